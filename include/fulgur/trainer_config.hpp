#pragma once
// TrainerConfig: what Lightning's Trainer(...) takes, as a plain aggregate checked when the
// Trainer is built (detail::validate_config names the field and the fix). A strategy's own
// options are its own type (e.g. DDPStrategy::options_type), given to the Trainer next to this.
#include <chrono>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "fulgur/preemption.hpp"

namespace fulgur {

enum class GradientClipAlgorithm { norm, value };

/// When fit checks that the loss is finite (under every precision; a loss scaler's skipped steps
/// are counted separately, see TrainerConfig::max_consecutive_skipped_steps).
enum class FiniteLossCheck {
  at_log_steps,  ///< when the loss is read anyway (log steps, an epoch's and the run's last batch): no extra sync
  every_step,    ///< every step: stops at the first bad batch, at one host sync per step
  off,
};

/// A number of batches or a fraction of them, as Lightning's limit_*_batches and
/// val_check_interval take them: an integer is a count (10), a floating-point number a fraction
/// of the loader's length (0.25; 1.0 is all of it).
class BatchAmount {
 public:
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  constexpr BatchAmount(I count) : count_(static_cast<std::int64_t>(count)) {}
  template <std::floating_point F>
  constexpr BatchAmount(F fraction) : fraction_(static_cast<double>(fraction)) {}

  constexpr bool is_fraction() const { return fraction_.has_value(); }
  constexpr std::int64_t count() const { return count_; }
  constexpr double fraction() const { return fraction_.value_or(0.0); }
  /// No batches: 0 or 0.0 (Lightning's way to turn a stage off).
  constexpr bool is_zero() const { return fraction_ ? *fraction_ == 0.0 : count_ == 0; }
  /// All batches: the fraction 1.0.
  constexpr bool is_all() const { return fraction_ && *fraction_ == 1.0; }
  /// Lightning's rule for a loader of `length` batches: min(length, count), or int(length * fraction).
  constexpr std::int64_t of(std::int64_t length) const {
    if (fraction_) return static_cast<std::int64_t>(static_cast<double>(length) * *fraction_);
    return count_ < length ? count_ : length;
  }

