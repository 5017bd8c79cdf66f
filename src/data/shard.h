// One shard of a tokenized corpus: an HDF5 file with a 1-D unsigned /tokens dataset and a few attributes
// (schema: docs/FORMAT.md). The reader accepts any file that follows the schema, whoever wrote it; the writer
// is what `yuanlm prep` uses.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/hdf5_check.h"
#include "util/memory.h"

namespace yuan {

constexpr int kShardFormatVersion = 1;

struct ShardMeta {
  int vocab_size = 0;
  int eot_id = 0;
  std::string tokenizer;  // "<kind>:sha256:<hex of the tokenizer file>"
};

class ShardReader {
 public:
  // Opens `path` read-only (no file locking: parallel file systems often refuse it, and nobody writes a
  // finished shard) and checks the schema. Reads are expected to be about `window` tokens; that sizes the
  // chunk cache. Throws Error naming the file.
  ShardReader(const std::string& path, size_t window);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  const ShardMeta& meta() const { return meta_; }
  uint64_t tokens() const { return tokens_; }
  // Tokens [offset, offset+n) as int32, every id checked < vocab_size.
  void read(uint64_t offset, size_t n, int32_t* out);
  // True when tokens are read with pread(2) at the file offsets HDF5 reports for the dataset's storage
  // (unfiltered little-endian data, which is what prep and h5py write by default); false when every read
  // goes through an HDF5 hyperslab selection (compressed or big-endian data, user blocks).
  bool direct() const { return !extent_addr_.empty(); }

 private:
  void map_storage(hid_t file_type);
  void read_direct(uint64_t offset, size_t n);
  void read_hyperslab(uint64_t offset, size_t n);

  std::string path_;
  ShardMeta meta_;
  uint64_t tokens_ = 0;
  size_t elem_size_ = 0;  // bytes per token in memory: the file's width, so HDF5 converts nothing but order
  Hid file_, dset_, fspace_, mspace_, memtype_;
  size_t mspace_n_ = 0;
  std::vector<uint8_t> scratch_;
  // Direct reads: the file offset of each chunk of extent_tokens_ tokens (one extent for contiguous data).
  std::vector<uint64_t> extent_addr_;
  uint64_t extent_tokens_ = 0;
  int fd_ = -1;
};

class ShardWriter {
 public:
  // Writes `path`.tmp and renames it to `path` in close(), so an interrupted write never leaves a file that
  // looks like a finished shard. `capacity` (the most tokens this shard will get) caps the chunk size so that
  // small shards stay small on disk.
  ShardWriter(const std::string& path, const ShardMeta& meta, uint64_t capacity);
  ~ShardWriter();  // without close(): the .tmp is removed
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  void begin_document();  // the next token appended starts a document (recorded in /doc_offsets)
  void append(const uint32_t* ids, size_t n);
  uint64_t tokens() const { return written_ + staged_; }
  void close();

 private:
  void flush();
  std::string path_, tmp_;
  ShardMeta meta_;
  Hid file_, dset_;
  HostArray<uint32_t> stage_;  // one chunk, so every write is a whole chunk
  size_t staged_ = 0;
  uint64_t written_ = 0;
  std::vector<uint64_t> doc_offsets_;
  bool closed_ = false;
};

}  // namespace yuan
