#include "program/params.h"

#include "util/error.h"

namespace yuan {

Tensor tensor_view(void* base, DType dt, const TensorSpec& t, size_t origin) {
  const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1, cols = static_cast<int64_t>(t.numel) / rows;
  return Tensor(static_cast<char*>(base) + (t.offset - origin) * dtype_size(dt), dt, rows, cols);
}

BackendSpec backend_spec(const ParamLayout& layout, std::optional<size_t> shards) {
  return {shards.value_or(layout.total()), shards.has_value(), layout.config().n_embd};
}

BackendParams::BackendParams(Backend& backend, const ParamLayout& layout) : backend_(backend) {
  YUAN_CHECK(!backend.sharded(), "%s backend: it holds ZeRO-3 shards, so the weights come from the optimizer",
             backend.name());
  YUAN_CHECK(backend.size() == layout.total(), "%s backend: its %zu-element buffers do not hold the layout's %zu "
             "parameters", backend.name(), backend.size(), layout.total());
}

Tensor BackendParams::weight(const TensorSpec& t) const {
  return tensor_view(backend_.weights().data, backend_.weights().dtype, t);
}

Tensor BackendParams::grad(const TensorSpec& t) const {
  return tensor_view(backend_.grads().data, backend_.grads().dtype, t);
}

}  // namespace yuan
