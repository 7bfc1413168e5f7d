#pragma once
// The policy matrix for any model: one Google Benchmark per compatible (accelerator, strategy,
// precision) of fulgur's shipped lists, each timing Trainer::fit beside the same training written
// by hand against LibTorch (the module's own training_step and configure_optimizers, autocast and
// GradScaler by hand), in one process, alternating which goes first.
//
//   int main(int argc, char** argv) {
//     fulgur::bench::register_matrix("my_model", [] { return MyModel(); }, [] { return my_batches(); });
//     return fulgur::bench::run_matrix(argc, argv);  // threads, flag check, exit status
//   }
//
// This header is not installed with fulgur: from a find_package(fulgur) project, add fulgur's
// bench/ folder to the include path and link benchmark::benchmark (docs/benchmarks.md).
//
// Each row first runs one untimed epoch of each side (fulgur's first, so a model that fails is
// reported with fulgur's message, which names the step, batch and dtype), then times epochs of
// both, alternating which goes first. Counters per row: hand_us and fulgur_us (median
// microseconds per step), ratio (median of fulgur / hand over the repetitions; fulgur's goal:
// <= 1.02), items_per_s (samples or tokens a second through fulgur), peak_mib (the process's peak
// resident memory during fulgur's timed epochs on the CPU: LibTorch, the batches, both models and
// the allocator's caches included; the CUDA allocator's peak on a GPU), threads (LibTorch's
// intra-op threads) and skipped_steps (optimizer steps the loss scaler skipped in fulgur's timed
// epochs). A row is reported as an error
//   "skipped: ..."  when it cannot run here (CUDA without a GPU; DDP, which needs several ranks), or
//                   when the loss scaler skipped optimizer steps in the timed epochs (the time would
//                   be that of steps that did not update the model);
//   "failed: fulgur: ..." / "failed: hand-written loop: ..."  when one side threw (a NaN loss in
//                   '16-true', say), with the whole message.
// run_matrix returns 1 when a row failed (not when one was skipped).
//
// The hand-written loop calls the module as fulgur's loops do: training_step(batch, batch_idx) or
// training_step(batch, batch_idx, StepContext&) (log() records into a metric collection, as in
// fit; no logger), configure_optimizers returning an optimizer, an OptimizerConfig (a stepwise
// scheduler is stepped at its interval) or a vector of them (manual optimization), any batch type
// fulgur::data::map_tensors traverses.
#include <benchmark/benchmark.h>
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define FULGUR_BENCH_CUDA_MEMORY 1
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <ranges>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace fulgur::bench {

struct MatrixOptions {
  /// Samples (or tokens) in one batch, for items_per_s; unset: the first batch's size
  /// (fulgur::data::extract_batch_size, Lightning's rule: the first dimension of its first tensor).
  std::optional<double> items_per_batch{};
  double min_time_s = 2.0;  ///< Google Benchmark's MinTime for each combination (> 0)
};

namespace detail {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// The registered rows, for run_matrix to apply --benchmark_min_time (a row's own MinTime wins
/// over the flag in Google Benchmark).
inline std::vector<benchmark::internal::Benchmark*>& registered() {
  static std::vector<benchmark::internal::Benchmark*> rows;
  return rows;
}

/// Rows that failed (not skipped) in this process: run_matrix's exit status.
inline int& failed_rows() {
  static int count = 0;
  return count;
}

/// An exception's whole text on one line: lines joined with " | ", at most `limit` characters.
inline std::string one_line(std::string_view text, std::size_t limit = 2000) {
  std::string out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (!line.empty()) {
      if (!out.empty()) out += " | ";
      out += line;
    }
    start = end + 1;
  }
  if (out.size() > limit) out = out.substr(0, limit - 3) + "...";
  return out;
}

/// "failed: fulgur: <message>" (fulgur's own "fulgur: " prefix is not repeated).
inline std::string failure_text(std::string_view side, std::string_view what) {
  std::string message = one_line(what);
  if (side == "fulgur" && message.rfind("fulgur: ", 0) == 0) message.erase(0, 8);
  return "failed: " + std::string(side) + ": " + message;
}

/// VmHWM, the resident-memory peak, after `reset_peak_rss` (writing 5 to clear_refs resets it).
inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }
inline double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  return 0.0;
}

/// The object behind a TORCH_MODULE holder or a smart pointer, or the object itself.
template <class T>
decltype(auto) module_of(T& object) {
  if constexpr (requires { *object; })
    return *object;
  else
    return (object);
}

