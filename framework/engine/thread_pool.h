// The engine's fork-join parallelism, on OpenMP.
//
// Contract: `ThreadPool pool(n)` runs jobs on n threads; the calling thread is thread 0 and
// takes part, so a pool of 1 runs everything inline. `run(fn)` calls fn(thread) once on each of
// the n threads and returns when all have finished. `parallel_for` splits [0, n_tasks) into n
// contiguous, near-equal ranges (thread t gets [t*n_tasks/n, (t+1)*n_tasks/n)): static, so which
// thread computes which rows never changes between calls (reproducible results, and each thread
// streams its own contiguous part of a weight matrix).
//
// Why OpenMP and not our own threads: the attention kernels (kernels/cpu) parallelise with
// OpenMP, and decode alternates dense layers and attention every few microseconds. One team of
// threads for both keeps them from fighting over the cores (two spinning runtimes on 2 cores
// halve the speed); OpenMP's hot team spins briefly between regions, which decode needs.
// BLAS calls are made from inside these regions single-threaded (linear.cpp), for the same reason.
// Jobs must not throw; a pool runs one job at a time and is not re-entrant.
#pragma once

#include <cstdint>
#include <functional>

namespace kvlab {

class ThreadPool {
 public:
  // n_threads <= 0: every core (omp_get_num_procs()).
  explicit ThreadPool(int n_threads);

  int size() const { return n_threads_; }

  // fn(thread) for each thread index 0..size()-1 (in parallel when OpenMP gives the threads);
  // returns when all are done.
  void run(const std::function<void(int thread)>& fn);

  // fn(begin, end, thread) on each thread's static range of [0, n_tasks) (empty ranges skipped).
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t begin, int64_t end, int thread)>& fn);

  // The static range of thread t out of n for n_tasks tasks.
  static void split(int64_t n_tasks, int n, int t, int64_t* begin, int64_t* end) {
    *begin = n_tasks * t / n;
    *end = n_tasks * (t + 1) / n;
  }

 private:
  int n_threads_ = 1;
};

}  // namespace kvlab
