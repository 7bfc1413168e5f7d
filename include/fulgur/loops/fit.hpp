#pragma once
// The fit loop (Lightning's Trainer.fit and _FitLoop), in Lightning 2.x's order:
//
//   prepare_data (local rank 0), setup("fit"), configure_model (in init_module's context),
//   the module set up (precision, device, strategy), configure_optimizers, the optimizers set up
//   on_fit_start
//   the sanity check: on_sanity_check_start, num_sanity_val_steps validation batches, on_sanity_check_end
//   on_train_start
//   per epoch: on_train_epoch_start, the batches (training_epoch.hpp), on_train_epoch_end,
//              epoch metrics, ReduceLROnPlateau schedulers of epoch interval
//   on_train_end, on_fit_end, teardown("fit")
//   on an exception: on_exception(e), then the exception goes on to the caller unchanged.
//
// It ends at max_epochs, max_steps, max_time, or a stop request (ctx.should_stop) once
// min_epochs and min_steps are met.
#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdint>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/checkpoint/state.hpp"
#include "fulgur/concepts/training_module.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/hooks.hpp"
#include "fulgur/interrupt.hpp"
#include "fulgur/preemption.hpp"
#include "fulgur/loops/checkpointing.hpp"
#include "fulgur/loops/common.hpp"
#include "fulgur/loops/evaluation.hpp"
#include "fulgur/loops/optimization.hpp"
#include "fulgur/loops/training_epoch.hpp"
#include "fulgur/metrics.hpp"
#include "fulgur/optimization.hpp"
#include "fulgur/results.hpp"

namespace fulgur::loops {

/// The random state of the CPU generator and of the training device's, put back when it ends
/// (Lightning's isolate_rng around the sanity check: validating first must not change training).
class IsolatedRandomState {
 public:
  explicit IsolatedRandomState(c10::Device device) {
    saved_.emplace_back(at::detail::getDefaultCPUGenerator(), at::detail::getDefaultCPUGenerator().get_state());
    if (!device.is_cpu()) {
      at::Generator generator = at::globalContext().defaultGenerator(device);
      saved_.emplace_back(generator, generator.get_state());
    }
  }
  ~IsolatedRandomState() {
    for (auto& [generator, state] : saved_) generator.set_state(state);
  }
  IsolatedRandomState(const IsolatedRandomState&) = delete;
  IsolatedRandomState& operator=(const IsolatedRandomState&) = delete;

 private:
  std::vector<std::pair<at::Generator, at::Tensor>> saved_;
};

/// What the strategy makes of a loader (a reference to it, or a loader of its own); NoData stays.
template <class Fabric, class Data>
struct processed_loader {
  using type = decltype(std::declval<Fabric&>().setup_dataloader(std::declval<Data&>()));
};
template <class Fabric>
struct processed_loader<Fabric, NoData> {
  using type = NoData;
};

template <class Fabric, class Module, class TrainData, class ValData>
class FitLoop final : public detail::FitCheckpointing {
  static constexpr bool has_validation = !std::is_same_v<ValData, NoData>;
  static constexpr bool automatic = detail::automatic_optimization_of<Module>();
  using TrainLoader = decltype(std::declval<Fabric&>().setup_dataloader(std::declval<TrainData&>()));
  using ValLoader = typename processed_loader<Fabric, ValData>::type;
  using Optimization = std::conditional_t<automatic, AutomaticOptimization<Fabric, Module>,
                                          ManualOptimization<Fabric, Module>>;
  using ValLoop = std::conditional_t<has_validation,
                                     EvaluationLoop<Validation, Fabric, Module, std::remove_reference_t<ValLoader>>,
                                     NoData>;
  using EpochLoop = TrainingEpochLoop<Fabric, Module, std::remove_reference_t<TrainLoader>, Optimization, ValLoop>;

 public:
  FitLoop(Fabric& fabric, Module& module, TrainData& train, ValData& val, FitOptions options = {})
      : options_(std::move(options)),
        fabric_(fabric),
        config_(fabric.config()),
        view_(ctx_, config_, module, fabric.view_ops()),
        hook_(module, ctx_, fabric.callback_set(), view_),
        train_(fabric.setup_dataloader(train)),
        val_(process_validation(fabric, val)) {}

