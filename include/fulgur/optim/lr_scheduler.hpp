#pragma once
// fulgur::optim's learning-rate schedulers: torch/optim/lr_scheduler.py in C++, step for step.
//
// LibTorch ships StepLR and ReduceLROnPlateau only, and its StepLR decays one step late: PyTorch's
// schedulers take a step in their constructor (so the first step() is the schedule's step 1), and
// LibTorch's do not, so torch::optim::StepLR(step_size=2, gamma=0.5) stepped per epoch gives
// 0.1 0.1 0.1 0.05 0.05 over epochs 0-4 where Python (and Lightning) gives 0.1 0.1 0.05 0.05 0.025.
// These follow Python exactly: the constructor's step, the same recursive formulas evaluated in the
// same order (so each learning rate is Python's to the last bit, not only its closed form's), the
// same get_last_lr() and state_dict() keys. They work with any torch::optim::Optimizer (they set
// each param group's lr), and Trainer::fit steps them as it steps LibTorch's.
//
// What Python keeps in the optimizer's param groups ("initial_lr", and OneCycleLR's "max_lr",
// "min_lr", momenta) LibTorch's options have no room for: these keep it themselves. So a scheduler's
// base learning rates are the groups' lr when it is made; SequentialLR gives all its schedulers
// those of the first one made, which is what Python's shared "initial_lr" gives. Resuming is by
// load_state_dict (fulgur's checkpoints do it), not by a last_epoch argument.
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fulgur/state_dict.hpp"

namespace fulgur::optim {

/// torch.optim.lr_scheduler.LRScheduler: the base of every scheduler below but ReduceLROnPlateau.
class LRScheduler {
 public:
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;
  virtual ~LRScheduler() = default;

  /// Python's step(): one more epoch (or step), each group's lr set to the schedule's value.
  virtual void step();
  /// The learning rates the last step set, one per param group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  std::int64_t last_epoch() const { return last_epoch_; }
  torch::optim::Optimizer& optimizer() const { return *optimizer_; }

  /// Python's state_dict(): the same keys in the same order, with the same values (a function of
  /// LambdaLR is None, as in Python).
  virtual StateDict state_dict() const;
  /// Restores what state_dict() gave, its own arguments included (as Python's does); a state of
  /// another kind of scheduler is refused. The optimizer's learning rates are its own state (the
  /// optimizer's load restores them).
  virtual void load_state_dict(const StateDict& state);

 protected:
  explicit LRScheduler(torch::optim::Optimizer& optimizer, std::vector<double> base_lrs = {});
  /// Python's _initial_step (step_count 0, then one step): the last statement of every constructor.
  void initial_step();
  /// Python's _update_lr: last_epoch + 1 (or `epoch`, with the closed form where there is one).
  void update_lr(std::optional<std::int64_t> epoch = std::nullopt);
  virtual std::vector<double> get_lr() = 0;
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  /// The keys a scheduler sets before the base's (Python's __dict__ order), and after (LambdaLR).
  virtual void own_state_before(StateDict&) const {}
  virtual void own_state_after(StateDict&) const {}
  /// Reads the scheduler's own keys (all of them before changing anything: a state of another kind
  /// leaves it as it was).
  virtual void load_own_state(const StateDict&) {}
  /// base_lrs_[group], or the error Python's zip(strict=True) raises as a clear one.
  double base_lr(std::size_t group) const;
  std::vector<double> group_lrs() const;
  void set_group_lrs(const std::vector<double>& lrs);
  std::size_t groups() const { return optimizer_->param_groups().size(); }

  torch::optim::Optimizer* optimizer_;
  std::vector<double> base_lrs_;
  std::int64_t last_epoch_ = -1;
  std::int64_t step_count_ = 0;
  bool is_initial_ = false;
  std::vector<double> last_lr_;

 private:
  friend class SequentialLR;
  friend class ChainedScheduler;
  std::uint64_t made_ = 0;  // order of construction: SequentialLR takes the first one's base_lrs
};

/// lr = base_lr * lambda(epoch), one function for every group or one per group.
class LambdaLR : public LRScheduler {
 public:
  using Lambda = std::function<double(std::int64_t)>;
  LambdaLR(torch::optim::Optimizer& optimizer, const Lambda& lr_lambda);
  LambdaLR(torch::optim::Optimizer& optimizer, std::vector<Lambda> lr_lambdas);

