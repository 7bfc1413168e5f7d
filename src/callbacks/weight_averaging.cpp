#include "fulgur/callbacks/weight_averaging.hpp"

#include <torch/torch.h>

#include <map>

#include "fulgur/grad_norm.hpp"
#include "src/callbacks/policy_names.hpp"

namespace fulgur {

namespace weight_averaging {

std::vector<at::Tensor> averaged_tensors(const torch::nn::Module& module, bool use_buffers) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : module.parameters()) out.push_back(p);
  if (use_buffers)
    for (const at::Tensor& b : module.buffers())
      if (b.defined()) out.push_back(b);
  return out;
}

std::vector<std::string> averaged_names(const torch::nn::Module& module, bool use_buffers) {
  std::vector<std::string> out;
  for (const auto& p : module.named_parameters()) out.push_back(p.key());
  if (use_buffers)
    for (const auto& b : module.named_buffers())
      if (b.value().defined()) out.push_back(b.key());
  return out;
}

void ema_update(const std::vector<at::Tensor>& average, const std::vector<at::Tensor>& current, double decay,
                std::int64_t n_averaged) {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < average.size(); ++i) {
    const at::Tensor model = current[i].detach().to(average[i].device());
    if (n_averaged == 0) {
      average[i].detach().copy_(model);
    } else {
      // get_ema_avg_fn: `decay * ema_param + (1 - decay) * current_param`, each product rounded to the
      // tensor's dtype before the sum (not a lerp, whose rounding differs). In place where that rounds
      // the same (one temporary less); an integer buffer is computed in floating point and truncated.
      const at::Tensor avg = average[i].detach();
      if (avg.is_floating_point() || avg.is_complex())
        avg.mul_(decay).add_(at::mul(model, 1.0 - decay));
      else
        avg.copy_(at::add(at::mul(avg, decay), at::mul(model, 1.0 - decay)));
    }
  }
}

}  // namespace weight_averaging

EMAWeightAveraging::EMAWeightAveraging(EMAWeightAveragingOptions options) : options_(options) {
  if (!(options_.decay >= 0.0 && options_.decay <= 1.0))  // NaN too
    throw MisconfigurationError("Invalid decay value " + python_float_repr(options_.decay) +
                                " provided. Please provide a value in [0,1] range.");
  // Lightning divides by update_every_n_steps (ZeroDivisionError) and compares negative starts as
  // they are (always started): both are mistakes here.
  if (options_.update_every_n_steps < 1)
    throw MisconfigurationError("fulgur: EMAWeightAveraging: update_every_n_steps must be at least 1 (update after "
                                "every n-th optimizer step); got " + std::to_string(options_.update_every_n_steps) + ".");
  if (options_.update_starting_at_step && *options_.update_starting_at_step < 0)
    throw MisconfigurationError("fulgur: EMAWeightAveraging: update_starting_at_step is a 0-based step index; got " +
                                std::to_string(*options_.update_starting_at_step) + ".");
  if (options_.update_starting_at_epoch && *options_.update_starting_at_epoch < 0)
    throw MisconfigurationError("fulgur: EMAWeightAveraging: update_starting_at_epoch is a 0-based epoch index; got " +
                                std::to_string(*options_.update_starting_at_epoch) + ".");
}

bool EMAWeightAveraging::should_update(std::optional<std::int64_t> step_idx, std::optional<std::int64_t> epoch_idx) const {
  if (step_idx) {
    const bool started = !options_.update_starting_at_step || *step_idx >= *options_.update_starting_at_step;
    const bool on_cadence = options_.update_every_n_steps > 0 && *step_idx % options_.update_every_n_steps == 0;
    if (started && on_cadence) return true;
  }
  if (epoch_idx && options_.update_starting_at_epoch && *epoch_idx >= *options_.update_starting_at_epoch) return true;
  return false;
}

