#pragma once
// Choosing at run time from the compiled set.
//
// Tools and benchmarks name a combination as strings ("cuda", "single_device", "bf16-mixed").
// fulgur::dispatch maps the three strings onto the compile-time list of compatible combinations
// (the cartesian product of the policy lists, filtered by fulgur::compatible) and calls a generic
// callable with the matching Trainer type. The same list drives typed tests and benchmark matrices.
//
// Names, as Lightning's: accelerator "cpu", "cuda" ("gpu"), "auto"; strategy "single_device", "ddp",
// "deepspeed_stage_1", "deepspeed_stage_2", "fsdp" ("deepspeed_stage_3"), "auto"; precision "32-true",
// "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true" ("32", "64", "16", "bf16"), "auto".
// "auto" resolves as Lightning's _AcceleratorConnector does, among the compiled combinations:
//   accelerator: "cuda" when a CUDA device is available (and the list has CUDA combinations), else "cpu";
//   strategy: "ddp" when the run has more than one process (the `config` argument's devices, as the
//     accelerator parses them, times num_nodes), else "single_device" (the default config: one device);
//   precision: "32-true".
#include <boost/hana/at.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include <cctype>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgur/accelerators/cpu.hpp"
#include "fulgur/accelerators/cuda.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/precision/double.hpp"
#include "fulgur/precision/float.hpp"
#include "fulgur/precision/half.hpp"
#include "fulgur/precision/mixed.hpp"
#include "fulgur/strategies/ddp.hpp"
#include "fulgur/strategies/sharded.hpp"
#include "fulgur/strategies/single_device.hpp"
#include "fulgur/trainer.hpp"