 private:
  std::vector<double> get_lr() override;
  void own_state_after(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  std::vector<Lambda> lr_lambdas_;
};

/// lr * gamma every step_size epochs.
class StepLR : public LRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, std::int64_t step_size, double gamma = 0.1);

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void own_state_before(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  std::int64_t step_size_;
  double gamma_;
};

/// lr * gamma at each milestone (a milestone given twice decays twice there, as Python's Counter).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(torch::optim::Optimizer& optimizer, const std::vector<std::int64_t>& milestones, double gamma = 0.1);

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void own_state_before(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  std::map<std::int64_t, std::int64_t> milestones_;  // epoch -> how many times it was given
  std::vector<std::int64_t> given_;                  // as given (Python's Counter, in its order)
  double gamma_;
};

/// lr * gamma every epoch.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(torch::optim::Optimizer& optimizer, double gamma);

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void own_state_before(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  double gamma_;
};

/// Half a cosine from the base lr down to eta_min over T_max epochs (then back up, and so on).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, std::int64_t T_max, double eta_min = 0.0);

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void own_state_before(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  std::int64_t t_max_;
  double eta_min_;
};

/// SGDR: cosine annealing restarted after T_0 epochs, each period T_mult times the last.
class CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, std::int64_t T_0, std::int64_t T_mult = 1,
                              double eta_min = 0.0);
  void step() override;

 private:
  std::vector<double> get_lr() override;
  void own_state_before(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  std::int64_t t_0_, t_i_, t_mult_;
  double eta_min_;
  std::int64_t t_cur_;
};

/// The lr times a factor going linearly from start_factor to end_factor over total_iters epochs.
class LinearLR : public LRScheduler {
 public:
  LinearLR(torch::optim::Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
           std::int64_t total_iters = 5);

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void own_state_before(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  double start_factor_, end_factor_;
  std::int64_t total_iters_;
};

struct OneCycleOptions {
  std::optional<std::int64_t> total_steps{};  ///< or epochs * steps_per_epoch
  std::optional<std::int64_t> epochs{};
  std::optional<std::int64_t> steps_per_epoch{};
  double pct_start = 0.3;
  enum class Anneal { cos, linear } anneal_strategy = Anneal::cos;
  bool cycle_momentum = true;  ///< SGD's (or RMSprop's) momentum, or Adam's and AdamW's beta1
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

/// The 1cycle policy, stepped after every batch: up from max_lr / div_factor to max_lr, then down
/// to max_lr / div_factor / final_div_factor (momentum the other way).
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(torch::optim::Optimizer& optimizer, double max_lr, OneCycleOptions options);
  OneCycleLR(torch::optim::Optimizer& optimizer, const std::vector<double>& max_lrs, OneCycleOptions options);

 private:
  struct Phase {
    double end_step;
    int start_lr, end_lr, start_momentum, end_momentum;  // indices into Group's values
  };
  struct Group {
    double values[3];    // initial_lr, max_lr, min_lr
    double momenta[2];   // max_momentum, base_momentum
  };
  std::vector<double> get_lr() override;
  void own_state_before(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  double anneal(double start, double end, double pct) const;
  std::int64_t total_steps_;
  std::optional<std::int64_t> made_total_steps_{};  ///< set when a loaded state replaced total_steps_: the one made with
  std::vector<Phase> phases_;
  OneCycleOptions::Anneal anneal_;
  bool cycle_momentum_, use_beta1_ = false;
  std::vector<Group> groups_;
};

/// One scheduler after another: schedulers[i] from milestones[i-1] on (e.g. LinearLR warm-up,
/// then CosineAnnealingLR). It owns them; they must be made on the same optimizer.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(torch::optim::Optimizer& optimizer, std::vector<std::unique_ptr<LRScheduler>> schedulers,
               std::vector<std::int64_t> milestones);
  void step() override;
  /// Python's keys: _milestones, last_epoch, _last_lr, _schedulers (each one's state).
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 private:
  std::vector<double> get_lr() override;  // never called: step() is its own
  std::vector<std::unique_ptr<LRScheduler>> schedulers_;
  std::vector<std::int64_t> milestones_;
};

/// lr = the previous lr * lambda(epoch) (from the first step on), one function for every group or one per group.
class MultiplicativeLR : public LRScheduler {
 public:
  using Lambda = std::function<double(std::int64_t)>;
  MultiplicativeLR(torch::optim::Optimizer& optimizer, const Lambda& lr_lambda);
  MultiplicativeLR(torch::optim::Optimizer& optimizer, std::vector<Lambda> lr_lambdas);

