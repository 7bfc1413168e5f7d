#pragma once
// The policy matrix for any model: one Google Benchmark per compatible (accelerator, strategy,
// precision) of fulgur's shipped lists, each timing Trainer::fit beside the same training written
// by hand against LibTorch (the module's own training_step and configure_optimizers, autocast and
// GradScaler by hand), in one process, alternating which goes first.
//
//   fulgur::bench::register_matrix("my_model", [] { return MyModel(); },
//                                  [] { return my_batches(); }, {.items_per_batch = 64});
//   benchmark::Initialize(&argc, argv); benchmark::RunSpecifiedBenchmarks();
//
// Counters per combination: hand_us and fulgur_us (median microseconds per step), ratio (median
// of fulgur / hand over the repetitions; fulgur's goal: <= 1.02), items_per_s (samples or tokens a
// second through fulgur), peak_mib (the process's peak resident memory during fulgur's run on the
// CPU, the CUDA allocator's peak on a GPU). A combination that cannot run here is reported as
// skipped with the reason (CUDA without a GPU; DDP, which needs ranks: bench_ddp runs it), one that
// fails on the model (a NaN loss in '16-true', say) as failed with fulgur's message.
#include <benchmark/benchmark.h>
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define FULGUR_BENCH_CUDA_MEMORY 1
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace fulgur::bench {

struct MatrixOptions {
  double items_per_batch = 1;  ///< samples (or tokens) in one batch, for items_per_s
  double min_time_s = 2.0;     ///< Google Benchmark's MinTime for each combination
};

namespace detail {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// VmHWM, the resident-memory peak, after `reset_peak_rss` (writing 5 to clear_refs resets it).
inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }
inline double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  return 0.0;
}

/// A floating-point input in the precision's dtype; token ids and labels stay as they are.
template <class P>
at::Tensor as_input(const at::Tensor& t, c10::Device device) {
  at::Tensor moved = t.to(device);
  if constexpr (requires { P::dtype; } && !requires { P::uses_scaler; })
    if (moved.is_floating_point()) return moved.to(P::dtype);
  return moved;
}

/// The loop a LibTorch user writes for precision P on `device`: the module's training_step, its
/// optimizer, autocast and a GradScaler by hand where the precision has them.
template <class P, class Module, class Batches>
void hand_written(Module& module, const Batches& batches, c10::Device device) {
  constexpr bool mixed = requires { P::uses_scaler; };
  constexpr bool scaled = fulgur::detail::uses_scaler<P>();
  module->to(device);
  if constexpr (!mixed && requires { P::dtype; }) module->to(P::dtype);
  auto optimizer = module->configure_optimizers();
  fulgur::GradScaler scaler;
  std::int64_t index = 0;
  for (const auto& raw : batches) {
    const fulgur::data::Batch batch{as_input<P>(raw.input, device), raw.target.to(device)};
    at::Tensor loss;
    if constexpr (mixed) {
      at::autocast::set_autocast_enabled(device.type(), true);
      at::autocast::set_autocast_dtype(device.type(), P::dtype);
      at::autocast::increment_nesting();
      loss = module->training_step(batch, index);
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      at::autocast::set_autocast_enabled(device.type(), false);
    } else {
      loss = module->training_step(batch, index);
    }
    if constexpr (scaled) {
      scaler.scale(loss).backward();
      scaler.step(*optimizer);
      scaler.update();
    } else {
      loss.backward();
      optimizer->step();
    }
    optimizer->zero_grad();
    ++index;
  }
}

