#pragma once
// The fit and validation loops of Trainer (included at the end of trainer.hpp).
//
// Per training batch, exactly what a hand-written LibTorch loop does: move the batch, convert the
// model inputs, forward and loss inside the precision's context, backward, and on a stepping batch
// clip (after unscaling), step, zero_grad. The loss reaches the host only every
// log_every_n_steps steps and on an epoch's last batch.
#include <ATen/ATen.h>
#include <torch/data/example.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <type_traits>

#include "fulgur/data/apply.hpp"
#include "fulgur/data/batch.hpp"
#include "fulgur/detail/describe.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/step_context.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur {

namespace detail {

struct NoValidationData {};

template <class Data>
using batch_of_t = std::remove_cvref_t<decltype(*std::begin(std::declval<Data&>()))>;

/// The model's inputs in the precision's dtype; targets are left as they are, so a regression
/// target is never rounded to half precision (Batch.input / Example.data; every tensor otherwise).
template <class Precision, class Batch>
auto convert_model_inputs(Precision& precision, const Batch& batch) {
  if constexpr (std::is_same_v<Batch, data::Batch>)
    return data::Batch{at::Tensor(precision.convert_input(batch.input)), batch.target};
  else if constexpr (requires { batch.data; batch.target; typename Batch::DataType; })
    return Batch{precision.convert_input(batch.data), batch.target};
  else
    return precision.convert_input(batch);
}

template <class Output>
at::Tensor loss_of(const Output& output) {
  if constexpr (std::is_convertible_v<Output, at::Tensor>)
    return output;
  else
    return output.loss;
}

#define FULGUR_DETAIL_CALL_STEP(step)                                                             \
  template <class M, class B>                                                                     \
  at::Tensor call_##step(M& module, const B& batch, std::int64_t batch_idx, StepContext& ctx) {   \
    if constexpr (requires { module.step(batch, batch_idx, ctx); })                               \
      return loss_of(module.step(batch, batch_idx, ctx));                                         \
    else                                                                                          \
      return loss_of(module.step(batch, batch_idx));                                              \
  }
FULGUR_DETAIL_CALL_STEP(training_step)
FULGUR_DETAIL_CALL_STEP(validation_step)
#undef FULGUR_DETAIL_CALL_STEP

#define FULGUR_DETAIL_HOOK(hook) \
  template <class M>             \
  void hook(M& module) {         \
    if constexpr (requires { module.hook(); }) module.hook(); \
  }
FULGUR_DETAIL_HOOK(on_fit_start)
FULGUR_DETAIL_HOOK(on_train_start)
FULGUR_DETAIL_HOOK(on_train_epoch_start)
FULGUR_DETAIL_HOOK(on_train_epoch_end)
FULGUR_DETAIL_HOOK(on_validation_epoch_end)
FULGUR_DETAIL_HOOK(on_train_end)
#undef FULGUR_DETAIL_HOOK

template <class R>
OptimizerConfig to_optimizer_config(R&& returned) {
  if constexpr (std::is_same_v<std::remove_cvref_t<R>, OptimizerConfig>) {
    return std::move(returned);
  } else if constexpr (requires { returned.optimizer; }) {
    OptimizerConfig config;
    config.optimizer = std::move(returned.optimizer);
    return config;
  } else {
    OptimizerConfig config;
    config.optimizer = std::move(returned);
    return config;
  }
}

inline std::string position_text(const char* step, std::int64_t epoch, std::int64_t batch_idx,
                                 std::int64_t global_step) {
  return std::string(step) + " at epoch " + std::to_string(epoch) + ", batch " + std::to_string(batch_idx) +
         " (global_step " + std::to_string(global_step) + ")";
}

