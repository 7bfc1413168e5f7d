#pragma once
// The loop contract: what fit, validate, test and predict need from the object that runs them (their
// host: fulgur::Trainer). Two parts:
//
//  - the Fabric-level verbs (trainer.hpp documents each one): the set-up of module, optimizers and
//    loaders, the way of a batch to the step, backward, clipping, the optimizer step, the
//    collectives, the checkpoint files and the states, each going to its policy. A loop never calls
//    a policy itself: what it asks of the strategy or the precision is a verb (end_training,
//    convert_batch, uses_loss_scaler, precision_name included).
//  - the loop services (LoopServices below): the callbacks and loggers, where the last fit ended,
//    the fit under way. They are plumbing, not the host's public API: the host holds them as a
//    private member `loop_services_` and befriends host_access, through which the loops reach them.
//
// `loop_host<H>` is the contract as a concept; a type that misses a part is refused with one error
// naming it (assert_loop_host), as the policy concepts do. The loops are written against it only:
// a host other than Trainer that satisfies it runs them (tests/unit/loops_tests.cpp does so).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fulgur/concepts/requirements.hpp"
#include "fulgur/concepts/vocabulary.hpp"
#include "fulgur/data/batch.hpp"
#include "fulgur/loops/boundary.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur::loops {

class FitState;

/// Where the last fit ended: epochs run and the logging step (Lightning's current_epoch and
/// _batches_that_stepped, which validate and test after fit report at).
struct FitPosition {
  std::int64_t epoch = 0, logging_step = 0;
};

/// The loop services a host holds for its loops: its callbacks and loggers, where the last fit
/// ended, and the fit under way (kept after it ends: save_checkpoint then writes its final state).
/// It is also the host's side of the library boundary (detail::HostLink): what compiled code asks
/// of the host goes through here to the host's Fabric-level verbs.
template <class Host, class Callbacks>
class LoopServices final : public detail::HostLink {
 public:
  using callbacks_type = Callbacks;

  template <class... C>
  explicit LoopServices(Host& host, C&&... callbacks) : host_(host), callbacks_(std::forward<C>(callbacks)...) {}
  LoopServices(const LoopServices&) = delete;
  LoopServices& operator=(const LoopServices&) = delete;
  ~LoopServices() = default;

  Callbacks& callbacks() { return callbacks_; }
  const Callbacks& callbacks() const { return callbacks_; }
  FitPosition fit_position() const { return fit_position_; }
  void record_fit_position(FitPosition position) { fit_position_ = position; }
  void attach_fit(std::shared_ptr<FitState> fit) { fit_ = std::move(fit); }
  detail::HostLink& link() { return *this; }

  // ---- detail::HostLink --------------------------------------------------------------------------
  bool reduce_boolean_decision(bool decision, bool all) override { return host_.reduce_boolean_decision(decision, all); }
  std::string broadcast(const std::string& text) override { return host_.broadcast(text); }
  at::Tensor all_gather(const at::Tensor& tensor) override { return host_.all_gather(tensor.to(host_.device())); }
  std::string resolve_path(const std::string& path) override { return host_.resolve_path(path); }
  void save(const std::string& path, const StateDict& state) override {
    auto timed = callbacks_.profile([] { return profiling::named<"save_checkpoint">(); });
    host_.save(path, state);
  }
  StateDict load(const std::string& path) override { return host_.load(path); }
  void remove_checkpoint(const std::string& path) override { host_.remove_checkpoint(path); }
  StateDict module_state(torch::nn::Module& module) override { return host_.module_state(module); }
  void load_module_state(torch::nn::Module& module, const StateDict& state, bool strict) override {
    host_.load_module_state(module, state, strict);
  }
  StateDict optimizer_state(torch::optim::Optimizer& optimizer) override { return host_.optimizer_state(optimizer); }
  void load_optimizer_state(torch::optim::Optimizer& optimizer, const StateDict& state) override {
    host_.load_optimizer_state(optimizer, state);
  }
  StateDict precision_state() override { return host_.precision_state(); }
  void load_precision_state(const StateDict& state) override { host_.load_precision_state(state); }
  std::string combination_name() const override { return Host::combination_name(); }
  /// Whether a logger is there: of a logger type, and (a std::vector of loggers) not an empty vector.
  bool has_loggers() const override {
    if constexpr (Callbacks::has_loggers) return callbacks_.logger_count() > 0;
    else return false;
  }
  void log_metrics(const Metrics& metrics, std::int64_t step) override {
    if constexpr (Callbacks::has_loggers) callbacks_.log_metrics(metrics, step);
  }
  std::string log_dir() override { return callbacks_.first_log_dir(); }
  StateDict callback_states() override {
    StateDict states;
    callbacks_.save_states(states);
    return states;
  }
  StateDict callback_file_records() override {
    StateDict states;
    callbacks_.save_file_records(states);
    return states;
  }
  std::vector<std::string> load_callback_states(const StateDict& states) override {
    return callbacks_.load_states(states);
  }
  StateDict logger_versions() override { return callbacks_.logger_versions(); }
  void resume_loggers(const StateDict& versions, std::int64_t step) override { callbacks_.resume_loggers(versions, step); }
  FitState* fit() override { return fit_.get(); }