namespace fulgur {

namespace hana = boost::hana;

/// The shipped policies, per axis.
inline constexpr auto shipped_accelerators = hana::tuple_t<CPUAccelerator, CUDAAccelerator>;
inline constexpr auto shipped_strategies = hana::tuple_t<SingleDeviceStrategy, DDPStrategy>;
inline constexpr auto shipped_precisions = hana::tuple_t<FloatPrecision, DoublePrecision, FP16MixedPrecision,
                                                         BF16MixedPrecision, FP16TruePrecision, BF16TruePrecision>;
/// The sharded strategies ("deepspeed_stage_1", "deepspeed_stage_2", "fsdp"). Not in shipped_strategies,
/// so that a program dispatching over shipped_trainers compiles 24 fit loops, not 54; a program that runs
/// them dispatches over a list that has them, e.g.
///   compatible_trainers(shipped_accelerators, shipped_sharded_strategies, shipped_precisions)
/// (compatible_trainers keeps the compatible triples only, as for the other strategies).
inline constexpr auto shipped_sharded_strategies = hana::tuple_t<ShardedStrategy<1>, ShardedStrategy<2>, ShardedStrategy<3>>;

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
/// Lightning's aliases: "gpu" -> "cuda"; "deepspeed_stage_3" -> "fsdp" (ShardedStrategy<3>); "32" -> "32-true",
/// "64" -> "64-true", "16" -> "16-mixed", "bf16" -> "bf16-mixed"; precision "auto" -> "32-true".
inline std::string_view canonical_accelerator(std::string_view name) { return name == "gpu" ? "cuda" : name; }
inline std::string_view canonical_strategy(std::string_view name) {
  return name == "deepspeed_stage_3" ? "fsdp" : name;
}
inline std::string_view canonical_precision(std::string_view name) {
  if (name == "32" || name == "auto") return "32-true";
  if (name == "64") return "64-true";
  if (name == "16") return "16-mixed";
  if (name == "bf16") return "bf16-mixed";
  return name;
}

/// T appended to a type_list unless it is there; the distinct types of a pack, in first-seen order.
template <class List, class T>
struct append_unique;
template <class... U, class T>
struct append_unique<type_list<U...>, T> {
  using type = std::conditional_t<(std::is_same_v<T, U> || ...), type_list<U...>, type_list<U..., T>>;
};
template <class List, class... T>
struct unique_types {
  using type = List;
};
template <class List, class T, class... Rest>
struct unique_types<List, T, Rest...> : unique_types<typename append_unique<List, T>::type, Rest...> {};

/// The distinct accelerators, strategies and precisions of a list of Trainer types.
template <class Trainers>
struct axes_of;
template <class... T>
struct axes_of<type_list<T...>> {
  using accelerators = typename unique_types<type_list<>, typename T::accelerator_type...>::type;
  using strategies = typename unique_types<type_list<>, typename T::strategy_type...>::type;
  using precisions = typename unique_types<type_list<>, typename T::precision_type...>::type;
};

template <class... X>
bool has_name(type_list<X...>, std::string_view name) {
  return ((X::name == name) || ...);
}
template <class... X>
std::string names_of(type_list<X...>) {
  std::string out;
  ((out += (out.empty() ? "'" : ", '") + std::string(X::name) + "'"), ...);
  return out;
}

/// compatibility_reason for the triple the names pick among the axes' types (each name matches one type).
template <class A, class S, class... P>
std::string_view reason_over_precisions(type_list<P...>, std::string_view precision) {
  std::string_view reason;
  ((P::name == precision ? (reason = compatibility_reason<A, S, P>(), 0) : 0), ...);
  return reason;
}
template <class A, class Precisions, class... S>
std::string_view reason_over_strategies(type_list<S...>, Precisions precisions, std::string_view strategy,
                                        std::string_view precision) {
  std::string_view reason;
  ((S::name == strategy ? (reason = reason_over_precisions<A, S>(precisions, precision), 0) : 0), ...);
  return reason;
}
template <class Strategies, class Precisions, class... A>
std::string_view combination_reason(type_list<A...>, Strategies strategies, Precisions precisions,
                                    std::string_view accelerator, std::string_view strategy, std::string_view precision) {
  std::string_view reason;
  ((A::name == accelerator ? (reason = reason_over_strategies<A>(strategies, precisions, strategy, precision), 0) : 0),
   ...);
  return reason;
}

/// Processes a run of `config` has on accelerator A: its devices as A parses them, times num_nodes.
template <class... A>
std::size_t process_count(type_list<A...>, std::string_view accelerator, const TrainerConfig& config) {
  std::size_t devices = 1;
  ((A::name == accelerator
        ? (devices = std::visit([](const auto& d) { return A::parse_devices(d).size(); }, config.devices), 0)
        : 0),
   ...);
  return devices * static_cast<std::size_t>(config.num_nodes > 1 ? config.num_nodes : 1);
}

/// " (also 'gpu' for 'cuda', and 'auto')": the aliases whose names this program compiled, each with what
/// it stands for, and 'auto' (`autos` says what 'auto' is, when it is one name).
template <class Names>
std::string aliases_of(Names names, std::initializer_list<std::pair<std::string_view, std::string_view>> aliases,
                       std::string_view autos = {}) {
  std::vector<std::string> parts;
  for (const auto& [alias, target] : aliases)
    if (has_name(names, target)) parts.push_back("'" + std::string(alias) + "' for '" + std::string(target) + "'");
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  out += (out.empty() ? "" : ", and ") + std::string("'auto'") +
         (autos.empty() || !has_name(names, autos) ? "" : " for '" + std::string(autos) + "'");
  return " (also " + out + ")";
}

/// One axis' name that no compiled combination has: which axis, what the program compiled, for a name fulgur
/// ships how to compile it, and for another the name of `names` (every name fulgur knows on that axis, and
/// its aliases) probably meant (src/dispatch_names.cpp).
std::string unknown_name(std::string_view axis, std::string_view given, std::string_view resolved,
                         const std::string& compiled, bool shipped, std::string_view aliases,
                         std::span<const std::string_view> names);

/// The name a user probably meant on an axis ("accelerator", "strategy", "precision"): a name from elsewhere
/// ("fp16", "ddp_spawn"), with a word on it where the spelling is ambiguous, or the one of `names` a
/// misspelling is closest to; empty when none is close (also fulgur::cli's "did you mean").
struct MeantName {
  std::string_view name{}, aside{};
};
MeantName probably_meant(std::string_view axis, std::string_view given, std::span<const std::string_view> names);

template <class... X>
void append_names(type_list<X...>, std::vector<std::string_view>& names) {
  (names.push_back(X::name), ...);
}
}  // namespace detail

