#pragma once
// The evaluation loop: validation (inside fit, and Trainer::validate) and testing (Trainer::test),
// in Lightning's order:
//
//   on_{validation,test}_model_eval (default: module.eval())
//   on_*_start, on_*_epoch_start
//   per batch: transfer hooks, on_*_batch_start, *_step, on_*_batch_end
//   on_*_epoch_end, on_*_end
//   on_*_model_train (default: every submodule back to its mode before evaluation)
//
// Gradients are off: no_grad inside fit, inference mode otherwise (Lightning's inference_mode).
// A step that returns a loss adds to fulgur's val_loss / test_loss, the batch-size-weighted mean
// over every rank's data; ctx.log values are reduced as metrics.hpp says.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/concepts/training_module.hpp"
#include "fulgur/data/apply.hpp"
#include "fulgur/data/loaders.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/hooks.hpp"
#include "fulgur/loops/common.hpp"
#include "fulgur/loops/step.hpp"
#include "fulgur/metrics.hpp"
#include "fulgur/results.hpp"

namespace fulgur::loops {

/// The hooks, step and names of validation.
struct Validation {
  template <class Module, class Batch>
  static constexpr bool defined_for = has_validation_step<Module, Batch>;
  template <class Module, class Batch>
  static constexpr bool defined_with_idx_for = detail::has_validation_step_with_idx_for<Module, Batch>;
  static constexpr Stage stage = Stage::validate;
  static constexpr auto limit = &TrainerConfig::limit_val_batches;
  static constexpr const char* limit_name = "limit_val_batches";
  static constexpr std::string_view loss_name = "val_loss";
  static constexpr std::string_view what = "validation";
  static Action next() { return profiling::named<"[_EvaluationLoop].val_next">(); }
  static constexpr auto step = hooks::validation_step;
  static constexpr auto model_eval = hooks::on_validation_model_eval;
  static constexpr auto model_train = hooks::on_validation_model_train;
  static constexpr auto start = hooks::on_validation_start;
  static constexpr auto end = hooks::on_validation_end;
  static constexpr auto epoch_start = hooks::on_validation_epoch_start;
  static constexpr auto epoch_end = hooks::on_validation_epoch_end;
  static constexpr auto batch_start = hooks::on_validation_batch_start;
  static constexpr auto batch_end = hooks::on_validation_batch_end;
};

/// The hooks, step and names of testing.
struct Test {
  template <class Module, class Batch>
  static constexpr bool defined_for = has_test_step<Module, Batch>;
  template <class Module, class Batch>
  static constexpr bool defined_with_idx_for = detail::has_test_step_with_idx_for<Module, Batch>;
  static constexpr Stage stage = Stage::test;
  static constexpr auto limit = &TrainerConfig::limit_test_batches;
  static constexpr const char* limit_name = "limit_test_batches";
  static constexpr std::string_view loss_name = "test_loss";
  static constexpr std::string_view what = "test";
  static Action next() { return profiling::named<"[_EvaluationLoop].test_next">(); }
  static constexpr auto step = hooks::test_step;
  static constexpr auto model_eval = hooks::on_test_model_eval;
  static constexpr auto model_train = hooks::on_test_model_train;
  static constexpr auto start = hooks::on_test_start;
  static constexpr auto end = hooks::on_test_end;
  static constexpr auto epoch_start = hooks::on_test_epoch_start;
  static constexpr auto epoch_end = hooks::on_test_epoch_end;
  static constexpr auto batch_start = hooks::on_test_batch_start;
  static constexpr auto batch_end = hooks::on_test_batch_end;
};

/// How an evaluation run is embedded: on its own, inside fit, or as fit's sanity check (whose
/// metrics are discarded, as Lightning does).
enum class EvaluationMode { standalone, inside_fit, sanity_check };

template <class Kind, class Host, class Module, class Data>
class EvaluationLoop {
  static constexpr bool several = data::several_loaders<Data>;