template <class P>
inline constexpr bool is_mixed = requires { P::uses_scaler; };
/// Whether fit converts the targets with the inputs (the "-true" precisions that declare it).
template <class P>
inline constexpr bool converts_targets = requires { requires P::converts_targets; };

/// One floating tensor in the precision's dtype (32-true: unchanged).
template <class P>
at::Tensor in_dtype(const at::Tensor& t) {
  if constexpr (requires { P::dtype; })
    if (t.defined() && t.is_floating_point() && t.scalar_type() != P::dtype) return t.to(P::dtype);
  return t;
}

/// The batch on `device`, converted as fit converts it: under a "-true" precision that converts
/// targets every floating tensor, otherwise the model's inputs (Batch.input, Example.data; every
/// tensor of other batch types); token ids and labels stay as they are.
template <class P, class B>
B prepare(const B& raw, c10::Device device) {
  auto on_device = [&](const at::Tensor& t) { return t.defined() ? t.to(device) : t; };
  auto convert = [&](const at::Tensor& t) { return in_dtype<P>(on_device(t)); };
  if constexpr (converts_targets<P>)
    return fulgur::data::map_tensors(raw, convert);
  else if constexpr (std::is_same_v<B, fulgur::data::Batch>)
    return B{convert(raw.input), on_device(raw.target)};
  else if constexpr (requires { raw.data; raw.target; typename B::DataType; })
    return B{fulgur::data::map_tensors(raw.data, convert), fulgur::data::map_tensors(raw.target, on_device)};
  else
    return fulgur::data::map_tensors(raw, convert);
}

/// The loss of a step's output (a tensor, or a struct with a `loss` member).
template <class R>
at::Tensor loss_of(R&& output) {
  if constexpr (std::is_convertible_v<R, at::Tensor>)
    return output;
  else
    return output.loss;
}

/// What the hand-written loop's manual-optimization side does for StepContext (backward, step,
/// clip): LibTorch and a GradScaler, nothing else.
/// A hand-written loop's manual optimization: what a module's manual training_step calls through
/// StepContext (fit's loop implements the same interface through the Trainer's verbs).
struct HandManual final : fulgur::detail::ManualOptimizationLink {
  HandManual(fulgur::GradScaler* scaler_, std::vector<fulgur::OptimizerConfig>* configs_)
      : scaler(scaler_), configs(configs_) {}
  fulgur::GradScaler* scaler = nullptr;  // null: no loss scaling
  std::vector<fulgur::OptimizerConfig>* configs = nullptr;
  std::int64_t steps = 0, skipped = 0;

  void manual_backward(const at::Tensor& loss) override {
    if (scaler != nullptr) scaler->scale(loss).backward();
    else loss.backward();
  }
  bool manual_step(std::size_t index) override {
    torch::optim::Optimizer& optimizer = *(*configs)[index].optimizer;
    bool ran = true;
    if (scaler != nullptr) {
      ran = scaler->step(optimizer);
      scaler->update();
    } else {
      optimizer.step();
    }
    ++steps;
    if (!ran) ++skipped;
    return ran;
  }
  at::Tensor manual_clip(std::size_t index, const fulgur::ClipGradients& clip) override {
    torch::optim::Optimizer& optimizer = *(*configs)[index].optimizer;
    if (scaler != nullptr && scaler->stage(optimizer) == fulgur::GradScaler::Stage::ready) scaler->unscale_(optimizer);
    std::vector<at::Tensor> params;
    for (const auto& group : optimizer.param_groups())
      for (const auto& p : group.params()) params.push_back(p);
    if (clip.max_norm)
      return at::scalar_tensor(torch::nn::utils::clip_grad_norm_(params, *clip.max_norm, clip.norm_type,
                                                                 clip.error_if_nonfinite));
    if (clip.clip_val) torch::nn::utils::clip_grad_value_(params, *clip.clip_val);
    return {};
  }
};

/// hand_written's default: nothing around a step.
struct NoStepHooks {
  void start(std::int64_t) const {}
  void end(std::int64_t) const {}
};

