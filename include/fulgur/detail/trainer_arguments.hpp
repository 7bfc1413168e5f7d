#pragma once
// What fulgur::Trainer's declaration needs before the class: a strategy's options type, the object
// behind a module holder or a loader pointer, the callback set with its default ProgressBar, and the
// one static_assert for arguments the rules refuse (include/fulgur/trainer.hpp).
#include <cstddef>
#include <string>
#include <type_traits>

#include "fulgur/callbacks/callback_set.hpp"
#include "fulgur/callbacks/progress_bar.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/concepts/callback.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur {

/// The options of a strategy that declares none.
struct NoStrategyOptions {};

namespace detail {

template <class S>
struct strategy_options {
  using type = NoStrategyOptions;
};
template <class S>
  requires requires { typename S::options_type; }
struct strategy_options<S> {
  using type = typename S::options_type;
};

/// The object behind a std::shared_ptr/unique_ptr, a TORCH_MODULE holder, or a plain reference.
template <class T>
decltype(auto) referent(T& object) {
  if constexpr (requires { object.ptr(); *object; } ||  // torch::nn::ModuleHolder
                requires { object.get(); *object; })     // smart pointer
    return *object;
  else
    return (object);
}

/// The range behind a std::unique_ptr/shared_ptr to a loader (torch::data::make_data_loader), or the range itself.
template <class D>
decltype(auto) range_ref(D& data) {
  if constexpr (requires { data.get(); *data; data->begin(); })
    return *data;
  else
    return (data);
}

/// Throws a MisconfigurationError naming the first field that cannot work and the fix.
void validate_config(const TrainerConfig& config);

inline TrainerConfig validated(TrainerConfig config) {
  validate_config(config);
  return config;
}

/// The callbacks of Trainer<A, S, P, Callbacks...>: those given, plus a ProgressBar when none of
/// them is one (Lightning adds its progress bar too; TrainerConfig::enable_progress_bar turns it off).
template <class T>
constexpr bool is_progress_bar() {
  if constexpr (requires { T::is_progress_bar; })
    return static_cast<bool>(T::is_progress_bar);
  else
    return false;
}
template <class... Callbacks>
using callback_set_for = std::conditional_t<(is_progress_bar<Callbacks>() || ...), CallbackSet<Callbacks...>,
                                            CallbackSet<Callbacks..., ProgressBar>>;

/// One static_assert for the first thing wrong with a Trainer's arguments.
template <class A, class S, class P, class... Callbacks>
constexpr bool assert_trainer_arguments() {
  if constexpr (!compatible<A, S, P>)
    return assert_compatible<A, S, P>();
  else if constexpr (!(callback<Callbacks> && ...))
    return (assert_callback<Callbacks>() && ...);
  else
    return assert_loggers_for<Callbacks...>();  // LearningRateMonitor without a logger
}

/// A value of any type, for the inert Trainer's members (never evaluated): it converts to anything,
/// and is a range and indexable, so that the code using a refused Trainer's results adds no error.
struct inert {
  template <class T>
  operator T() const;
  template <class I>
  inert operator[](const I&) const {
    return {};
  }
  const inert* begin() const { return this; }
  const inert* end() const { return this; }
  std::size_t size() const { return 0; }
  bool empty() const { return true; }
};

}  // namespace detail

}  // namespace fulgur
