// The GoogleTest fixture of the CUDA kernel tests: each test is skipped, naming the reason, when
// no CUDA GPU can be used (no device, no driver), so the suite passes on a machine without one.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/cuda_check.h"

namespace kvlab::cuda::testing {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = no_device_reason();
    if (!why.empty()) GTEST_SKIP() << "needs a CUDA GPU: " << why;
  }
};

}  // namespace kvlab::cuda::testing
