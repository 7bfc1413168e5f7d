#pragma once
// ShardedStrategy's checkpoint format (checkpoint_format.cpp): how its checkpoints are written,
// and how the generic reader reads, joins and removes them. Private.
#include <string>

#include "fulgur/checkpoint/format.hpp"
#include "fulgur/distributed/data_parallel.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur::distributed {

/// Every rank writes its sharded states to `<path>.shards/<id>/rank<r>.pt` (in parallel, each
/// atomically), then global rank 0 writes `path` — the manifest: the checkpoint with each sharded
/// state naming its files — and removes the shard files of the checkpoint it replaced. A crash at
/// any point leaves the previous manifest and its files whole. Every rank calls it.
void write_sharded_checkpoint(DataParallel& ddp, const std::string& path, const StateDict& state);

/// The format for the generic reader (checkpoint::formats()).
const checkpoint::Format& sharded_checkpoint_format();

}  // namespace fulgur::distributed
