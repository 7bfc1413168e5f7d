#pragma once
// CPUAccelerator — Lightning's "cpu".
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <string_view>
#include <vector>

#include "fulgur/accelerators/device_parsing.hpp"
#include "fulgur/errors.hpp"

namespace fulgur {

class CPUAccelerator {
 public:
  static constexpr std::string_view name = "cpu";
  static constexpr c10::DeviceType device_type = c10::kCPU;

  static bool is_available() { return true; }
  static int auto_device_count() { return 1; }
  static std::vector<int> parse_devices(int devices) { return detail::parse_cpu_devices(devices); }
  static std::vector<int> parse_devices(std::string_view devices) { return detail::parse_cpu_devices(devices); }
  static std::vector<c10::Device> get_parallel_devices(const std::vector<int>& devices) {
    return std::vector<c10::Device>(devices.size(), c10::Device(c10::kCPU));
  }

  void setup_device(const c10::Device& device) {
    if (!device.is_cpu()) throw AcceleratorError("Device should be CPU, got " + device.str() + " instead.");
  }
  void teardown() {}
  /// Every floating dtype computes on CPU (bf16 and fp16 in software where the ISA lacks them).
  static bool supports_dtype(const c10::Device&, c10::ScalarType) { return true; }
  /// Whether this CPU has LibTorch's fast float16/bfloat16 kernels (oneDNN's; on x86 they need AVX-512
  /// or AMX). false on an AVX2-only x86 CPU, where a bfloat16 or float16 matrix product runs on
  /// LibTorch's reference loops, tens of times slower than in float32 (docs/precision.md): a
  /// "16-" or "bf16-" precision on such a CPU is said once by fit (stderr). true elsewhere.
  static bool has_fast_reduced_precision();
};

}  // namespace fulgur
