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
#include <c10/util/FunctionRef.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
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
  /// With several evaluation loaders, name the value "<name>/dataloader_idx_<i>" (Lightning's).
  bool add_dataloader_idx = true;
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
  void set(std::string_view name, const at::Tensor& value);
  /// The value now (a tensor that later logging does not change); none if `name` was not logged.
  std::optional<at::Tensor> find(std::string_view name) const;
  /// The value on the host (one sync); none if `name` was not logged.
  std::optional<double> item(std::string_view name) const;
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
  std::vector<std::string> names() const;
  /// Every value on the host (one sync per value).
  Metrics to_host() const;
  /// Every value on the host, in the order first logged (what a progress bar shows).
  std::vector<std::pair<std::string, double>> to_host_in_order() const;
  /// name -> a copy of each value, in order (for a checkpoint).
  c10::impl::GenericDict state() const;
  void load_state(const c10::impl::GenericDict& state, c10::Device device);

 private:
  const at::Tensor* find_live(std::string_view name) const {
    for (const auto& [key, tensor] : items_)
      if (key == name) return &tensor;
    return nullptr;
  }
  /// A copy: logging again writes into the live tensor.
  static at::Tensor snapshot(const at::Tensor& live);

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
  c10::impl::GenericDict state() const;
  void load_state(const c10::impl::GenericDict& state, c10::Device device);
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

  /// `suffix` ("/dataloader_idx_<i>" under several evaluation loaders) follows the name and its
  /// "_step"/"_epoch" forms, as Lightning names them ("acc_step/dataloader_idx_0").
  void log(std::string_view name, const at::Tensor& value, const LogOptions& options, std::string_view suffix = {});

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
  void collect_step_logged(Metrics& out) const;
  /// The epoch values logged for loggers, on the host (after publish_epoch).
  void collect_epoch_logged(Metrics& out) const;
  /// The step values into the views (after each batch; tensors only, no host sync). A value already
  /// there is current (it is written in place): only new or displaced tensors are published.
  void publish_step(MetricViews& views);
  /// The epoch values, reduced (and synced across processes where asked), into the views (once an
  /// epoch: compiled once, the reduction passed by reference).
  void publish_epoch(MetricViews& views, c10::function_ref<at::Tensor(const at::Tensor&, ReduceOp)> all_reduce);
  bool empty() const { return entries_.empty(); }
  /// Whether a value of this name was logged (by any hook) since the last reset.
  bool logs(std::string_view name) const;
  void reset() { entries_.clear(); }

  /// What was logged so far in this epoch, for a checkpoint taken mid-epoch: each entry's options,
  /// latest step value and epoch accumulation.
  c10::impl::GenericList state() const;
  /// Puts back what state() returned; the step values reach the views.
  void load_state(const c10::impl::GenericList& entries);

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

  void store_step_value(Entry& e, const at::Tensor& value);
  at::Tensor placed(const at::Tensor& value) const;
  Entry& entry(std::string_view name, std::string_view suffix, bool on_step, bool on_epoch, const LogOptions& options);
  void publish(MetricViews& views, const Entry& e, const at::Tensor& value, bool on_step) const;

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
