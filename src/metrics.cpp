// Logged metrics (include/fulgur/metrics.hpp): compiled once here rather than in every translation
// unit that instantiates a Trainer.
#include "fulgur/metrics.hpp"
#include "fulgur/step_context.hpp"

#include <ATen/core/grad_mode.h>

#include <cstring>
#include <limits>

namespace fulgur::detail {

// ---- TensorMap ------------------------------------------------------------------------------------

void TensorMap::set(std::string_view name, const at::Tensor& value) {
  for (auto& [key, tensor] : items_)
    if (key == name) {
      if (!tensor.is_same(value)) tensor = value, ++changes_;
      return;
    }
  items_.emplace_back(std::string(name), value);
  ++changes_;
}

std::optional<at::Tensor> TensorMap::find(std::string_view name) const {
  if (const at::Tensor* live = find_live(name)) return snapshot(*live);
  return std::nullopt;
}

std::optional<double> TensorMap::item(std::string_view name) const {
  if (const at::Tensor* live = find_live(name)) return live->item<double>();
  return std::nullopt;
}

std::vector<std::string> TensorMap::names() const {
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const auto& item : items_) out.push_back(item.first);
  return out;
}

Metrics TensorMap::to_host() const {
  Metrics out;
  for (const auto& [key, tensor] : items_) out[key] = tensor.item<double>();
  return out;
}

std::vector<std::pair<std::string, double>> TensorMap::to_host_in_order() const {
  std::vector<std::pair<std::string, double>> out;
  out.reserve(items_.size());
  for (const auto& [key, tensor] : items_) out.emplace_back(key, tensor.item<double>());
  return out;
}

c10::impl::GenericDict TensorMap::state() const {
  c10::impl::GenericDict out(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [key, tensor] : items_) out.insert(key, snapshot(tensor));
  return out;
}

void TensorMap::load_state(const c10::impl::GenericDict& state, c10::Device device) {
  clear();
  for (const auto& item : state) set(item.key().toStringRef(), item.value().toTensor().to(device));
}

at::Tensor TensorMap::snapshot(const at::Tensor& live) {
  at::NoGradGuard no_grad;
  return live.clone();
}

// ---- MetricViews ----------------------------------------------------------------------------------

c10::impl::GenericDict MetricViews::state() const {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("callback", callback.state());
  out.insert("logged", logged.state());
  out.insert("progress_bar", progress_bar.state());
  return out;
}

void MetricViews::load_state(const c10::impl::GenericDict& state, c10::Device device) {
  callback.load_state(state.at("callback").toGenericDict(), device);
  logged.load_state(state.at("logged").toGenericDict(), device);
  progress_bar.load_state(state.at("progress_bar").toGenericDict(), device);
}

// ---- MetricCollection -----------------------------------------------------------------------------

void MetricCollection::log(std::string_view name, const at::Tensor& value, const LogOptions& options,
                           std::string_view suffix) {
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
  Entry& e = entry(name, suffix, on_step, on_epoch, options);
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

void MetricCollection::collect_step_logged(Metrics& out) const {
  for (const auto& e : entries_)
    if (e.fresh && e.on_step && e.options.logger && e.step_value.defined()) out[e.step_key] = e.step_value.item<double>();
}

void MetricCollection::collect_epoch_logged(Metrics& out) const {
  for (const auto& e : entries_)
    if (e.on_epoch && e.options.logger && e.computed.defined()) out[e.epoch_key] = e.computed.item<double>();
}

void MetricCollection::publish_epoch(MetricViews& views,
                                     c10::function_ref<at::Tensor(const at::Tensor&, ReduceOp)> all_reduce) {
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

void MetricCollection::publish_step(MetricViews& views) {
  for (auto& e : entries_) {
    if (!e.on_step || !e.step_value.defined()) continue;
    if (&views != views_ || e.published_at != views.changes()) publish(views, e, e.step_value, /*on_step=*/true);
    if (&views == views_) e.published_at = views.changes();
    e.fresh = false;
  }
}

bool MetricCollection::logs(std::string_view name) const {
  for (const auto& e : entries_)
    if (e.name == name) return true;
  return false;
}

c10::impl::GenericList MetricCollection::state() const {
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

void MetricCollection::load_state(const c10::impl::GenericList& entries) {
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

// The step value, without an allocation per step: the entry holds a tensor of its own (no autograd;
// the views share it, so they are current at once) and each new value is copied into it — on the
// host a memcpy of the number (no dispatcher call, none of the step's memory kept alive), on a
// device an asynchronous copy (no sync). A copy, not an alias: a tensor the module changes after
// logging it (a parameter, a running sum) leaves the logged value alone, as Lightning's clone does.
// A first value, or one of another kind, gets a new tensor.
void MetricCollection::store_step_value(Entry& e, const at::Tensor& value) {
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

// The value as one floating-point number on the training device (a copy only where needed).
at::Tensor MetricCollection::placed(const at::Tensor& value) const {
  at::Tensor v = value.dim() == 0 ? value : value.reshape({});  // a reshape costs ~0.8 us even when a no-op
  const c10::ScalarType wide = accumulation_dtype(device_);
  const bool keep_dtype = v.is_floating_point() && !(wide == at::kFloat && v.scalar_type() == at::kDouble);
  if (v.device() != device_ || !keep_dtype) v = v.to(device_, keep_dtype ? v.scalar_type() : wide);
  return v;
}

MetricCollection::Entry& MetricCollection::entry(std::string_view name, std::string_view suffix, bool on_step,
                                                 bool on_epoch, const LogOptions& options) {
  for (auto& e : entries_) {
    if (e.hook != hook_ || e.name.size() != name.size() + suffix.size() || !e.name.starts_with(name) ||
        !e.name.ends_with(suffix))
      continue;
    if (e.on_step != on_step || e.on_epoch != on_epoch || e.options.reduce != options.reduce ||
        e.options.sync_dist != options.sync_dist || e.options.prog_bar != options.prog_bar ||
        e.options.logger != options.logger)
      throw MisconfigurationError("You called `log(\"" + std::string(name) + "\", ...)` twice in `" +
                                  std::string(hook_) + "` with different arguments. This is not allowed");
    return e;
  }
  const bool forked = on_step && on_epoch;
  const std::string base(name), end(suffix);
  entries_.push_back(Entry{std::string(hook_), base + end, on_step, on_epoch, options, {}, {}, 0.0, {}, false,
                           base + (forked ? "_step" : "") + end, base + (forked ? "_epoch" : "") + end});
  return entries_.back();
}

void MetricCollection::publish(MetricViews& views, const Entry& e, const at::Tensor& value, bool on_step) const {
  const std::string& forked_name = on_step ? e.step_key : e.epoch_key;
  if (e.options.logger) views.logged.set(forked_name, value);
  if (training_ || (e.on_epoch && !on_step)) {
    views.callback.set(e.name, value);
    views.callback.set(forked_name, value);
  }
  if (e.options.prog_bar) views.progress_bar.set(forked_name, value);
}

}  // namespace fulgur::detail

namespace fulgur {
void StepContext::raise_named_idx(std::string_view name) {
  throw MisconfigurationError("You called `log` with the key `" + std::string(name) +
                              "` but it should not contain information about `dataloader_idx` when "
                              "`add_dataloader_idx=true` (fulgur adds the suffix itself with several loaders; set "
                              "LogOptions::add_dataloader_idx = false to name it yourself).");
}
}  // namespace fulgur
