#pragma once
// Checkpoint files and the state of modules and optimizers (implemented in src/checkpoint_io.cpp).
//
// A checkpoint is a StateDict written with torch::pickle_save (a torch.save-style zip).
// Writes are atomic: a temporary file in the same folder (".<name>.tmp.<pid>"), fsync, rename, fsync
// of the folder — a crash mid-save leaves the previous checkpoint intact. A save first removes the
// temporary files of writers killed mid-save (dead pid, no lock held); saves in one process run one
// at a time. A failed save or load is a CheckpointError and changes nothing on disk.
//
// Reading checks the zip (every record inside the file, CRC-32 of each), the pickle (a dry run of
// LibTorch's unpickler: opcodes, lengths, memo, nesting at most 1000 deep, no container holding
// itself) and every tensor (within its storage, its storage within its record) before any of it is
// used: a truncated, corrupt or hostile file is a CheckpointError, never a crash. Tensors load on
// the CPU, as Lightning's checkpoint loading maps them.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "fulgur/state_dict.hpp"

namespace fulgur::checkpoint {

void save(const std::string& path, const StateDict& state);
StateDict load(const std::string& path);

/// The bytes of a StateDict as torch::pickle_save writes them, and back.
std::vector<char> to_bytes(const StateDict& state);
StateDict from_bytes(const std::vector<char>& bytes, const std::string& what = "bytes");

/// Writes bytes to path atomically (see above).
void atomic_write(const std::string& path, const std::vector<char>& bytes);

/// Parameters and buffers under Python's names ("layer.weight"), in Python's order.
StateDict module_state_dict(const torch::nn::Module& module);
/// Copies a module state into `module`. strict: missing or unexpected keys are an error that lists them.
void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true);

/// An optimizer's full state (per-parameter buffers, step counts, param-group options).
StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer);
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state);

}  // namespace fulgur::checkpoint
