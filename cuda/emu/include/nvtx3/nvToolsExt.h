// NVTX ranges mark time for a profiler; the emulator has none, so they do nothing.
#pragma once

inline int nvtxRangePushA(const char*) { return 0; }
inline int nvtxRangePop() { return 0; }
