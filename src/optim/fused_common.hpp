#pragma once
// What the fused optimizers share: option checks, the parameter check, (device, dtype) buckets.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fulgur/errors.hpp"

namespace fulgur::optim::detail {

/// "FusedAdam: lr must be >= 0, got -0.1." unless ok.
inline void check_option(bool ok, const char* optimizer, const char* option, double value, const char* requirement) {
  if (ok) return;
  std::ostringstream text;
  text << optimizer << ": " << option << " must be " << requirement << ", got " << value << ".";
  throw MisconfigurationError(text.str());
}

/// ATen's fused kernels take floating-point tensors on the CPU or a CUDA device (as torch.optim's
/// _device_dtype_check_for_fused).
inline void check_fused_parameter(const at::Tensor& param, const char* optimizer) {
  if (!param.is_floating_point() || !(param.is_cpu() || param.is_cuda()))
    throw MisconfigurationError(std::string(optimizer) + " runs on floating-point tensors on the CPU or a CUDA device; " +
                                "a parameter is " + std::string(c10::toString(param.scalar_type())) + " on " +
                                param.device().str() + ". Use torch::optim's unfused optimizer for it.");
}

/// Python's checks at construction: some parameter to optimize (torch.optim.Optimizer's "optimizer got an
/// empty parameter list", also when every group is empty), and every parameter of every group fit for the kernel.
inline void check_fused_parameters(const torch::optim::Optimizer& optimizer, const char* name) {
  const auto& groups = optimizer.param_groups();
  if (std::all_of(groups.begin(), groups.end(), [](const auto& group) { return group.params().empty(); }))
    throw MisconfigurationError(std::string("fulgur: ") + name +
                                " got an empty parameter list; pass it the tensors to optimize, e.g. "
                                "model->parameters() once the module has registered its parameters (as Python's "
                                "\"optimizer got an empty parameter list\").");
  for (const auto& group : groups)
    for (const auto& param : group.params()) check_fused_parameter(param, name);
}

/// A state buffer that fits `param`: the kernel trusts sizes, so another shape (a state loaded from an
/// optimizer over other parameters) is an error here rather than memory corruption there; another
/// dtype or device is converted, as Python's Optimizer.load_state_dict casts state to its parameter's.
inline at::Tensor fitted_buffer(const at::Tensor& buffer, const at::Tensor& param, const char* optimizer,
                                const char* name) {
  if (!buffer.defined()) return buffer;
  if (buffer.sizes() != param.sizes()) {
    std::ostringstream text;
    text << optimizer << ": the optimizer state's " << name << " has shape " << buffer.sizes()
         << ", its parameter " << param.sizes()
         << ": the state was saved by an optimizer over other parameters. Load the state of an optimizer over the "
            "same parameters, in the same order.";
    throw CheckpointError(text.str());
  }
  if (buffer.scalar_type() != param.scalar_type() || buffer.device() != param.device()) return buffer.to(param.options());
  return buffer;
}

/// The bucket of `param`'s device and dtype, made on first use (then reused, its vectors' capacity kept).
template <class Bucket>
Bucket& bucket_for(std::vector<Bucket>& buckets, const at::Tensor& param) {
  const auto found = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
    return b.device == param.device() && b.dtype == param.scalar_type();
  });
  if (found != buckets.end()) return *found;
  buckets.emplace_back(param.device(), param.scalar_type());
  return buckets.back();
}

/// The scaler's tensor on `device` (itself when it is there already, as it is on one device).
inline std::optional<at::Tensor> on_device(const std::optional<at::Tensor>& tensor, const c10::Device& device) {
  if (!tensor || tensor->device() == device) return tensor;
  return tensor->to(device, /*non_blocking=*/true);
}

/// LibTorch's optimizers' closure rule: evaluated with gradients on, its loss returned.
inline at::Tensor evaluate(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace fulgur::optim::detail
