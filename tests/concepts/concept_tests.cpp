// Truth tables for the policy concepts, with near-miss types: each near miss lacks or misspells
// one member, so a concept that stopped checking it would let the type through and fail here.
#include <catch2/catch.hpp>

#include "fulgur/concepts/accelerator.hpp"
#include "fulgur/concepts/precision.hpp"
#include "fulgur/concepts/strategy.hpp"
#include "fulgur/concepts/training_module.hpp"
#include "stub_policies.hpp"

using V = stub::Vocabulary;
using namespace stub;

namespace accelerators {
struct NoTeardown {
  static constexpr std::string_view name = "x";
  static constexpr DeviceType device_type = DeviceType::cpu;
  static bool is_available() { return true; }
  static int auto_device_count() { return 1; }
  static std::vector<int> parse_devices(int) { return {}; }
  static std::vector<int> parse_devices(std::string_view) { return {}; }
  static std::vector<Device> get_parallel_devices(const std::vector<int>&) { return {}; }
  void setup_device(const Device&) {}
};
struct ParseReturnsInt : Accelerator {
  static int parse_devices(int n) { return n; }
};
struct NoStringParse {
  static constexpr std::string_view name = "x";
  static constexpr DeviceType device_type = DeviceType::cpu;
  static bool is_available() { return true; }
  static int auto_device_count() { return 1; }
  static std::vector<int> parse_devices(int) { return {}; }
  static std::vector<Device> get_parallel_devices(const std::vector<int>&) { return {}; }
  void setup_device(const Device&) {}
  void teardown() {}
};
struct NameIsInt : Accelerator {
  static constexpr int name = 3;
};
struct AvailabilityNotStatic : Accelerator {
  bool is_available() const { return true; }
};
struct SetupTakesInt : Accelerator {
  void setup_device(int) {}
  void setup_device(const Device&) = delete;
};
struct NotMovable : Accelerator {
  NotMovable() = default;
  NotMovable(NotMovable&&) = delete;
};
}  // namespace accelerators

TEST_CASE("accelerator: the stub satisfies the contract, each near miss does not", "[concepts][accelerator]") {
  STATIC_REQUIRE(fulgur::accelerator_for<Accelerator, V>);
  STATIC_REQUIRE(fulgur::accelerator_for<CudaAccelerator, V>);
  STATIC_REQUIRE_FALSE(fulgur::accelerator_for<int, V>);
  STATIC_REQUIRE_FALSE(fulgur::accelerator_for<accelerators::NoTeardown, V>);
  STATIC_REQUIRE_FALSE(fulgur::accelerator_for<accelerators::ParseReturnsInt, V>);
  STATIC_REQUIRE_FALSE(fulgur::accelerator_for<accelerators::NoStringParse, V>);
  STATIC_REQUIRE_FALSE(fulgur::accelerator_for<accelerators::NameIsInt, V>);
  STATIC_REQUIRE_FALSE(fulgur::accelerator_for<accelerators::AvailabilityNotStatic, V>);
  STATIC_REQUIRE_FALSE(fulgur::accelerator_for<accelerators::SetupTakesInt, V>);
  STATIC_REQUIRE_FALSE(fulgur::accelerator_for<accelerators::NotMovable, V>);
  // The fragments name what is missing.
  STATIC_REQUIRE(fulgur::accelerator_discovery_for<accelerators::NoTeardown, V>);
  STATIC_REQUIRE_FALSE(fulgur::accelerator_lifecycle_for<accelerators::NoTeardown, V>);
}

