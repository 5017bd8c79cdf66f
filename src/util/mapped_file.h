// A whole file mapped read-only, and unaligned little-endian reads from it: the kernel pages a mapped file in and
// out, so a terabyte corpus or a checkpoint shard costs no more memory than the pages being read. The formats read
// this way (safetensors, Megatron's index, llm.c's tokens) put fields at any byte offset, so values are copied out
// by memcpy, never dereferenced in place.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace yuan {

class MappedFile {
 public:
  // Throws an Error naming `path` when it cannot be opened, stat'ed or mapped. An empty file maps nothing.
  // `sequential`: the file is read front to back (the kernel reads ahead and drops pages behind).
  explicit MappedFile(const std::string& path, bool sequential = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  const uint8_t* data() const { return data_; }
  // The T at byte `offset`; the caller has checked the bounds.
  template <class T>
  T at(uint64_t offset) const;

 private:
  std::string path_;
  uint64_t size_ = 0;
  const uint8_t* data_ = nullptr;
};

// The T at `p` (little-endian, as on every machine this runs on), whatever its alignment.
template <class T>
T load_unaligned(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
T MappedFile::at(uint64_t offset) const {
  return load_unaligned<T>(data_ + offset);
}

}  // namespace yuan
