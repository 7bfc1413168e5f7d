#pragma once
// fulgur::optim::SWALR: torch.optim.swa_utils.SWALR, step for step — each group's lr annealed from
// where it is towards its swa_lr over anneal_epochs steps (cosine or linear), then held there. As
// in Python, each step recovers the lr the annealing started from out of the group's current lr
// (_get_initial_lr), so the values are Python's to the last bit. Python keeps swa_lr in the
// optimizer's param groups; LibTorch's options have no room for it: the scheduler keeps it.
#include <cstdint>
#include <string>
#include <vector>

#include "fulgur/optim/lr_scheduler.hpp"

namespace fulgur::optim {

class SWALR : public LRScheduler {
 public:
  /// swa_lrs: one for every group, or one per group; anneal_strategy "cos" or "linear" (PyTorch's
  /// errors otherwise). last_epoch >= 0 is Python's resuming form (StochasticWeightAveraging uses it
  /// as Lightning does): it only changes last_epoch, which SWALR's schedule does not read.
  SWALR(torch::optim::Optimizer& optimizer, std::vector<double> swa_lrs, std::int64_t anneal_epochs = 10,
        const std::string& anneal_strategy = "cos", std::int64_t last_epoch = -1);

  const std::vector<double>& swa_lrs() const { return swa_lrs_; }

 private:
  std::vector<double> get_lr() override;
  double anneal(double t) const;
  void own_state_before(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  std::vector<double> swa_lrs_;
  std::string anneal_strategy_;
  std::int64_t anneal_epochs_;
};

}  // namespace fulgur::optim
