#include "data/shard.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "data/hdf5_check.h"
#include "util/error.h"

namespace yuan {

namespace {

constexpr size_t kChunkBytes = 1 << 20;

// "uint16", "int32", "float32", ...: how a dtype is named in errors, as numpy would name it.
std::string dtype_name(hid_t t) {
  size_t bits = H5Tget_size(t) * 8;
  switch (H5Tget_class(t)) {
    case H5T_INTEGER: return strf("%sint%zu", H5Tget_sign(t) == H5T_SGN_NONE ? "u" : "", bits);
    case H5T_FLOAT: return strf("float%zu", bits);
    case H5T_STRING: return "string";
    default: return strf("non-numeric (HDF5 class %d)", static_cast<int>(H5Tget_class(t)));
  }
}

hid_t native_unsigned(size_t bytes) {
  switch (bytes) {
    case 1: return H5T_NATIVE_UINT8;
    case 2: return H5T_NATIVE_UINT16;
    case 4: return H5T_NATIVE_UINT32;
    default: return H5T_NATIVE_UINT64;
  }
}

Hid open_attr(hid_t obj, const std::string& path, const char* name) {
  htri_t exists = HDF5_CHECK(H5Aexists(obj, name), "%s: cannot look up attribute %s", path.c_str(), name);
  YUAN_CHECK(exists > 0, "%s: missing attribute %s (not a yuanlm shard? see docs/FORMAT.md)", path.c_str(), name);
  return Hid(HDF5_CHECK(H5Aopen(obj, name, H5P_DEFAULT), "%s: cannot open attribute %s", path.c_str(), name),
             H5Aclose);
}

// Integer attributes: h5py writes Python ints as int64 scalars, we write int32; both read as one int.
int64_t read_int_attr(hid_t obj, const std::string& path, const char* name) {
  Hid attr = open_attr(obj, path, name);
  Hid type(HDF5_CHECK(H5Aget_type(attr.get()), "%s: attribute %s", path.c_str(), name), H5Tclose);
  Hid space(HDF5_CHECK(H5Aget_space(attr.get()), "%s: attribute %s", path.c_str(), name), H5Sclose);
  YUAN_CHECK(H5Tget_class(type.get()) == H5T_INTEGER && H5Sget_simple_extent_npoints(space.get()) == 1,
             "%s: attribute %s must be one integer, found %s", path.c_str(), name, dtype_name(type.get()).c_str());
  int64_t v = 0;
  HDF5_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), "%s: cannot read attribute %s", path.c_str(), name);
  return v;
}

std::string read_string_attr(hid_t obj, const std::string& path, const char* name) {
  Hid attr = open_attr(obj, path, name);
  Hid type(HDF5_CHECK(H5Aget_type(attr.get()), "%s: attribute %s", path.c_str(), name), H5Tclose);
  YUAN_CHECK(H5Tget_class(type.get()) == H5T_STRING, "%s: attribute %s must be a string, found %s",
             path.c_str(), name, dtype_name(type.get()).c_str());
  Hid mem(HDF5_CHECK(H5Tcopy(H5T_C_S1), "%s: attribute %s", path.c_str(), name), H5Tclose);
  HDF5_CHECK(H5Tset_cset(mem.get(), H5Tget_cset(type.get())), "%s: attribute %s", path.c_str(), name);
  if (H5Tis_variable_str(type.get()) > 0) {  // what h5py writes for a Python str
    HDF5_CHECK(H5Tset_size(mem.get(), H5T_VARIABLE), "%s: attribute %s", path.c_str(), name);
    char* s = nullptr;
    HDF5_CHECK(H5Aread(attr.get(), mem.get(), &s), "%s: cannot read attribute %s", path.c_str(), name);
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  size_t n = H5Tget_size(type.get());
  std::string buf(n + 1, '\0');
  HDF5_CHECK(H5Tset_size(mem.get(), n + 1), "%s: attribute %s", path.c_str(), name);
  HDF5_CHECK(H5Aread(attr.get(), mem.get(), &buf[0]), "%s: cannot read attribute %s", path.c_str(), name);
  return std::string(buf.c_str());
}

// The check runs over the whole block before any error is formatted, so the copy loop vectorizes.
template <typename T>
void widen_checked(const T* in, size_t n, int32_t* out, const ShardReader& r, uint64_t offset) {
  T top = 0;
  for (size_t i = 0; i < n; i++) {
    top = std::max(top, in[i]);
    out[i] = static_cast<int32_t>(in[i]);
  }
  const uint64_t vocab = static_cast<uint64_t>(r.meta().vocab_size);
  if (top < vocab) return;
  const size_t i = std::find_if(in, in + n, [&](T id) { return id >= vocab; }) - in;
  throw Error(strf("%s: token id %llu at offset %llu >= vocab_size %llu", r.path().c_str(),
                   static_cast<unsigned long long>(in[i]), static_cast<unsigned long long>(offset + i),
                   static_cast<unsigned long long>(vocab)));
}

Hid file_access() {
  Hid fapl(HDF5_CHECK(H5Pcreate(H5P_FILE_ACCESS), "file access list"), H5Pclose);
  HDF5_CHECK(H5Pset_file_locking(fapl.get(), 0, 1), "file access list");
  return fapl;
}

}  // namespace