namespace precisions {
struct StepReturnsVoid : Precision {
  void optimizer_step(Optimizer&) {}
};
struct NoConvertOutput {
  static constexpr std::string_view name = "x";
  void convert_module(Module&) {}
  Guard module_init_context() { return {}; }
  Guard tensor_init_context() { return {}; }
  Guard forward_context() { return {}; }
  Tensor convert_input(const Tensor& t) { return t; }
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
struct StateDictNotConst : Precision {
  StateDict state_dict() = delete;
  StateDict state_dict() const = delete;
};
struct MainParamsNotRange : Precision {
  int main_params(Optimizer&) { return 0; }
};
struct BackwardWithoutModule : Precision {
  void backward(const Tensor&, Module&) = delete;
  void backward(const Tensor&) {}
};
struct NoName : Precision {
  static constexpr std::string_view label = "x";
  static constexpr int name = 0;
};
}  // namespace precisions

TEST_CASE("precision: the stub satisfies the contract, each near miss does not", "[concepts][precision]") {
  STATIC_REQUIRE(fulgur::precision_for<Precision, V>);
  STATIC_REQUIRE(fulgur::precision_for<Bf16MixedWithScaler, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_for<precisions::StepReturnsVoid, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_for<precisions::NoConvertOutput, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_for<precisions::StateDictNotConst, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_for<precisions::MainParamsNotRange, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_for<precisions::BackwardWithoutModule, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_for<precisions::NoName, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_for<Accelerator, V>);
  STATIC_REQUIRE(fulgur::precision_optimizer_hooks_for<precisions::NoConvertOutput, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_forward_hooks_for<precisions::NoConvertOutput, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_optimizer_hooks_for<precisions::StepReturnsVoid, V>);
}

namespace strategies {
struct NoBarrier : Strategy {
  void barrier(std::string_view) = delete;
};
struct AllReduceWithoutOp : Strategy {
  Tensor all_reduce(const Tensor& t, fulgur::ReduceOp) = delete;
  Tensor all_reduce(const Tensor& t) { return t; }
};
struct BackwardIgnoresPrecision : Strategy {
  template <class P> void backward(const Tensor&, Module&, P&) = delete;
  void backward(const Tensor&, Module&) {}
};
struct RankIsBool : Strategy {
  Device root_device() const { return {}; }
  std::string global_rank() const { return "0"; }
};
struct NoCheckpointLoad : Strategy {
  StateDict load_checkpoint(const std::string&) = delete;
};
// Uses a precision member outside the contract: the archetype precision refuses it.
struct NeedsPrecisionExtras : Strategy {
  template <class P>
  auto backward(const Tensor&, Module&, P& p) -> decltype(p.scaler()) { return p.scaler(); }
};
}  // namespace strategies

TEST_CASE("strategy: the stub satisfies the contract, each near miss does not", "[concepts][strategy]") {
  STATIC_REQUIRE(fulgur::strategy_for<Strategy, V>);
  STATIC_REQUIRE(fulgur::strategy_for<ShardingStrategy, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::NoBarrier, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::AllReduceWithoutOp, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::BackwardIgnoresPrecision, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::RankIsBool, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::NoCheckpointLoad, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::NeedsPrecisionExtras, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<Precision, V>);
  STATIC_REQUIRE(fulgur::strategy_topology_for<strategies::NoBarrier, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_collectives_for<strategies::NoBarrier, V>);
}

namespace modules {
struct Batch {};
struct Good : Module {
  Tensor training_step(const Batch&, std::int64_t) { return {}; }
  std::unique_ptr<Optimizer> configure_optimizers() { return nullptr; }
};
struct Output {
  Tensor loss;
  int extra = 0;
};
struct ReturnsStruct : Module {
  Output training_step(const Batch&, std::int64_t) { return {}; }
  std::unique_ptr<Optimizer> configure_optimizers() { return nullptr; }
};
struct OptimizerConfigLike {
  std::unique_ptr<Optimizer> optimizer;
  int interval = 0;
};
struct ReturnsConfig : Module {
  Tensor training_step(const Batch&, std::int64_t) { return {}; }
  OptimizerConfigLike configure_optimizers() { return {}; }
};
struct TakesContext : Module {
  Tensor training_step(const Batch&, std::int64_t, fulgur::StepContext&) { return {}; }
  std::unique_ptr<Optimizer> configure_optimizers() { return nullptr; }
};
struct NotAModule {
  Tensor training_step(const Batch&, std::int64_t) { return {}; }
  std::unique_ptr<Optimizer> configure_optimizers() { return nullptr; }
};
struct NoBatchIdx : Module {
  Tensor training_step(const Batch&) { return {}; }
  std::unique_ptr<Optimizer> configure_optimizers() { return nullptr; }
};
struct ReturnsInt : Module {
  int training_step(const Batch&, std::int64_t) { return 0; }
  std::unique_ptr<Optimizer> configure_optimizers() { return nullptr; }
};
struct RawOptimizerPointer : Module {
  Tensor training_step(const Batch&, std::int64_t) { return {}; }
  Optimizer* configure_optimizers() { return nullptr; }
};
struct MisspeltStep : Module {
  Tensor train_step(const Batch&, std::int64_t) { return {}; }
  std::unique_ptr<Optimizer> configure_optimizers() { return nullptr; }
};
struct OtherBatch {};
struct WithValidation : Good {
  Tensor validation_step(const Batch&, std::int64_t) { return {}; }
};
}  // namespace modules

TEST_CASE("training_module: required steps, accepted return forms, near misses", "[concepts][module]") {
  using modules::Batch;
  STATIC_REQUIRE(fulgur::training_module_for<modules::Good, Batch, V>);
  STATIC_REQUIRE(fulgur::training_module_for<modules::ReturnsStruct, Batch, V>);
  STATIC_REQUIRE(fulgur::training_module_for<modules::ReturnsConfig, Batch, V>);
  STATIC_REQUIRE(fulgur::training_module_for<modules::TakesContext, Batch, V>);
  STATIC_REQUIRE_FALSE(fulgur::training_module_for<modules::NotAModule, Batch, V>);
  STATIC_REQUIRE_FALSE(fulgur::training_module_for<modules::NoBatchIdx, Batch, V>);
  STATIC_REQUIRE_FALSE(fulgur::training_module_for<modules::ReturnsInt, Batch, V>);
  STATIC_REQUIRE_FALSE(fulgur::training_module_for<modules::RawOptimizerPointer, Batch, V>);
  STATIC_REQUIRE_FALSE(fulgur::training_module_for<modules::MisspeltStep, Batch, V>);
  STATIC_REQUIRE_FALSE(fulgur::training_module_for<modules::Good, modules::OtherBatch, V>);
  STATIC_REQUIRE(fulgur::detail::has_validation_step_for<modules::WithValidation, Batch, V>);
  STATIC_REQUIRE_FALSE(fulgur::detail::has_validation_step_for<modules::Good, Batch, V>);
}
