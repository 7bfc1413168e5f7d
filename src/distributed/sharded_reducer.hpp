#pragma once
// ShardedGradientReducer: ZeRO stage 2's gradient reduction — while backward runs, each bucket of
// the optimizers' flat layout (distributed/optimizer_shard.hpp) is reduce-scattered, so each rank
// receives the sum of its chunk only, and the module's gradients are freed as soon as they are
// copied out. Buckets are sent in one order on every rank (the optimizers', then the layout's).
//
// Memory: gradients pass through `staging_buffers` buffers used in turn (bucket b through buffer
// b mod staging_buffers, as large as the largest bucket it carries); bucket b waits for bucket
// b - staging_buffers's collective before it reuses its buffer.
// A gradient whose buffer is still busy stays on its parameter until it is free. At rest a rank
// holds its gradient shards only (1/N), plus the staging buffers.
//
// Between two optimizer steps every synchronised backward adds its averaged gradients to the
// shards (as gradients accumulate under DDP); an optimizer's step (gradients_consumed) starts its
// shards afresh, as DeepSpeed's step does. Under no_backward_sync backward accumulates on the parameters and the next
// synchronised backward sends the sum.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/distributed/optimizer_shard.hpp"
#include "src/distributed/process_group.hpp"

namespace fulgur::distributed {

class ShardedGradientReducer {
 public:
  /// `named_parameters`: the module's, to name parameters in errors; a trainable one that no
  /// optimizer holds is refused (its gradient would never be reduced).
  ShardedGradientReducer(ProcessGroup& group, const std::vector<OptimizerShard*>& shards,
                         const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                         bool find_unused_parameters, int staging_buffers = 2);
  ~ShardedGradientReducer();
  ShardedGradientReducer(const ShardedGradientReducer&) = delete;
  ShardedGradientReducer& operator=(const ShardedGradientReducer&) = delete;

  void prepare_for_backward();
  /// Sends what is left, waits for every reduce-scatter and leaves the averages in the shards'
  /// gradients. A parameter without gradient: zeros under find_unused_parameters, else an error naming it.
  void finalize_backward();
  /// Backward threw: waits for the collectives already sent and refuses further backwards.
  void abandon_backward() noexcept;
  /// That optimizer stepped: the next synchronised backward overwrites its shards' gradients.
  void gradients_consumed(const OptimizerShard& shard);
  /// Off: backward accumulates locally (NoSyncGuard turns it off for a micro-batch).
  bool* sync_flag() { return &sync_; }
  bool sync() const { return sync_; }

  std::size_t bucket_count() const;
  /// Bytes of the staging buffers (the gradient memory a rank holds beyond its shards).
  std::int64_t staging_bytes() const;

  struct State;  // opaque

 private:
  std::unique_ptr<State> state_;
  bool sync_ = true;
};

}  // namespace fulgur::distributed
