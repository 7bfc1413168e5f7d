// Stage 3's gathers on first use (include/fulgur/distributed/parameter_gatherer.hpp).
#include "src/distributed/parameter_gatherer.hpp"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <array>
#include <exception>
#include <mutex>
#include <unordered_map>

namespace fulgur::distributed {

struct ParameterGatherer::State {
  struct Ahead {  // a gather issued before its unit is needed
    PendingCollective pending;
    at::Tensor landing;
    bool active = false;
  };
  std::vector<Entry> entries;
  std::vector<Ahead> ahead;  // per entry
  std::unordered_map<const c10::StorageImpl*, std::size_t> by_storage;  // built once: read without the lock
  std::mutex mutex;  // autograd's device threads run backward for this thread
  std::int64_t current = -1;  // the last non-root unit gathered
  std::int64_t gathers = 0, prefetches = 0, bytes = 0, peak = 0;
  at::CallbackHandle handle = 0;
  // The order units were needed in during the first step (forward, then backward); later steps
  // gather the next unit of it ahead, while the current one computes.
  std::vector<std::int64_t> order, recording;
  bool recorded = false;
  std::size_t position = 0;
  // RecordFunction swallows a callback's exception (it logs it and runs the op): a failed gather is
  // kept here for the strategy's next verb, and later gathers only allocate (no collective waits
  // out its timeout on a peer that is gone).
  std::exception_ptr failure;

  static std::int64_t bytes_of(const Entry& e) { return e.bucket->numel * e.bucket->weights.element_size(); }
  void fail() {
    if (!failure) failure = std::current_exception();
  }

  /// The unit is needed now: whole when this returns. `keep`: the units the op under way reads,
  /// which the release rule must not free.
  void gather_unit(std::int64_t unit, const std::vector<std::int64_t>& keep = {}) {
    if (unit != 0 && current > 0 && current != unit && std::find(keep.begin(), keep.end(), current) == keep.end())
      release_unit(current);
    bool gathered_here = false;
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (entries[i].unit == unit) gathered_here = bring(i) || gathered_here;
    if (gathered_here) ++gathers;
    peak = std::max(peak, bytes);
    if (unit != 0) current = unit;
    advance(unit);
  }
  /// The entry's bucket whole: its gather ahead adopted, or gathered now (true then).
  bool bring(std::size_t i) {
    Entry& e = entries[i];
    if (e.bucket->gathered) return false;
    if (ahead[i].active) {
      adopt(i);
      return false;
    }
    gather_now(e);
    bytes += bytes_of(e);
    return true;
  }
  void gather_now(Entry& e) {
    try {
      e.owner->gather(*e.bucket, /*communicate=*/!failure);
    } catch (...) {
      fail();
    }
  }
  void adopt(std::size_t i) {
    try {
      entries[i].owner->adopt(*entries[i].bucket, ahead[i].landing, ahead[i].pending);
    } catch (...) {
      fail();
      ahead[i].landing = at::Tensor();
      gather_now(entries[i]);  // zeros: the op finishes, the strategy throws the failure
    }
    ahead[i].active = false;
  }
  /// Records the order on the first step; afterwards follows it and gathers the next unit ahead.
  void advance(std::int64_t unit) {
    if (!recorded) {
      recording.push_back(unit);
      return;
    }
    if (position < order.size() && order[position] == unit) {
      ++position;
    } else {  // another path (validation, a branch): pick the order up where this unit first is
      const auto it = std::find(order.begin(), order.end(), unit);
      position = it == order.end() ? order.size() : static_cast<std::size_t>(it - order.begin()) + 1;
    }
    if (position < order.size() && !failure) prefetch(order[position]);
  }
  void prefetch(std::int64_t unit) {
    if (unit == current) return;
    bool issued = false;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      Entry& e = entries[i];
      if (e.unit != unit || e.bucket->gathered || ahead[i].active) continue;
      try {
        ahead[i].pending = e.owner->gather_ahead(*e.bucket, ahead[i].landing);
      } catch (...) {
        fail();
        return;
      }
      ahead[i].active = true;
      bytes += bytes_of(e);
      issued = true;
    }
    if (issued) {
      ++gathers;
      ++prefetches;
      peak = std::max(peak, bytes);
    }
  }
  void release_entry(std::size_t i) {
    Entry& e = entries[i];
    if (ahead[i].active) {  // its memory may be written until the collective is done
      try {
        ahead[i].pending.wait();
      } catch (...) {
        fail();
      }
      ahead[i].landing = at::Tensor();
      ahead[i].active = false;
      bytes -= bytes_of(e);
    }
    if (e.bucket->gathered) {
      e.owner->release(*e.bucket);
      bytes -= bytes_of(e);
    }
  }
  void release_unit(std::int64_t unit) {
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (entries[i].unit == unit) release_entry(i);
  }
  /// The entry whose bucket `t` views, if any (its storage is the bucket's).
  const Entry* entry_of(const at::Tensor& t) const {
    if (!t.defined() || !t.has_storage()) return nullptr;
    const auto it = by_storage.find(t.storage().unsafeGetStorageImpl());
    return it == by_storage.end() ? nullptr : &entries[it->second];
  }
  /// The fast path: a released bucket has no bytes, and most tensors are no bucket's.
  static bool may_need(const at::Tensor& t) {
    return t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl()->nbytes() == 0;
  }
  /// An op's inputs: every unit they read is gathered before it runs, none of them released for
  /// another (an op may read two units: a cat over parameters, a shared weight).
  template <class ForEachTensor>
  void before_op(ForEachTensor&& for_each_tensor) {
    bool needed = false;
    for_each_tensor([&](const at::Tensor& t) { needed = needed || (may_need(t) && entry_of(t) != nullptr); });
    if (!needed) return;
    std::vector<std::int64_t> units;
    for_each_tensor([&](const at::Tensor& t) {
      if (const Entry* e = entry_of(t); e != nullptr && std::find(units.begin(), units.end(), e->unit) == units.end())
        units.push_back(e->unit);
    });
    std::lock_guard<std::mutex> lock(mutex);
    for (const std::int64_t unit : units) {
      const bool whole = std::all_of(entries.begin(), entries.end(),
                                     [&](const Entry& e) { return e.unit != unit || e.bucket->gathered; });
      if (!whole) gather_unit(unit, units);
    }
  }
};

