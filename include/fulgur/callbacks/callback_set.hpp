#pragma once
// The callbacks and loggers of a Trainer<A, S, P, Callbacks...>, held by value in the order given.
// A hook reaches each callback that defines it with a direct call chosen at compile time; a
// callback without the hook costs nothing, and a Trainer without callbacks has no code here at all.
// A std::vector of callbacks (e.g. std::vector<AnyCallback>) is called element by element.
#include <c10/util/Type.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <exception>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <vector>
#include <utility>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/concepts/callback.hpp"
#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/hooks.hpp"
#include "fulgur/loggers/hyperparameters.hpp"
#include "fulgur/loggers/log_directory.hpp"
#include "fulgur/profilers/profiler.hpp"
#include "fulgur/results.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur {

namespace detail {

template <class T>
struct callback_element {
  using type = T;
};
template <class T, class A>
struct callback_element<std::vector<T, A>> {
  using type = T;
};

template <class C>
concept adds_hyperparameters = requires(const C& c) { c.hyperparameters(); };

/// The index of the first profiler among Ts (sizeof...(Ts) if none).
template <class... Ts>
constexpr std::size_t profiler_index() {
  constexpr bool is[] = {fulgur::profiler<Ts>..., false};
  std::size_t i = 0;
  while (i < sizeof...(Ts) && !is[i]) ++i;
  return i;
}

template <class... Ts>
class CallbackSet {
 public:
  CallbackSet() = default;
  explicit CallbackSet(Ts... items)
    requires(sizeof...(Ts) > 0)
      : items_(std::move(items)...) {
    check_state_keys();
  }

  // A callback with a member of the hook's name that cannot take the call is reached too: the call
  // is then the compile error that names the hook (never a hook silently not called).
  template <class Hook, class Module, class... Args>
  static constexpr bool reached_by =
      ((Hook::template callback_named<typename callback_element<Ts>::type> ||
        Hook::template callback_defines<typename callback_element<Ts>::type, Module, Args...>) ||
       ...);
  static constexpr bool has_loggers = (logger<typename callback_element<Ts>::type> || ...);
  /// Some callback adds hyper-parameters for the loggers (hyperparameters() const), e.g. fulgur::cli's
  /// resolved config.
  static constexpr bool provides_hyperparameters = (adds_hyperparameters<typename callback_element<Ts>::type> || ...);
  /// The Trainer's profiler, if one of its arguments is one (at most one: Lightning's `profiler=`).
  static constexpr std::size_t profiler_count = (std::size_t{0} + ... + std::size_t{fulgur::profiler<Ts>});
  static_assert(profiler_count <= 1,
                "fulgur: a Trainer takes one profiler (Lightning's `profiler=` argument); two of its arguments are "
                "profilers. Keep one (SimpleProfiler or TorchProfiler).");
  static_assert(!(fulgur::profiler<typename callback_element<Ts>::type> || ...) || (fulgur::profiler<Ts> || ...),
                "fulgur: a profiler is given to the Trainer on its own, not in a std::vector.");
  static constexpr bool has_profiler = profiler_count == 1;

  template <hooks::CallbackGroup group, class Hook, class Module, class... Args>
  void call(Hook hook, TrainerView& view, Module& module, Args&... args) {
    std::apply([&](auto&... item) { (call_one<group>(item, hook, view, module, args...), ...); }, items_);
  }
  /// A batch hook under several evaluation loaders: each callback whose hook takes dataloader_idx
  /// after Lightning's arguments gets it; the others are called as with one loader.
  template <class Hook, class Module, class... Args>
  void call_with_dataloader_idx(Hook hook, TrainerView& view, Module& module, std::int64_t& dataloader_idx,
                                Args&... args) {
    std::apply([&](auto&... item) { (call_one_with_idx(item, hook, view, module, dataloader_idx, args...), ...); },
               items_);
  }
  /// The same on the way out of a failed run: every callback is called even if one throws; what one
  /// throws goes to `failed` (the run's own error is the one that reaches the caller).
  template <class Hook, class Module, class Failed, class... Args>
  void call_guarded(Hook hook, TrainerView& view, Module& module, Failed&& failed, Args&... args) {
    std::apply([&](auto&... item) {
      ([&] {
        try {
          call_one<hooks::CallbackGroup::all>(item, hook, view, module, args...);
        } catch (const std::exception& e) {
          failed(e);
        }
      }(), ...);
    }, items_);
  }

