#include "util/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "util/dtype.h"
#include "util/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so is this code");

namespace yuan {

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating anything.
constexpr size_t kMaxHeader = 100u << 20;

// Just enough JSON for safetensors headers. Numbers are kept as text and converted where they are used.
struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  std::string text;  // String: the decoded value; Number / Bool: the literal
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
};

class JsonParser {
 public:
  JsonParser(const char* s, size_t n, const std::string& file) : s_(s), n_(n), file_(file) {}

  Json parse_document() {
    Json v = value(0);
    skip_ws();
    if (i_ != n_) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw Error(strf("%s: bad safetensors header: %s at byte %zu of the JSON", file_.c_str(), what, i_));
  }
  void skip_ws() {
    while (i_ < n_ && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) i_++;
  }
  bool eat(char c) {
    skip_ws();
    if (i_ < n_ && s_[i_] == c) {
      i_++;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(strf("expected '%c'", c).c_str());
  }

  Json value(int depth) {
    if (depth > 32) fail("nesting too deep");
    skip_ws();
    if (i_ >= n_) fail("unexpected end");
    Json v;
    char c = s_[i_];
    if (c == '{') {
      i_++;
      v.kind = Json::Object;
      if (eat('}')) return v;
      do {
        skip_ws();
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      i_++;
      v.kind = Json::Array;
      if (eat(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::String;
      v.text = string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Json::Number;
      size_t b = i_;
      while (i_ < n_ && std::strchr("+-.eE0123456789", s_[i_])) i_++;
      v.text.assign(s_ + b, i_ - b);
    } else if (literal("true")) {
      v.kind = Json::Bool;
      v.text = "true";
    } else if (literal("false")) {
      v.kind = Json::Bool;
      v.text = "false";
    } else if (literal("null")) {
      v.kind = Json::Null;
    } else {
      fail("unexpected character");
    }
    return v;
  }

  bool literal(const char* word) {
    size_t n = std::strlen(word);
    if (n_ - i_ < n || std::memcmp(s_ + i_, word, n) != 0) return false;
    i_ += n;
    return true;
  }

  unsigned hex4() {
    if (n_ - i_ < 4) fail("short \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; k++) {
      char h = s_[i_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') u |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= static_cast<unsigned>(h - 'A' + 10);
      else fail("bad \\u escape");
    }
    return u;
  }

  std::string string() {
    if (i_ >= n_ || s_[i_] != '"') fail("expected a string");
    i_++;
    std::string out;
    while (true) {
      if (i_ >= n_) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= n_) fail("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
            if (!literal("\\u")) fail("lone surrogate");
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  const char* s_;
  size_t n_;
  const std::string& file_;
  size_t i_ = 0;
};

// A non-negative JSON integer (shape dims, offsets).
size_t to_size(const Json& v, const std::string& file, const std::string& tensor, const char* field) {
  bool ok = v.kind == Json::Number && !v.text.empty() && v.text.size() <= 18 &&
            v.text.find_first_not_of("0123456789") == std::string::npos;
  YUAN_CHECK(ok, "%s: tensor '%s': %s must hold non-negative integers", file.c_str(), tensor.c_str(), field);
  return static_cast<size_t>(std::stoull(v.text));
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += strf("\\u%04x", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  out += '"';
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

template <typename T>
T load(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
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

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  YUAN_CHECK(fd >= 0, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < 8) {
    ::close(fd);
    throw Error(strf("%s: not a safetensors file (shorter than its 8-byte header length)", path.c_str()));
  }
  map_size_ = static_cast<size_t>(st.st_size);
  void* m = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  YUAN_CHECK(m != MAP_FAILED, "%s: mmap failed: %s", path.c_str(), std::strerror(errno));
  map_ = static_cast<const uint8_t*>(m);

  // From here on the mapping is ours: release it if the header is bad.
  try {
    uint64_t n = load<uint64_t>(map_, 0);
    YUAN_CHECK(n <= kMaxHeader && n <= map_size_ - 8,
               "%s: not a safetensors file (header length %llu, file size %zu)", path.c_str(),
               static_cast<unsigned long long>(n), map_size_);
    data_ = map_ + 8 + n;
    const size_t data_size = map_size_ - 8 - n;
    Json root = JsonParser(reinterpret_cast<const char*>(map_ + 8), n, path).parse_document();
    YUAN_CHECK(root.kind == Json::Object, "%s: safetensors header is not a JSON object", path.c_str());
    for (const auto& [name, v] : root.members) {
      YUAN_CHECK(v.kind == Json::Object, "%s: header entry '%s' is not an object", path.c_str(), name.c_str());
      if (name == "__metadata__") {
        for (const auto& [k, s] : v.members) {
          YUAN_CHECK(s.kind == Json::String, "%s: metadata '%s' is not a string", path.c_str(), k.c_str());
          metadata_[k] = s.text;
        }
        continue;
      }
      YUAN_CHECK(!tensors_.count(name), "%s: tensor '%s' appears twice", path.c_str(), name.c_str());
      SafeTensorInfo t;
      const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
      for (const auto& [k, f] : v.members) {
        if (k == "dtype") dtype = &f;
        else if (k == "shape") shape = &f;
        else if (k == "data_offsets") offsets = &f;
      }
      YUAN_CHECK(dtype && dtype->kind == Json::String && shape && shape->kind == Json::Array && offsets &&
                     offsets->kind == Json::Array && offsets->items.size() == 2,
                 "%s: tensor '%s' needs dtype (string), shape (array) and data_offsets ([begin, end])",
                 path.c_str(), name.c_str());
      t.dtype = dtype->text;
      size_t esize = safetensors_dtype_size(t.dtype);
      YUAN_CHECK(esize, "%s: tensor '%s' has unknown dtype '%s'", path.c_str(), name.c_str(), t.dtype.c_str());
      for (const Json& d : shape->items) t.shape.push_back(static_cast<int64_t>(to_size(d, path, name, "shape")));
      t.begin = to_size(offsets->items[0], path, name, "data_offsets");
      t.end = to_size(offsets->items[1], path, name, "data_offsets");
      YUAN_CHECK(t.begin <= t.end && t.end <= data_size, "%s: tensor '%s' bytes [%zu, %zu) outside the %zu-byte data",
                 path.c_str(), name.c_str(), t.begin, t.end, data_size);
      YUAN_CHECK(t.end - t.begin == t.numel() * esize, "%s: tensor '%s' has %zu bytes, its %s shape needs %zu",
                 path.c_str(), name.c_str(), t.end - t.begin, t.dtype.c_str(), t.numel() * esize);
      tensors_.emplace(name, std::move(t));
    }
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), map_size_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() { ::munmap(const_cast<uint8_t*>(map_), map_size_); }

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

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<const Entry*> order;
  for (const Entry& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return safetensors_dtype_size(a->dtype) > safetensors_dtype_size(b->dtype);
  });

  std::string h = "{";
  if (!metadata_.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata_) {
      if (!first) h += ',';
      first = false;
      json_string(h, k);
      h += ':';
      json_string(h, v);
    }
    h += '}';
  }
  size_t offset = 0;
  for (const Entry* e : order) {
    if (h.size() > 1) h += ',';
    json_string(h, e->name);
    h += ":{\"dtype\":\"" + e->dtype + "\",\"shape\":" + shape_str(e->shape) + ",\"data_offsets\":[" +
         std::to_string(offset) + "," + std::to_string(offset + e->bytes) + "]}";
    offset += e->bytes;
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t n = h.size();

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  YUAN_CHECK(fd >= 0, "%s: cannot create: %s", tmp.c_str(), std::strerror(errno));
  try {
    write_all(fd, &n, 8, tmp);
    write_all(fd, h.data(), h.size(), tmp);
    for (const Entry* e : order) write_all(fd, e->data, e->bytes, tmp);
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