namespace {
// The gatherers of this process (one per strategy set up); the callback runs them on every op.
std::mutex registry_mutex;
std::vector<ParameterGatherer::State*> registry;
thread_local bool inside = false;  // the gather's own ops (copies, the collective) pass through

/// Sets `inside` for its scope, whatever leaves it.
struct InsideGuard {
  bool was = inside;
  InsideGuard() { inside = true; }
  ~InsideGuard() { inside = was; }
};

/// Calls f on every tensor an op input holds: a tensor, a tensor list, a list of optional tensors.
template <class F>
void for_each_input_tensor(c10::ArrayRef<const c10::IValue> inputs, F&& f) {
  for (const c10::IValue& input : inputs) {
    if (input.isTensor()) {
      f(input.toTensor());
    } else if (input.isTensorList()) {
      for (const at::Tensor& t : input.toTensorVector()) f(t);
    } else if (input.isList()) {
      for (const c10::IValue& item : input.toListRef())
        if (item.isTensor()) f(item.toTensor());
    }
  }
}

std::unique_ptr<at::ObserverContext> on_op(const at::RecordFunction& fn) {
  if (inside) return nullptr;
  std::array<ParameterGatherer::State*, 8> gatherers{};
  std::size_t count = 0;
  {  // not held while gathering: a gather runs ops (and waits on collectives)
    std::lock_guard<std::mutex> lock(registry_mutex);
    for (auto* g : registry)
      if (count < gatherers.size()) gatherers[count++] = g;
  }
  if (count == 0) return nullptr;
  InsideGuard guard;
  const auto inputs = fn.inputs();
  for (std::size_t i = 0; i < count; ++i)
    gatherers[i]->before_op([&](auto&& f) { for_each_input_tensor(inputs, f); });
  return nullptr;
}
}  // namespace

ParameterGatherer::ParameterGatherer(std::vector<Entry> entries) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.entries = std::move(entries);
  s.ahead.resize(s.entries.size());
  for (std::size_t i = 0; i < s.entries.size(); ++i) {
    const Entry& e = s.entries[i];
    s.by_storage.emplace(e.bucket->weights.storage().unsafeGetStorageImpl(), i);
    if (e.bucket->gathered) s.bytes += State::bytes_of(e);
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    registry.push_back(&s);
  }
  s.handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_op).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
}

ParameterGatherer::~ParameterGatherer() {
  at::removeCallback(state_->handle);
  for (auto& a : state_->ahead) {  // no collective may still write into memory about to be freed
    if (!a.active) continue;
    try {
      a.pending.wait();
    } catch (...) {
    }
  }
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry.erase(std::remove(registry.begin(), registry.end(), state_.get()), registry.end());
}

void ParameterGatherer::gather_all() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  InsideGuard guard;
  for (std::size_t i = 0; i < s.entries.size(); ++i) s.bring(i);
  s.peak = std::max(s.peak, s.bytes);
  s.current = -1;
  if (s.failure) std::rethrow_exception(s.failure);
}

void ParameterGatherer::rethrow_failure() const {
  if (state_->failure) std::rethrow_exception(state_->failure);
}

void ParameterGatherer::release_all() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  InsideGuard guard;  // a write-back of a changed weight runs an op
  for (std::size_t i = 0; i < s.entries.size(); ++i) s.release_entry(i);
  s.current = -1;
  if (!s.recorded && !s.recording.empty()) {  // the first step's order: followed from now on
    s.order = std::move(s.recording);
    s.recorded = true;
  }
  s.position = 0;
}

std::int64_t ParameterGatherer::gathers() const { return state_->gathers; }
std::int64_t ParameterGatherer::prefetches() const { return state_->prefetches; }
bool ParameterGatherer::all_gathered() const {
  return std::all_of(state_->entries.begin(), state_->entries.end(), [](const Entry& e) { return e.bucket->gathered; });
}
std::int64_t ParameterGatherer::gathered_bytes() const { return state_->bytes; }
std::int64_t ParameterGatherer::peak_gathered_bytes() const { return state_->peak; }
void ParameterGatherer::reset_peak() { state_->peak = state_->bytes; }

}  // namespace fulgur::distributed