 private:
  Host& host_;
  Callbacks callbacks_;
  FitPosition fit_position_{};
  std::shared_ptr<FitState> fit_;
};

/// How the loops reach a host's loop services (its private `loop_services_`, a LoopServices):
/// a host declares `friend struct fulgur::loops::host_access;`.
struct host_access {
  template <class Host>
  static auto& services(Host& host) {
    return host.loop_services_;
  }
};

/// The callbacks of a host's loops.
template <class Host>
using callbacks_of = typename std::remove_cvref_t<decltype(host_access::services(std::declval<Host&>()))>::callbacks_type;

// ---- the contract, one requirement per part ----------------------------------------------------
// V is unused (the loops speak LibTorch's types); it is there for the requirement-table machinery.

template <class H, class V>
concept loop_host_has_config = requires(const H& h) {
  { h.config() } -> std::convertible_to<const TrainerConfig&>;
};
template <class H, class V>
concept loop_host_has_topology = requires(const H& h) {
  { h.device() } -> std::convertible_to<c10::Device>;
  { h.global_rank() } -> std::convertible_to<int>;
  { h.local_rank() } -> std::convertible_to<int>;
  { h.world_size() } -> std::convertible_to<int>;
  { h.is_global_zero() } -> std::same_as<bool>;
};
template <class H, class V>
concept loop_host_has_setup = requires(H& h, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                       std::vector<data::Batch>& loader) {
  h.setup_module(module, ModuleSetup::training);
  h.setup_optimizers(optimizer);
  h.setup_dataloader(loader);
  h.init_module();
};
template <class H, class V>
concept loop_host_has_batch_verbs = requires(H& h, const data::Batch& batch, const at::Tensor& t) {
  { h.batch_to_device(batch) } -> std::convertible_to<data::Batch>;
  { h.convert_batch(batch) } -> std::convertible_to<data::Batch>;
  { h.convert_output(t) } -> std::convertible_to<at::Tensor>;
  h.forward_context();
};
template <class H, class V>
concept loop_host_has_backward = requires(H& h, const at::Tensor& loss, torch::nn::Module& module) {
  h.backward(loss, module);
  h.no_backward_sync(module, true);
};
template <class H, class V>
concept loop_host_has_optimizer_verbs = requires(H& h, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                                 const ClipGradients& clip) {
  h.unscale_gradients(optimizer);
  { h.unscales_in_optimizer(optimizer) } -> std::same_as<bool>;
  { h.clip_gradients(module, optimizer, clip) } -> std::convertible_to<at::Tensor>;
  { h.optimizer_step(optimizer) } -> std::same_as<bool>;
  h.end_training();
};
template <class H, class V>
concept loop_host_has_collectives = requires(H& h, const at::Tensor& t, const std::string& text) {
  { h.all_reduce(t, ReduceOp::mean) } -> std::convertible_to<at::Tensor>;
  { h.all_gather(t) } -> std::convertible_to<at::Tensor>;
  { h.broadcast(text) } -> std::convertible_to<std::string>;
  h.barrier(std::string_view{});
  { h.reduce_boolean_decision(true, true) } -> std::same_as<bool>;
};
template <class H, class V>
concept loop_host_has_checkpoint_files = requires(H& h, const std::string& path, const StateDict& state) {
  h.save(path, state);
  { h.load(path) } -> std::convertible_to<StateDict>;
  h.remove_checkpoint(path);
  { h.resolve_path(path) } -> std::convertible_to<std::string>;
};
template <class H, class V>
concept loop_host_has_states = requires(H& h, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                        const StateDict& state) {
  { h.module_state(module) } -> std::convertible_to<StateDict>;
  h.load_module_state(module, state, true);
  { h.optimizer_state(optimizer) } -> std::convertible_to<StateDict>;
  h.load_optimizer_state(optimizer, state);
  { h.precision_state() } -> std::convertible_to<StateDict>;
  h.load_precision_state(state);
};
template <class H, class V>
concept loop_host_has_names = requires {
  { H::combination_name() } -> std::convertible_to<std::string>;
  { H::precision_name() } -> std::convertible_to<std::string_view>;
  { H::uses_loss_scaler } -> std::convertible_to<bool>;
};
template <class H, class V>
concept loop_host_has_loop_services = requires(H& h) {
  host_access::services(h).callbacks();
  host_access::services(h).fit_position();
  { host_access::services(h).link() } -> std::convertible_to<detail::HostLink&>;
};

