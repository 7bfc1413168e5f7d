#pragma once
// fulgur::optim::FusedAdam and FusedAdamW: torch::optim::Adam and AdamW on ATen's fused kernels
// (_fused_adam_, _fused_adamw_), what Python's torch.optim.Adam(fused=True) and AdamW(fused=True) run.
//
// Drop-in: the same options types, param groups and archive layout as LibTorch's Adam/AdamW, so a
// state saved by one loads into the other. One kernel per (device, dtype) of a param group does the
// whole update, where LibTorch's optimizers run ten small ops per parameter. The step count lives on
// the parameter's device as float32, as in Python's fused path (so a skipped step costs no host
// sync); save() writes it into the archive as LibTorch's integer step.
#include <ATen/core/Tensor.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/archive.h>

#include <optional>
#include <vector>

#include "fulgur/optim/scaled_step.hpp"

namespace fulgur::optim {
namespace detail {

/// LibTorch's per-parameter state plus the device-side step count the fused kernel reads.
template <class ParamState>
struct FusedStepState : ParamState {
  at::Tensor step_count;  // float32, 0-dim, on the parameter's device
  /// As LibTorch's state: `step` from the device count (a host read, at save time only).
  void serialize(torch::serialize::OutputArchive& archive) const override;
  using ParamState::serialize;
  std::unique_ptr<torch::optim::OptimizerParamState> clone() const override {
    return std::make_unique<FusedStepState>(*this);
  }
};

/// The tensors of one (device, dtype) of a param group, gathered again each step into reused vectors.
struct AdamBucket {
  AdamBucket(c10::Device device, c10::ScalarType dtype) : device(device), dtype(dtype) {}
  c10::Device device;
  c10::ScalarType dtype;
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  void clear();
};

template <class Options, class ParamState, bool Decoupled>
class FusedAdamBase : public ScaledStepOptimizer {
 public:
  explicit FusedAdamBase(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, Options defaults = {});
  explicit FusedAdamBase(std::vector<at::Tensor> params, Options defaults = {})
      : FusedAdamBase({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  at::Tensor step(LossClosure closure = nullptr) override;
  void scaled_step(const std::optional<at::Tensor>& grad_scale, const at::Tensor& found_inf) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void update(const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf);
  FusedStepState<ParamState>& state_of(const at::Tensor& param, const Options& options);
  std::vector<AdamBucket> buckets_;
};

}  // namespace detail

/// torch::optim::Adam on _fused_adam_: L2 weight decay added to the gradient.
class FusedAdam : public detail::FusedAdamBase<torch::optim::AdamOptions, torch::optim::AdamParamState, false> {
 public:
  using FusedAdamBase::FusedAdamBase;
};

/// torch::optim::AdamW on _fused_adamw_: decoupled weight decay (default 1e-2, as AdamWOptions).
class FusedAdamW : public detail::FusedAdamBase<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true> {
 public:
  using FusedAdamBase::FusedAdamBase;
};

}  // namespace fulgur::optim
