// The one CUDA macro: check a runtime (or cuBLAS) call and throw kvlab::Error
// (kernels/common/error.h) naming the call, the file and line, and the error string. Never
// aborts (STYLE.md: library code throws).
//
// Also: device discovery for tests and benchmarks (no device -> tests skip with a message).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/common/error.h"

#define KVLAB_CUDA_CHECK(call)                                                               \
  do {                                                                                       \
    const cudaError_t kvlab_err_ = (call);                                                   \
    if (kvlab_err_ != cudaSuccess)                                                           \
      ::kvlab::fail("CUDA error at ", __FILE__, ":", __LINE__, ": ", #call, " -> ",         \
                    cudaGetErrorName(kvlab_err_), " (", cudaGetErrorString(kvlab_err_), ")"); \
  } while (0)

// Checks the last kernel launch (configuration errors surface here, faults at the next sync).
#define KVLAB_CUDA_CHECK_LAUNCH() KVLAB_CUDA_CHECK(cudaGetLastError())

namespace kvlab::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

// Why no device is usable, for skip messages ("" when one is).
inline std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(err);
  }
  return n == 0 ? "no CUDA device found" : "";
}

}  // namespace kvlab::cuda
