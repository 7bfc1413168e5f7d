#pragma once
// fulgur::Trainer<Accelerator, Strategy, Precision>.
//
// Two levels, the upper built only from the lower:
//  - Fabric level, for people who keep their own loop: setup, setup_module, setup_optimizers,
//    setup_dataloader, init_module, init_tensor, batch_to_device, forward_context, backward,
//    unscale_gradients, clip_gradients, optimizer_step, no_backward_sync, the collectives, save,
//    load, print. Each verb is one call into a policy; the optimizer step goes strategy ->
//    precision, as in Lightning.
//  - Trainer level: fit, validate, test, predict (loops/), written against the loop contract
//    (loops/host.hpp): they reach the policies only through the verbs above. The loops' plumbing
//    (callbacks, fit position, the fit under way) is a private member they reach through
//    loops::host_access, not the Trainer's public API.
// The policies are members held by value; every call is direct. A combination the rules refuse
// gets an inert Trainer whose only effect is one static_assert naming what is wrong.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/utils.h>

#include <concepts>
#include <iostream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "fulgur/accelerators/device_parsing.hpp"
#include "fulgur/callbacks/callback_set.hpp"
#include "fulgur/callbacks/progress_bar.hpp"
#include "fulgur/compatibility.hpp"
#include "fulgur/concepts/training_module.hpp"
#include "fulgur/checkpoint/io.hpp"
#include "fulgur/checkpoint/stateful.hpp"
#include "fulgur/data/batch.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/data/tensor_loader.hpp"
#include "fulgur/detail/meta_tensors.hpp"
#include "fulgur/detail/trainer_arguments.hpp"
#include "fulgur/detail/trainer_support.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/loops/evaluation.hpp"
#include "fulgur/loops/fit.hpp"
#include "fulgur/loops/host.hpp"
#include "fulgur/loops/prediction.hpp"
#include "fulgur/optimization.hpp"
#include "fulgur/parallel_devices.hpp"
#include "fulgur/precision/guards.hpp"
#include "fulgur/results.hpp"
#include "fulgur/state_dict.hpp"
#include "fulgur/step_context.hpp"
#include "fulgur/trainer_config.hpp"

namespace fulgur {

template <class A, class S, class P, class... Callbacks>
class Trainer {
 public:
  using accelerator_type = A;
  using strategy_type = S;
  using precision_type = P;
  using options_type = typename detail::strategy_options<S>::type;
  using callbacks_type = detail::callback_set_for<Callbacks...>;
  /// The same combination with these callbacks and loggers instead (e.g. on a type fulgur::dispatch chose).
  template <class... Others>
  using with_callbacks = Trainer<A, S, P, Others...>;

  /// Checks the config (before any policy is built), builds the policies, and sets up the
  /// strategy's environment on this process's device (DDP: meets the other processes, or
  /// launches them when devices x num_nodes > 1 and no launcher is around). Callbacks and loggers
  /// follow, in the order of the Trainer's arguments (default-constructed in this form).
  explicit Trainer(TrainerConfig config = {}, options_type options = {})
    requires(std::default_initializable<Callbacks> && ...)
      : Trainer(construct{}, std::move(config), std::move(options), Callbacks{}...) {}
  /// A callback that needs arguments (EarlyStopping) left out: one error saying to pass it.
  explicit Trainer(TrainerConfig config = {}, options_type options = {})
    requires(!(std::default_initializable<Callbacks> && ...))
      : Trainer(construct{}, std::move(config), std::move(options), default_callback<Callbacks>()...) {}
  Trainer(TrainerConfig config, Callbacks... callbacks)
    requires(sizeof...(Callbacks) > 0)
      : Trainer(construct{}, std::move(config), options_type{}, std::move(callbacks)...) {}
  Trainer(TrainerConfig config, options_type options, Callbacks... callbacks)
    requires(sizeof...(Callbacks) > 0)
      : Trainer(construct{}, std::move(config), std::move(options), std::move(callbacks)...) {}

