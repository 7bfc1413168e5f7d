#include "../matrix.hpp"
#include "workloads.hpp"

namespace fulgur::bench {
namespace {
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(32, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 64))),
        fc3(register_module("fc3", torch::nn::Linear(64, 10))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    const at::Tensor logits = fc3(torch::relu(fc2(torch::relu(fc1(b.input)))));
    return torch::nn::functional::cross_entropy(logits, b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);
}  // namespace

void register_mlp() {
  register_matrix("mlp", [] { return Mlp(); }, [] {
    torch::manual_seed(0);
    std::vector<data::Batch> batches;
    for (int i = 0; i < 100; ++i) batches.push_back({torch::randn({64, 32}), torch::randint(10, {64}, at::kLong)});
    return batches;
  }, {.items_per_batch = 64});
}
}  // namespace fulgur::bench
