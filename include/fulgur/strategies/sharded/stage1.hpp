#pragma once
// ShardedStrategy<1> ("deepspeed_stage_1"): DDP whose ranks each keep the optimizer state of 1/N of
// the parameters. Gradients are averaged while backward runs, as under DDPStrategy; the optimizer
// then steps this rank's shard of the flat parameters and the shards are all-gathered. Unscaling,
// clipping, zero_grad and toggle_optimizer see the module's whole gradients, as under DDP, so stage 1
// trains as DDP does, bit for bit, with any element-wise torch::optim optimizer (SGD, Adam, AdamW,
// Adagrad, RMSprop).
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string_view>

#include "fulgur/strategies/sharded/base.hpp"

namespace fulgur {

template <class Backend>
class ShardedStrategy<1, Backend>
    : public detail::ShardedStrategyBase<ShardedStrategy<1, Backend>, Backend, distributed::OptimizerSharding> {
  using Base = detail::ShardedStrategyBase<ShardedStrategy<1, Backend>, Backend, distributed::OptimizerSharding>;

 public:
  static constexpr std::string_view name = "deepspeed_stage_1";
  static constexpr std::string_view class_name = "ShardedStrategy<1>";  ///< a profiler's "[Strategy]..." actions
  using options_type = DDPOptions;
  // Not explicit, as DDPStrategy's.
  ShardedStrategy(DDPOptions options = {}) : Base(options) {}

  /// DDP's set-up (rank 0's weights broadcast, the gradient hooks); the optimizers are laid out anew.
  void setup_module(torch::nn::Module& module) {
    this->sharding().reset();
    Base::setup_module(module);
  }
  /// Unscales the whole averaged gradients (alike on every rank), then steps this rank's shard.
  template <class Precision>
  bool optimizer_step(torch::optim::Optimizer& optimizer, Precision& precision) {
    precision.unscale_gradients(optimizer);
    return this->sharding().step(optimizer, [&] { return precision.optimizer_step(optimizer); });
  }
};

}  // namespace fulgur
