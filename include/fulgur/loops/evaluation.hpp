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

#include "fulgur/concepts/training_module.hpp"
#include "fulgur/data/apply.hpp"
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
  static constexpr Stage stage = Stage::validate;
  static constexpr auto limit = &TrainerConfig::limit_val_batches;
  static constexpr const char* limit_name = "limit_val_batches";
  static constexpr std::string_view loss_name = "val_loss";
  static constexpr std::string_view what = "validation";
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
  static constexpr Stage stage = Stage::test;
  static constexpr auto limit = &TrainerConfig::limit_test_batches;
  static constexpr const char* limit_name = "limit_test_batches";
  static constexpr std::string_view loss_name = "test_loss";
  static constexpr std::string_view what = "test";
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
 public:
  EvaluationLoop(Host& host, HookCallerOf<Host, Module>& hook, Data& data, detail::MetricViews& views)
      : host_(host), hook_(hook), data_(data), views_(views) {}

  /// At most max_batches batches (-1: all of them).
  EvaluationResult run(std::int64_t max_batches, EvaluationMode mode) {
    // Every hook of the run too, not only the steps (Lightning's _no_grad_context around run).
    std::optional<torch::NoGradGuard> no_grad;
    std::optional<c10::InferenceMode> inference;
    if (mode == EvaluationMode::standalone)
      inference.emplace();
    else
      no_grad.emplace();
    StepContext& ctx = hook_.ctx();
    // Restored however run ends: an exception must not leave ctx pointing at this loop's metrics,
    // which may be gone when on_exception runs (found by ASan).
    const RestoreContext restore{ctx, {ctx.metrics(), ctx.batch_idx, ctx.sanity_checking}};
    metrics_.reset();
    metrics_.set_device(host_.device());
    metrics_.set_views(mode == EvaluationMode::sanity_check ? nullptr : &views_);  // the sanity check publishes nothing
    ctx.attach(&metrics_);
    ctx.sanity_checking = mode == EvaluationMode::sanity_check;
    if constexpr (requires { data_.set_epoch(ctx.current_epoch); })
      if (mode != EvaluationMode::standalone) data_.set_epoch(ctx.current_epoch);  // a sampler may follow fit's epoch
    if (TrainerView* view = hook_.view()) {
      std::int64_t batches = max_batches;
      if (const auto length = sized_length(data_)) batches = batches < 0 ? *length : std::min(batches, *length);
      view->set_num_evaluation_batches(batches);
    }
    ModuleModes modes(hook_.module());
    hook_.call_or(Kind::model_eval, [&] { hook_.module().eval(); });
    hook_(Kind::start);
    hook_(Kind::epoch_start);
    const std::int64_t batches = run_batches(max_batches);
    if (batches == 0 && max_batches != 0) raise_no_evaluation_batches(Kind::what, mode == EvaluationMode::standalone);
    EvaluationResult result = finish_epoch(mode);
    hook_(Kind::end);
    hook_.call_or(Kind::model_train, [&] { modes.restore(); });
    return result;
  }

 private:
  struct ContextState {
    detail::MetricCollection* metrics;
    std::int64_t batch_idx;
    bool sanity_checking;
  };
  struct RestoreContext {
    StepContext& ctx;
    ContextState saved;
    ~RestoreContext() {
      ctx.attach(saved.metrics);
      ctx.batch_idx = saved.batch_idx;
      ctx.sanity_checking = saved.sanity_checking;
    }
  };

  std::int64_t run_batches(std::int64_t max_batches) {
    std::int64_t batch_idx = 0;
    if (max_batches == 0) return 0;
    for (auto&& raw : data_) {
      run_batch(raw, batch_idx++);
      if (max_batches >= 0 && batch_idx >= max_batches) break;
    }
    return batch_idx;
  }

  template <class RawBatch>
  void run_batch(const RawBatch& raw, std::int64_t batch_idx) {
    StepContext& ctx = hook_.ctx();
    ctx.batch_idx = batch_idx;
    const auto batch = prepare_batch(host_, hook_, raw, Kind::step.name);
    const std::int64_t batch_size = data::extract_batch_size(batch);
    metrics_.set_batch_size(batch_size);
    hook_(Kind::batch_start, batch, batch_idx);
    const auto output = run_step(host_, hook_, Kind::step, batch);
    if constexpr (has_loss<std::remove_cvref_t<decltype(output)>>) add_loss(loss_of(output), batch_size);
    hook_(Kind::batch_end, output, batch, batch_idx);
    metrics_.sync_step_values(all_reduce());
    if (ctx.sanity_checking) return;
    if constexpr (callbacks_of<Host>::has_loggers) {  // Lightning's update_eval_step_metrics
      Metrics logged;
      metrics_.collect_step_logged(logged);
      if (!logged.empty()) hook_.view()->log_metrics(logged, seen_batches_);
      ++seen_batches_;
    }
    metrics_.publish_step(views_);
  }

  void add_loss(const at::Tensor& loss, std::int64_t batch_size) {
    const at::Tensor value = loss.detach().reshape({});
    if (!loss_sum_.defined()) loss_sum_ = at::zeros({}, value.options().dtype(detail::accumulation_dtype(value.device())));
    loss_sum_.add_(value, static_cast<double>(batch_size));
    loss_weight_ += static_cast<double>(batch_size);
  }

  EvaluationResult finish_epoch(EvaluationMode mode) {
    EvaluationResult result;
    const bool publish = mode != EvaluationMode::sanity_check;
    if (publish) metrics_.publish_epoch(views_, all_reduce());  // what on_*_epoch_end may read
    hook_(Kind::epoch_end);
    detail::MetricViews epoch;  // this run's epoch values: the result (Lightning's validate() output)
    metrics_.publish_epoch(epoch, all_reduce());
    if (publish) metrics_.publish_epoch(views_, all_reduce());  // with what on_*_epoch_end logged
    if (loss_sum_.defined()) {
      const at::Tensor totals =
          host_.all_reduce(at::stack({loss_sum_, at::scalar_tensor(loss_weight_, loss_sum_.options())}), ReduceOp::sum);
      const at::Tensor mean = totals[0] / totals[1];
      result.loss = mean.template item<double>();
      if (publish && !metrics_.logs(Kind::loss_name)) {  // the module's own val_loss wins
        views_.callback.set(Kind::loss_name, mean);
        views_.logged.set(Kind::loss_name, mean);
      }
      if (!std::isfinite(*result.loss))
        result.warnings.push_back(non_finite_evaluation_warning(Kind::what, Kind::step.name, *result.loss, hook_.ctx(),
                                                                host_.is_global_zero()));
    }
    for (const auto& [name, value] : epoch.logged.to_host()) result.metrics[name] = value;
    if (result.loss && !result.metrics.contains(std::string(Kind::loss_name)))
      result.metrics[std::string(Kind::loss_name)] = *result.loss;
    if constexpr (callbacks_of<Host>::has_loggers)
      if (publish && !result.metrics.empty()) send_to_loggers(result.metrics);
    loss_sum_ = at::Tensor();
    loss_weight_ = 0.0;
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
  at::Tensor loss_sum_;
  double loss_weight_ = 0.0;
  std::int64_t seen_batches_ = 0;  // the step of evaluation step values sent to loggers (across runs, as Lightning)
};

/// Trainer::validate and Trainer::test: one run over the data, as an evaluation stage.
template <class Kind, class Host, class Module, class Data>
EvaluationResult evaluate(Host& host, Module& module, Data& data) {
  if constexpr (!loop_host<Host>) {
    static_assert(assert_loop_host<Host>());
    return {};
  } else {
    return run_evaluation_stage(host, module, data, Kind::stage, [&](auto& hook, auto& loader, detail::MetricViews& views) {
      const BatchAmount& limit = host.config().*Kind::limit;
      require_batches(loader, limit, Kind::what, std::string("give it samples, or check ") + Kind::limit_name + ".");
      EvaluationLoop<Kind, Host, Module, std::remove_reference_t<decltype(loader)>> loop(host, hook, loader, views);
      return loop.run(batch_limit(loader, limit, Kind::limit_name), EvaluationMode::standalone);
    });
  }
}

}  // namespace fulgur::loops