 private:
  std::vector<double> get_lr() override;
  void own_state_after(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  std::vector<Lambda> lr_lambdas_;
};

/// The lr times `factor` for the first total_iters epochs, then the lr itself.
class ConstantLR : public LRScheduler {
 public:
  explicit ConstantLR(torch::optim::Optimizer& optimizer, double factor = 1.0 / 3, std::int64_t total_iters = 5);

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void own_state_before(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  double factor_;
  std::int64_t total_iters_;
};

/// base_lr * (1 - epoch / total_iters) ^ power, then constant from total_iters on.
class PolynomialLR : public LRScheduler {
 public:
  explicit PolynomialLR(torch::optim::Optimizer& optimizer, std::int64_t total_iters = 5, double power = 1.0);

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void own_state_before(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  std::int64_t total_iters_;
  double power_;
};

struct CyclicLROptions {
  std::vector<double> base_lr;  ///< one for every group, or one per group (set on the groups when made)
  std::vector<double> max_lr;   ///< one for every group, or one per group
  std::int64_t step_size_up = 2000;
  std::optional<std::int64_t> step_size_down{};  ///< step_size_up when not given
  enum class Mode { triangular, triangular2, exp_range } mode = Mode::triangular;
  double gamma = 1.0;  ///< exp_range's gamma ^ iterations
  /// A custom scale policy (replaces mode's), called with the cycle or the iteration (scale_mode).
  std::function<double(double)> scale_fn{};
  enum class ScaleMode { cycle, iterations } scale_mode = ScaleMode::cycle;  ///< used with scale_fn only
  bool cycle_momentum = true;  ///< SGD's (or RMSprop's) momentum, or Adam's and AdamW's beta1
  std::vector<double> base_momentum{0.8};  ///< one for every group, or one per group
  std::vector<double> max_momentum{0.9};   ///< one for every group, or one per group
};

/// The cyclical learning rate policy (CLR), stepped after every batch: the lr goes between base_lr and max_lr
/// (momentum the other way), the amplitude scaled per cycle or per iteration.
class CyclicLR : public LRScheduler {
 public:
  CyclicLR(torch::optim::Optimizer& optimizer, CyclicLROptions options);

 private:
  std::vector<double> get_lr() override;
  void own_state_before(StateDict& state) const override;
  void own_state_after(StateDict& state) const override;
  void load_own_state(const StateDict& state) override;
  double scale(std::int64_t x) const;
  std::vector<double> max_lrs_;
  double total_size_, step_ratio_;
  CyclicLROptions::Mode mode_;
  double gamma_;
  std::function<double(double)> scale_fn_;
  CyclicLROptions::ScaleMode scale_mode_;
  bool cycle_momentum_, use_beta1_ = false;
  std::vector<double> base_momentums_, max_momentums_;
};

/// Steps every scheduler given, one after another, in each step() (e.g. ConstantLR and ExponentialLR at once).
/// It owns them; they must be made on the same optimizer (`optimizer`, when given, or the first one's).
class ChainedScheduler : public LRScheduler {
 public:
  explicit ChainedScheduler(std::vector<std::unique_ptr<LRScheduler>> schedulers,
                            torch::optim::Optimizer* optimizer = nullptr);
  void step() override;
  /// Python's keys: _last_lr (and _step_count, _is_initial once SequentialLR started it), _schedulers.
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 private:
  friend class SequentialLR;
  std::vector<double> get_lr() override;  // called only by a SequentialLR restarting it: an error, as in Python
  std::vector<std::unique_ptr<LRScheduler>> schedulers_;
  bool started_ = false;  ///< initial_step() ran (SequentialLR's first scheduler)
};

struct ReduceLROnPlateauOptions {
  enum class Mode { min, max } mode = Mode::min;
  double factor = 0.1;
  std::int64_t patience = 10;
  double threshold = 1e-4;
  enum class ThresholdMode { rel, abs } threshold_mode = ThresholdMode::rel;
  std::int64_t cooldown = 0;
  std::vector<double> min_lr{0.0};  ///< one for every group, or one per group
  double eps = 1e-8;
};

/// Lowers the lr by `factor` when the monitored value stops improving for `patience` epochs.
/// (Python's, where LibTorch's ReduceLROnPlateauScheduler keeps its best value in a float and has
/// no state_dict.) Trainer::fit steps it on OptimizerConfig::monitor.
class ReduceLROnPlateau {
 public:
  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options = {});
  void step(double metric);
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  std::int64_t last_epoch() const { return last_epoch_; }
  double best() const { return best_; }
  const std::vector<double>& min_lrs() const { return min_lrs_; }
  /// Python's `scheduler.min_lrs = [...]` (e.g. after add_param_group): one per param group, none negative.
  void set_min_lrs(std::vector<double> min_lrs);
  std::int64_t num_bad_epochs() const { return num_bad_epochs_; }
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  bool is_better(double a, double best) const;
  torch::optim::Optimizer* optimizer_;
  ReduceLROnPlateauOptions options_;
  bool default_min_lr_;
  std::vector<double> min_lrs_;
  std::int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
  double best_;
  std::int64_t cooldown_counter_ = 0, num_bad_epochs_ = 0;
};

}  // namespace fulgur::optim
