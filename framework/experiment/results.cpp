#include "framework/experiment/results.h"

#include <H5Cpp.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <new>
#include <optional>
#include <thread>

#include "framework/core/error.h"
#include "framework/model/mapped_file.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;

constexpr int kDeflateLevel = 4;
constexpr uint64_t kChunkElements = 1 << 16;  // ~256 KiB of float32 per chunk

H5::StrType vlen_string_type() {
  H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  t.setCset(H5T_CSET_UTF8);
  return t;
}

// Opens the file, waiting while another process holds it: HDF5 locks a file while it is open
// (a reader such as h5py or `kvlab report` makes a writer's open fail, and vice versa). The
// writer keeps the file closed between cells, so such waits are short; after kOpenWaitSeconds
// the last error is thrown.
// Only a lock failure is waited for: a file that is not HDF5, or is corrupt, fails at once
// (waiting 2 minutes on a truncated file would look like a hang).
constexpr double kOpenWaitSeconds = 120;
bool last_error_is_lock_failure() {
  bool found = false;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        if (e->min_num == H5E_CANTLOCKFILE) *static_cast<bool*>(out) = true;
        return 0;
      },
      &found);
  return found;
}
H5::H5File open_file(const fs::path& path, unsigned flags) {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    try {
      return H5::H5File(path.string(), flags);
    } catch (const H5::Exception&) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!last_error_is_lock_failure() || waited > kOpenWaitSeconds || !fs::exists(path)) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
}

// The system errors (errno) HDF5 recorded on its error stack, e.g. "No space left on device",
// deduplicated: the detail of a C++ H5::Exception names only the API call that failed.
std::string hdf5_system_errors() {
  std::vector<std::string> found;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
        auto& out = *static_cast<std::vector<std::string>*>(data);
        const char* m = e->desc ? std::strstr(e->desc, "error message = '") : nullptr;
        if (!m) return 0;
        m += std::strlen("error message = '");
        const char* end = std::strchr(m, '\'');
        std::string msg = end ? std::string(m, end) : std::string(m);
        if (std::find(out.begin(), out.end(), msg) == out.end()) out.push_back(msg);
        return 0;
      },
      &found);
  std::string out;
  for (const auto& m : found) out += (out.empty() ? "" : "; ") + m;
  return out;
}

[[noreturn]] void fail_hdf5(const fs::path& path, const std::string& what, const H5::Exception& e) {
  const std::string sys = hdf5_system_errors();
  fail(path.string(), ": HDF5 error while ", what, ": ", e.getDetailMsg(), sys.empty() ? "" : " (", sys,
       sys.empty() ? "" : ")");
}

// Runs `body`, turning HDF5's exceptions into kvlab::Error naming the file and what we did.
template <class F>
auto guarded(const fs::path& path, const std::string& what, F&& body) {
  H5::Exception::dontPrint();
  try {
    return body();
  } catch (const H5::Exception& e) {
    fail_hdf5(path, what, e);
  } catch (const std::bad_alloc&) {  // a size read from a corrupt file
    fail(path.string(), ": out of memory while ", what);
  }
}

// ---- atomic updates ------------------------------------------------------------------------
// HDF5 has no journal: a process killed (or a disk filling up) in the middle of a write or flush
// can leave metadata half written and the whole file unreadable. So the file at `path` is never
// written in place. Every change copies it to PATH.partial, makes the change there, closes and
// fsyncs the copy and renames it over `path` (atomic on POSIX), then fsyncs the directory. At
// any instant `path` is the last completely written version; a failure (full disk, a kill)
// leaves it untouched and at worst a stale PATH.partial, which the next change overwrites.
// Cost: one copy of the file per change (a results file is small next to a cell's compute), and
// room for two copies on the disk.

fs::path partial_path(const fs::path& path) { return fs::path(path.string() + ".partial"); }

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.empty() ? "." : p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) fail(p.string(), ": cannot open to sync: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot sync a directory (EINVAL); the rename is still atomic there.
  if (rc != 0 && !(directory && (err == EINVAL || err == ENOTSUP)))
    fail(p.string(), ": fsync failed: ", std::strerror(err));
}

