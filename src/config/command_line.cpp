#include "config/command_line.h"

#include <iostream>

#include "util/error.h"

namespace yuan {

namespace po = boost::program_options;

bool parse_command(const char* command, const std::vector<std::string>& args, const po::options_description& desc,
                   po::variables_map* out) {
  po::variables_map local;
  po::variables_map& vm = out ? *out : local;
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    if (vm.count("help")) {
      if (process_rank() == 0) std::cout << desc;
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(strf("%s: %s (see yuanlm %s --help)", command, e.what(), command), true);
  }
  return true;
}

}  // namespace yuan
