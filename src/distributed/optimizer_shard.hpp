#pragma once
// OptimizerShard: one optimizer's parameters laid out for ZeRO — each rank keeps the optimizer
// state (stage 1), and the gradients (stage 2), of 1/N of them.
//
// At set-up each param group's trainable parameters, per dtype and device (a "unit"), are packed
// into one flat buffer that the module's parameters then alias (the same tensor objects, whole on
// every rank). The buffer is cut into buckets: parameters in reverse order (the order backward
// produces their gradients), each starting on a 64-byte boundary, a bucket holding about
// bucket_bytes and padded to N equal, aligned chunks. This rank's chunk of each bucket is a shard
// the optimizer steps (an alias of the module's weights, so a weight loaded or changed by hand is
// what it steps; the fp32 master weights under mixed precision); their gradients lie side by side
// in one buffer per unit. Stage 2 reduce-scatters each bucket's gradients into the
// chunks while backward runs (distributed/sharded_reducer.hpp); both stages all-gather each
// bucket's chunks back into the flat buffer after the step. The layout depends only on the
// parameters, the world size and the bucket sizes, so stages 1 and 2 read each other's states.
//
// Outside a step the optimizer's param groups hold the module's parameters as before, so
// zero_grad, toggle_optimizer and the hooks see the module (stage 1: with its whole averaged
// gradients, so unscaling and clipping are DDP's). For the step — and to save or load its state —
// the groups hold the shards instead (`with_shards`): the optimizer keeps state only for them.
// Any torch::optim optimizer whose update is element by element (SGD, Adam, AdamW, Adagrad,
// RMSprop) steps with the arithmetic of the unsharded step.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "src/distributed/process_group.hpp"

namespace fulgur::distributed {

/// Where the flat layout's buckets end: after about bucket_bytes (DDPOptions' first_bucket_bytes and
/// bucket_bytes), or — stage 3, whose buckets are the wrapped submodules — after the given numbers of
/// parameters, bucket by bucket in layout order.
struct ShardLayout {
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  ///< a unit's first bucket: its reduction starts early
  std::size_t bucket_bytes = std::size_t{25} << 20;
  std::vector<std::int64_t> bucket_params{};  ///< when not empty: the parameters in each bucket (bytes ignored)
};

/// Where each trainable parameter of an optimizer goes, for a world of N ranks (no tensors made).
struct ShardPlan {
  struct Slot {
    at::Tensor param;
    std::int64_t offset = 0;  // elements from the bucket's start
  };
  struct Bucket {
    std::vector<Slot> slots;
    std::vector<std::pair<std::int64_t, std::int64_t>> gaps;  // (offset, length) no parameter covers: zero gradient
    std::int64_t content = 0;  // where the last parameter ends (the same for every N)
    std::int64_t numel = 0;    // padded to N aligned chunks
  };
  struct Unit {  // a param group's trainable parameters of one dtype and device, in layout order
    std::vector<Bucket> buckets;
    std::int64_t numel = 0;  // of the parameters
  };
  struct Group {
    std::vector<Unit> units;
    std::vector<at::Tensor> frozen;  // requires_grad false: never packed
  };
  std::vector<Group> groups;

  /// `first_group`: the plan of the groups from there on only (those before it laid out already: a
  /// parameter of theirs is not packed again). A plan is its groups' plans one after the other.
  /// `wrap_unit`, when given, cuts a bucket wherever the next parameter's wrapped submodule differs
  /// (stage 3), whatever layout says; bucket_params() then describes that cut for a later plan.
  static ShardPlan of(const torch::optim::Optimizer& optimizer, int world, const ShardLayout& layout,
                      const std::function<std::int64_t(const at::Tensor&)>& wrap_unit = {},
                      std::size_t first_group = 0);
  /// The parameters in each bucket, in layout order (ShardLayout::bucket_params).
  std::vector<std::int64_t> bucket_params() const;
};

class OptimizerShard {
 public:
  using Slot = ShardPlan::Slot;
  /// A contiguous, padded stretch of a unit's flat buffer. The tensors are aliases made once.
  struct Bucket {
    std::vector<Slot> slots;
    std::vector<std::pair<std::int64_t, std::int64_t>> gaps;  // (offset, length) no parameter covers: zero gradient
    at::Tensor weights;            // the bucket in the flat buffer: world_size chunks
    at::Tensor shard;              // this rank's chunk of `weights`: what the optimizer steps
    at::Tensor shard_grad, send;   // its gradient, and its copy for the all-gather (in per-unit buffers)
    std::int64_t numel = 0;        // padded
    bool gathered = true;          // stage 3: `weights` holds every rank's chunk (else its storage is freed)
    std::vector<std::int64_t> versions;   // stage 3: each parameter's version counter when gathered
  };

