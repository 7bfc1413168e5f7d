// torch/optim/lr_scheduler.py (torch 2.11) in C++: every formula in Python's order of operations, so
// that each learning rate is the same double. The header says what is kept where. This file: the base and the
// schedulers that scale the lr step by step (LambdaLR, StepLR, MultiStepLR, ExponentialLR, LinearLR);
// cosine_schedulers.cpp, factor_schedulers.cpp, cyclic_lr.cpp, composite_schedulers.cpp and plateau.cpp the others.
#include "fulgur/optim/lr_scheduler.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "scheduler_support.hpp"

namespace fulgur::optim {

using namespace scheduler_support;

namespace {

std::uint64_t next_made() {
  static std::atomic<std::uint64_t> count{0};
  return ++count;
}

}  // namespace

// ---- LRScheduler ---------------------------------------------------------------------------------

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer, std::vector<double> base_lrs)
    : optimizer_(&optimizer), base_lrs_(std::move(base_lrs)), made_(next_made()) {
  if (base_lrs_.empty()) base_lrs_ = group_lrs();
}

std::vector<double> LRScheduler::group_lrs() const {
  std::vector<double> lrs;
  lrs.reserve(groups());
  for (const auto& group : optimizer_->param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

void LRScheduler::set_group_lrs(const std::vector<double>& lrs) {
  // Python's zip(param_groups, values, strict=True): the pairs it makes are set before it raises.
  auto& param_groups = optimizer_->param_groups();
  const std::size_t paired = std::min(lrs.size(), param_groups.size());
  for (std::size_t i = 0; i < paired; ++i) param_groups[i].options().set_lr(lrs[i]);
  if (lrs.size() != param_groups.size())
    refuse_added_group(kind_of(*this), param_groups.size(), lrs.size(),
                       std::string("zip() argument 2 is ") + (lrs.size() < param_groups.size() ? "shorter" : "longer") +
                           " than argument 1");
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  is_initial_ = true;
  try {
    step();
  } catch (...) {
    is_initial_ = false;
    throw;
  }
  is_initial_ = false;
}

void LRScheduler::step() {
  ++step_count_;
  update_lr();
}

void LRScheduler::update_lr(std::optional<std::int64_t> epoch) {
  std::vector<double> values;
  if (!epoch) {
    ++last_epoch_;
    values = get_lr();
  } else {
    last_epoch_ = *epoch;
    std::optional<std::vector<double>> closed = closed_form_lr();
    values = closed ? std::move(*closed) : get_lr();
  }
  set_group_lrs(values);
  last_lr_ = group_lrs();
}

double LRScheduler::base_lr(std::size_t group) const {
  if (group >= base_lrs_.size())
    refuse_added_group(kind_of(*this), groups(), base_lrs_.size(), "zip() argument 2 is longer than argument 1");
  return base_lrs_[group];
}

StateDict LRScheduler::state_dict() const {
  StateDict state;
  own_state_before(state);
  state.insert("base_lrs", doubles(base_lrs_));
  state.insert("last_epoch", last_epoch_);
  state.insert("_step_count", step_count_);
  state.insert("_is_initial", is_initial_);
  state.insert("_get_lr_called_within_step", false);
  state.insert("_last_lr", doubles(last_lr_));
  own_state_after(state);
  return state;
}

void LRScheduler::load_state_dict(const StateDict& state) {
  std::vector<double> base = doubles_entry(state, "base_lrs"), last = doubles_entry(state, "_last_lr");
  // Fewer than the optimizer's groups is a state saved after groups were added (Python's restores it as it is);
  // more is another optimizer's.
  if (base.size() > groups() || last.size() > groups())
    bad_state(base.size() > groups() ? "base_lrs" : "_last_lr",
              "has " + std::to_string(std::max(base.size(), last.size())) + " learning rates for the optimizer's " +
                  std::to_string(groups()) + " param groups");
  const std::int64_t last_epoch = int_entry(state, "last_epoch"), step_count = int_entry(state, "_step_count");
  load_own_state(state);
  base_lrs_ = std::move(base);
  last_lr_ = std::move(last);
  last_epoch_ = last_epoch;
  step_count_ = step_count;
}

// ---- LambdaLR ------------------------------------------------------------------------------------

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, const Lambda& lr_lambda)
    : LambdaLR(optimizer, std::vector<Lambda>(optimizer.param_groups().size(), lr_lambda)) {}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::vector<Lambda> lr_lambdas)
    : LRScheduler(optimizer), lr_lambdas_(std::move(lr_lambdas)) {
  if (lr_lambdas_.size() != groups())
    refuse("LambdaLR: expected " + std::to_string(groups()) + " lr_lambdas, but got " +
           std::to_string(lr_lambdas_.size()) + ".");
  for (const Lambda& f : lr_lambdas_)
    if (!f) refuse("LambdaLR: an lr_lambda is empty; give a function of the epoch.");
  initial_step();
}

