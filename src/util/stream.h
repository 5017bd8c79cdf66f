// A device stream as host code names it: a cudaStream_t (CUstream_st*, so no CUDA header is needed). Null stands
// for the host: work on it completes before the call that enqueues it returns.
#pragma once

struct CUstream_st;

namespace yuan {
using DeviceStream = CUstream_st*;
}
