#pragma once
// fulgur::compatible<A, S, P>: which accelerator/strategy/precision combinations can work,
// decided at compile time. Each rule is what Lightning's accelerator connector checks (or
// silently changes) at run time; here a refused combination does not compile, and the
// message says why in one sentence. Torch-free: rules read only the policies' traits.
//
// Traits a policy may declare (all optional; absent means "no restriction"):
//   static constexpr bool supports_accelerator(std::string_view accelerator_name);  // S or P
//   static constexpr bool supports_precision(std::string_view precision_name);      // S
//   static constexpr bool uses_scaler;                                               // P
#include <concepts>
#include <string_view>

#include "fulgur/concepts/accelerator.hpp"
#include "fulgur/concepts/precision.hpp"
#include "fulgur/concepts/strategy.hpp"

// The messages, one per rule; shared by the static_asserts and by compatibility_reason().
// (A type that is not a policy at all is reported by the member it lacks: see assert_accelerator,
// assert_strategy and assert_precision in concepts/.)
#define FULGUR_MSG_ARGUMENTS_OUT_OF_ORDER \
  "fulgur: the Trainer's arguments are an accelerator, a strategy and a precision, in another order; write Trainer<Accelerator, Strategy, Precision>, e.g. Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision>."
#define FULGUR_MSG_NOT_AN_ACCELERATOR \
  "fulgur: the first Trainer argument is not a fulgur::accelerator; docs/concepts/accelerator.md lists the members it needs."
#define FULGUR_MSG_NOT_A_STRATEGY \
  "fulgur: the second Trainer argument is not a fulgur::strategy; docs/concepts/strategy.md lists the members it needs."
#define FULGUR_MSG_NOT_A_PRECISION \
  "fulgur: the third Trainer argument is not a fulgur::precision; docs/concepts/precision.md lists the members it needs."
#define FULGUR_MSG_STRATEGY_ACCELERATOR \
  "fulgur: this strategy's communication backend cannot carry this accelerator's tensors (NCCL needs CUDAAccelerator; use backend::Gloo on CPU)."
#define FULGUR_MSG_PRECISION_ACCELERATOR \
  "fulgur: this precision policy does not run on this accelerator; pick a precision the accelerator supports."
#define FULGUR_MSG_BF16_SCALER \
  "fulgur: precision 'bf16-mixed' does not use a scaler (bfloat16 has float32's exponent range); use BF16MixedPrecision without a GradScaler."
#define FULGUR_MSG_STRATEGY_PRECISION \
  "fulgur: this strategy does not support this precision (its supports_precision refuses it: see the strategy's header for why); pick another precision."

