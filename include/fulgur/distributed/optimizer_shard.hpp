#pragma once
// OptimizerShard: ZeRO stage 1 for one optimizer — each rank keeps the optimizer state of 1/N of
// the parameters.
//
// At set-up, each param group's trainable parameters (per dtype and device: a "unit") are packed
// into one flat buffer, padded to a multiple of the world size, and the module's parameters become
// aliases of it (the same tensor objects, whole on every rank). This rank's contiguous 1/N of a
// flat buffer is its shard, with a gradient buffer of the same size.
//
// Outside a step the optimizer's param groups hold the module's parameters as before, so
// zero_grad, toggle_optimizer, clipping and the loss scaler's unscale work on the module's
// (averaged, whole) gradients exactly as under DDP. For the step — and to save or load its state —
// the groups hold the shards instead (`with_shards`): the optimizer keeps state only for them. So
// any torch::optim optimizer whose update is element by element (SGD, Adam, AdamW, Adagrad,
// RMSprop) steps with the arithmetic of the unsharded step. After the step the shards are
// all-gathered into every rank's flat buffers, which are the module's weights.
#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "fulgur/distributed/process_group.hpp"

namespace fulgur::distributed {

class OptimizerShard {
 public:
  /// The optimizer must hold no state yet (LibTorch's Adagrad, which creates its state up front,
  /// is given a fresh one for the shards), and must not be LBFGS (its step needs every parameter).
  OptimizerShard(ProcessGroup& group, torch::optim::Optimizer& optimizer);
  ~OptimizerShard();
  OptimizerShard(const OptimizerShard&) = delete;
  OptimizerShard& operator=(const OptimizerShard&) = delete;

  const torch::optim::Optimizer* optimizer() const { return optimizer_; }

  /// While alive, the optimizer's param groups hold the shards (and the group's frozen parameters,
  /// which it leaves alone as before).
  class [[nodiscard]] ShardView {
   public:
    explicit ShardView(OptimizerShard& shard);
    ~ShardView();
    ShardView(const ShardView&) = delete;
    ShardView& operator=(const ShardView&) = delete;

   private:
    OptimizerShard& shard_;
  };
  ShardView with_shards() { return ShardView(*this); }

  /// This rank's part of the module's gradients into the shards' gradients (a parameter without
  /// gradient contributes zeros).
  void copy_gradients();
  /// Every rank's shard into every rank's flat buffers: the module's weights.
  void gather_parameters();

  /// Elements of the optimizer's view (this rank's shards) and of the whole (the module's).
  std::int64_t shard_numel() const;
  std::int64_t full_numel() const;

 private:
  struct Unit;
  ProcessGroup& group_;
  torch::optim::Optimizer* optimizer_;
  std::vector<std::unique_ptr<Unit>> units_;
  // Per param group: its shards, then its frozen parameters. A ShardView swaps each with the group's
  // own list (no allocation), and back.
  std::vector<std::vector<at::Tensor>> swapped_params_;
};

}  // namespace fulgur::distributed
