#pragma once
// EMAWeightAveraging: Lightning 2.6's WeightAveraging callback with its EMA averaging function
// (lightning.pytorch.callbacks.EMAWeightAveraging). An averaged copy of the module's parameters and
// buffers (Lightning's use_buffers = True default) is kept beside it and updated after optimizer
// steps (should_update), the way torch.optim.swa_utils.AveragedModel(model,
// avg_fn=get_ema_avg_fn(decay), use_buffers=True).update_parameters does it, to the bit: the first
// update copies, the next ones compute `decay * average + (1 - decay) * current` in that order.
// Validation runs on the average (swapped in for each validation epoch and out after), the module
// holds the average once training ends (so validate/test/predict after fit see it), and a
// checkpoint holds the average as 'state_dict' and the current weights as 'current_model_state'
// (Lightning's keys), n_averaged in 'averaging_state': a resumed fit goes on exactly.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/stage.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur {

namespace weight_averaging {

/// The tensors AveragedModel(use_buffers) averages, in its order: the parameters, then the buffers
/// (use_buffers), each recursively in registration order; undefined ones left out.
std::vector<at::Tensor> averaged_tensors(const torch::nn::Module& module, bool use_buffers);
/// Their names (state_dict keys), in the same order.
std::vector<std::string> averaged_names(const torch::nn::Module& module, bool use_buffers);

/// AveragedModel.update_parameters with get_ema_avg_fn(decay): n_averaged == 0 copies `current`;
/// after that `decay * average + (1 - decay) * current`, computed as Python does (an integer
/// buffer's value is computed in floating point and truncated back, as Python's copy_ does).
void ema_update(const std::vector<at::Tensor>& average, const std::vector<at::Tensor>& current, double decay,
                std::int64_t n_averaged);

}  // namespace weight_averaging

struct EMAWeightAveragingOptions {
  double decay = 0.999;                                    ///< in [0, 1]
  std::int64_t update_every_n_steps = 1;                   ///< after optimizer steps whose 0-based index is a multiple
  std::optional<std::int64_t> update_starting_at_step{};   ///< none: from the first step
  std::optional<std::int64_t> update_starting_at_epoch{};  ///< also after each epoch from this one (none: never)
  bool use_buffers = true;                                 ///< average the buffers too (false: copy them, as AveragedModel)
};

class EMAWeightAveraging {
 public:
  /// Refuses a decay outside [0, 1] with PyTorch's message.
  explicit EMAWeightAveraging(EMAWeightAveragingOptions options = {});

  /// Lightning's should_update: whether the average is updated after the optimizer step `step_idx`
  /// (0-based) or after the epoch `epoch_idx` (one of them is given).
  bool should_update(std::optional<std::int64_t> step_idx, std::optional<std::int64_t> epoch_idx) const;

  /// The averaged tensors (parameters, then buffers when averaged), n_averaged; empty before fit.
  const std::vector<at::Tensor>& average() const { return average_; }
  std::int64_t n_averaged() const { return n_averaged_; }

  // ---- hooks ---------------------------------------------------------------------------------------
  void on_fit_start(TrainerView& trainer, torch::nn::Module& module);
  void on_train_batch_end(TrainerView& trainer, torch::nn::Module& module);
  void on_train_epoch_end(TrainerView& trainer, torch::nn::Module& module);
  void on_train_end(TrainerView& trainer, torch::nn::Module& module);
  void on_validation_epoch_start(TrainerView& trainer, torch::nn::Module& module);
  void on_validation_epoch_end(TrainerView& trainer, torch::nn::Module& module);
  void on_save_checkpoint(TrainerView& trainer, torch::nn::Module& module, StateDict& checkpoint) const;
  void on_load_checkpoint(TrainerView& trainer, torch::nn::Module& module, const StateDict& checkpoint);
  /// Lightning's callback state: {"latest_update_step"}.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);
  std::string state_key() const { return "EMAWeightAveraging"; }

 private:
  void update(torch::nn::Module& module);
  void swap(torch::nn::Module& module);

  EMAWeightAveragingOptions options_;
  std::vector<at::Tensor> average_;
  std::vector<std::string> names_;
  std::int64_t n_averaged_ = 0;
  std::int64_t latest_update_step_ = 0;
  std::int64_t latest_update_epoch_ = -1;
  std::optional<StateDict> resumed_average_{};  ///< a checkpoint's average, taken in at on_fit_start
  std::int64_t resumed_n_averaged_ = 0;
};

}  // namespace fulgur
