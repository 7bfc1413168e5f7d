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

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "fulgur/concepts/training_module.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/hooks.hpp"
#include "fulgur/interrupt.hpp"
#include "fulgur/loops/common.hpp"
#include "fulgur/loops/evaluation.hpp"
#include "fulgur/loops/fit_state.hpp"
#include "fulgur/loops/host.hpp"
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
template <class Host, class Data>
struct processed_loader {
  using type = decltype(std::declval<Host&>().setup_dataloader(std::declval<Data&>()));
};
template <class Host>
struct processed_loader<Host, NoData> {
  using type = NoData;
};

template <class Host, class Module, class TrainData, class ValData>
class FitLoop final : private detail::LoopLink, public FitState {
  static constexpr bool has_validation = !std::is_same_v<ValData, NoData>;
  static constexpr bool automatic = detail::automatic_optimization_of<Module>();
  using TrainLoader = decltype(std::declval<Host&>().setup_dataloader(std::declval<TrainData&>()));
  using ValLoader = typename processed_loader<Host, ValData>::type;
  using Optimization = std::conditional_t<automatic, AutomaticOptimization<Host, Module>,
                                          ManualOptimization<Host, Module>>;
  using ValLoop = std::conditional_t<has_validation,
                                     EvaluationLoop<Validation, Host, Module, std::remove_reference_t<ValLoader>>,
                                     NoData>;
  using EpochLoop = TrainingEpochLoop<Host, Module, std::remove_reference_t<TrainLoader>, Optimization, ValLoop>;

 public:
  FitLoop(Host& host, Module& module, TrainData& train, ValData& val, FitOptions options = {})
      : FitState(host.config(), module, host_access::services(host).link(), *this, host.global_rank(),
                 host.world_size()),
        options_(std::move(options)),
        host_(host),
        hook_(module, ctx_, host_access::services(host).callbacks(), view_),
        train_(host.setup_dataloader(train)),
        val_(process_validation(host, val)) {}

  FitResult run() {
    InterruptHandler interrupt_handler(config_.handle_interrupt, config_.preemption.enabled);
    try {
      const StateDict resumed = read_checkpoint(options_.ckpt_path);  // before any hook: a bad file fails fast
      set_up();
      if (!resumed.empty()) restore(resumed);
      hook_(hooks::on_fit_start);
      sanity_check();
      stop_if_interrupted("in the sanity check");
      if (max_batches_ != 0 && !done()) {  // nothing to train (limit 0, max_epochs 0, ...): Lightning's skip
        hook_(hooks::on_train_start);
        run_epochs();
        stop_if_finished_run_interrupted();  // a Ctrl-C in the last validation is not lost
        end_training();  // Lightning's Strategy.on_train_end, before the hooks of that name
        hook_(hooks::on_train_end);
      } else {
        if (max_batches_ == 0 && progress_.stop_reason.empty())
          progress_.stop_reason = "no training batches (limit_train_batches=0)";  // Lightning: "No training batches."
        end_training();
      }
      hook_(hooks::on_fit_end);
      hook_(hooks::teardown, Stage::fit);
      callbacks().finalize_loggers("success");
      callbacks().describe_profiler();
    } catch (const Preempted& e) {
      end_preempted(e);
    } catch (const Interrupted& e) {
      end_interrupted(e);
    } catch (const std::exception& e) {
      release_checkpoints(/*write=*/false);
      shut_down(e, "failed", /*teardown=*/false);
      throw;
    }
    return finish();
  }

 private:
  auto& callbacks() { return host_access::services(host_).callbacks(); }
  void end_training() {
    auto timed = profile_strategy<"on_train_end", Host>(hook_);
    host_.end_training();
  }

