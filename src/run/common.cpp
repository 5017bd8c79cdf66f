#include <iostream>

#include "run/commands.h"
#include "util/error.h"

namespace yuan {

namespace po = boost::program_options;

bool parse_command(const char* command, const std::vector<std::string>& args, const po::options_description& desc) {
  po::variables_map vm;
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

std::unique_ptr<Backend> checkpoint_backend(const CheckpointModel& m, const std::string& device, int micro_batch) {
  std::unique_ptr<Backend> b = make_backend(device, m.cfg.model, micro_batch, m.weights.size());
  b->set_params(m.weights.data(), 0, m.weights.size());
  return b;
}

}  // namespace yuan
