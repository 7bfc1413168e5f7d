// OnExceptionCheckpoint (include/fulgur/callbacks/on_exception_checkpoint.hpp).
#include "fulgur/callbacks/on_exception_checkpoint.hpp"

#include <unistd.h>

#include <iostream>
#include <utility>

#include "fulgur/detail/files.hpp"
#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"

namespace fulgur {

OnExceptionCheckpoint::OnExceptionCheckpoint(OnExceptionCheckpointOptions options) : options_(std::move(options)) {
  if (options_.dirpath.empty())
    throw MisconfigurationError("fulgur: OnExceptionCheckpoint needs a dirpath (Lightning's is required too: an "
                                "exception can come before any set-up); give .dirpath = \"checkpoints\", say.");
  if (options_.filename.empty())  // Lightning's ValueError
    throw MisconfigurationError("fulgur: OnExceptionCheckpoint: The filename cannot be empty (give it without "
                                "the extension; the default is \"on_exception\").");
  if (options_.filename.find('/') != std::string::npos)
    throw MisconfigurationError("fulgur: OnExceptionCheckpoint's filename '" + options_.filename + "' holds a '/'; "
                                "put the folder in dirpath and the name alone in filename.");
}

std::string OnExceptionCheckpoint::ckpt_path() const {
  const std::string& dir = options_.dirpath;
  return dir + (dir.back() == '/' ? "" : "/") + options_.filename + file_extension;
}

void OnExceptionCheckpoint::setup(TrainerView& trainer, Stage stage) {
  keep_ = false;
  if (stage == Stage::fit) trainer.track_completed_steps();
}

void OnExceptionCheckpoint::on_exception(TrainerView& trainer, const std::exception& e) {
  if (trainer.stage() != Stage::fit) return;  // only fit has a training state to save
  // Relative to the current directory, as Lightning's os.path.join (fulgur's save would put a
  // relative path under default_root_dir).
  const std::string path = detail::absolute_path(ckpt_path());
  if (dynamic_cast<const Interrupted*>(&e) != nullptr) {
    // Ctrl-C or a preemption signal is taken between steps (agreed on by every rank): the state
    // where fit stopped resumes exactly. fit returns and tears down; the file stays.
    trainer.save_checkpoint(path);
    keep_ = true;
    trainer.warn("fulgur: OnExceptionCheckpoint wrote '" + path + "' where the interrupted fit stopped.");
    return;
  }
  const bool peers_reachable = dynamic_cast<const DistributedError*>(&e) == nullptr;
  const std::string step = trainer.completed_step_text();
  const std::string why = trainer.save_completed_step(path, peers_reachable);
  if (why.empty()) {
    // A non-finite loss: the state as it was then (Lightning's too), to debug; resumed as it is, the
    // same loss comes again.
    const bool non_finite = dynamic_cast<const NonFiniteLossError*>(&e) != nullptr;
    trainer.warn("fulgur: OnExceptionCheckpoint wrote '" + path + "', the last completed optimizer step: " + step +
                 ". Resume with " + detail::resume_setting(path) + " once the cause is fixed." +
                 (non_finite ? " Its weights are those the step with the non-finite loss left (to debug it: they may "
                               "hold NaN or inf). Weights from before it are in a checkpoint a ModelCheckpoint wrote "
                               "earlier (its last_model_path or best_model_path), if it wrote one."
                             : ""));
    return;
  }
  const std::string text = "fulgur: OnExceptionCheckpoint wrote no checkpoint: " + why + ".";
  if (trainer.world_size() > 1)  // each rank says why (warn prints on global rank 0 only)
    std::cerr << "[rank " << trainer.global_rank() << "] " << text << std::endl;
  trainer.warn(text);
}

void OnExceptionCheckpoint::teardown(TrainerView& trainer, Stage stage) {
  // Lightning's: a stage that ends well removes the file (global rank 0; absent is fine).
  (void)stage;
  if (std::exchange(keep_, false) || !trainer.is_global_zero()) return;
  (void)::unlink(detail::absolute_path(ckpt_path()).c_str());
}

}  // namespace fulgur
