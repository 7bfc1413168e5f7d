#pragma once
// fulgur::accelerator_defaults<Derived>: the accelerator contract for any device type LibTorch
// was built with (CUDA, XPU, MPS, HIP, a PrivateUse1 backend...), from Derived's two constants:
//
//   struct XPUAccelerator : fulgur::accelerator_defaults<XPUAccelerator> {
//     static constexpr std::string_view name = "xpu";
//     static constexpr c10::DeviceType device_type = c10::kXPU;
//   };
//
// Availability and the device count come from LibTorch's accelerator hooks for that device type
// (false and 0 where the build lacks it); `devices` is parsed by Lightning's rule for indexed
// devices (n -> [0, n), -1 -> all, "1,3" -> [1, 3]); setup_device makes the device current.
// A member Derived declares hides the default. No virtual function anywhere.
#include <c10/core/Device.h>

#include <string>
#include <string_view>
#include <vector>

#include "fulgur/accelerators/device_parsing.hpp"
#include "fulgur/errors.hpp"

namespace fulgur {

namespace detail {
/// Whether LibTorch has a usable device of this type (its accelerator hooks; CPU: always).
bool device_type_available(c10::DeviceType type);
/// How many devices of this type LibTorch sees (CPU: 1; a type the build lacks: 0).
int device_type_count(c10::DeviceType type);
/// Makes `device` the current device of its type (no-op for CPU and for devices without an index).
void set_current_device(const c10::Device& device);
}  // namespace detail

template <class Derived>
struct accelerator_defaults {
  static bool is_available() { return detail::device_type_available(Derived::device_type); }
  static int auto_device_count() { return detail::device_type_count(Derived::device_type); }
  static std::vector<int> parse_devices(int devices) {
    return detail::parse_indexed_devices(devices, Derived::auto_device_count(), Derived::name);
  }
  static std::vector<int> parse_devices(std::string_view devices) {
    return detail::parse_indexed_devices(devices, Derived::auto_device_count(), Derived::name);
  }
  static std::vector<c10::Device> get_parallel_devices(const std::vector<int>& ids) {
    std::vector<c10::Device> devices;
    for (int id : ids)  // CPU tensors carry no index: cpu:0 would not compare equal to them
      devices.push_back(Derived::device_type == c10::kCPU ? c10::Device(c10::kCPU)
                                                          : c10::Device(Derived::device_type, static_cast<c10::DeviceIndex>(id)));
    return devices;
  }
  void setup_device(const c10::Device& device) {
    if (device.type() != Derived::device_type)
      throw AcceleratorError("Device should be " + std::string(Derived::name) + ", got " + device.str() + " instead.");
    detail::set_current_device(device);
  }
  void teardown() {}
};

}  // namespace fulgur
