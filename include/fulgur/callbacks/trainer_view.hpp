#pragma once
// TrainerView: what a callback sees of the trainer (Lightning passes `trainer` to every callback
// hook). One concrete type for every Trainer<A, S, P, ...>, so that callbacks need not be
// templates and can be compiled once (the shipped ones live in src/callbacks). The loops keep it
// current; reading it costs nothing, except the metric values, which are tensors until read. What
// it asks of the trainer goes through the library boundary (loops/boundary.hpp: HostLink).
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/errors.hpp"
#include "fulgur/loops/boundary.hpp"
#include "fulgur/metrics.hpp"
#include "fulgur/optimization.hpp"
#include "fulgur/results.hpp"
#include "fulgur/stage.hpp"
#include "fulgur/step_context.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur {

class TrainerView {
 public:
  /// `host`: the trainer (null: a view of no trainer, whose collectives are the identity).
  TrainerView(StepContext& ctx, const TrainerConfig& config, torch::nn::Module& module, detail::HostLink* host)
      : ctx_(&ctx), config_(&config), module_(&module), host_(host) {}

  // ---- where the run is ----------------------------------------------------------------------------
  Stage stage() const { return ctx_->stage; }
  std::int64_t current_epoch() const { return ctx_->current_epoch; }
  std::int64_t global_step() const { return ctx_->global_step; }
  std::int64_t batch_idx() const { return ctx_->batch_idx; }
  bool sanity_checking() const { return ctx_->sanity_checking; }
  int global_rank() const { return ctx_->global_rank; }
  int world_size() const { return ctx_->world_size; }
  bool is_global_zero() const { return ctx_->global_rank == 0; }
  const TrainerConfig& config() const { return *config_; }
  /// Changes the Trainer's accumulate_grad_batches from here on (GradientAccumulationScheduler, at an
  /// epoch's start, as Lightning's callback sets trainer.accumulate_grad_batches). The loops read
  /// the factor at each batch, so the change costs nothing per step; checkpoints record the factor
  /// in force. Refuses a factor below 1.
  void set_accumulate_grad_batches(std::int64_t factor);
  /// The epoch limit fit runs to (-1: none; max_steps or max_time bound the run).
  std::int64_t max_epochs() const { return max_epochs_; }
  /// Training batches per epoch (-1: the loader cannot tell).
  std::int64_t num_training_batches() const { return num_training_batches_; }
  /// Whether fit validates (validation data with batches to run).
  bool has_validation() const { return has_validation_; }
  /// Batches of the evaluation run under way (validation inside fit, validate, test, predict; -1: unknown).
  std::int64_t num_evaluation_batches() const { return num_evaluation_batches_; }
  /// The step loggers receive: optimizer steps that ran or were skipped, not counting
  /// accumulation micro-batches (Lightning's _batches_that_stepped).
  std::int64_t logging_step() const { return logging_step_; }
  /// When fit started (its set-up hooks excluded).
  std::chrono::steady_clock::time_point fit_start() const { return fit_start_; }
  /// The training loss as last read on the host (at the log cadence, an epoch's end); none yet.
  std::optional<double> last_train_loss() const { return last_train_loss_; }

  // ---- stopping ----------------------------------------------------------------------------------
  /// Lightning's trainer.should_stop: fit ends after this batch (or epoch end), once min_epochs and
  /// min_steps are met.
  bool should_stop() const { return ctx_->should_stop; }
  /// Asks fit to stop, with the reason FitResult::stop_reason reports (the first one given wins).
  void request_stop(std::string reason) {
    ctx_->should_stop = true;
    if (stop_reason_ != nullptr && stop_reason_->empty()) *stop_reason_ = std::move(reason);
  }

  // ---- metrics -----------------------------------------------------------------------------------
  /// Lightning's trainer.callback_metrics / logged_metrics / progress_bar_metrics, as tensors on the
  /// training device (reading one is a host sync).
  const detail::TensorMap& callback_metrics() const { return views_ != nullptr ? views_->callback : empty_; }
  const detail::TensorMap& logged_metrics() const { return views_ != nullptr ? views_->logged : empty_; }
  const detail::TensorMap& progress_bar_metrics() const { return views_ != nullptr ? views_->progress_bar : empty_; }
  /// One callback metric on the host; none when nothing of that name was logged.
  std::optional<double> metric(std::string_view name) const {
    return callback_metrics().item(name);
  }
  /// The names of the callback metrics, for messages ("`val_loss`, `train_loss`").
  std::string metric_names() const {
    std::string names;
    for (const std::string& name : callback_metrics().names()) names += (names.empty() ? "`" : ", `") + name + "`";
    return names.empty() ? "(none)" : names;
  }
  /// Logs from a callback hook, as the module's ctx.log (Lightning's pl_module.log in a callback).
  void log(std::string_view name, const at::Tensor& value, const LogOptions& options = {}) { ctx_->log(name, value, options); }
  void log(std::string_view name, double value, const LogOptions& options = {}) { ctx_->log(name, value, options); }

