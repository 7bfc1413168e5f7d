#pragma once
// fulgur::optim::FusedSGD: torch::optim::SGD (momentum, dampening, Nesterov, weight decay) on ATen's
// _fused_sgd_, what Python's torch.optim.SGD(fused=True) runs. Same options, param groups and archive
// layout as LibTorch's SGD: a state saved by one loads into the other.
//
// One difference from Python's fused SGD, on purpose: when the loss scaler skips a parameter's first
// step, Python keeps the momentum buffer it allocated uninitialised (torch.empty_like) and reads it on
// the next step; FusedSGD drops it, so the next step starts the momentum from the gradient as SGD's
// definition (and LibTorch's SGD) does. Knowing that takes one host read of the inf flag, on a first
// step only.
#include <ATen/core/Tensor.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <optional>
#include <vector>

#include "fulgur/optim/scaled_step.hpp"

namespace fulgur::optim {

class FusedSGD : public ScaledStepOptimizer {
 public:
  explicit FusedSGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                    torch::optim::SGDOptions defaults);
  explicit FusedSGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults)
      : FusedSGD({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  at::Tensor step(LossClosure closure = nullptr) override;
  void scaled_step(const std::optional<at::Tensor>& grad_scale, const at::Tensor& found_inf) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  /// The tensors of one (device, dtype) of a param group, in reused vectors: those with a momentum
  /// buffer, and those taking their first step (whose new buffers the kernel fills from the gradient).
  struct Bucket {
    Bucket(c10::Device device, c10::ScalarType dtype) : device(device), dtype(dtype) {}
    c10::Device device;
    c10::ScalarType dtype;
    std::vector<at::Tensor> params, grads, buffers;
    std::vector<at::Tensor> first_params, first_grads, first_buffers;
    void clear();
  };
  void update(const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf);
  std::vector<Bucket> buckets_;
};

}  // namespace fulgur::optim
