// One error check per library, in the style of nccl-tests: the failing call, file:line, this process's rank and
// host, and the library's own words for the error, thrown as yuan::Error so that main() reports it like any other
// failure and no rank is left waiting. Kernel launches are checked by launch() (launch.cuh). CUBLAS_CHECK and
// NCCL_CHECK name their library's types: the files that use them include cublasLt.h or nccl.h, so that the kernels
// build with the CUDA runtime's headers alone.
// CUDNN_CHECK takes what cuDNN's calls return, a cudnnStatus_t or the cuDNN frontend's error_t: cudnn_failure,
// defined beside the one file's calls (cudnn_attention.cpp), gives cuDNN's or the frontend's words, "" on success.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "util/error.h"

namespace yuan::gpu {

[[noreturn]] inline void throw_library_error(const char* lib, const char* call, const char* msg, const char* file,
                                             int line) {
  throw Error(strf("%s error at %s:%d (rank %d on %s): %s: %s", lib, file, line, process_rank(),
                   process_host().c_str(), call, msg));
}

}  // namespace yuan::gpu

#define CUDA_CHECK(call)                                                                                   \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess)                                                                                 \
      ::yuan::gpu::throw_library_error("CUDA", #call, cudaGetErrorString(e_), __FILE__, __LINE__);         \
  } while (0)

#define CUBLAS_CHECK(call)                                                                                 \
  do {                                                                                                     \
    cublasStatus_t s_ = (call);                                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                                       \
      ::yuan::gpu::throw_library_error("cuBLAS", #call, cublasGetStatusString(s_), __FILE__, __LINE__);    \
  } while (0)

#define CUDNN_CHECK(call)                                                                                  \
  do {                                                                                                     \
    const std::string m_ = cudnn_failure(call);                                                            \
    if (!m_.empty()) ::yuan::gpu::throw_library_error("cuDNN", #call, m_.c_str(), __FILE__, __LINE__);     \
  } while (0)

// ncclInProgress is not a failure: nonblocking communicators (cuda/nccl_communicator.cu) return it while an
// operation is still being set up, and then poll ncclCommGetAsyncError.
#define NCCL_CHECK(call)                                                                                   \
  do {                                                                                                     \
    ncclResult_t r_ = (call);                                                                              \
    if (r_ != ncclSuccess && r_ != ncclInProgress)                                                         \
      ::yuan::gpu::throw_library_error("NCCL", #call, ncclGetErrorString(r_), __FILE__, __LINE__);         \
  } while (0)