 private:
  struct construct {};
  Trainer(construct, TrainerConfig&& config, options_type&& options, Callbacks&&... callbacks)
      : config_(detail::validated(std::move(config))),
        strategy_(make_strategy(std::move(options))),
        loop_services_(*this, make_callbacks(std::move(callbacks)...)) {
    static_assert(detail::assert_trainer_arguments<A, S, P, Callbacks...>());  // e.g. a callback needing a logger
    init();
  }
  void init() {
    check_progress_bar();
    if (config_.seed) torch::manual_seed(*config_.seed);
    if (config_.deterministic) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    strategy_.setup_environment(accelerator_, parallel_devices());
    check_dtype_supported();
  }

 public:
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer() {
    precision_.teardown();
    strategy_.teardown();
    accelerator_.teardown();
  }

  /// The callbacks and loggers, in the order of the Trainer's arguments (then the default ProgressBar).
  auto& callbacks() { return loop_services_.callbacks().items(); }
  /// The callback or logger of type C (e.g. trainer.callback<fulgur::EarlyStopping>().stopped_epoch).
  template <class C>
  C& callback() {
    return std::get<C>(loop_services_.callbacks().items());
  }

  A& accelerator() { return accelerator_; }
  S& strategy() { return strategy_; }
  P& precision() { return precision_; }
  const TrainerConfig& config() const { return config_; }
  /// "cpu/single_device/32-true": the combination, in Lightning's names.
  static std::string combination_name() { return detail::combination_name(A::name, S::name, P::name); }
  /// The precision's Lightning name ("bf16-mixed"), for messages.
  static constexpr std::string_view precision_name() { return P::name; }
  /// Whether the precision scales the loss (a non-finite loss is then a skipped step, not an error).
  static constexpr bool uses_loss_scaler = fulgur::uses_loss_scaler<P>;

  // ---- Fabric level: set-up ----------------------------------------------------------------------

  /// Converts the module to the precision, moves it to the device, and lets the strategy set up
  /// the module and optimizers. Optimizers keep referring to the same parameters.
  template <class Module, class... Optimizers>
  void setup(Module& module, Optimizers&... optimizers) {
    torch::nn::Module& m = detail::referent(module);
    precision_.convert_module(m);
    strategy_.module_to_device(m);
    (loops::require_parameters(detail::referent(optimizers), "Trainer::setup was given"), ...);
    torch::optim::Optimizer* list[] = {&detail::referent(optimizers)..., nullptr};
    strategy_.setup_module_and_optimizers(m, std::span<torch::optim::Optimizer* const>(list, sizeof...(Optimizers)));
    module_ = &m;
  }
  /// The module alone (its optimizers, created afterwards on the moved parameters, go to setup_optimizers).
  template <class Module>
  void setup_module(Module& module, ModuleSetup use = ModuleSetup::training) {
    torch::nn::Module& m = detail::referent(module);
    precision_.convert_module(m);
    strategy_.module_to_device(m);
    if (use == ModuleSetup::evaluation) {  // backward(loss) keeps the module set up for training
      detail::refuse_meta_tensors(m, "a model built in init_module(/*empty_init=*/true) gets its memory when "
                                          "fit sets it up: fit it before validate, test or predict, or build it "
                                          "with init_module().");
      return;
    }
    strategy_.setup_module(m);
    module_ = &m;
  }
  template <class... Optimizers>
  void setup_optimizers(Optimizers&... optimizers) {
    (loops::require_parameters(detail::referent(optimizers), "Trainer::setup_optimizers was given"), ...);
    (strategy_.setup_optimizer(detail::referent(optimizers)), ...);
  }
  /// What the strategy makes of a loader (DDP: this rank's shard of a shard-aware loader).
  template <class Loader>
  decltype(auto) setup_dataloader(Loader&& loader) {
    return strategy_.process_dataloader(std::forward<Loader>(loader));
  }
  /// A context in which modules are created on the root device, in the precision's dtype.
  auto init_module(bool empty_init = false) { return strategy_.module_init_context(precision_, empty_init); }
  /// A context in which tensors are created on the root device, in the precision's dtype.
  auto init_tensor() { return strategy_.tensor_init_context(precision_); }