ShardReader::ShardReader(const std::string& path, size_t window) : path_(path) {
  const char* p = path.c_str();
  YUAN_CHECK(access(p, R_OK) == 0, "%s: %s", p, std::strerror(errno));
  Hdf5Lock lock;
  Hid fapl = file_access();
  file_ = Hid(HDF5_CHECK(H5Fopen(p, H5F_ACC_RDONLY, fapl.get()), "%s: not a readable HDF5 file", p), H5Fclose);
  htri_t has = HDF5_CHECK(H5Lexists(file_.get(), "tokens", H5P_DEFAULT), "%s: cannot look up /tokens", p);
  YUAN_CHECK(has > 0, "%s: no /tokens dataset (see docs/FORMAT.md)", p);

  Hid probe(HDF5_CHECK(H5Dopen2(file_.get(), "tokens", H5P_DEFAULT), "%s: cannot open /tokens", p), H5Dclose);
  Hid type(HDF5_CHECK(H5Dget_type(probe.get()), "%s: /tokens", p), H5Tclose);
  YUAN_CHECK(H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_NONE,
             "%s: /tokens has dtype %s, expected an unsigned integer (uint16 or uint32)", p,
             dtype_name(type.get()).c_str());
  elem_size_ = H5Tget_size(type.get());
  YUAN_CHECK(elem_size_ == 1 || elem_size_ == 2 || elem_size_ == 4 || elem_size_ == 8,
             "%s: /tokens has an unsupported %zu-byte integer type", p, elem_size_);
  fspace_ = Hid(HDF5_CHECK(H5Dget_space(probe.get()), "%s: /tokens", p), H5Sclose);
  int rank = HDF5_CHECK(H5Sget_simple_extent_ndims(fspace_.get()), "%s: /tokens", p);
  YUAN_CHECK(rank == 1, "%s: /tokens has rank %d, expected 1", p, rank);
  hsize_t dims = 0;
  HDF5_CHECK(H5Sget_simple_extent_dims(fspace_.get(), &dims, nullptr), "%s: /tokens", p);
  tokens_ = dims;

  // A window is far smaller than a chunk. A cache able to hold a chunk would read a whole 1 MiB chunk for a
  // few KiB at a random place; one sized to the read makes HDF5 read just the selection from the file.
  Hid dapl(HDF5_CHECK(H5Pcreate(H5P_DATASET_ACCESS), "%s: dataset access list", p), H5Pclose);
  HDF5_CHECK(H5Pset_chunk_cache(dapl.get(), 101, window * elem_size_, 1.0), "%s: chunk cache", p);
  probe.reset();
  dset_ = Hid(HDF5_CHECK(H5Dopen2(file_.get(), "tokens", dapl.get()), "%s: cannot open /tokens", p), H5Dclose);
  memtype_ = Hid(HDF5_CHECK(H5Tcopy(native_unsigned(elem_size_)), "%s: /tokens", p), H5Tclose);

  int64_t version = read_int_attr(file_.get(), path, "format_version");
  YUAN_CHECK(version == kShardFormatVersion, "%s: format_version %lld, this build reads version %d", p,
             static_cast<long long>(version), kShardFormatVersion);
  int64_t vocab = read_int_attr(file_.get(), path, "vocab_size");
  YUAN_CHECK(vocab > 0 && vocab <= INT32_MAX, "%s: vocab_size %lld out of range", p, static_cast<long long>(vocab));
  int64_t eot = read_int_attr(file_.get(), path, "eot_id");
  YUAN_CHECK(eot >= 0 && eot < vocab, "%s: eot_id %lld outside [0, vocab_size %lld)", p,
             static_cast<long long>(eot), static_cast<long long>(vocab));
  meta_.vocab_size = static_cast<int>(vocab);
  meta_.eot_id = static_cast<int>(eot);
  meta_.tokenizer = read_string_attr(file_.get(), path, "tokenizer");
  scratch_.resize(window * elem_size_);
  map_storage(type.get());
}

