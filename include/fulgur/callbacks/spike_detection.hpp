#pragma once
// SpikeDetection: stops training with a TrainingSpikeError when the loss jumps far outside its
// running mean (Lightning Fabric's SpikeDetection, with its semantics to the bit: the running window
// is torchmetrics' Running(MeanMetric) in float32, the atol/rtol tests and the "not an improvement"
// rule are Fabric's, and the decision is reduced over the ranks: any rank's spike stops them all).
// It records the current and the previous batch index in a JSON file (skip_batches.json under
// exclude_batches_path), so that a run rolled back to its last checkpoint can skip them
// (docs/spike_detection.md shows the workflow).
//
// As a Trainer callback it checks in on_train_batch_end; in a loop of your own call check() with
// each batch's loss. Its running window is part of a checkpoint (state_dict), so a resumed run,
// rolled back or not, judges each loss as the straight run did. Reading the loss is a host sync every step: inherent to the feature (Fabric's
// does the same), and only paid when the callback is in use.
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fulgur/callbacks/early_stopping.hpp"  // MonitorMode
#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/detail/loss.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur {

struct SpikeDetectionOptions {
  MonitorMode mode = MonitorMode::min;  ///< min: a rise is a spike; max: a fall is
  std::int64_t window = 10;             ///< batches in the running mean the loss is compared with
  std::int64_t warmup = 1;              ///< batch indices (of each epoch) below this are never a spike
  std::optional<double> atol{};         ///< a spike differs from the running mean by at least |atol|
  std::optional<double> rtol = 2.0;     ///< ... and by at least |rtol * running mean|
  /// Where the bad batch indices go: a folder (skip_batches.json inside it) or a path ending in
  /// ".json"; empty: the working directory. Relative paths are from the working directory.
  std::string exclude_batches_path{};
  bool finite_only = true;  ///< true: a NaN/inf loss is a spike; false: it is ignored (not a spike)
};

class SpikeDetection {
 public:
  /// all: every rank decided true; otherwise any rank did (TrainerView::reduce_boolean_decision's).
  using ReduceDecision = std::function<bool(bool decision, bool all)>;

  explicit SpikeDetection(SpikeDetectionOptions options = {});

  template <class Output, class Batch>
  void on_train_batch_end(TrainerView& trainer, torch::nn::Module&, const Output& output, const Batch&,
                          std::int64_t batch_idx) {
    static_assert(detail::has_loss<Output>,
                  "fulgur: SpikeDetection watches the training loss: return it from training_step (a tensor, "
                  "or a struct with a `loss` member).");
    check(detail::loss_of(output), batch_idx, trainer.global_step(), trainer.global_rank(),
          [&trainer](bool decision, bool all) { return trainer.reduce_boolean_decision(decision, all); });
  }

  /// One batch's loss (any floating dtype, one element) at `batch_idx` of its epoch. Throws
  /// TrainingSpikeError on a spike, after global rank 0 wrote the bad batches' file. `reduce`:
  /// the ranks' agreement (empty: one process); every rank must call check for every batch.
  void check(const at::Tensor& loss, std::int64_t batch_idx, std::int64_t global_step = -1, int global_rank = 0,
             const ReduceDecision& reduce = {});

  const SpikeDetectionOptions& options() const { return options_; }
  /// Every batch index recorded so far (two per spike: the one before and the spiking one).
  const std::vector<std::int64_t>& bad_batches() const { return bad_batches_; }
  /// Where the bad batches are written (exclude_batches_path resolved).
  std::string bad_batches_file() const;
  /// The batch indices in a skip_batches.json (SpikeDetection's or Fabric's), for a sampler that
  /// leaves them out when the run is rolled back; a missing or malformed file is an error naming it.
  static std::vector<std::int64_t> read_bad_batches(const std::string& path);
  /// The running mean the next loss is compared with (NaN before any loss entered the window).
  double running_mean() const;

  /// "SpikeDetection{'mode': 'min', 'window': 10}": a checkpoint's state of a detector with another
  /// mode or window is not this one's (it starts afresh, as a callback added since does).
  std::string state_key() const;
  /// The running window (its slots, how many losses entered it, the last one) and the bad batches.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  bool is_spike(const at::Tensor& loss) const;
  void update(double value);
  [[noreturn]] void raise_spike(const at::Tensor& loss, std::int64_t batch_idx, std::int64_t global_step,
                                int global_rank, bool spiked_here);

  SpikeDetectionOptions options_;
  // Running(MeanMetric, window): each slot holds one update's (sum, weight) in float32; a NaN loss
  // takes a slot with (0, 0), as MeanMetric drops NaN values.
  std::vector<float> sums_, weights_;
  std::int64_t seen_ = 0;
  double last_value_ = 0.0;  // the last loss that entered the window (Fabric's starts at 0.0)
  std::vector<std::int64_t> bad_batches_;
};

}  // namespace fulgur
