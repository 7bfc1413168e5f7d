// FusedAdam and FusedAdamW: torch/optim/adam.py's _fused_adam in C++, on LibTorch's optimizer types.
#include "fulgur/optim/fused_adam.hpp"

#include <ATen/ATen.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <torch/optim/serialize.h>

#include <algorithm>
#include <string>

#include "fulgur/errors.hpp"
#include "src/optim/fused_common.hpp"

namespace fulgur::optim::detail {

template <class ParamState>
void FusedStepState<ParamState>::serialize(torch::serialize::OutputArchive& archive) const {
  ParamState saved(*this);
  if (step_count.defined()) saved.step(static_cast<std::int64_t>(step_count.template item<float>()));
  saved.ParamState::serialize(archive);
}

void AdamBucket::clear() {
  for (auto* list : {&params, &grads, &exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs, &steps}) list->clear();
}

template <class Options, class ParamState, bool Decoupled>
FusedAdamBase<Options, ParamState, Decoupled>::FusedAdamBase(
    const std::vector<torch::optim::OptimizerParamGroup>& param_groups, Options defaults)
    : ScaledStepOptimizer(param_groups, std::make_unique<Options>(defaults)) {
  const char* name = Decoupled ? "FusedAdamW" : "FusedAdam";
  const auto [beta1, beta2] = defaults.betas();
  check_option(defaults.lr() >= 0, name, "lr", defaults.lr(), ">= 0");
  check_option(defaults.eps() >= 0, name, "eps", defaults.eps(), ">= 0");
  check_option(beta1 >= 0 && beta1 < 1, name, "betas[0]", beta1, "in [0, 1)");
  check_option(beta2 >= 0 && beta2 < 1, name, "betas[1]", beta2, "in [0, 1)");
  check_option(defaults.weight_decay() >= 0, name, "weight_decay", defaults.weight_decay(), ">= 0");
  check_fused_parameters(*this, name);
}

template <class Options, class ParamState, bool Decoupled>
FusedStepState<ParamState>& FusedAdamBase<Options, ParamState, Decoupled>::state_of(const at::Tensor& param,
                                                                                      const Options& options) {
  const char* name = Decoupled ? "FusedAdamW" : "FusedAdam";
  auto& slot = state_[param.unsafeGetTensorImpl()];
  if (auto* own = dynamic_cast<FusedStepState<ParamState>*>(slot.get())) {
    if (own->exp_avg().sizes() != param.sizes()) fitted_buffer(own->exp_avg(), param, name, "exp_avg");  // throws
    if (options.amsgrad() && !own->max_exp_avg_sq().defined())  // amsgrad turned on mid-run: a fresh maximum
      own->max_exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
    return *own;
  }
  check_fused_parameter(param, name);
  auto state = std::make_unique<FusedStepState<ParamState>>();
  if (const auto* loaded = dynamic_cast<const ParamState*>(slot.get())) {
    // A state LibTorch's Adam wrote (or load() read): its buffers, fitted to the parameter, and its
    // integer step on the device.
    static_cast<ParamState&>(*state) = *loaded;
    state->exp_avg(fitted_buffer(loaded->exp_avg(), param, name, "exp_avg"));
    state->exp_avg_sq(fitted_buffer(loaded->exp_avg_sq(), param, name, "exp_avg_sq"));
    state->max_exp_avg_sq(fitted_buffer(loaded->max_exp_avg_sq(), param, name, "max_exp_avg_sq"));
    state->step_count = at::full({}, static_cast<double>(loaded->step()), param.options().dtype(at::kFloat));
  } else {
    state->step_count = at::zeros({}, param.options().dtype(at::kFloat));
  }
  if (!state->exp_avg().defined()) state->exp_avg(at::zeros_like(param, at::MemoryFormat::Preserve));
  if (!state->exp_avg_sq().defined()) state->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
  if (options.amsgrad() && !state->max_exp_avg_sq().defined())
    state->max_exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
  slot = std::move(state);
  return static_cast<FusedStepState<ParamState>&>(*slot);
}

template <class Options, class ParamState, bool Decoupled>
void FusedAdamBase<Options, ParamState, Decoupled>::update(const std::optional<at::Tensor>& grad_scale,
                                                           const std::optional<at::Tensor>& found_inf) {
  at::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const Options&>(group.options());
    for (auto& bucket : buckets_) bucket.clear();
    for (const auto& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse())
        throw MisconfigurationError(std::string(Decoupled ? "FusedAdamW" : "FusedAdam") +
                                    " does not support sparse gradients (as Adam): use dense gradients.");
      auto& state = state_of(param, options);
      auto& bucket = bucket_for(buckets_, param);
      bucket.params.push_back(param);
      bucket.grads.push_back(grad);
      bucket.exp_avgs.push_back(state.exp_avg());
      bucket.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) bucket.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      bucket.steps.push_back(state.step_count);
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& bucket : buckets_) {
      if (bucket.params.empty()) continue;
      const auto scale = on_device(grad_scale, bucket.device);
      const auto inf = on_device(found_inf, bucket.device);
      at::_foreach_add_(bucket.steps, 1);
      if constexpr (Decoupled)
        at::_fused_adamw_(bucket.params, bucket.grads, bucket.exp_avgs, bucket.exp_avg_sqs, bucket.max_exp_avg_sqs,
                          bucket.steps, options.lr(), beta1, beta2, options.weight_decay(), options.eps(),
                          options.amsgrad(), /*maximize=*/false, scale, inf);
      else
        at::_fused_adam_(bucket.params, bucket.grads, bucket.exp_avgs, bucket.exp_avg_sqs, bucket.max_exp_avg_sqs,
                         bucket.steps, options.lr(), beta1, beta2, options.weight_decay(), options.eps(),
                         options.amsgrad(), /*maximize=*/false, scale, inf);
      if (inf) at::_foreach_add_(bucket.steps, *inf, -1);  // a skipped step does not count (Python's _foreach_sub_)
      bucket.clear();  // hold no gradient past the step
    }
  }
}

template <class Options, class ParamState, bool Decoupled>
at::Tensor FusedAdamBase<Options, ParamState, Decoupled>::step(LossClosure closure) {
  at::Tensor loss = evaluate(closure);
  update(std::nullopt, std::nullopt);
  return loss;
}

template <class Options, class ParamState, bool Decoupled>
void FusedAdamBase<Options, ParamState, Decoupled>::scaled_step(const std::optional<at::Tensor>& grad_scale,
                                                                const at::Tensor& found_inf) {
  update(grad_scale, found_inf);
}

template <class Options, class ParamState, bool Decoupled>
void FusedAdamBase<Options, ParamState, Decoupled>::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<ParamState, Options>(archive, *this);
}

template <class Options, class ParamState, bool Decoupled>
void FusedAdamBase<Options, ParamState, Decoupled>::load(torch::serialize::InputArchive& archive) {
  // LibTorch's states as written; each becomes a FusedStepState at its parameter's next step.
  torch::optim::serialize<ParamState, Options>(archive, *this);
}

template class FusedAdamBase<torch::optim::AdamOptions, torch::optim::AdamParamState, false>;
template class FusedAdamBase<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>;

}  // namespace fulgur::optim::detail