void EMAWeightAveraging::on_fit_start(TrainerView& trainer, torch::nn::Module& module) {
  if (detail::strategy_name(trainer) == "fsdp")
    throw MisconfigurationError("EMAWeightAveraging does not support ShardedStrategy<3> (its parameters are sharded "
                                "across ranks); use DDPStrategy or ShardedStrategy<1> or <2>.");
  // Lightning makes the AveragedModel at setup("fit"); here it is made once the module is on its
  // device and a checkpoint's weights are in it (what Lightning's on_load_checkpoint then loads).
  at::NoGradGuard no_grad;
  average_.clear();
  for (const at::Tensor& t : weight_averaging::averaged_tensors(module, /*use_buffers=*/true))
    average_.push_back(t.detach().clone());
  names_ = weight_averaging::averaged_names(module, /*use_buffers=*/true);
  n_averaged_ = 0;
  if (resumed_average_) {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      if (!resumed_average_->contains(names_[i]))
        throw CheckpointError("fulgur: the checkpoint's averaged weights (EMAWeightAveraging) have no `" + names_[i] +
                              "`; resume with the module that wrote it.");
      average_[i].copy_(resumed_average_->at(names_[i]).toTensor());
    }
    n_averaged_ = resumed_n_averaged_;
    resumed_average_.reset();
  }
}

void EMAWeightAveraging::update(torch::nn::Module& module) {
  const std::vector<at::Tensor> current = weight_averaging::averaged_tensors(module, /*use_buffers=*/true);
  if (current.size() != average_.size())
    throw Error("fulgur: EMAWeightAveraging: the module has " + std::to_string(current.size()) +
                " parameters and buffers, its average " + std::to_string(average_.size()) +
                "; the module's structure must not change during fit.");
  if (options_.use_buffers) {
    weight_averaging::ema_update(average_, current, options_.decay, n_averaged_);
  } else {  // AveragedModel(use_buffers=False): the parameters averaged, the buffers copied
    const auto n = static_cast<std::ptrdiff_t>(module.parameters().size());
    weight_averaging::ema_update({average_.begin(), average_.begin() + n}, {current.begin(), current.begin() + n},
                                 options_.decay, n_averaged_);
    at::NoGradGuard no_grad;
    for (auto i = static_cast<std::size_t>(n); i < average_.size(); ++i) average_[i].copy_(current[i].detach());
  }
  ++n_averaged_;
}

void EMAWeightAveraging::on_train_batch_end(TrainerView& trainer, torch::nn::Module& module) {
  const std::int64_t step = trainer.global_step();
  if (step > latest_update_step_ && should_update(step - 1, std::nullopt)) {
    update(module);
    latest_update_step_ = step;
  }
}

void EMAWeightAveraging::on_train_epoch_end(TrainerView& trainer, torch::nn::Module& module) {
  const std::int64_t epoch = trainer.current_epoch();
  if (epoch > latest_update_epoch_ && should_update(std::nullopt, epoch)) {
    update(module);
    latest_update_epoch_ = epoch;
  }
}

void EMAWeightAveraging::on_train_end(TrainerView& trainer, torch::nn::Module& module) {
  if (average_.empty()) return;
  // An average never updated is the weights fit started from: Lightning copies it in anyway, which
  // throws the whole run's training away. fulgur keeps the trained weights and says why.
  if (n_averaged_ == 0) {
    trainer.warn("fulgur: EMAWeightAveraging never updated its average in this fit (" +
                 std::to_string(trainer.global_step()) + " optimizer steps; update_starting_at_step = " +
                 (options_.update_starting_at_step ? std::to_string(*options_.update_starting_at_step) : "none") +
                 ", update_starting_at_epoch = " +
                 (options_.update_starting_at_epoch ? std::to_string(*options_.update_starting_at_epoch) : "none") +
                 "): the module keeps its trained weights; start the averaging earlier.");
    return;
  }
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> current = weight_averaging::averaged_tensors(module, /*use_buffers=*/true);
  for (std::size_t i = 0; i < current.size() && i < average_.size(); ++i) current[i].detach().copy_(average_[i]);
}

