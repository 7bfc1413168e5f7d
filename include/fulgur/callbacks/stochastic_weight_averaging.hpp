#pragma once
// StochasticWeightAveraging: Lightning 2.6's callback of that name (not a WeightAveraging; it keeps
// its own ways, and those are followed here). From epoch swa_start on, the optimizer's scheduler is
// replaced by optim::SWALR (annealing each group's lr to swa_lrs over annealing_epochs, stepped
// every epoch), and at the start of each epoch from swa_start to the last the module's parameters
// are averaged into a copy (equal weights: `average + (current - average) / (n_averaged + 1)`,
// computed as Lightning's avg_fn on the average's device, CPU by default). When the last epoch
// ends the average is copied into the module's parameters; a module with batch-norm layers then
// has their statistics recomputed for the averaged weights (Lightning runs one more epoch of
// forward passes for it; here one forward-only pass of training_step over the training loader,
// TrainerView::forward_training_pass, as fulgur::update_bn does it, or the `update_bn` option).
// The averaging state and the SWALR state are in the checkpoint's callback state (Lightning's
// keys), so a resumed fit goes on exactly.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur {

namespace optim {
class SWALR;
}

struct StochasticWeightAveragingOptions {
  std::vector<double> swa_lrs{};  ///< one for every param group, or one per group; each > 0
  /// An integer: the 1-based epoch SWA starts at; a fraction in [0, 1]: of max_epochs.
  std::variant<std::int64_t, double> swa_epoch_start = 0.8;
  std::int64_t annealing_epochs = 10;
  std::string annealing_strategy = "cos";  ///< "cos" or "linear"
  /// Where the average is kept (Lightning's default: the CPU); none: the module's device.
  std::optional<torch::Device> device = torch::Device(torch::kCPU);
  /// Recomputes the batch-norm statistics of the module holding the averaged weights, at the end
  /// of fit, instead of the callback's own pass (fulgur::update_bn with training_step as the
  /// forward over the training loader), e.g.
  /// [&](torch::nn::Module& m) { fulgur::update_bn(loader, m, [&](auto& b) { net->forward(b.input); }); }.
  std::function<void(torch::nn::Module&)> update_bn{};
};

class StochasticWeightAveraging {
 public:
  /// Refuses what Lightning and SWALR refuse, with their messages.
  explicit StochasticWeightAveraging(StochasticWeightAveragingOptions options);

  /// The averaged parameters (and the buffers as they were when fit started), n_averaged.
  const std::vector<at::Tensor>& average() const { return average_; }
  std::int64_t n_averaged() const { return n_averaged_; }
  /// Lightning's swa_start (0-based) once fit started.
  std::int64_t swa_start() const;

  // ---- hooks ---------------------------------------------------------------------------------------
  void on_fit_start(TrainerView& trainer, torch::nn::Module& module);
  void on_train_epoch_start(TrainerView& trainer, torch::nn::Module& module);
  void on_train_end(TrainerView& trainer, torch::nn::Module& module);
  void on_load_checkpoint(TrainerView& trainer, torch::nn::Module& module, const StateDict& checkpoint);
  /// Lightning's keys: n_averaged, latest_update_epoch, scheduler_state, average_model_state.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);
  std::string state_key() const { return "StochasticWeightAveraging"; }

 private:
  std::int64_t swa_end() const;
  void install_scheduler(TrainerView& trainer);
  void update(torch::nn::Module& module);
  void recompute_batch_norm(TrainerView& trainer, torch::nn::Module& module);

  StochasticWeightAveragingOptions options_;
  std::int64_t start_epoch_ = -1;  ///< swa_epoch_start resolved (an integer, 1-based)
  std::int64_t max_epochs_ = -1;
  bool initialized_ = false;
  optim::SWALR* scheduler_ = nullptr;  ///< owned by the optimizer's configuration once installed
  std::vector<at::Tensor> average_;
  std::vector<std::string> names_;
  std::int64_t n_averaged_ = 0;
  std::int64_t latest_update_epoch_ = -1;
  std::optional<StateDict> loaded_average_{};
  std::optional<StateDict> loaded_scheduler_{};
};

}  // namespace fulgur