  // ---- the profiler ---------------------------------------------------------------------------------
  auto& profiler()
    requires has_profiler
  {
    return std::get<profiler_index<Ts...>()>(items_);
  }
  /// A stage starts (after the loggers are set up: a profiler without a dirpath writes in their log_dir).
  void set_up_profiler(const ProfilerSetup& setup) {
    if constexpr (has_profiler) {
      profiling::start_run_generation();  // callbacks' action names are made afresh for this run
      if constexpr (requires { profiler().set_up(setup); }) profiler().set_up(setup);
    }
  }
  /// The stage ended: the profiler reports.
  void describe_profiler() {
    if constexpr (has_profiler)
      if constexpr (requires { profiler().describe(); }) profiler().describe();
  }
  /// Times `action` for the returned scope's life (nothing without a profiler).
  template <class MakeAction>
  auto profile(MakeAction&& make_action) {
    if constexpr (has_profiler) return profiling::Scope(profiler(), make_action());
    else return profiling::NoScope{};
  }

  /// Appends what callbacks and loggers reported on their own while the run went on (take_warnings():
  /// e.g. a tracking server that stopped answering), for FitResult::warnings; already printed by them.
  void collect_warnings(std::vector<std::string>& into) {
    for_each_item([&](auto& item) {
      if constexpr (requires { item.take_warnings(); })
        for (std::string& warning : item.take_warnings()) into.push_back(std::move(warning));
    });
  }

  // ---- loggers ----------------------------------------------------------------------------------
  /// Resolves every logger's directory before any writes (loggers sharing a name share the
  /// version); two loggers of one type in one directory would overwrite each other: an error.
  void set_up_loggers(const LoggerSetup& setup) {
    std::vector<std::pair<const std::type_info*, std::string>> claimed;
    for_each_logger([&](auto& logger) {
      if constexpr (requires { logger.set_up(setup); }) logger.set_up(setup);
      if constexpr (requires { logger.log_dir(); }) {
        const auto* type = &typeid(logger);
        const std::string dir = logger.log_dir();
        for (const auto& [other, other_dir] : claimed)
          if (*other == *type && other_dir == dir)
            throw MisconfigurationError("fulgur: two loggers of one type write to " + dir +
                                        " and would overwrite each other's files; give them different names (" +
                                        detail::spelled("LoggerOptions::name", "init_args.name") + ") or save_dirs.");
        claimed.emplace_back(type, dir);
      }
    });
  }
  /// Each logger's version directory, under "<type>/<name>" (what a resumed run writes on in).
  StateDict logger_versions() const {
    StateDict out;
    for_each_item([&](const auto& item) {
      if constexpr (requires { item.log_dir(); item.version(); item.name(); })
        if (!item.log_dir().empty()) out.insert(logger_key(item), item.version());
    });
    return out;
  }
  /// Points each logger that has no version of its own at the one the checkpoint's run wrote to,
  /// from the checkpoint's logging `step` on; before set_up_loggers.
  void resume_loggers(const StateDict& versions, std::int64_t step) {
    for_each_logger([&](auto& logger) {
      if constexpr (requires { logger.resume(std::string(), step); logger.name(); })
        if (const std::string key = logger_key(logger); versions.contains(key) && versions.at(key).isString())
          logger.resume(versions.at(key).toStringRef(), step);
    });
  }

  /// The loggers held (the elements of a std::vector of loggers counted one by one).
  std::size_t logger_count() const {
    std::size_t count = 0;
    for_each_item([&](const auto& item) {
      if constexpr (logger<std::remove_cvref_t<decltype(item)>>) ++count;
    });
    return count;
  }
  /// Every logger gets the metrics, then saves (Lightning's logger connector does both).
  void log_metrics(const Metrics& metrics, std::int64_t step) {
    for_each_logger([&](auto& logger) {
      logger.log_metrics(metrics, step);
      if constexpr (requires { logger.save(); }) logger.save();
    });
  }
  /// `into` with every callback's hyperparameters() added (later names replace earlier ones).
  void collect_hyperparameters(Hyperparameters& into) {
    for_each_item([&](const auto& item) {
      if constexpr (requires { item.hyperparameters(); }) loggers::detail::merge_hyperparameters(into, item.hyperparameters());
    });
  }
  void log_hyperparams(const Hyperparameters& hparams) {
    for_each_logger([&](auto& logger) {
      if constexpr (requires { logger.log_hyperparams(hparams); }) logger.log_hyperparams(hparams);
    });
  }
  /// "success", "failed" or "interrupted": the loggers write what they hold and close. First, a logger
  /// with after_save_checkpoint(callback) learns of each checkpoint callback's kept files (Lightning
  /// calls it after each save; MLFlowLogger's log_model uploads them, the best one marked).
  void finalize_loggers(std::string_view status) {
    for_each_item([&](const auto& item) {
      for_each_logger([&](auto& logger) {
        if constexpr (requires { logger.after_save_checkpoint(item); }) logger.after_save_checkpoint(item);
      });
    });
    for_each_logger([&](auto& logger) {
      if constexpr (requires { logger.finalize(status); }) logger.finalize(status);
    });
  }
  /// Every folder a callback or logger says it keeps checkpoints in (their checkpoint_folders), for
  /// fit's ckpt_path = "last".
  std::vector<std::string> checkpoint_folders(const std::string& default_root_dir) const {
    std::vector<std::string> folders;
    for_each_item([&](const auto& item) {
      if constexpr (requires { item.checkpoint_folders(default_root_dir); })
        for (std::string& folder : item.checkpoint_folders(default_root_dir)) folders.push_back(std::move(folder));
    });
    return folders;
  }
  /// Each checkpoint callback's best_model_path(), in the Trainer's order (ckpt_path = "best").
  std::vector<std::string> best_model_paths() const {
    std::vector<std::string> paths;
    for_each_item([&](const auto& item) {
      if constexpr (requires { { item.best_model_path() } -> std::convertible_to<std::string>; })
        paths.emplace_back(item.best_model_path());
    });
    return paths;
  }
  std::string first_log_dir() {
    std::string dir;
    for_each_logger([&](auto& logger) {
      if constexpr (requires { logger.log_dir(); })
        if (dir.empty()) dir = logger.log_dir();
    });
    return dir;
  }

