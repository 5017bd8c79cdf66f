#include "data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "data/shard.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/memory.h"
#include "util/rng.h"

namespace yuan {

namespace {

std::vector<std::string> shard_paths(const std::string& pattern) {
  YUAN_CHECK(!pattern.empty(), "data: empty shard glob (set data.train / data.val)");
  std::vector<std::string> paths = expand_glob(pattern);
  YUAN_CHECK(!paths.empty(), "%s: no shard files match this glob", pattern.c_str());
  return paths;
}

void check_spec(const LoaderSpec& s) {
  YUAN_CHECK(s.seq_len > 0, "data: seq_len %d must be positive", s.seq_len);
  YUAN_CHECK(s.vocab_size > 0, "data: model.vocab_size %d must be positive", s.vocab_size);
  YUAN_CHECK(s.micro_batch > 0, "data: train.micro_batch %d must be positive", s.micro_batch);
  YUAN_CHECK(s.world > 0 && s.rank >= 0 && s.rank < s.world, "data: rank %d outside world %d", s.rank, s.world);
}

// The corpus as windows of seq_len+1 tokens at stride seq_len, numbered shard by shard in glob order.
class Corpus {
 public:
  explicit Corpus(const LoaderSpec& spec) : seq_len_(spec.seq_len) {
    check_spec(spec);
    uint64_t tokens = 0;
    first_.push_back(0);
    for (const std::string& path : shard_paths(spec.glob)) {
      auto shard = std::make_unique<ShardReader>(path, window());
      const ShardMeta& m = shard->meta();
      const char* p = path.c_str();
      if (!shards_.empty()) {
        const ShardMeta& m0 = shards_[0]->meta();
        const char* p0 = shards_[0]->path().c_str();
        YUAN_CHECK(m.vocab_size == m0.vocab_size, "%s: vocab_size %d differs from %d in %s", p, m.vocab_size,
                   m0.vocab_size, p0);
        YUAN_CHECK(m.tokenizer == m0.tokenizer, "%s: tokenizer '%s' differs from '%s' in %s", p, m.tokenizer.c_str(),
                   m0.tokenizer.c_str(), p0);
        YUAN_CHECK(m.eot_id == m0.eot_id, "%s: eot_id %d differs from %d in %s", p, m.eot_id, m0.eot_id, p0);
      }
      YUAN_CHECK(m.vocab_size == spec.vocab_size,
                 "%s: shard vocab_size %d but model.vocab_size = %d (the model must use the shards' vocabulary)", p,
                 m.vocab_size, spec.vocab_size);
      YUAN_CHECK(shard->tokens() >= window(), "%s: %llu tokens, shorter than one window of seq_len+1 = %zu", p,
                 static_cast<unsigned long long>(shard->tokens()), window());
      tokens += shard->tokens();
      first_.push_back(first_.back() + (shard->tokens() - 1) / seq_len_);
      shards_.push_back(std::move(shard));
    }
    say("data: %s: %zu shards, %llu tokens, %llu windows of %zu", spec.glob.c_str(), shards_.size(),
        static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(windows()), window());
  }
  size_t window() const { return static_cast<size_t>(seq_len_) + 1; }
  uint64_t windows() const { return first_.back(); }
  void read(uint64_t w, int32_t* out) {
    size_t s = std::upper_bound(first_.begin(), first_.end(), w) - first_.begin() - 1;
    shards_[s]->read((w - first_[s]) * seq_len_, window(), out);
  }

 private:
  int seq_len_;
  std::vector<std::unique_ptr<ShardReader>> shards_;
  std::vector<uint64_t> first_;  // first_[i]: index of shard i's first window; first_.back(): all windows
};

// A bijection on [0, n) keyed by (seed, epoch), in O(1) memory: a 4-round Feistel network permutes the
// smallest power-of-four domain >= n (under 4n), and cycle-walking re-applies it until the value lands below
// n, which keeps it a bijection on [0, n) and takes under 4 rounds on average.
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t seed, uint64_t epoch) : n_(n) {
    while ((uint64_t{1} << (2 * half_bits_)) < n) half_bits_++;
    mask_ = (uint64_t{1} << half_bits_) - 1;
    for (int r = 0; r < 4; r++) key_[r] = splitmix64(splitmix64(seed ^ splitmix64(epoch)) + r);
  }
  uint64_t operator()(uint64_t i) const {
    do i = feistel(i);
    while (i >= n_);
    return i;
  }