// The bytes of `path` and its permission bits. Throws naming the file and the system error.
std::vector<char> read_all(const fs::path& path, mode_t* mode) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path.string(), ": cannot read: ", std::strerror(errno));
  struct stat st{};
  ::fstat(fd, &st);
  *mode = st.st_mode & 07777;
  std::vector<char> out(size_t(st.st_size));
  size_t done = 0;
  int err = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    done += size_t(n);
  }
  ::close(fd);
  if (err) fail(path.string(), ": cannot read: ", std::strerror(err));
  out.resize(done);
  return out;
}

// Writes `bytes` to `path` (created or truncated with `mode`), then fsyncs it. Throws naming
// the file and the system error (a full disk: "No space left on device").
void write_all(const fs::path& path, const std::vector<char>& bytes, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) fail("cannot create ", path.string(), ": ", std::strerror(errno));
  int err = 0;
  for (size_t done = 0; done < bytes.size() && !err;) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno != EINTR) err = errno;
    if (n > 0) done += size_t(n);
  }
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (err) fail("cannot write ", path.string(), ": ", std::strerror(err));
}

// An exclusive flock on the results file while it is being replaced: a second kvlab writing the
// same file waits instead of overwriting the first one's change, and HDF5 readers (which take
// a shared flock on open) wait too. Waits up to kOpenWaitSeconds. Re-checks after locking that
// `path` still is the file locked (another writer may have renamed a new version over it).
class ExclusiveFileLock {
 public:
  explicit ExclusiveFileLock(const fs::path& path) {
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) fail(path.string(), ": cannot open the results file: ", std::strerror(errno));
      if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
        struct stat locked{}, now{};
        if (::fstat(fd_, &locked) == 0 && ::stat(path.c_str(), &now) == 0 && locked.st_ino == now.st_ino &&
            locked.st_dev == now.st_dev)
          return;
      } else if (errno != EWOULDBLOCK && errno != EINTR) {
        return;  // a file system without flock (ENOLCK, ENOSYS): go on unlocked, as HDF5 can be told to
      }
      ::close(fd_);
      fd_ = -1;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > kOpenWaitSeconds)
        fail(path.string(), ": another process has held the results file for ", int(kOpenWaitSeconds),
             " s; is a second kvlab writing it?");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  ~ExclusiveFileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the flock
  }
  ExclusiveFileLock(const ExclusiveFileLock&) = delete;
  ExclusiveFileLock& operator=(const ExclusiveFileLock&) = delete;

 private:
  int fd_ = -1;
};

