#pragma once
// CUDAAccelerator — Lightning's "cuda" (alias "gpu"). Compiled when FULGUR_WITH_CUDA is on;
// without a GPU it reports itself unavailable, and a Trainer on it fails at construction with
// an error naming the accelerators that are available.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string_view>
#include <vector>

#include "fulgur/accelerators/device_parsing.hpp"

namespace fulgur {

class CUDAAccelerator {
 public:
  static constexpr std::string_view name = "cuda";
  static constexpr c10::DeviceType device_type = c10::kCUDA;

  static bool is_available();
  static int auto_device_count();
  static std::vector<int> parse_devices(int devices) { return detail::parse_cuda_devices(devices, auto_device_count()); }
  static std::vector<int> parse_devices(std::string_view devices) {
    return detail::parse_cuda_devices(devices, auto_device_count());
  }
  static std::vector<c10::Device> get_parallel_devices(const std::vector<int>& devices) {
    std::vector<c10::Device> out;
    out.reserve(devices.size());
    for (int i : devices) out.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
    return out;
  }

  /// Makes `device` the current CUDA device (and advises TF32 once on Ampere or newer).
  void setup_device(const c10::Device& device);
  /// Frees cached blocks and cuBLAS workspaces.
  void teardown();
  /// bf16 needs compute capability 8.0 (Ampere) or newer; fp16 and fp32/fp64 run everywhere.
  static bool supports_dtype(const c10::Device& device, c10::ScalarType dtype);
};

}  // namespace fulgur
