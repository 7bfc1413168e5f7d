// torch.optim.lr_scheduler's schedulers made of schedulers (torch 2.11): SequentialLR, ChainedScheduler.
#include "fulgur/optim/lr_scheduler.hpp"

#include <algorithm>
#include <functional>
#include <utility>

#include "scheduler_support.hpp"

namespace fulgur::optim {

using namespace scheduler_support;

namespace {

/// SequentialLR's and ChainedScheduler's "_schedulers": each member's state, in order.
c10::impl::GenericList child_states(const std::vector<std::unique_ptr<LRScheduler>>& schedulers) {
  c10::impl::GenericList children(c10::AnyType::get());
  for (const auto& s : schedulers) children.push_back(s->state_dict().to_ivalue());
  return children;
}

/// "_schedulers" read back, every entry checked before any member loads one.
std::vector<StateDict> checked_child_states(const StateDict& state, std::size_t count) {
  const c10::IValue children = entry(state, "_schedulers");
  if (!children.isList() || children.toListRef().size() != count)
    bad_state("_schedulers", "does not hold one state for each of the " + std::to_string(count) + " schedulers");
  std::vector<StateDict> states;
  for (const c10::IValue& child : children.toListRef()) {
    if (!child.isGenericDict()) bad_state("_schedulers", "holds a " + std::string(child.tagKind()) + ", not a state");
    states.emplace_back(child.toGenericDict());
  }
  return states;
}

}  // namespace

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
  // A SequentialLR or ChainedScheduler is made after what it holds: the first made is one of their leaves.
  const LRScheduler* first = nullptr;
  std::function<void(const LRScheduler&)> earliest = [&](const LRScheduler& s) {
    if (const auto* sequential = dynamic_cast<const SequentialLR*>(&s)) {
      for (const auto& child : sequential->schedulers_) earliest(*child);
    } else if (const auto* chained = dynamic_cast<const ChainedScheduler*>(&s)) {
      for (const auto& child : chained->schedulers_) earliest(*child);
    } else if (first == nullptr || s.made_ < first->made_) {
      first = &s;
    }
  };
  for (const auto& s : schedulers_) earliest(*s);
  const std::vector<double> initial = first->base_lrs_;
  std::function<void(LRScheduler&)> undo = [&](LRScheduler& s) {  // Python's recursive_undo
    if (auto* sequential = dynamic_cast<SequentialLR*>(&s)) {
      for (auto& child : sequential->schedulers_) undo(*child);
    } else if (auto* chained = dynamic_cast<ChainedScheduler*>(&s)) {
      for (auto& child : chained->schedulers_) undo(*child);
    } else {
      // Python's base_lrs are group["initial_lr"] but CyclicLR's, which are its own base_lr.
      if (dynamic_cast<CyclicLR*>(&s) == nullptr) s.base_lrs_ = initial;
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
  state.insert("_schedulers", child_states(schedulers_));
  return state;
}

void SequentialLR::load_state_dict(const StateDict& state) {
  const std::vector<StateDict> children = checked_child_states(state, schedulers_.size());
  const std::int64_t last_epoch = int_entry(state, "last_epoch");
  std::vector<double> last = doubles_entry(state, "_last_lr");
  for (std::size_t i = 0; i < schedulers_.size(); ++i) schedulers_[i]->load_state_dict(children[i]);
  last_epoch_ = last_epoch;
  last_lr_ = std::move(last);
}

// ---- ChainedScheduler ----------------------------------------------------------------------------

namespace {

torch::optim::Optimizer& chained_optimizer(const std::vector<std::unique_ptr<LRScheduler>>& schedulers,
                                           torch::optim::Optimizer* optimizer) {
  if (schedulers.empty())
    refuse("ChainedScheduler expects at least one scheduler to be chained, but got no scheduler.");
  for (std::size_t i = 0; i < schedulers.size(); ++i)
    if (!schedulers[i]) refuse("ChainedScheduler: the scheduler at index " + std::to_string(i) + " is null.");
  return optimizer != nullptr ? *optimizer : schedulers.front()->optimizer();
}

}  // namespace

ChainedScheduler::ChainedScheduler(std::vector<std::unique_ptr<LRScheduler>> schedulers,
                                   torch::optim::Optimizer* optimizer)
    : LRScheduler(chained_optimizer(schedulers, optimizer)), schedulers_(std::move(schedulers)) {
  for (std::size_t i = 0; i < schedulers_.size(); ++i)
    if (&schedulers_[i]->optimizer() != optimizer_)
      refuse("ChainedScheduler expects all schedulers to belong to the same optimizer, but got scheduler " +
             kind_of(*schedulers_[i]) + " at index " + std::to_string(i) + " on another optimizer.");
  // Python's base_lrs are group["initial_lr"], set by the first scheduler made on the optimizer and kept by the
  // others (CyclicLR's and OneCycleLR's are their own): those made later took the groups' lrs as the first one had
  // scaled them.
  const LRScheduler* first = nullptr;
  std::vector<LRScheduler*> leaves;
  std::function<void(LRScheduler&)> collect = [&](LRScheduler& s) {
    if (auto* chained = dynamic_cast<ChainedScheduler*>(&s)) {
      for (auto& child : chained->schedulers_) collect(*child);
      return;
    }
    if (first == nullptr || s.made_ < first->made_) first = &s;
    if (dynamic_cast<SequentialLR*>(&s) == nullptr && dynamic_cast<CyclicLR*>(&s) == nullptr &&
        dynamic_cast<OneCycleLR*>(&s) == nullptr)
      leaves.push_back(&s);
  };
  for (auto& s : schedulers_) collect(*s);
  for (LRScheduler* leaf : leaves) leaf->base_lrs_ = first->base_lrs_;
  last_lr_ = group_lrs();  // Python's: no step of its own when made (its schedulers took theirs)
}

void ChainedScheduler::step() {
  if (is_initial_) started_ = true;  // SequentialLR's _initial_step: Python's state then holds _step_count, _is_initial
  for (auto& scheduler : schedulers_) scheduler->step();
  last_lr_ = group_lrs();
}

std::vector<double> ChainedScheduler::get_lr() {
  refuse("ChainedScheduler: a SequentialLR restarted it at its milestone, which PyTorch's ChainedScheduler cannot "
         "either (its get_lr raises NotImplementedError). Put the ChainedScheduler first in the SequentialLR, or "
         "chain SequentialLRs inside one ChainedScheduler instead.");
}

StateDict ChainedScheduler::state_dict() const {
  StateDict state;
  state.insert("_last_lr", doubles(last_lr_));
  if (started_) {
    state.insert("_step_count", step_count_);
    state.insert("_is_initial", is_initial_);
  }
  state.insert("_schedulers", child_states(schedulers_));
  return state;
}

void ChainedScheduler::load_state_dict(const StateDict& state) {
  const std::vector<StateDict> children = checked_child_states(state, schedulers_.size());
  std::vector<double> last = doubles_entry(state, "_last_lr");
  for (std::size_t i = 0; i < schedulers_.size(); ++i) schedulers_[i]->load_state_dict(children[i]);
  last_lr_ = std::move(last);
}

}  // namespace fulgur::optim
