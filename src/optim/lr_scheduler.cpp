// torch/optim/lr_scheduler.py (torch 2.11) in C++: every formula in Python's order of operations, so
// that each learning rate is the same double. The header says what is kept where.
#include "fulgur/optim/lr_scheduler.hpp"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numbers>
#include <typeinfo>
#include <utility>

#include <c10/util/Type.h>

#include "fulgur/detail/describe.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::optim {

namespace {

constexpr double kPi = std::numbers::pi;  // math.pi

/// Python's a % b for b > 0 (never negative).
std::int64_t floor_mod(std::int64_t a, std::int64_t b) {
  const std::int64_t r = a % b;
  return r < 0 ? r + b : r;
}
/// Python's a // b for b > 0.
std::int64_t floor_div(std::int64_t a, std::int64_t b) { return (a - floor_mod(a, b)) / b; }

std::uint64_t next_made() {
  static std::atomic<std::uint64_t> count{0};
  return ++count;
}

c10::IValue doubles(const std::vector<double>& values) { return c10::List<double>(values); }

[[noreturn]] void bad_state(const std::string& key, const std::string& why) {
  throw CheckpointError("fulgur: the scheduler state's '" + key + "' " + why +
                        "; pass what state_dict() of the same kind of scheduler returned.");
}

c10::IValue entry(const StateDict& state, const std::string& key) {
  if (!state.contains(key)) bad_state(key, "is missing");
  return state.at(key);
}

std::int64_t int_entry(const StateDict& state, const std::string& key) {
  const c10::IValue value = entry(state, key);
  if (!value.isInt()) bad_state(key, "is a " + std::string(value.tagKind()) + ", not an integer");
  return value.toInt();
}

double double_entry(const StateDict& state, const std::string& key) {
  const c10::IValue value = entry(state, key);
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  bad_state(key, "is a " + std::string(value.tagKind()) + ", not a number");
}

std::vector<double> doubles_entry(const StateDict& state, const std::string& key) {
  const c10::IValue value = entry(state, key);
  std::vector<double> out;
  if (value.isDoubleList()) {
    for (double v : value.toDoubleList()) out.push_back(v);
  } else if (value.isList()) {
    for (const c10::IValue& v : value.toListRef()) {
      if (v.isDouble()) out.push_back(v.toDouble());
      else if (v.isInt()) out.push_back(static_cast<double>(v.toInt()));
      else bad_state(key, "holds a " + std::string(v.tagKind()) + ", not a number");
    }
  } else {
    bad_state(key, "is a " + std::string(value.tagKind()) + ", not a list of numbers");
  }
  return out;
}

[[noreturn]] void refuse(const std::string& text) { throw MisconfigurationError(text); }

/// A param group added after the scheduler was made, which a schedule kept per group cannot take (PyTorch
/// raises there too, with `python`): what happened and what to do.
[[noreturn]] void refuse_added_group(const std::string& kind, std::size_t groups, std::size_t known,
                                     const std::string& python) {
  refuse(kind + ": the optimizer has " + std::to_string(groups) + " param groups and this scheduler's schedule " +
         "holds " + std::to_string(known) + ", those it was made with: a group was added to the optimizer after it "
         "was made (as BackboneFinetuning's unfreeze adds the backbone's). PyTorch's " + kind + " fails there too (" +
         python + "). Make the scheduler after the last add_param_group; where a group is added during fit "
         "(BackboneFinetuning), use one that scales each group's own lr: StepLR, MultiStepLR, ExponentialLR, LinearLR, "
         "or CosineAnnealingLR within its first T_max steps (docs/optimizers.md).");
}

std::string kind_of(const LRScheduler& scheduler) {
  const std::string name = c10::demangle(typeid(scheduler).name());
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

using ::fulgur::detail::number_text;  // what an ostream's default writes: "%g"

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

// ---- CosineAnnealingLR ---------------------------------------------------------------------------

CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, std::int64_t T_max, double eta_min)
    : LRScheduler(optimizer), t_max_(T_max), eta_min_(eta_min) {
  if (T_max <= 0) refuse("CosineAnnealingLR: T_max must be a positive number of epochs, got " + std::to_string(T_max) + ".");
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (is_initial_) return lrs;
  const double e = static_cast<double>(last_epoch_), t = static_cast<double>(t_max_);
  for (std::size_t i = 0; i < lrs.size(); ++i) {
    if (step_count_ == 1 && last_epoch_ > 0)
      lrs[i] = eta_min_ + (base_lr(i) - eta_min_) * (1 + std::cos(e * kPi / t)) / 2;
    else if (floor_mod(last_epoch_ - 1 - t_max_, 2 * t_max_) == 0)
      lrs[i] = lrs[i] + (base_lr(i) - eta_min_) * (1 - std::cos(kPi / t)) / 2;
    else
      lrs[i] = (1 + std::cos(kPi * e / t)) / (1 + std::cos(kPi * (e - 1) / t)) * (lrs[i] - eta_min_) + eta_min_;
  }
  return lrs;
}

std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  const double e = static_cast<double>(last_epoch_), t = static_cast<double>(t_max_);
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (double base : base_lrs_) lrs.push_back(eta_min_ + (base - eta_min_) * (1 + std::cos(kPi * e / t)) / 2);
  return lrs;
}

