#pragma once
// fulgur::update_bn: torch.optim.swa_utils.update_bn — the batch-norm layers' running statistics
// recomputed by one pass over data: each BatchNorm{1,2,3}d's and nn::SyncBatchNorm's (Python's
// _BatchNorm subclasses) statistics reset, its momentum set to none (a cumulative average over the
// pass), the module in training mode, `forward(batch)` called
// on every batch of `loader` without gradients, then the momenta and the mode put back. Python
// calls model(batch[0]); here `forward` says what runs the module on a batch.
#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>

namespace fulgur {

namespace detail {

/// The batch-norm layers of a module with their momenta, reset for a cumulative pass; put back when
/// it ends (destroyed).
class BatchNormPass {
 public:
  explicit BatchNormPass(torch::nn::Module& module);
  ~BatchNormPass();
  BatchNormPass(const BatchNormPass&) = delete;
  BatchNormPass& operator=(const BatchNormPass&) = delete;
  /// Whether the module has batch-norm layers (nothing to do otherwise, as in Python).
  bool any() const;

 private:
  struct Layers;
  std::unique_ptr<Layers> layers_;
};

/// Whether the module has a BatchNorm{1,2,3}d or SyncBatchNorm layer (Lightning's
/// pl_module_contains_batch_norm: a _BatchNorm).
bool contains_batch_norm(const torch::nn::Module& module);

}  // namespace detail

template <class Loader, class Forward>
void update_bn(Loader& loader, torch::nn::Module& module, Forward&& forward) {
  detail::BatchNormPass pass(module);
  if (!pass.any()) return;
  torch::NoGradGuard no_grad;
  for (auto&& batch : loader) forward(batch);
}

}  // namespace fulgur