  // ---- Fabric level: a step --------------------------------------------------------------------

  template <class Batch>
  auto batch_to_device(const Batch& batch) {
    return strategy_.batch_to_device(batch);
  }
  /// The precision's forward context (autocast, default dtype): open it around forward and loss.
  auto forward_context() { return precision_.forward_context(); }
  template <class Data>
  auto convert_input(const Data& data) {
    return precision_.convert_input(data);
  }
  template <class Data>
  auto convert_output(const Data& data) {
    return precision_.convert_output(data);
  }
  /// A batch as fit hands it to a step: under a "-true" precision every floating tensor converted
  /// (Lightning's Double/HalfPrecision.convert_input); otherwise the model's inputs only
  /// (Batch::input, a torch::data Example's data; every tensor of other batch types), so that under
  /// mixed precision a regression target keeps its float32 values.
  template <class Batch>
  auto convert_batch(const Batch& batch) {
    if constexpr (!converts_targets && std::is_same_v<Batch, data::Batch>)
      return data::Batch{at::Tensor(precision_.convert_input(batch.input)), batch.target};
    else if constexpr (!converts_targets && requires { batch.data; batch.target; typename Batch::DataType; })
      return Batch{precision_.convert_input(batch.data), batch.target};
    else
      return precision_.convert_input(batch);
  }

  /// Backward through the strategy and precision (scaling the loss under '16-mixed', all-reducing
  /// gradients under DDP), for the module of the last setup.
  void backward(const at::Tensor& loss) {
    if (module_ == nullptr) detail::raise_needs_module("backward");
    strategy_.backward(loss, *module_, precision_);
  }
  template <class Module>
  void backward(const at::Tensor& loss, Module& module) {
    strategy_.backward(loss, detail::referent(module), precision_);
  }
  /// Divides the gradients by the loss scale now, so that code before the step sees true
  /// gradients ('16-mixed'; nothing under the other precisions). clip_gradients and
  /// optimizer_step do it themselves when it has not been done.
  void unscale_gradients(torch::optim::Optimizer& optimizer) {
    if constexpr (requires { strategy_.unscale_gradients(optimizer, precision_); })
      strategy_.unscale_gradients(optimizer, precision_);  // a strategy whose optimizer holds other gradients
    else
      precision_.unscale_gradients(optimizer);
  }
  /// Whether the gradients may stay scaled until the optimizer's own kernel divides them (a fused
  /// optim::ScaledStepOptimizer under '16-mixed'): the loops then skip their unscale before
  /// on_before_optimizer_step, as Lightning does for fused optimizers. Not under a strategy that
  /// unscales its gradients itself (sharded stage 2 sums the inf flags over the ranks).
  bool unscales_in_optimizer(torch::optim::Optimizer& optimizer) {
    if constexpr (requires { strategy_.unscale_gradients(optimizer, precision_); })
      return false;
    else if constexpr (requires { precision_.unscales_in_optimizer(optimizer); })
      return precision_.unscales_in_optimizer(optimizer);
    else
      return false;
  }

  /// Clips by value or by norm (unscaling first). Returns the total norm before clipping for
  /// max_norm, an undefined tensor for clip_val.
  template <class Module>
  at::Tensor clip_gradients(Module& module, torch::optim::Optimizer& optimizer, const ClipGradients& clip) {
    detail::check_clip_arguments(clip);
    torch::nn::Module& m = detail::referent(module);
    if (clip.clip_val) {
      strategy_.clip_gradients_value(m, optimizer, *clip.clip_val, precision_);
      return {};
    }
    return strategy_.clip_gradients_norm(m, optimizer, *clip.max_norm, clip.norm_type, clip.error_if_nonfinite,
                                         precision_);
  }