  FitResult run() {
    InterruptHandler interrupt_handler(config_.handle_interrupt, config_.preemption.enabled);
    try {
      StateDict resumed = read_checkpoint();  // before any hook: a bad file fails fast
      if (!resumed.empty()) resume_loggers(resumed);
      set_up();
      if (!resumed.empty()) restore(resumed);
      hook_(hooks::on_fit_start);
      sanity_check();
      stop_if_interrupted("in the sanity check");
      if (max_batches_ != 0 && !done()) {  // nothing to train (limit 0, max_epochs 0, ...): Lightning's skip
        hook_(hooks::on_train_start);
        run_epochs();
        stop_if_finished_run_interrupted();  // a Ctrl-C in the last validation is not lost
        hook_(hooks::on_train_end);
      }
      hook_(hooks::on_fit_end);
      hook_(hooks::teardown, Stage::fit);
      fabric_.callback_set().finalize_loggers("success");
    } catch (const Preempted& e) {  // the batch finished: save where the run is, then shut down
      std::string path;
      try {
        path = write_preemption_checkpoint();
      } catch (const std::exception& failure) {  // the shutdown still runs; the error says both
        hook_(hooks::on_exception, e);
        fabric_.callback_set().finalize_loggers("failed");
        hook_(hooks::teardown, Stage::fit);
        throw CheckpointError(std::string("fulgur: ") + e.what() + ", but its checkpoint could not be written: " +
                              failure.what() + " The run ends without one: resume from an earlier checkpoint, and "
                              "make default_root_dir writable.");
      }
      hook_(hooks::on_exception, e);
      fabric_.callback_set().finalize_loggers("interrupted");
      hook_(hooks::teardown, Stage::fit);
      result_.interrupted = result_.preempted = true;
      result_.checkpoint_path = path;
      progress_.stop_reason = e.what();
      warn(std::string("fulgur: ") + e.what() + "; wrote " + path + ", which the next fit continues exactly with "
           "FitOptions{.ckpt_path = \"hpc\"} (under SLURM, by itself).");
    } catch (const Interrupted& e) {  // Ctrl-C: the step finished; shut down as Lightning does, and return
      hook_(hooks::on_exception, e);
      fabric_.callback_set().finalize_loggers("interrupted");
      hook_(hooks::teardown, Stage::fit);
      result_.interrupted = true;
      progress_.stop_reason = e.what();
      warn(std::string("fulgur: ") + e.what() + "; fit returns with FitResult::interrupted = true.");
    } catch (const std::exception& e) {
      hook_(hooks::on_exception, e);
      fabric_.callback_set().finalize_loggers("failed");
      throw;
    }
    return finish();
  }

  // ---- checkpoints -------------------------------------------------------------------------------
  void request_save(const std::string& path, bool weights_only) override { checkpoints_.save(path, weights_only); }
  void request_removal(const std::string& path) override { checkpoints_.remove(path); }

 private:
  /// The checkpoint fit resumes from (FitOptions::ckpt_path), read and checked; empty without one.
  StateDict read_checkpoint() {
    if (options_.ckpt_path.empty()) return {};
    const std::string path = options_.ckpt_path;
    StateDict state = fabric_.load(path);
    checkpoint::check_format(state, "checkpoint '" + path + "'");
    const std::string what = "checkpoint '" + path + "'";
    const StateDict stamp = checkpoint::require_dict(state, "fulgur", what);
    const std::int64_t world = checkpoint::require_int(stamp, "world_size", what + "'s 'fulgur' entry");
    if (!state.contains("optimizer_states"))
      throw CheckpointError("fulgur: " + what + " holds weights only (save_weights_only), so training cannot go "
                            "on from it; load its 'state_dict' into the module instead (checkpoint::module_weights).");
    if (world != fabric_.world_size())
      throw CheckpointError("fulgur: " + what + " was written by " + std::to_string(world) + " processes, this run "
                            "has " + std::to_string(fabric_.world_size()) + "; each rank's random state and data "
                            "shard belong to its rank: resume with the same devices x num_nodes.");
    checkpoint_path_ = path;
    return state;
  }

