#pragma once
// MixedPrecision<dtype> — Lightning's "16-mixed" (float16, with a GradScaler) and "bf16-mixed"
// (bfloat16, no scaler): float32 parameters, forward and loss under autocast.
//
// '16-mixed' runs on CPU for real (LibTorch has CPU fp16 autocast and CPU scaler kernels): it is
// never switched to bf16 behind the user's back, as Lightning does.
#include <ATen/ATen.h>
#include <c10/core/DefaultDtype.h>
#include <torch/nn/module.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>

#include <string_view>
#include <type_traits>
#include <vector>

#include "fulgur/errors.hpp"
#include "fulgur/optim/scaled_step.hpp"
#include "fulgur/precision/common.hpp"
#include "fulgur/precision/grad_scaler.hpp"
#include "fulgur/precision/guards.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur {

/// The Scaler argument of MixedPrecision when no loss scaling is wanted.
struct NoScaler {};

namespace detail {
template <c10::ScalarType Dtype>
using default_scaler_t = std::conditional_t<Dtype == c10::kHalf, GradScaler, NoScaler>;
}

template <c10::ScalarType Dtype, class Scaler = detail::default_scaler_t<Dtype>>
  requires(Dtype == c10::kHalf || Dtype == c10::kBFloat16)
class MixedPrecision {
 public:
  static constexpr std::string_view name = Dtype == c10::kHalf ? "16-mixed" : "bf16-mixed";
  static constexpr c10::ScalarType dtype = Dtype;
  static constexpr bool uses_scaler = !std::is_same_v<Scaler, NoScaler>;

  /// device_type: where autocast runs (the accelerator's device type); the Trainer passes it.
  // Not explicit: a precision derived from this one by aggregate gets its device type the same way.
  MixedPrecision(c10::DeviceType device_type = c10::kCPU, Scaler scaler = Scaler{})
      : device_type_(device_type), scaler_(std::move(scaler)) {}

  /// Parameters stay float32. A module is set up at the start of a run: the scaler forgets the
  /// optimizers of any earlier run (keeping its scale), so a run that ended between unscaling and
  /// the step leaves nothing behind.
  void convert_module(torch::nn::Module&) {
    if constexpr (uses_scaler) scaler_.forget_optimizers();
  }
  NullContext module_init_context() { return {}; }
  NullContext tensor_init_context() { return {}; }
  /// One autocast region per forward: opened here, closed (and its cast cache dropped) at scope end.
  AutocastGuard forward_context() { return AutocastGuard(device_type_, Dtype); }
  template <class Data>
  auto convert_input(const Data& data) { return detail::convert_floating(data, Dtype); }
  template <class Data>
  auto convert_output(const Data& data) { return detail::convert_floating(data, c10::get_default_dtype_as_scalartype()); }

  void pre_backward(const at::Tensor&, torch::nn::Module&) {}
  void backward(const at::Tensor& loss, torch::nn::Module&) {
    if constexpr (uses_scaler) scaler_.scale(loss).backward();
    else loss.backward();
  }
  void post_backward(const at::Tensor&, torch::nn::Module&) {}

  /// Divides the gradients by the loss scale, once per step: the loop calls it before
  /// on_before_optimizer_step (so hooks see true gradients) and clipping calls it again, which
  /// then does nothing. (GradScaler::unscale_ itself refuses a second call, as Python's does.)
  void unscale_gradients(torch::optim::Optimizer& optimizer) {
    if constexpr (uses_scaler)
      if (scaler_.stage(optimizer) == GradScaler::Stage::ready) {
        require_scaled_loss();
        scaler_.unscale_(optimizer);
      }
  }
  /// Whether the scaler hands the scale to the optimizer's kernel (an optim::ScaledStepOptimizer):
  /// the gradients then need no unscaling pass of their own.
  bool unscales_in_optimizer(const torch::optim::Optimizer& optimizer) const {
    if constexpr (uses_scaler)
      return scaler_.is_enabled() && dynamic_cast<const optim::ScaledStepOptimizer*>(&optimizer) != nullptr;
    else
      return false;
  }
  /// Steps unless the scaler found an inf/NaN gradient; returns whether it stepped.
  bool optimizer_step(torch::optim::Optimizer& optimizer) {
    if constexpr (uses_scaler) {
      if (dynamic_cast<torch::optim::LBFGS*>(&optimizer) != nullptr)
        throw MisconfigurationError("AMP and the LBFGS optimizer are not compatible.");
      require_scaled_loss();
      const bool stepped = scaler_.step(optimizer);
      scaler_.update();
      return stepped;
    } else {
      optimizer.step();
      return true;
    }
  }
  std::vector<at::Tensor> main_params(torch::optim::Optimizer& optimizer) { return detail::all_params(optimizer); }

  StateDict state_dict() const {
    if constexpr (uses_scaler) return scaler_.state_dict();
    else return {};
  }
  void load_state_dict(const StateDict& state) {
    if constexpr (uses_scaler) scaler_.load_state_dict(state);
  }
  void teardown() {}

  Scaler& scaler() { return scaler_; }
  const Scaler& scaler() const { return scaler_; }
  c10::DeviceType device_type() const { return device_type_; }

 private:
  // The Fabric-level loop's usual slip: loss.backward() where trainer.backward(loss) scales the loss.
  void require_scaled_loss() const {
    if (scaler_.is_enabled() && !scaler_.scale_tensor().defined())
      throw GradScalerError("fulgur: optimizer_step (or unscaling, clipping) under '16-mixed' before any loss was "
                            "scaled: call trainer.backward(loss), which scales the loss for the GradScaler, instead "
                            "of loss.backward().");
  }

  c10::DeviceType device_type_;
  [[no_unique_address]] Scaler scaler_;
};

using FP16MixedPrecision = MixedPrecision<c10::kHalf>;
using BF16MixedPrecision = MixedPrecision<c10::kBFloat16>;

}  // namespace fulgur
