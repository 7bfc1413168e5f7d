#pragma once
// One call of a step (training_step, validation_step, test_step, predict_step) inside the
// precision's forward context, a LibTorch error turned into a StepError that names the step,
// the position, the batch and the model.
#include <ATen/ATen.h>

#include <type_traits>

#include "fulgur/hooks.hpp"
#include "fulgur/loops/common.hpp"

namespace fulgur::loops {

template <class Host, class Module, class Step, class Batch>
auto run_step(Host& host, HookCallerOf<Host, Module>& hook, Step step, const Batch& batch) {
  StepContext& ctx = hook.ctx();
  try {
    auto timed = profile_step<Host, Step>(hook);
    auto precision_context = host.forward_context();
    if constexpr (std::is_void_v<decltype(hook(step, batch, ctx.batch_idx))>) {
      hook(step, batch, ctx.batch_idx);
      return NoOutput{};
    } else {
      return hook(step, batch, ctx.batch_idx);
    }
  } catch (const c10::Error& e) {
    throw step_failure(Step::name, ctx, Host::precision_name(), e, batch, hook.module());
  }
}

/// The same under several evaluation loaders: the step gets (batch, batch_idx, dataloader_idx).
template <class Host, class Module, class Step, class Batch>
auto run_step(Host& host, HookCallerOf<Host, Module>& hook, Step step, const Batch& batch, std::int64_t dataloader_idx) {
  StepContext& ctx = hook.ctx();
  try {
    auto timed = profile_step<Host, Step>(hook);
    auto precision_context = host.forward_context();
    if constexpr (std::is_void_v<decltype(hook(step, batch, ctx.batch_idx, dataloader_idx))>) {
      hook(step, batch, ctx.batch_idx, dataloader_idx);
      return NoOutput{};
    } else {
      return hook(step, batch, ctx.batch_idx, dataloader_idx);
    }
  } catch (const c10::Error& e) {
    throw step_failure(Step::name, ctx, Host::precision_name(), e, batch, hook.module());
  }
}

/// The step's output type for batches of type Batch.
template <class Host, class Module, class Step, class Batch>
using step_output_t = decltype(run_step(std::declval<Host&>(), std::declval<HookCallerOf<Host, Module>&>(),
                                        std::declval<Step>(), std::declval<const Batch&>()));

}  // namespace fulgur::loops
