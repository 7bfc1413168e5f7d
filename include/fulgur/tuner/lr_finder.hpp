#pragma once
// fulgur::lr_find: Lightning's Tuner.lr_find (tuner/lr_finder.py) for a fulgur Trainer.
//
//   auto found = fulgur::lr_find(trainer, model, loader, {.min_lr = 1e-6, .max_lr = 1.0});
//   if (auto lr = found.suggestion()) model->lr = *lr;
//   trainer.fit(model, loader);  // as if lr_find had not run
//
// The range test trains num_training steps on the module's own optimizer (configure_optimizers,
// one optimizer, as Lightning), with every parameter group's learning rate set by Lightning's
// _ExponentialLR / _LinearLR schedule; after each step the training_step loss is read (a host
// sync per step, as Lightning's loss.item()), smoothed, and the search stops when it diverges.
// Then everything is put back as it was: the module's parameters, buffers and gradients, its
// train/eval mode, the CPU and device random state, the precision's loss scaler. The optimizer of
// the search is dropped (fit calls configure_optimizers again) and no callback, logger or loop
// counter of the Trainer is touched, so a fit afterwards is the fit it would have been (tested bit
// for bit). Gradient accumulation, limit_train_batches, max_epochs and gradient clipping apply as
// in fit (Lightning's search runs inside fit).
// The steps go through the Trainer's Fabric verbs (strategy and precision included: DDP reduces
// the gradients, the sharded strategies shard, '16-mixed' scales the loss).
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <concepts>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "fulgur/concepts/training_module.hpp"
#include "fulgur/detail/trainer_arguments.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/hooks.hpp"
#include "fulgur/loops/fit.hpp"
#include "fulgur/metrics.hpp"
#include "fulgur/optimization.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/step_context.hpp"
#include "fulgur/trainer_config.hpp"
#include "fulgur/tuner/lr_finder_result.hpp"

namespace fulgur {
namespace lr_finder {

/// The module's parameters, buffers, gradients and mode, and the random state, put back when it
/// goes out of scope (also when the search throws: Lightning restores in a `finally`).
class Snapshot {
 public:
  Snapshot(torch::nn::Module& module, c10::Device device) : module_(module), random_(device), training_(module.is_training()) {
    torch::NoGradGuard no_grad;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const at::Tensor& grad = item.value().grad();
      parameters_.emplace(item.key(), std::pair{item.value().detach().clone(), grad.defined() ? grad.clone() : at::Tensor()});
    }
    for (const auto& item : module.named_buffers(/*recurse=*/true))
      buffers_.emplace(item.key(), item.value().defined() ? item.value().detach().clone() : at::Tensor());
  }
  ~Snapshot() {
    torch::NoGradGuard no_grad;
    for (auto& item : module_.named_parameters(/*recurse=*/true)) {
      const auto found = parameters_.find(item.key());
      if (found == parameters_.end()) continue;
      put_back(item.value(), found->second.first);
      item.value().mutable_grad() = found->second.second;
    }
    for (auto& item : module_.named_buffers(/*recurse=*/true)) {
      const auto found = buffers_.find(item.key());
      if (found != buffers_.end() && found->second.defined()) put_back(item.value(), found->second);
    }
    module_.train(training_);
  }
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

 private:
  static void put_back(at::Tensor& live, const at::Tensor& saved) {
    if (live.sizes() == saved.sizes() && live.device() == saved.device() && live.dtype() == saved.dtype())
      live.copy_(saved);
    else
      live.set_data(saved);  // a strategy changed its form (a shard): the whole tensor, as it was
  }
  torch::nn::Module& module_;
  loops::IsolatedRandomState random_;
  bool training_;
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> parameters_;  // name -> (value, grad)
  std::map<std::string, at::Tensor> buffers_;
};

/// The precision's state (the loss scaler's scale and growth tracker under '16-mixed'), put back
/// when it goes out of scope: Lightning's checkpoint round trip restores it too.
template <class Precision>
class PrecisionSnapshot {
 public:
  explicit PrecisionSnapshot(Precision& precision) : precision_(precision), saved_(precision.state_dict()) {}
  ~PrecisionSnapshot() { precision_.load_state_dict(saved_); }
  PrecisionSnapshot(const PrecisionSnapshot&) = delete;
  PrecisionSnapshot& operator=(const PrecisionSnapshot&) = delete;

