#pragma once
// The errors fulgur raises. Each message names what was wrong and what to do.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fulgur {

/// Base of every fulgur error.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A setting or argument that cannot work (Lightning: ValueError / MisconfigurationException).
struct MisconfigurationError : Error {
  using Error::Error;
};

/// The requested accelerator or device is not present, or lacks a needed feature.
struct AcceleratorError : Error {
  using Error::Error;
};

/// A training/validation step failed; the message names the epoch, batch and the batch's tensors.
struct StepError : Error {
  using Error::Error;
};

/// The loss became NaN or infinite under a precision that has no loss scaler to absorb it.
struct NonFiniteLossError : Error {
  using Error::Error;
};

/// TrainerConfig::detect_anomaly found a NaN or infinite gradient after backward: the message names
/// the parameters and the step.
struct NonFiniteGradientError : StepError {
  using StepError::StepError;
};

/// SpikeDetection saw a loss far outside its running window (Lightning Fabric's
/// TrainingSpikeException): the message names the step, the batch and the values.
struct TrainingSpikeError : Error {
  TrainingSpikeError(const std::string& what, std::int64_t batch_idx, std::int64_t global_step)
      : Error(what), batch_idx_(batch_idx), global_step_(global_step) {}
  std::int64_t batch_idx() const noexcept { return batch_idx_; }
  std::int64_t global_step() const noexcept { return global_step_; }

 private:
  std::int64_t batch_idx_;
  std::int64_t global_step_;
};

/// A loader yielded no batches, or a batch that cannot be used.
struct DataError : Error {
  using Error::Error;
};

/// GradScaler used out of order (unscale twice, step twice, update without inf checks, ...).
struct GradScalerError : Error {
  using Error::Error;
};

/// Ctrl-C (SIGINT) reached fit: what on_exception receives (Lightning's KeyboardInterrupt). fit
/// itself catches it and returns with FitResult::interrupted.
struct Interrupted : Error {
  using Error::Error;
};

/// SIGTERM or SIGUSR1 reached fit (TrainerConfig::preemption): what on_exception receives; fit
/// writes a checkpoint, then ends the process or returns with FitResult::preempted.
struct Preempted : Interrupted {
  Preempted(int signal, const std::string& what) : Interrupted(what), signal_(signal) {}
  int signal() const noexcept { return signal_; }

 private:
  int signal_;
};

/// A collective failed or timed out: a peer process ended, or the ranks disagree on what to do.
struct DistributedError : Error {
  using Error::Error;
};

/// A checkpoint that cannot be written or read: the file, what is wrong with it, and what to do.
/// Nothing already on disk is changed by a failed save or load.
struct CheckpointError : Error {
  using Error::Error;
};

/// A part of a checkpoint kept beside its file (checkpoint/format.hpp: a sharded checkpoint's
/// per-rank files) is missing or is not the one the checkpoint wrote: the checkpoint cannot be
/// read, as opposed to a state that does not fit what it is loaded into.
struct CheckpointPartError : CheckpointError {
  using CheckpointError::CheckpointError;
};

}  // namespace fulgur
