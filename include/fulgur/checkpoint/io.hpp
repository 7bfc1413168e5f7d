#pragma once
// Checkpoint files and the state of modules and optimizers (implemented in src/checkpoint/).
//
// A checkpoint is a StateDict written with torch::pickle_save (a torch.save-style zip).
// Writes are atomic (detail/atomic_file.hpp: a temporary file, fsync, rename, fsync of the folder):
// a crash mid-save leaves the previous checkpoint intact. A failed save or load is a
// CheckpointError and changes nothing on disk. A strategy whose format keeps parts of a checkpoint
// beside the file (checkpoint/format.hpp) has them read, joined and removed here too.
//
// Reading checks the zip (every record inside the file, CRC-32 of each), the pickle (a dry run of the
// reader: opcodes, lengths, memo, nesting at most 1000 deep, no container holding itself) and every
// tensor (within its storage, its storage within its record) before any of it is
// used: a truncated, corrupt or hostile file is a CheckpointError, never a crash. Tensors load on
// the CPU, as Lightning's checkpoint loading maps them.
//
// The pickle is read by fulgur itself, never by running anything it names: what Python's torch.save
// writes (dicts, OrderedDicts such as a module's state_dict, lists, tuples, tensors of every dtype,
// Parameters, numbers, strings, torch.device), what LibTorch writes, and, when asked, pickled Python
// objects (see PythonObjects) — a Lightning checkpoint's hyperparameters or callback states.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "fulgur/state_dict.hpp"

namespace fulgur::checkpoint {

/// What load does with a pickled Python object that has no C++ form: an instance or a reference of a
/// class or function other than the containers, tensors, numbers and strings above (a pathlib.Path,
/// an Enum member, an argparse.Namespace, Lightning's AttributeDict, a torch.dtype, a numpy value...).
/// Nothing is executed in either case.
enum class PythonObjects {
  /// A CheckpointError that names the objects' classes and where they are (as torch.load's
  /// weights_only=True refuses them).
  refuse,
  /// Each becomes a dictionary: {"__python__": "module.Class"} plus, where the pickle has them, "args"
  /// (the tuple it is created from), "state" (what __setstate__ would get), "items" and "list" (the
  /// entries of a dict or list subclass). Saved again, it is a plain dictionary.
  as_dicts,
};

struct LoadOptions {
  PythonObjects python_objects = PythonObjects::refuse;
};

void save(const std::string& path, const StateDict& state);
/// Deletes a checkpoint and whatever its format keeps beside it (no error if there is none).
void remove(const std::string& path);
/// A checkpoint written by fulgur, torch.save or Lightning (a Lightning checkpoint holding Python objects
/// needs {.python_objects = PythonObjects::as_dicts}; its weights: module_weights in state.hpp).
StateDict load(const std::string& path, const LoadOptions& options = {});

/// A checkpoint whose format keeps parts beside the file (a sharded strategy's manifest and its
/// per-rank files) as one self-contained file at `out`, written atomically: each part read into it
/// by its Format (checkpoint/format.hpp; a sharded module state is joined whole, so Python's
/// torch.load reads its weights as tensors). Any run loads it as it loads the original; `path` is
/// left as it was.
void consolidate(const std::string& path, const std::string& out);

/// The bytes of a StateDict as torch::pickle_save writes them, and back.
std::vector<char> to_bytes(const StateDict& state);
StateDict from_bytes(const std::vector<char>& bytes, const std::string& what = "bytes", const LoadOptions& options = {});

/// Parameters and buffers under Python's names ("layer.weight"), in Python's order.
StateDict module_state_dict(const torch::nn::Module& module);
/// Copies a module state into `module`, bit for bit (converted where the dtypes differ). A key whose
/// shape differs is a CheckpointError; under strict, so are missing and unexpected keys. The error
/// lists them and says what to do: the prefix to take off (module_weights) or to add, the sizes to
/// build the module with, or strict = false.
void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true);

/// An optimizer's full state (per-parameter buffers, step counts, param-group options), as LibTorch's
/// archive: a PyTorch (Python) optimizer's state_dict, as a Lightning checkpoint holds it, is not one.
StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer);
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state);

}  // namespace fulgur::checkpoint
