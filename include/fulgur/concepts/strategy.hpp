#pragma once
// fulgur::strategy — how work is spread over devices and processes. Mirrors Lightning Fabric's
// Strategy (and PL 1.3's TrainingTypePlugin). Members that need the precision or accelerator
// policy take it as an argument: policies never reach into each other or into the trainer.
// The optimizer step goes strategy -> precision (optimizer_step returns whether it ran), so a
// sharding strategy owns it. Torch-free.
//
// The requirements are what the loops call, with the arguments they pass: batch_to_device gets
// a tensor and a fulgur::data::Batch, process_dataloader a fulgur::data::TensorLoader, and every
// member that takes a policy takes it as a template parameter (checked with the archetypes, so
// a strategy may use only what the precision and accelerator contracts promise).
#include <concepts>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/concepts/archetypes.hpp"
#include "fulgur/concepts/requirements.hpp"
#include "fulgur/concepts/vocabulary.hpp"

namespace fulgur {

template <class S, class V>
concept strategy_is_value_type = std::movable<S>;
template <class S, class V>
concept strategy_has_name = detail::has_policy_name<S>;
template <class S, class V>
concept strategy_has_setup_environment =
    requires(S& s, archetypes::accelerator<V>& accelerator, const typename V::parallel_devices& devices) {
      s.setup_environment(accelerator, devices);
    };
template <class S, class V>
concept strategy_has_setup_module = requires(S& s, typename V::module& module) { s.setup_module(module); };
template <class S, class V>
concept strategy_has_setup_optimizer = requires(S& s, typename V::optimizer& optimizer) { s.setup_optimizer(optimizer); };
template <class S, class V>
concept strategy_has_setup_module_and_optimizers =
    requires(S& s, typename V::module& module, std::span<typename V::optimizer* const> optimizers) {
      s.setup_module_and_optimizers(module, optimizers);
    };
template <class S, class V>
concept strategy_has_module_to_device = requires(S& s, typename V::module& module) { s.module_to_device(module); };
template <class S, class V>
concept strategy_has_module_init_context = requires(S& s, archetypes::precision<V>& precision) {
  s.module_init_context(precision, /*empty_init=*/false);
};
template <class S, class V>
concept strategy_has_tensor_init_context = requires(S& s, archetypes::precision<V>& precision) {
  s.tensor_init_context(precision);
};
template <class S, class V>
concept strategy_has_batch_to_device = requires(S& s, const typename V::tensor& t, const typename V::batch& batch) {
  { s.batch_to_device(t) } -> std::convertible_to<typename V::tensor>;
  { s.batch_to_device(batch) } -> std::convertible_to<typename V::batch>;
};
template <class S, class V>
concept strategy_has_process_dataloader = requires(S& s, typename V::loader& loader) { s.process_dataloader(loader); };
template <class S, class V>
concept strategy_has_backward = requires(S& s, const typename V::tensor& loss, typename V::module& module,
                                         archetypes::precision<V>& precision) {
  s.backward(loss, module, precision);
};
template <class S, class V>
concept strategy_has_optimizer_step = requires(S& s, typename V::optimizer& optimizer,
                                               archetypes::precision<V>& precision) {
  { s.optimizer_step(optimizer, precision) } -> std::same_as<bool>;  // false: the step was skipped
};
template <class S, class V>
concept strategy_has_clip_gradients = requires(S& s, typename V::module& module, typename V::optimizer& optimizer,
                                               archetypes::precision<V>& precision) {
  { s.clip_gradients_norm(module, optimizer, 1.0, 2.0, true, precision) } -> std::convertible_to<typename V::tensor>;
  s.clip_gradients_value(module, optimizer, 1.0, precision);
};
template <class S, class V>
concept strategy_has_no_backward_sync = requires(S& s, typename V::module& module) {
  s.no_backward_sync(module, /*enabled=*/true);  // a guard: backward skips communication while it lives
};
template <class S, class V>
concept strategy_has_all_reduce = requires(S& s, const typename V::tensor& t) {
  { s.all_reduce(t, ReduceOp::mean) } -> std::convertible_to<typename V::tensor>;
};
template <class S, class V>
concept strategy_has_all_gather = requires(S& s, const typename V::tensor& t) {
  { s.all_gather(t) } -> std::convertible_to<typename V::tensor>;
};
template <class S, class V>
concept strategy_has_broadcast = requires(S& s, const typename V::tensor& t) {
  { s.broadcast(t, 0) } -> std::convertible_to<typename V::tensor>;
};
template <class S, class V>
concept strategy_has_barrier = requires(S& s, std::string_view name) { s.barrier(name); };
template <class S, class V>
concept strategy_has_reduce_boolean_decision = requires(S& s) {
  { s.reduce_boolean_decision(true, /*all=*/true) } -> std::same_as<bool>;
};
template <class S, class V>
concept strategy_has_checkpoint_io = requires(S& s, typename V::module& module, typename V::optimizer& optimizer,
                                              const std::string& path, const typename V::state_dict& state) {
  s.get_optimizer_state(optimizer);
  s.save_checkpoint(path, state);
  { s.load_checkpoint(path) } -> std::convertible_to<typename V::state_dict>;
  s.load_module_state_dict(module, state, /*strict=*/true);
};
template <class S, class V>
concept strategy_has_root_device = requires(const S& s) {
  { s.root_device() } -> std::convertible_to<typename V::device>;
};
template <class S, class V>
concept strategy_has_ranks = requires(const S& s) {
  { s.is_global_zero() } -> std::same_as<bool>;
  { s.global_rank() } -> std::convertible_to<int>;
  { s.local_rank() } -> std::convertible_to<int>;
  { s.world_size() } -> std::convertible_to<int>;
};
template <class S, class V>
concept strategy_has_teardown = requires(S& s) { s.teardown(); };

// clang-format off
#define FULGUR_STRATEGY_REQUIREMENTS(R)                                                                       \
  R(strategy_is_value_type, "a move constructor")                                                              \
  R(strategy_has_name, "static constexpr std::string_view name")                                              \
  R(strategy_has_setup_environment, "void setup_environment(Accelerator&, const fulgur::ParallelDevices&)")   \
  R(strategy_has_setup_module, "void setup_module(torch::nn::Module&)")                                       \
  R(strategy_has_setup_optimizer, "void setup_optimizer(torch::optim::Optimizer&)")                           \
  R(strategy_has_setup_module_and_optimizers,                                                                 \
    "void setup_module_and_optimizers(torch::nn::Module&, std::span<torch::optim::Optimizer* const>)")        \
  R(strategy_has_module_to_device, "void module_to_device(torch::nn::Module&)")                               \
  R(strategy_has_module_init_context, "Guard module_init_context(Precision&, bool empty_init)")               \
  R(strategy_has_tensor_init_context, "Guard tensor_init_context(Precision&)")                                \
  R(strategy_has_batch_to_device, "Batch batch_to_device(const Batch&) for at::Tensor and fulgur::data::Batch") \
  R(strategy_has_process_dataloader, "Loader process_dataloader(Loader&&)")                                   \
  R(strategy_has_backward, "void backward(const at::Tensor& loss, torch::nn::Module&, Precision&)")           \
  R(strategy_has_optimizer_step, "bool optimizer_step(torch::optim::Optimizer&, Precision&)")                 \
  R(strategy_has_clip_gradients, "at::Tensor clip_gradients_norm(torch::nn::Module&, torch::optim::Optimizer&, "  \
    "double max_norm, double norm_type, bool error_if_nonfinite, Precision&) and void clip_gradients_value("    \
    "torch::nn::Module&, torch::optim::Optimizer&, double clip_val, Precision&)")                              \
  R(strategy_has_no_backward_sync, "Guard no_backward_sync(torch::nn::Module&, bool enabled)")                \
  R(strategy_has_all_reduce, "at::Tensor all_reduce(const at::Tensor&, fulgur::ReduceOp)")                    \
  R(strategy_has_all_gather, "at::Tensor all_gather(const at::Tensor&)")                                      \
  R(strategy_has_broadcast, "at::Tensor broadcast(const at::Tensor&, int src)")                               \
  R(strategy_has_barrier, "void barrier(std::string_view name)")                                              \
  R(strategy_has_reduce_boolean_decision, "bool reduce_boolean_decision(bool decision, bool all)")            \
  R(strategy_has_checkpoint_io, "get_optimizer_state, save_checkpoint, load_checkpoint and load_module_state_dict") \
  R(strategy_has_root_device, "c10::Device root_device() const")                                             \
  R(strategy_has_ranks, "bool is_global_zero() const, int global_rank() const, int local_rank() const and "   \
    "int world_size() const")                                                                                  \
  R(strategy_has_teardown, "void teardown()")
// clang-format on

// ---- optional members: absent, or callable as fulgur calls them --------------------------------------
namespace detail::strategy_members {
FULGUR_DETAIL_MEMBER_PROBE(unscale_gradients)
FULGUR_DETAIL_MEMBER_PROBE(get_module_state_dict)
FULGUR_DETAIL_MEMBER_PROBE(load_optimizer_state_dict)
FULGUR_DETAIL_MEMBER_PROBE(on_train_end)
FULGUR_DETAIL_MEMBER_PROBE(remove_checkpoint)
FULGUR_DETAIL_MEMBER_PROBE(supports_accelerator)
FULGUR_DETAIL_MEMBER_PROBE(supports_precision)
}  // namespace detail::strategy_members

/// A strategy whose optimizer holds other gradients than the module's (sharded stage 2) unscales them.
template <class S, class V>
concept strategy_optional_unscale_gradients =
    !detail::strategy_members::has_member_unscale_gradients<S>() ||
    requires(S& s, typename V::optimizer& optimizer, archetypes::precision<V>& precision) {
      s.unscale_gradients(optimizer, precision);
    };
/// A strategy that keeps the weights in its own form (sharded stage 3) gives their state.
template <class S, class V>
concept strategy_optional_get_module_state_dict =
    !detail::strategy_members::has_member_get_module_state_dict<S>() || requires(S& s, const typename V::module& module) {
      { s.get_module_state_dict(module) } -> std::convertible_to<typename V::state_dict>;
    };
/// ... and takes an optimizer state in that form.
template <class S, class V>
concept strategy_optional_load_optimizer_state_dict =
    !detail::strategy_members::has_member_load_optimizer_state_dict<S>() ||
    requires(S& s, typename V::optimizer& optimizer, const typename V::state_dict& state) {
      s.load_optimizer_state_dict(optimizer, state);
    };
/// Lightning's Strategy.on_train_end (sharded stage 3 gathers the module whole).
template <class S, class V>
concept strategy_optional_on_train_end =
    !detail::strategy_members::has_member_on_train_end<S>() || requires(S& s) { s.on_train_end(); };
/// Deletes a checkpoint in the strategy's format (default: the file, and what a Format keeps beside it).
template <class S, class V>
concept strategy_optional_remove_checkpoint =
    !detail::strategy_members::has_member_remove_checkpoint<S>() ||
    requires(S& s, const std::string& path) { s.remove_checkpoint(path); };
/// Compatibility rules (compatibility.hpp): which accelerators and precisions it takes.
template <class S, class V>
concept strategy_optional_supports_accelerator =
    !detail::strategy_members::has_member_supports_accelerator<S>() || requires(std::string_view name) {
      { S::supports_accelerator(name) } -> std::convertible_to<bool>;
    };
template <class S, class V>
concept strategy_optional_supports_precision =
    !detail::strategy_members::has_member_supports_precision<S>() || requires(std::string_view name) {
      { S::supports_precision(name) } -> std::convertible_to<bool>;
    };

// clang-format off
#define FULGUR_STRATEGY_OPTIONAL_MEMBERS(R)                                                                   \
  R(strategy_optional_unscale_gradients, "void unscale_gradients(torch::optim::Optimizer&, Precision&)")      \
  R(strategy_optional_get_module_state_dict, "fulgur::StateDict get_module_state_dict(const torch::nn::Module&)") \
  R(strategy_optional_load_optimizer_state_dict,                                                              \
    "void load_optimizer_state_dict(torch::optim::Optimizer&, const fulgur::StateDict&)")                      \
  R(strategy_optional_on_train_end, "void on_train_end()")                                                    \
  R(strategy_optional_remove_checkpoint, "void remove_checkpoint(const std::string& path)")                   \
  R(strategy_optional_supports_accelerator, "static constexpr bool supports_accelerator(std::string_view)")    \
  R(strategy_optional_supports_precision, "static constexpr bool supports_precision(std::string_view)")
// clang-format on

template <class T, class V>
concept strategy_for =
    true FULGUR_STRATEGY_REQUIREMENTS(FULGUR_DETAIL_ALL_OF) FULGUR_STRATEGY_OPTIONAL_MEMBERS(FULGUR_DETAIL_ALL_OF);

/// A strategy policy over LibTorch's types.
template <class S>
concept strategy = strategy_for<S, torch_vocabulary>;

namespace detail {
enum class strategy_requirement {
  FULGUR_STRATEGY_REQUIREMENTS(FULGUR_DETAIL_ENUMERATE) FULGUR_STRATEGY_OPTIONAL_MEMBERS(FULGUR_DETAIL_ENUMERATE) none
};
template <class T, class V>
consteval strategy_requirement first_missing_strategy_requirement() {
  using Missing = strategy_requirement;
  FULGUR_STRATEGY_REQUIREMENTS(FULGUR_DETAIL_FIRST_MISSING)
  FULGUR_STRATEGY_OPTIONAL_MEMBERS(FULGUR_DETAIL_FIRST_MISSING) return Missing::none;
}
}  // namespace detail

/// One static_assert naming the first member the type lacks (the others stay silent).
template <class T, class V = torch_vocabulary>
consteval bool assert_strategy() {
  using Missing = detail::strategy_requirement;
  constexpr Missing missing = detail::first_missing_strategy_requirement<T, V>();
#define FULGUR_DETAIL_LACKS "fulgur: the strategy (Trainer's second argument) lacks `"
#define FULGUR_DETAIL_REMEDY \
  "`; write it, or derive from fulgur::strategy_defaults<YourStrategy> (docs/concepts/strategy.md)."
  FULGUR_STRATEGY_REQUIREMENTS(FULGUR_DETAIL_REQUIRE)
#undef FULGUR_DETAIL_LACKS
#undef FULGUR_DETAIL_REMEDY
#define FULGUR_DETAIL_LACKS "fulgur: the strategy (Trainer's second argument) has a member named after the optional `"
#define FULGUR_DETAIL_REMEDY "`, but it cannot be called so; fix its signature (or rename it: fulgur would never call it)."
  FULGUR_STRATEGY_OPTIONAL_MEMBERS(FULGUR_DETAIL_REQUIRE)
#undef FULGUR_DETAIL_LACKS
#undef FULGUR_DETAIL_REMEDY
  return true;  // the one error is the static_assert above; a `false` here would add a second
}

}  // namespace fulgur
