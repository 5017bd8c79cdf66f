// The manifest.json that `yuanlm prep` writes beside a corpus's shards (docs/FORMAT.md): what the corpus says
// about itself, read where training needs it.
#pragma once
#include <string>

namespace yuan {

// The tokenizer file behind a training glob: manifest.json beside the first shard names it ("" when there is
// no manifest, e.g. shards written by another tool).
std::string find_tokenizer_for(const std::string& train_glob);

}  // namespace yuan
