#pragma once
// What every strategy does the same way, whatever it spreads: moving batches, the module-init
// context, and clipping after unscaling.
#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <torch/optim/optimizer.h>

#include <utility>

#include "fulgur/compatibility.hpp"
#include "fulgur/data/apply.hpp"
#include "fulgur/strategies/clipping.hpp"

namespace fulgur {

/// What module_init_context returns: the root device made current, then the precision's context.
template <class PrecisionContext>
struct ModuleInitContext {
  c10::OptionalDeviceGuard device;
  PrecisionContext precision;
};

namespace detail {

template <class Precision>
ModuleInitContext<decltype(std::declval<Precision&>().module_init_context())> module_init_context_on(
    const c10::Device& device, Precision& precision) {
  return {c10::OptionalDeviceGuard(device), precision.module_init_context()};
}

/// Every tensor of any nesting moved to `device` (non-blocking from pinned memory; a tensor
/// already there is returned as it is, without a copy).
template <class Batch>
auto move_batch(const Batch& batch, const c10::Device& device) {
  return data::map_tensors(batch, [&device](const at::Tensor& t) {
    return t.defined() ? t.to(device, /*non_blocking=*/t.is_pinned()) : t;
  });
}

/// Unscales first (so a scaled loss never meets the threshold), then clips the precision's main
/// parameters; returns the total norm before clipping. With a loss scaler, non-finite gradients
/// are the scaler's to handle (it skips the step), so they are never an error.
template <class Precision>
at::Tensor unscale_and_clip_norm(torch::optim::Optimizer& optimizer, double max_norm, double norm_type,
                                 bool error_if_nonfinite, Precision& precision) {
  precision.unscale_gradients(optimizer);
  return clip_grad_norm(precision.main_params(optimizer), max_norm, norm_type,
                        error_if_nonfinite && !uses_scaler<Precision>());
}

template <class Precision>
void unscale_and_clip_value(torch::optim::Optimizer& optimizer, double clip_value, Precision& precision) {
  precision.unscale_gradients(optimizer);
  clip_grad_value(precision.main_params(optimizer), clip_value);
}

}  // namespace detail
}  // namespace fulgur
