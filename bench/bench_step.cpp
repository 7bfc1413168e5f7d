// Per-step time of Trainer::fit against the same training written by hand against LibTorch,
// for each CPU precision, on a tiny MLP (the case where per-step overhead shows most).
//
// Each benchmark iteration runs one K-step training both ways, alternating which goes first, so
// drift and thermal noise hit both alike. Reported per precision: hand_us and fulgur_us (median
// microseconds per step) and ratio (median over iterations of fulgur/hand; goal <= 1.02).
// BM_step_logged is the same with what a real run carries: the module logs its loss every step,
// and the Trainer has a ProgressBar (plain lines, as off a terminal) and a CSVLogger, at the
// default log cadence (log_every_n_steps = 50). Its hand-written side logs as a LibTorch user does
// by hand: a clock read per step for the progress line, the loss read every 50 steps and appended
// to a CSV file (kept open), a line at the epoch's end. Its ratio is fulgur's overhead for the same
// output; `bare_us` (the hand loop without logging) shows what the logging itself costs.
// BM_loader times fit on the same shuffled in-memory data read two ways: TensorLoader, and
// DataLoader over a TensorDataset with num_workers = 0 (ratio = DataLoader / TensorLoader, goal
// <= 1.02: the loader's generality costs nothing when it is not used).
#include <ATen/autocast_mode.h>
#include <benchmark/benchmark.h>
#include <fulgur/detail/files.hpp>
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

namespace {

constexpr std::int64_t kSteps = 200, kBatch = 64, kIn = 32, kHidden = 64, kClasses = 10;

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kIn, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kHidden))),
        fc3(register_module("fc3", torch::nn::Linear(kHidden, kClasses))) {}
  at::Tensor forward(const at::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

/// The MLP logging its loss each step (on_step: reaches the logger every log_every_n_steps).
struct LoggingMlpImpl : MlpImpl {
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t i, fulgur::StepContext& ctx) {
    at::Tensor loss = MlpImpl::training_step(b, i);
    ctx.log("train_loss", loss, {.prog_bar = true});
    return loss;
  }
};

TORCH_MODULE(LoggingMlp);

/// Where the logged benchmark's progress lines go (the terminal would measure the terminal).
std::ostream& discard() {
  static std::ostream sink(nullptr);
  return sink;
}

std::vector<fulgur::data::Batch> make_batches() {
  torch::manual_seed(0);
  std::vector<fulgur::data::Batch> batches;
  for (std::int64_t i = 0; i < kSteps; ++i)
    batches.push_back({torch::randn({kBatch, kIn}), torch::randint(kClasses, {kBatch}, at::kLong)});
  return batches;
}

/// What a LibTorch user writes by hand for the logged run's output (see the top of the file).
struct HandLog {
  std::FILE* csv = nullptr;
  std::chrono::steady_clock::time_point last_line{};
  HandLog() {
    fulgur::detail::make_directories("/tmp/fulgur_bench_logs/hand");
    csv = std::fopen("/tmp/fulgur_bench_logs/hand/metrics.csv", "w");
    std::fprintf(csv, "epoch,step,train_loss\n");
  }
  ~HandLog() { std::fclose(csv); }
  void step(std::int64_t step, std::int64_t steps, const at::Tensor& loss) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_line > std::chrono::seconds(30)) {  // a progress line, at most every 30 s
      last_line = now;
      discard() << "step " << step << " loss " << loss.item<double>() << '\n';
    }
    if ((step + 1) % 50 == 0 || step + 1 == steps) {
      std::fprintf(csv, "0,%lld,%.9g\n", static_cast<long long>(step), loss.item<double>());
      std::fflush(csv);
    }
  }
};

