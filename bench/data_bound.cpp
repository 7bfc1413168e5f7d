// A data-bound fit: preparing a batch costs more than computing it. With W workers the loader should
// hide all it can, so a step takes max(compute, preparation / W), not compute + preparation.
//
// Preparation here waits (0.25 ms per sample, 32 samples a batch: what reading from a slow disk or a
// network store costs), so that it overlaps with computing even on the 2-core CI machine; the
// compute is an MLP step of a few ms. Each iteration measures, in turn: compute alone (fit over the
// batches already made), preparation alone (the loader read without training, num_workers = 0),
// and fit over the DataLoader with W workers. Counters: compute_ms, prepare_ms (per batch), step_ms
// (per step of the loaded fit, from its first step on: the wait for an epoch's first batch is one
// batch's preparation whatever W, as with PyTorch's workers), bound_ms = max(compute, prepare / W),
// and ratio = step / bound (median over iterations; goal <= 1.05).
#include <benchmark/benchmark.h>
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace {

constexpr std::int64_t kBatches = 96, kBatch = 32, kIn = 256, kHidden = 1024, kClasses = 10;
constexpr auto kWaitPerSample = std::chrono::microseconds(250);

struct MlpImpl : torch::nn::Module {
  std::chrono::steady_clock::time_point first_step;  // when batch 0 reached the step
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(kIn, kHidden))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(kHidden, kHidden))};
  torch::nn::Linear fc3{register_module("fc3", torch::nn::Linear(kHidden, kClasses))};
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t batch_idx) {
    if (batch_idx == 0) first_step = std::chrono::steady_clock::now();
    return torch::nn::functional::cross_entropy(fc3(torch::relu(fc2(torch::relu(fc1(b.input))))), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1e-3));
  }
};
TORCH_MODULE(Mlp);

/// Samples that take a while to arrive.
struct SlowSamples {
  at::Tensor x = torch::randn({kBatches * kBatch, kIn});
  at::Tensor y = torch::randint(kClasses, {kBatches * kBatch}, at::kLong);
  std::int64_t size() const { return x.size(0); }
  fulgur::data::Batch get(std::int64_t i) const {
    std::this_thread::sleep_for(kWaitPerSample);
    return {x[i], y[i]};
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

using Trainer = fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision>;

void BM_data_bound(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  torch::manual_seed(0);
  at::set_num_threads(1);  // the step on one core, the workers' waits beside it
  SlowSamples samples;
  fulgur::data::DataLoader loader(samples, {.batch_size = kBatch, .num_workers = workers});
  fulgur::data::DataLoader serial(samples, {.batch_size = kBatch, .num_workers = 0});
  std::vector<fulgur::data::Batch> ready;
  for (const auto& b : serial) ready.push_back(b);
  Trainer trainer({.max_epochs = 1, .enable_progress_bar = false});
  using clock = std::chrono::steady_clock;
  auto ms_per_batch = [](clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count() / kBatches;
  };
  // A step's time from the first step on: the wait for the epoch's first batch (one batch's
  // preparation, whatever W) and fit's set-up are left out, for both fits.
  auto ms_per_step = [](const Mlp& m) {
    return std::chrono::duration<double, std::milli>(clock::now() - m->first_step).count() / kBatches;
  };
  std::vector<double> compute, prepare, step, ratio;
  for (auto _ : state) {
    Mlp a, b;
    trainer.fit(a, ready);
    compute.push_back(ms_per_step(a));
    auto t0 = clock::now();
    for (const auto& batch : serial) benchmark::DoNotOptimize(batch.input.data_ptr());
    prepare.push_back(ms_per_batch(t0));
    trainer.fit(b, loader);
    step.push_back(ms_per_step(b));
    const double bound = std::max(compute.back(), prepare.back() / workers);
    ratio.push_back(step.back() / bound);
    state.SetIterationTime(step.back() * 1e-3 * kBatches);
  }
  state.counters["compute_ms"] = median(compute);
  state.counters["prepare_ms"] = median(prepare);
  state.counters["step_ms"] = median(step);
  state.counters["bound_ms"] = std::max(median(compute), median(prepare) / workers);
  state.counters["ratio"] = median(ratio);
}

}  // namespace

BENCHMARK(BM_data_bound)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_MAIN();