 private:
  Precision& precision_;
  StateDict saved_;
};

template <class M>
concept has_lr_member = requires(M& m) { m.lr = 1.0; };
template <class M>
concept has_learning_rate_member = requires(M& m) { m.learning_rate = 1.0; };

}  // namespace lr_finder

namespace lr_finder {

/// The search; `attribute`: the member update_attr sets (nullptr: `lr` or `learning_rate`).
template <class TrainerT, class ModuleRef, class TrainData, class Attribute>
LRFinderResult search(TrainerT& trainer, ModuleRef& module, TrainData& train_data, const LRFindOptions& options,
                      Attribute attribute) {
  auto& m = fulgur::detail::referent(module);
  using Module = std::remove_cvref_t<decltype(m)>;
  static_assert(fulgur::detail::automatic_optimization_of<Module>(),
                "fulgur::lr_find drives the optimizer itself (Lightning's scheduler swap): a module with "
                "automatic_optimization = false is not supported; find its learning rate with automatic optimization.");
  check_options(options);
  constexpr bool named = !std::is_null_pointer_v<Attribute>;
  if constexpr (!named && !has_lr_member<Module> && !has_learning_rate_member<Module>)
    if (options.update_attr) raise_no_lr_attribute();
  const TrainerConfig& config = trainer.config();
  const std::int64_t accumulate = config.accumulate_grad_batches;  // validated by the Trainer (>= 1)

  LRFinderResult result;
  result.mode = options.mode;
  {
    Snapshot snapshot(m, trainer.device());
    PrecisionSnapshot precision_snapshot(trainer.precision());
    auto&& loader = trainer.setup_dataloader(fulgur::detail::range_ref(train_data));
    // The epochs fit would run: limit_train_batches applies (Lightning's search runs inside fit).
    loops::require_batches(loader, config.limit_train_batches, "training",
                           "give lr_find samples (with drop_last, at least batch_size of them), or check "
                           "limit_train_batches.");
    const std::int64_t epoch_batches = loops::batch_limit(loader, config.limit_train_batches, "limit_train_batches");
    trainer.setup_module(module);
    auto configs = fulgur::detail::to_optimizer_configs(m.configure_optimizers());
    if (configs.size() != 1) raise_optimizer_count(configs.size());
    torch::optim::Optimizer& optimizer = *configs.front().optimizer;  // its scheduler, if any, is replaced
    trainer.setup_optimizers(optimizer);

    std::int64_t max_epochs = std::numeric_limits<std::int64_t>::max();  // Lightning's defaults
    if (config.max_epochs && *config.max_epochs >= 0) max_epochs = *config.max_epochs;
    else if (!config.max_epochs && config.max_steps == -1) max_epochs = 1000;
    std::optional<ClipGradients> clip;
    if (config.gradient_clip_val && *config.gradient_clip_val > 0.0) {
      clip.emplace(ClipGradients{.error_if_nonfinite = false});
      (config.gradient_clip_algorithm == GradientClipAlgorithm::norm ? clip->max_norm : clip->clip_val) =
          *config.gradient_clip_val;
    }
    StepContext ctx;
    ctx.global_rank = trainer.global_rank();
    ctx.world_size = trainer.world_size();
    detail::MetricCollection logged{/*training=*/true};  // what a step logs is accepted and dropped
    logged.set_device(trainer.device());                 // (Lightning's search logs to a DummyLogger)
    ctx.attach(&logged);
    LossTracker tracker(options.early_stop_threshold);
    std::int64_t step = 0;
    bool stop = false;
    for (std::int64_t epoch = 0; epoch < max_epochs && step < options.num_training && !stop; ++epoch) {
      ctx.current_epoch = epoch;
      logged.reset();
      if constexpr (requires { loader.set_epoch(epoch); }) loader.set_epoch(epoch);
      std::int64_t batch_idx = 0;
      // One batch ahead, as Lightning's data fetcher: the last batch of an epoch steps even inside an
      // accumulation window.
      using std::begin, std::end;
      auto next = begin(loader);
      const auto stop_at = end(loader);
      while (next != stop_at && batch_idx != epoch_batches) {
        auto batch = *next;
        ++next;
        const bool last = next == stop_at || batch_idx + 1 == epoch_batches;
        // Lightning's _LRCallback records at the last batch of a window only (a shorter window at an
        // epoch's end steps the optimizer and the schedule without a point, as there).
        const bool records = (batch_idx + 1) % accumulate == 0;
        const bool steps = records || last;
        const double lr = scheduled_lr(options, step);
        for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
        if (records) result.lrs.push_back(lr);
        const auto on_device = trainer.convert_batch(trainer.batch_to_device(batch));
        if (batch_idx % accumulate == 0) optimizer.zero_grad();
        ctx.batch_idx = batch_idx;
        at::Tensor loss;
        {
          auto precision_context = trainer.forward_context();
          ctx.enter(hooks::training_step_t::name, hooks::training_step_t::log_scope);
          if constexpr (requires { m.training_step(on_device, batch_idx, ctx); })
            loss = m.training_step(on_device, batch_idx, ctx);
          else
            loss = m.training_step(on_device, batch_idx);
        }
        if (accumulate > 1) loss = loss / accumulate;  // Lightning's normalized loss, also what it records
        {
          auto accumulating = trainer.no_backward_sync(module, !steps);
          trainer.backward(loss, module);
        }
        if (steps) {
          if (clip) trainer.clip_gradients(module, optimizer, *clip);
          trainer.optimizer_step(optimizer);
          ctx.global_step = ++step;
        }
        if (records) {
          const double raw = loss.detach().item<double>();  // the host sync Lightning's loss.item() has
          result.raw_losses.push_back(raw);
          result.losses.push_back(tracker.add(raw, step));
          stop = tracker.stop();
          if (trainer.world_size() > 1)  // every rank follows rank 0, as Lightning's broadcast of should_stop
            stop = trainer.broadcast(at::full({1}, stop ? 1 : 0, at::TensorOptions(at::kInt).device(trainer.device())))
                       .template item<int>() != 0;
        }
        ++batch_idx;
        if (stop || step >= options.num_training) break;
      }
      if (batch_idx == 0)  // a loader that could not tell its length, and gave nothing
        throw DataError("lr_find: the training data gave no batches in epoch " + std::to_string(epoch) +
                        "; give it samples, or check limit_train_batches.");
    }
    result.stopped_early = stop;
    if (!stop && step < options.num_training && trainer.global_rank() == 0) warn_cut_short(options, step, max_epochs);
    trainer.end_training();
    if (trainer.world_size() > 1) {  // rank 0's results on every rank (Lightning broadcasts them)
      const auto n = static_cast<std::int64_t>(result.lrs.size());
      auto share = [&](std::vector<double>& values) {
        at::Tensor t = at::from_blob(values.data(), {n}, at::kDouble).to(trainer.device());
        t = trainer.broadcast(t).cpu().contiguous();
        std::copy(t.data_ptr<double>(), t.data_ptr<double>() + n, values.begin());
      };
      share(result.losses);
      share(result.raw_losses);
    }
  }  // the snapshot is put back here
  if (options.update_attr) {
    if (const auto lr = result.suggestion()) {
      if constexpr (named) m.*attribute = *lr;
      else if constexpr (has_lr_member<Module>) m.lr = *lr;
      else if constexpr (has_learning_rate_member<Module>) m.learning_rate = *lr;
      result.applied_lr = lr;
    }
  }
  return result;
}

}  // namespace lr_finder

