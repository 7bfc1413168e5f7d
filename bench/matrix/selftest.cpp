// ctest bench.matrix.selftest: bench/matrix.hpp's own behaviour, on a tiny MLP and short rows.
//  - a row whose hand-written loop throws under bf16-mixed leaves CPU autocast off (and its nesting
//    at 0): a 32-true fit after it gives the same losses, bit for bit, as before it;
//  - a failed row says which side failed, with fulgur's whole message (step, batch, precision);
//  - a row where the loss scaler skipped steps (inputs beyond float16's range) is not reported as a timing;
//  - bad MatrixOptions are a std::invalid_argument naming the field; items_per_batch defaults to
//    the first batch's size;
//  - modules shaped as fit accepts them (StepContext&, OptimizerConfig with a scheduler, manual
//    optimization) run in the hand-written loop, and batches are converted as fit converts them;
//  - --threads, a misspelt flag, and run_matrix's exit status.
#include <ATen/autocast_mode.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../matrix.hpp"

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool throws = false)
      : throws(throws), fc1(register_module("fc1", torch::nn::Linear(32, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 10))) {}
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    TORCH_CHECK(!throws, "model error on purpose");
    at::Tensor loss = torch::nn::functional::cross_entropy(fc2(torch::relu(fc1(b.input))), b.target);
    if (record) losses.push_back(loss.item<double>());
    return loss;
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
  bool throws;
  bool record = false;
  torch::nn::Linear fc1, fc2;
  std::vector<double> losses;
};
TORCH_MODULE(Net);

/// training_step with a StepContext (it logs), configure_optimizers with a per-step scheduler.
struct LoggingNetImpl : torch::nn::Module {
  LoggingNetImpl() : fc(register_module("fc", torch::nn::Linear(32, 10))) {}
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t, fulgur::StepContext& ctx) {
    at::Tensor loss = torch::nn::functional::cross_entropy(fc(b.input), b.target);
    ctx.log("train_loss", loss);
    return loss;
  }
  fulgur::OptimizerConfig configure_optimizers() {
    auto sgd = std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
    auto scheduler = std::make_unique<torch::optim::StepLR>(*sgd, 2, 0.5);
    return {std::move(sgd), std::move(scheduler), fulgur::SchedulerInterval::step};
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(LoggingNet);

/// A regression against a float32 target: under a "-true" precision fit converts the target too.
struct RegressionImpl : torch::nn::Module {
  RegressionImpl() : fc(register_module("fc", torch::nn::Linear(32, 1))) {}
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::mse_loss(fc(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01));
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Regression);

/// Manual optimization with two optimizers.
struct ManualNetImpl : torch::nn::Module {
  static constexpr bool automatic_optimization = false;
  ManualNetImpl() : a(register_module("a", torch::nn::Linear(32, 16))), b(register_module("b", torch::nn::Linear(16, 10))) {}
  void training_step(const fulgur::data::Batch& batch, std::int64_t, fulgur::StepContext& ctx) {
    at::Tensor loss = torch::nn::functional::cross_entropy(b(torch::relu(a(batch.input))), batch.target);
    ctx.manual_backward(loss);
    for (auto& optimizer : ctx.optimizers()) {
      optimizer.step();
      optimizer.zero_grad();
    }
  }
  std::vector<fulgur::OptimizerConfig> configure_optimizers() {
    std::vector<fulgur::OptimizerConfig> configs;
    configs.push_back({std::make_unique<torch::optim::SGD>(a->parameters(), torch::optim::SGDOptions(0.1))});
    configs.push_back({std::make_unique<torch::optim::SGD>(b->parameters(), torch::optim::SGDOptions(0.1))});
    return configs;
  }
  torch::nn::Linear a, b;
};
TORCH_MODULE(ManualNet);

std::vector<fulgur::data::Batch> batches(std::int64_t samples = 64, int count = 6, double scale = 1.0) {
  torch::manual_seed(0);
  std::vector<fulgur::data::Batch> b;
  for (int i = 0; i < count; ++i)
    b.push_back({torch::randn({samples, 32}) * scale, torch::randint(10, {samples}, at::kLong)});
  return b;
}

/// The losses of a 32-true fit from fixed weights.
std::vector<double> fit_losses() {
  torch::manual_seed(1);
  Net net;
  net->record = true;
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer(
      {.max_epochs = 1, .num_sanity_val_steps = 0, .enable_progress_bar = false});
  trainer.fit(net, batches());
  return net->losses;
}

struct Row {
  bool error = false;
  std::string message;
  std::map<std::string, double> counters;
};

/// Keeps every row's outcome (and prints nothing).
class Capture : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      Row& row = rows[run.benchmark_name()];
      row.error = run.error_occurred;
      row.message = run.error_message;
      for (const auto& [name, counter] : run.counters) row.counters[name] = counter.value;
    }
  }
  std::map<std::string, Row> rows;
};