/// The loop a LibTorch user writes for precision P on `device`: the module's training_step, its
/// optimizer (and stepwise scheduler), autocast and a GradScaler by hand where the precision has
/// them. `scaler` lives as long as the row, as the Trainer's does. `hooks.start(i)` and `hooks.end(i)`
/// run before step i's batch is moved to the device and after its optimizer step (bench/compare's
/// timing window). Returns the optimizer steps the scaler skipped.
template <class P, class Holder, class Batches, class Hooks = NoStepHooks>
std::int64_t hand_written(Holder& holder, const Batches& batches, c10::Device device, fulgur::GradScaler& scaler,
                          Hooks&& hooks = {}) {
  constexpr bool mixed = is_mixed<P>;
  constexpr bool scaled = fulgur::detail::uses_scaler<P>();
  auto& module = module_of(holder);
  using M = std::remove_cvref_t<decltype(module)>;
  using B = std::remove_cvref_t<decltype(*std::begin(batches))>;
  constexpr bool takes_context = requires(M& m, const B& b, std::int64_t i, fulgur::StepContext& c) {
    m.training_step(b, i, c);
  };
  constexpr bool automatic = fulgur::detail::automatic_optimization_of<M>();

  module.to(device);
  if constexpr (!mixed && requires { P::dtype; }) module.to(P::dtype);
  std::vector<fulgur::OptimizerConfig> configs = fulgur::detail::to_optimizer_configs(module.configure_optimizers());
  if (configs.empty() || !configs.front().optimizer)
    throw std::invalid_argument("configure_optimizers returned no optimizer");
  if (automatic && configs.size() != 1)
    throw std::invalid_argument("configure_optimizers returned " + std::to_string(configs.size()) +
                                " optimizers under automatic optimization (several need manual optimization)");
  for (auto& config : configs) {
    if (automatic && config.lr_scheduler.reduce_on_plateau())
      throw std::invalid_argument(
          "the matrix's hand-written loop does not step a ReduceLROnPlateau scheduler (it has no monitored metric)");
    config.lr_scheduler.initial_step();  // as fit does when configure_optimizers hands it over
  }
  torch::optim::Optimizer& optimizer = *configs.front().optimizer;

  fulgur::StepContext ctx;
  fulgur::detail::MetricCollection metrics(/*training=*/true);
  HandManual manual(scaled ? &scaler : nullptr, &configs);
  if constexpr (takes_context) {
    metrics.set_device(device);
    ctx.attach(&metrics);
    if constexpr (!automatic) {
      std::vector<fulgur::ManualOptimizer> handles;
      std::vector<fulgur::AnyLRScheduler*> schedulers;
      for (std::size_t i = 0; i < configs.size(); ++i) {
        handles.emplace_back(*configs[i].optimizer, i, manual);
        schedulers.push_back(&configs[i].lr_scheduler);
      }
      ctx.attach_manual(&manual, std::move(handles), std::move(schedulers));
    }
  }
  auto step = [&](const B& batch, std::int64_t index) -> decltype(auto) {
    if constexpr (takes_context) {
      ctx.batch_idx = index;
      ctx.global_step = automatic ? index : manual.steps;
      metrics.set_batch_size(fulgur::data::extract_batch_size(batch));
      ctx.enter("training_step", fulgur::detail::LogScope::step);
      return module.training_step(batch, index, ctx);
    } else {
      return module.training_step(batch, index);
    }
  };

  std::int64_t index = 0, skipped = 0;
  bool any_step_ran = false;
  for (const auto& raw : batches) {
    hooks.start(index);
    const B batch = prepare<P>(raw, device);
    if constexpr (!automatic) {
      if constexpr (mixed) {
        fulgur::AutocastGuard autocast(device.type(), P::dtype);  // restored also when the step throws
        (void)step(batch, index);
      } else {
        (void)step(batch, index);
      }
    } else {
      at::Tensor loss;
      if constexpr (mixed) {
        fulgur::AutocastGuard autocast(device.type(), P::dtype);  // restored also when the step throws
        loss = loss_of(step(batch, index));
      } else {
        loss = loss_of(step(batch, index));
      }
      bool ran = true;
      if constexpr (scaled) {
        scaler.scale(loss).backward();
        ran = scaler.step(optimizer);
        scaler.update();
      } else {
        loss.backward();
        optimizer.step();
      }
      optimizer.zero_grad();
      if (!ran) ++skipped;
      any_step_ran = any_step_ran || ran;
      // Stepwise schedulers at their interval; a step the scaler skipped leaves the rate alone (as in fit).
      auto& config = configs.front();
      if (ran && config.lr_scheduler && config.interval == fulgur::SchedulerInterval::step &&
          (index + 1) % config.frequency == 0)
        config.lr_scheduler.step();
    }
    hooks.end(index);
    ++index;
  }
  if constexpr (automatic) {
    auto& config = configs.front();
    if (any_step_ran && config.lr_scheduler && config.interval == fulgur::SchedulerInterval::epoch &&
        1 % config.frequency == 0)
      config.lr_scheduler.step();
    return skipped;
  } else {
    return manual.skipped;
  }
}

