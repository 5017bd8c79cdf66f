// The machine's fp32 peak as this process sees it: an FMA loop on all of its OpenMP threads. MFU on the CPU
// backend and the GEMM benchmark are ratios against this measured number, not a datasheet value.
#pragma once

namespace yuan {
double measure_peak_flops(double seconds = 0.2);
}
