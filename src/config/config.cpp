#include "config/config.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>

#include <boost/program_options.hpp>

#include "config/command_line.h"
#include "util/error.h"
#include "util/log.h"

namespace po = boost::program_options;

namespace yuan {

namespace {

// One row of the option table. Defaults are not stored here: they are the member initialisers in config.h and
// gpt.h, read back through a default Config, so there is a single source of truth.
struct Field {
  const char* key;
  // A vector holds a repeatable key's "NAME: ..." entries: each occurrence adds one, or replaces the one of the
  // same NAME.
  std::variant<bool*, int*, uint64_t*, double*, std::string*, std::vector<std::string>*, ZeroStage*, Offload*,
               AttentionKernels*>
      ptr;
  const char* help;
};

// The table, bound to the fields of `c`; deck order.
std::vector<Field> fields(Config& c) {
  return {
      {"model.n_layer", &c.model.n_layer, "transformer blocks (required)"},
      {"model.n_head", &c.model.n_head, "attention heads per block; must divide n_embd (required)"},
      {"model.n_embd", &c.model.n_embd, "residual stream width (required)"},
      {"model.seq_len", &c.model.seq_len, "context length in tokens (required)"},
      {"model.vocab_size", &c.model.vocab_size, "token ids are < vocab_size; match the tokenizer (required)"},
      {"model.attention", &c.model.attention,
       "attention kernels on a GPU: auto (cuDNN's fused attention where it runs the shape, else own), cudnn "
       "(refuse to start without it) or own (this project's)"},
      {"data.train", &c.data.train, "glob of training shards (*.h5)"},
      {"data.val", &c.data.val, "glob of validation shards; empty: no evaluation"},
      {"data.prefetch", &c.data.prefetch, "micro-batches read ahead by the loader thread"},
      {"train.micro_batch", &c.train.micro_batch, "sequences per forward/backward on one rank"},
      {"train.global_batch", &c.train.global_batch,
       "sequences per optimizer step over all ranks; a multiple of ranks x micro_batch"},
      {"train.steps", &c.train.steps, "optimizer steps"},
      {"train.seed", &c.train.seed, "seed for initialisation and data order"},
      {"train.device", &c.train.device, "cpu | cuda | auto (cuda when built with it and a GPU is visible)"},
      {"train.log_every", &c.train.log_every, "steps between log lines"},
      {"train.eval_every", &c.train.eval_every, "steps between val-loss evaluations; 0: only at start and end"},
      {"train.eval_batches", &c.train.eval_batches, "micro-batches per rank per evaluation"},
      {"train.recompute", &c.train.recompute,
       "keep only each block's output and recompute the block in backward: less activation memory (fits "
       "longer sequences) for about one more forward pass"},
      {"train.max_bad_steps", &c.train.max_bad_steps,
       "consecutive steps with a non-finite loss or gradient norm (each skipped) before the run stops"},
      {"init.from", &c.init.from,
       "a HuggingFace GPT-2 directory (config.json, model.safetensors) whose weights a fresh run starts from, "
       "checked against the model's shape; ignored once the run resumes a checkpoint; empty: random from train.seed"},
      {"optim.lr", &c.optim.lr, "peak learning rate, reached after warmup"},
      {"optim.warmup_steps", &c.optim.warmup_steps, "linear warmup steps"},
      {"optim.min_lr", &c.optim.min_lr, "learning rate at the end of the cosine decay"},
      {"optim.weight_decay", &c.optim.weight_decay, "AdamW decoupled weight decay (matrices and embeddings)"},
      {"optim.beta1", &c.optim.beta1, "Adam first-moment decay"},
      {"optim.beta2", &c.optim.beta2, "Adam second-moment decay"},
      {"optim.eps", &c.optim.eps, "Adam epsilon"},
      {"optim.grad_clip", &c.optim.grad_clip, "clip the global gradient L2 norm to this; 0 disables"},
      {"optim.zero", &c.optim.zero,
       "ZeRO stage: 0 replicated, 1 optimizer state sharded, 2 gradients too, 3 working weights too (gathered per "
       "module as the passes use them)"},
      {"optim.bucket_mb", &c.optim.bucket_mb, "gradient communication bucket size in MiB"},
      {"optim.delayed_update", &c.optim.delayed_update,
       "run step t's host AdamW beside step t+1's forward/backward; gradients see weights one step stale"},
      {"optim.offload", &c.optim.offload,
       "auto | host | none: the fp32 master weights and AdamW moments in host memory (host) or on the GPUs (none, "
       "any ZeRO stage); auto takes none where the rank's plan with them fits its GPU"},
      {"parallel.template", &c.parallel.templates,
       "(repeatable) a pipeline template, NAME: stage | stage | ..., a stage listing modules and ranges "
       "(wte, wpe, h.0-h.3, ln_f), or NAME: auto:K for K stages balanced by modelled cost"},
      {"parallel.pipelines", &c.parallel.pipelines,
       "the job's pipelines by template name, comma-separated (repeats allowed); empty: one pipeline per rank "
       "(data parallelism)"},
      {"parallel.microbatches", &c.parallel.microbatches,
       "NAME:M, ...: micro-batches per step of each template's pipelines; their sequences make train.global_batch"},
      {"parallel.schedule", &c.parallel.schedule, "1f1b | gpipe: the order of a step's passes on a pipeline stage"},
      {"parallel.tp_size", &c.parallel.tp_size, "tensor-parallel ranks per stage (1: none)"},
      {"dist.nccl_timeout_s", &c.dist.nccl_timeout_s,
       "CUDA on several ranks: an NCCL operation not done after this many seconds aborts the job"},
      {"dist.timeout_s", &c.dist.timeout_s,
       "seconds a rank may wait in one MPI collective or transfer (for a stopped, stuck or unreachable peer) before "
       "the job ends with a line naming the rank, operation and group; must exceed the longest work a rank does "
       "while its peers wait: the slowest stage's step, writing or reading its checkpoint shard, one evaluation "
       "micro-batch (NCCL operations: dist.nccl_timeout_s)"},
      {"run.dir", &c.run.dir, "directory for logs, config.ini and checkpoints"},
      {"ckpt.every", &c.ckpt.every, "steps between checkpoints; 0: only at the end and on SIGTERM/SIGUSR1"},
      {"ckpt.keep", &c.ckpt.keep, "newest checkpoints kept in run.dir/ckpt"},
      {"ckpt.resume", &c.ckpt.resume,
       "auto: continue from the newest valid checkpoint in run.dir/ckpt, by run then step; none: start fresh (refused "
       "when run.dir/ckpt or node memory holds checkpoints of the run.dir); or a checkpoint dir"},
      {"ckpt.local_every", &c.ckpt.local_every,
       "steps between checkpoints in node memory (ckpt.local_dir), each rank's with a copy on a partner rank of the "
       "next node; written in the background, resumed from when newer than run.dir/ckpt's; 0: off"},
      {"ckpt.local_dir", &c.ckpt.local_dir,
       "node-local directory of those checkpoints (%h expands to the host name; empty: /dev/shm); each job keeps "
       "them in its own yuanlm-<16 hex digits of the sha256 of the absolute run.dir> under it"},
      {"profile.steps", &c.profile.steps,
       "A:B brackets steps A..B with cudaProfilerStart/Stop and NVTX phase ranges (nsys/ncu "
       "--profile-from-start off); empty: off"},
      {"profile.kernels", &c.profile.kernels,
       "A:B times every kernel, GEMM, copy and NCCL call of steps A..B with CUDA events (train.device=cuda): a "
       "table by op, phase and shape against the roofline, and run.dir/kernels.json; empty: off"},
  };
}

std::vector<Field> fields(const Config& c) {
  return fields(const_cast<Config&>(c));  // callers only read through these pointers
}

std::string format_double(double v) {
  char buf[32];
  // Shortest %g-style text that parses back to the same double: "0.0006", "1e-08", "0.30000000000000004".
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);
  return std::string(buf, r.ptr);
}

std::string render(const Field& f) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) return *p;
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) return p->empty() ? "" : p->back();
        else if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>) return format_double(*p);
        else if constexpr (std::is_same_v<T, ZeroStage>) return std::to_string(p->number());
        else if constexpr (is_named<T>::value) return name_of(*p);
        else return std::to_string(*p);
      },
      f.ptr);
}