  // ---- the module, the optimizers, the processes, the loggers -------------------------------------
  torch::nn::Module& module() const { return *module_; }
  /// What configure_optimizers returned (empty outside fit).
  std::span<OptimizerConfig> optimizers() const { return optimizers_; }
  /// all: every rank decided true; otherwise: any rank did (one collective under DDP).
  bool reduce_boolean_decision(bool decision, bool all = true) {
    return host_ != nullptr ? host_->reduce_boolean_decision(decision, all) : decision;
  }
  /// The tensor from every rank, on the training device, stacked in rank order: shape (world_size, ...)
  /// (Lightning's all_gather). In one process, as Lightning's, the tensor as it is; a view of no
  /// trainer: the tensor with a leading 1.
  at::Tensor all_gather(const at::Tensor& tensor) {
    return host_ != nullptr ? host_->all_gather(tensor) : tensor.unsqueeze(0);
  }
  /// One line on global rank 0.
  void print(std::string_view line) const {
    if (is_global_zero()) std::cout << line << std::endl;
  }
  /// A warning: printed on global rank 0 and, during fit, kept in FitResult::warnings.
  void warn(std::string text);
  bool has_loggers() const { return host_ != nullptr && host_->has_loggers(); }
  /// Sends metrics to every logger (global rank 0 writes), at `step` (usually logging_step()).
  void log_metrics(const Metrics& metrics, std::int64_t step) {
    if (has_loggers()) host_->log_metrics(metrics, step);
  }
  /// The Trainer's policies, "<accelerator>/<strategy>/<precision>" in their names ("cpu/single_device/bf16-mixed");
  /// empty for a view of no trainer.
  std::string combination_name() const { return host_ != nullptr ? host_->combination_name() : std::string(); }
  /// The first logger's directory (default_root_dir without loggers).
  std::string log_dir() const { return has_loggers() ? host_->log_dir() : config_->default_root_dir; }

  // ---- checkpoints -------------------------------------------------------------------------------
  /// Lightning's trainer.save_checkpoint: every rank calls it, global rank 0 writes (atomically). In
  /// a batch or at an epoch's end the file is written once that batch or epoch is over, so that it
  /// holds a state fit continues from exactly (ckpt_path). A relative path is under default_root_dir.
  void save_checkpoint(const std::string& path, bool weights_only = false);
  /// Deletes a checkpoint (global rank 0; with what its strategy's format keeps beside it), after
  /// the saves asked for before it are written.
  void remove_checkpoint(const std::string& path);
  /// Global rank 0's text on every rank (a file name all ranks agree on).
  std::string broadcast(const std::string& text) { return host_ != nullptr ? host_->broadcast(text) : text; }
  /// OnExceptionCheckpoint's: the fit under way remembers the position after each completed
  /// optimizer step (no weights; a few small copies per step). Nothing outside fit.
  void track_completed_steps();
  /// On the way out of a failed fit, every rank: the checkpoint of the last completed optimizer
  /// step at `path`, which fit resumes exactly. Returns why none was written (empty: written).
  /// `peers_reachable`: false when the failure was a collective's (then no rank tries another).
  std::string save_completed_step(const std::string& path, bool peers_reachable);
  /// "global_step 12 (epoch 1, after batch 3)": the step save_completed_step writes.
  std::string completed_step_text() const;

  // ---- passes over the data ------------------------------------------------------------------------
  /// A forward-only pass of the module's training_step over the training loader of the fit under
  /// way: this rank's batches (limit_train_batches of them), prepared as in training (transfer hooks,
  /// device, precision, autocast), without gradients, backward or optimizer steps; what it logs is
  /// dropped; the module's mode is left as the caller set it. For on_train_start, on_train_end,
  /// on_fit_end (not inside a training epoch). Returns how many batches ran. StochasticWeightAveraging
  /// recomputes batch-norm statistics with it. `who` names the caller in errors.
  std::int64_t forward_training_pass(const std::string& who);

  // ---- set by the loops ----------------------------------------------------------------------------
  void attach_metrics(const detail::MetricViews* views) { views_ = views; }
  void attach_optimizers(std::span<OptimizerConfig> optimizers) { optimizers_ = optimizers; }
  void attach_stop_reason(std::string* reason) { stop_reason_ = reason; }
  void set_max_epochs(std::int64_t n) { max_epochs_ = n; }
  void set_num_training_batches(std::int64_t n) { num_training_batches_ = n; }
  void set_has_validation(bool validates) { has_validation_ = validates; }
  void set_num_evaluation_batches(std::int64_t n) { num_evaluation_batches_ = n; }
  void set_logging_step(std::int64_t n) { logging_step_ = n; }
  void set_fit_start(std::chrono::steady_clock::time_point t) { fit_start_ = t; }
  void set_last_train_loss(double loss) { last_train_loss_ = loss; }

 private:
  StepContext* ctx_;
  const TrainerConfig* config_;
  torch::nn::Module* module_;
  detail::HostLink* host_;
  const detail::MetricViews* views_ = nullptr;
  std::span<OptimizerConfig> optimizers_{};
  std::string* stop_reason_ = nullptr;
  std::int64_t max_epochs_ = -1;
  std::int64_t num_training_batches_ = -1;
  bool has_validation_ = false;
  std::int64_t num_evaluation_batches_ = -1;
  std::int64_t logging_step_ = 0;
  std::chrono::steady_clock::time_point fit_start_{};
  std::optional<double> last_train_loss_{};
  inline static const detail::TensorMap empty_{};
};

}  // namespace fulgur
