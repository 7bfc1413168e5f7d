// SpikeDetection against Lightning Fabric's on the same loss sequences, and TrainerConfig::detect_anomaly
// against Lightning's detect_anomaly on the same tiny modules: spike_reference.py computes both at
// test time, in one Python run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

#include "fulgur/callbacks/model_checkpoint.hpp"
#include "fulgur/callbacks/spike_detection.hpp"
#include "fulgur/checkpoint/io.hpp"
#include "unit/support.hpp"

using namespace fulgur;

namespace {

/// The reference script's output: ctest's spike.reference fixture writes it once for every test case
/// (each its own process); a run outside ctest, or after the script changed, makes its own.
const std::string& reference_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const std::string script = std::string(FULGUR_SOURCE_DIR) + "/tests/unit/spike_reference.py";
    const std::string fixture = std::string(FULGUR_GOLDEN_DIR) + "/spike";
    std::error_code error;
    const auto written = fs::last_write_time(fixture + "/anomaly.txt", error);
    if (!error && written >= fs::last_write_time(script)) return fixture;
    std::string folder = test::scratch_folder("spike_reference");
    const std::string line =
        std::string(FULGUR_TEST_PYTHON) + " " + script + " " + folder + " > " + folder + "/python.log 2>&1";
    if (std::system(line.c_str()) != 0) throw std::runtime_error("the Python reference failed: " + line);
    return folder;
  }();
  return dir;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "<no file>";
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::optional<double> optional_number(const std::string& text) {
  if (text == "none") return std::nullopt;
  return std::strtod(text.c_str(), nullptr);  // float.hex(), "nan", "inf", "-inf"
}

struct SpikeCase {
  std::string name;
  SpikeDetectionOptions options;
  at::ScalarType dtype = at::kFloat;
  bool continue_after = true;
  bool json_file = false;
  std::vector<double> losses;
  std::vector<std::int64_t> batch_idx;
  std::vector<int> other_spike, other_finite;  // empty: one rank
  std::vector<std::size_t> spikes;             // where Fabric raised
};

std::vector<SpikeCase> spike_cases() {
  std::ifstream in(reference_dir() + "/spike_cases.txt");
  std::vector<SpikeCase> cases;
  for (std::string line; std::getline(in, line);) {
    const auto w = words(line);
    if (w.empty()) continue;
    if (w[0] == "case") {
      SpikeCase c;
      c.name = w[1];
      c.options.mode = w[2] == "max" ? MonitorMode::max : MonitorMode::min;
      c.options.window = std::stoll(w[3]);
      c.options.warmup = std::stoll(w[4]);
      c.options.atol = optional_number(w[5]);
      c.options.rtol = optional_number(w[6]);
      c.options.finite_only = w[7] == "1";
      c.dtype = w[8] == "float64" ? at::kDouble : w[8] == "bfloat16" ? at::kBFloat16 : at::kFloat;
      c.continue_after = w[9] == "1";
      c.json_file = w[10] == "file";
      cases.push_back(c);
      continue;
    }
    SpikeCase& c = cases.back();
    for (std::size_t i = 1; i < w.size(); ++i) {
      if (w[0] == "losses") c.losses.push_back(std::strtod(w[i].c_str(), nullptr));
      if (w[0] == "batch_idx") c.batch_idx.push_back(std::stoll(w[i]));
      if (w[0] == "other_spike" && w[i] != "none") c.other_spike.push_back(std::stoi(w[i]));
      if (w[0] == "other_finite" && w[i] != "none") c.other_finite.push_back(std::stoi(w[i]));
      if (w[0] == "spikes") c.spikes.push_back(std::stoul(w[i]));
    }
  }
  return cases;
}

/// Feeds the case to fulgur's SpikeDetection as the reference fed Fabric's; the positions where it raised.
std::vector<std::size_t> run_spike_case(const SpikeCase& c, const std::string& folder) {
  SpikeDetectionOptions options = c.options;
  options.exclude_batches_path = c.json_file ? folder + "/bad.json" : folder;
  SpikeDetection detector(options);
  std::vector<std::size_t> spikes;
  for (std::size_t i = 0; i < c.losses.size(); ++i) {
    SpikeDetection::ReduceDecision reduce;
    if (!c.other_spike.empty())
      reduce = [&c, i](bool decision, bool all) {
        return all ? decision && c.other_finite[i] != 0 : decision || c.other_spike[i] != 0;
      };
    try {
      detector.check(at::scalar_tensor(c.losses[i], at::TensorOptions().dtype(c.dtype)), c.batch_idx[i],
                     static_cast<std::int64_t>(i), 0, reduce);
    } catch (const TrainingSpikeError& e) {
      CHECK(e.batch_idx() == c.batch_idx[i]);
      CHECK(e.global_step() == static_cast<std::int64_t>(i));
      CHECK_THAT(e.what(), Catch::Contains("training spike detected in batch " + std::to_string(c.batch_idx[i])));
      spikes.push_back(i);
      if (!c.continue_after) break;
    }
  }
  return spikes;
}

}  // namespace

