#pragma once
// Logged metrics, kept as Lightning keeps them (its _ResultCollection and logger connector), but
// as tensors until someone reads them: logging a value costs no host sync.
//
// A value is logged under (hook, name). Logged on_step, its latest value is the step value;
// logged on_epoch, it is reduced over the epoch: `mean` weighted by the batch size (Lightning's
// rule), `sum`, `max` or `min`, accumulated in float64. Logged both ways, it appears as
// `name_step` and `name_epoch`. The reduced values flow into three views, as in Lightning:
// callback metrics (what monitors and FitResult::metrics see), logged metrics (what a logger gets)
// and progress-bar metrics.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fulgur/concepts/vocabulary.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/results.hpp"

namespace fulgur {

/// ctx.log's options, with Lightning's meaning and defaults. Unset on_step/on_epoch take the
/// hook's defaults: training_step and the batch-level training hooks log on_step; validation and
/// test steps and every epoch-level hook log on_epoch. Give them in this order (designated
/// initialisers): {.prog_bar, .logger, .on_step, .on_epoch, .sync_dist, .reduce, .batch_size}.
struct LogOptions {
  bool prog_bar = false;
  bool logger = true;
  std::optional<bool> on_step{};
  std::optional<bool> on_epoch{};
  bool sync_dist = false;             ///< reduce across processes (with `reduce`) when the value is computed
  ReduceOp reduce = ReduceOp::mean;   ///< over the epoch (and across processes with sync_dist)
  std::optional<std::int64_t> batch_size{};  ///< the weight of this value in an epoch mean; default: the batch's size
};

namespace detail {

/// Where a hook may log, and its defaults (Lightning's _FxValidator).
enum class LogScope {
  none,         ///< logging here is an error
  step,         ///< on_step by default, on_epoch allowed (training_step, batch-level training hooks)
  epoch,        ///< on_epoch by default, on_step allowed (validation/test steps and batch hooks)
  epoch_only,   ///< on_epoch only (epoch-level hooks, on_train_start, ...)
};

/// The dtype epoch values accumulate in: float64, or float32 where the device has no float64 (MPS).
inline c10::ScalarType accumulation_dtype(const c10::Device& device) {
  return device.type() == c10::kMPS ? at::kFloat : at::kDouble;
}

/// Named tensors, updated in place by name (no allocation once a name is known).
///
/// A step value is held as one tensor per metric that each new value is written into (no
/// allocation per step), so a map is current as soon as a value is logged, as Lightning's
/// callback_metrics are. What a reader gets is therefore a snapshot of its own: a tensor that keeps
/// the value it had when read.
class TensorMap {
 public:
  void set(std::string_view name, const at::Tensor& value) {
    for (auto& [key, tensor] : items_)
      if (key == name) {
        if (!tensor.is_same(value)) tensor = value, ++changes_;
        return;
      }
    items_.emplace_back(std::string(name), value);
    ++changes_;
  }
  /// The value now (a tensor that later logging does not change); none if `name` was not logged.
  std::optional<at::Tensor> find(std::string_view name) const {
    if (const at::Tensor* live = find_live(name)) return snapshot(*live);
    return std::nullopt;
  }
  /// The value on the host (one sync); none if `name` was not logged.
  std::optional<double> item(std::string_view name) const {
    if (const at::Tensor* live = find_live(name)) return live->item<double>();
    return std::nullopt;
  }
  bool contains(std::string_view name) const { return find_live(name) != nullptr; }
  bool empty() const { return items_.empty(); }
  std::size_t size() const { return items_.size(); }
  void clear() { items_.clear(), ++changes_; }
  /// How many times a name was added or given another tensor (a metric knows from it, at the cost
  /// of one comparison per log, whether the tensor it writes into is still the one shown).
  std::uint64_t changes() const { return changes_; }
  /// f(name, value) for each value, in the order first logged (values as find gives them).
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [key, tensor] : items_) f(key, snapshot(tensor));
  }
  /// The names, in the order first logged.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& item : items_) out.push_back(item.first);
    return out;
  }
  /// Every value on the host (one sync per value).
  Metrics to_host() const {
    Metrics out;
    for (const auto& [key, tensor] : items_) out[key] = tensor.template item<double>();
    return out;
  }
  /// Every value on the host, in the order first logged (what a progress bar shows).
  std::vector<std::pair<std::string, double>> to_host_in_order() const {
    std::vector<std::pair<std::string, double>> out;
    for (const auto& [key, tensor] : items_) out.emplace_back(key, tensor.template item<double>());
    return out;
  }
  /// name -> a copy of each value, in order (for a checkpoint).
  c10::impl::GenericDict state() const {
    c10::impl::GenericDict out(c10::StringType::get(), c10::TensorType::get());
    for (const auto& [key, tensor] : items_) out.insert(key, snapshot(tensor));
    return out;
  }
  void load_state(const c10::impl::GenericDict& state, c10::Device device) {
    clear();
    for (const auto& item : state) set(item.key().toStringRef(), item.value().toTensor().to(device));
  }

 private:
  const at::Tensor* find_live(std::string_view name) const {
    for (const auto& [key, tensor] : items_)
      if (key == name) return &tensor;
    return nullptr;
  }
  /// A copy: logging again writes into the live tensor.
  static at::Tensor snapshot(const at::Tensor& live) {
    at::NoGradGuard no_grad;
    return live.clone();
  }

  std::vector<std::pair<std::string, at::Tensor>> items_;
  std::uint64_t changes_ = 0;
};

