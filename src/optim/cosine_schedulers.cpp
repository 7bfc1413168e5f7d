// torch.optim.lr_scheduler's cosine and one-cycle schedulers (torch 2.11), Python's formulas in Python's order:
// CosineAnnealingLR, CosineAnnealingWarmRestarts, OneCycleLR.
#include "fulgur/optim/lr_scheduler.hpp"

#include <cmath>
#include <string>

#include "scheduler_support.hpp"

namespace fulgur::optim {

using namespace scheduler_support;

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

// ---- OneCycleLR ----------------------------------------------------------------------------------

namespace {
enum OneCycleValue { initial_lr = 0, max_lr = 1, min_lr = 2, max_momentum = 0, base_momentum = 1 };
const char* const kLrNames[] = {"initial_lr", "max_lr", "min_lr"};
const char* const kMomentumNames[] = {"max_momentum", "base_momentum"};
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
    const bool momentum = has_momentum(optimizer);
    use_beta1_ = has_beta1(optimizer);
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

}  // namespace fulgur::optim
