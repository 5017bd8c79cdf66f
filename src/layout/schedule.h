// The order of one optimizer step's work on a pipeline stage: a Schedule lists the forward and backward passes of
// the step's micro-batches for stage `stage` of `stages`, and which activation slot each micro-batch occupies.
// The trainer walks the list; a stage with a neighbour exchanges activations (forward) and their gradients
// (backward) with it around each pass.
//
//   GPipe: every forward, then every backward in the same order. Simple, and the stage keeps the activations of
//          all m micro-batches.
//   1F1B:  (PipeDream-Flush, as Megatron-LM) stage s warms up with min(p-s-1, m) forwards, then alternates one
//          forward and one backward, then drains the remaining backwards. Same bubble as GPipe, (p-1)/(m+p-1) of
//          the step, with at most p-s micro-batches in flight.
// With one stage, 1F1B is forward, backward, forward, backward, ...: data parallelism with accumulation.
#pragma once
#include <vector>

namespace yuan::layout {

enum class ScheduleKind { GPipe, OneFOneB };
const char* schedule_name(ScheduleKind k);

struct PipeAction {
  enum Kind { Forward, Backward } kind;
  int micro;  // micro-batch index in the step, 0 .. m-1
  int slot;   // activation slot it uses from its forward to its backward
};

class Schedule {
 public:
  Schedule(ScheduleKind kind, int stage, int stages, int micro_batches);
  const std::vector<PipeAction>& actions() const { return actions_; }
  int slots() const { return slots_; }  // activation slots the stage needs: micro-batches in flight at most
  int micro_batches() const { return micro_batches_; }

 private:
  std::vector<PipeAction> actions_;
  int slots_ = 1, micro_batches_ = 1;
};

}  // namespace yuan::layout
