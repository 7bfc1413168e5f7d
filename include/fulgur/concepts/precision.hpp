#pragma once
// fulgur::precision — in which number format a run computes. Mirrors Lightning Fabric's
// Precision: convert_module, module_init_context, tensor_init_context, forward_context,
// convert_input, convert_output, pre_backward, backward, post_backward, unscale_gradients,
// optimizer_step, main_params, state_dict, load_state_dict, teardown. Torch-free.
//
// The requirements are what the loops call, with the arguments they pass: convert_input gets a
// tensor and a batch (fulgur::data::Batch), the contexts are RAII guards kept for a scope.
#include <concepts>
#include <string_view>
#include <vector>

#include "fulgur/concepts/requirements.hpp"
#include "fulgur/concepts/vocabulary.hpp"

namespace fulgur {

template <class P, class V>
concept precision_is_value_type = std::movable<P>;
template <class P, class V>
concept precision_has_name = detail::has_policy_name<P>;
template <class P, class V>
concept precision_has_convert_module = requires(P& p, typename V::module& module) { p.convert_module(module); };
template <class P, class V>
concept precision_has_module_init_context = requires(P& p) { p.module_init_context(); };
template <class P, class V>
concept precision_has_tensor_init_context = requires(P& p) { p.tensor_init_context(); };
template <class P, class V>
concept precision_has_forward_context = requires(P& p) { p.forward_context(); };
template <class P, class V>
concept precision_has_convert_input = requires(P& p, const typename V::tensor& t, const typename V::batch& batch) {
  { p.convert_input(t) } -> std::convertible_to<typename V::tensor>;
  p.convert_input(batch);
};
template <class P, class V>
concept precision_has_convert_output = requires(P& p, const typename V::tensor& t) {
  { p.convert_output(t) } -> std::convertible_to<typename V::tensor>;
};
template <class P, class V>
concept precision_has_backward = requires(P& p, const typename V::tensor& loss, typename V::module& module) {
  p.pre_backward(loss, module);
  p.backward(loss, module);
  p.post_backward(loss, module);
};
template <class P, class V>
concept precision_has_unscale_gradients = requires(P& p, typename V::optimizer& optimizer) {
  p.unscale_gradients(optimizer);
};
template <class P, class V>
concept precision_has_optimizer_step = requires(P& p, typename V::optimizer& optimizer) {
  { p.optimizer_step(optimizer) } -> std::same_as<bool>;  // false: the step was skipped
};
template <class P, class V>
concept precision_has_main_params = requires(P& p, typename V::optimizer& optimizer) {
  { p.main_params(optimizer) } -> std::convertible_to<std::vector<typename V::tensor>>;  // what clipping acts on
};
template <class P, class V>
concept precision_has_state_dict = requires(P& p, const P& cp) {
  { cp.state_dict() } -> std::convertible_to<typename V::state_dict>;
  p.load_state_dict(cp.state_dict());
};
template <class P, class V>
concept precision_has_teardown = requires(P& p) { p.teardown(); };

// clang-format off
#define FULGUR_PRECISION_REQUIREMENTS(R)                                                                      \
  R(precision_is_value_type, "a move constructor")                                                             \
  R(precision_has_name, "static constexpr std::string_view name")                                             \
  R(precision_has_convert_module, "void convert_module(torch::nn::Module&)")                                  \
  R(precision_has_module_init_context, "Guard module_init_context()")                                         \
  R(precision_has_tensor_init_context, "Guard tensor_init_context()")                                         \
  R(precision_has_forward_context, "Guard forward_context()")                                                 \
  R(precision_has_convert_input, "convert_input(const at::Tensor&) and convert_input(const fulgur::data::Batch&)") \
  R(precision_has_convert_output, "at::Tensor convert_output(const at::Tensor&)")                            \
  R(precision_has_backward, "void pre_backward/backward/post_backward(const at::Tensor& loss, torch::nn::Module&)") \
  R(precision_has_unscale_gradients, "void unscale_gradients(torch::optim::Optimizer&)")                      \
  R(precision_has_optimizer_step, "bool optimizer_step(torch::optim::Optimizer&)")                            \
  R(precision_has_main_params, "std::vector<at::Tensor> main_params(torch::optim::Optimizer&)")               \
  R(precision_has_state_dict, "fulgur::StateDict state_dict() const and void load_state_dict(const fulgur::StateDict&)") \
  R(precision_has_teardown, "void teardown()")
// clang-format on

template <class T, class V>
concept precision_for = true FULGUR_PRECISION_REQUIREMENTS(FULGUR_DETAIL_ALL_OF);

/// A precision policy over LibTorch's types.
template <class P>
concept precision = precision_for<P, torch_vocabulary>;

namespace detail {
enum class precision_requirement { FULGUR_PRECISION_REQUIREMENTS(FULGUR_DETAIL_ENUMERATE) none };
template <class T, class V>
consteval precision_requirement first_missing_precision_requirement() {
  using Missing = precision_requirement;
  FULGUR_PRECISION_REQUIREMENTS(FULGUR_DETAIL_FIRST_MISSING) return Missing::none;
}
}  // namespace detail

/// One static_assert naming the first member the type lacks (the others stay silent).
template <class T, class V = torch_vocabulary>
consteval bool assert_precision() {
  using Missing = detail::precision_requirement;
  constexpr Missing missing = detail::first_missing_precision_requirement<T, V>();
#define FULGUR_DETAIL_LACKS "fulgur: the precision (Trainer's third argument) lacks `"
#define FULGUR_DETAIL_REMEDY \
  "`; write it, or derive from a shipped precision such as fulgur::FloatPrecision (docs/concepts/precision.md)."
  FULGUR_PRECISION_REQUIREMENTS(FULGUR_DETAIL_REQUIRE)
#undef FULGUR_DETAIL_LACKS
#undef FULGUR_DETAIL_REMEDY
  return true;  // the one error is the static_assert above; a `false` here would add a second
}

}  // namespace fulgur
