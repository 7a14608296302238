// One HDF5 file, safely (hdf5_file.h): opening while another process holds it, HDF5 errors
// as kvlab errors, every change as an atomic replacement of the whole file, and the check of
// global heap collections before libhdf5 trusts them.
#include "framework/experiment/hdf5_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "framework/core/error.h"
#include "framework/model/mapped_file.h"

namespace kvlab::hdf5 {

namespace fs = std::filesystem;

namespace {

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
}  // namespace

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


namespace {

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

}  // namespace

// Writes a new version of `path` through PATH.partial (above). HDF5 works on an in-memory image
// of the file (the core driver without backing store), so it never touches the disk: all I/O
// is ours, and a full disk is a clean error from write(2) -- HDF5 1.10 crashes when a file whose
// close failed for want of space is closed again. `body(H5::H5File&)` changes the image (for
// `create`, an empty file); the image is written to PATH.partial, fsynced and renamed over
// `path`. On any error the partial copy is removed and `path` is as before; the error names
// `path`, `what` and the system error.
constexpr size_t kImageIncrementBytes = size_t{1} << 20;
void replace_file(const fs::path& path, const std::string& what, bool create,
                  const std::function<void(H5::H5File&)>& body) {
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
    body(f);
    finish();
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

}  // namespace kvlab::hdf5

namespace kvlab::hdf5 {
namespace {

uint64_t read_le(const unsigned char* p, size_t bytes) {
  uint64_t v = 0;
  for (size_t k = 0; k < bytes; ++k) v |= uint64_t(p[k]) << (8 * k);
  return v;
}

uint64_t align8(uint64_t v) { return (v + 7) / 8 * 8; }

// The object `index` of the global heap collection at byte `addr`, walked as libhdf5 1.10.8
// deserialises it (H5HG__cache_heap_deserialize): objects {u16 index, u16 refcount, u32
// reserved, length, data padded to 8}; index 0 is free space, `length` bytes including its
// header; a tail shorter than an object header is free space too; a later object with the same
// index replaces an earlier one. Returns its length, or nothing when the collection has none.
std::optional<uint64_t> heap_object_size(const unsigned char* d, size_t n, uint64_t addr, size_t len_size,
                                         uint64_t index, const std::string& what) {
  const size_t header = 8 + len_size, object_header = 8 + len_size;
  if (addr > n || n - addr < header || std::memcmp(d + addr, "GCOL", 4) != 0 || d[addr + 4] != 1)
    fail(what, " points at a global heap collection at byte ", addr, " that the file does not hold (corrupt file?)");
  const uint64_t size = read_le(d + addr + 8, len_size);
  if (size < header || size > n - addr)
    fail(what, " points at a global heap collection at byte ", addr, " of ", size,
         " bytes, which the file does not hold (corrupt file?)");
  const uint64_t end = addr + size;
  std::optional<uint64_t> found;
  for (uint64_t p = addr + header; p < end;) {
    if (end - p < object_header) break;  // free space
    const uint64_t i = read_le(d + p, 2);
    const uint64_t bytes = read_le(d + p + 8, len_size);
    // libhdf5 steps by `bytes` over free space (a 0 would make it loop forever) and by the
    // padded data over an object; either must stay inside the collection.
    const uint64_t step = i == 0 ? bytes : (bytes > end ? end : object_header + align8(bytes));
    if (step == 0 || step > end - p)
      fail(what, " points into the global heap collection at byte ", addr, ", whose object ", i, " of ", bytes,
           " bytes does not fit it (corrupt file?)");
    if (i == index) found = bytes;
    p += step;
  }
  return found;
}

}  // namespace

// See hdf5_file.h. The object header is read from the file's bytes: a version-1 object header
// (prefix: version 1, reserved, u16 message count, u32 reference count, u32 header size, padded
// to 16 bytes; messages {u16 type, u16 size, u8 flags, 3 reserved, body}; type 0x10 continues
// the header elsewhere {offset, length}); attribute messages (type 0x0C) of versions 1-3 (name,
// datatype and dataspace sizes, padded to 8 in version 1); a variable-length string datatype
// (class 9, type 1) whose values are {u32 length, heap collection offset, u32 object index}.
// (HDF5 file format specification 3.0, sections III.C, IV.A.1, IV.A.2.b/c/d/m.)
void check_string_attributes(hid_t attr, const std::string& what) {
  std::string path;
  if (const ssize_t len = H5Fget_name(attr, nullptr, 0); len > 0) {
    path.resize(size_t(len) + 1);
    if (H5Fget_name(attr, path.data(), path.size()) < 0) path.clear();
    path.resize(std::min(path.size(), size_t(len)));
  }
  const std::string in = path + ": " + what;
  H5O_info_t info;
  if (H5Oget_info2(attr, &info, H5O_INFO_BASIC) < 0) fail(in, ": cannot locate its object header (corrupt file?)");
  // The file's bytes: mapped when HDF5 reads it from disk, else (an in-memory image) copied.
  std::optional<MappedFile> map;
  std::vector<unsigned char> image;
  {
    const hid_t file = H5Iget_file_id(attr);
    const hid_t fapl = file < 0 ? -1 : H5Fget_access_plist(file);
    const bool on_disk = fapl >= 0 && H5Pget_driver(fapl) == H5FD_SEC2;
    if (!on_disk && file >= 0) {
      const ssize_t size = H5Fget_file_image(file, nullptr, 0);
      if (size > 0) {
        image.resize(size_t(size));
        if (H5Fget_file_image(file, image.data(), image.size()) != size) image.clear();
      }
    }
    if (fapl >= 0) H5Pclose(fapl);
    if (file >= 0) H5Fclose(file);
    if (on_disk) {
      map = MappedFile::open(path);
    } else if (image.empty()) {
      fail(in, ": cannot read the file's bytes to check it");
    }
  }
  const auto* d = map ? reinterpret_cast<const unsigned char*>(map->data()) : image.data();
  const size_t n = map ? map->size() : image.size();
  // Superblock at byte 0 (kvlab writes no user block), base address 0; sizes of offsets/lengths.
  if (n < 40 || std::memcmp(d, "\x89HDF\r\n\x1a\n", 8) != 0)
    fail(in, ": the file does not start with an HDF5 superblock, which kvlab writes at byte 0");
  const unsigned sb = d[8];
  const size_t off_size = sb <= 1 ? d[13] : d[9];
  const size_t len_size = sb <= 1 ? d[14] : d[10];
  const size_t base_at = sb == 0 ? 24 : sb == 1 ? 28 : 12;
  if ((off_size != 2 && off_size != 4 && off_size != 8) || (len_size != 2 && len_size != 4 && len_size != 8) ||
      base_at + off_size > n || read_le(d + base_at, off_size) != 0)
    fail(in, ": superblock sizes or base address kvlab does not write (corrupt file?)");
  const uint64_t addr = info.addr;
  if (addr > n || n - addr < 16) fail(in, ": its object header at byte ", addr, " is past the end of the file");
  if (std::memcmp(d + addr, "OHDR", 4) == 0)
    fail(in, ": its object header is version 2, which kvlab does not write (a file kvlab did not write?)");
  if (d[addr] != 1) fail(in, ": its object header at byte ", addr, " has version ", unsigned(d[addr]), " (corrupt file?)");
  std::vector<std::pair<uint64_t, uint64_t>> chunks{{addr + 16, read_le(d + addr + 8, 4)}};
  for (size_t c = 0; c < chunks.size(); ++c) {
    const auto [start, length] = chunks[c];
    if (start > n || length > n - start) fail(in, ": its object header runs past the end of the file (corrupt file?)");
    for (uint64_t p = start; length - (p - start) >= 8;) {
      const uint64_t type = read_le(d + p, 2), size = read_le(d + p + 2, 2);
      const unsigned flags = d[p + 4];
      const uint64_t body = p + 8;
      if (size > start + length - body) break;  // libhdf5 refuses the header itself
      const unsigned char* b = d + body;
      if (type == 0x10 && size >= off_size + len_size) {
        if (chunks.size() == 4096) fail(in, ": its object header continues more than 4096 times (corrupt file?)");
        chunks.emplace_back(read_le(b, off_size), read_le(b + off_size, len_size));
      } else if (type == 0x0C && size >= 8 && b[0] >= 1 && b[0] <= 3) {
        // Attribute message. Shared datatypes or messages live elsewhere: kvlab writes neither.
        const unsigned version = b[0];
        const unsigned attr_flags = version == 1 ? 0 : b[1];
        if ((flags & 0x02) || (attr_flags & 0x03))
          fail(in, ": the object has a shared attribute or datatype, which kvlab does not write (corrupt file?)");
        const uint64_t name_size = read_le(b + 2, 2), dt_size = read_le(b + 4, 2), ds_size = read_le(b + 6, 2);
        auto pad = [&](uint64_t v) { return version == 1 ? align8(v) : v; };
        const uint64_t dt = (version == 3 ? 9 : 8) + pad(name_size), ds = dt + pad(dt_size), data = ds + pad(ds_size);
        if (data > size || dt_size < 8) {
          p = body + size;
          continue;  // libhdf5 refuses this message when it decodes it
        }
        const unsigned char* t = b + dt;
        const bool vlen_string = (t[0] & 0x0f) == 9 && (t[1] & 0x0f) == 1;
        if (vlen_string) {
          const uint64_t element = read_le(t + 4, 4);
          if (element != 4 + off_size + 4)
            fail(in, ": a variable-length string attribute of the object stores ", element, "-byte values, not ",
                 4 + off_size + 4, " (corrupt file?)");
          // Dataspace: version 1 {version, rank, flags, reserved 5, dims} or 2 {version, rank,
          // flags, type (0 scalar, 1 simple, 2 null), dims}; lengths of len_size bytes.
          const unsigned char* s = b + ds;
          if (ds_size < 8) fail(in, ": an attribute's dataspace is truncated (corrupt file?)");
          const unsigned rank = s[1];
          const uint64_t dims_at = s[0] == 1 ? 8 : 4;
          uint64_t count = s[0] == 2 && s[3] == 2 ? 0 : 1;
          if (dims_at + uint64_t(rank) * len_size > ds_size) fail(in, ": an attribute's dataspace is truncated (corrupt file?)");
          for (unsigned r = 0; r < rank; ++r) {
            const uint64_t dim = read_le(s + dims_at + r * len_size, len_size);
            if (dim != 0 && count > (size - data) / dim) {
              count = UINT64_MAX;
              break;
            }
            count *= dim;
          }
          if (count > (size - data) / element)
            fail(in, ": an attribute's values overrun its message (corrupt file?)");
          for (uint64_t e = 0; e < count; ++e) {
            const unsigned char* v = b + data + e * element;
            const uint64_t chars = read_le(v, 4), heap = read_le(v + 4, off_size), index = read_le(v + 4 + off_size, 4);
            if (heap == 0) continue;  // a null string: libhdf5 reads nothing
            const std::string value = in + ": a string value of the object";
            const std::optional<uint64_t> bytes = heap_object_size(d, n, heap, len_size, index, value);
            if (!bytes)
              fail(value, " names object ", index, " of the global heap collection at byte ", heap,
                   ", which it does not hold (corrupt file?)");
            if (*bytes != chars)
              fail(value, " claims ", chars, " bytes; its global heap object holds ", *bytes, " (corrupt file?)");
          }
        }
      }
      p = body + size;
    }
  }
}

}  // namespace kvlab::hdf5
