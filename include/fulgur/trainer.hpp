#pragma once
// fulgur::Trainer<Accelerator, Strategy, Precision>.
//
// Two levels, the upper built only from the lower:
//  - Fabric level, for people who keep their own loop: setup, setup_dataloader, batch_to_device,
//    forward_context, backward, clip_gradients, optimizer_step, collectives, print;
//  - Trainer level: fit(module, train_data[, val_data]) (loops/fit.hpp).
// The policies are members held by value; every hook is a direct call.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include <concepts>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgur/accelerators/device_parsing.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/concepts/training_module.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/precision/guards.hpp"
#include "fulgur/step_context.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur {

/// Which gradient clipping Trainer::clip_gradients does: exactly one of clip_val and max_norm.
struct ClipGradients {
  std::optional<double> clip_val{};
  std::optional<double> max_norm{};
  double norm_type = 2.0;
  bool error_if_nonfinite = true;
};

namespace detail {

/// The module behind a std::shared_ptr<M>, a TORCH_MODULE holder, or a plain reference.
template <class M>
decltype(auto) module_ref(M& module) {
  if constexpr (requires { module.ptr(); *module; })  // torch::nn::ModuleHolder
    return *module;
  else if constexpr (requires { module.get(); *module; })  // smart pointer
    return *module;
  else
    return (module);
}

/// The range behind a std::unique_ptr/shared_ptr to a loader (torch::data::make_data_loader), or the range itself.
template <class D>
decltype(auto) range_ref(D& data) {
  if constexpr (requires { data.get(); *data; data->begin(); })
    return *data;
  else
    return (data);
}

}  // namespace detail

template <class A, class S, class P>
class Trainer {
  static_assert(assert_compatible<A, S, P>());  // a broken rule fails inside, with its own sentence

 public:
  using accelerator_type = A;
  using strategy_type = S;
  using precision_type = P;

  explicit Trainer(TrainerConfig config = {})
      : config_(std::move(config)),
        strategy_(make_strategy(resolve_devices(config_))),
        precision_(make_precision()) {
    if (config_.num_nodes < 1)
      throw MisconfigurationError("`num_nodes` must be >= 1, got " + std::to_string(config_.num_nodes) + ".");
    if (config_.seed) torch::manual_seed(*config_.seed);
    if (config_.deterministic) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    strategy_.setup_environment(accelerator_);
    check_dtype_supported();
  }

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer() {
    precision_.teardown();
    strategy_.teardown();
    accelerator_.teardown();
  }

  A& accelerator() { return accelerator_; }
  S& strategy() { return strategy_; }
  P& precision() { return precision_; }
  const TrainerConfig& config() const { return config_; }
  /// "cpu/single_device/32-true": the combination, in Lightning's names.
  static std::string combination_name() {
    return std::string(A::name) + "/" + std::string(S::name) + "/" + std::string(P::name);
  }

  // ---- Fabric level ----------------------------------------------------------------------------

  /// Converts the module to the precision, moves it to the device, and lets the strategy set up
  /// the module and optimizers. Optimizers keep referring to the same parameters.
  template <class Module, class... Optimizers>
  void setup(Module& module, Optimizers&... optimizers) {
    torch::nn::Module& m = detail::module_ref(module);
    precision_.convert_module(m);
    strategy_.module_to_device(m);
    std::vector<torch::optim::Optimizer*> opts{&detail::module_ref(optimizers)...};
    strategy_.setup_module_and_optimizers(m, opts);
    module_ = &m;
  }
  /// A context that creates modules on the root device and in the precision's dtype.
  auto init_module(bool empty_init = false) { return strategy_.module_init_context(precision_, empty_init); }
  auto init_tensor() { return precision_.tensor_init_context(); }

  template <class Loader>
  decltype(auto) setup_dataloader(Loader&& loader) {
    return strategy_.process_dataloader(std::forward<Loader>(loader));
  }
  template <class Batch>
  auto batch_to_device(const Batch& batch) { return strategy_.batch_to_device(batch); }
  /// The precision's forward context (autocast, default dtype): open it around forward and loss.
  auto forward_context() { return precision_.forward_context(); }
  template <class Data>
  auto convert_input(const Data& data) { return precision_.convert_input(data); }
  template <class Data>
  auto convert_output(const Data& data) { return precision_.convert_output(data); }

  /// Backward through the strategy and precision (scaling the loss under '16-mixed').
  void backward(const at::Tensor& loss) {
    if (module_ == nullptr)
      throw MisconfigurationError("Trainer::backward needs a module: call trainer.setup(module, optimizer) first.");
    strategy_.backward(loss, *module_, precision_);
  }
  template <class Module>
  void backward(const at::Tensor& loss, Module& module) {
    strategy_.backward(loss, detail::module_ref(module), precision_);
  }

