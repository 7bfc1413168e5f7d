#pragma once
// The parts of a trainer checkpoint that are not a module or an optimizer (implemented in
// src/checkpoint/state.cpp): the random generators, the LR schedulers, and the format stamp.
//
// A checkpoint follows Lightning 2.6's .ckpt layout (docs/checkpoints.md has the table):
//   epoch, global_step, pytorch-lightning_version, state_dict, optimizer_states, lr_schedulers,
//   MixedPrecision (a loss scaler's state), callbacks, loops, hyper_parameters, and "fulgur":
//   format_version, fulgur/torch versions, the combination, and each rank's random state.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "fulgur/optimization.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur::checkpoint {

/// The format this fulgur writes; it reads this one and older.
inline constexpr std::int64_t format_version = 1;
/// The Lightning release whose checkpoint layout the keys follow (LightningModule.load_from_checkpoint
/// reads the weights of a fulgur checkpoint when the module's names match).
inline constexpr const char* lightning_layout_version = "2.6.0";
inline constexpr const char* fulgur_version = "0.1.0";

/// The CPU generator's state and every CUDA generator's ("cpu", "cuda": one row per device).
StateDict random_state();
void set_random_state(const StateDict& state, const std::string& what);

/// A scheduler's state under PyTorch's names (_step_count, last_epoch; best, num_bad_epochs,
/// cooldown_counter for ReduceLROnPlateau). LibTorch's schedulers expose none of it.
StateDict scheduler_state(const AnyLRScheduler& scheduler);
void load_scheduler_state(AnyLRScheduler& scheduler, const StateDict& state, const std::string& what);

/// A checkpoint's module weights: its "state_dict" (or the dictionary itself when it has none). With a
/// prefix, the entries under it with the prefix taken off: "model." (or "model") for a LightningModule
/// that holds the network as self.model; the module's other members' entries are left out. A prefix
/// that no key starts with is a CheckpointError that lists the prefixes the keys have. Give the result
/// to load_module_state_dict (strict lists what differs).
StateDict module_weights(const StateDict& checkpoint, const std::string& prefix = "");

/// The "fulgur" entry: format_version, versions, the combination that wrote it, the world size.
StateDict stamp(const std::string& combination, int world_size);
/// Refuses a checkpoint this fulgur cannot continue: none of fulgur's, or a newer format.
void check_format(const StateDict& checkpoint, const std::string& what);

/// The value under key, of the expected kind, or a CheckpointError naming what is missing.
c10::IValue require(const StateDict& state, const std::string& key, const std::string& what);
StateDict require_dict(const StateDict& state, const std::string& key, const std::string& what);
std::int64_t require_int(const StateDict& state, const std::string& key, const std::string& what);

}  // namespace fulgur::checkpoint
