// examples/extending/announcing_strategy.hpp
// A strategy that derives from nothing: it holds a SingleDeviceStrategy and forwards every
// member of the contract to it, announcing each checkpoint it writes. Deriving is a convenience,
// never a requirement: the concept checks the members, and this type trains through fit.
#pragma once
#include <fulgur/fulgur.hpp>

#include <iostream>

class AnnouncingStrategy {
 public:
  static constexpr std::string_view name = "announcing";

  template <class Accelerator>
  void setup_environment(Accelerator& accelerator, const fulgur::ParallelDevices& devices) {
    inner_.setup_environment(accelerator, devices);
  }
  void setup_module(torch::nn::Module& module) { inner_.setup_module(module); }
  void setup_optimizer(torch::optim::Optimizer& optimizer) { inner_.setup_optimizer(optimizer); }
  void setup_module_and_optimizers(torch::nn::Module& module, std::span<torch::optim::Optimizer* const> optimizers) {
    inner_.setup_module_and_optimizers(module, optimizers);
  }
  void module_to_device(torch::nn::Module& module) { inner_.module_to_device(module); }
  template <class Precision>
  auto module_init_context(Precision& precision, bool empty_init) {
    return inner_.module_init_context(precision, empty_init);
  }
  template <class Precision>
  auto tensor_init_context(Precision& precision) {
    return inner_.tensor_init_context(precision);
  }
  void teardown() { inner_.teardown(); }

  template <class Batch>
  auto batch_to_device(const Batch& batch) {
    return inner_.batch_to_device(batch);
  }
  template <class Loader>
  Loader&& process_dataloader(Loader&& loader) {
    return std::forward<Loader>(loader);
  }

  template <class Precision>
  void backward(const at::Tensor& loss, torch::nn::Module& module, Precision& precision) {
    inner_.backward(loss, module, precision);
  }
  template <class Precision>
  bool optimizer_step(torch::optim::Optimizer& optimizer, Precision& precision) {
    return inner_.optimizer_step(optimizer, precision);
  }
  template <class Precision>
  at::Tensor clip_gradients_norm(torch::nn::Module& module, torch::optim::Optimizer& optimizer, double max_norm,
                                 double norm_type, bool error_if_nonfinite, Precision& precision) {
    return inner_.clip_gradients_norm(module, optimizer, max_norm, norm_type, error_if_nonfinite, precision);
  }
  template <class Precision>
  void clip_gradients_value(torch::nn::Module& module, torch::optim::Optimizer& optimizer, double clip_value,
                            Precision& precision) {
    inner_.clip_gradients_value(module, optimizer, clip_value, precision);
  }
  auto no_backward_sync(torch::nn::Module& module, bool enabled) { return inner_.no_backward_sync(module, enabled); }

  at::Tensor all_reduce(const at::Tensor& t, fulgur::ReduceOp op = fulgur::ReduceOp::mean) { return inner_.all_reduce(t, op); }
  at::Tensor all_gather(const at::Tensor& t) { return inner_.all_gather(t); }
  template <class T>
  T broadcast(T value, int src = 0) {
    return inner_.broadcast(std::move(value), src);
  }
  void barrier(std::string_view barrier_name = {}) { inner_.barrier(barrier_name); }
  bool reduce_boolean_decision(bool decision, bool all = true) { return inner_.reduce_boolean_decision(decision, all); }

  fulgur::StateDict get_optimizer_state(torch::optim::Optimizer& optimizer) { return inner_.get_optimizer_state(optimizer); }
  void save_checkpoint(const std::string& path, const fulgur::StateDict& state) {
    inner_.save_checkpoint(path, state);
    if (is_global_zero()) std::cout << "checkpoint written: " << path << '\n';
  }
  fulgur::StateDict load_checkpoint(const std::string& path) { return inner_.load_checkpoint(path); }
  void load_module_state_dict(torch::nn::Module& module, const fulgur::StateDict& state, bool strict = true) {
    inner_.load_module_state_dict(module, state, strict);
  }

  c10::Device root_device() const { return inner_.root_device(); }
  bool is_global_zero() const { return inner_.is_global_zero(); }
  int global_rank() const { return inner_.global_rank(); }
  int local_rank() const { return inner_.local_rank(); }
  int world_size() const { return inner_.world_size(); }

 private:
  fulgur::SingleDeviceStrategy inner_;
};
