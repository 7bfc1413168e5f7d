#pragma once
// Choosing at run time from the compiled set.
//
// Tools and benchmarks name a combination as strings ("cuda", "single_device", "bf16-mixed").
// fulgur::dispatch maps the three strings onto the compile-time list of compatible combinations
// (the cartesian product of the policy lists, filtered by fulgur::compatible) and calls a generic
// callable with the matching Trainer type. The same list drives typed tests and benchmark matrices.
#include <boost/hana/at.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "fulgur/accelerators/cpu.hpp"
#include "fulgur/accelerators/cuda.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/precision/double.hpp"
#include "fulgur/precision/float.hpp"
#include "fulgur/precision/half.hpp"
#include "fulgur/precision/mixed.hpp"
#include "fulgur/strategies/ddp.hpp"
#include "fulgur/strategies/single_device.hpp"
#include "fulgur/trainer.hpp"

namespace fulgur {

namespace hana = boost::hana;

/// The shipped policies, per axis.
inline constexpr auto shipped_accelerators = hana::tuple_t<CPUAccelerator, CUDAAccelerator>;
inline constexpr auto shipped_strategies = hana::tuple_t<SingleDeviceStrategy, DDPStrategy>;
inline constexpr auto shipped_precisions = hana::tuple_t<FloatPrecision, DoublePrecision, FP16MixedPrecision,
                                                         BF16MixedPrecision, FP16TruePrecision, BF16TruePrecision>;

namespace detail {
template <class... T>
struct type_list {};
template <class... Lists>
struct concat {
  using type = type_list<>;
};
template <class... T>
struct concat<type_list<T...>> {
  using type = type_list<T...>;
};
template <class... A, class... B, class... Rest>
struct concat<type_list<A...>, type_list<B...>, Rest...> : concat<type_list<A..., B...>, Rest...> {};

/// The types of a hana::tuple_t<...>.
template <class Tuple>
struct types_of;
template <class... T>
struct types_of<hana::tuple<T...>> {
  using type = type_list<typename T::type...>;
};

/// Trainer<A, S, P> for each compatible triple, in cartesian order (accelerator, strategy, precision).
template <class A, class S, class P>
using trainer_if_compatible = std::conditional_t<compatible<A, S, P>, type_list<Trainer<A, S, P>>, type_list<>>;
template <class A, class S, class Precisions>
struct trainers_over_precisions;
template <class A, class S, class... P>
struct trainers_over_precisions<A, S, type_list<P...>> : concat<trainer_if_compatible<A, S, P>...> {};
template <class A, class Strategies, class Precisions>
struct trainers_over_strategies;
template <class A, class... S, class Precisions>
struct trainers_over_strategies<A, type_list<S...>, Precisions>
    : concat<typename trainers_over_precisions<A, S, Precisions>::type...> {};
template <class Accelerators, class Strategies, class Precisions>
struct trainers_over;
template <class... A, class Strategies, class Precisions>
struct trainers_over<type_list<A...>, Strategies, Precisions>
    : concat<typename trainers_over_strategies<A, Strategies, Precisions>::type...> {};

template <class... T>
constexpr auto as_hana_types(type_list<T...>) {
  return hana::tuple_t<T...>;
}
}  // namespace detail

/// Every compatible combination of the given policy lists (hana::tuple_t), each as
/// hana::type<Trainer<A, S, P>>, in the order of hana::cartesian_product (accelerator, then strategy,
/// then precision). Computed with plain type lists rather than Hana's cartesian_product + filter:
/// every TU that includes fulgur.hpp evaluates shipped_trainers, and this costs it a few class
/// instantiations instead of about a second.
template <class Accelerators, class Strategies, class Precisions>
constexpr auto compatible_trainers(Accelerators, Strategies, Precisions) {
  return detail::as_hana_types(typename detail::trainers_over<typename detail::types_of<Accelerators>::type,
                                                              typename detail::types_of<Strategies>::type,
                                                              typename detail::types_of<Precisions>::type>::type{});
}

inline constexpr auto shipped_trainers =
    compatible_trainers(shipped_accelerators, shipped_strategies, shipped_precisions);

/// The same list as a std::tuple of types (for Catch's TEMPLATE_LIST_TEST_CASE and the like).
template <auto Trainers>
using trainer_tuple_t = typename decltype(hana::unpack(Trainers, [](auto... t) {
  return hana::type_c<std::tuple<typename decltype(t)::type...>>;
}))::type;

namespace detail {
/// Lightning's aliases: "gpu" -> "cuda"; "32" -> "32-true", "64" -> "64-true", "16" -> "16-mixed", "bf16" -> "bf16-mixed".
inline std::string_view canonical_accelerator(std::string_view name) { return name == "gpu" ? "cuda" : name; }
inline std::string_view canonical_precision(std::string_view name) {
  if (name == "32") return "32-true";
  if (name == "64") return "64-true";
  if (name == "16") return "16-mixed";
  if (name == "bf16") return "bf16-mixed";
  return name;
}
}  // namespace detail

/// Calls f(hana::type_c<Trainer<A, S, P>>) for the compiled combination the strings name, and returns
/// its result. An unknown or incompatible choice is a MisconfigurationError listing the valid ones.
template <class F, class Trainers = std::remove_const_t<decltype(shipped_trainers)>>
auto dispatch(std::string_view accelerator, std::string_view strategy, std::string_view precision, F&& f,
                        Trainers trainers = shipped_trainers) {
  using First = typename decltype(+hana::at_c<0>(trainers))::type;
  using Result = decltype(f(hana::type_c<First>));
  accelerator = detail::canonical_accelerator(accelerator);
  precision = detail::canonical_precision(precision);
  std::conditional_t<std::is_void_v<Result>, bool, std::optional<Result>> result{};
  std::string valid;
  hana::for_each(trainers, [&](auto trainer) {
    using T = typename decltype(trainer)::type;
    using A = typename T::accelerator_type;
    using S = typename T::strategy_type;
    using P = typename T::precision_type;
    valid += (valid.empty() ? "" : ", ") + T::combination_name();
    if (A::name != accelerator || S::name != strategy || P::name != precision || result) return;
    if constexpr (std::is_void_v<Result>) {
      f(trainer);
      result = true;
    } else {
      result.emplace(f(trainer));
    }
  });
  if (!result)
    throw MisconfigurationError("fulgur::dispatch: no compiled combination is accelerator='" + std::string(accelerator) +
                                "', strategy='" + std::string(strategy) + "', precision='" + std::string(precision) +
                                "'. The valid ones (accelerator/strategy/precision) are: " + valid + ".");
  if constexpr (!std::is_void_v<Result>) return *std::move(result);
}

}  // namespace fulgur
