#pragma once
// The elastic-restart scenario (tests/distributed/elastic.sh), shared by ddp_worker (DDP) and
// sharded_worker (ShardedStrategy<2>): 2 ranks train 40 steps with dropout and a ModelCheckpoint
// every 5 steps. With FULGUR_TEST_KILL_STEP=s and FULGUR_TEST_KILL_RANK=r, rank r SIGKILLs itself
// in training_step at global step s, once (the marker file <root>/killed, holding the kill's time,
// makes the restarted group train on); the launcher (fulgur's, max_restarts = 1, or torchrun
// --max-restarts=1) restarts both ranks, which resume by themselves. The final weights go to
// <root>/weights (rank 0), to be compared with an uninterrupted run's; the restarted group's first
// step prints "first resumed step at <ns>" for the restart-to-resume time. With
// FULGUR_TEST_BREAK_NEWEST set, the killed rank first removes the parts beside the newest checkpoint
// (a sharded one's rank files): the restarted ranks must pass over it and resume from the one before.
#include <fulgur/detail/files.hpp>
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "worker.hpp"

namespace elastic {

inline long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline int environment_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 33))), fc2(register_module("fc2", torch::nn::Linear(33, 3))) {}
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t, fulgur::StepContext& ctx) {
    if (ctx.global_step == kill_step && ctx.global_rank == kill_rank && !std::ifstream(marker)) {
      if (std::getenv("FULGUR_TEST_BREAK_NEWEST")) {  // the newest checkpoint loses its parts beside the file
        const std::string newest = fulgur::detail::newest_file({checkpoints}, "", ".ckpt");
        fulgur::detail::remove_tree(newest + ".shards");
        std::cout << "removed the parts of " << newest << std::endl;
      }
      std::ofstream(marker) << now_ns() << std::endl;  // closed (flushed) before the kill
      std::raise(SIGKILL);
    }
    if (first_step && environment_int("TORCHELASTIC_RESTART_COUNT", 0) > 0 && ctx.global_rank == 0)
      std::cout << "first resumed step at " << now_ns() << " (global step " << ctx.global_step << ")" << std::endl;
    first_step = false;
    return torch::nn::functional::cross_entropy(fc2(drop(torch::tanh(fc1(b.input)))), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout drop{register_module("drop", torch::nn::Dropout(0.2))};
  std::int64_t kill_step = environment_int("FULGUR_TEST_KILL_STEP", -1);
  int kill_rank = environment_int("FULGUR_TEST_KILL_RANK", 1);
  std::string marker, checkpoints;
  bool first_step = true;
};
TORCH_MODULE(Net);

/// argv: <root>; the strategy S runs 2 ranks (fulgur's launcher when none is around).
template <class S>
void run(const std::string& root) {
  torch::manual_seed(5);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto x = at::randn({512, 8}, gen);
  const auto y = (x.select(1, 0) > 0).to(at::kLong) + (x.select(1, 1) > 0.5).to(at::kLong);
  Net model;
  model->marker = root + "/killed";
  model->checkpoints = root + "/checkpoints";
  fulgur::TrainerConfig c;
  c.max_steps = 40;
  c.enable_progress_bar = false;
  c.default_root_dir = root;
  c.devices = 2;
  c.max_restarts = 1;
  fulgur::Trainer<fulgur::CPUAccelerator, S, fulgur::FloatPrecision, fulgur::ModelCheckpoint> trainer(
      c, worker::options(),
      fulgur::ModelCheckpoint({.dirpath = model->checkpoints, .save_top_k = -1, .every_n_train_steps = 5}));
  worker::my_rank = trainer.global_rank();
  fulgur::data::TensorLoader loader(x, y, {.batch_size = 16, .shuffle = true, .seed = 3});
  const auto result = trainer.fit(model, loader);
  worker::check(result.global_step == 40, "trained to max_steps: " + std::to_string(result.global_step));
  if (trainer.is_global_zero()) {
    std::ofstream out(root + "/weights");
    out << std::hexfloat;
    for (const auto& p : model->parameters()) {
      const at::Tensor flat = p.detach().flatten().contiguous();
      for (std::int64_t i = 0; i < flat.numel(); ++i) out << flat[i].item<float>() << "\n";
    }
  }
}

}  // namespace elastic
