// CUDA: DataLoader{.pin_memory}: batches in page-locked memory from a reused pool, copied on a stream
// of their own that overlaps the kernels queued before, and a fit that trains as with pageable batches.
#include <catch2/catch.hpp>

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Sleep.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAGuard.h>

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "unit/support.hpp"

using namespace fulgur;

namespace {
using CudaFloatTrainer = Trainer<CUDAAccelerator, SingleDeviceStrategy, FloatPrecision>;

/// Samples a pair of (image, label): the per-sample collate path (stack_samples and numbers).
struct Images {
  at::Tensor x = torch::randn({40, 3, 8, 8}, torch::TensorOptions().dtype(at::kFloat));
  std::int64_t size() const { return x.size(0); }
  std::pair<at::Tensor, std::int64_t> get(std::int64_t i) const { return {x[i] * 2, i % 7}; }
};

/// A user collate returning pageable tensors: pinned after it by the loader.
struct PageableCollate {
  data::Batch operator()(std::span<const data::Batch> samples) const {
    std::vector<at::Tensor> inputs, targets;
    for (const auto& s : samples) {
      inputs.push_back(s.input);
      targets.push_back(s.target);
    }
    return {at::stack(inputs), at::stack(targets)};
  }
};

bool all_pinned(const auto& batch) {
  bool pinned = true;
  data::for_each_tensor(batch, [&](const at::Tensor& t) {
    pinned = pinned && data::is_pinned(t) && t.is_pinned();  // ours and the driver's answer agree
  });
  return pinned;
}

template <class Loader>
void check_pinned_like_pageable(const Loader& pinned, const Loader& pageable) {
  auto a = pinned.begin();
  auto b = pageable.begin();
  std::int64_t n = 0;
  for (; a != pinned.end(); ++a, ++b, ++n) {
    INFO("batch " << n);
    CHECK(all_pinned(*a));
    std::vector<at::Tensor> got, expected;
    data::for_each_tensor(*a, [&](const at::Tensor& t) { got.push_back(t); });
    data::for_each_tensor(*b, [&](const at::Tensor& t) { expected.push_back(t); });
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CHECK_FALSE(data::is_pinned(expected[i]));
      CHECK(test::identical(got[i], expected[i]));
    }
  }
  CHECK(n == pinned.size());
}

std::int64_t host_allocations() { return at::getHostAllocator(at::kCUDA)->get_stats().num_host_alloc; }
}  // namespace

TEST_CASE("DataLoader pin_memory on CUDA: every tensor of every batch page-locked, the values the pageable loader gives",
          "[cuda][data]") {
  REQUIRE(data::pinned_memory_available());
  for (int workers : {0, 2}) {
    INFO("num_workers " << workers);
    {
      Images images;
      data::DataLoader pinned(images, {.batch_size = 6, .shuffle = true, .num_workers = workers, .pin_memory = true});
      data::DataLoader pageable(images, {.batch_size = 6, .shuffle = true, .num_workers = workers});
      check_pinned_like_pageable(pinned, pageable);
    }
    {
      auto [x, y] = test::classification_data(50);
      data::TensorDataset dataset(x, y);  // get_batch: index_select into the pinned buffer
      data::DataLoader pinned(dataset, {.batch_size = 8, .shuffle = true, .num_workers = workers, .pin_memory = true});
      data::DataLoader pageable(dataset, {.batch_size = 8, .shuffle = true, .num_workers = workers});
      check_pinned_like_pageable(pinned, pageable);
      data::DataLoader in_order(dataset, {.batch_size = 8, .num_workers = workers, .pin_memory = true});
      data::DataLoader in_order_pageable(dataset, {.batch_size = 8, .num_workers = workers});
      check_pinned_like_pageable(in_order, in_order_pageable);  // narrow views, pinned by a copy
    }
    {
      auto [x, y] = test::classification_data(30);
      struct Samples {
        at::Tensor x, y;
        std::int64_t size() const { return x.size(0); }
        data::Batch get(std::int64_t i) const { return {x[i], y[i]}; }
      };
      data::DataLoader pinned(Samples{x, y}, {.batch_size = 4, .num_workers = workers, .pin_memory = true},
                              PageableCollate{});
      data::DataLoader pageable(Samples{x, y}, {.batch_size = 4, .num_workers = workers}, PageableCollate{});
      check_pinned_like_pageable(pinned, pageable);
    }
  }
}

TEST_CASE("DataLoader pin_memory on CUDA: buffers come from a reused pool, not a cudaHostAlloc per batch",
          "[cuda][data]") {
  auto [x, y] = test::classification_data(512);
  data::DataLoader loader(data::TensorDataset(x, y),
                          {.batch_size = 32, .shuffle = true, .num_workers = 2, .pin_memory = true});
  CudaFloatTrainer trainer(test::quiet());
  auto epoch = [&] {
    for (const auto& batch : loader) {
      auto on_device = trainer.batch_to_device(batch);
      (void)(on_device.input.sum() + on_device.target.sum());
    }
    at::cuda::getCurrentCUDAStream().synchronize();
  };
  const std::int64_t before = host_allocations();  // the process's count so far
  epoch();                                         // fills the pool
  epoch();
  const std::int64_t warm = host_allocations();
  for (int e = 0; e < 3; ++e) epoch();
  CHECK(host_allocations() == warm);  // 48 more batches, no new page-locked allocation
  CHECK(warm - before <= 32);         // at most the batches in flight (slots, the one in hand, copies) x 2 tensors
}

