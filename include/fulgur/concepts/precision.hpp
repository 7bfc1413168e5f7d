#pragma once
// fulgur::precision — in which number format a run computes. Mirrors Lightning Fabric's
// Precision: convert_module, module_init_context, tensor_init_context, forward_context,
// convert_input, convert_output, pre_backward, backward, post_backward, unscale_gradients,
// optimizer_step, main_params, state_dict, load_state_dict, teardown. Torch-free.
#include <concepts>
#include <vector>
#include <string_view>

#include "fulgur/concepts/accelerator.hpp"  // detail::has_policy_name
#include "fulgur/concepts/vocabulary.hpp"

namespace fulgur {

template <class P, class V>
concept precision_module_hooks_for = requires(P& p, typename V::module& module) {
  p.convert_module(module);
  p.module_init_context();  // RAII guards: alive for the scope of the returned object
  p.tensor_init_context();
};

template <class P, class V>
concept precision_forward_hooks_for = requires(P& p, const typename V::tensor& t) {
  p.forward_context();
  { p.convert_input(t) } -> std::convertible_to<typename V::tensor>;
  { p.convert_output(t) } -> std::convertible_to<typename V::tensor>;
};

template <class P, class V>
concept precision_backward_hooks_for =
    requires(P& p, const typename V::tensor& loss, typename V::module& module) {
      p.pre_backward(loss, module);
      p.backward(loss, module);
      p.post_backward(loss, module);
    };

template <class P, class V>
concept precision_optimizer_hooks_for = requires(P& p, typename V::optimizer& optimizer) {
  p.unscale_gradients(optimizer);
  { p.optimizer_step(optimizer) } -> std::same_as<bool>;  // false: the step was skipped
  { p.main_params(optimizer) } -> std::convertible_to<std::vector<typename V::tensor>>;  // what clipping acts on
};

template <class P, class V>
concept precision_state_for = requires(P& p, const P& cp) {
  { cp.state_dict() } -> std::convertible_to<typename V::state_dict>;
  p.load_state_dict(cp.state_dict());
  p.teardown();
};

template <class P, class V>
concept precision_for = std::movable<P> && detail::has_policy_name<P> &&
                        precision_module_hooks_for<P, V> && precision_forward_hooks_for<P, V> &&
                        precision_backward_hooks_for<P, V> && precision_optimizer_hooks_for<P, V> &&
                        precision_state_for<P, V>;

/// A precision policy over LibTorch's types.
template <class P>
concept precision = precision_for<P, torch_vocabulary>;

}  // namespace fulgur
