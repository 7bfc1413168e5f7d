#pragma once
// The training epoch loop: the batches of one epoch, and validation where val_check_interval puts
// it (Lightning's _TrainingEpochLoop). Per batch, in Lightning's order:
//
//   transfer hooks; on_train_batch_start (returning -1 ends the epoch here)
//   the optimization (optimization.hpp); step-interval schedulers after a step that ran;
//   epoch-interval schedulers after the epoch's last batch
//   on_train_batch_end(output, batch, batch_idx)
//   validation, if this batch is a val check (on_validation_model_zero_grad first, unless accumulating)
//   ReduceLROnPlateau schedulers of step interval
//
// The loss reaches the host only on log steps, the epoch's last batch, the run's last batch, or
// every step with FiniteLossCheck::every_step.
#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "fulgur/compatibility.hpp"
#include "fulgur/data/apply.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/hooks.hpp"
#include "fulgur/interrupt.hpp"
#include "fulgur/loops/common.hpp"
#include "fulgur/loops/evaluation.hpp"
#include "fulgur/loops/optimization.hpp"
#include "fulgur/metrics.hpp"
#include "fulgur/results.hpp"

namespace fulgur::loops {

class FitState;

/// When fit validates, from val_check_interval, check_val_every_n_epoch and the loaders' lengths.
struct ValidationSchedule {
  bool enabled = false;            ///< validation data, a validation_step, and batches to run
  std::int64_t batches = -1;       ///< validation batches per run (-1: all)
  std::int64_t check_batch = -1;   ///< validate after every check_batch training batches (-1: at the epoch's end)
  std::optional<std::int64_t> every_n_epochs{};
};

/// What of a batch, or of an epoch, is still to run once its training half is done (after the
/// optimizer step, the schedulers, on_train_batch_end, the step's metrics and loggers, the loss read):
/// OnExceptionCheckpoint's second position (FitState::mark_trained_batch). A checkpoint of it runs
/// that first when resumed, then goes on with the next batch.
struct PendingBatchEnd {
  enum class Kind : std::int64_t { batch_end = 1, epoch_end = 2 };
  Kind kind = Kind::batch_end;
  bool step_ran = false;  ///< the optimizer really stepped (the plateau schedulers step after validation)
  bool validate = false;  ///< validation is due at this batch
  bool last = false;      ///< the epoch's last batch: its end follows
  bool stop = false;      ///< the run stops after this batch (kept for the record; a resumed run asks again)
  bool should_stop = false;  ///< a stop asked for (ctx.should_stop; under DDP, agreed), maybe not taken yet
  std::optional<double> train_loss{}, val_loss{};  ///< the epoch's summary so far
};

template <class Host, class Module, class TrainData, class Optimization, class ValLoop>
class TrainingEpochLoop {
 public:
  struct Parts {
    Host& host;
    HookCallerOf<Host, Module>& hook;
    TrainData& data;
    Optimization& optimization;
    Schedulers& schedulers;
    FitProgress& progress;
    detail::MetricCollection& metrics;
    detail::MetricViews& views;
    std::vector<std::string>& warnings;
    ValLoop* validation;  // null without validation data
    FitState& fit;  // its checkpoint requests, written between batches
  };

  TrainingEpochLoop(Parts parts, std::int64_t max_batches, ValidationSchedule schedule)
      : p_(parts), config_(parts.host.config()), max_batches_(max_batches), schedule_(schedule) {}

