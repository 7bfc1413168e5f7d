#pragma once
// fulgur::training_module — the user's model: a torch::nn::Module subclass with
// training_step(batch, batch_idx) and configure_optimizers(). Optional steps and hooks are
// detected with `requires` (see the has_* concepts below). Torch-free.
#include <concepts>
#include <cstdint>
#include <memory>

#include "fulgur/concepts/vocabulary.hpp"

namespace fulgur {

class StepContext;  // logging and loop position handed to steps that ask for it

/// A step returns the loss tensor, or a struct whose `loss` member is one.
template <class R, class V>
concept step_output_for = std::convertible_to<R, typename V::tensor> || requires(const R& r) {
  { r.loss } -> std::convertible_to<typename V::tensor>;
};

/// configure_optimizers returns a std::unique_ptr<Optimizer> or a fulgur::OptimizerConfig
/// (anything with an `optimizer` member that is one).
template <class R, class V>
concept optimizer_configuration_for =
    std::convertible_to<R, std::unique_ptr<typename V::optimizer>> || requires(R& r) {
      { std::move(r.optimizer) } -> std::convertible_to<std::unique_ptr<typename V::optimizer>>;
    };

namespace detail {
// A step may be written (batch, batch_idx) or (batch, batch_idx, StepContext&).
#define FULGUR_DETAIL_STEP_CONCEPT(step)                                                         \
  template <class M, class B, class V>                                                           \
  concept has_##step##_for =                                                                     \
      requires(M& m, const B& batch, std::int64_t batch_idx) {                                   \
        { m.step(batch, batch_idx) } -> step_output_for<V>;                                      \
      } || requires(M& m, const B& batch, std::int64_t batch_idx, StepContext& ctx) {            \
        { m.step(batch, batch_idx, ctx) } -> step_output_for<V>;                                 \
      };
FULGUR_DETAIL_STEP_CONCEPT(training_step)
FULGUR_DETAIL_STEP_CONCEPT(validation_step)
FULGUR_DETAIL_STEP_CONCEPT(test_step)
#undef FULGUR_DETAIL_STEP_CONCEPT
}  // namespace detail

template <class M, class Batch, class V>
concept training_module_for =
    std::derived_from<M, typename V::module> && detail::has_training_step_for<M, Batch, V> &&
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

}  // namespace fulgur
