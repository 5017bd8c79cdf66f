// Checkpoint save and verify on one rank's optimizer state of about 1 GiB (fp32 master, exp_avg, exp_avg_sq,
// as save_checkpoint writes them). Save is what a rank does for its shard: SafetensorsWriter::write (write,
// fsync, rename) and the sha256 of the written file for state.json; its limit is write(2) + fsync of the same
// bytes. Verify is what resuming does per file, the sha256 of the file; its limit is a sequential read(2) of
// the same file. Both reads find the file in the page cache (just written; dropping it needs root), so the
// verify ratio is the checksum's own cost.
//   bin/bench_checkpoint [DIR]    (default /tmp/yuan_bench_checkpoint; the files written there are removed)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "util/error.h"
#include "util/log.h"
#include "util/memory.h"
#include "util/rng.h"
#include "util/safetensors.h"
#include "util/sha256.h"

namespace {

constexpr const char* kTensors[] = {"master", "exp_avg", "exp_avg_sq"};

// write(2) of the three arrays into one file and fsync: the disk's limit for the bytes a checkpoint holds.
void raw_write(const std::string& path, const std::vector<const float*>& arrays, size_t n) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  YUAN_CHECK(fd >= 0, "%s: cannot create: %s", path.c_str(), std::strerror(errno));
  for (const float* a : arrays) {
    const char* p = reinterpret_cast<const char*>(a);
    for (size_t left = n * sizeof(float); left > 0;) {
      ssize_t w = write(fd, p, std::min<size_t>(left, size_t{1} << 30));
      YUAN_CHECK(w > 0, "%s: write failed: %s", path.c_str(), std::strerror(errno));
      p += w;
      left -= static_cast<size_t>(w);
    }
  }
  YUAN_CHECK(fsync(fd) == 0 && close(fd) == 0, "%s: fsync failed: %s", path.c_str(), std::strerror(errno));
}

// Sequential read(2) of the whole file in the block size sha256_file reads with.
void raw_read(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  YUAN_CHECK(fd >= 0, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  std::vector<char> buf(8 << 20);
  ssize_t n;
  while ((n = read(fd, buf.data(), buf.size())) > 0) {
  }
  close(fd);
  YUAN_CHECK(n == 0, "%s: read failed", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp/yuan_bench_checkpoint";
  const std::string raw_path = dir + "/raw.bin", path = dir + "/optim_00000.safetensors";
  const size_t floats = (size_t{1} << 30) / 12;  // three tensors of this many floats: 1 GiB
  int status = 0;
  try {
    std::filesystem::create_directories(dir);
    std::vector<yuan::HostArray<float>> state;
    std::vector<const float*> arrays;
    for (size_t t = 0; t < 3; t++) {
      state.emplace_back(floats, yuan::Mem::Optimizer);
      for (size_t i = 0; i < floats; i++) state[t][i] = static_cast<float>(yuan::splitmix64(i * 3 + t) >> 40);
      arrays.push_back(state[t].data());
    }
    const double gb = 3.0 * floats * sizeof(float) / 1e9;

    double t0 = yuan::now_seconds();
    raw_write(raw_path, arrays, floats);
    const double t_raw_write = yuan::now_seconds() - t0;
    std::filesystem::remove(raw_path);

    yuan::SafetensorsWriter out;
    for (size_t t = 0; t < 3; t++) out.add_f32(kTensors[t], {static_cast<int64_t>(floats)}, arrays[t]);
    t0 = yuan::now_seconds();
    out.write(path);
    const double t_write = yuan::now_seconds() - t0;
    const std::string sum = yuan::sha256_file(path);
    const double t_save = yuan::now_seconds() - t0;

    t0 = yuan::now_seconds();
    raw_read(path);
    const double t_raw_read = yuan::now_seconds() - t0;
    t0 = yuan::now_seconds();
    YUAN_CHECK(yuan::sha256_file(path) == sum, "%s: checksum changed between two reads", path.c_str());
    const double t_verify = yuan::now_seconds() - t0;

    std::printf("raw write(2) + fsync of the same bytes: %.2f s (%.2f GB/s)\n", t_raw_write, gb / t_raw_write);
    std::printf("checkpoint save %.2f GB: %.2f s (%.2f GB/s; %.2f x raw write+fsync of the same bytes); "
                "write+fsync %.2f s, sha256 %.2f s\n",
                gb, t_save, gb / t_save, t_save / t_raw_write, t_write, t_save - t_write);
    std::printf("raw sequential read(2) of the file: %.2f s (%.2f GB/s)\n", t_raw_read, gb / t_raw_read);
    std::printf("verify: %.2f s (%.2f GB/s; %.2f x sequential read of the same file)\n", t_verify, gb / t_verify,
                t_verify / t_raw_read);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
    status = 1;
  }
  std::filesystem::remove(raw_path);
  std::filesystem::remove(path);
  return status;
}
