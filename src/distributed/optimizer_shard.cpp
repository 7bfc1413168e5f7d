// The ZeRO layout of one optimizer's parameters (include/fulgur/distributed/optimizer_shard.hpp).
#include "src/distributed/optimizer_shard.hpp"

#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/lbfgs.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::distributed {

/// The trainable parameters of one param group of one dtype and device, packed.
struct OptimizerShard::Unit {
  std::vector<at::Tensor> params;  // in layout order: reverse of the group's
  std::vector<Bucket> buckets;
  at::Tensor weights;     // flat, every bucket padded; the params alias it
  at::Tensor shard_grad;  // this rank's chunk of every bucket's gradient, side by side
  at::Tensor send;        // a copy of the rank's chunks, sent by the all-gathers (stage 3: the shards)
  std::int64_t numel = 0;
};

namespace {
/// `sizes` elements of `flat` from `offset` on, sharing its storage. Not an autograd view: an
/// optimizer's zero_grad detaches gradients in place, which LibTorch refuses for views.
at::Tensor alias(const at::Tensor& flat, std::int64_t offset, at::IntArrayRef sizes) {
  at::Tensor t = at::empty({0}, flat.options());
  t.set_(flat.storage(), flat.storage_offset() + offset, sizes);
  return t;
}

std::int64_t round_up(std::int64_t n, std::int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

/// LibTorch's Adagrad creates its state in its constructor (sum = initial_accumulator_value, step 0);
/// untouched, it is dropped here and made again for the shards.
bool fresh_adagrad(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<torch::optim::Adagrad*>(&optimizer) == nullptr) return false;
  for (const auto& [key, state] : optimizer.state())
    if (static_cast<const torch::optim::AdagradParamState&>(*state).step() != 0) return false;
  return true;
}
}  // namespace