// Writes a new version of `path` through PATH.partial (above). HDF5 works on an in-memory image
// of the file (the core driver without backing store), so it never touches the disk: all I/O
// is ours, and a full disk is a clean error from write(2) -- HDF5 1.10 crashes when a file whose
// close failed for want of space is closed again. `body(H5::H5File&)` changes the image (for
// `create`, an empty file); the image is written to PATH.partial, fsynced and renamed over
// `path`. On any error the partial copy is removed and `path` is as before; the error names
// `path`, `what` and the system error.
constexpr size_t kImageIncrementBytes = size_t{1} << 20;
template <class F>
auto replace_file(const fs::path& path, const std::string& what, bool create, F&& body) {
  H5::Exception::dontPrint();
  // A symbolic link stays one: the file it points to is replaced (in its own directory).
  fs::path target = path;
  std::error_code link_ec;
  if (fs::is_symlink(path, link_ec)) {
    const fs::path resolved = fs::canonical(path, link_ec);
    if (!link_ec) target = resolved;
  }
  const fs::path partial = partial_path(target);
  const std::string unchanged = create ? std::string("; no results file was written")
                                       : str_cat("; ", path.string(), " is unchanged (it keeps everything written before)");
  std::optional<ExclusiveFileLock> lock;
  if (!create) lock.emplace(target);
  auto cleanup = [&] {
    std::error_code ec;
    fs::remove(partial, ec);
  };
  try {
    mode_t mode = 0666;  // (less the umask) as HDF5 creates files
    std::vector<char> image;
    if (!create) image = read_all(target, &mode);
    H5::FileAccPropList fapl;
    fapl.setCore(kImageIncrementBytes, /*backing_store=*/false);
    if (!create && H5Pset_file_image(fapl.getId(), image.data(), image.size()) < 0)
      fail(path.string(), ": HDF5 cannot take the file's image (", image.size(), " bytes)");
    // The name only identifies the in-memory file; nothing is written under it (but the core
    // driver refuses a name that exists on disk, such as a stale PATH.partial).
    H5::H5File f(path.string() + ".kvlab-in-memory-image", create ? H5F_ACC_TRUNC : H5F_ACC_RDWR, H5::FileCreatPropList::DEFAULT, fapl);
    auto finish = [&] {
      f.flush(H5F_SCOPE_GLOBAL);
      const ssize_t n = H5Fget_file_image(f.getId(), nullptr, 0);
      if (n < 0) throw H5::FileIException("H5Fget_file_image", "cannot size the file image");
      image.assign(size_t(n), 0);
      if (H5Fget_file_image(f.getId(), image.data(), size_t(n)) != n)
        throw H5::FileIException("H5Fget_file_image", "cannot copy the file image");
      f.close();  // in memory: no I/O
      write_all(partial, image, mode);
      std::error_code ec;
      fs::rename(partial, target, ec);
      if (ec) fail("cannot put ", partial.string(), " in its place: ", ec.message());
      fsync_path(target.parent_path(), true);
    };
    if constexpr (std::is_void_v<decltype(body(f))>) {
      body(f);
      finish();
    } else {
      auto result = body(f);
      finish();
      return result;
    }
  } catch (const H5::Exception& e) {
    cleanup();
    try {
      fail_hdf5(path, what, e);
    } catch (const Error& translated) {
      fail(translated.what(), unchanged);
    }
  } catch (const Error& e) {
    cleanup();
    const std::string msg = e.what();
    // Messages naming the file itself (a refused cell) stand; others get the file and the step.
    if (msg.rfind(path.string() + ":", 0) == 0) fail(msg, unchanged);
    fail(path.string(), ": while ", what, ": ", msg, unchanged);
  } catch (...) {
    cleanup();
    throw;
  }
}

void write_attr(H5::H5Object& obj, const std::string& name, const AttrValue& value) {
  if (obj.attrExists(name)) obj.removeAttr(name);
  if (auto* i = std::get_if<int64_t>(&value)) {
    H5::Attribute a = obj.createAttribute(name, H5::PredType::NATIVE_INT64, H5::DataSpace(H5S_SCALAR));
    a.write(H5::PredType::NATIVE_INT64, i);
  } else if (auto* d = std::get_if<double>(&value)) {
    H5::Attribute a = obj.createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR));
    a.write(H5::PredType::NATIVE_DOUBLE, d);
  } else if (auto* s = std::get_if<std::string>(&value)) {
    H5::StrType t = vlen_string_type();
    H5::Attribute a = obj.createAttribute(name, t, H5::DataSpace(H5S_SCALAR));
    const char* p = s->c_str();
    a.write(t, &p);
  } else if (auto* vi = std::get_if<std::vector<int64_t>>(&value)) {
    hsize_t n = vi->size();
    H5::Attribute a = obj.createAttribute(name, H5::PredType::NATIVE_INT64, H5::DataSpace(1, &n));
    if (n) a.write(H5::PredType::NATIVE_INT64, vi->data());
  } else {
    const auto& vd = std::get<std::vector<double>>(value);
    hsize_t n = vd.size();
    H5::Attribute a = obj.createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(1, &n));
    if (n) a.write(H5::PredType::NATIVE_DOUBLE, vd.data());
  }
}

// The size of the file holding `obj` (0 when HDF5 cannot tell).
uint64_t file_bytes_of(hid_t obj) {
  const hid_t f = H5Iget_file_id(obj);
  hsize_t size = 0;
  if (f >= 0) {
    if (H5Fget_filesize(f, &size) < 0) size = 0;
    H5Fclose(f);
  }
  return size;
}

