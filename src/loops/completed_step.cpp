// OnExceptionCheckpoint's positions in the fit loop (include/fulgur/loops/fit_state.hpp): the last
// completed step, or a batch's/epoch's trained half with what is still pending, and whether a
// checkpoint of it can be written when fit fails.
#include <string>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/checkpoint/state.hpp"
#include "fulgur/detail/describe.hpp"
#include "fulgur/loops/fit_state.hpp"
#include "src/detail/error_text.hpp"

namespace fulgur::loops {

FitState::CompletedStep::CompletedStep() = default;

void FitState::remember_completed_step() {
  // The weights, optimizers and schedulers do not move until the next optimizer step, so the
  // position, the random state and the loader's own state are all a checkpoint of here needs.
  if (!completed_step_) completed_step_.emplace();
  completed_step_->progress = progress_;
  completed_step_->skipped_total = skipped_total_;
  completed_step_->loader = loop_link_.loader_state();
  completed_step_->random = checkpoint::random_state();
  completed_step_->pending.reset();
  completed_step_->metrics.reset();
  completed_step_->callbacks.reset();
  completed_step_->passed = false;
}

void FitState::remember_trained_batch(std::int64_t batch_idx, const PendingBatchEnd& pending) {
  remember_completed_step();
  completed_step_->progress.batches_in_epoch = batch_idx + 1;  // resumed, the loader goes on after it
  completed_step_->pending = pending;
  if (pending.validate) remember_hook_state();  // validation's hooks may change them before it fails
}

void FitState::remember_trained_epoch(const EpochSummary& summary) {
  remember_completed_step();
  completed_step_->pending = PendingBatchEnd{.kind = PendingBatchEnd::Kind::epoch_end,
                                             .should_stop = world_size_ == 1 ? ctx_.should_stop : progress_.stop_agreed,
                                             .train_loss = summary.train_loss,
                                             .val_loss = summary.val_loss};
  remember_hook_state();  // on_train_epoch_end may log, and callbacks change their states, before it fails
}

void FitState::remember_hook_state() {
  // Copies (deepcopy: the live tensors accumulate in place); taken at validations and epoch ends only.
  completed_step_->metrics = c10::IValue(train_metrics_.state()).deepcopy().toList();
  completed_step_->callbacks = StateDict(host_link_.callback_states().to_ivalue().deepcopy().toGenericDict());
}

std::string FitState::completed_step_text() const {
  if (!completed_step_) return {};
  if (!progress_.in_epoch && frozen_loop_.has_value() &&
      (completed_step_->progress.global_step != progress_.global_step || completed_step_->pending))
    return "global_step " + std::to_string(progress_.global_step) + " (epoch " +
           std::to_string(progress_.epochs_done - 1) + ", where the run stopped)";
  const FitProgress& p = completed_step_->progress;
  if (completed_step_->pending) {
    const PendingBatchEnd& pending = *completed_step_->pending;
    const std::string epoch = std::to_string(p.epochs_done);
    if (pending.kind == PendingBatchEnd::Kind::epoch_end)
      return "global_step " + std::to_string(p.global_step) + " (epoch " + epoch + ", its batches done; resumed, its "
             "end runs first: on_train_epoch_end, its loggers and schedulers)";
    std::string then = pending.validate ? "its validation" : "";
    if (pending.last) then += std::string(then.empty() ? "" : " and ") + "the epoch's end";
    return "global_step " + std::to_string(p.global_step) + " (epoch " + epoch + ", after the optimizer step of "
           "batch " + std::to_string(p.batches_in_epoch - 1) +
           (then.empty() ? ")" : "; resumed, " + then + " run first)");
  }
  const bool mid_epoch = p.in_epoch && p.batches_in_epoch > 0;
  return "global_step " + std::to_string(p.global_step) + " (epoch " + std::to_string(p.epochs_done) +
         (mid_epoch ? ", after batch " + std::to_string(p.batches_in_epoch - 1) + ")" : ", before its first batch)");
}

std::string FitState::save_completed_step(const std::string& path, bool peers_reachable) {
  std::string why;
  // A run that stopped mid-epoch (max_steps, a stop request) and failed after its training loop
  // (on_train_end, on_fit_end): its position is frozen where it stopped, which resumes exactly.
  const bool stopped_mid_epoch = !progress_.in_epoch && frozen_loop_.has_value();
  if (progress_.in_optimizer_step)
    why = "the exception came from inside the optimizer step of global step " + std::to_string(progress_.global_step) +
          ", so the weights may be partly updated and no consistent state exists";
  else if (!completed_step_)
    why = "the exception came before the first training batch: nothing was trained yet";
  else if (completed_step_->progress.global_step != progress_.global_step && !stopped_mid_epoch)
    why = "the exception came after the optimizer step of global step " + std::to_string(progress_.global_step - 1) +
          ", before that batch's training half ended (the step-interval schedulers, on_train_batch_end, the step's "
          "logging): hooks partly ran, so no state a resumed fit goes on from exactly exists; the last checkpoint "
          "ModelCheckpoint wrote still resumes exactly";
  else if (progress_.in_epoch && frozen_loop_.has_value())  // finish_epoch of an epoch a stop cut short
    why = "the exception came in the end of epoch " + std::to_string(progress_.epochs_done - 1) +
          ", which a stop cut short after batch " + std::to_string(progress_.batches_in_epoch - 1) +
          " (on_train_epoch_end, its loggers): hooks partly ran, so no state a resumed fit goes on from exactly "
          "exists; the last checkpoint ModelCheckpoint wrote still resumes exactly";
  else if (completed_step_->pending && !stopped_mid_epoch &&
           (completed_step_->passed ||
            (completed_step_->pending->kind == PendingBatchEnd::Kind::batch_end &&
             completed_step_->progress.batches_that_stepped != progress_.batches_that_stepped)))
    why = "the exception came after the " +
          std::string(completed_step_->pending->kind == PendingBatchEnd::Kind::epoch_end
                          ? "end of epoch " + std::to_string(completed_step_->progress.epochs_done) +
                                " had stepped its schedulers"
                          : "end of batch " + std::to_string(completed_step_->progress.batches_in_epoch - 1) +
                                " had stepped its schedulers") +
          " (writing the checkpoints asked for there): the state moved past the position a checkpoint can resume "
          "from; the checkpoints already written resume exactly";
  if (world_size_ > 1) {
    if (!peers_reachable)
      return "the failure was a collective's (a rank failed alone or is gone), so the ranks cannot agree on a step "
             "to save" + (why.empty() ? std::string() : "; besides, " + why);
    // Every rank says whether it can save, and which step: all must save the same one.
    const std::int64_t step = completed_step_ ? completed_step_->progress.global_step : -1;
    try {
      const at::Tensor all =
          host_link_.all_gather(at::tensor({std::int64_t{why.empty()}, step}, at::kLong)).cpu().reshape({-1, 2});
      for (int r = 0; r < world_size_ && why.empty(); ++r) {
        if (all[r][0].item<std::int64_t>() == 0) why = "rank " + std::to_string(r) + " cannot save its last step";
        else if (all[r][1].item<std::int64_t>() != step)
          why = "rank " + std::to_string(r) + " is at global_step " + std::to_string(all[r][1].item<std::int64_t>()) +
                ", this rank at " + std::to_string(step);
      }
    } catch (const std::exception& e) {
      return "the ranks could not agree on a step to save (" + detail::first_line(detail::without_fulgur_prefix(e.what())) + ")" +
             (why.empty() ? std::string() : "; besides, " + why);
    }
  }
  if (!why.empty()) return why;
  try {
    // Where the run stopped: a pending end of its last batch has run (frozen after it).
    const bool current = stopped_mid_epoch && (completed_step_->progress.global_step != progress_.global_step ||
                                               completed_step_->pending);
    host_link_.save(path, checkpoint_state(/*weights_only=*/false, current ? nullptr : &*completed_step_,
                                           /*for_failure=*/true));
  } catch (const std::exception& e) {
    return "writing it failed: " + detail::first_line(detail::without_fulgur_prefix(e.what()));
  }
  return {};
}

}  // namespace fulgur::loops