  /// Clips by value or by norm (unscaling first). Returns the total norm before clipping for
  /// max_norm, an undefined tensor for clip_val.
  template <class Module>
  at::Tensor clip_gradients(Module& module, torch::optim::Optimizer& optimizer, const ClipGradients& clip) {
    if (clip.clip_val && clip.max_norm)
      throw MisconfigurationError(
          "Only one of `clip_val` or `max_norm` can be set as this specifies the underlying clipping algorithm!");
    torch::nn::Module& m = detail::module_ref(module);
    if (clip.clip_val) {
      strategy_.clip_gradients_value(m, optimizer, *clip.clip_val, precision_);
      return {};
    }
    if (clip.max_norm)
      return strategy_.clip_gradients_norm(m, optimizer, *clip.max_norm, clip.norm_type, clip.error_if_nonfinite,
                                           precision_);
    throw MisconfigurationError("You have to specify either `clip_val` or `max_norm` to do gradient clipping!");
  }

  /// While the returned guard lives, backward accumulates gradients without communicating
  /// (gradient accumulation micro-batches under DDP; nothing to skip on a single device).
  auto no_backward_sync(bool enabled = true) {
    if constexpr (requires { strategy_.no_backward_sync(enabled); })
      return strategy_.no_backward_sync(enabled);
    else
      return NullContext{};
  }

  /// Steps the optimizer through the precision; false when the step was skipped (inf/NaN gradients).
  bool optimizer_step(torch::optim::Optimizer& optimizer) { return precision_.optimizer_step(optimizer); }

  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::mean) { return strategy_.all_reduce(tensor, op); }
  at::Tensor all_gather(const at::Tensor& tensor) { return strategy_.all_gather(tensor); }
  template <class T>
  T broadcast(T value, int src = 0) { return strategy_.broadcast(std::move(value), src); }
  void barrier(std::string_view name = {}) { strategy_.barrier(name); }
  bool is_global_zero() const { return strategy_.is_global_zero(); }
  int global_rank() const { return strategy_.global_rank(); }
  int local_rank() const { return strategy_.local_rank(); }
  int world_size() const { return strategy_.world_size(); }
  c10::Device device() const { return strategy_.root_device(); }

  /// Prints one line on global rank 0 only.
  template <class... Args>
  void print(const Args&... args) const {
    if (!is_global_zero()) return;
    std::ostringstream line;
    (line << ... << args);
    std::cout << line.str() << std::endl;
  }

  // ---- Trainer level ---------------------------------------------------------------------------

  /// Trains `module` (a std::shared_ptr<M>, a TORCH_MODULE holder, or M&) on `train_data` (any range
  /// of batches: fulgur::data::TensorLoader, std::vector<Batch>, a torch::data loader...),
  /// validating on `val_data` after each epoch (every check_val_every_n_epoch).
  template <class Module, class TrainData>
  FitResult fit(Module& module, TrainData& train_data);
  template <class Module, class TrainData, class ValData>
  FitResult fit(Module& module, TrainData& train_data, ValData& val_data);

  /// Runs validation_step over `val_data` once; returns the batch-size-weighted mean loss.
  template <class Module, class ValData>
  double validate(Module& module, ValData& val_data);

 private:
  template <class Module, class TrainData, class ValData>
  FitResult run_fit(Module& module, TrainData& train_data, ValData* val_data);
  template <class Module, class ValData>
  double validation_loop(Module& module, ValData& val_data, std::int64_t epoch, std::int64_t global_step,
                         std::map<std::string, double>& metrics);

  static std::vector<c10::Device> resolve_devices(const TrainerConfig& config) {
    if (!A::is_available())
      throw AcceleratorError("`" + std::string(A::name) +
                             "` can not run on your system since the accelerator is not available. The following "
                             "accelerator(s) is available and can be passed into the Trainer: " +
                             detail::available_accelerators_text() + ". Pick one of them (e.g. fulgur::CPUAccelerator), "
                             "or run on a machine where '" + std::string(A::name) + "' is available.");
    const std::vector<int> ids =
        std::visit([](const auto& devices) { return A::parse_devices(devices); }, config.devices);
    return A::get_parallel_devices(ids);
  }
  S make_strategy(const std::vector<c10::Device>& devices) const {
    if constexpr (std::constructible_from<S, const std::vector<c10::Device>&, const TrainerConfig&>)
      return S(devices, config_);
    else if constexpr (std::constructible_from<S, const std::vector<c10::Device>&>)
      return S(devices);
    else
      return S{};
  }
  static P make_precision() {
    if constexpr (std::constructible_from<P, c10::DeviceType>)
      return P(A::device_type);
    else
      return P{};
  }
  void check_dtype_supported() {
    if constexpr (requires { P::dtype; A::supports_dtype(strategy_.root_device(), P::dtype); }) {
      if (!A::supports_dtype(strategy_.root_device(), P::dtype))
        throw AcceleratorError("precision '" + std::string(P::name) + "' computes in " +
                               std::string(c10::toString(P::dtype)) + ", which " + strategy_.root_device().str() +
                               " does not support (bfloat16 needs compute capability 8.0 or newer); use '16-mixed' "
                               "(FP16MixedPrecision) or '32-true' instead.");
    }
  }

  TrainerConfig config_;
  A accelerator_{};
  S strategy_;
  P precision_;
  torch::nn::Module* module_ = nullptr;  // the module of the last setup(), for backward(loss)
};

}  // namespace fulgur

#include "fulgur/loops/fit.hpp"
