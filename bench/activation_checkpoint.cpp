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
#include "tests/counting_allocator.hpp"

namespace {

using namespace fulgur::bench;

using test::CountingAllocator;
using test::CountingScope;

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
    if (counting) held_after_forward = counting->held_bytes();
    loss.backward();
    if (counting) {
      std::lock_guard<std::mutex> lock(counting->mutex);
      peak = counting->peak;  // forward and backward (the gradients included)
    }
    optimizer->step();
  };
  step();  // gradients and the optimizer's state exist from here on
  {
    CountingScope scope;
    step();  // everything the step keeps is now counted
    counting = &scope.counting;
    step();
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