/// Lightning's trainer.callback_metrics / logged_metrics / progress_bar_metrics.
struct MetricViews {
  TensorMap callback, logged, progress_bar;
  void clear() {
    callback.clear();
    logged.clear();
    progress_bar.clear();
  }
  std::uint64_t changes() const { return callback.changes() + logged.changes() + progress_bar.changes(); }
  c10::impl::GenericDict state() const {
    c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
    out.insert("callback", callback.state());
    out.insert("logged", logged.state());
    out.insert("progress_bar", progress_bar.state());
    return out;
  }
  void load_state(const c10::impl::GenericDict& state, c10::Device device) {
    callback.load_state(state.at("callback").toGenericDict(), device);
    logged.load_state(state.at("logged").toGenericDict(), device);
    progress_bar.load_state(state.at("progress_bar").toGenericDict(), device);
  }
};

/// The values one loop logged (a training epoch, or one evaluation run).
class MetricCollection {
 public:
  /// training: step values also reach the callback metrics (Lightning's rule for the training loop).
  explicit MetricCollection(bool training) : training_(training) {}

  /// Called before each hook or step: who logs now, and with which defaults.
  void enter(std::string_view hook, LogScope scope) {
    hook_ = hook;
    scope_ = scope;
  }
  void set_batch_size(std::int64_t batch_size) { batch_size_ = batch_size; }
  /// Where values are kept and reduced: the training device (so sync_dist works over NCCL too).
  void set_device(c10::Device device) { device_ = device; }
  /// The views a step value appears in as soon as it is logged (else at publish_step).
  void set_views(MetricViews* views) { views_ = views; }

