#pragma once
// fulgur::training_module — the user's model: a torch::nn::Module subclass with
// training_step(batch, batch_idx) and configure_optimizers(). Optional steps and hooks are
// detected with `requires` (hooks.hpp). Torch-free.
//
// Under automatic optimization (the default) training_step returns the loss (a tensor, or a
// struct with a `loss` member). A module that declares `static constexpr bool
// automatic_optimization = false;` steps its optimizers itself (StepContext::optimizers,
// manual_backward), and its training_step may return anything, or nothing.
#include <concepts>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "fulgur/concepts/vocabulary.hpp"

namespace fulgur {

class StepContext;  // logging and loop position handed to steps that ask for it

/// A step returns the loss tensor, or a struct whose `loss` member is one.
template <class R, class V>
concept step_output_for = std::convertible_to<R, typename V::tensor> || requires(const R& r) {
  { r.loss } -> std::convertible_to<typename V::tensor>;
};

/// configure_optimizers returns a std::unique_ptr<Optimizer>, a fulgur::OptimizerConfig (anything
/// with an `optimizer` member that is one), or a std::vector of OptimizerConfig. Returned by
/// reference it still qualifies here; fit then refuses it on its own (it takes ownership, see
/// configure_optimizers_returns_reference), so the error says that and nothing else.
template <class R, class V>
concept optimizer_configuration_for =
    std::convertible_to<std::remove_cvref_t<R>, std::unique_ptr<typename V::optimizer>> ||
    requires(R& r) {
      { std::move(r.optimizer) } -> std::convertible_to<std::unique_ptr<typename V::optimizer>>;
    } ||
    requires(R& r) {
      r.size();
      { std::move(r.front().optimizer) } -> std::convertible_to<std::unique_ptr<typename V::optimizer>>;
    };

namespace detail {

/// Whether the module leaves optimization to fulgur (Lightning's automatic_optimization).
template <class M>
concept declares_automatic_optimization = requires { M::automatic_optimization; };
template <class M>
concept declares_constant_automatic_optimization =
    requires { typename std::bool_constant<static_cast<bool>(M::automatic_optimization)>; };
template <class M>
consteval bool automatic_optimization_of() {
  if constexpr (declares_constant_automatic_optimization<M>)
    return M::automatic_optimization;
  else
    return true;
}

/// configure_optimizers() hands back a reference (to a member, most likely): fit would have to
/// move the optimizers out from under the module, so it asks for them by value instead.
template <class M>
concept configure_optimizers_returns_reference =
    requires(M& m) { m.configure_optimizers(); } &&
    std::is_reference_v<decltype(std::declval<M&>().configure_optimizers())>;

// A step may be written (batch, batch_idx) or (batch, batch_idx, StepContext&).
#define FULGUR_DETAIL_STEP_CONCEPTS(step)                                                             \
  template <class M, class B, class V>                                                                \
  concept has_##step##_for = requires(M& m, const B& batch, std::int64_t batch_idx) {                 \
    m.step(batch, batch_idx);                                                                         \
  } || requires(M& m, const B& batch, std::int64_t batch_idx, StepContext& ctx) {                     \
    m.step(batch, batch_idx, ctx);                                                                    \
  };                                                                                                  \
  template <class M, class B, class V>                                                                \
  concept step##_returns_loss_for = requires(M& m, const B& batch, std::int64_t batch_idx) {          \
    { m.step(batch, batch_idx) } -> step_output_for<V>;                                               \
  } || requires(M& m, const B& batch, std::int64_t batch_idx, StepContext& ctx) {                     \
    { m.step(batch, batch_idx, ctx) } -> step_output_for<V>;                                          \
  };
FULGUR_DETAIL_STEP_CONCEPTS(training_step)
FULGUR_DETAIL_STEP_CONCEPTS(validation_step)
FULGUR_DETAIL_STEP_CONCEPTS(test_step)
FULGUR_DETAIL_STEP_CONCEPTS(predict_step)
#undef FULGUR_DETAIL_STEP_CONCEPTS
}  // namespace detail

template <class M, class Batch, class V>
concept training_module_for =
    std::derived_from<M, typename V::module> && detail::has_training_step_for<M, Batch, V> &&
    (!detail::automatic_optimization_of<M>() || detail::training_step_returns_loss_for<M, Batch, V>) &&
    requires(M& m) {
      { m.configure_optimizers() } -> optimizer_configuration_for<V>;
    };

/// The user's module, trained on batches of type Batch (fulgur::data::Batch by default).
namespace data { struct Batch; }
template <class M, class Batch = data::Batch>
concept training_module = training_module_for<M, Batch, torch_vocabulary>;

template <class M, class Batch = data::Batch>
concept has_validation_step = detail::has_validation_step_for<M, Batch, torch_vocabulary>;
template <class M, class Batch = data::Batch>
concept has_test_step = detail::has_test_step_for<M, Batch, torch_vocabulary>;
template <class M, class Batch = data::Batch>
concept has_predict_step = detail::has_predict_step_for<M, Batch, torch_vocabulary>;

}  // namespace fulgur
