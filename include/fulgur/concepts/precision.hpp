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
#include <type_traits>
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

// ---- optional members: absent, or what fulgur reads them as ---------------------------------------
namespace detail::precision_members {
FULGUR_DETAIL_MEMBER_PROBE(uses_scaler)
FULGUR_DETAIL_MEMBER_PROBE(converts_targets)
FULGUR_DETAIL_MEMBER_PROBE(unscales_in_optimizer)
FULGUR_DETAIL_MEMBER_PROBE(supports_accelerator)
FULGUR_DETAIL_MEMBER_PROBE(dtype)
}  // namespace detail::precision_members

/// It scales the loss: gradients are scaled until unscaled, and a step may be skipped.
template <class P, class V>
concept precision_optional_uses_scaler = !detail::precision_members::has_member_uses_scaler<P>() || requires {
  { P::uses_scaler } -> std::convertible_to<bool>;
  typename std::bool_constant<static_cast<bool>(P::uses_scaler)>;  // a constant: the loops decide at compile time
};
/// Its models compute in its dtype, so a batch's targets are converted with its inputs ("-true").
template <class P, class V>
concept precision_optional_converts_targets = !detail::precision_members::has_member_converts_targets<P>() || requires {
  typename std::bool_constant<static_cast<bool>(P::converts_targets)>;
};
/// The optimizer's own kernel divides the scaled gradients (a fused optimizer under a loss scaler).
template <class P, class V>
concept precision_optional_unscales_in_optimizer =
    !detail::precision_members::has_member_unscales_in_optimizer<P>() || requires(P& p, typename V::optimizer& o) {
      { p.unscales_in_optimizer(o) } -> std::same_as<bool>;
    };
/// Compatibility rule (compatibility.hpp): which accelerators it runs on.
template <class P, class V>
concept precision_optional_supports_accelerator =
    !detail::precision_members::has_member_supports_accelerator<P>() || requires(std::string_view name) {
      { P::supports_accelerator(name) } -> std::convertible_to<bool>;
    };
/// The dtype its matrix products compute in: the accelerator's supports_dtype checks it, and a CPU
/// without fast float16/bfloat16 kernels is said to be slow for it.
template <class P, class V>
concept precision_optional_dtype = !detail::precision_members::has_member_dtype<P>() || requires {
  { P::dtype } -> std::convertible_to<typename V::scalar_type>;
  typename std::integral_constant<typename V::scalar_type, P::dtype>;  // a constant: read at compile time
};

// clang-format off
#define FULGUR_PRECISION_OPTIONAL_MEMBERS(R)                                                                  \
  R(precision_optional_uses_scaler, "static constexpr bool uses_scaler")                                      \
  R(precision_optional_converts_targets, "static constexpr bool converts_targets")                            \
  R(precision_optional_unscales_in_optimizer, "bool unscales_in_optimizer(torch::optim::Optimizer&)")          \
  R(precision_optional_supports_accelerator, "static constexpr bool supports_accelerator(std::string_view)")   \
  R(precision_optional_dtype, "static constexpr c10::ScalarType dtype")
// clang-format on

template <class T, class V>
concept precision_for =
    true FULGUR_PRECISION_REQUIREMENTS(FULGUR_DETAIL_ALL_OF) FULGUR_PRECISION_OPTIONAL_MEMBERS(FULGUR_DETAIL_ALL_OF);

/// A precision policy over LibTorch's types.
template <class P>
concept precision = precision_for<P, torch_vocabulary>;

namespace detail {
enum class precision_requirement {
  FULGUR_PRECISION_REQUIREMENTS(FULGUR_DETAIL_ENUMERATE) FULGUR_PRECISION_OPTIONAL_MEMBERS(FULGUR_DETAIL_ENUMERATE) none
};
template <class T, class V>
consteval precision_requirement first_missing_precision_requirement() {
  using Missing = precision_requirement;
  FULGUR_PRECISION_REQUIREMENTS(FULGUR_DETAIL_FIRST_MISSING)
  FULGUR_PRECISION_OPTIONAL_MEMBERS(FULGUR_DETAIL_FIRST_MISSING) return Missing::none;
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
#define FULGUR_DETAIL_LACKS "fulgur: the precision (Trainer's third argument) has a member named after the optional `"
#define FULGUR_DETAIL_REMEDY "`, but it cannot be read so; fix its declaration (or rename it: fulgur would never read it)."
  FULGUR_PRECISION_OPTIONAL_MEMBERS(FULGUR_DETAIL_REQUIRE)
#undef FULGUR_DETAIL_LACKS
#undef FULGUR_DETAIL_REMEDY
  return true;  // the one error is the static_assert above; a `false` here would add a second
}

}  // namespace fulgur
