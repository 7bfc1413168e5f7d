#pragma once
// ShardedStrategy<3> ("fsdp"): stage 2, with the parameters sharded too. Each unit a WrapPolicy
// picks (submodules by type or by size, as FSDP's auto-wrap) is a bucket of its own storage, freed
// at rest; a rank keeps 1/N of the weights, gradients and optimizer state. A unit is gathered when
// an op first reads one of its parameters, forward or backward, and released when the next unit is
// gathered; gradients go as stage 2's. A model built in init_module(/*empty_init=*/true) is on the
// meta device and gets its memory at set-up, already sharded. The module's state_dict is gathered
// whole for a checkpoint (StateDictType::full) or kept as each rank's chunks (sharded, the default);
// the module is whole again after fit.
#include <c10/core/DeviceGuard.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fulgur/device_guards.hpp"
#include "fulgur/strategies/sharded/stage2.hpp"

namespace fulgur {

template <class Backend>
class ShardedStrategy<3, Backend>
    : public detail::GradientShardedStrategyBase<ShardedStrategy<3, Backend>, Backend, distributed::ParameterSharding> {
  using Base =
      detail::GradientShardedStrategyBase<ShardedStrategy<3, Backend>, Backend, distributed::ParameterSharding>;
  friend detail::ShardedStrategyBase<ShardedStrategy<3, Backend>, Backend, distributed::ParameterSharding>;

 public:
  static constexpr std::string_view name = "fsdp";
  static constexpr std::string_view class_name = "ShardedStrategy<3>";  ///< a profiler's "[Strategy]..." actions
  using options_type = FSDPOptions;
  // Not explicit, as DDPStrategy's.
  ShardedStrategy(FSDPOptions options = {}) : Base(static_cast<DDPOptions>(options)), options_(std::move(options)) {}

  /// With empty_init: modules created in this context are on the meta device (shapes, no memory),
  /// and set-up gives them memory a unit at a time, already sharded — a model too big for one rank.
  /// Otherwise DDP's context (the root device).
  template <class Precision>
  auto module_init_context(Precision& precision, bool empty_init) {
    const c10::Device device = this->root_device();
    return InitContext<decltype(precision.module_init_context())>{
        c10::OptionalDeviceGuard(device), DefaultDeviceGuard(empty_init ? c10::Device(c10::kMeta) : device),
        precision.module_init_context()};
  }
  /// Tensors on the meta device stay there until setup_optimizer materialises them.
  void module_to_device(torch::nn::Module& module) {
    if (!this->sharding().module_to_device(module, this->root_device())) Base::module_to_device(module);
  }
  /// The module whole again, then laid out anew (its optimizers are set up after it).
  void setup_module(torch::nn::Module& module) { this->sharding().set_module(module); }
  /// A meta-built module set up without an optimizer gets whole memory here.
  void setup_module_and_optimizers(torch::nn::Module& module, std::span<torch::optim::Optimizer* const> optimizers) {
    Base::setup_module_and_optimizers(module, optimizers);
    this->sharding().materialize_pending();
  }

  /// The module whole again at the end of fit (every unit gathered; they are released at the next
  /// step, if another fit or a manual step follows). Lightning's Strategy.on_train_end.
  void on_train_end() { this->sharding().gather_all(); }
  /// Sharded (the default): this rank's chunks of the weights and where each weight lies
  /// (src/distributed/sharded_module_state.hpp), nothing gathered; each rank's chunks go to its
  /// own file when saved. Full: copied to the CPU tensor by tensor, a unit gathered at a time.
  StateDict get_module_state_dict(const torch::nn::Module& module) { return this->sharding().module_state(module); }
  /// A sharded state laid out as this run's loads each rank's chunks straight into its shards;
  /// any other state — whole, or sharded on another world size or other units — is loaded into the
  /// gathered module, each rank's chunk then copied into its shards.
  void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true) {
    this->sharding().load_module_state(module, state, strict);
  }

  /// Statistics for tests and docs (src/distributed/parameter_gatherer.hpp), or null before an
  /// optimizer is set up.
  const distributed::ParameterGatherer* parameter_gatherer() { return this->sharding().gatherer(); }
  /// The submodules the wrap policy made units of.
  const std::vector<std::string>& wrapped_units() { return this->sharding().wrapped_units(); }
  /// A meta-built model: what its materialisation took (modules, most bytes whole at once).
  const distributed::MaterializeStats& materialize_stats() { return this->sharding().materialize_stats(); }

 private:
  std::unique_ptr<distributed::ParameterSharding> make_sharding() {
    return std::make_unique<distributed::ParameterSharding>(this->data_parallel(), options_);
  }

  FSDPOptions options_;
};

}  // namespace fulgur
