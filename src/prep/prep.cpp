#include "prep/prep.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>

#include "config/command_line.h"
#include "data/shard.h"
#include "prep/documents.h"
#include "prep/output_dir.h"
#include "prep/token_import.h"
#include "prep/tokenizer.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/rng.h"
#include "util/sha256.h"

namespace yuan {

namespace {

namespace fs = std::filesystem;
namespace po = boost::program_options;

struct PrepOptions {
  std::vector<std::string> inputs;
  std::string format = "auto", doc_sep = "line", tokenizer, out;
  bool train_tokenizer = false;
  SentencePieceTraining spm;
  uint64_t shard_tokens = 100000000;
  double val_fraction = 0.01;
  uint64_t val_docs = 0;
  uint64_t seed = 1;
  int threads = 0;
};

struct ShardRecord {
  std::string file;
  uint64_t tokens = 0, docs = 0;
  std::string sha256;
};

// Writes <dir>/<split>_NNNNN.h5 shards of `shard_tokens` each, documents running on across shard ends. The
// corpus's last shard would be arbitrarily short and might not hold one training window, so a full shard is
// held open while up to half a shard more arrives: a remainder below that is appended to it, a longer one
// starts the next shard.
class ShardSequence {
 public:
  ShardSequence(const std::string& dir, const std::string& split, const ShardMeta& meta, uint64_t shard_tokens)
      : dir_(dir), split_(split), meta_(meta), full_(shard_tokens), tail_cap_(std::max<uint64_t>(1, shard_tokens / 2)) {}

  void add_document(const std::vector<uint32_t>& ids) { add(ids.data(), ids.size(), true); }

  // Appends `n` tokens, the first of them starting a document when `start`, else continuing the last one: a
  // document that arrives in pieces (an imported corpus) needs never be held whole.
  void add(const uint32_t* t, size_t n, bool start) {
    for (; n > 0; start = false) {
      if (!cur_) open_next();
      size_t k;
      if (cur_->tokens() < full_) {
        if (start) begin_document();
        k = std::min<uint64_t>(n, full_ - cur_->tokens());
        cur_->append(t, k);
      } else {
        if (start) tail_starts_.push_back(tail_.size());
        k = std::min<uint64_t>(n, tail_cap_ - tail_.size());
        tail_.insert(tail_.end(), t, t + k);
        if (tail_.size() == tail_cap_) {
          close_current();
          open_next();
          flush_tail();
        }
      }
      t += k, n -= k;
    }
  }

  std::vector<ShardRecord> finish() {
    if (cur_) {
      flush_tail();
      close_current();
    }
    return std::move(records_);
  }

 private:
  void begin_document() {
    cur_->begin_document();
    docs_++;
  }
  void open_next() {
    std::string file = strf("%s_%05zu.h5", split_.c_str(), records_.size());
    cur_ = std::make_unique<ShardWriter>((fs::path(dir_) / file).string(), meta_, full_ + tail_cap_);
    docs_ = 0;
  }
  // Appends the held-back tokens to the current shard, marking the documents that start inside them.
  void flush_tail() {
    size_t at = 0;
    for (size_t s : tail_starts_) {
      cur_->append(tail_.data() + at, s - at);
      begin_document();
      at = s;
    }
    cur_->append(tail_.data() + at, tail_.size() - at);
    tail_.clear();
    tail_starts_.clear();
  }
  void close_current() {
    std::string path = (fs::path(dir_) / strf("%s_%05zu.h5", split_.c_str(), records_.size())).string();
    uint64_t tokens = cur_->tokens();
    cur_->close();
    cur_.reset();
    records_.push_back({fs::path(path).filename().string(), tokens, docs_, sha256_file(path)});
  }

