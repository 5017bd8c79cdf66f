// Command-line parsing shared by the subcommands that take plain options (prep, eval, sample, export; train
// reads decks through config.h).
#pragma once
#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace yuan {

// --help line width: the option texts are long.
constexpr unsigned kHelpWidth = 110;

// Parses `args` against `desc` (which must hold "help"); returns false when --help was asked (printed on
// rank 0). Errors name the command: "eval: ... (see yuanlm eval --help)". `vm`, when given, receives the parsed
// values (to ask which options kept their defaults).
bool parse_command(const char* command, const std::vector<std::string>& args,
                   const boost::program_options::options_description& desc,
                   boost::program_options::variables_map* vm = nullptr);

}  // namespace yuan
