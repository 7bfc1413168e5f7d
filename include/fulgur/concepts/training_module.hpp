#pragma once
// fulgur::training_module — the user's model: a torch::nn::Module subclass with
// training_step(batch, batch_idx) and configure_optimizers(). Optional steps and hooks are
// detected with `requires` (hooks.hpp). Torch-free.
//
// Under automatic optimization (the default) training_step returns the loss (a tensor, or a
// struct with a `loss` member). A module that declares `static constexpr bool
// automatic_optimization = false;` steps its optimizers itself (StepContext::optimizers,
// manual_backward), and its training_step may return anything, or nothing.
//
// What fit, validate, test and predict check is a table of requirements, one concept each, as the
// policy concepts have (requirements.hpp): assert_training_module and assert_evaluation_step give one
// static_assert per requirement, of which only the first the module misses fires.
#include <concepts>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "fulgur/concepts/requirements.hpp"
#include "fulgur/concepts/vocabulary.hpp"
#include "fulgur/stage.hpp"

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

// A step may be written (batch, batch_idx) or (batch, batch_idx, StepContext&); under several
// evaluation loaders (batch, batch_idx, dataloader_idx) or (batch, batch_idx, dataloader_idx, StepContext&).
#define FULGUR_DETAIL_STEP_CONCEPTS(step)                                                             \
  template <class M, class B, class V>                                                                \
  concept has_##step##_for = requires(M& m, const B& batch, std::int64_t batch_idx) {                 \
    m.step(batch, batch_idx);                                                                         \
  } || requires(M& m, const B& batch, std::int64_t batch_idx, StepContext& ctx) {                     \
    m.step(batch, batch_idx, ctx);                                                                    \
  };                                                                                                  \
  template <class M, class B>                                                                         \
  concept has_##step##_with_idx_for = requires(M& m, const B& batch, std::int64_t i) {                \
    m.step(batch, i, i);                                                                              \
  } || requires(M& m, const B& batch, std::int64_t i, StepContext& ctx) {                             \
    m.step(batch, i, i, ctx);                                                                         \
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

namespace detail {
/// The vocabulary the module requirements are checked in: V, with the batch type the data yields and
/// the stage under way (which evaluation step is needed).
template <class V, class Batch, Stage S = Stage::fit>
struct module_vocabulary : V {
  using step_batch = Batch;
  static constexpr Stage stage = S;
};
}  // namespace detail

// ---- the requirements, one concept each (T: the module; V: a detail::module_vocabulary) -----------
template <class M, class V>
concept module_is_torch_module = std::derived_from<M, typename V::module>;
/// A training_step for fulgur::data::Batch (what a TensorLoader yields), when that is the batch type.
template <class M, class V>
concept module_has_training_step_for_batch = !std::same_as<typename V::step_batch, typename V::batch> ||
                                             detail::has_training_step_for<M, typename V::step_batch, V>;
template <class M, class V>
concept module_has_training_step = detail::has_training_step_for<M, typename V::step_batch, V>;
template <class M, class V>
concept module_declares_automatic_optimization_constant =
    !detail::declares_automatic_optimization<M> || detail::declares_constant_automatic_optimization<M>;
template <class M, class V>
concept module_training_step_returns_loss =
    !detail::automatic_optimization_of<M>() || detail::training_step_returns_loss_for<M, typename V::step_batch, V>;
template <class M, class V>
concept module_has_configure_optimizers = requires(M& m) { m.configure_optimizers(); };
template <class M, class V>
concept module_configure_optimizers_returns_optimizers = requires(M& m) {
  { m.configure_optimizers() } -> optimizer_configuration_for<V>;
};
template <class M, class V>
concept module_has_validation_step_to_validate =
    V::stage != Stage::validate || detail::has_validation_step_for<M, typename V::step_batch, V>;
template <class M, class V>
concept module_has_test_step_to_test =
    V::stage != Stage::test || detail::has_test_step_for<M, typename V::step_batch, V>;
template <class M, class V>
concept module_has_predict_step_to_predict =
    V::stage != Stage::predict || detail::has_predict_step_for<M, typename V::step_batch, V>;

// clang-format off
#define FULGUR_TRAINING_MODULE_REQUIREMENTS(R)                                                                   \
  R(module_is_torch_module, "the module must derive from torch::nn::Module (struct Net : torch::nn::Module "      \
    "{...}; fit takes it as a std::shared_ptr, a TORCH_MODULE holder or a reference)")                          \
  R(module_has_training_step_for_batch, "the module has no training_step callable as (const fulgur::data::Batch&, " \
    "int64_t batch_idx) or (const fulgur::data::Batch&, int64_t batch_idx, fulgur::StepContext&), for the "       \
    "fulgur::data::Batch that train_data yields: add it (misspelt? a parameter of another type?)")               \
  R(module_has_training_step, "the module has no training_step callable as (const Batch&, int64_t batch_idx) or " \
    "(const Batch&, int64_t batch_idx, fulgur::StepContext&) for the batches of train_data (their type is the "   \
    "`Batch = ...` of this error's context): add it (misspelt? a parameter of another type?)")                  \
  R(module_declares_automatic_optimization_constant, "declare automatic_optimization as `static constexpr bool "  \
    "automatic_optimization = false;` (fulgur picks the optimization loop at compile time)")                     \
  R(module_training_step_returns_loss, "training_step returns void, or something that is not a loss, under "     \
    "automatic optimization: return the loss (a tensor, or a struct with a `loss` member), or declare `static "   \
    "constexpr bool automatic_optimization = false;` and step the optimizers in training_step yourself")         \
  R(module_has_configure_optimizers, "the module has no configure_optimizers(): define it, returning a "           \
    "std::unique_ptr<torch::optim::Optimizer> or a fulgur::OptimizerConfig (optimizer and LR scheduler)")        \
  R(module_configure_optimizers_returns_optimizers, "configure_optimizers() returns something fit cannot train "  \
    "with: return a std::unique_ptr<torch::optim::Optimizer>, a fulgur::OptimizerConfig, or a std::vector of "    \
    "OptimizerConfig (by value)")

#define FULGUR_EVALUATION_STEP_REQUIREMENTS(R)                                                                   \
  R(module_is_torch_module, "the module must derive from torch::nn::Module (struct Net : torch::nn::Module "      \
    "{...}; it is given as a std::shared_ptr, a TORCH_MODULE holder or a reference)")                           \
  R(module_has_validation_step_to_validate, "validate() needs validation_step(batch, batch_idx) (or with a third " \
    "fulgur::StepContext& parameter) in the module, for the batches of the data: add it")                       \
  R(module_has_test_step_to_test, "test() needs test_step(batch, batch_idx) (or with a third fulgur::StepContext& " \
    "parameter) in the module, for the batches of the data: add it")                                            \
  R(module_has_predict_step_to_predict, "predict() needs predict_step(batch, batch_idx) (or with a third "         \
    "fulgur::StepContext& parameter) returning the prediction, in the module, for the batches of the data: add it")
// clang-format on

namespace detail {
enum class training_module_requirement { FULGUR_TRAINING_MODULE_REQUIREMENTS(FULGUR_DETAIL_ENUMERATE) none };
template <class T, class V>
consteval training_module_requirement first_missing_training_module_requirement() {
  using Missing = training_module_requirement;
  FULGUR_TRAINING_MODULE_REQUIREMENTS(FULGUR_DETAIL_FIRST_MISSING) return Missing::none;
}
enum class evaluation_step_requirement { FULGUR_EVALUATION_STEP_REQUIREMENTS(FULGUR_DETAIL_ENUMERATE) none };
template <class T, class V>
consteval evaluation_step_requirement first_missing_evaluation_step_requirement() {
  using Missing = evaluation_step_requirement;
  FULGUR_EVALUATION_STEP_REQUIREMENTS(FULGUR_DETAIL_FIRST_MISSING) return Missing::none;
}
}  // namespace detail

#define FULGUR_DETAIL_LACKS "fulgur: "
#define FULGUR_DETAIL_REMEDY "; see docs/concepts/training_module.md."
/// What fit asks of the module it trains on batches of type Batch: one static_assert naming the first
/// requirement the module misses (the others stay silent). Returns true, so that
/// `static_assert(assert_training_module<M, Batch>())` adds no error of its own.
template <class M, class Batch, class V = torch_vocabulary>
consteval bool assert_training_module() {
  using Missing = detail::training_module_requirement;
  constexpr Missing missing = detail::first_missing_training_module_requirement<M, detail::module_vocabulary<V, Batch>>();
  FULGUR_TRAINING_MODULE_REQUIREMENTS(FULGUR_DETAIL_REQUIRE)
  return true;
}

/// What validate (Stage::validate), test (Stage::test) and predict (Stage::predict) ask of the module:
/// the one step the stage runs, named by one static_assert.
template <Stage S, class M, class Batch, class V = torch_vocabulary>
consteval bool assert_evaluation_step() {
  using Missing = detail::evaluation_step_requirement;
  constexpr Missing missing =
      detail::first_missing_evaluation_step_requirement<M, detail::module_vocabulary<V, Batch, S>>();
  FULGUR_EVALUATION_STEP_REQUIREMENTS(FULGUR_DETAIL_REQUIRE)
  return true;
}
#undef FULGUR_DETAIL_LACKS
#undef FULGUR_DETAIL_REMEDY

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
