// NVRTC in the emulator: not emulated (nvrtc.h says why). Every call is refused with NVRTC_ERROR_INTERNAL_ERROR and
// reported as a Library check, so that a code path that reaches run-time compilation shows.
#include <nvrtc.h>

#include "emulator.h"

using namespace yuan::emu;

namespace {
nvrtcResult not_emulated(const char* call) {
  Lock lock(mutex());
  report(Check::Library, Where{}, 0, std::string(call) + ": run-time compilation (NVRTC) is not emulated", false,
         cudaErrorNotSupported);
  return NVRTC_ERROR_INTERNAL_ERROR;
}
}  // namespace

const char* nvrtcGetErrorString(nvrtcResult result) {
  return result == NVRTC_SUCCESS ? "NVRTC_SUCCESS" : "NVRTC_ERROR_INTERNAL_ERROR (NVRTC is not emulated)";
}
nvrtcResult nvrtcVersion(int*, int*) { return not_emulated("nvrtcVersion"); }
nvrtcResult nvrtcCreateProgram(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*) {
  return not_emulated("nvrtcCreateProgram");
}
nvrtcResult nvrtcDestroyProgram(nvrtcProgram*) { return not_emulated("nvrtcDestroyProgram"); }
nvrtcResult nvrtcCompileProgram(nvrtcProgram, int, const char* const*) { return not_emulated("nvrtcCompileProgram"); }
nvrtcResult nvrtcGetPTXSize(nvrtcProgram, size_t*) { return not_emulated("nvrtcGetPTXSize"); }
nvrtcResult nvrtcGetPTX(nvrtcProgram, char*) { return not_emulated("nvrtcGetPTX"); }
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram, size_t*) { return not_emulated("nvrtcGetCUBINSize"); }
nvrtcResult nvrtcGetCUBIN(nvrtcProgram, char*) { return not_emulated("nvrtcGetCUBIN"); }
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram, size_t*) { return not_emulated("nvrtcGetProgramLogSize"); }
nvrtcResult nvrtcGetProgramLog(nvrtcProgram, char*) { return not_emulated("nvrtcGetProgramLog"); }
