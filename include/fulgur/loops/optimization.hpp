#pragma once
// One training batch's optimization, automatic or manual (Lightning's _AutomaticOptimization and
// _ManualOptimization), and the learning-rate schedulers that follow the optimizer steps.
//
// Automatic, per batch, in Lightning's order:
//   training_step (in the precision's forward context)
//   on the first batch of an accumulation window: on_before_zero_grad, optimizer.zero_grad()
//   on_before_backward(loss / accumulate), backward (no gradient sync on accumulating batches),
//   on_after_backward
//   on a stepping batch: unscale (hooks see true gradients; not for a fused optimizer under the loss
//   scaler, whose kernel unscales, as in Lightning), on_before_optimizer_step, clipping (which unscales),
//   the optimizer step through strategy and precision (false: the loss scaler skipped it)
//
// Manual: the whole training_step runs in the forward context and drives backward and the steps
// through StepContext (manual_backward, optimizers()[i].step()); each step counts toward
// global_step, as in Lightning.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fulgur/compatibility.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/hooks.hpp"
#include "fulgur/loops/common.hpp"
#include "fulgur/loops/step.hpp"
#include "fulgur/metrics.hpp"
#include "fulgur/optimization.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur::loops {

/// Where fit is: what the loops count and what ends them.
struct FitProgress {
  std::int64_t global_step = 0;           ///< optimizer steps, skipped ones included (Lightning's count)
  std::int64_t total_batch_idx = 0;       ///< batches across epochs
  std::int64_t batches_that_stepped = 0;  ///< Lightning's logging step
  std::int64_t epochs_done = 0;
  std::int64_t stepped_in_epoch = 0;      ///< optimizer steps that really ran this epoch
  std::int64_t skipped_in_epoch = 0;
  std::int64_t skipped_in_a_row = 0;
  std::int64_t batches_in_epoch = 0;      ///< batches of the current epoch that are done
  bool in_epoch = false;                  ///< between an epoch's first batch and its end
  /// Set while an optimizer changes the weights: an exception leaving it may have left them half
  /// updated (OnExceptionCheckpoint then writes nothing).
  bool in_optimizer_step = false;
  /// Under DDP, the stop request every rank agreed on (stop_wanted). A rank that sets ctx.should_stop
  /// alone stops with the others at the next point where they agree: after a validation, at a log
  /// step, at an epoch's end (no collective per batch). One process: ctx.should_stop itself.
  bool stop_agreed = false;
  std::string stop_reason{};
};

/// Whether a stop is asked for, as every rank sees it (see FitProgress::stop_agreed).
inline bool stop_wanted(const FitProgress& progress, const StepContext& ctx, int world_size) {
  return world_size == 1 ? ctx.should_stop : progress.stop_agreed;
}

/// Whether a stop request may end the run now (Lightning's _can_stop_early).
inline bool can_stop_early(const FitProgress& progress, const TrainerConfig& config) {
  return progress.epochs_done >= config.min_epochs && progress.global_step >= config.min_steps;
}

/// A step the loss scaler skipped; max_consecutive_skipped_steps of them in a row is an error (the
/// loss or its gradients are not finite, and nothing is learnt any more).
void count_skipped_step(FitProgress& progress, const TrainerConfig& config, const StepContext& ctx,
                        std::string_view precision);

/// TrainerConfig::detect_anomaly, before an optimizer step: a NaN/inf gradient (after unscaling) is a
/// NonFiniteGradientError naming the parameters and the step. Not called under a loss scaler, whose
/// skipped steps are how it handles them (count_skipped_step).
void check_gradients_finite(torch::nn::Module& module, const StepContext& ctx, std::string_view precision);

/// Counts an optimizer step (the common case inline; a skipped one out of line).
inline void count_optimizer_step(FitProgress& progress, bool ran, const TrainerConfig& config, const StepContext& ctx,
                                 std::string_view precision) {
  ++progress.global_step;
  if (!ran) return count_skipped_step(progress, config, ctx, precision);
  ++progress.stepped_in_epoch;
  progress.skipped_in_a_row = 0;
}

