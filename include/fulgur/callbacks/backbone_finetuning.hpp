#pragma once
// BackboneFinetuning: Lightning's callback of that name. The module's backbone (its submodule
// "backbone", as Lightning's pl_module.backbone, or the one named in the options) is frozen before
// the optimizers are made; at unfreeze_backbone_at_epoch it trains again, its parameters as a new
// param group of each optimizer at lr = current_lr * backbone_initial_ratio_lr (or
// backbone_initial_lr); each later epoch that lr is multiplied by lambda_func(epoch + 1) and, with
// should_align, kept at most the first group's lr — Lightning's arithmetic, in double as Python's.
// Its state (the backbone lr, the groups it added) is checkpointed: a resumed fit adds the groups
// again before the optimizer state is loaded, trains the backbone, and does not apply an epoch twice.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur {

struct BackboneFinetuningOptions {
  std::int64_t unfreeze_backbone_at_epoch = 10;
  /// The factor on the backbone lr at each epoch after the unfreeze, given epoch + 1 (Lightning's multiplicative: 2).
  std::function<double(std::int64_t)> lambda_func = [](std::int64_t) { return 2.0; };
  double backbone_initial_ratio_lr = 0.1;
  std::optional<double> backbone_initial_lr{};
  bool should_align = true;
  /// Kept for Lightning's signature: BackboneFinetuning always passes an lr, so it divides by 1.
  double initial_denom_lr = 10.0;
  /// false: the backbone's BatchNorm layers stay frozen (no gradient, running statistics kept).
  bool train_bn = true;
  bool verbose = false;  ///< prints "Current lr: ..., Backbone lr: ..." at each epoch from the unfreeze
  int rounding = 12;     ///< digits of the printed lrs
  /// The backbone's path among the module's named_modules ("backbone", "encoder", "net.features").
  std::string backbone = "backbone";
};

class BackboneFinetuning {
 public:
  /// Refuses a negative unfreeze epoch, a missing lambda_func, a non-positive lr ratio or lr.
  explicit BackboneFinetuning(BackboneFinetuningOptions options = {});

  /// Freezes the backbone (before configure_optimizers); refuses a module without it and the
  /// strategies the unfreeze cannot reach (see the docs page).
  void setup(TrainerView& trainer, torch::nn::Module& module);
  /// Refuses LibTorch's ReduceLROnPlateauScheduler (it would read past its per-group min_lrs once the backbone's
  /// group is added; fulgur::optim's schedulers take the group as PyTorch's do) and warns once when
  /// unfreeze_backbone_at_epoch is not below max_epochs.
  void on_fit_start(TrainerView& trainer);
  void on_train_epoch_start(TrainerView& trainer, torch::nn::Module& module);
  /// Resuming: before the optimizers' state is loaded, adds the param groups the run had added.
  void on_load_checkpoint(TrainerView& trainer, torch::nn::Module& module, const StateDict& checkpoint);

  std::string state_key() const { return "BackboneFinetuning"; }
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

  /// The backbone lr set at the last epoch start (Lightning's previous_backbone_lr); none before the unfreeze.
  std::optional<double> previous_backbone_lr() const { return previous_backbone_lr_; }

 private:
  torch::nn::Module& backbone_of(torch::nn::Module& module) const;
  void finetune(TrainerView& trainer, torch::nn::Module& module, std::int64_t epoch, std::size_t index);
  void read_state(const StateDict& state);

  BackboneFinetuningOptions options_;
  std::optional<double> previous_backbone_lr_{};
  std::int64_t last_epoch_ = -1;                      // the last epoch applied (a resumed epoch is not applied again)
  std::vector<std::vector<std::string>> added_groups_;  // per optimizer: the parameter names of the group added
  std::unordered_map<torch::nn::Module*, std::optional<double>> frozen_momenta_;  // frozen BatchNorms' own momenta
};

}  // namespace fulgur
