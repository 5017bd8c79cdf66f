// The safetensors format (huggingface/safetensors), used for checkpoints, HuggingFace export/import and test
// fixtures:
//   u64 little-endian N | N bytes of JSON header | data
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets into the
// data section) and may hold "__metadata__": {string: string}. The header is read and written with nlohmann-json
// (header-only, so the core still links on GPU machines without Boost).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "util/mapped_file.h"

namespace yuan {

struct SafeTensorInfo {
  std::string dtype;           // "F32", "BF16", "I32", ... as in the file
  std::vector<int64_t> shape;  // empty for a scalar
  size_t begin = 0, end = 0;   // byte range in the data section
  size_t numel() const;
};

// Bytes per element of a safetensors dtype (BOOL, U8, I8, F16, BF16, U16, I16, F32, U32, I32, F64, U64, I64);
// 0 for an unknown one.
size_t safetensors_dtype_size(const std::string& dtype);

// Maps the file read-only; tensors are converted on access. Every error names the file and the tensor.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const;  // sorted
  const SafeTensorInfo& info(const std::string& name) const;
  const uint8_t* raw(const std::string& name) const;  // info(name).end - begin bytes, little-endian

  // Typed reads check that the tensor has exactly `shape` and convert: read_f32 from F32, F64, F16, BF16;
  // read_f64 from F64, F32; read_i32 / read_i64 from any integer dtype (range-checked).
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& shape) const;
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;
  std::vector<double> read_f64(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<int32_t> read_i32(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<int64_t> read_i64(const std::string& name, const std::vector<int64_t>& shape) const;

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& meta(const std::string& key) const;  // throws naming the file and key when missing

 private:
  void check_shape(const std::string& name, const std::vector<int64_t>& shape) const;
  std::string path_;
  MappedFile file_;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, SafeTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors and writes them in one go. add_* keeps the pointer, not a copy (checkpoints hold the whole
// optimizer state): the data must stay valid until write(). Tensors are laid out by descending element size,
// then in add order, so every tensor is naturally aligned (the header is padded with spaces to 8 bytes), as
// the reference implementation does.
class SafetensorsWriter {
 public:
  void add(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape, const void* data);
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
    add(name, "F32", shape, data);
  }
  void add_f64(const std::string& name, const std::vector<int64_t>& shape, const double* data) {
    add(name, "F64", shape, data);
  }
  void add_i32(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data) {
    add(name, "I32", shape, data);
  }
  void add_i64(const std::string& name, const std::vector<int64_t>& shape, const int64_t* data) {
    add(name, "I64", shape, data);
  }
  void add_bf16(const std::string& name, const std::vector<int64_t>& shape, const uint16_t* data) {
    add(name, "BF16", shape, data);
  }
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes path.tmp, fsyncs it, renames it over `path` and fsyncs the directory, so a crash leaves either the
  // old file or the complete new one. With `sha256`, sets it to the file's checksum, hashed while writing (each
  // piece as it leaves the cache) instead of reading the file back.
  void write(const std::string& path, std::string* sha256 = nullptr) const;
  // What write() puts before the tensors' bytes (the header's length and the header, padded to 8 bytes); the
  // tensors follow in the order added, widest dtype first.
  std::string prefix() const;

 private:
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    const void* data;
    size_t bytes;
  };
  std::vector<const Entry*> order() const;  // the tensors in the order of their bytes in the file
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace yuan
