#pragma once
// What the loops share: the batch type of a loader, the loss in a step's output, a batch's way to
// the device (with the transfer hooks), and errors that name where a step failed. Everything here
// reaches the policies only through the host's Fabric-level verbs (`host.*`, loops/host.hpp).
#include <ATen/ATen.h>
#include <torch/data/example.h>
#include <c10/util/FunctionRef.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <iostream>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <memory>
#include <vector>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/data/apply.hpp"
#include "fulgur/data/batch.hpp"
#include "fulgur/data/loaders.hpp"
#include "fulgur/detail/describe.hpp"
#include "fulgur/detail/loss.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/hooks.hpp"
#include "fulgur/interrupt.hpp"
#include "fulgur/loops/host.hpp"
#include "fulgur/step_context.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur::loops {

/// fit without validation data.
struct NoData {};

/// The hook caller of a host's loops: the module's hooks and its callbacks'.
template <class Host, class Module>
using HookCallerOf = hooks::HookCaller<Module, callbacks_of<Host>>;

// ---- profiling points (nothing is compiled in without a profiler) ---------------------------------

/// The strategy a host runs (for the profiler's "[Strategy]<name>.<verb>" actions).
template <class Host>
struct strategy_of {
  using type = Host;
};
template <class Host>
  requires requires { typename Host::strategy_type; }
struct strategy_of<Host> {
  using type = typename Host::strategy_type;
};

/// Times a loop action of a fixed name ("run_training_batch") for the returned scope's life.
template <profiling::fixed_string Name, class Hooks>
auto profile(Hooks& hook) {
  return hook.profile([] { return profiling::named<Name>(); });
}
/// "[Strategy]<Strategy>.<Verb>".
template <profiling::fixed_string Verb, class Host, class Hooks>
auto profile_strategy(Hooks& hook) {
  return hook.profile([] { return profiling::strategy_action<typename strategy_of<Host>::type, Verb>(); });
}
/// "[Strategy]<Strategy>.<step>" for a step hook (Lightning times the steps as the strategy's).
template <class Host, class Step, class Hooks>
auto profile_step(Hooks& hook) {
  return hook.profile([] { return profiling::strategy_hook_action<typename strategy_of<Host>::type, Step>(); });
}
/// A loader's DataError (a sample that could not be read) again, naming the loader (`what`: "training",
/// "validation", ...; ctx's dataloader_idx), the batch it was making and where the run was.
[[noreturn]] void raise_data_failure(const DataError& error, std::string_view what, const StepContext& ctx,
                                     std::int64_t batch_idx);
/// Seconds as the shortest text that reads back the same: 1e-06, 0.25, 2592000.
std::string seconds_text(double seconds);

/// `body(raw)` for each batch of `loader` (the `what` loader) while it returns true, each fetch timed as
/// `next()` names it (Lightning's "[_EvaluationLoop].val_next", one call per batch): a range-for, with the
/// fetch timed and a DataError said with where it happened.
template <class Loader, class Hooks, class MakeAction, class Body>
void for_each_batch(Loader& loader, std::string_view what, Hooks& hook, MakeAction next, Body&& body) {
  auto it = std::begin(loader);
  const auto end = std::end(loader);
  // Only the loader's calls are in the try blocks: what the step throws goes on from where it was thrown.
  for (std::int64_t batch_idx = 0;; ++batch_idx) {
    const bool more = [&] {
      try {
        if (batch_idx > 0) ++it;
        return static_cast<bool>(it != end);
      } catch (const DataError& e) {
        raise_data_failure(e, what, hook.ctx(), batch_idx);
      }
    }();
    if (!more) return;
    auto fetching = hook.profile(next);  // the batch is made (or waited for) on dereference
    auto&& raw = [&]() -> decltype(auto) {  // a batch made on dereference is elided, a reference stays one
      try {
        return *it;
      } catch (const DataError& e) {
        raise_data_failure(e, what, hook.ctx(), batch_idx);
      }
    }();
    fetching.end();
    if (!body(raw)) return;
  }
}

