#include "fulgur/callbacks/early_stopping.hpp"

#include <cmath>
#include <cstdio>
#include <iostream>

#include "fulgur/detail/describe.hpp"
#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"

namespace fulgur {
namespace {

std::string fixed3(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", v);
  return text;
}
using detail::number_text;

}  // namespace

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  if (options_.monitor.empty())
    throw MisconfigurationError("EarlyStopping needs a metric to monitor: " +
                                detail::spelled("EarlyStopping{{.monitor = \"val_loss\"}}",
                                                "init_args: {monitor: val_loss}") + ".");
  if (options_.patience < 0)
    throw MisconfigurationError("EarlyStopping's patience must be >= 0, got " + std::to_string(options_.patience) + ".");
  // Lightning's sign convention: an improvement must exceed |min_delta| in the mode's direction.
  options_.min_delta = std::abs(options_.min_delta) * (options_.mode == MonitorMode::max ? 1.0 : -1.0);
  best_score_ = options_.mode == MonitorMode::min ? std::numeric_limits<double>::infinity()
                                                  : -std::numeric_limits<double>::infinity();
}

void EarlyStopping::setup(TrainerView& trainer, Stage stage) {
  if (stage != Stage::fit) return;
  const TrainerConfig& config = trainer.config();
  // fulgur's fit is a fresh run: a second fit starts counting again.
  wait_count_ = 0;
  stopped_epoch_ = 0;
  reason_ = EarlyStoppingReason::not_stopped;
  reason_message_.clear();
  best_score_ = options_.mode == MonitorMode::min ? std::numeric_limits<double>::infinity()
                                                  : -std::numeric_limits<double>::infinity();
  check_on_train_epoch_end_ = options_.check_on_train_epoch_end.value_or(
      config.val_check_interval.is_all() && config.check_val_every_n_epoch == 1);
}

bool EarlyStopping::skip(const TrainerView& trainer) const {
  return trainer.stage() != Stage::fit || trainer.sanity_checking();
}

void EarlyStopping::on_train_epoch_end(TrainerView& trainer) {
  if (check_on_train_epoch_end_ && !skip(trainer)) check(trainer);
}

void EarlyStopping::on_validation_end(TrainerView& trainer) {
  if (!check_on_train_epoch_end_ && !skip(trainer)) check(trainer);
}

bool EarlyStopping::better(double current, double reference) const {
  return options_.mode == MonitorMode::min ? current < reference : current > reference;
}

namespace {

/// "rank 1", "ranks 0, 3": the ranks whose check asked to stop (every rank takes part); empty: none did.
std::string asking_ranks(TrainerView& trainer, bool asked) {
  if (trainer.world_size() == 1) return asked ? "rank 0" : "";
  const at::Tensor asked_on = trainer.all_gather(at::scalar_tensor(asked ? 1 : 0, at::kInt)).cpu().reshape({-1});
  std::string ranks;
  std::int64_t count = 0;
  for (std::int64_t rank = 0; rank < asked_on.numel(); ++rank)
    if (asked_on[rank].item<int>() != 0) ranks += (count++ == 0 ? "" : ", ") + std::to_string(rank);
  return count == 0 ? "" : (count == 1 ? "rank " : "ranks ") + ranks;
}

}  // namespace

