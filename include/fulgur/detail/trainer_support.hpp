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

/// Where the callbacks and loggers keep checkpoints (their checkpoint_folders), and each
/// ModelCheckpoint's best_model_path in the Trainer's order.
struct CheckpointSources {
  std::vector<std::string> folders;
  std::vector<std::string> best_model_paths;
};

/// The checkpoint a verb ("fit", "validate", "test", "predict") loads for its ckpt_path (Lightning's
/// _parse_ckpt_path): "last" — the newest last*.ckpt in default_root_dir/checkpoints and the sources'
/// folders, else "" and a warning; "best" — the first ModelCheckpoint's best checkpoint (an error if
/// there is no ModelCheckpoint or it saved none); "hpc" — the newest hpc_ckpt_{n}.ckpt in
/// default_root_dir (an error if none); any other path under default_root_dir. fit only: none in a
/// SLURM batch job with auto_requeue — the hpc one, if any (Lightning's auto-resume); none in a
/// restarted worker group (TORCHELASTIC_RESTART_COUNT or SLURM_RESTART_COUNT > 0) — the newest
/// complete checkpoint of those folders and the hpc ones (detail/elastic_resume.hpp). Absolute, or
/// empty for none (a fresh start, or the module's own weights).
std::string checkpoint_to_load(const TrainerConfig& config, std::string_view verb, const std::string& ckpt_path,
                               const CheckpointSources& sources, bool global_zero, std::vector<std::string>& warnings);

/// A precision computing in float16 or bfloat16 (its declared `dtype`) on a CPU without LibTorch's fast
/// reduced-precision kernels (CPUAccelerator::has_fast_reduced_precision): said on stderr on global rank
/// 0, unless `said` (which it sets: once per Trainer).
void say_slow_cpu_precision(std::string_view precision, c10::ScalarType dtype, bool global_zero, bool& said);

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