void CosineAnnealingLR::load_own_state(const StateDict& state) {
  const std::int64_t t_max = int_entry(state, "T_max");
  const double eta_min = double_entry(state, "eta_min");
  t_max_ = t_max;
  eta_min_ = eta_min;
}

void CosineAnnealingLR::own_state_before(StateDict& state) const {
  state.insert("T_max", t_max_);
  state.insert("eta_min", eta_min_);
}

// ---- CosineAnnealingWarmRestarts -----------------------------------------------------------------

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, std::int64_t T_0,
                                                         std::int64_t T_mult, double eta_min)
    : LRScheduler(optimizer), t_0_(T_0), t_i_(T_0), t_mult_(T_mult), eta_min_(eta_min), t_cur_(-1) {
  if (T_0 <= 0) refuse("CosineAnnealingWarmRestarts: expected positive integer T_0, but got " + std::to_string(T_0) + ".");
  if (T_mult < 1)
    refuse("CosineAnnealingWarmRestarts: expected integer T_mult >= 1, but got " + std::to_string(T_mult) + ".");
  initial_step();
}

void CosineAnnealingWarmRestarts::step() {  // Python's own step(): it does not count _step_count
  std::int64_t epoch = 0;
  if (last_epoch_ < 0) {  // epoch 0, given: below T_0
    t_i_ = t_0_;
    t_cur_ = 0;
  } else {
    epoch = last_epoch_ + 1;
    t_cur_ = t_cur_ + 1;
    if (t_cur_ >= t_i_) {
      t_cur_ = floor_mod(t_cur_, t_i_);
      t_i_ = t_i_ * t_mult_;
    }
  }
  last_epoch_ = epoch;
  set_group_lrs(get_lr());
  last_lr_ = group_lrs();
}

std::vector<double> CosineAnnealingWarmRestarts::get_lr() {
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (double base : base_lrs_)
    lrs.push_back(eta_min_ + (base - eta_min_) *
                                 (1 + std::cos(kPi * static_cast<double>(t_cur_) / static_cast<double>(t_i_))) / 2);
  return lrs;
}

void CosineAnnealingWarmRestarts::own_state_before(StateDict& state) const {
  state.insert("T_0", t_0_);
  state.insert("T_i", t_i_);
  state.insert("T_mult", t_mult_);
  state.insert("eta_min", eta_min_);
  state.insert("T_cur", t_cur_);
}

void CosineAnnealingWarmRestarts::load_own_state(const StateDict& state) {
  const std::int64_t t_0 = int_entry(state, "T_0"), t_i = int_entry(state, "T_i"), t_mult = int_entry(state, "T_mult"),
                     t_cur = int_entry(state, "T_cur");
  const double eta_min = double_entry(state, "eta_min");
  t_0_ = t_0;
  t_i_ = t_i;
  t_mult_ = t_mult;
  t_cur_ = t_cur;
  eta_min_ = eta_min;
}

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

