// torch.optim.lr_scheduler.ReduceLROnPlateau (torch 2.11).
#include "fulgur/optim/lr_scheduler.hpp"

#include <algorithm>
#include <limits>
#include <utility>

#include "scheduler_support.hpp"

namespace fulgur::optim {

using namespace scheduler_support;

// ---- ReduceLROnPlateau ---------------------------------------------------------------------------

ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : optimizer_(&optimizer), options_(std::move(options)) {
  if (options_.factor >= 1.0) refuse("ReduceLROnPlateau: factor should be < 1.0, got " + number_text(options_.factor) + ".");
  const std::size_t groups = optimizer.param_groups().size();
  if (options_.min_lr.size() == 1) {
    default_min_lr_ = true;
    min_lrs_.assign(groups, options_.min_lr.front());
  } else if (options_.min_lr.size() == groups) {
    default_min_lr_ = false;
    min_lrs_ = options_.min_lr;
  } else {
    refuse("ReduceLROnPlateau: expected " + std::to_string(groups) + " min_lrs, got " +
           std::to_string(options_.min_lr.size()) + ".");
  }
  for (const auto& group : optimizer.param_groups()) last_lr_.push_back(group.options().get_lr());
  best_ = options_.mode == ReduceLROnPlateauOptions::Mode::min ? std::numeric_limits<double>::infinity()
                                                               : -std::numeric_limits<double>::infinity();
}

void ReduceLROnPlateau::set_min_lrs(std::vector<double> min_lrs) {
  const std::size_t groups = optimizer_->param_groups().size();
  if (min_lrs.size() != groups)
    refuse("ReduceLROnPlateau::set_min_lrs: expected " + std::to_string(groups) +
           " min_lrs (one per param group), got " + std::to_string(min_lrs.size()) + ".");
  for (std::size_t i = 0; i < min_lrs.size(); ++i)
    if (!(min_lrs[i] >= 0.0))
      refuse("ReduceLROnPlateau::set_min_lrs: min_lrs[" + std::to_string(i) + "] is " + number_text(min_lrs[i]) +
             "; a minimum learning rate must be a number >= 0.");
  min_lrs_ = std::move(min_lrs);
}

bool ReduceLROnPlateau::is_better(double a, double best) const {
  using Mode = ReduceLROnPlateauOptions::Mode;
  using Threshold = ReduceLROnPlateauOptions::ThresholdMode;
  const bool rel = options_.threshold_mode == Threshold::rel;
  if (options_.mode == Mode::min) return rel ? a < best * (1.0 - options_.threshold) : a < best - options_.threshold;
  return rel ? a > best * (options_.threshold + 1.0) : a > best + options_.threshold;
}

void ReduceLROnPlateau::step(double metric) {
  last_epoch_ = last_epoch_ + 1;
  if (is_better(metric, best_)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    num_bad_epochs_ += 1;
  }
  if (cooldown_counter_ > 0) {
    cooldown_counter_ -= 1;
    num_bad_epochs_ = 0;  // bad epochs in cooldown do not count
  }
  auto& groups = optimizer_->param_groups();
  if (num_bad_epochs_ > options_.patience) {
    if (groups.size() != min_lrs_.size()) {
      if (!default_min_lr_)  // Python's RuntimeError, word for word, then what fulgur offers instead of the field
        refuse("The number of param groups in the `optimizer` (" + std::to_string(groups.size()) +
               ") differs from when `ReduceLROnPlateau` was initialized (" + std::to_string(min_lrs_.size()) +
               "), usually due to a new param group being added to the optimizer. Please modify the `min_lrs` field "
               "to match the length of the `optimizer` param groups. (fulgur: give ReduceLROnPlateauOptions::min_lr "
               "one value, which every group takes, those added later included.)");
      min_lrs_.assign(groups.size(), options_.min_lr.front());
    }
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const double old_lr = groups[i].options().get_lr();
      const double new_lr = std::max(old_lr * options_.factor, min_lrs_[i]);
      if (old_lr - new_lr > options_.eps) groups[i].options().set_lr(new_lr);
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
  last_lr_.clear();
  for (const auto& group : groups) last_lr_.push_back(group.options().get_lr());
}

StateDict ReduceLROnPlateau::state_dict() const {
  using Mode = ReduceLROnPlateauOptions::Mode;
  const bool min = options_.mode == Mode::min;
  StateDict state;
  state.insert("factor", options_.factor);
  state.insert("default_min_lr", default_min_lr_ ? c10::IValue(options_.min_lr.front()) : c10::IValue());
  state.insert("min_lrs", doubles(min_lrs_));
  state.insert("patience", options_.patience);
  state.insert("cooldown", options_.cooldown);
  state.insert("eps", options_.eps);
  state.insert("last_epoch", last_epoch_);
  state.insert("_last_lr", doubles(last_lr_));
  state.insert("mode_worse", min ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity());
  state.insert("mode", std::string(min ? "min" : "max"));
  state.insert("threshold", options_.threshold);
  state.insert("threshold_mode",
               std::string(options_.threshold_mode == ReduceLROnPlateauOptions::ThresholdMode::rel ? "rel" : "abs"));
  state.insert("best", best_);
  state.insert("cooldown_counter", cooldown_counter_);
  state.insert("num_bad_epochs", num_bad_epochs_);
  return state;
}

void ReduceLROnPlateau::load_state_dict(const StateDict& state) {
  // Python's restores every attribute, its arguments included.
  ReduceLROnPlateauOptions options = options_;
  options.factor = double_entry(state, "factor");
  options.patience = int_entry(state, "patience");
  options.cooldown = int_entry(state, "cooldown");
  options.eps = double_entry(state, "eps");
  options.threshold = double_entry(state, "threshold");
  const c10::IValue mode = entry(state, "mode"), threshold_mode = entry(state, "threshold_mode");
  if (!mode.isString() || (mode.toStringRef() != "min" && mode.toStringRef() != "max"))
    bad_state("mode", "is not 'min' or 'max'");
  if (!threshold_mode.isString() || (threshold_mode.toStringRef() != "rel" && threshold_mode.toStringRef() != "abs"))
    bad_state("threshold_mode", "is not 'rel' or 'abs'");
  options.mode = mode.toStringRef() == "min" ? ReduceLROnPlateauOptions::Mode::min : ReduceLROnPlateauOptions::Mode::max;
  options.threshold_mode = threshold_mode.toStringRef() == "rel" ? ReduceLROnPlateauOptions::ThresholdMode::rel
                                                                 : ReduceLROnPlateauOptions::ThresholdMode::abs;
  const double best = double_entry(state, "best");
  const std::int64_t last_epoch = int_entry(state, "last_epoch"), cooldown_counter = int_entry(state, "cooldown_counter"),
                     bad = int_entry(state, "num_bad_epochs");
  std::vector<double> min_lrs = doubles_entry(state, "min_lrs"), last = doubles_entry(state, "_last_lr");
  options_ = std::move(options);
  best_ = best;
  last_epoch_ = last_epoch;
  cooldown_counter_ = cooldown_counter;
  num_bad_epochs_ = bad;
  min_lrs_ = std::move(min_lrs);
  last_lr_ = std::move(last);
}

}  // namespace fulgur::optim