/// "[LightningModule]<Module>.<Name>": what Lightning runs as a module hook with a default
/// (optimizer_step, optimizer_zero_grad, configure_gradient_clipping, configure_optimizers).
template <profiling::fixed_string Name, class Hooks>
auto profile_module(Hooks& hook) {
  return hook.profile([] { return profiling::module_action<typename Hooks::module_type, Name>(); });
}

template <class Data>
using batch_of_t = std::remove_cvref_t<decltype(*std::begin(std::declval<Data&>()))>;

/// check(std::type_identity<Batch>{}) for the batch type of each loader of Data (one loader, or
/// several: data::loaders(...)); whether it holds for all of them.
template <class Data, class Check>
constexpr bool every_batch_type(Check check) {
  if constexpr (data::several_loaders<Data>)
    return []<class... Ls>(Check c, std::type_identity<std::tuple<Ls...>>) {
      return (c(std::type_identity<batch_of_t<Ls>>{}) && ...);
    }(check, std::type_identity<typename std::remove_cvref_t<Data>::loader_types>{});
  else
    return check(std::type_identity<batch_of_t<Data>>{});
}

/// The number of batches a loader yields, when it can tell (TensorLoader, std::vector, ...).
template <class Data>
std::optional<std::int64_t> sized_length(Data& data) {
  if constexpr (requires { data.size(); })
    return static_cast<std::int64_t>(data.size());
  else
    return std::nullopt;
}

using detail::number_text;

/// How many batches of a loader of `length` batches (none: it cannot tell) to run: Lightning's
/// limit rule (an unknown length: the count, or -1 for all); a fraction of an unknown length other
/// than 1.0 is an error naming the field.
std::int64_t batch_limit(std::optional<std::int64_t> length, const BatchAmount& limit, const char* field);
template <class Data>
std::int64_t batch_limit(Data& data, const BatchAmount& limit, const char* field) {
  return batch_limit(sized_length(data), limit, field);
}

/// The DataError for a loader that is empty while its limit asks for batches.
[[noreturn]] void throw_no_batches(std::string_view what, std::string_view advice, const std::string& description);
/// A loader that can tell it is empty, while its limit asks for batches: a DataError naming it.
template <class Data>
void require_batches(Data& data, const BatchAmount& limit, std::string_view what, std::string_view advice) {
  if (sized_length(data) != 0 || limit.is_zero()) return;
  if constexpr (requires { data.describe(); }) throw_no_batches(what, advice, data.describe());
  else throw_no_batches(what, advice, {});
}

using detail::has_loss;
using detail::loss_of;

/// "training_step at epoch 1, batch 3 (global_step 7)": where a step failed or stopped.
std::string position_text(std::string_view step, std::int64_t epoch, std::int64_t batch_idx, std::int64_t global_step);

/// SIGINT or a preemption signal (interrupt.hpp), agreed on by every rank: the ranks call this at
/// the same points, and stop together. Preemption wins (it needs a checkpoint); one collective when
/// nothing happened, a second only when something did. Throws Interrupted or Preempted, whose text
/// is "<what> <where>". training_done: the run is complete, so a preemption has nothing to save and
/// only a Ctrl-C still ends fit as interrupted; returns whether a preemption signal was passed over.
/// The decision itself, compiled once: `any_rank` ORs a flag over the ranks (called only when
/// world_size > 1), `where` says where the run stopped.
bool stop_if_signalled(int world_size, c10::function_ref<bool(bool)> any_rank, c10::function_ref<std::string()> where,
                       bool training_done);
template <class Host, class Where>
bool stop_if_signalled(Host& host, Where&& where, bool training_done = false) {
  const int world_size = host.world_size();
  if (world_size == 1 && detail::preemption_signal() == 0 && !detail::interrupt_requested()) return false;
  return stop_if_signalled(
      world_size, [&host](bool decision) { return host.reduce_boolean_decision(decision, /*all=*/false); },
      [&where] { return std::string(where()); }, training_done);
}

/// "the module's parameters are float32 on cpu" (for errors about a batch that does not fit).
std::string parameters_text(torch::nn::Module& module);

