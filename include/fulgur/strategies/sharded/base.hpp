#pragma once
// What the three stages of ShardedStrategy share (strategies/sharded.hpp): DDP's processes and
// collectives, the optimizers' shards and their state, and the checkpoint format — a manifest and
// each rank's shards beside it. `Sharding` is the stage's part in libfulgur (sharded/sharding.hpp).
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "fulgur/state_dict.hpp"
#include "fulgur/strategies/ddp.hpp"
#include "fulgur/strategies/sharded/options.hpp"
#include "fulgur/strategies/sharded/sharding.hpp"

namespace fulgur {

/// ShardedStrategy<1>, <2> and <3> (strategies/sharded/stage*.hpp); any other stage is an error.
template <int Stage, class Backend = backend::Auto>
class ShardedStrategy;

namespace detail {

template <class Derived, class Backend, class Sharding>
class ShardedStrategyBase : public BasicDDPStrategy<Backend, Derived> {
  using Base = BasicDDPStrategy<Backend, Derived>;

 public:
  using Base::Base;

  /// Lays the optimizer's parameters out in shards (it must hold no state yet).
  void setup_optimizer(torch::optim::Optimizer& optimizer) { sharding().add_optimizer(optimizer); }
  /// This rank's shard of the optimizer state; save_checkpoint writes each rank's beside the manifest.
  StateDict get_optimizer_state(torch::optim::Optimizer& optimizer) { return sharding().optimizer_state(optimizer); }
  /// A state written on as many ranks, on another number (resharded), or unsharded (sharded here).
  void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state) {
    sharding().load_optimizer_state(optimizer, state);
  }
  /// Every rank writes its shards to `<path>.shards/<id>/rank<r>.pt` (in parallel, each atomically),
  /// then global rank 0 writes `path`, the manifest, and removes the shard files of the checkpoint it
  /// replaced: a crash at any point leaves the previous manifest and its files whole. (Every rank
  /// must see the same folder: a shared file system across nodes.)
  void save_checkpoint(const std::string& path, const StateDict& state) { sharding().save_checkpoint(path, state); }

  /// What the optimizers hold, per rank (src/distributed/optimizer_shard.hpp).
  const std::vector<std::unique_ptr<distributed::OptimizerShard>>& optimizer_shards() { return sharding().shards(); }

  /// No collective here (a peer may be gone, or still inside a step).
  void teardown() {
    sharding_.reset();
    Base::teardown();
  }

 protected:
  /// The stage's part in libfulgur, made once the processes have met.
  Sharding& sharding() {
    if (!sharding_) sharding_ = static_cast<Derived&>(*this).make_sharding();
    return *sharding_;
  }
  std::unique_ptr<Sharding> make_sharding() { return std::make_unique<Sharding>(this->data_parallel()); }

 private:
  std::unique_ptr<Sharding> sharding_;
};

}  // namespace detail
}  // namespace fulgur
