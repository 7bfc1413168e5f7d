#pragma once
// The tiny MLP of the benchmarks (bench_matrix's "mlp" rows, bench/compare's default model):
// 32-64-64-10, SGD with momentum. bench/compare/compare.py builds the same network in Python, under
// the same parameter names.
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <vector>

namespace fulgur::bench::models {

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(32, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 64))),
        fc3(register_module("fc3", torch::nn::Linear(64, 10))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    at::Tensor loss = torch::nn::functional::cross_entropy(fc3(torch::relu(fc2(torch::relu(fc1(b.input))))), b.target);
    if (record_losses) losses.push_back(loss.detach());
    return loss;
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  }
  torch::nn::Linear fc1, fc2, fc3;
  bool record_losses = false;  // bench/compare: each step's loss, read after the run
  std::vector<at::Tensor> losses;
};
TORCH_MODULE(Mlp);

}  // namespace fulgur::bench::models
