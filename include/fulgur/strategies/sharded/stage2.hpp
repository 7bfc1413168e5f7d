#pragma once
// ShardedStrategy<2> ("deepspeed_stage_2"): stage 1, with the gradients sharded too. Backward
// reduce-scatters them bucket by bucket into the shards and frees the module's, so a rank holds 1/N
// of them; the loss scaler's inf check and the clipping norm are reduced across the ranks. The
// module's parameters have no .grad after backward. Stage 3 (stage3.hpp) steps the same way.
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string_view>

#include "fulgur/compatibility.hpp"
#include "fulgur/strategies/clipping.hpp"
#include "fulgur/strategies/sharded/base.hpp"

namespace fulgur {
namespace detail {

/// Backward, unscaling, clipping and the step of the stages whose gradients are sharded (2 and 3).
template <class Derived, class Backend, class Sharding>
class GradientShardedStrategyBase : public ShardedStrategyBase<Derived, Backend, Sharding> {
  using Base = ShardedStrategyBase<Derived, Backend, Sharding>;

 public:
  using Base::Base;

  /// Rank 0's weights to every rank; the optimizers are laid out anew after it.
  void setup_module(torch::nn::Module& module) { this->sharding().set_module(module); }

  /// Backward with each bucket's gradients reduce-scattered into the shards as soon as they are
  /// ready; the module's parameters keep no gradient.
  template <class Precision>
  void backward(const at::Tensor& loss, torch::nn::Module& module, Precision& precision) {
    Sharding& sharding = this->sharding();
    precision.pre_backward(loss, module);
    sharding.begin_backward();
    try {
      precision.backward(loss, module);
    } catch (...) {
      sharding.abandon_backward();  // buckets already sent must not land later
      throw;
    }
    sharding.end_backward();
    precision.post_backward(loss, module);
  }
  /// While alive, backward accumulates on the parameters without communicating.
  distributed::NoSyncGuard no_backward_sync(torch::nn::Module&, bool enabled = true) {
    return distributed::NoSyncGuard(enabled ? this->sharding().sync_flag() : nullptr);
  }

  /// Each rank unscales its shard of the gradients; the inf/NaN flags are then summed over the
  /// ranks, so that all skip alike.
  template <class Precision>
  void unscale_gradients(torch::optim::Optimizer& optimizer, Precision& precision) {
    if constexpr (uses_loss_scaler<Precision>)
      this->sharding().unscale(optimizer, precision.scaler(), [&] { precision.unscale_gradients(optimizer); });
  }
  /// The norm of the whole gradients, from every rank's shard (sum of |g|^p, or the max,
  /// all-reduced), then each rank scales its shard.
  template <class Precision>
  at::Tensor clip_gradients_norm(torch::nn::Module&, torch::optim::Optimizer& optimizer, double max_norm,
                                 double norm_type, bool error_if_nonfinite, Precision& precision) {
    unscale_gradients(optimizer, precision);
    return this->sharding().clip_norm(optimizer, max_norm, norm_type,
                                      error_if_nonfinite && !uses_loss_scaler<Precision>);
  }
  /// Element-wise: each rank clips its own shard.
  template <class Precision>
  void clip_gradients_value(torch::nn::Module&, torch::optim::Optimizer& optimizer, double clip_value,
                            Precision& precision) {
    unscale_gradients(optimizer, precision);
    this->sharding().with_shards(optimizer, [&] { clip_grad_value(precision.main_params(optimizer), clip_value); });
  }
  /// Steps this rank's shard (its gradients from the reduce-scatter), then gathers every rank's.
  template <class Precision>
  bool optimizer_step(torch::optim::Optimizer& optimizer, Precision& precision) {
    unscale_gradients(optimizer, precision);
    return this->sharding().step(optimizer, [&] { return precision.optimizer_step(optimizer); });
  }

  /// The reducer (built at the first backward after the optimizers are set up), or null.
  const distributed::ShardedGradientReducer* sharded_gradient_reducer() { return this->sharding().reducer(); }
};

}  // namespace detail

template <class Backend>
class ShardedStrategy<2, Backend>
    : public detail::GradientShardedStrategyBase<ShardedStrategy<2, Backend>, Backend, distributed::GradientSharding> {
  using Base = detail::GradientShardedStrategyBase<ShardedStrategy<2, Backend>, Backend, distributed::GradientSharding>;

 public:
  static constexpr std::string_view name = "deepspeed_stage_2";
  static constexpr std::string_view class_name = "ShardedStrategy<2>";  ///< a profiler's "[Strategy]..." actions
  using options_type = DDPOptions;
  // Not explicit, as DDPStrategy's.
  ShardedStrategy(DDPOptions options = {}) : Base(options) {}
};

}  // namespace fulgur