  /// Steps the optimizer through the strategy and the precision; false when the step was skipped
  /// (inf/NaN gradients under a loss scaler).
  bool optimizer_step(torch::optim::Optimizer& optimizer) { return strategy_.optimizer_step(optimizer, precision_); }

  /// Training is over (Lightning's Strategy.on_train_end, which fit calls before the on_train_end
  /// hooks): a strategy that keeps the module in its own form hands it back whole (ShardedStrategy<3>
  /// gathers every unit). A hand-written loop calls it after its last step.
  void end_training() {
    if constexpr (requires { strategy_.on_train_end(); }) strategy_.on_train_end();
  }

  /// While the returned guard lives, backward accumulates gradients without communicating
  /// (gradient accumulation micro-batches under DDP; nothing to skip on a single device).
  template <class Module>
  auto no_backward_sync(Module& module, bool enabled = true) {
    return strategy_.no_backward_sync(detail::referent(module), enabled);
  }
  /// The same for the module of the last setup.
  auto no_backward_sync(bool enabled = true) {
    if (module_ == nullptr) detail::raise_needs_module("no_backward_sync");
    return strategy_.no_backward_sync(*module_, enabled);
  }

  // ---- Fabric level: processes -------------------------------------------------------------------

  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::mean) { return strategy_.all_reduce(tensor, op); }
  at::Tensor all_gather(const at::Tensor& tensor) { return strategy_.all_gather(tensor); }
  template <class T>
  T broadcast(T value, int src = 0) {
    return strategy_.broadcast(std::move(value), src);
  }
  void barrier(std::string_view name = {}) { strategy_.barrier(name); }
  /// all: every rank decided true; otherwise: any rank did.
  bool reduce_boolean_decision(bool decision, bool all = true) { return strategy_.reduce_boolean_decision(decision, all); }
  bool is_global_zero() const { return strategy_.is_global_zero(); }
  int global_rank() const { return strategy_.global_rank(); }
  int local_rank() const { return strategy_.local_rank(); }
  int world_size() const { return strategy_.world_size(); }
  c10::Device device() const { return strategy_.root_device(); }

  /// Writes a checkpoint (global rank 0 only under DDP, atomically); a relative path is taken
  /// under TrainerConfig::default_root_dir.
  void save(const std::string& path, const StateDict& state) { strategy_.save_checkpoint(resolve(path), state); }
  StateDict load(const std::string& path) { return strategy_.load_checkpoint(resolve(path)); }
  /// Lightning's fabric.save(path, state) / fabric.load(path, state, strict): the named objects'
  /// states, written; read back into the same objects in place, returning what else the file holds.
  void save(const std::string& path, const CheckpointState& state) { save(path, state.collect(loop_services_.link())); }
  StateDict load(const std::string& path, const CheckpointState& state, bool strict = true) {
    return state.restore(loop_services_.link(), load(path), resolve(path), strict);
  }
  /// Deletes a checkpoint save wrote (global rank 0), with whatever its strategy's format keeps
  /// beside the file; a relative path is under default_root_dir.
  void remove_checkpoint(const std::string& path) {
    if constexpr (requires { strategy_.remove_checkpoint(path); })
      strategy_.remove_checkpoint(resolve(path));  // a strategy whose format keeps files beside the checkpoint
    else if (is_global_zero())
      checkpoint::remove(resolve(path));
  }
  /// A path as save and load take it: a relative one under TrainerConfig::default_root_dir.
  std::string resolve_path(const std::string& path) const { return resolve(path); }
  /// The states a checkpoint holds, each through its policy.
  StateDict module_state(const torch::nn::Module& module) {
    if constexpr (requires { strategy_.get_module_state_dict(module); })
      return strategy_.get_module_state_dict(module);  // a strategy that holds the weights in its own form
    else
      return checkpoint::module_state_dict(module);
  }
  StateDict optimizer_state(torch::optim::Optimizer& optimizer) { return strategy_.get_optimizer_state(optimizer); }
  /// A state of another optimizer type or of other parameters is a CheckpointError.
  void load_optimizer_state(torch::optim::Optimizer& optimizer, const StateDict& state) {
    try {
      if constexpr (requires { strategy_.load_optimizer_state_dict(optimizer, state); }) {
        strategy_.load_optimizer_state_dict(optimizer, state);  // a strategy that keeps it in its own form (and checks it)
      } else {
        checkpoint::load_optimizer_state_dict(optimizer, state);
        detail::check_optimizer_state_shapes(optimizer);
      }
    } catch (const c10::Error& e) {
      detail::raise_optimizer_state_mismatch(e);
    }
  }
  StateDict precision_state() const { return precision_.state_dict(); }
  void load_precision_state(const StateDict& state) { precision_.load_state_dict(state); }
  void load_module_state(torch::nn::Module& module, const StateDict& state, bool strict = true) {
    strategy_.load_module_state_dict(module, state, strict);
  }

