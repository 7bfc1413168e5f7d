#pragma once
// What a restarted worker group resumes from, by itself (Lightning-style auto-resume for elastic
// launchers): under torchrun --max-restarts (TORCHELASTIC_RESTART_COUNT > 0), fulgur's own
// launcher with TrainerConfig::max_restarts (which sets the same variable), or a requeued SLURM job
// (SLURM_RESTART_COUNT > 0), a fit given no ckpt_path continues from the checkpoint with the most
// training progress among the checkpoint callbacks' folders, default_root_dir/checkpoints and the
// preemption checkpoints (hpc_ckpt_{n}.ckpt in default_root_dir), skipping any that is unreadable
// or incomplete (a sharded checkpoint missing a rank's part). Used by checkpoint_to_load
// (src/trainer_support.cpp); implemented in src/elastic_resume.cpp.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fulgur::detail {

/// This process's place in a run that was restarted: the count (0: the first attempt) and who
/// restarted it ("torchrun", "fulgur launcher", "SLURM requeue").
struct Restart {
  int count = 0;
  std::string by{};
};

/// Reads TORCHELASTIC_RESTART_COUNT (with FULGUR_LAUNCHER set: fulgur's launcher) and
/// SLURM_RESTART_COUNT through `lookup` (getenv by default). A value that is not a count is
/// ignored (restart 0): a restart is never inferred from garbage.
Restart restart_of_this_process(const std::function<std::optional<std::string>(const std::string&)>& lookup = {});

/// The checkpoint a restarted run resumes from.
struct ResumePoint {
  std::string path{};              ///< absolute; empty: no complete checkpoint (start afresh)
  std::int64_t global_step = -1;   ///< its progress
  std::vector<std::string> skipped{};  ///< "<path>: <why>" for each newer candidate passed over
};

/// Among the *.ckpt files of `folders` and the hpc_ckpt_{n}.ckpt files of `hpc_folder`: the one
/// with the highest global step (ties: the most recently written) that reads whole, holds a
/// resumable training state (optimizer states; not weights only) and has every part its format
/// keeps beside it. Deterministic: every rank that sees the same files picks the same one.
ResumePoint newest_complete_checkpoint(const std::vector<std::string>& folders, const std::string& hpc_folder);

}  // namespace fulgur::detail
