#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

namespace kvlab {

namespace {
// Spin iterations (with pause) before a waiting worker sleeps, and before the caller starts
// yielding while it waits for workers still inside a job.
constexpr int kSpinIterations = 1 << 12;
constexpr int kChunksPerThread = 4;
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  n_threads_ = n_threads < 1 ? 1 : n_threads;
  workers_.reserve(n_threads_ - 1);
  for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  wake_workers();
  for (auto& w : workers_) w.join();
}

// After a generation bump. A worker counts itself in sleepers_ (under the mutex) before its last
// check of generation_, so either it sees the bump or we see it and notify under the mutex.
void ThreadPool::wake_workers() {
  if (sleepers_.load() == 0) return;
  { std::lock_guard<std::mutex> lock(mutex_); }
  wake_.notify_all();
}

void ThreadPool::work(int thread) {
  for (;;) {
    const int64_t begin = next_.fetch_add(chunk_);
    if (begin >= n_tasks_) return;
    const int64_t end = begin + chunk_ < n_tasks_ ? begin + chunk_ : n_tasks_;
    (*fn_)(begin, end, thread);
  }
}

void ThreadPool::worker_loop(int thread) {
  uint32_t seen = 0;  // the generation at construction: a worker that starts late still sees every bump
  for (;;) {
    uint32_t gen = generation_.load();
    for (int i = 0; gen == seen && i < kSpinIterations; ++i) {
      _mm_pause();
      gen = generation_.load();
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1);
      while ((gen = generation_.load()) == seen) wake_.wait(lock);
      sleepers_.fetch_sub(1);
    }
    seen = gen;
    if (stop_.load()) return;
    // Dekker-style handshake with the caller (all seq_cst): enter, then check the job is still
    // open; the caller closes, then waits for active_ == 0 before touching the job again.
    active_.fetch_add(1);
    if (open_.load()) work(thread);
    active_.fetch_sub(1);
  }
}

void ThreadPool::parallel_for(int64_t n_tasks,
                              const std::function<void(int64_t begin, int64_t end, int thread)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    fn(0, n_tasks, 0);
    return;
  }
  const int64_t n_chunks = std::min<int64_t>(n_tasks, int64_t{kChunksPerThread} * n_threads_);
  fn_ = &fn;
  n_tasks_ = n_tasks;
  chunk_ = (n_tasks + n_chunks - 1) / n_chunks;
  next_.store(0);
  open_.store(true);
  generation_.fetch_add(1);
  wake_workers();
  work(0);
  open_.store(false);
  for (int i = 0; active_.load() != 0; ++i) {
    if (i < kSpinIterations) _mm_pause();
    else std::this_thread::yield();
  }
  fn_ = nullptr;
}

void ThreadPool::run(const std::function<void(int thread)>& fn) {
  // one task per thread index; any thread may run any index
  parallel_for(n_threads_, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) fn(static_cast<int>(t));
  });
}

}  // namespace kvlab
