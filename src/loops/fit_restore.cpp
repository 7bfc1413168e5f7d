// Resuming fit from a checkpoint: reading it, and restoring the module, optimizers, progress,
// metric views, epoch position and random state of FitState (include/fulgur/loops/fit_state.hpp).
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/checkpoint/state.hpp"
#include "fulgur/detail/describe.hpp"
#include "fulgur/detail/elastic_resume.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/loops/common.hpp"
#include "fulgur/loops/fit_state.hpp"
#include "src/detail/error_text.hpp"

namespace fulgur::loops {

using detail::without_fulgur_prefix;

// ---- resume ---------------------------------------------------------------------------------------

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