  /// Lightning's trainer.save_checkpoint: the state of the fit under way (written once the batch or
  /// epoch under way is over) or of the last fit, which FitOptions::ckpt_path continues exactly.
  /// Every rank calls it; global rank 0 writes, atomically. weights_only: the module's weights and
  /// the loop position, without optimizer, scheduler, precision or callback states.
  void save_checkpoint(const std::string& path, bool weights_only = false) {
    loops::FitState* fit = loop_services_.fit();
    if (fit == nullptr) detail::raise_save_checkpoint_outside_fit();
    fit->request_save(path, weights_only);
  }

  /// Prints one line on global rank 0 only.
  template <class... Args>
  void print(const Args&... args) const {
    if (!is_global_zero()) return;
    std::ostringstream line;
    (line << ... << args);
    std::cout << line.str() << std::endl;
  }

  // ---- Trainer level -------------------------------------------------------------------------------

  /// Trains `module` (a std::shared_ptr<M>, a TORCH_MODULE holder, or M&) on `train_data` (any range
  /// of batches: fulgur::data::TensorLoader, std::vector<Batch>, a torch::data loader...; a
  /// temporary is fine), validating on `val_data` as val_check_interval says.
  template <class Module, class TrainData>
  FitResult fit(Module&& module, TrainData&& train_data, FitOptions options = {}) {
    loops::NoData none;
    return run_fit(detail::referent(module), detail::range_ref(train_data), none, std::move(options));
  }
  template <class Module, class TrainData, class ValData>
    requires(!std::is_same_v<std::remove_cvref_t<ValData>, FitOptions>)
  FitResult fit(Module&& module, TrainData&& train_data, ValData&& val_data, FitOptions options = {}) {
    return run_fit(detail::referent(module), detail::range_ref(train_data), detail::range_ref(val_data),
                   std::move(options));
  }
  /// Several validation loaders of one type, as a braced list: fit(module, train, {val_a, val_b}).
  template <class Module, class TrainData, class Loader>
  FitResult fit(Module&& module, TrainData&& train_data, std::initializer_list<Loader> val_loaders,
                FitOptions options = {}) {
    data::EvaluationLoaderList<Loader> val(val_loaders);
    return run_fit(detail::referent(module), detail::range_ref(train_data), val, std::move(options));
  }
  /// validation_step over the data once (a fresh module is set up first, as fit does). Several
  /// loaders (data::loaders(a, b) or {a, b}): one EvaluationResult per loader, in order.
  /// options.ckpt_path: evaluate a checkpoint's weights ("best", "last", "hpc" or a path).
  template <class Module, class Data>
  auto validate(Module&& module, Data&& data, const EvaluationOptions& options = {}) {
    return run_evaluation<loops::Validation>(detail::referent(module), detail::range_ref(data), options);
  }
  template <class Module, class Loader>
  std::vector<EvaluationResult> validate(Module&& module, std::initializer_list<Loader> loaders,
                                         const EvaluationOptions& options = {}) {
    data::EvaluationLoaderList<Loader> list(loaders);
    return run_evaluation<loops::Validation>(detail::referent(module), list, options);
  }
  /// test_step over the data once (several loaders, options: as validate).
  template <class Module, class Data>
  auto test(Module&& module, Data&& data, const EvaluationOptions& options = {}) {
    return run_evaluation<loops::Test>(detail::referent(module), detail::range_ref(data), options);
  }
  template <class Module, class Loader>
  std::vector<EvaluationResult> test(Module&& module, std::initializer_list<Loader> loaders,
                                     const EvaluationOptions& options = {}) {
    data::EvaluationLoaderList<Loader> list(loaders);
    return run_evaluation<loops::Test>(detail::referent(module), list, options);
  }
  /// predict_step over the data: the predictions, on the CPU, in the order of the batches. Several
  /// loaders (data::loaders(a, b) or {a, b}): one vector of predictions per loader, in order.
  /// options: as validate.
  template <class Module, class Data>
  auto predict(Module&& module, Data&& data, const EvaluationOptions& options = {}) {
    auto& m = detail::referent(module);
    auto& d = detail::range_ref(data);
    using M = std::remove_cvref_t<decltype(m)>;
    using D = std::remove_reference_t<decltype(d)>;
    if constexpr (data::several_loaders<D>) {
      constexpr bool has_step = loops::every_batch_type<D>([]<class B>(std::type_identity<B>) {
        return detail::has_predict_step_with_idx_for<M, B>;
      });
      static_assert(has_step, "fulgur: several loaders were given to predict(), but predict_step does not take "
                              "(batch, batch_idx, std::int64_t dataloader_idx) for their batches (Lightning: \"You "
                              "provided multiple `predict_dataloader`, but no `dataloader_idx` argument\").");
      if constexpr (has_step) return loops::predict(*this, m, d, evaluation_weights(Stage::predict, options));
      else return std::vector<std::vector<at::Tensor>>{};  // what the caller most likely uses: no second error
    } else {
      using Batch = loops::batch_of_t<std::remove_reference_t<decltype(setup_dataloader(d))>>;
      static_assert(assert_evaluation_step<Stage::predict, M, Batch>());  // "predict() needs predict_step(...)"
      if constexpr (has_predict_step<M, Batch>)
        return loops::predict(*this, m, d, evaluation_weights(Stage::predict, options));
      else
        return std::vector<at::Tensor>{};  // the usual predictions' type, so that their use adds no error
    }
  }
  template <class Module, class Loader>
  auto predict(Module&& module, std::initializer_list<Loader> loaders, const EvaluationOptions& options = {}) {
    data::EvaluationLoaderList<Loader> list(loaders);
    return predict(std::forward<Module>(module), list, options);
  }

