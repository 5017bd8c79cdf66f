#include "optim/lr_schedule.h"

#include <cmath>

namespace yuan {

double lr_at(const OptimConfig& o, int step, int total_steps) {
  if (step < o.warmup_steps) return o.lr * (step + 1) / o.warmup_steps;
  int decay_steps = total_steps - o.warmup_steps;
  if (decay_steps <= 1) return o.lr;
  double progress = static_cast<double>(step - o.warmup_steps) / (decay_steps - 1);
  if (progress > 1) progress = 1;
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1 + std::cos(M_PI * progress));
}

}  // namespace yuan