  // ---- detail::LoopLink: what FitState and StepContext ask of this loop ----------------------------
  std::optional<c10::impl::GenericDict> module_hyperparameters() override {
    if constexpr (requires { hook_.module().hparams(); }) return hyperparameters(hook_.module().hparams());
    else return std::nullopt;
  }
  std::optional<StateDict> loader_state() override {
    if constexpr (requires { train_.state_dict(); }) return train_.state_dict();
    else return std::nullopt;
  }
  bool load_loader_state(const StateDict& state) override {
    if constexpr (requires { train_.load_state_dict(state); }) {
      train_.load_state_dict(state);
      return true;
    } else {
      return false;
    }
  }
  void on_save_checkpoint(StateDict& checkpoint) override { hook_(hooks::on_save_checkpoint, checkpoint); }
  void on_load_checkpoint(const StateDict& checkpoint) override { hook_(hooks::on_load_checkpoint, checkpoint); }
  // Every hook and logger runs even if one throws; what they throw is reported, and the run's own
  // error (or interruption) is what the caller sees.
  void shut_down(const std::exception& e, const char* status, bool teardown) override {
    shut_down_hooks(hook_, callbacks(), e, status, teardown ? std::optional(Stage::fit) : std::nullopt,
                    [this](const std::string& line) { warn(line); });
  }
  // In a forward-only pass a manual training_step's backward, steps and clipping are skipped.
  void manual_backward(const at::Tensor& loss) override {
    if constexpr (!automatic)
      if (!forward_only_) optimization_->backward(loss);
  }
  bool manual_step(std::size_t optimizer) override {
    if constexpr (!automatic) return !forward_only_ && optimization_->step(optimizer);
    else return false;
  }
  at::Tensor manual_clip(std::size_t optimizer, const ClipGradients& clip) override {
    if constexpr (!automatic)
      if (!forward_only_) return optimization_->clip(optimizer, clip);
    return {};
  }
  std::int64_t forward_training_pass() override {
    // What training_step logs goes to a collection of its own, dropped; batch_idx is the pass's.
    detail::MetricCollection dropped{/*training=*/true};
    dropped.set_device(host_.device());
    struct Restore {
      FitLoop& loop;
      std::int64_t batch_idx;
      ~Restore() {
        loop.ctx_.attach(&loop.train_metrics_);
        loop.ctx_.batch_idx = batch_idx;
        loop.forward_only_ = false;
      }
    } restore{*this, ctx_.batch_idx};
    ctx_.attach(&dropped);
    forward_only_ = true;
    at::NoGradGuard no_grad;
    std::int64_t batch_idx = 0;
    const auto end = std::end(train_);
    for (auto it = std::begin(train_); it != end && (max_batches_ < 0 || batch_idx < max_batches_); ++it) {
      ctx_.batch_idx = batch_idx++;
      const auto& raw = *it;
      const auto batch = prepare_batch(host_, hook_, raw, "training_step");
      (void)run_step(host_, hook_, hooks::training_step, batch);
    }
    return batch_idx;
  }

  static ValLoader process_validation(Host& host, ValData& val) {
    if constexpr (has_validation) return host.setup_dataloader(val);
    else return NoData{};
  }

