// ZeRO stage 2's gradient reduction (include/fulgur/distributed/sharded_reducer.hpp).
#include "src/distributed/sharded_reducer.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <mutex>

#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"
#include "gradient_hook.hpp"

namespace fulgur::distributed {

struct ShardedGradientReducer::State {
  enum class SlotState { waiting, held, sent };  // held: ready, its bucket's buffer still busy
  struct Slot {
    std::string name;
    at::Tensor param;
    std::size_t bucket = 0;
    at::Tensor staging;  // flat, in the bucket's staging buffer
    SlotState state = SlotState::waiting;
  };
  struct Bucket {
    OptimizerShard::Bucket* layout = nullptr;
    const OptimizerShard* owner = nullptr;
    std::vector<std::size_t> slots;
    std::vector<at::Tensor> gaps;  // in the staging buffer: zeroed when it opens
    at::Tensor staging;            // the whole bucket in its staging buffer
    at::Tensor scratch;            // the reduced chunk when it adds to the shard (made on first need)
    std::size_t pending = 0, ready = 0;
    bool open = false, launched = false, accumulate = false, fresh = true;
    PendingCollective work;
  };

  ProcessGroup* group = nullptr;
  bool find_unused = false;
  std::size_t ring = 2;
  std::vector<at::Tensor> buffers;  // the staging buffers (bytes)
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::size_t next_to_launch = 0;
  bool armed = false, poisoned = false;
  std::mutex mutex;  // hooks may run on autograd's device threads

  void send(Slot& slot) {
    const at::Tensor& grad = slot.param.grad();
    if (grad.defined()) slot.staging.copy_(grad.reshape({-1}));
    else slot.staging.zero_();
    slot.param.mutable_grad() = at::Tensor();  // the rank keeps only its shard of the gradient
    slot.state = SlotState::sent;
    --buckets[slot.bucket].pending;
  }
  /// After a failure: every collective already sent is done before any buffer is reused or freed.
  void wait_all_quietly() noexcept {
    for (auto& bucket : buckets) {
      try {
        bucket.work.wait();
      } catch (...) {
      }
    }
  }
  /// Its staging buffer is free once bucket index - ring's collective is done.
  void open(std::size_t index) {
    Bucket& bucket = buckets[index];
    if (index >= ring) buckets[index - ring].work.wait();
    for (auto& gap : bucket.gaps) gap.zero_();
    bucket.open = true;
    for (std::size_t s : bucket.slots)
      if (slots[s].state == SlotState::held) send(slots[s]);
  }
  bool can_open(std::size_t index) const { return index < ring || buckets[index - ring].launched; }

  void launch_ready() {
    while (next_to_launch < buckets.size()) {
      Bucket& bucket = buckets[next_to_launch];
      if (!bucket.open) {
        if (bucket.ready < bucket.slots.size() || !can_open(next_to_launch)) return;
        open(next_to_launch);
      }
      if (bucket.pending != 0) return;
      bucket.accumulate = !bucket.fresh;
      if (bucket.accumulate && !bucket.scratch.defined()) bucket.scratch = at::empty_like(bucket.layout->shard_grad);
      bucket.work =
          group->reduce_scatter_sum_async(bucket.accumulate ? bucket.scratch : bucket.layout->shard_grad, bucket.staging);
      bucket.launched = true;
      ++next_to_launch;
    }
  }

  void on_gradient(std::size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!armed) return;
    Slot& slot = slots[index];
    if (slot.state != SlotState::waiting) return;  // a parameter used twice in the graph accumulates once
    Bucket& bucket = buckets[slot.bucket];
    ++bucket.ready;
    slot.state = SlotState::held;
    if (!bucket.open && can_open(slot.bucket)) open(slot.bucket);
    else if (bucket.open) send(slot);
    launch_ready();
  }
};

namespace {

/// `numel` elements of `dtype` from `offset` (in those elements) in `bytes`' storage.
at::Tensor alias(const at::Tensor& bytes, c10::ScalarType dtype, std::int64_t offset, std::int64_t numel) {
  at::Tensor t = at::empty({0}, bytes.options().dtype(dtype));
  t.set_(bytes.storage(), offset, {numel});
  return t;
}
}  // namespace