inline void synchronize(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

/// Why Trainer T cannot run in this process, or "" if it can.
template <class T>
std::string cannot_run() {
  using A = typename T::accelerator_type;
  using S = typename T::strategy_type;
  if (!A::is_available()) return std::string("skipped: '") + std::string(A::name) + "' is not available on this machine";
  if constexpr (!std::is_same_v<S, fulgur::SingleDeviceStrategy>)
    return "skipped: '" + std::string(S::name) + "' needs several ranks; bench_ddp runs it side by side with torch DDP";
  return "";
}

inline void skip(benchmark::State& state, const std::string& why) {
  state.SkipWithError(why.c_str());
  for (auto _ : state) {
  }
}

template <class T, class MakeModule, class MakeBatches>
void run(benchmark::State& state, MakeModule& make_module, MakeBatches& make_batches, const MatrixOptions& options) {
  using P = typename T::precision_type;
  if constexpr (!std::is_same_v<typename T::strategy_type, fulgur::SingleDeviceStrategy>) {
    skip(state, cannot_run<T>());  // not instantiated: fit under DDP needs ranks
  } else {
  if (const std::string why = cannot_run<T>(); !why.empty()) return skip(state, why);
  const auto batches = make_batches();
  const double steps = static_cast<double>(std::size(batches));
  T trainer(fulgur::TrainerConfig{.max_epochs = 1, .num_sanity_val_steps = 0, .enable_progress_bar = false});
  const c10::Device device = trainer.device();
  std::vector<double> hand_us, fulgur_us, ratios;
  double peak_mib = 0.0;
  bool fulgur_first = false;
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    auto hand_model = make_module();
    auto fulgur_model = make_module();
    double t_hand = 0, t_fulgur = 0;
    auto time_hand = [&] {
      const auto t0 = clock::now();
      hand_written<P>(hand_model, batches, device);
      synchronize(device);
      t_hand = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / steps;
    };
    auto time_fulgur = [&] {
      reset_peak_rss();
#ifdef FULGUR_BENCH_CUDA_MEMORY
      if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
      const auto t0 = clock::now();
      trainer.fit(fulgur_model, batches);
      synchronize(device);
      t_fulgur = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / steps;
      double peak = peak_rss_mib();
#ifdef FULGUR_BENCH_CUDA_MEMORY
      if (device.is_cuda())
        peak = static_cast<double>(c10::cuda::CUDACachingAllocator::getDeviceStats(device.index())
                                       .allocated_bytes[0].peak) / (1024.0 * 1024.0);
#endif
      peak_mib = std::max(peak_mib, peak);
    };
    try {  // a combination that fails on this model (e.g. diverges in '16-true') says so and stops
      if (fulgur_first) {
        time_fulgur();
        time_hand();
      } else {
        time_hand();
        time_fulgur();
      }
    } catch (const std::exception& e) {
      std::string text = e.what();
      state.SkipWithError(("failed: " + text.substr(0, text.find('\n'))).c_str());
      return;
    }
    fulgur_first = !fulgur_first;
    hand_us.push_back(t_hand);
    fulgur_us.push_back(t_fulgur);
    ratios.push_back(t_fulgur / t_hand);
    state.SetIterationTime(t_fulgur * 1e-6 * steps);
  }
  state.counters["hand_us"] = median(hand_us);
  state.counters["fulgur_us"] = median(fulgur_us);
  state.counters["ratio"] = median(ratios);
  state.counters["items_per_s"] = options.items_per_batch * 1e6 / median(fulgur_us);
  state.counters["peak_mib"] = peak_mib;
  }
}

}  // namespace detail

/// Registers "<name>/<accelerator>/<strategy>/<precision>" for every combination of `trainers`
/// (default: every compatible one of the shipped lists). make_module() returns a fresh module (a
/// TORCH_MODULE holder or std::shared_ptr) with training_step and configure_optimizers;
/// make_batches() returns the batches of one epoch (fulgur::data::Batch, on the CPU).
template <class MakeModule, class MakeBatches, class Trainers = std::remove_const_t<decltype(shipped_trainers)>>
void register_matrix(const std::string& name, MakeModule make_module, MakeBatches make_batches,
                     MatrixOptions options = {}, Trainers trainers = shipped_trainers) {
  boost::hana::for_each(trainers, [&](auto trainer_type) {
    using T = typename decltype(trainer_type)::type;
    const std::string label = name + "/" + std::string(T::accelerator_type::name) + "/" +
                              std::string(T::strategy_type::name) + "/" + std::string(T::precision_type::name);
    benchmark::RegisterBenchmark(label.c_str(),
                                 [=](benchmark::State& state) mutable {
                                   detail::run<T>(state, make_module, make_batches, options);
                                 })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(options.min_time_s);
  });
}

}  // namespace fulgur::bench
