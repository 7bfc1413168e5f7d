// torch.optim.lr_scheduler's MultiplicativeLR, ConstantLR and PolynomialLR (torch 2.11): Python's recursive forms
// (each step scales the group's own lr) and closed forms, in Python's order of operations.
#include "fulgur/optim/lr_scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "scheduler_support.hpp"

namespace fulgur::optim {

using namespace scheduler_support;

// ---- MultiplicativeLR ----------------------------------------------------------------------------

MultiplicativeLR::MultiplicativeLR(torch::optim::Optimizer& optimizer, const Lambda& lr_lambda)
    : MultiplicativeLR(optimizer, std::vector<Lambda>(optimizer.param_groups().size(), lr_lambda)) {}

MultiplicativeLR::MultiplicativeLR(torch::optim::Optimizer& optimizer, std::vector<Lambda> lr_lambdas)
    : LRScheduler(optimizer), lr_lambdas_(std::move(lr_lambdas)) {
  if (lr_lambdas_.size() != groups())
    refuse("MultiplicativeLR: expected " + std::to_string(groups()) + " lr_lambdas, but got " +
           std::to_string(lr_lambdas_.size()) + ".");
  for (const Lambda& f : lr_lambdas_)
    if (!f) refuse("MultiplicativeLR: an lr_lambda is empty; give a function of the epoch.");
  initial_step();
}

std::vector<double> MultiplicativeLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (is_initial_) return lrs;
  // Python zips the lambdas with the groups (strict=True): a group added later has none.
  if (lrs.size() != lr_lambdas_.size())
    refuse_added_group("MultiplicativeLR", lrs.size(), lr_lambdas_.size(),
                       "zip() argument 2 is longer than argument 1");
  for (std::size_t i = 0; i < lrs.size(); ++i) lrs[i] = lrs[i] * lr_lambdas_[i](last_epoch_);
  return lrs;
}

void MultiplicativeLR::own_state_after(StateDict& state) const {
  c10::impl::GenericList none(c10::AnyType::get());
  for (std::size_t i = 0; i < lr_lambdas_.size(); ++i) none.push_back(c10::IValue());
  state.insert("lr_lambdas", none);  // Python's None for a function: it is not state
}

void MultiplicativeLR::load_own_state(const StateDict& state) {
  entry(state, "lr_lambdas");  // a MultiplicativeLR's state (its functions are not state: they stay)
}

// ---- ConstantLR ----------------------------------------------------------------------------------

ConstantLR::ConstantLR(torch::optim::Optimizer& optimizer, double factor, std::int64_t total_iters)
    : LRScheduler(optimizer), factor_(factor), total_iters_(total_iters) {
  if (factor > 1.0 || factor < 0)
    refuse("ConstantLR: Constant multiplicative factor expected to be between 0 and 1. It is " + number_text(factor) +
           ".");
  initial_step();
}

std::vector<double> ConstantLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (last_epoch_ == 0) {
    for (double& lr : lrs) lr = lr * factor_;
    return lrs;
  }
  if (last_epoch_ != total_iters_) return lrs;
  if (factor_ == 0.0)  // Python's 1.0 / self.factor raises there
    refuse("ConstantLR: float division by zero at epoch " + std::to_string(total_iters_) +
           " (total_iters): a factor of 0 cannot be undone by scaling; give a factor above 0.");
  for (double& lr : lrs) lr = lr * (1.0 / factor_);
  return lrs;
}

std::optional<std::vector<double>> ConstantLR::closed_form_lr() const {
  const double passed = last_epoch_ >= total_iters_ ? 1.0 - factor_ : 0.0;  // Python's bool * (1 - factor)
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (double base : base_lrs_) lrs.push_back(base * (factor_ + passed));
  return lrs;
}

void ConstantLR::own_state_before(StateDict& state) const {
  state.insert("factor", factor_);
  state.insert("total_iters", total_iters_);
}

void ConstantLR::load_own_state(const StateDict& state) {
  const double factor = double_entry(state, "factor");
  const std::int64_t total = int_entry(state, "total_iters");
  factor_ = factor;
  total_iters_ = total;
}

// ---- PolynomialLR --------------------------------------------------------------------------------

PolynomialLR::PolynomialLR(torch::optim::Optimizer& optimizer, std::int64_t total_iters, double power)
    : LRScheduler(optimizer), total_iters_(total_iters), power_(power) {
  initial_step();
}

std::vector<double> PolynomialLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (is_initial_ || last_epoch_ > total_iters_) return lrs;
  const double epoch = static_cast<double>(last_epoch_), total = static_cast<double>(total_iters_);
  const double decay_factor = std::pow((1.0 - epoch / total) / (1.0 - (epoch - 1) / total), power_);
  for (double& lr : lrs) lr = lr * decay_factor;
  return lrs;
}

std::optional<std::vector<double>> PolynomialLR::closed_form_lr() const {
  if (total_iters_ == 0)  // Python's min(0, last_epoch) / 0 raises
    refuse("PolynomialLR: division by zero: total_iters is 0 (restarted by SequentialLR, or stepped with an epoch); "
           "give total_iters above 0.");
  const double total = static_cast<double>(total_iters_);
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (double base : base_lrs_)
    lrs.push_back(base * std::pow(1.0 - static_cast<double>(std::min(total_iters_, last_epoch_)) / total, power_));
  return lrs;
}

void PolynomialLR::own_state_before(StateDict& state) const {
  state.insert("total_iters", total_iters_);
  state.insert("power", power_);
}

void PolynomialLR::load_own_state(const StateDict& state) {
  const std::int64_t total = int_entry(state, "total_iters");
  const double power = double_entry(state, "power");
  total_iters_ = total;
  power_ = power;
}

}  // namespace fulgur::optim
