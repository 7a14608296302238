// Where the engine's dense layers and attention run (EngineOptions::device), parsed once from
// the command line or an experiment's options into an enum; everything downstream switches on
// the enum.
//   cpu       the reference: kernels/cpu over the host KV store (cpu_backend.cpp)
//   emulated  the device plans executed by CPU loops over device-shaped arrays (tests)
//   cuda      the GPU (device_backend.h); needs a kvlab built with CUDA and a GPU
#pragma once

#include <string>
#include <string_view>

namespace kvlab {

enum class Device { kCpu, kEmulated, kCuda };
// Weights, KV pages and GEMM inputs on the device: bf16 (fp32 accumulation: the fast path) or
// f32 (agrees with the CPU path to float tolerance).
enum class DeviceDtype { kBf16, kF32 };

// "cpu" | "emulated" | "cuda" and "bf16" | "f32"; anything else throws Error naming `what`
// (the option or key, e.g. "--device") and the accepted values.
Device parse_device(std::string_view text, std::string_view what = "device");
DeviceDtype parse_device_dtype(std::string_view text, std::string_view what = "device dtype");
const char* device_name(Device device);
const char* device_dtype_name(DeviceDtype dtype);

// "NVIDIA H200 (sm_90, 139.8 GiB)" for the first GPU, or why none can be used.
std::string cuda_device_summary();
// True when this build has CUDA and a GPU is visible.
bool cuda_device_available();

}  // namespace kvlab
