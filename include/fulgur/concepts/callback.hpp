#pragma once
// What makes a type a callback or a logger for fulgur::Trainer<A, S, P, Callbacks...> (torch-free).
//
// A callback is any class with at least one member named after a hook fulgur calls on callbacks
// (Lightning's Callback hooks); a logger is a class with `log_metrics`. Both are found by name, so
// a type whose every member is misspelt (`on_train_epoch_ends`) is refused at compile time
// instead of being silently never called. A member with a hook's name that cannot be called with
// that hook's arguments is a separate error, raised where the hook is called (hooks.hpp).
#include <concepts>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "fulgur/concepts/requirements.hpp"
#include "fulgur/profilers/profiler.hpp"

// Every hook fulgur calls on callbacks, in no particular order (docs/callbacks.md gives each
// signature and when it runs).
#define FULGUR_CALLBACK_HOOK_NAMES(X)                                                                     \
  X(setup) X(teardown) X(on_fit_start) X(on_fit_end) X(on_sanity_check_start) X(on_sanity_check_end)     \
  X(on_exception) X(on_train_start) X(on_train_end) X(on_train_epoch_start) X(on_train_epoch_end)        \
  X(on_train_batch_start) X(on_train_batch_end) X(on_before_zero_grad) X(on_before_backward)             \
  X(on_after_backward) X(on_before_optimizer_step) X(on_validation_start) X(on_validation_end)           \
  X(on_validation_epoch_start) X(on_validation_epoch_end) X(on_validation_batch_start)                   \
  X(on_validation_batch_end) X(on_test_start) X(on_test_end) X(on_test_epoch_start) X(on_test_epoch_end) \
  X(on_test_batch_start) X(on_test_batch_end) X(on_predict_start) X(on_predict_end)                      \
  X(on_predict_epoch_start) X(on_predict_epoch_end) X(on_predict_batch_start) X(on_predict_batch_end)      \
  X(on_save_checkpoint) X(on_load_checkpoint)