 public:
  EvaluationLoop(Host& host, HookCallerOf<Host, Module>& hook, Data& data, detail::MetricViews& views)
      : host_(host), hook_(hook), data_(data), views_(views) {}

  /// At most max_batches batches (-1: all of them). Under several loaders, 0 runs none and anything
  /// else runs each loader to its own limit (limit_*_batches; num_sanity_val_steps in the sanity check).
  EvaluationResult run(std::int64_t max_batches, EvaluationMode mode) {
    // Every hook of the run too, not only the steps (Lightning's _no_grad_context around run).
    // A guard that sets grad mode to what it is (standalone, where InferenceMode turns it off) or off:
    // std::optional<NoGradGuard> does the same, but GCC warns it may be read uninitialized at -O1 and up.
    const c10::AutoGradMode grad_mode(mode == EvaluationMode::standalone && c10::GradMode::is_enabled());
    std::optional<c10::InferenceMode> inference;
    if (mode == EvaluationMode::standalone) inference.emplace();
    StepContext& ctx = hook_.ctx();
    // Restored however run ends: an exception must not leave ctx pointing at this loop's metrics,
    // which may be gone when on_exception runs (found by ASan).
    const RestoreContext restore{ctx, {ctx.metrics(), ctx.batch_idx, ctx.sanity_checking, ctx.dataloader_idx}};
    metrics_.reset();
    metrics_.set_device(host_.device());
    metrics_.set_views(mode == EvaluationMode::sanity_check ? nullptr : &views_);  // the sanity check publishes nothing
    ctx.attach(&metrics_);
    ctx.sanity_checking = mode == EvaluationMode::sanity_check;
    if constexpr (requires { data_.set_epoch(ctx.current_epoch); })
      if (mode != EvaluationMode::standalone) data_.set_epoch(ctx.current_epoch);  // a sampler may follow fit's epoch
    const std::vector<std::int64_t> caps = loader_caps(max_batches, mode);
    if (TrainerView* view = hook_.view()) view->set_num_evaluation_batches(total_batches(caps));
    losses_.assign(caps.size(), LossSum{});
    if (seen_batches_.size() < caps.size()) seen_batches_.resize(caps.size(), 0);
    ModuleModes modes(hook_.module());
    hook_.call_or_default(Kind::model_eval, [&] { hook_.module().eval(); });
    hook_(Kind::start);
    hook_(Kind::epoch_start);
    std::int64_t batches = 0;
    if constexpr (several) {
      data_.each([&](auto& loader, std::int64_t idx) {
        ctx.dataloader_idx = idx;
        batches += run_batches(loader, caps[static_cast<std::size_t>(idx)], idx);
      });
      ctx.dataloader_idx.reset();  // what the epoch-end hooks log belongs to every loader
    } else {
      batches = run_batches(data_, caps.front(), 0);
    }
    if (batches == 0 && max_batches != 0) raise_no_evaluation_batches(Kind::what, mode == EvaluationMode::standalone);
    EvaluationResult result = finish_epoch(mode);
    hook_(Kind::end);
    hook_.call_or(Kind::model_train, [&] { modes.restore(); });
    return result;
  }

  /// Each loader's result of the last run, in dataloader_idx order (Lightning's list of dicts): its
  /// own "<name>/dataloader_idx_<i>" values, what was logged outside the steps, and its loss.
  std::vector<EvaluationResult> results() const { return per_loader_; }

 private:
  struct ContextState {
    detail::MetricCollection* metrics;
    std::int64_t batch_idx;
    bool sanity_checking;
    std::optional<std::int64_t> dataloader_idx;
  };
  struct RestoreContext {
    StepContext& ctx;
    ContextState saved;
    ~RestoreContext() {
      ctx.attach(saved.metrics);
      ctx.batch_idx = saved.batch_idx;
      ctx.sanity_checking = saved.sanity_checking;
      ctx.dataloader_idx = saved.dataloader_idx;
    }
  };
  struct LossSum {
    at::Tensor sum;
    double weight = 0.0;
  };

