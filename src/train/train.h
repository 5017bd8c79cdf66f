#pragma once
#include <string>
#include <vector>

namespace yuan {
// Exit code after SIGTERM/SIGUSR1: the run checkpointed and wants to be requeued (EX_TEMPFAIL).
constexpr int kExitRequeue = 75;
// `yuanlm train [DECK] [--section.key=value ...]`; returns the process exit code.
int train_main(const std::vector<std::string>& args);
}
