#pragma once
// The hooks fulgur calls on the module, in Lightning's names; each is optional and found with
// `requires`, so an absent hook costs nothing. A hook is called with Lightning's arguments, or
// with none; either form may add a trailing `fulgur::StepContext&` (to log, read the position or
// request a stop):
//
//   void on_train_batch_end(const Output& outputs, const Batch& batch, std::int64_t batch_idx);
//   void on_train_epoch_end(fulgur::StepContext& ctx);
//   void on_fit_start();
//
// A member with a hook's name that cannot be called in any of these forms is a compile error
// naming it (a misspelt hook name cannot be caught: docs/loops-and-hooks.md lists every name).
// The loops call every hook through here, and callbacks will too: one place decides the order.
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "fulgur/concepts/callback.hpp"
#include "fulgur/concepts/requirements.hpp"
#include "fulgur/metrics.hpp"
#include "fulgur/profilers/profiler.hpp"
#include "fulgur/stage.hpp"
#include "fulgur/step_context.hpp"

namespace fulgur {

class TrainerView;

/// What an evaluation step that returns nothing hands to on_validation_batch_end and friends
/// (Lightning passes None).
struct NoOutput {};

}  // namespace fulgur

namespace fulgur::hooks {

/// What a hook call returns when the module does not define the hook.
struct absent {};


// The module's side of a hook: tried with Lightning's arguments (and a trailing StepContext&), then
// without them — only when the module has a member of the hook's name at all (a concept conjunction
// stops there), so that the hooks a module leaves out cost one name lookup each, not four overload
// resolutions: most of what `fit` costs to compile in a user's program is hooks it does not define.
#define FULGUR_DETAIL_HOOK_MODULE_PART(hook_name, scope)                                                       \
  static constexpr std::string_view name = #hook_name;                                                         \
  static constexpr detail::LogScope log_scope = detail::LogScope::scope;                                       \
  template <class M, class... Args>                                                                            \
  static constexpr bool defined_for = hook_name##_module_defines<M, Args...>;                                  \
  template <class M>                                                                                           \
  static constexpr bool named_in = hook_name##_named<M>;                                                       \
  template <class M, class... Args>                                                                            \
  static decltype(auto) call(M& m, StepContext& ctx, Args&&... args) {                                         \
    if constexpr (requires { m.hook_name(args..., ctx); })                                                     \
      return m.hook_name(args..., ctx);                                                                        \
    else if constexpr (requires { m.hook_name(args...); })                                                     \
      return m.hook_name(args...);                                                                             \
    else if constexpr (sizeof...(Args) > 0 && requires { m.hook_name(ctx); })                                  \
      return m.hook_name(ctx);                                                                                 \
    else if constexpr (sizeof...(Args) > 0 && requires { m.hook_name(); })                                     \
      return m.hook_name();                                                                                    \
    else {                                                                                                     \
      static_assert(!requires { &M::hook_name; },                                                              \
                    "fulgur: the module's `" #hook_name "` cannot be called with Lightning's arguments for "     \
                    "this hook (nor with none); docs/loops-and-hooks.md gives its signature.");                \
      return absent{};                                                                                         \
    }                                                                                                          \
  }

// A hook only the module has (the steps, the data hooks, the model-mode hooks).
#define FULGUR_DETAIL_HOOK_CONCEPTS(hook_name)                                                                 \
  namespace probes { FULGUR_DETAIL_MEMBER_PROBE(hook_name) }                                                   \
  template <class M>                                                                                           \
  concept hook_name##_named = std::is_final_v<M> || probes::has_member_##hook_name<M>();                       \
  template <class M, class... Args>                                                                            \
  concept hook_name##_callable = requires(M& m, StepContext& ctx, Args&... args) {                             \
    m.hook_name(args..., ctx);                                                                                 \
  } || requires(M& m, Args&... args) { m.hook_name(args...); } || requires(M& m, StepContext& ctx) {          \
    m.hook_name(ctx);                                                                                          \
  } || requires(M& m) { m.hook_name(); };                                                                      \
  template <class M, class... Args>                                                                            \
  concept hook_name##_module_defines = hook_name##_named<M> && hook_name##_callable<M, Args...>;               \
  template <class C, class M, class... Args>                                                                   \
  concept hook_name##_callback_callable =                                                                      \
      requires(C& c, TrainerView& v, M& m, Args&... args) { c.hook_name(v, m, args...); } ||                   \
      requires(C& c, TrainerView& v, Args&... args) { c.hook_name(v, args...); } ||                            \
      requires(C& c, TrainerView& v, M& m) { c.hook_name(v, m); } ||                                           \
      requires(C& c, TrainerView& v) { c.hook_name(v); } || requires(C& c) { c.hook_name(); };                 \
  template <class C, class M, class... Args>                                                                   \
  concept hook_name##_callback_defines = hook_name##_named<C> && hook_name##_callback_callable<C, M, Args...>;