  /// The optimizer must hold no state yet (LibTorch's Adagrad, which creates its state up front,
  /// is given a fresh one for the shards), and must not be LBFGS (its step needs every parameter).
  /// shard_parameters (stage 3): each bucket gets storage of its own, freed at once and between
  /// uses — the shard, stepped by the optimizer, is then a buffer apart, and the parameters are
  /// whole only between gather(bucket) and release(bucket).
  /// materialize_on (stage 3, a model built on the meta device): the buckets go to that device, and
  /// a meta parameter takes its place in its bucket with no value yet (materialize_meta gives it one).
  OptimizerShard(ProcessGroup& group, torch::optim::Optimizer& optimizer, const ShardLayout& layout = {},
                 bool shard_parameters = false, std::optional<c10::Device> materialize_on = std::nullopt);
  ~OptimizerShard();
  OptimizerShard(const OptimizerShard&) = delete;
  OptimizerShard& operator=(const OptimizerShard&) = delete;

  const torch::optim::Optimizer* optimizer() const { return optimizer_; }
  /// The layout it was made with (recorded in its checkpoints).
  const ShardLayout& layout() const { return layout_; }

  /// Whether param groups were added to the optimizer since it was laid out (BaseFinetuning's
  /// unfreeze_and_add_param_group): a size comparison, for the strategy to check before it uses the shard.
  bool adds_groups() const;
  /// The added groups laid out after the others, as if the optimizer had had them at set-up: their
  /// parameters moved into new flat buffers, this rank's shard of them stepped here (stages 1 and 2;
  /// stage 3 refuses). Every rank must call it at the same point with the same groups: one collective
  /// checks that they agree (DistributedError otherwise). The stage-2 reducer is to be built again.
  void lay_out_added_groups();
  /// A parameter of the optimizer that was frozen when it was laid out (never packed) and requires
  /// grad now, or null: a flag read per such parameter.
  const at::Tensor* unfrozen() const;

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

  /// Stage 1: this rank's chunks of the module's (averaged, whole) gradients into the shards'
  /// gradients (a parameter without gradient contributes zeros).
  void copy_gradients();
  /// Every rank's chunks into every rank's flat buffers: the module's weights (stage 3: into the
  /// buckets not gathered yet).
  void gather_parameters();

  /// Stage 3: whether the parameters are sharded at rest.
  bool shards_parameters() const { return shard_parameters_; }
  /// Stage 3: the bucket's storage allocated again and every rank's chunk all-gathered into it
  /// (communicate false, after a failed collective: zeros, so that the op under way can finish
  /// before the error is thrown).
  void gather(Bucket& bucket, bool communicate = true);
  /// Stage 3, ahead of use: every rank's chunk all-gathered into `landing` (made here, the bucket's
  /// size), returning at once; adopt() then waits and hands landing's memory to the bucket.
  PendingCollective gather_ahead(Bucket& bucket, at::Tensor& landing);
  void adopt(Bucket& bucket, at::Tensor& landing, PendingCollective& pending);
  /// Stage 3: the bucket's storage freed (its parameters keep their shapes; reading them before the
  /// next gather is an error of LibTorch's, which the strategy's gatherer prevents). A parameter
  /// written in place while whole (Embedding's max_norm, a hook) has this rank's chunk copied back
  /// into the shard first, so that the write is kept.
  void release(Bucket& bucket);
  /// Stage 3: for each gathered bucket whose parameters were written in place while whole, this
  /// rank's chunk copied back into its shard (the bucket stays gathered).
  void keep_writes();
  /// Stage 3, a bucket gathered and its parameters just initialised on every rank: rank 0's values
  /// broadcast, this rank's chunk kept as its shard, the bucket released.
  void keep_initialized(Bucket& bucket);
  /// Stage 3, after a step: the parameters' version counters moved on, as an in-place step moves
  /// them, so that autograd refuses a graph saved before the step.
  void bump_versions();
  /// Stage 3: each gathered bucket's chunk of the weights copied back into the shard (after weights
  /// were loaded into the module).
  void scatter_parameters();

  /// Every bucket, in unit order: what the stage-2 reducer fills.
  const std::vector<Bucket*>& buckets() const { return buckets_; }
  /// The shards (one per bucket, in the order of buckets()).
  std::vector<at::Tensor> shards() const;
  /// The shards' gradient buffers (one per unit).
  const std::vector<at::Tensor>& shard_grads() const { return shard_grads_; }

  /// Elements the optimizer steps on this rank (its shards, with their padding) and of the whole.
  std::int64_t shard_numel() const;
  std::int64_t full_numel() const;

 private:
  struct Unit;
  bool keep_written(Bucket& bucket);  // this rank's chunk back into the shard if written while whole
  /// The plan's groups (from first_group on in the optimizer) packed into units, buckets and shards.
  void lay_out(const ShardPlan& plan, std::size_t first_group, bool adagrad, std::optional<c10::Device> materialize_on);
  c10::Device unit_device(const ShardPlan& plan) const;  // where the agreement collective runs
  ProcessGroup& group_;
  torch::optim::Optimizer* optimizer_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<Bucket*> buckets_;
  std::vector<at::Tensor> shard_grads_;
  // Per param group: its shards, then its frozen parameters. A ShardView swaps each with the group's
  // own list (no allocation), and back.
  std::vector<std::vector<at::Tensor>> swapped_params_;
  std::vector<at::Tensor> frozen_;  // the groups' parameters frozen when laid out: never packed
  bool shard_parameters_ = false;
  ShardLayout layout_;
};

}  // namespace fulgur::distributed
