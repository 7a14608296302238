#include "framework/engine/device.h"

#include "framework/core/error.h"

namespace kvlab {

Device parse_device(std::string_view text, std::string_view what) {
  if (text == "cpu") return Device::kCpu;
  if (text == "emulated") return Device::kEmulated;
  if (text == "cuda") return Device::kCuda;
  fail(what, ": expected cpu, cuda or emulated, got '", text, "'");
}

DeviceDtype parse_device_dtype(std::string_view text, std::string_view what) {
  if (text == "bf16") return DeviceDtype::kBf16;
  if (text == "f32") return DeviceDtype::kF32;
  fail(what, ": expected bf16 or f32, got '", text, "'");
}

const char* device_name(Device device) {
  static constexpr const char* kNames[] = {"cpu", "emulated", "cuda"};  // Device order
  return kNames[static_cast<int>(device)];
}

const char* device_dtype_name(DeviceDtype dtype) { return dtype == DeviceDtype::kBf16 ? "bf16" : "f32"; }

}  // namespace kvlab
