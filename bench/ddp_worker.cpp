// One training run for bench_ddp: DDP over Gloo when started by torchrun (2 ranks, batch B each),
// else one process (batch 2B); FULGUR_BENCH_STRATEGY=zero1 / zero2 trains under ShardedStrategy<1> /
// <2> instead of DDP. Prints "step_us <mean microseconds per step>" from rank 0, timed between
// barriers after a warm-up.
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

namespace {
constexpr std::int64_t kIn = 256, kHidden = 512, kClasses = 10, kBatchPerRank = 64, kWarmup = 10, kSteps = 60;

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kIn, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kHidden))),
        fc3(register_module("fc3", torch::nn::Linear(kHidden, kClasses))) {}
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc3(torch::relu(fc2(torch::relu(fc1(b.input))))), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

template <class Trainer>
double run(Trainer& trainer, std::int64_t batch) {
  torch::manual_seed(0);
  Mlp model;
  std::vector<fulgur::data::Batch> batches;
  for (std::int64_t i = 0; i < kWarmup + kSteps; ++i)
    batches.push_back({torch::randn({batch, kIn}), torch::randint(kClasses, {batch}, at::kLong)});
  std::vector<fulgur::data::Batch> warmup(batches.begin(), batches.begin() + kWarmup);
  std::vector<fulgur::data::Batch> timed(batches.begin() + kWarmup, batches.end());
  trainer.fit(model, warmup);
  trainer.barrier();
  const auto start = std::chrono::steady_clock::now();
  trainer.fit(model, timed);
  trainer.barrier();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kSteps;
}
}  // namespace

int main() {
  fulgur::TrainerConfig config{.max_epochs = 1, .enable_progress_bar = false};
  double step_us = 0;
  int rank = 0;
  if (std::getenv("RANK")) {
    config.devices = std::atoi(std::getenv("WORLD_SIZE"));
    const char* strategy = std::getenv("FULGUR_BENCH_STRATEGY");
    const std::string which = strategy != nullptr ? strategy : "";
    if (which == "zero1") {  // ShardedStrategy<1>: optimizer state sharded
      fulgur::Trainer<fulgur::CPUAccelerator, fulgur::ShardedStrategy<1, fulgur::backend::Gloo>, fulgur::FloatPrecision>
          trainer(config);
      rank = trainer.global_rank();
      step_us = run(trainer, kBatchPerRank);
    } else if (which == "zero2") {  // ShardedStrategy<2>: gradients sharded too
      fulgur::Trainer<fulgur::CPUAccelerator, fulgur::ShardedStrategy<2, fulgur::backend::Gloo>, fulgur::FloatPrecision>
          trainer(config);
      rank = trainer.global_rank();
      step_us = run(trainer, kBatchPerRank);
    } else {
      fulgur::Trainer<fulgur::CPUAccelerator, fulgur::BasicDDPStrategy<fulgur::backend::Gloo>, fulgur::FloatPrecision>
          trainer(config);
      rank = trainer.global_rank();
      step_us = run(trainer, kBatchPerRank);
    }
  } else {
    fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer(config);
    step_us = run(trainer, 2 * kBatchPerRank);
  }
  if (rank == 0) std::cout << "step_us " << step_us << std::endl;
}
