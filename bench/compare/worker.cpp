// One run of the side-by-side comparison (compare.py): the tiny MLP trained for the steps of
// data.pt from the weights of init.pt (both written by the driver with torch.save), either by
// fulgur's Trainer::fit or by the same loop written by hand against LibTorch.
//   bench_compare_worker fulgur|libtorch PRECISION DIR
// Prints one line: {"seconds": <wall time of the training>, "losses": [<loss of each step>]}.
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "../matrix.hpp"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(32, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 64))),
        fc3(register_module("fc3", torch::nn::Linear(64, 10))) {}
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    at::Tensor loss = torch::nn::functional::cross_entropy(fc3(torch::relu(fc2(torch::relu(fc1(b.input))))), b.target);
    losses.push_back(loss.detach());
    return loss;
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  }
  torch::nn::Linear fc1, fc2, fc3;
  std::vector<at::Tensor> losses;
};
TORCH_MODULE(Mlp);

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: bench_compare_worker fulgur|libtorch PRECISION DIR\n";
    return 2;
  }
  const std::string mode = argv[1], precision = argv[2], dir = argv[3];
  at::set_num_threads(1);
  const fulgur::StateDict init = fulgur::checkpoint::load(dir + "/init.pt");
  const fulgur::StateDict data = fulgur::checkpoint::load(dir + "/data.pt");
  const at::Tensor x = data.at("x").toTensor(), y = data.at("y").toTensor();
  std::vector<fulgur::data::Batch> batches;
  for (std::int64_t i = 0; i < x.size(0); ++i) batches.push_back({x[i], y[i]});
  Mlp model;
  fulgur::checkpoint::load_module_state_dict(*model, init);
  double seconds = 0;
  fulgur::dispatch("cpu", "single_device", precision, [&](auto trainer_type) {
    using T = typename decltype(trainer_type)::type;
    using P = typename T::precision_type;
    if (mode == "fulgur") {
      T trainer(fulgur::TrainerConfig{.max_epochs = 1, .enable_progress_bar = false});
      const auto t0 = std::chrono::steady_clock::now();
      trainer.fit(model, batches);
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      fulgur::bench::detail::hand_written<P>(model, batches, c10::Device(c10::kCPU));
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  });
  std::printf("{\"seconds\": %.9f, \"losses\": [", seconds);
  for (std::size_t i = 0; i < model->losses.size(); ++i)
    std::printf("%s%.17g", i ? ", " : "", model->losses[i].to(at::kDouble).item<double>());
  std::printf("]}\n");
}