ShardReader::~ShardReader() {
  if (fd_ >= 0) ::close(fd_);
}

// HDF5 spends about 4 us of CPU on every hyperslab read (selection, chunk lookup, the global lock), most of
// the cost of one 2 KiB window from the page cache. Data that HDF5 keeps as plain bytes (no filters, the
// host's byte order) sits at file offsets that HDF5 reports: they are looked up once here, and a read becomes
// one pread(2) per chunk it touches. HDF5 still opens and validates the file; anything unusual keeps the
// hyperslab path.
void ShardReader::map_storage(hid_t file_type) {
  const char* p = path_.c_str();
  Hdf5Lock lock;
  if (tokens_ == 0 || H5Tget_order(file_type) != H5Tget_order(memtype_.get())) return;
  Hid fcpl(HDF5_CHECK(H5Fget_create_plist(file_.get()), "%s: file properties", p), H5Pclose);
  hsize_t userblock = 0;
  HDF5_CHECK(H5Pget_userblock(fcpl.get(), &userblock), "%s: file properties", p);
  if (userblock != 0) return;  // addresses would count from the end of the user block
  Hid dcpl(HDF5_CHECK(H5Dget_create_plist(dset_.get()), "%s: /tokens properties", p), H5Pclose);
  std::vector<uint64_t> addr;
  uint64_t extent = 0;
  switch (H5Pget_layout(dcpl.get())) {
    case H5D_CONTIGUOUS: {
      haddr_t a = H5Dget_offset(dset_.get());
      if (a == HADDR_UNDEF) return;  // storage never allocated: HDF5 reads the fill value
      addr.push_back(a);
      extent = tokens_;
      break;
    }
    case H5D_CHUNKED: {
      if (HDF5_CHECK(H5Pget_nfilters(dcpl.get()), "%s: /tokens filters", p) != 0) return;
      hsize_t dim = 0;
      HDF5_CHECK(H5Pget_chunk(dcpl.get(), 1, &dim), "%s: /tokens chunking", p);
      for (hsize_t start = 0; start < tokens_; start += dim) {
        unsigned mask = 0;
        haddr_t a = HADDR_UNDEF;
        hsize_t bytes = 0;
        HDF5_CHECK(H5Dget_chunk_info_by_coord(dset_.get(), &start, &mask, &a, &bytes), "%s: /tokens chunk at %llu",
                   p, static_cast<unsigned long long>(start));
        if (a == HADDR_UNDEF || bytes != dim * elem_size_) return;
        addr.push_back(a);
      }
      extent = dim;
      break;
    }
    default: return;  // compact: a few KiB inside the object header
  }
  int fd = ::open(p, O_RDONLY | O_CLOEXEC);
  YUAN_CHECK(fd >= 0, "%s: %s", p, std::strerror(errno));
  // Windows are read at random places: read-ahead, when the kernel sees neighbouring windows in a row and
  // guesses a stream, would only fetch data nobody asked for.
  posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  fd_ = fd;
  extent_addr_ = std::move(addr);
  extent_tokens_ = extent;
}

