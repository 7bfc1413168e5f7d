#pragma once
// The half of the fit loop that depends on neither the module's type, nor the loaders', nor the
// policies: the progress counters, what was logged, when the run is done, the checkpoints asked
// for, and the loop's part of a checkpoint and of a resume. It is compiled once, in libfulgur
// (src/loops/fit_state.cpp), rather than in every translation unit that calls fit: FitLoop (fit.hpp)
// derives from it and keeps only what must see the module, the data or the Fabric-level verbs.
//
// The paths that run a few times a fit (writing a checkpoint, resuming, a preemption or a Ctrl-C,
// shutting down) live here too: they reach the trainer through detail::HostLink and the loop's
// templates through detail::LoopLink (loops/boundary.hpp, the one boundary). Compiling those paths
// in every file that calls fit was most of fit's compile time (docs/benchmarks.md, "Compile-time
// cost"). Nothing per step goes through them.
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
#include "fulgur/loops/boundary.hpp"
#include "fulgur/loops/training_epoch.hpp"
#include "fulgur/metrics.hpp"
#include "fulgur/optimization.hpp"
#include "fulgur/results.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/step_context.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur::loops {

class FitState {
 public:
  FitState(const FitState&) = delete;
  FitState& operator=(const FitState&) = delete;

  /// Printed by global rank 0; kept in FitResult on every rank.
  void warn(std::string text);

  // ---- checkpoints asked for (a callback's, the module's, trainer.save_checkpoint) ----------------
  /// Writes now between batches, or once the batch or epoch under way is over, so that every
  /// checkpoint holds a state fit continues from exactly: after batch k of epoch e, or before epoch
  /// e + 1. Every rank calls it; the strategy decides who writes.
  void request_save(const std::string& path, bool weights_only);
  /// Deletes a checkpoint (ModelCheckpoint's worse files), never before a save asked for before it.
  void request_removal(const std::string& path);
  /// Whether saves or removals wait for the batch or epoch under way to end.
  bool checkpoints_requested() const { return !saves_.empty() || !removals_.empty(); }
  /// What waited, in the order asked.
  void write_requested_checkpoints();

  // ---- OnExceptionCheckpoint: the last completed optimizer step ----------------------------------
  /// From now on the loop remembers where it was after each completed optimizer step (its counters,
  /// random state and loader position; no weights): a few small copies per step, none when off.
  void track_completed_steps() { track_completed_steps_ = true; }
  /// Whether it does (the loop builds what a mark needs only then: nothing per step without the callback).
  bool tracks_completed_steps() const { return track_completed_steps_; }
  /// Where the loop is now is the end of an accumulation window (or an epoch's start or end).
  void mark_completed_step() {
    if (track_completed_steps_) remember_completed_step();
  }
  /// Where the loop is now is batch `batch_idx`'s training half done, after its optimizer step: its
  /// end (`pending`) is still to run, and a checkpoint of here runs it first when resumed.
  void mark_trained_batch(std::int64_t batch_idx, const PendingBatchEnd& pending) {
    if (track_completed_steps_) remember_trained_batch(batch_idx, pending);
  }
  /// On the way out of a failed fit: writes the checkpoint of the last completed optimizer step to
  /// `path` (every rank calls it; under DDP only when every rank can save the same step). Returns
  /// why none was written; empty when it was. `peers_reachable`: false when the failure was a
  /// collective's (no rank attempts another).
  std::string save_completed_step(const std::string& path, bool peers_reachable);
  /// "global_step 12 (epoch 1, after batch 3)" of the last completed step; empty before any.
  std::string completed_step_text() const;

  // ---- a callback's forward-only pass over the training data ---------------------------------------
  /// LoopLink::forward_training_pass once the fit is set up and outside a training epoch (the epoch's
  /// own iteration of the loader must not be disturbed); refused otherwise, naming `who`.
  std::int64_t forward_training_pass(const std::string& who);

 protected:
  // Out of line, both: the members' constructors and destructors are compiled once.
  FitState(const TrainerConfig& config, torch::nn::Module& module, detail::HostLink& host, detail::LoopLink& loop,
           int global_rank, int world_size);
  ~FitState();

  // ---- checkpoints asked for while a batch or an epoch's end is under way -------------------------
  /// While held, requested saves wait for write_requested_checkpoints().
  void hold_checkpoints(bool held) { checkpoints_held_ = held; }
  /// The end of a run that did not finish its epoch: saves asked for since the epoch began are
  /// written (`write`: an interruption, taken between steps) or dropped (an error), and later ones
  /// (Trainer::save_checkpoint after fit) are written at once.
  void release_checkpoints(bool write);