  /// The batches each loader may run: max_batches for one loader; each loader's own limit for several.
  std::vector<std::int64_t> loader_caps(std::int64_t max_batches, EvaluationMode mode) {
    if constexpr (!several) {
      return {max_batches};
    } else {
      std::vector<std::int64_t> caps;
      const TrainerConfig& config = host_.config();
      data_.each([&](auto& loader, std::int64_t) {
        std::int64_t cap = max_batches == 0 ? 0 : batch_limit(loader, config.*Kind::limit, Kind::limit_name);
        if (mode == EvaluationMode::sanity_check && config.num_sanity_val_steps >= 0)
          cap = cap < 0 ? config.num_sanity_val_steps : std::min(cap, config.num_sanity_val_steps);
        caps.push_back(cap);
      });
      return caps;
    }
  }
  /// The batches this run will take over all loaders (-1 when a loader cannot tell its length).
  std::int64_t total_batches(const std::vector<std::int64_t>& caps) {
    std::int64_t total = 0;
    std::size_t i = 0;
    auto add = [&](auto& loader) {
      std::int64_t batches = caps[i++];
      if (const auto length = sized_length(loader)) batches = batches < 0 ? *length : std::min(batches, *length);
      if (batches < 0 || total < 0) total = -1;
      else total += batches;
    };
    if constexpr (several) data_.each([&](auto& loader, std::int64_t) { add(loader); });
    else add(data_);
    return total;
  }

  template <class Loader>
  std::int64_t run_batches(Loader& loader, std::int64_t max_batches, std::int64_t dataloader_idx) {
    std::int64_t batch_idx = 0;
    if (max_batches == 0) return 0;
    for_each_batch(loader, Kind::what, hook_, &Kind::next, [&](const auto& raw) {
      run_batch(raw, batch_idx++, dataloader_idx);
      return !(max_batches >= 0 && batch_idx >= max_batches);
    });
    return batch_idx;
  }

  template <class RawBatch>
  void run_batch(const RawBatch& raw, std::int64_t batch_idx, std::int64_t dataloader_idx) {
    StepContext& ctx = hook_.ctx();
    ctx.batch_idx = batch_idx;
    const auto batch = prepare_batch(host_, hook_, raw, Kind::step.name, dataloader_idx);
    const std::int64_t batch_size = data::extract_batch_size(batch);
    metrics_.set_batch_size(batch_size);
    using B = std::remove_cvref_t<decltype(batch)>;
    if constexpr (several) {
      // Lightning refuses a module hook that cannot tell the loaders apart; so does the compiler.
      constexpr bool start_ok = takes_dataloader_idx<decltype(Kind::batch_start), const B, const std::int64_t>;
      constexpr bool step_ok = takes_dataloader_idx<decltype(Kind::step), const B, const std::int64_t>;
      static_assert(start_ok, "fulgur: several evaluation loaders were given, but the module's batch-start hook "
                              "(on_validation_batch_start / on_test_batch_start) takes no dataloader_idx: add a "
                              "std::int64_t dataloader_idx after batch_idx (Lightning: \"You provided multiple "
                              "dataloaders, but no `dataloader_idx` argument\").");
      static_assert(step_ok, "fulgur: several evaluation loaders were given, but validation_step / test_step takes "
                             "no dataloader_idx: write it (batch, batch_idx, std::int64_t dataloader_idx) (Lightning: "
                             "\"You provided multiple dataloaders, but no `dataloader_idx` argument\").");
      if constexpr (start_ok && step_ok) {
        hook_.call_with_dataloader_idx(Kind::batch_start, dataloader_idx, batch, batch_idx);
        const auto output = run_step(host_, hook_, Kind::step, batch, dataloader_idx);
        constexpr bool end_ok = takes_dataloader_idx<decltype(Kind::batch_end), const std::remove_cvref_t<decltype(output)>,
                                                     const B, const std::int64_t>;
        static_assert(end_ok, "fulgur: several evaluation loaders were given, but the module's batch-end hook "
                              "(on_validation_batch_end / on_test_batch_end) takes no dataloader_idx: add a "
                              "std::int64_t dataloader_idx after batch_idx (Lightning: \"You provided multiple "
                              "dataloaders, but no `dataloader_idx` argument\").");
        if constexpr (has_loss<std::remove_cvref_t<decltype(output)>>) add_loss(loss_of(output), batch_size, dataloader_idx);
        if constexpr (end_ok) hook_.call_with_dataloader_idx(Kind::batch_end, dataloader_idx, output, batch, batch_idx);
      }
    } else {
      hook_(Kind::batch_start, batch, batch_idx);
      const auto output = run_step(host_, hook_, Kind::step, batch);
      if constexpr (has_loss<std::remove_cvref_t<decltype(output)>>) add_loss(loss_of(output), batch_size, 0);
      hook_(Kind::batch_end, output, batch, batch_idx);
    }
    metrics_.sync_step_values(all_reduce());
    if (ctx.sanity_checking) return;
    if constexpr (callbacks_of<Host>::has_loggers) {  // Lightning's update_eval_step_metrics
      Metrics logged;
      metrics_.collect_step_logged(logged);
      // each loader counts its own batches (Lightning's _seen_batches_per_dataloader)
      std::int64_t& seen = seen_batches_[static_cast<std::size_t>(dataloader_idx)];
      if (!logged.empty()) hook_.view()->log_metrics(logged, seen);
      ++seen;
    }
    metrics_.publish_step(views_);
  }