// Element counts come from the file's dataspaces: they are checked against what the file can
// hold before a vector is sized from them. Attribute data is stored uncompressed (each element
// at least one byte of the file); dataset chunks may be deflated, and deflate expands at most
// ~1032:1, so a dataset may hold up to 1100 bytes per file byte (+1 MiB for fill values).
void check_elements(uint64_t n, uint64_t bytes_per_file_byte, uint64_t slack_bytes, hid_t obj,
                    const std::string& what) {
  const uint64_t file_bytes = file_bytes_of(obj);
  if (n > file_bytes * bytes_per_file_byte + slack_bytes)
    fail(what, " claims ", n, " elements, more than the file's ", file_bytes, " bytes can hold (corrupt file?)");
}

AttrValue read_attr(const H5::Attribute& a) {
  const H5::DataSpace space = a.getSpace();
  const bool scalar = space.getSimpleExtentType() == H5S_SCALAR;
  const hssize_t n = space.getSimpleExtentNpoints();
  check_elements(uint64_t(n), 1, 0, a.getId(), "attribute '" + a.getName() + "'");
  if (scalar && n != 1) fail("attribute '", a.getName(), "' is a scalar without a value");
  const H5T_class_t cls = a.getTypeClass();
  if (cls == H5T_STRING) {
    H5::StrType t = a.getStrType();
    std::string s;
    a.read(t, s);
    return s;
  }
  if (cls == H5T_INTEGER) {
    std::vector<int64_t> v(n);
    if (n) a.read(H5::PredType::NATIVE_INT64, v.data());
    if (scalar) return v.at(0);
    return v;
  }
  if (cls == H5T_FLOAT) {
    std::vector<double> v(n);
    if (n) a.read(H5::PredType::NATIVE_DOUBLE, v.data());
    if (scalar) return v.at(0);
    return v;
  }
  fail("attribute '", a.getName(), "' has an unsupported type");
}

AttrMap read_attrs(const H5::H5Object& obj) {
  AttrMap out;
  const int n = obj.getNumAttrs();
  for (int i = 0; i < n; ++i) {
    H5::Attribute a = obj.openAttribute(static_cast<unsigned>(i));
    out[a.getName()] = read_attr(a);
  }
  return out;
}

std::vector<std::string> child_names(const H5::Group& g) {
  std::vector<std::string> out;
  const hsize_t n = g.getNumObjs();
  for (hsize_t i = 0; i < n; ++i) out.push_back(g.getObjnameByIdx(i));
  std::sort(out.begin(), out.end());
  return out;
}

H5::Group ensure_group(H5::Group& parent, const std::string& name) {
  if (parent.nameExists(name)) return parent.openGroup(name);
  return parent.createGroup(name);
}

void write_dataset(H5::Group& g, const std::string& name, const Dataset& ds) {
  const std::vector<uint64_t> dims64 = ds.dims();
  std::vector<hsize_t> dims(dims64.begin(), dims64.end());
  uint64_t total = 1;
  for (uint64_t d : dims64) total *= d;
  KVLAB_CHECK(total == ds.size(), "dataset '", name, "': shape does not match its data");
  H5::DataSpace space(int(dims.size()), dims.data());
  H5::DSetCreatPropList props;
  if (total > 0) {
    // Chunk: the trailing dimensions whole as far as kChunkElements allows, leading ones 1.
    std::vector<hsize_t> chunk(dims.size(), 1);
    uint64_t elems = 1;
    for (size_t i = dims.size(); i-- > 0;) {
      chunk[i] = std::max<hsize_t>(1, std::min<hsize_t>(dims[i], kChunkElements / elems));
      elems *= chunk[i];
    }
    props.setChunk(int(chunk.size()), chunk.data());
    props.setShuffle();
    props.setDeflate(kDeflateLevel);
  }
  H5::DataSet out;
  std::visit(
      [&](const auto& v) {
        using T = typename std::decay_t<decltype(v)>::value_type;
        if constexpr (std::is_same_v<T, std::string>) {
          H5::StrType t = vlen_string_type();
          out = g.createDataSet(name, t, space, props);
          std::vector<const char*> ptrs;
          for (const auto& s : v) ptrs.push_back(s.c_str());
          if (total) out.write(ptrs.data(), t);
        } else {
          const H5::PredType& t = std::is_same_v<T, float>     ? H5::PredType::NATIVE_FLOAT
                                  : std::is_same_v<T, double>  ? H5::PredType::NATIVE_DOUBLE
                                  : std::is_same_v<T, int64_t> ? H5::PredType::NATIVE_INT64
                                                               : H5::PredType::NATIVE_INT8;
          out = g.createDataSet(name, t, space, props);
          if (total) out.write(v.data(), t);
        }
      },
      ds.data);
  for (const auto& [k, a] : ds.attrs) write_attr(out, k, a);
}

