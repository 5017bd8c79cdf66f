// Where the program finds the model's parameters: a ParamLayout (model/gpt.h) laid over a backend's flat buffers,
// or ZeRO-3's gathered modules (optim/zero.h). The backend holds N elements and knows nothing of what they are;
// this is where the model's table meets them.
#pragma once
#include <cstddef>
#include <functional>
#include <optional>

#include "backend/backend.h"
#include "model/gpt.h"

namespace yuan {

// Called during backward with a module index once that module's gradient for the current micro-batch is
// complete in the order of Backend::stream() (host backends: complete), so gradient communication can overlap
// the rest of backward.
using ModuleReadyFn = std::function<void(int module)>;

// The [rows, cols] view (a vector: one row) of tensor `t` in memory `base` of dtype `dt`, which holds its layout's
// flat buffer from element `origin` on.
Tensor tensor_view(void* base, DType dt, const TensorSpec& t, size_t origin = 0);

// The backend that holds `layout`'s parameters: all of them, or with `shards` (ZeRO-3, optim/zero.h
// zero_shard_elements) that many elements of this rank's shards and no gradients; its ops sized for the model's
// rows.
BackendSpec backend_spec(const ParamLayout& layout, std::optional<size_t> shards = std::nullopt);

// Where the program (program/program.h) finds a module's weights and gradients. BackendParams reads the backend's
// flat buffers, which hold every module for the whole run; ZeRO-3 (optim/zero.h) holds shards only and gathers a
// module's weights for the span between acquire and release.
class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // The program reads module `module`'s weights until release(module); with `grads` it also adds into the
  // module's gradients, which then stay until the ready hook has reported the module.
  virtual void acquire(int module, bool grads) = 0;
  virtual void release(int module) = 0;
  // Shaped views of one tensor ([rows, cols]; a vector is one row), valid while its module is acquired.
  virtual Tensor weight(const TensorSpec& t) const = 0;
  virtual Tensor grad(const TensorSpec& t) const = 0;
};

// The tensors of `layout` in a backend's flat buffers (a backend made with backend_spec(layout)).
class BackendParams final : public ParamSource {
 public:
  // Throws when the backend holds ZeRO-3 shards or buffers of another size than the layout.
  BackendParams(Backend& backend, const ParamLayout& layout);
  void acquire(int, bool) override {}
  void release(int) override {}
  Tensor weight(const TensorSpec& t) const override;
  Tensor grad(const TensorSpec& t) const override;

 private:
  Backend& backend_;
};

}  // namespace yuan
