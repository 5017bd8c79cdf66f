// The CUDA backend: the CPU backend's forward and backward (src/backend/cpu_backend.cpp) on one GPU, with the
// kernels of cuda/ and cuBLASLt GEMMs, all on one stream. See src/backend/cuda_backend.h for the memory choices.
//
// Differences in structure from the CPU backend, all fusions:
//   - each residual add rides in the GEMM that produces the branch (attn.c_proj, mlp.c_proj: C operand, beta 1);
//   - the MLP's GELU and its backward are GEMM epilogues, with the GELU input kept for backward;
//   - attention keeps only the logsumexp per row (cuda/attention.cu);
//   - the residual stream's gradient accumulates in fp32, with a bf16 copy for the GEMMs.
#include "backend/cuda_backend.h"

#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstring>

#include "kernels.cuh"
#include "util/error.h"
#include "util/log.h"

namespace yuan {
namespace {

using gpu::bf16;

enum Pool { kWeights, kGrads, kActivations, kBuffers, kPools };
constexpr size_t kStageElems = size_t(16) << 20;  // fp32 staging of set_params / get_params: 64 MiB per chunk
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Bump allocation in 256-byte steps (cuBLASLt's preferred alignment). Without base pointers it only counts: the
// memory plan is the same walk as the allocation, so the two cannot disagree.
struct Carver {
  char* base[kPools] = {};
  size_t used[kPools] = {};
  template <typename T>
  T* take(Pool p, size_t n) {
    const size_t off = (used[p] + 255) / 256 * 256;
    used[p] = off + n * sizeof(T);
    return base[p] ? reinterpret_cast<T*>(base[p] + off) : nullptr;
  }
};

// What one block keeps from forward for its backward.
struct LayerActs {
  bf16 *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu;  // fch: GELU input; fch_gelu: its output
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
};

struct DeviceMemory {
  bf16* params;
  float* grads;
  std::vector<LayerActs> layers;  // one per layer, or one scratch set with recompute
  std::vector<bf16*> res3;        // block outputs (the residual stream), one per layer
  bf16 *encoded, *lnf, *logits;
  float *lnf_mean, *lnf_rstd, *losses;
  // backward scratch, reused by every layer
  float* dres;  // the residual stream's gradient, fp32
  bf16 *dres_bf16, *dln, *datty, *dqkv, *dfch;
  float *ln_partials, *att_delta, *bias_scratch;
  // transfers and library scratch
  float* stage;
  int32_t *tokens, *groups;
  double* sumsq;
  char* workspace;
};

// Row stride of the logits: a multiple of 64 keeps every row 128-byte aligned for the GEMMs and the classifier's
// 16-byte vectors (V = 50257 is odd).
int logits_stride(int V) { return (V + 63) / 64 * 64; }

void lay_out(DeviceMemory& m, Carver& k, const GPTConfig& c, int B, bool recompute, size_t padded) {
  const size_t BT = static_cast<size_t>(B) * c.seq_len, C = c.n_embd;
  m.params = k.take<bf16>(kWeights, padded);
  m.grads = k.take<float>(kGrads, padded);
  m.layers.assign(recompute ? 1 : c.n_layer, LayerActs{});
  for (LayerActs& a : m.layers) {
    a.ln1 = k.take<bf16>(kActivations, BT * C);
    a.qkv = k.take<bf16>(kActivations, BT * 3 * C);
    a.atty = k.take<bf16>(kActivations, BT * C);
    a.res2 = k.take<bf16>(kActivations, BT * C);
    a.ln2 = k.take<bf16>(kActivations, BT * C);
    a.fch = k.take<bf16>(kActivations, BT * 4 * C);
    a.fch_gelu = k.take<bf16>(kActivations, BT * 4 * C);
    a.ln1_mean = k.take<float>(kActivations, BT);
    a.ln1_rstd = k.take<float>(kActivations, BT);
    a.ln2_mean = k.take<float>(kActivations, BT);
    a.ln2_rstd = k.take<float>(kActivations, BT);
    a.lse = k.take<float>(kActivations, BT * c.n_head);
  }
  m.res3.assign(c.n_layer, nullptr);
  for (bf16*& r : m.res3) r = k.take<bf16>(kActivations, BT * C);
  m.encoded = k.take<bf16>(kActivations, BT * C);
  m.lnf = k.take<bf16>(kActivations, BT * C);
  m.lnf_mean = k.take<float>(kActivations, BT);
  m.lnf_rstd = k.take<float>(kActivations, BT);
  m.logits = k.take<bf16>(kActivations, BT * logits_stride(c.vocab_size));
  m.losses = k.take<float>(kActivations, BT);

  m.dres = k.take<float>(kBuffers, BT * C);
  m.dres_bf16 = k.take<bf16>(kBuffers, BT * C);
  m.dln = k.take<bf16>(kBuffers, BT * C);
  m.datty = k.take<bf16>(kBuffers, BT * C);
  m.dqkv = k.take<bf16>(kBuffers, BT * 3 * C);
  m.dfch = k.take<bf16>(kBuffers, BT * 4 * C);
  m.ln_partials = k.take<float>(kBuffers, gpu::layernorm_partials_size(c.n_embd));
  m.att_delta = k.take<float>(kBuffers, BT * c.n_head);
  m.bias_scratch = k.take<float>(kBuffers, 4 * C);
  m.stage = k.take<float>(kBuffers, kStageElems);
  m.tokens = k.take<int32_t>(kBuffers, static_cast<size_t>(B) * (c.seq_len + 1));
  m.groups = k.take<int32_t>(kBuffers, gpu::token_groups_max_size(B, c.seq_len));
  m.sumsq = k.take<double>(kBuffers, gpu::sum_squares_partials_size());
  m.workspace = k.take<char>(kBuffers, gpu::Matmul::kWorkspaceBytes);
}

CudaMemoryPlan plan_from(const Carver& k) {
  CudaMemoryPlan p;
  p.weights = k.used[kWeights];
  p.grads = k.used[kGrads];
  p.activations = k.used[kActivations];
  p.buffers = k.used[kBuffers];
  return p;
}

CudaMemoryPlan plan_padded(const GPTConfig& c, int B, bool recompute, size_t padded) {
  DeviceMemory m;
  Carver k;
  lay_out(m, k, c, B, recompute, padded);
  return plan_from(k);
}

std::string describe(const CudaMemoryPlan& p) {
  return strf("%.2f GiB on the GPU (weights %.2f, grads %.2f, activations %.2f, buffers %.2f)", p.total() / kGiB,
              p.weights / kGiB, p.grads / kGiB, p.activations / kGiB, p.buffers / kGiB);
}

// check_cuda_memory for a buffer of `padded` parameters, which is what the backend allocates (the flat buffer is
// padded for ZeRO's shards); the public, unpadded plan undercounts it.
void check_plan_fits(const GPTConfig& cfg, int micro_batch, bool recompute, size_t padded, size_t free_bytes) {
  const CudaMemoryPlan plan = plan_padded(cfg, micro_batch, recompute, padded);
  if (plan.total() <= free_bytes) return;
  int fits = 0;  // the largest micro-batch below this one that fits as configured
  for (int b = micro_batch - 1; b >= 1 && !fits; b--)
    if (plan_padded(cfg, b, recompute, padded).total() <= free_bytes) fits = b;
  std::string hint;
  if (fits && !recompute)
    hint = strf("try train.micro_batch=%d or train.recompute=true", fits);
  else if (fits)
    hint = strf("try train.micro_batch=%d", fits);
  else if (!recompute)
    hint = "try train.recompute=true or a smaller model";
  else
    hint = "the model does not fit at micro-batch 1: use a smaller model or more GPUs";
  throw Error(strf("memory plan: needs %s, device has %.2f GiB free; %s", describe(plan).c_str(), free_bytes / kGiB,
                   hint.c_str()));
}

}  // namespace

PeakFlops cuda_peak_flops() {
  int dev = 0, sms = 0, khz = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const std::string name = prop.name;
  // First match wins: the PCIe and NVL parts before the SXM ones whose names they contain.
  const std::pair<const char*, double> known[] = {{"H100 PCIe", 756}, {"H100 NVL", 835}, {"H200 NVL", 835},
                                                  {"H100", 989},      {"H200", 989},     {"A100", 312}};
  for (const auto& [part, tflops] : known)
    if (name.find(part) != std::string::npos)
      return {tflops * 1e12, strf("%s, dense bf16 from the datasheet", prop.name)};
  // Tensor-core bf16 FLOPs per SM per clock, dense: 2048 on sm_80 (A100), 4096 on sm_90 (H100).
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  const double per_clock = prop.major >= 9 ? 4096 : prop.major == 8 && prop.minor == 0 ? 2048 : 1024;
  return {sms * (khz * 1e3) * per_clock,
          strf("%s, dense bf16 estimated: %d SMs x %.0f MHz x %.0f FLOP/clock", prop.name, sms, khz / 1e3, per_clock)};
}

namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(const GPTConfig& c, int micro_batch, size_t padded, bool recompute)
      : layout_(c), B_(micro_batch), padded_(padded), recompute_(recompute), V_ld_(logits_stride(c.vocab_size)) {
    YUAN_CHECK(padded >= layout_.total(), "backend: padded size %zu < parameter count %zu", padded, layout_.total());
    YUAN_CHECK(micro_batch >= 1 && c.seq_len >= 1 && c.n_layer >= 1, "cuda backend: micro-batch %d, seq_len %d, "
               "n_layer %d must be positive", micro_batch, c.seq_len, c.n_layer);
    YUAN_CHECK(c.n_embd % 8 == 0, "cuda backend: n_embd = %d must be a multiple of 8 (16-byte bf16 vectors)", c.n_embd);
    const int hs = c.n_head > 0 ? c.n_embd / c.n_head : 0;
    YUAN_CHECK(c.n_head > 0 && c.n_embd % c.n_head == 0 && hs % 8 == 0 && hs <= 128,
               "cuda backend: head size n_embd/n_head = %d/%d must be a multiple of 8 and at most 128", c.n_embd,
               c.n_head);
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const CudaMemoryPlan plan = plan_padded(c, B_, recompute_, padded_);
    say("cuda: device %d %s (sm_%d%d), memory plan B=%d T=%d recompute %s: %s of %.2f GiB free", dev, prop.name,
        prop.major, prop.minor, B_, c.seq_len, recompute_ ? "on" : "off", describe(plan).c_str(), free_bytes / kGiB);
    check_plan_fits(c, micro_batch, recompute, padded_, free_bytes);

    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking));
    for (cudaStream_t& s : up_) CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&ev_compute_, &ev_after_, &ev_d2h_, &ev_up_[0], &ev_up_[1]})
      CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    Carver k;
    const size_t sizes[kPools] = {plan.weights, plan.grads, plan.activations, plan.buffers};
    for (int p = 0; p < kPools; p++) {
      void* ptr = nullptr;
      CUDA_CHECK(cudaMalloc(&ptr, sizes[p]));
      pools_[p] = k.base[p] = static_cast<char*>(ptr);
    }
    lay_out(mem_, k, c, B_, recompute_, padded_);
    // The padding tail of weights and gradients is zero and stays zero; the logits' padding columns are never
    // written by the GEMM, and zeroing them once keeps the classifier's over-reads finite.
    CUDA_CHECK(cudaMemsetAsync(mem_.params, 0, padded_ * sizeof(bf16), stream_));
    CUDA_CHECK(cudaMemsetAsync(mem_.grads, 0, padded_ * sizeof(float), stream_));
    CUDA_CHECK(cudaMemsetAsync(mem_.logits, 0, static_cast<size_t>(B_) * c.seq_len * V_ld_ * sizeof(bf16), stream_));
    CUDA_CHECK(cudaMallocHost(&host_tokens_, (static_cast<size_t>(B_) * (c.seq_len + 1) +
                                              gpu::token_groups_max_size(B_, c.seq_len)) * sizeof(int32_t)));
    CUDA_CHECK(cudaMallocHost(&host_losses_, static_cast<size_t>(B_) * c.seq_len * sizeof(float)));
    gemm_ = std::make_unique<gpu::Matmul>(mem_.workspace, mem_.bias_scratch, 4 * static_cast<size_t>(c.n_embd));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  ~CudaBackend() override {
    // Destructors do not throw: errors here are ignored (the process is usually on its way out). Work still
    // queued on any stream may use the GEMM workspace, the pools or the pinned buffers, so all drain first.
    for (cudaStream_t s : {stream_, d2h_, up_[0], up_[1]})
      if (s) cudaStreamSynchronize(s);
    gemm_.reset();
    for (char* p : pools_)
      if (p) cudaFree(p);
    if (host_tokens_) cudaFreeHost(host_tokens_);
    if (host_losses_) cudaFreeHost(host_losses_);
    for (cudaStream_t s : {stream_, d2h_, up_[0], up_[1]})
      if (s) cudaStreamDestroy(s);
    for (cudaEvent_t e : {ev_compute_, ev_after_, ev_d2h_, ev_up_[0], ev_up_[1]})
      if (e) cudaEventDestroy(e);
  }

  const char* name() const override { return "cuda"; }
  PeakFlops peak_flops() override { return cuda_peak_flops(); }
  const ParamLayout& layout() const override { return layout_; }
  size_t padded_size() const override { return padded_; }
  int max_micro_batch() const override { return B_; }

  void set_params(const float* src, size_t off, size_t n) override {
    check_range(off, n);
    for (size_t i = 0; i < n; i += kStageElems) {
      const size_t chunk = std::min(kStageElems, n - i);
      CUDA_CHECK(cudaMemcpyAsync(mem_.stage, src + i, chunk * sizeof(float), cudaMemcpyHostToDevice, stream_));
      gpu::f32_to_bf16(mem_.params + off + i, mem_.stage, chunk, stream_);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void get_params(float* dst, size_t off, size_t n) override {
    check_range(off, n);
    for (size_t i = 0; i < n; i += kStageElems) {
      const size_t chunk = std::min(kStageElems, n - i);
      gpu::bf16_to_f32(mem_.stage, mem_.params + off + i, chunk, stream_);
      CUDA_CHECK(cudaMemcpyAsync(dst + i, mem_.stage, chunk * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void zero_grads(size_t off, size_t n) override {
    check_range(off, n);
    after_gradient_copies();
    CUDA_CHECK(cudaMemsetAsync(mem_.grads + off, 0, n * sizeof(float), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  DeviceBuffer grad_buffer() override { return {mem_.grads, padded_, DType::F32}; }
  DeviceBuffer param_buffer() override { return {mem_.params, padded_, DType::BF16}; }
  void profiler(bool capture) override { CUDA_CHECK(capture ? cudaProfilerStart() : cudaProfilerStop()); }
  void range_push(const char* name) override { nvtxRangePushA(name); }
  void range_pop() override { nvtxRangePop(); }
  void grads_to_host(size_t off, size_t n, float* dst) override {
    check_range(off, n);
    CUDA_CHECK(cudaMemcpyAsync(dst, mem_.grads + off, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // The offload pipeline: gradient copies on d2h_, weight uploads on up_[lane], compute on stream_, ordered by
  // events so that none of them waits for the host (see backend.h).
  void* stream() override { return stream_; }
  PinnedBuffer alloc_pinned(size_t bytes, Mem cat) override {
    if (bytes == 0) return {};
    void* p = nullptr;
    CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    std::memset(p, 0, bytes);
    return PinnedBuffer(p, bytes, cat, [](void* q) { cudaFreeHost(q); });
  }
  void grads_to_host_async(size_t off, size_t n, float* dst, void* after) override {
    check_range(off, n);
    wait_for(d2h_, stream_, ev_compute_);
    if (after) wait_for(d2h_, static_cast<cudaStream_t>(after), ev_after_);
    CUDA_CHECK(cudaMemcpyAsync(dst, mem_.grads + off, n * sizeof(float), cudaMemcpyDeviceToHost, d2h_));
  }
  void wait_transfers() override { CUDA_CHECK(cudaStreamSynchronize(d2h_)); }
  void params_from_host_async(const void* src, size_t off, size_t n, int lane) override {
    check_range(off, n);
    YUAN_CHECK(lane == 0 || lane == 1, "cuda backend: upload lane %d (0 or 1)", lane);
    // Compute already enqueued may still read the old weights; compute enqueued later must read the new ones.
    wait_for(up_[lane], stream_, ev_compute_);
    CUDA_CHECK(cudaMemcpyAsync(mem_.params + off, src, n * sizeof(bf16), cudaMemcpyHostToDevice, up_[lane]));
    CUDA_CHECK(cudaEventRecord(ev_up_[lane], up_[lane]));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ev_up_[lane], 0));
  }
  void wait_upload(int lane) override {
    YUAN_CHECK(lane == 0 || lane == 1, "cuda backend: upload lane %d (0 or 1)", lane);
    CUDA_CHECK(cudaEventSynchronize(ev_up_[lane]));
  }

  float forward_backward(const int32_t* tokens, int B, float grad_scale, const ModuleReadyFn& ready) override {
    const int T = layout_.config().seq_len;
    after_gradient_copies();  // backward accumulates into the buffers they read
    forward(tokens, B, T, T + 1);
    classify(B, T, T + 1, grad_scale / (static_cast<float>(B) * T));
    // The embedding backward's token grouping is built while the GPU runs the forward.
    const std::vector<int32_t> groups = gpu::token_groups(tokens, B, T, T + 1);
    int32_t* staged = host_tokens_ + static_cast<size_t>(B_) * (T + 1);
    std::memcpy(staged, groups.data(), groups.size() * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(mem_.groups, staged, groups.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    backward(B, T, groups[0], ready);
    return mean_loss(B, T);
  }

  float forward_loss(const int32_t* tokens, int B) override {
    const int T = layout_.config().seq_len;
    forward(tokens, B, T, T + 1);
    classify(B, T, T + 1, 0.0f);
    return mean_loss(B, T);
  }

  void forward_logits(const int32_t* ids, int len, float* logits) override {
    const int V = layout_.config().vocab_size;
    YUAN_CHECK(len >= 1 && len <= layout_.config().seq_len, "forward_logits: length %d outside [1, seq_len=%d]", len,
               layout_.config().seq_len);
    forward(ids, 1, len, len);
    std::vector<uint16_t> rows(static_cast<size_t>(len) * V);
    CUDA_CHECK(cudaMemcpy2DAsync(rows.data(), V * sizeof(bf16), mem_.logits, V_ld_ * sizeof(bf16), V * sizeof(bf16),
                                 len, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < rows.size(); i++) logits[i] = bf16_to_f32(rows[i]);
  }

  // For CudaAdamW.
  cudaStream_t cuda_stream() const { return stream_; }
  bf16* params() { return mem_.params; }
  float* grads() { return mem_.grads; }
  double* sumsq_scratch() { return mem_.sumsq; }

 private:
  void check_range(size_t off, size_t n) const {
    YUAN_CHECK(off + n <= padded_, "backend: range [%zu, %zu) outside the %zu-element buffer", off, off + n, padded_);
  }
  // Work enqueued on `waiter` from now on runs after the work enqueued on `producer` so far (`ev`: scratch).
  static void wait_for(cudaStream_t waiter, cudaStream_t producer, cudaEvent_t ev) {
    CUDA_CHECK(cudaEventRecord(ev, producer));
    CUDA_CHECK(cudaStreamWaitEvent(waiter, ev, 0));
  }
  void after_gradient_copies() { wait_for(stream_, d2h_, ev_d2h_); }
  const bf16* W(const TensorSpec& t) const { return mem_.params + t.offset; }
  const bf16* W(int l, BlockTensor t) const { return W(layout_.block(l, t)); }
  float* G(const TensorSpec& t) { return mem_.grads + t.offset; }
  float* G(int l, BlockTensor t) { return G(layout_.block(l, t)); }
  LayerActs& acts(int l) { return mem_.layers[recompute_ ? 0 : l]; }

  // Row b of `tok` starts at b * stride; positions [0, T) are the inputs, and with stride T+1 the targets follow.
  void forward(const int32_t* tok, int B, int T, int stride) {
    const GPTConfig& c = layout_.config();
    YUAN_CHECK(B >= 1 && B <= B_, "backend: micro-batch %d outside [1, %d]", B, B_);
    check_token_ids(tok, B, stride, c.vocab_size);
    const size_t n_tok = static_cast<size_t>(B) * stride;
    std::memcpy(host_tokens_, tok, n_tok * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(mem_.tokens, host_tokens_, n_tok * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    const int C = c.n_embd, BT = B * T;
    gpu::encoder_forward(mem_.encoded, mem_.tokens, W(layout_.wte()), W(layout_.wpe()), B, T, C, stride, stream_);
    const bf16* x = mem_.encoded;
    for (int l = 0; l < c.n_layer; l++) {
      block_forward(l, x, B, T, true);
      x = mem_.res3[l];
    }
    gpu::layernorm_forward(mem_.lnf, mem_.lnf_mean, mem_.lnf_rstd, x, W(layout_.ln_f_w()), W(layout_.ln_f_b()), BT, C,
                           stream_);
    gemm_->forward(mem_.logits, mem_.lnf, W(layout_.wte()), nullptr, nullptr, nullptr, BT, C, c.vocab_size, V_ld_,
                   stream_);
  }

  // One transformer block from its input x into acts(l); the block output res3[l] only when asked (a recompute
  // in backward needs everything but the output).
  void block_forward(int l, const bf16* x, int B, int T, bool output) {
    const GPTConfig& c = layout_.config();
    const int C = c.n_embd, BT = B * T;
    LayerActs& a = acts(l);
    gpu::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, W(l, kLn1W), W(l, kLn1B), BT, C, stream_);
    gemm_->forward(a.qkv, a.ln1, W(l, kQkvW), W(l, kQkvB), nullptr, nullptr, BT, C, 3 * C, 3 * C, stream_);
    gpu::attention_forward(a.atty, a.lse, a.qkv, B, T, C, c.n_head, stream_);
    gemm_->forward(a.res2, a.atty, W(l, kAttnProjW), W(l, kAttnProjB), x, nullptr, BT, C, C, C, stream_);
    gpu::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, W(l, kLn2W), W(l, kLn2B), BT, C, stream_);
    gemm_->forward(a.fch_gelu, a.ln2, W(l, kFcW), W(l, kFcB), nullptr, a.fch, BT, C, 4 * C, 4 * C, stream_);
    if (output)
      gemm_->forward(mem_.res3[l], a.fch_gelu, W(l, kFcProjW), W(l, kFcProjB), a.res2, nullptr, BT, 4 * C, C, C,
                     stream_);
  }

  // Losses of the B*T targets; with dscale != 0 the logits become dloss/dlogits * dscale * B*T.
  void classify(int B, int T, int stride, float dscale) {
    gpu::classifier_forward_backward(mem_.logits, mem_.losses, mem_.tokens + 1, B, T, layout_.config().vocab_size,
                                     V_ld_, stride, dscale, stream_);
  }

  float mean_loss(int B, int T) {
    const size_t n = static_cast<size_t>(B) * T;
    CUDA_CHECK(cudaMemcpyAsync(host_losses_, mem_.losses, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += host_losses_[i];
    return static_cast<float>(sum / static_cast<double>(n));
  }

  // No synchronisation: whoever the hook hands the gradient to (an NCCL collective, a gradient copy) orders
  // itself after stream_ with an event, and the host keeps enqueuing backward meanwhile.
  void notify(const ModuleReadyFn& ready, int module) {
    if (ready) ready(module);
  }

  void backward(int B, int T, int n_groups, const ModuleReadyFn& ready) {
    const GPTConfig& c = layout_.config();
    const int C = c.n_embd, L = c.n_layer, BT = B * T;
    DeviceMemory& m = mem_;
    const int n_modules = static_cast<int>(layout_.modules().size());

    CUDA_CHECK(cudaMemsetAsync(m.dres, 0, static_cast<size_t>(BT) * C * sizeof(float), stream_));
    gemm_->backward(m.dln, G(layout_.wte()), nullptr, m.logits, m.lnf, W(layout_.wte()), nullptr, BT, C, c.vocab_size,
                    V_ld_, stream_);
    gpu::layernorm_backward(m.dres, m.dres_bf16, G(layout_.ln_f_w()), G(layout_.ln_f_b()), m.ln_partials, m.dln,
                            m.res3[L - 1], W(layout_.ln_f_w()), m.lnf_mean, m.lnf_rstd, BT, C, stream_);
    notify(ready, n_modules - 1);

    for (int l = L - 1; l >= 0; l--) {
      const bf16* x = l == 0 ? m.encoded : m.res3[l - 1];
      // The scratch set still holds the last block from forward; every other block is recomputed.
      if (recompute_ && l != L - 1) block_forward(l, x, B, T, false);
      const LayerActs& a = acts(l);
      // res3 = res2 + fcproj: dres flows unchanged into both
      gemm_->backward(m.dfch, G(l, kFcProjW), G(l, kFcProjB), m.dres_bf16, a.fch_gelu, W(l, kFcProjW), a.fch, BT,
                      4 * C, C, C, stream_);
      gemm_->backward(m.dln, G(l, kFcW), G(l, kFcB), m.dfch, a.ln2, W(l, kFcW), nullptr, BT, C, 4 * C, 4 * C, stream_);
      gpu::layernorm_backward(m.dres, m.dres_bf16, G(l, kLn2W), G(l, kLn2B), m.ln_partials, m.dln, a.res2,
                              W(l, kLn2W), a.ln2_mean, a.ln2_rstd, BT, C, stream_);
      // res2 = x + attproj
      gemm_->backward(m.datty, G(l, kAttnProjW), G(l, kAttnProjB), m.dres_bf16, a.atty, W(l, kAttnProjW), nullptr,
                      BT, C, C, C, stream_);
      gpu::attention_backward(m.dqkv, m.att_delta, m.datty, a.qkv, a.atty, a.lse, B, T, C, c.n_head, stream_);
      gemm_->backward(m.dln, G(l, kQkvW), G(l, kQkvB), m.dqkv, a.ln1, W(l, kQkvW), nullptr, BT, C, 3 * C, 3 * C,
                      stream_);
      gpu::layernorm_backward(m.dres, m.dres_bf16, G(l, kLn1W), G(l, kLn1B), m.ln_partials, m.dln, x, W(l, kLn1W),
                              a.ln1_mean, a.ln1_rstd, BT, C, stream_);
      notify(ready, layout_.block(l, kLn1W).module);
    }
    gpu::encoder_backward(G(layout_.wte()), G(layout_.wpe()), m.dres, m.groups, n_groups, B, T, C, stream_);
    notify(ready, layout_.wpe().module);
    notify(ready, layout_.wte().module);
  }

  ParamLayout layout_;
  int B_;
  size_t padded_;
  bool recompute_;
  int V_ld_;  // row stride of the logits
  cudaStream_t stream_ = nullptr;
  cudaStream_t d2h_ = nullptr, up_[2] = {};  // gradient copies; weight upload lanes
  cudaEvent_t ev_compute_ = nullptr, ev_after_ = nullptr, ev_d2h_ = nullptr, ev_up_[2] = {};
  char* pools_[kPools] = {};
  DeviceMemory mem_{};
  std::unique_ptr<gpu::Matmul> gemm_;
  int32_t* host_tokens_ = nullptr;  // pinned: tokens, then the token grouping
  float* host_losses_ = nullptr;    // pinned
};

}  // namespace

bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int cuda_select_device(int local_rank) {
  int n = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n));
  YUAN_CHECK(n > 0, "no CUDA device is visible to this process");
  const int dev = local_rank % n;
  CUDA_CHECK(cudaSetDevice(dev));
  return dev;
}

CudaMemoryPlan plan_cuda_memory(const GPTConfig& cfg, int micro_batch, bool recompute) {
  return plan_padded(cfg, micro_batch, recompute, ParamLayout(cfg).total());
}

void check_cuda_memory(const GPTConfig& cfg, int micro_batch, bool recompute, size_t free_bytes) {
  check_plan_fits(cfg, micro_batch, recompute, ParamLayout(cfg).total(), free_bytes);
}

std::unique_ptr<Backend> make_cuda_backend(const GPTConfig& cfg, int micro_batch, size_t padded_size,
                                           bool recompute) {
  YUAN_CHECK(cuda_device_available(), "train.device=cuda: no CUDA device is visible to this process");
  return std::make_unique<CudaBackend>(cfg, micro_batch, padded_size, recompute);
}

// ---- CudaAdamW ----

struct CudaAdamW::State {
  CudaBackend* backend = nullptr;
  size_t offset = 0, count = 0;
  float* state = nullptr;  // master | m | v, count each
  struct Segment {
    size_t offset, count;  // absolute, in the flat buffer
    bool decay;
  };
  std::vector<Segment> segments;
};

CudaAdamW::CudaAdamW(Backend& cuda_backend, size_t offset, size_t count, const float* init_master)
    : s_(std::make_unique<State>()) {
  s_->backend = dynamic_cast<CudaBackend*>(&cuda_backend);
  YUAN_CHECK(s_->backend, "GPU AdamW needs the cuda backend, not '%s'", cuda_backend.name());
  YUAN_CHECK(offset + count <= cuda_backend.padded_size(), "GPU AdamW: range [%zu, %zu) outside the %zu parameters",
             offset, offset + count, cuda_backend.padded_size());
  s_->offset = offset;
  s_->count = count;
  const size_t bytes = 3 * count * sizeof(float);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  YUAN_CHECK(bytes <= free_bytes, "GPU AdamW: needs %.2f GiB for the fp32 master weights and moments of %zu "
             "parameters, device has %.2f GiB free; keep the optimizer on the host (optim.offload)", bytes / kGiB,
             count, free_bytes / kGiB);
  CUDA_CHECK(cudaMalloc(&s_->state, bytes));
  cudaStream_t st = s_->backend->cuda_stream();
  CUDA_CHECK(cudaMemcpyAsync(s_->state, init_master, count * sizeof(float), cudaMemcpyHostToDevice, st));
  CUDA_CHECK(cudaMemsetAsync(s_->state + count, 0, 2 * count * sizeof(float), st));
  CUDA_CHECK(cudaStreamSynchronize(st));

  const ParamLayout& layout = cuda_backend.layout();
  auto add = [&](size_t begin, size_t end, bool decay) {
    begin = std::max(begin, offset);
    end = std::min(end, offset + count);
    if (begin >= end) return;
    if (!s_->segments.empty() && s_->segments.back().decay == decay) {
      s_->segments.back().count += end - begin;
      return;
    }
    s_->segments.push_back({begin, end - begin, decay});
  };
  for (const TensorSpec& t : layout.tensors()) add(t.offset, t.offset + t.numel, t.decay);
  add(layout.total(), cuda_backend.padded_size(), false);
}

CudaAdamW::~CudaAdamW() {
  if (s_ && s_->state) cudaFree(s_->state);
}

double CudaAdamW::grad_sum_squares() {
  return gpu::sum_squares(s_->backend->grads() + s_->offset, s_->count, s_->backend->sumsq_scratch(),
                          s_->backend->cuda_stream());
}

void CudaAdamW::step(const ops::AdamWHyper& h) {
  CudaBackend& be = *s_->backend;
  float *master = s_->state, *m = master + s_->count, *v = m + s_->count;
  for (const State::Segment& seg : s_->segments) {
    ops::AdamWHyper hs = h;
    hs.weight_decay = seg.decay ? h.weight_decay : 0.0;
    const size_t i = seg.offset - s_->offset;
    gpu::adamw_update(master + i, m + i, v + i, be.grads() + seg.offset, be.params() + seg.offset, seg.count, hs,
                      be.cuda_stream());
  }
  CUDA_CHECK(cudaStreamSynchronize(be.cuda_stream()));
}

void CudaAdamW::master_to_host(float* dst) {
  CUDA_CHECK(cudaMemcpyAsync(dst, s_->state, s_->count * sizeof(float), cudaMemcpyDeviceToHost,
                             s_->backend->cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(s_->backend->cuda_stream()));
}

}  // namespace yuan
