#pragma once
// What Trainer<A, S, P, ...> does that depends on none of its policies, compiled once in libfulgur
// (src/trainer_support.cpp) rather than in every program that builds a Trainer: its error messages,
// names, paths and the checkpoint a fit resumes from.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/trainer_config.hpp"

namespace c10 {
class Error;
}

namespace fulgur::detail {

/// "cpu/single_device/32-true".
std::string combination_name(std::string_view accelerator, std::string_view strategy, std::string_view precision);
/// A path as the Fabric verbs take it: a relative one under TrainerConfig::default_root_dir.
std::string resolve_path(const TrainerConfig& config, const std::string& path);

/// fit's ckpt_path as it is loaded: "last" — the newest last*.ckpt in default_root_dir/checkpoints
/// and `checkpoint_folders` (what the callbacks and loggers name), else "" and a warning; "hpc" — the
/// newest hpc_ckpt_{n}.ckpt in default_root_dir (an error if none); none in a SLURM batch job with
/// auto_requeue — that one, if any (Lightning's auto-resume); none in a restarted worker group
/// (TORCHELASTIC_RESTART_COUNT or SLURM_RESTART_COUNT > 0) — the newest complete checkpoint of those
/// folders and the hpc ones (detail/elastic_resume.hpp); any other path under default_root_dir.
/// Absolute, or empty for a fresh start.
std::string fit_checkpoint(const TrainerConfig& config, const std::string& ckpt_path,
                           const std::vector<std::string>& checkpoint_folders, bool global_zero,
                           std::vector<std::string>& warnings);

/// The process ends after a preemption checkpoint (TrainerConfig::preemption.exit_process), its
/// output flushed, with the code a scheduler reads as "try again".
[[noreturn]] void end_preempted_process(int exit_code);

// ---- the Trainer's errors, each naming what was wrong and what to do ------------------------------
[[noreturn]] void raise_needs_module(std::string_view verb);
/// Refuses a ClipGradients that names both bounds or neither, a negative or NaN bound, a NaN norm type.
void check_clip_arguments(const ClipGradients& clip);
[[noreturn]] void raise_optimizer_state_mismatch(const c10::Error& error);
[[noreturn]] void raise_save_checkpoint_outside_fit();
[[noreturn]] void raise_progress_bar_disabled();
[[noreturn]] void raise_accelerator_unavailable(std::string_view accelerator);
[[noreturn]] void raise_dtype_unsupported(std::string_view precision, c10::ScalarType dtype, c10::Device device);
/// A one-process strategy asked for several devices or nodes.
[[noreturn]] void raise_single_process_devices(std::string_view strategy, std::size_t devices, int num_nodes);

}  // namespace fulgur::detail