TEST_CASE("SpikeDetection raises where Lightning Fabric's does and writes the same skip_batches.json", "[spike]") {
  const auto cases = spike_cases();
  REQUIRE(cases.size() >= 15);
  std::size_t with_spikes = 0;
  for (const SpikeCase& c : cases) {
    INFO("case " << c.name);
    const std::string folder = test::scratch_folder("spike_" + c.name);
    CHECK(run_spike_case(c, folder) == c.spikes);
    const std::string file = c.json_file ? "/bad.json" : "/skip_batches.json";
    CHECK(read_file(folder + file) == read_file(reference_dir() + "/" + c.name + file));
    with_spikes += c.spikes.empty() ? 0 : 1;
  }
  CHECK(with_spikes == cases.size());  // every case raises somewhere: none passes by finding nothing
}

TEST_CASE("SpikeDetection names the batch, the step, the loss and its running mean", "[spike]") {
  const std::string folder = test::scratch_folder("spike_message");
  SpikeDetection detector({.window = 3, .exclude_batches_path = folder + "/sub"});
  for (std::int64_t i = 0; i < 4; ++i) detector.check(at::scalar_tensor(1.0), i, 10 + i);
  CHECK(detector.running_mean() == 1.0);
  const std::string message =
      test::message_of<TrainingSpikeError>([&] { detector.check(at::scalar_tensor(4.0), 4, 14); });
  CHECK_THAT(message, Catch::Contains("training spike detected in batch 4 (global_step 14): the loss 4 is above its "
                                      "running mean 1 over the last 3 batches by 3 (atol none, rtol 2)"));
  CHECK_THAT(message, Catch::Contains("Batches 3 and 4 are recorded in '" + folder + "/sub/skip_batches.json'"));
  CHECK(read_file(folder + "/sub/skip_batches.json") == "[\n    3,\n    4\n]");
  CHECK((detector.bad_batches() == std::vector<std::int64_t>{3, 4}));

  const std::string nan_message = test::message_of<TrainingSpikeError>(
      [&] { detector.check(at::scalar_tensor(std::numeric_limits<double>::quiet_NaN()), 5, 15); });
  CHECK_THAT(nan_message, Catch::Contains("the loss is nan (finite_only: a non-finite loss is a spike)"));

  // Another rank's spike stops this one too; only global rank 0 writes the file.
  SpikeDetection rank1({.exclude_batches_path = folder + "/rank1"});
  const std::string other = test::message_of<TrainingSpikeError>([&] {
    rank1.check(at::scalar_tensor(1.0), 3, 3, 1, [](bool decision, bool all) { return all ? decision : true; });
  });
  CHECK_THAT(other, Catch::Contains("another rank's loss spiked (this rank's loss is 1, its running mean nan)"));
  CHECK(!std::filesystem::exists(folder + "/rank1"));
}

TEST_CASE("SpikeDetection refuses bad options and losses", "[spike]") {
  CHECK_THROWS_WITH(SpikeDetection({.window = 0}), Catch::Contains("window must be a positive number"));
  CHECK_THROWS_WITH(SpikeDetection({.warmup = -1}), Catch::Contains("warmup must be >= 0"));
  CHECK_THROWS_WITH(SpikeDetection({.rtol = std::numeric_limits<double>::quiet_NaN()}),
                    Catch::Contains("atol and rtol must be numbers"));
  SpikeDetection detector;
  CHECK_THROWS_WITH(detector.check(at::ones({2}), 0), Catch::Contains("a tensor of 2 elements"));
  CHECK_THROWS_WITH(detector.check(at::ones({}, at::kLong), 0), Catch::Contains("dtype Long"));
  CHECK_THROWS_WITH(detector.check(at::Tensor(), 0), Catch::Contains("an undefined tensor"));
}