/// Calls f(hana::type_c<Trainer<A, S, P>>) for the compiled combination the strings name, and returns
/// its result. "auto" resolves as the header says; `config` (the TrainerConfig the Trainer will be built
/// with) gives the devices and nodes that strategy "auto" counts. A name no compiled combination has is a
/// MisconfigurationError naming its axis and that axis's names; a combination of valid names that is not
/// compiled names the compatibility rule it breaks (if any) and lists the valid combinations.
template <class F, class Trainers = std::remove_const_t<decltype(shipped_trainers)>>
auto dispatch(std::string_view accelerator, std::string_view strategy, std::string_view precision, F&& f,
              Trainers trainers = shipped_trainers, const TrainerConfig& config = {}) {
  using First = typename decltype(+hana::at_c<0>(trainers))::type;
  using Result = decltype(f(hana::type_c<First>));
  using Axes = detail::axes_of<typename detail::types_of<Trainers>::type>;
  using ShippedStrategies = typename detail::concat<typename detail::types_of<std::remove_cvref_t<decltype(shipped_strategies)>>::type,
                                                    typename detail::types_of<std::remove_cvref_t<decltype(shipped_sharded_strategies)>>::type>::type;
  const std::string_view given_accelerator = accelerator, given_strategy = strategy, given_precision = precision;
  accelerator = detail::canonical_accelerator(accelerator);
  if (accelerator == "auto")
    accelerator = detail::has_name(typename Axes::accelerators{}, "cuda") && CUDAAccelerator::is_available() ? "cuda" : "cpu";
  std::string lowered(strategy);  // strategy names in any case, as Lightning's Trainer(strategy="DDP")
  for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  strategy = detail::canonical_strategy(lowered);
  precision = detail::canonical_precision(precision);
  const bool accelerator_known = detail::has_name(typename Axes::accelerators{}, accelerator);
  if (strategy == "auto")
    strategy = accelerator_known && detail::process_count(typename Axes::accelerators{}, accelerator, config) > 1
                   ? "ddp"
                   : "single_device";
  std::string unknown;
  auto axis = [&](bool known, std::string_view name, std::string_view given, std::string_view resolved, auto compiled,
                  auto shipped, std::string_view aliases, std::initializer_list<std::string_view> alias_names) {
    if (known) return;
    std::vector<std::string_view> names(alias_names);  // what a misspelling is compared with
    detail::append_names(compiled, names);
    detail::append_names(shipped, names);
    unknown += (unknown.empty() ? "" : " ") + detail::unknown_name(name, given, resolved, detail::names_of(compiled),
                                                                   detail::has_name(shipped, resolved), aliases, names);
  };
  using ShippedAccelerators = typename detail::types_of<std::remove_cvref_t<decltype(shipped_accelerators)>>::type;
  using ShippedPrecisions = typename detail::types_of<std::remove_cvref_t<decltype(shipped_precisions)>>::type;
  axis(accelerator_known, "accelerator", given_accelerator, accelerator, typename Axes::accelerators{},
       ShippedAccelerators{}, detail::aliases_of(typename Axes::accelerators{}, {{"gpu", "cuda"}}), {"gpu", "auto"});
  axis(detail::has_name(typename Axes::strategies{}, strategy), "strategy", given_strategy, strategy,
       typename Axes::strategies{}, ShippedStrategies{},
       detail::aliases_of(typename Axes::strategies{}, {{"deepspeed_stage_3", "fsdp"}}), {"deepspeed_stage_3", "auto"});
  axis(detail::has_name(typename Axes::precisions{}, precision), "precision", given_precision, precision,
       typename Axes::precisions{}, ShippedPrecisions{},
       detail::aliases_of(typename Axes::precisions{}, {{"32", "32-true"}, {"64", "64-true"}, {"16", "16-mixed"}, {"bf16", "bf16-mixed"}},
                          "32-true"),
       {"32", "64", "16", "bf16", "auto"});
  if (!unknown.empty()) throw MisconfigurationError("fulgur::dispatch: " + unknown);

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
  if (!result) {
    const std::string_view reason =
        detail::combination_reason(typename Axes::accelerators{}, typename Axes::strategies{},
                                   typename Axes::precisions{}, accelerator, strategy, precision);
    throw MisconfigurationError("fulgur::dispatch: no compiled combination is accelerator='" + std::string(accelerator) +
                                "', strategy='" + std::string(strategy) + "', precision='" + std::string(precision) +
                                "': " +
                                (reason.empty() ? std::string("this program did not compile it (add it to the Trainer "
                                                              "types given to dispatch)")
                                                : std::string(reason)) +
                                " The valid ones (accelerator/strategy/precision) are: " + valid + ".");
  }
  if constexpr (!std::is_void_v<Result>) return *std::move(result);
}

}  // namespace fulgur
