// fulgur::GradScaler: torch/amp/grad_scaler.py in C++ (see the header for the differences).
#include "fulgur/precision/grad_scaler.hpp"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>

#include <algorithm>
#include <string>

#include "fulgur/errors.hpp"
#include "fulgur/optim/scaled_step.hpp"

namespace fulgur {

namespace {
double number_at(const StateDict& state, const char* key) {
  if (!state.contains(key))
    throw GradScalerError(std::string("GradScaler.load_state_dict: the state has no key '") + key +
                          "'; pass a state saved by GradScaler.state_dict().");
  const c10::IValue v = state.at(key);
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  throw GradScalerError(std::string("GradScaler.load_state_dict: '") + key + "' is a " + v.tagKind() +
                        ", expected a number.");
}
}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options), init_scale_(options.init_scale) {
  if (!(options_.growth_factor > 1.0))
    throw MisconfigurationError("GradScaler: the growth factor must be > 1.0, got " +
                                std::to_string(options_.growth_factor) + ".");
  if (!(options_.backoff_factor < 1.0))
    throw MisconfigurationError("GradScaler: the backoff factor must be < 1.0, got " +
                                std::to_string(options_.backoff_factor) + ".");
  if (options_.growth_interval <= 0)
    throw MisconfigurationError("GradScaler: growth_interval must be > 0, got " +
                                std::to_string(options_.growth_interval) + ".");
}

void GradScaler::lazy_init(const c10::Device& device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  scale_ = at::full({}, init_scale_, f32);
  growth_tracker_ = at::full({}, init_growth_tracker_, f32.dtype(at::kInt));
  inv_scale_ = at::empty({}, f32);
  scale_double_ = at::empty({}, f32.dtype(at::kDouble));
  found_inf_ = at::zeros({}, f32);
}

void GradScaler::require_initialised(const char* function) const {
  if (!scale_.defined())
    throw GradScalerError(std::string("Attempted ") + function +
                          " but _scale is None.  This may indicate your script did not use "
                          "scaler.scale(loss or outputs) earlier in the iteration.");
}

GradScaler::OptimizerRecord& GradScaler::record_for(const torch::optim::Optimizer& optimizer) {
  for (auto& record : records_)
    if (record.optimizer == &optimizer) return record;
  records_.push_back(OptimizerRecord{&optimizer, Stage::ready, {},
                                     dynamic_cast<const optim::ScaledStepOptimizer*>(&optimizer) != nullptr});
  return records_.back();
}

GradScaler::DeviceFlags& GradScaler::flags_for(OptimizerRecord& record, const c10::Device& device) {
  for (auto& flags : record.devices)
    if (flags.device == device) return flags;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  record.devices.push_back(DeviceFlags{device, at::zeros({}, f32), at::empty({}, f32), false});
  return record.devices.back();
}

GradScaler::Stage GradScaler::stage(const torch::optim::Optimizer& optimizer) const {
  for (const auto& record : records_)
    if (record.optimizer == &optimizer) return record.stage;
  return Stage::ready;
}

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  if (!options_.enabled) return outputs;
  if (!scale_.defined()) lazy_init(outputs.device());
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  require_initialised("unscale_");
  OptimizerRecord& record = record_for(optimizer);
  if (record.stage == Stage::unscaled)
    throw GradScalerError("unscale_() has already been called on this optimizer since the last update().");
  if (record.stage == Stage::stepped) throw GradScalerError("unscale_() is being called after step().");
  check_gradients(optimizer, record, /*unscale=*/true);
  record.stage = Stage::unscaled;
}

void GradScaler::check_gradients(torch::optim::Optimizer& optimizer, OptimizerRecord& record, bool unscale) {
  if (unscale) {  // inv_scale = scale.double().reciprocal().float(), into preallocated buffers.
    scale_double_.copy_(scale_);
    scale_double_.reciprocal_();
    inv_scale_.copy_(scale_double_);
  }
  for (auto& group : groups_) group.grads.clear();
  for (auto& param_group : optimizer.param_groups()) {
    for (auto& param : param_group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (unscale && grad.scalar_type() == at::kHalf)  // Python's allow_fp16=False, unscale_'s only
        throw GradScalerError(
            "Attempting to unscale FP16 gradients. The parameters are float16, so there are no float32 "
            "master weights to step: use FP16MixedPrecision with float32 parameters, or FP16TruePrecision "
            "without a scaler.");
      at::Tensor to_unscale = grad.is_sparse() ? grad._values() : grad;
      auto group = std::find_if(groups_.begin(), groups_.end(), [&](const GradGroup& g) {
        return g.device == to_unscale.device() && g.dtype == to_unscale.scalar_type();
      });
      if (group == groups_.end()) {
        groups_.push_back(GradGroup{to_unscale.device(), to_unscale.scalar_type(), {}});
        group = std::prev(groups_.end());
      }
      group->grads.push_back(std::move(to_unscale));
    }
  }
  for (auto& group : groups_) {
    if (group.grads.empty()) continue;
    DeviceFlags& flags = flags_for(record, group.device);
    if (!flags.checked) {
      flags.found_inf.zero_();
      if (unscale) flags.inv_scale.copy_(inv_scale_, /*non_blocking=*/true);
      else flags.inv_scale.fill_(1.0);
      flags.checked = true;
    }
    at::_amp_foreach_non_finite_check_and_unscale_(group.grads, flags.found_inf, flags.inv_scale);
    group.grads.clear();  // hold no gradient past this call (zero_grad may free them)
  }
}