  // ---- checkpoints ------------------------------------------------------------------------------
  /// Each callback with state_dict() under its state key (Lightning's checkpoint["callbacks"]).
  void save_states(StateDict& out) const {
    for_each_item([&](const auto& item) { save_state(item, out); });
  }
  /// The states of the callbacks whose state records the files they wrote (records_files_callback).
  void save_file_records(StateDict& out) const {
    for_each_item([&](const auto& item) {
      if constexpr (records_files_callback<std::remove_cvref_t<decltype(item)>>()) save_state(item, out);
    });
  }
  /// load_state_dict(state) on each callback the checkpoint holds a state for; returns the
  /// checkpoint's keys that no callback here claims (callbacks of the run that wrote it, missing now).
  std::vector<std::string> load_states(const StateDict& states) {
    std::vector<std::string> claimed;
    for_each_item([&](auto& item) { load_state(item, states, claimed); });
    std::vector<std::string> unclaimed;
    for (const auto& entry : states)
      if (std::find(claimed.begin(), claimed.end(), entry.key().toStringRef()) == claimed.end())
        unclaimed.push_back(entry.key().toStringRef());
    return unclaimed;
  }

  std::tuple<Ts...>& items() { return items_; }

  /// f(callback) for each callback, the elements of a std::vector of them included, in order.
  template <class F>
  void for_each_item(F&& f) {
    std::apply([&](auto&... item) { (visit_item(item, f), ...); }, items_);
  }
  template <class F>
  void for_each_item(F&& f) const {
    std::apply([&](const auto&... item) { (visit_item(item, f), ...); }, items_);
  }

 private:
  template <class C, class F>
  static void visit_item(C& item, F& f) {
    if constexpr (is_vector<std::remove_const_t<C>>::value)
      for (auto& element : item) f(element);
    else
      f(item);
  }
  /// Two stateful callbacks with one state key would overwrite each other's state in a checkpoint
  /// (Lightning refuses them when the Trainer is built, as here).
  void check_state_keys() const {
    std::vector<std::string> keys;
    for_each_item([&](const auto& item) {
      if constexpr (stateful<std::remove_cvref_t<decltype(item)>>) {
        const std::string key = state_key_of(item);
        if (std::find(keys.begin(), keys.end(), key) != keys.end())
          throw MisconfigurationError("fulgur: two stateful callbacks have the state key " + key +
                                      ": their states would overwrite each other in a checkpoint. Give them "
                                      "different settings (the state key is made of them), or keep one.");
        keys.push_back(key);
      }
    });
  }
  template <class C>
  static constexpr bool stateful = requires(C& c, const C& cc, const StateDict& s) {
    { cc.state_dict() } -> std::convertible_to<StateDict>;
    c.load_state_dict(s);
  };
  template <class L>
  static std::string logger_key(const L& logger) {
    return c10::demangle(typeid(L).name()) + "/" + std::string(logger.name());
  }
  template <class C>
  static std::string state_key_of(const C& item) {
    if constexpr (requires { item.state_key(); })
      return std::string(item.state_key());
    else
      return c10::demangle(typeid(C).name());
  }
  template <class C>
  static void save_state(const C& item, StateDict& out) {
    if constexpr (stateful<C>) out.insert(state_key_of(item), item.state_dict().to_ivalue());
  }
  template <class C>
  static void load_state(C& item, const StateDict& states, std::vector<std::string>& claimed) {
    if constexpr (stateful<C>) {
      const std::string key = state_key_of(item);
      if (!states.contains(key)) return;  // a callback added since: it starts afresh, as in Lightning
      const c10::IValue state = states.at(key);
      if (!state.isGenericDict())
        throw CheckpointError("fulgur: the checkpoint's state for callback " + key + " is not a dictionary.");
      item.load_state_dict(StateDict(state.toGenericDict()));
      claimed.push_back(key);
    }
  }