TEST_CASE("batch_to_device on CUDA: a pinned batch crosses on the copy stream, overlapping the kernels before it, "
          "and the compute stream waits for it",
          "[cuda][data]") {
  CudaFloatTrainer trainer(test::quiet());
  const c10::Device device(c10::kCUDA, 0);
  c10::cuda::CUDAGuard guard(device);
  const auto compute = at::cuda::getCurrentCUDAStream();
  const auto copy = c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, data::detail::copy_stream(device));
  REQUIRE(copy != compute);
  const auto host = data::pin_memory(torch::arange(1 << 22, torch::kFloat));  // 16 MiB
  REQUIRE(data::is_pinned(host));
  const std::int64_t second = 2'000'000'000;  // cycles: about a second at the H100's clocks
  {  // the copy stream's memory pool warm, so that the copies below need no cudaMalloc
    const auto warm = trainer.batch_to_device(data::Batch{host, host.narrow(0, 0, 10)});
    at::cuda::getCurrentCUDAStream().synchronize();
  }

  SECTION("the copy does not wait for the kernels queued before it") {
    at::cuda::sleep(second);  // busy compute stream
    const auto batch = trainer.batch_to_device(data::Batch{host, host.narrow(0, 0, 10)});
    copy.synchronize();  // the copy is done ...
    CHECK_FALSE(compute.query());  // ... while the kernel queued before it still runs
    compute.synchronize();
    CHECK(test::identical(batch.input.cpu(), host));
    CHECK(test::identical(batch.target.cpu(), host.narrow(0, 0, 10)));
  }
  SECTION("kernels queued after it read the copied values, however long the copy waits") {
    {
      c10::cuda::CUDAStreamGuard on_copy(copy);
      at::cuda::sleep(second / 4);  // the copy starts late
    }
    const auto batch = trainer.batch_to_device(data::Batch{host, {}});
    const auto doubled = batch.input * 2;  // on the compute stream
    CHECK(test::identical(doubled.cpu(), host * 2));
  }
  SECTION("a pageable batch goes on the compute stream, in its order") {
    at::cuda::sleep(second / 8);
    const auto pageable = torch::arange(1000, torch::kFloat);
    const auto batch = trainer.batch_to_device(data::Batch{pageable, {}});
    CHECK(test::identical(batch.input.cpu(), pageable));
  }
}

TEST_CASE("a fit over a pinned DataLoader trains exactly as over a pageable one, and as over data on the GPU",
          "[cuda][data]") {
  auto [x, y] = test::classification_data(256);
  auto fit = [&](auto loader) {
    torch::manual_seed(0);
    test::Classifier model;
    CudaFloatTrainer trainer(test::quiet({.max_epochs = 2}));
    trainer.fit(model, loader);
    std::vector<at::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().cpu());
    return out;
  };
  const auto on_gpu =
      fit(data::TensorLoader(x.cuda(), y.cuda(), {.batch_size = 16, .shuffle = true}));
  const auto pinned = fit(data::DataLoader(data::TensorDataset(x, y),
                                           {.batch_size = 16, .shuffle = true, .num_workers = 2, .pin_memory = true}));
  const auto pageable =
      fit(data::DataLoader(data::TensorDataset(x, y), {.batch_size = 16, .shuffle = true, .num_workers = 2}));
  REQUIRE(pinned.size() == pageable.size());
  for (std::size_t i = 0; i < pinned.size(); ++i) {
    INFO("parameter " << i);
    CHECK(test::identical(pinned[i], pageable[i]));
    CHECK(test::identical(pinned[i], on_gpu[i]));
  }
}

namespace {
/// How many times each ATen op ran inside f (RecordFunction, as the profiler sees them).
template <class F>
std::map<std::string, std::int64_t> ops_during(F&& f) {
  static std::atomic<bool> counting{false};
  static std::mutex mutex;
  static std::map<std::string, std::int64_t> counts;
  auto handle = at::addGlobalCallback(at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                                                     -> std::unique_ptr<at::ObserverContext> {
                                        if (counting.load()) {
                                          std::lock_guard<std::mutex> lock(mutex);
                                          ++counts[fn.name()];
                                        }
                                        return nullptr;
                                      }).scopes({at::RecordScope::FUNCTION}));
  counts.clear();
  counting = true;
  f();
  counting = false;
  at::removeCallback(handle);
  return counts;
}
}  // namespace

TEST_CASE("a fit over a pinned DataLoader adds no per-step driver queries or host syncs", "[cuda][data]") {
  auto fit_ops = [&](std::int64_t batches) {
    torch::manual_seed(0);
    test::Classifier model;
    auto [x, y] = test::classification_data(16 * batches);
    data::DataLoader loader(data::TensorDataset(x, y), {.batch_size = 16, .num_workers = 0, .pin_memory = true});
    CudaFloatTrainer trainer(test::quiet({.max_epochs = 1}));
    return ops_during([&] { trainer.fit(model, loader); });
  };
  fit_ops(4);  // one-off costs
  auto ops20 = fit_ops(20), ops40 = fit_ops(40);
  CHECK(ops40["aten::is_pinned"] == 0);
  CHECK(ops40["aten::_local_scalar_dense"] == ops20["aten::_local_scalar_dense"]);
  CHECK(ops40["aten::_to_copy"] > ops20["aten::_to_copy"]);  // the counter saw the copies
}
