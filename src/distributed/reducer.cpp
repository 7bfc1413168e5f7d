#include "src/distributed/reducer.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"
#include "gradient_hook.hpp"

namespace fulgur::distributed {

struct GradientReducer::State {
  struct Slot {
    std::string name;
    at::Tensor param;
    std::size_t bucket = 0;
    std::int64_t offset = 0;  // in elements, within the bucket's flat buffer
    bool ready = false;
  };
  struct Bucket {
    at::Tensor flat;
    std::vector<std::size_t> slots;
    std::size_t pending = 0;
    PendingCollective work;
  };
  struct Parameter {
    std::string name;
    at::Tensor param;
  };
  // The buckets of one set of trainable parameters. Two are kept, the current one and the one before
  // it, so alternating sets (toggle_optimizer's GAN halves) switch back without allocating.
  struct Layout {
    std::vector<char> trainable;        // per parameter: requires_grad when laid out
    std::vector<std::size_t> slot_of;   // per parameter: its slot, or none (frozen)
    std::vector<Slot> slots;            // the trainable parameters, in bucket order
    std::vector<Bucket> buckets;
    at::Tensor used;                    // find_unused_parameters: per slot, 1 if this rank produced a gradient
    bool matches(const std::vector<Parameter>& parameters) const {  // one bool read per parameter
      for (std::size_t i = 0; i < parameters.size(); ++i)
        if (parameters[i].param.requires_grad() != (trainable[i] != 0)) return false;
      return true;
    }
  };
  static constexpr std::size_t no_slot = static_cast<std::size_t>(-1);
  bool poisoned = false;  // a backward failed mid-way: this rank's collectives are out of step

  ProcessGroup* group = nullptr;
  ReducerOptions options;
  std::vector<Parameter> parameters;  // every parameter, trainable or not, in registration order
  Layout layout;                      // the current buckets
  std::optional<Layout> previous;     // the layout before (alternating sets switch back to it)
  std::vector<Slot>& slots = layout.slots;
  std::vector<Bucket>& buckets = layout.buckets;
  std::size_t next_to_launch = 0;
  bool armed = false;
  std::mutex mutex;  // hooks may run on autograd's device threads

  void on_gradient(std::size_t parameter) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!armed) return;
    const std::size_t index = layout.slot_of[parameter];
    if (index == no_slot) return;
    Slot& slot = slots[index];
    if (slot.ready) return;  // a parameter used twice in the graph accumulates once
    const at::Tensor& grad = slot.param.grad();
    Bucket& bucket = buckets[slot.bucket];
    bucket.flat.narrow(0, slot.offset, slot.param.numel()).copy_(grad.reshape({-1}));
    slot.ready = true;
    if (--bucket.pending == 0) launch_ready();
  }

  /// The buckets of the parameters that require grad now.
  Layout build() const;
  /// A parameter frozen or unfrozen since the current layout: the previous layout if it matches,
  /// else a new one (checked to be every rank's; the oldest is dropped).
  void relayout();

  void launch_ready() {
    while (next_to_launch < buckets.size() && buckets[next_to_launch].pending == 0) {
      Bucket& bucket = buckets[next_to_launch++];
      bucket.work = group->all_reduce_sum_async(bucket.flat);
    }
  }
};

GradientReducer::State::Layout GradientReducer::State::build() const {
  Layout out;
  out.trainable.resize(parameters.size());
  out.slot_of.assign(parameters.size(), no_slot);
  // Reverse registration order: the last layers' gradients come first in backward.
  for (std::size_t k = parameters.size(); k-- > 0;) {
    out.trainable[k] = parameters[k].param.requires_grad() ? 1 : 0;
    if (!out.trainable[k]) continue;
    out.slot_of[k] = out.slots.size();
    out.slots.push_back({parameters[k].name, parameters[k].param, 0, 0, false});
  }
  std::size_t bucket_bytes = 0;
  for (std::size_t i = 0; i < out.slots.size(); ++i) {
    auto& slot = out.slots[i];
    const std::size_t bytes = static_cast<std::size_t>(slot.param.numel() * slot.param.element_size());
    const std::size_t cap = out.buckets.size() <= 1 ? options.first_bucket_bytes : options.bucket_bytes;
    const bool fits = !out.buckets.empty() && bucket_bytes + bytes <= cap &&
                      out.slots[out.buckets.back().slots.front()].param.scalar_type() == slot.param.scalar_type() &&
                      out.slots[out.buckets.back().slots.front()].param.device() == slot.param.device();
    if (!fits) {
      out.buckets.emplace_back();
      bucket_bytes = 0;
    }
    auto& bucket = out.buckets.back();
    slot.bucket = out.buckets.size() - 1;
    slot.offset = bucket.slots.empty() ? 0 : out.slots[bucket.slots.back()].offset + out.slots[bucket.slots.back()].param.numel();
    bucket.slots.push_back(i);
    bucket_bytes += bytes;
  }
  for (auto& bucket : out.buckets) {
    const auto& last = out.slots[bucket.slots.back()];
    bucket.flat = at::zeros({last.offset + last.param.numel()}, last.param.options().requires_grad(false));
  }
  const auto device = parameters.empty() ? c10::Device(c10::kCPU) : parameters.front().param.device();
  out.used = at::zeros({static_cast<std::int64_t>(out.slots.size())}, at::TensorOptions().dtype(at::kInt).device(device));
  return out;
}