  /// What fit needs to go on exactly from here: Lightning's .ckpt keys, plus each rank's random
  /// state and, inside an accumulation window, its gradients. Every rank calls it (the per-rank
  /// parts are gathered); global rank 0 writes.
  StateDict checkpoint_state(bool weights_only) {
    Module& module = hook_.module();
    const StateDict loop = loop_state();
    StateDict c;
    c.insert("epoch", loop.at("epoch"));
    c.insert("global_step", progress_.global_step);
    c.insert("pytorch-lightning_version", std::string(checkpoint::lightning_layout_version));
    c.insert("state_dict", checkpoint::module_state_dict(module).to_ivalue());
    StateDict loops;
    loops.insert("fit_loop", loop.to_ivalue());
    c.insert("loops", loops.to_ivalue());
    if (!weights_only) {
      StateDict callbacks;
      fabric_.callback_set().save_states(callbacks);
      c.insert("callbacks", callbacks.to_ivalue());
      c10::impl::GenericList optimizer_states(c10::AnyType::get()), schedulers(c10::AnyType::get());
      for (auto& config : optimizers_) {
        optimizer_states.push_back(fabric_.optimizer_state(*config.optimizer).to_ivalue());
        schedulers.push_back(checkpoint::scheduler_state(config.lr_scheduler).to_ivalue());
      }
      c.insert("optimizer_states", optimizer_states);
      c.insert("lr_schedulers", schedulers);
      if (const StateDict precision = fabric_.precision_state(); !precision.empty())
        c.insert("MixedPrecision", precision.to_ivalue());  // Lightning's key: the precision plugin's class
    }
    if constexpr (requires { module.hparams(); }) c.insert("hyper_parameters", hyperparameters(module.hparams()));
    StateDict stamp = checkpoint::stamp(Fabric::combination_name(), fabric_.world_size());
    stamp.insert("loggers", fabric_.callback_set().logger_versions().to_ivalue());
    if (!weights_only) stamp.insert("ranks", rank_states().to_ivalue());
    c.insert("fulgur", stamp.to_ivalue());
    hook_(hooks::on_save_checkpoint, c);
    return c;
  }

  /// Where the run is: after batch k of epoch e (mid-epoch: what was logged so far goes too), or
  /// before an epoch. An epoch cut short by a stop keeps its mid-epoch position (frozen then).
  StateDict loop_state() {
    if (frozen_loop_) return *frozen_loop_;
    const bool mid_epoch = progress_.in_epoch && progress_.batches_in_epoch > 0;
    StateDict s;
    s.insert("epoch", progress_.epochs_done);
    s.insert("batch_idx", mid_epoch ? progress_.batches_in_epoch : std::int64_t{0});
    s.insert("global_step", progress_.global_step);
    s.insert("total_batch_idx", progress_.total_batch_idx);
    s.insert("batches_that_stepped", progress_.batches_that_stepped);
    s.insert("stepped_in_epoch", mid_epoch ? progress_.stepped_in_epoch : std::int64_t{0});
    s.insert("skipped_in_epoch", mid_epoch ? progress_.skipped_in_epoch : std::int64_t{0});
    s.insert("skipped_in_a_row", progress_.skipped_in_a_row);
    s.insert("skipped_total", skipped_total_);
    s.insert("accumulate_grad_batches", config_.accumulate_grad_batches);
    s.insert("metrics", mid_epoch ? c10::IValue(train_metrics_.state()) : c10::IValue(c10::impl::GenericList(c10::AnyType::get())));
    s.insert("views", views_.state());
    if constexpr (requires { train_.state_dict(); }) s.insert("loader", train_.state_dict().to_ivalue());
    return s;
  }

  /// Each rank's random state and pending gradients, one row per rank.
  StateDict rank_states() {
    StateDict mine = checkpoint::random_state();
    const bool accumulating = progress_.in_epoch && progress_.batches_in_epoch % config_.accumulate_grad_batches != 0;
    StateDict grads;
    if (accumulating)
      for (const auto& item : hook_.module().named_parameters())
        if (item.value().grad().defined()) grads.insert(item.key(), item.value().grad());
    mine.insert("accumulated_gradients", grads.to_ivalue());
    c10::impl::GenericList ranks(c10::AnyType::get());
    if (fabric_.world_size() == 1) {
      ranks.push_back(mine.to_ivalue());
    } else {  // through one gathered byte tensor: ranks may hold different things
      const std::vector<char> bytes = checkpoint::to_bytes(mine);
      at::Tensor local = at::empty({static_cast<std::int64_t>(bytes.size())}, at::kByte);
      std::memcpy(local.data_ptr(), bytes.data(), bytes.size());
      at::Tensor size = at::scalar_tensor(local.numel(), at::kLong).to(fabric_.device());
      const at::Tensor sizes = fabric_.all_gather(size).cpu();
      const std::int64_t longest = sizes.max().template item<std::int64_t>();
      at::Tensor padded = at::zeros({longest}, at::kByte);
      padded.narrow(0, 0, local.numel()).copy_(local);
      const at::Tensor all = fabric_.all_gather(padded.to(fabric_.device())).cpu();
      for (int r = 0; r < fabric_.world_size(); ++r) {
        const at::Tensor row = all[r].narrow(0, 0, sizes[r].template item<std::int64_t>()).contiguous();
        const char* data = static_cast<const char*>(row.data_ptr());
        ranks.push_back(checkpoint::from_bytes(std::vector<char>(data, data + row.numel()), "rank " + std::to_string(r) + "'s state").to_ivalue());
      }
    }
    StateDict out;
    out.insert("per_rank", ranks);
    return out;
  }

