#include "fulgur/callbacks/stochastic_weight_averaging.hpp"

#include <torch/torch.h>

#include <limits>

#include "fulgur/callbacks/weight_averaging.hpp"
#include "fulgur/nn/sync_batchnorm.hpp"
#include "fulgur/optim/swalr.hpp"
#include "fulgur/update_bn.hpp"
#include "src/callbacks/policy_names.hpp"
#include "src/detail/error_text.hpp"

namespace fulgur {

StochasticWeightAveraging::StochasticWeightAveraging(StochasticWeightAveragingOptions options)
    : options_(std::move(options)) {
  const char* start_error = "swa_epoch_start should be a >0 integer or a float between 0 and 1.";
  if (const auto* epoch = std::get_if<std::int64_t>(&options_.swa_epoch_start); epoch && *epoch < 1)
    throw MisconfigurationError(start_error);
  if (const auto* fraction = std::get_if<double>(&options_.swa_epoch_start); fraction && !(*fraction >= 0 && *fraction <= 1))
    throw MisconfigurationError(start_error);
  bool positive = !options_.swa_lrs.empty();
  for (double lr : options_.swa_lrs) positive = positive && lr > 0;
  if (!positive) throw MisconfigurationError("The `swa_lrs` should a positive float, or a list of positive floats");
  // SWALR's own checks, which Lightning meets when SWA starts: here when the callback is made.
  if (options_.annealing_strategy != "cos" && options_.annealing_strategy != "linear")
    throw MisconfigurationError("anneal_strategy must by one of 'cos' or 'linear', instead got " +
                                options_.annealing_strategy);
  if (options_.annealing_epochs < 0)
    throw MisconfigurationError("anneal_epochs must be equal or greater than 0, got " +
                                std::to_string(options_.annealing_epochs));
}

std::int64_t StochasticWeightAveraging::swa_start() const { return std::max<std::int64_t>(start_epoch_ - 1, 0); }

std::int64_t StochasticWeightAveraging::swa_end() const {
  return max_epochs_ == -1 ? std::numeric_limits<std::int64_t>::max() : max_epochs_ - 1;
}

void StochasticWeightAveraging::on_fit_start(TrainerView& trainer, torch::nn::Module& module) {
  if (detail::strategy_name(trainer) == "fsdp") throw MisconfigurationError("SWA does not currently support sharded models.");
  if (trainer.optimizers().size() != 1) throw MisconfigurationError("SWA currently works with 1 `optimizer`.");
  max_epochs_ = trainer.max_epochs();
  if (const auto* fraction = std::get_if<double>(&options_.swa_epoch_start)) {
    if (max_epochs_ == -1)
      throw MisconfigurationError("SWA with `swa_epoch_start` as a float is not supported when `max_epochs=-1`. "
                                  "Please provide `swa_epoch_start` as an integer.");
    start_epoch_ = static_cast<std::int64_t>(static_cast<double>(max_epochs_) * *fraction);  // Python's int(): toward 0
  } else {
    start_epoch_ = std::get<std::int64_t>(options_.swa_epoch_start);
  }
  // Lightning deep-copies the module at setup: the average starts as the module's weights (those of a
  // resumed checkpoint's average, loaded below).
  at::NoGradGuard no_grad;
  const torch::Device device = options_.device.value_or(module.parameters().front().device());
  average_.clear();
  for (const at::Tensor& t : weight_averaging::averaged_tensors(module, /*use_buffers=*/true))
    average_.push_back(t.detach().to(device, /*non_blocking=*/false, /*copy=*/true));
  names_ = weight_averaging::averaged_names(module, /*use_buffers=*/true);
  if (loaded_average_) {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      if (!loaded_average_->contains(names_[i]))
        throw CheckpointError("fulgur: the checkpoint's averaged weights (StochasticWeightAveraging) have no `" +
                              names_[i] + "`; resume with the module that wrote it.");
      average_[i].copy_(loaded_average_->at(names_[i]).toTensor());
    }
    loaded_average_.reset();
  }
}

