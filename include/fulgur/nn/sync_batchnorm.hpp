#pragma once
// fulgur::nn::SyncBatchNorm — torch.nn.SyncBatchNorm for LibTorch: in training, the batch statistics
// (each rank's count, mean and inverse standard deviation, all-gathered and combined as torch's
// batch_norm_gather_stats_with_counts does) and, in backward, sum_dy and sum_dy_xmu (all-reduced)
// cover every rank's part of the batch, so N ranks normalise as one process with the whole batch.
// The running statistics take the global unbiased variance. Eval mode, and a module no strategy has
// given a process group of more than one rank, compute exactly what torch::nn::BatchNorm does.
//
// The process group: DDPStrategy and ShardedStrategy attach theirs to every SyncBatchNorm of the
// model at set-up (attach_sync_group); a hand-written loop may do the same with its own group.
// Parameters and buffers are named as BatchNorm's (and torch's), so state dicts load either way.
#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>  // BatchNorm1d/2d/3d, what conversion replaces
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <ostream>

namespace torch::nn {
class Module;
}

namespace fulgur::nn {

/// What SyncBatchNorm needs of a process group. Every rank calls both collectives in the same order.
class BatchNormSyncGroup {
 public:
  virtual ~BatchNormSyncGroup() = default;
  virtual int world_size() const = 0;
  /// Every rank's `tensor` (same shape on all), stacked: shape (world_size, ...).
  virtual at::Tensor all_gather(const at::Tensor& tensor) = 0;
  /// Sums `tensor` over the ranks, in place.
  virtual void all_reduce_sum(const at::Tensor& tensor) = 0;
};

/// Options as BatchNorm's: num_features, eps (1e-5), momentum (0.1; std::nullopt: cumulative
/// average, as momentum=None), affine, track_running_stats.
using SyncBatchNormOptions = torch::nn::BatchNormOptions;

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(int64_t num_features) : SyncBatchNormImpl(SyncBatchNormOptions(num_features)) {}
  explicit SyncBatchNormImpl(const SyncBatchNormOptions& options);
  /// Registers these very tensors as its weight, bias and buffers (undefined where absent), as
  /// conversion does: shared with the BatchNorm it replaces, as torch.nn.SyncBatchNorm.convert_sync_batchnorm.
  SyncBatchNormImpl(const SyncBatchNormOptions& options, const at::Tensor& weight, const at::Tensor& bias,
                    const at::Tensor& running_mean, const at::Tensor& running_var,
                    const at::Tensor& num_batches_tracked);

  /// input: (N, C, ...) with C = num_features.
  at::Tensor forward(const at::Tensor& input);
  /// Fresh parameters and buffers, as BatchNorm's (weight 1, bias 0, mean 0, var 1, count 0).
  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// The group the training forward reduces over (null, or one of one rank: none, as BatchNorm).
  void set_sync_group(std::shared_ptr<BatchNormSyncGroup> group) { group_ = std::move(group); }
  const std::shared_ptr<BatchNormSyncGroup>& sync_group() const { return group_; }
  /// Training forwards run since construction (tests read it).
  int64_t training_forwards() const { return training_forwards_; }

  SyncBatchNormOptions options;
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  void check_input(const at::Tensor& input) const;
  void register_state(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
                      const at::Tensor& running_var, const at::Tensor& num_batches_tracked);
  std::shared_ptr<BatchNormSyncGroup> group_;
  int64_t training_forwards_ = 0;
};
TORCH_MODULE(SyncBatchNorm);

/// Gives every SyncBatchNorm in `module` (itself included) this group; returns how many it found.
int attach_sync_group(torch::nn::Module& module, const std::shared_ptr<BatchNormSyncGroup>& group);

/// torch.nn.SyncBatchNorm.convert_sync_batchnorm: every BatchNorm1d/2d/3d in `module` becomes a
/// SyncBatchNorm holding the same weight, bias and buffers (the same tensors, as torch: optimizers
/// keep working, requires_grad stays) in the same training mode. A BatchNorm given as `module` is returned
/// replaced; otherwise `module` is converted in place and returned.
///
/// LibTorch calls children through what holds them, not through the registry: a BatchNorm inside
/// Sequential, ModuleList or ModuleDict is replaced there too, but one also held by a typed member
/// (`torch::nn::BatchNorm2d bn;` that forward calls) would keep running unsynchronised, so it is
/// refused with a MisconfigurationError naming it, before anything is changed: declare that layer
/// as fulgur::nn::SyncBatchNorm instead (it synchronises only under a multi-process strategy).
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module);
/// The same for the descendants of `module` (it stays itself): what DDPOptions::sync_batchnorm
/// does at set-up. Returns how many BatchNorm layers were replaced.
int convert_sync_batchnorm_children(torch::nn::Module& module);

}  // namespace fulgur::nn
