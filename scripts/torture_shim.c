// LD_PRELOAD crash injector for scripts/torture.py: kills the process (SIGKILL, no cleanup) just
// before its N-th file-changing system call on a path under a directory, so a torture run can
// stop kvlab at every write boundary of its results file -- not only where a timer happens to
// land (mostly inside compute).
//
//   KVLAB_TORTURE_DIR=DIR        only calls on files under DIR count (the results file, its
//                                .partial copy, the directory itself)
//   KVLAB_TORTURE_KILL_AT=N      N >= 1: SIGKILL before the N-th counted call; 0: count only
//   KVLAB_TORTURE_COUNT_FILE=F   on normal exit, the number of counted calls is written to F
//
// Counted calls: write, pwrite, pwrite64, writev, pwritev, ftruncate, fsync, fdatasync,
// sendfile, copy_file_range (on an fd whose file is under DIR), rename, renameat, renameat2,
// unlink (on a path under DIR). Build: cc -shared -fPIC -O2 -o torture_shim.so torture_shim.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static char g_dir[PATH_MAX];
static size_t g_dir_len;
static long g_kill_at = -1;  // -1: not initialised
static long g_count;

static void init(void) {
  if (g_kill_at >= 0) return;
  const char* d = getenv("KVLAB_TORTURE_DIR");
  const char* k = getenv("KVLAB_TORTURE_KILL_AT");
  g_kill_at = k ? atol(k) : 0;
  if (d && realpath(d, g_dir)) g_dir_len = strlen(g_dir);
}

static int under_dir(const char* path) {
  return g_dir_len && strncmp(path, g_dir, g_dir_len) == 0 &&
         (path[g_dir_len] == '/' || path[g_dir_len] == '\0');
}

static int fd_under_dir(int fd) {
  char link[64], target[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return 0;
  target[n] = '\0';
  return under_dir(target);
}

static int path_under_dir(int dirfd, const char* path) {
  char full[2 * PATH_MAX + 2];
  if (path[0] != '/') {
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
      if (!getcwd(base, sizeof base)) return 0;
    } else {
      char link[64];
      snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
      const ssize_t n = readlink(link, base, sizeof base - 1);
      if (n <= 0) return 0;
      base[n] = '\0';
    }
    snprintf(full, sizeof full, "%s/%s", base, path);
    path = full;
  }
  // The file may not exist yet: resolve its directory.
  char dir[2 * PATH_MAX + 2], resolved[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char* slash = strrchr(dir, '/');
  if (!slash) return 0;
  *slash = '\0';
  if (!realpath(dir[0] ? dir : "/", resolved)) return 0;
  return under_dir(resolved);
}

static void event(int counts) {
  init();
  if (!counts) return;
  ++g_count;
  if (g_kill_at > 0 && g_count >= g_kill_at) raise(SIGKILL);
}

__attribute__((destructor)) static void report(void) {
  const char* f = getenv("KVLAB_TORTURE_COUNT_FILE");
  if (!f) return;
  const int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  char buf[32];
  const int n = snprintf(buf, sizeof buf, "%ld\n", g_count);
  ssize_t (*real_write)(int, const void*, size_t) = dlsym(RTLD_NEXT, "write");
  if (real_write(fd, buf, (size_t)n) < 0) {
  }
  close(fd);
}

#define REAL(name) static __typeof__(name)* real = NULL; if (!real) real = (__typeof__(name)*)dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void* b, size_t n) { REAL(write); init(); if (g_dir_len) event(fd_under_dir(fd)); return real(fd, b, n); }
ssize_t pwrite(int fd, const void* b, size_t n, off_t o) { REAL(pwrite); init(); event(fd_under_dir(fd)); return real(fd, b, n, o); }
ssize_t pwrite64(int fd, const void* b, size_t n, off64_t o) { REAL(pwrite64); init(); event(fd_under_dir(fd)); return real(fd, b, n, o); }
ssize_t writev(int fd, const struct iovec* v, int c) { REAL(writev); init(); event(fd_under_dir(fd)); return real(fd, v, c); }
ssize_t pwritev(int fd, const struct iovec* v, int c, off_t o) { REAL(pwritev); init(); event(fd_under_dir(fd)); return real(fd, v, c, o); }
int ftruncate(int fd, off_t l) { REAL(ftruncate); init(); event(fd_under_dir(fd)); return real(fd, l); }
int ftruncate64(int fd, off64_t l) { REAL(ftruncate64); init(); event(fd_under_dir(fd)); return real(fd, l); }
int fsync(int fd) { REAL(fsync); init(); event(fd_under_dir(fd)); return real(fd); }
int fdatasync(int fd) { REAL(fdatasync); init(); event(fd_under_dir(fd)); return real(fd); }
ssize_t sendfile(int out, int in, off_t* o, size_t n) { REAL(sendfile); init(); event(fd_under_dir(out)); return real(out, in, o, n); }
ssize_t sendfile64(int out, int in, off64_t* o, size_t n) { REAL(sendfile64); init(); event(fd_under_dir(out)); return real(out, in, o, n); }
ssize_t copy_file_range(int in, off64_t* io, int out, off64_t* oo, size_t n, unsigned f) {
  REAL(copy_file_range); init(); event(fd_under_dir(out)); return real(in, io, out, oo, n, f);
}
int rename(const char* a, const char* b) { REAL(rename); init(); event(path_under_dir(AT_FDCWD, b)); return real(a, b); }
int renameat(int ad, const char* a, int bd, const char* b) { REAL(renameat); init(); event(path_under_dir(bd, b)); return real(ad, a, bd, b); }
int renameat2(int ad, const char* a, int bd, const char* b, unsigned f) {
  REAL(renameat2); init(); event(path_under_dir(bd, b)); return real(ad, a, bd, b, f);
}
int unlink(const char* p) { REAL(unlink); init(); event(path_under_dir(AT_FDCWD, p)); return real(p); }