inline void synchronize(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

/// The CUDA caching allocator's peak of allocated memory on a CUDA `device` (MiB) since
/// reset_cuda_peak(device); nullopt on the CPU or where LibTorch's CUDA headers are absent.
inline void reset_cuda_peak([[maybe_unused]] c10::Device device) {
#ifdef FULGUR_BENCH_CUDA_MEMORY
  // The allocator's per-device statistics exist only once CUDA is initialised (before the first allocation
  // they answer "Invalid device argument"): initialise it, as the first tensor on the device would.
  if (device.is_cuda()) {
    at::globalContext().lazyInitDevice(c10::kCUDA);
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  }
#endif
}
inline std::optional<double> cuda_peak_mib([[maybe_unused]] c10::Device device) {
#ifdef FULGUR_BENCH_CUDA_MEMORY
  if (device.is_cuda()) {
    at::globalContext().lazyInitDevice(c10::kCUDA);
    return static_cast<double>(
               c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak) /
           (1024.0 * 1024.0);
  }
#endif
  return std::nullopt;
}

/// Why Trainer T cannot run in this process, or "" if it can.
template <class T>
std::string cannot_run() {
  using A = typename T::accelerator_type;
  using S = typename T::strategy_type;
  if (!A::is_available()) return std::string("skipped: '") + std::string(A::name) + "' is not available on this machine";
  if constexpr (!std::is_same_v<S, fulgur::SingleDeviceStrategy>)
    return "skipped: '" + std::string(S::name) +
           "' needs several ranks and this matrix runs one process (bench_ddp and bench/compare/compare.py --ddp "
           "time fulgur's DDP on their own MLP, not on this model)";
  return "";
}

inline void skip(benchmark::State& state, const std::string& why) {
  state.SkipWithError(why.c_str());
  for (auto _ : state) {
  }
}

/// An exception's text; a LibTorch error's without its C++ backtrace.
inline std::string what_of(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  return e.what();
}

inline void fail(benchmark::State& state, std::string_view side, const std::exception& e) {
  ++failed_rows();
  skip(state, failure_text(side, what_of(e)));
}

template <class T, class MakeModule, class MakeHandModule, class MakeBatches>
void run(benchmark::State& state, MakeModule& make_module, MakeHandModule& make_hand_module, MakeBatches& make_batches,
         const MatrixOptions& options) {
  using P = typename T::precision_type;
  state.counters["threads"] = at::get_num_threads();
  if constexpr (!std::is_same_v<typename T::strategy_type, fulgur::SingleDeviceStrategy>) {
    skip(state, cannot_run<T>());  // not instantiated: fit under DDP needs ranks
  } else {
  if (const std::string why = cannot_run<T>(); !why.empty()) return skip(state, why);
  const auto batches = make_batches();
  const double steps = static_cast<double>(std::ranges::distance(batches));
  double items_per_batch = 1.0;
  if (options.items_per_batch) items_per_batch = *options.items_per_batch;
  else if (steps > 0) items_per_batch = static_cast<double>(fulgur::data::extract_batch_size(*std::begin(batches)));
  T trainer(fulgur::TrainerConfig{.max_epochs = 1, .num_sanity_val_steps = 0, .enable_progress_bar = false});
  const c10::Device device = trainer.device();
  fulgur::GradScaler hand_scaler;  // lives as long as the row, as the trainer's does

  // Warm-up: one untimed epoch each, fulgur's first (its message names the step, batch and dtype).
  try {
    auto model = make_module();
    trainer.fit(model, batches);
    synchronize(device);
  } catch (const std::exception& e) {
    return fail(state, "fulgur", e);
  }
  try {
    auto model = make_hand_module();
    hand_written<P>(model, batches, device, hand_scaler);
    synchronize(device);
  } catch (const std::exception& e) {
    return fail(state, "hand-written loop", e);
  }

  std::vector<double> hand_us, fulgur_us, ratios;
  double peak_mib = 0.0;
  std::int64_t fulgur_skipped = 0, hand_skipped = 0, timed_epochs = 0;
  bool fulgur_first = false;
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    auto hand_model = make_hand_module();
    auto fulgur_model = make_module();
    double t_hand = 0, t_fulgur = 0;
    auto time_hand = [&] {
      const auto t0 = clock::now();
      hand_skipped += hand_written<P>(hand_model, batches, device, hand_scaler);
      synchronize(device);
      t_hand = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / steps;
    };
    auto time_fulgur = [&] {
      reset_peak_rss();
      reset_cuda_peak(device);
      const auto t0 = clock::now();
      const fulgur::FitResult result = trainer.fit(fulgur_model, batches);
      synchronize(device);
      t_fulgur = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / steps;
      fulgur_skipped += result.skipped_optimizer_steps;
      peak_mib = std::max(peak_mib, cuda_peak_mib(device).value_or(peak_rss_mib()));
    };
    const char* side = "fulgur";
    try {  // a combination that fails on this model (e.g. diverges in '16-true') says so and stops
      if (fulgur_first) {
        time_fulgur();
        side = "hand-written loop";
        time_hand();
      } else {
        side = "hand-written loop";
        time_hand();
        side = "fulgur";
        time_fulgur();
      }
    } catch (const std::exception& e) {
      ++failed_rows();
      state.SkipWithError(failure_text(side, what_of(e)).c_str());
      break;
    }
    ++timed_epochs;
    fulgur_first = !fulgur_first;
    hand_us.push_back(t_hand);
    fulgur_us.push_back(t_fulgur);
    ratios.push_back(t_fulgur / t_hand);
    state.SetIterationTime(t_fulgur * 1e-6 * steps);
  }
  if (state.error_occurred()) return;
  state.counters["hand_us"] = median(hand_us);
  state.counters["fulgur_us"] = median(fulgur_us);
  state.counters["ratio"] = median(ratios);
  state.counters["items_per_s"] = items_per_batch * 1e6 / median(fulgur_us);
  state.counters["peak_mib"] = peak_mib;
  state.counters["skipped_steps"] = static_cast<double>(fulgur_skipped);
  if (fulgur_skipped > 0 || hand_skipped > 0) {
    const auto total = static_cast<std::int64_t>(steps) * timed_epochs;
    state.SkipWithError(("skipped: " + std::to_string(fulgur_skipped) + " of " + std::to_string(total) +
                         " steps (fulgur) and " + std::to_string(hand_skipped) + " of " + std::to_string(total) +
                         " (hand-written loop) skipped by the loss scaler (inf/NaN gradients): the timing is of "
                         "skipped steps, so it is not reported")
                            .c_str());
  }
  }
}

