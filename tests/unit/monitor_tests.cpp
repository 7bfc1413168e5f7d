// The monitors of "Seeing a run": ThroughputMonitor (and Throughput, the peak FLOP/s table),
// DeviceStatsMonitor's CPU statistics, measure_flops, grad_norm and GradNormMonitor. Lightning's and
// torch's values come from the venv at test time (tests/unit/monitor_reference.py).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "unit/support.hpp"

using namespace fulgur;

namespace {

/// "<case> <key> <value>" lines: case -> key -> value (NaN for Python's None).
using Reference = std::map<std::string, std::map<std::string, double>>;

Reference python_reference(const std::string& command, const std::string& input = "") {
  const std::string out = test::scratch_folder("monitor_reference_" + command) + "/out.txt";
  const std::string line = std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR + "/tests/unit/monitor_reference.py " +
                           command + (input.empty() ? "" : " " + input) + " " + out + " 2>/dev/null";
  if (std::system(line.c_str()) != 0) throw std::runtime_error("the Python reference failed: " + line);
  Reference reference;
  std::ifstream in(out);
  std::string c, key, value;
  while (in >> c >> key >> value)
    reference[c][key] = value == "None" ? std::numeric_limits<double>::quiet_NaN() : std::strtod(value.c_str(), nullptr);
  if (reference.empty()) throw std::runtime_error("the Python reference wrote nothing: " + line);
  return reference;
}

/// The clock of monitor_reference.py: 0.5k + 0.01k² at its k-th call.
std::function<double()> scripted_clock() {
  return [k = 0]() mutable {
    ++k;
    return 0.5 * k + 0.01 * k * k;
  };
}

/// Every call a Trainer's loggers receive.
struct Recorder {
  std::vector<std::pair<std::int64_t, Metrics>> calls;
  void log_metrics(const Metrics& metrics, std::int64_t step) { calls.emplace_back(step, metrics); }
};

struct CountedImpl : torch::nn::Module {
  CountedImpl() : fc(register_module("fc", torch::nn::Linear(8, 3))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc(b.input), b.target);
  }
  at::Tensor validation_step(const data::Batch& b, std::int64_t i) { return training_step(b, i); }
  at::Tensor test_step(const data::Batch& b, std::int64_t i) { return training_step(b, i); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  std::int64_t flops_per_batch = 1000;  // read each batch, as Lightning reads the attribute
  torch::nn::Linear fc;
};
TORCH_MODULE(Counted);

data::TensorLoader loader(std::int64_t n) {
  return data::TensorLoader(torch::randn({n, 8}), torch::randint(3, {n}, at::kLong), {.batch_size = 4});
}

}  // namespace

// ---- Throughput and ThroughputMonitor ---------------------------------------------------------------

TEST_CASE("Throughput computes Lightning's metrics, value for value", "[monitors][throughput]") {
  const Reference lightning = python_reference("throughput");
  // monitor_reference.py's THROUGHPUT_CASES: world_size, window_size, available_flops, lengths, flops.
  struct Case {
    int world, window;
    std::optional<double> peak;
    bool lengths, flops;
  };
  const std::vector<Case> cases{{1, 2, {}, false, false}, {1, 3, 5e6, true, true}, {3, 4, 2e7, true, true},
                                {2, 3, {}, false, true}};
  for (std::size_t c = 0; c < cases.size(); ++c) {
    Throughput t({.available_flops = cases[c].peak, .world_size = cases[c].world, .window_size = cases[c].window});
    auto tick = scripted_clock();
    std::int64_t samples = 0, length = 0;
    for (std::int64_t i = 1; i < 8; ++i) {
      samples += 3 + i % 2;
      length += 7 * (3 + i % 2) + i;
      t.update(tick(), i, samples, cases[c].lengths ? std::optional(length) : std::nullopt,
               cases[c].flops ? std::optional<std::int64_t>(1000 + 37 * i) : std::nullopt);
      const auto& expected = lightning.at(std::to_string(c) + "." + std::to_string(i));
      const Metrics got = t.compute();
      INFO("case " << c << ", update " << i);
      CHECK(got.size() == expected.size());
      for (const auto& [key, value] : expected) {
        INFO(key);
        REQUIRE(got.count(key) == 1);
        CHECK(got.at(key) == value);  // exact: the same arithmetic in the same order
      }
    }
  }
  CHECK_THROWS_WITH(Throughput({.window_size = 1}), Catch::Contains("window_size must be at least 2") &&
                                                         Catch::Contains("got 1"));
  Throughput t;
  t.update(1.0, 1, 4);
  CHECK_THROWS_WITH(t.update(1.0, 2, 8), Catch::Contains("Expected the value to increase"));
  Throughput u;
  CHECK_THROWS_WITH(u.update(1.0, 4, 2), Catch::Contains("Expected samples (2) to be greater or equal than batches (4)"));
}