ShardPlan ShardPlan::of(const torch::optim::Optimizer& optimizer, int world_size, const ShardLayout& layout,
                        const std::function<std::int64_t(const at::Tensor&)>& wrap_unit, std::size_t first_group) {
  const std::int64_t world = world_size;
  ShardPlan plan;
  std::size_t counted_bucket = 0;  // layout.bucket_params: the bucket being filled, and its parameters so far
  std::int64_t counted = 0;
  std::vector<const void*> packed;  // a parameter listed twice (tied weights) is packed, and stepped, once
  const auto& param_groups = optimizer.param_groups();
  for (std::size_t g = 0; g < first_group && g < param_groups.size(); ++g)  // laid out already
    for (const at::Tensor& p : param_groups[g].params())
      if (p.requires_grad()) packed.push_back(p.unsafeGetTensorImpl());
  for (std::size_t g = first_group; g < param_groups.size(); ++g) {
    const auto& param_group = param_groups[g];
    Group& group = plan.groups.emplace_back();
    std::vector<std::vector<at::Tensor>> units;  // this group's, in order of first appearance
    for (const at::Tensor& p : param_group.params()) {
      if (!p.requires_grad()) {  // never has a gradient: the optimizer passes over it, as before
        group.frozen.push_back(p);
        continue;
      }
      if (std::find(packed.begin(), packed.end(), p.unsafeGetTensorImpl()) != packed.end()) continue;
      packed.push_back(p.unsafeGetTensorImpl());
      auto it = std::find_if(units.begin(), units.end(), [&](const auto& u) {
        return u.front().scalar_type() == p.scalar_type() && u.front().device() == p.device();
      });
      if (it == units.end()) it = units.insert(units.end(), std::vector<at::Tensor>{});
      it->push_back(p);
    }
    for (auto& params : units) {
      std::reverse(params.begin(), params.end());  // backward's order: last layers first
      Unit& unit = group.units.emplace_back();
      const auto element = static_cast<std::int64_t>(params.front().element_size());
      const std::int64_t align = std::max<std::int64_t>(1, 64 / element);  // 64-byte starts: the kernels' alignment
      // A bucket ends where the next parameter would pass its cap, and is padded to world aligned chunks.
      std::int64_t cursor = 0, bytes = 0;
      auto close = [&] {
        Bucket& b = unit.buckets.back();
        b.content = cursor;
        b.numel = round_up(std::max<std::int64_t>(cursor, 1), align * world);
        std::int64_t end = 0;
        for (const Slot& s : b.slots) {
          if (s.offset > end) b.gaps.emplace_back(end, s.offset - end);
          end = s.offset + s.param.numel();
        }
        if (b.numel > end) b.gaps.emplace_back(end, b.numel - end);
      };
      std::int64_t wrapped = -1;  // the current bucket's wrapped submodule
      for (const at::Tensor& p : params) {
        const std::int64_t p_bytes = p.numel() * element;
        const auto cap = static_cast<std::int64_t>(unit.buckets.size() <= 1 ? layout.first_bucket_bytes
                                                                            : layout.bucket_bytes);
        bool cut = false;
        if (wrap_unit) {
          const std::int64_t id = wrap_unit(p);
          cut = id != wrapped;
          wrapped = id;
        } else if (!layout.bucket_params.empty()) {
          if (counted_bucket >= layout.bucket_params.size())
            throw CheckpointError("fulgur: ShardedStrategy: the layout names " + std::to_string(layout.bucket_params.size()) +
                                  " buckets, but the optimizer has more parameters than they hold; it was written "
                                  "for other parameters.");
          cut = counted == layout.bucket_params[counted_bucket] && counted > 0;
          if (cut) {
            ++counted_bucket;
            counted = 0;
            if (counted_bucket >= layout.bucket_params.size())
              throw CheckpointError("fulgur: ShardedStrategy: the optimizer has more parameters than the layout's " +
                                    std::to_string(layout.bucket_params.size()) + " buckets hold; it was written for "
                                    "other parameters.");
          }
          ++counted;
        } else {
          cut = cursor > 0 && bytes + p_bytes > cap;
        }
        if (unit.buckets.empty() || cut) {
          if (!unit.buckets.empty()) close();
          unit.buckets.emplace_back();
          cursor = bytes = 0;
        }
        const std::int64_t offset = round_up(cursor, align);
        unit.buckets.back().slots.push_back({p, offset});
        cursor = offset + p.numel();
        bytes += p_bytes;
        unit.numel += p.numel();
      }
      close();
      if (!layout.bucket_params.empty() && !wrap_unit) {  // a unit ends its bucket
        if (counted != layout.bucket_params[counted_bucket])
          throw CheckpointError("fulgur: ShardedStrategy: the layout's bucket " + std::to_string(counted_bucket) +
                                " holds " + std::to_string(layout.bucket_params[counted_bucket]) +
                                " parameters, the optimizer's " + std::to_string(counted) +
                                "; it was written for other parameters.");
        ++counted_bucket;
        counted = 0;
      }
    }
  }
  if (!layout.bucket_params.empty() && !wrap_unit && counted_bucket != layout.bucket_params.size())
    throw CheckpointError("fulgur: ShardedStrategy: the layout names " + std::to_string(layout.bucket_params.size()) +
                          " buckets, the optimizer's parameters fill " + std::to_string(counted_bucket) +
                          "; it was written for other parameters.");
  return plan;
}

std::vector<std::int64_t> ShardPlan::bucket_params() const {
  std::vector<std::int64_t> out;
  for (const Group& g : groups)
    for (const Unit& u : g.units)
      for (const Bucket& b : u.buckets) out.push_back(static_cast<std::int64_t>(b.slots.size()));
  return out;
}

