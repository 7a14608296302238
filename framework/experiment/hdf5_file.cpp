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

namespace {

// How a new version of a file starts (new_version below).
enum class Start {
  empty,         // an empty file (create)
  copy,          // a read-write copy of the file's bytes (replace_file)
  empty_beside,  // an empty file, beside a read-only copy of the file (rebuild_file)
};

constexpr size_t kImageIncrementBytes = size_t{1} << 20;

// A file held in memory by HDF5's core driver without backing store: nothing is written under
// `name` (but the driver refuses a name that exists on disk, such as a stale PATH.partial).
// `image` (if not empty) is its initial content.
H5::H5File in_memory_file(const std::string& name, unsigned flags, const std::vector<char>& image) {
  H5::FileAccPropList fapl;
  fapl.setCore(kImageIncrementBytes, /*backing_store=*/false);
  if (!image.empty() && H5Pset_file_image(fapl.getId(), const_cast<char*>(image.data()), image.size()) < 0)
    fail("HDF5 cannot take the file's image (", image.size(), " bytes)");
  return H5::H5File(name, flags, H5::FileCreatPropList::DEFAULT, fapl);
}

// Writes a new version of `path` through PATH.partial (above). HDF5 works on an in-memory image
// of the file (the core driver without backing store), so it never touches the disk: all I/O
// is ours, and a full disk is a clean error from write(2) -- HDF5 1.10 crashes when a file whose
// close failed for want of space is closed again. `body(source, f)` makes the new version in
// `f`; `source` is the file as it was, read-only (Start::empty_beside), or null. The image is
// written to PATH.partial, fsynced and renamed over `path`. On any error the partial copy is
// removed and `path` is as before; the error names `path`, `what` and the system error.
void new_version(const fs::path& path, const std::string& what, Start start,
                 const std::function<void(const H5::H5File* source, H5::H5File& f)>& body) {
  H5::Exception::dontPrint();
  const bool create = start == Start::empty;
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
    std::optional<H5::H5File> source;
    if (start == Start::empty_beside)
      source.emplace(in_memory_file(path.string() + ".kvlab-in-memory-source", H5F_ACC_RDONLY, image));
    H5::H5File f = in_memory_file(path.string() + ".kvlab-in-memory-image",
                                  start == Start::copy ? H5F_ACC_RDWR : H5F_ACC_TRUNC,
                                  start == Start::copy ? image : std::vector<char>{});
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
    body(source ? &*source : nullptr, f);
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

}  // namespace

void replace_file(const fs::path& path, const std::string& what, bool create,
                  const std::function<void(H5::H5File&)>& body) {
  new_version(path, what, create ? Start::empty : Start::copy,
              [&](const H5::H5File*, H5::H5File& f) { body(f); });
}

void rebuild_file(const fs::path& path, const std::string& what,
                  const std::function<void(const H5::H5File& source, H5::H5File& f)>& body) {
  new_version(path, what, Start::empty_beside, [&](const H5::H5File* source, H5::H5File& f) { body(*source, f); });
}

}  // namespace kvlab::hdf5