std::vector<double> LambdaLR::get_lr() {
  std::vector<double> lrs;
  for (std::size_t i = 0; i < base_lrs_.size(); ++i) lrs.push_back(base_lrs_[i] * lr_lambdas_[i](last_epoch_));
  return lrs;
}

void LambdaLR::own_state_after(StateDict& state) const {
  c10::impl::GenericList none(c10::AnyType::get());
  for (std::size_t i = 0; i < lr_lambdas_.size(); ++i) none.push_back(c10::IValue());
  state.insert("lr_lambdas", none);  // Python's None for a function: it is not state
}

void LambdaLR::load_own_state(const StateDict& state) {
  entry(state, "lr_lambdas");  // a LambdaLR's state (its functions are not state: they stay)
}

// ---- StepLR --------------------------------------------------------------------------------------

StepLR::StepLR(torch::optim::Optimizer& optimizer, std::int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  if (step_size <= 0) refuse("StepLR: step_size must be a positive number of epochs, got " + std::to_string(step_size) + ".");
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  if (last_epoch_ == 0 || floor_mod(last_epoch_, step_size_) != 0) return group_lrs();
  std::vector<double> lrs = group_lrs();
  for (double& lr : lrs) lr = lr * gamma_;
  return lrs;
}

std::optional<std::vector<double>> StepLR::closed_form_lr() const {
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (double base : base_lrs_)
    lrs.push_back(base * std::pow(gamma_, static_cast<double>(floor_div(last_epoch_, step_size_))));
  return lrs;
}

void StepLR::load_own_state(const StateDict& state) {
  const std::int64_t step_size = int_entry(state, "step_size");
  const double gamma = double_entry(state, "gamma");
  step_size_ = step_size;
  gamma_ = gamma;
}

void StepLR::own_state_before(StateDict& state) const {
  state.insert("step_size", step_size_);
  state.insert("gamma", gamma_);
}

// ---- MultiStepLR ---------------------------------------------------------------------------------

MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer, const std::vector<std::int64_t>& milestones, double gamma)
    : LRScheduler(optimizer), gamma_(gamma) {
  for (std::int64_t m : milestones) {
    if (milestones_[m]++ == 0) given_.push_back(m);
  }
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  const auto found = milestones_.find(last_epoch_);
  if (found == milestones_.end()) return group_lrs();
  std::vector<double> lrs = group_lrs();
  for (double& lr : lrs) lr = lr * std::pow(gamma_, static_cast<double>(found->second));
  return lrs;
}

std::optional<std::vector<double>> MultiStepLR::closed_form_lr() const {
  std::int64_t passed = 0;  // bisect_right over the sorted milestones, repeats counted
  for (const auto& [epoch, count] : milestones_)
    if (epoch <= last_epoch_) passed += count;
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (double base : base_lrs_) lrs.push_back(base * std::pow(gamma_, static_cast<double>(passed)));
  return lrs;
}

