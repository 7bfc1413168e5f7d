#pragma once
// The "-true" precisions ("64-true", "16-true", "bf16-true"): parameters, inputs and every
// tensor created in the contexts are of one dtype; there is no scaler and no float32 copy.
// Public names: DoublePrecision (double.hpp) and HalfPrecision<dtype> (half.hpp).
#include <ATen/ATen.h>
#include <c10/core/DefaultDtype.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string_view>
#include <vector>

#include "fulgur/precision/common.hpp"
#include "fulgur/precision/guards.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur::detail {

template <c10::ScalarType Dtype>
constexpr std::string_view true_precision_name() {
  if constexpr (Dtype == c10::kDouble) return "64-true";
  else if constexpr (Dtype == c10::kHalf) return "16-true";
  else if constexpr (Dtype == c10::kBFloat16) return "bf16-true";
  else static_assert(Dtype == c10::kDouble, "true precision is offered for kDouble, kHalf and kBFloat16 only");
}

/// Casts a module's floating-point parameters, their gradients and floating buffers to dtype,
/// as Python's module.double()/half()/bfloat16() do; integer and complex tensors stay as they are.
/// (LibTorch's Module::to(dtype) would also cast integer buffers such as num_batches_tracked.)
inline void cast_floating_state(torch::nn::Module& module, c10::ScalarType dtype) {
  at::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    if (!p.is_floating_point() || p.scalar_type() == dtype) continue;
    p.set_data(p.to(dtype));
    if (p.grad().defined()) p.mutable_grad() = p.grad().to(dtype);
  }
  for (auto& b : module.buffers())
    if (b.is_floating_point() && b.scalar_type() != dtype) b.set_data(b.to(dtype));
}

template <c10::ScalarType Dtype>
class TruePrecision {
 public:
  static constexpr std::string_view name = true_precision_name<Dtype>();
  static constexpr c10::ScalarType dtype = Dtype;
  /// fit converts the whole batch, targets too (Lightning's convert_input for "-true"): the model's
  /// outputs are of this dtype, so a float32 regression target would not meet them in the loss.
  static constexpr bool converts_targets = true;

  void convert_module(torch::nn::Module& module) { cast_floating_state(module, Dtype); }
  DefaultDtypeGuard module_init_context() { return DefaultDtypeGuard(Dtype); }
  DefaultDtypeGuard tensor_init_context() { return DefaultDtypeGuard(Dtype); }
  DefaultDtypeGuard forward_context() { return DefaultDtypeGuard(Dtype); }
  template <class Data>
  auto convert_input(const Data& data) { return convert_floating(data, Dtype); }
  template <class Data>
  auto convert_output(const Data& data) { return convert_floating(data, c10::get_default_dtype_as_scalartype()); }

  void pre_backward(const at::Tensor&, torch::nn::Module&) {}
  void backward(const at::Tensor& loss, torch::nn::Module&) { loss.backward(); }
  void post_backward(const at::Tensor&, torch::nn::Module&) {}

  void unscale_gradients(torch::optim::Optimizer&) {}
  bool optimizer_step(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    return true;
  }
  std::vector<at::Tensor> main_params(torch::optim::Optimizer& optimizer) { return all_params(optimizer); }

  StateDict state_dict() const { return {}; }
  void load_state_dict(const StateDict&) {}
  void teardown() {}
};

}  // namespace fulgur::detail
