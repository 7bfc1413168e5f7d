#pragma once
// fulgur::activation_checkpoint(fn, inputs...): torch.utils.checkpoint.checkpoint(fn, *inputs,
// use_reentrant=False) for LibTorch. fn runs once in the forward and keeps none of its activations:
// only its tensor inputs are saved, and backward runs fn again (with the CPU and CUDA RNG states and
// the autocast state of the forward restored, so dropout and mixed precision recompute the same
// values) to get the gradients. LibTorch has no C++ saved-tensor hooks, so this is one autograd node
// whose inputs are fn's tensor inputs and the parameters fn reads; its backward recomputes fn and
// returns the gradients of both, which autograd accumulates into .grad as for any op (the gradient
// hooks of DDP and the sharded strategies see them as usual). The parameters are found from the graph
// of the forward (each leaf that requires grad), or are given (checkpoint_module: the module's own).
// docs/activation_checkpointing.md.
#include <ATen/core/Tensor.h>

#include <concepts>
#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fulgur {
namespace detail {

/// fn with its non-tensor arguments bound: the tensors in, the tensors out (in order).
using CheckpointBody = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// The non-template part (src/nn/activation_checkpoint.cpp). params null: found from the forward's
/// graph; otherwise those (each requiring grad) and fn runs without a graph in the forward.
std::vector<at::Tensor> checkpoint_tensors(CheckpointBody body, std::vector<at::Tensor> inputs,
                                           const std::vector<at::Tensor>* params);

template <class T>
inline constexpr bool is_tensor_v = std::is_same_v<std::remove_cvref_t<T>, at::Tensor>;

template <class R>
struct CheckpointOutput {
  static constexpr bool valid = false;
};
template <>
struct CheckpointOutput<at::Tensor> {
  static constexpr bool valid = true;
  static std::vector<at::Tensor> flatten(at::Tensor t) { return {std::move(t)}; }
  static at::Tensor rebuild(std::vector<at::Tensor>&& v) { return std::move(v[0]); }
};
template <>
struct CheckpointOutput<std::vector<at::Tensor>> {
  static constexpr bool valid = true;
  static std::vector<at::Tensor> flatten(std::vector<at::Tensor> v) { return v; }
  static std::vector<at::Tensor> rebuild(std::vector<at::Tensor>&& v) { return std::move(v); }
};
template <class... Ts>
  requires(std::is_same_v<Ts, at::Tensor> && ...)
struct CheckpointOutput<std::tuple<Ts...>> {
  static constexpr bool valid = true;
  static std::vector<at::Tensor> flatten(std::tuple<Ts...> t) {
    return std::apply([](auto&&... x) { return std::vector<at::Tensor>{std::move(x)...}; }, std::move(t));
  }
  static std::tuple<Ts...> rebuild(std::vector<at::Tensor>&& v) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return std::tuple<Ts...>{std::move(v[I])...}; }(
        std::index_sequence_for<Ts...>{});
  }
};

/// Position of argument I among the tensor arguments (how many tensors come before it).
template <class... Args>
constexpr std::size_t tensor_index(std::size_t i) {
  constexpr bool tensor[] = {is_tensor_v<Args>..., false};
  std::size_t n = 0;
  for (std::size_t k = 0; k < i; ++k) n += tensor[k] ? 1 : 0;
  return n;
}

template <class>
inline constexpr bool refused_checkpoint_use = false;

template <class Fn, class... Args>
auto checkpoint_call(const std::vector<at::Tensor>* params, Fn&& fn, Args&&... args) {
  using Result = std::remove_cvref_t<std::invoke_result_t<Fn&, Args&...>>;
  using Output = CheckpointOutput<Result>;
  if constexpr (!Output::valid) {
    static_assert(refused_checkpoint_use<Result>,
                  "fulgur::activation_checkpoint: fn must return an at::Tensor, a std::tuple of at::Tensor or a "
                  "std::vector<at::Tensor>");
    if constexpr (std::is_default_constructible_v<Result>) return Result{};  // no second error at the caller
  } else if constexpr (!(std::is_copy_constructible_v<std::decay_t<Args>> && ...)) {
    static_assert(refused_checkpoint_use<Result>,
                  "fulgur::activation_checkpoint: fn runs again in backward, so every argument is kept until then "
                  "(copied): pass arguments that can be copied (a pointer or std::ref for the others)");
    return Result{};
  } else {
    std::vector<at::Tensor> inputs;
    inputs.reserve(sizeof...(Args));
    (
        [&](const auto& a) {
          if constexpr (is_tensor_v<decltype(a)>) inputs.push_back(a);
        }(args),
        ...);
    // The tensors are given anew at each call (the forward's, then the recomputation's leaves); the other
    // arguments are kept by value for the recomputation, as Python keeps references to them.
    CheckpointBody body = [fn = std::decay_t<Fn>(std::forward<Fn>(fn)),
                           kept = std::tuple<std::decay_t<Args>...>(args...)](
                              const std::vector<at::Tensor>& tensors) mutable {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        auto pick = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) -> decltype(auto) {
          if constexpr (is_tensor_v<std::tuple_element_t<J, std::tuple<Args...>>>)
            return static_cast<const at::Tensor&>(tensors[tensor_index<Args...>(J)]);
          else
            return static_cast<std::tuple_element_t<J, std::tuple<std::decay_t<Args>...>>&>(std::get<J>(kept));
        };
        return Output::flatten(std::invoke(fn, pick(std::integral_constant<std::size_t, I>{})...));
      }(std::index_sequence_for<Args...>{});
    };
    return Output::rebuild(checkpoint_tensors(std::move(body), std::move(inputs), params));
  }
}

}  // namespace detail

/// fn(inputs...) whose activations are not kept: recomputed in backward (torch.utils.checkpoint,
/// use_reentrant=False). fn returns an at::Tensor, a std::tuple of them or a std::vector of them; the
/// at::Tensor arguments are its inputs (saved; gradients flow to those that require grad), any other
/// argument is copied and given again to the recomputation. Parameters fn reads get their gradients
/// even when no input requires grad. Grad mode off: just fn(inputs...). fn must compute the same
/// thing when called again (the RNG and autocast states are restored for it); a tensor that requires
/// grad and that fn reads without taking it as an argument must be a leaf (a parameter): pass an
/// intermediate result as an argument (refused with a clear error otherwise).
template <class Fn, class... Args>
  requires std::invocable<Fn&, Args&...>
auto activation_checkpoint(Fn&& fn, Args&&... inputs) {
  return detail::checkpoint_call(nullptr, std::forward<Fn>(fn), std::forward<Args>(inputs)...);
}

/// The same for a module's forward, with the module's parameters (those that require grad) as the
/// parameters: no graph is built in the forward. module is a TORCH_MODULE holder or a shared_ptr.
template <class Holder, class... Args>
auto checkpoint_module(Holder& module, Args&&... inputs) {
  auto& impl = *module;
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : impl.parameters())
    if (p.requires_grad()) params.push_back(p);
  auto* m = &impl;  // the module outlives its backward, as its parameters do
  return detail::checkpoint_call(
      &params, [m](auto&&... a) { return m->forward(std::forward<decltype(a)>(a)...); },
      std::forward<Args>(inputs)...);
}

}  // namespace fulgur
