// ZeRO stage 1 for one optimizer (include/fulgur/distributed/optimizer_shard.hpp).
#include "fulgur/distributed/optimizer_shard.hpp"

#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/lbfgs.h>

#include <algorithm>
#include <string>

#include "fulgur/errors.hpp"

namespace fulgur::distributed {

/// The trainable parameters of one param group of one dtype and device, packed.
struct OptimizerShard::Unit {
  std::vector<at::Tensor> params;
  at::Tensor weights;     // flat, padded to a multiple of the world size; the params alias it
  at::Tensor shard;       // this rank's slice of `weights`: what the optimizer steps
  at::Tensor shard_grad;  // its gradient
  at::Tensor send;        // the shard's copy, sent by the all-gather
  std::int64_t numel = 0, shard_begin = 0;
};

namespace {
/// `sizes` elements of `flat` from `offset` on, sharing its storage. Not an autograd view: an
/// optimizer's zero_grad detaches gradients in place, which LibTorch refuses for views.
at::Tensor alias(const at::Tensor& flat, std::int64_t offset, at::IntArrayRef sizes) {
  at::Tensor t = at::empty({0}, flat.options());
  t.set_(flat.storage(), flat.storage_offset() + offset, sizes);
  return t;
}

/// LibTorch's Adagrad creates its state in its constructor (sum = initial_accumulator_value, step 0);
/// untouched, it is dropped here and made again for the shards.
bool fresh_adagrad(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<torch::optim::Adagrad*>(&optimizer) == nullptr) return false;
  for (const auto& [key, state] : optimizer.state())
    if (static_cast<const torch::optim::AdagradParamState&>(*state).step() != 0) return false;
  return true;
}
}  // namespace

OptimizerShard::OptimizerShard(ProcessGroup& group, torch::optim::Optimizer& optimizer)
    : group_(group), optimizer_(&optimizer) {
  if (dynamic_cast<torch::optim::LBFGS*>(&optimizer) != nullptr)
    throw MisconfigurationError("fulgur: ShardedStrategy cannot shard LBFGS: its step takes dot products over every "
                                "parameter at once; use DDPStrategy with LBFGS.");
  const bool adagrad = fresh_adagrad(optimizer);
  if (!optimizer.state().empty() && !adagrad)
    throw MisconfigurationError("fulgur: ShardedStrategy: the optimizer already holds state (it stepped, or a state "
                                "was loaded into it) before fit set it up; let fit create it in configure_optimizers, "
                                "and resume with FitOptions::ckpt_path.");
  optimizer.state().clear();
  const int world = group.size(), rank = group.rank();
  at::NoGradGuard no_grad;
  std::vector<const void*> packed;  // a parameter listed twice (tied weights) is packed, and stepped, once
  for (auto& param_group : optimizer.param_groups()) {
    std::vector<std::unique_ptr<Unit>> units;  // this group's, in order of first appearance
    std::vector<at::Tensor> frozen;
    for (const at::Tensor& p : param_group.params()) {
      if (!p.requires_grad()) {  // never has a gradient: the optimizer passes over it, as before
        frozen.push_back(p);
        continue;
      }
      if (std::find(packed.begin(), packed.end(), p.unsafeGetTensorImpl()) != packed.end()) continue;
      packed.push_back(p.unsafeGetTensorImpl());
      auto it = std::find_if(units.begin(), units.end(), [&](const auto& u) {
        return u->params.front().scalar_type() == p.scalar_type() && u->params.front().device() == p.device();
      });
      if (it == units.end()) {
        units.push_back(std::make_unique<Unit>());
        it = std::prev(units.end());
      }
      (*it)->params.push_back(p);
      (*it)->numel += p.numel();
    }
    std::vector<at::Tensor> shards;
    for (auto& unit : units) {
      const at::TensorOptions options = unit->params.front().options().requires_grad(false);
      const std::int64_t per_rank = (unit->numel + world - 1) / world;
      unit->weights = at::zeros({per_rank * world}, options);
      std::int64_t offset = 0;
      for (at::Tensor& p : unit->params) {
        at::Tensor in_flat = alias(unit->weights, offset, p.sizes());
        in_flat.copy_(p);
        p.set_data(in_flat);  // the module's parameter, the same tensor object, now in the flat buffer
        offset += p.numel();
      }
      unit->shard_begin = rank * per_rank;
      unit->shard = alias(unit->weights, unit->shard_begin, {per_rank});
      unit->shard_grad = at::zeros({per_rank}, options);
      unit->shard.mutable_grad() = unit->shard_grad;
      unit->send = at::empty({per_rank}, options);
      if (adagrad) {
        const auto& defaults = static_cast<const torch::optim::AdagradOptions&>(param_group.options());
        auto state = std::make_unique<torch::optim::AdagradParamState>();
        state->step(0);
        state->sum(at::full_like(unit->shard, defaults.initial_accumulator_value()));
        optimizer.state()[unit->shard.unsafeGetTensorImpl()] = std::move(state);
      }
      shards.push_back(unit->shard);
      units_.push_back(std::move(unit));
    }
    shards.insert(shards.end(), frozen.begin(), frozen.end());
    swapped_params_.push_back(std::move(shards));
  }
}

OptimizerShard::~OptimizerShard() = default;

OptimizerShard::ShardView::ShardView(OptimizerShard& shard) : shard_(shard) {
  auto& groups = shard_.optimizer_->param_groups();
  if (groups.size() != shard_.swapped_params_.size())
    throw MisconfigurationError("fulgur: ShardedStrategy: the optimizer has " + std::to_string(groups.size()) +
                                " param groups, but had " + std::to_string(shard_.swapped_params_.size()) +
                                " when the strategy set it up; add param groups before fit (in configure_optimizers).");
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g].params().swap(shard_.swapped_params_[g]);
}

OptimizerShard::ShardView::~ShardView() {
  auto& groups = shard_.optimizer_->param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g].params().swap(shard_.swapped_params_[g]);
}

void OptimizerShard::copy_gradients() {
  at::NoGradGuard no_grad;
  for (auto& unit : units_) {
    const std::int64_t begin = unit->shard_begin, end = begin + unit->shard.numel();
    std::int64_t offset = 0;  // the padding's gradient stays zero: no parameter covers it
    for (const at::Tensor& p : unit->params) {
      const std::int64_t from = std::max(begin, offset), to = std::min(end, offset + p.numel());
      if (from < to) {
        at::Tensor target = unit->shard_grad.narrow(0, from - begin, to - from);
        if (p.grad().defined()) target.copy_(p.grad().reshape({-1}).narrow(0, from - offset, to - from));
        else target.zero_();
      }
      offset += p.numel();
    }
  }
}

void OptimizerShard::gather_parameters() {
  at::NoGradGuard no_grad;
  for (auto& unit : units_) {
    unit->send.copy_(unit->shard);
    group_.all_gather_into(unit->weights, unit->send);
  }
}

std::int64_t OptimizerShard::shard_numel() const {
  std::int64_t n = 0;
  for (const auto& unit : units_) n += unit->shard.numel();
  return n;
}

std::int64_t OptimizerShard::full_numel() const {
  std::int64_t n = 0;
  for (const auto& unit : units_) n += unit->numel;
  return n;
}

}  // namespace fulgur::distributed
