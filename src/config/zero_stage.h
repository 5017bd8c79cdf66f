// The ZeRO stage (optim.zero): how much of the training state the ranks of a data-parallel group split among them
// instead of each holding all of it. Each stage splits what the one below does and one thing more: 1 the optimizer
// state (fp32 master weights and AdamW moments), 2 the gradients too, 3 the working weights too. Code asks the
// questions below rather than comparing numbers, so that each test says what it depends on; the number is what the
// deck, the log, checkpoints' state.json and the planner's overrides show.
#pragma once

namespace yuan {

class ZeroStage {
 public:
  static constexpr int kHighest = 3;

  // Any integer: a stage parsed from a deck holds what was written until validate_optim_run refuses it by number,
  // in deck order with the other keys. The questions below are for a valid() stage.
  constexpr explicit ZeroStage(int number) : number_(number) {}

  constexpr int number() const { return number_; }
  constexpr bool valid() const { return number_ >= 0 && number_ <= kHighest; }

  // Each rank updates its part of the parameters: the gradients are reduce-scattered and the updated weights
  // all-gathered. Otherwise (stage 0) every rank holds the whole state, all-reduces the whole gradient, and updates
  // every parameter.
  constexpr bool shards_optimizer_state() const { return number_ >= 1; }
  // A rank keeps only its part of the reduced gradient: each micro-batch's gradient is reduced as its backward ends
  // (where the reductions can overlap the passes) instead of accumulating the whole gradient for one reduction.
  constexpr bool shards_gradients() const { return number_ >= 2; }
  // A rank holds only its part of the working weights: each module is gathered as a pass needs it and its gradient
  // reduced module by module, so every member of a group must run the same passes.
  constexpr bool shards_weights() const { return number_ >= 3; }

 private:
  int number_;
};

}  // namespace yuan