// clang-format off
#define FULGUR_LOOP_HOST_REQUIREMENTS(R)                                                                      \
  R(loop_host_has_config, "const fulgur::TrainerConfig& config() const")                                     \
  R(loop_host_has_topology, "device(), global_rank(), local_rank(), world_size() and bool is_global_zero(), " \
    "each const")                                                                                              \
  R(loop_host_has_setup, "setup_module(torch::nn::Module&, fulgur::ModuleSetup), "                             \
    "setup_optimizers(torch::optim::Optimizer&), setup_dataloader(Loader&) and init_module()")                 \
  R(loop_host_has_batch_verbs, "batch_to_device(const Batch&), convert_batch(const Batch&), "                  \
    "convert_output(const at::Tensor&) and forward_context()")                                                 \
  R(loop_host_has_backward, "backward(const at::Tensor& loss, torch::nn::Module&) and "                        \
    "no_backward_sync(torch::nn::Module&, bool enabled)")                                                      \
  R(loop_host_has_optimizer_verbs, "unscale_gradients(torch::optim::Optimizer&), bool "                        \
    "unscales_in_optimizer(torch::optim::Optimizer&), clip_gradients(torch::nn::Module&, "                     \
    "torch::optim::Optimizer&, const fulgur::ClipGradients&), bool optimizer_step(torch::optim::Optimizer&) "  \
    "and end_training()")                                                                                      \
  R(loop_host_has_collectives, "all_reduce(const at::Tensor&, fulgur::ReduceOp), all_gather(const at::Tensor&), " \
    "broadcast(const std::string&), barrier(std::string_view) and bool reduce_boolean_decision(bool, bool all)") \
  R(loop_host_has_checkpoint_files, "save(path, const fulgur::StateDict&), load(path), remove_checkpoint(path) " \
    "and resolve_path(path)")                                                                                  \
  R(loop_host_has_states, "module_state, load_module_state, optimizer_state, load_optimizer_state, "           \
    "precision_state and load_precision_state")                                                                \
  R(loop_host_has_names, "static combination_name(), static constexpr precision_name() and "                   \
    "static constexpr bool uses_loss_scaler")                                                                  \
  R(loop_host_has_loop_services, "a private fulgur::loops::LoopServices<Host, Callbacks> loop_services_ and "   \
    "`friend struct fulgur::loops::host_access;`")
// clang-format on

template <class T, class V = void>
concept loop_host_for = true FULGUR_LOOP_HOST_REQUIREMENTS(FULGUR_DETAIL_ALL_OF);

/// What the loops run on (fulgur::Trainer is one).
template <class H>
concept loop_host = loop_host_for<H>;

enum class loop_host_requirement { FULGUR_LOOP_HOST_REQUIREMENTS(FULGUR_DETAIL_ENUMERATE) none };
template <class T, class V>
consteval loop_host_requirement first_missing_loop_host_requirement() {
  using Missing = loop_host_requirement;
  FULGUR_LOOP_HOST_REQUIREMENTS(FULGUR_DETAIL_FIRST_MISSING) return Missing::none;
}

/// One static_assert naming the first part of the contract the host lacks.
template <class T, class V = void>
consteval bool assert_loop_host() {
  using Missing = loop_host_requirement;
  constexpr Missing missing = first_missing_loop_host_requirement<T, V>();
#define FULGUR_DETAIL_LACKS "fulgur: the loops' host lacks `"
#define FULGUR_DETAIL_REMEDY "`; the loop contract is in fulgur/loops/host.hpp (docs/architecture.md)."
  FULGUR_LOOP_HOST_REQUIREMENTS(FULGUR_DETAIL_REQUIRE)
#undef FULGUR_DETAIL_LACKS
#undef FULGUR_DETAIL_REMEDY
  return true;  // the one error is the static_assert above
}

}  // namespace fulgur::loops
