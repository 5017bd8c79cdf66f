// One rank's pipeline stage at run time: a step's forward and backward passes in the schedule's order, with the
// activations received from the previous stage before a forward and sent to the next one after it, and their
// gradients coming back the other way around each backward. With one stage (data parallelism) there is nothing
// to exchange and a step is forward, loss, backward per micro-batch.
//
// Exchanges never wait on each other: a send is held back until the next pass, and when that pass receives from
// the same neighbour the two go as one send_recv (1F1B's steady state: send an activation forward and receive a
// gradient back at once; the next stage sends that gradient and receives the following activation). Every rank
// therefore meets its neighbours' transfers in the same order, whatever the schedule, with blocking transfers.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "layout/schedule.h"
#include "program/program.h"

namespace yuan {

class StageRunner {
 public:
  // `pipeline`: the pipeline group's communicator (stage ranks in order), null for a one-stage pipeline.
  StageRunner(Program& program, Backend& backend, Communicator* pipeline, int stage, int stages, int micro_batch);

  struct Hooks {
    std::function<const int32_t*()> tokens;       // the next micro-batch (called on stages that embed or head)
    ModuleReadyFn ready;                          // the program's ready hook
    std::function<void(int micro)> before_forward;  // before micro-batch `micro`'s forward
    std::function<void()> after_backward;         // after each backward
  };
  // One step's passes; each micro-batch's gradient is scaled by grad_scale. Returns the sum of the micro-batch
  // losses on a stage that heads, 0 elsewhere.
  double run(const layout::Schedule& schedule, float grad_scale, const Hooks& hooks);
  // Forward passes of `batches` micro-batches (tokens(i) for batch i, on stages that embed or head), one at a
  // time; returns the sum of their losses on a stage that heads, 0 elsewhere. `stop`, when given, is asked after
  // each micro-batch, with no transfer outstanding so that it may be collective; true ends the loop early and
  // evaluate returns nullopt.
  std::optional<double> evaluate(int batches, const std::function<const int32_t*(int)>& tokens,
                                 const std::function<bool()>& stop = {});

  // Of the last run(): its wall time, and the time spent in the program's passes (the rest waited for
  // neighbours or moved data). On a device backend the passes are enqueued, so this measures the host.
  double step_seconds() const { return step_seconds_; }
  double compute_seconds() const { return compute_seconds_; }

 private:
  struct Pending {  // a send held back to pair with the next receive
    const void* buf = nullptr;
    size_t bytes = 0;
    int peer = -1;
  };
  // Completes the held-back send, in one send_recv with receiving `bytes` into `buf` from `peer` when both go to
  // the same rank (0 bytes: nothing to receive).
  void exchange(void* buf, size_t bytes, int peer);
  void forward(int slot, const int32_t* tokens);

  Program& program_;
  Backend& backend_;
  Communicator* pipe_;
  int stage_, stages_, micro_batch_;
  Tensor recv_grad_;     // fp32 gradient of this stage's output, from the next stage
  Allocation recv_mem_;
  Pending pending_;
  double step_seconds_ = 0, compute_seconds_ = 0;
};

}  // namespace yuan