#define FULGUR_DETAIL_DEFINE_HOOK(hook_name, scope)                                                            \
  FULGUR_DETAIL_HOOK_CONCEPTS(hook_name)                                                                       \
  struct hook_name##_t {                                                                                       \
    FULGUR_DETAIL_HOOK_MODULE_PART(hook_name, scope)                                                           \
    static constexpr bool reaches_callbacks = false;                                                           \
  };                                                                                                           \
  inline constexpr hook_name##_t hook_name {}

// A hook callbacks receive too, first (Lightning's order), as
//   cb.hook(TrainerView&, Module&, args...)   Lightning's (trainer, pl_module, ...)
//   cb.hook(TrainerView&, args...)
//   cb.hook(TrainerView&, Module&)            a hook with arguments, taken without them
//   cb.hook(TrainerView&)
//   cb.hook()
// the first form that compiles; a member of the hook's name that fits none is an error naming it.
#define FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(hook_name, scope)                                                   \
  FULGUR_DETAIL_HOOK_CONCEPTS(hook_name)                                                                       \
  struct hook_name##_t {                                                                                       \
    FULGUR_DETAIL_HOOK_MODULE_PART(hook_name, scope)                                                           \
    static constexpr bool reaches_callbacks = true;                                                            \
    template <class C>                                                                                         \
    static constexpr bool callback_named = fulgur::detail::has_member_##hook_name<C>();                       \
    template <class C, class M, class... Args>                                                                 \
    static constexpr bool callback_defines = hook_name##_callback_defines<C, M, Args...>;                      \
    template <class C, class M, class... Args>                                                                 \
    static void call_callback(C& c, TrainerView& v, M& m, Args&... args) {                                     \
      if constexpr (requires { c.hook_name(v, m, args...); })                                                  \
        c.hook_name(v, m, args...);                                                                            \
      else if constexpr (requires { c.hook_name(v, args...); })                                                \
        c.hook_name(v, args...);                                                                               \
      else if constexpr (sizeof...(Args) > 0 && requires { c.hook_name(v, m); })                               \
        c.hook_name(v, m);                                                                                     \
      else if constexpr (requires { c.hook_name(v); })                                                         \
        c.hook_name(v);                                                                                        \
      else if constexpr (requires { c.hook_name(); })                                                          \
        c.hook_name();                                                                                         \
      else                                                                                                     \
        static_assert(!fulgur::detail::has_member_##hook_name<C>(),                                            \
                      "fulgur: the callback's `" #hook_name "` cannot be called as (TrainerView&, Module&, "     \
                      "Lightning's arguments...) nor in a shorter form; docs/callbacks.md gives its signature."); \
    }                                                                                                          \
  };                                                                                                           \
  inline constexpr hook_name##_t hook_name {}

// The steps.
FULGUR_DETAIL_DEFINE_HOOK(training_step, step);
FULGUR_DETAIL_DEFINE_HOOK(validation_step, epoch);
FULGUR_DETAIL_DEFINE_HOOK(test_step, epoch);
FULGUR_DETAIL_DEFINE_HOOK(predict_step, none);
// Set-up and tear-down.
FULGUR_DETAIL_DEFINE_HOOK(prepare_data, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(setup, none);
FULGUR_DETAIL_DEFINE_HOOK(configure_model, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(teardown, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_fit_start, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_fit_end, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_sanity_check_start, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_sanity_check_end, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_exception, none);
// Checkpoints: the module and callbacks may add entries of their own (StateDict&) and read them back.
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_save_checkpoint, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_load_checkpoint, none);
// Training.
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_train_start, epoch_only);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_train_end, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_train_epoch_start, epoch_only);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_train_epoch_end, epoch_only);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_train_batch_start, step);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_train_batch_end, step);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_before_zero_grad, step);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_before_backward, step);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_after_backward, step);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_before_optimizer_step, step);
// Moving a batch.
FULGUR_DETAIL_DEFINE_HOOK(on_before_batch_transfer, none);
FULGUR_DETAIL_DEFINE_HOOK(transfer_batch_to_device, none);
FULGUR_DETAIL_DEFINE_HOOK(on_after_batch_transfer, none);
// Validation.
FULGUR_DETAIL_DEFINE_HOOK(on_validation_model_zero_grad, none);
FULGUR_DETAIL_DEFINE_HOOK(on_validation_model_eval, none);
FULGUR_DETAIL_DEFINE_HOOK(on_validation_model_train, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_validation_start, epoch_only);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_validation_end, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_validation_epoch_start, epoch_only);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_validation_epoch_end, epoch_only);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_validation_batch_start, epoch);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_validation_batch_end, epoch);
// Testing.
FULGUR_DETAIL_DEFINE_HOOK(on_test_model_eval, none);
FULGUR_DETAIL_DEFINE_HOOK(on_test_model_train, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_test_start, epoch_only);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_test_end, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_test_epoch_start, epoch_only);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_test_epoch_end, epoch_only);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_test_batch_start, epoch);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_test_batch_end, epoch);
// Prediction.
FULGUR_DETAIL_DEFINE_HOOK(on_predict_model_eval, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_predict_start, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_predict_end, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_predict_epoch_start, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_predict_epoch_end, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_predict_batch_start, none);
FULGUR_DETAIL_DEFINE_CALLBACK_HOOK(on_predict_batch_end, none);

