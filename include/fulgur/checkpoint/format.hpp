#pragma once
// Checkpoint formats beyond the one file. A strategy owns how its checkpoints lie on disk: the
// strategy contract's save_checkpoint, load_checkpoint and remove_checkpoint (strategy_defaults:
// one file, written atomically by global rank 0). A strategy whose format keeps parts of a
// checkpoint beside its file (ShardedStrategy: each rank's shards in files next to a manifest)
// describes those parts to the generic reader as a Format, so that any run reads its checkpoints:
// a run on one device or under DDP resumes from a sharded checkpoint, checkpoint::module_weights
// and checkpoint::consolidate join its parts, and removing it removes them too.
//
// A part is a dictionary inside the checkpoint that its Format owns (by a "format" tag of its
// own); the generic code (checkpoint/io.hpp) finds the Format of each dictionary it meets and asks
// it, never naming a format itself. The Formats libfulgur knows are listed once, beside the
// strategies that own them (src/strategies/checkpoint_formats.cpp).
#include <optional>
#include <string>
#include <vector>

#include "fulgur/state_dict.hpp"

namespace torch::optim {
class Optimizer;
}

namespace fulgur::checkpoint {

class Format {
 public:
  virtual ~Format() = default;
  /// Whether `part`, a dictionary inside a checkpoint, is in this format.
  virtual bool owns(const StateDict& part) const = 0;
  /// After the checkpoint was read from `folder`: the part with what it refers to beside the file
  /// made usable from anywhere (paths made absolute). Nothing is read yet.
  virtual StateDict opened(const StateDict& part, const std::string& folder) const = 0;
  /// The part as a module's whole state_dict, if it is a module state (its pieces joined).
  virtual std::optional<StateDict> whole_module_state(const StateDict& part) const = 0;
  /// Loads the part into `optimizer` as its whole state, if it is an optimizer state; false otherwise.
  virtual bool load_whole_optimizer_state(torch::optim::Optimizer& optimizer, const StateDict& part) const = 0;
  /// The part with everything it refers to beside the file read into it (consolidate).
  virtual StateDict inlined(const StateDict& part) const = 0;
  /// Removes what a checkpoint at `path` in this format keeps beside the file (nothing if none).
  virtual void remove_beside(const std::string& path) const = 0;
};

/// Every Format libfulgur knows, and those added with add_format.
std::vector<const Format*> formats();
/// A format of a strategy of your own; it must outlive every checkpoint operation.
void add_format(const Format& format);
/// The Format that owns `part`, or null (a plain dictionary).
const Format* format_of(const StateDict& part);

}  // namespace fulgur::checkpoint

namespace fulgur::detail {
/// The formats of the shipped strategies (src/strategies/checkpoint_formats.cpp).
std::vector<const checkpoint::Format*> shipped_checkpoint_formats();
}  // namespace fulgur::detail