TEST_CASE("ThroughputMonitor logs what Lightning's logs, at the same steps, on the same clock", "[monitors][throughput]") {
  const Reference lightning = python_reference("monitor");
  torch::manual_seed(0);
  Counted model;
  test::CpuTrainer<FloatPrecision, ThroughputMonitor, Recorder> trainer(
      test::quiet({.max_epochs = 2, .accumulate_grad_batches = 2, .log_every_n_steps = 2}),
      ThroughputMonitor({.batch_size_fn = [](const data::Batch& b) { return b.input.size(0); },
                         .length_fn = [](const data::Batch& b) { return b.input.numel(); },
                         .window_size = 2,
                         .time = scripted_clock()}),
      Recorder());
  trainer.fit(model, loader(24), loader(12));
  trainer.validate(model, loader(12));
  trainer.test(model, loader(12));
  std::vector<std::pair<std::int64_t, Metrics>> ours;
  for (const auto& [step, metrics] : trainer.callback<Recorder>().calls) {
    Metrics kept;
    for (const auto& [key, value] : metrics)
      for (const char* stage : {"train/", "validate/", "test/", "predict/"})
        if (key.rfind(stage, 0) == 0) kept[key] = value;
    if (kept.empty()) continue;
    if (metrics.count("epoch")) kept["epoch"] = metrics.at("epoch");
    ours.emplace_back(step, kept);
  }
  REQUIRE(ours.size() == lightning.size());
  for (std::size_t n = 0; n < ours.size(); ++n) {
    Metrics expected;
    for (const auto& [key, value] : lightning.at(std::to_string(n))) expected[key] = value;
    INFO("logger call " << n);
    CHECK(ours[n].first == static_cast<std::int64_t>(expected.at("step")));
    expected.erase("step");
    CHECK(ours[n].second == expected);
  }
  const ThroughputMonitor& monitor = trainer.callback<ThroughputMonitor>();
  CHECK(monitor.last_metrics("test").count("test/device/flops_per_sec") == 1);
  CHECK(monitor.last_metrics("train").count("train/device/mfu") == 0);  // the CPU has no peak (Lightning: None)
  CHECK_THROWS_WITH(ThroughputMonitor({.window_size = 1}), Catch::Contains("window_size must be at least 2") &&
                                                             Catch::EndsWith("got 1"));
}

// ---- LearningRateMonitor over the schedulers added with issue 34 -------------------------------------------

namespace {
struct ScheduledImpl : torch::nn::Module {
  explicit ScheduledImpl(bool cyclic) : cyclic(cyclic), fc(register_module("fc", torch::nn::Linear(8, 3))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc(b.input), b.target);
  }
  OptimizerConfig configure_optimizers() {
    if (cyclic) {
      auto sgd = std::make_unique<torch::optim::SGD>(parameters(),
                                                     torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
      auto schedule = std::make_unique<optim::CyclicLR>(
          *sgd, optim::CyclicLROptions{.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = 3,
                                       .mode = optim::CyclicLROptions::Mode::triangular2});
      return {.optimizer = std::move(sgd), .lr_scheduler = std::move(schedule), .interval = SchedulerInterval::step};
    }
    auto adam = std::make_unique<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01).betas({0.85, 0.99}));
    std::vector<std::unique_ptr<optim::LRScheduler>> parts;
    parts.push_back(std::make_unique<optim::ConstantLR>(*adam, 0.5, 2));
    parts.push_back(std::make_unique<optim::PolynomialLR>(*adam, 3, 2.0));
    auto chained = std::make_unique<optim::ChainedScheduler>(std::move(parts));
    return {.optimizer = std::move(adam), .lr_scheduler = std::move(chained), .interval = SchedulerInterval::epoch};
  }
  bool cyclic;
  torch::nn::Linear fc;
};
TORCH_MODULE(Scheduled);
}  // namespace