  void log(std::string_view name, const at::Tensor& value, const LogOptions& options) {
    if (scope_ == LogScope::none)
      throw MisconfigurationError("You can't `log()` inside `" + std::string(hook_) +
                                  "`: fulgur (as Lightning) takes logged values in the steps and in the hooks of "
                                  "docs/loops-and-hooks.md that allow it.");
    const bool on_step = options.on_step.value_or(scope_ == LogScope::step);
    const bool on_epoch = options.on_epoch.value_or(scope_ != LogScope::step);
    if (!on_step && !on_epoch)
      throw MisconfigurationError("`log(\"" + std::string(name) + "\", ..., {.on_step = false, .on_epoch = false})` "
                                  "is not useful: log it on_step, on_epoch, or both.");
    if (scope_ == LogScope::epoch_only && on_step)
      throw MisconfigurationError("You can't log \"" + std::string(name) + "\" with on_step = true in `" +
                                  std::string(hook_) + "`, which runs once per epoch: log it on_epoch.");
    if (!value.defined() || value.numel() != 1)
      throw MisconfigurationError("`log(\"" + std::string(name) + "\", ...)` in `" + std::string(hook_) +
                                  "` needs one number, got " + (value.defined() ? "a tensor of " +
                                  std::to_string(value.numel()) + " elements" : std::string("an undefined tensor")) +
                                  "; reduce it first (.mean(), .sum()).");
    Entry& e = entry(name, on_step, on_epoch, options);
    e.fresh = true;
    if (on_step) store_step_value(e, value);
    if (!on_epoch) return;
    at::NoGradGuard no_grad;  // the epoch value keeps no autograd history (and needs no detached copy)
    const at::Tensor v = on_step ? e.step_value : placed(value);
    const double weight = static_cast<double>(options.batch_size.value_or(batch_size_));
    if (!e.accumulated.defined()) {
      e.accumulated = at::zeros({}, v.options().dtype(accumulation_dtype(device_)));
      if (e.options.reduce == ReduceOp::max) e.accumulated.fill_(-std::numeric_limits<double>::infinity());
      if (e.options.reduce == ReduceOp::min) e.accumulated.fill_(std::numeric_limits<double>::infinity());
    }
    switch (e.options.reduce) {
      case ReduceOp::mean: e.accumulated.add_(v, weight), e.weight += weight; break;
      case ReduceOp::sum: e.accumulated.add_(v); break;
      case ReduceOp::max: at::maximum_out(e.accumulated, e.accumulated, v); break;
      case ReduceOp::min: at::minimum_out(e.accumulated, e.accumulated, v); break;
    }
    e.computed = at::Tensor();
  }

  /// Step values logged with sync_dist are reduced across processes (once per batch, only when
  /// such a value was logged).
  template <class AllReduce>
  void sync_step_values(AllReduce&& all_reduce) {
    for (auto& e : entries_)
      if (e.fresh && e.on_step && e.options.sync_dist) {
        e.step_value = all_reduce(e.step_value.clone(), e.options.reduce);
        e.published_at = kNever;
      }
  }
  /// The step values logged (for loggers) since the last publish_step, on the host: what a logger
  /// receives at a log step. Call before publish_step.
  void collect_step_logged(Metrics& out) const {
    for (const auto& e : entries_)
      if (e.fresh && e.on_step && e.options.logger && e.step_value.defined()) out[e.step_key] = e.step_value.item<double>();
  }
  /// The epoch values logged for loggers, on the host (after publish_epoch).
  void collect_epoch_logged(Metrics& out) const {
    for (const auto& e : entries_)
      if (e.on_epoch && e.options.logger && e.computed.defined()) out[e.epoch_key] = e.computed.item<double>();
  }
  /// The step values into the views (after each batch; tensors only, no host sync). A value already
  /// there is current (it is written in place): only new or displaced tensors are published.
  void publish_step(MetricViews& views) {
    for (auto& e : entries_) {
      if (!e.on_step || !e.step_value.defined()) continue;
      if (&views != views_ || e.published_at != views.changes()) publish(views, e, e.step_value, /*on_step=*/true);
      if (&views == views_) e.published_at = views.changes();
      e.fresh = false;
    }
  }
  /// The epoch values, reduced (and synced across processes where asked), into the views.
  template <class AllReduce>
  void publish_epoch(MetricViews& views, AllReduce&& all_reduce) {
    for (auto& e : entries_) {  // every rank holds the same entries in the same order: collectives line up
      if (!e.on_epoch || !e.accumulated.defined()) continue;
      if (!e.computed.defined()) {
        at::Tensor value = e.accumulated.clone();
        at::Tensor weight = at::scalar_tensor(e.weight, value.options());
        if (e.options.sync_dist) {
          const ReduceOp op = e.options.reduce == ReduceOp::mean ? ReduceOp::sum : e.options.reduce;
          value = all_reduce(value, op);
          if (e.options.reduce == ReduceOp::mean) weight = all_reduce(weight, ReduceOp::sum);
        }
        e.computed = e.options.reduce == ReduceOp::mean ? value / weight : value;
      }
      publish(views, e, e.computed, /*on_step=*/false);
    }
  }
  bool empty() const { return entries_.empty(); }
  /// Whether a value of this name was logged (by any hook) since the last reset.
  bool logs(std::string_view name) const {
    for (const auto& e : entries_)
      if (e.name == name) return true;
    return false;
  }
  void reset() { entries_.clear(); }