Dataset read_dataset(const H5::DataSet& in) {
  Dataset ds;
  const H5::DataSpace space = in.getSpace();
  const int rank = space.getSimpleExtentNdims();
  std::vector<hsize_t> dims(rank);
  space.getSimpleExtentDims(dims.data());
  ds.shape.assign(dims.begin(), dims.end());
  const size_t n = size_t(space.getSimpleExtentNpoints());
  check_elements(n, 1100, 1 << 20, in.getId(), "dataset '" + in.getObjName() + "'");
  const H5T_class_t cls = in.getTypeClass();
  if (cls == H5T_STRING) {
    H5::StrType t = vlen_string_type();
    std::vector<char*> ptrs(n, nullptr);
    if (n) in.read(ptrs.data(), t);
    std::vector<std::string> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = ptrs[i] ? ptrs[i] : "";
    if (n) H5::DataSet::vlenReclaim(ptrs.data(), t, space);
    ds.data = std::move(v);
  } else if (cls == H5T_FLOAT) {
    if (in.getFloatType().getSize() == 4) {
      std::vector<float> v(n);
      if (n) in.read(v.data(), H5::PredType::NATIVE_FLOAT);
      ds.data = std::move(v);
    } else {
      std::vector<double> v(n);
      if (n) in.read(v.data(), H5::PredType::NATIVE_DOUBLE);
      ds.data = std::move(v);
    }
  } else if (cls == H5T_INTEGER) {
    if (in.getIntType().getSize() == 1) {
      std::vector<int8_t> v(n);
      if (n) in.read(v.data(), H5::PredType::NATIVE_INT8);
      ds.data = std::move(v);
    } else {
      std::vector<int64_t> v(n);
      if (n) in.read(v.data(), H5::PredType::NATIVE_INT64);
      ds.data = std::move(v);
    }
  } else {
    fail("dataset '", in.getObjName(), "' has an unsupported type");
  }
  ds.attrs = read_attrs(in);
  return ds;
}

bool group_complete(const H5::Group& g) {
  if (!g.attrExists("complete")) return false;
  const AttrValue v = read_attr(g.openAttribute("complete"));
  const auto* i = std::get_if<int64_t>(&v);
  return i && *i == 1;
}

}  // namespace

size_t Dataset::size() const {
  return std::visit([](const auto& v) { return v.size(); }, data);
}

std::vector<uint64_t> Dataset::dims() const {
  if (shape.empty()) return {uint64_t(size())};
  return shape;
}

bool is_timing_attr(const std::string& name) {
  static const char* kTiming[] = {"start_time", "end_time", "host", "prefill_s", "decode_s",
                                  "tokens_per_s", "prefill_tokens_per_s", "decode_tokens_per_s",
                                  "wall_s", "git_commit", "kvlab_version", "finished_at", "sample_s"};
  for (const char* t : kTiming)
    if (name == t) return true;
  return false;
}

ResultsFile ResultsFile::create(const fs::path& path, const AttrMap& root_attrs) {
  if (path.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) fail(path.string(), ": cannot create its directory: ", ec.message());
  }
  replace_file(path, "creating the results file", /*create=*/true, [&](H5::H5File& f) {
    for (const auto& [k, v] : root_attrs) write_attr(f, k, v);
    write_attr(f, "schema_version", int64_t(kResultsSchemaVersion));
    f.createGroup("runs");
  });
  return ResultsFile(path);
}

