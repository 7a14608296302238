// A small fork-join thread pool for the forward pass.
//
// Contract: `ThreadPool pool(n)` owns n - 1 worker threads; the calling thread is thread 0 and
// takes part in every job, so a pool of 1 runs everything inline. `run(fn)` calls fn(thread)
// once on each of the n threads and returns when all have finished. `parallel_for` splits
// [0, n_tasks) into n contiguous, near-equal ranges (thread t gets [t*n_tasks/n,
// (t+1)*n_tasks/n)): static, so which thread computes which rows never changes between calls
// (reproducible results, and each thread streams its own contiguous part of a weight matrix).
//
// Decode issues a few jobs per layer, microseconds apart, so workers spin briefly (with pause)
// before sleeping on an atomic wait; during an OpenBLAS call they fall asleep and leave the
// cores to BLAS. Jobs must not throw (the kernels do not); a pool runs one job at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
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

  // fn(thread) on each thread 0..size()-1; returns when all are done.
  void run(const std::function<void(int thread)>& fn);

  // fn(begin, end, thread) on each thread's static range of [0, n_tasks) (empty ranges skipped).
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t begin, int64_t end, int thread)>& fn);

  // The static range of thread t out of n for n_tasks tasks.
  static void split(int64_t n_tasks, int n, int t, int64_t* begin, int64_t* end) {
    *begin = n_tasks * t / n;
    *end = n_tasks * (t + 1) / n;
  }

 private:
  void worker_loop(int thread);

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint32_t> generation_{0};  // bumped once per job; workers wait on it
  std::atomic<int> pending_{0};          // workers still running the current job
  std::atomic<bool> stop_{false};
};

}  // namespace kvlab