namespace {

/// A regression whose data hold one poisoned batch: targets far off at batch `bad` of epoch 1.
struct SpikyImpl : torch::nn::Module {
  SpikyImpl() : fc(register_module("fc", torch::nn::Linear(4, 1))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::mse_loss(fc(b.input).squeeze(1), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.05);
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Spiky);

std::pair<at::Tensor, at::Tensor> spiky_tensors(std::int64_t bad_batch) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor x = at::randn({64, 4}, gen);
  at::Tensor y = x.sum(1);
  if (bad_batch >= 0) y.narrow(0, bad_batch * 8, 8).fill_(100.0);
  return {x, y};
}

data::TensorLoader spiky_data(std::int64_t bad_batch) {
  auto [x, y] = spiky_tensors(bad_batch);
  return data::TensorLoader(x, y, {.batch_size = 8});
}

/// docs/spike_detection.md's sampler: the epoch's samples without those of the recorded batches.
struct SkipRecordedBatches {
  std::int64_t dataset_size = 0, batch_size = 0;
  std::vector<std::int64_t> bad;  // SpikeDetection::read_bad_batches(...)
  std::vector<std::int64_t> indices(std::int64_t /*epoch*/) const {
    std::vector<std::int64_t> order;
    for (std::int64_t i = 0; i < dataset_size; ++i)
      if (std::find(bad.begin(), bad.end(), i / batch_size) == bad.end()) order.push_back(i);
    return order;
  }
};

}  // namespace

TEST_CASE("SpikeDetection's roll-back workflow: resume from a checkpoint before the spike, the batches skipped",
          "[spike]") {
  const std::string folder = test::scratch_folder("spike_rollback");
  using Run = test::CpuTrainer<FloatPrecision, ModelCheckpoint, SpikeDetection>;
  const auto callbacks = [&] {
    return std::make_tuple(
        ModelCheckpoint(
            {.dirpath = folder + "/ckpt", .filename = "{step}", .save_top_k = -1, .every_n_train_steps = 2}),
        SpikeDetection({.exclude_batches_path = folder}));
  };
  std::int64_t spike_step = -1;
  {
    Spiky model;
    auto [checkpoint, spike] = callbacks();
    try {
      Run(test::quiet({.max_epochs = 3}), checkpoint, spike).fit(model, spiky_data(5));
    } catch (const TrainingSpikeError& e) {
      spike_step = e.global_step();
    }
  }
  REQUIRE(spike_step == 6);
  const std::int64_t safe_step = (spike_step - 2) / 2 * 2;  // before batch_idx - 1's step
  const auto bad = SpikeDetection::read_bad_batches(folder + "/skip_batches.json");
  CHECK((bad == std::vector<std::int64_t>{4, 5}));
  auto [x, y] = spiky_tensors(5);
  Spiky model;
  auto [checkpoint, spike] = callbacks();
  Run trainer(test::quiet({.max_epochs = 3}), checkpoint, spike);
  data::DataLoader skipping(data::TensorDataset(x, y), {.batch_size = 8}, SkipRecordedBatches{64, 8, bad});
  const FitResult r =
      trainer.fit(model, skipping, {.ckpt_path = folder + "/ckpt/step=" + std::to_string(safe_step) + ".ckpt"});
  CHECK(r.global_step == 18);  // 6 batches an epoch now, 3 epochs
}