 private:
  template <class M, class TrainData, class ValData>
  FitResult run_fit(M& module, TrainData& train_data, ValData& val_data, FitOptions options) {
    using Module = std::remove_cvref_t<M>;
    using Batch = loops::batch_of_t<std::remove_reference_t<decltype(setup_dataloader(train_data))>>;
    constexpr bool owns_optimizers = !detail::configure_optimizers_returns_reference<Module>;
    static_assert(owns_optimizers,
                  "fulgur: configure_optimizers() returns a reference; return the optimizer by value (a "
                  "std::unique_ptr<Optimizer>, an OptimizerConfig or a vector of them): fit takes ownership (callbacks "
                  "see the optimizers as trainer.optimizers(), a manual training_step as ctx.optimizers()).");
    // One error naming the first requirement the module misses (concepts/training_module.hpp).
    constexpr bool trainable = detail::first_missing_training_module_requirement<
                                   Module, detail::module_vocabulary<torch_vocabulary, Batch>>() ==
                               detail::training_module_requirement::none;
    static_assert(assert_training_module<Module, Batch>());
    constexpr bool validates = [] {
      if constexpr (std::is_same_v<ValData, loops::NoData>)
        return true;
      else if constexpr (data::several_loaders<ValData>)
        return loops::every_batch_type<ValData>([]<class B>(std::type_identity<B>) {
          return detail::has_validation_step_with_idx_for<Module, B>;
        });
      else
        return has_validation_step<Module, loops::batch_of_t<std::remove_reference_t<
                                               decltype(std::declval<Trainer&>().setup_dataloader(std::declval<ValData&>()))>>>;
    }();
    static_assert(validates || data::several_loaders<ValData>,
                  "fulgur: validation data was given but the module has no validation_step(batch, "
                  "batch_idx); add one, or call fit without validation data.");
    static_assert(validates || !data::several_loaders<ValData>,
                  "fulgur: several validation loaders were given, but the module has no validation_step(batch, "
                  "batch_idx, std::int64_t dataloader_idx) for their batches (Lightning: \"You provided multiple "
                  "`val_dataloader`, but no `dataloader_idx` argument in `validation_step()`\").");
    if constexpr (owns_optimizers && trainable && validates) {
      // One path from the root: "last" and "hpc" found, a relative path under default_root_dir.
      std::vector<std::string> warnings;  // reported with the fit's own (FitResult::warnings)
      options.ckpt_path =
          detail::checkpoint_to_load(config_, "fit", options.ckpt_path, checkpoint_sources(), is_global_zero(), warnings);
      say_if_slow_on_this_cpu();
      std::optional<torch::autograd::DetectAnomalyGuard> anomaly_mode;  // TrainerConfig::detect_anomaly
      if (config_.detect_anomaly) anomaly_mode.emplace();
      FitResult result = loops::fit(*this, module, train_data, val_data, std::move(options), std::move(warnings));
      if (result.preempted && config_.preemption.exit_process) end_preempted_process();
      return result;
    } else {
      return {};
    }
  }