void GradientReducer::State::relayout() {
  if (previous && previous->matches(parameters)) {  // verified when it was built
    std::swap(layout, *previous);
    return;
  }
  previous = std::move(layout);
  layout = build();
  if (group->size() <= 1) return;
  // Every rank must have laid out the same parameters, or its buckets would meet other ranks'
  // buckets of other parameters. One collective, only for a new layout: the names and sizes, hashed.
  std::uint64_t hash = 14695981039346656037ULL;  // FNV-1a
  const auto mix = [&](const void* data, std::size_t size) {
    for (std::size_t i = 0; i < size; ++i) hash = (hash ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ULL;
  };
  for (const auto& slot : slots) {
    mix(slot.name.data(), slot.name.size());
    const std::int64_t numel = slot.param.numel();
    mix(&numel, sizeof numel);
  }
  const auto key = static_cast<std::int64_t>(hash >> 2);
  const auto count = static_cast<std::int64_t>(slots.size());
  // max of (x, -x) gives the maximum and minus the minimum in one all-reduce.
  auto agreement = at::tensor(std::vector<std::int64_t>{key, -key, count, -count}, at::TensorOptions().dtype(at::kLong))
                       .to(layout.used.device());
  try {
    group->all_reduce(agreement, ReduceOp::max);
  } catch (...) {
    poisoned = true;
    throw;
  }
  const auto values = agreement.cpu();
  const auto* v = values.data_ptr<std::int64_t>();
  if (v[0] != -v[1] || v[2] != -v[3]) {
    poisoned = true;
    throw DistributedError(
        "fulgur: DDP: the parameters that require grad changed on rank " + std::to_string(group->rank()) +
        " but not in the same way on every rank (" + std::to_string(slots.size()) +
        " trainable here); freeze and unfreeze parameters on every rank at the same step (as BackboneFinetuning does, "
        "at an epoch's start).");
  }
}

GradientReducer::GradientReducer(ProcessGroup& group, std::vector<std::pair<std::string, at::Tensor>> named_parameters,
                                 ReducerOptions options)
    : state_(std::make_unique<State>()) {
  state_->group = &group;
  state_->options = options;
  for (auto& [name, param] : named_parameters) state_->parameters.push_back({std::move(name), std::move(param)});
  state_->layout = state_->build();
  // Every parameter, frozen ones too (a hook waits there until it trains): a new layout installs none.
  for (std::size_t i = 0; i < state_->parameters.size(); ++i)
    detail::install_gradient_hook(state_->parameters[i].param, state_.get(), i);
}

GradientReducer::~GradientReducer() {
  for (auto& parameter : state_->parameters) torch::autograd::impl::post_acc_grad_hooks(parameter.param).reset();
}

void GradientReducer::prepare_for_backward() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->poisoned)
    throw DistributedError("fulgur: DDP: an earlier backward failed on rank " + std::to_string(state_->group->rank()) +
                           ", so this rank's collectives are out of step with the others'; the run cannot continue.");
  state_->armed = false;
  if (!sync_) return;
  // A parameter frozen or unfrozen since the buckets were laid out (BackboneFinetuning's unfreeze,
  // toggle_optimizer): lay them out again, so an unfrozen parameter is averaged too. Checked at each
  // synchronised backward; nothing is in flight then.
  if (!state_->layout.matches(state_->parameters)) state_->relayout();
  state_->armed = true;
  state_->next_to_launch = 0;
  for (auto& slot : state_->slots) slot.ready = false;
  for (auto& bucket : state_->buckets) bucket.pending = bucket.slots.size();
}