 private:
  uint64_t feistel(uint64_t x) const {
    uint64_t l = x >> half_bits_, r = x & mask_;
    for (uint64_t k : key_) {
      uint64_t t = l ^ (splitmix64(k ^ r) & mask_);
      l = r, r = t;
    }
    return (l << half_bits_) | r;
  }
  uint64_t n_, mask_ = 0;
  int half_bits_ = 0;
  uint64_t key_[4];
};

}  // namespace

// The spec with its data-parallel share spelled out as a slice when none is given.
LoaderSpec with_slice(LoaderSpec s) {
  if (s.slice_count == 0 && s.world > 0) {
    s.slice_count = s.global_batch / s.world;
    s.slice_first = s.rank * s.slice_count;
  }
  return s;
}

// Token ids of one micro-batch: micro_batch windows of seq_len + 1 (Corpus::window).
static size_t micro_batch_ids(const LoaderSpec& s) { return static_cast<size_t>(s.micro_batch) * (s.seq_len + 1); }

size_t train_loader_bytes(const LoaderSpec& s) {
  return (static_cast<size_t>(s.prefetch) + 1) * micro_batch_ids(s) * sizeof(int32_t);
}
size_t val_loader_bytes(const LoaderSpec& s) { return micro_batch_ids(s) * sizeof(int32_t); }

struct TrainLoader::Impl {
  LoaderSpec spec;
  Corpus corpus;
  uint64_t start;      // global sample where this loader began
  int micro_per_step;  // micro-batches per optimizer step of this reader
  std::vector<HostArray<int32_t>> ring;

  std::mutex mu;
  std::condition_variable cv;
  uint64_t produced = 0;  // micro-batches of this reader's stream filled, counted from `start`
  uint64_t consumed = 0;  // micro-batches handed out; the last one is still in the caller's hands
  bool stop = false;
  std::exception_ptr error;
  double wait = 0;
  std::thread thread;

  Impl(const LoaderSpec& s, uint64_t next_sample) : spec(with_slice(s)), corpus(s), start(next_sample) {
    YUAN_CHECK(s.global_batch > 0 && (s.slice_count > 0 || s.global_batch % (s.world * s.micro_batch) == 0),
               "data: train.global_batch %d must be a positive multiple of world %d x train.micro_batch %d",
               s.global_batch, s.world, s.micro_batch);
    YUAN_CHECK(spec.slice_count > 0 && spec.slice_count % s.micro_batch == 0 && spec.slice_first >= 0 &&
                   spec.slice_first + spec.slice_count <= s.global_batch,
               "data: sequences [%d, %d) of train.global_batch %d are not whole micro-batches of %d inside it",
               spec.slice_first, spec.slice_first + spec.slice_count, s.global_batch, s.micro_batch);
    YUAN_CHECK(s.prefetch > 0, "data: data.prefetch %d must be positive", s.prefetch);
    micro_per_step = spec.slice_count / s.micro_batch;
    for (int i = 0; i <= s.prefetch; i++) ring.emplace_back(micro_batch_ids(s), Mem::Data);
    thread = std::thread([this] { run(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }

  void fill(uint64_t m, int32_t* out) {
    const uint64_t n = corpus.windows();
    const uint64_t first = start + (m / micro_per_step) * spec.global_batch + spec.slice_first +
                           (m % micro_per_step) * spec.micro_batch;
    for (int row = 0; row < spec.micro_batch; row++) {
      const uint64_t g = first + row;
      corpus.read(Permutation(n, spec.seed, g / n)(g % n), out + row * corpus.window());
    }
  }

  void run() {
    try {
      for (uint64_t m = 0;; m++) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || m < consumed + spec.prefetch; });
          if (stop) return;
        }
        fill(m, ring[m % ring.size()].data());
        {
          std::lock_guard<std::mutex> lock(mu);
          produced = m + 1;
        }
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::current_exception();
      cv.notify_all();
    }
  }