  std::string dir_, split_;
  ShardMeta meta_;
  uint64_t full_, tail_cap_;
  std::unique_ptr<ShardWriter> cur_;
  uint64_t docs_ = 0;
  std::vector<uint32_t> tail_;
  std::vector<size_t> tail_starts_;  // document starts inside tail_
  std::vector<ShardRecord> records_;
};

// Which documents are held out: decided by a hash of (seed, document index) alone, so the split depends on
// nothing but the input order and the seed.
uint64_t doc_hash(uint64_t seed, uint64_t i) { return splitmix64(splitmix64(seed) ^ splitmix64(i + 1)); }

// Documents with doc_hash below the returned bound go to validation. `count_documents` (a pass over the whole
// input) is called only for --val-docs.
uint64_t val_bound(const PrepOptions& o, const std::function<uint64_t()>& count_documents) {
  if (o.val_docs == 0) return static_cast<uint64_t>(std::ldexp(o.val_fraction, 64));
  std::priority_queue<uint64_t> smallest;  // the val_docs smallest hashes
  const uint64_t n = count_documents();
  for (uint64_t i = 0; i < n; i++) {
    smallest.push(doc_hash(o.seed, i));
    if (smallest.size() > o.val_docs) smallest.pop();
  }
  YUAN_CHECK(o.val_docs < n, "--val-docs %llu: the input has only %llu documents",
             static_cast<unsigned long long>(o.val_docs), static_cast<unsigned long long>(n));
  return smallest.top() + 1;
}

nlohmann::ordered_json shard_list(const std::vector<ShardRecord>& shards) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ShardRecord& r : shards)
    list.push_back({{"file", r.file}, {"tokens", r.tokens}, {"docs", r.docs}, {"sha256", r.sha256}});
  return list;
}

nlohmann::ordered_json source(const std::string& path, const char* format, uint64_t bytes, uint64_t docs) {
  return {{"path", path}, {"format", format}, {"bytes", bytes}, {"docs", docs}};
}