// ---- OneCycleLR ----------------------------------------------------------------------------------

namespace {
enum OneCycleValue { initial_lr = 0, max_lr = 1, min_lr = 2, max_momentum = 0, base_momentum = 1 };
const char* const kLrNames[] = {"initial_lr", "max_lr", "min_lr"};
const char* const kMomentumNames[] = {"max_momentum", "base_momentum"};

/// Where a param group keeps its momentum: SGD's and RMSprop's `momentum`, Adam's and AdamW's beta1.
struct MomentumOf {
  torch::optim::OptimizerOptions& options;
  void set(double value) const {
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) sgd->momentum(value);
    else if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) rms->momentum(value);
    else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options))
      adam->betas({value, std::get<1>(adam->betas())});
    else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options))
      adamw->betas({value, std::get<1>(adamw->betas())});
  }
};
}  // namespace

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, double max_lr, OneCycleOptions options)
    : OneCycleLR(optimizer, std::vector<double>(optimizer.param_groups().size(), max_lr), options) {}

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, const std::vector<double>& max_lrs, OneCycleOptions options)
    : LRScheduler(optimizer), anneal_(options.anneal_strategy), cycle_momentum_(options.cycle_momentum) {
  if (options.total_steps) {
    if (*options.total_steps <= 0)
      refuse("OneCycleLR: expected positive integer total_steps, but got " + std::to_string(*options.total_steps) + ".");
    total_steps_ = *options.total_steps;
  } else if (options.epochs && options.steps_per_epoch) {
    if (*options.epochs <= 0) refuse("OneCycleLR: expected positive integer epochs, but got " + std::to_string(*options.epochs) + ".");
    if (*options.steps_per_epoch <= 0)
      refuse("OneCycleLR: expected positive integer steps_per_epoch, but got " +
             std::to_string(*options.steps_per_epoch) + ".");
    total_steps_ = *options.epochs * *options.steps_per_epoch;
  } else {
    refuse("OneCycleLR: you must define either total_steps OR (epochs AND steps_per_epoch).");
  }
  const double total = static_cast<double>(total_steps_), pct = options.pct_start;
  if (options.three_phase)
    phases_ = {{pct * total - 1, initial_lr, max_lr, max_momentum, base_momentum},
               {2 * pct * total - 2, max_lr, initial_lr, base_momentum, max_momentum},
               {total - 1, initial_lr, min_lr, max_momentum, max_momentum}};
  else
    phases_ = {{pct * total - 1, initial_lr, max_lr, max_momentum, base_momentum},
               {total - 1, max_lr, min_lr, base_momentum, max_momentum}};
  if (pct < 0 || pct > 1) refuse("OneCycleLR: expected float between 0 and 1 pct_start, but got " + number_text(pct) + ".");
  if (max_lrs.size() != groups())
    refuse("OneCycleLR: max_lr must have the same length as optimizer.param_groups. max_lr has " +
           std::to_string(max_lrs.size()) + " values, param_groups has " + std::to_string(groups()) + ".");
  base_lrs_.clear();
  for (double max : max_lrs) {
    Group group{};
    group.values[initial_lr] = max / options.div_factor;
    group.values[max_lr] = max;
    group.values[min_lr] = group.values[initial_lr] / options.final_div_factor;
    group.momenta[max_momentum] = options.max_momentum;
    group.momenta[base_momentum] = options.base_momentum;
    groups_.push_back(group);
    base_lrs_.push_back(group.values[initial_lr]);  // Python's group["initial_lr"]
  }
  if (cycle_momentum_) {
    torch::optim::OptimizerOptions& defaults = optimizer.defaults();
    const bool momentum = dynamic_cast<torch::optim::SGDOptions*>(&defaults) != nullptr ||
                          dynamic_cast<torch::optim::RMSpropOptions*>(&defaults) != nullptr;
    use_beta1_ = dynamic_cast<torch::optim::AdamOptions*>(&defaults) != nullptr ||
                 dynamic_cast<torch::optim::AdamWOptions*>(&defaults) != nullptr;
    if (!momentum && !use_beta1_)
      refuse("OneCycleLR: optimizer must support momentum or beta1 with `cycle_momentum` option enabled (SGD, "
             "RMSprop, Adam, AdamW); pass cycle_momentum = false for another.");
    for (auto& group : optimizer.param_groups()) MomentumOf{group.options()}.set(options.max_momentum);
  }
  initial_step();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (anneal_ == OneCycleOptions::Anneal::cos) {
    const double cos_out = std::cos(kPi * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

std::vector<double> OneCycleLR::get_lr() {
  const std::int64_t step_num = last_epoch_;
  if (step_num > total_steps_) {
    std::string text = "OneCycleLR: tried to step " + std::to_string(step_num) +
                       " times. The specified number of total steps is " + std::to_string(total_steps_) + ".";
    if (made_total_steps_)  // a loaded state set the total: say so, it is not the number the user wrote
      text += " That total_steps (or epochs * steps_per_epoch) came from the checkpoint the run resumed from: loading a "
              "scheduler's state restores its arguments (as Python's load_state_dict does), so the total this OneCycleLR "
              "was made with (" + std::to_string(*made_total_steps_) + ") was replaced by the first run's, and its "
              "schedule ends there. A resumed run continues that schedule and cannot run past its end: to train longer "
              "on one cycle, make the OneCycleLR for the longer run's total from the first run on; else start a new fit "
              "from the checkpoint's weights (a new cycle) instead of resuming it.";
    refuse(text);
  }
  std::vector<double> lrs;
  auto& param_groups = optimizer_->param_groups();
  for (std::size_t g = 0; g < param_groups.size(); ++g) {
    if (g >= groups_.size())  // Python reads initial_lr, max_lr, min_lr from the group: a KeyError (momenta set so far)
      refuse_added_group("OneCycleLR", param_groups.size(), groups_.size(),
                         "a KeyError: the new group has no 'initial_lr', 'max_lr', 'min_lr'");
    const Group& group = groups_[g];
    double start_step = 0.0, lr = 0.0, momentum = 0.0;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      if (static_cast<double>(step_num) <= phase.end_step || i == phases_.size() - 1) {
        const double pct = (static_cast<double>(step_num) - start_step) / (phase.end_step - start_step);
        lr = anneal(group.values[phase.start_lr], group.values[phase.end_lr], pct);
        if (cycle_momentum_) momentum = anneal(group.momenta[phase.start_momentum], group.momenta[phase.end_momentum], pct);
        break;
      }
      start_step = phase.end_step;
    }
    lrs.push_back(lr);
    if (cycle_momentum_) MomentumOf{param_groups[g].options()}.set(momentum);
  }
  return lrs;
}

void OneCycleLR::load_own_state(const StateDict& state) {
  const std::int64_t total = int_entry(state, "total_steps");
  const c10::IValue phases = entry(state, "_schedule_phases");
  if (!phases.isList() || phases.toListRef().size() != phases_.size())
    bad_state("_schedule_phases", "does not hold this OneCycleLR's " + std::to_string(phases_.size()) + " phases");
  std::vector<double> ends;
  for (const c10::IValue& phase : phases.toListRef()) {
    if (!phase.isGenericDict()) bad_state("_schedule_phases", "holds a " + std::string(phase.tagKind()) + ", not a phase");
    ends.push_back(double_entry(StateDict(phase.toGenericDict()), "end_step"));
  }
  if (!made_total_steps_) made_total_steps_ = total_steps_;
  total_steps_ = total;
  for (std::size_t i = 0; i < ends.size(); ++i) phases_[i].end_step = ends[i];
}

void OneCycleLR::own_state_before(StateDict& state) const {
  state.insert("total_steps", total_steps_);
  c10::impl::GenericList phases(c10::AnyType::get());
  for (const Phase& phase : phases_) {
    StateDict entry;
    entry.insert("end_step", phase.end_step);
    entry.insert("start_lr", std::string(kLrNames[phase.start_lr]));
    entry.insert("end_lr", std::string(kLrNames[phase.end_lr]));
    entry.insert("start_momentum", std::string(kMomentumNames[phase.start_momentum]));
    entry.insert("end_momentum", std::string(kMomentumNames[phase.end_momentum]));
    phases.push_back(entry.to_ivalue());
  }
  state.insert("_schedule_phases", phases);
  state.insert("_anneal_func_type", std::string(anneal_ == OneCycleOptions::Anneal::cos ? "cos" : "linear"));
  state.insert("cycle_momentum", cycle_momentum_);
  if (cycle_momentum_) state.insert("use_beta1", use_beta1_);
}

// ---- SequentialLR --------------------------------------------------------------------------------

SequentialLR::SequentialLR(torch::optim::Optimizer& optimizer, std::vector<std::unique_ptr<LRScheduler>> schedulers,
                           std::vector<std::int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  if (schedulers_.empty()) refuse("SequentialLR expects at least one scheduler, but got no scheduler.");
  for (std::size_t i = 0; i < schedulers_.size(); ++i) {
    if (!schedulers_[i]) refuse("SequentialLR: the scheduler at index " + std::to_string(i) + " is null.");
    if (&schedulers_[i]->optimizer() != &optimizer)
      refuse("SequentialLR expects all schedulers to belong to the same optimizer, but got the scheduler at index " +
             std::to_string(i) + " on another optimizer.");
  }
  if (milestones_.size() != schedulers_.size() - 1)
    refuse("Sequential Schedulers expects number of schedulers provided to be one more than the number of milestone "
           "points, but got number of schedulers " + std::to_string(schedulers_.size()) +
           " and the number of milestones to be equal to " + std::to_string(milestones_.size()));
  // Python's group["initial_lr"]: set by the first scheduler made on the optimizer, kept by the others.
  const LRScheduler* first = nullptr;
  for (const auto& s : schedulers_)
    if (first == nullptr || s->made_ < first->made_) first = s.get();
  const std::vector<double> initial = first->base_lrs_;
  std::function<void(LRScheduler&)> undo = [&](LRScheduler& s) {  // Python's recursive_undo
    if (auto* nested = dynamic_cast<SequentialLR*>(&s)) {
      for (auto& child : nested->schedulers_) undo(*child);
    } else {
      s.base_lrs_ = initial;
      s.last_epoch_ -= 1;
    }
  };
  last_epoch_ = 0;
  set_group_lrs(initial);
  for (auto& s : schedulers_) undo(*s);
  schedulers_.front()->initial_step();
  last_lr_ = schedulers_.front()->get_last_lr();
}

void SequentialLR::step() {
  ++last_epoch_;
  const auto idx = static_cast<std::size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) -
                                            milestones_.begin());
  LRScheduler& scheduler = *schedulers_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_) scheduler.update_lr(0);
  else scheduler.step();
  last_lr_ = scheduler.get_last_lr();
}