const at::Tensor& GradScaler::combined_found_inf(OptimizerRecord& record) {
  const at::Tensor* only = nullptr;
  int count = 0;
  for (const auto& flags : record.devices)
    if (flags.checked && count++ == 0) only = &flags.found_inf;
  if (count == 0)
    throw GradScalerError("No inf checks were recorded for this optimizer: none of its parameters has a "
                          "gradient. Call backward on the scaled loss before step().");
  if (count == 1 && only->device() == scale_.device()) return *only;
  found_inf_.zero_();  // Python: sum(flag.to(scale's device) for each device's flag)
  for (const auto& flags : record.devices)
    if (flags.checked) found_inf_.add_(flags.found_inf.to(scale_.device(), /*non_blocking=*/true));
  return found_inf_;
}

void GradScaler::for_each_found_inf(const torch::optim::Optimizer& optimizer,
                                    const std::function<void(const at::Tensor&)>& visit) {
  for (auto& flags : record_for(optimizer).devices)
    if (flags.checked) visit(flags.found_inf);
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  require_initialised("step");
  if (stage(optimizer) == Stage::stepped)
    throw GradScalerError("step() has already been called since the last update().");
  OptimizerRecord& record = record_for(optimizer);
  if (record.scales_in_kernel) {
    const bool unscaled = record.stage == Stage::unscaled;
    if (!unscaled) check_gradients(optimizer, record, /*unscale=*/false);
    const at::Tensor& found_inf = combined_found_inf(record);
    static_cast<optim::ScaledStepOptimizer&>(optimizer).scaled_step(
        unscaled ? std::nullopt : std::optional<at::Tensor>(scale_), found_inf);
    record.stage = Stage::stepped;
    return found_inf.item<float>() == 0.0f;
  }
  if (record.stage == Stage::ready) unscale_(optimizer);

  bool any_checked = false, found_inf = false;
  for (const auto& flags : record.devices) {
    if (!flags.checked) continue;
    any_checked = true;
    found_inf = found_inf || flags.found_inf.item<float>() != 0.0f;  // the one host sync of a step
  }
  if (!any_checked)
    throw GradScalerError("No inf checks were recorded for this optimizer: none of its parameters has a "
                          "gradient. Call backward on the scaled loss before step().");
  if (!found_inf) optimizer.step();
  record.stage = Stage::stepped;
  return !found_inf;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  require_initialised("update");
  const at::Tensor* first = nullptr;
  int count = 0;
  for (auto& record : records_)
    for (auto& flags : record.devices) {
      if (!flags.checked) continue;
      if (count++ == 0) {
        first = &flags.found_inf;
      } else {
        if (count == 2) found_inf_.copy_(*first, /*non_blocking=*/true);
        found_inf_.add_(flags.found_inf.to(scale_.device(), /*non_blocking=*/true));
      }
    }
  if (count == 0) throw GradScalerError("No inf checks were recorded prior to update().");
  const at::Tensor combined =
      count == 1 ? first->to(scale_.device(), /*non_blocking=*/true) : found_inf_;
  at::_amp_update_scale_(scale_, growth_tracker_, combined, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
  for (auto& record : records_) {
    record.stage = Stage::ready;
    for (auto& flags : record.devices) flags.checked = false;
  }
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  require_initialised("update");
  scale_.fill_(new_scale);
  for (auto& record : records_) {
    record.stage = Stage::ready;
    for (auto& flags : record.devices) flags.checked = false;
  }
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : init_scale_;
}

std::int64_t GradScaler::growth_tracker() const {
  return growth_tracker_.defined() ? growth_tracker_.item<std::int32_t>() : init_growth_tracker_;
}

StateDict GradScaler::state_dict() const {
  StateDict state;
  if (!options_.enabled) return state;
  state.insert("scale", get_scale());
  state.insert("growth_factor", options_.growth_factor);
  state.insert("backoff_factor", options_.backoff_factor);
  state.insert("growth_interval", options_.growth_interval);
  state.insert("_growth_tracker", growth_tracker());
  return state;
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!options_.enabled) return;
  if (state.empty())
    throw GradScalerError(
        "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.");
  init_scale_ = number_at(state, "scale");
  options_.growth_factor = number_at(state, "growth_factor");
  options_.backoff_factor = number_at(state, "backoff_factor");
  options_.growth_interval = static_cast<std::int64_t>(number_at(state, "growth_interval"));
  init_growth_tracker_ = static_cast<std::int64_t>(number_at(state, "_growth_tracker"));
  if (scale_.defined()) scale_.fill_(init_scale_);
  if (growth_tracker_.defined()) growth_tracker_.fill_(init_growth_tracker_);
}

}  // namespace fulgur