  static c10::impl::GenericDict hyperparameters(const Hyperparameters& hparams) {
    c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [name, value] : hparams) std::visit([&](const auto& v) { out.insert(name, v); }, value);
    return out;
  }

  void write_checkpoint(const std::string& path, bool weights_only) {
    fabric_.save(path, checkpoint_state(weights_only));
  }
  void remove_checkpoint(const std::string& path) {
    if (fabric_.is_global_zero()) ::unlink(fabric_.resolve_path(path).c_str());
  }

  /// The loggers write on in the version directories of the checkpoint's run, from its logging step.
  void resume_loggers(const StateDict& c) {
    const StateDict stamp = checkpoint::require_dict(c, "fulgur", "checkpoint '" + checkpoint_path_ + "'");
    if (!stamp.contains("loggers") || !stamp.at("loggers").isGenericDict()) return;  // written before loggers were kept
    const StateDict loop = checkpoint::require_dict(checkpoint::require_dict(c, "loops", "checkpoint"), "fit_loop", "checkpoint's loops");
    fabric_.callback_set().resume_loggers(StateDict(stamp.at("loggers").toGenericDict()),
                                          checkpoint::require_int(loop, "batches_that_stepped", "checkpoint's fit_loop"));
  }

  /// Everything but the parts that wait for their moment (random state, what this epoch logged).
  void restore(const StateDict& c) {
    const std::string what = "checkpoint '" + checkpoint_path_ + "'";
    Module& module = hook_.module();
    hook_(hooks::on_load_checkpoint, c);
    const StateDict callbacks = checkpoint::require_dict(c, "callbacks", what);
    for (const std::string& key : fabric_.callback_set().load_states(callbacks))
      warn("fulgur: " + what + " holds the state of callback " + key + ", which this Trainer does not have; add it "
           "to the Trainer's arguments to restore it (Lightning warns the same).");
    try {
      fabric_.load_module_state(module, checkpoint::require_dict(c, "state_dict", what), /*strict=*/true);
    } catch (const Error& e) {  // resuming is strict: weights alone go through checkpoint::module_weights
      std::string text = e.what();
      if (text.rfind("fulgur: ", 0) == 0) text.erase(0, 8);
      throw CheckpointError("fulgur: " + what + " does not fit the module " + module.name() + " (resuming a fit "
                            "needs every weight): " + text);
    }
    const auto optimizer_states = checkpoint::require(c, "optimizer_states", what).toList();
    const auto schedulers = checkpoint::require(c, "lr_schedulers", what).toList();
    if (optimizer_states.size() != optimizers_.size())
      throw CheckpointError("fulgur: " + what + " holds " + std::to_string(optimizer_states.size()) +
                            " optimizer states, configure_optimizers returned " + std::to_string(optimizers_.size()) +
                            "; resume with the module's own configure_optimizers.");
    for (std::size_t i = 0; i < optimizers_.size(); ++i) {
      try {
        fabric_.load_optimizer_state(*optimizers_[i].optimizer, StateDict(optimizer_states.get(i).toGenericDict()));
      } catch (const std::exception& e) {
        std::string text = e.what();
        if (text.rfind("fulgur: ", 0) == 0) text.erase(0, 8);
        throw CheckpointError("fulgur: " + what + "'s optimizer state " + std::to_string(i) + " does not fit the "
                              "optimizer configure_optimizers returned: " + detail::first_line(text) +
                              " Resume with the same optimizer type and parameters.");
      }
      if (i < schedulers.size())
        checkpoint::load_scheduler_state(optimizers_[i].lr_scheduler, StateDict(schedulers.get(i).toGenericDict()),
                                         what + "'s lr_schedulers[" + std::to_string(i) + "]");
    }
    if (c.contains("MixedPrecision")) fabric_.load_precision_state(StateDict(c.at("MixedPrecision").toGenericDict()));
    const StateDict loops = checkpoint::require_dict(c, "loops", what);
    const StateDict loop = checkpoint::require_dict(loops, "fit_loop", what + "'s loops");
    auto count = [&](const char* key) { return checkpoint::require_int(loop, key, what + "'s fit_loop"); };
    progress_.epochs_done = count("epoch");
    progress_.global_step = count("global_step");
    progress_.total_batch_idx = count("total_batch_idx");
    progress_.batches_that_stepped = count("batches_that_stepped");
    progress_.stepped_in_epoch = count("stepped_in_epoch");
    progress_.skipped_in_epoch = count("skipped_in_epoch");
    progress_.skipped_in_a_row = count("skipped_in_a_row");
    skipped_total_ = count("skipped_total");
    resume_batch_ = count("batch_idx");
    if (loop.contains("accumulate_grad_batches")) {  // inside a window, its length must stay
      const std::int64_t saved = count("accumulate_grad_batches");
      if (resume_batch_ % saved != 0 && saved != config_.accumulate_grad_batches)
        throw CheckpointError("fulgur: " + what + " was taken inside a gradient-accumulation window (batch " +
                              std::to_string(resume_batch_ % saved) + " of " + std::to_string(saved) + ", its "
                              "gradients saved with it); resume with accumulate_grad_batches = " +
                              std::to_string(saved) + " (this run has " + std::to_string(config_.accumulate_grad_batches) +
                              "), or from a checkpoint at a window's end.");
    }
    ctx_.current_epoch = progress_.epochs_done;
    ctx_.global_step = progress_.global_step;
    view_.set_logging_step(progress_.batches_that_stepped);
    if constexpr (requires { train_.load_state_dict(StateDict{}); }) {
      if (loop.contains("loader")) {
        train_.load_state_dict(StateDict(loop.at("loader").toGenericDict()));
        loader_restored_ = true;
      }
    }
    resume_metrics_ = checkpoint::require(loop, "metrics", what).toList();
    resume_views_ = checkpoint::require(loop, "views", what).toGenericDict();
    const auto ranks = checkpoint::require_dict(checkpoint::require_dict(c, "fulgur", what), "ranks", what).at("per_rank").toList();
    resume_rank_ = StateDict(ranks.get(static_cast<std::size_t>(fabric_.global_rank())).toGenericDict());
    resuming_ = true;
  }

