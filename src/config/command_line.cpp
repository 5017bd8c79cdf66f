#include "config/command_line.h"

#include <cmath>
#include <cstdint>
#include <iostream>
#include <typeinfo>

#include "util/error.h"

namespace yuan {

namespace po = boost::program_options;

std::vector<std::string> split_empty_values(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    if (a.size() > 3 && a.compare(0, 2, "--") == 0 && a.back() == '=' && a.find('=') == a.size() - 1) {
      out.push_back(a.substr(0, a.size() - 1));
      out.emplace_back();
    } else {
      out.push_back(a);
    }
  }
  return out;
}

void check_numbers(const char* command, const po::parsed_options& parsed, const po::variables_map& vm) {
  for (const po::option& o : parsed.options) {
    auto it = vm.find(o.string_key);
    if (it == vm.end() || o.value.empty()) continue;
    const std::type_info& type = it->second.value().type();
    const std::string& text = o.value.back();
    const bool is_unsigned = type == typeid(unsigned) || type == typeid(unsigned long) ||
                             type == typeid(unsigned long long);
    if (is_unsigned && text.find('-') != std::string::npos)
      throw Error(strf("%s: --%s must be a non-negative integer (got '%s')", command, o.string_key.c_str(),
                       text.c_str()),
                  true);
    const bool is_float = type == typeid(double) || type == typeid(float);
    const double v = type == typeid(double) ? it->second.as<double>()
                     : type == typeid(float) ? it->second.as<float>()
                                             : 0.0;
    if (is_float && !std::isfinite(v))
      throw Error(strf("%s: --%s must be a finite number (got '%s')", command, o.string_key.c_str(), text.c_str()),
                  true);
  }
}

void check_at_least(const char* command, const char* option, double value, double lo, bool finite) {
  if (!(value >= lo) || (finite && !std::isfinite(value)))
    throw Error(strf("%s: %s must be %s>= %g (got %.10g)", command, option, finite ? "a finite number " : "", lo, value),
                true);
}

bool parse_command(const char* command, const std::vector<std::string>& args, const po::options_description& desc,
                   po::variables_map* out) {
  po::variables_map local;
  po::variables_map& vm = out ? *out : local;
  try {
    const po::parsed_options parsed = po::command_line_parser(split_empty_values(args)).options(desc).run();
    po::store(parsed, vm);
    if (vm.count("help")) {
      if (process_rank() == 0) std::cout << desc;
      return false;
    }
    po::notify(vm);
    check_numbers(command, parsed, vm);
  } catch (const po::error& e) {
    throw Error(strf("%s: %s (see yuanlm %s --help)", command, e.what(), command), true);
  }
  return true;
}

}  // namespace yuan
