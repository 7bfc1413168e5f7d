// One run of the side-by-side comparison (compare.py): the tiny MLP of bench/matrix/mlp.hpp (or the
// small GPT of bench/matrix/gpt.hpp) trained for the steps of data.pt from the weights of init.pt (both written by
// the driver with torch.save), either by fulgur's Trainer::fit or by the same loop written by hand
// against LibTorch.
//   bench_compare_worker fulgur|libtorch PRECISION DIR [mlp|gpt]
// Prints one line: {"seconds": <wall time of the training>, "losses": [<loss of each step>]}.
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "../matrix.hpp"
#include "../matrix/gpt.hpp"
#include "../matrix/mlp.hpp"


template <class Model>
int run(const std::string& mode, const std::string& precision, const std::string& dir) {
  const fulgur::StateDict init = fulgur::checkpoint::load(dir + "/init.pt");
  const fulgur::StateDict data = fulgur::checkpoint::load(dir + "/data.pt");
  const at::Tensor x = data.at("x").toTensor(), y = data.at("y").toTensor();
  std::vector<fulgur::data::Batch> batches;
  for (std::int64_t i = 0; i < x.size(0); ++i) batches.push_back({x[i], y[i]});
  Model model;
  model->record_losses = true;
  fulgur::checkpoint::load_module_state_dict(*model, init);
  double seconds = 0;
  fulgur::dispatch("cpu", "single_device", precision, [&](auto trainer_type) {
    using T = typename decltype(trainer_type)::type;
    using P = typename T::precision_type;
    {  // untimed, for both: two steps of another model pay the process's first-use costs (thread
       // pool, allocator, kernel selection), which the Python runs pay in their warm-up run
      Model warm;
      const std::vector<fulgur::data::Batch> two(batches.begin(), batches.begin() + std::min<std::size_t>(2, batches.size()));
      fulgur::bench::detail::hand_written<P>(warm, two, c10::Device(c10::kCPU));
    }
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
    std::printf("%s%.17g", i ? ", " : "", model->losses[i].to(at::kDouble).template item<double>());
  std::printf("]}\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: bench_compare_worker fulgur|libtorch PRECISION DIR [mlp|gpt]\n";
    return 2;
  }
  at::set_num_threads(1);
  const std::string model = argc == 5 ? argv[4] : "mlp";
  if (model == "gpt") return run<fulgur::bench::models::Gpt>(argv[1], argv[2], argv[3]);
  return run<fulgur::bench::models::Mlp>(argv[1], argv[2], argv[3]);
}