/// "min_time_s must be > 0" and friends, at registration (Google Benchmark would abort on its CHECK).
inline void validate(const std::string& name, const MatrixOptions& options) {
  auto bad = [&](const char* field, double value, const char* rule) {
    std::ostringstream text;
    text << "fulgur::bench::register_matrix(\"" << name << "\"): MatrixOptions::" << field << " = " << value
         << " " << rule;
    throw std::invalid_argument(text.str());
  };
  if (!(options.min_time_s > 0) || !std::isfinite(options.min_time_s))
    bad("min_time_s", options.min_time_s, "must be a finite number of seconds > 0");
  if (options.items_per_batch && (!(*options.items_per_batch > 0) || !std::isfinite(*options.items_per_batch)))
    bad("items_per_batch", *options.items_per_batch,
        "must be > 0 (leave it unset to take the first batch's size)");
}

}  // namespace detail

/// Registers "<name>/<accelerator>/<strategy>/<precision>" for every combination of `trainers`
/// (default: every compatible one of the shipped lists). make_module() returns a fresh module (a
/// TORCH_MODULE holder or std::shared_ptr) that Trainer::fit accepts; make_batches() returns the
/// batches of one epoch (on the CPU), a sized range. Throws std::invalid_argument for bad options.
/// register_matrix_versus: the hand-written loop trains make_hand_module()'s module instead (the same
/// network with LibTorch's optimizer where fulgur's side has a fused one: bench/matrix/fused.cpp).
template <class MakeModule, class MakeHandModule, class MakeBatches,
          class Trainers = std::remove_const_t<decltype(shipped_trainers)>>