void EMAWeightAveraging::swap(torch::nn::Module& module) {
  // Before the first update the average is the starting weights: validation runs on the current ones
  // (n_averaged does not change inside a validation epoch, so start and end agree).
  if (average_.empty() || n_averaged_ == 0) return;
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> current = weight_averaging::averaged_tensors(module, /*use_buffers=*/true);
  for (std::size_t i = 0; i < current.size() && i < average_.size(); ++i) {
    const at::Tensor held = average_[i].clone();
    average_[i].copy_(current[i].detach());
    current[i].detach().copy_(held);
  }
}

void EMAWeightAveraging::on_validation_epoch_start(TrainerView&, torch::nn::Module& module) { swap(module); }
void EMAWeightAveraging::on_validation_epoch_end(TrainerView&, torch::nn::Module& module) { swap(module); }

void EMAWeightAveraging::on_save_checkpoint(TrainerView& trainer, torch::nn::Module&, StateDict& checkpoint) const {
  if (average_.empty()) {
    trainer.print("You're using the WeightAveraging callback, but saving a checkpoint outside the 'fit' stage. The "
                  "state of the WeightAveraging callback won't be saved in the checkpoint. If training has finished, "
                  "the average model parameters will be saved to the state_dict in the checkpoint.");
    return;
  }
  if (!checkpoint.contains("state_dict") || !checkpoint.at("state_dict").isGenericDict()) return;
  const StateDict current(checkpoint.at("state_dict").toGenericDict());
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < names_.size(); ++i) index.emplace(names_[i], i);
  StateDict averaged;
  std::size_t replaced = 0;
  for (const auto& item : current) {  // the current state's keys in its order, the average's values
    const std::string& key = item.key().toStringRef();
    const auto found = index.find(key);
    if (found == index.end()) {
      averaged.insert(key, item.value());
    } else {
      const at::Tensor& saved = item.value().toTensor();
      averaged.insert(key, average_[found->second].detach().to(saved.device(), /*non_blocking=*/false, /*copy=*/true));
      ++replaced;
    }
  }
  // A strategy whose state names the weights otherwise would get the current weights saved as the
  // average without a word.
  if (replaced != names_.size())
    throw CheckpointError("fulgur: EMAWeightAveraging found " + std::to_string(replaced) + " of the module's " +
                          std::to_string(names_.size()) + " parameters and buffers in the checkpoint's state_dict; "
                          "this strategy's checkpoints cannot hold the average.");
  StateDict averaging;
  averaging.insert("n_averaged", at::scalar_tensor(n_averaged_, at::kLong));
  checkpoint.insert("current_model_state", current.to_ivalue());
  checkpoint.insert("state_dict", averaged.to_ivalue());
  checkpoint.insert("averaging_state", averaging.to_ivalue());
}

void EMAWeightAveraging::on_load_checkpoint(TrainerView& trainer, torch::nn::Module&, const StateDict& checkpoint) {
  if (checkpoint.contains("current_model_state") && checkpoint.contains("averaging_state")) {
    trainer.print("Found current_model_state in the checkpoint. This will be used to initialize the model.");
    resumed_average_ = StateDict(checkpoint.at("state_dict").toGenericDict());
    const StateDict averaging(checkpoint.at("averaging_state").toGenericDict());
    resumed_n_averaged_ = averaging.contains("n_averaged") ? averaging.at("n_averaged").toTensor().item<std::int64_t>() : 0;
    // Lightning loads 'state_dict' into the module, then current_model_state over it. fit restores
    // the module after this hook, from the same dictionary (a StateDict is a handle on it): point its
    // 'state_dict' at the current weights, and the average comes in at on_fit_start.
    StateDict shared = checkpoint;
    shared.insert("state_dict", checkpoint.at("current_model_state"));
  } else {
    trainer.warn("The checkpoint was not created with WeightAveraging. Both the current and the average model will be "
                 "initialized with state_dict.");
  }
}

StateDict EMAWeightAveraging::state_dict() const {
  StateDict s;
  s.insert("latest_update_step", latest_update_step_);
  return s;
}

void EMAWeightAveraging::load_state_dict(const StateDict& state) {
  if (state.contains("latest_update_step")) latest_update_step_ = state.at("latest_update_step").toInt();
}

}  // namespace fulgur
