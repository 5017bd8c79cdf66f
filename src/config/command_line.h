// Command-line parsing shared by the subcommands that take plain options (prep, eval, sample, export; train
// reads decks through config.h).
#pragma once
#include <boost/program_options.hpp>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace yuan {

// --help line width: the option texts are long.
constexpr unsigned kHelpWidth = 110;

// Parses `args` against `desc` (which must hold "help"); returns false when --help was asked (printed on
// rank 0). Errors name the command: "eval: ... (see yuanlm eval --help)". `vm`, when given, receives the parsed
// values (to ask which options kept their defaults). Every value goes through check_numbers().
bool parse_command(const char* command, const std::vector<std::string>& args,
                   const boost::program_options::options_description& desc,
                   boost::program_options::variables_map* vm = nullptr);

// `args` with "--key=" (an empty value) given as "--key" "": program_options refuses the first form, and an empty
// value is meaningful for some keys (--data.val= turns evaluation off); where it is not, the key's own conversion
// or check names it.
std::vector<std::string> split_empty_values(const std::vector<std::string>& args);

// Refuses what program_options' conversions let through for the options in `parsed` stored in `vm`: a floating
// value that is nan or infinite (a range check "must be >= 0" would misdescribe it), and a negative number for an
// unsigned option (which wraps to 2^64-1).
void check_numbers(const char* command, const boost::program_options::parsed_options& parsed,
                   const boost::program_options::variables_map& vm);

// Throws "COMMAND: OPTION must be >= LO (got V)" for a value below `lo`; with `finite` "must be a finite number
// >= LO", for nan and infinities too.
void check_at_least(const char* command, const char* option, double value, double lo, bool finite);

// A notifier for po::value(...)->notifier(): check_at_least() on the value given (finite for floating types). It
// runs before check_numbers(), so a range gets the fuller message.
template <typename T>
std::function<void(const T&)> at_least(const char* command, const char* option, T lo) {
  return [=](const T& v) {
    check_at_least(command, option, static_cast<double>(v), static_cast<double>(lo), std::is_floating_point_v<T>);
  };
}

}  // namespace yuan
