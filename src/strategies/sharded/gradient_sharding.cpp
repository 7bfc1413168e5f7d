// Stage 2 of the sharded strategy: the gradients reduce-scattered into the optimizers' shards
// (include/fulgur/strategies/sharded/sharding.hpp: GradientSharding).
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "fulgur/errors.hpp"
#include "fulgur/precision/grad_scaler.hpp"
#include "fulgur/strategies/clipping.hpp"
#include "src/distributed/process_group.hpp"
#include "src/strategies/sharded/state.hpp"

namespace fulgur::distributed {

GradientSharding::GradientSharding(DataParallel& ddp) : OptimizerSharding(ddp), gradients_(std::make_unique<Gradients>()) {}
GradientSharding::~GradientSharding() = default;

void GradientSharding::reset() {
  gradients_->reducer.reset();  // first: its destructor removes its hooks
  OptimizerSharding::reset();
}

void GradientSharding::set_module(torch::nn::Module& module) {
  reset();
  gradients_->named_parameters = ddp().broadcast_module(module);  // meta tensors: broadcast when materialised
}

void GradientSharding::add_optimizer(torch::optim::Optimizer& optimizer) {
  const DDPOptions& o = ddp().options();
  add_optimizer(optimizer, ShardLayout{o.first_bucket_bytes, o.bucket_bytes}, /*shard_parameters=*/false);
}

void GradientSharding::add_optimizer(torch::optim::Optimizer& optimizer, const ShardLayout& layout, bool shard_parameters) {
  gradients_->reducer.reset();  // laid out again over every optimizer at the next backward
  OptimizerSharding::add_optimizer(optimizer, layout, shard_parameters);
}

ShardedGradientReducer& GradientSharding::sharded_reducer() {
  if (!gradients_->reducer) {
    if (shards().empty())
      throw MisconfigurationError("fulgur: ShardedStrategy: backward before any optimizer was set up; the "
                                  "gradients are reduced into the optimizers' shards (return them from "
                                  "configure_optimizers, or pass them to setup).");
    std::vector<OptimizerShard*> all;
    for (const auto& shard : shards()) all.push_back(shard.get());
    gradients_->reducer = std::make_unique<ShardedGradientReducer>(ddp().group(), all, gradients_->named_parameters,
                                                                   ddp().options().find_unused_parameters);
  }
  return *gradients_->reducer;
}

const ShardedGradientReducer* GradientSharding::reducer() const { return gradients_->reducer.get(); }

void GradientSharding::begin_backward() { sharded_reducer().prepare_for_backward(); }
void GradientSharding::end_backward() { sharded_reducer().finalize_backward(); }
void GradientSharding::abandon_backward() noexcept {
  if (gradients_->reducer) gradients_->reducer->abandon_backward();
}
bool* GradientSharding::sync_flag() { return sharded_reducer().sync_flag(); }

void GradientSharding::unscale(torch::optim::Optimizer& optimizer, GradScaler& scaler, c10::function_ref<void()> unscale) {
  if (!scaler.is_enabled() || scaler.stage(optimizer) != GradScaler::Stage::ready) return;
  {
    auto view = shard_of(optimizer).with_shards();
    unscale();
  }
  scaler.for_each_found_inf(optimizer, [this](const at::Tensor& flag) { ddp().group().all_reduce(flag, ReduceOp::sum); });
}

at::Tensor GradientSharding::clip_norm(torch::optim::Optimizer& optimizer, double max_norm, double norm_type,
                                       bool error_if_nonfinite) {
  const auto& grads = shard_of(optimizer).shard_grads();
  if (grads.empty()) return at::zeros({});
  return clip_sharded_grad_norm(grads, max_norm, norm_type, error_if_nonfinite,
                                [this](const at::Tensor& t, ReduceOp op) { ddp().group().all_reduce(t, op); });
}

void GradientSharding::with_shards(torch::optim::Optimizer& optimizer, c10::function_ref<void()> fn) {
  auto view = shard_of(optimizer).with_shards();
  fn();
}

bool GradientSharding::step(torch::optim::Optimizer& optimizer, c10::function_ref<bool()> step) {
  OptimizerShard& shard = shard_of(optimizer);
  bool stepped = false;
  {
    auto view = shard.with_shards();
    stepped = step();
  }
  if (stepped) shard.gather_parameters();
  if (gradients_->reducer) gradients_->reducer->gradients_consumed(shard);
  return stepped;
}

}  // namespace fulgur::distributed
