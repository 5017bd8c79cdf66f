#pragma once
#include <memory>

#include "backend/backend.h"

namespace yuan {
std::unique_ptr<Backend> make_cpu_backend(const GPTConfig& cfg, int micro_batch, size_t padded_size);
}
