// Profilers: SimpleProfiler's report and action names against Lightning's (made at test time by
// tests/profilers/lightning_profile.py), its files, and its refusals.
#include <catch2/catch.hpp>
#include <fulgur/fulgur.hpp>
#include <fulgur/profilers/report_file.hpp>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "unit/support.hpp"

using namespace fulgur;

namespace {

std::string python(const std::string& arguments) {
  return test::run_command(std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR + "/tests/profilers/lightning_profile.py " +
                     arguments);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Lightning's test fit (lightning_profile.py fit): Net with a validation step logging val_loss.
struct NetImpl : torch::nn::Module {
  NetImpl() : layer(register_module("layer", torch::nn::Linear(4, 1))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::mse_loss(layer(b.input), b.target);
  }
  void validation_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    ctx.log("val_loss", torch::mse_loss(layer(b.input), b.target));
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
  torch::nn::Linear layer;
};
TORCH_MODULE(Net);

data::TensorLoader loader() {
  return {torch::randn({32, 4}), torch::randn({32, 1}), {.batch_size = 8}};
}

std::map<std::string, std::int64_t> calls_of(const SimpleProfiler& profiler) {
  std::map<std::string, std::int64_t> calls;
  for (const auto& row : profiler.rows()) calls[row.action] = row.calls;
  return calls;
}

}  // namespace

TEST_CASE("SimpleProfiler's report is Lightning's table, character for character", "[profilers]") {
  const std::string dir = test::temporary_directory("profiler_report");
  // Per-call durations in ns, chosen to cover fixed and scientific notation, ties broken by order.
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> timings = {
      {"run_training_epoch", {1'234'567'000, 987'654'321}},
      {"[Strategy]SingleDeviceStrategy.backward", {31'000, 29'000, 30'500}},
      {"[LightningModule]Net.optimizer_step", {1'000'000'000}},
      {"[Callback]EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}.on_validation_end", {7'123}},
      {"save_checkpoint", {12'345'678'901}}};
  std::vector<SimpleProfiler::Row> rows;
  std::ofstream tsv(dir + "/durations.tsv");
  for (const auto& [action, durations] : timings) {
    SimpleProfiler::Row row{action, 0, {}};
    for (std::int64_t ns : durations) {
      row.total += std::chrono::nanoseconds(ns);
      ++row.calls;
      tsv << ns << '\t' << action << '\n';
    }
    rows.push_back(row);
  }
  tsv.close();
  const auto total = std::chrono::nanoseconds(21'500'000'000);
  for (const bool extended : {true, false}) {
    CAPTURE(extended);
    const std::string ours = SimpleProfiler::format_report(rows, total, "fit", extended);
    const std::string lightnings = python("report " + dir + "/durations.tsv 21.5 fit " + (extended ? "1" : "0"));
    CHECK(ours == lightnings);
    if (ours != lightnings) {  // for `diff` by hand
      std::ofstream(dir + "/fulgur.txt") << ours;
      std::ofstream(dir + "/lightning.txt") << lightnings;
    }
  }
}

TEST_CASE("SimpleProfiler times Lightning's actions with Lightning's names and call counts", "[profilers]") {
  torch::manual_seed(0);
  const std::string dir = test::temporary_directory("profiler_fit");
  test::CpuTrainer<FloatPrecision, SimpleProfiler, EarlyStopping> trainer(
      test::quiet({.max_epochs = 2, .default_root_dir = dir}),
      SimpleProfiler({.filename = "perf"}), EarlyStopping({.monitor = "val_loss", .patience = 100}));
  Net net;
  auto train = loader(), val = loader();
  trainer.fit(net, train, val);

  const auto ours = calls_of(trainer.callback<SimpleProfiler>());
  std::map<std::string, std::int64_t> lightnings;
  std::istringstream lines(python("fit"));
  for (std::string line; std::getline(lines, line);) {
    const auto tab = line.find('\t');
    if (tab != std::string::npos) lightnings[line.substr(tab + 1)] = std::stoll(line.substr(0, tab));
  }
  REQUIRE(lightnings.size() > 20);
  // Each action fulgur times is one Lightning times, as often (Lightning times also the hooks a module
  // or callback leaves undefined: fulgur does not call those).
  for (const auto& [action, calls] : ours) {
    CAPTURE(action);
    if (action.starts_with("[Callback]ProgressBar.")) continue;  // fulgur's bar is there, switched off
    REQUIRE(lightnings.contains(action));
    CHECK(calls == lightnings.at(action));
  }
  // ... and the ones that carry the time are there.
  for (const char* action :
       {"run_training_epoch", "run_training_batch", "[_TrainingEpochLoop].train_dataloader_next",
        "[_EvaluationLoop].val_next", "[Strategy]SingleDeviceStrategy.training_step",
        "[Strategy]SingleDeviceStrategy.validation_step", "[Strategy]SingleDeviceStrategy.backward",
        "[Strategy]SingleDeviceStrategy.batch_to_device", "[Strategy]SingleDeviceStrategy.on_train_end",
        "[LightningModule]Net.optimizer_step", "[LightningModule]Net.optimizer_zero_grad",
        "[LightningModule]Net.configure_optimizers", "[LightningModule]Net.on_validation_model_eval",
        "[LightningModule]Net.on_validation_model_zero_grad",
        "[Callback]EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}.on_validation_end"}) {
    CAPTURE(action);
    CHECK(ours.contains(action));
  }
  // The report went to <default_root_dir>/fit-perf.txt (no logger: Lightning's log_dir is the root).
  const std::string report = read_file(dir + "/fit-perf.txt");
  CHECK(report.starts_with("FIT Profiler Report\n"));
  CHECK(report.find("|  run_training_batch") != std::string::npos);
  CHECK(trainer.callback<SimpleProfiler>().report_path() == dir + "/fit-perf.txt");
}

TEST_CASE("SimpleProfiler: validate, test and predict report under their stage, a logger's log_dir is the default "
          "folder, DDP names the rank",
          "[profilers]") {
  const std::string dir = test::temporary_directory("profiler_stages");
  struct Scored : NetImpl {
    void test_step(const data::Batch& b, std::int64_t) { (void)layer(b.input); }
    at::Tensor predict_step(const data::Batch& b, std::int64_t) { return layer(b.input); }
  };
  test::CpuTrainer<FloatPrecision, SimpleProfiler, CSVLogger> trainer(
      test::quiet({.max_epochs = 1, .default_root_dir = dir}), SimpleProfiler({.filename = "perf"}), CSVLogger());
  Scored model;
  auto train = loader(), val = loader();
  trainer.fit(model, train, val);
  trainer.validate(model, val);
  trainer.test(model, val);
  (void)trainer.predict(model, val);
  const std::string logs = dir + "/lightning_logs/version_0";
  for (const char* stage : {"fit", "validate", "test", "predict"}) {
    CAPTURE(stage);
    const std::string report = read_file(logs + "/" + stage + "-perf.txt");
    REQUIRE(!report.empty());
    CHECK(report.find(std::string(stage) + " Profiler Report") == std::string::npos);  // upper case, as Lightning
  }
  const auto calls = calls_of(trainer.callback<SimpleProfiler>());
  CHECK(calls.at("[_EvaluationLoop].test_next") == 4);
  CHECK(calls.at("[_PredictionLoop].predict_next") == 4);
  CHECK(calls.at("[Strategy]SingleDeviceStrategy.test_step") == 4);
  CHECK(calls.at("[Strategy]SingleDeviceStrategy.predict_step") == 4);
  CHECK(calls.at("[LightningModule]Scored.on_predict_model_eval") == 1);

  ProfilerSetup ddp{.stage = Stage::fit, .global_rank = 1, .local_rank = 1, .world_size = 2};
  CHECK(profiling::report_file_name(ddp, "perf", ".txt") == "fit-perf-1.txt");
  CHECK(profiling::report_file_name(ddp, "a/b:c", ".txt") == "fit-a_b_c-1.txt");  // Lightning's cleaning
  ddp.world_size = 1;
  CHECK(profiling::report_file_name(ddp, "", ".txt") == "fit.txt");
}

TEST_CASE("SimpleProfiler: a folder it cannot write is an error before training", "[profilers]") {
  const std::string dir = test::temporary_directory("profiler_bad_dir");
  std::ofstream(dir + "/a_file") << "not a folder";
  struct Counting : NetImpl {
    int steps = 0;
    at::Tensor training_step(const data::Batch& b, std::int64_t i) {
      ++steps;
      return NetImpl::training_step(b, i);
    }
  };
  test::CpuTrainer<FloatPrecision, SimpleProfiler> trainer(
      test::quiet({.max_epochs = 1, .default_root_dir = dir}),
      SimpleProfiler({.dirpath = dir + "/a_file/reports", .filename = "perf"}));
  Counting model;
  auto train = loader();
  CHECK_THROWS_WITH(trainer.fit(model, train),
                    Catch::Contains("SimpleProfilerOptions::dirpath") && Catch::Contains(dir + "/a_file"));
  CHECK(model.steps == 0);
}

TEST_CASE("profilers: a folder they fell back to is named by where it came from, not by the unset dirpath (probe 8)", "[profilers]") {
  const std::string dir = test::temporary_directory("profiler_bad_fallback");
  std::ofstream(dir + "/a_file") << "not a folder";
  ProfilerSetup setup;
  setup.log_dir = dir + "/a_file/logs";  // the logger's log_dir or default_root_dir, as the Trainer gives it
  SimpleProfiler simple({.filename = "perf"});
  CHECK_THROWS_WITH(simple.set_up(setup),
                    Catch::Contains("the profiler's folder (SimpleProfilerOptions::dirpath unset: the first logger's "
                                    "log_dir, else TrainerConfig::default_root_dir) '" + dir + "/a_file/logs'") &&
                        Catch::Contains(dir + "/a_file"));
  TorchProfiler torch_profiler;
  CHECK_THROWS_WITH(torch_profiler.set_up(setup), Catch::Contains("TorchProfilerOptions::dirpath unset: "));
}

TEST_CASE("SimpleProfiler: an action that throws is still timed, nested starts time the outermost", "[profilers]") {
  SimpleProfiler profiler;
  const Action action("a test action");
  CHECK_THROWS([&] {
    profiling::Scope timed(profiler, action);
    throw std::runtime_error("boom");
  }());
  profiler.start(action);
  profiler.start(action);
  profiler.stop(action);
  profiler.stop(action);
  profiler.stop(action);  // one stop too many: ignored
  std::int64_t calls = 0;
  for (const auto& row : profiler.rows())
    if (row.action == "a test action") calls = row.calls;
  CHECK(calls == 2);
  // A profiler used for many runs keeps one slot per action (it once doubled its slots at each set-up).
  for (int run = 0; run < 64; ++run) profiler.set_up({});
  CHECK(profiler.slot_count() == std::max<std::size_t>(profiling::action_count(), action.id() + 1));
  CHECK(profiling::class_name(typeid(NetImpl)) == "Net");
  CHECK(profiling::strategy_name<ShardedStrategy<3>>() == "ShardedStrategy<3>");
  CHECK(profiling::strategy_name<DDPStrategy>() == "DDPStrategy");
}

TEST_CASE("TorchProfiler records the steps its schedule selects into a Chrome trace, with fulgur's ranges and the "
          "operator table",
          "[profilers]") {
  torch::manual_seed(0);
  const std::string dir = test::temporary_directory("torch_profiler");
  test::CpuTrainer<FloatPrecision, TorchProfiler> trainer(
      test::quiet({.max_epochs = 2, .default_root_dir = dir}),
      TorchProfiler({.filename = "trace",
                     .schedule = {.wait = 1, .warmup = 1, .active = 2, .repeat = 1},
                     .record_shapes = true,
                     .with_flops = true}));
  Net net;
  auto train = loader(), val = loader();
  trainer.fit(net, train, val);  // 8 training batches: steps 2 and 3 recorded

  const TorchProfiler& profiler = trainer.callback<TorchProfiler>();
  REQUIRE(profiler.trace_files().size() == 1);
  CHECK(profiler.trace_files()[0] == dir + "/fit-trace.0.pt.trace.json");
  const std::string command = std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR +
                              "/tests/profilers/check_trace.py " + profiler.trace_files()[0] +
                              " run_training_batch=2 [Strategy]SingleDeviceStrategy.training_step=2"
                              " [Strategy]SingleDeviceStrategy.backward=2 [LightningModule]Net.optimizer_step=2";
  CHECK(std::system(command.c_str()) == 0);

  std::map<std::string, TorchProfiler::OperatorRow> ops;
  for (const auto& row : profiler.operators()) ops[row.name] = row;
  REQUIRE(ops.contains("aten::addmm"));
  CHECK(ops.at("aten::addmm").calls == 2);  // one Linear forward per recorded step
  CHECK(ops.at("aten::addmm").flops == 2 * 2 * 8 * 4 * 1);  // 2·M·N·K per call, two calls
  CHECK(ops.at("run_training_batch").calls == 2);
  CHECK(ops.at("run_training_batch").self_cpu_ns < ops.at("run_training_batch").cpu_total_ns);
  const std::string table = read_file(dir + "/fit-trace.txt");
  CHECK(table.find("aten::addmm") != std::string::npos);
  CHECK(table.find("Self CPU time total:") != std::string::npos);
  CHECK(table.find(" \n") == std::string::npos);  // no trailing blanks

  Net again;  // a second fit's trace does not overwrite the first's (probe finding)
  trainer.fit(again, train, val);
  REQUIRE(profiler.trace_files().size() == 2);
  CHECK(profiler.trace_files()[1] == dir + "/fit-trace.1.pt.trace.json");
}

TEST_CASE("TorchProfiler: a schedule that records nothing is refused, a stage too short for it says so",
          "[profilers]") {
  CHECK_THROWS_WITH(TorchProfiler({.schedule = {.active = 0}}), Catch::Contains("records no step (active = 0)"));
  CHECK_THROWS_WITH(TorchProfiler({.schedule = {.wait = -1}}), Catch::Contains("negative"));
  CHECK_THROWS_WITH(TorchProfiler({.sort_by_key = "self_time"}), Catch::Contains("'self_time' is none of"));

  const std::string dir = test::temporary_directory("torch_profiler_short");
  test::CpuTrainer<FloatPrecision, TorchProfiler> trainer(
      test::quiet({.default_root_dir = dir}),
      TorchProfiler({.filename = "late", .schedule = {.skip_first = 10, .active = 1}}));
  Net net;
  auto val = loader();
  trainer.validate(net, val);
  CHECK(trainer.callback<TorchProfiler>().trace_files().empty());
  CHECK(read_file(dir + "/validate-late.txt")
            .find("recorded no step in validate: it ran 4 step(s), and the schedule records from step 13 on") !=
        std::string::npos);

  // The stage ends just as the recording opens (after 2 waited + 2 warm-up steps): what it would record
  // is the stage's own ending, not a step, so no trace, and the same notice (probe finding: a trace
  // numbered as a cycle, holding on_validation_end and teardown only).
  test::CpuTrainer<FloatPrecision, TorchProfiler> edge(
      test::quiet({.default_root_dir = dir}),
      TorchProfiler({.filename = "edge", .schedule = {.wait = 2, .warmup = 2, .active = 3}}));
  edge.validate(net, val);
  CHECK(edge.callback<TorchProfiler>().trace_files().empty());
  CHECK(read_file(dir + "/validate-edge.txt")
            .find("recorded no step in validate: it ran 4 step(s), and the schedule records from step 5 on") !=
        std::string::npos);
}
