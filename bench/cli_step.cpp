// Per-step time of a fit launched by fulgur::cli (a command line parsed, the Trainer type chosen at run
// time, callbacks held in std::vectors, the resolved config saved) against the same fit written
// directly with the Trainer type named in code, on the tiny MLP of bench_step (where per-step overhead
// shows most). The module times its own training (on_train_start to on_train_end), so the CLI's one-off
// parsing and dispatch are outside the step time measured, as they are outside a step.
//
// Each iteration runs both, alternating which goes first. Counters: direct_us and cli_us (median
// microseconds per step) and ratio (median of cli/direct; goal <= 1.02).
#include <benchmark/benchmark.h>
#include <fulgur/cli.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace {

constexpr std::int64_t kSteps = 200, kBatch = 64, kIn = 32, kHidden = 64, kClasses = 10;
std::chrono::steady_clock::time_point train_start, train_end;

struct MlpConfig {
  double lr = 1e-2;
  static constexpr auto fields() { return std::tuple(fulgur::cli::field("lr", &MlpConfig::lr, "SGD's lr")); }
};

struct MlpImpl : torch::nn::Module {
  using config_type = MlpConfig;
  explicit MlpImpl(MlpConfig c = {})
      : config(c),
        fc1(register_module("fc1", torch::nn::Linear(kIn, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kHidden))),
        fc3(register_module("fc3", torch::nn::Linear(kHidden, kClasses))) {}
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc3(torch::relu(fc2(torch::relu(fc1(b.input))))), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(config.lr).momentum(0.9));
  }
  void on_train_start() { train_start = std::chrono::steady_clock::now(); }
  void on_train_end() { train_end = std::chrono::steady_clock::now(); }
  MlpConfig config;
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

struct Data {
  static fulgur::data::TensorLoader loader() {
    static const at::Tensor x = (torch::manual_seed(0), torch::randn({kSteps * kBatch, kIn}));
    static const at::Tensor y = torch::randint(kClasses, {kSteps * kBatch}, at::kLong);
    return {x, y, {.batch_size = kBatch}};
  }
  fulgur::data::TensorLoader train_dataloader() const { return loader(); }
};

double step_us() { return std::chrono::duration<double, std::micro>(train_end - train_start).count() / kSteps; }

double direct() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer(
      {.max_epochs = 1, .seed = 0, .default_root_dir = "/tmp/fulgur_bench_cli/direct", .enable_progress_bar = false});
  Mlp model;
  auto loader = Data::loader();
  trainer.fit(model, loader);
  return step_us();
}

double through_cli() {
  constexpr auto compiled = fulgur::compatible_trainers(
      fulgur::shipped_accelerators, boost::hana::tuple_t<fulgur::SingleDeviceStrategy>, fulgur::shipped_precisions);
  fulgur::cli::run<Mlp, Data>({"bench", "fit", "--trainer.max_epochs=1", "--seed_everything=0",
                               "--trainer.accelerator=cpu", "--trainer.precision=32-true",
                               "--trainer.default_root_dir=/tmp/fulgur_bench_cli/cli", "--trainer.enable_progress_bar=false",
                               "--trainer.logger=false", "--trainer.enable_checkpointing=false",
                               "--trainer.enable_model_summary=false"},
                              compiled);
  return step_us();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BM_cli_step(benchmark::State& state) {
  torch::set_num_threads(1);
  std::vector<double> direct_us, cli_us, ratios;
  bool cli_first = false;
  for (auto _ : state) {
    double d = 0, c = 0;
    if (cli_first) c = through_cli(), d = direct();
    else d = direct(), c = through_cli();
    cli_first = !cli_first;
    direct_us.push_back(d);
    cli_us.push_back(c);
    ratios.push_back(c / d);
  }
  state.counters["direct_us"] = median(direct_us);
  state.counters["cli_us"] = median(cli_us);
  state.counters["ratio"] = median(ratios);
}
BENCHMARK(BM_cli_step)->Iterations(30)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
