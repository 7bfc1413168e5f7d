#pragma once
// A vocabulary of small complete stand-ins for LibTorch's types, and policies written against
// it. Concept and compatibility tests use these, so they compile without LibTorch.
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/concepts/vocabulary.hpp"

namespace stub {

struct Tensor {};
struct Device {};
enum class DeviceType { cpu, cuda };
enum class ScalarType { f32, f16 };
struct Module {};
struct Optimizer {};
struct StateDict {};
struct Batch {};
struct Loader {};
struct ParallelDevices {};

struct Vocabulary {
  using tensor = Tensor;
  using device = Device;
  using device_type = DeviceType;
  using scalar_type = ScalarType;
  using module = Module;
  using optimizer = Optimizer;
  using state_dict = StateDict;
  using parallel_devices = ParallelDevices;
  using batch = Batch;
  using loader = Loader;
};

struct Guard {
  Guard() = default;
  Guard(const Guard&) = delete;
};

struct Accelerator {
  static constexpr std::string_view name = "cpu";
  static constexpr DeviceType device_type = DeviceType::cpu;
  static bool is_available() { return true; }
  static int auto_device_count() { return 1; }
  static std::vector<int> parse_devices(int) { return {0}; }
  static std::vector<int> parse_devices(std::string_view) { return {0}; }
  static std::vector<Device> get_parallel_devices(const std::vector<int>&) { return {Device{}}; }
  void setup_device(const Device&) {}
  void teardown() {}
};

struct CudaAccelerator : Accelerator {
  static constexpr std::string_view name = "cuda";
  static constexpr DeviceType device_type = DeviceType::cuda;
};

struct Precision {
  static constexpr std::string_view name = "32-true";
  void convert_module(Module&) {}
  Guard module_init_context() { return {}; }
  Guard tensor_init_context() { return {}; }
  Guard forward_context() { return {}; }
  Tensor convert_input(const Tensor& t) { return t; }
  Batch convert_input(const Batch& b) { return b; }
  Tensor convert_output(const Tensor& t) { return t; }
  void pre_backward(const Tensor&, Module&) {}
  void backward(const Tensor&, Module&) {}
  void post_backward(const Tensor&, Module&) {}
  void unscale_gradients(Optimizer&) {}
  bool optimizer_step(Optimizer&) { return true; }
  std::vector<Tensor> main_params(Optimizer&) { return {}; }
  StateDict state_dict() const { return {}; }
  void load_state_dict(const StateDict&) {}
  void teardown() {}
};

struct Strategy {
  static constexpr std::string_view name = "single_device";
  template <class A> void setup_environment(A&, const ParallelDevices&) {}
  void setup_module(Module&) {}
  void setup_optimizer(Optimizer&) {}
  void setup_module_and_optimizers(Module&, std::span<Optimizer* const>) {}
  void module_to_device(Module&) {}
  template <class P> Guard module_init_context(P&, bool) { return {}; }
  template <class P> Guard tensor_init_context(P&) { return {}; }
  Tensor batch_to_device(const Tensor& t) { return t; }
  Batch batch_to_device(const Batch& b) { return b; }
  template <class L> L& process_dataloader(L& l) { return l; }
  template <class P> void backward(const Tensor&, Module&, P&) {}
  template <class P> bool optimizer_step(Optimizer&, P&) { return true; }
  template <class P> Tensor clip_gradients_norm(Module&, Optimizer&, double, double, bool, P&) { return {}; }
  template <class P> void clip_gradients_value(Module&, Optimizer&, double, P&) {}
  Guard no_backward_sync(Module&, bool) { return {}; }
  Tensor all_reduce(const Tensor& t, fulgur::ReduceOp) { return t; }
  Tensor all_gather(const Tensor& t) { return t; }
  Tensor broadcast(const Tensor& t, int) { return t; }
  void barrier(std::string_view = {}) {}
  bool reduce_boolean_decision(bool d, bool) { return d; }
  StateDict get_optimizer_state(Optimizer&) { return {}; }
  void save_checkpoint(const std::string&, const StateDict&) {}
  StateDict load_checkpoint(const std::string&) { return {}; }
  void load_module_state_dict(Module&, const StateDict&, bool) {}
  Device root_device() const { return {}; }
  bool is_global_zero() const { return true; }
  int global_rank() const { return 0; }
  int local_rank() const { return 0; }
  int world_size() const { return 1; }
  void teardown() {}
};

// ---- policies that declare compatibility traits ------------------------------------------------
struct NcclLikeStrategy : Strategy {  // a backend that carries CUDA tensors only
  static constexpr std::string_view name = "ddp";
  static constexpr bool supports_accelerator(std::string_view a) { return a == "cuda"; }
};
struct CudaOnlyPrecision : Precision {  // e.g. an fp8 policy
  static constexpr std::string_view name = "fp8-mixed";
  static constexpr bool supports_accelerator(std::string_view a) { return a == "cuda"; }
};
struct Bf16MixedWithScaler : Precision {
  static constexpr std::string_view name = "bf16-mixed";
  static constexpr bool uses_scaler = true;
};
struct Bf16MixedNoScaler : Precision {
  static constexpr std::string_view name = "bf16-mixed";
  static constexpr bool uses_scaler = false;
};
struct Fp16MixedWithScaler : Precision {
  static constexpr std::string_view name = "16-mixed";
  static constexpr bool uses_scaler = true;
};
struct DoublePrecision : Precision {
  static constexpr std::string_view name = "64-true";
};
struct ShardingStrategy : Strategy {
  static constexpr std::string_view name = "fsdp";
  static constexpr bool supports_precision(std::string_view p) { return p != "64-true"; }
};

}  // namespace stub
