#pragma once
// The post-accumulate-grad hook both reducers install on each parameter: it tells the reducer's
// state that parameter `index`'s gradient is complete for this backward.
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace fulgur::distributed::detail {

template <class State>
struct GradientReadyHook final : torch::autograd::PostAccumulateGradHook {
  State* state;
  std::size_t index;
  GradientReadyHook(State* s, std::size_t i) : state(s), index(i) {}
  void operator()(const torch::autograd::Variable&) override { state->on_gradient(index); }
};

/// Installs the hook on `param` (replacing a post-accumulate-grad hook set there before).
template <class State>
void install_gradient_hook(const at::Tensor& param, State* state, std::size_t index) {
  torch::autograd::impl::set_post_acc_grad_hooks(param, std::make_unique<GradientReadyHook<State>>(state, index));
}

/// 'a', 'b', 'c' and 7 more: the parameters an error names (the first ten).
inline std::string quoted_names(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 10; ++i) out += (i ? "', '" : "'") + names[i];
  out += "'";
  if (names.size() > 10) out += " and " + std::to_string(names.size() - 10) + " more";
  return out;
}

}  // namespace fulgur::distributed::detail