void write_manifest(const std::string& dir, const PrepOptions& o, const Tokenizer& tok,
                    const nlohmann::ordered_json& sources, const std::vector<ShardRecord>& train,
                    const std::vector<ShardRecord>& val) {
  const nlohmann::ordered_json manifest = {
      {"format_version", kShardFormatVersion},
      {"tokenizer", tok.name()},
      {"tokenizer_file", fs::path(o.tokenizer).filename().string()},
      {"vocab_size", tok.vocab_size()},
      {"eot_id", tok.eot_id()},
      {"seed", o.seed},
      {"sources", sources},
      {"train", shard_list(train)},
      {"val", shard_list(val)}};
  // Input paths are bytes, not necessarily UTF-8: a stray byte becomes U+FFFD rather than failing the run.
  write_file_atomic((fs::path(dir) / "manifest.json").string(),
                    manifest.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
}

bool parse_options(const std::vector<std::string>& args, PrepOptions& o) {
  po::options_description desc(
      "yuanlm prep: tokenize text into HDF5 shards (docs/FORMAT.md)\n\n"
      "Every document is written preceded by eot_id: the SentencePiece model's eos id, or a dedicated id\n"
      "(= piece count) for models without one; for vocab.txt, <eod> if present; for BPE, <|endoftext|>.\n\nOptions");
  desc.add_options()
      ("help,h", "print this help")
      ("input,i", po::value(&o.inputs)->multitoken()->required(), "input files or globs (several allowed)")
      ("format", po::value(&o.format)->default_value(o.format),
       "auto | text | jsonl | fortune; auto: by extension (.jsonl/.json/.ndjson, .txt), else by content.\n"
       "Already tokenized (ids kept, checked < the --tokenizer's vocab_size): megatron (each --input a PREFIX of\n"
       "Megatron-LM's PREFIX.idx/.bin; eot_id is put before each document) | llmc (llm.c's token files; a\n"
       "document starts at each eot_id of the --tokenizer, 50256 for GPT-2)")
      ("doc-sep", po::value(&o.doc_sep)->default_value(o.doc_sep),
       "text inputs: line (a document per line) | blank (documents separated by blank lines)")
      ("tokenizer", po::value(&o.tokenizer),
       "reuse a tokenizer: a SentencePiece FILE.model, a WordPiece vocab.txt (Yuan/ASC vocabulary), or a\n"
       "byte-level BPE: a HuggingFace tokenizer.json, or GPT-2's vocab.json + merges.txt (name either; the other\n"
       "is read from beside it), stored as OUT/tokenizer.json")
      ("train-tokenizer", po::bool_switch(&o.train_tokenizer),
       "train a byte-fallback BPE SentencePiece model on the input, saved as OUT/tokenizer.model")
      ("vocab-size", po::value(&o.spm.vocab_size)->default_value(o.spm.vocab_size),
       "--train-tokenizer: vocabulary size (the model's model.vocab_size must equal the shards')")
      ("character-coverage", po::value(&o.spm.character_coverage)->default_value(o.spm.character_coverage),
       "--train-tokenizer: share of characters covered by pieces, the rest spelled as bytes (0: as many\n"
       "characters as fit in 3/4 of the ids left after the 256 bytes and 3 specials, within [0.98, 0.9995];\n"
       "SentencePiece accepts 0.98 to 1)")
      ("tokenizer-sentences", po::value(&o.spm.sentences)->default_value(o.spm.sentences),
       "--train-tokenizer: lines sampled from the input for training (bounds time and memory)")
      ("out,o", po::value(&o.out)->required(),
       "output directory: train_NNNNN.h5, val_NNNNN.h5, manifest.json and the tokenizer; written beside it\n"
       "and swapped in once complete, so a failed prep leaves an earlier corpus there as it was")
      ("shard-tokens", po::value(&o.shard_tokens)->default_value(o.shard_tokens),
       "tokens per shard (the last shard of a split may hold up to 1.5x)")
      ("val-fraction", po::value(&o.val_fraction)->default_value(o.val_fraction),
       "share of documents held out for validation, chosen by a hash of (seed, document index)")
      ("val-docs", po::value(&o.val_docs)->default_value(o.val_docs),
       "hold out exactly this many documents instead of --val-fraction (0: use --val-fraction)")
      ("seed", po::value(&o.seed)->default_value(o.seed), "seed of the validation split and tokenizer sampling")
      ("threads", po::value(&o.threads)->default_value(o.threads),
       "tokenizer threads (0: all cores); the output does not depend on it");
  po::variables_map vm;
  if (!parse_command("prep", args, desc, &vm)) return false;
  YUAN_CHECK(o.train_tokenizer != !o.tokenizer.empty(), "prep: give exactly one of --tokenizer FILE and --train-tokenizer");
  YUAN_CHECK(!o.train_tokenizer || (o.format != "megatron" && o.format != "llmc"),
             "prep: --format %s holds token ids: give the --tokenizer that made them, not --train-tokenizer",
             o.format.c_str());
  YUAN_CHECK(o.doc_sep == "line" || o.doc_sep == "blank", "prep: --doc-sep %s: expected line or blank", o.doc_sep.c_str());
  YUAN_CHECK(o.spm.vocab_size >= 300, "prep: --vocab-size %d: need at least 300 (256 bytes + specials + pieces)",
             o.spm.vocab_size);
  YUAN_CHECK(o.spm.character_coverage == 0 ||
                 (o.spm.character_coverage >= kMinCharacterCoverage && o.spm.character_coverage <= 1),
             "prep: --character-coverage %g: expected 0 (automatic) or %g to 1, the range SentencePiece accepts",
             o.spm.character_coverage, kMinCharacterCoverage);
  YUAN_CHECK(o.shard_tokens > 0, "prep: --shard-tokens must be positive");
  YUAN_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "prep: --val-fraction %g outside [0, 1)", o.val_fraction);
  YUAN_CHECK(o.val_docs == 0 || vm["val-fraction"].defaulted(), "prep: give --val-fraction or --val-docs, not both");
  YUAN_CHECK(o.threads >= 0, "prep: --threads %d must be >= 0", o.threads);
  if (o.threads == 0) o.threads = omp_get_max_threads();
  o.spm.seed = o.seed;
  for (const std::string& in : o.inputs) o.spm.input += (o.spm.input.empty() ? "" : " ") + in;
  return true;
}

