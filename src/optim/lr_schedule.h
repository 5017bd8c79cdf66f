// Learning rate: linear warmup from lr/warmup_steps to lr over optim.warmup_steps, then cosine decay to
// optim.min_lr at the last step (step counts from 0).
#pragma once
#include "config/config.h"

namespace yuan {
double lr_at(const OptimConfig& o, int step, int total_steps);
}