/// The optimizer step, automatic or manual: detect_anomaly's gradient check, `before` (the clipping),
/// then the step under the profiler scope `timer` starts, flagged in FitProgress::in_optimizer_step
/// while it changes the weights (left set by an exception: they may be half updated), then counted.
template <class Host, class Hook, class Before, class Timer>
inline bool guarded_optimizer_step(Host& host, Hook& hook, const TrainerConfig& config,
                                   torch::optim::Optimizer& optimizer, FitProgress& progress, Before&& before,
                                   Timer&& timer) {
  if (!Host::uses_loss_scaler && config.detect_anomaly)
    check_gradients_finite(hook.module(), hook.ctx(), Host::precision_name());
  before();
  auto timed = timer();
  progress.in_optimizer_step = true;
  const bool ran = host.optimizer_step(optimizer);
  progress.in_optimizer_step = false;
  timed.end();
  count_optimizer_step(progress, ran, config, hook.ctx(), Host::precision_name());
  return ran;
}

/// What one batch's optimization gives back.
template <class Output>
struct BatchOutcome {
  Output output;
  at::Tensor loss;         ///< the step's loss as returned (undefined if it returned none)
  bool stepped = false;    ///< an optimizer step was taken (or skipped by the scaler)
  bool step_ran = false;   ///< ... and really changed the parameters
};

template <class Host, class Module>
class AutomaticOptimization {
 public:
  AutomaticOptimization(Host& host, HookCallerOf<Host, Module>& hook, const TrainerConfig& config,
                        torch::optim::Optimizer& optimizer, FitProgress& progress)
      : host_(host), hook_(hook), config_(config), optimizer_(optimizer), progress_(progress) {}

  /// step_now: this batch ends an accumulation window (or the epoch); first: it starts one.
  template <class Batch>
  auto run(const Batch& batch, bool step_now, bool first) {
    auto output = run_step(host_, hook_, hooks::training_step, batch);
    BatchOutcome<decltype(output)> outcome{std::move(output), {}, step_now, false};
    outcome.loss = checked_loss(loss_of(outcome.output));
    if (first) {
      hook_(hooks::on_before_zero_grad, optimizer_);
      auto timed = profile_module<"optimizer_zero_grad">(hook_);
      optimizer_.zero_grad();
    }
    const std::int64_t accumulate = config_.accumulate_grad_batches;
    const at::Tensor loss = accumulate > 1 ? outcome.loss / static_cast<double>(accumulate) : outcome.loss;
    hook_(hooks::on_before_backward, loss);
    try {
      auto local_only = host_.no_backward_sync(hook_.module(), !step_now);  // micro-batches: no communication
      auto timed = profile_strategy<"backward", Host>(hook_);
      host_.backward(loss, hook_.module());
    } catch (const c10::Error& e) {
      throw step_failure("training_step", hook_.ctx(), Host::precision_name(), e, batch, hook_.module());
    }
    hook_(hooks::on_after_backward);
    if (step_now) outcome.step_ran = step();
    return outcome;
  }

 private:
  at::Tensor checked_loss(const at::Tensor& loss) const {
    if (loss.defined() && loss.numel() == 1) return loss;
    raise_loss_not_scalar(hook_.ctx(), loss);
  }

  bool step() {
    if (!host_.unscales_in_optimizer(optimizer_)) host_.unscale_gradients(optimizer_);
    hook_(hooks::on_before_optimizer_step, optimizer_);
    auto clip_gradients = [&] {
      if (!config_.gradient_clip_val || *config_.gradient_clip_val <= 0.0) return;
      ClipGradients clip{.error_if_nonfinite = false};
      (config_.gradient_clip_algorithm == GradientClipAlgorithm::norm ? clip.max_norm : clip.clip_val) =
          *config_.gradient_clip_val;
      auto timed = profile_module<"configure_gradient_clipping">(hook_);
      host_.clip_gradients(hook_.module(), optimizer_, clip);
    };
    // the step alone is timed: the closure ran before it
    return guarded_optimizer_step(host_, hook_, config_, optimizer_, progress_, clip_gradients,
                                  [&] { return profile_module<"optimizer_step">(hook_); });
  }

  Host& host_;
  HookCallerOf<Host, Module>& hook_;
  const TrainerConfig& config_;
  torch::optim::Optimizer& optimizer_;
  FitProgress& progress_;
};

