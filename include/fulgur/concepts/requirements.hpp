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
#include <concepts>
#include <string_view>

// `requirement` names a concept, which cannot be parenthesized before its template arguments.
#define FULGUR_DETAIL_ALL_OF(requirement, signature) &&requirement<T, V>  // NOLINT(bugprone-macro-parentheses)
#define FULGUR_DETAIL_ENUMERATE(requirement, signature) requirement,
#define FULGUR_DETAIL_FIRST_MISSING(requirement, signature) \
  if constexpr (!requirement<T, V>) return Missing::requirement; else  // NOLINT(bugprone-macro-parentheses)
#define FULGUR_DETAIL_REQUIRE(requirement, signature) \
  static_assert(missing != Missing::requirement, FULGUR_DETAIL_LACKS signature FULGUR_DETAIL_REMEDY);

namespace fulgur::detail {

/// The policy's `static constexpr std::string_view name` (its Lightning string).
template <class T>
concept has_policy_name = requires {
  { T::name } -> std::convertible_to<std::string_view>;
};

}  // namespace fulgur::detail