TEST_CASE("LearningRateMonitor logs Lightning's keys and values over CyclicLR (momentum cycled) and ChainedScheduler",
          "[monitors][lr_monitor]") {
  const Reference lightning = python_reference("lr_monitor");
  for (const std::string kind : {"cyclic", "chained"}) {
    CAPTURE(kind);
    torch::manual_seed(0);
    Scheduled model(kind == "cyclic");
    test::CpuTrainer<FloatPrecision, LearningRateMonitor, Recorder> trainer(
        test::quiet({.max_epochs = 3, .log_every_n_steps = 1}),
        LearningRateMonitor({.log_momentum = true, .log_weight_decay = true}), Recorder());
    trainer.fit(model, data::TensorLoader(torch::randn({16, 8}), torch::randint(3, {16}, at::kLong), {.batch_size = 4}));
    std::vector<std::pair<std::int64_t, Metrics>> ours;
    for (const auto& [step, metrics] : trainer.callback<Recorder>().calls) {
      Metrics kept;
      for (const auto& [key, value] : metrics)
        if (key.rfind("lr-", 0) == 0) kept[key] = value;
      if (!kept.empty()) ours.emplace_back(step, kept);
    }
    std::vector<std::pair<std::int64_t, Metrics>> expected;
    for (int n = 0; lightning.contains(kind + std::to_string(n)); ++n) {
      Metrics values;
      for (const auto& [key, value] : lightning.at(kind + std::to_string(n))) values[key] = value;
      const auto step = static_cast<std::int64_t>(values.at("step"));
      values.erase("step");
      expected.emplace_back(step, values);
    }
    REQUIRE(expected.size() == (kind == "cyclic" ? 12u : 3u));
    CHECK(ours == expected);  // the same steps, keys and values, to the bit
  }
}

TEST_CASE("ThroughputMonitor: MFU from a given peak, and without FLOPs a warning", "[monitors][throughput]") {
  Counted model;
  test::CpuTrainer<FloatPrecision, ThroughputMonitor, Recorder> trainer(
      test::quiet({.max_epochs = 1, .log_every_n_steps = 1}),
      ThroughputMonitor({.available_flops = 1e6, .window_size = 2, .time = scripted_clock()}), Recorder());
  trainer.fit(model, loader(12));
  const Metrics& last = trainer.callback<ThroughputMonitor>().last_metrics("train");
  REQUIRE(last.count("train/device/mfu") == 1);
  CHECK(last.at("train/device/mfu") == Approx(last.at("train/device/flops_per_sec") / 1e6));
  CHECK(last.count("train/lengths") == 0);  // no length_fn
  CHECK(last.at("train/samples") == 12.0);  // Lightning's batch-size rule without batch_size_fn

  test::Classifier plain;  // no flops_per_batch
  test::CpuTrainer<FloatPrecision, ThroughputMonitor, Recorder> without(test::quiet({.max_epochs = 1}),
                                                                        ThroughputMonitor(), Recorder());
  const auto x = torch::randn({8, 8});
  const auto result = without.fit(plain, data::TensorLoader(x, torch::randint(3, {8}, at::kLong), {.batch_size = 4}));
  bool warned = false;
  for (const auto& w : result.warnings) warned = warned || w.find("flops_per_batch") != std::string::npos;
  CHECK(warned);
}

