#include "data/manifest.h"

#include <filesystem>
#include <vector>

#include "util/error.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/sha256.h"

namespace yuan {
namespace fs = std::filesystem;

std::string find_tokenizer_for(const std::string& train_glob) {
  const std::vector<std::string> shards = expand_glob(train_glob);
  if (shards.empty()) return "";
  const fs::path dir = fs::path(shards[0]).parent_path();
  const fs::path manifest = dir / "manifest.json";
  if (!fs::exists(manifest)) return "";
  const nlohmann::json t = read_json_object(manifest.string(), manifest.string());
  const std::string file =
      t.contains("tokenizer_file") ? json_field<std::string>(t, "tokenizer_file", manifest) : "";
  if (file.empty()) return "";
  fs::path p = fs::path(file).is_absolute() ? fs::path(file) : dir / file;
  YUAN_CHECK(fs::exists(p), "%s names tokenizer '%s', which does not exist", manifest.c_str(), p.c_str());
  const std::string name = t.contains("tokenizer") ? json_field<std::string>(t, "tokenizer", manifest) : "";
  const std::string sum = sha256_file(p.string());
  YUAN_CHECK(name.size() >= sum.size() && name.compare(name.size() - sum.size(), sum.size(), sum) == 0,
             "%s: tokenizer '%s' has sha256 %s, the manifest says '%s'", manifest.c_str(), p.c_str(), sum.c_str(),
             name.c_str());
  return p.string();
}

}  // namespace yuan