// The running totals on stderr: on a terminal every half second on one line, in a log every 10 s.
class Progress {
 public:
  void update(uint64_t docs, uint64_t tokens) {
    const double now = now_seconds();
    if (now - last_ <= (tty_ ? 0.5 : 10.0)) return;
    std::fprintf(stderr, "%sprep: %llu docs, %llu tokens, %.0f tokens/s%s", tty_ ? "\r" : "",
                 static_cast<unsigned long long>(docs), static_cast<unsigned long long>(tokens),
                 tokens / (now - start_), tty_ ? "" : "\n");
    last_ = now;
  }
  void finish() const {
    if (tty_ && last_ > start_) std::fputc('\n', stderr);
  }
  double start() const { return start_; }

 private:
  double start_ = now_seconds(), last_ = start_;
  bool tty_ = isatty(STDERR_FILENO);
};

struct Counts {
  uint64_t docs = 0, tokens = 0;
};

// Tokenizes the documents of `files` into train and val; returns the manifest's sources.
nlohmann::ordered_json tokenize_text(const PrepOptions& o, const std::vector<InputFile>& files, const Tokenizer& tok,
                                     uint64_t bound, ShardSequence& train, ShardSequence& val, Counts& c) {
  Documents docs(files, o.doc_sep == "blank");
  std::vector<uint64_t> file_docs(files.size());
  std::vector<std::string> block;
  std::vector<std::vector<uint32_t>> ids;
  Progress progress;
  for (;;) {
    // Blocks of documents are tokenized in parallel and written in input order: the output is the same for
    // any thread count.
    block.clear();
    size_t bytes = 0;
    for (std::string d; block.size() < 4096 && bytes < (16u << 20) && docs.next(d); bytes += block.back().size()) {
      block.push_back(std::move(d));
      file_docs[docs.file_index()]++;
    }
    if (block.empty()) break;
    ids.resize(block.size());
    std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 4) num_threads(o.threads)
    for (size_t i = 0; i < block.size(); i++) {
      try {
        ids[i].assign(1, static_cast<uint32_t>(tok.eot_id()));
        tok.encode(block[i], ids[i]);
      } catch (...) {
#pragma omp critical
        error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    for (size_t i = 0; i < block.size(); i++, c.docs++) {
      (doc_hash(o.seed, c.docs) < bound ? val : train).add_document(ids[i]);
      c.tokens += ids[i].size();
    }
    progress.update(c.docs, c.tokens);
  }
  progress.finish();
  nlohmann::ordered_json sources = nlohmann::ordered_json::array();
  for (size_t i = 0; i < files.size(); i++)
    sources.push_back(source(files[i].path, input_format_name(files[i].format),
                             static_cast<uint64_t>(fs::file_size(files[i].path)), file_docs[i]));
  return sources;
}

// Copies the documents of an already tokenized corpus into train and val; returns the manifest's sources.
nlohmann::ordered_json import_corpus(const PrepOptions& o, TokenFormat format, std::vector<TokenSource>& files,
                                     const Tokenizer& tok, uint64_t bound, ShardSequence& train, ShardSequence& val,
                                     Counts& c) {
  Progress progress;
  ShardSequence* to = &train;
  import_tokens(format, files, tok.vocab_size(), tok.eot_id(), [&](const uint32_t* ids, size_t n, bool start) {
    if (start) {
      to = doc_hash(o.seed, c.docs) < bound ? &val : &train;
      c.docs++;
      progress.update(c.docs, c.tokens);
    }
    to->add(ids, n, start);
    c.tokens += n;
  });
  progress.finish();
  nlohmann::ordered_json sources = nlohmann::ordered_json::array();
  for (const TokenSource& f : files) sources.push_back(source(f.path, o.format.c_str(), f.bytes, f.docs));
  return sources;
}

}  // namespace

