// FusedSGD: torch/optim/sgd.py's _fused_sgd in C++, on LibTorch's SGD types.
#include "fulgur/optim/fused_sgd.hpp"

#include <ATen/ATen.h>
#include <ATen/ops/_fused_sgd.h>
#include <torch/optim/serialize.h>

#include "src/optim/fused_common.hpp"

namespace fulgur::optim {

using detail::bucket_for;
using detail::check_option;
using detail::on_device;

void FusedSGD::Bucket::clear() {
  for (auto* list : {&params, &grads, &buffers, &first_params, &first_grads, &first_buffers}) list->clear();
}

FusedSGD::FusedSGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                   torch::optim::SGDOptions defaults)
    : ScaledStepOptimizer(param_groups, std::make_unique<torch::optim::SGDOptions>(defaults)) {
  check_option(defaults.lr() >= 0, "FusedSGD", "lr", defaults.lr(), ">= 0");
  check_option(defaults.momentum() >= 0, "FusedSGD", "momentum", defaults.momentum(), ">= 0");
  check_option(defaults.weight_decay() >= 0, "FusedSGD", "weight_decay", defaults.weight_decay(), ">= 0");
  if (defaults.nesterov() && !(defaults.momentum() > 0 && defaults.dampening() == 0))
    throw MisconfigurationError("FusedSGD: Nesterov momentum requires a momentum > 0 and zero dampening (as SGD).");
  detail::check_fused_parameters(*this, "FusedSGD");
}

void FusedSGD::update(const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  at::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const bool momentum = o.momentum() != 0;
    for (auto& bucket : buckets_) bucket.clear();
    for (const auto& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) throw MisconfigurationError("FusedSGD does not support sparse gradients: use SGD.");
      detail::check_fused_parameter(param, "FusedSGD");  // no state to check it once in, without momentum
      Bucket& bucket = bucket_for(buckets_, param);
      const auto found = momentum ? state_.find(param.unsafeGetTensorImpl()) : state_.end();
      if (!momentum || found != state_.end()) {
        bucket.params.push_back(param);
        bucket.grads.push_back(grad);
        if (momentum) {
          const at::Tensor& buffer = static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
          if (buffer.sizes() != param.sizes()) detail::fitted_buffer(buffer, param, "FusedSGD", "momentum_buffer");
          bucket.buffers.push_back(buffer);
        }
      } else {  // the parameter's first step with momentum: the kernel copies the gradient into a new buffer
        bucket.first_params.push_back(param);
        bucket.first_grads.push_back(grad);
        bucket.first_buffers.push_back(at::empty_like(grad, at::MemoryFormat::Preserve));
      }
    }
    for (auto& bucket : buckets_) {
      const auto scale = on_device(grad_scale, bucket.device);
      const auto inf = on_device(found_inf, bucket.device);
      if (!bucket.params.empty()) {
        at::_fused_sgd_(bucket.params, bucket.grads, bucket.buffers, o.weight_decay(), o.momentum(), o.lr(),
                        o.dampening(), o.nesterov(), /*maximize=*/false, /*is_first_step=*/false, scale, inf);
      }
      if (!bucket.first_params.empty()) {
        at::_fused_sgd_(bucket.first_params, bucket.first_grads, bucket.first_buffers, o.weight_decay(),
                        o.momentum(), o.lr(), o.dampening(), o.nesterov(), /*maximize=*/false,
                        /*is_first_step=*/true, scale, inf);
        // A skipped first step filled no buffer: keep none (the header says why this reads the flag).
        const bool skipped = inf && inf->item<float>() != 0.0f;
        for (std::size_t i = 0; !skipped && i < bucket.first_params.size(); ++i) {
          auto state = std::make_unique<torch::optim::SGDParamState>();
          state->momentum_buffer(bucket.first_buffers[i]);
          state_[bucket.first_params[i].unsafeGetTensorImpl()] = std::move(state);
        }
      }
      bucket.clear();
    }
  }
}

at::Tensor FusedSGD::step(LossClosure closure) {
  at::Tensor loss = detail::evaluate(closure);
  update(std::nullopt, std::nullopt);
  return loss;
}

void FusedSGD::scaled_step(const std::optional<at::Tensor>& grad_scale, const at::Tensor& found_inf) {
  update(grad_scale, found_inf);
}

void FusedSGD::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<torch::optim::SGDParamState, torch::optim::SGDOptions>(archive, *this);
}

void FusedSGD::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<torch::optim::SGDParamState, torch::optim::SGDOptions>(archive, *this);
  for (const auto& group : param_groups_)
    for (const auto& param : group.params()) {
      const auto found = state_.find(param.unsafeGetTensorImpl());
      if (found == state_.end()) continue;
      auto& state = static_cast<torch::optim::SGDParamState&>(*found->second);
      state.momentum_buffer(detail::fitted_buffer(state.momentum_buffer(), param, "FusedSGD", "momentum_buffer"));
    }
}

}  // namespace fulgur::optim