namespace fulgur {

class LearningRateMonitor;  // callbacks/learning_rate_monitor.hpp
class DeviceStatsMonitor;   // callbacks/device_stats_monitor.hpp
namespace detail {

// A callback is found by the names of its members (concepts/requirements.hpp: FULGUR_DETAIL_MEMBER_PROBE).
FULGUR_CALLBACK_HOOK_NAMES(FULGUR_DETAIL_MEMBER_PROBE)
FULGUR_DETAIL_MEMBER_PROBE(log_metrics)

template <class T>
constexpr bool names_a_callback_hook() {
#define FULGUR_DETAIL_HAS(name) || has_member_##name<T>()
  return false FULGUR_CALLBACK_HOOK_NAMES(FULGUR_DETAIL_HAS);
#undef FULGUR_DETAIL_HAS
}

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {
  using element = T;
};

}  // namespace detail

/// A logger: receives metrics (log_metrics(metrics, step)); see docs/loggers.md.
template <class T>
concept logger = detail::has_member_log_metrics<T>();

/// A callback: defines at least one of the hooks fulgur calls on callbacks (a final class is
/// accepted as it is). A std::vector of callbacks (e.g. of AnyCallback) is one too, and so is a
/// profiler (fulgur/profilers/profiler.hpp), which the Trainer takes among its callbacks.
template <class T>
concept callback = std::is_class_v<T> &&
                   (std::is_final_v<T> || detail::names_a_callback_hook<T>() || logger<T> || profiler<T> ||
                    (detail::is_vector<T>::value && requires { typename detail::is_vector<T>::element; }));

/// One error for a Trainer argument that is neither a callback nor a logger (true otherwise).
template <class T>
constexpr bool assert_callback() {
  static_assert(callback<T>,
                "fulgur: a callback given to Trainer (its fourth and later arguments) defines none of the hooks "
                "fulgur calls on callbacks, and no log_metrics: misspelt? docs/callbacks.md lists every hook with "
                "its signature.");
  return true;  // the static_assert above is the one error
}

/// The callback a Trainer makes itself when it is built without callback arguments (Trainer(config)):
/// one error, not a page of constructor overloads, for a callback that needs arguments (EarlyStopping:
/// its monitor).
template <class C>
C default_callback() {
  constexpr bool default_constructible = std::default_initializable<C>;  // (a bool: no page of concept notes)
  static_assert(default_constructible,
                "fulgur: a callback among the Trainer's template arguments (the `C = ...` of this error's context) "
                "has no default constructor, so Trainer(config) cannot make it: pass it to the constructor: "
                "Trainer(config, callbacks...), e.g. Trainer<A, S, P, EarlyStopping>(config, "
                "EarlyStopping({.monitor = \"val_loss\"})).");
  if constexpr (default_constructible)
    return C{};
  else
    std::abort();  // never compiled into a program: the static_assert above stopped the build
}

/// A callback that only works with a logger declares `static constexpr bool needs_logger = true;`
/// (LearningRateMonitor: it sends its values to the loggers).
template <class T>
constexpr bool needs_logger() {
  if constexpr (requires { T::needs_logger; })
    return static_cast<bool>(T::needs_logger);
  else
    return false;
}

namespace detail {
template <class T>
struct element_of {
  using type = T;
};
template <class T, class A>
struct element_of<std::vector<T, A>> {  // a std::vector of callbacks: its element type
  using type = T;
};
}  // namespace detail

/// One error when a callback of the Trainer needs a logger and none of its arguments is one
/// (Lightning raises it when fit starts; the callback list is a type list, so here it is a compile
/// error). A callback inside an AnyCallback is not seen: its own run-time check stays.
template <class... Callbacks>
constexpr bool assert_loggers_for() {
  constexpr bool has_loggers = (logger<typename detail::element_of<Callbacks>::type> || ...);
  constexpr bool needs = (needs_logger<typename detail::element_of<Callbacks>::type>() || ...);
  // Lightning's text for its two callbacks that need one; one error, naming the callback in question.
  constexpr bool lr = (std::is_same_v<typename detail::element_of<Callbacks>::type, LearningRateMonitor> || ...);
  constexpr bool stats = (std::is_same_v<typename detail::element_of<Callbacks>::type, DeviceStatsMonitor> || ...);
  static_assert(has_loggers || !lr,
                "Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger. (fulgur: add a logger "
                "to the Trainer's arguments, e.g. fulgur::CSVLogger or fulgur::TensorBoardLogger.)");
  static_assert(has_loggers || lr || !stats,
                "Cannot use `DeviceStatsMonitor` callback with `Trainer` that has no logger. (fulgur: add a logger "
                "to the Trainer's arguments, e.g. fulgur::CSVLogger or fulgur::TensorBoardLogger.)");
  static_assert(has_loggers || lr || stats || !needs,
                "fulgur: a callback that declares `static constexpr bool needs_logger = true;` is given to a Trainer "
                "that has no logger: add one to the Trainer's arguments, e.g. fulgur::CSVLogger.");
  return true;
}

/// Whether a callback runs its on_train_epoch_end after the module's (Lightning runs EarlyStopping
/// and ModelCheckpoint there, so that they see what the module logged): declare
/// `static constexpr bool monitoring = true;`.
template <class T>
constexpr bool monitoring_callback() {
  if constexpr (requires { T::monitoring; })
    return static_cast<bool>(T::monitoring);
  else
    return false;
}

/// Whether a callback's state records the files it wrote (ModelCheckpoint: its top k, its last
/// file): declare `static constexpr bool state_records_files = true;`. The checkpoints written after
/// a stop inside an epoch (max_steps, max_time, a stop request) carry the callbacks' states from
/// before the stop's epoch end, so that the epoch's real end counts once, and such a callback's state
/// as it is: a record of files from before would leave the stop's files outside it (resumed,
/// "last-v1.ckpt" beside the stop's "last.ckpt", and a top-k file never pruned).
template <class T>
constexpr bool records_files_callback() {
  if constexpr (requires { T::state_records_files; })
    return static_cast<bool>(T::state_records_files);
  else
    return false;
}

}  // namespace fulgur