  /// One epoch; fills the summary's train_loss and val_loss. Returns whether the epoch reached its
  /// end (its last batch, or on_train_batch_start's -1), also when the run stops there.
  /// first_batch: where a resumed epoch goes on (the batches before it are passed over unread;
  /// skip = false when the loader restored its own position). pending: a resumed checkpoint of batch
  /// first_batch - 1's training half (PendingBatchEnd::batch_end), whose end runs first.
  bool run(EpochSummary& summary, std::chrono::steady_clock::time_point fit_start, std::int64_t first_batch = 0,
           bool skip = true, const PendingBatchEnd* pending = nullptr) {
    fit_start_ = fit_start;
    summary_ = &summary;
    if (pending != nullptr) {
      const BatchEnd ended = end_pending_batch(*pending, first_batch - 1);
      if (ended != BatchEnd::go_on) return ended == BatchEnd::end_of_epoch || pending->last;
    }
    // The position at or past this run's epoch: where only a smaller limit_train_batches than the saved
    // run's ends it there (the data goes on) and nothing is lost (a fresh iterator, no accumulation window
    // open), the epoch is over; otherwise (shorter data, ...) resuming exactly cannot be done: an error.
    if (first_batch > 0 && max_batches_ >= 0 && first_batch >= max_batches_) {
      const bool data_goes_on = [&] {
        if constexpr (requires { p_.data.size(); }) return static_cast<std::int64_t>(p_.data.size()) > first_batch;
        else return false;
      }();
      if (!data_goes_on || !skip || first_batch % config_.accumulate_grad_batches != 0)
        raise_resume_past_data(summary.epoch, first_batch, max_batches_);
      p_.warnings.push_back(
          say_resumed_at_batch_limit(summary.epoch, first_batch, max_batches_, p_.host.is_global_zero()));
      step_epoch_schedulers();
      return true;
    }
    // A loader that can start mid-epoch (begin_at) does so without reading the batches before.
    constexpr bool starts_anywhere = requires { p_.data.begin_at(first_batch); p_.data.size(); };
    auto it = [&] {
      if constexpr (starts_anywhere) return skip ? p_.data.begin_at(first_batch) : std::begin(p_.data);
      else return std::begin(p_.data);
    }();
    auto end = std::end(p_.data);
    if constexpr (starts_anywhere) {
      if (skip && first_batch > 0 && it == end) raise_resume_past_data(summary.epoch, first_batch, p_.data.size());
    } else {
      for (std::int64_t i = 0; skip && i < first_batch; ++i, ++it)
        if (it == end) raise_resume_past_data(summary.epoch, first_batch, i);
    }
    std::optional<batch_of_t<TrainData>> current;
    if (max_batches_ != 0 && it != end && (max_batches_ < 0 || first_batch < max_batches_)) {
      auto fetching = profile<"[_TrainingEpochLoop].train_dataloader_next">(p_.hook);
      fetch(current, it, first_batch);
    }
    std::int64_t batch_idx = first_batch;
    bool reached_end = false;
    while (current) {  // one batch of look-ahead tells the epoch's last batch (accumulation flushes there)
      const bool is_last = it == end || (max_batches_ >= 0 && batch_idx + 1 >= max_batches_);
      const BatchEnd ended = run_batch(*current, batch_idx++, is_last);
      reached_end = ended == BatchEnd::end_of_epoch || (ended == BatchEnd::stop_run && is_last);
      if (ended != BatchEnd::go_on) break;
      auto fetching = profile<"[_TrainingEpochLoop].train_dataloader_next">(p_.hook);
      fetch(current, it, batch_idx);
    }
    if (batch_idx == 0 || (batch_idx == first_batch && first_batch > 0)) {
      if constexpr (requires { p_.data.describe(); }) raise_no_training_batches(summary.epoch, p_.data.describe());
      else raise_no_training_batches(summary.epoch, {});
    }
    return reached_end;
  }

 private:
  enum class BatchEnd { go_on, end_of_epoch, stop_run };

  /// Batch `batch_idx` into `current` and the iterator on to the next; a DataError said with the loader
  /// and the batch it was making.
  template <class Iterator>
  void fetch(std::optional<batch_of_t<TrainData>>& current, Iterator& it, std::int64_t batch_idx) {
    try {
      current.emplace(*it);
    } catch (const DataError& e) {
      raise_data_failure(e, "training", p_.hook.ctx(), batch_idx);
    }
    try {
      ++it;
    } catch (const DataError& e) {  // a loader that reads ahead on ++ fails on the next batch
      raise_data_failure(e, "training", p_.hook.ctx(), batch_idx + 1);
    }
  }