/// What a hook or a logger threw while a run was ending on `original` (an error or an interruption):
/// one line that names both and says that `original` is what goes on.
std::string shutdown_failure_text(std::string_view where, const std::exception& thrown, const std::exception& original);

// ---- the loops' failures, compiled once (src/loops/common.cpp): each names where and what to do ----
/// A resumed epoch whose position is at or past this run's limit_train_batches: the epoch is over. Said
/// on global rank 0; returns the warning.
std::string say_resumed_at_batch_limit(std::int64_t epoch, std::int64_t first_batch, std::int64_t limit,
                                      bool global_zero);
/// A resumed epoch's position is past its data (or this run's limit_train_batches, where ending the
/// epoch there would lose an open accumulation window or a loader's own position).
[[noreturn]] void raise_resume_past_data(std::int64_t epoch, std::int64_t first_batch, std::int64_t batches);
/// An epoch yielded no training batch (`description`: the loader's, if it describes itself).
[[noreturn]] void raise_no_training_batches(std::int64_t epoch, const std::string& description);
/// validate/test/fit's validation yielded no batch.
[[noreturn]] void raise_no_evaluation_batches(std::string_view what, bool standalone);
/// A training_step returned something other than a scalar loss.
[[noreturn]] void raise_loss_not_scalar(const StepContext& ctx, const at::Tensor& loss);
/// The training loss is NaN or infinite (`last_finite_step`: -1 if never seen finite).
[[noreturn]] void raise_non_finite_loss(double value, const StepContext& ctx, std::int64_t step_at_batch,
                                        std::string_view precision, bool every_step, std::int64_t last_finite_step);
/// An evaluation loss that is not finite: a warning (printed on global rank 0), returned.
std::string non_finite_evaluation_warning(std::string_view what, std::string_view step, double loss,
                                          const StepContext& ctx, bool global_zero);
/// A batch that cannot get to the device.
[[noreturn]] void raise_batch_transfer(std::string_view step, const StepContext& ctx, c10::Device device,
                                       const c10::Error& error, const std::string& batch_description);
/// A module without parameters has nothing to train.
[[noreturn]] void raise_no_parameters(const std::string& module_name);

/// An optimizer over no parameters trains nothing: a MisconfigurationError naming it (PyTorch's
/// "optimizer got an empty parameter list"); `where` says where it came from.
void require_parameters(const torch::optim::Optimizer& optimizer, std::string_view where);

/// The StepError for a step that LibTorch refused: where, why, the batch and the model.
StepError step_failure(std::string_view step, const StepContext& ctx, std::string_view precision,
                       const c10::Error& error, const std::string& batch_description, torch::nn::Module& module);
template <class Batch>
StepError step_failure(std::string_view step, const StepContext& ctx, std::string_view precision,
                       const c10::Error& error, const Batch& batch, torch::nn::Module& module) {
  return step_failure(step, ctx, precision, error, detail::describe_batch(batch), module);
}

/// A batch on its way to the step: on_before_batch_transfer, the move to the device (the
/// module's transfer_batch_to_device if it has one), on_after_batch_transfer, then the model
/// inputs converted to the precision. A batch that cannot get there is a StepError naming it.
template <class Host, class Module, class Batch>
auto prepare_batch(Host& host, HookCallerOf<Host, Module>& hook, const Batch& raw, std::string_view step,
                   std::int64_t dataloader_idx = 0) {
  const StepContext& ctx = hook.ctx();
  try {
    decltype(auto) before = [&]() -> decltype(auto) {
      if constexpr (hooks::defines<Module, hooks::on_before_batch_transfer_t, const Batch, const std::int64_t>)
        return Batch(hook(hooks::on_before_batch_transfer, raw, dataloader_idx));
      else
        return (raw);
    }();
    auto timed = profile_strategy<"batch_to_device", Host>(hook);  // the transfer hooks inside, as Lightning's
    auto moved = [&] {
      if constexpr (hooks::defines<Module, hooks::transfer_batch_to_device_t, const Batch, const c10::Device,
                                   const std::int64_t>)
        return Batch(hook(hooks::transfer_batch_to_device, before, host.device(), dataloader_idx));
      else
        return host.batch_to_device(before);
    }();
    if constexpr (hooks::defines<Module, hooks::on_after_batch_transfer_t, decltype(moved), const std::int64_t>)
      moved = decltype(moved)(hook(hooks::on_after_batch_transfer, moved, dataloader_idx));
    timed.end();
    return host.convert_batch(moved);
  } catch (const c10::Error& e) {
    raise_batch_transfer(step, ctx, host.device(), e, detail::describe_batch(raw));
  }
}