void StochasticWeightAveraging::install_scheduler(TrainerView& trainer) {
  OptimizerConfig& config = trainer.optimizers().front();
  // Lightning: last_epoch = max_epochs for "cos" (the group's initial_lr set to swa_lr first), -1 for
  // "linear"; SWALR's schedule reads neither.
  auto scheduler = std::make_unique<optim::SWALR>(*config.optimizer, options_.swa_lrs, options_.annealing_epochs,
                                                   options_.annealing_strategy,
                                                   options_.annealing_strategy == "cos" ? max_epochs_ : -1);
  scheduler_ = scheduler.get();
  if (config.lr_scheduler) {
    if (config.interval != SchedulerInterval::epoch || config.frequency != 1)
      trainer.warn("SWA is currently only supported every epoch. Found the scheduler stepping every " +
                   std::to_string(config.frequency) +
                   (config.interval == SchedulerInterval::epoch ? " epoch(s)" : " step(s)"));
    trainer.print("Swapping scheduler for `SWALR`");
  }
  config.lr_scheduler = AnyLRScheduler(std::move(scheduler));
  config.interval = SchedulerInterval::epoch;
  config.frequency = 1;
  config.monitor.clear();
}

void StochasticWeightAveraging::on_train_epoch_start(TrainerView& trainer, torch::nn::Module& module) {
  const std::int64_t epoch = trainer.current_epoch();
  const bool in_range = swa_start() <= epoch && epoch <= swa_end();
  if (!initialized_ && in_range) {
    initialized_ = true;
    install_scheduler(trainer);
    if (epoch != swa_start())
      trainer.warn("SWA is initializing after swa_start without any checkpoint data. This may be caused by loading a "
                   "checkpoint from an older version of PyTorch Lightning.");
  }
  if (in_range && epoch > latest_update_epoch_) {
    update(module);
    latest_update_epoch_ = epoch;
  }
}

void StochasticWeightAveraging::update(torch::nn::Module& module) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> current = module.parameters();
  if (current.size() > average_.size()) throw Error("fulgur: StochasticWeightAveraging: the module gained parameters during fit.");
  for (std::size_t i = 0; i < current.size(); ++i) {
    const at::Tensor avg = average_[i];
    const at::Tensor model = current[i].detach().to(avg.device());
    if (n_averaged_ == 0) {
      avg.copy_(model);
    } else {  // Lightning's avg_fn, with n_averaged a long tensor on the average's device
      const at::Tensor n = at::scalar_tensor(n_averaged_, at::TensorOptions(at::kLong).device(avg.device()));
      avg.copy_(at::add(avg, at::div(at::sub(model, avg), at::add(n, 1))));
    }
  }
  ++n_averaged_;
}

void StochasticWeightAveraging::on_train_end(TrainerView& trainer, torch::nn::Module& module) {
  if (average_.empty() || n_averaged_ == 0) {  // the average is the starting weights: keep the trained ones
    trainer.warn("fulgur: StochasticWeightAveraging never started: fit ended in epoch " +
                 std::to_string(trainer.current_epoch()) + ", before swa_epoch_start (epoch " +
                 std::to_string(swa_start()) + "); the module keeps its trained weights.");
    return;
  }
  if (!(trainer.current_epoch() == swa_end() || max_epochs_ == -1)) {  // Lightning: no transfer then
    trainer.warn("fulgur: fit stopped in epoch " + std::to_string(trainer.current_epoch()) + ", before its last (" +
                 std::to_string(swa_end()) + "): as in Lightning, StochasticWeightAveraging's average (" +
                 std::to_string(n_averaged_) + " epochs) is not copied into the module; it is in the callback's "
                 "average() and in the checkpoints.");
    return;
  }
  {
    at::NoGradGuard no_grad;
    const std::vector<at::Tensor> params = module.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(average_[i].to(params[i].device()));
  }
  if (!detail::contains_batch_norm(module)) return;
  if (options_.update_bn) return options_.update_bn(module);
  recompute_batch_norm(trainer, module);
}

void StochasticWeightAveraging::recompute_batch_norm(TrainerView& trainer, torch::nn::Module& module) {
  // fulgur::update_bn with training_step as the forward: the statistics reset, momenta none, train
  // mode, one pass without gradients; momenta and mode put back however the pass ends.
  detail::BatchNormPass pass(module);
  const std::string what = "StochasticWeightAveraging: recomputing the batch-norm statistics of the averaged weights "
                           "(a forward-only pass of training_step over the training data) failed: ";
  try {
    trainer.forward_training_pass("StochasticWeightAveraging");
  } catch (...) {
    detail::rethrow_with_prefix(what);  // the same error type: a DistributedError stays one
  }
}