  /// Whether the module's hook can be called with dataloader_idx after these arguments (or defines
  /// no such hook at all).
  template <class Hook, class... Args>
  static constexpr bool takes_dataloader_idx =
      !Hook::template named_in<Module> || Hook::template defined_for<Module, Args..., std::int64_t> ||
      (std::is_final_v<Module> && !Hook::template defined_for<Module, Args...>);

  void add_loss(const at::Tensor& loss, std::int64_t batch_size, std::int64_t dataloader_idx) {
    LossSum& sum = losses_[static_cast<std::size_t>(dataloader_idx)];
    const at::Tensor value = loss.detach().reshape({});
    if (!sum.sum.defined()) sum.sum = at::zeros({}, value.options().dtype(detail::accumulation_dtype(value.device())));
    sum.sum.add_(value, static_cast<double>(batch_size));
    sum.weight += static_cast<double>(batch_size);
  }

  /// The loss of one loader over every rank's data, published under `name`; nullopt when its step
  /// returned none.
  std::optional<double> finish_loss(LossSum& sum, const std::string& name, bool publish, EvaluationResult& result) {
    if (!sum.sum.defined()) return std::nullopt;
    const at::Tensor totals =
        host_.all_reduce(at::stack({sum.sum, at::scalar_tensor(sum.weight, sum.sum.options())}), ReduceOp::sum);
    const at::Tensor mean = totals[0] / totals[1];
    const double value = mean.template item<double>();
    if (publish && !metrics_.logs(name)) {  // the module's own val_loss wins
      views_.callback.set(name, mean);
      views_.logged.set(name, mean);
    }
    if (!std::isfinite(value))
      result.warnings.push_back(non_finite_evaluation_warning(Kind::what, Kind::step.name, value, hook_.ctx(),
                                                              host_.is_global_zero()));
    sum = LossSum{};
    return value;
  }