void GradientReducer::finalize_backward() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.armed) return;
    s.armed = false;
    std::vector<std::string> unused;
    std::vector<std::int32_t> used;  // only under find_unused_parameters: no allocation otherwise
    if (s.options.find_unused_parameters) used.assign(s.slots.size(), 0);
    for (std::size_t index = 0; index < s.slots.size(); ++index) {
      auto& slot = s.slots[index];
      if (!used.empty()) used[index] = slot.ready ? 1 : 0;
      if (slot.ready) continue;
      if (!s.options.find_unused_parameters) {
        unused.push_back(slot.name);
        continue;
      }
      // No gradient from this backward: contribute what accumulated earlier (no_backward_sync
      // micro-batches), or zeros; receive the average either way.
      auto region = s.buckets[slot.bucket].flat.narrow(0, slot.offset, slot.param.numel());
      if (slot.param.grad().defined())
        region.copy_(slot.param.grad().reshape({-1}));
      else
        region.zero_();
      slot.ready = true;
      --s.buckets[slot.bucket].pending;
    }
    if (!unused.empty()) {
      s.poisoned = true;
      const std::string names = detail::quoted_names(unused);
      throw DistributedError("fulgur: DDP: the parameter(s) " + names + " got no gradient in this backward on rank " +
                             std::to_string(s.group->rank()) +
                             ", so their all-reduce cannot complete. Make every parameter take part in the loss, or "
                             "set " + fulgur::detail::strategy_setting("DDPOptions", "find_unused_parameters", "true") +
                             ".");
    }
    if (s.options.find_unused_parameters) s.layout.used.copy_(at::tensor(used, at::TensorOptions().dtype(at::kInt)));
    s.launch_ready();
  }
  // After every bucket, in the same place on every rank: how many ranks used each parameter.
  PendingCollective used_counts;
  if (s.options.find_unused_parameters) used_counts = s.group->all_reduce_sum_async(s.layout.used);
  const double world = static_cast<double>(s.group->size());
  try {
    for (auto& bucket : s.buckets) {
      if (!bucket.work.valid())
        throw DistributedError("fulgur: DDP internal error: a gradient bucket was never sent on rank " +
                               std::to_string(s.group->rank()) + ".");
      bucket.work.wait();
    }
    used_counts.wait();
  } catch (...) {
    s.poisoned = true;
    throw;
  }
  const at::Tensor used_by = s.options.find_unused_parameters ? s.layout.used.cpu() : at::Tensor();
  for (auto& bucket : s.buckets) {
    if (world > 1) bucket.flat.div_(world);
    for (std::size_t index : bucket.slots) {
      auto& slot = s.slots[index];
      // A parameter no rank used keeps no gradient, as in PyTorch: momentum and weight decay leave it alone.
      if (used_by.defined() && used_by.data_ptr<std::int32_t>()[index] == 0 && !slot.param.grad().defined())
        continue;
      auto averaged = bucket.flat.narrow(0, slot.offset, slot.param.numel()).view(slot.param.sizes());
      if (slot.param.grad().defined())
        slot.param.mutable_grad().copy_(averaged);
      else
        slot.param.mutable_grad() = averaged.clone();
    }
  }
}

void GradientReducer::abandon_backward() noexcept {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.armed = false;
  s.poisoned = true;
  for (auto& bucket : s.buckets) {
    try {
      bucket.work.wait();  // no collective may still write into a buffer
    } catch (...) {
    }
  }
}

std::size_t GradientReducer::bucket_count() const { return state_->buckets.size(); }

std::int64_t GradientReducer::buffer_bytes() const {
  std::int64_t n = 0;
  for (const auto& bucket : state_->buckets) n += bucket.flat.numel() * static_cast<std::int64_t>(bucket.flat.element_size());
  return n;
}

std::vector<std::vector<std::string>> GradientReducer::bucket_layout() const {
  std::vector<std::vector<std::string>> layout;
  for (const auto& bucket : state_->buckets) {
    layout.emplace_back();
    for (std::size_t index : bucket.slots) layout.back().push_back(state_->slots[index].name);
  }
  return layout;
}

}  // namespace fulgur::distributed