OptimizerShard::OptimizerShard(ProcessGroup& group, torch::optim::Optimizer& optimizer, const ShardLayout& layout,
                               bool shard_parameters, std::optional<c10::Device> materialize_on)
    : group_(group), optimizer_(&optimizer), shard_parameters_(shard_parameters), layout_(layout) {
  if (dynamic_cast<torch::optim::LBFGS*>(&optimizer) != nullptr)
    throw MisconfigurationError("fulgur: ShardedStrategy cannot shard LBFGS: its step takes dot products over every "
                                "parameter at once; use DDPStrategy with LBFGS.");
  const bool adagrad = fresh_adagrad(optimizer);
  if (!optimizer.state().empty() && !adagrad)
    throw MisconfigurationError("fulgur: ShardedStrategy: the optimizer already holds state (it stepped, or a state "
                                "was loaded into it) before fit set it up; let fit create it in configure_optimizers, "
                                "and resume with " +
                                fulgur::detail::spelled("FitOptions::ckpt_path", "--ckpt_path") + ".");
  optimizer.state().clear();
  lay_out(ShardPlan::of(optimizer, group.size(), layout), 0, adagrad, materialize_on);
}

bool OptimizerShard::adds_groups() const {
  const auto& groups = optimizer_->param_groups();
  if (groups.size() < swapped_params_.size())
    throw MisconfigurationError("fulgur: ShardedStrategy: the optimizer has " + std::to_string(groups.size()) +
                                " param groups, but had " + std::to_string(swapped_params_.size()) +
                                " when the strategy laid it out; param groups may be added during fit, not removed.");
  return groups.size() > swapped_params_.size();
}

void OptimizerShard::lay_out_added_groups() {
  const std::size_t first = swapped_params_.size();
  if (shard_parameters_ || !layout_.bucket_params.empty())
    throw MisconfigurationError("fulgur: ShardedStrategy<3> cannot take a param group added during fit (its "
                                "parameters are sharded in wrapped units laid out at set-up); add every group in "
                                "configure_optimizers, or use ShardedStrategy<2>.");
  const ShardPlan plan = ShardPlan::of(*optimizer_, group_.size(), layout_, {}, first);
  // Every rank must add the same parameters at the same step, or the buckets laid out next would pair
  // other parameters' gradients and weights across the ranks. One collective, only when groups are
  // added: their count, and the added parameters' count and sizes, hashed (max of (x, -x) gives the
  // maximum and minus the minimum at once).
  std::uint64_t hash = 14695981039346656037ULL;  // FNV-1a
  const auto mix = [&](std::int64_t value) {
    for (std::size_t i = 0; i < sizeof value; ++i)
      hash = (hash ^ static_cast<std::uint64_t>((value >> (8 * i)) & 0xff)) * 1099511628211ULL;
  };
  std::int64_t added = 0;
  for (const auto& g : plan.groups)
    for (const auto& unit : g.units)
      for (const auto& bucket : unit.buckets)
        for (const auto& slot : bucket.slots) {
          mix(slot.param.numel());
          ++added;
        }
  const auto groups = static_cast<std::int64_t>(optimizer_->param_groups().size());
  const auto key = static_cast<std::int64_t>(hash >> 2);
  if (group_.size() > 1) {
    const std::vector<std::int64_t> mine{groups, -groups, added, -added, key, -key};
    const at::Tensor agreement = at::tensor(mine, at::TensorOptions().dtype(at::kLong)).to(unit_device(plan));
    group_.all_reduce(agreement, ReduceOp::max);
    const at::Tensor values = agreement.cpu();
    const std::int64_t* v = values.data_ptr<std::int64_t>();
    if (v[0] != -v[1] || v[2] != -v[3] || v[4] != -v[5])
      throw DistributedError("fulgur: ShardedStrategy: a param group was added to the optimizer on rank " +
                             std::to_string(group_.rank()) + " (now " + std::to_string(groups) + " groups, " +
                             std::to_string(added) + " trainable parameters added) but not in the same way on every "
                             "rank (" + std::to_string(-v[1]) + " to " + std::to_string(v[0]) + " groups, " +
                             std::to_string(-v[3]) + " to " + std::to_string(v[2]) + " parameters added); add param "
                             "groups on every rank at the same step (as BackboneFinetuning does, at an epoch's "
                             "start).");
  }
  lay_out(plan, first, dynamic_cast<torch::optim::Adagrad*>(optimizer_) != nullptr, std::nullopt);
}

