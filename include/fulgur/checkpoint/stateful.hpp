#pragma once
// The Fabric-level checkpoint of a hand-written loop (Lightning's fabric.save(path, state) and
// fabric.load(path, state)): a CheckpointState names the objects that make up the run, by
// reference (collected and restored in libfulgur, through the trainer's detail::HostLink). save writes each one's state under its name; load puts them back in place — modules
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
#include <vector>

#include "fulgur/errors.hpp"
#include "fulgur/loops/boundary.hpp"
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
void check_optimizer_state_shapes(torch::optim::Optimizer& optimizer);  // src/checkpoint/state.cpp
}  // namespace detail

class CheckpointState {
 public:
  /// One named object, held by reference: it must outlive the save or load.
  class Entry {
   public:
    template <class T>
      requires std::derived_from<T, torch::nn::Module>
    Entry(std::string name, T& module)
        : name_(std::move(name)), kind_(Kind::module), object_(static_cast<torch::nn::Module*>(&module)) {}
    template <class T>
    Entry(std::string name, torch::nn::ModuleHolder<T>& holder) : Entry(std::move(name), *holder) {}
    template <class T>
      requires std::derived_from<T, torch::nn::Module>
    Entry(std::string name, std::shared_ptr<T>& module) : Entry(std::move(name), *module) {}
    template <class T>
      requires std::derived_from<T, torch::optim::Optimizer>
    Entry(std::string name, T& optimizer)
        : name_(std::move(name)), kind_(Kind::optimizer), object_(static_cast<torch::optim::Optimizer*>(&optimizer)) {}
    Entry(std::string name, std::int64_t& value) : name_(std::move(name)), kind_(Kind::integer), object_(&value) {}
    Entry(std::string name, double& value) : name_(std::move(name)), kind_(Kind::real), object_(&value) {}
    Entry(std::string name, bool& value) : name_(std::move(name)), kind_(Kind::boolean), object_(&value) {}
    Entry(std::string name, std::string& value) : name_(std::move(name)), kind_(Kind::text), object_(&value) {}
    Entry(std::string name, at::Tensor& value) : name_(std::move(name)), kind_(Kind::tensor), object_(&value) {}
    Entry(std::string name, StateDict& value) : name_(std::move(name)), kind_(Kind::state), object_(&value) {}
    template <class T>
      requires(stateful<T> && !std::same_as<T, StateDict> && !std::derived_from<T, torch::nn::Module>)
    Entry(std::string name, T& object)
        : name_(std::move(name)),
          kind_(Kind::custom),
          object_(&object),
          custom_(std::make_shared<const Custom>(Custom{[&object] { return StateDict(object.state_dict()); },
                                                        [&object](const StateDict& state) { object.load_state_dict(state); }})) {}
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
    enum class Kind : std::uint8_t { module, optimizer, integer, real, boolean, text, tensor, state, custom };
    struct Custom {
      std::function<StateDict()> save;
      std::function<void(const StateDict&)> load;
    };
    std::string name_;
    Kind kind_ = Kind::state;
    void* object_ = nullptr;  // of the type kind_ says
    std::shared_ptr<const Custom> custom_;
  };

  CheckpointState(std::initializer_list<Entry> entries) : entries_(entries) { check_names(); }
  CheckpointState& add(Entry entry) {
    entries_.push_back(std::move(entry));
    check_names();
    return *this;
  }
  const std::vector<Entry>& entries() const { return entries_; }

  /// What save writes: each object's state under its name. `host` (the trainer) gives the states of
  /// modules and optimizers, each through its strategy (src/checkpoint/stateful.cpp).
  StateDict collect(detail::HostLink& host) const;
  /// Puts each object back from `checkpoint` (read from `path`), in place, and returns the entries
  /// no object took. strict: every object must find its entry (Lightning's strict loading), and a
  /// module its exact keys.
  StateDict restore(detail::HostLink& host, StateDict checkpoint, const std::string& path, bool strict) const;

 private:
  void check_names() const;

  std::vector<Entry> entries_;
};

}  // namespace fulgur