int prep_main(const std::vector<std::string>& args) {
  PrepOptions o;
  if (!parse_options(args, o)) return 0;
  const double t0 = now_seconds();
  const bool imported = o.format == "megatron" || o.format == "llmc";
  const TokenFormat token_format = o.format == "megatron" ? TokenFormat::Megatron : TokenFormat::Llmc;
  const std::vector<InputFile> files =
      imported ? std::vector<InputFile>{} : expand_inputs(o.inputs, parse_input_format(o.format));
  std::vector<TokenSource> token_files = imported ? token_sources(token_format, o.inputs) : std::vector<TokenSource>{};
  const bool blank = o.doc_sep == "blank";
  // A tokenizer brought along is checked before anything is written, and copied into the corpus: the manifest
  // names a file that lives and dies with the shards, even when it came from the directory being replaced.
  std::unique_ptr<Tokenizer> tok = o.train_tokenizer ? nullptr : load_tokenizer(o.tokenizer);
  StagedOutput out(o.out);
  // With --val-docs this reads the whole input, so a bad byte, a bad id or too few documents show before any
  // training.
  const uint64_t bound = val_bound(o, [&] {
    uint64_t n = 0;
    if (imported) {
      import_tokens(token_format, token_files, tok->vocab_size(), tok->eot_id(),
                    [&](const uint32_t*, size_t, bool start) { n += start; });
    } else {
      Documents docs(files, blank);
      for (std::string d; docs.next(d);) n++;
    }
    return n;
  });
  if (o.train_tokenizer) {
    const std::string model = out.dir() + "/tokenizer.model";
    Documents docs(files, blank);
    train_sentencepiece(docs, o.spm, model);
    say("prep: trained tokenizer %s in %.1f s", (fs::path(o.out) / "tokenizer.model").c_str(), now_seconds() - t0);
    tok = load_tokenizer(model);
    o.tokenizer = model;
    // The trainer stops early when the text has no more merges to make.
    if (tok->vocab_size() < o.spm.vocab_size)
      warn("prep: the input holds too little text for --vocab-size %d: the tokenizer has %d pieces", o.spm.vocab_size,
           tok->vocab_size());
  } else {
    const StoredTokenizer stored = stored_tokenizer(o.tokenizer);
    const std::string copy = out.dir() + "/tokenizer" + stored.extension;
    // Not fs::copy_file: libstdc++ reports a short sendfile(2), which is what a full disk gives, as an I/O error.
    write_file_atomic(copy, stored.text);
    o.tokenizer = copy;
  }
  const ShardMeta meta{tok->vocab_size(), tok->eot_id(), tok->name()};

  const double t1 = now_seconds();
  ShardSequence train(out.dir(), "train", meta, o.shard_tokens), val(out.dir(), "val", meta, o.shard_tokens);
  Counts c;
  const nlohmann::ordered_json sources = imported
                                             ? import_corpus(o, token_format, token_files, *tok, bound, train, val, c)
                                             : tokenize_text(o, files, *tok, bound, train, val, c);
  YUAN_CHECK(c.docs > 0, "prep: the input (%s ...) holds no documents", o.inputs[0].c_str());
  const std::vector<ShardRecord> train_shards = train.finish(), val_shards = val.finish();
  YUAN_CHECK(!train_shards.empty(), "prep: every document went to validation; lower --val-fraction/--val-docs");
  if (val_shards.empty() && (o.val_fraction > 0 || o.val_docs > 0))
    warn("prep: no document went to validation (too few documents for --val-fraction %g)", o.val_fraction);
  write_manifest(out.dir(), o, *tok, sources, train_shards, val_shards);
  out.commit();

  auto total = [](const std::vector<ShardRecord>& v) {
    uint64_t n = 0;
    for (const auto& r : v) n += r.tokens;
    return static_cast<unsigned long long>(n);
  };
  const double dt = now_seconds() - t1;
  say("prep: %llu docs, %llu tokens in %.1f s (%.0f tokens/s, %d threads)", static_cast<unsigned long long>(c.docs),
      static_cast<unsigned long long>(c.tokens), dt, c.tokens / std::max(dt, 1e-9), o.threads);
  say("prep: train %llu tokens in %zu shards, val %llu tokens in %zu shards, in %s", total(train_shards),
      train_shards.size(), total(val_shards), val_shards.size(), o.out.c_str());
  say("prep: vocab_size %d, eot_id %d, tokenizer %s", tok->vocab_size(), tok->eot_id(), tok->name().c_str());
  say("prep: train with model.vocab_size=%d data.train=%s/train_*.h5 data.val=%s/val_*.h5", tok->vocab_size(),
      o.out.c_str(), o.out.c_str());
  return 0;
}

}  // namespace yuan