  template <class RawBatch>
  BatchEnd run_batch(const RawBatch& raw, std::int64_t batch_idx, bool is_last) {
    StepContext& ctx = p_.hook.ctx();
    ctx.batch_idx = batch_idx;
    const std::int64_t step_at_batch = ctx.global_step = p_.progress.global_step;
    const auto batch = prepare_batch(p_.host, p_.hook, raw, "training_step");
    p_.metrics.set_batch_size(data::extract_batch_size(batch));
    if (ends_epoch(p_.hook(hooks::on_train_batch_start, batch, batch_idx))) {
      ++p_.progress.total_batch_idx;  // Lightning counts the batch as ready
      step_epoch_schedulers();        // the epoch ends here, as at its last batch
      return BatchEnd::end_of_epoch;
    }
    const std::int64_t accumulate = config_.accumulate_grad_batches;
    const bool step_now = (batch_idx + 1) % accumulate == 0 || is_last;
    auto running = profile<"run_training_batch">(p_.hook);
    auto outcome = p_.optimization.run(batch, step_now, batch_idx % accumulate == 0);
    running.end();
    ctx.global_step = p_.progress.global_step;
    if (outcome.step_ran) p_.schedulers.after_step(batch_idx, p_.views.callback, /*plateau=*/false);
    if (is_last) step_epoch_schedulers();
    p_.hook(hooks::on_train_batch_end, outcome.output, batch, batch_idx);
    if (!p_.metrics.empty()) {  // something was logged this epoch
      p_.metrics.sync_step_values(all_reduce());
      if constexpr (callbacks_of<Host>::has_loggers)
        if (outcome.stepped) send_step_to_loggers();
      p_.metrics.publish_step(p_.views);
    }
    ++p_.progress.total_batch_idx;
    if (outcome.stepped && (p_.progress.batches_that_stepped + 1) % config_.log_every_n_steps == 0)
      agree_on_stop();  // under DDP, at each log step: a stop any rank asked for ends every rank's run here
    const bool stop = stop_requested();
    const bool finite = read_loss(outcome, is_last || stop, step_at_batch);
    const bool validate_now = should_validate(is_last);
    // OnExceptionCheckpoint's second point: the rest of this batch (and epoch) is pending
    if (outcome.stepped && p_.fit.tracks_completed_steps())
      p_.fit.mark_trained_batch(batch_idx, {.step_ran = outcome.step_ran,
                                            .validate = validate_now,
                                            .last = is_last,
                                            .stop = stop,
                                            .should_stop = stop_wanted(p_.progress, ctx, p_.host.world_size()),
                                            .train_loss = summary_->train_loss,
                                            .val_loss = summary_->val_loss});
    if (!finite)
      raise_non_finite_loss(summary_->train_loss.value_or(0.0), p_.hook.ctx(), step_at_batch, Host::precision_name(),
                            config_.finite_loss_check == FiniteLossCheck::every_step, last_finite_step_);
    return end_batch(batch_idx, outcome.stepped, outcome.step_ran, validate_now, is_last, stop);
  }

  /// A resumed checkpoint of a batch's training half: its end, as the batch left it.
  BatchEnd end_pending_batch(const PendingBatchEnd& pending, std::int64_t batch_idx) {
    StepContext& ctx = p_.hook.ctx();
    ctx.batch_idx = batch_idx;
    ctx.global_step = p_.progress.global_step;
    ctx.should_stop = p_.progress.stop_agreed = pending.should_stop;
    summary_->train_loss = pending.train_loss;
    summary_->val_loss = pending.val_loss;
    p_.progress.batches_in_epoch = batch_idx;  // the batch is not over yet
    p_.fit.mark_trained_batch(batch_idx, pending);  // again: a failure in its end saves the same state
    // Whether the run ends after it, by this run's limits (a resumed run may have raised max_steps).
    const bool stop = stop_requested();
    return end_batch(batch_idx, /*stepped=*/true, pending.step_ran, pending.validate, pending.last, stop);
  }

