// torch.optim.lr_scheduler.CyclicLR (torch 2.11): Python's cycle arithmetic in Python's order, momentum cycled the
// other way on SGD's / RMSprop's momentum or Adam's / AdamW's beta1.
#include "fulgur/optim/lr_scheduler.hpp"

#include <cmath>
#include <utility>

#include "scheduler_support.hpp"

namespace fulgur::optim {

using namespace scheduler_support;

namespace {

/// Python's _format_param: one value for every group, or one per group.
std::vector<double> per_group(const char* name, std::vector<double> values, std::size_t groups) {
  if (values.size() == 1) values.assign(groups, values.front());
  if (values.size() != groups)
    refuse(std::string("CyclicLR: ") + name + " must have the same length as optimizer.param_groups. " + name +
           " has " + std::to_string(values.size()) + " values, param_groups has " + std::to_string(groups) + ".");
  return values;
}

const char* mode_name(CyclicLROptions::Mode mode) {
  switch (mode) {
    case CyclicLROptions::Mode::triangular2: return "triangular2";
    case CyclicLROptions::Mode::exp_range: return "exp_range";
    default: return "triangular";
  }
}

}  // namespace

CyclicLR::CyclicLR(torch::optim::Optimizer& optimizer, CyclicLROptions options)
    : LRScheduler(optimizer, per_group("base_lr", std::move(options.base_lr), optimizer.param_groups().size())),
      max_lrs_(per_group("max_lr", std::move(options.max_lr), groups())),
      mode_(options.mode),
      gamma_(options.gamma),
      scale_fn_(std::move(options.scale_fn)),
      scale_mode_(options.scale_mode),
      cycle_momentum_(options.cycle_momentum) {
  // Python divides by step_ratio (0 when step_size_up is 0: a ZeroDivisionError at the first step).
  if (options.step_size_up <= 0)
    refuse("CyclicLR: step_size_up must be a positive number of iterations, got " +
           std::to_string(options.step_size_up) + ".");
  const std::int64_t down = options.step_size_down.value_or(options.step_size_up);
  if (down < 0) refuse("CyclicLR: step_size_down must not be negative, got " + std::to_string(down) + ".");
  const double up = static_cast<double>(options.step_size_up);
  total_size_ = up + static_cast<double>(down);
  step_ratio_ = up / total_size_;
  if (!scale_fn_) scale_mode_ = mode_ == CyclicLROptions::Mode::exp_range ? CyclicLROptions::ScaleMode::iterations
                                                                         : CyclicLROptions::ScaleMode::cycle;
  if (cycle_momentum_) {
    if (!has_momentum(optimizer) && !has_beta1(optimizer))
      refuse("CyclicLR: optimizer must support momentum or beta1 with `cycle_momentum` option enabled (SGD, RMSprop, "
             "Adam, AdamW); pass cycle_momentum = false for another.");
    use_beta1_ = has_beta1(optimizer);
    base_momentums_ = per_group("base_momentum", std::move(options.base_momentum), groups());
    max_momentums_ = per_group("max_momentum", std::move(options.max_momentum), groups());
  }
  // Python sets each group's lr to base_lr (and momentum to max_momentum) before its first step.
  set_group_lrs(base_lrs_);
  if (cycle_momentum_)
    for (std::size_t g = 0; g < groups(); ++g) MomentumOf{optimizer.param_groups()[g].options()}.set(max_momentums_[g]);
  initial_step();
}

double CyclicLR::scale(std::int64_t x) const {
  const double at = static_cast<double>(x);
  if (scale_fn_) return scale_fn_(at);
  switch (mode_) {
    case CyclicLROptions::Mode::triangular2: return 1 / std::pow(2.0, at - 1);
    case CyclicLROptions::Mode::exp_range: return std::pow(gamma_, at);
    default: return 1.0;
  }
}

std::vector<double> CyclicLR::get_lr() {
  const double progress = static_cast<double>(last_epoch_) / total_size_;
  const auto cycle = static_cast<std::int64_t>(std::floor(1 + progress));
  const double x = 1.0 + progress - static_cast<double>(cycle);
  const double scale_factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  const double scaled = scale(scale_mode_ == CyclicLROptions::ScaleMode::cycle ? cycle : last_epoch_);
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (std::size_t i = 0; i < base_lrs_.size(); ++i) {
    const double base_height = (max_lrs_[i] - base_lrs_[i]) * scale_factor;
    lrs.push_back(base_lrs_[i] + base_height * scaled);
  }
  if (cycle_momentum_) {
    auto& param_groups = optimizer_->param_groups();
    // Python zips the groups with the momenta (strict=True): the pairs it makes are set before it raises.
    for (std::size_t g = 0; g < std::min(param_groups.size(), max_momentums_.size()); ++g) {
      const double base_height = (max_momentums_[g] - base_momentums_[g]) * scale_factor;
      MomentumOf{param_groups[g].options()}.set(max_momentums_[g] - base_height * scaled);
    }
    if (param_groups.size() != max_momentums_.size())
      refuse_added_group("CyclicLR", param_groups.size(), max_momentums_.size(),
                         "zip() argument 2 is shorter than argument 1");
  }
  return lrs;
}

void CyclicLR::own_state_before(StateDict& state) const {
  state.insert("max_lrs", doubles(max_lrs_));
  state.insert("total_size", total_size_);
  state.insert("step_ratio", step_ratio_);
  state.insert("mode", std::string(mode_name(mode_)));
  state.insert("gamma", gamma_);
  state.insert("scale_mode",
               std::string(scale_mode_ == CyclicLROptions::ScaleMode::cycle ? "cycle" : "iterations"));
  state.insert("cycle_momentum", cycle_momentum_);
  if (cycle_momentum_) {
    state.insert("use_beta1", use_beta1_);
    state.insert("base_momentums", doubles(base_momentums_));
    state.insert("max_momentums", doubles(max_momentums_));
  }
}

void CyclicLR::own_state_after(StateDict& state) const {
  state.insert("_scale_fn_custom", c10::IValue());  // Python's None for a function: it is not state
}

void CyclicLR::load_own_state(const StateDict& state) {
  entry(state, "_scale_fn_custom");
  std::vector<double> max_lrs = doubles_entry(state, "max_lrs");
  const double total_size = double_entry(state, "total_size"), step_ratio = double_entry(state, "step_ratio");
  const double gamma = double_entry(state, "gamma");
  const c10::IValue mode = entry(state, "mode"), scale_mode = entry(state, "scale_mode");
  CyclicLROptions::Mode loaded_mode{};
  if (mode.isString() && mode.toStringRef() == "triangular") loaded_mode = CyclicLROptions::Mode::triangular;
  else if (mode.isString() && mode.toStringRef() == "triangular2") loaded_mode = CyclicLROptions::Mode::triangular2;
  else if (mode.isString() && mode.toStringRef() == "exp_range") loaded_mode = CyclicLROptions::Mode::exp_range;
  else bad_state("mode", "is not 'triangular', 'triangular2' or 'exp_range'");
  if (!scale_mode.isString() || (scale_mode.toStringRef() != "cycle" && scale_mode.toStringRef() != "iterations"))
    bad_state("scale_mode", "is not 'cycle' or 'iterations'");
  const c10::IValue cycle_momentum = entry(state, "cycle_momentum");
  if (!cycle_momentum.isBool()) bad_state("cycle_momentum", "is not a bool");
  std::vector<double> base_momentums, max_momentums;
  bool use_beta1 = false;
  if (cycle_momentum.toBool()) {
    const c10::IValue beta1 = entry(state, "use_beta1");
    if (!beta1.isBool()) bad_state("use_beta1", "is not a bool");
    use_beta1 = beta1.toBool();
    base_momentums = doubles_entry(state, "base_momentums");
    max_momentums = doubles_entry(state, "max_momentums");
  }
  max_lrs_ = std::move(max_lrs);
  total_size_ = total_size;
  step_ratio_ = step_ratio;
  gamma_ = gamma;
  mode_ = loaded_mode;
  scale_mode_ = scale_mode.toStringRef() == "cycle" ? CyclicLROptions::ScaleMode::cycle
                                                    : CyclicLROptions::ScaleMode::iterations;
  if (!scale_fn_)  // Python's _init_scale_fn: mode decides the scale mode
    scale_mode_ = mode_ == CyclicLROptions::Mode::exp_range ? CyclicLROptions::ScaleMode::iterations
                                                            : CyclicLROptions::ScaleMode::cycle;
  cycle_momentum_ = cycle_momentum.toBool();
  use_beta1_ = use_beta1;
  base_momentums_ = std::move(base_momentums);
  max_momentums_ = std::move(max_momentums);
}

}  // namespace fulgur::optim
