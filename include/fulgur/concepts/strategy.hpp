#pragma once
// fulgur::strategy — how work is spread over devices and processes. Mirrors Lightning Fabric's
// Strategy (and PL 1.3's TrainingTypePlugin). Members that need the precision or accelerator
// policy take it as an argument: policies never reach into each other or into the trainer.
// Torch-free.
#include <concepts>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/concepts/accelerator.hpp"
#include "fulgur/concepts/archetypes.hpp"
#include "fulgur/concepts/vocabulary.hpp"

namespace fulgur {

template <class S, class V>
concept strategy_setup_for = requires(S& s, typename V::module& module, typename V::optimizer& optimizer,
                                      archetypes::accelerator<V>& accelerator,
                                      archetypes::precision<V>& precision,
                                      std::vector<typename V::optimizer*>& optimizers) {
  s.setup_environment(accelerator);
  s.setup_module(module);
  s.setup_optimizer(optimizer);
  s.setup_module_and_optimizers(module, optimizers);
  s.module_to_device(module);
  s.module_init_context(precision, /*empty_init=*/false);
  s.teardown();
};

template <class S, class V>
concept strategy_data_for = requires(S& s, const typename V::tensor& batch,
                                     std::vector<typename V::tensor>& loader) {
  { s.batch_to_device(batch) } -> std::convertible_to<typename V::tensor>;
  s.process_dataloader(loader);
};

template <class S, class V>
concept strategy_step_for = requires(S& s, const typename V::tensor& loss, typename V::module& module,
                                     typename V::optimizer& optimizer,
                                     archetypes::precision<V>& precision) {
  s.backward(loss, module, precision);
  { s.clip_gradients_norm(module, optimizer, 1.0, 2.0, true, precision) }
      -> std::convertible_to<typename V::tensor>;
  s.clip_gradients_value(module, optimizer, 1.0, precision);
};

template <class S, class V>
concept strategy_collectives_for = requires(S& s, const typename V::tensor& t, std::string_view name) {
  { s.all_reduce(t, ReduceOp::mean) } -> std::convertible_to<typename V::tensor>;
  { s.all_gather(t) } -> std::convertible_to<typename V::tensor>;
  { s.broadcast(t, 0) } -> std::convertible_to<typename V::tensor>;
  s.barrier(name);
  { s.reduce_boolean_decision(true, /*all=*/true) } -> std::same_as<bool>;
};

template <class S, class V>
concept strategy_state_for =
    requires(S& s, typename V::module& module, typename V::optimizer& optimizer, const std::string& path,
             const typename V::state_dict& state) {
      s.get_optimizer_state(optimizer);
      s.save_checkpoint(path, state);
      { s.load_checkpoint(path) } -> std::convertible_to<typename V::state_dict>;
      s.load_module_state_dict(module, state, /*strict=*/true);
    };

template <class S, class V>
concept strategy_topology_for = requires(const S& s) {
  { s.root_device() } -> std::convertible_to<typename V::device>;
  { s.is_global_zero() } -> std::same_as<bool>;
  { s.global_rank() } -> std::convertible_to<int>;
  { s.local_rank() } -> std::convertible_to<int>;
  { s.world_size() } -> std::convertible_to<int>;
};

template <class S, class V>
concept strategy_for = std::movable<S> && detail::has_policy_name<S> && strategy_setup_for<S, V> &&
                       strategy_data_for<S, V> && strategy_step_for<S, V> &&
                       strategy_collectives_for<S, V> && strategy_state_for<S, V> &&
                       strategy_topology_for<S, V>;

/// A strategy policy over LibTorch's types.
template <class S>
concept strategy = strategy_for<S, torch_vocabulary>;

}  // namespace fulgur