/// The end of a stage that failed with `original`: on_exception, the loggers' finalize(status), then
/// teardown(stage) when given — each runs even if one before it threw; what they throw goes to `say`
/// as one line naming both, and `original` is what the caller sees.
template <class HookCaller, class Callbacks, class Say>
void shut_down_hooks(HookCaller& hook, Callbacks& callbacks, const std::exception& original, const char* status,
                     std::optional<Stage> teardown, Say&& say) {
  auto report = [&](std::string_view where) {
    return [&, where](const std::exception& thrown) { say(shutdown_failure_text(where, thrown, original)); };
  };
  hook.call_guarded(hooks::on_exception, report("on_exception"), original);
  try {
    callbacks.finalize_loggers(status);
  } catch (const std::exception& thrown) {
    report("a logger's finalize")(thrown);
  }
  if (teardown) hook.call_guarded(hooks::teardown, report("teardown"), *teardown);
  try {
    callbacks.describe_profiler();  // where the time went up to the failure
  } catch (const std::exception& thrown) {
    report("the profiler's report")(thrown);
  }
}

/// The set-up every stage starts with, in Lightning's order: prepare_data (on each node's local
/// rank 0, then every rank waits), setup(stage), configure_model (in init_module's context, so
/// what it creates lands on the device in the precision's dtype).
template <class Host, class Module>
void run_setup_hooks(Host& host, HookCallerOf<Host, Module>& hook, Stage stage) {
  auto& callbacks = host_access::services(host).callbacks();
  callbacks.set_up_loggers({host.config().default_root_dir, host.global_rank()});
  if constexpr (callbacks_of<Host>::has_profiler) {
    const std::string log_dir = callbacks.first_log_dir();
    callbacks.set_up_profiler({stage, host.global_rank(), host.local_rank(), host.world_size(),
                               log_dir.empty() ? host.config().default_root_dir : log_dir});
  }
  if constexpr (hooks::defines<Module, hooks::prepare_data_t>) {
    if (host.local_rank() == 0) hook(hooks::prepare_data);
    host.barrier("prepare_data");
  }
  hook(hooks::setup, stage);
  if constexpr (hooks::defines<Module, hooks::configure_model_t>) {
    auto on_device = host.init_module();
    hook(hooks::configure_model);
  }
}

/// The weights validate/test/predict run on: EvaluationOptions::ckpt_path as the Trainer found it
/// (empty: the module's own), and what finding it said (reported with the stage's own warnings).
struct EvaluationWeights {
  std::string checkpoint{};
  std::vector<std::string> warnings{};
};

/// The checkpoint's "state_dict", or a CheckpointError naming the stage's call and the file.
StateDict evaluation_weights(const StateDict& checkpoint, const std::string& path, Stage stage);
/// A checkpoint whose weights do not fit the module: the loader's message (it names the module), with
/// what the stage can do.
[[noreturn]] void raise_evaluation_weights_mismatch(const std::exception& error, const std::string& path, Stage stage);
/// What an evaluation stage says besides its metrics, in the order it happened: what finding its checkpoint
/// said, then the samples its shards repeat (`repeated`: under several ranks the padding that evens the shards
/// out is evaluated twice; Lightning warns too). Said once, on global rank 0; returned for each result.
std::vector<std::string> say_evaluation_warnings(const EvaluationWeights& weights, Stage stage, std::int64_t repeated,
                                                 int world_size, int global_rank);