#undef FULGUR_DETAIL_DEFINE_HOOK
#undef FULGUR_DETAIL_DEFINE_CALLBACK_HOOK
#undef FULGUR_DETAIL_HOOK_MODULE_PART

/// Whether Module defines the hook (tag type Hook, e.g. hooks::on_fit_start_t) for arguments of
/// these types (each passed as an lvalue of that type).
template <class Module, class Hook, class... Args>
inline constexpr bool defines = Hook::template defined_for<Module, Args...>;

/// Which callbacks a call reaches: Lightning runs on_train_epoch_end on the monitoring callbacks
/// (EarlyStopping, ModelCheckpoint) after the module's, every other hook on all callbacks before it.
enum class CallbackGroup { all, non_monitoring, monitoring };

/// A Trainer without callbacks.
struct NoCallbacks {
  static constexpr bool has_profiler = false;
  template <class Hook, class Module, class... Args>
  static constexpr bool reached_by = false;
  template <CallbackGroup, class Hook, class Module, class... Args>
  void call(Hook, TrainerView&, Module&, Args&...) {}
  template <class Hook, class Module, class... Args>
  void call_with_dataloader_idx(Hook, TrainerView&, Module&, std::int64_t&, Args&...) {}
  template <class Hook, class Module, class Failed, class... Args>
  void call_guarded(Hook, TrainerView&, Module&, Failed&&, Args&...) {}
};

/// The steps: a profiler times them as the strategy's ("[Strategy]DDPStrategy.training_step"), as
/// Lightning does, not as the module's.
template <class Hook>
inline constexpr bool is_step_hook = std::is_same_v<Hook, training_step_t> || std::is_same_v<Hook, validation_step_t> ||
                                     std::is_same_v<Hook, test_step_t> || std::is_same_v<Hook, predict_step_t>;

/// "[LightningModule]<Module>.<hook>": a module's hook as a profiler names it.
template <class Module, class Hook>
Action module_hook_action() {
  static const Action action("[LightningModule]" + profiling::class_name(typeid(Module)) + "." + std::string(Hook::name));
  return action;
}

/// Calls hooks: sets the logging scope, then calls the callbacks' hook (if the hook reaches
/// callbacks) and the module's (if it defines it), in Lightning's order. With a profiler among the
/// callbacks, each call is timed under Lightning's action name.
template <class Module, class Callbacks = NoCallbacks>
class HookCaller {
 public:
  using module_type = Module;
  static constexpr bool profiled = Callbacks::has_profiler;

  HookCaller(Module& module, StepContext& ctx) requires std::is_same_v<Callbacks, NoCallbacks>
      : module_(module), ctx_(ctx) {}
  HookCaller(Module& module, StepContext& ctx, Callbacks& callbacks, TrainerView& view)
      : module_(module), ctx_(ctx), callbacks_(&callbacks), view_(&view) {}

