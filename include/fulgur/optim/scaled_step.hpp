#pragma once
// fulgur::optim::ScaledStepOptimizer: an optimizer that takes the loss scaler into its kernel, as
// torch.optim's fused optimizers do (their `_step_supports_amp_scaling`).
#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <optional>

namespace fulgur::optim {

/// GradScaler::step hands such an optimizer the loss scale and the inf/NaN flag instead of dividing
/// the gradients itself and reading the flag on the host: the kernel divides each gradient by the
/// scale as it reads it, and leaves parameters and state untouched where the flag is set.
class ScaledStepOptimizer : public torch::optim::Optimizer {
 public:
  using torch::optim::Optimizer::Optimizer;

  /// One step on gradients still multiplied by grad_scale (nullopt: already unscaled, e.g. for
  /// clipping), skipped on the device when found_inf (float32, 0-dim, any device) is non-zero.
  virtual void scaled_step(const std::optional<at::Tensor>& grad_scale, const at::Tensor& found_inf) = 0;
};

}  // namespace fulgur::optim
