// What the loops share, compiled once (include/fulgur/loops/common.hpp, optimization.hpp).
#include "fulgur/loops/common.hpp"

#include <c10/util/Type.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <exception>
#include <iostream>
#include <typeinfo>

#include "fulgur/detail/host_terms.hpp"
#include "fulgur/loggers/log_directory.hpp"
#include "fulgur/loops/optimization.hpp"
#include "src/detail/error_text.hpp"
#include "src/strategies/sharded/gradient_check.hpp"

namespace fulgur::loops {

std::string position_text(std::string_view step, std::int64_t epoch, std::int64_t batch_idx,
                          std::int64_t global_step) {
  return std::string(step) + " at epoch " + std::to_string(epoch) + ", batch " + std::to_string(batch_idx) +
         " (global_step " + std::to_string(global_step) + ")";
}

namespace {
std::string evaluation_call(Stage stage, const std::string& path) {
  return std::string(to_string(stage)) + "(ckpt_path = '" + path + "')";
}
}  // namespace

StateDict evaluation_weights(const StateDict& checkpoint, const std::string& path, Stage stage) {
  if (!checkpoint.contains("state_dict") || !checkpoint.at("state_dict").isGenericDict())
    throw CheckpointError("fulgur: " + evaluation_call(stage, path) + ": the file holds no 'state_dict' (module "
                          "weights); give a checkpoint written by fit (ModelCheckpoint, Trainer::save_checkpoint).");
  return StateDict(checkpoint.at("state_dict").toGenericDict());
}

void raise_evaluation_weights_mismatch(const std::exception& error, const std::string& path, Stage stage) {
  std::string text = detail::without_fulgur_prefix(error.what());
  // The loader's own advice (strict = false) is for loading weights by hand, which is what to do here.
  const bool partial = detail::without_strict_advice(text);
  throw CheckpointError("fulgur: " + evaluation_call(stage, path) + ": " + text +
                        (partial ? "\nTo " + std::string(to_string(stage)) + " on the weights that match, load them into "
                                   "the module first (fulgur::checkpoint::load_module_state_dict(module, fulgur::checkpoint::"
                                   "module_weights(fulgur::checkpoint::load(path)), /*strict=*/false)) and call it "
                                   "without ckpt_path."
                                 : ""));
}

std::vector<std::string> say_evaluation_warnings(const EvaluationWeights& weights, Stage stage, std::int64_t repeated,
                                                 int world_size, int global_rank) {
  std::vector<std::string> said = weights.warnings;
  if (repeated > 0)
    said.push_back("fulgur: " + std::string(to_string(stage)) + " under " + std::to_string(world_size) +
                   " processes evaluated " + std::to_string(repeated) + " sample" + (repeated == 1 ? "" : "s") +
                   " twice: the data do not divide by the number of processes, and the shards are padded with "
                   "repeated samples so that every rank runs the same batches (as Lightning's DistributedSampler). "
                   "For each sample exactly once, " + std::string(to_string(stage)) + " with devices = 1, or give "
                   "the loader a sample count that divides evenly.");
  if (global_rank == 0)
    for (const std::string& text : said) std::cerr << text << std::endl;
  return said;
}

bool stop_if_signalled(int world_size, c10::function_ref<bool(bool)> any_rank, c10::function_ref<std::string()> where,
                       bool training_done) {
  const int local_preemption = detail::preemption_signal();
  const bool local_interrupt = detail::interrupt_requested();
  bool any = local_preemption != 0 || local_interrupt;
  bool preemption = local_preemption != 0;
  bool interrupt = local_interrupt;
  if (world_size > 1) {
    any = any_rank(any);
    if (any) preemption = any_rank(preemption);
    if (any && preemption && training_done) interrupt = any_rank(interrupt);
  }
  if (!any) return false;
  if (!preemption || (training_done && interrupt)) throw Interrupted("interrupted by SIGINT (Ctrl-C) " + where());
  if (training_done) return true;
  const int signal = local_preemption != 0 ? local_preemption : SIGTERM;  // another rank's: say SIGTERM
  throw Preempted(signal, std::string("preempted by ") + (signal == SIGUSR1 ? "SIGUSR1" : "SIGTERM") + " " + where());
}

std::string say_resumed_at_batch_limit(std::int64_t epoch, std::int64_t first_batch, std::int64_t limit,
                                      bool global_zero) {
  std::string text = "fulgur: the checkpoint continues epoch " + std::to_string(epoch) + " at batch " +
                     std::to_string(first_batch) + ", but this run trains " + std::to_string(limit) +
                     " batches an epoch (" + detail::trainer_setting("limit_train_batches") + "): epoch " +
                     std::to_string(epoch) + " is over (its epoch-based schedulers step as at an epoch's end; the validation of its end "
                     "does not run), and fit goes on with epoch " + std::to_string(epoch + 1) + ".";
  if (global_zero) std::cerr << text << std::endl;
  return text;
}

void raise_resume_past_data(std::int64_t epoch, std::int64_t first_batch, std::int64_t batches) {
  throw CheckpointError("fulgur: the checkpoint continues epoch " + std::to_string(epoch) + " at batch " +
                        std::to_string(first_batch) + ", but the training data has only " + std::to_string(batches) +
                        " batches in it (after " + detail::trainer_setting("limit_train_batches") +
                        "); resume with the data, batch size and limit_train_batches the checkpoint was trained on.");
}

void raise_no_training_batches(std::int64_t epoch, const std::string& description) {
  throw DataError("fulgur: the training data yielded no batches in epoch " + std::to_string(epoch) +
                  (description.empty() ? std::string() : " (" + description + ")") +
                  "; give it samples (with drop_last, at least batch_size of them), or check limit_train_batches.");
}

std::string seconds_text(double seconds) { return loggers::detail::number_text(seconds); }  // as a CSV writes it

void raise_data_failure(const DataError& error, std::string_view what, const StepContext& ctx,
                        std::int64_t batch_idx) {
  std::string loader = "the " + std::string(what) + " data";
  if (ctx.dataloader_idx) loader += " (dataloader_idx " + std::to_string(*ctx.dataloader_idx) + ")";
  std::string run;
  if (ctx.sanity_checking) run = "the sanity check";
  else if (ctx.stage == Stage::fit) run = (what == "training" ? "" : "the validation in ") + std::string("epoch ") +
                                          std::to_string(ctx.current_epoch);
  else run = std::string(to_string(ctx.stage)) + "()";
  // The same type, so a caller that catches DataError still does; the loader's own text says which sample,
  // and the sample's exception stays nested in it, as the loader nested it.
  std::string message = "fulgur: " + loader + " failed making batch " + std::to_string(batch_idx) + " of " + run +
                        ": " + error.what();
  // (rethrow_if_nested would end the process on a nested_exception that holds nothing.)
  if (const auto* nested = dynamic_cast<const std::nested_exception*>(&error); nested && nested->nested_ptr()) {
    try {
      nested->rethrow_nested();
    } catch (...) {
      std::throw_with_nested(DataError(std::move(message)));
    }
  }
  throw DataError(std::move(message));
}

void raise_no_evaluation_batches(std::string_view what, bool standalone) {
  throw DataError("fulgur: the " + std::string(what) + " data yielded no batches; give it data, or " +
                  (standalone ? std::string("check its limit_*_batches.") : std::string("call fit without it.")));
}

void raise_loss_not_scalar(const StepContext& ctx, const at::Tensor& loss) {
  throw StepError("fulgur: " + position_text("training_step", ctx.current_epoch, ctx.batch_idx, ctx.global_step) +
                  " returned " + (loss.defined() ? detail::describe_tensor(loss) : "an undefined tensor") +
                  "; return the scalar loss (reduce it with .mean() or .sum()).");
}

void raise_non_finite_loss(double value, const StepContext& ctx, std::int64_t step_at_batch, std::string_view precision,
                           bool every_step, std::int64_t last_finite_step) {
  throw NonFiniteLossError(
      "fulgur: the loss is " + std::string(std::isnan(value) ? "NaN" : "infinite") + " at " +
      position_text("training_step", ctx.current_epoch, ctx.batch_idx, step_at_batch) + " under precision '" +
      std::string(precision) + "'" +
      (every_step || last_finite_step < 0 ? std::string(".")
                                          : "; it was last seen finite at global_step " + std::to_string(last_finite_step) + ".") +
      (precision == "16-true" ? " Under '16-true' an Adam or AdamW with its default eps (1e-8, which rounds to 0 in "
                                "float16) divides by zero: give it eps(1e-4), or train with SGD, 'bf16-true' or "
                                "'16-mixed'. Otherwise:"
                              : "") +
      " Lower the learning rate, clip gradients (" + detail::trainer_setting("gradient_clip_val") +
      ") or check the data for NaN/inf" +
      (every_step ? std::string(".")
                  : "; set " + detail::trainer_setting("finite_loss_check", "FiniteLossCheck::every_step", "every_step") +
                        " to stop at the first bad batch."));
}

std::string non_finite_evaluation_warning(std::string_view what, std::string_view step, double loss,
                                          const StepContext& ctx, bool global_zero) {
  std::string text = "fulgur: the " + std::string(what) + " loss is " + (std::isnan(loss) ? "NaN" : "infinite") +
                     " at epoch " + std::to_string(ctx.current_epoch) + " (global_step " + std::to_string(ctx.global_step) +
                     ")" + (ctx.sanity_checking ? ", in the sanity check before training" : "") + "; a " + std::string(step) + " returned a non-finite loss. Check the data and the model's outputs.";
  if (global_zero) std::cerr << text << std::endl;
  return text;
}

void raise_batch_transfer(std::string_view step, const StepContext& ctx, c10::Device device, const c10::Error& error,
                          const std::string& batch_description) {
  throw StepError("fulgur: moving the batch of " + position_text(step, ctx.current_epoch, ctx.batch_idx, ctx.global_step) +
                  " to " + device.str() + " failed: " + detail::first_line(error.what_without_backtrace()) +
                  "\n  batch: " + batch_description + ". Give the loader tensors on the CPU (or on the training device).");
}

void raise_no_parameters(const std::string& module_name) {
  throw MisconfigurationError("fulgur: the module " + module_name + " has no parameters, so there is nothing to train; "
                              "register them with register_module/register_parameter in its constructor (or create "
                              "them in configure_model).");
}

void require_parameters(const torch::optim::Optimizer& optimizer, std::string_view where) {
  for (const auto& group : optimizer.param_groups())
    if (!group.params().empty()) return;
  throw MisconfigurationError("fulgur: " + std::string(where) + " a " + c10::demangle(typeid(optimizer).name()) +
                              " over no parameters, which would train nothing (PyTorch: \"optimizer got an empty "
                              "parameter list\"); build it from the module's parameters(), e.g. "
                              "std::make_unique<torch::optim::Adam>(parameters(), 1e-3).");
}

std::string shutdown_failure_text(std::string_view where, const std::exception& thrown, const std::exception& original) {
  return "fulgur: " + std::string(where) + " threw while the run was ending: " + thrown.what() +
         " (reported here; the run's own error or interruption is what fit returns or throws: " + original.what() + ")";
}

std::string parameters_text(torch::nn::Module& module) {
  for (const auto& p : module.parameters())
    return "the module's parameters are " + detail::dtype_name(p.scalar_type()) + " on " + p.device().str();
  return "the module has no parameters";
}

std::int64_t batch_limit(std::optional<std::int64_t> length, const BatchAmount& limit, const char* field) {
  if (length) {
    const std::int64_t n = limit.of(*length);
    if (n == 0 && limit.is_fraction() && limit.fraction() > 0.0 && *length > 0)
      throw MisconfigurationError("You requested to check " + number_text(limit.fraction()) + " of the data but " +
                                  number_text(limit.fraction()) + " * " + std::to_string(*length) +
                                  " < 1. Please increase the `" + field + "` argument. Try at least `" + field + "=" +
                                  number_text(1.0 / static_cast<double>(*length)) + "`.");
    return n;
  }
  if (limit.is_all()) return -1;
  if (limit.is_fraction())
    throw MisconfigurationError(std::string("The loader cannot tell its length, so `") + field +
                                "` must be 1.0 or a number of batches (an int), got the fraction " +
                                number_text(limit.fraction()) + ".");
  return limit.count();
}

void throw_no_batches(std::string_view what, std::string_view advice, const std::string& description) {
  std::string text = "fulgur: the " + std::string(what) + " data yielded no batches";
  if (!description.empty()) text += " (" + description + ")";
  throw DataError(text + "; " + std::string(advice));
}

StepError step_failure(std::string_view step, const StepContext& ctx, std::string_view precision,
                       const c10::Error& error, const std::string& batch_description, torch::nn::Module& module) {
  const std::string what = detail::first_line(error.what_without_backtrace());
  // BatchNorm in training mode cannot normalize a batch of one (LibTorch's _verify_batch_size): almost always
  // the last batch of an epoch, where the dataset's size leaves one sample over. Not a dtype/shape/device issue.
  const std::string advice =
      what.find("returned nan values in its") != std::string::npos
          ? ". autograd's anomaly mode (" + detail::trainer_setting("detect_anomaly") +
                ") stopped the backward at the first function whose gradient is NaN: it is the backward of the "
                "forward op named (SqrtBackward0: a sqrt). Look for a gradient that divides by zero there (sqrt, "
                "log, pow or division at 0, also under a where() or a mask that zeroes its result)."
      : what.find("Expected more than 1 value per channel when training") != std::string::npos
          ? ". A batch norm layer in training mode cannot normalize a batch of one sample, which is usually the "
            "epoch's last batch when the dataset's size leaves one sample over: drop that batch with drop_last = true "
            "on the loader (fulgur::data::TensorLoaderOptions::drop_last), or choose a batch size that does not leave "
            "one sample (under DDP, per process)."
          : ". Make the batch's dtype, shape and device match what the model expects.";
  // With several evaluation loaders the batch index alone does not say which batch: name the loader too.
  const std::string loader =
      ctx.dataloader_idx ? " of the loader at dataloader_idx " + std::to_string(*ctx.dataloader_idx) : std::string();
  return StepError("fulgur: " + position_text(step, ctx.current_epoch, ctx.batch_idx, ctx.global_step) + loader +
                   " failed under precision '" + std::string(precision) + "': " + what + "\n  batch: " +
                   batch_description + "\n  " + parameters_text(module) + advice);
}

void count_skipped_step(FitProgress& progress, const TrainerConfig& config, const StepContext& ctx,
                        std::string_view precision) {
  ++progress.skipped_in_epoch;
  ++progress.skipped_in_a_row;
  const std::int64_t limit = config.max_consecutive_skipped_steps;
  if (limit > 0 && progress.skipped_in_a_row >= limit)
    throw NonFiniteLossError(
        "fulgur: the loss scaler skipped " + std::to_string(progress.skipped_in_a_row) + " optimizer steps in a row " +
        "(inf/NaN gradients every time), the last at " +
        position_text("training_step", ctx.current_epoch, ctx.batch_idx, ctx.global_step) + " under precision '" +
        std::string(precision) + "': the loss or its gradients are not finite, and the model no longer learns. Check "
        "the data for NaN/inf, lower the learning rate, clip gradients (" + detail::trainer_setting("gradient_clip_val") +
        "), or raise " + detail::trainer_setting("max_consecutive_skipped_steps") + " (0: never stop).");
}

namespace {

/// The module's parameters whose .grad is NaN or infinite (whole gradients: one device, DDP, stage 1).
std::vector<std::string> non_finite_gradients(torch::nn::Module& module) {
  // One flag per gradient, stacked: the one host sync detect_anomaly costs. The list is reused from
  // step to step and the parameters' names are looked up only when a gradient is bad.
  thread_local std::vector<at::Tensor> finite;
  finite.clear();
  for (const at::Tensor& parameter : module.parameters())
    if (parameter.grad().defined()) finite.push_back(at::isfinite(parameter.grad()).all());
  if (finite.empty()) return {};
  const at::Tensor flags = at::stack(finite).cpu();
  finite.clear();  // holds no tensor between steps
  const bool* ok = flags.data_ptr<bool>();
  if (std::all_of(ok, ok + flags.numel(), [](bool b) { return b; })) return {};
  std::vector<std::string> bad;
  std::size_t i = 0;  // parameters() and named_parameters() walk the module in the same order
  for (const auto& item : module.named_parameters())
    if (item.value().grad().defined() && !ok[i++]) bad.push_back(item.key());
  return bad;
}

}  // namespace

void check_gradients_finite(torch::nn::Module& module, const StepContext& ctx, std::string_view precision) {
  // Under ShardedStrategy<2>/<3> the module keeps no gradient: each rank checks its shard, and the
  // ranks agree on the names (a NaN in one rank's shard stops every rank, none waits in a collective).
  auto sharded = distributed::sharded_non_finite_gradients(module);
  const std::vector<std::string> names = sharded ? std::move(*sharded) : non_finite_gradients(module);
  std::string bad;
  const auto count = static_cast<std::int64_t>(names.size());
  for (std::size_t i = 0; i < names.size() && i < 8; ++i) bad += (bad.empty() ? "'" : ", '") + names[i] + "'";
  if (count == 0) return;
  if (count > 8) bad += " and " + std::to_string(count - 8) + " more";
  throw NonFiniteGradientError(
      "fulgur: detect_anomaly: the gradient of " + std::to_string(count) + " parameter" + (count == 1 ? "" : "s") +
      " is NaN or infinite (" + bad + ") after the backward of " +
      position_text("training_step", ctx.current_epoch, ctx.batch_idx, ctx.global_step) + " under precision '" +
      std::string(precision) + "'. Look for an operation whose gradient overflows or divides by zero (log, sqrt, "
      "division, pow near 0); autograd's anomaly mode, on with detect_anomaly, names the forward op if its "
      "backward made the first NaN.");
}

void Schedulers::update(SchedulerInterval interval, std::int64_t count, const detail::TensorMap& metrics, bool plateau) {
  if (!automatic_) return;
  for (auto& config : configs_) {
    AnyLRScheduler& scheduler = config.lr_scheduler;
    if (!scheduler || scheduler.reduce_on_plateau() != plateau || config.interval != interval ||
        count % config.frequency != 0)
      continue;
    if (!plateau) {
      scheduler.step();
      continue;
    }
    if (const std::optional<double> value = metrics.item(config.monitor)) {
      scheduler.step(*value);
    } else if (config.strict) {
      std::string available;
      for (const std::string& name : metrics.names()) available += (available.empty() ? "'" : ", '") + name + "'";
      throw MisconfigurationError("ReduceLROnPlateau conditioned on metric " + config.monitor +
                                  " which is not available. Available metrics are: [" + available +
                                  "]. Condition can be set using `monitor` key in lr scheduler dict");
    } else {
      warnings_.push_back("ReduceLROnPlateau conditioned on metric " + config.monitor +
                          " which is not available but strict is set to `False`. Skipping learning rate update.");
    }
  }
}

}  // namespace fulgur::loops