TEST_CASE("the peak FLOP/s table equals Lightning's get_available_flops for every chip and dtype", "[monitors][throughput]") {
  const Reference lightning = python_reference("peak");
  const std::vector<std::string> names{"NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200",
                                       "NVIDIA H200 SXM1", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090",
                                       "NVIDIA GeForce RTX 3080 Ti", "NVIDIA GeForce RTX 4080 SUPER", "NVIDIA L4",
                                       "Tesla L40", "NVIDIA A10G", "Tesla T4", "Tesla V100-SXM2-16GB", "NVIDIA RTX A6000",
                                       "Quadro RTX 5000", "NVIDIA TITAN RTX", "NVIDIA A40", "Some Other GPU", "GeForce RTX"};
  REQUIRE(lightning.size() == names.size());
  int known = 0;
  for (std::size_t n = 0; n < names.size(); ++n)
    for (const auto& [dtype, expected] : lightning.at(std::to_string(n))) {
      INFO(names[n] << " " << dtype);
      const auto got = peak_flops(names[n], dtype);
      CHECK(got.has_value() == !std::isnan(expected));
      if (got && !std::isnan(expected)) {
        CHECK(*got == expected);
        ++known;
      }
    }
  CHECK(known > 60);
  std::string why;
  CHECK_FALSE(peak_flops("Tesla T4", "bfloat16", &why));
  CHECK(why == "'Tesla T4' does not support bfloat16");
  CHECK_FALSE(available_flops(c10::Device(c10::kCPU), c10::kFloat));  // Lightning: None on the CPU
  CHECK(compute_dtype("bf16-mixed") == c10::kBFloat16);
  CHECK(compute_dtype("16-mixed") == c10::kHalf);
  CHECK(compute_dtype("64-true") == c10::kDouble);
  CHECK(compute_dtype("32-true") == c10::kFloat);
}

// ---- DeviceStatsMonitor ------------------------------------------------------------------------------

namespace {
double vm_rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return -1.0;
}
}  // namespace

TEST_CASE("DeviceStatsMonitor: Lightning's names and hooks, and the CPU statistics are plausible", "[monitors][device_stats]") {
  Counted model;
  test::CpuTrainer<FloatPrecision, DeviceStatsMonitor, Recorder> trainer(
      test::quiet({.max_epochs = 1, .num_sanity_val_steps = 0, .log_every_n_steps = 2}), DeviceStatsMonitor(), Recorder());
  trainer.fit(model, loader(16), loader(8));
  std::map<std::string, std::vector<std::int64_t>> steps_by_hook;
  for (const auto& [step, metrics] : trainer.callback<Recorder>().calls) {
    const auto dot = metrics.begin()->first.find('/');
    const std::string hook = metrics.begin()->first.substr(0, dot);
    if (hook.rfind("DeviceStatsMonitor.", 0) != 0) continue;
    steps_by_hook[hook].push_back(step);
    for (const char* name : {"cpu_percent", "cpu_vm_percent", "cpu_swap_percent", "cpu_rss_bytes"})
      CHECK(metrics.count(hook + "/" + name) == 1);
  }
  // 4 training batches, logged where Lightning's should_update_logs is true: (steps so far + 1) % 2 == 0.
  CHECK(steps_by_hook["DeviceStatsMonitor.on_train_batch_start"] == std::vector<std::int64_t>{1, 3});
  CHECK(steps_by_hook["DeviceStatsMonitor.on_train_batch_end"] == std::vector<std::int64_t>{1, 3});
  // 2 validation batches: the evaluation loop's second, at the training loop's step (validation runs
  // before the epoch's last step is counted, in Lightning and here).
  CHECK(steps_by_hook["DeviceStatsMonitor.on_validation_batch_start"] == std::vector<std::int64_t>{3});
  CHECK(steps_by_hook["DeviceStatsMonitor.on_validation_batch_end"] == std::vector<std::int64_t>{3});

  (void)cpu_stats();
  std::vector<double> burn(1 << 20, 1.0);  // some work between two readings
  double sum = 0;
  for (int r = 0; r < 50; ++r)
    for (double& v : burn) sum += v * 1.0000001;
  const Metrics stats = cpu_stats();
  CHECK(sum > 0);
  CHECK(stats.at("cpu_percent") >= 0.0);
  CHECK(stats.at("cpu_percent") <= 100.0);  // system-wide, as psutil.cpu_percent()
  CHECK(stats.at("cpu_vm_percent") > 0.0);
  CHECK(stats.at("cpu_vm_percent") <= 100.0);
  CHECK(stats.at("cpu_swap_percent") >= 0.0);
  CHECK(stats.at("cpu_swap_percent") <= 100.0);
  CHECK(stats.at("cpu_rss_bytes") > 0.0);
  CHECK(stats.at("cpu_rss_bytes") == Approx(vm_rss_bytes()).epsilon(0.05));
  CHECK(cuda_memory_stats(0).empty());  // no CUDA used here (tests/gpu checks the CUDA statistics)

  test::CpuTrainer<FloatPrecision, DeviceStatsMonitor, Recorder> off(test::quiet({.max_epochs = 1, .log_every_n_steps = 1}),
                                                                     DeviceStatsMonitor({.cpu_stats = false}), Recorder());
  off.fit(model, loader(8));
  CHECK(off.callback<DeviceStatsMonitor>().last_values().empty());

  std::vector<AnyCallback> hidden{AnyCallback(DeviceStatsMonitor())};
  test::CpuTrainer<FloatPrecision, std::vector<AnyCallback>> without_logger(test::quiet({.max_epochs = 1}), std::move(hidden));
  CHECK_THROWS_WITH(without_logger.fit(model, loader(8)), Catch::Contains("Cannot use `DeviceStatsMonitor` callback"));
  STATIC_REQUIRE(needs_logger<DeviceStatsMonitor>());
}