namespace fulgur {

namespace detail {

template <class T>
constexpr bool supports_accelerator_named(std::string_view accelerator_name) {
  if constexpr (requires(std::string_view n) {
                  { T::supports_accelerator(n) } -> std::convertible_to<bool>;
                })
    return T::supports_accelerator(accelerator_name);
  else
    return true;
}

template <class S>
constexpr bool supports_precision_named(std::string_view precision_name) {
  if constexpr (requires(std::string_view n) {
                  { S::supports_precision(n) } -> std::convertible_to<bool>;
                })
    return S::supports_precision(precision_name);
  else
    return true;
}

template <class P>
constexpr bool uses_scaler() {
  if constexpr (requires { { P::uses_scaler } -> std::convertible_to<bool>; })
    return P::uses_scaler;
  else
    return false;
}
}  // namespace detail

/// Whether precision P scales the loss (its optional `static constexpr bool uses_scaler`; absent:
/// false). '16-mixed' does: its gradients are scaled until unscaled, and a step may be skipped.
template <class P>
inline constexpr bool uses_loss_scaler = detail::uses_scaler<P>();

namespace detail {

enum class compatibility_rule {
  none,
  arguments_out_of_order,
  not_an_accelerator,
  not_a_strategy,
  not_a_precision,
  strategy_accelerator,
  precision_accelerator,
  bf16_scaler,
  strategy_precision,
};

/// Whether X, Y, Z are an accelerator, a strategy and a precision in that order.
template <class X, class Y, class Z, class V>
constexpr bool policies_in_order() {
  return accelerator_for<X, V> && strategy_for<Y, V> && precision_for<Z, V>;
}

/// Whether A, S, P, which are not in Trainer's order, are in another: the policies are right, their order
/// is not (a precision given second would otherwise read as a strategy lacking setup_environment).
template <class A, class S, class P, class V>
constexpr bool policies_in_another_order() {
  return policies_in_order<A, P, S, V>() || policies_in_order<S, A, P, V>() || policies_in_order<S, P, A, V>() ||
         policies_in_order<P, A, S, V>() || policies_in_order<P, S, A, V>();
}

/// Which of the first rules A, S, P break when they are not an accelerator, a strategy and a precision.
template <class A, class S, class P, class V>
constexpr compatibility_rule first_misplaced_policy() {
  if constexpr (policies_in_another_order<A, S, P, V>())
    return compatibility_rule::arguments_out_of_order;
  else if constexpr (!accelerator_for<A, V>)
    return compatibility_rule::not_an_accelerator;
  else if constexpr (!strategy_for<S, V>)
    return compatibility_rule::not_a_strategy;
  else
    return compatibility_rule::not_a_precision;
}

/// The first rule that A, S, P break, checked in order, so later rules may rely on earlier ones.
template <class A, class S, class P, class V>
constexpr compatibility_rule first_broken_rule() {
  if constexpr (!policies_in_order<A, S, P, V>())
    return first_misplaced_policy<A, S, P, V>();  // the other orders are tried only here
  else if constexpr (!supports_accelerator_named<S>(A::name))
    return compatibility_rule::strategy_accelerator;
  else if constexpr (!supports_accelerator_named<P>(A::name))
    return compatibility_rule::precision_accelerator;
  else if constexpr (P::name == std::string_view{"bf16-mixed"} && uses_scaler<P>())
    return compatibility_rule::bf16_scaler;
  else if constexpr (!supports_precision_named<S>(P::name))
    return compatibility_rule::strategy_precision;
  else
    return compatibility_rule::none;
}

}  // namespace detail

/// True when Trainer<A, S, P> can be built (V: the vocabulary, see concepts/vocabulary.hpp).
template <class A, class S, class P, class V = torch_vocabulary>
inline constexpr bool compatible_for =
    detail::first_broken_rule<A, S, P, V>() == detail::compatibility_rule::none;

template <class A, class S, class P>
inline constexpr bool compatible = compatible_for<A, S, P, torch_vocabulary>;

/// Why A, S, P are not compatible, in one sentence; empty when they are.
template <class A, class S, class P, class V = torch_vocabulary>
constexpr std::string_view compatibility_reason() {
  using enum detail::compatibility_rule;
  switch (detail::first_broken_rule<A, S, P, V>()) {
    case arguments_out_of_order: return FULGUR_MSG_ARGUMENTS_OUT_OF_ORDER;
    case not_an_accelerator: return FULGUR_MSG_NOT_AN_ACCELERATOR;
    case not_a_strategy: return FULGUR_MSG_NOT_A_STRATEGY;
    case not_a_precision: return FULGUR_MSG_NOT_A_PRECISION;
    case strategy_accelerator: return FULGUR_MSG_STRATEGY_ACCELERATOR;
    case precision_accelerator: return FULGUR_MSG_PRECISION_ACCELERATOR;
    case bf16_scaler: return FULGUR_MSG_BF16_SCALER;
    case strategy_precision: return FULGUR_MSG_STRATEGY_PRECISION;
    case none: break;
  }
  return {};
}

/// static_asserts compatibility with one message: exactly one error, not a cascade. A type that
/// is not a policy is reported by the first member it lacks (concepts/*.hpp), a broken rule by the
/// rule's own sentence. Returns true either way, so `static_assert(assert_compatible<A, S, P>())` adds no
/// second error of its own.
template <class A, class S, class P, class V = torch_vocabulary>
consteval bool assert_compatible() {
  using enum detail::compatibility_rule;
  constexpr auto rule = detail::first_broken_rule<A, S, P, V>();
  if constexpr (rule == arguments_out_of_order) {
    static_assert(rule != arguments_out_of_order, FULGUR_MSG_ARGUMENTS_OUT_OF_ORDER);
    return true;
  } else if constexpr (rule == not_an_accelerator) {
    return assert_accelerator<A, V>();
  } else if constexpr (rule == not_a_strategy) {
    return assert_strategy<S, V>();
  } else if constexpr (rule == not_a_precision) {
    return assert_precision<P, V>();
  } else {
    static_assert(rule != strategy_accelerator, FULGUR_MSG_STRATEGY_ACCELERATOR);
    static_assert(rule != precision_accelerator, FULGUR_MSG_PRECISION_ACCELERATOR);
    static_assert(rule != bf16_scaler, FULGUR_MSG_BF16_SCALER);
    static_assert(rule != strategy_precision, FULGUR_MSG_STRATEGY_PRECISION);
    return true;
  }
}

}  // namespace fulgur
