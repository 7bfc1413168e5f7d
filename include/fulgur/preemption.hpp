#pragma once
// What fit does when the job is about to be ended (TrainerConfig::preemption): the checkpoint's
// name and place (Lightning's hpc_ckpt_{n}.ckpt in default_root_dir) and SLURM's requeue.
// Torch-free.
#include <string>

namespace fulgur {

/// The exit code of a process that fit ended for a preemption after writing its checkpoint:
/// sysexits' EX_TEMPFAIL ("a temporary failure; try again"), neither success (0) nor a crash.
inline constexpr int preempted_exit_code = 75;

namespace detail {

/// hpc_ckpt_{n}.ckpt in `folder`: the highest n there ("" if none), or (next) the one after it,
/// starting at 1.
std::string hpc_checkpoint(const std::string& folder, bool next);

/// Whether this process runs in a SLURM job that can be requeued: SLURM_JOB_ID is set and the job
/// is not an interactive session (job name "bash" or "interactive", as Lightning tells them apart).
bool in_slurm_batch_job();

/// `scontrol requeue <job>` (the array task when SLURM_ARRAY_JOB_ID is set), as Lightning's
/// SLURM connector does; returns what happened, one line for the log.
std::string requeue_slurm_job();

}  // namespace detail
}  // namespace fulgur
