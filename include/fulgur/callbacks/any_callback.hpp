#pragma once
// AnyCallback: a callback chosen at run time (a plug-in, a list built from a config file), for
// the cases compile-time callbacks cannot cover. It holds any callback object whose hooks take
// (TrainerView&, torch::nn::Module&, ...) with LambdaCallback's arguments, and calls them through
// one indirect call per hook it defines (the only callback in fulgur that is not a direct call):
//
//   std::vector<fulgur::AnyCallback> plugins{fulgur::AnyCallback(MyPlugin{...})};
//   fulgur::Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, std::vector<fulgur::AnyCallback>>
//       trainer(config, std::move(plugins));
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "fulgur/callbacks/lambda_callback.hpp"
#include "fulgur/hooks.hpp"

namespace fulgur {

class AnyCallback : public LambdaCallback {
 public:
  template <class C>
    requires(!std::is_same_v<std::remove_cvref_t<C>, AnyCallback>)
  explicit AnyCallback(C plugin)
      : held_(std::make_shared<C>(std::move(plugin))), type_(&typeid(C)), name_(&held_name<C>) {
    static_assert(callback<C>, "fulgur: AnyCallback holds a callback: a type defining at least one hook (docs/callbacks.md).");
    auto held = std::static_pointer_cast<C>(held_);
#define FULGUR_DETAIL_ERASE(name, ...)                                                                   \
  if constexpr (hooks::name##_t::template callback_defines<C, torch::nn::Module __VA_OPT__(, ) __VA_ARGS__>) \
    this->name = [held](TrainerView& view, torch::nn::Module& module, auto&&... args) {                 \
      hooks::name##_t::call_callback(*held, view, module, args...);                                      \
    };                                                                                                   \
  else if constexpr (fulgur::detail::has_member_##name<C>())                                             \
    static_assert(sizeof(C) == 0, "fulgur: AnyCallback calls `" #name "` as (TrainerView&, torch::nn::Module&, " \
                  "...) with LambdaCallback's arguments; take torch::nn::Module& (not your module's type), or give " \
                  "the callback to the Trainer as a type of its own.");
    FULGUR_DETAIL_ERASED_HOOKS(FULGUR_DETAIL_ERASE)
#undef FULGUR_DETAIL_ERASE
  }

  /// What a profiler calls the held callback: its state key, or its class name (Lightning's).
  std::string profiler_name() const { return name_(held_.get()); }

  /// The held callback, if it is a C (e.g. to read its state after fit); null otherwise.
  template <class C>
  C* target() const {
    return *type_ == typeid(C) ? static_cast<C*>(held_.get()) : nullptr;
  }

 private:
  template <class C>
  static std::string held_name(const void* held) {
    if constexpr (requires(const C& c) { c.state_key(); }) return std::string(static_cast<const C*>(held)->state_key());
    else return profiling::class_name(typeid(C));
  }

  std::shared_ptr<void> held_;
  const std::type_info* type_;
  std::string (*name_)(const void*);
};

}  // namespace fulgur
