#pragma once
// The actions a profiler times, in Lightning's names ("run_training_batch",
// "[LightningModule]Net.on_train_epoch_end", "[Strategy]DDPStrategy.backward", ...).
//
// A name is interned once, where it is first used (a function-local static per call site), into a
// process-wide table; the loops then hand profilers an `Action` — an index and a view of its name —
// so that timing an action costs two clock reads and no string work per step. Torch-free.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <typeinfo>

namespace fulgur {

/// An interned action name.
class Action {
 public:
  Action() = default;
  /// The action of this name (interned on first use; thread-safe).
  explicit Action(std::string_view name);

  /// A dense index from 0: profilers keep per-action slots in a vector.
  std::uint32_t id() const { return id_; }
  std::string_view name() const;
  friend bool operator==(Action, Action) = default;

 private:
  std::uint32_t id_ = 0;
};

namespace profiling {

/// How many actions have been interned so far (ids are below this).
std::size_t action_count();
/// The name of the action with this id.
std::string_view action_name(std::uint32_t id);

/// A string literal as a template argument: `profile<"run_training_batch">(...)`.
template <std::size_t N>
struct fixed_string {
  char text[N]{};
  constexpr fixed_string(const char (&s)[N]) {  // NOLINT(google-explicit-constructor): used as a literal
    for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
  }
  constexpr std::string_view view() const { return {text, N - 1}; }
};

/// A type's name as Python's `type(x).__name__` gives a class's: without namespaces (template
/// arguments kept), and a TORCH_MODULE's `Impl` suffix dropped (the user's `Net`, not `NetImpl`).
std::string class_name(const std::type_info& type);

/// The action for a fixed name, interned once per name.
template <fixed_string Name>
Action named() {
  static const Action action(Name.view());
  return action;
}

/// "[LightningModule]<Module>.<hook>".
template <class Module, fixed_string Hook>
Action module_action() {
  static const Action action("[LightningModule]" + class_name(typeid(Module)) + "." + std::string(Hook.view()));
  return action;
}

/// A strategy's name in actions: its `static constexpr std::string_view class_name` if it has a
/// non-empty one (DDPStrategy and ShardedStrategy<3>, whose types also name their backends), else its
/// class name.
template <class Strategy>
std::string strategy_name() {
  if constexpr (requires { std::string_view(Strategy::class_name); })
    if (!Strategy::class_name.empty()) return std::string(Strategy::class_name);
  return class_name(typeid(Strategy));
}

/// "[Strategy]<Strategy>.<verb>".
template <class Strategy, fixed_string Verb>
Action strategy_action() {
  static const Action action("[Strategy]" + strategy_name<Strategy>() + "." + std::string(Verb.view()));
  return action;
}

/// "[Strategy]<Strategy>.<Hook::name>" (a step hook's tag type).
template <class Strategy, class Hook>
Action strategy_hook_action() {
  static const Action action("[Strategy]" + strategy_name<Strategy>() + "." + std::string(Hook::name));
  return action;
}

/// A new run's actions for callbacks are named afresh (a callback's state key may differ between runs).
std::uint64_t run_generation();
void start_run_generation();

}  // namespace profiling
}  // namespace fulgur