namespace {

// libhdf5 1.10 trusts the object sizes inside a global heap collection (where variable-length
// strings live): a corrupt size makes H5HG_read copy past the collection (found by
// fuzz_results: a 262,144-byte object in a 4,096-byte collection). Before HDF5 reads the file,
// every collection ("GCOL", version 1, its size, then objects {u16 index, u16 refcount, u32
// reserved, length size, data padded to 8}; index 0 is the free space ending it) is checked to
// hold its objects. Collections are found by their signature, each skipped as a whole once
// checked (so string data inside one is never taken for a header).
void check_global_heaps(const fs::path& path) {
  const MappedFile map = MappedFile::open(path);
  const auto* d = reinterpret_cast<const unsigned char*>(map.data());
  const size_t n = map.size();
  // Size of lengths from a version 0/1 (byte 14) or 2/3 (byte 10) superblock at offset 0.
  if (n < 16 || std::memcmp(d, "\x89HDF\r\n\x1a\n", 8) != 0) return;
  const size_t len_size = d[8] <= 1 ? d[14] : d[10];
  if (len_size != 2 && len_size != 4 && len_size != 8) return;  // HDF5 itself refuses these
  auto read_len = [&](size_t at) {
    uint64_t v = 0;
    for (size_t k = 0; k < len_size; ++k) v |= uint64_t(d[at + k]) << (8 * k);
    return v;
  };
  const size_t header = 8 + len_size;  // signature, version, 3 reserved, collection size
  for (size_t at = 0; at + header <= n;) {
    const void* hit = memmem(d + at, n - at, "GCOL", 4);
    if (!hit) break;
    const size_t start = size_t(static_cast<const unsigned char*>(hit) - d);
    if (start + header > n || d[start + 4] != 1 || d[start + 5] || d[start + 6] || d[start + 7]) {
      at = start + 4;
      continue;
    }
    const uint64_t size = read_len(start + 8);
    if (size < header || size > n - start) {
      at = start + 4;  // not a collection this file could hold: HDF5 refuses it on its own
      continue;
    }
    const size_t end = start + size;
    for (size_t p = start + header; p + 8 + len_size <= end;) {
      const unsigned index = d[p] | unsigned(d[p + 1]) << 8;
      if (index == 0) break;  // free space: the rest of the collection
      const uint64_t bytes = read_len(p + 8);
      const uint64_t padded = bytes > end ? bytes : (bytes + 7) / 8 * 8;
      if (padded > end - (p + 8 + len_size))
        fail(path.string(), ": corrupt HDF5 global heap at byte ", start, ": object ", index, " of ", bytes,
             " bytes does not fit its ", size, "-byte collection");
      p += 8 + len_size + padded;
    }
    at = end;
  }
}

}  // namespace

ResultsFile ResultsFile::open(const fs::path& path) {
  if (!fs::exists(path)) fail(path.string(), ": results file not found");
  return guarded(path, "opening the results file", [&] {
    if (!H5::H5File::isHdf5(path.string())) fail(path.string(), ": not an HDF5 file");
    check_global_heaps(path);
    H5::H5File f;
    try {
      f = open_file(path, H5F_ACC_RDONLY);
    } catch (const H5::Exception& e) {
      const std::string sys = hdf5_system_errors();
      fail(path.string(), ": cannot open it as an HDF5 file (", sys.empty() ? "truncated or damaged?" : sys, "): ",
           e.getDetailMsg());
    }
    if (!f.attrExists("schema_version") || !f.nameExists("runs"))
      fail(path.string(), ": not a kvlab results file (no schema_version attribute or /runs group)");
    const AttrValue v = read_attr(f.openAttribute("schema_version"));
    const auto* version = std::get_if<int64_t>(&v);
    if (!version || *version > kResultsSchemaVersion)
      fail(path.string(), ": results schema version ", version ? *version : -1,
           " is newer than this kvlab understands (", kResultsSchemaVersion, ")");
    return ResultsFile(path);
  });
}

