// nvrtc.h of the emulator: run-time compilation of CUDA C++ is not emulated (a compiled cubin could not run here).
// The cuDNN frontend includes this header for its own run-time compiled engines, which the graphs of this project
// never select; every call returns NVRTC_ERROR_INTERNAL_ERROR and reports it as a Library check
// (cuda/emu/nvrtc.cpp). Names and values as in the toolkit's nvrtc.h.
#pragma once
#include <cstddef>

enum nvrtcResult {
  NVRTC_SUCCESS = 0,
  NVRTC_ERROR_COMPILATION = 6,
  NVRTC_ERROR_INTERNAL_ERROR = 11,
};
struct _nvrtcProgram;
typedef _nvrtcProgram* nvrtcProgram;

const char* nvrtcGetErrorString(nvrtcResult result);
nvrtcResult nvrtcVersion(int* major, int* minor);
nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name, int num_headers,
                               const char* const* headers, const char* const* include_names);
nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog);
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int num_options, const char* const* options);
nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t* bytes);
nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char* ptx);
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t* bytes);
nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char* cubin);
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* bytes);
nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log);
