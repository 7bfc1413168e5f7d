#pragma once
// FloatPrecision — Lightning's "32-true": every hook is the identity; the contexts do nothing.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string_view>
#include <vector>

#include "fulgur/precision/common.hpp"
#include "fulgur/precision/guards.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur {

class FloatPrecision {
 public:
  static constexpr std::string_view name = "32-true";

  void convert_module(torch::nn::Module&) {}
  NullContext module_init_context() { return {}; }
  NullContext tensor_init_context() { return {}; }
  NullContext forward_context() { return {}; }
  template <class Data>
  Data convert_input(Data data) { return data; }
  template <class Data>
  Data convert_output(Data data) { return data; }

  void pre_backward(const at::Tensor&, torch::nn::Module&) {}
  void backward(const at::Tensor& loss, torch::nn::Module&) { loss.backward(); }
  void post_backward(const at::Tensor&, torch::nn::Module&) {}

  void unscale_gradients(torch::optim::Optimizer&) {}
  bool optimizer_step(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    return true;
  }
  std::vector<at::Tensor> main_params(torch::optim::Optimizer& optimizer) { return detail::all_params(optimizer); }

  StateDict state_dict() const { return {}; }
  void load_state_dict(const StateDict&) {}
  void teardown() {}
};

}  // namespace fulgur
