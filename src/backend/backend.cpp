#include "backend/backend.h"

#include "backend/cpu_backend.h"
#include "util/error.h"
#ifdef YUAN_CUDA
#include "backend/cuda_backend.h"
#endif

namespace yuan {

std::unique_ptr<Backend> make_backend(const std::string& device, const GPTConfig& cfg, int micro_batch,
                                      size_t padded_size, bool recompute) {
#ifdef YUAN_CUDA
  if (device == "cuda" || (device == "auto" && cuda_device_available()))
    return make_cuda_backend(cfg, micro_batch, padded_size, recompute);
#else
  (void)recompute;
  YUAN_CHECK(device != "cuda", "train.device=cuda: this yuanlm was built without the CUDA backend (built: %s)",
             YUAN_BACKENDS);
#endif
  YUAN_CHECK(device == "cpu" || device == "auto", "train.device: unknown device '%s' (expected cpu, cuda or auto)",
             device.c_str());
  return make_cpu_backend(cfg, micro_batch, padded_size);
}

}  // namespace yuan
