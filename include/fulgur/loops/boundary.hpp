#pragma once
// The one boundary between fulgur's templates and libfulgur.
//
// A Trainer<A, S, P, Callbacks...> and the loops it runs are templates: every step is a direct,
// inlinable call into the policies and hooks. What runs rarely and does not depend on the user's
// types is compiled once, in libfulgur (src/): what callbacks see of the trainer (TrainerView),
// the manual-optimization calls a training_step makes (StepContext), and the one-off paths of fit —
// writing a checkpoint, resuming, a preemption, a Ctrl-C, the shutdown (loops::FitState). When that
// compiled code needs something only the templates know (a policy, the callbacks, the module's
// hooks, the loader), it asks through one of two interfaces, and only through them:
//
//   HostLink  the Trainer (the loops' host), type-erased: the collectives, the checkpoint files,
//             the states of module, optimizer and precision (each through its policy), the
//             callbacks' and loggers' states, and the fit under way. loops::LoopServices<Host>
//             implements it, once per Trainer type.
//   LoopLink  the fit under way, type-erased: the module's checkpoint and shutdown hooks, the
//             training loader's position, and manual optimization (its ManualOptimizationLink
//             part, which a hand-written loop may implement alone). loops::FitLoop implements it.
//
// One mechanism: abstract classes the templates implement (`final`, so a call from a template
// that knows the type is direct) and compiled code calls. Virtual functions rather than tables of
// function pointers: the compiler checks every override's signature, there is no void* to cast,
// and a missing member is an error where the class is defined.
//
// What crosses, and how often: a collective decision per epoch (EarlyStopping), metrics at the log
// cadence, the states when a checkpoint is written or read, a callback's forward-only pass (once a
// fit). Nothing per training step, except the calls a training_step under manual optimization makes
// itself (manual_backward, optimizer.step(), clip_gradients): one indirect call each, as Lightning's
// own are. Automatic optimization, the precisions, the strategies and the hooks never cross it
// (bench_step: within 2 % of a hand loop).
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "fulgur/results.hpp"
#include "fulgur/state_dict.hpp"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace fulgur {

struct ClipGradients;

namespace loops {
class FitState;
}

namespace detail {

/// The Trainer, as compiled code sees it (implemented by loops::LoopServices<Host>).
class HostLink {
 public:
  // ---- processes -------------------------------------------------------------------------------
  /// all: every rank decided true; otherwise: any rank did.
  virtual bool reduce_boolean_decision(bool decision, bool all) = 0;
  /// Global rank 0's text on every rank.
  virtual std::string broadcast(const std::string& text) = 0;
  /// The tensor, moved to the training device, gathered over the ranks (shape (world_size, ...)).
  virtual at::Tensor all_gather(const at::Tensor& tensor) = 0;

  // ---- checkpoint files, in the strategy's format --------------------------------------------------
  /// A path as the Fabric verbs take it: a relative one under TrainerConfig::default_root_dir.
  virtual std::string resolve_path(const std::string& path) = 0;
  /// Every rank takes part; the strategy decides who writes what.
  virtual void save(const std::string& path, const StateDict& state) = 0;
  virtual StateDict load(const std::string& path) = 0;
  /// Deletes a checkpoint and whatever its format keeps beside it.
  virtual void remove_checkpoint(const std::string& path) = 0;

  // ---- states, each through its policy ---------------------------------------------------------
  virtual StateDict module_state(torch::nn::Module& module) = 0;
  virtual void load_module_state(torch::nn::Module& module, const StateDict& state, bool strict) = 0;
  virtual StateDict optimizer_state(torch::optim::Optimizer& optimizer) = 0;
  virtual void load_optimizer_state(torch::optim::Optimizer& optimizer, const StateDict& state) = 0;
  virtual StateDict precision_state() = 0;
  virtual void load_precision_state(const StateDict& state) = 0;
  /// "cpu/single_device/32-true".
  virtual std::string combination_name() const = 0;

