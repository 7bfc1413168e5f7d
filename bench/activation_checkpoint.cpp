// bench_activation_checkpoint: the bench GPT (bench/matrix/gpt.hpp) with and without activation
// checkpointing of every block (ActivationCheckpointing::by_type<Block>(): one unit per block), on the
// CPU: the memory a training step holds for backward and its peak (a counting CPU allocator, installed
// for one measured step), and the step time (forward, backward, AdamW step). Rows:
//   gpt_step/<shape>/<precision>/<plain|checkpointed>; counters activation_MiB (bytes held between
//   forward and backward: what the graph keeps), peak_MiB (the peak of forward and backward above the bytes held
//   before the forward: gradients included).
// docs/benchmarks.md records a run.
#include <benchmark/benchmark.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "matrix/gpt.hpp"

namespace {

using namespace fulgur::bench;

/// Bytes handed out by the CPU allocator and not yet given back, and their peak.
struct CountingAllocator final : c10::Allocator {
  c10::Allocator* base = nullptr;
  std::int64_t live = 0, peak = 0;
  std::mutex mutex;
  std::unordered_map<void*, std::pair<c10::DataPtr, std::int64_t>> held;
  static CountingAllocator& instance() {
    static auto* counting = new CountingAllocator();  // never destroyed: tensors it made may outlive main
    return *counting;
  }
  static void release(void* data) {
    CountingAllocator& self = instance();
    std::lock_guard<std::mutex> lock(self.mutex);
    const auto it = self.held.find(data);
    self.live -= it->second.second;
    self.held.erase(it);
  }
  c10::DataPtr allocate(std::size_t n) override {
    c10::DataPtr inner = base->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    std::lock_guard<std::mutex> lock(mutex);
    live += static_cast<std::int64_t>(n);
    peak = std::max(peak, live);
    held.emplace(data, std::make_pair(std::move(inner), static_cast<std::int64_t>(n)));
    return {data, data, &release, device};  // the context is the pointer: raw_allocate's users need it
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

struct Shape {
  const char* name;
  models::GptOptions options;
  std::int64_t batch;
};
const Shape shapes[] = {{"small", {}, models::kBatch},  // bench_matrix's GPT: 2 blocks, width 64, context 64
                        {"6x128", {.vocab = 256, .width = 128, .heads = 4, .context = 128, .layers = 6}, 8}};

void gpt_step(benchmark::State& state, const Shape& shape, std::optional<at::ScalarType> autocast, bool checkpointed) {
  torch::manual_seed(0);
  models::Gpt gpt(shape.options);
  if (checkpointed) gpt->checkpointing = fulgur::ActivationCheckpointing::by_type<models::Block>();
  auto optimizer = gpt->configure_optimizers();
  const fulgur::data::Batch batch{torch::randint(0, shape.options.vocab, {shape.batch, shape.options.context}),
                                  torch::randint(0, shape.options.vocab, {shape.batch, shape.options.context})};
  CountingAllocator* counting = nullptr;
  std::int64_t held_at_start = 0, held_after_forward = 0, peak = 0;
  auto step = [&] {
    optimizer->zero_grad();  // the gradients freed (set to none): the baseline is what the model and AdamW hold
    if (counting) {
      std::lock_guard<std::mutex> lock(counting->mutex);
      held_at_start = counting->live;
      counting->peak = counting->live;
    }
    at::Tensor loss;
    {
      std::optional<fulgur::AutocastGuard> region;
      if (autocast) region.emplace(c10::DeviceType::CPU, *autocast);
      loss = gpt->training_step(batch, 0);
    }
    if (counting) held_after_forward = counting->live;
    loss.backward();
    if (counting) {
      std::lock_guard<std::mutex> lock(counting->mutex);
      peak = counting->peak;  // forward and backward (the gradients included)
    }
    optimizer->step();
  };
  step();  // gradients and the optimizer's state exist from here on
  {
    CountingAllocator& c = CountingAllocator::instance();
    c.base = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&c, 0);
    step();  // everything the step keeps is now counted
    counting = &c;
    step();
    c10::SetCPUAllocator(c.base, 0);
    counting = nullptr;
  }
  for (auto _ : state) step();
  state.counters["activation_MiB"] = static_cast<double>(held_after_forward - held_at_start) / (1 << 20);
  state.counters["peak_MiB"] = static_cast<double>(peak - held_at_start) / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  for (const Shape& shape : shapes)
    for (const auto& [precision, autocast] :
         {std::pair<const char*, std::optional<at::ScalarType>>{"32-true", std::nullopt}, {"bf16-mixed", at::kBFloat16}})
      for (const bool checkpointed : {false, true})
        benchmark::RegisterBenchmark((std::string("gpt_step/") + shape.name + "/" + precision + "/" +
                                         (checkpointed ? "checkpointed" : "plain"))
                                         .c_str(),
                                     [&shape, autocast, checkpointed](benchmark::State& state) {
                                       gpt_step(state, shape, autocast, checkpointed);
                                     })
            ->Unit(benchmark::kMillisecond)
            ->MeasureProcessCPUTime()
            ->UseRealTime();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