ShardedGradientReducer::ShardedGradientReducer(ProcessGroup& group, const std::vector<OptimizerShard*>& shards,
                                               const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                                               bool find_unused_parameters, int staging_buffers)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.group = &group;
  s.find_unused = find_unused_parameters;
  s.ring = static_cast<std::size_t>(std::max(1, staging_buffers));
  auto name_of = [&](const at::Tensor& p) -> std::string {
    for (const auto& [name, q] : named_parameters)
      if (q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return name;
    return "(a parameter outside the module)";
  };
  for (OptimizerShard* shard : shards)
    for (OptimizerShard::Bucket* layout : shard->buckets()) {
      State::Bucket bucket;
      bucket.layout = layout;
      bucket.owner = shard;
      for (const auto& slot : layout->slots) {
        bucket.slots.push_back(s.slots.size());
        s.slots.push_back({name_of(slot.param), slot.param, s.buckets.size(), {}, State::SlotState::waiting});
      }
      s.buckets.push_back(std::move(bucket));
    }
  std::vector<std::string> uncovered;
  for (const auto& [name, p] : named_parameters) {
    if (!p.requires_grad()) continue;
    const bool covered = std::any_of(s.slots.begin(), s.slots.end(), [&](const State::Slot& slot) {
      return slot.param.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    });
    if (!covered && std::find(uncovered.begin(), uncovered.end(), name) == uncovered.end()) uncovered.push_back(name);
  }
  if (!uncovered.empty()) {
    const std::string names = detail::quoted_names(uncovered);
    throw MisconfigurationError("fulgur: ShardedStrategy<2>: the trainable parameter(s) " + names +
                                " are in no optimizer, so no rank would keep their gradient; add them to an "
                                "optimizer or freeze them (requires_grad_(false)).");
  }
  if (s.buckets.empty()) return;
  const c10::Device device = s.buckets.front().layout->weights.device();
  for (const auto& bucket : s.buckets)
    if (bucket.layout->weights.device() != device)
      throw MisconfigurationError("fulgur: ShardedStrategy<2>: the parameters are on more than one device (" +
                                  device.str() + ", " + bucket.layout->weights.device().str() +
                                  "); keep the module on the rank's device.");
  // Each staging buffer as large as the largest bucket that passes through it.
  const std::size_t rings = std::min(s.ring, s.buckets.size());
  std::vector<std::int64_t> sizes(rings, 0);
  for (std::size_t b = 0; b < s.buckets.size(); ++b) {
    const auto* layout = s.buckets[b].layout;
    sizes[b % rings] = std::max(sizes[b % rings], layout->numel * static_cast<std::int64_t>(layout->weights.element_size()));
  }
  for (std::size_t i = 0; i < rings; ++i)
    s.buffers.push_back(at::empty({sizes[i]}, at::TensorOptions().dtype(at::kByte).device(device)));
  for (std::size_t b = 0; b < s.buckets.size(); ++b) {
    State::Bucket& bucket = s.buckets[b];
    const at::Tensor& buffer = s.buffers[b % rings];
    const c10::ScalarType dtype = bucket.layout->weights.scalar_type();
    bucket.staging = alias(buffer, dtype, 0, bucket.layout->numel);
    for (std::size_t k = 0; k < bucket.slots.size(); ++k) {
      const auto& slot = bucket.layout->slots[k];
      s.slots[bucket.slots[k]].staging = alias(buffer, dtype, slot.offset, slot.param.numel());
    }
    for (const auto& [offset, length] : bucket.layout->gaps) bucket.gaps.push_back(alias(buffer, dtype, offset, length));
  }
  for (std::size_t i = 0; i < s.slots.size(); ++i)
    detail::install_gradient_hook(s.slots[i].param, &s, i);
}

ShardedGradientReducer::~ShardedGradientReducer() {
  abandon_backward();
  for (auto& slot : state_->slots) torch::autograd::impl::post_acc_grad_hooks(slot.param).reset();
}

