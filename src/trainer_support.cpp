// Trainer's policy-independent parts (include/fulgur/detail/trainer_support.hpp).
#include "fulgur/detail/trainer_support.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "fulgur/accelerators/cpu.hpp"
#include "fulgur/accelerators/device_parsing.hpp"
#include "fulgur/detail/describe.hpp"
#include "fulgur/detail/elastic_resume.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/preemption.hpp"

namespace fulgur::detail {

std::string combination_name(std::string_view accelerator, std::string_view strategy, std::string_view precision) {
  return std::string(accelerator) + "/" + std::string(strategy) + "/" + std::string(precision);
}

std::string resolve_path(const TrainerConfig& config, const std::string& path) {
  if (path.empty() || path.front() == '/' || config.default_root_dir == ".") return path;
  return config.default_root_dir + "/" + path;
}

namespace {

std::string last_checkpoint(const TrainerConfig& config, std::string_view verb,
                            const std::vector<std::string>& checkpoint_folders, std::vector<std::string>& warnings) {
  std::vector<std::string> folders{absolute_path(resolve_path(config, "checkpoints"))};
  folders.insert(folders.end(), checkpoint_folders.begin(), checkpoint_folders.end());
  std::string newest = newest_file(folders, "last", ".ckpt");
  if (newest.empty())
    warnings.push_back("fulgur: " + std::string(verb) + "(ckpt_path = \"last\") is set, but there is no last "
                       "checkpoint available (looked for last*.ckpt in " + folders.front() + " and the checkpoint "
                       "callbacks' folders). No checkpoint will be loaded" +
                       (verb == "fit" ? std::string(".") : ": " + std::string(verb) + " uses the module's own weights.") +
                       " HINT: for fit to write one, give its ModelCheckpoint save_last = true (" +
                       spelled("ModelCheckpointOptions{.save_last = true}",
                               "--trainer.callbacks+=ModelCheckpoint --trainer.callbacks.save_last=true") +
                       "), as Lightning hints.");
  return newest;
}

/// Lightning's ckpt_path="best": the first ModelCheckpoint's best_model_path.
std::string best_checkpoint(std::string_view verb, const std::vector<std::string>& best_model_paths,
                            std::vector<std::string>& warnings) {
  const std::string call = std::string(verb) + "(ckpt_path = \"best\")";
  if (best_model_paths.empty())
    throw MisconfigurationError("fulgur: " + call + " is set but no ModelCheckpoint is configured (Lightning: "
                                "\"`ModelCheckpoint` is not configured\"): add one to the Trainer's callbacks and fit, "
                                "or give the path of a checkpoint.");
  if (best_model_paths.size() > 1)
    warnings.push_back("fulgur: " + call + " with " + std::to_string(best_model_paths.size()) + " ModelCheckpoint "
                       "callbacks: the first one's best checkpoint is used (as in Lightning).");
  if (best_model_paths.front().empty())
    throw MisconfigurationError("fulgur: " + call + " is set but the ModelCheckpoint has saved no best checkpoint "
                                "(Lightning: \"`ModelCheckpoint` is not configured to save the best model\"): \"best\" is "
                                "the best checkpoint of an earlier fit with this Trainer (in this process); fit first, or "
                                "give the path of a checkpoint, or \"last\".");
  return best_model_paths.front();
}

std::string preemption_checkpoint(const TrainerConfig& config, std::string_view verb, const std::string& ckpt_path,
                                  bool global_zero) {
  const bool automatic = verb == "fit" && ckpt_path.empty() && config.preemption.enabled &&
                         config.preemption.auto_requeue && in_slurm_batch_job();
  if (ckpt_path != "hpc" && !automatic) return ckpt_path;
  const std::string found = hpc_checkpoint(config.default_root_dir, /*next=*/false);
  if (found.empty() && !automatic)
    throw CheckpointError("fulgur: `" + spelled(std::string(verb) + "(..., {.ckpt_path = \"hpc\"})", "--ckpt_path=hpc") +
                          "` is set but no HPC "
                          "checkpoint was found (hpc_ckpt_{n}.ckpt in default_root_dir '" + config.default_root_dir +
                          "'). Pass the path of a checkpoint" +
                          (verb == "fit" ? ", or leave ckpt_path empty to start afresh." : "."));
  if (!found.empty() && global_zero) std::cerr << "fulgur: resuming from the preemption checkpoint " << found << std::endl;
  return found.empty() ? found : absolute_path(found);  // already under default_root_dir
}

/// A restarted worker group's own resume point (elastic_resume.hpp), said on global rank 0.
std::string restarted_run_checkpoint(const TrainerConfig& config, const std::vector<std::string>& checkpoint_folders,
                                     const Restart& restart, bool global_zero) {
  std::vector<std::string> folders{absolute_path(resolve_path(config, "checkpoints"))};
  for (const std::string& folder : checkpoint_folders)
    if (std::find(folders.begin(), folders.end(), absolute_path(folder)) == folders.end())
      folders.push_back(absolute_path(folder));
  const std::string root = absolute_path(config.default_root_dir);
  const ResumePoint point = newest_complete_checkpoint(folders, root);
  if (!global_zero) return point.path;
  const std::string who = "fulgur: restart " + std::to_string(restart.count) + " (" + restart.by + "): ";
  for (const std::string& skipped : point.skipped)
    std::cerr << who << "passing over " << skipped << "; falling back to the next checkpoint" << std::endl;
  if (point.path.empty()) {
    std::string looked;
    for (const std::string& folder : folders) looked += folder + ", ";
    std::cerr << who << "no complete checkpoint to resume from (looked for *.ckpt in " << looked
              << "and hpc_ckpt_*.ckpt in " << root << "); starting afresh" << std::endl;
  } else {
    std::cerr << who << "resuming from " << point.path << " (global step " << point.global_step << ")" << std::endl;
  }
  return point.path;
}

}  // namespace

std::string checkpoint_to_load(const TrainerConfig& config, std::string_view verb, const std::string& ckpt_path,
                               const CheckpointSources& sources, bool global_zero, std::vector<std::string>& warnings) {
  const bool fitting = verb == "fit";
  if (ckpt_path.empty() && fitting)
    if (const Restart restart = restart_of_this_process(); restart.count > 0)
      return restarted_run_checkpoint(config, sources.folders, restart, global_zero);
  const bool named = ckpt_path == "last" || ckpt_path == "best";
  const std::string path = ckpt_path == "last"   ? last_checkpoint(config, verb, sources.folders, warnings)
                           : ckpt_path == "best" ? best_checkpoint(verb, sources.best_model_paths, warnings)
                                                 : preemption_checkpoint(config, verb, ckpt_path, global_zero);
  if (path.empty()) return path;
  // Relative: from the working directory when there is one there (Lightning opens it so, and a callback's
  // relative dirpath is from there too), else under default_root_dir (where save_checkpoint puts one).
  const bool relative = path.front() != '/';
  const std::string under_root = absolute_path(resolve_path(config, path));
  const bool as_given = relative && path_exists(path);
  const std::string resolved = as_given ? absolute_path(path) : under_root;
  if (relative && under_root != resolved && as_given && path_exists(under_root))
    warnings.push_back("fulgur: " + std::string(verb) + "(ckpt_path = \"" + path + "\") names two files: " + resolved +
                       " (from the current directory, which is loaded) and " + under_root +
                       " (under " + trainer_setting("default_root_dir") + "); give an absolute path to load the other.");
  if (relative && !as_given && !path_exists(under_root))
    throw CheckpointError("fulgur: " + std::string(verb) + "(ckpt_path = \"" + path + "\"): no such checkpoint: looked at " +
                          absolute_path(path) + " (from the current directory) and " + under_root +
                          " (under " + trainer_setting("default_root_dir") + "). Check the path, or give \"last\", \"best\" or "
                          "\"hpc\".");
  // Lightning's "Restoring states from the checkpoint path at ..." (a preemption checkpoint said so already);
  // validate/test/predict load the weights only.
  if (global_zero && (named || path == ckpt_path))
    std::cerr << "fulgur: " << (fitting ? "restoring states" : "loading the weights") << " from the checkpoint path at "
              << resolved << std::endl;
  return resolved;
}

void say_slow_cpu_precision(std::string_view precision, c10::ScalarType dtype, bool global_zero, bool& said) {
  const bool reduced = dtype == c10::kHalf || dtype == c10::kBFloat16;
  if (said || !reduced || !global_zero || CPUAccelerator::has_fast_reduced_precision()) return;
  said = true;
  std::cerr << "fulgur: " << precision << " on this CPU will be slow: it has neither AVX-512 nor AMX, so LibTorch "
            << "computes float16 and bfloat16 matrix products in its reference loops, tens of times slower than in "
            << "float32 (docs/precision.md). Train in 32-true on this machine; reduced precision pays off on a GPU or "
            << "on a CPU with AVX-512 or AMX." << std::endl;
}

void end_preempted_process(int exit_code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::exit(exit_code);
}

void raise_needs_module(std::string_view verb) {
  throw MisconfigurationError("Trainer::" + std::string(verb) + " needs a module: call trainer.setup(module, "
                              "optimizer) first.");
}

void check_clip_arguments(const ClipGradients& clip) {
  if (clip.clip_val && clip.max_norm)
    throw MisconfigurationError(
        "Only one of `clip_val` or `max_norm` can be set as this specifies the underlying clipping algorithm!");
  if (!clip.clip_val && !clip.max_norm)
    throw MisconfigurationError("You have to specify either `clip_val` or `max_norm` to do gradient clipping!");
  const char* field = clip.clip_val ? "clip_val" : "max_norm";
  const double value = clip.clip_val ? *clip.clip_val : *clip.max_norm;
  if (!(value >= 0.0))  // NaN too
    throw MisconfigurationError("fulgur: clip_gradients: `" + std::string(field) + "` must be >= 0, got " +
                                std::to_string(value) + " (a negative bound would flip or reverse the gradients).");
  if (std::isnan(clip.norm_type))
    throw MisconfigurationError("fulgur: clip_gradients: `norm_type` is NaN; use 2.0 (the default), 1.0 or "
                                "std::numeric_limits<double>::infinity().");
}

void raise_optimizer_state_mismatch(const c10::Error& error) {
  // LibTorch's own check reads "INTERNAL ASSERT FAILED ... report a bug": it is not one.
  std::string text = first_line(error.what_without_backtrace());
  if (text.find("INTERNAL ASSERT FAILED") != std::string::npos) text = "the state's type differs";
  throw CheckpointError("fulgur: the optimizer state does not fit the optimizer (" + text + "): load the state of the "
                        "same optimizer type over the same parameters.");
}

void raise_save_checkpoint_outside_fit() {
  throw MisconfigurationError("fulgur: save_checkpoint saves the state of a fit: call it during or after trainer.fit "
                              "(for weights alone, use trainer.save(path, fulgur::checkpoint::module_state_dict(module))).");
}

void raise_progress_bar_disabled() {
  throw MisconfigurationError(
      "Trainer was configured with `enable_progress_bar = false` but found a ProgressBar among its callbacks; "
      "remove the ProgressBar from the Trainer's arguments or set `enable_progress_bar = true`.");
}

void raise_accelerator_unavailable(std::string_view accelerator) {
  const std::string name(accelerator);
  throw AcceleratorError("`" + name + "` can not run on your system since the accelerator is not available. The "
                         "following accelerator(s) is available and can be passed into the Trainer: " +
                         available_accelerators_text() + ". Pick one of them (e.g. " +
                         spelled("fulgur::CPUAccelerator", "--trainer.accelerator=cpu") + "), or run on a "
                         "machine where '" + name + "' is available.");
}

void raise_dtype_unsupported(std::string_view precision, c10::ScalarType dtype, c10::Device device) {
  throw AcceleratorError("precision '" + std::string(precision) + "' computes in " + std::string(c10::toString(dtype)) +
                         ", which " + device.str() + " does not support (bfloat16 needs compute capability 8.0 or "
                         "newer); use '16-mixed' (FP16MixedPrecision) or '32-true' instead.");
}

void raise_single_process_devices(std::string_view strategy, std::size_t devices, int num_nodes) {
  throw MisconfigurationError(std::string(strategy) + " runs in one process on exactly one device, but " +
                              std::to_string(devices) + " device(s) x " + std::to_string(num_nodes) +
                              " node(s) were requested (" + trainer_setting("devices") + ", " + trainer_setting("num_nodes") +
                              "); use devices = 1, or a distributed strategy such as " +
                              spelled("fulgur::DDPStrategy", "ddp (trainer.strategy)") + " for more.");
}

}  // namespace fulgur::detail
