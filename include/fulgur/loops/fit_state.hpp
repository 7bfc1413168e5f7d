#pragma once
// The half of the fit loop that depends on neither the module's type, nor the loaders', nor the
// policies: the progress counters, what was logged, when the run is done, and the loop's part of a
// checkpoint and of a resume. It is compiled once, in libfulgur (src/loops/fit_state.cpp), rather
// than in every translation unit that calls fit: FitLoop (fit.hpp) derives from it and keeps only
// what must see the module, the data or the Fabric-level verbs.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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
  explicit FitState(const TrainerConfig& config) : config_(config) {}
  ~FitState() override;  // out of line: the members' destructors are compiled once

  /// Whether this process prints warnings (global rank 0); they are kept in FitResult on every rank.
  virtual bool prints_warnings() const = 0;
  void warn(std::string text);

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

  // ---- checkpoints ------------------------------------------------------------------------------
  /// Where the run is: after batch k of epoch e (mid-epoch: what was logged so far goes too), or
  /// before an epoch; `loader` is the training loader's own state, if it has one. An epoch cut short
  /// by a stop keeps its mid-epoch position (frozen then).
  StateDict loop_state(std::optional<StateDict> loader = std::nullopt) const;
  /// The keys every checkpoint has (Lightning's epoch, global_step, version, state_dict, loops).
  StateDict checkpoint_base(const torch::nn::Module& module, const StateDict& loop) const;
  /// What a full (not weights-only) checkpoint adds: the callbacks' states, each optimizer's state
  /// (through `optimizer_state`, the Fabric's) and its scheduler's, the precision's.
  void add_training_state(StateDict& c, const StateDict& callbacks,
                          const std::function<StateDict(torch::optim::Optimizer&)>& optimizer_state,
                          const StateDict& precision) const;
  /// Each rank's random state and pending gradients, one row per rank (all_gather: the Fabric's,
  /// for a world of more than one).
  StateDict rank_states(torch::nn::Module& module, int world_size,
                        const std::function<at::Tensor(const at::Tensor&)>& all_gather) const;
  static c10::impl::GenericDict hyperparameters(const Hyperparameters& hparams);

  // ---- resume -----------------------------------------------------------------------------------
  /// The checkpoint at `path`, checked before any hook runs: a full training state (not weights
  /// only) written by as many processes as this run has.
  StateDict accept_checkpoint(StateDict state, const std::string& path, int world_size);
  /// "checkpoint '<path>'", for errors.
  std::string checkpoint_name() const { return "checkpoint '" + checkpoint_path_ + "'"; }
  /// The logger versions and the logging step a resumed run writes on from (none: written before
  /// fulgur kept them).
  std::optional<std::pair<StateDict, std::int64_t>> logger_resume_state(const StateDict& c) const;
  /// Warns of each callback state the checkpoint holds that no callback of this Trainer claimed.
  void warn_unknown_callbacks(const std::vector<std::string>& keys);
  /// Loads the checkpoint's weights through `load` (the Fabric's, strict); a mismatch is a
  /// CheckpointError naming the file and the module.
  void restore_module(const torch::nn::Module& module, const StateDict& c, const std::function<void(const StateDict&)>& load);
  /// Loads each optimizer's state (through `load`, the Fabric's) and its scheduler's.
  void restore_optimizers(const StateDict& c, const std::function<void(torch::optim::Optimizer&, const StateDict&)>& load);
  /// The fit_loop section: the progress counters and what waits for its moment (this epoch's logged
  /// values, the views, this rank's random state and gradients). Returns the section (the loader's
  /// state is in it).
  StateDict restore_progress(const StateDict& c, int global_rank);
  void restore_views(c10::Device device);
  /// At the point the checkpoint was taken: this epoch's logged values and the pending gradients.
  void restore_epoch_position(torch::nn::Module& module);
  void restore_random_state();

  const TrainerConfig& config_;
  StepContext ctx_;
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
};

}  // namespace fulgur::loops