  template <class Hook, class... Args>
  decltype(auto) operator()(Hook hook, Args&&... args) {
    constexpr bool to_callbacks = reaches_callbacks<Hook, std::remove_reference_t<Args>...>();
    if constexpr (to_callbacks) {
      ctx_.enter(Hook::name, Hook::log_scope);
      callbacks_->template call<CallbackGroup::all>(hook, *view_, module_, args...);
    }
    return call_module(hook, std::forward<Args>(args)...);
  }
  /// A step or batch hook under several evaluation loaders: dataloader_idx follows Lightning's
  /// arguments for the module (whose hook must take it, as Lightning requires) and for each callback
  /// whose hook takes it; a callback's hook written without it is called without it.
  template <class Hook, class... Args>
  decltype(auto) call_with_dataloader_idx(Hook hook, std::int64_t dataloader_idx, Args&&... args) {
    if constexpr (reaches_callbacks<Hook, std::remove_reference_t<Args>..., std::int64_t>() ||
                  reaches_callbacks<Hook, std::remove_reference_t<Args>...>()) {
      ctx_.enter(Hook::name, Hook::log_scope);
      callbacks_->call_with_dataloader_idx(hook, *view_, module_, dataloader_idx, args...);
    }
    return call_module(hook, std::forward<Args>(args)..., dataloader_idx);
  }
  /// A hook on the way out of a failed or interrupted run (on_exception, teardown): the callbacks and
  /// the module are each called even if one before throws; what they throw goes to `failed`, so that
  /// the run's own error is the one that reaches the caller.
  template <class Hook, class Failed, class... Args>
  void call_guarded(Hook hook, Failed&& failed, Args&&... args) {
    if constexpr (reaches_callbacks<Hook, std::remove_reference_t<Args>...>()) {
      ctx_.enter(Hook::name, Hook::log_scope);
      callbacks_->call_guarded(hook, *view_, module_, failed, args...);
    }
    try {
      call_module(hook, std::forward<Args>(args)...);
    } catch (const std::exception& e) {
      failed(e);
    }
  }
  /// Lightning's on_train_epoch_end: the callbacks that are not monitoring, the module, `between()`,
  /// then the monitoring callbacks (EarlyStopping, ModelCheckpoint: they see what the module logged).
  template <class Hook, class Between>
  void call_with_monitoring_after(Hook hook, Between&& between) {
    constexpr bool to_callbacks = reaches_callbacks<Hook>();
    if constexpr (to_callbacks) {
      ctx_.enter(Hook::name, Hook::log_scope);
      callbacks_->template call<CallbackGroup::non_monitoring>(hook, *view_, module_);
    }
    call_module(hook);
    between();
    if constexpr (to_callbacks) {
      ctx_.enter(Hook::name, Hook::log_scope);
      callbacks_->template call<CallbackGroup::monitoring>(hook, *view_, module_);
    }
  }
  /// A hook that has Lightning's default behaviour: the module's own if it defines one, else
  /// `fallback()` (e.g. on_validation_model_eval, whose default is module.eval()).
  template <class Hook, class Fallback>
  void call_or(Hook hook, Fallback&& fallback) {
    if constexpr (Hook::template defined_for<Module>)
      (*this)(hook);
    else
      fallback();
  }
  /// The same for a hook Lightning always calls (its default is a LightningModule method): a profiler
  /// times the fallback under the hook's name too (on_validation_model_eval, ..._zero_grad).
  template <class Hook, class Fallback>
  void call_or_default(Hook hook, Fallback&& fallback) {
    if constexpr (Hook::template defined_for<Module>) {
      (*this)(hook);
    } else {
      auto timed = profile([] { return module_hook_action<Module, Hook>(); });
      fallback();
    }
  }
  /// The module's hook alone, without the callbacks' (Lightning's restore_model outside fit calls only
  /// the module's on_load_checkpoint).
  template <class Hook, class... Args>
  decltype(auto) call_module_only(Hook hook, Args&&... args) {
    return call_module(hook, std::forward<Args>(args)...);
  }
  /// Times `make_action()` for the returned scope's life (nothing without a profiler).
  template <class MakeAction>
  auto profile(MakeAction&& make_action) {
    if constexpr (profiled) return callbacks_->profile(make_action);
    else return profiling::NoScope{};
  }

  Module& module() { return module_; }
  StepContext& ctx() { return ctx_; }
  /// What callbacks see (null without callbacks).
  TrainerView* view() { return view_; }
  Callbacks* callbacks() { return callbacks_; }

 private:
  template <class Hook, class... Args>
  static constexpr bool reaches_callbacks() {
    if constexpr (Hook::reaches_callbacks)
      return Callbacks::template reached_by<Hook, Module, Args...>;
    else
      return false;
  }
  template <class Hook, class... Args>
  decltype(auto) call_module(Hook, Args&&... args) {
    if constexpr (Hook::template defined_for<Module, std::remove_reference_t<Args>...>) {
      ctx_.enter(Hook::name, Hook::log_scope);
      if constexpr (profiled && !is_step_hook<Hook>) {
        auto timed = profile([] { return module_hook_action<Module, Hook>(); });
        return Hook::call(module_, ctx_, std::forward<Args>(args)...);
      } else {
        return Hook::call(module_, ctx_, std::forward<Args>(args)...);
      }
    } else if constexpr (Hook::template named_in<Module>) {
      return Hook::call(module_, ctx_, std::forward<Args>(args)...);  // a member of that name: its signature error
    } else {
      return absent{};  // no such member: nothing to try
    }
  }

  Module& module_;
  StepContext& ctx_;
  Callbacks* callbacks_ = nullptr;
  TrainerView* view_ = nullptr;
};

}  // namespace fulgur::hooks
