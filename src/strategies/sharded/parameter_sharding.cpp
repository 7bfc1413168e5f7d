// Stage 3 of the sharded strategy: the parameters sharded too, gathered a wrapped unit at a time
// (include/fulgur/strategies/sharded/sharding.hpp: ParameterSharding).
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <unordered_map>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/detail/meta_tensors.hpp"
#include "fulgur/errors.hpp"
#include "src/distributed/meta_init.hpp"
#include "src/distributed/sharded_module_state.hpp"
#include "src/strategies/sharded/gradient_check.hpp"
#include "src/strategies/sharded/state.hpp"

namespace fulgur::distributed {

ParameterSharding::ParameterSharding(DataParallel& ddp, const FSDPOptions& options)
    : GradientSharding(ddp), parameters_(std::make_unique<Parameters>()) {
  parameters_->options = options;
}

ParameterSharding::~ParameterSharding() {
  parameters_->gatherer.reset();  // first: its callback and hooks read the shards
}

void ParameterSharding::reset() {
  if (parameters_->gatherer) parameters_->gatherer->gather_all();  // the weights whole before they are laid out anew
  parameters_->gatherer.reset();  // first: its destructor removes its callback and hooks
  GradientSharding::reset();
}

void ParameterSharding::set_module(torch::nn::Module& module) {
  reset();
  gradients_->named_parameters = ddp().broadcast_module(module);  // meta tensors: broadcast when materialised
  parameters_->units = wrap_units(module, parameters_->options.auto_wrap);
  parameters_->module = &module;
  parameters_->meta_pending = meta_tensors(module);
  remember_sharded_module(module, static_cast<const GradientSharding*>(this), [this] {
    return non_finite_gradient_names(shards(), gradients_->named_parameters, ddp().group());
  });
}

bool ParameterSharding::module_to_device(torch::nn::Module& module, c10::Device device) {
  if (fulgur::detail::first_meta_tensor(module).empty()) return false;
  at::NoGradGuard no_grad;
  for (auto& t : module.parameters())
    if (t.defined() && !t.is_meta() && t.device() != device) t.set_data(t.to(device));
  for (auto& t : module.buffers())
    if (t.defined() && !t.is_meta() && t.device() != device) t.set_data(t.to(device));
  return true;
}

void ParameterSharding::add_optimizer(torch::optim::Optimizer& optimizer) {
  const DDPOptions& o = ddp().options();
  ShardLayout layout{o.first_bucket_bytes, o.bucket_bytes};
  // A bucket per wrapped unit (per param group, dtype and device).
  const WrappedUnits& units = parameters_->units;
  layout.bucket_params = ShardPlan::of(optimizer, ddp().environment().world_size, layout, [&units](const at::Tensor& p) {
                           return units.of(p.unsafeGetTensorImpl());
                         }).bucket_params();
  // The shard is made before the gatherer goes: if it refuses the optimizer, what was set up stays.
  GradientSharding::add_optimizer(optimizer, layout, /*shard_parameters=*/true);
  parameters_->gatherer.reset();
  materialize();  // a meta-built model: every tensor given memory (this optimizer's sharded) and a value
  rebuild_gatherer();
}

void ParameterSharding::materialize_pending() {
  if (parameters_->meta_pending.empty()) return;
  parameters_->gatherer.reset();  // its observer must not see the initialisation's ops; made again below
  materialize();
  if (!shards().empty()) rebuild_gatherer();
}

void ParameterSharding::unscale(torch::optim::Optimizer& optimizer, GradScaler& scaler, c10::function_ref<void()> unscale) {
  if (parameters_->gatherer) parameters_->gatherer->rethrow_failure();  // a failed gather: nothing is stepped
  GradientSharding::unscale(optimizer, scaler, unscale);
}

void ParameterSharding::begin_backward() {
  if (parameters_->gatherer) parameters_->gatherer->rethrow_failure();  // a gather in forward failed: the loss is not real
  GradientSharding::begin_backward();
}

void ParameterSharding::end_backward() {
  GradientSharding::end_backward();
  if (parameters_->gatherer) {
    parameters_->gatherer->release_all();  // the root unit and the last one used
    parameters_->gatherer->rethrow_failure();
  }
}

bool ParameterSharding::step(torch::optim::Optimizer& optimizer, c10::function_ref<bool()> step) {
  if (parameters_->gatherer) parameters_->gatherer->rethrow_failure();  // nothing is stepped after a failed gather
  OptimizerShard& shard = shard_of(optimizer);
  bool stepped = false;
  {
    auto view = shard.with_shards();
    stepped = step();
  }
  if (parameters_->gatherer) parameters_->gatherer->release_all();  // whole copies of the old weights: gathered anew on use
  if (stepped) shard.bump_versions();
  if (gradients_->reducer) gradients_->reducer->gradients_consumed(shard);
  return stepped;
}

void ParameterSharding::gather_all() {
  if (parameters_->gatherer) parameters_->gatherer->gather_all();
}

StateDict ParameterSharding::module_state(const torch::nn::Module& module) {
  ParameterGatherer* gatherer = parameters_->gatherer.get();
  if (gatherer == nullptr) return checkpoint::module_state_dict(module);
  gatherer->rethrow_failure();
  if (parameters_->options.state_dict_type == StateDictType::sharded) {
    for (const auto& shard : shards()) shard->keep_writes();  // a weight written in place while whole
    return sharded_module_state(module, shards(), ddp().environment().world_size);
  }
  const bool whole = gatherer->all_gathered();
  StateDict out;
  {
    at::NoGradGuard no_grad;
    for (const auto& [key, t] : state_tensors(module))  // one op per tensor: each unit gathered once
      out.insert(key, t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).detach());
  }
  gatherer->rethrow_failure();
  if (!whole) gatherer->release_all();
  return out;
}