  // ---- callbacks and loggers -------------------------------------------------------------------
  virtual bool has_loggers() const = 0;
  /// To every logger (global rank 0 writes), at `step`.
  virtual void log_metrics(const Metrics& metrics, std::int64_t step) = 0;
  /// The first logger's directory (empty without loggers).
  virtual std::string log_dir() = 0;
  /// Each stateful callback's state under its state key (Lightning's checkpoint["callbacks"]).
  virtual StateDict callback_states() = 0;
  /// The states of the callbacks whose state records the files they wrote (records_files_callback:
  /// ModelCheckpoint): the checkpoints written after a stop inside an epoch carry them as they are.
  virtual StateDict callback_file_records() = 0;
  /// Returns the keys no callback claimed.
  virtual std::vector<std::string> load_callback_states(const StateDict& states) = 0;
  virtual StateDict logger_versions() = 0;
  virtual void resume_loggers(const StateDict& versions, std::int64_t step) = 0;

  // ---- the fit -----------------------------------------------------------------------------------
  /// The fit under way, or the last one (for save_checkpoint after fit); null before any fit.
  virtual loops::FitState* fit() = 0;

 protected:
  HostLink() = default;
  HostLink(const HostLink&) = default;
  HostLink& operator=(const HostLink&) = default;
  ~HostLink() = default;
};

/// What a training_step under manual optimization calls through StepContext: the fit under way
/// (LoopLink below), or a hand-written loop that runs a module's manual training_step.
class ManualOptimizationLink {
 public:
  /// Backward through the strategy and precision, with on_before_backward/on_after_backward.
  virtual void manual_backward(const at::Tensor& loss) = 0;
  /// on_before_optimizer_step, then the step through strategy and precision; false when skipped.
  virtual bool manual_step(std::size_t optimizer) = 0;
  virtual at::Tensor manual_clip(std::size_t optimizer, const ClipGradients& clip) = 0;

 protected:
  ManualOptimizationLink() = default;
  ManualOptimizationLink(const ManualOptimizationLink&) = default;
  ManualOptimizationLink& operator=(const ManualOptimizationLink&) = default;
  ~ManualOptimizationLink() = default;
};

/// The fit under way, as compiled code sees it (implemented by loops::FitLoop).
class LoopLink : public ManualOptimizationLink {
 public:
  // ---- the module's and the callbacks' hooks around checkpoints and the shutdown ------------------
  /// The module's hparams(), if it has them.
  virtual std::optional<c10::impl::GenericDict> module_hyperparameters() = 0;
  virtual void on_save_checkpoint(StateDict& checkpoint) = 0;
  virtual void on_load_checkpoint(const StateDict& checkpoint) = 0;
  /// on_exception(e), the loggers finalized with `status`, then teardown("fit") if `teardown`.
  virtual void shut_down(const std::exception& e, const char* status, bool teardown) = 0;

  // ---- the training loader's own position --------------------------------------------------------
  virtual std::optional<StateDict> loader_state() = 0;
  /// Whether the loader took the state (false: it keeps none).
  virtual bool load_loader_state(const StateDict& state) = 0;

  // ---- a pass a callback asks for (TrainerView::forward_training_pass), a few times a fit at most ----
  /// training_step over this rank's training batches (limit_train_batches of them), each prepared as
  /// in training (transfer hooks, device, precision) and run in the forward context, without
  /// gradients, backward or optimizer steps (a manual training_step's calls are skipped); what it
  /// logs is dropped. The module's mode is the caller's. Returns how many batches ran.
  virtual std::int64_t forward_training_pass() = 0;

 protected:
  LoopLink() = default;
  LoopLink(const LoopLink&) = default;
  LoopLink& operator=(const LoopLink&) = default;
  ~LoopLink() = default;
};

}  // namespace detail
}  // namespace fulgur
