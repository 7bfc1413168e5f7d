// The module-independent half of the fit loop (include/fulgur/loops/fit_state.hpp).
#include "fulgur/loops/fit_state.hpp"

#include "fulgur/detail/files.hpp"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <variant>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/checkpoint/state.hpp"
#include "fulgur/detail/describe.hpp"
#include "fulgur/detail/elastic_resume.hpp"
#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/loops/common.hpp"
#include "fulgur/preemption.hpp"
#include "src/detail/error_text.hpp"

namespace fulgur::loops {

using detail::without_fulgur_prefix;

FitState::FitState(const TrainerConfig& config, torch::nn::Module& module, detail::HostLink& host,
                   detail::LoopLink& loop, int global_rank, int world_size)
    : config_(config),
      module_(module),
      host_link_(host),
      loop_link_(loop),
      view_(ctx_, config, module, &host),
      global_rank_(global_rank),
      world_size_(world_size) {
  warn_unreachable_minimum("min_epochs", config.min_epochs, "max_epochs", max_epochs(), config.max_epochs.has_value());
  warn_unreachable_minimum("min_steps", config.min_steps, "max_steps", config.max_steps, /*maximum_set=*/true);
}

void FitState::warn_unreachable_minimum(const char* minimum, std::int64_t at_least, const char* maximum,
                                        std::int64_t at_most, bool maximum_set) {
  // The maximum ends fit first (Lightning's order too, silently there): a smoke test that lowers one
  // limit of a shared config hears that the other no longer holds.
  if (at_most < 0 || at_least <= at_most) return;
  const std::string least = std::to_string(at_least), most = std::to_string(at_most);
  warn("fulgur: " + detail::trainer_setting(minimum, least, least) + " is more than " +
       (maximum_set ? detail::trainer_setting(maximum, most, most)
                    : detail::trainer_setting(maximum) + " (unset: " + most + ")") +
       ": fit stops at " + maximum + ", so the minimum is not reached. Lower " + minimum + " or raise " + maximum + ".");
}

FitState::~FitState() = default;

void FitState::warn(std::string text) {
  // Said once: a warning that comes back every epoch (a non-strict monitor never logged) is the same
  // news each time (Python's warnings module shows one call site's text once too).
  if (std::find(warnings_.begin(), warnings_.end(), text) != warnings_.end()) return;
  if (global_rank_ == 0) std::cerr << text << std::endl;
  warnings_.push_back(std::move(text));
}

// ---- checkpoints asked for ------------------------------------------------------------------------

void FitState::request_save(const std::string& path, bool weights_only) {
  if (checkpoints_held_) saves_.emplace_back(path, weights_only);
  else write_checkpoint(path, weights_only);
}

void FitState::request_removal(const std::string& path) {
  if (checkpoints_held_ && !saves_.empty()) removals_.push_back(path);  // never before the save that replaces it
  else remove_checkpoint(path);
}

void FitState::write_requested_checkpoints() {
  auto saves = std::exchange(saves_, {});
  auto removals = std::exchange(removals_, {});
  for (const auto& [path, weights_only] : saves) write_checkpoint(path, weights_only);
  for (const auto& path : removals) remove_checkpoint(path);
}

void FitState::release_checkpoints(bool write) {
  checkpoints_held_ = false;
  if (write) {
    write_requested_checkpoints();
  } else {
    saves_.clear();
    removals_.clear();
  }
}

// ---- the run ------------------------------------------------------------------------------------

void FitState::check_optimizers(bool automatic) const {
  if (optimizers_.empty() || !optimizers_.front().optimizer)
    throw MisconfigurationError("fulgur: configure_optimizers() returned no optimizer; return one, e.g. "
                                "std::make_unique<torch::optim::Adam>(parameters(), 1e-3).");
  for (const auto& config : optimizers_) {
    if (!config.optimizer) throw MisconfigurationError("fulgur: configure_optimizers() returned an empty OptimizerConfig.");
    require_parameters(*config.optimizer, "configure_optimizers() returned");
    if (config.frequency < 1) throw MisconfigurationError("fulgur: OptimizerConfig::frequency must be >= 1.");
    if (config.lr_scheduler.reduce_on_plateau() && config.monitor.empty())
      throw MisconfigurationError(
          "The lr scheduler dict must include a monitor when a `ReduceLROnPlateau` scheduler is used. For example: "
          "OptimizerConfig{.optimizer = ..., .lr_scheduler = ..., .monitor = \"val_loss\"}.");
  }
  if (automatic) {
    if (optimizers_.size() > 1)
      throw MisconfigurationError(
          "Training with multiple optimizers is only supported with manual optimization. Declare `static "
          "constexpr bool automatic_optimization = false;` in your module, then step each optimizer in "
          "training_step through ctx.optimizers().");
    return;
  }
  if (config_.accumulate_grad_batches != 1)
    throw MisconfigurationError(
        "Automatic gradient accumulation is not supported for manual optimization. Remove "
        "`" + detail::trainer_setting("accumulate_grad_batches", std::to_string(config_.accumulate_grad_batches),
                                      std::to_string(config_.accumulate_grad_batches)) +
        "` or switch to automatic optimization.");
  if (config_.gradient_clip_val && *config_.gradient_clip_val > 0.0)
    throw MisconfigurationError(
        "Automatic gradient clipping is not supported for manual optimization. Remove `" +
        detail::trainer_setting("gradient_clip_val") + "` or switch to automatic optimization (in training_step, clip with "
        "ctx.clip_gradients(optimizer, {.max_norm = ...})).");
}

void FitState::plan_validation_interval() {
  const BatchAmount& interval = config_.val_check_interval;
  if (!interval.is_fraction()) {
    schedule_.check_batch = interval.count();
    if (schedule_.enabled && schedule_.every_n_epochs && max_batches_ >= 0 && schedule_.check_batch > max_batches_)
      throw MisconfigurationError(
          "`val_check_interval` (" + std::to_string(schedule_.check_batch) + ") must be less than or equal to "
          "the number of the training batches (" + std::to_string(max_batches_) + "). If you want to disable "
          "validation set `limit_val_batches` to 0.0 instead. If you want to validate based on the total training "
          "batches, set `" + detail::trainer_setting("check_val_every_n_epoch") + "` to " + detail::unset_value() + ".");
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

std::int64_t FitState::max_epochs() const {
  if (config_.max_epochs) return *config_.max_epochs;
  return config_.max_steps == -1 && !config_.max_time ? 1000 : -1;
}

bool FitState::done() {
  if (config_.max_steps >= 0 && progress_.global_step >= config_.max_steps) {
    progress_.stop_reason = "max_steps=" + std::to_string(config_.max_steps) + " reached";
    return true;
  }
  if (const std::int64_t limit = max_epochs(); limit >= 0 && progress_.epochs_done >= limit) {
    progress_.stop_reason = "max_epochs=" + std::to_string(limit) + " reached";
    return true;
  }
  if (!stop_wanted(progress_, ctx_, world_size_) || !can_stop_early(progress_, config_)) return false;
  if (progress_.stop_reason.empty()) progress_.stop_reason = "should_stop was set";
  return true;
}

void FitState::agree_on_stop() {
  if (world_size_ > 1)
    ctx_.should_stop = progress_.stop_agreed = host_link_.reduce_boolean_decision(ctx_.should_stop, /*all=*/false);
}

void FitState::close_epoch(EpochSummary& summary, bool completed, Schedulers& schedulers) {
  if (completed && progress_.stepped_in_epoch > 0)
    schedulers.after_epoch(summary.epoch, views_.callback, /*plateau=*/true);
  if (completed_step_ && completed_step_->pending) completed_step_->passed = true;  // the schedulers stepped
  for (auto& w : schedulers.take_warnings()) warn(std::move(w));
  train_metrics_.reset();
  summary.global_step = progress_.global_step;
  summary.skipped_optimizer_steps = progress_.skipped_in_epoch;
  skipped_total_ += progress_.skipped_in_epoch;
  summary.metrics = views_.callback.to_host();
  result_.epochs.push_back(summary);
}

std::int64_t FitState::forward_training_pass(const std::string& who) {
  if (finished_ || optimizers_.empty())
    throw MisconfigurationError("fulgur: " + who + ": a forward pass over the training data needs the fit under way "
                                "(set up, not finished); run it from on_train_start, on_train_end or on_fit_end.");
  if (progress_.in_epoch)
    throw MisconfigurationError("fulgur: " + who + ": a forward pass over the training data cannot run inside a "
                                "training epoch (epoch " + std::to_string(ctx_.current_epoch) +
                                "), whose own pass over the loader is under way; run it from on_train_start, "
                                "on_train_end or on_fit_end.");
  return loop_link_.forward_training_pass();
}

FitResult FitState::finish() {
  finished_ = true;
  result_.global_step = progress_.global_step;
  result_.skipped_optimizer_steps = skipped_total_;
  result_.metrics = views_.callback.to_host();
  result_.logged_metrics = views_.logged.to_host();
  result_.progress_bar_metrics = views_.progress_bar.to_host();
  result_.stop_reason = progress_.stop_reason;
  result_.warnings = std::move(warnings_);
  return std::move(result_);
}

// ---- interruptions -----------------------------------------------------------------------------

bool FitState::stop_if_interrupted(const char* where, bool training_done) {
  return stop_if_signalled(
      world_size_, [this](bool decision) { return host_link_.reduce_boolean_decision(decision, /*all=*/false); },
      [&] {
        return std::string(where) + " (epoch " + std::to_string(ctx_.current_epoch) + ", global_step " +
               std::to_string(progress_.global_step) + ")";
      },
      training_done);
}

void FitState::stop_if_finished_run_interrupted() {
  if (stop_if_interrupted("in the last epoch", /*training_done=*/true))
    warn("fulgur: a preemption signal (SIGTERM/SIGUSR1) arrived as training finished; nothing to save, fit "
         "completes normally.");
}

/// Lightning's hpc_ckpt_{n}.ckpt in default_root_dir, the next n (rank 0's count); every rank
/// takes part (the random states are gathered). Then, in a SLURM batch job, the requeue.
std::string FitState::write_preemption_checkpoint() {
  std::string name;
  if (global_rank_ == 0) {
    const std::string folder = config_.default_root_dir;
    const std::string path = detail::hpc_checkpoint(folder, /*next=*/true);
    name = path.substr(folder.size() + 1);
  }
  if (world_size_ > 1) name = host_link_.broadcast(name);
  write_checkpoint(name, /*weights_only=*/false);
  if (config_.preemption.auto_requeue && detail::in_slurm_batch_job() && global_rank_ == 0)
    warn("fulgur: " + detail::requeue_slurm_job() + ".");
  return host_link_.resolve_path(name);
}

void FitState::end_preempted(const Preempted& e) {  // the batch finished: save where the run is, then shut down
  std::string path;
  try {
    release_checkpoints(/*write=*/true);
    path = write_preemption_checkpoint();
  } catch (const std::exception& failure) {  // the shutdown still runs; the error says both
    loop_link_.shut_down(e, "failed", /*teardown=*/true);
    throw CheckpointError(std::string("fulgur: ") + e.what() + ", but its checkpoint could not be written: " +
                          failure.what() + " The run ends without one: resume from an earlier checkpoint, and "
                          "make default_root_dir writable.");
  }
  loop_link_.shut_down(e, "interrupted", /*teardown=*/true);
  result_.interrupted = result_.preempted = true;
  result_.checkpoint_path = path;
  progress_.stop_reason = e.what();
  warn(std::string("fulgur: ") + e.what() + "; wrote " + path + ", which the next fit continues exactly with " +
       detail::resume_setting("hpc") + " (under SLURM, by itself).");
}

void FitState::end_interrupted(const Interrupted& e) {  // Ctrl-C: the step finished; shut down as Lightning does
  try {
    release_checkpoints(/*write=*/true);  // what a callback asked for before the signal
  } catch (const std::exception&) {
    loop_link_.shut_down(e, "failed", /*teardown=*/true);
    throw;
  }
  loop_link_.shut_down(e, "interrupted", /*teardown=*/true);
  result_.interrupted = true;
  progress_.stop_reason = e.what();
  warn(std::string("fulgur: ") + e.what() + "; fit returns with FitResult::interrupted = true.");
}

// ---- checkpoints --------------------------------------------------------------------------------

StateDict FitState::checkpoint_state(bool weights_only, const CompletedStep* at, bool for_failure) {
  StateDict loop = at != nullptr ? loop_state(at->progress, at->skipped_total, at->loader) : current_loop_state();
  if (at != nullptr && at->pending) {
    if (at->metrics) {
      loop.erase("metrics");
      loop.insert("metrics", *at->metrics);
    }
    StateDict pending;
    pending.insert("kind", static_cast<std::int64_t>(at->pending->kind));
    pending.insert("step_ran", at->pending->step_ran);
    pending.insert("validate", at->pending->validate);
    pending.insert("last", at->pending->last);
    pending.insert("stop", at->pending->stop);
    pending.insert("should_stop", at->pending->should_stop);
    if (at->pending->train_loss) pending.insert("train_loss", *at->pending->train_loss);
    if (at->pending->val_loss) pending.insert("val_loss", *at->pending->val_loss);
    loop.insert("pending", pending.to_ivalue());
  }
  StateDict c;
  c.insert("epoch", loop.at("epoch"));
  c.insert("global_step", at != nullptr ? at->progress.global_step : progress_.global_step);
  c.insert("pytorch-lightning_version", std::string(checkpoint::lightning_layout_version));
  c.insert("state_dict", host_link_.module_state(module_).to_ivalue());
  StateDict loops;
  loops.insert("fit_loop", loop.to_ivalue());
  c.insert("loops", loops.to_ivalue());
  if (!weights_only) {
    // After a stop inside an epoch, the states from before its epoch end, with the file records as they
    // are now; a failure's checkpoint keeps those records from before too (the stop's writes may be
    // what failed, and a record of a file never written would outlive it).
    const bool frozen = at == nullptr && frozen_callbacks_;
    c.insert("callbacks", at != nullptr && at->callbacks ? at->callbacks->to_ivalue()
                          : frozen && for_failure        ? frozen_callbacks_->to_ivalue()
                          : frozen                       ? with_current_file_records(*frozen_callbacks_).to_ivalue()
                                                         : host_link_.callback_states().to_ivalue());
    c10::impl::GenericList optimizer_states(c10::AnyType::get()), schedulers(c10::AnyType::get());
    for (const auto& config : optimizers_) {
      optimizer_states.push_back(host_link_.optimizer_state(*config.optimizer).to_ivalue());
      schedulers.push_back(checkpoint::scheduler_state(config.lr_scheduler).to_ivalue());
    }
    c.insert("optimizer_states", optimizer_states);
    c.insert("lr_schedulers", schedulers);
    const StateDict precision = host_link_.precision_state();
    if (!precision.empty()) c.insert("MixedPrecision", precision.to_ivalue());  // Lightning's key: the plugin's class
  }
  if (auto hparams = loop_link_.module_hyperparameters()) c.insert("hyper_parameters", *hparams);
  StateDict stamp = checkpoint::stamp(host_link_.combination_name(), world_size_);
  stamp.insert("loggers", host_link_.logger_versions().to_ivalue());
  if (!weights_only) stamp.insert("ranks", rank_states(at, loop).to_ivalue());
  c.insert("fulgur", stamp.to_ivalue());
  loop_link_.on_save_checkpoint(c);
  return c;
}

StateDict FitState::with_current_file_records(const StateDict& earlier) {
  // After a stop inside an epoch, whose epoch end ran and wrote its files: a ModelCheckpoint's record of
  // them is its state now, so that a resumed run overwrites and prunes them. A shallow copy (the
  // earlier states stay as they were taken).
  StateDict states(earlier.to_ivalue().toGenericDict().copy());
  for (const auto& entry : host_link_.callback_file_records()) states.insert(entry.key().toStringRef(), entry.value());
  return states;
}

void FitState::remove_checkpoint(const std::string& path) { host_link_.remove_checkpoint(path); }

void FitState::freeze_position() {
  frozen_loop_ = current_loop_state();
  // A copy (deepcopy: callbacks may hold tensors they change in place).
  frozen_callbacks_ = StateDict(host_link_.callback_states().to_ivalue().deepcopy().toGenericDict());
}

StateDict FitState::current_loop_state() {
  if (frozen_loop_) return *frozen_loop_;
  return loop_state(progress_, skipped_total_, loop_link_.loader_state());
}

StateDict FitState::loop_state(const FitProgress& progress, std::int64_t skipped_total,
                               std::optional<StateDict> loader) const {
  const bool mid_epoch = progress.in_epoch && progress.batches_in_epoch > 0;
  StateDict s;
  s.insert("epoch", progress.epochs_done);
  s.insert("batch_idx", mid_epoch ? progress.batches_in_epoch : std::int64_t{0});
  s.insert("global_step", progress.global_step);
  s.insert("total_batch_idx", progress.total_batch_idx);
  s.insert("batches_that_stepped", progress.batches_that_stepped);
  s.insert("stepped_in_epoch", mid_epoch ? progress.stepped_in_epoch : std::int64_t{0});
  s.insert("skipped_in_epoch", mid_epoch ? progress.skipped_in_epoch : std::int64_t{0});
  s.insert("skipped_in_a_row", progress.skipped_in_a_row);
  s.insert("skipped_total", skipped_total);
  s.insert("accumulate_grad_batches", config_.accumulate_grad_batches);
  s.insert("metrics", mid_epoch ? c10::IValue(train_metrics_.state()) : c10::IValue(c10::impl::GenericList(c10::AnyType::get())));
  s.insert("views", views_.state());
  if (loader) s.insert("loader", loader->to_ivalue());
  if (mid_epoch && max_batches_ >= 0) s.insert("epoch_batches", max_batches_);  // what its rest belongs to
  return s;
}

StateDict FitState::rank_states(const CompletedStep* at, const StateDict& loop) {
  StateDict mine = at != nullptr ? at->random : checkpoint::random_state();
  // What this rank's epoch logged so far, and its last logged values: under several ranks they differ
  // (a value logged without sync_dist, each rank's own batches), and fit_loop's copy is global rank 0's.
  if (world_size_ > 1) {
    mine.insert("epoch_metrics", loop.at("metrics"));
    mine.insert("views", loop.at("views"));
  }
  // A completed step is a window's end: no gradients pending there.
  const bool accumulating = at == nullptr && progress_.in_epoch &&
                            progress_.batches_in_epoch % config_.accumulate_grad_batches != 0;
  StateDict grads;
  if (accumulating)
    for (const auto& item : module_.named_parameters())
      if (item.value().grad().defined()) grads.insert(item.key(), item.value().grad());
  mine.insert("accumulated_gradients", grads.to_ivalue());
  c10::impl::GenericList ranks(c10::AnyType::get());
  if (world_size_ == 1) {
    ranks.push_back(mine.to_ivalue());
  } else {  // through one gathered byte tensor: ranks may hold different things
    const std::vector<char> bytes = checkpoint::to_bytes(mine);
    at::Tensor local = at::empty({static_cast<std::int64_t>(bytes.size())}, at::kByte);
    std::memcpy(local.data_ptr(), bytes.data(), bytes.size());
    const at::Tensor sizes = host_link_.all_gather(at::scalar_tensor(local.numel(), at::kLong)).cpu();
    const std::int64_t longest = sizes.max().item<std::int64_t>();
    at::Tensor padded = at::zeros({longest}, at::kByte);
    padded.narrow(0, 0, local.numel()).copy_(local);
    const at::Tensor all = host_link_.all_gather(padded).cpu();
    for (int r = 0; r < world_size_; ++r) {
      const at::Tensor row = all[r].narrow(0, 0, sizes[r].item<std::int64_t>()).contiguous();
      const char* data = static_cast<const char*>(row.data_ptr());
      ranks.push_back(checkpoint::from_bytes(std::vector<char>(data, data + row.numel()),
                                             "rank " + std::to_string(r) + "'s state").to_ivalue());
    }
  }
  StateDict out;
  out.insert("per_rank", ranks);
  return out;
}

c10::impl::GenericDict FitState::hyperparameters(const Hyperparameters& hparams) {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, value] : hparams) std::visit([&](const auto& v) { out.insert(name, v); }, value);
  return out;
}

}  // namespace fulgur::loops
