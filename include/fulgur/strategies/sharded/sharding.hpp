#pragma once
// What ShardedStrategy<Stage> does apart from the precision and the accelerator, compiled once in
// libfulgur (src/strategies/sharded/): one class per stage, each adding to the one before.
//   OptimizerSharding  stage 1: each optimizer's state kept as 1/N per rank. Gradients are averaged
//                      whole (DDP's reducer); the step runs on this rank's shard of the flat
//                      parameters, then every rank's shard is all-gathered.
//   GradientSharding   stage 2: gradients too. Backward reduce-scatters them bucket by bucket into
//                      the shards and frees the module's; the loss scaler's inf check and the
//                      clipping norm are reduced across the ranks.
//   ParameterSharding  stage 3: parameters too, gathered a WrapPolicy unit at a time when an op first
//                      reads them; a model built on the meta device is materialised already sharded.
// The internals (the shards' layout, the reducer, the gatherer, the materialisation) stay in
// src/distributed/; the strategy (strategies/sharded/stage*.hpp) holds one of these.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/FunctionRef.h>

#include <memory>
#include <string>
#include <vector>

#include "fulgur/distributed/data_parallel.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/strategies/sharded/options.hpp"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace fulgur {

class GradScaler;

namespace distributed {

class OptimizerShard;          // src/distributed/optimizer_shard.hpp
class ShardedGradientReducer;  // src/distributed/sharded_reducer.hpp
class ParameterGatherer;       // src/distributed/parameter_gatherer.hpp
struct ShardLayout;

class OptimizerSharding {
 public:
  explicit OptimizerSharding(DataParallel& ddp);
  ~OptimizerSharding();
  OptimizerSharding(const OptimizerSharding&) = delete;
  OptimizerSharding& operator=(const OptimizerSharding&) = delete;

  /// A module set up again starts afresh: its optimizers are set up after it.
  void reset();
  /// Lays the optimizer's parameters out in shards (it must hold no state yet).
  void add_optimizer(torch::optim::Optimizer& optimizer);
  /// This rank's shard copied out of the whole averaged gradients, `step` (the precision's) run on
  /// it, every rank's shard gathered back if it stepped; returns whether it did.
  bool step(torch::optim::Optimizer& optimizer, c10::function_ref<bool()> step);

  /// This rank's shard of the optimizer state (LibTorch's archive of its optimizer over the shard),
  /// with the layout: {"format": "fulgur-sharded-optimizer", "world_size", ..., "shard"}.
  StateDict optimizer_state(torch::optim::Optimizer& optimizer);
  /// This rank's shard of a state from optimizer_state: written by as many ranks, or by another
  /// number (resharded), or an unsharded state (a run on one device or under DDP: sharded here).
  void load_optimizer_state(torch::optim::Optimizer& optimizer, const StateDict& state);
  /// The checkpoint as a manifest at `path` and each rank's shards in a file beside it; every rank
  /// calls it (checkpoint format: src/strategies/sharded/checkpoint_format.cpp).
  void save_checkpoint(const std::string& path, const StateDict& state);

  /// What the optimizers hold, per rank: elements of the shards they step, and of the whole.
  const std::vector<std::unique_ptr<OptimizerShard>>& shards() const;

 protected:
  DataParallel& ddp();
  OptimizerShard& shard_of(const torch::optim::Optimizer& optimizer);
  /// add_optimizer with a layout of the stage's own.
  void add_optimizer(torch::optim::Optimizer& optimizer, const ShardLayout& layout, bool shard_parameters);

  struct State;
  std::unique_ptr<State> state_;
};

class GradientSharding : public OptimizerSharding {
 public:
  explicit GradientSharding(DataParallel& ddp);
  ~GradientSharding();

  void reset();
  /// Broadcasts rank 0's parameters and buffers (meta ones when materialised); keeps their names.
  void set_module(torch::nn::Module& module);
  void add_optimizer(torch::optim::Optimizer& optimizer);
  void begin_backward();
  void end_backward();
  void abandon_backward() noexcept;
  /// For NoSyncGuard: off, backward accumulates on the parameters without communicating.
  bool* sync_flag();
  /// `unscale` (the precision's) on this rank's shard of the gradients, then the inf flags summed
  /// over the ranks, so that every rank skips alike. Nothing when the scaler is off or has unscaled.
  void unscale(torch::optim::Optimizer& optimizer, GradScaler& scaler, c10::function_ref<void()> unscale);
  /// The norm of the whole gradients from every rank's shard; each rank scales its own.
  at::Tensor clip_norm(torch::optim::Optimizer& optimizer, double max_norm, double norm_type, bool error_if_nonfinite);
  /// Runs `fn` with the optimizer's parameters and gradients swapped for this rank's shards.
  void with_shards(torch::optim::Optimizer& optimizer, c10::function_ref<void()> fn);
  bool step(torch::optim::Optimizer& optimizer, c10::function_ref<bool()> step);

  /// The reducer (built at the first backward after the optimizers are set up), or null.
  const ShardedGradientReducer* reducer() const;

 protected:
  ShardedGradientReducer& sharded_reducer();
  void add_optimizer(torch::optim::Optimizer& optimizer, const ShardLayout& layout, bool shard_parameters);

  struct Gradients;
  std::unique_ptr<Gradients> gradients_;
};

class ParameterSharding : public GradientSharding {
 public:
  ParameterSharding(DataParallel& ddp, const FSDPOptions& options);
  ~ParameterSharding();

  /// The module whole again before it is laid out anew.
  void reset();
  void set_module(torch::nn::Module& module);
  /// A module with tensors on the meta device: its other tensors moved to `device`, the meta ones
  /// left for materialisation; false when it has none (moved as usual).
  bool module_to_device(torch::nn::Module& module, c10::Device device);
  /// Buckets cut at the wrapped units; a meta-built model materialised, this optimizer's shards first.
  void add_optimizer(torch::optim::Optimizer& optimizer);
  /// A meta-built module set up without an optimizer gets whole memory here.
  void materialize_pending();
  /// As stage 2's, after a gather that failed during an op is raised (nothing is stepped then).
  void unscale(torch::optim::Optimizer& optimizer, GradScaler& scaler, c10::function_ref<void()> unscale);
  void begin_backward();
  void end_backward();
  bool step(torch::optim::Optimizer& optimizer, c10::function_ref<bool()> step);
  /// Every unit gathered: the module whole (after fit, for its state_dict).
  void gather_all();
  /// Sharded (the default): this rank's chunks and where each weight lies; full: whole tensors on
  /// the CPU, gathered a unit at a time.
  StateDict module_state(const torch::nn::Module& module);
  void load_module_state(torch::nn::Module& module, const StateDict& state, bool strict);

  const ParameterGatherer* gatherer() const;
  const std::vector<std::string>& wrapped_units() const;
  const MaterializeStats& materialize_stats() const;

 private:
  void rebuild_gatherer();
  void materialize();
  void load_own_chunks(torch::nn::Module& module, const StateDict& state);

  struct Parameters;
  std::unique_ptr<Parameters> parameters_;
};

}  // namespace distributed
}  // namespace fulgur
