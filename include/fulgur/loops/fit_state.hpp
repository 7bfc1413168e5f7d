#pragma once
// The half of the fit loop that depends on neither the module's type, nor the loaders', nor the
// policies: the progress counters, what was logged, when the run is done, and the loop's part of a
// checkpoint and of a resume. It is compiled once, in libfulgur (src/loops/fit_state.cpp), rather
// than in every translation unit that calls fit: FitLoop (fit.hpp) derives from it and keeps only
// what must see the module, the data or the Fabric-level verbs.
//
// The paths that run a few times a fit (writing a checkpoint, resuming, a preemption or a Ctrl-C,
// shutting down) live here too: they reach the Fabric, the callbacks, the hooks and the loader
// through the virtual functions below, which FitLoop implements in a line each. A virtual call
// there costs nothing that matters; compiling those paths in every file that calls fit was most of
// fit's compile time (docs/benchmarks.md, "Compile-time cost"). Nothing per step goes through them.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/loggers/hyperparameters.hpp"
#include "fulgur/loops/checkpointing.hpp"
#include "fulgur/loops/training_epoch.hpp"
#include "fulgur/metrics.hpp"
#include "fulgur/optimization.hpp"
#include "fulgur/results.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/step_context.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur::loops {

class FitState : public detail::FitCheckpointing {
 protected:
  FitState(const TrainerConfig& config, torch::nn::Module& module, detail::TrainerViewOps view_ops, int global_rank,
           int world_size)
      : config_(config),
        module_(module),
        view_(ctx_, config, module, view_ops),
        global_rank_(global_rank),
        world_size_(world_size) {}
  ~FitState() override;  // out of line: the members' destructors are compiled once

  /// Printed by global rank 0; kept in FitResult on every rank.
  void warn(std::string text);

  // ---- what the one-off paths need of FitLoop (the Fabric, the callbacks, the hooks, the loader) --
  virtual StateDict load(const std::string& path) = 0;
  /// Every rank takes part; global rank 0 writes.
  virtual void save(const std::string& path, const StateDict& state) = 0;
  virtual std::string resolve_path(const std::string& path) = 0;
  virtual std::string broadcast_text(const std::string& text) = 0;
  /// The tensor, moved to the device, gathered over the ranks (world_size > 1 only).
  virtual at::Tensor all_gather(const at::Tensor& tensor) = 0;
  /// Whether any rank decided so (world_size > 1 only).
  virtual bool any_rank(bool decision) = 0;
  virtual StateDict module_state() = 0;
  virtual StateDict optimizer_state(torch::optim::Optimizer& optimizer) = 0;
  virtual void load_optimizer_state(torch::optim::Optimizer& optimizer, const StateDict& state) = 0;
  /// Strict: every weight of the module.
  virtual void load_module_state(const StateDict& weights) = 0;
  virtual StateDict precision_state() = 0;
  virtual void load_precision_state(const StateDict& state) = 0;
  virtual std::string combination_name() const = 0;
  /// The module's hparams(), if it has them.
  virtual std::optional<c10::impl::GenericDict> module_hyperparameters() = 0;
  virtual StateDict callback_states() = 0;
  /// Returns the keys no callback claimed.
  virtual std::vector<std::string> load_callback_states(const StateDict& states) = 0;
  virtual StateDict logger_versions() = 0;
  virtual void resume_loggers(const StateDict& versions, std::int64_t step) = 0;
  /// The training loader's own state, if it keeps one.
  virtual std::optional<StateDict> loader_state() = 0;
  /// Whether the training loader took the state (false: it keeps none).
  virtual bool load_loader_state(const StateDict& state) = 0;
  virtual void on_save_checkpoint(StateDict& checkpoint) = 0;
  virtual void on_load_checkpoint(const StateDict& checkpoint) = 0;
  /// on_exception(e), the loggers finalized with `status`, then teardown("fit") if `teardown`.
  virtual void shut_down(const std::exception& e, const char* status, bool teardown) = 0;

