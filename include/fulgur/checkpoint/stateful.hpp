#pragma once
// The Fabric-level checkpoint of a hand-written loop (Lightning's fabric.save(path, state) and
// fabric.load(path, state)): a CheckpointState names the objects that make up the run, by
// reference. save writes each one's state under its name; load puts them back in place — modules
// and optimizers through the strategy, numbers and strings by assignment, anything with
// state_dict()/load_state_dict(StateDict) through those — and returns what the checkpoint holds
// besides.
//
//   std::int64_t step = 0;
//   fulgur::CheckpointState state{{"model", model}, {"optimizer", *optimizer}, {"step", step}};
//   trainer.save("run.ckpt", state);
//   fulgur::StateDict rest = trainer.load("run.ckpt", state);  // model, optimizer, step restored
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <concepts>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "fulgur/errors.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur {

/// An object with its own state (a user's counter, a data loader, a callback): Lightning's _Stateful.
template <class T>
concept stateful = requires(T& object, const StateDict& state) {
  { object.state_dict() } -> std::convertible_to<StateDict>;
  object.load_state_dict(state);
};

namespace detail {
template <class T>
struct is_module_pointer : std::is_base_of<torch::detail::ModuleHolderIndicator, T> {};  // TORCH_MODULE holders
template <class T>
struct is_module_pointer<std::shared_ptr<T>> : std::is_base_of<torch::nn::Module, T> {};
template <class T>
inline constexpr bool checkpoint_entry_type =
    std::derived_from<T, torch::nn::Module> || std::derived_from<T, torch::optim::Optimizer> ||
    is_module_pointer<T>::value || stateful<T> || std::same_as<T, std::int64_t> || std::same_as<T, double> ||
    std::same_as<T, bool> || std::same_as<T, std::string> || std::same_as<T, at::Tensor> || std::same_as<T, StateDict>;
template <class>
inline constexpr bool always_false = false;

/// After an optimizer state was loaded: each parameter's buffers (Adam's moments, SGD's momentum,
/// ...) have the parameter's shape. LibTorch checks only the count of parameters, so a state of
/// another model of as many tensors loads and fails at the first step, inside the kernel.
void check_optimizer_state_shapes(torch::optim::Optimizer& optimizer);  // src/checkpoint_state.cpp
}  // namespace detail

class CheckpointState {
 public:
  /// One named object, held by reference: it must outlive the save or load.
  class Entry {
   public:
    template <class T>
      requires std::derived_from<T, torch::nn::Module>
    Entry(std::string name, T& module) : name_(std::move(name)), object_(static_cast<torch::nn::Module*>(&module)) {}
    template <class T>
    Entry(std::string name, torch::nn::ModuleHolder<T>& holder) : Entry(std::move(name), *holder) {}
    template <class T>
      requires std::derived_from<T, torch::nn::Module>
    Entry(std::string name, std::shared_ptr<T>& module) : Entry(std::move(name), *module) {}
    template <class T>
      requires std::derived_from<T, torch::optim::Optimizer>
    Entry(std::string name, T& optimizer)
        : name_(std::move(name)), object_(static_cast<torch::optim::Optimizer*>(&optimizer)) {}
    Entry(std::string name, std::int64_t& value) : name_(std::move(name)), object_(&value) {}
    Entry(std::string name, double& value) : name_(std::move(name)), object_(&value) {}
    Entry(std::string name, bool& value) : name_(std::move(name)), object_(&value) {}
    Entry(std::string name, std::string& value) : name_(std::move(name)), object_(&value) {}
    Entry(std::string name, at::Tensor& value) : name_(std::move(name)), object_(&value) {}
    Entry(std::string name, StateDict& value) : name_(std::move(name)), object_(&value) {}
    template <class T>
      requires(stateful<T> && !std::same_as<T, StateDict> && !std::derived_from<T, torch::nn::Module>)
    Entry(std::string name, T& object)
        : name_(std::move(name)),
          object_(Custom{[&object] { return StateDict(object.state_dict()); },
                         [&object](const StateDict& state) { object.load_state_dict(state); }}) {}

    /// Anything else: one message saying what an entry can be.
    template <class T>
      requires(!detail::checkpoint_entry_type<T>)
    Entry(const std::string&, T&) {
      static_assert(detail::always_false<T>,
                    "fulgur::CheckpointState entries are modules, optimizers, std::int64_t, double, bool, "
                    "std::string, at::Tensor, StateDict or objects with state_dict()/load_state_dict(StateDict), "
                    "held by non-const reference (load writes into them): keep an int or size_t counter as "
                    "std::int64_t and a float as double.");
    }

    const std::string& name() const { return name_; }

   private:
    friend class CheckpointState;
    struct Custom {
      std::function<StateDict()> save;
      std::function<void(const StateDict&)> load;
    };
    std::string name_;
    std::variant<torch::nn::Module*, torch::optim::Optimizer*, std::int64_t*, double*, bool*, std::string*,
                 at::Tensor*, StateDict*, Custom>
        object_;
  };

  CheckpointState(std::initializer_list<Entry> entries) : entries_(entries) { check_names(); }
  CheckpointState& add(Entry entry) {
    entries_.push_back(std::move(entry));
    check_names();
    return *this;
  }
  const std::vector<Entry>& entries() const { return entries_; }