/// Lightning's trainer-level Tuner(trainer).lr_find(model, train_dataloaders, ...): a learning-rate
/// range test on `train_data`; the Trainer, the module and the data are left as they were (see the
/// header comment). Validation data is not needed: Lightning's search ends before validating.
/// update_attr sets the module's `lr` or `learning_rate` member (Lightning's automatic names).
template <class TrainerT, class ModuleRef, class TrainData>
LRFinderResult lr_find(TrainerT& trainer, ModuleRef& module, TrainData& train_data, const LRFindOptions& options = {}) {
  return lr_finder::search(trainer, module, train_data, options, nullptr);
}
/// The same, update_attr setting the member `attribute` (Lightning's attr_name), e.g. &NetImpl::base_lr.
template <class TrainerT, class ModuleRef, class TrainData, class Module>
  requires std::derived_from<std::remove_cvref_t<decltype(fulgur::detail::referent(std::declval<ModuleRef&>()))>, Module>
LRFinderResult lr_find(TrainerT& trainer, ModuleRef& module, TrainData& train_data, const LRFindOptions& options,
                       double Module::*attribute) {
  if (attribute == nullptr)
    throw MisconfigurationError("lr_find: the attribute for the learning rate is a null member pointer; "
                                "pass the member to set, e.g. &MyModelImpl::lr.");
  return lr_finder::search(trainer, module, train_data, options, attribute);
}

}  // namespace fulgur