// The NAME of a repeatable key's "NAME: ..." entry, trimmed; "" when there is none.
std::string entry_name(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return "";
  const size_t b = text.find_first_not_of(" \t"), e = text.find_last_not_of(" \t", colon - 1);
  return b < colon && e != std::string::npos && e >= b ? text.substr(b, e - b + 1) : "";
}

bool repeatable(const Field& f) { return std::holds_alternative<std::vector<std::string>*>(f.ptr); }

// Converts `text` into the field; `where` (the deck's path and ": ", or "") prefixes the error.
void assign(const Field& f, const std::string& text, const std::string& where) {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *p = text;
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          const std::string name = entry_name(text);
          if (name.empty())
            throw Error(strf("%s%s: '%s' does not start with a name and ':'", where.c_str(), f.key, text.c_str()),
                        true);
          auto same = std::find_if(p->begin(), p->end(), [&](const std::string& e) { return entry_name(e) == name; });
          if (same != p->end())
            *same = text;
          else
            p->push_back(text);
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text == "true" || text == "1" || text == "yes" || text == "on")
            *p = true;
          else if (text == "false" || text == "0" || text == "no" || text == "off")
            *p = false;
          else
            throw Error(strf("%s%s: '%s' is not true or false", where.c_str(), f.key, text.c_str()), true);
        } else if constexpr (std::is_same_v<T, ZeroStage>) {
          int number = 0;  // any integer: validate_optim_run names the stages it takes
          assign(Field{f.key, &number, f.help}, text, where);
          *p = ZeroStage(number);
        } else if constexpr (is_named<T>::value) {
          const std::optional<T> named = from_name<T>(text);
          if (!named)
            throw Error(strf("%s%s must be %s (got '%s')", where.c_str(), f.key, names_listed<T>().c_str(),
                             text.c_str()),
                        true);
          *p = *named;
        } else {
          const char* what = std::is_same_v<T, double> ? "a finite number"
                             : std::is_same_v<T, int>  ? "an integer"
                                                       : "a non-negative integer";
          auto r = std::from_chars(text.data(), text.data() + text.size(), *p);
          if (r.ec != std::errc() || r.ptr != text.data() + text.size() || !std::isfinite(static_cast<double>(*p)))
            throw Error(strf("%s%s: '%s' is not %s", where.c_str(), f.key, text.c_str(), what), true);
        }
      },
      f.ptr);
}

