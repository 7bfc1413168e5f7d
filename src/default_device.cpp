// DefaultDeviceGuard (include/fulgur/device_guards.hpp): factory functions without a device go to
// the guard's device, through a boxed fallback on a thread-locally included dispatch key.
#include "fulgur/device_guards.hpp"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace fulgur {
namespace {

constexpr c10::DispatchKey kDefaultDeviceKey = c10::DispatchKey::DeferredInit;
thread_local std::optional<c10::Device> tls_device;

bool is_tensor_like(const c10::IValue& v) {
  return v.isTensor() || v.isTensorList() || v.isOptionalTensorList() ||
         (v.isList() && !v.toListRef().empty() && v.toListRef().front().isTensor());
}

/// Fills the `device` of a tensor-free operator called without one, then dispatches on below.
void place_factory_outputs(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const std::size_t first = stack->size() - arguments.size();
  std::optional<std::size_t> device_slot;
  bool takes_tensors = false;
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& value = (*stack)[first + i];
    takes_tensors = takes_tensors || is_tensor_like(value);
    if (arguments[i].name() == "device") device_slot = first + i;
  }
  if (tls_device && device_slot && !takes_tensors && (*stack)[*device_slot].isNone())
    (*stack)[*device_slot] = c10::IValue(*tls_device);
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kDefaultDeviceKey), stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, DeferredInit, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&place_factory_outputs>());
}

DefaultDeviceGuard::DefaultDeviceGuard(std::optional<c10::Device> device) {
  if (!device || device->is_cpu()) return;
  active_ = true;
  previous_ = tls_device;
  previous_included_ = c10::impl::tls_is_dispatch_key_included(kDefaultDeviceKey);
  tls_device = device;
  c10::impl::tls_set_dispatch_key_included(kDefaultDeviceKey, true);
}

DefaultDeviceGuard::~DefaultDeviceGuard() {
  if (!active_) return;
  tls_device = previous_;
  c10::impl::tls_set_dispatch_key_included(kDefaultDeviceKey, previous_included_);
}

std::optional<c10::Device> DefaultDeviceGuard::current() { return tls_device; }

}  // namespace fulgur
