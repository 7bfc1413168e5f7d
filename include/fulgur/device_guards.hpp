#pragma once
// DefaultDeviceGuard: while it lives, factory functions called on this thread without a device
// (torch::zeros({3}), torch::empty(...), the parameters a torch::nn module creates) put their
// tensors on `device` — what Python's `with torch.device(...)` does, which LibTorch lacks. It is
// how Trainer::init_tensor and init_module create tensors on the root device directly.
//
// Mechanism (src/default_device.cpp): the guard adds a dispatch key to this thread's included
// set; a boxed fallback on that key fills the `device` argument of operators that take no tensor
// and were given no device, then hands the call on. Operators with tensor arguments (.to(),
// empty_like, in-place initialisation) are left as they are. Outside a guard nothing changes and
// nothing is paid. The key is DispatchKey::DeferredInit, reserved for module-initialisation
// interception (torchdistx's deferred_init, which a program using fulgur does not load).
// A CPU device (or none) makes the guard do nothing: CPU is LibTorch's default already.
#include <c10/core/Device.h>

#include <optional>

namespace fulgur {

class [[nodiscard]] DefaultDeviceGuard {
 public:
  explicit DefaultDeviceGuard(std::optional<c10::Device> device);
  ~DefaultDeviceGuard();
  DefaultDeviceGuard(const DefaultDeviceGuard&) = delete;
  DefaultDeviceGuard& operator=(const DefaultDeviceGuard&) = delete;

  /// The device this thread's factory functions use now (none outside every guard).
  static std::optional<c10::Device> current();

 private:
  std::optional<c10::Device> previous_;
  bool previous_included_ = false;
  bool active_ = false;
};

}  // namespace fulgur
