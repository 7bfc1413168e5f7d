// Where the time of a GPT step goes: the GPT of this folder trained for a few steps on random tokens,
// once under SimpleProfiler (Lightning's table of actions) and once under TorchProfiler (a Chrome trace
// of steps 2 and 3, which Perfetto opens, and LibTorch's operator table). docs/observability.md.
//
//   gpt_profile [--out DIR] [--steps N] [--cuda]
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "model.hpp"

namespace {

using gpt::Gpt;
using gpt::GptConfig;

/// Random token windows (inputs, and the same shifted by one as targets).
std::vector<fulgur::data::Batch> windows(const GptConfig& config, std::int64_t steps, std::int64_t batch) {
  torch::manual_seed(0);
  std::vector<fulgur::data::Batch> batches;
  for (std::int64_t i = 0; i < steps; ++i) {
    const at::Tensor tokens = torch::randint(config.vocab, {batch, config.context + 1}, at::kLong);
    batches.push_back({tokens.narrow(1, 0, config.context), tokens.narrow(1, 1, config.context)});
  }
  return batches;
}

template <class Accelerator>
int run(const std::string& out, std::int64_t steps) {
  const GptConfig config{.context = 64, .width = 128, .heads = 4, .layers = 4, .sample_bytes = 0};
  const auto batches = windows(config, steps, 16);
  const fulgur::TrainerConfig trainer_config{.max_epochs = 1, .default_root_dir = out, .enable_progress_bar = false};
  {
    fulgur::Trainer<Accelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision, fulgur::SimpleProfiler> trainer(
        trainer_config, fulgur::SimpleProfiler({.filename = "simple"}));
    Gpt model(config);
    trainer.fit(model, batches);
  }
  fulgur::Trainer<Accelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision, fulgur::TorchProfiler> trainer(
      trainer_config,
      fulgur::TorchProfiler({.filename = "trace", .schedule = {.wait = 1, .warmup = 1, .active = 2}, .row_limit = 15}));
  Gpt model(config);
  trainer.fit(model, batches);
  for (const std::string& trace : trainer.template callback<fulgur::TorchProfiler>().trace_files())
    std::cout << "trace: " << trace << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "gpt_profile";
  std::int64_t steps = 8;
  bool cuda = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) out = argv[++i];
    else if (arg == "--steps" && i + 1 < argc) steps = std::atoll(argv[++i]);
    else if (arg == "--cuda") cuda = true;
    else {
      std::cerr << "usage: gpt_profile [--out DIR] [--steps N (>= 4)] [--cuda]\n";
      return 2;
    }
  }
  if (steps < 4) {
    std::cerr << "gpt_profile: --steps must be at least 4 (the trace records steps 2 and 3)\n";
    return 2;
  }
  if (cuda) return run<fulgur::CUDAAccelerator>(out, steps);
  return run<fulgur::CPUAccelerator>(out, steps);
}
