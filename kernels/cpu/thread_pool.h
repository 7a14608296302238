// The engine's fork-join thread pool.
//
// Contract: `ThreadPool pool(n)` owns n - 1 worker threads; the calling thread is thread 0 and
// takes part in every job, so a pool of 1 runs everything inline. `parallel_for(n_tasks, fn)`
// calls fn(begin, end, thread) on disjoint ranges covering [0, n_tasks) exactly once and returns
// when all are done; `thread` (< size()) identifies the executing thread for per-thread scratch.
// `run(fn)` calls fn(t) once for each t in [0, size()). Jobs must not throw; one job at a time.
//
// Work is claimed, not assigned: the range is cut into about 4 chunks per thread, and each
// thread (the caller included) takes the next chunk until none is left. The caller never waits
// for a worker that has not started: on a machine whose cores are shared with other processes
// a descheduled worker simply gets no work, where a static split (OpenMP's fork-join) would
// stall every call until the OS ran it again (measured: 2-thread decode 6x slower than 1 thread
// at load 12 on 2 cores). Which thread computes a range never changes the result.
//
// Waiting: workers spin briefly (decode issues a job every few tens of microseconds) and then
// sleep on a condition variable; BLAS and OpenMP work in between leaves them asleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvlab {

class ThreadPool {
 public:
  // n_threads <= 0: std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  void parallel_for(int64_t n_tasks, const std::function<void(int64_t begin, int64_t end, int thread)>& fn);
  void run(const std::function<void(int thread)>& fn);

 private:
  void worker_loop(int thread);
  void wake_workers();
  void work(int thread);  // claims and runs chunks of the open job until none is left

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  // The open job; written by the caller only while no worker is inside it (active_ == 0 after
  // the previous job was closed), published by open_ (seq_cst).
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_tasks_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};       // next unclaimed task
  std::atomic<bool> open_{false};      // workers may join the job
  std::atomic<int> active_{0};         // workers inside the job
  std::atomic<uint32_t> generation_{0};  // bumped per job: wakes workers
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};         // workers blocked (or about to block) on wake_
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace kvlab
