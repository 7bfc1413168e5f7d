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

StateDict FitState::checkpoint_state(bool weights_only, const CompletedStep* at) {
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
    // A failure's checkpoint keeps every state from before the hooks it resumes into, file records
    // included (save_completed_step): a save those hooks asked for may not have been written.
    c.insert("callbacks", at != nullptr && at->callbacks ? at->callbacks->to_ivalue()
                          : at == nullptr && frozen_callbacks_ ? with_current_file_records(*frozen_callbacks_).to_ivalue()
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

// ---- resume -------------------------------------------------------------------------------------

StateDict FitState::read_checkpoint(const std::string& chosen) {
  std::string path = chosen;
  // A restarted group (detail/elastic_resume.hpp) resumes from the file global rank 0 chose: a rank
  // whose view of the folders differs (a shared file system's lag) follows it, and says so.
  if (world_size_ > 1 && detail::restart_of_this_process().count > 0) {
    path = host_link_.broadcast(chosen);
    if (path != chosen)
      std::cerr << "fulgur: rank " << global_rank_ << " resumes from global rank 0's checkpoint '" << path
                << "' (this rank found '" << chosen << "')" << std::endl;
  }
  if (path.empty()) return {};
  StateDict state = host_link_.load(path);
  const std::string what = "checkpoint '" + path + "'";
  checkpoint::check_format(state, what);
  const StateDict stamp = checkpoint::require_dict(state, "fulgur", what);
  const std::int64_t world = checkpoint::require_int(stamp, "world_size", what + "'s 'fulgur' entry");
  if (!state.contains("optimizer_states"))
    throw CheckpointError("fulgur: " + what + " holds weights only (save_weights_only), so training cannot go "
                          "on from it; load its 'state_dict' into the module instead (checkpoint::module_weights).");
  if (world != world_size_)
    throw CheckpointError("fulgur: " + what + " was written by " + std::to_string(world) + (world == 1 ? " process" : " processes") + ", this run "
                          "has " + std::to_string(world_size_) + "; each rank's random state and data "
                          "shard belong to its rank: resume with the same devices x num_nodes.");
  checkpoint_path_ = path;
  // The loggers write on in the version directories of the checkpoint's run, from its logging step
  // (none kept: written before fulgur kept them).
  if (stamp.contains("loggers") && stamp.at("loggers").isGenericDict()) {
    const StateDict loop =
        checkpoint::require_dict(checkpoint::require_dict(state, "loops", what), "fit_loop", what + "'s loops");
    host_link_.resume_loggers(StateDict(stamp.at("loggers").toGenericDict()),
                   checkpoint::require_int(loop, "batches_that_stepped", what + "'s fit_loop"));
  }
  return state;
}

void FitState::restore(const StateDict& c) {
  loop_link_.on_load_checkpoint(c);
  warn_unknown_callbacks(host_link_.load_callback_states(checkpoint::require_dict(c, "callbacks", checkpoint_name())));
  restore_module(c);
  restore_optimizers(c);
  if (c.contains("MixedPrecision")) host_link_.load_precision_state(StateDict(c.at("MixedPrecision").toGenericDict()));
  const StateDict loop = restore_progress(c);
  view_.set_logging_step(progress_.batches_that_stepped);
  if (loop.contains("loader")) loader_restored_ = loop_link_.load_loader_state(StateDict(loop.at("loader").toGenericDict()));
}

void FitState::warn_unknown_callbacks(const std::vector<std::string>& keys) {
  for (const std::string& key : keys)
    warn("fulgur: " + checkpoint_name() + " holds the state of callback " + key + ", which this Trainer does not "
         "have; add it to the Trainer's arguments to restore it (Lightning warns the same).");
}

void FitState::restore_module(const StateDict& c) {
  const std::string what = checkpoint_name();
  const StateDict weights = checkpoint::require_dict(c, "state_dict", what);
  try {
    host_link_.load_module_state(module_, weights, /*strict=*/true);
  } catch (const CheckpointPartError& e) {  // a part of the checkpoint is missing: its message says which
    throw CheckpointError("fulgur: " + what + "'s weights cannot be read: " + without_fulgur_prefix(e.what()));
  } catch (const Error& e) {  // resuming is strict: weights alone go through checkpoint::module_weights
    std::string text = without_fulgur_prefix(e.what());
    // The loader's own advice (strict = false) is for loading weights, which fit's resume is not.
    const bool partial = detail::without_strict_advice(text);
    throw CheckpointError("fulgur: " + what + " does not fit the module " + module_.name() + " (resuming a fit "
                          "needs every weight): " + text +
                          (partial ? "\nfit resumes a run exactly, so every weight must fit. To train the weights that "
                                     "match in this network, load them into the module first (fulgur::checkpoint::"
                                     "load_module_state_dict(module, fulgur::checkpoint::module_weights("
                                     "fulgur::checkpoint::load(path)), /*strict=*/false)) and call fit without "
                                     "ckpt_path."
                                   : ""));
  }
}

void FitState::restore_optimizers(const StateDict& c) {
  const std::string what = checkpoint_name();
  const auto optimizer_states = checkpoint::require(c, "optimizer_states", what).toList();
  const auto schedulers = checkpoint::require(c, "lr_schedulers", what).toList();
  if (optimizer_states.size() != optimizers_.size())
    throw CheckpointError("fulgur: " + what + " holds " + std::to_string(optimizer_states.size()) +
                          " optimizer states, configure_optimizers returned " + std::to_string(optimizers_.size()) +
                          "; resume with the module's own configure_optimizers.");
  for (std::size_t i = 0; i < optimizers_.size(); ++i) {
    const std::string which = "fulgur: " + what + "'s optimizer state " + std::to_string(i);
    try {
      host_link_.load_optimizer_state(*optimizers_[i].optimizer, StateDict(optimizer_states.get(i).toGenericDict()));
    } catch (const CheckpointPartError& e) {  // a part of the checkpoint is missing: its message says which, and what to do
      throw CheckpointError(which + " cannot be read: " + detail::first_line(without_fulgur_prefix(e.what())));
    } catch (const std::exception& e) {
      const std::string text = without_fulgur_prefix(e.what());
      const bool says_how = text.find("resume") != std::string::npos || text.find("Resume") != std::string::npos;
      throw CheckpointError(which + " does not fit the optimizer configure_optimizers returned: " +
                            detail::first_line(text) + (says_how ? "" : " Resume with the same optimizer type and parameters."));
    }
    if (i < schedulers.size())
      checkpoint::load_scheduler_state(optimizers_[i].lr_scheduler, StateDict(schedulers.get(i).toGenericDict()),
                                       what + "'s lr_schedulers[" + std::to_string(i) + "]");
  }
}

StateDict FitState::restore_progress(const StateDict& c) {
  const std::string what = checkpoint_name();
  const StateDict loops = checkpoint::require_dict(c, "loops", what);
  StateDict loop = checkpoint::require_dict(loops, "fit_loop", what + "'s loops");  // returned: moved
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
  resume_epoch_batches_ = loop.contains("epoch_batches") ? count("epoch_batches") : -1;  // older checkpoints: none
  // Inside a window its length must stay; checked once the resumed epoch started (restore_epoch_position),
  // where a GradientAccumulationScheduler has set the factor of that epoch.
  resume_accumulate_ = loop.contains("accumulate_grad_batches") ? count("accumulate_grad_batches") : config_.accumulate_grad_batches;
  ctx_.current_epoch = progress_.epochs_done;
  ctx_.global_step = progress_.global_step;
  // Past the end this run asks for: nothing trains, which a user who raised the wrong limit should hear.
  if (config_.max_steps >= 0 && progress_.global_step >= config_.max_steps)
    warn("fulgur: " + what + " is at global_step " + std::to_string(progress_.global_step) + ", already at or past "
         "max_steps = " + std::to_string(config_.max_steps) + ": nothing will train. Raise max_steps to train on.");
  else if (config_.max_epochs && *config_.max_epochs >= 0 && progress_.epochs_done >= *config_.max_epochs &&
           resume_batch_ == 0) {
    const std::int64_t done = progress_.epochs_done;  // epochs count from 0, as in every other message
    warn("fulgur: " + what + " is " +
         (done == 0 ? std::string("before epoch 0")
                    : "after epoch " + std::to_string(done - 1) + " (" + std::to_string(done) + " epoch" +
                          (done == 1 ? "" : "s") + " done)") +
         ", already at or past max_epochs = " + std::to_string(*config_.max_epochs) +
         ": nothing will train. Raise max_epochs to train on.");
  }
  resume_pending_.reset();
  // OnExceptionCheckpoint's checkpoint of a batch's training half, or of an epoch's batches
  if (loop.contains("pending")) {
    const StateDict pending = checkpoint::require_dict(loop, "pending", what + "'s fit_loop");
    const std::int64_t kind = checkpoint::require_int(pending, "kind", what + "'s fit_loop pending");
    if ((kind != 1 && kind != 2) || resume_batch_ < 1)
      throw CheckpointError("fulgur: " + what + "'s fit_loop 'pending' entry is not one fulgur writes (kind " +
                            std::to_string(kind) + " at batch_idx " + std::to_string(resume_batch_) +
                            "); resume from a checkpoint this version of fulgur wrote.");
    auto flag = [&](const char* key) { return pending.contains(key) && pending.at(key).toBool(); };
    auto loss = [&](const char* key) {
      return pending.contains(key) ? std::optional<double>(pending.at(key).toDouble()) : std::nullopt;
    };
    resume_pending_ = PendingBatchEnd{.kind = static_cast<PendingBatchEnd::Kind>(kind), .step_ran = flag("step_ran"),
                                      .validate = flag("validate"), .last = flag("last"), .stop = flag("stop"),
                                      .should_stop = flag("should_stop"),
                                      .train_loss = loss("train_loss"), .val_loss = loss("val_loss")};
  }
  resume_metrics_ = checkpoint::require(loop, "metrics", what).toList();
  resume_views_ = checkpoint::require(loop, "views", what).toGenericDict();
  const auto ranks = checkpoint::require_dict(checkpoint::require_dict(c, "fulgur", what), "ranks", what).at("per_rank").toList();
  resume_rank_ = StateDict(ranks.get(static_cast<std::size_t>(global_rank_)).toGenericDict());
  if (resume_rank_.contains("epoch_metrics")) resume_metrics_ = resume_rank_.at("epoch_metrics").toList();
  if (resume_rank_.contains("views")) resume_views_ = resume_rank_.at("views").toGenericDict();
  resuming_ = true;
  return loop;
}

void FitState::restore_views(c10::Device device) { views_.load_state(resume_views_, device); }

void FitState::restore_epoch_position() {
  const std::int64_t saved = resume_accumulate_, batch = progress_.batches_in_epoch;
  // Other data under the same position (a checkpoint at or past this epoch's end is the epoch loop's:
  // it ends the epoch there, or refuses).
  if (resume_epoch_batches_ >= 0 && max_batches_ >= 0 && resume_epoch_batches_ != max_batches_ && batch < max_batches_)
    warn("fulgur: " + checkpoint_name() + " was taken after batch " + std::to_string(batch - 1) + " of epoch " +
         std::to_string(progress_.epochs_done) + ", an epoch of " + std::to_string(resume_epoch_batches_) +
         " batches; this run's has " + std::to_string(max_batches_) + " (another batch size, dataset or "
         "limit_train_batches), so the rest of the epoch is not the rest of the one it was cut from: samples are "
         "skipped or seen twice. For an exact continuation resume with the data, batch size and "
         "limit_train_batches it was trained on, or from a checkpoint at an epoch's end.");
  if (batch % saved != 0 && saved != config_.accumulate_grad_batches)
    throw CheckpointError("fulgur: " + checkpoint_name() + " was taken inside a gradient-accumulation window (batch " +
                          std::to_string(batch % saved) + " of " + std::to_string(saved) + ", its "
                          "gradients saved with it); resume with accumulate_grad_batches = " +
                          std::to_string(saved) + " (this run has " + std::to_string(config_.accumulate_grad_batches) +
                          "), or from a checkpoint at a window's end.");
  train_metrics_.load_state(resume_metrics_);
  const StateDict grads(resume_rank_.at("accumulated_gradients").toGenericDict());
  if (grads.empty()) return;
  at::NoGradGuard no_grad;
  for (const auto& item : module_.named_parameters())
    if (grads.contains(item.key())) item.value().mutable_grad() = grads.at(item.key()).toTensor().to(item.value().device());
}

void FitState::restore_random_state() { checkpoint::set_random_state(resume_rank_, checkpoint_name()); }

}  // namespace fulgur::loops
