#pragma once
// fulgur::strategy_defaults<Derived>: every member of the strategy contract, as a single process
// on a single device does it (Lightning's SingleDeviceStrategy), written against `derived()` so
// that a strategy overrides only what differs, as thrust's execution_policy<Derived> falls back to
// a generic backend:
//
//   struct CountingStrategy : fulgur::strategy_defaults<CountingStrategy> {
//     static constexpr std::string_view name = "counting";
//     template <class Precision>
//     bool optimizer_step(torch::optim::Optimizer& optimizer, Precision& precision) {
//       ++steps;
//       return strategy_defaults::optimizer_step(optimizer, precision);
//     }
//     int steps = 0;
//   };
//
// Where a default calls another member (setup_module_and_optimizers calls setup_module and
// setup_optimizer; is_global_zero calls global_rank; the contexts and batch_to_device use
// root_device), it calls Derived's, so overriding one member is enough. No virtual function:
// every call is resolved at compile time. Nothing has to derive from this: it is a convenience;
// the concept (concepts/strategy.hpp) is the contract.
#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/concepts/vocabulary.hpp"
#include "fulgur/data/apply.hpp"
#include "fulgur/data/pinned_memory.hpp"
#include "fulgur/detail/meta_tensors.hpp"
#include "fulgur/detail/trainer_support.hpp"
#include "fulgur/device_guards.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/parallel_devices.hpp"
#include "fulgur/precision/guards.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/strategies/clipping.hpp"

namespace fulgur {

/// What module_init_context and tensor_init_context return: the root device made current and
/// the default device for factory functions, then the precision's context (default dtype).
template <class PrecisionContext>
struct [[nodiscard]] InitContext {
  c10::OptionalDeviceGuard current_device;
  DefaultDeviceGuard default_device;
  PrecisionContext precision;
};

template <class Derived>
class strategy_defaults {
 public:
  strategy_defaults() = default;
  /// For Fabric-style use without a Trainer: run on `device`.
  explicit strategy_defaults(c10::Device device) : root_device_(device) {}

  // ---- set-up --------------------------------------------------------------------------------
  /// Takes this process's device from the accelerator's devices and sets it up.
  template <class Accelerator>
  void setup_environment(Accelerator& accelerator, const ParallelDevices& parallel) {
    if (parallel.devices.size() != 1 || parallel.num_nodes != 1)
      detail::raise_single_process_devices(Derived::name, parallel.devices.size(), parallel.num_nodes);
    root_device_ = parallel.devices.front();
    accelerator.setup_device(root_device_);
  }
  void setup_module(torch::nn::Module&) {}
  void setup_optimizer(torch::optim::Optimizer&) {}
  void setup_module_and_optimizers(torch::nn::Module& module, std::span<torch::optim::Optimizer* const> optimizers) {
    derived().setup_module(module);
    for (auto* optimizer : optimizers) derived().setup_optimizer(*optimizer);
  }
  void module_to_device(torch::nn::Module& module) {
    detail::refuse_meta_tensors(
        module, std::string(Derived::name) + " cannot give it memory: it does not materialise a model built in "
                "init_module(/*empty_init=*/true) (docs/sharding.md names the strategy that does); build it "
                "with init_module() instead.");
    module.to(derived().root_device());
  }
  /// Modules created in this context get their parameters on the root device, in the precision's
  /// dtype. empty_init is accepted for Lightning's signature; initialisation always runs (a
  /// strategy that materialises modules at set-up builds them on the meta device instead).
  template <class Precision>
  auto module_init_context(Precision& precision, bool /*empty_init*/) {
    const c10::Device device = derived().root_device();
    return InitContext<decltype(precision.module_init_context())>{
        c10::OptionalDeviceGuard(device), DefaultDeviceGuard(device), precision.module_init_context()};
  }
  /// Tensors created in this context go to the root device, in the precision's dtype.
  template <class Precision>
  auto tensor_init_context(Precision& precision) {
    const c10::Device device = derived().root_device();
    return InitContext<decltype(precision.tensor_init_context())>{
        c10::OptionalDeviceGuard(device), DefaultDeviceGuard(device), precision.tensor_init_context()};
  }
  void teardown() {}

