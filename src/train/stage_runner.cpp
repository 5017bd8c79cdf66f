#include "train/stage_runner.h"

#include "util/error.h"
#include "util/log.h"

namespace yuan {

StageRunner::StageRunner(Program& program, Backend& backend, Communicator* pipeline, int stage, int stages,
                         int micro_batch)
    : program_(program), backend_(backend), pipe_(pipeline), stage_(stage), stages_(stages),
      micro_batch_(micro_batch) {
  YUAN_CHECK(stages == 1 || (pipe_ && pipe_->size() == stages && pipe_->rank() == stage),
             "stage runner: stage %d of %d without its pipeline communicator", stage, stages);
  YUAN_CHECK(program.embeds() == (stage == 0) && program.runs_head() == (stage == stages - 1),
             "stage runner: stage %d of %d runs a program that %s and %s", stage, stages,
             program.embeds() ? "embeds" : "does not embed", program.runs_head() ? "heads" : "does not head");
  if (!program.runs_head()) {
    const Tensor out = program.input_buffer(0, micro_batch);  // the shape of this stage's output as well
    recv_mem_ = backend.alloc(out.numel() * sizeof(float), Mem::Comm);
    recv_grad_ = Tensor(recv_mem_.as<void>(), DType::F32, out.rows, out.cols);
  }
}

static size_t bytes_of(const Tensor& t) { return t.numel() * dtype_size(t.dtype); }

void StageRunner::exchange(void* buf, size_t bytes, int peer) {
  if (!pipe_) return;
  if (pending_.bytes && pending_.peer == peer) {
    pipe_->send_recv(pending_.buf, pending_.bytes, pending_.peer, buf, bytes, peer);
  } else {
    if (pending_.bytes) pipe_->send_recv(pending_.buf, pending_.bytes, pending_.peer, nullptr, 0, -1);
    if (bytes) pipe_->send_recv(nullptr, 0, -1, buf, bytes, peer);
  }
  pending_ = {};
  backend_.compute_after(pipe_->stream());
}

void StageRunner::forward(int slot, const int32_t* tokens) {
  if (!program_.embeds()) {
    const Tensor in = program_.input_buffer(slot, micro_batch_);
    exchange(in.data, bytes_of(in), stage_ - 1);
  } else {
    exchange(nullptr, 0, -1);
  }
  const double t0 = now_seconds();
  program_.forward(slot, tokens, micro_batch_);
  compute_seconds_ += now_seconds() - t0;
}

double StageRunner::run(const layout::Schedule& schedule, float grad_scale, const Hooks& hooks) {
  const double start = now_seconds();
  compute_seconds_ = 0;
  double loss = 0;
  const bool reads = program_.embeds() || program_.runs_head();
  for (const layout::PipeAction& a : schedule.actions()) {
    if (a.kind == layout::PipeAction::Forward) {
      if (hooks.before_forward) hooks.before_forward(a.micro);
      const int32_t* tokens = reads ? hooks.tokens() : nullptr;
      backend_.range_push("forward");
      forward(a.slot, tokens);
      const double t0 = now_seconds();
      if (program_.runs_head()) loss += program_.loss(a.slot, grad_scale);
      compute_seconds_ += now_seconds() - t0;
      if (!program_.runs_head()) {
        const Tensor out = program_.output(a.slot);
        pending_ = {out.data, bytes_of(out), stage_ + 1};
      }
    } else {
      backend_.range_push("backward");
      if (!program_.runs_head()) exchange(recv_grad_.data, bytes_of(recv_grad_), stage_ + 1);
      else exchange(nullptr, 0, -1);
      const double t0 = now_seconds();
      program_.backward(a.slot, program_.runs_head() ? Tensor() : recv_grad_, hooks.ready);
      compute_seconds_ += now_seconds() - t0;
      if (!program_.embeds()) {
        const Tensor g = program_.input_grad(a.slot);
        pending_ = {g.data, bytes_of(g), stage_ - 1};
      }
      if (hooks.after_backward) hooks.after_backward();
    }
    backend_.range_pop();
  }
  exchange(nullptr, 0, -1);
  step_seconds_ = now_seconds() - start;
  return loss;
}

std::optional<double> StageRunner::evaluate(int batches, const std::function<const int32_t*(int)>& tokens,
                                            const std::function<bool()>& stop) {
  double loss = 0;
  const bool reads = program_.embeds() || program_.runs_head();
  for (int i = 0; i < batches; i++) {
    forward(0, reads ? tokens(i) : nullptr);
    if (program_.runs_head()) {
      loss += program_.loss(0, 0.0f);
    } else {
      const Tensor out = program_.output(0);
      pending_ = {out.data, bytes_of(out), stage_ + 1};
    }
    if (!stop) continue;
    // A send held back to the next micro-batch would wait for a receive that the next stage only posts after the
    // check: every rank would sit in the check for ever.
    exchange(nullptr, 0, -1);
    if (stop()) return std::nullopt;
  }
  exchange(nullptr, 0, -1);
  return loss;
}

}  // namespace yuan
