// `yuanlm sample`: text from a checkpoint, one token at a time. Training put the eot id before every document,
// so the context starts with it and a prompt is read as the beginning of a document; sampling the eot id
// means the document has ended, and generation stops there (it is never printed). No KV cache: each token
// re-runs the model on the last seq_len tokens, which is fine for looking at what a run has learned.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "comm/world.h"
#include "prep/tokenizer.h"
#include "run/commands.h"
#include "util/error.h"
#include "util/log.h"
#include "util/rng.h"

namespace yuan {

namespace po = boost::program_options;

namespace {

// The next id among logits[0, n): argmax at temperature 0, else a draw from softmax(logits / temperature)
// restricted to the top_k largest (all when top_k is 0).
int pick(const float* logits, int n, double temperature, int top_k, Rng& rng) {
  if (temperature == 0) return static_cast<int>(std::max_element(logits, logits + n) - logits);
  float floor = -INFINITY;
  if (top_k > 0 && top_k < n) {
    std::vector<float> sorted(logits, logits + n);
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
    floor = sorted[top_k - 1];  // ties at the k-th value all stay in: still a function of the logits alone
  }
  const float top = *std::max_element(logits, logits + n);
  std::vector<double> p(n);
  double total = 0;
  for (int i = 0; i < n; i++) total += p[i] = logits[i] >= floor ? std::exp((logits[i] - top) / temperature) : 0.0;
  const double u = static_cast<double>(rng.next_u64() >> 11) * 0x1p-53 * total;  // [0, total)
  double acc = 0;
  int last = 0;
  for (int i = 0; i < n; i++) {
    if (p[i] == 0) continue;
    acc += p[i];
    last = i;
    if (u < acc) return i;
  }
  return last;  // u landed in the rounding gap at the top
}

}  // namespace

int sample_main(const std::vector<std::string>& args) {
  std::string checkpoint, prompt, device = "auto";
  long long n_tokens = 100;  // wider than int: 2^31 and more is refused by the limit below, not as "invalid"
  int top_k = 0;
  double temperature = 1.0;
  uint64_t seed = 1;
  po::options_description desc(
      "yuanlm sample: continue a prompt with a checkpoint's model\n\n"
      "usage: yuanlm sample --checkpoint DIR --prompt TEXT [options]\n\n"
      "Prints the prompt and its continuation. The context starts with the eot id, as every training document\n"
      "did; generation stops early when the model samples the eot id (the document ended).\n\noptions", kHelpWidth);
  desc.add_options()
      ("help,h", "print this help")
      ("checkpoint", po::value(&checkpoint)->required(),
       "a checkpoint directory (run/ckpt/step_N) or a run directory (its newest checkpoint)")
      ("prompt", po::value(&prompt)->default_value(prompt, "\"\""), "text to continue (empty: a document from scratch)")
      ("tokens", po::value(&n_tokens)->default_value(n_tokens)->notifier(at_least("sample", "--tokens", 1LL)),
       "tokens to generate at most; at most 100 x the model's seq_len")
      ("temperature",
       po::value(&temperature)->default_value(temperature)->notifier(at_least("sample", "--temperature", 0.0)),
       "softmax temperature; 0 is greedy (always the most likely token)")
      ("top-k", po::value(&top_k)->default_value(top_k)->notifier(at_least("sample", "--top-k", 0)),
       "sample among the k most likely tokens only (0: all)")
      ("seed", po::value(&seed)->default_value(seed), "random seed: the same seed gives the same text")
      ("device", po::value(&device)->default_value(device), "cpu | cuda | auto");
  if (!parse_command("sample", args, desc)) return 0;

  // The options are checked against the checkpoint's small files (its tokenizer among them) before its shards (tens
  // of GB for a large model) are read. What is wrong with the checkpoint itself is reported once they are verified:
  // a checkpoint that does not verify is refused as that, whatever else it lacks. Every rank reads and checks alone,
  // and a refusal is printed once (comm::refuse_together).
  CheckpointInfo info;
  std::unique_ptr<Tokenizer> tok;
  CheckpointModel m;
  comm::refuse_together([&] {
    info = read_checkpoint_info(checkpoint);
    // No KV cache: every token re-runs the model over the last seq_len tokens, and nothing is printed before the last
    // one. Once seq_len tokens are generated the prompt has left that window, and each further token follows from the
    // model's own output alone; a hundred windows of that is far past what sampling is for (seeing what a run has
    // learned), and with a full-context forward per token already hours on a CPU for a large model. Past it a value
    // is a mistake (2^31 tokens would run for weeks and hold ids of 8 GiB), refused before the shards are read.
    const long long max_tokens = 100LL * info.cfg.model.seq_len;
    YUAN_CHECK(n_tokens <= max_tokens, "sample: --tokens %lld is more than %lld, 100 times the model's context "
               "(seq_len %d) of checkpoint %s; give --tokens <= %lld", n_tokens, max_tokens, info.cfg.model.seq_len,
               info.dir.c_str(), max_tokens);
    if (!info.tokenizer.empty()) {
      tok = load_tokenizer(info.tokenizer);
      // A k past the tokenizer's ids would silently mean all of them, which 0 already says.
      YUAN_CHECK(top_k <= tok->vocab_size(), "sample: --top-k %d is more than the %d ids of tokenizer %s; give at "
                 "most %d (0: all)", top_k, tok->vocab_size(), info.tokenizer.c_str(), tok->vocab_size());
    }
    m = load_checkpoint_model(info);
    YUAN_CHECK(tok, "checkpoint %s has no tokenizer: its training shards had no manifest.json", m.dir.c_str());
    // Ids past the tokenizer's (a model vocabulary padded for speed) have no text: they are never sampled.
    YUAN_CHECK(tok->vocab_size() <= m.cfg.model.vocab_size && tok->eot_id() < m.cfg.model.vocab_size,
               "checkpoint %s: tokenizer %s has %d ids (eot %d), more than the model's vocab_size %d", m.dir.c_str(),
               m.tokenizer.c_str(), tok->vocab_size(), tok->eot_id(), m.cfg.model.vocab_size);
  });
  const GPTConfig& c = m.cfg.model;
  Replica model = checkpoint_replica(m, device, 1);

  std::vector<uint32_t> ids = {static_cast<uint32_t>(tok->eot_id())};
  tok->encode(prompt, ids);
  const size_t prompt_len = ids.size();
  Rng rng(seed, 0x5a391e);
  std::vector<float> logits(static_cast<size_t>(c.seq_len) * c.vocab_size);
  std::vector<int32_t> ctx;
  bool ended = false;
  const double t0 = now_seconds();
  for (long long i = 0; i < n_tokens && !ended; i++) {
    const size_t len = std::min<size_t>(ids.size(), c.seq_len);
    ctx.assign(ids.end() - len, ids.end());
    model.program->forward_logits(ctx.data(), static_cast<int>(len), logits.data());
    const int next = pick(logits.data() + (len - 1) * c.vocab_size, tok->vocab_size(), temperature, top_k, rng);
    ended = next == tok->eot_id();
    if (!ended) ids.push_back(static_cast<uint32_t>(next));
  }
  // Decoding prompt and continuation together keeps the space a SentencePiece piece carries at its front.
  const std::string text = tok->decode(ids);
  if (process_rank() == 0) {
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "sample: %zu prompt + %zu generated tokens%s, %.2f s (checkpoint %s, seed %llu)\n",
                 prompt_len - 1, ids.size() - prompt_len, ended ? ", stopped at eot" : "", now_seconds() - t0,
                 m.dir.c_str(), static_cast<unsigned long long>(seed));
  }
  return 0;
}

}  // namespace yuan