template <class... P>
auto cpu() {
  namespace hana = boost::hana;
  return fulgur::compatible_trainers(hana::tuple_t<fulgur::CPUAccelerator>, hana::tuple_t<fulgur::SingleDeviceStrategy>,
                                     hana::tuple_t<P...>);
}

template <class F>
std::string invalid_argument_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument)";
}

}  // namespace

int main(int, char** argv) {
  using namespace fulgur;
  using bench::register_matrix;
  {  // --threads is taken out of argv and applied
    std::string a0 = argv[0], a1 = "--threads=1", a2 = "--benchmark_min_time=0.01";
    char* args[] = {a0.data(), a1.data(), a2.data(), nullptr};
    int n = 3;
    check(bench::configure_threads(n, args) == 1 && n == 2 && std::string(args[1]) == a2,
          "--threads=1 sets one intra-op thread and leaves Google Benchmark's flags");
    std::string bad = "--threads=two";
    char* bad_args[] = {a0.data(), bad.data(), nullptr};
    n = 2;
    check(contains(invalid_argument_of([&] { bench::configure_threads(n, bad_args); }), "--threads=two"),
          "--threads=two is an error naming the flag");
  }
  const std::vector<double> before = fit_losses();

  // MatrixOptions are checked at registration.
  const auto make_net = [] { return Net(); };
  const auto make_batches = [] { return batches(); };
  check(contains(invalid_argument_of([&] { register_matrix("bad", make_net, make_batches, {.min_time_s = 0}); }),
                 "MatrixOptions::min_time_s = 0"),
        "min_time_s = 0: std::invalid_argument naming the field");
  check(contains(invalid_argument_of(
                     [&] { register_matrix("bad", make_net, make_batches, {.items_per_batch = 0, .min_time_s = 1}); }),
                 "MatrixOptions::items_per_batch = 0"),
        "items_per_batch = 0: std::invalid_argument naming the field");

  const bench::MatrixOptions quick{.min_time_s = 0.01};
  // The hand-written loop throws (fulgur's warm-up ran): autocast must not stay on.
  register_matrix("hand_throws", [made = std::make_shared<int>(0)] { return Net(++*made == 2); }, make_batches, quick,
                  cpu<BF16MixedPrecision>());
  // The model throws: fulgur runs first, its StepError is what the row says.
  register_matrix("model_throws", [] { return Net(true); }, make_batches, quick, cpu<BF16MixedPrecision>());
  // Inputs beyond float16's range under 16-mixed: the gradients overflow, the scaler skips every step.
  register_matrix("huge", make_net, [] { return batches(64, 6, 1e6); }, quick, cpu<FP16MixedPrecision>());
  // items_per_batch unset: the first batch's 48 samples.
  register_matrix("plain", make_net, [] { return batches(48); }, quick, cpu<FloatPrecision>());
  register_matrix("logging", [] { return LoggingNet(); }, make_batches, quick, cpu<FloatPrecision>());
  register_matrix("manual", [] { return ManualNet(); }, make_batches, quick,
                  cpu<FloatPrecision, FP16MixedPrecision>());
  register_matrix("regression", [] { return Regression(); }, [] {
    std::vector<fulgur::data::Batch> b;
    for (int i = 0; i < 4; ++i) b.push_back({torch::randn({16, 32}), torch::randn({16, 1})});
    return b;
  }, quick, cpu<DoublePrecision>());
  Capture capture;
  // The throwing row alone first: a later mixed-precision row would switch autocast off again and hide a leak.
  benchmark::RunSpecifiedBenchmarks(&capture, "^hand_throws/");
  const bool autocast_left_on = at::autocast::is_autocast_enabled(at::kCPU);
  const int nesting = at::autocast::increment_nesting();
  at::autocast::decrement_nesting();
  const std::vector<double> after = fit_losses();
  benchmark::RunSpecifiedBenchmarks(&capture, "-^hand_throws/");
  auto row = [&](const std::string& prefix) -> const Row& {
    for (const auto& [name, r] : capture.rows)
      if (name.rfind(prefix, 0) == 0) return r;
    static const Row none{true, "(row not run)", {}};
    return none;
  };

  check(!autocast_left_on, "CPU autocast is off after a row that threw under bf16-mixed");
  check(nesting == 1, "autocast nesting is back to 0 (increment gave " + std::to_string(nesting) + ")");
  check(!before.empty() && after == before, "a 32-true fit after that row gives the same losses as before it");
  check(!at::autocast::is_autocast_enabled(at::kCPU), "CPU autocast is off after all the rows");

  const Row& hand = row("hand_throws/cpu/single_device/bf16-mixed");
  check(hand.error && hand.message.rfind("failed: hand-written loop: model error on purpose", 0) == 0,
        "a throwing hand-written loop is named: " + hand.message);
  const Row& model = row("model_throws/cpu/single_device/bf16-mixed");
  check(model.error && model.message.rfind("failed: fulgur: training_step at epoch 0, batch 0", 0) == 0 &&
            contains(model.message, "'bf16-mixed'") && contains(model.message, "model error on purpose") &&
            contains(model.message, " | batch: ") && !contains(model.message, "\n"),
        "a throwing model is reported with fulgur's whole message on one line: " + model.message);
  const Row& huge = row("huge/cpu/single_device/16-mixed");
  check(huge.error && huge.message.rfind("skipped: ", 0) == 0 &&
            contains(huge.message, "skipped by the loss scaler") && contains(huge.message, "not reported"),
        "steps skipped by the loss scaler are not reported as a timing: " + huge.message);
  const Row& plain = row("plain/cpu/single_device/32-true");
  check(!plain.error && plain.counters.count("skipped_steps") && plain.counters.at("skipped_steps") == 0 &&
            plain.counters.count("threads") && plain.counters.at("threads") == 1,
        "a plain row has skipped_steps = 0 and threads = 1: " + plain.message);
  if (!plain.error) {
    const double expected = 48 * 1e6 / plain.counters.at("fulgur_us");
    check(std::abs(plain.counters.at("items_per_s") - expected) < 1e-6 * expected,
          "items_per_batch unset: items_per_s counts the first batch's 48 samples");
  }
  const Row& logging = row("logging/cpu/single_device/32-true");
  check(!logging.error, "training_step(batch, idx, StepContext&) and an OptimizerConfig run: " + logging.message);
  const Row& manual32 = row("manual/cpu/single_device/32-true");
  const Row& manual16 = row("manual/cpu/single_device/16-mixed");
  check(!manual32.error && !manual16.error,
        "manual optimization with two optimizers runs: " + manual32.message + manual16.message);

  const Row& regression = row("regression/cpu/single_device/64-true");
  check(!regression.error, "a float32 regression target under 64-true is converted as fit converts it: " +
                               regression.message);

  {  // run_matrix: a misspelt flag fails; so does a process in which a row failed
    std::string a0 = argv[0], filter = "--benchmark_filter=^$", typo = "--benchmark_min_tme=1";
    char* typo_args[] = {a0.data(), filter.data(), typo.data(), nullptr};
    check(bench::run_matrix(3, typo_args) == 1, "run_matrix: a misspelt flag is an error");
    char* args[] = {a0.data(), filter.data(), nullptr};
    check(bench::detail::failed_rows() == 2 && bench::run_matrix(2, args) == 1,
          "run_matrix: exit status 1 after the 2 failed rows");
  }
  std::printf(failures == 0 ? "matrix selftest: all checks passed\n" : "matrix selftest: %d check(s) failed\n",
              failures);
  return failures == 0 ? 0 : 1;
}