  // ---- data ----------------------------------------------------------------------------------
  /// Every tensor of any nesting moved to the root device (a tensor already there is returned as it
  /// is, without a copy). Copies to a GPU are non-blocking, as Lightning's: a pinned tensor (a
  /// DataLoader's with pin_memory) crosses on a copy stream that the compute stream then waits for,
  /// so it overlaps the kernels queued before it; from pageable memory CUDA has staged the bytes when
  /// the call returns, so the source may go at once. Whether a tensor is pinned is known from its
  /// allocator: Tensor::is_pinned() would cost a CUDA driver query per tensor per step.
  template <class Batch>
  auto batch_to_device(const Batch& batch) const {
    const c10::Device device = derived().root_device();
    // The device test first: to() is a dispatcher call (~1k instructions a batch on CPU), for a
    // tensor that stays where it is.
    if (!device.is_cuda())
      return data::map_tensors(batch, [&device](const at::Tensor& t) {
        return !t.defined() || t.device() == device ? t : t.to(device);
      });
    data::detail::DeviceCopy copy(device);
    auto out = data::map_tensors(batch, [&](const at::Tensor& t) {
      return !t.defined() || t.device() == device ? t : copy(t);
    });
    copy.finish();
    return out;
  }
  /// One process sees all the data.
  template <class Loader>
  Loader&& process_dataloader(Loader&& loader) {
    return std::forward<Loader>(loader);
  }

  // ---- a step --------------------------------------------------------------------------------
  template <class Precision>
  void backward(const at::Tensor& loss, torch::nn::Module& module, Precision& precision) {
    precision.pre_backward(loss, module);
    precision.backward(loss, module);
    precision.post_backward(loss, module);
  }
  /// Steps through the precision (which may skip the step); returns whether the step ran.
  template <class Precision>
  bool optimizer_step(torch::optim::Optimizer& optimizer, Precision& precision) {
    return precision.optimizer_step(optimizer);
  }
  /// Unscales first (so a scaled gradient never meets the threshold), then clips the precision's
  /// main parameters; returns the total norm before clipping. With a loss scaler, non-finite
  /// gradients are the scaler's to handle (it skips the step), so they are never an error.
  template <class Precision>
  at::Tensor clip_gradients_norm(torch::nn::Module&, torch::optim::Optimizer& optimizer, double max_norm,
                                 double norm_type, bool error_if_nonfinite, Precision& precision) {
    precision.unscale_gradients(optimizer);
    return clip_grad_norm(precision.main_params(optimizer), max_norm, norm_type,
                          error_if_nonfinite && !detail::uses_scaler<Precision>());
  }
  template <class Precision>
  void clip_gradients_value(torch::nn::Module&, torch::optim::Optimizer& optimizer, double clip_value,
                            Precision& precision) {
    precision.unscale_gradients(optimizer);
    clip_grad_value(precision.main_params(optimizer), clip_value);
  }
  /// Nothing to skip on one process.
  NullContext no_backward_sync(torch::nn::Module&, bool /*enabled*/ = true) { return {}; }

  // ---- collectives: one process, so each is the identity -------------------------------------
  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp = ReduceOp::mean) { return tensor; }
  at::Tensor all_gather(const at::Tensor& tensor) { return tensor; }
  template <class T>
  T broadcast(T value, int /*src*/ = 0) {
    return value;
  }
  void barrier(std::string_view /*name*/ = {}) {}
  bool reduce_boolean_decision(bool decision, bool /*all*/ = true) { return decision; }

  // ---- state ---------------------------------------------------------------------------------
  StateDict get_optimizer_state(torch::optim::Optimizer& optimizer) {
    return checkpoint::optimizer_state_dict(optimizer);
  }
  /// Global rank 0 writes (atomically), then every rank waits for it.
  void save_checkpoint(const std::string& path, const StateDict& state) {
    if (derived().is_global_zero()) checkpoint::save(path, state);
    derived().barrier("save_checkpoint");
  }
  StateDict load_checkpoint(const std::string& path) { return checkpoint::load(path); }
  /// Global rank 0 deletes the checkpoint and what its format keeps beside it; no rank waits.
  void remove_checkpoint(const std::string& path) {
    if (derived().is_global_zero()) checkpoint::remove(path);
  }
  void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true) {
    checkpoint::load_module_state_dict(module, state, strict);
  }

  // ---- topology ------------------------------------------------------------------------------
  c10::Device root_device() const { return root_device_; }
  bool is_global_zero() const { return derived().global_rank() == 0; }
  int global_rank() const { return 0; }
  int local_rank() const { return 0; }
  int node_rank() const { return 0; }
  int world_size() const { return 1; }

 protected:
  Derived& derived() { return static_cast<Derived&>(*this); }
  const Derived& derived() const { return static_cast<const Derived&>(*this); }
  void set_root_device(c10::Device device) { root_device_ = device; }

 private:
  c10::Device root_device_{c10::kCPU};
};

}  // namespace fulgur
