// Sum of squares of an fp32 gradient (grad_norm.cu; CPU twin ops::sum_squares), for the global clipping norm.
#pragma once
#include <cstddef>

#include "common.cuh"

namespace yuan::gpu {

// Sum of x[i]^2 accumulated in double, in a fixed order (the same bits every run); waits for the result.
// `partials` is scratch of sum_squares_partials_size() doubles.
double sum_squares(const float* x, size_t n, double* partials, cudaStream_t s);
size_t sum_squares_partials_size();

}  // namespace yuan::gpu