const Field* find_field(const std::vector<Field>& table, const std::string& key) {
  for (const Field& f : table)
    if (key == f.key) return &f;
  return nullptr;
}

size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string after_dot(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string did_you_mean(const std::string& key, const char* dashes) {
  std::string near = closest_key(key);
  return near.empty() ? "" : strf(" (did you mean '%s%s'?)", dashes, near.c_str());
}

// Every table key as a string-valued program_options option: conversion happens in assign(), which gives
// errors that name the key, and keeping parsed options unstored lets us see duplicates and their order.
po::options_description key_options() {
  po::options_description d;
  const Config defaults;
  for (const Field& f : fields(defaults)) d.add_options()(f.key, po::value<std::string>());
  return d;
}

void read_deck(const std::string& path, Config& c) {
  std::error_code ec;
  // An ifstream opens a directory and reads it as empty: the run would go on with the defaults.
  if (std::filesystem::is_directory(path, ec))
    throw Error(strf("deck %s is a directory, expected an INI file", path.c_str()), true);
  std::ifstream in(path);
  if (!in) throw Error(strf("cannot read config deck '%s'", path.c_str()), true);
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::parse_config_file(in, key_options(), /*allow_unregistered=*/true);
  } catch (const po::error& e) {
    throw Error(strf("%s: %s", path.c_str(), e.what()), true);
  }
  auto table = fields(c);
  // A deck is written as a whole, so a key or template set twice in it is a slip, whichever would win: the
  // command line is where values are replaced.
  std::set<std::string> seen;
  for (const po::option& o : parsed.options) {
    if (o.unregistered)
      throw Error(
          strf("%s: unknown key '%s'%s", path.c_str(), o.string_key.c_str(), did_you_mean(o.string_key, "").c_str()),
          true);
    const Field& f = *find_field(table, o.string_key);
    const std::string& value = o.value.at(0);
    const std::string name = entry_name(value);  // what a repeatable key's entry is known by
    if (!seen.insert(repeatable(f) ? o.string_key + ": " + name : o.string_key).second)
      throw Error(repeatable(f) ? strf("%s: %s '%s' is defined twice", path.c_str(), o.string_key.c_str(),
                                       name.c_str())
                                : strf("%s: key '%s' is set twice", path.c_str(), o.string_key.c_str()),
                  true);
    assign(f, value, path + ": ");
  }
}