void register_matrix_versus(const std::string& name, MakeModule make_module, MakeHandModule make_hand_module,
                            MakeBatches make_batches, MatrixOptions options = {}, Trainers trainers = shipped_trainers) {
  using Module = std::remove_cvref_t<decltype(detail::module_of(std::declval<std::invoke_result_t<MakeModule&>&>()))>;
  using Batches = std::remove_cvref_t<std::invoke_result_t<MakeBatches&>>;
  static_assert(std::ranges::sized_range<Batches>,
                "fulgur::bench::register_matrix: make_batches() must return the batches of one epoch as a sized "
                "range (a std::vector, say): the matrix divides an epoch's time by its length.");
  using Batch = std::remove_cvref_t<std::ranges::range_reference_t<Batches>>;
  static_assert(fulgur::training_module<Module, Batch>,
                "fulgur::bench::register_matrix: the matrix's hand-written loop supports what Trainer::fit "
                "supports: training_step(batch, batch_idx[, StepContext&]) returning the loss (or anything, "
                "with automatic_optimization = false) and configure_optimizers() returning an optimizer, an "
                "OptimizerConfig or a vector of them, for make_batches()' batch type.");
  detail::validate(name, options);
  boost::hana::for_each(trainers, [&](auto trainer_type) {
    using T = typename decltype(trainer_type)::type;
    const std::string label = name + "/" + std::string(T::accelerator_type::name) + "/" +
                              std::string(T::strategy_type::name) + "/" + std::string(T::precision_type::name);
    detail::registered().push_back(benchmark::RegisterBenchmark(label.c_str(),
                                                                [=](benchmark::State& state) mutable {
                                                                  detail::run<T>(state, make_module, make_hand_module,
                                                                                 make_batches, options);
                                                                })
                                       ->UseManualTime()
                                       ->Unit(benchmark::kMillisecond)
                                       ->MinTime(options.min_time_s));
  });
}

template <class MakeModule, class MakeBatches, class Trainers = std::remove_const_t<decltype(shipped_trainers)>>
void register_matrix(const std::string& name, MakeModule make_module, MakeBatches make_batches,
                     MatrixOptions options = {}, Trainers trainers = shipped_trainers) {
  register_matrix_versus(name, make_module, make_module, std::move(make_batches), options, trainers);
}

/// LibTorch's intra-op threads for the matrix: `--threads=N` (taken out of argv), else the
/// environment's FULGUR_BENCH_THREADS, else 1 (as bench/compare/compare.py); 0 keeps LibTorch's
/// default. Returns the count in use; throws std::invalid_argument for a value that is not a
/// non-negative integer.
inline int configure_threads(int& argc, char** argv) {
  std::string value, source;
  if (const char* env = std::getenv("FULGUR_BENCH_THREADS"); env != nullptr && *env != '\0') {
    value = env;
    source = "FULGUR_BENCH_THREADS";
  }
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      value = argv[i] + 10;
      source = "--threads";
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  int threads = 1;
  if (!source.empty()) {
    char* end = nullptr;
    const long parsed = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || parsed < 0 || parsed > 4096)
      throw std::invalid_argument(source + "=" + value + ": the number of intra-op threads must be an integer >= 0 "
                                  "(0: LibTorch's default)");
    threads = static_cast<int>(parsed);
  }
  if (threads > 0) at::set_num_threads(threads);
  const int used = at::get_num_threads();
  static bool in_context = false;  // Google Benchmark refuses a second entry of the same name
  if (!std::exchange(in_context, true)) benchmark::AddCustomContext("intra_op_threads", std::to_string(used));
  return used;
}

/// The matrix's main: threads (configure_threads), Google Benchmark's flags (a misspelt one is an
/// error; --benchmark_min_time=X overrides every row's MatrixOptions::min_time_s), the registered
/// rows; returns 1 when a flag was not understood or a row failed.
inline int run_matrix(int argc, char** argv) {
  try {
    configure_threads(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::optional<double> min_time;  // --benchmark_min_time=X[s] overrides each row's min_time_s
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--benchmark_min_time=", 21) == 0) {
      char* end = nullptr;
      const double value = std::strtod(argv[i] + 21, &end);
      if (end != argv[i] + 21 && (*end == '\0' || (*end == 's' && end[1] == '\0')) && value > 0) min_time = value;
    }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (min_time)
    for (auto* row : detail::registered()) row->MinTime(*min_time);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (detail::failed_rows() > 0) {
    std::fprintf(stderr, "%s: %d row(s) failed (see 'failed:' above)\n", argv[0], detail::failed_rows());
    return 1;
  }
  return 0;
}

}  // namespace fulgur::bench