  /// What save writes: each object's state under its name. `fabric` gives the states of modules and
  /// optimizers (its strategy's view of them).
  template <class Fabric>
  StateDict collect(Fabric& fabric) const {
    StateDict out;
    for (const Entry& e : entries_) {
      std::visit(
          [&](auto&& object) {
            using T = std::remove_cvref_t<decltype(object)>;
            if constexpr (std::is_same_v<T, torch::nn::Module*>) out.insert(e.name_, fabric.module_state(*object).to_ivalue());
            else if constexpr (std::is_same_v<T, torch::optim::Optimizer*>) out.insert(e.name_, fabric.optimizer_state(*object).to_ivalue());
            else if constexpr (std::is_same_v<T, StateDict*>) out.insert(e.name_, object->to_ivalue());
            else if constexpr (std::is_same_v<T, Entry::Custom>) out.insert(e.name_, object.save().to_ivalue());
            else out.insert(e.name_, c10::IValue(*object));
          },
          e.object_);
    }
    return out;
  }

  /// Puts each object back from `checkpoint` (read from `path`), in place, and returns the entries
  /// no object took. strict: every object must find its entry (Lightning's strict loading), and a
  /// module its exact keys.
  template <class Fabric>
  StateDict restore(Fabric& fabric, StateDict checkpoint, const std::string& path, bool strict) const {
    const std::string what = "checkpoint '" + path + "'";
    std::vector<std::string> missing;
    for (const Entry& e : entries_)
      if (!checkpoint.contains(e.name_)) missing.push_back(e.name_);
    if (strict && !missing.empty()) {
      std::string names, held;
      for (const auto& name : missing) names += (names.empty() ? "'" : ", '") + name + "'";
      for (const auto& item : checkpoint) held += (held.empty() ? "'" : ", '") + item.key().toStringRef() + "'";
      throw CheckpointError("fulgur: the requested state contains " + names + ", which " + what + " does not hold "
                            "(it holds " + (held.empty() ? std::string("nothing") : held) + "). To load the rest "
                            "anyway, pass strict = false.");
    }
    for (const Entry& e : entries_) {
      if (!checkpoint.contains(e.name_)) continue;
      const c10::IValue value = checkpoint.at(e.name_);
      const std::string where = what + "'s '" + e.name_ + "'";
      std::visit(
          [&](auto&& object) {
            using T = std::remove_cvref_t<decltype(object)>;
            if constexpr (std::is_same_v<T, torch::nn::Module*>) fabric.load_module_state(*object, dict(value, where), strict);
            else if constexpr (std::is_same_v<T, torch::optim::Optimizer*>) load_optimizer(fabric, *object, dict(value, where), where);
            else if constexpr (std::is_same_v<T, StateDict*>) *object = dict(value, where);
            else if constexpr (std::is_same_v<T, Entry::Custom>) object.load(dict(value, where));
            else if constexpr (std::is_same_v<T, std::int64_t*>) *object = expect(value.isInt(), value, where, "an integer").toInt();
            else if constexpr (std::is_same_v<T, double*>) *object = expect(value.isDouble() || value.isInt(), value, where, "a number").toScalar().toDouble();
            else if constexpr (std::is_same_v<T, bool*>) *object = expect(value.isBool(), value, where, "a bool").toBool();
            else if constexpr (std::is_same_v<T, std::string*>) *object = expect(value.isString(), value, where, "a string").toStringRef();
            else if constexpr (std::is_same_v<T, at::Tensor*>) *object = expect(value.isTensor(), value, where, "a tensor").toTensor();
          },
          e.object_);
      checkpoint.erase(e.name_);
    }
    return checkpoint;
  }

 private:
  void check_names() const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (entries_[i].name_ == entries_[j].name_)
          throw MisconfigurationError("fulgur: CheckpointState names '" + entries_[i].name_ + "' twice; give each "
                                      "object its own name.");
  }
  static const c10::IValue& expect(bool ok, const c10::IValue& value, const std::string& where, const char* wanted) {
    if (!ok)
      throw CheckpointError("fulgur: " + where + " holds " + value.tagKind() + ", where the state has " + wanted +
                            "; load it into an object of that type, or leave it out of the state.");
    return value;
  }
  static StateDict dict(const c10::IValue& value, const std::string& where) {
    if (!value.isGenericDict())
      throw CheckpointError("fulgur: " + where + " holds " + value.tagKind() + ", not the state of an object (a "
                            "dictionary); was it saved from a number, a string or a tensor?");
    return StateDict(value.toGenericDict());
  }
  template <class Fabric>
  static void load_optimizer(Fabric& fabric, torch::optim::Optimizer& optimizer, const StateDict& state,
                             const std::string& where) {
    try {
      fabric.load_optimizer_state(optimizer, state);
    } catch (const std::exception& e) {
      std::string text = e.what();
      text = text.substr(0, text.find('\n'));
      if (text.rfind("fulgur: ", 0) == 0) text.erase(0, 8);
      throw CheckpointError("fulgur: " + where + ": " + text);
    }
  }

  std::vector<Entry> entries_;
};

}  // namespace fulgur
