#pragma once
// The prediction loop (Lightning's Trainer.predict), in Lightning's order:
//
//   on_predict_model_eval (default: module.eval()), on_predict_start, on_predict_epoch_start
//   per batch: transfer hooks, on_predict_batch_start, predict_step, on_predict_batch_end
//   on_predict_epoch_end, on_predict_end
//
// In inference mode. Each prediction is converted back to the default dtype by the precision
// (fp32 under '16-true' or 'bf16-mixed') and moved to the CPU, and they are returned in the
// order of the batches. Under DDP each rank returns the predictions of its own shard, as
// Lightning's predict does.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fulgur/data/apply.hpp"
#include "fulgur/hooks.hpp"
#include "fulgur/loops/common.hpp"
#include "fulgur/loops/step.hpp"

namespace fulgur::loops {

template <class Host, class Module, class Data>
class PredictionLoop {
  static constexpr bool several = data::several_loaders<Data>;

 public:
  PredictionLoop(Host& host, HookCallerOf<Host, Module>& hook, Data& data) : host_(host), hook_(hook), data_(data) {}

  /// At most max_batches batches (-1: all of them); several loaders: each to limit_predict_batches.
  auto run(std::int64_t max_batches) {
    c10::InferenceMode inference;
    ModuleModes modes(hook_.module());
    hook_.call_or_default(hooks::on_predict_model_eval, [&] { hook_.module().eval(); });
    hook_(hooks::on_predict_start);
    hook_(hooks::on_predict_epoch_start);
    auto predictions = [&] {
      if constexpr (several) {
        using Prediction =
            typename decltype(common_prediction(std::type_identity<typename Data::loader_types>{}))::type;
        std::vector<std::vector<Prediction>> out;
        StepContext& ctx = hook_.ctx();
        data_.each([&](auto& loader, std::int64_t idx) {
          ctx.dataloader_idx = idx;
          const std::int64_t cap =
              max_batches == 0 ? 0 : batch_limit(loader, host_.config().limit_predict_batches, "limit_predict_batches");
          out.push_back(run_loader<Prediction>(loader, cap, idx));
        });
        ctx.dataloader_idx.reset();
        return out;
      } else {
        return run_loader<typename decltype(prediction_of(std::type_identity<Data>{}))::type>(data_, max_batches, 0);
      }
    }();
    hook_(hooks::on_predict_epoch_end);
    hook_(hooks::on_predict_end);
    modes.restore();
    return predictions;
  }

 private:
  template <class Prediction, class Loader>
  std::vector<Prediction> run_loader(Loader& loader, std::int64_t max_batches, std::int64_t dataloader_idx) {
    std::vector<Prediction> predictions;
    std::int64_t batch_idx = 0;
    if (max_batches != 0)
      for_each_batch(loader, "prediction", hook_, [] { return profiling::named<"[_PredictionLoop].predict_next">(); },
                     [&](const auto& raw) {
                       predictions.push_back(run_batch(raw, batch_idx++, dataloader_idx));
                       return !(max_batches >= 0 && batch_idx >= max_batches);
                     });
    return predictions;
  }

  template <class RawBatch>
  auto run_batch(const RawBatch& raw, std::int64_t batch_idx, std::int64_t dataloader_idx) {
    hook_.ctx().batch_idx = batch_idx;
    const auto batch = prepare_batch(host_, hook_, raw, "predict_step", dataloader_idx);
    if constexpr (several) {
      hook_.call_with_dataloader_idx(hooks::on_predict_batch_start, dataloader_idx, batch, batch_idx);
      auto prediction = to_cpu(checked(run_step(host_, hook_, hooks::predict_step, batch, dataloader_idx)));
      hook_.call_with_dataloader_idx(hooks::on_predict_batch_end, dataloader_idx, prediction, batch, batch_idx);
      return prediction;
    } else {
      hook_(hooks::on_predict_batch_start, batch, batch_idx);
      auto prediction = to_cpu(checked(run_step(host_, hook_, hooks::predict_step, batch)));
      hook_(hooks::on_predict_batch_end, prediction, batch, batch_idx);
      return prediction;
    }
  }

  template <class Output>
  static const Output& checked(const Output& output) {
    static_assert(!std::is_same_v<Output, NoOutput>,
                  "fulgur: predict_step returns nothing; return the prediction (a tensor, or tensors in a struct "
                  "map_tensors can walk).");
    return output;
  }
  template <class Output>
  auto to_cpu(const Output& output) {
    if constexpr (std::is_same_v<Output, NoOutput>) return output;  // checked() said why
    else return data::map_tensors(host_.convert_output(output), [](const at::Tensor& t) { return t.defined() ? t.cpu() : t; });
  }

  // What predict_step gives for a loader's batches, on the CPU: asked in function bodies, where the
  // class is complete (clang refuses the member access in an alias at class scope).
  template <class Loader>
  static auto prediction_of(std::type_identity<Loader>) {
    return std::type_identity<decltype(std::declval<PredictionLoop&>().run_batch(
        std::declval<const batch_of_t<Loader>&>(), std::int64_t{}, std::int64_t{}))>{};
  }
  template <class... Ls>
  static auto common_prediction(std::type_identity<std::tuple<Ls...>>) {
    return std::type_identity<std::common_type_t<typename decltype(prediction_of(std::type_identity<Ls>{}))::type...>>{};
  }

  Host& host_;
  HookCallerOf<Host, Module>& hook_;
  Data& data_;
};

/// Trainer::predict: one run over the data, as an evaluation stage.
template <class Host, class Module, class Data>
auto predict(Host& host, Module& module, Data& data, const EvaluationWeights& weights = {}) {
  if constexpr (!loop_host<Host>) {
    static_assert(assert_loop_host<Host>());
    return 0;  // never reached: the static_assert above is the one error
  } else {
    return run_evaluation_stage(host, module, data, Stage::predict, weights, [&](auto& hook, auto& loader, detail::MetricViews&) {
      require_batches(loader, host.config().limit_predict_batches, "predict",
                      "give it samples, or check limit_predict_batches.");  // as validate and test do
      PredictionLoop<Host, Module, std::remove_reference_t<decltype(loader)>> loop(host, hook, loader);
      return loop.run(batch_limit(loader, host.config().limit_predict_batches, "limit_predict_batches"));
    });
  }
}

}  // namespace fulgur::loops