 private:
  std::int64_t count_ = 0;
  std::optional<double> fraction_{};
};

/// What fit does on SIGTERM or SIGUSR1 — what SLURM (`--signal=USR1@90`), Kubernetes and
/// torchrun's agent send before they end a job: it finishes the batch under way (under DDP the ranks
/// agree at the next log step or epoch end), writes a checkpoint that resumes exactly
/// (default_root_dir/hpc_ckpt_{n}.ckpt, Lightning's name), requeues a SLURM job, and ends the process
/// with exit_code. The next run continues with FitOptions{.ckpt_path = "hpc"}, or by itself under
/// SLURM (Lightning's auto-resume).
struct PreemptionOptions {
  bool enabled = true;       ///< false: SIGTERM and SIGUSR1 keep their actions during fit
  bool auto_requeue = true;  ///< in a SLURM batch job: `scontrol requeue` after the save (global rank 0)
  /// true: after the save, the Trainer tears down and calls std::exit(exit_code) (Lightning raises
  /// SystemExit); false: fit returns with FitResult::preempted and the checkpoint's path.
  bool exit_process = true;
  int exit_code = preempted_exit_code;  ///< 75, EX_TEMPFAIL ("try again"); 1-255: 0 (success, never requeued) is refused
};

struct TrainerConfig {
  // ---- how long --------------------------------------------------------------------------------
  std::optional<std::int64_t> max_epochs{};  ///< unset with max_steps = -1: 1000, as in Lightning; -1: no limit
  std::int64_t min_epochs = 0;               ///< a stop request (should_stop) waits until this many epochs ran
  std::int64_t max_steps = -1;               ///< optimizer steps; -1: no limit
  std::int64_t min_steps = 0;                ///< a stop request waits until this many steps ran
  std::optional<std::chrono::duration<double>> max_time{};  ///< wall time of fit; checked after each batch
  // ---- the optimization ----------------------------------------------------------------------
  std::int64_t accumulate_grad_batches = 1;
  std::optional<double> gradient_clip_val{};  ///< unset or 0: no clipping
  GradientClipAlgorithm gradient_clip_algorithm = GradientClipAlgorithm::norm;
  std::optional<std::uint64_t> seed{};  ///< seeds torch's generators when the Trainer is built
  bool deterministic = false;           ///< torch deterministic algorithms on
  // ---- where -----------------------------------------------------------------------------------
  std::variant<int, std::string> devices = 1;
  int num_nodes = 1;
  /// fulgur's own launcher (devices > 1 without torchrun or SLURM): when a worker fails, end the others
  /// and start them all again this many times; each restart resumes from the newest complete checkpoint
  /// by itself (as under torchrun --max-restarts). 0: a failed worker ends the run.
  int max_restarts = 0;
  // ---- validation and data ---------------------------------------------------------------------
  BatchAmount val_check_interval = 1.0;  ///< validate every N training batches, or every fraction of an epoch
  std::optional<std::int64_t> check_val_every_n_epoch = 1;  ///< unset: val_check_interval counts batches across epochs
  std::int64_t num_sanity_val_steps = 2;  ///< validation batches run before training; -1: all of them
  BatchAmount limit_train_batches = 1.0;
  BatchAmount limit_val_batches = 1.0;
  BatchAmount limit_test_batches = 1.0;
  BatchAmount limit_predict_batches = 1.0;
  // ---- reporting and checks ----------------------------------------------------------------------
  std::int64_t log_every_n_steps = 50;  ///< step metrics reach the host (and logged_metrics) this often
  FiniteLossCheck finite_loss_check = FiniteLossCheck::at_log_steps;
  /// A loss scaler ('16-mixed') that skipped this many optimizer steps in a row (inf/NaN gradients
  /// every time) ends the run with an error naming the step; 0: never.
  std::int64_t max_consecutive_skipped_steps = 25;
  /// Lightning's detect_anomaly: autograd's anomaly mode during fit (a backward that makes a NaN names
  /// the forward op that made it), and a NaN/inf gradient after backward is an error naming the
  /// parameters and the step, even when the loss is finite. One host sync per step: for debugging.
  bool detect_anomaly = false;
  std::string default_root_dir = ".";  ///< where relative paths of Trainer::save/load resolve
  bool enable_progress_bar = true;     ///< the default ProgressBar draws (global rank 0)
  /// Ctrl-C (SIGINT) during fit: finish the step under way, run on_exception and teardown, flush the
  /// loggers and return with FitResult::interrupted (a second Ctrl-C ends the process at once).
  bool handle_interrupt = true;
  PreemptionOptions preemption{};  ///< SIGTERM / SIGUSR1: checkpoint, requeue, exit (see PreemptionOptions)
};

/// Whether Trainer::setup_module also lets the strategy prepare the module for training (DDP:
/// broadcast rank 0's weights, install the gradient hooks), or only converts and moves it.
enum class ModuleSetup { training, evaluation };

/// Which gradient clipping Trainer::clip_gradients does: exactly one of clip_val and max_norm.
struct ClipGradients {
  std::optional<double> clip_val{};
  std::optional<double> max_norm{};
  double norm_type = 2.0;
  bool error_if_nonfinite = true;
};

/// What one fit call may add to the TrainerConfig (Lightning's fit arguments).
struct FitOptions {
  /// A checkpoint to continue from exactly where it was taken (Trainer::save_checkpoint,
  /// ModelCheckpoint): weights, optimizers, schedulers, loss scale, loop position, callbacks, random
  /// state. "last": the newest last*.ckpt of the ModelCheckpoint callbacks' folders (or
  /// default_root_dir/checkpoints), else a warning and a fresh start, as in Lightning. A relative path:
  /// from the current directory, else under default_root_dir. "best": the best checkpoint of the first
  /// ModelCheckpoint of an earlier fit with this Trainer. "hpc": the newest hpc_ckpt_{n}.ckpt there.
  std::string ckpt_path{};
};

/// What one validate, test or predict call may add (Lightning's ckpt_path argument of those verbs).
struct EvaluationOptions {
  /// The weights to evaluate. Empty: the module's own. A checkpoint's "state_dict" (its weights only:
  /// optimizers, loop and callbacks stay as they are) is loaded into the module once the strategy has
  /// set it up, after the module's on_load_checkpoint hook: "best" — the best checkpoint of this
  /// Trainer's first ModelCheckpoint (of an earlier fit with this Trainer; an error if it saved none);
  /// "last" — as fit finds it (none: a warning and the module's own weights, as in Lightning); "hpc"
  /// — as fit; a path — relative ones as fit takes them.
  std::string ckpt_path{};
};

}  // namespace fulgur