void ParameterSharding::load_module_state(torch::nn::Module& module, const StateDict& state, bool strict) {
  ParameterGatherer* gatherer = parameters_->gatherer.get();
  if (gatherer == nullptr) return checkpoint::load_module_state_dict(module, state, strict);
  gatherer->rethrow_failure();
  const bool sharded = is_sharded_module_state(state);
  const int world = ddp().environment().world_size;
  if (sharded) {
    gatherer->release_all();
    if (same_module_layout(state, sharded_module_state(module, shards(), world, /*with_shard=*/false))) {
      load_own_chunks(module, state);
      return;
    }
  }
  const StateDict whole = sharded ? consolidate_module_state(state) : state;
  gatherer->gather_all();
  checkpoint::load_module_state_dict(module, whole, strict);
  for (const auto& shard : shards()) shard->scatter_parameters();  // each rank's chunk into its shards
  gatherer->release_all();
}

/// This rank's chunks (its file, or the state in memory) into its shards, the whole tensors into the
/// module; the layouts were compared first.
void ParameterSharding::load_own_chunks(torch::nn::Module& module, const StateDict& state) {
  const int rank = ddp().environment().rank;
  const std::vector<at::Tensor> chunks = sharded_module_chunks(state, rank, /*own_rank=*/true);
  at::NoGradGuard no_grad;
  std::size_t i = 0;
  for (const auto& shard : shards())
    for (auto* bucket : shard->buckets()) {
      if (i >= chunks.size() || chunks[i].numel() != bucket->shard.numel())
        throw CheckpointError("fulgur: ShardedStrategy: rank " + std::to_string(rank) + "'s weights file does not "
                              "hold the chunks its manifest describes (bucket " + std::to_string(i) + "); the .shards "
                              "folder is not the one this checkpoint wrote.");
      bucket->shard.copy_(chunks[i++].reshape(bucket->shard.sizes()));
    }
  std::unordered_map<std::string, at::Tensor> tensors;
  for (const auto& item : module.named_parameters()) tensors.emplace(item.key(), item.value());
  for (const auto& item : module.named_buffers()) tensors.emplace(item.key(), item.value());
  for (const auto& item : state.at("whole").toGenericDict()) {
    const std::string& key = item.key().toStringRef();
    const at::Tensor value = item.value().toTensor();
    const auto found = tensors.find(key);
    if (found == tensors.end() || found->second.sizes() != value.sizes())
      throw CheckpointError("fulgur: the state_dict does not fit the module: '" + key + "' " +
                            (found == tensors.end() ? std::string("is not the module's")
                                                    : "has shape " + c10::str(value.sizes()) + ", the module's " +
                                                          c10::str(found->second.sizes())) + ".");
    found->second.copy_(value);
  }
  for (const auto& shard : shards()) shard->bump_versions();  // a graph saved before the load is refused
}

void ParameterSharding::rebuild_gatherer() {
  std::vector<ParameterGatherer::Entry> entries;
  for (const auto& shard : shards())
    for (auto* bucket : shard->buckets())
      entries.push_back({shard.get(), bucket, parameters_->units.of(bucket->slots.front().param.unsafeGetTensorImpl())});
  parameters_->gatherer = std::make_unique<ParameterGatherer>(std::move(entries));
}

void ParameterSharding::materialize() {
  Parameters& p = *parameters_;
  if (p.meta_pending.empty() || p.module == nullptr) return;
  const auto stats = materialize_meta(*p.module, ddp().device(), p.options.param_init, shards(), ddp().group(), p.meta_pending);
  p.materialized.modules += stats.modules;
  p.materialized.whole_bytes += stats.whole_bytes;
  p.materialized.peak_bytes = std::max(p.materialized.peak_bytes, stats.peak_bytes);
}

const ParameterGatherer* ParameterSharding::gatherer() const { return parameters_->gatherer.get(); }
const std::vector<std::string>& ParameterSharding::wrapped_units() const { return parameters_->units.names; }
const MaterializeStats& ParameterSharding::materialize_stats() const { return parameters_->materialized; }

}  // namespace fulgur::distributed
