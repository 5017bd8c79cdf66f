// `yuanlm prep`: text, or a corpus another trainer tokenized, in; tokenized HDF5 shards out (docs/FORMAT.md).
// `args` is what follows "prep". Returns the exit code; bad input throws Error.
#pragma once
#include <string>
#include <vector>

namespace yuan {
int prep_main(const std::vector<std::string>& args);
}