TEST_CASE("SpikeDetection's window is in checkpoints: a resumed run judges each loss as the straight run did",
          "[spike]") {
  const std::string folder = test::scratch_folder("spike_resume");
  using Run = test::CpuTrainer<FloatPrecision, ModelCheckpoint, SpikeDetection>;
  const auto make = [&](const std::string& dir) {
    return Run(test::quiet({.max_epochs = 3}),
               ModelCheckpoint({.dirpath = dir, .filename = "{step}", .save_top_k = -1, .every_n_train_steps = 5}),
               SpikeDetection({.window = 4, .exclude_batches_path = folder}));
  };
  Spiky straight_model;
  Run straight = make(folder + "/straight");
  straight.fit(straight_model, spiky_data(-1));
  const StateDict expected = straight.callback<SpikeDetection>().state_dict();
  CHECK(expected.at("seen").toInt() == 24);

  // Resumed mid-epoch (step 10 = epoch 1, after batch 1): the window comes back with the position.
  const std::string mid = folder + "/straight/step=10.ckpt";
  const auto states = checkpoint::load(mid).at("callbacks").toGenericDict();
  REQUIRE(states.contains("SpikeDetection{'mode': 'min', 'window': 4}"));
  Spiky resumed_model;
  Run resumed = make(folder + "/resumed");
  resumed.fit(resumed_model, spiky_data(-1), {.ckpt_path = mid});
  const SpikeDetection& detector = resumed.callback<SpikeDetection>();
  const StateDict got = detector.state_dict();
  CHECK(got.at("seen").toInt() == 24);
  CHECK(got.at("sums").toTensor().equal(expected.at("sums").toTensor()));
  CHECK(got.at("weights").toTensor().equal(expected.at("weights").toTensor()));
  CHECK(got.at("last_value").toDouble() == expected.at("last_value").toDouble());
  CHECK(detector.running_mean() == straight.callback<SpikeDetection>().running_mean());

  // A state that is not this detector's is refused by name; another window starts afresh (its own key).
  SpikeDetection other({.window = 3});
  CHECK_THROWS_WITH(other.load_state_dict(expected), Catch::Contains("'sums' is not 3 float32 slots"));
  StateDict missing = expected;
  missing.erase("seen");
  CHECK_THROWS_WITH(SpikeDetection({.window = 4}).load_state_dict(missing), Catch::Contains("has no 'seen'"));
  CHECK(other.state_key() == "SpikeDetection{'mode': 'min', 'window': 3}");
}

TEST_CASE("SpikeDetection in fit: a poisoned batch stops the run with TrainingSpikeError", "[spike]") {
  const std::string folder = test::scratch_folder("spike_fit");
  Spiky model;
  test::CpuTrainer<FloatPrecision, SpikeDetection> trainer(test::quiet({.max_epochs = 3}),
                                                           SpikeDetection({.exclude_batches_path = folder}));
  try {
    trainer.fit(model, spiky_data(5));
    FAIL("fit ended without a TrainingSpikeError");
  } catch (const TrainingSpikeError& e) {
    CHECK(e.batch_idx() == 5);
    CHECK(e.global_step() == 6);  // after batch 5's optimizer step
    CHECK_THAT(e.what(), Catch::Contains("training spike detected in batch 5 (global_step 6)"));
  }
  CHECK(read_file(folder + "/skip_batches.json") == "[\n    4,\n    5\n]");
  // The clean data run to the end.
  Spiky clean;
  test::CpuTrainer<FloatPrecision, SpikeDetection> again(test::quiet({.max_epochs = 3}),
                                                         SpikeDetection({.exclude_batches_path = folder + "/clean"}));
  CHECK(again.fit(clean, spiky_data(-1)).global_step == 24);
  CHECK(!std::filesystem::exists(folder + "/clean"));
}

// ---- detect_anomaly ----------------------------------------------------------------------------------

namespace {

/// A Linear, and `gate` (and `gate2`) at 0 under a sqrt whose gradient there is not finite while the loss is:
///   inf:   + sqrt(gate): d/dgate = 1 / 0 = inf, no NaN inside the backward (anomaly mode lets it through)
///   inf2:  + sqrt(gate) - sqrt(gate2): +inf and -inf
///   where: + where(gate > 1, sqrt(gate), 0): sqrt's backward gets a zero gradient, 0 / 0 = NaN
///   accumulate: + sqrt(gate) on even batches, - sqrt(gate) on odd ones: each micro-batch's gradient
///          is infinite and their sum, made in .grad where anomaly mode does not look, is NaN
struct GateImpl : torch::nn::Module {
  explicit GateImpl(std::string kind_)
      : fc(register_module("fc", torch::nn::Linear(4, 1))),
        gate(register_parameter("gate", torch::zeros({1}))),
        gate2(register_parameter("gate2", torch::zeros({1}))),
        kind(std::move(kind_)) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t batch_idx) {
    at::Tensor loss = torch::nn::functional::mse_loss(fc(b.input).squeeze(1), b.target);
    if (kind == "inf") return loss + gate.sqrt().sum();
    if (kind == "inf2") return loss + gate.sqrt().sum() - gate2.sqrt().sum();
    if (kind == "accumulate") return loss + (batch_idx % 2 == 0 ? 1.0 : -1.0) * gate.sqrt().sum();
    return loss + at::where(gate > 1, gate.sqrt(), at::zeros_like(gate)).sum();
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc;
  at::Tensor gate, gate2;
  std::string kind;
};
TORCH_MODULE(Gate);

data::TensorLoader gate_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  return data::TensorLoader(at::randn({16, 4}, gen), at::randn({16}, gen), {.batch_size = 4});
}