// ---- measure_flops -----------------------------------------------------------------------------------

TEST_CASE("measure_flops counts a Linear MLP's matmuls as FlopCounterMode and the analytic count do", "[monitors][flops]") {
  const Reference torch_counts = python_reference("flops");
  torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 16));
  const auto x = torch::randn({12, 32});
  const std::int64_t forward = measure_flops([&] { (void)model->forward(x); });
  const FlopCount both = count_flops([&] { model->forward(x).sum().backward(); });
  // 2·M·N·K per matmul: forward 2·12·32·64 + 2·12·64·16; backward twice that, less the input's gradient
  // of the first layer (x needs none).
  const std::int64_t analytic_forward = 2 * 12 * 32 * 64 + 2 * 12 * 64 * 16;
  CHECK(forward == analytic_forward);
  CHECK(both.matmul == analytic_forward + 2 * analytic_forward - 2 * 12 * 32 * 64);
  CHECK(static_cast<double>(forward) == torch_counts.at("mlp").at("forward"));
  CHECK(static_cast<double>(both.matmul) == torch_counts.at("mlp").at("total"));
  CHECK(both.total >= both.matmul);  // Kineto also counts elementwise add/mul
  CHECK(both.by_operator.count("aten::addmm") == 1);
}

// ---- grad_norm and GradNormMonitor -------------------------------------------------------------------