const at::Tensor* OptimizerShard::unfrozen() const {
  for (const at::Tensor& p : frozen_)
    if (p.requires_grad()) return &p;
  return nullptr;
}

c10::Device OptimizerShard::unit_device(const ShardPlan& plan) const {
  for (const auto& g : plan.groups)
    for (const auto& unit : g.units) return unit.buckets.front().slots.front().param.device();
  return units_.empty() ? c10::Device(c10::kCPU) : units_.front()->shard_grad.device();
}

void OptimizerShard::lay_out(const ShardPlan& plan, std::size_t first_group, bool adagrad,
                             std::optional<c10::Device> materialize_on) {
  torch::optim::Optimizer& optimizer = *optimizer_;
  const bool shard_parameters = shard_parameters_;
  const std::int64_t world = group_.size(), rank = group_.rank();
  at::NoGradGuard no_grad;
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    const auto& param_group = optimizer.param_groups()[first_group + g];
    std::vector<at::Tensor> shards;
    for (const ShardPlan::Unit& planned : plan.groups[g].units) {
      auto unit = std::make_unique<Unit>();
      const at::Tensor& first = planned.buckets.front().slots.front().param;
      at::TensorOptions options = first.options().requires_grad(false);
      if (first.is_meta()) {
        if (!materialize_on || !shard_parameters)
          throw MisconfigurationError("fulgur: ShardedStrategy: the optimizer's parameters are on the meta device "
                                      "(built in init_module(/*empty_init=*/true)); only ShardedStrategy<3> "
                                      "materialises them, at set-up: build the model with init_module() instead.");
        options = options.device(*materialize_on);
      }
      std::int64_t total = 0;
      for (const auto& b : planned.buckets) total += b.numel;
      unit->numel = planned.numel;
      if (!shard_parameters) unit->weights = at::zeros({total}, options);
      unit->send = shard_parameters ? at::zeros({total / world}, options) : at::empty({total / world}, options);
      unit->shard_grad = at::zeros({total / world}, options);
      std::int64_t start = 0, chunk_start = 0;
      for (const auto& planned_bucket : planned.buckets) {
        Bucket& b = unit->buckets.emplace_back();
        b.slots = planned_bucket.slots;
        b.gaps = planned_bucket.gaps;
        b.numel = planned_bucket.numel;
        const std::int64_t chunk = b.numel / world;
        if (shard_parameters) {  // storage of its own, to be freed; the shard apart from it
          b.weights = at::zeros({b.numel}, options);
          b.send = alias(unit->send, chunk_start, {chunk});
          b.shard = b.send;
        } else {
          b.weights = alias(unit->weights, start, {b.numel});
          b.shard = alias(unit->weights, start + rank * chunk, {chunk});  // the module's weights: always current
          b.send = alias(unit->send, chunk_start, {chunk});
        }
        b.shard_grad = alias(unit->shard_grad, chunk_start, {chunk});
        b.shard.mutable_grad() = b.shard_grad;
        for (Slot& s : b.slots) {
          unit->params.push_back(s.param);
          at::Tensor in_flat = alias(b.weights, s.offset, s.param.sizes());
          if (s.param.is_meta()) {
            // No value to copy, and set_data refuses a change of device kind: the same tensor object
            // takes the flat buffer's memory directly (what set_data does after its check).
            s.param.unsafeGetTensorImpl()->shallow_copy_from(in_flat.getIntrusivePtr());
          } else {
            in_flat.copy_(s.param);
            s.param.set_data(in_flat);  // the module's parameter, the same tensor object, now in the flat buffer
          }
        }
        if (shard_parameters) {
          b.shard.copy_(b.weights.narrow(0, rank * chunk, chunk));
          release(b);
        }
        start += b.numel;
        chunk_start += chunk;
      }
      for (Bucket& b : unit->buckets) {
        if (adagrad) {
          const auto& defaults = static_cast<const torch::optim::AdagradOptions&>(param_group.options());
          auto state = std::make_unique<torch::optim::AdagradParamState>();
          state->step(0);
          state->sum(at::full_like(b.shard, defaults.initial_accumulator_value()));
          optimizer.state()[b.shard.unsafeGetTensorImpl()] = std::move(state);
        }
        shards.push_back(b.shard);
        buckets_.push_back(&b);
      }
      shard_grads_.push_back(unit->shard_grad);
      units_.push_back(std::move(unit));
    }
    shards.insert(shards.end(), plan.groups[g].frozen.begin(), plan.groups[g].frozen.end());
    frozen_.insert(frozen_.end(), plan.groups[g].frozen.begin(), plan.groups[g].frozen.end());
    swapped_params_.push_back(std::move(shards));
  }
}

