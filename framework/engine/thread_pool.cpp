#include "framework/engine/thread_pool.h"

#include <omp.h>


namespace kvlab {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = omp_get_num_procs();
  n_threads_ = n_threads < 1 ? 1 : n_threads;
}

void ThreadPool::run(const std::function<void(int thread)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  int team = n_threads_;
#pragma omp parallel num_threads(n_threads_)
  {
    const int t = omp_get_thread_num();
    if (t == 0) team = omp_get_num_threads();
    fn(t);
  }
  // OpenMP may give fewer threads (nested inside another parallel region, OMP_THREAD_LIMIT):
  // the missing thread indices then run here, one after another.
  for (int t = team; t < n_threads_; ++t) fn(t);
}

void ThreadPool::parallel_for(int64_t n_tasks,
                              const std::function<void(int64_t begin, int64_t end, int thread)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    fn(0, n_tasks, 0);
    return;
  }
#pragma omp parallel num_threads(n_threads_)
  {
    // split by the team OpenMP really gave, so no task is ever skipped
    int64_t begin, end;
    split(n_tasks, omp_get_num_threads(), omp_get_thread_num(), &begin, &end);
    if (begin < end) fn(begin, end, omp_get_thread_num());
  }
}

}  // namespace kvlab
