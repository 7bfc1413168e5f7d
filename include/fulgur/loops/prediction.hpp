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
#include <type_traits>
#include <vector>

#include "fulgur/data/apply.hpp"
#include "fulgur/hooks.hpp"
#include "fulgur/loops/common.hpp"
#include "fulgur/loops/step.hpp"

namespace fulgur::loops {

template <class Host, class Module, class Data>
class PredictionLoop {
  using Output = step_output_t<Host, Module, hooks::predict_step_t,
                               decltype(prepare_batch(std::declval<Host&>(), std::declval<HookCallerOf<Host, Module>&>(),
                                                      std::declval<const batch_of_t<Data>&>(), ""))>;

 public:
  PredictionLoop(Host& host, HookCallerOf<Host, Module>& hook, Data& data) : host_(host), hook_(hook), data_(data) {}

  /// At most max_batches batches (-1: all of them).
  auto run(std::int64_t max_batches) {
    static_assert(!std::is_same_v<Output, NoOutput>,
                  "fulgur: predict_step returns nothing; return the prediction (a tensor, or tensors in a struct "
                  "map_tensors can walk).");
    std::vector<decltype(to_cpu(std::declval<const Output&>()))> predictions;
    c10::InferenceMode inference;
    ModuleModes modes(hook_.module());
    hook_.call_or(hooks::on_predict_model_eval, [&] { hook_.module().eval(); });
    hook_(hooks::on_predict_start);
    hook_(hooks::on_predict_epoch_start);
    std::int64_t batch_idx = 0;
    if (max_batches != 0)
      for (auto&& raw : data_) {
        predictions.push_back(run_batch(raw, batch_idx++));
        if (max_batches >= 0 && batch_idx >= max_batches) break;
      }
    hook_(hooks::on_predict_epoch_end);
    hook_(hooks::on_predict_end);
    modes.restore();
    return predictions;
  }

 private:
  template <class RawBatch>
  auto run_batch(const RawBatch& raw, std::int64_t batch_idx) {
    hook_.ctx().batch_idx = batch_idx;
    const auto batch = prepare_batch(host_, hook_, raw, "predict_step");
    hook_(hooks::on_predict_batch_start, batch, batch_idx);
    auto prediction = to_cpu(run_step(host_, hook_, hooks::predict_step, batch));
    hook_(hooks::on_predict_batch_end, prediction, batch, batch_idx);
    return prediction;
  }

  auto to_cpu(const Output& output) {
    return data::map_tensors(host_.convert_output(output), [](const at::Tensor& t) { return t.defined() ? t.cpu() : t; });
  }

  Host& host_;
  HookCallerOf<Host, Module>& hook_;
  Data& data_;
};

/// Trainer::predict: one run over the data, as an evaluation stage.
template <class Host, class Module, class Data>
auto predict(Host& host, Module& module, Data& data) {
  if constexpr (!loop_host<Host>) {
    static_assert(assert_loop_host<Host>());
    return 0;  // never reached: the static_assert above is the one error
  } else {
    return run_evaluation_stage(host, module, data, Stage::predict, [&](auto& hook, auto& loader, detail::MetricViews&) {
      require_batches(loader, host.config().limit_predict_batches, "predict",
                      "give it samples, or check limit_predict_batches.");  // as validate and test do
      PredictionLoop<Host, Module, std::remove_reference_t<decltype(loader)>> loop(host, hook, loader);
      return loop.run(batch_limit(loader, host.config().limit_predict_batches, "limit_predict_batches"));
    });
  }
}

}  // namespace fulgur::loops