  /// The rest of a batch after its training half: validation where due, the plateau schedulers, the
  /// counters, the checkpoints asked for, the signals.
  BatchEnd end_batch(std::int64_t batch_idx, bool stepped, bool step_ran, bool validate_now, bool is_last, bool stop) {
    if (validate_now) {
      validate(stepped);
      agree_on_stop();
      stop = stop || stop_requested();  // a stop asked for in validation (EarlyStopping) ends the run here
    }
    if (step_ran) p_.schedulers.after_step(batch_idx, p_.views.callback, /*plateau=*/true);
    if (stepped) p_.hook.view()->set_logging_step(++p_.progress.batches_that_stepped);
    p_.progress.batches_in_epoch = batch_idx + 1;
    const BatchEnd ended = stop ? BatchEnd::stop_run : is_last ? BatchEnd::end_of_epoch : BatchEnd::go_on;
    // Saves asked for in this batch are written now that it is over; at an epoch's end (or a
    // stop), once the epoch is (fit.hpp).
    if (ended == BatchEnd::go_on) {
      if (p_.fit.checkpoints_requested()) p_.fit.write_requested_checkpoints();
      check_signals(stepped);  // the batch is over: a checkpoint taken now resumes exactly
      if (stepped) p_.fit.mark_completed_step();  // a window ended (OnExceptionCheckpoint's point)
    }
    return ended;
  }

  /// At Lightning's log steps (every log_every_n_steps optimizer steps, and when stopping), the
  /// values logged on_step in this batch go to the loggers, with the epoch.
  void send_step_to_loggers() {
    const std::int64_t n = p_.progress.batches_that_stepped + 1;
    if (n % config_.log_every_n_steps != 0 && !stop_wanted(p_.progress, p_.hook.ctx(), p_.host.world_size())) return;
    Metrics logged;
    p_.metrics.collect_step_logged(logged);
    if (logged.empty()) return;
    logged.emplace("epoch", static_cast<double>(p_.hook.ctx().current_epoch));
    p_.hook.view()->log_metrics(logged, p_.progress.batches_that_stepped);
  }

  template <class Response>
  static bool ends_epoch(const Response& response) {
    if constexpr (std::is_convertible_v<Response, std::int64_t> && !std::is_same_v<Response, bool>)
      return static_cast<std::int64_t>(response) == -1;
    else
      return false;
  }

  void step_epoch_schedulers() {
    if (p_.progress.stepped_in_epoch > 0)
      p_.schedulers.after_epoch(p_.hook.ctx().current_epoch, p_.views.callback, /*plateau=*/false);
  }

  /// Ctrl-C or a preemption signal: one process stops after the batch; under DDP the ranks agree
  /// after each log step's batch (one collective there, none per batch), so that they stop
  /// together. An epoch's last batch and a stop are left to fit, once the epoch is over.
  void check_signals(bool stepped) {
    if (p_.host.world_size() > 1 && !(stepped && p_.progress.batches_that_stepped % config_.log_every_n_steps == 0))
      return;
    const StepContext& ctx = p_.hook.ctx();
    stop_if_signalled(p_.host, [&] {
      return "after " + position_text("training_step", ctx.current_epoch, ctx.batch_idx, p_.progress.global_step);
    });
  }

  /// Under DDP: every rank takes a stop any rank asked for (FitProgress::stop_agreed).
  void agree_on_stop() {
    if (p_.host.world_size() == 1) return;
    StepContext& ctx = p_.hook.ctx();
    ctx.should_stop = p_.progress.stop_agreed = p_.host.reduce_boolean_decision(ctx.should_stop, /*all=*/false);
  }