/// The batch on the strategy's device with the model inputs in the precision's dtype; a batch
/// that cannot get there (a tensor on another or a meta device, say) is a StepError naming it.
template <class Strategy, class Precision, class Batch>
auto prepare_batch(Strategy& strategy, Precision& precision, const Batch& batch, const char* step,
                   std::int64_t epoch, std::int64_t batch_idx, std::int64_t global_step) {
  try {
    return convert_model_inputs(precision, strategy.batch_to_device(batch));
  } catch (const c10::Error& e) {
    throw StepError("fulgur: moving the batch of " + position_text(step, epoch, batch_idx, global_step) + " to " +
                    strategy.root_device().str() + " failed: " + first_line(e.what_without_backtrace()) +
                    "\n  batch: " + describe_batch(batch) +
                    ". Give the loader tensors on the CPU (or on the training device).");
  }
}

inline std::string parameters_text(torch::nn::Module& module) {
  for (const auto& p : module.parameters())
    return "the module's parameters are " + dtype_name(p.scalar_type()) + " on " + p.device().str();
  return "the module has no parameters";
}

/// The StepError for a step that LibTorch refused: where, why, the batch and the model.
template <class Batch>
StepError step_failure(const char* step, std::int64_t epoch, std::int64_t batch_idx, std::int64_t global_step,
                       std::string_view precision, const c10::Error& error, const Batch& batch,
                       torch::nn::Module& module) {
  return StepError("fulgur: " + position_text(step, epoch, batch_idx, global_step) + " failed under precision '" +
                   std::string(precision) + "': " + first_line(error.what_without_backtrace()) + "\n  batch: " +
                   describe_batch(batch) + "\n  " + parameters_text(module) +
                   ". Make the batch's dtype, shape and device match what the model expects.");
}

inline std::string fixed(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", v);
  return text;
}

inline void check_config(const TrainerConfig& c) {
  auto bad = [](const std::string& what) { throw MisconfigurationError(what); };
  if (c.max_epochs && *c.max_epochs < -1) bad("`max_epochs` must be >= -1 (-1: no limit), got " + std::to_string(*c.max_epochs) + ".");
  if (c.max_steps < -1) bad("`max_steps` must be >= -1 (-1: no limit), got " + std::to_string(c.max_steps) + ".");
  if (c.accumulate_grad_batches < 1)
    bad("`accumulate_grad_batches` must be >= 1, got " + std::to_string(c.accumulate_grad_batches) + ".");
  if (c.gradient_clip_val && *c.gradient_clip_val < 0)
    bad("`gradient_clip_val` must be >= 0 (0 or unset: no clipping), got " + std::to_string(*c.gradient_clip_val) + ".");
  if (c.log_every_n_steps < 1) bad("`log_every_n_steps` must be >= 1, got " + std::to_string(c.log_every_n_steps) + ".");
  if (c.check_val_every_n_epoch < 1)
    bad("`check_val_every_n_epoch` must be >= 1, got " + std::to_string(c.check_val_every_n_epoch) + ".");
  if (c.limit_train_batches && *c.limit_train_batches < 0) bad("`limit_train_batches` must be >= 0.");
  if (c.limit_val_batches && *c.limit_val_batches < 0) bad("`limit_val_batches` must be >= 0.");
}

}  // namespace detail

template <class A, class S, class P>
template <class Module, class TrainData>
FitResult Trainer<A, S, P>::fit(Module& module, TrainData& train_data) {
  return run_fit(module, train_data, static_cast<detail::NoValidationData*>(nullptr));
}

template <class A, class S, class P>
template <class Module, class TrainData, class ValData>
FitResult Trainer<A, S, P>::fit(Module& module, TrainData& train_data, ValData& val_data) {
  return run_fit(module, train_data, &val_data);
}

template <class A, class S, class P>
template <class Module, class ValData>
double Trainer<A, S, P>::validate(Module& module, ValData& val_data) {
  std::map<std::string, double> metrics;
  return validation_loop(module, val_data, 0, 0, metrics);
}