  /// Where "last", "best" and a restarted run's newest checkpoint are looked for: the callbacks' and
  /// loggers' checkpoint folders, the ModelCheckpoints' best checkpoints.
  detail::CheckpointSources checkpoint_sources() const {
    const auto& callbacks = loop_services_.callbacks();
    return {callbacks.checkpoint_folders(config_.default_root_dir), callbacks.best_model_paths()};
  }
  loops::EvaluationWeights evaluation_weights(Stage stage, const EvaluationOptions& options) {
    loops::EvaluationWeights weights;
    say_if_slow_on_this_cpu();
    weights.checkpoint = detail::checkpoint_to_load(config_, to_string(stage), options.ckpt_path, checkpoint_sources(),
                                                    is_global_zero(), weights.warnings);
    return weights;
  }

  template <class Kind, class M, class Data>
  auto run_evaluation(M& module, Data& data, const EvaluationOptions& options) {
    using Module = std::remove_cvref_t<M>;
    if constexpr (data::several_loaders<Data>) {
      constexpr bool has_step = loops::every_batch_type<Data>([]<class B>(std::type_identity<B>) {
        return Kind::template defined_with_idx_for<Module, B>;
      });
      static_assert(has_step, "fulgur: several loaders were given, but the module's validation_step / test_step "
                              "does not take (batch, batch_idx, std::int64_t dataloader_idx) for their batches "
                              "(Lightning: \"You provided multiple dataloaders, but no `dataloader_idx` argument\").");
      if constexpr (has_step) return loops::evaluate<Kind>(*this, module, data, evaluation_weights(Kind::stage, options));
      else return std::vector<EvaluationResult>{};
    } else {
      using Batch = loops::batch_of_t<std::remove_reference_t<decltype(setup_dataloader(data))>>;
      constexpr bool has_step = Kind::template defined_for<Module, Batch>;
      static_assert(assert_evaluation_step<Kind::stage, Module, Batch>());  // "test() needs test_step(...)"
      if constexpr (has_step) return loops::evaluate<Kind>(*this, module, data, evaluation_weights(Kind::stage, options));
      else return EvaluationResult{};
    }
  }

