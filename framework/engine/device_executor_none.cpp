// The CUDA executor in a kvlab built without CUDA: every request for the GPU is a clear error.
#include "framework/core/error.h"
#include "framework/engine/device_executor.h"

namespace kvlab {

std::string cuda_device_summary() { return "this kvlab was built without CUDA"; }

bool cuda_device_available() { return false; }

std::unique_ptr<DeviceExecutor> make_cuda_executor(const DeviceExecutorConfig&) {
  fail("device cuda: this kvlab was built without CUDA (reconfigure with -DKVLAB_CUDA=ON on a "
       "machine with the CUDA toolkit); use device cpu");
}

}  // namespace kvlab