  /// Puts back, at the point the checkpoint was taken, what the hooks before it must not see
  /// changed: the views and this epoch's logged values, the pending gradients, the random state.
  void restore_views() { views_.load_state(resume_views_, fabric_.device()); }
  void restore_epoch_position() {
    train_metrics_.load_state(resume_metrics_);
    const StateDict grads(resume_rank_.at("accumulated_gradients").toGenericDict());
    if (!grads.empty()) {
      at::NoGradGuard no_grad;
      for (const auto& item : hook_.module().named_parameters())
        if (grads.contains(item.key())) {
          at::Tensor saved = grads.at(item.key()).toTensor().to(item.value().device());
          item.value().mutable_grad() = saved;
        }
    }
  }
  void restore_random_state() { checkpoint::set_random_state(resume_rank_, "checkpoint '" + checkpoint_path_ + "'"); }

  /// Ctrl-C outside the training batches (which check it themselves): the same graceful stop.
  /// Lightning's hpc_ckpt_{n}.ckpt in default_root_dir, the next n (rank 0's count); every rank
  /// takes part (the random states are gathered). Then, in a SLURM batch job, the requeue.
  std::string write_preemption_checkpoint() {
    std::string name;
    if (fabric_.is_global_zero()) {
      const std::string folder = config_.default_root_dir;
      const std::string path = detail::hpc_checkpoint(folder, /*next=*/true);
      name = path.substr(folder.size() + 1);
    }
    if (fabric_.world_size() > 1) name = fabric_.broadcast(name);
    write_checkpoint(name, /*weights_only=*/false);
    if (config_.preemption.auto_requeue && detail::in_slurm_batch_job() && fabric_.is_global_zero())
      warn("fulgur: " + detail::requeue_slurm_job() + ".");
    return fabric_.resolve_path(name);
  }

  /// After the last epoch a Ctrl-C still ends fit as interrupted; a preemption signal does not
  /// matter any more: the run is complete, nothing needs saving.
  void stop_if_finished_run_interrupted() {
    if (stop_if_interrupted("in the last epoch", /*training_done=*/true))
      warn("fulgur: a preemption signal (SIGTERM/SIGUSR1) arrived as training finished; nothing to save, fit "
           "completes normally.");
  }

  bool stop_if_interrupted(const char* where, bool training_done = false) {
    return stop_if_signalled(fabric_, [&] {
      return std::string(where) + " (epoch " + std::to_string(ctx_.current_epoch) + ", global_step " +
             std::to_string(progress_.global_step) + ")";
    }, training_done);
  }