void ShardReader::read_direct(uint64_t offset, size_t n) {
  uint8_t* dst = scratch_.data();
  for (uint64_t t = offset, end = offset + n; t < end;) {
    const uint64_t within = t % extent_tokens_;
    const uint64_t take = std::min(end - t, extent_tokens_ - within);
    const size_t bytes = take * elem_size_;
    const off_t at = static_cast<off_t>(extent_addr_[t / extent_tokens_] + within * elem_size_);
    for (size_t got = 0; got < bytes;) {
      ssize_t r = pread(fd_, dst + got, bytes - got, at + static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      YUAN_CHECK(r > 0, "%s: cannot read %zu tokens at offset %llu: %s", path_.c_str(), n,
                 static_cast<unsigned long long>(offset),
                 r == 0 ? "the file ends early (truncated?)" : std::strerror(errno));
      got += static_cast<size_t>(r);
    }
    dst += bytes;
    t += take;
  }
}

void ShardReader::read_hyperslab(uint64_t offset, size_t n) {
  const char* p = path_.c_str();
  Hdf5Lock lock;
  if (mspace_n_ != n) {
    hsize_t dim = n;
    mspace_ = Hid(HDF5_CHECK(H5Screate_simple(1, &dim, nullptr), "%s: memory space", p), H5Sclose);
    mspace_n_ = n;
  }
  hsize_t start = offset, count = n;
  HDF5_CHECK(H5Sselect_hyperslab(fspace_.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr),
             "%s: select tokens at offset %llu", p, static_cast<unsigned long long>(offset));
  HDF5_CHECK(H5Dread(dset_.get(), memtype_.get(), mspace_.get(), fspace_.get(), H5P_DEFAULT, scratch_.data()),
             "%s: cannot read %zu tokens at offset %llu", p, n, static_cast<unsigned long long>(offset));
}

void ShardReader::read(uint64_t offset, size_t n, int32_t* out) {
  const char* p = path_.c_str();
  YUAN_CHECK(offset + n <= tokens_, "%s: read of %zu tokens at offset %llu runs past the end (%llu tokens)", p, n,
             static_cast<unsigned long long>(offset), static_cast<unsigned long long>(tokens_));
  if (scratch_.size() < n * elem_size_) scratch_.resize(n * elem_size_);
  if (direct())
    read_direct(offset, n);
  else
    read_hyperslab(offset, n);
  const void* s = scratch_.data();
  switch (elem_size_) {
    case 1: widen_checked(static_cast<const uint8_t*>(s), n, out, *this, offset); break;
    case 2: widen_checked(static_cast<const uint16_t*>(s), n, out, *this, offset); break;
    case 4: widen_checked(static_cast<const uint32_t*>(s), n, out, *this, offset); break;
    default: widen_checked(static_cast<const uint64_t*>(s), n, out, *this, offset); break;
  }
}

ShardWriter::ShardWriter(const std::string& path, const ShardMeta& meta, uint64_t capacity)
    : path_(path), tmp_(path + ".tmp"), meta_(meta) {
  const char* p = tmp_.c_str();
  YUAN_CHECK(meta.vocab_size > 0 && meta.eot_id >= 0 && meta.eot_id < meta.vocab_size,
             "%s: bad shard metadata: vocab_size %d, eot_id %d", path.c_str(), meta.vocab_size, meta.eot_id);
  const bool narrow = meta.vocab_size <= 65536;
  uint64_t chunk = kChunkBytes / (narrow ? 2 : 4);
  if (capacity > 0 && capacity < chunk) chunk = capacity;
  stage_ = HostArray<uint32_t>(chunk, Mem::Data);

  Hdf5Lock lock;
  Hid fapl = file_access();
  file_ = Hid(HDF5_CHECK(H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), "%s: cannot create", p), H5Fclose);
  hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk_dim = chunk;
  Hid space(HDF5_CHECK(H5Screate_simple(1, &zero, &unlimited), "%s: /tokens space", p), H5Sclose);
  Hid dcpl(HDF5_CHECK(H5Pcreate(H5P_DATASET_CREATE), "%s: /tokens", p), H5Pclose);
  HDF5_CHECK(H5Pset_chunk(dcpl.get(), 1, &chunk_dim), "%s: /tokens chunking", p);
  // No modification times in the file: the same tokens give the same bytes, so checksums compare runs.
  HDF5_CHECK(H5Pset_obj_track_times(dcpl.get(), 0), "%s: /tokens", p);
  dset_ = Hid(HDF5_CHECK(H5Dcreate2(file_.get(), "tokens", narrow ? H5T_STD_U16LE : H5T_STD_U32LE, space.get(),
                                    H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                         "%s: cannot create /tokens", p),
              H5Dclose);
}

ShardWriter::~ShardWriter() {
  if (closed_) return;
  dset_.reset();
  file_.reset();
  std::remove(tmp_.c_str());
}

void ShardWriter::begin_document() { doc_offsets_.push_back(tokens()); }

void ShardWriter::append(const uint32_t* ids, size_t n) {
  for (size_t i = 0; i < n; i++) {
    YUAN_CHECK(ids[i] < static_cast<uint32_t>(meta_.vocab_size), "%s: token id %u at offset %llu >= vocab_size %d",
               path_.c_str(), ids[i], static_cast<unsigned long long>(tokens() + i), meta_.vocab_size);
  }
  while (n > 0) {
    size_t take = std::min(n, stage_.size() - staged_);
    std::memcpy(stage_.data() + staged_, ids, take * sizeof(uint32_t));
    staged_ += take, ids += take, n -= take;
    if (staged_ == stage_.size()) flush();
  }
}

void ShardWriter::flush() {
  if (staged_ == 0) return;
  const char* p = tmp_.c_str();
  Hdf5Lock lock;
  hsize_t start = written_, count = staged_, total = written_ + staged_;
  HDF5_CHECK(H5Dset_extent(dset_.get(), &total), "%s: cannot extend /tokens", p);
  Hid fspace(HDF5_CHECK(H5Dget_space(dset_.get()), "%s: /tokens", p), H5Sclose);
  HDF5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr), "%s: /tokens", p);
  Hid mspace(HDF5_CHECK(H5Screate_simple(1, &count, nullptr), "%s: memory space", p), H5Sclose);
  HDF5_CHECK(H5Dwrite(dset_.get(), H5T_NATIVE_UINT32, mspace.get(), fspace.get(), H5P_DEFAULT, stage_.data()),
             "%s: cannot write %zu tokens at offset %llu", p, staged_, static_cast<unsigned long long>(written_));
  written_ += staged_;
  staged_ = 0;
}

