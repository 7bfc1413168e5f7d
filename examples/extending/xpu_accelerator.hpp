// examples/extending/xpu_accelerator.hpp
// An accelerator for a device type that LibTorch has and fulgur does not ship: Intel's XPU here;
// c10::kMPS, c10::kHIP or a PrivateUse1 backend (c10::kPrivateUse1) work the same way.
// accelerator_defaults derives availability, the device count (LibTorch's accelerator hooks),
// Lightning's parsing of `devices`, and setup_device from the two constants.
#pragma once
#include <fulgur/fulgur.hpp>

struct XPUAccelerator : fulgur::accelerator_defaults<XPUAccelerator> {
  static constexpr std::string_view name = "xpu";
  static constexpr c10::DeviceType device_type = c10::kXPU;
};