AttrMap ResultsFile::root_attrs() const {
  return guarded(path_, "reading root attributes", [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    return read_attrs(f);
  });
}

void ResultsFile::set_root_attr(const std::string& name, const AttrValue& value) {
  replace_file(path_, "writing root attribute " + name, false, [&](H5::H5File& f) { write_attr(f, name, value); });
}

void ResultsFile::ensure_run(const std::string& run, const AttrMap& attrs) {
  // The run's attributes are (re)written every time: a resumed experiment records its current
  // settings (effective parameters) on an existing run group too.
  replace_file(path_, "creating run group " + run, false, [&](H5::H5File& f) {
    H5::Group runs = f.openGroup("runs");
    H5::Group g = ensure_group(runs, run);
    for (const auto& [k, v] : attrs) write_attr(g, k, v);
    ensure_group(g, "cells");
  });
}

std::vector<std::string> ResultsFile::runs() const {
  return guarded(path_, "listing runs", [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    return child_names(f.openGroup("runs"));
  });
}

AttrMap ResultsFile::run_attrs(const std::string& run) const {
  return guarded(path_, "reading run " + run, [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    return read_attrs(f.openGroup("runs/" + run));
  });
}

std::vector<std::string> ResultsFile::complete_cells(const std::string& run) const {
  return guarded(path_, "listing cells of run " + run, [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    std::vector<std::string> out;
    const std::string cells_path = "runs/" + run + "/cells";
    if (!f.nameExists("runs/" + run) || !f.nameExists(cells_path)) return out;
    H5::Group cells = f.openGroup(cells_path);
    for (const auto& name : child_names(cells))
      if (group_complete(cells.openGroup(name))) out.push_back(name);
    return out;
  });
}

bool ResultsFile::cell_complete(const std::string& run, const std::string& cell) const {
  return guarded(path_, "reading cell " + run + "/" + cell, [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    const std::string p = "runs/" + run + "/cells/" + cell;
    return f.nameExists("runs/" + run) && f.nameExists("runs/" + run + "/cells") &&
           f.nameExists(p) && group_complete(f.openGroup(p));
  });
}

int ResultsFile::delete_incomplete_cells() {
  // Files written by this build never hold an incomplete cell (every change replaces the file
  // whole); older builds' files may. Look first, so a clean file is not rewritten.
  const bool any = guarded(path_, "looking for interrupted cells", [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    H5::Group runs = f.openGroup("runs");
    for (const auto& run : child_names(runs)) {
      H5::Group r = runs.openGroup(run);
      if (!r.nameExists("cells")) continue;
      H5::Group cells = r.openGroup("cells");
      for (const auto& name : child_names(cells))
        if (!group_complete(cells.openGroup(name))) return true;
    }
    return false;
  });
  if (!any) return 0;
  return replace_file(path_, "deleting interrupted cells", false, [&](H5::H5File& f) {
    H5::Group runs = f.openGroup("runs");
    int deleted = 0;
    for (const auto& run : child_names(runs)) {
      H5::Group r = runs.openGroup(run);
      if (!r.nameExists("cells")) continue;
      H5::Group cells = r.openGroup("cells");
      for (const auto& name : child_names(cells))
        if (!group_complete(cells.openGroup(name))) {
          cells.unlink(name);
          ++deleted;
        }
    }
    return deleted;
  });
}

void ResultsFile::write_cell(const std::string& run, const std::string& cell, const CellRecord& record) {
  replace_file(path_, "writing cell " + run + "/" + cell, false, [&](H5::H5File& f) {
    H5::Group runs = f.openGroup("runs");
    H5::Group r = ensure_group(runs, run);
    H5::Group cells = ensure_group(r, "cells");
    if (cells.nameExists(cell)) {
      if (group_complete(cells.openGroup(cell)))
        fail(path_.string(), ": cell ", run, "/", cell, " is already complete");
      cells.unlink(cell);
    }
    H5::Group g = cells.createGroup(cell);
    for (const auto& [name, ds] : record.datasets) write_dataset(g, name, ds);
    for (const auto& [k, v] : record.attrs)
      if (k != "complete") write_attr(g, k, v);
    // The file is replaced whole (replace_file), so a cell is never seen half written; the
    // mark stays for readers of files from older builds, which wrote in place.
    write_attr(g, "complete", int64_t(1));
  });
}