void MultiStepLR::load_own_state(const StateDict& state) {
  const c10::IValue counter = entry(state, "milestones");
  if (!counter.isGenericDict()) bad_state("milestones", "is a " + std::string(counter.tagKind()) + ", not a dictionary");
  std::map<std::int64_t, std::int64_t> milestones;
  std::vector<std::int64_t> given;
  for (const auto& item : counter.toGenericDict()) {
    if (!item.key().isInt() || !item.value().isInt()) bad_state("milestones", "does not map epochs to counts");
    milestones[item.key().toInt()] = item.value().toInt();
    given.push_back(item.key().toInt());
  }
  const double gamma = double_entry(state, "gamma");
  milestones_ = std::move(milestones);
  given_ = std::move(given);
  gamma_ = gamma;
}

void MultiStepLR::own_state_before(StateDict& state) const {
  c10::Dict<std::int64_t, std::int64_t> counter;  // Python's Counter, in the order the milestones were given
  for (std::int64_t m : given_) counter.insert(m, milestones_.at(m));
  state.insert("milestones", counter);
  state.insert("gamma", gamma_);
}

// ---- ExponentialLR -------------------------------------------------------------------------------

ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, double gamma) : LRScheduler(optimizer), gamma_(gamma) {
  initial_step();
}

std::vector<double> ExponentialLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (is_initial_) return lrs;
  for (double& lr : lrs) lr = lr * gamma_;
  return lrs;
}

std::optional<std::vector<double>> ExponentialLR::closed_form_lr() const {
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (double base : base_lrs_) lrs.push_back(base * std::pow(gamma_, static_cast<double>(last_epoch_)));
  return lrs;
}

void ExponentialLR::own_state_before(StateDict& state) const { state.insert("gamma", gamma_); }

void ExponentialLR::load_own_state(const StateDict& state) { gamma_ = double_entry(state, "gamma"); }

// ---- LinearLR ------------------------------------------------------------------------------------

LinearLR::LinearLR(torch::optim::Optimizer& optimizer, double start_factor, double end_factor, std::int64_t total_iters)
    : LRScheduler(optimizer), start_factor_(start_factor), end_factor_(end_factor), total_iters_(total_iters) {
  if (start_factor > 1.0 || start_factor <= 0)
    refuse("LinearLR: starting multiplicative factor expected to be greater than 0 and less or equal to 1, got " +
           number_text(start_factor) + ".");
  if (end_factor > 1.0 || end_factor < 0)
    refuse("LinearLR: ending multiplicative factor expected to be between 0 and 1, got " + number_text(end_factor) + ".");
  if (total_iters <= 0) refuse("LinearLR: total_iters must be positive, got " + std::to_string(total_iters) + ".");
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (last_epoch_ == 0) {
    for (double& lr : lrs) lr = lr * start_factor_;
    return lrs;
  }
  if (is_initial_ || last_epoch_ > total_iters_) return lrs;
  const double delta = end_factor_ - start_factor_;
  for (double& lr : lrs)
    lr = lr * (1.0 + delta / (static_cast<double>(total_iters_) * start_factor_ +
                              static_cast<double>(last_epoch_ - 1) * delta));
  return lrs;
}

std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (double base : base_lrs_)
    lrs.push_back(base * (start_factor_ + (end_factor_ - start_factor_) *
                                              static_cast<double>(std::min(total_iters_, last_epoch_)) /
                                              static_cast<double>(total_iters_)));
  return lrs;
}

void LinearLR::load_own_state(const StateDict& state) {
  const double start = double_entry(state, "start_factor"), end = double_entry(state, "end_factor");
  const std::int64_t total = int_entry(state, "total_iters");
  start_factor_ = start;
  end_factor_ = end;
  total_iters_ = total;
}

void LinearLR::own_state_before(StateDict& state) const {
  state.insert("start_factor", start_factor_);
  state.insert("end_factor", end_factor_);
  state.insert("total_iters", total_iters_);
}

}  // namespace fulgur::optim