  const int32_t* next() {
    std::unique_lock<std::mutex> lock(mu);
    consumed++;
    cv.notify_all();
    double t0 = now_seconds();
    cv.wait(lock, [&] { return produced >= consumed || error; });
    wait += now_seconds() - t0;
    if (error) std::rethrow_exception(error);
    return ring[(consumed - 1) % ring.size()].data();
  }

  uint64_t next_sample() const {
    uint64_t steps = (consumed + micro_per_step - 1) / micro_per_step;  // a step begun counts as taken
    return start + steps * spec.global_batch;
  }
};

TrainLoader::TrainLoader(const LoaderSpec& spec, uint64_t next_sample)
    : impl_(std::make_unique<Impl>(spec, next_sample)) {}
TrainLoader::~TrainLoader() = default;
const int32_t* TrainLoader::next_micro_batch() { return impl_->next(); }
uint64_t TrainLoader::next_sample() const { return impl_->next_sample(); }
uint64_t TrainLoader::epoch() const { return next_sample() / windows(); }
uint64_t TrainLoader::windows() const { return impl_->corpus.windows(); }
double TrainLoader::wait_seconds() const { return impl_->wait; }

struct ValLoader::Impl {
  LoaderSpec spec;
  Corpus corpus;
  int batches;
  HostArray<int32_t> buf;  // allocated once the set is known to fit: a micro-batch asked for can be gigabytes
  Impl(const LoaderSpec& s, int b, const char* glob_key, const char* batches_key, const char* micro_batch_key)
      : spec(s), corpus(s), batches(b) {
    YUAN_CHECK(b > 0, "data: %s %d must be positive", batches_key, b);
    const uint64_t windows = corpus.windows();
    const uint64_t per_batch = static_cast<uint64_t>(s.micro_batch) * s.world;  // windows read per batch index
    if (per_batch > windows) {
      // Fewer batches cannot help: the micro-batch must shrink, or, below one window per reader, the readers.
      const std::string fix =
          windows >= static_cast<uint64_t>(s.world)
              ? strf("give %s <= %llu", micro_batch_key, static_cast<unsigned long long>(windows / s.world))
              : strf("use at most %llu readers", static_cast<unsigned long long>(windows));
      throw Error(strf("%s = %s holds %llu windows of %zu tokens, fewer than one micro-batch reads (%s %d x %d "
                       "reader%s = %llu windows): %s or a larger validation set",
                       glob_key, s.glob.c_str(), static_cast<unsigned long long>(windows), corpus.window(),
                       micro_batch_key, s.micro_batch, s.world, s.world == 1 ? "" : "s",
                       static_cast<unsigned long long>(per_batch), fix.c_str()));
    }
    YUAN_CHECK(static_cast<uint64_t>(b) <= windows / per_batch,
               "%s = %s holds %llu windows of %zu tokens, fewer than one evaluation reads (%s %d x %d sequences x "
               "%d reader%s = %.0f windows): give %s <= %llu or a larger validation set",
               glob_key, s.glob.c_str(), static_cast<unsigned long long>(windows), corpus.window(), batches_key, b,
               s.micro_batch, s.world, s.world == 1 ? "" : "s", static_cast<double>(b) * static_cast<double>(per_batch),
               batches_key, static_cast<unsigned long long>(windows / per_batch));
    buf = HostArray<int32_t>(micro_batch_ids(s), Mem::Data);
  }
};

ValLoader::ValLoader(const LoaderSpec& spec, int batches, const char* glob_key, const char* batches_key,
                     const char* micro_batch_key)
    : impl_(std::make_unique<Impl>(spec, batches, glob_key, batches_key, micro_batch_key)) {}
ValLoader::~ValLoader() = default;
int ValLoader::batches() const { return impl_->batches; }

const int32_t* ValLoader::batch(int i) {
  Impl& v = *impl_;
  YUAN_CHECK(i >= 0 && i < v.batches, "data: validation batch %d outside [0, %d)", i, v.batches);
  for (int row = 0; row < v.spec.micro_batch; row++) {
    uint64_t j = (static_cast<uint64_t>(i) * v.spec.micro_batch + row) * v.spec.world + v.spec.rank;
    v.corpus.read(j, v.buf.data() + row * v.corpus.window());
  }
  return v.buf.data();
}

}  // namespace yuan