template <class A, class S, class P>
template <class Module, class ValData>
double Trainer<A, S, P>::validation_loop(Module& module, ValData& val_data, std::int64_t epoch,
                                         std::int64_t global_step, std::map<std::string, double>& metrics) {
  auto& m = detail::module_ref(module);
  using M = std::remove_cvref_t<decltype(m)>;
  auto&& range = strategy_.process_dataloader(detail::range_ref(val_data));  // each rank validates its shard
  using Batch = detail::batch_of_t<std::remove_reference_t<decltype(range)>>;
  static_assert(has_validation_step<M, Batch>,
                "fulgur: validation data was given but the module has no validation_step(batch, batch_idx) "
                "returning its loss; add one, or call fit without validation data.");
  torch::NoGradGuard no_grad;
  const bool was_training = m.is_training();
  m.eval();
  StepContext ctx;
  ctx.global_rank = global_rank();
  ctx.current_epoch = epoch;
  ctx.global_step = global_step;
  ctx.reset(/*accumulate=*/true);  // logged values: batch-size-weighted means over the epoch
  at::Tensor weighted_sum;
  double weight = 0.0;
  std::int64_t batch_idx = 0;
  for (auto&& batch : range) {
    if (config_.limit_val_batches && batch_idx >= *config_.limit_val_batches) break;
    auto device_batch = detail::prepare_batch(strategy_, precision_, batch, "validation_step", epoch, batch_idx, global_step);
    const std::int64_t batch_size = data::extract_batch_size(device_batch);
    ctx.batch_idx = batch_idx;
    ctx.set_batch_size(batch_size);
    at::Tensor loss;
    try {
      auto guard = precision_.forward_context();
      loss = detail::call_validation_step(m, device_batch, batch_idx, ctx);
    } catch (const c10::Error& e) {
      throw detail::step_failure("validation_step", epoch, batch_idx, global_step, P::name, e, device_batch, m);
    }
    const at::Tensor contribution = loss.detach().to(at::kDouble) * static_cast<double>(batch_size);
    weighted_sum = weighted_sum.defined() ? weighted_sum + contribution : contribution;
    weight += static_cast<double>(batch_size);
    ++batch_idx;
  }
  if (batch_idx == 0)
    throw DataError("fulgur: the validation data yielded no batches; give it data, or call fit without it.");
  const at::Tensor totals =
      strategy_.all_reduce(at::stack({weighted_sum, at::scalar_tensor(weight, weighted_sum.options())}), ReduceOp::sum);
  for (const auto* entry : ctx.entries_by_name()) {  // the same order on every rank
    at::Tensor mean = entry->sum / entry->weight;
    if (entry->options.sync_dist) mean = strategy_.all_reduce(mean, ReduceOp::mean);
    metrics[entry->name] = mean.template item<double>();
  }
  m.train(was_training);
  detail::on_validation_epoch_end(m);
  return (totals[0] / totals[1]).template item<double>();
}

