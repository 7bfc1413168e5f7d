#pragma once
// The machinery behind a policy concept and its diagnosis. Torch-free.
//
// A policy header lists its requirements once, in order, as a table of
// (one-member concept, the member's signature as the user writes it):
//
//   #define FULGUR_STRATEGY_REQUIREMENTS(R)
//     R(strategy_has_name, "static constexpr std::string_view name")
//     R(strategy_has_optimizer_step, "bool optimizer_step(torch::optim::Optimizer&, Precision&)")
//
// (each line but the last ending in a backslash)
//
// and the table gives three things:
//   - the concept: every requirement together (FULGUR_DETAIL_ALL_OF);
//   - an enumeration of the requirements (FULGUR_DETAIL_ENUMERATE) and the first one a type
//     misses (FULGUR_DETAIL_FIRST_MISSING), so a check can stop at it;
//   - one static_assert per requirement whose message names the member (FULGUR_DETAIL_REQUIRE),
//     of which only the first missing one fires: one error that says what to write, not a cascade.
// Inside these expansions the policy type is `T` and the vocabulary `V`.
//
// A policy's optional members (those fulgur calls only when a type has them) are a second table of
// the same shape, whose concepts read "absent, or present with this signature": a member named after
// an optional one but not callable as fulgur calls it is then the one error that names it, where a
// bare `requires` would fall back to the default without a word (a misspelt signature never called).
// Names are found with FULGUR_DETAIL_MEMBER_PROBE, whatever kind of member has them.
#include <concepts>
#include <string_view>
#include <type_traits>

// `requirement` names a concept, which cannot be parenthesized before its template arguments.
#define FULGUR_DETAIL_ALL_OF(requirement, signature) &&requirement<T, V>  // NOLINT(bugprone-macro-parentheses)
#define FULGUR_DETAIL_ENUMERATE(requirement, signature) requirement,
#define FULGUR_DETAIL_FIRST_MISSING(requirement, signature) \
  if constexpr (!requirement<T, V>) return Missing::requirement; else  // NOLINT(bugprone-macro-parentheses)
#define FULGUR_DETAIL_REQUIRE(requirement, signature) \
  static_assert(missing != Missing::requirement, FULGUR_DETAIL_LACKS signature FULGUR_DETAIL_REMEDY);

// Whether T has a member of a given name, of any kind (function, overload set, template, data):
// a class derived from T and from a probe with an `int name` makes `&Derived::name` ambiguous
// exactly when T has one too. A final class cannot be derived from: its member is found when its
// address can be taken (one function or data member, public); an overload set or a template in a
// final class is not seen. Expand it in a namespace of its own per use, so that two headers may probe
// one name.
#define FULGUR_DETAIL_MEMBER_PROBE(name)                                                  \
  struct probe_##name {                                                                   \
    int name;                                                                             \
  };                                                                                      \
  template <class T>                                                                      \
  struct probed_##name : T, probe_##name {};                                              \
  template <class T>                                                                      \
  constexpr bool has_member_##name() {                                                    \
    if constexpr (!std::is_class_v<T>)                                                    \
      return false;                                                                       \
    else if constexpr (std::is_final_v<T>)                                                \
      return requires { &T::name; };                                                      \
    else                                                                                  \
      return !requires { &probed_##name<T>::name; };                                      \
  }

namespace fulgur::detail {

/// The policy's `static constexpr std::string_view name` (its Lightning string).
template <class T>
concept has_policy_name = requires {
  { T::name } -> std::convertible_to<std::string_view>;
};

}  // namespace fulgur::detail