  static ValLoader process_validation(Fabric& fabric, ValData& val) {
    if constexpr (has_validation) return fabric.setup_dataloader(val);
    else return NoData{};
  }

  void set_up() {
    Module& module = hook_.module();
    ctx_.global_rank = fabric_.global_rank();  // the set-up hooks may ask where they run
    ctx_.world_size = fabric_.world_size();
    ctx_.stage = Stage::fit;
    ctx_.attach(&train_metrics_);
    view_.attach_metrics(&views_);
    view_.attach_stop_reason(&progress_.stop_reason);
    view_.set_max_epochs(max_epochs());
    train_metrics_.set_device(fabric_.device());
    train_metrics_.set_views(&views_);
    run_setup_hooks(fabric_, hook_, Stage::fit);
    if (module.parameters().empty())
      throw MisconfigurationError("fulgur: the module " + module.name() +
                                  " has no parameters, so there is nothing to train; register them with "
                                  "register_module/register_parameter in its constructor (or create them in "
                                  "configure_model).");
    fabric_.setup_module(module);
    optimizers_ = detail::to_optimizer_configs(module.configure_optimizers());
    check_optimizers();
    for (auto& config : optimizers_) {
      fabric_.setup_optimizers(*config.optimizer);
      config.lr_scheduler.initial_step();  // as PyTorch's scheduler constructors do
    }
    if constexpr (automatic)
      optimization_.emplace(fabric_, hook_, config_, *optimizers_.front().optimizer, progress_);
    else
      optimization_.emplace(fabric_, hook_, config_, optimizers_, progress_);
    view_.attach_optimizers(optimizers_);
    plan_batches();
    view_.set_num_training_batches(max_batches_ >= 0 ? max_batches_ : -1);
    view_.set_has_validation(schedule_.enabled);
    if constexpr (Fabric::callbacks_type::has_loggers && requires { module.hparams(); })
      fabric_.callback_set().log_hyperparams(module.hparams());  // Lightning's _log_hyperparams
    if (!module.is_training())
      warn("fulgur: the module is in eval mode at the start of training (dropout and batch norm behave as in "
           "evaluation); call module->train() before fit if that is not what you want.");
  }

  void check_optimizers() {
    if (optimizers_.empty() || !optimizers_.front().optimizer)
      throw MisconfigurationError("fulgur: configure_optimizers() returned no optimizer; return one, e.g. "
                                  "std::make_unique<torch::optim::Adam>(parameters(), 1e-3).");
    for (const auto& config : optimizers_) {
      if (!config.optimizer) throw MisconfigurationError("fulgur: configure_optimizers() returned an empty OptimizerConfig.");
      if (config.frequency < 1) throw MisconfigurationError("fulgur: OptimizerConfig::frequency must be >= 1.");
      if (config.lr_scheduler.reduce_on_plateau() && config.monitor.empty())
        throw MisconfigurationError(
            "The lr scheduler dict must include a monitor when a `ReduceLROnPlateau` scheduler is used. For example: "
            "OptimizerConfig{.optimizer = ..., .lr_scheduler = ..., .monitor = \"val_loss\"}.");
    }
    if constexpr (automatic) {
      if (optimizers_.size() > 1)
        throw MisconfigurationError(
            "Training with multiple optimizers is only supported with manual optimization. Declare `static "
            "constexpr bool automatic_optimization = false;` in your module, then step each optimizer in "
            "training_step through ctx.optimizers().");
    } else {
      if (config_.accumulate_grad_batches != 1)
        throw MisconfigurationError(
            "Automatic gradient accumulation is not supported for manual optimization. Remove "
            "`TrainerConfig::accumulate_grad_batches = " + std::to_string(config_.accumulate_grad_batches) +
            "` or switch to automatic optimization.");
      if (config_.gradient_clip_val && *config_.gradient_clip_val > 0.0)
        throw MisconfigurationError(
            "Automatic gradient clipping is not supported for manual optimization. Remove "
            "`TrainerConfig::gradient_clip_val` or switch to automatic optimization (in training_step, clip with "
            "ctx.clip_gradients(optimizer, {.max_norm = ...})).");
    }
  }

