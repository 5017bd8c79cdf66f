#include "util/json.h"

#include "util/fs.h"

namespace yuan {

nlohmann::json read_json_object(const std::string& path, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(strf("%s: unreadable: %s", what.c_str(), e.what()));
  }
  YUAN_CHECK(j.is_object(), "%s: not a JSON object", what.c_str());
  return j;
}

}  // namespace yuan
