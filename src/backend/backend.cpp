#include "backend/backend.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/cpu_backend.h"
#include "util/peak.h"
#ifdef YUAN_CUDA
#include "backend/cuda_backend.h"
#endif

namespace yuan {

Allocation::Allocation(void* p, size_t bytes, Release release, std::optional<Mem> host_category)
    : p_(p), bytes_(bytes), release_(release), category_(host_category) {
  if (category_) detail::mem_account(*category_, static_cast<std::ptrdiff_t>(bytes_));
}

Allocation::~Allocation() {
  if (!p_) return;
  release_(p_);
  if (category_) detail::mem_account(*category_, -static_cast<std::ptrdiff_t>(bytes_));
}

Allocation host_allocation(size_t bytes, Mem cat) {
  if (bytes == 0) return {};
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) detail::out_of_host_memory(bytes, mem_name(cat));
  std::memset(p, 0, bytes);
  return Allocation(p, bytes, std::free, cat);
}

Backend::Backend(const BackendSpec& spec)
    : size_(spec.elements), sharded_(spec.sharded), attention_(spec.attention) {}

PeakFlops Backend::peak_flops() { return {measure_peak_flops(), "measured fp32 FMA loop on this rank's threads"}; }

const TensorFormats& Backend::formats() const { return tensor_formats(device()); }

void Backend::check_range(size_t off, size_t n) const {
  YUAN_CHECK(off + n <= size(), "%s backend: range [%zu, %zu) outside the %zu-element buffer", name(), off, off + n,
             size());
}

void Backend::grads_to_host_async(size_t offset, size_t count, float* dst, DeviceStream after) {
  check_range(offset, count);
  YUAN_CHECK(!sharded_, "%s backend: no flat gradients under ZeRO-3", name());
  to_host_async(dst, Tensor(static_cast<float*>(grads_.data) + offset, DType::F32, 1, static_cast<int64_t>(count)),
                after);
}

void Backend::params_from_host_async(const void* src, size_t offset, size_t count, int lane) {
  (void)lane;
  YUAN_CHECK(weights_.dtype == DType::F32, "backend %s: no upload path for its working weights", name());
  set_params(static_cast<const float*>(src), offset, count);
}

// ---- registry ----

namespace {

struct Registered {
  Device device;
  const TensorFormats& (*formats)();
  bool (*available)();  // a device of this kind is visible to this process
  size_t (*free_bytes)();
  int (*select)(int local_rank);
  std::unique_ptr<Backend> (*make)(const BackendSpec&);
  std::string (*cudnn_problem)(int head_size, int seq_len);  // why cuDNN's attention cannot run here, or ""
  std::string (*cudnn_library)();
};

bool always() { return true; }
size_t unbounded() { return SIZE_MAX; }
int host(int) { return -1; }
std::string no_cudnn(int, int) { return "the cpu backend runs the reference attention"; }
std::string no_library() { return ""; }

// In order of preference for train.device=auto.
const Registered kRegistry[] = {
#ifdef YUAN_CUDA
    {Device::Cuda, cuda_tensor_formats, cuda_device_available, cuda_free_bytes, cuda_select_device, make_cuda_backend,
     cuda_cudnn_attention_problem, cuda_cudnn_attention_library},
#endif
    {Device::Cpu, cpu_tensor_formats, always, unbounded, host, make_cpu_backend, no_cudnn, no_library},
};

const Registered* find(Device d) {
  for (const Registered& r : kRegistry)
    if (r.device == d) return &r;
  return nullptr;
}

const Registered& require(Device d) {
  const Registered* r = find(d);
  YUAN_CHECK(r, "train.device=%s: this yuanlm was built without the %s backend (built: %s)", device_name(d),
             device_name(d), YUAN_BACKENDS);
  return *r;
}

}  // namespace

const char* device_name(Device d) {
  switch (d) {
    case Device::Cpu: return "cpu";
    case Device::Cuda: return "cuda";
  }
  return "?";
}

DeviceRequest parse_device(const std::string& text, const char* key) {
  if (text == "auto") return {};
  for (Device d : {Device::Cpu, Device::Cuda})
    if (text == device_name(d)) return {false, d};
  throw Error(strf("%s must be cpu, cuda or auto (got '%s')", key, text.c_str()), true);
}

Device resolve_device(const DeviceRequest& req) {
  if (!req.automatic) {
    const Registered& r = require(req.device);
    YUAN_CHECK(r.available(), "train.device=%s: no %s device is visible to this process", device_name(req.device),
               device_name(req.device));
    return req.device;
  }
  for (const Registered& r : kRegistry)
    if (r.available()) return r.device;
  return Device::Cpu;
}

int select_device(Device d, int local_rank) { return require(d).select(local_rank); }

Device planned_device(const DeviceRequest& req) {
  return req.automatic ? kRegistry[0].device : require(req.device).device;
}

const char* attention_path_name(AttentionPath p) { return p == AttentionPath::Cudnn ? "cudnn" : "own"; }

AttentionChoice choose_attention(Device device, std::optional<AttentionPath> request, int head_size, int seq_len) {
  const Registered& r = require(device);
  if (request == AttentionPath::Own) return {AttentionPath::Own, "as model.attention asks"};
  const std::string problem = r.cudnn_problem(head_size, seq_len);
  if (request == AttentionPath::Cudnn) {
    YUAN_CHECK(problem.empty(), "model.attention = cudnn on train.device=%s: %s", device_name(device), problem.c_str());
    return {AttentionPath::Cudnn, r.cudnn_library()};
  }
  if (problem.empty()) return {AttentionPath::Cudnn, r.cudnn_library()};
  return {AttentionPath::Own, device == Device::Cpu ? problem : "no cuDNN: " + problem};
}

const TensorFormats& tensor_formats(Device device) { return require(device).formats(); }

size_t device_free_bytes(Device device) { return require(device).free_bytes(); }

std::unique_ptr<Backend> make_backend(Device device, const BackendSpec& spec) { return require(device).make(spec); }

}  // namespace yuan