void print_help(const std::string& command, const po::options_description* command_options) {
  say("usage: yuanlm %s [DECK] [--section.key=value ...]%s", command.c_str(),
      command_options ? " [options]" : "");
  if (command_options) {
    std::ostringstream out;
    out << *command_options;
    say("\noptions:\n%s", out.str().c_str());
  }
  say("  DECK (or --config DECK) is an INI file with [model] [data] [train] [optim] [parallel] [dist] [run] [ckpt] "
      "[profile] sections;");
  say("  --section.key=value (or --section.key value) overrides it. Defaults in parentheses.");
  std::string section;
  for (const ConfigOption& o : config_options()) {
    std::string s = o.key.substr(0, o.key.find('.'));
    if (s != section) say("\n[%s]", (section = s).c_str());
    std::string lhs = strf("  --%s (%s)", o.key.c_str(), o.default_value.c_str());
    say("%-36s %s", lhs.c_str(), o.help.c_str());
  }
}

void at_least(const char* key, double v, double lo) {
  if (!(v >= lo)) throw Error(strf("%s must be >= %g (got %.10g)", key, lo, v), true);
}
void above(const char* key, double v, double lo) {
  if (!(v > lo)) throw Error(strf("%s must be > %g (got %.10g)", key, lo, v), true);
}
// A deadline key: above 0, and at most 30 days, longer than any batch job. Far larger values would overflow the
// clocks the deadlines are kept in (int64 nanoseconds end at 292 years) into a deadline already past.
void deadline(const char* key, double seconds) {
  above(key, seconds, 0);
  constexpr double kMaxSeconds = 30 * 86400;
  if (seconds > kMaxSeconds)
    throw Error(strf("%s must be <= %.0f s (30 days: longer than any batch job; got %g)", key, kMaxSeconds, seconds),
                true);
}

}  // namespace

std::string Config::to_ini() const {
  std::string out, section;
  for (const Field& f : fields(*this)) {
    std::string key = f.key;
    std::string s = key.substr(0, key.find('.'));
    if (s != section) out += (section.empty() ? "[" : "\n[") + (section = s) + "]\n";
    if (auto* entries = std::get_if<std::vector<std::string>*>(&f.ptr)) {
      for (const std::string& e : **entries) out += after_dot(key) + " = " + e + "\n";
      continue;
    }
    out += after_dot(key) + " = " + render(f) + "\n";
  }
  return out;
}

uint64_t Config::hash() const {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64
  for (unsigned char ch : to_ini()) h = (h ^ ch) * 1099511628211ull;
  return h;
}

namespace {

// "section.key" -> its values (several for a repeatable key), in the order the text gives them.
std::vector<std::pair<std::string, std::vector<std::string>>> ini_values(const std::string& ini) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  std::istringstream in(ini);
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.size() > 1 && line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    const std::string key = section + "." + line.substr(0, eq);
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& kv) { return kv.first == key; });
    if (it == out.end()) it = out.insert(out.end(), {key, {}});
    it->second.push_back(line.substr(eq + 3));
  }
  return out;
}

std::string shown_values(const std::vector<std::string>* values) {
  if (!values) return "(not set)";
  std::string out;
  for (const std::string& v : *values) out += (out.empty() ? "'" : "; '") + v + "'";
  return out;
}

}  // namespace

std::string ini_difference(const std::string& ini_a, const std::string& name_a, const std::string& ini_b,
                           const std::string& name_b) {
  const auto a = ini_values(ini_a), b = ini_values(ini_b);
  auto find = [](const auto& kvs, const std::string& key) -> const std::vector<std::string>* {
    for (const auto& kv : kvs)
      if (kv.first == key) return &kv.second;
    return nullptr;
  };
  for (const auto* side : {&a, &b})
    for (const auto& kv : *side) {
      const std::vector<std::string>*va = find(a, kv.first), *vb = find(b, kv.first);
      if (va && vb && *va == *vb) continue;
      return strf("%s = %s on %s, %s on %s", kv.first.c_str(), shown_values(vb).c_str(), name_b.c_str(),
                  shown_values(va).c_str(), name_a.c_str());
    }
  return "";
}