OptimizerShard::~OptimizerShard() = default;

OptimizerShard::ShardView::ShardView(OptimizerShard& shard) : shard_(shard) {
  auto& groups = shard_.optimizer_->param_groups();
  if (groups.size() != shard_.swapped_params_.size())
    throw MisconfigurationError("fulgur: ShardedStrategy: the optimizer has " + std::to_string(groups.size()) +
                                " param groups, but had " + std::to_string(shard_.swapped_params_.size()) +
                                " when the strategy laid it out last (fulgur internal error: the strategy lays "
                                "added groups out before it uses the shards).");
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g].params().swap(shard_.swapped_params_[g]);
}

OptimizerShard::ShardView::~ShardView() {
  auto& groups = shard_.optimizer_->param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g].params().swap(shard_.swapped_params_[g]);
}

void OptimizerShard::copy_gradients() {
  at::NoGradGuard no_grad;
  const std::int64_t rank = group_.rank();
  for (const Bucket* b : buckets_) {
    const std::int64_t chunk = b->shard.numel(), begin = rank * chunk, end = begin + chunk;
    for (const Slot& s : b->slots) {  // gaps keep their zero gradient: no parameter covers them
      const std::int64_t from = std::max(begin, s.offset), to = std::min(end, s.offset + s.param.numel());
      if (from >= to) continue;
      at::Tensor target = b->shard_grad.narrow(0, from - begin, to - from);
      if (s.param.grad().defined()) target.copy_(s.param.grad().reshape({-1}).narrow(0, from - s.offset, to - from));
      else target.zero_();
    }
  }
}

void OptimizerShard::gather_parameters() {
  at::NoGradGuard no_grad;
  for (Bucket* b : buckets_) {
    if (shard_parameters_) {
      if (!b->gathered) gather(*b);
      continue;
    }
    b->send.copy_(b->shard);
    group_.all_gather_into(b->weights, b->send);
  }
}

namespace {
/// The storage's bytes freed: tensors that view it keep their shapes and offsets (FSDP's
/// `_free_storage`); autograd's saved tensors see the same storage come back.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}
void allocate_storage(const at::Tensor& t, std::size_t nbytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}
}  // namespace

namespace {
void record_versions(OptimizerShard::Bucket& bucket) {
  bucket.versions.clear();
  for (const auto& slot : bucket.slots) bucket.versions.push_back(slot.param._version());
}
}  // namespace