struct LightningAnomaly {
  std::int64_t raised_step = -1;  // -1: fit ended without an error
  bool gate_finite = true;
  std::string message;
};

/// Lightning's Trainer(detect_anomaly=...) on the same modules (max_steps=3, 32-true), per case.
std::map<std::string, LightningAnomaly> lightning_anomaly() {
  std::map<std::string, LightningAnomaly> out;
  std::ifstream in(reference_dir() + "/anomaly.txt");
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string name;
    int finite = 0;
    LightningAnomaly a;
    fields >> name >> a.raised_step >> finite;
    a.gate_finite = finite != 0;
    std::getline(fields >> std::ws, a.message);
    out[name] = a;
  }
  return out;
}

TrainerConfig anomaly_config(bool detect) { return test::quiet({.max_steps = 3, .detect_anomaly = detect}); }

}  // namespace

TEST_CASE("detect_anomaly: a finite loss with an infinite gradient is an error naming the parameters and the step",
          "[spike][detect_anomaly]") {
  const auto lightning = lightning_anomaly();
  REQUIRE(lightning.size() == 3);
  {
    Gate model("inf2");
    const std::string message = test::message_of<NonFiniteGradientError>(
        [&] { test::CpuTrainer<FloatPrecision>(anomaly_config(true)).fit(model, gate_data()); });
    CHECK_THAT(message, Catch::StartsWith("fulgur: detect_anomaly: the gradient of 2 parameters is NaN or infinite "
                                          "('gate', 'gate2') after the backward of training_step at epoch 0, batch 0 "
                                          "(global_step 0) under precision '32-true'"));
    // Stopped before the optimizer step: the weights are still finite.
    CHECK(torch::isfinite(model->gate).all().item<bool>());
  }
  {
    // Lightning's detect_anomaly lets the inf through (no NaN inside the backward): its step turns the
    // gate to -inf and it stops one step later, when sqrt(-inf) makes a NaN. fulgur stops first.
    const LightningAnomaly& reference = lightning.at("inf_anomaly");
    CHECK(reference.raised_step == 1);
    CHECK(!reference.gate_finite);
    Gate model("inf");
    try {
      test::CpuTrainer<FloatPrecision>(anomaly_config(true)).fit(model, gate_data());
      FAIL("no NonFiniteGradientError");
    } catch (const NonFiniteGradientError& e) {
      CHECK_THAT(e.what(), Catch::Contains("the gradient of 1 parameter is NaN or infinite ('gate')"));
      CHECK_THAT(e.what(), Catch::Contains("(global_step 0)"));
    }
    CHECK(torch::isfinite(model->gate).all().item<bool>());
  }
  {
    // Two micro-batches' gradients, +inf and -inf, sum to NaN in .grad: caught at the step.
    Gate model("accumulate");
    TrainerConfig config = anomaly_config(true);
    config.accumulate_grad_batches = 2;
    const std::string message = test::message_of<NonFiniteGradientError>(
        [&] { test::CpuTrainer<FloatPrecision>(config).fit(model, gate_data()); });
    CHECK_THAT(message, Catch::Contains("('gate') after the backward of training_step at epoch 0, batch 1"));
    CHECK(std::isnan(model->gate.grad().item<double>()));
  }
}

TEST_CASE("detect_anomaly: without it the run goes on and the weights turn NaN, as Lightning's",
          "[spike][detect_anomaly]") {
  const LightningAnomaly reference = lightning_anomaly().at("nan_plain");
  CHECK(reference.raised_step == -1);
  CHECK(!reference.gate_finite);
  Gate model("where");
  const FitResult r = test::CpuTrainer<FloatPrecision>(anomaly_config(false)).fit(model, gate_data());
  CHECK(r.global_step == 3);
  CHECK(torch::isnan(model->gate).all().item<bool>());
  CHECK(torch::isfinite(model->fc->weight).all().item<bool>());
}

TEST_CASE("detect_anomaly: anomaly mode names the backward that made the NaN, with Lightning's message and step",
          "[spike][detect_anomaly]") {
  const LightningAnomaly reference = lightning_anomaly().at("nan_anomaly");
  REQUIRE(reference.raised_step == 0);
  CHECK(reference.message == "Function 'SqrtBackward0' returned nan values in its 0th output.");
  Gate model("where");
  const std::string message = test::message_of<StepError>(
      [&] { test::CpuTrainer<FloatPrecision>(anomaly_config(true)).fit(model, gate_data()); });
  CHECK_THAT(message, Catch::StartsWith("fulgur: training_step at epoch 0, batch 0 (global_step " +
                                        std::to_string(reference.raised_step) + ") failed under precision '32-true': " +
                                        reference.message));
  CHECK_THAT(message, Catch::Contains("autograd's anomaly mode"));
  CHECK(torch::isfinite(model->gate).all().item<bool>());
}

