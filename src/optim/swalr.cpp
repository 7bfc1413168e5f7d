#include "fulgur/optim/swalr.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "fulgur/errors.hpp"

namespace fulgur::optim {

namespace {

[[noreturn]] void bad_state(const std::string& key, const std::string& why) {
  throw CheckpointError("fulgur: the scheduler state's '" + key + "' " + why +
                        "; pass what state_dict() of a SWALR returned.");
}

}  // namespace

SWALR::SWALR(torch::optim::Optimizer& optimizer, std::vector<double> swa_lrs, std::int64_t anneal_epochs,
             const std::string& anneal_strategy, std::int64_t last_epoch)
    : LRScheduler(optimizer, {}), anneal_strategy_(anneal_strategy), anneal_epochs_(anneal_epochs) {
  if (swa_lrs.size() == 1) swa_lrs.resize(groups(), swa_lrs.front());
  if (swa_lrs.size() != groups())
    throw MisconfigurationError("swa_lr must have the same length as optimizer.param_groups. swa_lr has " +
                                std::to_string(swa_lrs.size()) + " values, param_groups has " +
                                std::to_string(groups()) + ".");
  swa_lrs_ = std::move(swa_lrs);
  if (anneal_strategy != "cos" && anneal_strategy != "linear")
    throw MisconfigurationError("anneal_strategy must by one of 'cos' or 'linear', instead got " + anneal_strategy);
  if (anneal_epochs < 0)
    throw MisconfigurationError("anneal_epochs must be equal or greater than 0, got " + std::to_string(anneal_epochs));
  // Python: base_lrs are the groups' "initial_lr" (Lightning sets it to swa_lr before making one).
  if (last_epoch >= 0) base_lrs_ = swa_lrs_;
  last_epoch_ = last_epoch;
  initial_step();
}

double SWALR::anneal(double t) const {
  if (anneal_strategy_ == "linear") return t;
  return (1 - std::cos(std::numbers::pi * t)) / 2;
}

std::vector<double> SWALR::get_lr() {
  std::int64_t step = step_count_ - 1;
  if (anneal_epochs_ == 0) step = std::max<std::int64_t>(1, step);
  const double span = static_cast<double>(std::max<std::int64_t>(1, anneal_epochs_));
  const double prev_t = std::max(0.0, std::min(1.0, static_cast<double>(step - 1) / span));
  const double prev_alpha = anneal(prev_t);
  const double t = std::max(0.0, std::min(1.0, static_cast<double>(step) / span));
  const double alpha = anneal(t);
  const std::vector<double> lrs = group_lrs();
  std::vector<double> out;
  for (std::size_t i = 0; i < lrs.size(); ++i) {
    if (i >= swa_lrs_.size())  // Python keeps swa_lr in the group: a group added later has none (a KeyError)
      throw MisconfigurationError(
          "SWALR: the optimizer has " + std::to_string(lrs.size()) + " param groups and SWALR holds the swa_lr of " +
          std::to_string(swa_lrs_.size()) + ", those it was made with: a group was added to the optimizer after it "
          "was made. PyTorch's SWALR fails there too (a KeyError: the new group has no 'swa_lr'). Make the SWALR "
          "after the last add_param_group.");
    const double swa_lr = swa_lrs_[i];
    // _get_initial_lr: the lr the annealing started from, out of the current one.
    const double prev_lr = prev_alpha == 1 ? swa_lr : (lrs[i] - prev_alpha * swa_lr) / (1 - prev_alpha);
    out.push_back(swa_lr * alpha + prev_lr * (1 - alpha));
  }
  return out;
}

void SWALR::own_state_before(StateDict& state) const {
  state.insert("_anneal_strategy", anneal_strategy_);
  state.insert("anneal_epochs", anneal_epochs_);
}

void SWALR::load_own_state(const StateDict& state) {
  if (!state.contains("_anneal_strategy") || !state.at("_anneal_strategy").isString())
    bad_state("_anneal_strategy", "is missing or not a string");
  if (!state.contains("anneal_epochs") || !state.at("anneal_epochs").isInt())
    bad_state("anneal_epochs", "is missing or not an integer");
  const std::string strategy = state.at("_anneal_strategy").toStringRef();
  if (strategy != "cos" && strategy != "linear") bad_state("_anneal_strategy", "is neither 'cos' nor 'linear'");
  anneal_strategy_ = strategy;
  anneal_epochs_ = state.at("anneal_epochs").toInt();
}

}  // namespace fulgur::optim
