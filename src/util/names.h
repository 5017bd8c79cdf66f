// A value that is one of a few names (a deck key such as optim.offload = auto | host | none): an enum class whose
// values count from 0, with a specialisation of Names listing their names in that order. The deck's parsing, the
// text a run writes of it (config.ini, its hash, logs, the planner's overrides) and the errors that list what it
// takes all come from that one list, so code compares values and the text stays what the deck says.
#pragma once
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace yuan {

// Specialise as `template <> struct Names<E> { static constexpr std::array<const char*, N> names{...}; };`, the
// names in the order of E's values.
template <typename E>
struct Names;

template <typename E, typename = void>
struct is_named : std::false_type {};
template <typename E>
struct is_named<E, std::void_t<decltype(Names<E>::names)>> : std::true_type {};

template <typename E>
const char* name_of(E value) {
  return Names<E>::names[static_cast<size_t>(value)];
}

// The value named `text`; nullopt for any other text (the caller's error names the key: names_listed).
template <typename E>
std::optional<E> from_name(std::string_view text) {
  for (size_t i = 0; i < Names<E>::names.size(); ++i)
    if (text == Names<E>::names[i]) return static_cast<E>(i);
  return std::nullopt;
}

// The names as a sentence lists them, in order: "auto, host or none".
template <typename E>
std::string names_listed() {
  const auto& names = Names<E>::names;
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i]);
  return out;
}

}  // namespace yuan