void StochasticWeightAveraging::on_load_checkpoint(TrainerView& trainer, torch::nn::Module&, const StateDict& checkpoint) {
  // The optimizer's scheduler was SWALR when the checkpoint was written: it is again before fit
  // restores the schedulers' states, so that SWALR's goes into a SWALR (Lightning clears the user's
  // scheduler and loads SWALR's state when it makes one again).
  if (!checkpoint.contains("callbacks") || !checkpoint.at("callbacks").isGenericDict()) return;
  const StateDict callbacks(checkpoint.at("callbacks").toGenericDict());
  if (!callbacks.contains(state_key()) || !callbacks.at(state_key()).isGenericDict()) return;
  const StateDict mine(callbacks.at(state_key()).toGenericDict());
  if (!mine.contains("scheduler_state") || !mine.at("scheduler_state").isGenericDict()) return;
  if (trainer.optimizers().size() != 1) throw MisconfigurationError("SWA currently works with 1 `optimizer`.");
  max_epochs_ = trainer.max_epochs();
  install_scheduler(trainer);
  initialized_ = true;
}

StateDict StochasticWeightAveraging::state_dict() const {
  StateDict s;
  s.insert("n_averaged", n_averaged_);
  s.insert("latest_update_epoch", latest_update_epoch_);
  s.insert("scheduler_state", scheduler_ != nullptr && initialized_ ? scheduler_->state_dict().to_ivalue() : c10::IValue());
  if (average_.empty()) {
    s.insert("average_model_state", c10::IValue());
  } else {
    StateDict average;
    for (std::size_t i = 0; i < names_.size(); ++i) average.insert(names_[i], average_[i].clone());
    s.insert("average_model_state", average.to_ivalue());
  }
  return s;
}

void StochasticWeightAveraging::load_state_dict(const StateDict& state) {
  if (state.contains("n_averaged")) n_averaged_ = state.at("n_averaged").toInt();
  if (state.contains("latest_update_epoch")) latest_update_epoch_ = state.at("latest_update_epoch").toInt();
  if (state.contains("average_model_state") && state.at("average_model_state").isGenericDict())
    loaded_average_ = StateDict(state.at("average_model_state").toGenericDict());
}

namespace detail {

namespace {

/// f(layer) for each BatchNorm{1,2,3}d and SyncBatchNorm of the module (itself included): Python's
/// _BatchNorm subclasses, which update_bn and Lightning's SWA look for.
template <class F>
void for_each_batch_norm(const torch::nn::Module& module, F&& f) {
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (auto* bn = dynamic_cast<torch::nn::BatchNorm1dImpl*>(child.get())) f(*bn);
    else if (auto* bn2 = dynamic_cast<torch::nn::BatchNorm2dImpl*>(child.get())) f(*bn2);
    else if (auto* bn3 = dynamic_cast<torch::nn::BatchNorm3dImpl*>(child.get())) f(*bn3);
    else if (auto* sync = dynamic_cast<nn::SyncBatchNormImpl*>(child.get())) f(*sync);
  }
}

}  // namespace

struct BatchNormPass::Layers {
  torch::nn::Module* module = nullptr;
  bool was_training = true;
  std::vector<std::function<void()>> restore;
};

BatchNormPass::BatchNormPass(torch::nn::Module& module) : layers_(std::make_unique<Layers>()) {
  layers_->module = &module;
  layers_->was_training = module.is_training();
  for_each_batch_norm(module, [&](auto& bn) {
    bn.reset_running_stats();
    const std::optional<double> momentum = bn.options.momentum();
    bn.options.momentum(std::nullopt);
    layers_->restore.push_back([&bn, momentum] { bn.options.momentum(momentum); });
  });
  if (any()) module.train();
}

BatchNormPass::~BatchNormPass() {
  if (!any()) return;
  for (auto& restore : layers_->restore) restore();
  layers_->module->train(layers_->was_training);
}

bool BatchNormPass::any() const { return !layers_->restore.empty(); }

bool contains_batch_norm(const torch::nn::Module& module) {
  bool found = false;
  for_each_batch_norm(module, [&](auto&) { found = true; });
  return found;
}

}  // namespace detail

}  // namespace fulgur
