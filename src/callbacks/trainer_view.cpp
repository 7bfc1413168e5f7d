// TrainerView's calls into the fit under way (include/fulgur/callbacks/trainer_view.hpp).
#include "fulgur/callbacks/trainer_view.hpp"

#include <iostream>

#include "fulgur/loops/fit_state.hpp"

namespace fulgur {

void TrainerView::warn(std::string text) {
  if (loops::FitState* fit = host_ != nullptr ? host_->fit() : nullptr; fit != nullptr && ctx_->stage == Stage::fit)
    return fit->warn(std::move(text));
  if (is_global_zero()) std::cerr << text << std::endl;
}

void TrainerView::save_checkpoint(const std::string& path, bool weights_only) {
  loops::FitState* fit = host_ != nullptr ? host_->fit() : nullptr;
  if (fit == nullptr)
    throw MisconfigurationError("fulgur: save_checkpoint needs a fit under way or finished; call it from fit's hooks.");
  fit->request_save(path, weights_only);
}

void TrainerView::set_accumulate_grad_batches(std::int64_t factor) {
  if (factor < 1)
    throw MisconfigurationError("fulgur: accumulate_grad_batches must be at least 1, got " + std::to_string(factor) + ".");
  if (host_ == nullptr)
    throw MisconfigurationError("fulgur: set_accumulate_grad_batches needs a Trainer; this view has none.");
  // The view's config is the Trainer's own TrainerConfig (a non-const member), which the loops read at
  // each batch: the Trainer lends it read-only to callbacks, this one field excepted.
  const_cast<TrainerConfig*>(config_)->accumulate_grad_batches = factor;
}

void TrainerView::track_completed_steps() {
  if (loops::FitState* fit = host_ != nullptr ? host_->fit() : nullptr; fit != nullptr && ctx_->stage == Stage::fit)
    fit->track_completed_steps();
}

std::string TrainerView::save_completed_step(const std::string& path, bool peers_reachable) {
  loops::FitState* fit = host_ != nullptr ? host_->fit() : nullptr;
  if (fit == nullptr || ctx_->stage != Stage::fit) return "no fit is under way";
  return fit->save_completed_step(path, peers_reachable);
}

std::string TrainerView::completed_step_text() const {
  loops::FitState* fit = host_ != nullptr ? host_->fit() : nullptr;
  return fit != nullptr && ctx_->stage == Stage::fit ? fit->completed_step_text() : std::string();
}

std::int64_t TrainerView::forward_training_pass(const std::string& who) {
  loops::FitState* fit = host_ != nullptr ? host_->fit() : nullptr;
  if (fit == nullptr || ctx_->stage != Stage::fit)
    throw MisconfigurationError("fulgur: " + who + ": a forward pass over the training data needs a fit under way; "
                                "run it from fit's hooks (on_train_end, on_fit_end).");
  return fit->forward_training_pass(who);
}

void TrainerView::remove_checkpoint(const std::string& path) {
  if (loops::FitState* fit = host_ != nullptr ? host_->fit() : nullptr) fit->request_removal(path);
}

}  // namespace fulgur