  /// How many training batches an epoch runs, and where validation goes (Lightning's setup_data).
  void plan_batches() {
    require_batches(train_, config_.limit_train_batches, "training",
                    "give it samples (with drop_last, at least batch_size of them), or check limit_train_batches.");
    max_batches_ = batch_limit(train_, config_.limit_train_batches, "limit_train_batches");
    if constexpr (has_validation) {
      require_batches(val_, config_.limit_val_batches, "validation",
                      "give it samples, set limit_val_batches = 0, or call fit without it.");
      schedule_.batches = batch_limit(val_, config_.limit_val_batches, "limit_val_batches");
      schedule_.enabled = schedule_.batches != 0;
      schedule_.every_n_epochs = config_.check_val_every_n_epoch;
    }
    const BatchAmount& interval = config_.val_check_interval;
    if (!interval.is_fraction()) {
      schedule_.check_batch = interval.count();
      if (schedule_.enabled && schedule_.every_n_epochs && max_batches_ >= 0 && schedule_.check_batch > max_batches_)
        throw MisconfigurationError(
            "`val_check_interval` (" + std::to_string(schedule_.check_batch) + ") must be less than or equal to "
            "the number of the training batches (" + std::to_string(max_batches_) + "). If you want to disable "
            "validation set `limit_val_batches` to 0.0 instead. If you want to validate based on the total training "
            "batches, set `check_val_every_n_epoch` to std::nullopt.");
    } else if (max_batches_ < 0) {
      if (!interval.is_all())
        throw MisconfigurationError("The training loader cannot tell its length, so `val_check_interval` must be "
                                    "1.0 or a number of batches (an int), got the fraction " +
                                    number_text(interval.fraction()) + ".");
      schedule_.check_batch = -1;
    } else {
      schedule_.check_batch = std::max<std::int64_t>(1, interval.of(max_batches_));
    }
  }

  void sanity_check() {
    if constexpr (has_validation) {
      const std::int64_t wanted = config_.num_sanity_val_steps;
      if (!schedule_.enabled || wanted == 0) return;
      std::int64_t steps = wanted < 0 ? schedule_.batches : wanted;
      if (wanted > 0 && schedule_.batches >= 0) steps = std::min(steps, schedule_.batches);
      IsolatedRandomState isolated(fabric_.device());
      hook_(hooks::on_sanity_check_start);
      const auto result = validation_.emplace(fabric_, hook_, val_, views_).run(steps, EvaluationMode::sanity_check);
      warnings_.insert(warnings_.end(), result.warnings.begin(), result.warnings.end());
      hook_(hooks::on_sanity_check_end);
    }
  }

  /// The epoch limit: max_epochs, else Lightning's default of 1000 unless max_steps or max_time
  /// bounds the run (-1: none).
  std::int64_t max_epochs() const {
    if (config_.max_epochs) return *config_.max_epochs;
    return config_.max_steps == -1 && !config_.max_time ? 1000 : -1;
  }

  bool done() {
    if (config_.max_steps >= 0 && progress_.global_step >= config_.max_steps) {
      progress_.stop_reason = "max_steps=" + std::to_string(config_.max_steps) + " reached";
      return true;
    }
    if (const std::int64_t limit = max_epochs(); limit >= 0 && progress_.epochs_done >= limit) {
      progress_.stop_reason = "max_epochs=" + std::to_string(limit) + " reached";
      return true;
    }
    if (!ctx_.should_stop || !can_stop_early(progress_, config_)) return false;
    if (progress_.stop_reason.empty()) progress_.stop_reason = "should_stop was set";
    return true;
  }

  void run_epochs() {
    auto* validation = [&]() -> ValLoop* {
      if constexpr (has_validation) return &(validation_ ? *validation_ : validation_.emplace(fabric_, hook_, val_, views_));
      else return nullptr;
    }();
    EpochLoop epoch_loop({fabric_, hook_, train_, *optimization_, schedulers_, progress_, train_metrics_, views_,
                          warnings_, validation, checkpoints_},
                         max_batches_, schedule_);
    const auto start = std::chrono::steady_clock::now();
    view_.set_fit_start(start);
    if (resuming_) restore_views();
    while (!done()) {
      EpochSummary summary;
      summary.epoch = ctx_.current_epoch = progress_.epochs_done;
      const std::int64_t first_batch = std::exchange(resume_batch_, 0);
      const bool resumed = std::exchange(resuming_, false);
      if (first_batch == 0) progress_.stepped_in_epoch = progress_.skipped_in_epoch = 0;
      if (resumed && first_batch == 0) restore_random_state();  // before the epoch, as when it was taken
      progress_.in_epoch = true;
      progress_.batches_in_epoch = first_batch;
      checkpoints_.set_busy(true);
      if constexpr (requires { train_.set_epoch(summary.epoch); }) train_.set_epoch(summary.epoch);
      hook_(hooks::on_train_epoch_start);
      if (resumed && first_batch > 0) {  // mid-epoch: as the batch after it found things
        restore_epoch_position();
        restore_random_state();
      }
      const bool completed = epoch_loop.run(summary, start, first_batch, !loader_restored_);
      if (!completed && !frozen_loop_) frozen_loop_ = loop_state();  // cut short: resume inside this epoch
      finish_epoch(summary, completed);
      progress_.in_epoch = false;
      checkpoints_.set_busy(false);
      checkpoints_.flush();
      if (!done()) stop_if_interrupted(("after epoch " + std::to_string(summary.epoch)).c_str());
    }
  }