namespace {

/// Lightning's grad_norm on the module's gradients, by norm type.
std::map<double, Metrics> lightning_grad_norms(torch::nn::Module& module, const std::vector<double>& norm_types,
                                               const std::string& name) {
  const std::string path = test::scratch_folder("grad_norm_" + name) + "/grads.txt";
  {
    std::ofstream out(path);
    out.precision(9);  // float32 round-trips in 9 significant digits
    for (double p : norm_types) out << python_float_repr(p) << " ";
    out << "\n";
    for (const auto& item : module.named_parameters()) {
      const at::Tensor& p = item.value();
      out << item.key() << " ";
      std::string shape;
      for (auto d : p.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
      out << (shape.empty() ? "-" : shape);
      if (!p.grad().defined()) {
        out << " none\n";
        continue;
      }
      const at::Tensor g = p.grad().to(at::kFloat).contiguous().flatten();
      for (std::int64_t i = 0; i < g.numel(); ++i) out << " " << g[i].item<float>();
      out << "\n";
    }
  }
  std::map<double, Metrics> out;
  for (const auto& [norm, values] : python_reference("grad_norm", path))
    for (const auto& [key, value] : values) out[std::strtod(norm.c_str(), nullptr)][key] = value;
  return out;
}

}  // namespace

TEST_CASE("grad_norm: Lightning's keys and values, one transfer", "[monitors][grad_norm]") {
  torch::manual_seed(1);
  test::Classifier model;
  torch::nn::functional::cross_entropy(model->forward(torch::randn({16, 8})), torch::randint(3, {16}, at::kLong)).backward();
  model->fc2->bias.mutable_grad() = at::Tensor();  // a parameter without a gradient is left out
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> norm_types{2.0, 1.0, 1.5, inf};
  const auto lightning = lightning_grad_norms(*model, norm_types, "unit");
  for (double p : norm_types) {
    INFO("norm_type " << p);
    const Metrics ours = grad_norm(*model, p);
    REQUIRE(ours.size() == lightning.at(p).size());
    for (const auto& [key, value] : lightning.at(p)) {
      INFO(key);
      REQUIRE(ours.count(key) == 1);
      CHECK(ours.at(key) == Approx(value).epsilon(1e-6));
    }
  }
  CHECK(grad_norm(*model, 2.0).count("grad_2.0_norm/fc1.weight") == 1);
  CHECK(grad_norm(*model, inf).count("grad_inf_norm_total") == 1);
  CHECK(python_float_repr(1e-5) == "1e-05");
  CHECK(python_float_repr(3.0) == "3.0");
  CHECK(python_float_repr(0.25) == "0.25");
  CHECK_THROWS_WITH(grad_norm(*model, 0.0), Catch::Contains("`norm_type` must be a positive number or 'inf'") &&
                                                Catch::Contains("Got 0.0"));
  CHECK_THROWS_WITH(GradNormMonitor({.norm_type = -1.0}), Catch::Contains("Got -1.0"));
  test::Classifier fresh;
  CHECK(grad_norm(*fresh, 2.0).empty());  // no gradients yet: no keys, as Lightning
}

namespace {
/// At on_before_optimizer_step (after GradNormMonitor's), the module's gradient norms on the host and
/// the gradients themselves, for Lightning's grad_norm.
struct GradientProbe {
  std::vector<Metrics> norms;
  std::vector<std::vector<at::Tensor>> grads;
  void on_before_optimizer_step(TrainerView&, torch::nn::Module& module, torch::optim::Optimizer&) {
    norms.push_back(grad_norm(module, 2.0));
    std::vector<at::Tensor> g;
    for (const auto& p : module.parameters()) g.push_back(p.grad().detach().clone());
    grads.push_back(std::move(g));
  }
};

template <class Precision>
std::pair<std::vector<std::pair<std::int64_t, Metrics>>, GradientProbe> run_grad_norm_monitor(double clip) {
  torch::manual_seed(3);
  test::Classifier model(8, 16, 3, /*use_sgd=*/true, /*lr=*/0.5);
  const auto [x, y] = test::classification_data(32, 5);
  test::CpuTrainer<Precision, GradNormMonitor, GradientProbe, Recorder> trainer(
      test::quiet({.max_epochs = 1, .gradient_clip_val = clip, .log_every_n_steps = 2}), GradNormMonitor(), GradientProbe(),
      Recorder());
  trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 8}));
  return {trainer.template callback<Recorder>().calls, trainer.template callback<GradientProbe>()};
}
}  // namespace

TEST_CASE("GradNormMonitor logs the unscaled, unclipped norms at on_before_optimizer_step (16-mixed, clipping)",
          "[monitors][grad_norm]") {
  const double clip = 1e-3;  // far below the norms: clipping would show
  const auto [logged, probe] = run_grad_norm_monitor<FP16MixedPrecision>(clip);
  const auto [logged32, probe32] = run_grad_norm_monitor<FloatPrecision>(clip);
  REQUIRE(probe.norms.size() == 4);
  // Logged at the log cadence (steps 1 and 3, 0-based), with the values the probe read in the same hook.
  std::vector<std::int64_t> steps;
  for (const auto& [step, metrics] : logged) {
    if (metrics.count("grad_2.0_norm_total") == 0) continue;
    steps.push_back(step);
    const Metrics& seen = probe.norms.at(static_cast<std::size_t>(step));
    for (const auto& [key, value] : seen) {
      INFO(key);
      REQUIRE(metrics.count(key) == 1);
      CHECK(metrics.at(key) == value);
    }
  }
  CHECK(steps == std::vector<std::int64_t>{1, 3});
  // Unclipped: far above the clip value; unscaled: the first step's norm equals 32-true's (same weights
  // and batch; 16-mixed's forward in half precision), not 65536 times it.
  CHECK(probe.norms[0].at("grad_2.0_norm_total") > 100 * clip);
  CHECK(probe.norms[0].at("grad_2.0_norm_total") == Approx(probe32.norms[0].at("grad_2.0_norm_total")).epsilon(1e-2));
  // And Lightning's grad_norm on those gradients.
  test::Classifier holder(8, 16, 3);
  auto params = holder->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = probe.grads[1][i];
  const auto lightning = lightning_grad_norms(*holder, {2.0}, "monitor");
  for (const auto& [key, value] : lightning.at(2.0)) {
    INFO(key);
    CHECK(probe.norms[1].at(key) == Approx(value).epsilon(1e-6));
  }
}