  friend struct loops::host_access;
  /// Under a "-true" precision fit converts a batch's targets with its inputs (convert_batch).
  static constexpr bool converts_targets = requires { requires P::converts_targets; };

  static callbacks_type make_callbacks(Callbacks&&... callbacks) {
    if constexpr ((detail::is_progress_bar<Callbacks>() || ...))
      return callbacks_type(std::move(callbacks)...);
    else
      return callbacks_type(std::move(callbacks)..., ProgressBar{});
  }
  void check_progress_bar() const {
    if (!config_.enable_progress_bar && (detail::is_progress_bar<Callbacks>() || ...)) detail::raise_progress_bar_disabled();
  }
  S make_strategy(options_type&& options) {
    if constexpr (std::is_same_v<options_type, NoStrategyOptions>) {
      return S{};
    } else {
      static_assert(std::constructible_from<S, options_type>,
                    "fulgur: the strategy declares options_type but cannot be built from it; a strategy derived "
                    "from a shipped one gets its constructor with `using Base::Base;`.");
      return S(std::move(options));
    }
  }
  static P make_precision() {
    if constexpr (std::constructible_from<P, c10::DeviceType>)
      return P(A::device_type);
    else
      return P{};
  }
  ParallelDevices parallel_devices() const {
    if (!A::is_available()) detail::raise_accelerator_unavailable(A::name);
    const std::vector<int> ids = std::visit([](const auto& devices) { return A::parse_devices(devices); }, config_.devices);
    return ParallelDevices{A::get_parallel_devices(ids), config_.num_nodes, config_.max_restarts};
  }
  /// Once per Trainer: a float16 or bfloat16 precision on a CPU without LibTorch's fast kernels for it.
  void say_if_slow_on_this_cpu() {
    if constexpr (A::device_type == c10::kCPU && requires { P::dtype; })
      detail::say_slow_cpu_precision(P::name, P::dtype, is_global_zero(), slow_precision_said_);
  }
  void check_dtype_supported() {  // both members are declared (concepts/): a wrong one is an error
    if constexpr (requires { P::dtype; A::supports_dtype(strategy_.root_device(), P::dtype); }) {
      if (!A::supports_dtype(strategy_.root_device(), P::dtype))
        detail::raise_dtype_unsupported(P::name, P::dtype, strategy_.root_device());
    }
  }
  /// TrainerConfig::preemption.exit_process: the loop has saved and shut down; the policies let go
  /// of what they hold (the process group, the device) and the process ends with the code a
  /// scheduler or script reads as "try again".
  [[noreturn]] void end_preempted_process() {
    precision_.teardown();
    strategy_.teardown();
    accelerator_.teardown();
    detail::end_preempted_process(config_.preemption.exit_code);
  }

  std::string resolve(const std::string& path) const { return detail::resolve_path(config_, path); }

  TrainerConfig config_;
  A accelerator_{};
  S strategy_;
  P precision_ = make_precision();
  torch::nn::Module* module_ = nullptr;  // the module of the last setup, for backward(loss)
  bool slow_precision_said_ = false;     // detail::say_slow_cpu_precision: once per Trainer
  // The loops' plumbing: callbacks and loggers, where the last fit ended, the fit under way (or the
  // last one); also the Trainer's side of the library boundary (loops/boundary.hpp).
  loops::LoopServices<Trainer, callbacks_type> loop_services_;
};

}  // namespace fulgur

#include "fulgur/detail/refused_trainer.hpp"  // Trainer<A, S, P, ...> for combinations the rules refuse