  void finish_epoch(EpochSummary& summary, bool completed) {
    ++progress_.epochs_done;
    auto publish = [this] { train_metrics_.publish_epoch(views_, [this](const at::Tensor& t, ReduceOp op) { return fabric_.all_reduce(t, op); }); };
    // What the epoch logged is visible to on_train_epoch_end, and what the module logs there to the
    // monitoring callbacks after it (EarlyStopping, the progress bar's epoch line).
    publish();
    hook_.call_with_monitoring_after(hooks::on_train_epoch_end, publish);
    if constexpr (Fabric::callbacks_type::has_loggers) send_epoch_to_loggers();
    if (completed && progress_.stepped_in_epoch > 0)
      schedulers_.after_epoch(summary.epoch, views_.callback, /*plateau=*/true);
    for (auto& w : schedulers_.take_warnings()) warn(std::move(w));
    train_metrics_.reset();
    summary.global_step = progress_.global_step;
    summary.skipped_optimizer_steps = progress_.skipped_in_epoch;
    skipped_total_ += progress_.skipped_in_epoch;
    summary.metrics = host_metrics();
    result_.epochs.push_back(summary);
  }

  /// The callback metrics on the host (one read each, at an epoch's end or fit's).
  Metrics host_metrics() const { return views_.callback.to_host(); }

  /// The epoch's logged values to the loggers, at the epoch's last logging step (Lightning's
  /// update_train_epoch_metrics, which logs at _batches_that_stepped - 1).
  void send_epoch_to_loggers() {
    Metrics logged;
    train_metrics_.collect_epoch_logged(logged);
    if (logged.empty()) return;
    logged.emplace("epoch", static_cast<double>(ctx_.current_epoch));
    view_.log_metrics(logged, progress_.batches_that_stepped - 1);
  }

  void warn(std::string text) {
    if (fabric_.is_global_zero()) std::cerr << text << std::endl;
    warnings_.push_back(std::move(text));
  }

  FitResult finish() {
    fabric_.record_fit_position({progress_.epochs_done, progress_.batches_that_stepped});
    result_.global_step = progress_.global_step;
    result_.skipped_optimizer_steps = skipped_total_;
    result_.metrics = host_metrics();
    result_.logged_metrics = views_.logged.to_host();
    result_.progress_bar_metrics = views_.progress_bar.to_host();
    result_.stop_reason = progress_.stop_reason;
    result_.warnings = std::move(warnings_);
    return std::move(result_);
  }

  FitOptions options_;
  Fabric& fabric_;
  const TrainerConfig& config_;
  StepContext ctx_;
  TrainerView view_;
  HookCallerOf<Fabric, Module> hook_;
  TrainLoader train_;
  ValLoader val_;
  std::vector<OptimizerConfig> optimizers_;
  std::optional<Optimization> optimization_;
  std::optional<ValLoop> validation_;
  FitProgress progress_;
  Schedulers schedulers_{optimizers_, automatic};
  detail::MetricCollection train_metrics_{/*training=*/true};
  detail::MetricViews views_;
  std::int64_t max_batches_ = -1;
  ValidationSchedule schedule_;
  std::int64_t skipped_total_ = 0;
  std::vector<std::string> warnings_;
  FitResult result_;
  // Checkpoints: saves wait for the batch or epoch under way; a resume puts its parts back in order.
  detail::CheckpointQueue checkpoints_{[this](const std::string& path, bool weights_only) { write_checkpoint(path, weights_only); },
                                       [this](const std::string& path) { remove_checkpoint(path); }};
  std::optional<StateDict> frozen_loop_;
  std::string checkpoint_path_;
  bool resuming_ = false, loader_restored_ = false;
  std::int64_t resume_batch_ = 0;
  c10::impl::GenericList resume_metrics_{c10::AnyType::get()};
  c10::impl::GenericDict resume_views_{c10::StringType::get(), c10::AnyType::get()};
  StateDict resume_rank_;
};

}  // namespace fulgur::loops