  EvaluationResult finish_epoch(EvaluationMode mode) {
    EvaluationResult result;
    const bool publish = mode != EvaluationMode::sanity_check;
    if (publish) metrics_.publish_epoch(views_, all_reduce());  // what on_*_epoch_end may read
    hook_(Kind::epoch_end);
    detail::MetricViews epoch;  // this run's epoch values: the result (Lightning's validate() output)
    metrics_.publish_epoch(epoch, all_reduce());
    if (publish) metrics_.publish_epoch(views_, all_reduce());  // with what on_*_epoch_end logged
    const Metrics logged = epoch.logged.to_host();
    if constexpr (!several) {
      result.loss = finish_loss(losses_.front(), std::string(Kind::loss_name), publish, result);
      result.metrics = logged;
      if (result.loss && !result.metrics.contains(std::string(Kind::loss_name)))
        result.metrics[std::string(Kind::loss_name)] = *result.loss;
    } else {
      per_loader_.assign(losses_.size(), EvaluationResult{});
      for (std::size_t i = 0; i < losses_.size(); ++i) {
        EvaluationResult& own = per_loader_[i];
        const std::string suffix = "/dataloader_idx_" + std::to_string(i);
        for (const auto& [name, value] : logged)  // its own values and those of no loader (epoch hooks)
          if (name.ends_with(suffix) || name.find("/dataloader_idx_") == std::string::npos) own.metrics[name] = value;
        const std::string loss_name = std::string(Kind::loss_name) + suffix;
        own.loss = finish_loss(losses_[i], loss_name, publish, own);
        if (own.loss && !own.metrics.contains(loss_name)) own.metrics[loss_name] = *own.loss;
        result.metrics.insert(own.metrics.begin(), own.metrics.end());
        result.warnings.insert(result.warnings.end(), own.warnings.begin(), own.warnings.end());
      }
    }
    if constexpr (callbacks_of<Host>::has_loggers)
      if (publish && !result.metrics.empty()) send_to_loggers(result.metrics);
    return result;
  }

  /// The run's epoch values to the loggers, at the logging step, with the epoch (Lightning's
  /// update_eval_epoch_metrics).
  void send_to_loggers(Metrics metrics) {
    TrainerView& view = *hook_.view();
    metrics.emplace("epoch", static_cast<double>(view.current_epoch()));
    view.log_metrics(metrics, view.logging_step());
  }

  auto all_reduce() {
    return [this](const at::Tensor& t, ReduceOp op) { return host_.all_reduce(t, op); };
  }

  Host& host_;
  HookCallerOf<Host, Module>& hook_;
  Data& data_;
  detail::MetricViews& views_;
  detail::MetricCollection metrics_{/*training=*/false};
  std::vector<LossSum> losses_;             // one per loader
  std::vector<EvaluationResult> per_loader_;  // several loaders: the last run's result of each
  // per loader: the step of evaluation step values sent to loggers (across runs, as Lightning)
  std::vector<std::int64_t> seen_batches_;
};

/// Trainer::validate and Trainer::test: one run over the data, as an evaluation stage.
template <class Kind, class Host, class Module, class Data>
auto evaluate(Host& host, Module& module, Data& data, const EvaluationWeights& weights = {}) {
  if constexpr (!loop_host<Host>) {
    static_assert(assert_loop_host<Host>());
    return EvaluationResult{};
  } else {
    return run_evaluation_stage(host, module, data, Kind::stage, weights, [&](auto& hook, auto& loader, detail::MetricViews& views) {
      const BatchAmount& limit = host.config().*Kind::limit;
      require_batches(loader, limit, Kind::what, std::string("give it samples, or check ") + Kind::limit_name + ".");
      using Loader = std::remove_reference_t<decltype(loader)>;
      EvaluationLoop<Kind, Host, Module, Loader> loop(host, hook, loader, views);
      EvaluationResult result = loop.run(batch_limit(loader, limit, Kind::limit_name), EvaluationMode::standalone);
      if constexpr (data::several_loaders<Loader>) return loop.results();  // one result per loader, as Lightning
      else return result;
    });
  }
}

}  // namespace fulgur::loops
