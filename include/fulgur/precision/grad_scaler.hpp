#pragma once
// fulgur::GradScaler: a C++ port of torch.amp.GradScaler (LibTorch has none).
//
// Same defaults, same READY -> UNSCALED -> STEPPED stages per optimizer, same kernels
// (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_), same state_dict keys.
// Differences that cost nothing in behaviour: buffers are allocated once and reused, so a
// step allocates no tensors; step() returns whether the optimizer really stepped.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "fulgur/state_dict.hpp"

namespace fulgur {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  enum class Stage { ready, unscaled, stepped };

  explicit GradScaler(GradScalerOptions options = {});

  /// outputs * scale. Creates the scale (float32) and growth tracker (int32) on outputs' device
  /// the first time. Disabled: returns outputs.
  at::Tensor scale(const at::Tensor& outputs);

  /// Divides the optimizer's gradients by the scale in place and records whether any is inf/NaN.
  /// Once per optimizer between two update()s.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Unscales if not done yet; calls optimizer.step() unless a gradient was inf/NaN.
  /// Returns whether the optimizer stepped (one host sync, as in Python).
  /// An optim::ScaledStepOptimizer (the fused optimizers) takes Python's path for optimizers with
  /// `_step_supports_amp_scaling` instead: the gradients are only checked for inf/NaN (not divided),
  /// and the optimizer gets the scale (none if unscale_ ran) and the flag, and skips on the device.
  /// The flag is read after the step is queued, for the return value only.
  bool step(torch::optim::Optimizer& optimizer);

  /// Backs off on inf/NaN, grows after growth_interval clean steps; resets the stages.
  void update();
  /// Sets the scale to new_scale instead.
  void update(double new_scale);
  /// Drops what it knows of every optimizer (stages, inf flags) and keeps the scale: for a new run,
  /// whose optimizers may live where a previous run's did (one that ended between unscale_ and update).
  void forget_optimizers() { records_.clear(); }

  /// The current scale (a host sync); init_scale before the first scale(); 1.0 when disabled.
  double get_scale() const;
  /// The scale tensor itself (undefined before the first scale()).
  const at::Tensor& scale_tensor() const { return scale_; }
  std::int64_t growth_tracker() const;
  Stage stage(const torch::optim::Optimizer& optimizer) const;
  /// The inf/NaN flags unscale_ recorded for `optimizer` (one per device), in place: a sharded
  /// strategy, whose ranks each checked their shard, all-reduces them before step().
  void for_each_found_inf(const torch::optim::Optimizer& optimizer, const std::function<void(const at::Tensor&)>& visit);

  bool is_enabled() const { return options_.enabled; }
  double get_growth_factor() const { return options_.growth_factor; }
  void set_growth_factor(double v) { options_.growth_factor = v; }
  double get_backoff_factor() const { return options_.backoff_factor; }
  void set_backoff_factor(double v) { options_.backoff_factor = v; }
  std::int64_t get_growth_interval() const { return options_.growth_interval; }
  void set_growth_interval(std::int64_t v) { options_.growth_interval = v; }

  /// Python's five keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker.
  /// Empty when disabled.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  struct DeviceFlags {  // allocated once per (optimizer, device), reset at each unscale_
    c10::Device device;
    at::Tensor found_inf;  // float32, 0-dim, on `device`
    at::Tensor inv_scale;  // float32, 0-dim, on `device`
    bool checked = false;  // a gradient on this device was checked since the last update()
  };
  struct OptimizerRecord {
    const torch::optim::Optimizer* optimizer = nullptr;
    Stage stage = Stage::ready;
    std::vector<DeviceFlags> devices;
    bool scales_in_kernel = false;  // an optim::ScaledStepOptimizer (decided once, at the first use)
  };
  struct GradGroup {  // gradients of one (device, dtype), rebuilt each unscale without reallocating
    c10::Device device;
    c10::ScalarType dtype;
    std::vector<at::Tensor> grads;
  };

  OptimizerRecord& record_for(const torch::optim::Optimizer& optimizer);
  /// Python's _unscale_grads_: checks every gradient for inf/NaN into the record's per-device flags,
  /// dividing by the scale when `unscale` (else by 1: _check_inf_per_device, for a ScaledStepOptimizer).
  void check_gradients(torch::optim::Optimizer& optimizer, OptimizerRecord& record, bool unscale);
  /// The flags of `record`'s devices, summed on the scale's device (the flag itself on one device).
  const at::Tensor& combined_found_inf(OptimizerRecord& record);
  void require_initialised(const char* function) const;
  void lazy_init(const c10::Device& device);
  DeviceFlags& flags_for(OptimizerRecord& record, const c10::Device& device);

  GradScalerOptions options_;
  double init_scale_;
  std::int64_t init_growth_tracker_ = 0;
  at::Tensor scale_;           // float32, 0-dim
  at::Tensor growth_tracker_;  // int32, 0-dim
  at::Tensor inv_scale_;       // float32, 0-dim: 1/scale, computed in double as in Python
  at::Tensor scale_double_;    // float64 scratch for that
  at::Tensor found_inf_;       // float32, 0-dim: sum of every checked flag, for update()
  std::vector<OptimizerRecord> records_;
  std::vector<GradGroup> groups_;
};

}  // namespace fulgur
