// Reading the small JSON files yuanlm writes and reads back (checkpoint state, corpus manifests), with errors that
// name the file and the key.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "util/error.h"

namespace yuan {

// The JSON object in `path`; `what` names it in errors ("checkpoint DIR: state.json").
nlohmann::json read_json_object(const std::string& path, const std::string& what);

// A member of a JSON object that must be present and of the type T (integers non-negative).
template <typename T>
T json_field(const nlohmann::json& obj, const char* key, const std::string& what) {
  const auto it = obj.find(key);
  YUAN_CHECK(it != obj.end(), "%s: no \"%s\"", what.c_str(), key);
  const bool ok = std::is_same_v<T, std::string> ? it->is_string() : it->is_number_unsigned();
  YUAN_CHECK(ok, "%s: \"%s\" is not a %s", what.c_str(), key,
             std::is_same_v<T, std::string> ? "string" : "non-negative integer");
  return it->get<T>();
}

}  // namespace yuan
