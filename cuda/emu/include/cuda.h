// cuda.h of the emulator: the CUDA driver API is not emulated. The cuDNN frontend includes this header and names
// its types in code that reaches the driver through cudaGetDriverEntryPoint, which finds nothing here; the one driver
// function it calls directly, cuThreadExchangeStreamCaptureMode, is the runtime's per-thread capture mode
// (runtime.cpp). Types and values as in the toolkit's cuda.h.
#pragma once
#include "cuda_runtime_api.h"

#define CUDAAPI

enum CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_NOT_SUPPORTED = 801,
};
typedef int CUdevice;
struct CUctx_st;
struct CUlib_st;
struct CUkern_st;
typedef CUctx_st* CUcontext;
typedef CUstream_st* CUstream;
typedef CUlib_st* CUlibrary;
typedef CUkern_st* CUkernel;
enum CUjit_option { CU_JIT_MAX_REGISTERS = 0 };
enum CUlibraryOption { CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE = 0 };
enum CUstreamCaptureMode {
  CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_STREAM_CAPTURE_MODE_RELAXED = 2,
};
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

extern "C++" CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode);