CellRecord ResultsFile::read_cell(const std::string& run, const std::string& cell) const {
  return guarded(path_, "reading cell " + run + "/" + cell, [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    const std::string p = "runs/" + run + "/cells/" + cell;
    if (!f.nameExists("runs/" + run) || !f.nameExists("runs/" + run + "/cells") || !f.nameExists(p))
      fail(path_.string(), ": no cell ", run, "/", cell);
    H5::Group g = f.openGroup(p);
    CellRecord rec;
    rec.attrs = read_attrs(g);
    for (const auto& name : child_names(g)) rec.datasets[name] = read_dataset(g.openDataSet(name));
    return rec;
  });
}

AttrMap ResultsFile::cell_attrs(const std::string& run, const std::string& cell) const {
  return guarded(path_, "reading cell " + run + "/" + cell, [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    const std::string p = "runs/" + run + "/cells/" + cell;
    if (!f.nameExists("runs/" + run) || !f.nameExists("runs/" + run + "/cells") || !f.nameExists(p))
      fail(path_.string(), ": no cell ", run, "/", cell);
    return read_attrs(f.openGroup(p));
  });
}

std::map<std::string, std::map<std::string, AttrMap>> ResultsFile::all_cell_attrs() const {
  return guarded(path_, "reading the cells", [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    std::map<std::string, std::map<std::string, AttrMap>> out;
    H5::Group runs = f.openGroup("runs");
    for (const auto& run : child_names(runs)) {
      H5::Group r = runs.openGroup(run);
      out[run];
      if (!r.nameExists("cells")) continue;
      H5::Group cells = r.openGroup("cells");
      for (const auto& name : child_names(cells)) {
        H5::Group g = cells.openGroup(name);
        if (group_complete(g)) out[run][name] = read_attrs(g);
      }
    }
    return out;
  });
}

std::map<std::string, std::map<std::string, CellRecord>> ResultsFile::peer_cells() const {
  return guarded(path_, "reading /peer", [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    std::map<std::string, std::map<std::string, CellRecord>> out;
    if (!f.nameExists("peer")) return out;
    H5::Group peer = f.openGroup("peer");
    for (const auto& run : child_names(peer)) {
      H5::Group r = peer.openGroup(run);
      for (const auto& name : child_names(r)) {
        H5::Group g = r.openGroup(name);
        if (!group_complete(g)) continue;
        CellRecord& rec = out[run][name];
        rec.attrs = read_attrs(g);
        for (const auto& d : child_names(g)) rec.datasets[d] = read_dataset(g.openDataSet(d));
      }
    }
    return out;
  });
}

void ResultsFile::write_summary(const std::string& run, const std::string& group,
                                const std::map<std::string, Dataset>& datasets, const AttrMap& attrs) {
  replace_file(path_, "writing summary " + run + "/" + group, false, [&](H5::H5File& f) {
    H5::Group runs = f.openGroup("runs");
    H5::Group r = ensure_group(runs, run);
    if (r.nameExists(group)) r.unlink(group);
    H5::Group g = r.createGroup(group);
    for (const auto& [name, ds] : datasets) write_dataset(g, name, ds);
    for (const auto& [k, v] : attrs) write_attr(g, k, v);
  });
}

std::map<std::string, Dataset> ResultsFile::read_summary(const std::string& run, const std::string& group,
                                                         AttrMap* attrs) const {
  return guarded(path_, "reading summary " + run + "/" + group, [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    const std::string p = "runs/" + run + "/" + group;
    std::map<std::string, Dataset> out;
    if (!f.nameExists("runs/" + run) || !f.nameExists(p)) return out;
    H5::Group g = f.openGroup(p);
    if (attrs) *attrs = read_attrs(g);
    for (const auto& name : child_names(g)) out[name] = read_dataset(g.openDataSet(name));
    return out;
  });
}

std::string utc_now_iso8601() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace kvlab