template <class A, class S, class P>
template <class Module, class TrainData, class ValData>
FitResult Trainer<A, S, P>::run_fit(Module& module, TrainData& train_data, ValData* val_data) {
  constexpr bool has_val = !std::is_same_v<ValData, detail::NoValidationData>;
  auto& m = detail::module_ref(module);
  using M = std::remove_cvref_t<decltype(m)>;
  auto&& train = strategy_.process_dataloader(detail::range_ref(train_data));  // a strategy may shard it
  using Batch = detail::batch_of_t<std::remove_reference_t<decltype(train)>>;
  static_assert(training_module<M, Batch>,
                "fulgur: the module must derive from torch::nn::Module and define "
                "training_step(const Batch&, int64_t batch_idx) returning the loss (or a struct with `loss`) for "
                "the batches of train_data, and configure_optimizers() returning a std::unique_ptr<Optimizer> or "
                "fulgur::OptimizerConfig; see docs/concepts/training_module.md.");

  detail::check_config(config_);
  const std::int64_t max_epochs = config_.max_epochs ? *config_.max_epochs : (config_.max_steps == -1 ? 1000 : -1);
  if (m.parameters().empty())
    throw MisconfigurationError("fulgur: the module " + m.name() +
                                " has no parameters, so there is nothing to train; register them with "
                                "register_module/register_parameter in its constructor.");

  precision_.convert_module(m);
  strategy_.module_to_device(m);
  OptimizerConfig optimization = detail::to_optimizer_config(m.configure_optimizers());
  if (!optimization.optimizer)
    throw MisconfigurationError("fulgur: configure_optimizers() returned no optimizer; return one, e.g. "
                                "std::make_unique<torch::optim::Adam>(parameters(), 1e-3).");
  if (optimization.frequency < 1) throw MisconfigurationError("fulgur: OptimizerConfig::frequency must be >= 1.");
  torch::optim::Optimizer& optimizer = *optimization.optimizer;
  std::vector<torch::optim::Optimizer*> optimizers{&optimizer};
  strategy_.setup_module_and_optimizers(m, optimizers);
  module_ = &m;

  const std::int64_t accumulate = config_.accumulate_grad_batches;
  const bool clip = config_.gradient_clip_val && *config_.gradient_clip_val > 0.0;
  constexpr bool scaler = detail::uses_scaler<P>();

  FitResult result;
  StepContext ctx;
  ctx.global_rank = global_rank();
  std::int64_t global_step = 0;
  bool stop = config_.max_steps == 0;
  std::int64_t last_checked_step = 0;

  detail::on_fit_start(m);
  m.train();
  detail::on_train_start(m);
  optimizer.zero_grad();

  for (std::int64_t epoch = 0; !stop && (max_epochs == -1 || epoch < max_epochs); ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    if constexpr (requires { train.set_epoch(epoch); }) train.set_epoch(epoch);
    m.train();
    detail::on_train_epoch_start(m);
    ctx.reset(/*accumulate=*/false);
    ctx.current_epoch = epoch;

    EpochSummary summary;
    summary.epoch = epoch;
    std::int64_t batch_idx = 0, stepped_in_epoch = 0;
    auto it = std::begin(train);
    auto end = std::end(train);
    const std::int64_t limit = config_.limit_train_batches.value_or(-1);
    std::optional<Batch> current;
    if (limit != 0 && it != end) {
      current.emplace(*it);
      ++it;
    }
    while (current) {
      // One batch of look-ahead tells whether this batch is the epoch's last (accumulation flushes there).
      const bool is_last = it == end || (limit >= 0 && batch_idx + 1 >= limit);
      auto device_batch =
          detail::prepare_batch(strategy_, precision_, *current, "training_step", epoch, batch_idx, global_step);
      ctx.batch_idx = batch_idx;
      ctx.global_step = global_step;

      const bool step_now = (batch_idx + 1) % accumulate == 0 || is_last;
      at::Tensor loss;
      try {
        {
          auto guard = precision_.forward_context();
          loss = detail::call_training_step(m, device_batch, batch_idx, ctx);
        }
        if (!loss.defined() || loss.numel() != 1)
          throw StepError("fulgur: " + detail::position_text("training_step", epoch, batch_idx, global_step) +
                          " returned " + (loss.defined() ? detail::describe_tensor(loss) : "an undefined tensor") +
                          "; return the scalar loss (reduce it with .mean() or .sum()).");
        if (accumulate > 1) loss = loss / static_cast<double>(accumulate);
        auto local_only = no_backward_sync(!step_now);  // micro-batches accumulate without communication
        strategy_.backward(loss, m, precision_);
      } catch (const c10::Error& e) {
        throw detail::step_failure("training_step", epoch, batch_idx, global_step, P::name, e, device_batch, m);
      }

      if (step_now) {
        if (clip) {
          if (config_.gradient_clip_algorithm == GradientClipAlgorithm::norm)
            strategy_.clip_gradients_norm(m, optimizer, *config_.gradient_clip_val, 2.0,
                                          /*error_if_nonfinite=*/false, precision_);
          else
            strategy_.clip_gradients_value(m, optimizer, *config_.gradient_clip_val, precision_);
        }
        const bool stepped = precision_.optimizer_step(optimizer);
        optimizer.zero_grad();
        ++global_step;
        if (stepped) {
          ++stepped_in_epoch;
          // A skipped step leaves the learning rate alone (Lightning issues 5558, 16228).
          if (optimization.lr_scheduler && optimization.interval == SchedulerInterval::step &&
              global_step % optimization.frequency == 0)
            optimization.lr_scheduler->step();
        } else {
          ++summary.skipped_optimizer_steps;
        }
      }

      // The loss reaches the host only here: on log steps, the first step and the epoch's last batch.
      const bool read_loss = is_last || (step_now && (global_step == 1 || global_step % config_.log_every_n_steps == 0)) ||
                             config_.finite_loss_check == FiniteLossCheck::every_step;
      if (read_loss) {
        const double value = loss.detach().template item<double>() * static_cast<double>(accumulate);
        if (!scaler && config_.finite_loss_check != FiniteLossCheck::off && !std::isfinite(value))
          throw NonFiniteLossError(
              "fulgur: the loss is " + std::string(std::isnan(value) ? "NaN" : "infinite") + " at " +
              detail::position_text("training_step", epoch, batch_idx, global_step) + " under precision '" +
              std::string(P::name) + "'" +
              (config_.finite_loss_check == FiniteLossCheck::every_step
                   ? std::string(".")
                   : "; it was last seen finite at global_step " + std::to_string(last_checked_step) + ".") +
              " Lower the learning rate, clip gradients (TrainerConfig::gradient_clip_val), check the data for "
              "NaN/inf, or set finite_loss_check = FiniteLossCheck::every_step to stop at the first bad batch.");
        last_checked_step = global_step;
        summary.train_loss = value;
      }
      if (config_.max_steps >= 0 && global_step >= config_.max_steps) stop = true;
      ++batch_idx;
      if (is_last || stop) break;
      current.emplace(*it);
      ++it;
    }
    if (batch_idx == 0) {
      std::string what = "fulgur: the training data yielded no batches in epoch " + std::to_string(epoch);
      if constexpr (requires { train.describe(); }) what += " (" + train.describe() + ")";
      throw DataError(what + "; give it samples (with drop_last, at least batch_size of them), or check "
                             "limit_train_batches.");
    }

    summary.global_step = global_step;
    result.metrics["train_loss"] = summary.train_loss;
    for (const auto* entry : ctx.entries_by_name()) {  // the same order on every rank
      at::Tensor v = entry->sum.detach().to(at::kDouble);
      if (entry->options.sync_dist) v = strategy_.all_reduce(v, ReduceOp::mean);
      result.metrics[entry->name] = v.template item<double>();
    }
    if constexpr (has_val) {
      if ((epoch + 1) % config_.check_val_every_n_epoch == 0) {
        summary.val_loss = validation_loop(m, *val_data, epoch, global_step, result.metrics);
        result.metrics["val_loss"] = *summary.val_loss;
      }
    }
    detail::on_train_epoch_end(m);
    if (optimization.lr_scheduler && optimization.interval == SchedulerInterval::epoch && stepped_in_epoch > 0 &&
        (epoch + 1) % optimization.frequency == 0)
      optimization.lr_scheduler->step();

    result.skipped_optimizer_steps += summary.skipped_optimizer_steps;
    result.epochs.push_back(summary);
    if (config_.enable_progress_bar) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
      print("epoch ", epoch + 1, max_epochs > 0 ? "/" + std::to_string(max_epochs) : std::string(), "  step ",
            global_step, "  train_loss ", detail::fixed(summary.train_loss),
            summary.val_loss ? "  val_loss " + detail::fixed(*summary.val_loss) : std::string(),
            summary.skipped_optimizer_steps ? "  skipped_steps " + std::to_string(summary.skipped_optimizer_steps)
                                            : std::string(),
            "  (", detail::fixed(seconds), " s)");
    }
  }
  result.global_step = global_step;
  detail::on_train_end(m);
  return result;
}

}  // namespace fulgur