/// The loop a LibTorch user writes today for precision P (autocast and GradScaler by hand); with
/// a HandLog, it logs as the logged benchmark's Trainer does.
template <class P>
void hand_written(Mlp& model, const std::vector<fulgur::data::Batch>& batches, HandLog* log = nullptr) {
  constexpr bool mixed = requires { P::uses_scaler; };
  constexpr bool scaled = fulgur::detail::uses_scaler<P>();
  if constexpr (!mixed && !std::is_same_v<P, fulgur::FloatPrecision>) {
    model->to(P::dtype);
  }
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  fulgur::GradScaler scaler;
  for (const auto& batch : batches) {
    at::Tensor loss;
    if constexpr (mixed) {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, P::dtype);
      at::autocast::increment_nesting();
      loss = torch::nn::functional::cross_entropy(model->forward(batch.input), batch.target);
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      at::autocast::set_autocast_enabled(at::kCPU, false);
    } else if constexpr (std::is_same_v<P, fulgur::FloatPrecision>) {
      loss = torch::nn::functional::cross_entropy(model->forward(batch.input), batch.target);
    } else {
      loss = torch::nn::functional::cross_entropy(model->forward(batch.input.to(P::dtype)), batch.target);
    }
    if constexpr (scaled) {
      scaler.scale(loss).backward();
      scaler.step(optimizer);
      scaler.update();
    } else {
      loss.backward();
      optimizer.step();
    }
    optimizer.zero_grad();
    if (log != nullptr) log->step(&batch - batches.data(), static_cast<std::int64_t>(batches.size()), loss);
  }
  if (log != nullptr) discard() << "epoch 0 done\n";
}


double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Trainer, class Model>
Trainer make_trainer() {
  if constexpr (std::is_same_v<Model, Mlp>) {
    return Trainer({.max_epochs = 1, .enable_progress_bar = false});
  } else {
    const std::string logs = "/tmp/fulgur_bench_logs";
    fulgur::detail::remove_tree(logs);  // POSIX: see fulgur/detail/files.hpp
    return Trainer({.max_epochs = 1, .default_root_dir = logs},
                   fulgur::ProgressBar({.terminal = false, .stream = &discard()}), fulgur::CSVLogger());
  }
}

template <class Trainer, class Model = Mlp>
void BM_step(benchmark::State& state) {
  using P = typename Trainer::precision_type;
  auto batches = make_batches();
  Trainer trainer = make_trainer<Trainer, Model>();
  constexpr bool logged = !std::is_same_v<Model, Mlp>;
  std::optional<HandLog> log;
  if constexpr (logged) log.emplace();
  std::vector<double> hand_us, fulgur_us, ratios, bare_us;
  bool fulgur_first = false;
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    Mlp hand_model;
    Model fulgur_model;
    double t_hand = 0, t_fulgur = 0;
    auto time_hand = [&] {
      const auto t0 = clock::now();
      hand_written<P>(hand_model, batches, log ? &*log : nullptr);
      t_hand = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / kSteps;
    };
    auto time_fulgur = [&] {
      const auto t0 = clock::now();
      trainer.fit(fulgur_model, batches);
      t_fulgur = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / kSteps;
    };
    if (fulgur_first) { time_fulgur(); time_hand(); } else { time_hand(); time_fulgur(); }
    fulgur_first = !fulgur_first;
    if constexpr (logged) {  // the bare loop too, for what the logging itself costs
      Mlp bare_model;
      const auto t0 = clock::now();
      hand_written<P>(bare_model, batches);
      bare_us.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count() / kSteps);
    }
    hand_us.push_back(t_hand);
    fulgur_us.push_back(t_fulgur);
    ratios.push_back(t_fulgur / t_hand);
    state.SetIterationTime(t_fulgur * 1e-6 * kSteps);
  }
  state.counters["hand_us"] = median(hand_us);
  state.counters["fulgur_us"] = median(fulgur_us);
  state.counters["ratio"] = median(ratios);
  if constexpr (logged) state.counters["bare_us"] = median(bare_us);
  state.SetLabel(std::string(P::name));
}

