#pragma once
// LambdaCallback: a callback from functions, one per hook (Lightning's LambdaCallback):
//
//   fulgur::LambdaCallback{.on_train_epoch_end = [](fulgur::TrainerView& t, torch::nn::Module&) {
//     t.print("epoch " + std::to_string(t.current_epoch()) + " done");
//   }}
//
// Every hook takes (TrainerView&, torch::nn::Module&) and, where Lightning's has them, the
// arguments that have one type for every run: setup/teardown their Stage, on_exception the
// exception, on_before_backward the loss, on_before_zero_grad/on_before_optimizer_step the
// optimizer. Batch hooks read the position from the TrainerView. A hook left empty is skipped.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <concepts>
#include <exception>
#include <functional>
#include <utility>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/stage.hpp"

// Every callback hook with the arguments a LambdaCallback / AnyCallback passes after
// (TrainerView&, torch::nn::Module&), in declaration order.
#define FULGUR_DETAIL_ERASED_HOOKS(X)                                                          \
  X(setup, Stage) X(teardown, Stage) X(on_fit_start) X(on_fit_end) X(on_sanity_check_start)    \
  X(on_sanity_check_end) X(on_exception, const std::exception&) X(on_train_start) X(on_train_end) \
  X(on_train_epoch_start) X(on_train_epoch_end) X(on_train_batch_start) X(on_train_batch_end)  \
  X(on_before_zero_grad, torch::optim::Optimizer&) X(on_before_backward, const at::Tensor&)    \
  X(on_after_backward) X(on_before_optimizer_step, torch::optim::Optimizer&) X(on_validation_start) \
  X(on_validation_end) X(on_validation_epoch_start) X(on_validation_epoch_end)                  \
  X(on_validation_batch_start) X(on_validation_batch_end) X(on_test_start) X(on_test_end)       \
  X(on_test_epoch_start) X(on_test_epoch_end) X(on_test_batch_start) X(on_test_batch_end)       \
  X(on_predict_start) X(on_predict_end) X(on_predict_epoch_start) X(on_predict_epoch_end)       \
  X(on_predict_batch_start) X(on_predict_batch_end)

namespace fulgur {

/// A hook as a function that may be empty (then calling it does nothing).
template <class... Args>
class HookFunction {
 public:
  HookFunction() = default;
  template <class F>
    requires(!std::same_as<std::remove_cvref_t<F>, HookFunction> && std::invocable<F&, Args...>)
  HookFunction(F function) : function_(std::move(function)) {}
  void operator()(Args... args) const {
    if (function_) function_(std::forward<Args>(args)...);
  }
  explicit operator bool() const { return static_cast<bool>(function_); }

 private:
  std::function<void(Args...)> function_;
};

struct LambdaCallback {
#define FULGUR_DETAIL_LAMBDA_MEMBER(name, ...) HookFunction<TrainerView&, torch::nn::Module& __VA_OPT__(, ) __VA_ARGS__> name{};
  FULGUR_DETAIL_ERASED_HOOKS(FULGUR_DETAIL_LAMBDA_MEMBER)
#undef FULGUR_DETAIL_LAMBDA_MEMBER
};

}  // namespace fulgur
