// Byte-level BPE encoding throughput as `yuanlm prep` runs it (documents in parallel on every core, OpenMP), per
// core, against HuggingFace `tokenizers` (Tokenizer.encode_batch on as many Rayon threads, tools/bench/bpe_hf.py)
// on the same documents with the same tokenizer.json, in the same run. The documents: Debian's GPL-3 paragraphs
// (English, repeated) and the demo corpus's fortunes (Chinese), about 4 MB. The tokenizer: tests/data/bpe's
// (800 ids), or the tokenizer.json given as the first argument (e.g. GPT-2's own).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "prep/documents.h"
#include "prep/tokenizer.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/log.h"

using namespace yuan;

namespace {

constexpr int kReps = 3;
constexpr int kGplCopies = 60;

std::vector<std::string> documents() {
  std::vector<std::string> docs;
  const std::string gpl = read_text("/usr/share/common-licenses/GPL-3");
  for (int copy = 0; copy < kGplCopies; copy++)
    for (size_t pos = 0; pos < gpl.size();) {
      size_t end = gpl.find("\n\n", pos);
      end = end == std::string::npos ? gpl.size() : end;
      if (end > pos) docs.push_back(gpl.substr(pos, end - pos));
      pos = end + 2;
    }
  const std::string dir = "/usr/share/games/fortunes/";
  Documents fortunes(expand_inputs({dir + "tang300", dir + "song100", dir + "chinese"}, InputFormat::Fortune), false);
  for (std::string d; fortunes.next(d);) docs.push_back(std::move(d));
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string tokenizer = argc > 1 ? argv[1] : "tests/data/bpe/tokenizer.json";
  const int threads = omp_get_max_threads();
  const auto tok = load_tokenizer(tokenizer);
  const std::vector<std::string> docs = documents();
  size_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();

  std::vector<std::vector<uint32_t>> ids(docs.size());
  uint64_t tokens = 0;
  double best = 1e30;
  for (int rep = 0; rep <= kReps; rep++) {  // the first is the warm-up
    const double t0 = now_seconds();
#pragma omp parallel for schedule(dynamic, 4)
    for (size_t i = 0; i < docs.size(); i++) {
      ids[i].clear();
      tok->encode(docs[i], ids[i]);
    }
    if (rep > 0) best = std::min(best, now_seconds() - t0);
  }
  for (const auto& v : ids) tokens += v.size();
  const double ours = tokens / best;
  std::printf("bpe encode (yuanlm): %zu documents, %.1f MB, %llu tokens, %s: %.0f tokens/s per core "
              "(%.1f MB/s per core), %d threads\n",
              docs.size(), bytes / 1e6, static_cast<unsigned long long>(tokens), tok->name().substr(0, 19).c_str(),
              ours / threads, bytes / best / 1e6 / threads, threads);

  const std::string jsonl = "/tmp/bench_prep_bpe." + std::to_string(getpid()) + ".jsonl";
  {
    std::ofstream out(jsonl);
    for (const std::string& d : docs) out << nlohmann::json{{"text", d}}.dump() << "\n";
  }
  const std::string cmd =
      strf("/usr/bin/python3 tools/bench/bpe_hf.py %s %s %d 2>&1", tokenizer.c_str(), jsonl.c_str(), threads);
  FILE* f = popen(cmd.c_str(), "r");
  double peer = -1, fast = -1;
  unsigned long long peer_tokens = 0;
  std::string why;  // what the peer said instead of its numbers
  char line[512];
  while (f && std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "tokens %llu", &peer_tokens) != 1 && std::sscanf(line, "tokens_per_s %lf", &peer) != 1 &&
        std::sscanf(line, "fast_tokens_per_s %lf", &fast) != 1)
      why = line;
  }
  const bool ran = f && pclose(f) == 0 && peer > 0;
  std::remove(jsonl.c_str());
  if (!ran) {
    if (!why.empty() && why.back() == '\n') why.pop_back();
    std::printf("bpe encode vs HF tokenizers: no peer (%s); yuanlm alone: %.0f tokens/s per core\n",
                why.empty() ? "tools/bench/bpe_hf.py did not run" : why.c_str(), ours / threads);
    return 0;
  }
  // The same ids give the same count: a different count means the two did not tokenize alike.
  YUAN_CHECK(peer_tokens == tokens, "bench_prep_bpe: HF tokenizers made %llu tokens, yuanlm %llu",
             peer_tokens, static_cast<unsigned long long>(tokens));
  std::printf("bpe encode vs HF tokenizers (encode_batch, RAYON_NUM_THREADS=%d): %.0f vs %.0f tokens/s per core, "
              "ratio %.2fx\n",
              threads, ours / threads, peer / threads, ours / peer);
  if (fast > 0)
    std::printf("bpe encode vs HF tokenizers (encode_batch_fast, no offsets): %.0f vs %.0f tokens/s per core, "
                "ratio %.2fx\n",
                ours / threads, fast / threads, ours / fast);
  return 0;
}