/// fit over TensorLoader against fit over DataLoader(TensorDataset, num_workers = 0), 32-true.
void BM_loader(benchmark::State& state) {
  using Trainer = fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision>;
  torch::manual_seed(0);
  const auto x = torch::randn({kSteps * kBatch, kIn});
  const auto y = torch::randint(kClasses, {kSteps * kBatch}, at::kLong);
  fulgur::data::TensorLoader tensor_loader(x, y, {.batch_size = kBatch, .shuffle = true, .seed = 1});
  fulgur::data::DataLoader data_loader(fulgur::data::TensorDataset(x, y),
                                       {.batch_size = kBatch, .shuffle = true, .num_workers = 0, .seed = 1});
  Trainer trainer({.max_epochs = 1, .enable_progress_bar = false});
  std::vector<double> tensor_us, data_us, ratios;
  bool data_first = false;
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    Mlp a, b;
    double t_tensor = 0, t_data = 0;
    auto time = [&](Mlp& model, auto& loader, double& out) {
      loader.set_epoch(0);
      const auto t0 = clock::now();
      trainer.fit(model, loader);
      out = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / kSteps;
    };
    if (data_first) { time(a, data_loader, t_data); time(b, tensor_loader, t_tensor); }
    else { time(a, tensor_loader, t_tensor); time(b, data_loader, t_data); }
    data_first = !data_first;
    tensor_us.push_back(t_tensor);
    data_us.push_back(t_data);
    ratios.push_back(t_data / t_tensor);
    state.SetIterationTime(t_data * 1e-6 * kSteps);
  }
  state.counters["tensor_loader_us"] = median(tensor_us);
  state.counters["data_loader_us"] = median(data_us);
  state.counters["ratio"] = median(ratios);
}

/// fit with a SimpleProfiler timing every action against the same fit without one, 32-true
/// (ratio = profiled / plain, goal <= 1.02: Lightning's action timings cost two clock reads each).
void BM_profiled(benchmark::State& state) {
  using Plain = fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision>;
  using Profiled = Plain::with_callbacks<fulgur::SimpleProfiler>;
  auto batches = make_batches();
  Plain plain({.max_epochs = 1, .enable_progress_bar = false});
  Profiled profiled({.max_epochs = 1, .enable_progress_bar = false}, fulgur::SimpleProfiler({.print = false}));
  std::vector<double> plain_us, profiled_us, ratios;
  bool profiled_first = false;
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    Mlp a, b;
    double t_plain = 0, t_profiled = 0;
    auto time = [&](auto& trainer, Mlp& model, double& out) {
      const auto t0 = clock::now();
      trainer.fit(model, batches);
      out = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / kSteps;
    };
    if (profiled_first) { time(profiled, a, t_profiled); time(plain, b, t_plain); }
    else { time(plain, a, t_plain); time(profiled, b, t_profiled); }
    profiled_first = !profiled_first;
    plain_us.push_back(t_plain);
    profiled_us.push_back(t_profiled);
    ratios.push_back(t_profiled / t_plain);
    state.SetIterationTime(t_profiled * 1e-6 * kSteps);
  }
  state.counters["plain_us"] = median(plain_us);
  state.counters["profiled_us"] = median(profiled_us);
  state.counters["ratio"] = median(ratios);
  std::size_t actions = 0;
  for (const auto& row : profiled.callback<fulgur::SimpleProfiler>().rows()) actions += row.calls > 0;
  state.counters["actions"] = static_cast<double>(actions);
}

}  // namespace

// The matrix: every compatible CPU single-device combination, from the shipped policy lists.
inline constexpr auto cpu_trainers = fulgur::compatible_trainers(
    boost::hana::tuple_t<fulgur::CPUAccelerator>, boost::hana::tuple_t<fulgur::SingleDeviceStrategy>,
    fulgur::shipped_precisions);

int main(int argc, char** argv) {
  boost::hana::for_each(cpu_trainers, [](auto trainer_type) {
    using Trainer = typename decltype(trainer_type)::type;
    benchmark::RegisterBenchmark(("BM_step/" + std::string(Trainer::precision_type::name)).c_str(), BM_step<Trainer>)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(3.0);
    using Logged = typename Trainer::template with_callbacks<fulgur::ProgressBar, fulgur::CSVLogger>;
    benchmark::RegisterBenchmark(("BM_step_logged/" + std::string(Trainer::precision_type::name)).c_str(),
                                 BM_step<Logged, LoggingMlp>)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(3.0);
  });
  benchmark::RegisterBenchmark("BM_profiled/32-true", BM_profiled)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(3.0);
  benchmark::RegisterBenchmark("BM_loader/32-true", BM_loader)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(3.0);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