  /// The epoch's batches are all done; its end (on_train_epoch_end, loggers, schedulers) is still to run.
  void mark_trained_epoch(const EpochSummary& summary) {
    if (track_completed_steps_) remember_trained_epoch(summary);
  }

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
  /// Under DDP: every rank takes a stop any rank asked for (FitProgress::stop_agreed); an epoch's end.
  void agree_on_stop();
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
  /// Where the loop was after a completed optimizer step (mark_completed_step).
  struct CompletedStep {
    CompletedStep();  // out of line: clang cannot default-construct a nested class with member initializers here
    FitProgress progress;
    std::int64_t skipped_total = 0;
    std::optional<StateDict> loader;  // the training loader's own state, if it keeps one
    StateDict random;                 // this rank's random state
    // A batch's training half or an epoch's batches done (mark_trained_batch / _epoch): what is still
    // to run, and where it calls hooks that may change them, what the epoch logged and the callbacks'
    // states before (copies, taken at validations and epoch ends only).
    std::optional<PendingBatchEnd> pending;
    std::optional<c10::impl::GenericList> metrics;
    std::optional<StateDict> callbacks;
    bool passed = false;  // the run went past the point where the pending part changes state for good
  };
  /// `at`: the checkpoint of that completed step instead (its position and random state; the weights,
  /// optimizers and callbacks as they are now, which the caller checked have not moved on since).
  /// for_failure: OnExceptionCheckpoint's, whose callback states stay from before the hooks it resumes
  /// into, file records included (a save they asked for may not have been written).
  StateDict checkpoint_state(bool weights_only, const CompletedStep* at = nullptr, bool for_failure = false);
  void write_checkpoint(const std::string& path, bool weights_only) { host_link_.save(path, checkpoint_state(weights_only)); }
  void remove_checkpoint(const std::string& path);
  /// Where the run is: after batch k of epoch e (mid-epoch: what was logged so far goes too, and the
  /// loader's own state), or before an epoch. An epoch cut short by a stop keeps its mid-epoch
  /// position (frozen then).
  StateDict current_loop_state();
  /// A stop cut the epoch short: checkpoints written from here on (at its end, on_train_end, after fit)
  /// resume inside it, after its last batch, with the callbacks as they were there. The end that runs
  /// now (on_train_epoch_end: EarlyStopping's check of a stale score, ModelCheckpoint's save) then runs
  /// once, at the epoch's real end, as in a run that never stopped.
  void freeze_position();

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
  detail::HostLink& host_link_;  // the trainer, through the library boundary
  detail::LoopLink& loop_link_;  // the FitLoop this is part of
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
  std::optional<StateDict> frozen_callbacks_;  // from before the epoch end of a stop inside the epoch
  std::string checkpoint_path_;
  bool resuming_ = false, loader_restored_ = false;
  std::int64_t resume_batch_ = 0;
  std::int64_t resume_accumulate_ = 1;  // the factor in force when the checkpoint was taken
  std::int64_t resume_epoch_batches_ = -1;  // the batches of the epoch it was taken in (-1: unknown, or at its end)
  c10::impl::GenericList resume_metrics_{c10::AnyType::get()};
  c10::impl::GenericDict resume_views_{c10::StringType::get(), c10::AnyType::get()};
  StateDict resume_rank_;
  std::optional<PendingBatchEnd> resume_pending_;  // the resumed checkpoint's pending batch or epoch end

 private:
  bool checkpoints_held_ = false;
  std::vector<std::pair<std::string, bool>> saves_;  // (path, weights_only), in the order asked
  std::vector<std::string> removals_;
  std::string write_preemption_checkpoint();
  StateDict loop_state(const FitProgress& progress, std::int64_t skipped_total, std::optional<StateDict> loader) const;
  StateDict rank_states(const CompletedStep* at, const StateDict& loop);
  void warn_unreachable_minimum(const char* minimum, std::int64_t at_least, const char* maximum, std::int64_t at_most,
                                bool maximum_set);
  /// Callback states taken earlier, with those of the callbacks that record their files as they are now.
  StateDict with_current_file_records(const StateDict& earlier);
  void remember_completed_step();
  void remember_trained_batch(std::int64_t batch_idx, const PendingBatchEnd& pending);
  void remember_trained_epoch(const EpochSummary& summary);
  /// Copies of what the pending part's hooks may change (what this epoch logged, the callbacks' states).
  void remember_hook_state();
  bool track_completed_steps_ = false;
  bool finished_ = false;  // finish() ran: the loaders may be gone
  std::optional<CompletedStep> completed_step_;
  std::string checkpoint_name() const { return "checkpoint '" + checkpoint_path_ + "'"; }
  void warn_unknown_callbacks(const std::vector<std::string>& keys);
  void restore_module(const StateDict& c);
  void restore_optimizers(const StateDict& c);
  StateDict restore_progress(const StateDict& c);
};

}  // namespace fulgur::loops
