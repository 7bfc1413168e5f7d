// Stage 2 of the sharded strategy: the gradients reduce-scattered into the optimizers' shards
// (include/fulgur/strategies/sharded/sharding.hpp: GradientSharding).
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "fulgur/errors.hpp"
#include "fulgur/precision/grad_scaler.hpp"
#include "fulgur/strategies/clipping.hpp"
#include "src/distributed/process_group.hpp"
#include "src/strategies/sharded/gradient_check.hpp"
#include "src/strategies/sharded/state.hpp"

#include <algorithm>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace fulgur::distributed {
namespace {

// The modules laid out by a GradientSharding (stage 2 or 3), with what finds their non-finite gradients.
// A module is known by its address and its first parameter: the sharding holds its parameters, so a
// module made later at the address of one destroyed is not taken for it.
struct Registered {
  const void* owner;
  const c10::TensorImpl* first_parameter;
  NonFiniteGradientNames names;
};
std::mutex registry_mutex;
std::unordered_map<const torch::nn::Module*, Registered>& registry() {
  static std::unordered_map<const torch::nn::Module*, Registered> modules;
  return modules;
}
const c10::TensorImpl* first_parameter(const torch::nn::Module& module) {
  const auto parameters = module.parameters();
  return parameters.empty() ? nullptr : parameters.front().unsafeGetTensorImpl();
}

}  // namespace

void remember_sharded_module(const torch::nn::Module& module, const void* owner, NonFiniteGradientNames names) {
  std::lock_guard lock(registry_mutex);
  registry()[&module] = Registered{owner, first_parameter(module), std::move(names)};
}

void forget_sharded_modules(const void* owner) {
  std::lock_guard lock(registry_mutex);
  std::erase_if(registry(), [&](const auto& entry) { return entry.second.owner == owner; });
}

std::vector<std::string> non_finite_gradient_names(const std::vector<std::unique_ptr<OptimizerShard>>& shards,
                                          const std::vector<std::pair<std::string, at::Tensor>>& named,
                                          ProcessGroup& group) {
  at::NoGradGuard no_grad;
  std::unordered_map<const void*, std::size_t> index;
  for (std::size_t i = 0; i < named.size(); ++i) index.emplace(named[i].second.unsafeGetTensorImpl(), i);
  std::vector<at::Tensor> bad(named.size() + 1);  // the last: a parameter outside the module
  const std::int64_t rank = group.rank();
  at::Device device = at::kCPU;
  for (const auto& shard : shards)
    for (const OptimizerShard::Bucket* b : shard->buckets()) {
      device = b->shard_grad.device();
      const std::int64_t chunk = b->shard_grad.numel(), begin = rank * chunk, end = begin + chunk;
      for (const OptimizerShard::Slot& s : b->slots) {
        const std::int64_t from = std::max(begin, s.offset), to = std::min(end, s.offset + s.param.numel());
        if (from >= to) continue;
        const auto found = index.find(s.param.unsafeGetTensorImpl());
        at::Tensor& flag = bad[found == index.end() ? named.size() : found->second];
        const at::Tensor here = at::isfinite(b->shard_grad.narrow(0, from - begin, to - from)).all().logical_not();
        flag = flag.defined() ? flag.logical_or(here) : here;
      }
    }
  for (at::Tensor& flag : bad)
    if (!flag.defined()) flag = at::zeros({}, at::TensorOptions().dtype(at::kBool).device(device));
  at::Tensor flags = at::stack(bad).to(at::kInt);
  group.all_reduce(flags, ReduceOp::max);
  flags = flags.cpu();  // the one host sync of the check
  std::vector<std::string> names;
  const int* data = flags.data_ptr<int>();
  for (std::size_t i = 0; i < bad.size(); ++i)
    if (data[i] != 0) names.push_back(i < named.size() ? named[i].first : "(a parameter the module does not name)");
  return names;
}

std::optional<std::vector<std::string>> sharded_non_finite_gradients(const torch::nn::Module& module) {
  NonFiniteGradientNames names;
  {
    std::lock_guard lock(registry_mutex);
    const auto found = registry().find(&module);
    if (found == registry().end() || found->second.first_parameter != first_parameter(module)) return std::nullopt;
    names = found->second.names;
  }
  return names();
}

GradientSharding::GradientSharding(DataParallel& ddp) : OptimizerSharding(ddp), gradients_(std::make_unique<Gradients>()) {}
GradientSharding::~GradientSharding() { forget_sharded_modules(this); }

void GradientSharding::reset() {
  forget_sharded_modules(this);
  gradients_->reducer.reset();  // first: its destructor removes its hooks
  OptimizerSharding::reset();
}

void GradientSharding::set_module(torch::nn::Module& module) {
  reset();
  gradients_->named_parameters = ddp().broadcast_module(module);  // meta tensors: broadcast when materialised
  remember_sharded_module(module, this, [this] {
    return non_finite_gradient_names(shards(), gradients_->named_parameters, ddp().group());
  });
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

void GradientSharding::begin_backward() {
  // A param group added since the reducer was built (BackboneFinetuning's unfreeze at an epoch's
  // start) is laid out now, and the reducer built again over the new buckets, before any gradient
  // of its parameters arrives. Without added groups: a size comparison per optimizer.
  std::size_t buckets = 0;
  for (const auto& shard : shards()) {
    if (shard->adds_groups()) shard->lay_out_added_groups();
    buckets += shard->buckets().size();
    if (const at::Tensor* p = shard->unfrozen()) {
      std::string name = "(a parameter outside the module)";
      for (const auto& [n, q] : gradients_->named_parameters)
        if (q.unsafeGetTensorImpl() == p->unsafeGetTensorImpl()) name = n;
      const std::string stage = shard->shards_parameters() ? "3" : "2";
      throw MisconfigurationError("fulgur: ShardedStrategy<" + stage + ">: '" + name + "' was frozen when the "
                                  "strategy laid its optimizer out and requires grad now; its gradient would not be "
                                  "reduced across the ranks. Give the optimizer the trainable parameters only (as "
                                  "BackboneFinetuning expects: the unfrozen ones then come as a new param group), "
                                  "or use ShardedStrategy<1> or DDPStrategy.");
    }
  }
  if (gradients_->reducer && gradients_->reducer->bucket_count() != buckets) gradients_->reducer.reset();
  sharded_reducer().prepare_for_backward();
}
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