TEST_CASE("detect_anomaly under 16-mixed: the loss scaler skips the steps, no error", "[spike][detect_anomaly]") {
  Gate model("inf");
  TrainerConfig config = anomaly_config(true);
  config.max_consecutive_skipped_steps = 0;
  // Small data: the only non-finite gradient is the gate's +inf. With gate_data's targets the loss's own
  // gradient, times the scaler's 65536, could pass float16's 65504 for some initial weights, and inf minus inf
  // in AddmmBackward is a NaN that anomaly mode rightly stops at (1 run in ~40 did).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  data::TensorLoader small(at::randn({16, 4}, gen) * 0.1, at::randn({16}, gen) * 0.01, {.batch_size = 4});
  const FitResult r = test::CpuTrainer<FP16MixedPrecision>(config).fit(model, small);
  CHECK(r.global_step == 3);
  CHECK(r.skipped_optimizer_steps == 3);
  CHECK(torch::isfinite(model->gate).all().item<bool>());
}

TEST_CASE("SpikeDetection::read_bad_batches reads what SpikeDetection and Fabric write, and refuses the rest",
          "[spike]") {
  const std::string folder = test::scratch_folder("spike_read");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(folder + "/" + name) << text;
    return folder + "/" + name;
  };
  // Fabric's file for two spikes (json.dump with indent=4), as the reference wrote it.
  CHECK((SpikeDetection::read_bad_batches(reference_dir() + "/walk_min/skip_batches.json") ==
         std::vector<std::int64_t>{29, 30, 30, 31}));
  CHECK((SpikeDetection::read_bad_batches(write("compact.json", "[-1,0, 7 ]\n")) ==
         std::vector<std::int64_t>{-1, 0, 7}));
  CHECK(SpikeDetection::read_bad_batches(write("empty.json", "[]")).empty());
  for (const char* bad : {"", "{}", "[1,]", "[1 2]", "[1", "[1] x", "[a]", "[,1]"})
    CHECK_THROWS_WITH(SpikeDetection::read_bad_batches(write("bad.json", bad)),
                      Catch::Contains("is not a JSON list of batch indices"));
  CHECK_THROWS_WITH(SpikeDetection::read_bad_batches(folder + "/missing.json"), Catch::Contains("cannot read"));
}

TEST_CASE("SpikeDetection, probed as a new user would: a NaN batch, a folder it cannot write to", "[spike]") {
  const std::string folder = test::scratch_folder("spike_probe");
  {
    // A NaN target in batch 3: SpikeDetection (finite_only) stops before fulgur's NaN-loss check, with the
    // batches recorded.
    auto [x, y] = spiky_tensors(-1);
    y[27] = std::numeric_limits<float>::quiet_NaN();
    Spiky model;
    test::CpuTrainer<FloatPrecision, SpikeDetection> trainer(test::quiet({.max_epochs = 1}),
                                                             SpikeDetection({.exclude_batches_path = folder}));
    const std::string message = test::message_of<TrainingSpikeError>(
        [&] { trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 8})); });
    CHECK_THAT(message, Catch::Contains("batch 3 (global_step 4): the loss is nan"));
    CHECK(read_file(folder + "/skip_batches.json") == "[\n    2,\n    3\n]");
  }
  {
    // A folder it cannot create: the spike is still the error, and its message holds the indices.
    std::ofstream(folder + "/a_file") << "x";
    SpikeDetection detector({.exclude_batches_path = folder + "/a_file/sub"});
    detector.check(at::scalar_tensor(1.0), 0);
    detector.check(at::scalar_tensor(1.0), 1);
    const std::string message =
        test::message_of<TrainingSpikeError>([&] { detector.check(at::scalar_tensor(9.0), 2); });
    CHECK_THAT(message, Catch::Contains("Batches 1 and 2 could not be recorded in '" + folder +
                                        "/a_file/sub/skip_batches.json' (set exclude_batches_path to a folder you "
                                        "can write to); all so far: [\n    1,\n    2\n]"));
  }
}
