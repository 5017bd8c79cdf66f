// Loader throughput: tokens/s that TrainLoader hands to one rank (world 1, gpt-small shape: seq_len 1024),
// against a plain sequential read(2) of the same shard files, against pread(2) of window-sized pieces at
// random places in them (what any reader of uniformly shuffled windows pays) and against what one H100
// consumes in gpt-small training. Writes a synthetic corpus first (uint16 tokens, like a 50k GPT-2
// vocabulary) and removes it after.
//   bin/bench_loader [--dir /tmp/yuan_bench_loader] [--tokens 200000000] [--shards 4] [--seconds 5]
#include <fcntl.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/shard.h"
#include "util/error.h"
#include "util/log.h"
#include "util/rng.h"

namespace {

constexpr int kSeq = 1024, kVocab = 50257, kMicroBatch = 8;
constexpr double kH100GptSmallTokensPerSecond = 400e3;  // assumed: one H100 training gpt-small (124M)

std::vector<std::string> write_corpus(const std::string& dir, uint64_t tokens, int shards) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> paths;
  std::vector<uint32_t> block(1 << 20);
  uint64_t counter = 0;
  for (int s = 0; s < shards; s++) {
    std::string path = yuan::strf("%s/bench_%05d.h5", dir.c_str(), s);
    uint64_t n = tokens / shards;
    yuan::ShardWriter w(path, yuan::ShardMeta{kVocab, kVocab - 1, "bench:sha256:0"}, n);
    for (uint64_t done = 0; done < n; done += block.size()) {
      size_t k = std::min<uint64_t>(block.size(), n - done);
      for (size_t i = 0; i < k; i++) block[i] = static_cast<uint32_t>(yuan::splitmix64(counter++) % kVocab);
      w.append(block.data(), k);
    }
    w.close();
    paths.push_back(path);
  }
  return paths;
}

double raw_read_bytes_per_second(const std::vector<std::string>& paths) {
  std::vector<char> buf(4 << 20);
  uint64_t bytes = 0;
  double t0 = yuan::now_seconds();
  for (const std::string& p : paths) {
    int fd = open(p.c_str(), O_RDONLY);
    YUAN_CHECK(fd >= 0, "%s: cannot open", p.c_str());
    for (ssize_t n; (n = read(fd, buf.data(), buf.size())) > 0;) bytes += static_cast<uint64_t>(n);
    close(fd);
  }
  return bytes / (yuan::now_seconds() - t0);
}

// pread(2) of `window` bytes at random offsets of the files, for `seconds`: no HDF5, no shuffle bookkeeping,
// no conversion.
double raw_random_bytes_per_second(const std::vector<std::string>& paths, size_t window, double seconds) {
  std::vector<int> fds;
  std::vector<uint64_t> sizes;
  for (const std::string& p : paths) {
    fds.push_back(open(p.c_str(), O_RDONLY));
    YUAN_CHECK(fds.back() >= 0, "%s: cannot open", p.c_str());
    sizes.push_back(static_cast<uint64_t>(lseek(fds.back(), 0, SEEK_END)));
  }
  std::vector<uint8_t> buf(window);
  uint64_t reads = 0, x = 1;
  double t0 = yuan::now_seconds(), t = t0;
  for (; t - t0 < seconds; reads++) {
    for (int k = 0; k < 64; k++) {
      x = yuan::splitmix64(x);
      size_t f = x % fds.size();
      YUAN_CHECK(pread(fds[f], buf.data(), window, static_cast<off_t>((x >> 8) % (sizes[f] - window))) ==
                     static_cast<ssize_t>(window),
                 "%s: short read", paths[f].c_str());
    }
    t = yuan::now_seconds();
  }
  for (int fd : fds) close(fd);
  return static_cast<double>(reads) * 64 * window / (t - t0);
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string dir = "/tmp/yuan_bench_loader";
  uint64_t tokens = 200000000;
  int shards = 4;
  double seconds = 5;
  po::options_description desc("bench_loader options");
  desc.add_options()("help,h", "print this help")(
      "dir", po::value(&dir)->default_value(dir), "where the synthetic corpus is written (removed afterwards)")(
      "tokens", po::value(&tokens)->default_value(tokens), "corpus size in tokens")(
      "shards", po::value(&shards)->default_value(shards), "number of shard files")(
      "seconds", po::value(&seconds)->default_value(seconds), "how long the loader is timed");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    double t0 = yuan::now_seconds();
    std::vector<std::string> paths = write_corpus(dir, tokens, shards);
    std::printf("corpus: %llu uint16 tokens in %d shards under %s, written at %.0f tokens/s\n",
                static_cast<unsigned long long>(tokens), shards, dir.c_str(), tokens / (yuan::now_seconds() - t0));

    // Both reads see the files in the page cache (just written; dropping it needs root), so the ratio is the
    // loader's own overhead: random windows through HDF5 against one sequential stream of bytes.
    raw_read_bytes_per_second(paths);
    double raw = raw_read_bytes_per_second(paths) / 2;
    double raw_random = raw_random_bytes_per_second(paths, (kSeq + 1) * 2, seconds) / 2 * kSeq / (kSeq + 1);

    yuan::LoaderSpec spec;
    spec.glob = dir + "/bench_*.h5";
    spec.seq_len = kSeq;
    spec.vocab_size = kVocab;
    spec.global_batch = spec.micro_batch = kMicroBatch;
    yuan::TrainLoader loader(spec);
    loader.next_micro_batch();  // the prefetch thread is running
    uint64_t batches = 0;
    t0 = yuan::now_seconds();
    double t = t0;
    for (; t - t0 < seconds; t = yuan::now_seconds(), batches++) loader.next_micro_batch();
    double rate = static_cast<double>(batches) * kMicroBatch * kSeq / (t - t0);

    std::printf("raw read(2), sequential: %.3e tokens/s\n", raw);
    std::printf("loader (1 rank, seq %d, micro-batch %d, random windows): %.3e tokens/s (caller waited %.2f s)\n",
                kSeq, kMicroBatch, rate, loader.wait_seconds());
    std::printf("raw pread(2) of %d-byte windows at random offsets: %.3e tokens/s (%.3f of sequential)\n",
                (kSeq + 1) * 2, raw_random, raw_random / raw);
    std::printf("loader / raw read: %.3f (goal >= 0.5)\n", rate / raw);
    std::printf("loader / raw random pread: %.3f\n", rate / raw_random);
    std::printf("loader / gpt-small on one H100 (assumed %.0f tokens/s): %.1f\n", kH100GptSmallTokensPerSecond,
                rate / kH100GptSmallTokensPerSecond);
    std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_loader: %s\n", e.what());
    std::filesystem::remove_all(dir);
    return 1;
  }
  return 0;
}