  // ---- the run ----------------------------------------------------------------------------------
  /// configure_optimizers' answer fits the optimization mode and the config (Lightning's checks).
  void check_optimizers(bool automatic) const;
  /// Where validation goes inside an epoch (val_check_interval), once max_batches_ is known.
  void plan_validation_interval();
  /// The epoch limit: max_epochs, else Lightning's default of 1000 unless max_steps or max_time
  /// bounds the run (-1: none).
  std::int64_t max_epochs() const;
  /// Whether the run ends here; sets the stop reason.
  bool done();
  /// An epoch's end, after its metrics were published: counters, summary, the epoch-end schedulers.
  void close_epoch(EpochSummary& summary, bool completed, Schedulers& schedulers);
  /// FitResult of the run (the metrics read to the host once).
  FitResult finish();

  // ---- interruptions ---------------------------------------------------------------------------
  /// Ctrl-C or a preemption signal outside the training batches (which check it themselves), agreed
  /// on by every rank: throws Interrupted or Preempted ("... <where> (epoch e, global_step s)").
  bool stop_if_interrupted(const char* where, bool training_done = false);
  /// After the last epoch a Ctrl-C still ends fit as interrupted; a preemption signal does not
  /// matter any more: the run is complete, nothing needs saving.
  void stop_if_finished_run_interrupted();
  /// A preemption: the preemption checkpoint, the shutdown hooks, FitResult::preempted.
  void end_preempted(const Preempted& e);
  /// Ctrl-C: the shutdown hooks, FitResult::interrupted.
  void end_interrupted(const Interrupted& e);

  // ---- checkpoints ------------------------------------------------------------------------------
  /// What fit needs to go on exactly from here: Lightning's .ckpt keys, plus each rank's random
  /// state and, inside an accumulation window, its gradients. Every rank calls it (the per-rank
  /// parts are gathered); global rank 0 writes.
  StateDict checkpoint_state(bool weights_only);
  void write_checkpoint(const std::string& path, bool weights_only) { save(path, checkpoint_state(weights_only)); }
  void remove_checkpoint(const std::string& path);
  /// Where the run is: after batch k of epoch e (mid-epoch: what was logged so far goes too, and the
  /// loader's own state), or before an epoch. An epoch cut short by a stop keeps its mid-epoch
  /// position (frozen then).
  StateDict current_loop_state();

  // ---- resume -----------------------------------------------------------------------------------
  /// The checkpoint fit resumes from (FitOptions::ckpt_path), read and checked before any hook
  /// runs: a full training state (not weights only) written by as many processes as this run has.
  /// Empty without one. The loggers go on in the checkpoint's version folders.
  StateDict read_checkpoint(const std::string& path);
  /// Everything but the parts that wait for their moment (random state, what this epoch logged).
  void restore(const StateDict& c);
  void restore_views(c10::Device device);
  /// At the point the checkpoint was taken: this epoch's logged values and the pending gradients.
  void restore_epoch_position();
  void restore_random_state();
  static c10::impl::GenericDict hyperparameters(const Hyperparameters& hparams);

  const TrainerConfig& config_;
  torch::nn::Module& module_;
  StepContext ctx_;
  TrainerView view_;
  const int global_rank_, world_size_;
  std::vector<OptimizerConfig> optimizers_;
  FitProgress progress_;
  detail::MetricCollection train_metrics_{/*training=*/true};
  detail::MetricViews views_;
  std::int64_t max_batches_ = -1;
  ValidationSchedule schedule_;
  std::int64_t skipped_total_ = 0;
  std::vector<std::string> warnings_;
  FitResult result_;
  std::optional<StateDict> frozen_loop_;
  std::string checkpoint_path_;
  bool resuming_ = false, loader_restored_ = false;
  std::int64_t resume_batch_ = 0;
  c10::impl::GenericList resume_metrics_{c10::AnyType::get()};
  c10::impl::GenericDict resume_views_{c10::StringType::get(), c10::AnyType::get()};
  StateDict resume_rank_;

 private:
  std::string write_preemption_checkpoint();
  StateDict loop_state(std::optional<StateDict> loader) const;
  StateDict rank_states();
  std::string checkpoint_name() const { return "checkpoint '" + checkpoint_path_ + "'"; }
  void warn_unknown_callbacks(const std::vector<std::string>& keys);
  void restore_module(const StateDict& c);
  void restore_optimizers(const StateDict& c);
  StateDict restore_progress(const StateDict& c);
};

}  // namespace fulgur::loops
