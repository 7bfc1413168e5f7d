// On a GPU: a fit that reads its images from host memory through DataLoader{.pin_memory} against the
// same fit with the whole dataset already on the GPU (TensorLoader over CUDA tensors), and against the
// DataLoader without pin_memory. Goal: pinned within 2% of resident — the copy of batch n + 1 runs on
// its own stream while batch n computes, so reading from the host costs nothing.
//
// A small CNN on 3 x 64 x 64 images, 128 a batch (6 MiB a batch to copy), two workers; each iteration
// fits one model per mode in turn (the same seed; 3 epochs of 32 batches, or 1 of 96) and times the
// whole fit (a device synchronisation at its end). Counters: resident_ms, pinned_ms, pageable_ms (per
// step), pinned_ratio = pinned / resident and pageable_ratio (medians over the iterations).
// Without a CUDA device it says so and runs nothing.
#include <benchmark/benchmark.h>
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

namespace {

constexpr std::int64_t kBatch = 128, kClasses = 10;

struct CnnImpl : torch::nn::Module {
  torch::nn::Conv2d c1{register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 3).padding(1)))};
  torch::nn::Conv2d c2{register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 128, 3).padding(1)))};
  torch::nn::Conv2d c3{register_module("c3", torch::nn::Conv2d(torch::nn::Conv2dOptions(128, 256, 3).padding(1)))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(256, kClasses))};
  at::Tensor forward(const at::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(c1(x)), 2);
    h = torch::max_pool2d(torch::relu(c2(h)), 2);
    h = torch::adaptive_avg_pool2d(torch::relu(c3(h)), {1, 1}).flatten(1);
    return head(h);
  }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  }
};
TORCH_MODULE(Cnn);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Precision>
void BM_pinned_fit(benchmark::State& state) {
  if (!fulgur::CUDAAccelerator::is_available()) {
    state.SkipWithError("no CUDA device: this benchmark compares host-to-GPU loading, so it needs one");
    return;
  }
  using Trainer = fulgur::Trainer<fulgur::CUDAAccelerator, fulgur::SingleDeviceStrategy, Precision>;
  const std::int64_t kEpochs = state.range(0), kBatches = state.range(1);
  const double steps = static_cast<double>(kEpochs * kBatches);
  torch::manual_seed(0);
  const auto x = torch::randn({kBatches * kBatch, 3, 64, 64});
  const auto y = torch::randint(kClasses, {kBatches * kBatch}, at::kLong);
  const auto x_gpu = x.cuda(), y_gpu = y.cuda();
  fulgur::data::TensorLoader resident(x_gpu, y_gpu, {.batch_size = kBatch, .shuffle = true});
  fulgur::data::DataLoader pinned(fulgur::data::TensorDataset(x, y),
                                  {.batch_size = kBatch, .shuffle = true, .num_workers = 2, .pin_memory = true});
  fulgur::data::DataLoader pageable(fulgur::data::TensorDataset(x, y),
                                    {.batch_size = kBatch, .shuffle = true, .num_workers = 2});
  auto ms_per_step = [&](auto& loader) {
    torch::manual_seed(0);
    Cnn model;
    Trainer trainer({.max_epochs = kEpochs, .enable_progress_bar = false});
    torch::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    trainer.fit(model, loader);
    torch::cuda::synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
  };
  ms_per_step(resident);  // cuDNN's choices, the allocators' pools
  ms_per_step(pinned);
  std::vector<double> on_gpu, from_pinned, from_pageable, ratio, pageable_ratio;
  for (auto _ : state) {
    on_gpu.push_back(ms_per_step(resident));
    from_pinned.push_back(ms_per_step(pinned));
    from_pageable.push_back(ms_per_step(pageable));
    ratio.push_back(from_pinned.back() / on_gpu.back());
    pageable_ratio.push_back(from_pageable.back() / on_gpu.back());
    state.SetIterationTime(from_pinned.back() * 1e-3 * steps);
  }
  state.counters["resident_ms"] = median(on_gpu);
  state.counters["pinned_ms"] = median(from_pinned);
  state.counters["pageable_ms"] = median(from_pageable);
  state.counters["pinned_ratio"] = median(ratio);
  state.counters["pageable_ratio"] = median(pageable_ratio);
}

}  // namespace

// Args: epochs, batches an epoch (3 x 32: an epoch's start, whose first batch nothing prepared ahead,
// three times; 1 x 96: the same steps, one start).
BENCHMARK_TEMPLATE(BM_pinned_fit, fulgur::FloatPrecision)
    ->Name("pinned_fit/32-true")->Args({3, 32})->Args({1, 96})->ArgNames({"epochs", "batches"})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_TEMPLATE(BM_pinned_fit, fulgur::BF16MixedPrecision)
    ->Name("pinned_fit/bf16-mixed")->Args({3, 32})->Args({1, 96})->ArgNames({"epochs", "batches"})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_MAIN();