  void set_up() {
    Module& module = hook_.module();
    ctx_.global_rank = host_.global_rank();  // the set-up hooks may ask where they run
    ctx_.world_size = host_.world_size();
    ctx_.stage = Stage::fit;
    ctx_.attach(&train_metrics_);
    view_.attach_metrics(&views_);
    view_.attach_stop_reason(&progress_.stop_reason);
    view_.set_max_epochs(max_epochs());
    train_metrics_.set_device(host_.device());
    train_metrics_.set_views(&views_);
    run_setup_hooks(host_, hook_, Stage::fit);
    if (module.parameters().empty()) raise_no_parameters(module.name());
    host_.setup_module(module);
    {
      auto timed = profile_module<"configure_optimizers">(hook_);
      optimizers_ = detail::to_optimizer_configs(module.configure_optimizers());
    }
    check_optimizers(automatic);
    for (auto& config : optimizers_) {
      host_.setup_optimizers(*config.optimizer);
      config.lr_scheduler.initial_step();  // as PyTorch's scheduler constructors do
    }
    if constexpr (automatic)
      optimization_.emplace(host_, hook_, config_, *optimizers_.front().optimizer, progress_);
    else
      optimization_.emplace(host_, hook_, config_, optimizers_, progress_,
                            static_cast<detail::ManualOptimizationLink&>(*this));
    view_.attach_optimizers(optimizers_);
    plan_batches();
    view_.set_num_training_batches(max_batches_ >= 0 ? max_batches_ : -1);
    view_.set_has_validation(schedule_.enabled);
    if constexpr (callbacks_of<Host>::has_loggers &&
                  (requires { module.hparams(); } || callbacks_of<Host>::provides_hyperparameters)) {
      Hyperparameters hparams;  // Lightning's _log_hyperparams: the module's, and what callbacks add (fulgur::cli)
      if constexpr (requires { module.hparams(); }) hparams = module.hparams();
      callbacks().collect_hyperparameters(hparams);
      callbacks().log_hyperparams(hparams);
    }
    if (!module.is_training())
      warn("fulgur: the module is in eval mode at the start of training (dropout and batch norm behave as in "
           "evaluation); call module->train() before fit if that is not what you want.");
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
      if constexpr (data::several_loaders<std::remove_reference_t<ValLoader>>)  // each loader's limit, now
        val_.each([&](auto& loader, std::int64_t idx) { check_loader_limit(loader, idx); });
      schedule_.enabled = schedule_.batches != 0;
      schedule_.every_n_epochs = config_.check_val_every_n_epoch;
    }
    plan_validation_interval();
  }

  /// A limit that cannot work for one of several validation loaders, found before training (the
  /// loop applies each loader's limit when it validates).
  template <class Loader>
  void check_loader_limit(Loader& loader, std::int64_t idx) {
    try {
      (void)batch_limit(loader, config_.limit_val_batches, "limit_val_batches");
    } catch (const MisconfigurationError& e) {
      throw MisconfigurationError("validation loader " + std::to_string(idx) + " (dataloader_idx " +
                                  std::to_string(idx) + "): " + e.what());
    }
  }

  void sanity_check() {
    if constexpr (has_validation) {
      const std::int64_t wanted = config_.num_sanity_val_steps;
      if (!schedule_.enabled || wanted == 0) return;
      std::int64_t steps = wanted < 0 ? schedule_.batches : wanted;
      if (wanted > 0 && schedule_.batches >= 0) steps = std::min(steps, schedule_.batches);
      IsolatedRandomState isolated(host_.device());
      hook_(hooks::on_sanity_check_start);
      const auto result = validation_.emplace(host_, hook_, val_, views_).run(steps, EvaluationMode::sanity_check);
      warnings_.insert(warnings_.end(), result.warnings.begin(), result.warnings.end());
      hook_(hooks::on_sanity_check_end);
    }
  }

  void run_epochs() {
    auto* validation = [&]() -> ValLoop* {
      if constexpr (has_validation) return &(validation_ ? *validation_ : validation_.emplace(host_, hook_, val_, views_));
      else return nullptr;
    }();
    EpochLoop epoch_loop({host_, hook_, train_, *optimization_, schedulers_, progress_, train_metrics_, views_,
                          warnings_, validation, *this},
                         max_batches_, schedule_);
    const auto start = std::chrono::steady_clock::now();
    view_.set_fit_start(start);
    if (resuming_) restore_views(host_.device());
    while (!done()) {
      EpochSummary summary;
      summary.epoch = ctx_.current_epoch = progress_.epochs_done;
      const std::int64_t first_batch = std::exchange(resume_batch_, 0);
      const bool resumed = std::exchange(resuming_, false);
      // A resumed checkpoint of a batch's training half, or of an epoch whose batches were all done.
      const std::optional<PendingBatchEnd> pending = std::exchange(resume_pending_, std::nullopt);
      if (first_batch == 0) progress_.stepped_in_epoch = progress_.skipped_in_epoch = 0;
      if (resumed && first_batch == 0) restore_random_state();  // before the epoch, as when it was taken
      if (first_batch == 0) mark_completed_step();  // before epoch e: OnExceptionCheckpoint's point
      progress_.in_epoch = true;
      progress_.batches_in_epoch = first_batch;
      hold_checkpoints(true);
      if constexpr (requires { train_.set_epoch(summary.epoch); }) train_.set_epoch(summary.epoch);
      hook_(hooks::on_train_epoch_start);
      if (resumed && first_batch > 0) {  // mid-epoch: as the batch after it found things
        restore_epoch_position();
        restore_random_state();
        if (!pending) mark_completed_step();  // the resumed position (a pending one is marked where it runs)
      }
      bool completed = true;
      if (pending && pending->kind == PendingBatchEnd::Kind::epoch_end) {  // its batches are done: its end runs
        summary.train_loss = pending->train_loss;
        summary.val_loss = pending->val_loss;
        ctx_.should_stop = progress_.stop_agreed = pending->should_stop;  // a stop asked for ends the run after it
      } else {
        auto running = profile<"run_training_epoch">(hook_);
        completed = epoch_loop.run(summary, start, first_batch, !loader_restored_, pending ? &*pending : nullptr);
      }
      // OnExceptionCheckpoint's point before the epoch's end (on_train_epoch_end, its loggers, schedulers)
      if (completed) mark_trained_epoch(summary);
      if (!completed && !frozen_loop_) freeze_position();  // cut short: resume inside this epoch
      finish_epoch(summary, completed);
      agree_on_stop();  // before done(): a stop asked for on one rank ends every rank's run here
      progress_.in_epoch = false;
      hold_checkpoints(false);
      write_requested_checkpoints();
      if (completed) mark_completed_step();  // after the epoch's end (a stopped one keeps its last mid-epoch mark)
      if (!done()) stop_if_interrupted(("after epoch " + std::to_string(summary.epoch)).c_str());
    }
  }

  void finish_epoch(EpochSummary& summary, bool completed) {
    ++progress_.epochs_done;
    auto publish = [this] { train_metrics_.publish_epoch(views_, [this](const at::Tensor& t, ReduceOp op) { return host_.all_reduce(t, op); }); };
    // What the epoch logged is visible to on_train_epoch_end, and what the module logs there to the
    // monitoring callbacks after it (EarlyStopping, the progress bar's epoch line).
    publish();
    hook_.call_with_monitoring_after(hooks::on_train_epoch_end, publish);
    if constexpr (callbacks_of<Host>::has_loggers) send_epoch_to_loggers();
    close_epoch(summary, completed, schedulers_);
  }

  /// The epoch's logged values to the loggers, at the epoch's last logging step (Lightning's
  /// update_train_epoch_metrics, which logs at _batches_that_stepped - 1).
  void send_epoch_to_loggers() {
    Metrics logged;
    train_metrics_.collect_epoch_logged(logged);
    if (logged.empty()) return;
    logged.emplace("epoch", static_cast<double>(ctx_.current_epoch));
    view_.log_metrics(logged, progress_.batches_that_stepped - 1);
  }

  FitResult finish() {
    host_access::services(host_).record_fit_position({progress_.epochs_done, progress_.batches_that_stepped});
    callbacks().collect_warnings(warnings_);  // what loggers reported on their own (a tracking server away)
    return FitState::finish();
  }

  FitOptions options_;
  Host& host_;
  HookCallerOf<Host, Module> hook_;
  TrainLoader train_;
  ValLoader val_;
  std::optional<Optimization> optimization_;
  std::optional<ValLoop> validation_;
  Schedulers schedulers_{optimizers_, automatic};
  bool forward_only_ = false;  // forward_training_pass under way
};

/// Trainer::fit: the fit loop on `host` (a fulgur::loops::loop_host), kept by the host's loop
/// services after it ends (save_checkpoint writes its final state).
/// `warnings`: what the host found before the fit began (e.g. no "last" checkpoint), reported with the
/// fit's own.
template <class Host, class Module, class TrainData, class ValData>
FitResult fit(Host& host, Module& module, TrainData& train, ValData& val, FitOptions options,
              std::vector<std::string> warnings = {}) {
  if constexpr (!loop_host<Host>) {
    static_assert(assert_loop_host<Host>());
    return {};
  } else {
    auto loop = std::make_shared<FitLoop<Host, Module, TrainData, ValData>>(host, module, train, val, std::move(options));
    host_access::services(host).attach_fit(loop);
    for (std::string& warning : warnings) loop->warn(std::move(warning));
    return loop->run();
  }
}

}  // namespace fulgur::loops
