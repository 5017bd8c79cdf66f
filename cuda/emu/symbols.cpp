// Names for reports, from the program's own symbol table (.symtab of /proc/self/exe): the function a kernel or an
// access belongs to, and the extent of every __shared__ array (cuda_runtime.h puts them in the yuan_emu_shared
// section). Read once, on the first report or shared access; a stripped binary gives "?" and no array extents.
#include <cxxabi.h>
#include <elf.h>
#include <link.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "emulator.h"

// Defined by the linker when the section exists (weak: a program without __shared__ variables has none).
extern "C" char __start_yuan_emu_shared[] __attribute__((weak));
extern "C" char __stop_yuan_emu_shared[] __attribute__((weak));

namespace yuan::emu {
namespace {

struct Symbol {
  uintptr_t begin;
  size_t bytes;
  std::string name;            // mangled
  mutable std::string pretty;  // demangled and shortened on first use: reports ask for few names, often
};

struct Symbols {
  std::vector<Symbol> functions, shared;  // sorted by address
};

int main_program_bias(dl_phdr_info* info, size_t, void* out) {
  *static_cast<uintptr_t*>(out) = info->dlpi_addr;
  return 1;  // the first object is the program itself
}

std::vector<char> read_file(const char* path) {
  std::vector<char> data;
  FILE* f = std::fopen(path, "rb");
  if (!f) return data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
  std::fclose(f);
  return data;
}

Symbols load() {
  Symbols out;
  const std::vector<char> elf = read_file("/proc/self/exe");
  if (elf.size() < sizeof(Elf64_Ehdr)) return out;
  uintptr_t bias = 0;
  dl_iterate_phdr(main_program_bias, &bias);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(elf.data());
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_shoff + eh->e_shnum * sizeof(Elf64_Shdr) > elf.size())
    return out;
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(elf.data() + eh->e_shoff);
  const char* section_names = elf.data() + sh[eh->e_shstrndx].sh_offset;
  int shared_index = -1;
  for (int i = 0; i < eh->e_shnum; i++)
    if (std::strcmp(section_names + sh[i].sh_name, "yuan_emu_shared") == 0) shared_index = i;
  for (int i = 0; i < eh->e_shnum; i++) {
    if (sh[i].sh_type != SHT_SYMTAB) continue;
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(elf.data() + sh[i].sh_offset);
    const char* names = elf.data() + sh[sh[i].sh_link].sh_offset;
    for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); k++) {
      const Elf64_Sym& s = syms[k];
      if (s.st_value == 0) continue;
      const Symbol sym{s.st_value + bias, s.st_size, names + s.st_name, {}};
      if (ELF64_ST_TYPE(s.st_info) == STT_FUNC)
        out.functions.push_back(sym);
      else if (ELF64_ST_TYPE(s.st_info) == STT_OBJECT && s.st_shndx == shared_index)
        out.shared.push_back(sym);
    }
  }
  for (auto* v : {&out.functions, &out.shared})
    std::sort(v->begin(), v->end(), [](const Symbol& a, const Symbol& b) { return a.begin < b.begin; });
  return out;
}

const Symbols& symbols() {
  static const Symbols s = load();
  return s;
}

const Symbol* containing(const std::vector<Symbol>& v, uintptr_t p) {
  auto it = std::upper_bound(v.begin(), v.end(), p, [](uintptr_t q, const Symbol& s) { return q < s.begin; });
  if (it == v.begin()) return nullptr;
  --it;
  return p < it->begin + std::max<size_t>(it->bytes, 1) ? &*it : nullptr;
}

// "void ns::kernel<64>(int, float*)" -> "ns::kernel<64>": drops a template's return type and the outermost trailing
// parameter list (the name itself may hold parentheses: "(anonymous namespace)").
std::string without_parameters(std::string s) {
  if (s.compare(0, 5, "void ") == 0) s.erase(0, 5);
  if (s.size() > 6 && s.compare(s.size() - 6, 6, " const") == 0) s.resize(s.size() - 6);
  if (s.empty() || s.back() != ')') return s;
  int depth = 0;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == ')') depth++;
    if (s[i] == '(' && --depth == 0) return s.substr(0, i);
  }
  return s;
}

std::string demangle(const std::string& mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : mangled;
  std::free(d);
  return out;
}

}  // namespace

std::string function_name(const void* pc) {
  const Symbol* s = containing(symbols().functions, reinterpret_cast<uintptr_t>(pc));
  if (!s) return "?";
  if (s->pretty.empty()) s->pretty = without_parameters(demangle(s->name));
  return s->pretty;
}

std::string mangled_name(const void* f) {
  const Symbol* s = containing(symbols().functions, reinterpret_cast<uintptr_t>(f));
  return s && s->begin == reinterpret_cast<uintptr_t>(f) ? s->name : std::string();
}

std::string code_site(const void* pc) {
  const Symbol* s = containing(symbols().functions, reinterpret_cast<uintptr_t>(pc));
  if (!s) return format("0x%zx", reinterpret_cast<uintptr_t>(pc));
  return function_name(pc) + format("+0x%zx", reinterpret_cast<uintptr_t>(pc) - s->begin);
}

std::vector<const void*> functions_containing(const char* fragment) {
  std::vector<const void*> out;
  for (const Symbol& s : symbols().functions)
    if (s.name.find(fragment) != std::string::npos) out.push_back(reinterpret_cast<const void*>(s.begin));
  return out;
}

bool shared_array(uintptr_t p, SharedArray* out) {
  const Symbol* s = containing(symbols().shared, p);
  if (!s) return false;
  if (s->pretty.empty()) {  // "f(int)::part": the function's parameters go, the array's name stays
    s->pretty = demangle(s->name);
    const size_t sep = s->pretty.rfind("::");
    if (sep != std::string::npos) s->pretty = without_parameters(s->pretty.substr(0, sep)) + s->pretty.substr(sep);
  }
  out->begin = s->begin;
  out->bytes = s->bytes;
  out->name = s->pretty.c_str();
  return true;
}

const std::vector<SharedArray>& shared_arrays() {
  static const std::vector<SharedArray> all = [] {
    std::vector<SharedArray> v;
    for (const Symbol& s : symbols().shared) {
      SharedArray a;
      shared_array(s.begin, &a);
      v.push_back(a);
    }
    return v;
  }();
  return all;
}

uintptr_t shared_section_begin() { return reinterpret_cast<uintptr_t>(__start_yuan_emu_shared); }
uintptr_t shared_section_end() { return reinterpret_cast<uintptr_t>(__stop_yuan_emu_shared); }

}  // namespace yuan::emu
