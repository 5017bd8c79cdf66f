#include "layout/schedule.h"

#include <algorithm>

#include "util/error.h"

namespace yuan::layout {

const char* schedule_name(ScheduleKind k) { return k == ScheduleKind::GPipe ? "gpipe" : "1f1b"; }

Schedule::Schedule(ScheduleKind kind, int stage, int stages, int m) : micro_batches_(m) {
  YUAN_CHECK(stages >= 1 && stage >= 0 && stage < stages && m >= 1, "schedule: stage %d of %d, %d micro-batches",
             stage, stages, m);
  // Backwards run in forward order on every stage, so a micro-batch's slot is its index modulo the slots: the
  // slot is free again by the time the micro-batch `slots` later runs its forward.
  slots_ = kind == ScheduleKind::GPipe ? m : std::min(stages - stage, m);
  int fwd = 0, bwd = 0;
  auto forward = [&] { actions_.push_back({PipeAction::Forward, fwd, fwd % slots_}), fwd++; };
  auto backward = [&] { actions_.push_back({PipeAction::Backward, bwd, bwd % slots_}), bwd++; };
  if (kind == ScheduleKind::GPipe) {
    while (fwd < m) forward();
  } else {
    const int warmup = std::min(stages - stage - 1, m);
    while (fwd < warmup) forward();
    while (fwd < m) {
      forward();
      backward();
    }
  }
  while (bwd < m) backward();
}

}  // namespace yuan::layout