template <class Host, class Module>
class ManualOptimization {
 public:
  /// `link`: the loop under way, through which StepContext reaches backward, step and clip below.
  ManualOptimization(Host& host, HookCallerOf<Host, Module>& hook, const TrainerConfig& config,
                     std::vector<OptimizerConfig>& optimizers, FitProgress& progress,
                     detail::ManualOptimizationLink& link)
      : host_(host), hook_(hook), config_(config), optimizers_(optimizers), progress_(progress) {
    std::vector<ManualOptimizer> handles;
    std::vector<AnyLRScheduler*> schedulers;
    for (std::size_t i = 0; i < optimizers_.size(); ++i) {
      handles.emplace_back(*optimizers_[i].optimizer, i, link);
      schedulers.push_back(&optimizers_[i].lr_scheduler);
    }
    hook_.ctx().attach_manual(&link, std::move(handles), std::move(schedulers));
  }
  ManualOptimization(const ManualOptimization&) = delete;
  ManualOptimization& operator=(const ManualOptimization&) = delete;

  template <class Batch>
  auto run(const Batch& batch, bool /*step_now*/, bool /*first*/) {
    const std::int64_t ran_before = progress_.stepped_in_epoch;
    auto output = run_step(host_, hook_, hooks::training_step, batch);
    BatchOutcome<decltype(output)> outcome{std::move(output), {}, false, false};
    if constexpr (has_loss<decltype(outcome.output)>) outcome.loss = loss_of(outcome.output);
    outcome.stepped = true;  // nothing accumulates under manual optimization (Lightning's rule)
    outcome.step_ran = progress_.stepped_in_epoch > ran_before;
    return outcome;
  }

  // ---- what the training_step calls (StepContext -> the loop's ManualOptimizationLink -> here) -----
  void backward(const at::Tensor& loss) {
    hook_(hooks::on_before_backward, loss);
    auto timed = profile_strategy<"backward", Host>(hook_);
    host_.backward(loss, hook_.module());
    timed.end();
    hook_(hooks::on_after_backward);
  }
  bool step(std::size_t index) {
    torch::optim::Optimizer& optimizer = *optimizers_[index].optimizer;
    if (!host_.unscales_in_optimizer(optimizer)) host_.unscale_gradients(optimizer);
    hook_(hooks::on_before_optimizer_step, optimizer);
    // profile<"optimizer_step">: Lightning's name under manual optimization
    const bool ran = guarded_optimizer_step(host_, hook_, config_, optimizer, progress_, [] {},
                                            [&] { return profile<"optimizer_step">(hook_); });
    hook_.ctx().global_step = progress_.global_step;
    return ran;
  }
  at::Tensor clip(std::size_t index, const ClipGradients& clip) {
    return host_.clip_gradients(hook_.module(), *optimizers_[index].optimizer, clip);
  }

 private:
  Host& host_;
  HookCallerOf<Host, Module>& hook_;
  const TrainerConfig& config_;
  std::vector<OptimizerConfig>& optimizers_;
  FitProgress& progress_;
};

/// The schedulers of configure_optimizers, stepped as Lightning steps them (update_lr_schedulers),
/// with one difference: a step the loss scaler skipped leaves the learning rate alone (Lightning
/// issues 5558, 16228). Under manual optimization the module steps them itself.
class Schedulers {
 public:
  Schedulers(std::vector<OptimizerConfig>& configs, bool automatic) : configs_(configs), automatic_(automatic) {}

  /// After a batch whose optimizer step ran: step-interval schedulers (batch_idx counts from 0).
  void after_step(std::int64_t batch_idx, const detail::TensorMap& metrics, bool plateau) {
    update(SchedulerInterval::step, batch_idx + 1, metrics, plateau);
  }
  /// At an epoch's end (only if some step ran in it): epoch-interval schedulers.
  void after_epoch(std::int64_t epoch, const detail::TensorMap& metrics, bool plateau) {
    update(SchedulerInterval::epoch, epoch + 1, metrics, plateau);
  }
  std::vector<std::string> take_warnings() { return std::move(warnings_); }

 private:
  void update(SchedulerInterval interval, std::int64_t count, const detail::TensorMap& metrics, bool plateau);

  std::vector<OptimizerConfig>& configs_;
  bool automatic_;
  std::vector<std::string> warnings_;
};

}  // namespace fulgur::loops