void ShardWriter::close() {
  flush();
  const char* p = tmp_.c_str();
  {
    Hdf5Lock lock;
    hid_t f = file_.get();
    if (!doc_offsets_.empty()) {
      hsize_t n = doc_offsets_.size();
      Hid space(HDF5_CHECK(H5Screate_simple(1, &n, nullptr), "%s: /doc_offsets", p), H5Sclose);
      Hid dcpl(HDF5_CHECK(H5Pcreate(H5P_DATASET_CREATE), "%s: /doc_offsets", p), H5Pclose);
      HDF5_CHECK(H5Pset_obj_track_times(dcpl.get(), 0), "%s: /doc_offsets", p);
      Hid d(HDF5_CHECK(H5Dcreate2(f, "doc_offsets", H5T_STD_U64LE, space.get(), H5P_DEFAULT, dcpl.get(),
                                  H5P_DEFAULT),
                       "%s: cannot create /doc_offsets", p),
            H5Dclose);
      HDF5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, doc_offsets_.data()),
                 "%s: cannot write /doc_offsets", p);
    }
    Hid scalar(HDF5_CHECK(H5Screate(H5S_SCALAR), "%s: attributes", p), H5Sclose);
    const std::pair<const char*, int> ints[] = {
        {"format_version", kShardFormatVersion}, {"vocab_size", meta_.vocab_size}, {"eot_id", meta_.eot_id}};
    for (const auto& [name, value] : ints) {
      Hid a(HDF5_CHECK(H5Acreate2(f, name, H5T_STD_I32LE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT), "%s: %s", p, name),
            H5Aclose);
      HDF5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT, &value), "%s: cannot write attribute %s", p, name);
    }
    // A variable-length UTF-8 string, which is what h5py writes for a str and reads back as one.
    Hid str(HDF5_CHECK(H5Tcopy(H5T_C_S1), "%s: tokenizer", p), H5Tclose);
    HDF5_CHECK(H5Tset_size(str.get(), H5T_VARIABLE), "%s: tokenizer", p);
    HDF5_CHECK(H5Tset_cset(str.get(), H5T_CSET_UTF8), "%s: tokenizer", p);
    Hid a(HDF5_CHECK(H5Acreate2(f, "tokenizer", str.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT), "%s: tokenizer", p),
          H5Aclose);
    const char* s = meta_.tokenizer.c_str();
    HDF5_CHECK(H5Awrite(a.get(), str.get(), &s), "%s: cannot write attribute tokenizer", p);
    a.reset();
    dset_.reset();
    HDF5_CHECK(H5Fflush(f, H5F_SCOPE_LOCAL), "%s: cannot flush", p);
    file_.reset();
  }
  YUAN_CHECK(std::rename(p, path_.c_str()) == 0, "%s: cannot rename to %s: %s", p, path_.c_str(),
             std::strerror(errno));
  closed_ = true;
}

}  // namespace yuan