/// Lightning's restore_model outside fit: the module's on_load_checkpoint, then the checkpoint's weights
/// through the strategy (after its set-up: a sharded module loads its own shards). Every rank loads.
template <class Host, class Hook, class Module>
void load_evaluation_weights(Host& host, Hook& hook, Module& module, const std::string& path, Stage stage) {
  const StateDict checkpoint = host.load(path);
  hook.call_module_only(hooks::on_load_checkpoint, checkpoint);
  const StateDict weights = evaluation_weights(checkpoint, path, stage);
  try {
    host.load_module_state(module, weights, /*strict=*/true);
  } catch (const Error& e) {
    raise_evaluation_weights_mismatch(e, path, stage);
  }
}

/// A stage that only evaluates (validate, test, predict): the set-up hooks, the module converted
/// to the precision and moved to the device, as fit does (under DDP without the broadcast of rank
/// 0's weights, as in Lightning: give every rank the same weights, or a checkpoint's), the
/// checkpoint's weights if one was asked for, the loader processed by the strategy, then
/// `run(hook, loader)`, then teardown(stage); an exception reaches on_exception on its way out, unchanged.
template <class Host, class Module, class Data, class Run>
auto run_evaluation_stage(Host& host, Module& module, Data& data, Stage stage, const EvaluationWeights& weights,
                          Run&& run) {
  auto& services = host_access::services(host);
  StepContext ctx;
  ctx.stage = stage;
  ctx.global_rank = host.global_rank();
  ctx.world_size = host.world_size();
  ctx.current_epoch = services.fit_position().epoch;  // after fit, Lightning reports there
  TrainerView view(ctx, host.config(), module, &services.link());
  view.set_logging_step(services.fit_position().logging_step);
  detail::MetricViews views;  // this stage's callback/logged/progress-bar metrics, seen by every hook
  view.attach_metrics(&views);
  HookCallerOf<Host, Module> hook(module, ctx, services.callbacks(), view);
  try {
    run_setup_hooks(host, hook, stage);
    host.setup_module(module, ModuleSetup::evaluation);
    if (!weights.checkpoint.empty()) load_evaluation_weights(host, hook, module, weights.checkpoint, stage);
    auto&& loader = host.setup_dataloader(data);
    if (host.world_size() > 1) {
      if constexpr (requires { loader.shard_without_repeats(0, 1); })
        if (stage == Stage::predict)  // Lightning's UnrepeatedDistributedSampler: each sample predicted once
          loader.shard_without_repeats(host.global_rank(), host.world_size());
    }
    auto result = run(hook, loader, views);
    std::int64_t repeated = 0;
    if constexpr (requires { loader.repeated_samples(); }) repeated = loader.repeated_samples();
    if (repeated > 0 || !weights.warnings.empty()) {
      const auto said = say_evaluation_warnings(weights, stage, repeated, host.world_size(), host.global_rank());
      if constexpr (requires { result.warnings; })  // one loader's result, or each of several loaders'
        result.warnings.insert(result.warnings.begin(), said.begin(), said.end());
      else if constexpr (requires { result.front().warnings; })
        for (auto& each : result) each.warnings.insert(each.warnings.begin(), said.begin(), said.end());
    }
    hook(hooks::teardown, stage);
    services.callbacks().finalize_loggers("success");
    services.callbacks().describe_profiler();
    return result;
  } catch (const std::exception& e) {
    shut_down_hooks(hook, services.callbacks(), e, "failed", std::nullopt,
                    [](const std::string& line) { std::cerr << line << std::endl; });
    throw;
  }
}

/// Each submodule's train/eval mode, captured before evaluation and restored after it (Lightning's
/// _ModuleMode), unless the module restores it itself (on_validation_model_train).
class ModuleModes {
 public:
  explicit ModuleModes(torch::nn::Module& module) : root_(module), root_training_(module.is_training()) {
    for (const auto& m : module.modules(/*include_self=*/false)) modes_.emplace_back(m, m->is_training());
  }
  void restore() {
    root_.train(root_training_);  // train() reaches every child; children's own modes follow, in pre-order
    for (auto& [m, training] : modes_) m->train(training);
  }

 private:
  torch::nn::Module& root_;
  bool root_training_;
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes_;
};

}  // namespace fulgur::loops