std::vector<ConfigOption> config_options() {
  std::vector<ConfigOption> out;
  const Config defaults;  // the table points into it
  for (const Field& f : fields(defaults)) out.push_back({f.key, f.help, render(f)});
  return out;
}

std::string closest_key(const std::string& key) {
  std::string best;
  size_t best_d = SIZE_MAX;
  const Config defaults;
  for (const Field& f : fields(defaults)) {
    std::string k = f.key, tail = after_dot(k);
    // The tail match catches a key in the wrong section (lr under [train], for optim.lr) or with no section at all
    // ("n_layer").
    size_t d_full = levenshtein(key, k), d_tail = levenshtein(after_dot(key), tail);
    size_t d = std::min(d_full <= k.size() / 3 ? d_full : SIZE_MAX, d_tail <= tail.size() / 3 ? d_tail : SIZE_MAX);
    if (d < best_d) best_d = d, best = k;
  }
  return best;
}

namespace {
// "A:B" as {A, B}; {0, -1} when empty (validate_optim_run has checked the text).
std::pair<int, int> parse_window(const std::string& text) {
  int a = 0, b = -1;
  if (!text.empty()) std::sscanf(text.c_str(), "%d:%d", &a, &b);
  return {a, b};
}
}  // namespace

std::pair<int, int> ProfileConfig::window() const { return parse_window(steps); }
std::pair<int, int> ProfileConfig::kernel_window() const { return parse_window(kernels); }

bool parse_config(const std::vector<std::string>& args, const std::string& command, Config& out,
                  const po::options_description* command_options, po::variables_map* command_values) {
  po::options_description cli;
  cli.add_options()("help,h", "")("config", po::value<std::string>());
  cli.add(key_options());
  if (command_options) cli.add(*command_options);
  po::positional_options_description positional;
  positional.add("config", 1);
  po::parsed_options parsed(nullptr);
  try {
    // No guessing: an abbreviated key would silently bind to whichever option it prefixes.
    parsed = po::command_line_parser(split_empty_values(args))
                 .options(cli)
                 .positional(positional)
                 .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
                 .allow_unregistered()
                 .run();
  } catch (const po::error& e) {
    throw Error(strf("command line: %s", e.what()), true);
  }

  std::string deck;
  for (const po::option& o : parsed.options) {
    if (o.string_key == "help") {
      print_help(command, command_options);
      return false;
    }
    if (o.unregistered) {
      std::string given = o.original_tokens.at(0).substr(0, o.original_tokens[0].find('='));
      std::string key = given.substr(given.find_first_not_of('-'));
      throw Error(strf("unknown option '%s'%s", given.c_str(), did_you_mean(key, "--").c_str()), true);
    }
    if (o.string_key == "config") {
      if (!deck.empty())
        throw Error(strf("two config decks given: '%s' and '%s'", deck.c_str(), o.value.at(0).c_str()), true);
      deck = o.value.at(0);
    }
  }

  Config c;
  if (!deck.empty()) read_deck(deck, c);
  // Command line after the deck so it wins; a key repeated on the command line takes its last value, which lets
  // job scripts append overrides.
  auto table = fields(c);
  for (const po::option& o : parsed.options)
    if (const Field* f = find_field(table, o.string_key)) assign(*f, o.value.at(0), "");
  if (command_options && command_values) {
    po::parsed_options own(command_options);
    for (const po::option& o : parsed.options)
      if (command_options->find_nothrow(o.string_key, false)) own.options.push_back(o);
    try {
      po::store(own, *command_values);
      po::notify(*command_values);
      check_numbers(command.c_str(), own, *command_values);
    } catch (const po::error& e) {
      throw Error(strf("%s: %s (see yuanlm %s --help)", command.c_str(), e.what(), command.c_str()), true);
    }
  }
  out = c;
  return true;
}