void ShardedGradientReducer::prepare_for_backward() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.poisoned)
    throw DistributedError("fulgur: ShardedStrategy: an earlier backward failed on rank " +
                           std::to_string(s.group->rank()) +
                           ", so this rank's collectives are out of step with the others'; the run cannot continue.");
  s.armed = sync_;
  if (!sync_) return;
  s.next_to_launch = 0;
  for (auto& slot : s.slots) slot.state = State::SlotState::waiting;
  for (std::size_t b = 0; b < s.buckets.size(); ++b) {
    auto& bucket = s.buckets[b];
    bucket.pending = bucket.slots.size();
    bucket.ready = 0;
    bucket.launched = false;
    bucket.open = false;
  }
  for (std::size_t b = 0; b < s.buckets.size() && b < s.ring; ++b) s.open(b);
}

void ShardedGradientReducer::finalize_backward() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.armed) return;
  s.armed = false;
  std::vector<std::string> unused;
  for (auto& slot : s.slots) {
    if (slot.state != State::SlotState::waiting) continue;
    if (!s.find_unused && slot.param.requires_grad()) {
      unused.push_back(slot.name);
      continue;
    }
    // No gradient from this backward (unused, or frozen for it: toggle_optimizer): what accumulated
    // earlier (no_backward_sync), or zeros. Every rank still sends the bucket, so none waits.
    slot.state = State::SlotState::held;
    ++s.buckets[slot.bucket].ready;
  }
  if (!unused.empty()) {
    s.poisoned = true;
    const std::string names = detail::quoted_names(unused);
    s.wait_all_quietly();
    throw DistributedError("fulgur: ShardedStrategy: the parameter(s) " + names + " got no gradient in this backward "
                           "on rank " + std::to_string(s.group->rank()) + ", so their reduce-scatter cannot complete. "
                           "Make every parameter take part in the loss, freeze the ones that do not "
                           "(requires_grad_(false), as toggle_optimizer does), or set " +
                           fulgur::detail::spelled(
                               s.buckets.front().owner->shards_parameters()
                                   ? "find_unused_parameters = true (FSDPOptions, ShardedStrategy<3>'s options)"
                                   : "find_unused_parameters = true (DDPOptions, ShardedStrategy<1> and <2>'s options)",
                               "--trainer.strategy.find_unused_parameters=true") +
                           ".");
  }
  try {
    for (std::size_t b = s.next_to_launch; b < s.buckets.size(); ++b) {
      auto& bucket = s.buckets[b];
      if (!bucket.open) s.open(b);  // its predecessor in the ring was launched: buckets go in order
      else
        for (std::size_t i : bucket.slots)
          if (s.slots[i].state == State::SlotState::held) s.send(s.slots[i]);
      s.launch_ready();
    }
    for (auto& bucket : s.buckets) {
      if (!bucket.launched)
        throw DistributedError("fulgur: ShardedStrategy internal error: a gradient bucket was never sent on rank " +
                               std::to_string(s.group->rank()) + ".");
      bucket.work.wait();
    }
  } catch (...) {
    s.poisoned = true;
    s.wait_all_quietly();
    throw;
  }
  const double world = static_cast<double>(s.group->size());
  for (auto& bucket : s.buckets) {
    if (bucket.accumulate) {
      if (world > 1) bucket.scratch.div_(world);
      bucket.layout->shard_grad.add_(bucket.scratch);
    } else if (world > 1) {
      bucket.layout->shard_grad.div_(world);
    }
  }
  for (auto& bucket : s.buckets) bucket.fresh = false;
}

void ShardedGradientReducer::abandon_backward() noexcept {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.armed) s.poisoned = true;
  s.armed = false;
  s.wait_all_quietly();  // no collective may still write into a buffer
}

void ShardedGradientReducer::gradients_consumed(const OptimizerShard& shard) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (auto& bucket : state_->buckets)
    if (bucket.owner == &shard) bucket.fresh = true;
}

std::size_t ShardedGradientReducer::bucket_count() const { return state_->buckets.size(); }

std::int64_t ShardedGradientReducer::staging_bytes() const {
  std::int64_t n = 0;
  for (const auto& buffer : state_->buffers) n += buffer.numel();
  return n;
}

}  // namespace fulgur::distributed