  /// What was logged so far in this epoch, for a checkpoint taken mid-epoch: each entry's options,
  /// latest step value and epoch accumulation.
  c10::impl::GenericList state() const {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const auto& e : entries_) {
      c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
      d.insert("hook", e.hook);
      d.insert("name", e.name);
      d.insert("on_step", e.on_step);
      d.insert("on_epoch", e.on_epoch);
      d.insert("prog_bar", e.options.prog_bar);
      d.insert("logger", e.options.logger);
      d.insert("sync_dist", e.options.sync_dist);
      d.insert("reduce", static_cast<std::int64_t>(e.options.reduce));
      d.insert("step_value", e.step_value.defined() ? c10::IValue(e.step_value) : c10::IValue());
      d.insert("accumulated", e.accumulated.defined() ? c10::IValue(e.accumulated) : c10::IValue());
      d.insert("weight", e.weight);
      out.push_back(d);
    }
    return out;
  }
  /// Puts back what state() returned; the step values reach the views.
  void load_state(const c10::impl::GenericList& entries) {
    entries_.clear();
    auto tensor = [&](const c10::IValue& v) { return v.isTensor() ? v.toTensor().to(device_) : at::Tensor(); };
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto d = entries.get(i).toGenericDict();
      LogOptions options{.prog_bar = d.at("prog_bar").toBool(), .logger = d.at("logger").toBool(),
                         .sync_dist = d.at("sync_dist").toBool(),
                         .reduce = static_cast<ReduceOp>(d.at("reduce").toInt())};
      const std::string name = d.at("name").toStringRef();
      const bool on_step = d.at("on_step").toBool(), on_epoch = d.at("on_epoch").toBool();
      const bool forked = on_step && on_epoch;
      entries_.push_back(Entry{d.at("hook").toStringRef(), name, on_step, on_epoch, options,
                               tensor(d.at("step_value")), tensor(d.at("accumulated")), d.at("weight").toDouble(), {},
                               on_step, name + (forked ? "_step" : ""), name + (forked ? "_epoch" : "")});
    }
    if (views_ != nullptr) publish_step(*views_);
  }

 private:
  struct Entry {
    std::string hook;
    std::string name;
    bool on_step = false, on_epoch = false;
    LogOptions options;
    at::Tensor step_value;   // the latest value logged on_step
    at::Tensor accumulated;  // float64: the weighted sum (mean), sum, max or min over the epoch
    double weight = 0.0;     // the summed batch sizes (mean)
    at::Tensor computed;     // the epoch value, cached until the next update
    bool fresh = false;      // logged since the last publish_step
    std::string step_key, epoch_key;  // name_step / name_epoch when logged both ways, else name
    std::uint64_t published_at = kNever;  // the views' changes() when step_value was last put there
  };
  static constexpr std::uint64_t kNever = ~std::uint64_t{0};

  /// The step value, without an allocation per step: the entry holds a tensor of its own (no
  /// autograd; the views share it, so they are current at once) and each new value is copied into
  /// it — on the host a memcpy of the number (no dispatcher call, none of the step's memory kept
  /// alive), on a device an asynchronous copy (no sync). A copy, not an alias: a tensor the module
  /// changes after logging it (a parameter, a running sum) leaves the logged value alone, as
  /// Lightning's clone does. A first value, or one of another kind, gets a new tensor.
  void store_step_value(Entry& e, const at::Tensor& value) {
    const at::Tensor& held = e.step_value;
    const bool same_kind = held.defined() && value.dim() == 0 && value.scalar_type() == held.scalar_type() &&
                           value.device() == held.device() && value.layout() == c10::kStrided &&
                           !value.is_conj() && !value.is_neg();
    if (same_kind && held.is_cpu()) {
      std::memcpy(held.mutable_data_ptr(), value.const_data_ptr(), held.itemsize());
    } else if (same_kind) {
      at::NoGradGuard no_grad;
      held.copy_(value, /*non_blocking=*/true);
    } else {
      at::NoGradGuard no_grad;
      e.step_value = placed(value).clone();
      e.published_at = kNever;
    }
    // Republished when new, or when the views show another tensor under its name (a validation run
    // logging the same name, say): one comparison per log otherwise.
    if (views_ != nullptr && e.published_at != views_->changes()) {
      publish(*views_, e, e.step_value, /*on_step=*/true);
      e.published_at = views_->changes();
    }
  }

  /// The value as one floating-point number on the training device (a copy only where needed).
  at::Tensor placed(const at::Tensor& value) const {
    at::Tensor v = value.dim() == 0 ? value : value.reshape({});  // a reshape costs ~0.8 us even when a no-op
    const c10::ScalarType wide = accumulation_dtype(device_);
    const bool keep_dtype = v.is_floating_point() && !(wide == at::kFloat && v.scalar_type() == at::kDouble);
    if (v.device() != device_ || !keep_dtype) v = v.to(device_, keep_dtype ? v.scalar_type() : wide);
    return v;
  }

  Entry& entry(std::string_view name, bool on_step, bool on_epoch, const LogOptions& options) {
    for (auto& e : entries_) {
      if (e.hook != hook_ || e.name != name) continue;
      if (e.on_step != on_step || e.on_epoch != on_epoch || e.options.reduce != options.reduce ||
          e.options.sync_dist != options.sync_dist || e.options.prog_bar != options.prog_bar ||
          e.options.logger != options.logger)
        throw MisconfigurationError("You called `log(\"" + std::string(name) + "\", ...)` twice in `" +
                                    std::string(hook_) + "` with different arguments. This is not allowed");
      return e;
    }
    const bool forked = on_step && on_epoch;
    entries_.push_back(Entry{std::string(hook_), std::string(name), on_step, on_epoch, options, {}, {}, 0.0, {}, false,
                             std::string(name) + (forked ? "_step" : ""), std::string(name) + (forked ? "_epoch" : "")});
    return entries_.back();
  }

  void publish(MetricViews& views, const Entry& e, const at::Tensor& value, bool on_step) const {
    const std::string& forked_name = on_step ? e.step_key : e.epoch_key;
    if (e.options.logger) views.logged.set(forked_name, value);
    if (training_ || (e.on_epoch && !on_step)) {
      views.callback.set(e.name, value);
      views.callback.set(forked_name, value);
    }
    if (e.options.prog_bar) views.progress_bar.set(forked_name, value);
  }

  bool training_;
  std::string_view hook_ = "training_step";
  LogScope scope_ = LogScope::none;
  std::int64_t batch_size_ = 1;
  c10::Device device_{c10::kCPU};
  MetricViews* views_ = nullptr;
  std::vector<Entry> entries_;
};

}  // namespace detail
}  // namespace fulgur