void validate_model_data_train(const Config& c) {
  at_least("model.n_layer", c.model.n_layer, 1);
  at_least("model.n_head", c.model.n_head, 1);
  at_least("model.n_embd", c.model.n_embd, 1);
  at_least("model.seq_len", c.model.seq_len, 1);
  at_least("model.vocab_size", c.model.vocab_size, 2);  // the upper bound (2^31-1) is enforced by int parsing
  if (c.model.n_embd % c.model.n_head != 0)
    throw Error(strf("model.n_embd (%d) must be divisible by model.n_head (%d)", c.model.n_embd, c.model.n_head),
                true);

  if (c.data.train.empty()) throw Error("data.train must name the training shards (a glob of *.h5)", true);
  at_least("data.prefetch", c.data.prefetch, 1);

  at_least("train.micro_batch", c.train.micro_batch, 1);
  at_least("train.global_batch", c.train.global_batch, 1);
  at_least("train.steps", c.train.steps, 1);
  at_least("train.log_every", c.train.log_every, 1);
  at_least("train.eval_every", c.train.eval_every, 0);
  at_least("train.eval_batches", c.train.eval_batches, 1);
  at_least("train.max_bad_steps", c.train.max_bad_steps, 1);
}

void validate_dist(const Config& c) {
  deadline("dist.nccl_timeout_s", c.dist.nccl_timeout_s);
  deadline("dist.timeout_s", c.dist.timeout_s);
}

namespace {
// A window of steps "A:B" (empty: off), 1-based and inclusive, that ends within train.steps; `unfinished` says
// what a window past the last step would leave undone.
void check_step_window(const char* key, const std::string& text, int train_steps, const char* unfinished) {
  if (text.empty()) return;
  int a = 0, b = 0;
  char end = 0;
  if (std::sscanf(text.c_str(), "%d:%d%c", &a, &b, &end) != 2 || a < 1 || b < a)
    throw Error(strf("%s must be A:B with 1 <= A <= B (got '%s')", key, text.c_str()), true);
  if (b > train_steps)
    throw Error(strf("%s %s ends after train.steps (%d): %s", key, text.c_str(), train_steps, unfinished), true);
}
}  // namespace

void validate_optim_run(const Config& c) {
  const OptimConfig& o = c.optim;
  above("optim.lr", o.lr, 0);
  at_least("optim.min_lr", o.min_lr, 0);
  if (o.min_lr > o.lr)
    throw Error(strf("optim.min_lr (%g) must be <= optim.lr (%g)", o.min_lr, o.lr), true);
  at_least("optim.warmup_steps", o.warmup_steps, 0);
  at_least("optim.weight_decay", o.weight_decay, 0);
  for (auto [key, beta] : {std::pair{"optim.beta1", o.beta1}, std::pair{"optim.beta2", o.beta2}})
    if (!(beta >= 0 && beta < 1)) throw Error(strf("%s must be in [0, 1) (got %g)", key, beta), true);
  above("optim.eps", o.eps, 0);
  at_least("optim.grad_clip", o.grad_clip, 0);
  if (!o.zero.valid()) throw Error(strf("optim.zero must be 0, 1, 2 or 3 (got %d)", o.zero.number()), true);
  above("optim.bucket_mb", o.bucket_mb, 0);
  validate_dist(c);

  if (c.run.dir.empty()) throw Error("run.dir must not be empty", true);
  at_least("ckpt.every", c.ckpt.every, 0);
  at_least("ckpt.keep", c.ckpt.keep, 1);
  at_least("ckpt.local_every", c.ckpt.local_every, 0);
  if (c.ckpt.resume.empty()) throw Error("ckpt.resume must be auto, none or a checkpoint directory", true);
  check_step_window("profile.steps", c.profile.steps, c.train.steps, "the profile would never be closed");
  check_step_window("profile.kernels", c.profile.kernels, c.train.steps, "the account would never be written");

  // Values each valid alone that together undo what they ask for: said once, at start.
  if (o.warmup_steps > c.train.steps)
    warn("optim.warmup_steps (%d) > train.steps (%d): the learning rate never reaches optim.lr (%g); the last step's "
         "is %.3g",
         o.warmup_steps, c.train.steps, o.lr, o.lr * c.train.steps / o.warmup_steps);
  if (c.ckpt.local_every >= c.train.steps)
    warn("ckpt.local_every (%d) >= train.steps (%d): no node-memory checkpoint is ever written (the last step's goes "
         "to run.dir/ckpt)",
         c.ckpt.local_every, c.train.steps);
}

}  // namespace yuan