void EarlyStopping::check(TrainerView& trainer) {
  const std::optional<double> value = trainer.metric(options_.monitor);
  if (!value) {
    const std::string text = "Early stopping conditioned on metric `" + options_.monitor +
                             "` which is not available. Pass in or modify your `EarlyStopping` callback to use any "
                             "of the following: " + trainer.metric_names() +
                             " (log it with ctx.log(\"" + options_.monitor + "\", value), or set strict = false)." +
                             (!trainer.has_validation() && options_.monitor.rfind("val", 0) == 0
                                  ? " fit was given no validation data: pass a validation loader, or monitor a "
                                    "training metric."
                                  : "");
    if (options_.strict) throw MisconfigurationError(text);
    if (options_.verbose && trainer.is_global_zero()) std::cerr << text << std::endl;
    return;
  }
  const double current = *value;
  bool stop = false;
  std::string reason;
  const char* order = options_.mode == MonitorMode::min ? "<" : ">";
  if (options_.check_finite && !std::isfinite(current)) {
    stop = true;
    reason_ = EarlyStoppingReason::non_finite_metric;
    reason = "Monitored metric " + options_.monitor + " = " + number_text(current) + " is not finite. Previous best value was " +
             fixed3(best_score_) + ". Signaling Trainer to stop.";
  } else if (options_.stopping_threshold && better(current, *options_.stopping_threshold)) {
    stop = true;
    reason_ = EarlyStoppingReason::stopping_threshold;
    reason = "Stopping threshold reached: " + options_.monitor + " = " + number_text(current) + " " + order + " " +
             number_text(*options_.stopping_threshold) + ". Signaling Trainer to stop.";
  } else if (options_.divergence_threshold && better(-current, -*options_.divergence_threshold)) {
    stop = true;
    reason_ = EarlyStoppingReason::divergence_threshold;
    reason = "Divergence threshold reached: " + options_.monitor + " = " + number_text(current) + " " + order + " " +
             number_text(*options_.divergence_threshold) + ". Signaling Trainer to stop.";
  } else if (better(current - options_.min_delta, best_score_)) {
    reason = std::isfinite(best_score_)
                 ? "Metric " + options_.monitor + " improved by " + fixed3(std::abs(best_score_ - current)) +
                       " >= min_delta = " + number_text(std::abs(options_.min_delta)) + ". New best score: " + fixed3(current)
                 : "Metric " + options_.monitor + " improved. New best score: " + fixed3(current);
    best_score_ = current;
    wait_count_ = 0;
  } else if (++wait_count_ >= options_.patience) {
    stop = true;
    reason_ = EarlyStoppingReason::patience_exhausted;
    reason = "Monitored metric " + options_.monitor + " did not improve in the last " + std::to_string(wait_count_) +
             " records. Best score: " + fixed3(best_score_) + ". Signaling Trainer to stop.";
  }
  // Lightning's reduce_boolean_decision(all=False): one rank that asks stops every rank. Gathered rather
  // than reduced (once a check, not per step), so that a rank that did not ask can say which one did.
  const bool asked_here = stop;
  const std::string asking = asking_ranks(trainer, stop);
  stop = !asking.empty();
  if (stop) {
    stopped_epoch_ = trainer.current_epoch();
    if (!asked_here)  // this rank's own check found no reason: say why fit stops here all the same
      reason = "Monitored metric " + options_.monitor + " asked to stop on " + asking + " (one rank suffices)" +
               (reason.empty() ? "" : "; on this rank: " + reason) + ". Signaling Trainer to stop.";
    reason_message_ = reason;
    trainer.request_stop("EarlyStopping: " + reason);
  }
  if (!reason.empty() && options_.verbose) {
    const std::string prefix = trainer.world_size() > 1 ? "[rank: " + std::to_string(trainer.global_rank()) + "] " : "";
    std::cout << prefix << reason << std::endl;
  }
}

}  // namespace fulgur

namespace fulgur {

std::string EarlyStopping::state_key() const {
  return "EarlyStopping{'monitor': '" + options_.monitor + "', 'mode': '" +
         (options_.mode == MonitorMode::min ? "min" : "max") + "'}";
}

StateDict EarlyStopping::state_dict() const {
  StateDict out;
  out.insert("wait_count", wait_count_);
  out.insert("stopped_epoch", stopped_epoch_);
  out.insert("best_score", at::scalar_tensor(best_score_, at::kDouble));  // Lightning keeps a tensor
  out.insert("patience", options_.patience);
  return out;
}

void EarlyStopping::load_state_dict(const StateDict& state) {
  for (const char* key : {"wait_count", "stopped_epoch", "best_score"})
    if (!state.contains(key))
      throw CheckpointError(std::string("fulgur: the checkpoint's ") + state_key() + " state has no '" + key + "'.");
  wait_count_ = state.at("wait_count").toInt();
  stopped_epoch_ = state.at("stopped_epoch").toInt();
  const c10::IValue best = state.at("best_score");
  best_score_ = best.isTensor() ? best.toTensor().item<double>() : best.toDouble();
}

}  // namespace fulgur