  template <hooks::CallbackGroup group, class C, class Hook, class Module, class... Args>
  void call_one(C& item, Hook hook, TrainerView& view, Module& module, Args&... args) {
    using Element = typename callback_element<C>::type;
    if constexpr (Hook::template callback_named<Element> || Hook::template callback_defines<Element, Module, Args...>) {
      constexpr bool monitoring = monitoring_callback<Element>();
      if constexpr ((group == hooks::CallbackGroup::monitoring && !monitoring) ||
                    (group == hooks::CallbackGroup::non_monitoring && monitoring)) {
        return;
      } else if constexpr (is_vector<C>::value) {
        for (auto& element : item) {
          auto timed = profile_callback<Hook>(element);
          Hook::call_callback(element, view, module, args...);
        }
      } else {
        auto timed = profile_callback<Hook>(item);
        Hook::call_callback(item, view, module, args...);
      }
    }
    (void)hook;
  }
  template <class C, class Hook, class Module, class... Args>
  void call_one_with_idx(C& item, Hook hook, TrainerView& view, Module& module, std::int64_t& dataloader_idx,
                         Args&... args) {
    using Element = typename callback_element<C>::type;
    if constexpr (Hook::template callback_defines<Element, Module, Args..., std::int64_t>) {
      if constexpr (is_vector<C>::value) {
        for (auto& element : item) {
          auto timed = profile_callback<Hook>(element);
          Hook::call_callback(element, view, module, args..., dataloader_idx);
        }
      } else {
        auto timed = profile_callback<Hook>(item);
        Hook::call_callback(item, view, module, args..., dataloader_idx);
      }
    } else {
      call_one<hooks::CallbackGroup::all>(item, hook, view, module, args...);
    }
  }
  /// A callback's hook timed as "[Callback]<state key>.<hook>" (Lightning's name; the class name for a
  /// callback without a state key); the profiler's own hooks are not timed, nor those of a callback whose
  /// `profiled()` says it is switched off (the default ProgressBar under enable_progress_bar = false,
  /// which Lightning would not have made).
  template <class Hook, class C>
  auto profile_callback(const C& item) {
    if constexpr (has_profiler && !fulgur::profiler<C>) {
      if constexpr (requires { item.profiled(); }) {
        const bool on = item.profiled();
        return profiling::Scope(on ? &profiler() : nullptr, on ? callback_action<Hook>(item) : Action{});
      } else {
        return profiling::Scope(&profiler(), callback_action<Hook>(item));
      }
    } else {
      return profiling::NoScope{};
    }
  }
  template <class Hook, class C>
  static Action callback_action(const C& item) {
    if constexpr (requires { item.profiler_name(); } || requires { item.state_key(); }) {
      // Named per instance (a state key holds the callback's settings), once per run and instance.
      struct Named {
        const C* item;
        std::uint64_t run;
        Action action;
      };
      static thread_local std::vector<Named> named;
      const std::uint64_t run = profiling::run_generation();
      for (const Named& n : named)
        if (n.item == &item && n.run == run) return n.action;
      std::erase_if(named, [&](const Named& n) { return n.item == &item || n.run != run; });
      std::string key;
      if constexpr (requires { item.profiler_name(); }) key = item.profiler_name();
      else key = item.state_key();
      return named.emplace_back(Named{&item, run, Action("[Callback]" + key + "." + std::string(Hook::name))}).action;
    } else {
      static const Action action("[Callback]" + profiling::class_name(typeid(C)) + "." + std::string(Hook::name));
      return action;
    }
  }
  template <class F>
  void for_each_logger(F&& f) {
    std::apply([&](auto&... item) { (visit_logger(item, f), ...); }, items_);
  }
  template <class C, class F>
  static void visit_logger(C& item, F& f) {
    if constexpr (logger<typename callback_element<C>::type>) {
      if constexpr (is_vector<C>::value)
        for (auto& element : item) f(element);
      else
        f(item);
    }
  }

  std::tuple<Ts...> items_;
};

}  // namespace detail
}  // namespace fulgur
