// The learning-rate schedule: linear warmup to lr, then cosine to min_lr at the last step.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/lr_schedule.h"

namespace yuan {
namespace {

TEST(LrSchedule, WarmupThenCosineToMinLr) {
  OptimConfig o;
  o.lr = 1e-3;
  o.min_lr = 1e-4;
  o.warmup_steps = 10;
  const int steps = 110;
  for (int s = 0; s < 10; s++) EXPECT_DOUBLE_EQ(lr_at(o, s, steps), 1e-3 * (s + 1) / 10);
  EXPECT_DOUBLE_EQ(lr_at(o, 10, steps), 1e-3);                  // decay starts at the peak
  EXPECT_NEAR(lr_at(o, steps - 1, steps), 1e-4, 1e-15);         // ends exactly at min_lr
  for (int s = 11; s < steps; s++) EXPECT_LT(lr_at(o, s, steps), lr_at(o, s - 1, steps));
  // halfway through the decay the cosine is at its midpoint
  const int mid = 10 + 99 / 2;
  double progress = (mid - 10) / 99.0;
  EXPECT_NEAR(lr_at(o, mid, steps), 1e-4 + 0.5 * 9e-4 * (1 + std::cos(M_PI * progress)), 1e-15);
}

TEST(LrSchedule, NoWarmupAndStepsPastTheEndStayAtMinLr) {
  OptimConfig o;
  o.lr = 2.0;
  o.min_lr = 0.5;
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(lr_at(o, 0, 5), 2.0);
  EXPECT_DOUBLE_EQ(lr_at(o, 4, 5), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(o, 9, 5), 0.5);
}

}  // namespace
}  // namespace yuan
