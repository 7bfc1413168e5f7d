#pragma once
// Stage 3's module state as a sharded checkpoint holds it. Each rank writes only the chunks of the
// weights it keeps (its shards) and nothing is gathered to save; the manifest says where each
// weight lies, so the chunks are joined back without the model or the optimizer:
//   {"format": "fulgur-sharded-module", "world_size": N,
//    "keys":    every state_dict key, in the module's order,
//    "whole":   {key: tensor}, what no rank shards (buffers, frozen parameters), rank 0's,
//    "params":  {key: [bucket, offset, sizes...]}, where a sharded parameter lies in its bucket,
//    "buckets": [elements of each bucket, padded: each rank holds 1/N of it],
//    "shard":   [this rank's chunk of each bucket]}   (in memory; a checkpoint's manifest names
//                                                     "files" + "slot" instead, as for optimizers)
// Tied parameters are two keys at one place. The same description lets a Python user join the
// chunks with a few lines of torch (docs/sharding.md), or checkpoint::consolidate does it.
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/distributed/optimizer_shard.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur::distributed {

/// The module's tensors under their state_dict keys, in checkpoint::module_state_dict's order, as
/// they are: no op runs on them (an op on a released parameter has stage 3's gatherer gather it).
std::vector<std::pair<std::string, at::Tensor>> state_tensors(const torch::nn::Module& module);

/// The module's state under stage 3: its sharded parameters as this rank's chunks (copied to the
/// CPU), the rest whole. Reads no released memory and runs no collective. Without `with_shard`,
/// the description only (to compare layouts).
StateDict sharded_module_state(const torch::nn::Module& module,
                               const std::vector<std::unique_ptr<OptimizerShard>>& shards, int world_size,
                               bool with_shard = true);
bool is_sharded_module_state(const StateDict& state);
/// Whether two descriptions lay the same weights out alike (world size, keys, buckets, places):
/// then each rank's chunks load straight into its shards.
bool same_module_layout(const StateDict& a, const StateDict& b);
/// Rank `rank`'s chunks, one per bucket: from its file (a loaded checkpoint), or the in-memory
/// "shard" when the state was made on that rank (`own_rank`).
std::vector<at::Tensor> sharded_module_chunks(const StateDict& state, int rank, bool own_rank = false);
/// The whole state_dict, every rank's chunks joined (each rank's file read once).
StateDict consolidate_module_state(const StateDict& state);

}  // namespace fulgur::distributed