  /// Whether the run ends after this batch: max_steps, max_time, or a stop request once
  /// min_epochs/min_steps are met.
  bool stop_requested() {
    StepContext& ctx = p_.hook.ctx();
    FitProgress& progress = p_.progress;
    if (config_.max_steps >= 0 && progress.global_step >= config_.max_steps) {
      progress.stop_reason = "max_steps=" + std::to_string(config_.max_steps) + " reached";
      return true;
    }
    if (config_.max_time && !ctx.should_stop) {
      const bool up = std::chrono::steady_clock::now() - fit_start_ >= *config_.max_time;
      if (p_.host.reduce_boolean_decision(up, /*all=*/false)) {  // every rank stops at the same batch
        ctx.should_stop = progress.stop_agreed = true;
        progress.stop_reason = "max_time=" + seconds_text(config_.max_time->count()) + " s reached";
      }
    }
    if (stop_wanted(progress, ctx, p_.host.world_size()) && can_stop_early(progress, config_)) {
      if (progress.stop_reason.empty()) progress.stop_reason = "should_stop was set";
      return true;
    }
    return false;
  }

  /// Reads the loss where it is due; false when it is not finite and that is an error (raised once
  /// the batch's position is marked).
  template <class Outcome>
  bool read_loss(const Outcome& outcome, bool must, std::int64_t step_at_batch) {
    if (!outcome.loss.defined()) return true;
    const std::int64_t steps = p_.progress.global_step;
    const bool log_step = outcome.stepped && (steps == 1 || steps % config_.log_every_n_steps == 0);
    const bool every_step = config_.finite_loss_check == FiniteLossCheck::every_step;
    if (!(must || log_step || every_step)) return true;
    // A copy (float32: every backend reduces it), averaged over the ranks, which all read the same
    // batches: every rank reports, monitors and checks the same number.
    at::Tensor loss = outcome.loss.detach().reshape({}).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    if (p_.host.world_size() > 1) loss = p_.host.all_reduce(loss, ReduceOp::mean);
    const double value = loss.template item<double>();
    summary_->train_loss = value;
    p_.hook.view()->set_last_train_loss(value);
    if (!p_.metrics.logs("train_loss"))  // fulgur's train_loss, a callback metric monitors can use
      p_.views.callback.set("train_loss", loss);
    constexpr bool scaled = Host::uses_loss_scaler;  // skips are counted instead
    if (!scaled && config_.finite_loss_check != FiniteLossCheck::off && !std::isfinite(value)) return false;
    last_finite_step_ = step_at_batch;
    return true;
  }

  bool should_validate(bool is_last) const {
    if constexpr (std::is_same_v<ValLoop, NoData>) {
      return false;
    } else {
      const StepContext& ctx = p_.hook.ctx();
      if (!schedule_.enabled) return false;
      if (schedule_.every_n_epochs && (ctx.current_epoch + 1) % *schedule_.every_n_epochs != 0) return false;
      if (stop_wanted(p_.progress, ctx, p_.host.world_size()) && can_stop_early(p_.progress, config_)) return true;
      if (schedule_.check_batch < 0) return is_last;
      const std::int64_t done = schedule_.every_n_epochs ? ctx.batch_idx : p_.progress.total_batch_idx - 1;
      return (done + 1) % schedule_.check_batch == 0;
    }
  }

  void validate(bool stepped) {
    if constexpr (!std::is_same_v<ValLoop, NoData>) {
      if (stepped) {  // free the gradients before validating (Lightning's on_validation_model_zero_grad)
        p_.hook.call_or_default(hooks::on_validation_model_zero_grad, [&] { p_.hook.module().zero_grad(/*set_to_none=*/true); });
      }
      const EvaluationResult result = p_.validation->run(schedule_.batches, EvaluationMode::inside_fit);
      summary_->val_loss = result.loss;
      p_.warnings.insert(p_.warnings.end(), result.warnings.begin(), result.warnings.end());
    }
  }

  auto all_reduce() {
    return [this](const at::Tensor& t, ReduceOp op) { return p_.host.all_reduce(t, op); };
  }

  Parts p_;
  const TrainerConfig& config_;
  std::int64_t max_batches_;
  ValidationSchedule schedule_;
  std::chrono::steady_clock::time_point fit_start_{};
  EpochSummary* summary_ = nullptr;
  std::int64_t last_finite_step_ = -1;  // the step of the last loss read and found finite
};

}  // namespace fulgur::loops