void OptimizerShard::gather(Bucket& bucket, bool communicate) {
  if (bucket.gathered) return;
  allocate_storage(bucket.weights, static_cast<std::size_t>(bucket.numel * bucket.weights.element_size()));
  bucket.gathered = true;
  record_versions(bucket);
  if (!communicate) {
    bucket.weights.zero_();
    record_versions(bucket);
    return;
  }
  try {
    group_.all_gather_into(bucket.weights, bucket.shard);  // the backend's own call: no version counter moves
  } catch (...) {
    bucket.weights.zero_();  // not half-written memory: the op under way finishes on zeros
    record_versions(bucket);
    throw;
  }
}

PendingCollective OptimizerShard::gather_ahead(Bucket& bucket, at::Tensor& landing) {
  landing = at::empty({bucket.numel}, bucket.weights.options());
  return group_.all_gather_into_async(landing, bucket.shard);
}

void OptimizerShard::adopt(Bucket& bucket, at::Tensor& landing, PendingCollective& pending) {
  pending.wait();  // first: on failure the landing buffer is dropped with the error
  c10::StorageImpl* from = landing.storage().unsafeGetStorageImpl();
  c10::StorageImpl* to = bucket.weights.storage().unsafeGetStorageImpl();
  const std::size_t nbytes = from->nbytes();
  to->set_data_ptr_noswap(std::move(from->mutable_data_ptr()));  // the memory moves; no copy
  to->set_nbytes(nbytes);
  from->set_nbytes(0);
  landing = at::Tensor();
  bucket.gathered = true;
  record_versions(bucket);
}

bool OptimizerShard::keep_written(Bucket& bucket) {
  bool written = false;
  for (std::size_t i = 0; i < bucket.slots.size() && i < bucket.versions.size(); ++i)
    written = written || bucket.slots[i].param._version() != bucket.versions[i];
  if (written) {  // every rank wrote the same (the module runs alike on all): its own chunk back
    at::NoGradGuard no_grad;
    const std::int64_t chunk = bucket.shard.numel();
    bucket.shard.copy_(bucket.weights.narrow(0, group_.rank() * chunk, chunk));
  }
  return written;
}

void OptimizerShard::keep_writes() {
  for (Bucket* b : buckets_)
    if (b->gathered && keep_written(*b)) record_versions(*b);
}

void OptimizerShard::release(Bucket& bucket) {
  if (!bucket.gathered) return;
  keep_written(bucket);
  free_storage(bucket.weights);
  bucket.gathered = false;
}

void OptimizerShard::keep_initialized(Bucket& bucket) {
  at::NoGradGuard no_grad;
  group_.broadcast(bucket.weights, 0);  // as an eager model's weights are at set-up: rank 0's
  const std::int64_t chunk = bucket.shard.numel();
  bucket.shard.copy_(bucket.weights.narrow(0, group_.rank() * chunk, chunk));
  record_versions(bucket);  // the shard is current: release has nothing to write back
  release(bucket);
}

void OptimizerShard::bump_versions() {
  for (Bucket* b : buckets_)
    for (const auto& slot : b->slots) slot.param.unsafeGetTensorImpl()->bump_version();
}

void OptimizerShard::scatter_parameters() {
  at::NoGradGuard no_grad;
  const std::int64_t rank = group_.rank();
  for (Bucket* b : buckets_) {
    if (!b->gathered) continue;
    const std::int64_t chunk = b->shard.numel();
    b->shard.copy_(b->weights.narrow(0, rank * chunk, chunk));
  }
}

std::vector<at::Tensor> OptimizerShard::shards() const {
  std::vector<at::Tensor> out;
  out.reserve(buckets_.size());
  for (const Bucket* b : buckets_) out.push_back(b->shard);
  return out;
}

std::int64_t OptimizerShard::shard_numel() const {
  std::int64_t n = 0;
  for (const auto& unit : units_) n += unit->shard_grad.numel();
  return n;
}

std::int64_t OptimizerShard::full_numel() const {
  std::int64_t n = 0;
  for (const auto& unit : units_) n += unit->numel;
  return n;
}

}  // namespace fulgur::distributed
