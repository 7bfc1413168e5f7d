// Truth tables for the policy concepts, with near-miss types: each near miss lacks or misspells
// one member, so a concept that stopped checking it would let the type through and fail here.
#include <catch2/catch.hpp>

#include "fulgur/concepts/accelerator.hpp"
#include "fulgur/concepts/callback.hpp"
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
struct NotDefaultConstructible : Accelerator {  // the Trainer default-constructs its accelerator
  explicit NotDefaultConstructible(int) {}
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
  STATIC_REQUIRE_FALSE(fulgur::accelerator_for<accelerators::NotDefaultConstructible, V>);
  // The diagnosis names the first member missing.
  using enum fulgur::detail::accelerator_requirement;
  STATIC_REQUIRE(fulgur::detail::first_missing_accelerator_requirement<Accelerator, V>() == none);
  STATIC_REQUIRE(fulgur::detail::first_missing_accelerator_requirement<accelerators::NoTeardown, V>() ==
                 accelerator_has_teardown);
  STATIC_REQUIRE(fulgur::detail::first_missing_accelerator_requirement<accelerators::NoStringParse, V>() ==
                 accelerator_has_parse_devices);
  STATIC_REQUIRE(fulgur::detail::first_missing_accelerator_requirement<accelerators::NotDefaultConstructible, V>() ==
                 accelerator_is_value_type);
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
  Batch convert_input(const Batch& b) { return b; }
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
struct ConvertsTensorsOnly : Precision {  // the loops convert a whole batch too
  Batch convert_input(const Batch&) = delete;
  using Precision::convert_input;
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
  STATIC_REQUIRE_FALSE(fulgur::precision_for<precisions::ConvertsTensorsOnly, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_for<Accelerator, V>);
  // Each member is its own requirement, and the diagnosis names the first one missing.
  STATIC_REQUIRE(fulgur::precision_has_optimizer_step<precisions::NoConvertOutput, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_has_convert_output<precisions::NoConvertOutput, V>);
  STATIC_REQUIRE_FALSE(fulgur::precision_has_optimizer_step<precisions::StepReturnsVoid, V>);
  using enum fulgur::detail::precision_requirement;
  STATIC_REQUIRE(fulgur::detail::first_missing_precision_requirement<Precision, V>() == none);
  STATIC_REQUIRE(fulgur::detail::first_missing_precision_requirement<precisions::NoConvertOutput, V>() ==
                 precision_has_convert_output);
  STATIC_REQUIRE(fulgur::detail::first_missing_precision_requirement<precisions::ConvertsTensorsOnly, V>() ==
                 precision_has_convert_input);
  STATIC_REQUIRE(fulgur::detail::first_missing_precision_requirement<precisions::NoName, V>() == precision_has_name);
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
struct NoOptimizerStep : Strategy {  // the optimizer step goes strategy -> precision
  template <class P> bool optimizer_step(Optimizer&, P&) = delete;
};
struct MovesTensorsOnly : Strategy {  // the loops move whole batches
  Batch batch_to_device(const Batch&) = delete;
};
struct NoTensorInitContext : Strategy {
  template <class P> Guard tensor_init_context(P&) = delete;
};
struct NoBackwardSyncControl : Strategy {
  Guard no_backward_sync(Module&, bool) = delete;
};
// Uses a precision member outside the contract: the archetype precision refuses it.
struct NeedsPrecisionExtras : Strategy {
  template <class P>
  auto backward(const Tensor&, Module&, P& p) -> decltype(p.scaler()) { return p.scaler(); }
};
}  // namespace strategies

namespace optional_members {
// Each has a member named after an optional one, declared so that fulgur cannot call it as it does:
// without the declared table, `requires` would find no such member and fall back in silence.
struct UnscaleWithoutPrecision : Strategy {
  void unscale_gradients(Optimizer&) {}
};
struct ModuleStateOfNonConst : Strategy {
  StateDict get_module_state_dict(Module&) { return {}; }
};
struct OptimizerStateFromPath : Strategy {
  void load_optimizer_state_dict(Optimizer&, const std::string&) {}
};
struct TrainEndWithArgument : Strategy {
  void on_train_end(int) {}
};
struct RemoveCheckpointOfNothing : Strategy {
  void remove_checkpoint() {}
};
struct SupportsAcceleratorNotStatic : Strategy {
  bool supports_accelerator(std::string_view) const { return true; }
};
// Declared right: still the contract (absent members are as right as correct ones).
struct AllOptionalMembers : Strategy {
  template <class P> void unscale_gradients(Optimizer&, P&) {}
  StateDict get_module_state_dict(const Module&) { return {}; }
  void load_optimizer_state_dict(Optimizer&, const StateDict&) {}
  void on_train_end() {}
  void remove_checkpoint(const std::string&) {}
};
struct ScalerFlagNotConstant : Precision {
  static inline bool uses_scaler = true;  // a run-time flag: the loops decide at compile time
};
struct UnscalesInOptimizerReturnsVoid : Precision {
  void unscales_in_optimizer(Optimizer&) {}
};
struct ConvertsTargetsAsFunction : Precision {
  bool converts_targets() { return true; }
};
struct DtypeAsNumber : Precision {
  static constexpr int dtype = 5;  // c10::kHalf's value, not its type
};
struct DtypeNotConstant : Precision {
  static inline ScalarType dtype = ScalarType::f16;
};
struct AllOptionalPrecisionMembers : Precision {
  static constexpr bool uses_scaler = true;
  static constexpr bool converts_targets = false;
  static constexpr ScalarType dtype = ScalarType::f16;
  bool unscales_in_optimizer(Optimizer&) { return false; }
};
struct SupportsDtypeNotStatic : Accelerator {
  bool supports_dtype(const Device&, ScalarType) const { return true; }
};
struct SupportsDtypeOfName : Accelerator {
  static bool supports_dtype(const Device&, std::string_view) { return true; }
};
struct AllOptionalAcceleratorMembers : Accelerator {
  static bool supports_dtype(const Device&, ScalarType) { return true; }
};
// final: not derived from to probe, found by its member's address (one member, not an overload set).
struct SealedDtypeAsNumber final : Precision {
  static constexpr int dtype = 5;
};
struct SealedTrainEndWithArgument final : Strategy {
  void on_train_end(int) {}
};
struct SealedSupportsDtypeNotStatic final : Accelerator {
  bool supports_dtype(const Device&, ScalarType) const { return true; }
};
struct SealedAllOptionalMembers final : Strategy {
  template <class P> void unscale_gradients(Optimizer&, P&) {}
  void on_train_end() {}
};
}  // namespace optional_members

TEST_CASE("optional members: absent or right is the contract, a wrong signature is not and is named",
          "[concepts][optional]") {
  using namespace optional_members;
  using fulgur::detail::strategy_requirement;
  using fulgur::detail::precision_requirement;
  STATIC_REQUIRE(fulgur::strategy_for<AllOptionalMembers, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<UnscaleWithoutPrecision, V>);
  STATIC_REQUIRE(fulgur::detail::first_missing_strategy_requirement<UnscaleWithoutPrecision, V>() ==
                 strategy_requirement::strategy_optional_unscale_gradients);
  STATIC_REQUIRE(fulgur::detail::first_missing_strategy_requirement<ModuleStateOfNonConst, V>() ==
                 strategy_requirement::strategy_optional_get_module_state_dict);
  STATIC_REQUIRE(fulgur::detail::first_missing_strategy_requirement<OptimizerStateFromPath, V>() ==
                 strategy_requirement::strategy_optional_load_optimizer_state_dict);
  STATIC_REQUIRE(fulgur::detail::first_missing_strategy_requirement<TrainEndWithArgument, V>() ==
                 strategy_requirement::strategy_optional_on_train_end);
  STATIC_REQUIRE(fulgur::detail::first_missing_strategy_requirement<RemoveCheckpointOfNothing, V>() ==
                 strategy_requirement::strategy_optional_remove_checkpoint);
  STATIC_REQUIRE(fulgur::detail::first_missing_strategy_requirement<SupportsAcceleratorNotStatic, V>() ==
                 strategy_requirement::strategy_optional_supports_accelerator);
  STATIC_REQUIRE(fulgur::precision_for<AllOptionalPrecisionMembers, V>);
  STATIC_REQUIRE(fulgur::detail::first_missing_precision_requirement<ScalerFlagNotConstant, V>() ==
                 precision_requirement::precision_optional_uses_scaler);
  STATIC_REQUIRE(fulgur::detail::first_missing_precision_requirement<UnscalesInOptimizerReturnsVoid, V>() ==
                 precision_requirement::precision_optional_unscales_in_optimizer);
  STATIC_REQUIRE(fulgur::detail::first_missing_precision_requirement<ConvertsTargetsAsFunction, V>() ==
                 precision_requirement::precision_optional_converts_targets);
  STATIC_REQUIRE(fulgur::detail::first_missing_precision_requirement<DtypeAsNumber, V>() ==
                 precision_requirement::precision_optional_dtype);
  STATIC_REQUIRE(fulgur::detail::first_missing_precision_requirement<DtypeNotConstant, V>() ==
                 precision_requirement::precision_optional_dtype);
  using fulgur::detail::accelerator_requirement;
  STATIC_REQUIRE(fulgur::accelerator_for<AllOptionalAcceleratorMembers, V>);
  STATIC_REQUIRE(fulgur::detail::first_missing_accelerator_requirement<SupportsDtypeNotStatic, V>() ==
                 accelerator_requirement::accelerator_optional_supports_dtype);
  STATIC_REQUIRE(fulgur::detail::first_missing_accelerator_requirement<SupportsDtypeOfName, V>() ==
                 accelerator_requirement::accelerator_optional_supports_dtype);
}

TEST_CASE("optional members: a final policy's wrong one is named too", "[concepts][optional]") {
  using namespace optional_members;
  STATIC_REQUIRE(fulgur::detail::first_missing_precision_requirement<SealedDtypeAsNumber, V>() ==
                 fulgur::detail::precision_requirement::precision_optional_dtype);
  STATIC_REQUIRE(fulgur::detail::first_missing_strategy_requirement<SealedTrainEndWithArgument, V>() ==
                 fulgur::detail::strategy_requirement::strategy_optional_on_train_end);
  STATIC_REQUIRE(fulgur::detail::first_missing_accelerator_requirement<SealedSupportsDtypeNotStatic, V>() ==
                 fulgur::detail::accelerator_requirement::accelerator_optional_supports_dtype);
  STATIC_REQUIRE(fulgur::strategy_for<SealedAllOptionalMembers, V>);  // a template: not seen, taken at its word
}

TEST_CASE("strategy: the stub satisfies the contract, each near miss does not", "[concepts][strategy]") {
  STATIC_REQUIRE(fulgur::strategy_for<Strategy, V>);
  STATIC_REQUIRE(fulgur::strategy_for<ShardingStrategy, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::NoBarrier, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::AllReduceWithoutOp, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::BackwardIgnoresPrecision, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::RankIsBool, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::NoCheckpointLoad, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::NeedsPrecisionExtras, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::NoOptimizerStep, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::MovesTensorsOnly, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::NoTensorInitContext, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<strategies::NoBackwardSyncControl, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_for<Precision, V>);
  STATIC_REQUIRE(fulgur::strategy_has_ranks<strategies::NoBarrier, V>);
  STATIC_REQUIRE_FALSE(fulgur::strategy_has_barrier<strategies::NoBarrier, V>);
  using enum fulgur::detail::strategy_requirement;
  constexpr auto first_missing = []<class S>(S*) { return fulgur::detail::first_missing_strategy_requirement<S, V>(); };
  STATIC_REQUIRE(first_missing(static_cast<Strategy*>(nullptr)) == none);
  STATIC_REQUIRE(first_missing(static_cast<strategies::NoBarrier*>(nullptr)) == strategy_has_barrier);
  STATIC_REQUIRE(first_missing(static_cast<strategies::NoOptimizerStep*>(nullptr)) == strategy_has_optimizer_step);
  STATIC_REQUIRE(first_missing(static_cast<strategies::MovesTensorsOnly*>(nullptr)) == strategy_has_batch_to_device);
  STATIC_REQUIRE(first_missing(static_cast<strategies::NoTensorInitContext*>(nullptr)) == strategy_has_tensor_init_context);
  STATIC_REQUIRE(first_missing(static_cast<strategies::NoBackwardSyncControl*>(nullptr)) == strategy_has_no_backward_sync);
  STATIC_REQUIRE(first_missing(static_cast<strategies::NeedsPrecisionExtras*>(nullptr)) == strategy_has_backward);
  STATIC_REQUIRE(first_missing(static_cast<Precision*>(nullptr)) == strategy_has_setup_environment);
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
struct ReturnsMemberReference : Module {  // fit refuses it with its own message (it takes ownership)
  Tensor training_step(const Batch&, std::int64_t) { return {}; }
  std::unique_ptr<Optimizer>& configure_optimizers() { return optimizer; }
  std::unique_ptr<Optimizer> optimizer;
};
struct OtherBatch {};
struct WithValidation : Good {
  Tensor validation_step(const Batch&, std::int64_t) { return {}; }
};
// Manual optimization: training_step may return nothing; configure_optimizers may return several.
struct OptimizerConfigs {
  OptimizerConfigLike& front();
  std::size_t size() const;
};
struct Manual : Module {
  static constexpr bool automatic_optimization = false;
  void training_step(const Batch&, std::int64_t, fulgur::StepContext&) {}
  OptimizerConfigs configure_optimizers() { return {}; }
};
struct AutomaticReturningNothing : Module {
  void training_step(const Batch&, std::int64_t) {}
  std::unique_ptr<Optimizer> configure_optimizers() { return nullptr; }
};
struct ManualAsDataMember : Module {  // must be a compile-time constant to pick the loop
  bool automatic_optimization = false;
};
struct ManualStepAsDataMember : Module {
  bool automatic_optimization = false;
  void training_step(const Batch&, std::int64_t) {}
  std::unique_ptr<Optimizer> configure_optimizers() { return nullptr; }
};
struct NoConfigureOptimizers : Module {
  Tensor training_step(const Batch&, std::int64_t) { return {}; }
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
  STATIC_REQUIRE(fulgur::training_module_for<modules::ReturnsMemberReference, Batch, V>);
  STATIC_REQUIRE(fulgur::detail::configure_optimizers_returns_reference<modules::ReturnsMemberReference>);
  STATIC_REQUIRE_FALSE(fulgur::detail::configure_optimizers_returns_reference<modules::Good>);
  STATIC_REQUIRE_FALSE(fulgur::detail::configure_optimizers_returns_reference<modules::NotAModule>);
  STATIC_REQUIRE_FALSE(fulgur::training_module_for<modules::Good, modules::OtherBatch, V>);
  STATIC_REQUIRE(fulgur::training_module_for<modules::Manual, Batch, V>);
  STATIC_REQUIRE_FALSE(fulgur::training_module_for<modules::AutomaticReturningNothing, Batch, V>);
  STATIC_REQUIRE_FALSE(fulgur::detail::automatic_optimization_of<modules::Manual>());
  STATIC_REQUIRE(fulgur::detail::automatic_optimization_of<modules::Good>());
  STATIC_REQUIRE(fulgur::detail::declares_automatic_optimization<modules::ManualAsDataMember>);
  STATIC_REQUIRE_FALSE(fulgur::detail::declares_constant_automatic_optimization<modules::ManualAsDataMember>);
  STATIC_REQUIRE(fulgur::detail::has_validation_step_for<modules::WithValidation, Batch, V>);
  STATIC_REQUIRE_FALSE(fulgur::detail::has_validation_step_for<modules::Good, Batch, V>);
}

TEST_CASE("training_module: the requirement a module misses first, for fit's and evaluation's one error",
          "[concepts][module]") {
  using modules::Batch;
  using Missing = fulgur::detail::training_module_requirement;
  constexpr auto first = []<class M, class B = Batch>(M*, B* = nullptr) {
    return fulgur::detail::first_missing_training_module_requirement<M, fulgur::detail::module_vocabulary<V, B>>();
  };
  STATIC_REQUIRE(first(static_cast<modules::Good*>(nullptr)) == Missing::none);
  STATIC_REQUIRE(first(static_cast<modules::Manual*>(nullptr)) == Missing::none);
  STATIC_REQUIRE(first(static_cast<modules::ReturnsMemberReference*>(nullptr)) == Missing::none);  // fit's own error
  STATIC_REQUIRE(first(static_cast<modules::NotAModule*>(nullptr)) == Missing::module_is_torch_module);
  STATIC_REQUIRE(first(static_cast<modules::MisspeltStep*>(nullptr)) == Missing::module_has_training_step);
  STATIC_REQUIRE(first(static_cast<modules::NoBatchIdx*>(nullptr)) == Missing::module_has_training_step);
  STATIC_REQUIRE(first(static_cast<modules::ManualStepAsDataMember*>(nullptr)) ==
                 Missing::module_declares_automatic_optimization_constant);
  STATIC_REQUIRE(first(static_cast<modules::ReturnsInt*>(nullptr)) == Missing::module_training_step_returns_loss);
  STATIC_REQUIRE(first(static_cast<modules::AutomaticReturningNothing*>(nullptr)) ==
                 Missing::module_training_step_returns_loss);
  STATIC_REQUIRE(first(static_cast<modules::NoConfigureOptimizers*>(nullptr)) == Missing::module_has_configure_optimizers);
  STATIC_REQUIRE(first(static_cast<modules::RawOptimizerPointer*>(nullptr)) ==
                 Missing::module_configure_optimizers_returns_optimizers);
  // For the vocabulary's own batch type (fulgur::data::Batch, a TensorLoader's), the message that names it.
  STATIC_REQUIRE(first(static_cast<modules::Good*>(nullptr), static_cast<stub::Batch*>(nullptr)) ==
                 Missing::module_has_training_step_for_batch);
  STATIC_REQUIRE(first(static_cast<modules::Good*>(nullptr), static_cast<modules::OtherBatch*>(nullptr)) ==
                 Missing::module_has_training_step);
  STATIC_REQUIRE(fulgur::assert_training_module<modules::Good, Batch, V>());

  using Step = fulgur::detail::evaluation_step_requirement;
  constexpr auto step = []<fulgur::Stage S, class M>(std::integral_constant<fulgur::Stage, S>, M*) {
    return fulgur::detail::first_missing_evaluation_step_requirement<M, fulgur::detail::module_vocabulary<V, Batch, S>>();
  };
  using validate = std::integral_constant<fulgur::Stage, fulgur::Stage::validate>;
  using test = std::integral_constant<fulgur::Stage, fulgur::Stage::test>;
  using predict = std::integral_constant<fulgur::Stage, fulgur::Stage::predict>;
  STATIC_REQUIRE(step(validate{}, static_cast<modules::WithValidation*>(nullptr)) == Step::none);
  STATIC_REQUIRE(step(validate{}, static_cast<modules::Good*>(nullptr)) == Step::module_has_validation_step_to_validate);
  STATIC_REQUIRE(step(test{}, static_cast<modules::WithValidation*>(nullptr)) == Step::module_has_test_step_to_test);
  STATIC_REQUIRE(step(predict{}, static_cast<modules::WithValidation*>(nullptr)) ==
                 Step::module_has_predict_step_to_predict);
  STATIC_REQUIRE(step(test{}, static_cast<modules::NotAModule*>(nullptr)) == Step::module_is_torch_module);
}

namespace callback_probe {
struct View;  // stands for fulgur::TrainerView: the probe looks at names, not signatures
struct OneHook {
  void on_fit_start(View&) {}
};
struct TemplateHook {
  template <class... A>
  void on_train_batch_end(A&&...) {}
};
struct OverloadedHook {
  void setup(View&) {}
  void setup(View&, int) {}
};
struct DataMemberHook {
  int on_train_end = 0;  // e.g. a std::function member (LambdaCallback)
};
struct Misspelt {
  void on_train_epoch_ends(View&) {}
  void on_fit_begin() {}
};
struct Empty {};
struct Logger {
  void log_metrics(int, long) {}
};
struct Monitoring {
  static constexpr bool monitoring = true;
  void on_train_epoch_end() {}
};
struct Sealed final {
  void on_fit_start() {}
};
struct SealedLogger final {
  void log_metrics(int, long) {}
};
}  // namespace callback_probe

TEST_CASE("callback: a type is one when a member bears a hook's name, a misspelt one is not", "[concepts][callback]") {
  using namespace callback_probe;
  STATIC_REQUIRE(fulgur::callback<OneHook>);
  STATIC_REQUIRE(fulgur::callback<TemplateHook>);
  STATIC_REQUIRE(fulgur::callback<OverloadedHook>);
  STATIC_REQUIRE(fulgur::callback<DataMemberHook>);
  STATIC_REQUIRE(fulgur::callback<Logger>);
  STATIC_REQUIRE(fulgur::logger<Logger>);
  STATIC_REQUIRE_FALSE(fulgur::logger<OneHook>);
  STATIC_REQUIRE_FALSE(fulgur::callback<Misspelt>);
  STATIC_REQUIRE_FALSE(fulgur::callback<Empty>);
  STATIC_REQUIRE_FALSE(fulgur::callback<int>);
  STATIC_REQUIRE(fulgur::callback<std::vector<OneHook>>);
  STATIC_REQUIRE(fulgur::callback<Sealed>);  // final: taken at its word
  STATIC_REQUIRE(fulgur::logger<SealedLogger>);  // final: found by the member's address
  STATIC_REQUIRE(fulgur::monitoring_callback<Monitoring>());
  STATIC_REQUIRE_FALSE(fulgur::monitoring_callback<OneHook>());
}
