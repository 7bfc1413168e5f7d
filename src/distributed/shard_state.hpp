#pragma once
// ShardedOptimizerState: an optimizer state that ShardedStrategy wrote on N ranks (one LibTorch
// archive per rank, each over that rank's shards), read back whole — per bucket of the layout
// (distributed/optimizer_shard.hpp), every rank's chunks joined — so it can be loaded
//   - whole, into the optimizer's own parameters: a run without sharding (one device, DDP) resumes
//     it, and it is the consolidated state of the unsharded optimizer;
//   - as the shards of another number of ranks (resharding: 2 -> 3, 3 -> 1, ...).
// And the other way: a state written without sharding, laid out in buckets, loads as shards.
// The layout depends only on the parameters, the world size and the bucket sizes, so it is
// recomputed here from the optimizer's parameters; the archives' shapes are checked against it.
// LibTorch's optimizers keep typed per-parameter states: SGD, Adam, AdamW, Adagrad and RMSprop
// (every element-wise optimizer LibTorch has) are known; another is a CheckpointError.
#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "src/distributed/optimizer_shard.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur::distributed {

/// The name of a sharded optimizer state's format (ShardedStrategy::get_optimizer_state). It holds
/// "world_size", "bucket_bytes", "first_bucket_bytes" and the shards as one of
///   "shard": this rank's archive (in memory, as get_optimizer_state returns it),
///   "files" + "slot": one file per rank (as a checkpoint holds it; the archive is the file's
///     "shards"[slot]), relative to the checkpoint's folder until loaded,
///   "shards": every rank's archive (checkpoints of earlier versions).
inline constexpr const char* sharded_optimizer_format = "fulgur-sharded-optimizer";

/// The name of stage 3's sharded module state's format (distributed/sharded_module_state.hpp).
inline constexpr const char* sharded_module_format = "fulgur-sharded-module";
/// A sharded checkpoint's per-rank file: {"format", "rank", "world_size", "shards": [one entry per
/// sharded state of the checkpoint, at the "slot" the manifest names]}.
inline constexpr const char* rank_file_format = "fulgur-rank-shards";

/// Entry `slot` of rank `rank`'s file, checked to be that rank's; `what` names the state in errors.
c10::IValue rank_file_entry(const std::string& file, std::int64_t rank, std::size_t slot, const std::string& what);

/// The archives of a sharded optimizer state, one per rank that wrote it; with `only_rank` >= 0,
/// only that rank's is read (the others are left undefined).
std::vector<at::Tensor> sharded_archives(const StateDict& state, int only_rank = -1);
/// The layout a sharded optimizer state was written with: its "bucket_params" (stage 3, buckets
/// cut at the wrapped submodules) or its "bucket_bytes" and "first_bucket_bytes".
ShardLayout sharded_layout(const StateDict& state);
/// Makes the "files" of every sharded state (optimizer or module) in a loaded checkpoint paths from `folder`.
void resolve_shard_files(StateDict& checkpoint, const std::string& folder);

class ShardedOptimizerState {
 public:
  /// `archives`: one per rank that wrote the state, in rank order. The optimizer's param groups must
  /// hold the module's parameters (as they do outside a step); its state is left empty.
  ShardedOptimizerState(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& archives,
                        const ShardLayout& layout);
  /// The optimizer's own, unsharded state (loaded from a run without sharding), laid out in buckets.
  static ShardedOptimizerState from_whole(const torch::optim::Optimizer& optimizer, const ShardLayout& layout);
  ~ShardedOptimizerState();
  ShardedOptimizerState(ShardedOptimizerState&&) noexcept;

  /// Into the optimizer's own parameters, whole (replacing its state).
  void load_whole(torch::optim::Optimizer& optimizer) const;
  /// Rank `rank`'s part under a world of `world` ranks into `shards` (its shard tensors, one per
  /// bucket, in layout order: OptimizerShard::shards()).
  void load_shards(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& shards, int world,
                   int rank) const;

 private:
  ShardedOptimizerState() = default;
  ShardPlan plan_;                        // of the ranks that wrote it
  std::vector<const ShardPlan::Bucket*> buckets_;
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> whole_;  // per bucket, its content; null: no state
};

}  // namespace fulgur::distributed
