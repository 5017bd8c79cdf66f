#include "util/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "util/dtype.h"
#include "util/error.h"
#include "util/sha256.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so is this code");

namespace yuan {

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating anything.
constexpr size_t kMaxHeader = 100u << 20;

using nlohmann::json;

// Parses the header. nlohmann keeps the last of two equal keys; a tensor named twice is an error instead.
json parse_header(const char* text, size_t n, const std::string& file) {
  std::set<std::string> names;
  auto no_duplicate_tensor = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second)
      throw Error(strf("%s: tensor '%s' appears twice", file.c_str(), parsed.get<std::string>().c_str()));
    return true;
  };
  try {
    return json::parse(text, text + n, no_duplicate_tensor);
  } catch (const json::parse_error& e) {
    throw Error(strf("%s: bad safetensors header: %s", file.c_str(), e.what()));
  }
}

// A non-negative integer that fits int64_t (shape dims, offsets).
size_t to_size(const json& v, const std::string& file, const std::string& tensor, const char* field) {
  YUAN_CHECK(v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
             "%s: tensor '%s': %s must hold non-negative integers", file.c_str(), tensor.c_str(), field);
  return v.get<size_t>();
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  uint32_t u;
  if (exp == 0x1F) {
    u = sign | 0x7F800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {  // subnormal half: normalise
    int e = -1;
    do {
      mant <<= 1;
      e++;
    } while (!(mant & 0x400));
    u = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Element i of a little-endian array of T at p, unaligned (a tensor's data starts at any byte of the file).
template <typename T>
T load(const uint8_t* p, size_t i) {
  return load_unaligned<T>(p + i * sizeof(T));
}

void write_all(int fd, const void* buf, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    YUAN_CHECK(w > 0, "%s: write failed: %s", path.c_str(), std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

size_t SafeTensorInfo::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

size_t safetensors_dtype_size(const std::string& t) {
  if (t == "BOOL" || t == "U8" || t == "I8") return 1;
  if (t == "F16" || t == "BF16" || t == "U16" || t == "I16") return 2;
  if (t == "F32" || t == "U32" || t == "I32") return 4;
  if (t == "F64" || t == "U64" || t == "I64") return 8;
  return 0;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path), file_(path) {
  const size_t size = file_.size();
  YUAN_CHECK(size >= 8, "%s: not a safetensors file (shorter than its 8-byte header length)", path.c_str());
  const uint64_t n = file_.at<uint64_t>(0);
  YUAN_CHECK(n <= kMaxHeader && n <= size - 8, "%s: not a safetensors file (header length %llu, file size %zu)",
             path.c_str(), static_cast<unsigned long long>(n), size);
  data_ = file_.data() + 8 + n;
  const size_t data_size = size - 8 - n;
  const json root = parse_header(reinterpret_cast<const char*>(file_.data() + 8), n, path);
  YUAN_CHECK(root.is_object(), "%s: safetensors header is not a JSON object", path.c_str());
  for (const auto& [name, v] : root.items()) {
    YUAN_CHECK(v.is_object(), "%s: header entry '%s' is not an object", path.c_str(), name.c_str());
    if (name == "__metadata__") {
      for (const auto& [k, s] : v.items()) {
        YUAN_CHECK(s.is_string(), "%s: metadata '%s' is not a string", path.c_str(), k.c_str());
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    SafeTensorInfo t;
    const auto dtype = v.find("dtype"), shape = v.find("shape"), offsets = v.find("data_offsets");
    YUAN_CHECK(dtype != v.end() && dtype->is_string() && shape != v.end() && shape->is_array() &&
                   offsets != v.end() && offsets->is_array() && offsets->size() == 2,
               "%s: tensor '%s' needs dtype (string), shape (array) and data_offsets ([begin, end])",
               path.c_str(), name.c_str());
    t.dtype = dtype->get<std::string>();
    size_t esize = safetensors_dtype_size(t.dtype);
    YUAN_CHECK(esize, "%s: tensor '%s' has unknown dtype '%s'", path.c_str(), name.c_str(), t.dtype.c_str());
    for (const json& d : *shape) t.shape.push_back(static_cast<int64_t>(to_size(d, path, name, "shape")));
    t.begin = to_size((*offsets)[0], path, name, "data_offsets");
    t.end = to_size((*offsets)[1], path, name, "data_offsets");
    YUAN_CHECK(t.begin <= t.end && t.end <= data_size, "%s: tensor '%s' bytes [%zu, %zu) outside the %zu-byte data",
               path.c_str(), name.c_str(), t.begin, t.end, data_size);
    YUAN_CHECK(t.end - t.begin == t.numel() * esize, "%s: tensor '%s' has %zu bytes, its %s shape needs %zu",
               path.c_str(), name.c_str(), t.end - t.begin, t.dtype.c_str(), t.numel() * esize);
    tensors_.emplace(name, std::move(t));
  }
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

const SafeTensorInfo& SafetensorsReader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  YUAN_CHECK(it != tensors_.end(), "%s: no tensor '%s'", path_.c_str(), name.c_str());
  return it->second;
}

const uint8_t* SafetensorsReader::raw(const std::string& name) const { return data_ + info(name).begin; }

const std::string& SafetensorsReader::meta(const std::string& key) const {
  auto it = metadata_.find(key);
  YUAN_CHECK(it != metadata_.end(), "%s: no metadata key '%s'", path_.c_str(), key.c_str());
  return it->second;
}

static std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void SafetensorsReader::check_shape(const std::string& name, const std::vector<int64_t>& shape) const {
  const SafeTensorInfo& t = info(name);
  YUAN_CHECK(t.shape == shape, "%s: tensor '%s' has shape %s, expected %s", path_.c_str(), name.c_str(),
             shape_str(t.shape).c_str(), shape_str(shape).c_str());
}

void SafetensorsReader::read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const {
  check_shape(name, shape);
  const SafeTensorInfo& t = info(name);
  const uint8_t* p = data_ + t.begin;
  const size_t n = t.numel();
  if (t.dtype == "F32") {
    std::memcpy(dst, p, n * 4);
  } else if (t.dtype == "F64") {
    for (size_t i = 0; i < n; i++) dst[i] = static_cast<float>(load<double>(p, i));
  } else if (t.dtype == "BF16") {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(load<uint16_t>(p, i));
  } else if (t.dtype == "F16") {
    for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(load<uint16_t>(p, i));
  } else {
    throw Error(strf("%s: tensor '%s' is %s, expected a float dtype", path_.c_str(), name.c_str(), t.dtype.c_str()));
  }
}

std::vector<float> SafetensorsReader::read_f32(const std::string& name, const std::vector<int64_t>& shape) const {
  check_shape(name, shape);
  std::vector<float> out(info(name).numel());
  read_f32(name, shape, out.data());
  return out;
}

std::vector<double> SafetensorsReader::read_f64(const std::string& name, const std::vector<int64_t>& shape) const {
  check_shape(name, shape);
  const SafeTensorInfo& t = info(name);
  const uint8_t* p = data_ + t.begin;
  std::vector<double> out(t.numel());
  if (t.dtype == "F64") {
    std::memcpy(out.data(), p, out.size() * 8);
  } else if (t.dtype == "F32") {
    for (size_t i = 0; i < out.size(); i++) out[i] = load<float>(p, i);
  } else {
    throw Error(strf("%s: tensor '%s' is %s, expected F64 or F32", path_.c_str(), name.c_str(), t.dtype.c_str()));
  }
  return out;
}

std::vector<int64_t> SafetensorsReader::read_i64(const std::string& name, const std::vector<int64_t>& shape) const {
  check_shape(name, shape);
  const SafeTensorInfo& t = info(name);
  const uint8_t* p = data_ + t.begin;
  std::vector<int64_t> out(t.numel());
  for (size_t i = 0; i < out.size(); i++) {
    if (t.dtype == "I64") out[i] = load<int64_t>(p, i);
    else if (t.dtype == "I32") out[i] = load<int32_t>(p, i);
    else if (t.dtype == "I16") out[i] = load<int16_t>(p, i);
    else if (t.dtype == "I8") out[i] = load<int8_t>(p, i);
    else if (t.dtype == "U32") out[i] = load<uint32_t>(p, i);
    else if (t.dtype == "U16") out[i] = load<uint16_t>(p, i);
    else if (t.dtype == "U8" || t.dtype == "BOOL") out[i] = load<uint8_t>(p, i);
    else if (t.dtype == "U64") {
      uint64_t u = load<uint64_t>(p, i);
      YUAN_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 "%s: tensor '%s' element %zu does not fit int64", path_.c_str(), name.c_str(), i);
      out[i] = static_cast<int64_t>(u);
    } else {
      throw Error(
          strf("%s: tensor '%s' is %s, expected an integer dtype", path_.c_str(), name.c_str(), t.dtype.c_str()));
    }
  }
  return out;
}

std::vector<int32_t> SafetensorsReader::read_i32(const std::string& name, const std::vector<int64_t>& shape) const {
  std::vector<int64_t> wide = read_i64(name, shape);
  std::vector<int32_t> out(wide.size());
  for (size_t i = 0; i < wide.size(); i++) {
    YUAN_CHECK(wide[i] >= std::numeric_limits<int32_t>::min() && wide[i] <= std::numeric_limits<int32_t>::max(),
               "%s: tensor '%s' element %zu = %lld does not fit int32", path_.c_str(), name.c_str(), i,
               static_cast<long long>(wide[i]));
    out[i] = static_cast<int32_t>(wide[i]);
  }
  return out;
}

void SafetensorsWriter::add(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                            const void* data) {
  YUAN_CHECK(!name.empty() && name != "__metadata__", "safetensors: invalid tensor name '%s'", name.c_str());
  for (const Entry& e : entries_) YUAN_CHECK(e.name != name, "safetensors: tensor '%s' added twice", name.c_str());
  size_t esize = safetensors_dtype_size(dtype);
  YUAN_CHECK(esize, "safetensors: tensor '%s' has unknown dtype '%s'", name.c_str(), dtype.c_str());
  size_t n = 1;
  for (int64_t d : shape) {
    YUAN_CHECK(d >= 0, "safetensors: tensor '%s' has a negative dimension", name.c_str());
    n *= static_cast<size_t>(d);
  }
  entries_.push_back({name, dtype, shape, data, n * esize});
}

std::vector<const SafetensorsWriter::Entry*> SafetensorsWriter::order() const {
  std::vector<const Entry*> order;
  for (const Entry& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return safetensors_dtype_size(a->dtype) > safetensors_dtype_size(b->dtype);
  });
  return order;
}

std::string SafetensorsWriter::prefix() const {
  // Ordered: the header lists the tensors in the order of their bytes.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  size_t offset = 0;
  for (const Entry* e : order()) {
    header[e->name] = {{"dtype", e->dtype}, {"shape", e->shape}, {"data_offsets", {offset, offset + e->bytes}}};
    offset += e->bytes;
  }
  std::string h;
  try {
    h = header.dump();
  } catch (const nlohmann::json::type_error& e) {  // a name or metadata value that is not UTF-8
    throw Error(strf("cannot write the safetensors header: %s", e.what()));
  }
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t n = h.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + h;
}

void SafetensorsWriter::write(const std::string& path, std::string* sha256) const {
  std::string pre;
  try {
    pre = prefix();
  } catch (const Error& e) {
    throw Error(strf("%s: %s", path.c_str(), e.what()));
  }
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  YUAN_CHECK(fd >= 0, "%s: cannot create: %s", tmp.c_str(), std::strerror(errno));
  try {
    std::unique_ptr<Sha256> digest;
    if (sha256) digest = std::make_unique<Sha256>();
    // Pieces small enough that the digest reads them from the cache the write just filled.
    auto put = [&](const void* data, size_t bytes) {
      const char* p = static_cast<const char*>(data);
      for (size_t at = 0, piece = digest ? size_t{1} << 20 : bytes; at < bytes; at += piece) {
        const size_t k = std::min(piece, bytes - at);
        write_all(fd, p + at, k, tmp);
        if (digest) digest->update(p + at, k);
      }
    };
    put(pre.data(), pre.size());
    for (const Entry* e : order()) put(e->data, e->bytes);
    if (digest) *sha256 = digest->hex();
    YUAN_CHECK(::fsync(fd) == 0, "%s: fsync failed: %s", tmp.c_str(), std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  YUAN_CHECK(::close(fd) == 0, "%s: close failed: %s", tmp.c_str(), std::strerror(errno));
  YUAN_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "%s: cannot rename %s over it: %s", path.c_str(), tmp.c_str(),
             std::strerror(errno));
  // The rename is durable only once the directory entry is.
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace yuan
