#pragma once
// SingleDeviceStrategy — Lightning's "single_device": one process, one device; the collectives
// are the identity.
#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/concepts/vocabulary.hpp"
#include "fulgur/data/apply.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/strategies/common.hpp"

namespace fulgur {

class SingleDeviceStrategy {
 public:
  static constexpr std::string_view name = "single_device";

  explicit SingleDeviceStrategy(c10::Device device = c10::Device(c10::kCPU)) : root_device_(device) {}
  /// From the accelerator's parallel devices (what the Trainer passes): exactly one.
  explicit SingleDeviceStrategy(const std::vector<c10::Device>& devices) : root_device_(only_device(devices)) {}

  template <class Accelerator>
  void setup_environment(Accelerator& accelerator) { accelerator.setup_device(root_device_); }
  void setup_module(torch::nn::Module&) {}
  void setup_optimizer(torch::optim::Optimizer&) {}
  void setup_module_and_optimizers(torch::nn::Module& module, std::span<torch::optim::Optimizer* const> optimizers) {
    setup_module(module);
    for (auto* optimizer : optimizers) setup_optimizer(*optimizer);
  }
  void module_to_device(torch::nn::Module& module) { module.to(root_device_); }
  template <class Precision>
  auto module_init_context(Precision& precision, bool /*empty_init*/) {
    return detail::module_init_context_on(root_device_, precision);
  }

  /// Moves every tensor of any nesting to the root device (non-blocking from pinned memory).
  template <class Batch>
  auto batch_to_device(const Batch& batch) const {
    return detail::move_batch(batch, root_device_);
  }
  template <class Loader>
  Loader&& process_dataloader(Loader&& loader) { return std::forward<Loader>(loader); }

  template <class Precision>
  void backward(const at::Tensor& loss, torch::nn::Module& module, Precision& precision) {
    precision.pre_backward(loss, module);
    precision.backward(loss, module);
    precision.post_backward(loss, module);
  }
  /// Unscales first, then clips; returns the norm before clipping (strategies/common.hpp).
  template <class Precision>
  at::Tensor clip_gradients_norm(torch::nn::Module&, torch::optim::Optimizer& optimizer, double max_norm,
                                 double norm_type, bool error_if_nonfinite, Precision& precision) {
    return detail::unscale_and_clip_norm(optimizer, max_norm, norm_type, error_if_nonfinite, precision);
  }
  template <class Precision>
  void clip_gradients_value(torch::nn::Module&, torch::optim::Optimizer& optimizer, double clip_value,
                            Precision& precision) {
    detail::unscale_and_clip_value(optimizer, clip_value, precision);
  }

  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp = ReduceOp::mean) { return tensor; }
  at::Tensor all_gather(const at::Tensor& tensor) { return tensor; }
  template <class T>
  T broadcast(T value, int /*src*/ = 0) { return value; }
  void barrier(std::string_view /*name*/ = {}) {}
  bool reduce_boolean_decision(bool decision, bool /*all*/ = true) { return decision; }

  StateDict get_optimizer_state(torch::optim::Optimizer& optimizer) {
    return checkpoint::optimizer_state_dict(optimizer);
  }
  void save_checkpoint(const std::string& path, const StateDict& state) { checkpoint::save(path, state); }
  StateDict load_checkpoint(const std::string& path) { return checkpoint::load(path); }
  void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true) {
    checkpoint::load_module_state_dict(module, state, strict);
  }

  c10::Device root_device() const { return root_device_; }
  bool is_global_zero() const { return true; }
  int global_rank() const { return 0; }
  int local_rank() const { return 0; }
  int node_rank() const { return 0; }
  int world_size() const { return 1; }
  void teardown() {}

 private:
  static c10::Device only_device(const std::vector<c10::Device>& devices) {
    if (devices.size() != 1)
      throw MisconfigurationError("SingleDeviceStrategy runs on exactly one device, but " +
                                  std::to_string(devices.size()) +
                                  " were requested (TrainerConfig::devices); use devices = 1, or a "
                                  "distributed strategy for more.");
    return devices.front();
  }
  c10::Device root_device_;
};

}  // namespace fulgur
