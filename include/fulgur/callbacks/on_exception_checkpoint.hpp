#pragma once
// OnExceptionCheckpoint (Lightning's): an exception leaving fit writes <dirpath>/<filename>.ckpt
// before it goes on to the caller. Stronger than Lightning's, which saves whatever state the
// exception left: the file holds the LAST COMPLETED optimizer step, so fit resumes from it
// (FitOptions::ckpt_path) exactly as the run would have gone on from that step — the failing batch
// runs again, and under gradient accumulation the whole unfinished window. An exception from
// inside the optimizer step (weights perhaps half updated), or after a step before its batch
// ended, writes nothing and says why; so does a failure the DDP ranks cannot agree on. A Ctrl-C or
// a preemption signal (taken between steps) writes the state where fit stopped, and the file stays.
// A fit that ends well removes the file (Lightning's teardown).
//
// Cost: while it is in the Trainer, the loop keeps, after each optimizer step, its counters, the
// random state and the loader's own state (no weights); nothing without it.
#include <exception>
#include <string>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/stage.hpp"

namespace fulgur {

struct OnExceptionCheckpointOptions {
  /// Required, as Lightning's (an exception can come before any set-up); a relative one is taken
  /// from the current directory.
  std::string dirpath{};
  std::string filename = "on_exception";  ///< without the extension: ".ckpt" is appended
};

class OnExceptionCheckpoint {
 public:
  static constexpr const char* file_extension = ".ckpt";

  explicit OnExceptionCheckpoint(OnExceptionCheckpointOptions options);

  void setup(TrainerView& trainer, Stage stage);
  void on_exception(TrainerView& trainer, const std::exception& e);
  void teardown(TrainerView& trainer, Stage stage);

  const std::string& dirpath() const { return options_.dirpath; }
  const std::string& filename() const { return options_.filename; }
  /// <dirpath>/<filename>.ckpt, as given (relative paths stay relative).
  std::string ckpt_path() const;

 private:
  OnExceptionCheckpointOptions options_;
  bool keep_ = false;  // written for an interruption, whose fit still tears down
};

}  // namespace fulgur