std::vector<double> SequentialLR::get_lr() { return group_lrs(); }

StateDict SequentialLR::state_dict() const {
  StateDict state;
  state.insert("_milestones", c10::List<std::int64_t>(milestones_));
  state.insert("last_epoch", last_epoch_);
  state.insert("_last_lr", doubles(last_lr_));
  c10::impl::GenericList children(c10::AnyType::get());
  for (const auto& s : schedulers_) children.push_back(s->state_dict().to_ivalue());
  state.insert("_schedulers", children);
  return state;
}

void SequentialLR::load_state_dict(const StateDict& state) {
  const c10::IValue children = entry(state, "_schedulers");
  if (!children.isList() || children.toListRef().size() != schedulers_.size())
    bad_state("_schedulers", "does not hold one state for each of the " + std::to_string(schedulers_.size()) +
                                 " schedulers");
  const std::int64_t last_epoch = int_entry(state, "last_epoch");
  std::vector<double> last = doubles_entry(state, "_last_lr");
  for (std::size_t i = 0; i < schedulers_.size(); ++i) {
    const c10::IValue child = children.toListRef()[i];
    if (!child.isGenericDict()) bad_state("_schedulers", "holds a " + std::string(child.tagKind()) + ", not a state");
    schedulers_[i]->load_state_dict(StateDict(child.toGenericDict()));
  }
  last_epoch_ = last_epoch;
  last_lr_ = std::move(last);
}

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
