// The commands that use a trained model: eval (validation loss, under mpirun or alone), sample (text from a
// prompt) and export (HuggingFace GPT-2 directory). Each takes a checkpoint directory or a run directory (its
// newest checkpoint) and builds the model from the checkpoint's config.ini and optimizer shards alone.
#pragma once
#include <string>
#include <vector>

#include "config/command_line.h"
#include "optim/replica.h"
#include "train/checkpoint.h"

namespace yuan {

int eval_main(const std::vector<std::string>& args);
int sample_main(const std::vector<std::string>& args);
int export_main(const std::vector<std::string>& args);
int plan_main(const std::vector<std::string>& args);

// The checkpoint's model on `device` (cpu | cuda | auto): a backend holding its weights and the program over every
// module, for micro-batches of up to `micro_batch` rows; no optimizer.
Replica checkpoint_replica(const CheckpointModel& m, const std::string& device, int micro_batch);

}  // namespace yuan
