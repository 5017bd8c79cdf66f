// Streaming training and validation batches from sharded HDF5 token files (format: docs/FORMAT.md).
//
// The corpus is cut into windows of seq_len+1 tokens with stride seq_len inside each shard. Samples form one
// global stream: sample g belongs to epoch g / n_windows and is window perm_epoch(g % n_windows), where perm
// is a bijection keyed by (seed, epoch) computed on the fly (no permutation array, O(1) memory). Optimizer
// step s consumes global samples [g0, g0 + global_batch); each reader takes a contiguous slice of it, in
// micro-batches: rank r of N data-parallel ranks [g0 + r*global_batch/N, g0 + (r+1)*global_batch/N), a pipeline
// its micro-batches' share after the pipelines before it. So the union over readers is the same whatever the
// layout, and the whole position is one integer (`next_sample`) that a checkpoint saves.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace yuan {

struct LoaderSpec {
  std::string glob;       // shard files
  int seq_len = 0;
  int vocab_size = 0;     // every token id must be < vocab_size (checked as data is read)
  uint64_t seed = 0;
  int global_batch = 0;   // sequences per optimizer step, all readers
  int rank = 0, world = 1;  // this reader among the data-parallel ones
  // Training: this reader's sequences of each step are [slice_first, slice_first + slice_count) of the global
  // batch, a whole number of micro-batches; slice_count 0 means rank's equal share, [rank, rank+1) x GB/world.
  // Validation interleaves: reader `rank` takes every world-th window.
  int slice_first = 0, slice_count = 0;
  int micro_batch = 0;    // sequences per next_micro_batch() call
  int prefetch = 4;       // micro-batches read ahead by the background thread
};

// Host bytes of a TrainLoader's buffers (prefetch + 1 micro-batches: the one the caller holds stays untouched while
// `prefetch` are read) and of a ValLoader's (one micro-batch), for the memory plan (train/memory_plan.h).
size_t train_loader_bytes(const LoaderSpec& spec);
size_t val_loader_bytes(const LoaderSpec& spec);

class TrainLoader {
 public:
  // Opens and validates every shard (throws Error naming the file). Starts reading at global sample
  // `next_sample` (0 for a new run, the checkpoint's value on resume).
  TrainLoader(const LoaderSpec& spec, uint64_t next_sample = 0);
  ~TrainLoader();
  // This reader's next micro-batch: micro_batch rows of seq_len+1 token ids, valid until the next call.
  // After slice_count/micro_batch calls the loader has moved on to the next optimizer step.
  const int32_t* next_micro_batch();
  uint64_t next_sample() const;  // global sample index where the next optimizer step starts
  uint64_t epoch() const;        // epoch of next_sample()
  uint64_t windows() const;      // windows per epoch
  double wait_seconds() const;   // time next_micro_batch() spent waiting for the prefetch thread (cumulative)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A fixed evaluation set: the first `batches * micro_batch * world` windows in file order (no shuffle), rank r
// taking every world-th. A set larger than the corpus is refused before anything is allocated (throws Error naming
// `glob_key`, the windows the corpus holds and `batches_key`, or `micro_batch_key` when one micro-batch per reader
// is already more than the corpus): reading windows twice would weigh them twice and report windows that do not
// exist, and a silently smaller set would not be the one asked for.
class ValLoader {
 public:
  ValLoader(const LoaderSpec& spec, int batches, const char* glob_key = "data.val",
            const char* batches_key = "train.eval_batches", const char* micro_batch_key = "train.micro_batch");
  ~ValLoader();
  int batches() const;
  const int32_t* batch(int i);  // micro_batch rows of seq_len+1

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace yuan
