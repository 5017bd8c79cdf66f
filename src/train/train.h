#pragma once
#include <string>
#include <vector>

namespace yuan {
// `yuanlm train [DECK] [--section.key=value ...]`; returns the process exit code.
int train_main(const std::vector<std::string>& args);
}
