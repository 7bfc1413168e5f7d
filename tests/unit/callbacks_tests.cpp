// The shipped callbacks and loggers, callbacks of the user's own (LambdaCallback, AnyCallback, a
// plain struct), faults inside hooks, and Ctrl-C. Lightning parity of the hook order, the CSV
// rows and the model summary is in lightning_parity_tests.cpp.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "../../examples/extending/grad_norm_monitor.hpp"
#include "unit/support.hpp"

using namespace fulgur;

namespace {

/// A small module that logs "score" in validation_step: scores[epoch] (NaN and beyond the list: the last).
struct ScriptedImpl : torch::nn::Module {
  explicit ScriptedImpl(std::vector<double> s = {1.0}) : fc(register_module("fc", torch::nn::Linear(4, 2))), scores(std::move(s)) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    if (raise_at && *raise_at == ctx.global_step) std::raise(SIGINT);
    auto loss = torch::nn::functional::cross_entropy(fc(b.input), b.target);
    ctx.log("train_loss", loss, {.on_epoch = true});
    return loss;
  }
  at::Tensor validation_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    const auto epoch = static_cast<std::size_t>(ctx.current_epoch);
    ctx.log("score", scores.at(std::min(epoch, scores.size() - 1)));
    return torch::nn::functional::cross_entropy(fc(b.input), b.target);
  }
  at::Tensor test_step(const data::Batch& b, std::int64_t) { return torch::nn::functional::cross_entropy(fc(b.input), b.target); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  Hyperparameters hparams() const { return {{"lr", 0.1}, {"hidden", std::int64_t{2}}, {"optimizer", std::string("sgd")}}; }
  void on_exception(const std::exception& e) { exceptions.push_back(e.what()); }
  void teardown(Stage) { ++teardowns; }

  torch::nn::Linear fc;
  std::vector<double> scores;
  std::optional<std::int64_t> raise_at{};
  std::vector<std::string> exceptions;
  int teardowns = 0;
};
TORCH_MODULE(Scripted);

data::TensorLoader loader(std::int64_t samples) {
  return data::TensorLoader(torch::randn({samples, 4}), torch::randint(2, {samples}, at::kLong), {.batch_size = 4});
}

template <class... Callbacks>
using CbTrainer = test::CpuTrainer<FloatPrecision, Callbacks...>;

}  // namespace

// ---- EarlyStopping --------------------------------------------------------------------------------

TEST_CASE("EarlyStopping stops after `patience` checks without improvement and says why", "[callbacks][early_stopping]") {
  Scripted model(std::vector<double>{5, 4, 4.5, 4.2, 4.1, 1});
  CbTrainer<EarlyStopping> trainer(test::quiet({.max_epochs = 10}), EarlyStopping({.monitor = "score", .patience = 3}));
  const auto result = trainer.fit(model, loader(8), loader(8));
  // best 4 at epoch 1; epochs 2, 3, 4 do not improve on it
  CHECK(result.epochs.size() == 5);
  const EarlyStopping& stopper = trainer.callback<EarlyStopping>();
  CHECK(stopper.stopped_epoch() == 4);
  CHECK(stopper.best_score() == 4.0);
  CHECK(stopper.stopping_reason() == EarlyStoppingReason::patience_exhausted);
  CHECK(result.stop_reason ==
        "EarlyStopping: Monitored metric score did not improve in the last 3 records. Best score: 4.000. Signaling "
        "Trainer to stop.");
}

TEST_CASE("EarlyStopping: min_delta, mode max, thresholds and a non-finite monitor", "[callbacks][early_stopping]") {
  SECTION("an improvement smaller than min_delta does not count") {
    Scripted model(std::vector<double>{5, 4.95, 4.9, 4.85});
    CbTrainer<EarlyStopping> trainer(test::quiet({.max_epochs = 10}),
                                   EarlyStopping({.monitor = "score", .min_delta = 0.1, .patience = 2}));
    CHECK(trainer.fit(model, loader(8), loader(8)).epochs.size() == 3);
  }
  SECTION("mode max: a falling score is no improvement") {
    Scripted model(std::vector<double>{0.5, 0.6, 0.55, 0.58});
    CbTrainer<EarlyStopping> trainer(test::quiet({.max_epochs = 10}),
                                   EarlyStopping({.monitor = "score", .patience = 2, .mode = MonitorMode::max}));
    CHECK(trainer.fit(model, loader(8), loader(8)).epochs.size() == 4);
    CHECK(trainer.callback<EarlyStopping>().best_score() == 0.6);
  }
  SECTION("stopping_threshold: good enough") {
    Scripted model(std::vector<double>{5, 3, 0.5, 0.4});
    CbTrainer<EarlyStopping> trainer(test::quiet({.max_epochs = 10}),
                                   EarlyStopping({.monitor = "score", .stopping_threshold = 1.0}));
    const auto result = trainer.fit(model, loader(8), loader(8));
    CHECK(result.epochs.size() == 3);
    CHECK(trainer.callback<EarlyStopping>().stopping_reason() == EarlyStoppingReason::stopping_threshold);
  }
  SECTION("divergence_threshold: hopeless") {
    Scripted model(std::vector<double>{5, 50, 1});
    CbTrainer<EarlyStopping> trainer(test::quiet({.max_epochs = 10}),
                                   EarlyStopping({.monitor = "score", .divergence_threshold = 10.0}));
    CHECK(trainer.fit(model, loader(8), loader(8)).epochs.size() == 2);
    CHECK(trainer.callback<EarlyStopping>().stopping_reason() == EarlyStoppingReason::divergence_threshold);
  }
  SECTION("check_finite: NaN stops at once, unless turned off") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    Scripted model(std::vector<double>{5, nan, 1});
    CbTrainer<EarlyStopping> trainer(test::quiet({.max_epochs = 3}), EarlyStopping({.monitor = "score"}));
    CHECK(trainer.fit(model, loader(8), loader(8)).epochs.size() == 2);
    CHECK(trainer.callback<EarlyStopping>().stopping_reason() == EarlyStoppingReason::non_finite_metric);
    Scripted again(std::vector<double>{5, nan, 1});
    CbTrainer<EarlyStopping> lenient(test::quiet({.max_epochs = 3}),
                                   EarlyStopping({.monitor = "score", .check_finite = false}));
    CHECK(lenient.fit(again, loader(8), loader(8)).epochs.size() == 3);
  }
  SECTION("min_epochs holds the stop back") {
    Scripted model(std::vector<double>{5, 6, 7, 8, 9});
    CbTrainer<EarlyStopping> trainer(test::quiet({.max_epochs = 10, .min_epochs = 4}),
                                   EarlyStopping({.monitor = "score", .patience = 1}));
    CHECK(trainer.fit(model, loader(8), loader(8)).epochs.size() == 4);
  }
  SECTION("validation inside the epoch: checked after each validation run") {
    Scripted model(std::vector<double>{5, 4, 4});  // one score per epoch; val runs twice per epoch
    CbTrainer<EarlyStopping> trainer(test::quiet({.max_epochs = 10, .val_check_interval = 1}),
                                   EarlyStopping({.monitor = "score", .patience = 2}));
    const auto result = trainer.fit(model, loader(8), loader(8));
    // epoch 0: 5 (best), 5 (wait 1); epoch 1: 4 (best), 4 (wait 1); epoch 2: 4 (wait 2): stop after its first batch
    CHECK(result.epochs.size() == 3);
    CHECK(result.global_step == 5);
  }
}

TEST_CASE("EarlyStopping on a metric never logged names it and what was logged", "[callbacks][early_stopping][errors]") {
  Scripted model;
  CbTrainer<EarlyStopping> trainer(test::quiet({.max_epochs = 2}), EarlyStopping("val_los"));
  const std::string message = test::message_of<MisconfigurationError>([&] { trainer.fit(model, loader(8), loader(8)); });
  CHECK_THAT(message, Catch::Contains("Early stopping conditioned on metric `val_los` which is not available"));
  CHECK_THAT(message, Catch::Contains("`score`"));
  CHECK_THAT(message, Catch::Contains("`val_loss`"));
  CHECK(model->exceptions.size() == 1);  // on_exception ran on the way out
  Scripted lenient_model;
  CbTrainer<EarlyStopping> lenient(test::quiet({.max_epochs = 2}), EarlyStopping({.monitor = "val_los", .strict = false}));
  CHECK(lenient.fit(lenient_model, loader(8), loader(8)).epochs.size() == 2);
  CHECK_THROWS_AS(EarlyStopping({.monitor = ""}), MisconfigurationError);
}

// ---- ProgressBar ------------------------------------------------------------------------------------

TEST_CASE("ProgressBar: plain lines off a terminal, in place on one, nothing when disabled", "[callbacks][progress]") {
  std::ostringstream plain, terminal;
  {
    Scripted model;
    CbTrainer<ProgressBar> trainer(TrainerConfig{.max_epochs = 2},
                                 ProgressBar({.plain_interval = std::chrono::seconds(0), .terminal = false, .stream = &plain}));
    trainer.fit(model, loader(12), loader(8));
  }
  const std::string lines = plain.str();
  CHECK_THAT(lines, Catch::Contains("Epoch 1/2  3/3 100%"));
  CHECK_THAT(lines, Catch::Contains("epoch 2/2  step 6  train_loss "));
  CHECK_THAT(lines, Catch::Contains(" val_loss "));
  CHECK(lines.find('\r') == std::string::npos);
  {
    Scripted model;
    CbTrainer<ProgressBar> trainer(TrainerConfig{.max_epochs = 1}, ProgressBar({.terminal = true, .stream = &terminal}));
    trainer.fit(model, loader(12));
  }
  CHECK_THAT(terminal.str(), Catch::Contains("\r\x1b[2KEpoch 1/1  3/3 [====================] 100%"));
  CHECK_THAT(terminal.str(), Catch::Contains("epoch 1/1  step 3"));
  // enable_progress_bar = false with a ProgressBar given: Lightning's error
  CHECK_THROWS_WITH((CbTrainer<ProgressBar>(test::quiet())), Catch::Contains("enable_progress_bar = false"));
}

TEST_CASE("ProgressBar: the ETA counts to max_steps when it ends the epoch first", "[callbacks][progress]") {
  std::ostringstream limited, whole;
  for (const auto& [stream, max_steps] : {std::pair{&limited, std::int64_t{2}}, std::pair{&whole, std::int64_t{-1}}}) {
    Scripted model;
    CbTrainer<ProgressBar> trainer(TrainerConfig{.max_epochs = 1, .max_steps = max_steps},
                                   ProgressBar({.plain_interval = std::chrono::seconds(0), .terminal = false, .stream = stream}));
    trainer.fit(model, loader(40));  // 10 batches
  }
  CHECK_THAT(limited.str(), Catch::Contains("Epoch 1/1  1/10 10%") && Catch::Contains("(max_steps)"));
  CHECK_THAT(whole.str(), Catch::Contains("Epoch 1/1  1/10 10%") && Catch::Contains("ETA "));
  CHECK(whole.str().find("(max_steps)") == std::string::npos);
}

// ---- callbacks of the user's own ------------------------------------------------------------------

namespace {
struct CountingCallback {
  int fit_starts = 0, epochs = 0, batches = 0;
  void on_fit_start(TrainerView&) { ++fit_starts; }
  void on_train_epoch_end(TrainerView& trainer) {
    ++epochs;
    if (trainer.current_epoch() == 1) trainer.request_stop("counting callback had enough");
  }
  template <class Output, class Batch>
  void on_train_batch_end(TrainerView&, torch::nn::Module&, const Output& output, const Batch& batch, std::int64_t) {
    static_assert(std::is_same_v<Batch, data::Batch>);
    CHECK(output.defined());
    CHECK(batch.input.size(1) == 4);
    ++batches;
  }
};

/// A plug-in: hooks take (TrainerView&, torch::nn::Module&, ...) with concrete types.
struct Plugin {
  std::shared_ptr<std::vector<std::string>> seen = std::make_shared<std::vector<std::string>>();
  void setup(TrainerView&, torch::nn::Module&, Stage stage) { seen->push_back("setup:" + std::string(to_string(stage))); }
  void on_train_epoch_start(TrainerView& t, torch::nn::Module&) { seen->push_back("epoch " + std::to_string(t.current_epoch())); }
  void on_before_backward(TrainerView&, torch::nn::Module&, const at::Tensor& loss) { CHECK(loss.requires_grad()); }
};
}  // namespace

TEST_CASE("a plain struct is a callback: direct calls, Lightning's arguments, a stop request", "[callbacks]") {
  Scripted model;
  CbTrainer<CountingCallback> trainer(test::quiet({.max_epochs = 5}));  // default-constructed
  const auto result = trainer.fit(model, loader(12));
  const auto& counter = trainer.callback<CountingCallback>();
  CHECK(counter.fit_starts == 1);
  CHECK(counter.epochs == 2);
  CHECK(counter.batches == 6);
  CHECK(result.stop_reason == "counting callback had enough");
}

TEST_CASE("LambdaCallback and AnyCallback: hooks chosen at run time", "[callbacks]") {
  int epoch_ends = 0;
  std::vector<std::int64_t> batch_indices;
  LambdaCallback lambda{.on_train_epoch_end = [&](TrainerView&, torch::nn::Module&) { ++epoch_ends; },
                        .on_train_batch_end = [&](TrainerView& t, torch::nn::Module&) { batch_indices.push_back(t.batch_idx()); }};
  Plugin plugin;
  std::vector<AnyCallback> plugins{AnyCallback(plugin), AnyCallback(LambdaCallback{})};
  Scripted model;
  CbTrainer<LambdaCallback, std::vector<AnyCallback>> trainer(test::quiet({.max_epochs = 2}), std::move(lambda), std::move(plugins));
  trainer.fit(model, loader(8));
  CHECK(epoch_ends == 2);
  CHECK((batch_indices == std::vector<std::int64_t>{0, 1, 0, 1}));
  CHECK((*plugin.seen == std::vector<std::string>{"setup:fit", "epoch 0", "epoch 1"}));
  auto& held = std::get<std::vector<AnyCallback>>(trainer.callbacks());
  CHECK(held[0].target<Plugin>() != nullptr);
  CHECK(held[0].target<LambdaCallback>() == nullptr);
}

TEST_CASE("a ten-line callback of your own logs the gradient norm each step (docs/callbacks.md)", "[callbacks][extending]") {
  Scripted model;
  CbTrainer<::GradNormMonitor> trainer(test::quiet({.max_epochs = 1, .log_every_n_steps = 1}));
  const auto result = trainer.fit(model, loader(8));
  REQUIRE(result.metrics.count("grad_norm") == 1);
  CHECK(result.metrics.at("grad_norm") > 0.0);
  CHECK(result.logged_metrics.count("grad_norm") == 1);
}

// ---- LearningRateMonitor, Timer, ModelSummary -------------------------------------------------------

namespace {
struct ScheduledImpl : ScriptedImpl {
  OptimizerConfig configure_optimizers() {
    auto sgd = std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto step = std::make_unique<torch::optim::StepLR>(*sgd, /*step_size=*/1, /*gamma=*/0.5);
    return {.optimizer = std::move(sgd), .lr_scheduler = std::move(step), .interval = SchedulerInterval::epoch};
  }
};
TORCH_MODULE(Scheduled);
}  // namespace

TEST_CASE("LearningRateMonitor logs lr-SGD (and its momentum) at each epoch's start", "[callbacks][loggers]") {
  const std::string root = test::temporary_directory("lr_monitor");
  Scheduled model;
  CbTrainer<LearningRateMonitor, CSVLogger> trainer(test::quiet({.max_epochs = 3, .default_root_dir = root}),
                                                  LearningRateMonitor({.log_momentum = true}), CSVLogger());
  trainer.fit(model, loader(8));
  std::ifstream csv(trainer.callback<CSVLogger>().metrics_file());
  std::string header, line, text;
  std::getline(csv, header);
  CHECK(header == "epoch,lr-SGD,lr-SGD-momentum,step,train_loss_epoch");
  std::vector<double> lrs;
  while (std::getline(csv, line))
    if (line.find(",0.9,") != std::string::npos) lrs.push_back(std::stod(line.substr(line.find(',') + 1)));
  CHECK((lrs == std::vector<double>{0.1, 0.05, 0.025}));
  CHECK(trainer.callback<LearningRateMonitor>().last_values().at("lr-SGD") == 0.025);
  // Without a logger: a compile error (compile_fail.learning_rate_monitor_without_logger). Hidden in an
  // AnyCallback, the type is not seen at compile time: refused when fit starts.
  Scripted plain;
  std::vector<AnyCallback> hidden{AnyCallback(LearningRateMonitor())};
  CbTrainer<std::vector<AnyCallback>> without_logger(test::quiet({.max_epochs = 1}), std::move(hidden));
  CHECK_THROWS_WITH(without_logger.fit(plain, loader(8)), Catch::Contains("Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger"));
  STATIC_REQUIRE(needs_logger<LearningRateMonitor>());
}

TEST_CASE("Timer measures each stage and stops training at its duration", "[callbacks][timer]") {
  Scripted model;
  CbTrainer<Timer> trainer(test::quiet({.max_epochs = 100}), Timer(std::chrono::duration<double>(0.0)));
  const auto result = trainer.fit(model, loader(12), loader(8));
  CHECK(result.global_step == 1);  // the limit is checked after each batch
  CHECK_THAT(result.stop_reason, Catch::StartsWith("Timer: Time limit reached."));
  const Timer& timer = trainer.callback<Timer>();
  CHECK(timer.time_elapsed(Timer::Phase::train) > 0.0);
  CHECK(timer.time_elapsed(Timer::Phase::validate) > 0.0);  // the last batch's validation ran (stop request)
  CHECK(timer.time_elapsed(Timer::Phase::test) == 0.0);
  CHECK(timer.end_time(Timer::Phase::train).has_value());
  trainer.test(model, loader(8));
  CHECK(timer.time_elapsed(Timer::Phase::test) > 0.0);
}

namespace {
/// The module of scripts/lightning_reference.py's summary_scenario.
struct SummarizedImpl : torch::nn::Module {
  SummarizedImpl() {
    register_module("fc1", torch::nn::Linear(64, 32));
    register_module("act", torch::nn::ReLU());
    auto fc2 = register_module("fc2", torch::nn::Linear(32, 10));
    register_module("bn", torch::nn::BatchNorm1d(10))->eval();
    register_module("big", torch::nn::Linear(1000, 1200));
    fc2->weight.requires_grad_(false);
  }
};
}  // namespace

TEST_CASE("ModelSummary's table has Lightning's rows and totals", "[callbacks][lightning]") {
  const std::string text = summarize(SummarizedImpl(), 1).text();
  std::ifstream in(std::string(FULGUR_GOLDEN_DIR) + "/lightning/model_summary.txt");
  REQUIRE(in);
  std::vector<std::string> lightning;
  for (std::string line; std::getline(in, line);) lightning.push_back(line);
  std::vector<std::string> fulgur;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) fulgur.push_back(line);
  // Lightning adds a FLOPs column and a "Total Flops" line (fulgur has no example input to count them).
  auto cells = [](const std::string& line) {
    std::vector<std::string> out;
    std::istringstream fields(line);
    for (std::string cell; std::getline(fields, cell, '|');) {
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
      out.push_back(cell);
    }
    return out;
  };
  REQUIRE(fulgur.size() + 1 == lightning.size());
  for (std::size_t i = 0; i < fulgur.size(); ++i) {
    INFO(fulgur[i] << "\n" << lightning[i]);
    if (lightning[i].find('|') != std::string::npos) {
      auto expected = cells(lightning[i]);
      expected.pop_back();  // FLOPs
      CHECK(cells(fulgur[i]) == expected);
    } else if (lightning[i].find("---") == std::string::npos) {
      CHECK(fulgur[i] == lightning[i]);
    }
  }
  CHECK(human_readable_count(999) == "999  ");
  CHECK(human_readable_count(1234567) == "1.2 M");
  CHECK(human_readable_count(123456789) == "123 M");
}

// ---- loggers ------------------------------------------------------------------------------------------

TEST_CASE("CSV and TensorBoard logs read back by Python's csv module and TensorBoard's own reader",
          "[loggers]") {
  const std::string root = test::temporary_directory("loggers");
  Scripted model;
  {
    CbTrainer<CSVLogger, TensorBoardLogger> trainer(
        test::quiet({.max_epochs = 3, .log_every_n_steps = 1, .default_root_dir = root}));
    trainer.fit(model, loader(12), loader(8));
    CHECK(trainer.callback<CSVLogger>().log_dir() == root + "/lightning_logs/version_0");
    CHECK(trainer.callback<TensorBoardLogger>().log_dir() == root + "/lightning_logs/version_0");  // one version for both
  }
  {
    Scripted again;
    CbTrainer<CSVLogger> second(test::quiet({.max_epochs = 1, .default_root_dir = root}));
    second.fit(again, loader(8));
    CHECK(second.callback<CSVLogger>().version() == "version_1");
  }
  const std::string command = std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR + "/tests/loggers/check_logs.py " +
                              root + "/lightning_logs/version_0 --steps 9 --epochs 3";
  CHECK(std::system(command.c_str()) == 0);
}

TEST_CASE("loggers: quoted CSV names, one directory per logger, validate/test after fit at fit's step (probe regressions)",
          "[loggers]") {
  const std::string root = test::temporary_directory("logger_probes");
  struct OddNames : ScriptedImpl {
    at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
      ctx.log("a,b", 1.0);
      ctx.log("c\"d", 2.0);
      return ScriptedImpl::training_step(b, i, ctx);
    }
  };
  auto odd = std::make_shared<OddNames>();
  CbTrainer<CSVLogger> trainer(test::quiet({.max_epochs = 1, .log_every_n_steps = 1, .default_root_dir = root}));
  trainer.fit(odd, loader(8));
  std::ifstream csv(trainer.callback<CSVLogger>().metrics_file());
  std::string header;
  std::getline(csv, header);
  CHECK(header == "\"a,b\",\"c\"\"d\",epoch,step,train_loss_epoch,train_loss_step");
  // test after fit: at fit's epoch and logging step, as Lightning
  trainer.test(odd, loader(8));
  std::string line, last;
  while (std::getline(csv, line)) last = line;
  std::ifstream again(trainer.callback<CSVLogger>().metrics_file());
  while (std::getline(again, line)) last = line;
  CHECK_THAT(last, Catch::Contains(",1,2,"));  // epoch 1, step 2
  // two loggers of one type in one directory would overwrite each other
  Scripted model;
  CbTrainer<CSVLogger, CSVLogger> twins(test::quiet({.max_epochs = 1, .default_root_dir = root}));
  CHECK_THROWS_WITH(twins.fit(model, loader(8)), Catch::Contains("two loggers of one type write to"));
  CbTrainer<CSVLogger> unwritable(test::quiet({.max_epochs = 1, .default_root_dir = "/proc/fulgur"}));
  CHECK_THROWS_AS(unwritable.fit(model, loader(8)), fulgur::Error);
  CHECK_THROWS_AS(Timer(std::chrono::duration<double>(-1.0)), MisconfigurationError);
  CHECK_THROWS_AS(summarize(*model, -2), MisconfigurationError);
}

TEST_CASE("CSVLogger: a new column rewrites the saved rows under the new header (read back from the file)",
          "[loggers]") {
  // Only unsaved rows are kept in memory; a header change reads the file back, as Lightning does.
  const std::string root = test::temporary_directory("csv_rewrite");
  CSVLogger logger;
  logger.set_up({.root_dir = root});
  logger.log_metrics({{"q,uoted", 1.5}, {"loss", 0.25}}, 0);
  logger.save();
  logger.log_metrics({{"loss", 0.125}}, 1);
  logger.save();  // same columns: appended
  logger.log_metrics({{"acc", 0.5}, {"q,uoted", 2.0}}, 2);
  logger.save();  // a new column: rewritten
  logger.log_metrics({{"loss", 0.0625}}, 3);
  logger.finalize("success");
  std::ifstream csv(logger.metrics_file());
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  CHECK(lines == std::vector<std::string>{"acc,loss,\"q,uoted\",step", ",0.25,1.5,0", ",0.125,,1", "0.5,,2,2",
                                          ",0.0625,,3"});
}

TEST_CASE("CSVLogger: metrics.csv removed mid-run or between fits is written again with its header",
          "[loggers]") {
  // Found by a probe: the open file kept taking rows after the user removed it, and a new file
  // started without a header. Lightning writes the header again.
  const std::string root = test::temporary_directory("csv_removed");
  CSVLogger logger({}, 1);
  logger.set_up({.root_dir = root});
  auto lines = [&] {
    std::ifstream csv(logger.metrics_file());
    std::vector<std::string> out;
    for (std::string line; std::getline(csv, line);) out.push_back(line);
    return out;
  };
  logger.log_metrics({{"a", 1.5}}, 0);
  logger.log_metrics({{"a", 2.5}}, 1);  // appended through the open file
  std::remove(logger.metrics_file().c_str());
  logger.log_metrics({{"a", 3.5}}, 2);
  CHECK(lines() == std::vector<std::string>{"a,step", "3.5,2"});
  logger.finalize("success");
  std::remove(logger.metrics_file().c_str());  // between two runs
  logger.log_metrics({{"a", 4.5}}, 3);
  logger.finalize("success");
  CHECK(lines() == std::vector<std::string>{"a,step", "4.5,3"});
}

// ---- faults -------------------------------------------------------------------------------------------

namespace {
struct ThrowingCallback {
  std::vector<std::string>* seen;
  void on_train_epoch_start(TrainerView& t) {
    if (t.current_epoch() == 1) throw std::out_of_range("the callback's own failure");
  }
  void on_exception(TrainerView&, torch::nn::Module&, const std::exception& e) { seen->push_back(e.what()); }
};
}  // namespace

TEST_CASE("a callback that throws: on_exception everywhere, loggers flushed, the exception unchanged", "[callbacks][errors]") {
  const std::string root = test::temporary_directory("throwing");
  std::vector<std::string> seen;
  Scripted model;
  CbTrainer<ThrowingCallback, CSVLogger> trainer(
      test::quiet({.max_epochs = 3, .log_every_n_steps = 1, .default_root_dir = root}), ThrowingCallback{&seen}, CSVLogger());
  CHECK_THROWS_AS(trainer.fit(model, loader(8)), std::out_of_range);
  CHECK(seen == std::vector<std::string>{"the callback's own failure"});
  CHECK(model->exceptions == seen);
  std::ifstream csv(trainer.callback<CSVLogger>().metrics_file());
  std::string line;
  int rows = -1;
  while (std::getline(csv, line)) ++rows;
  CHECK(rows == 3);  // 2 steps and the epoch row of epoch 0, all on disk
}

TEST_CASE("Ctrl-C during fit: the step finishes, on_exception and teardown run, fit returns interrupted",
          "[callbacks][interrupt]") {
  const std::string root = test::temporary_directory("interrupt");
  struct sigaction before {};
  sigaction(SIGINT, nullptr, &before);
  Scripted model;
  model->raise_at = 4;  // SIGINT inside the fifth training_step
  CbTrainer<CSVLogger> trainer(test::quiet({.max_epochs = 10, .log_every_n_steps = 1, .default_root_dir = root}));
  const auto result = trainer.fit(model, loader(12));
  CHECK(result.interrupted);
  CHECK(result.global_step == 5);
  CHECK_THAT(result.stop_reason, Catch::StartsWith("interrupted by SIGINT (Ctrl-C) after training_step at epoch 1, batch 1"));
  REQUIRE(model->exceptions.size() == 1);
  CHECK(model->teardowns == 1);
  std::ifstream csv(trainer.callback<CSVLogger>().metrics_file());
  CHECK(csv.good());
  // The handler is gone after fit: SIGINT is back to what it was.
  struct sigaction now {};
  sigaction(SIGINT, nullptr, &now);
  CHECK(now.sa_handler == before.sa_handler);
  // Ctrl-C during validation (here: the last one) is not lost: fit still returns interrupted.
  struct InterruptedInValidation : ScriptedImpl {
    at::Tensor validation_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
      if (!ctx.sanity_checking && ctx.current_epoch == 1 && i == 0) std::raise(SIGINT);  // once: a second one kills
      return ScriptedImpl::validation_step(b, i, ctx);
    }
  };
  auto in_validation = std::make_shared<InterruptedInValidation>();
  CbTrainer<> validating(test::quiet({.max_epochs = 2}));
  const auto stopped = validating.fit(in_validation, loader(8), loader(8));
  CHECK(stopped.interrupted);
  CHECK(stopped.global_step == 4);
  // handle_interrupt = false leaves SIGINT alone during fit.
  Scripted untouched;
  CbTrainer<> plain(test::quiet({.max_epochs = 1, .handle_interrupt = false}));
  CHECK_FALSE(plain.fit(untouched, loader(8)).interrupted);
}

// ---- the second new-user probe ------------------------------------------------------------------

namespace {
struct FailsThenThrowsInOnException {
  void on_train_epoch_end(TrainerView&) { throw std::runtime_error("first failure"); }
  void on_exception(TrainerView&, const std::exception&) { throw std::runtime_error("second failure"); }
};
struct RecordsShutdown {
  std::vector<std::string>* seen;
  void on_exception(TrainerView&, const std::exception& e) { seen->push_back(std::string("on_exception: ") + e.what()); }
};
struct PredictingImpl : ScriptedImpl {
  at::Tensor predict_step(const data::Batch& b, std::int64_t) { return fc(b.input); }
};
TORCH_MODULE(Predicting);
}  // namespace

TEST_CASE("save_checkpoint after an interrupted or failed fit writes the file, which resumes (probe regressions)",
          "[callbacks][interrupt][checkpoint]") {
  const std::string root = test::temporary_directory("save_after_stop");
  {  // Ctrl-C mid-epoch: fit returns interrupted, then the program saves what it needs
    Scripted model;
    model->raise_at = 4;
    CbTrainer<> trainer(test::quiet({.max_epochs = 4, .default_root_dir = root}));
    REQUIRE(trainer.fit(model, loader(12)).interrupted);
    trainer.save_checkpoint("after_interrupt.ckpt");
    CHECK(fulgur::detail::path_exists(root + "/after_interrupt.ckpt"));
    Scripted resumed;
    CbTrainer<> next(test::quiet({.max_epochs = 4, .default_root_dir = root}));
    CHECK(next.fit(resumed, loader(12), FitOptions{.ckpt_path = "after_interrupt.ckpt"}).global_step == 12);
  }
  {  // a callback that throws: the error reaches the caller; a save afterwards is written, not queued
    std::vector<std::string> seen;
    Scripted model;
    CbTrainer<ThrowingCallback> trainer(test::quiet({.max_epochs = 3, .default_root_dir = root}), ThrowingCallback{&seen});
    CHECK_THROWS_AS(trainer.fit(model, loader(8)), std::out_of_range);
    trainer.save_checkpoint("after_failure.ckpt");
    CHECK(fulgur::detail::path_exists(root + "/after_failure.ckpt"));
  }
}

TEST_CASE("an on_exception that throws does not replace the run's error, and later callbacks still run (probe regressions)",
          "[callbacks][errors]") {
  std::vector<std::string> seen;
  Scripted model;
  CbTrainer<FailsThenThrowsInOnException, RecordsShutdown> trainer(test::quiet({.max_epochs = 2}),
                                                                    FailsThenThrowsInOnException{}, RecordsShutdown{&seen});
  CHECK_THROWS_WITH(trainer.fit(model, loader(8)), "first failure");
  CHECK(seen == std::vector<std::string>{"on_exception: first failure"});
  CHECK(model->exceptions == std::vector<std::string>{"first failure"});  // the module's hook ran too
  // The same in a stage that only evaluates.
  struct ThrowsInTest {
    void on_test_batch_end(TrainerView&) { throw std::runtime_error("test failure"); }
    void on_exception(TrainerView&, const std::exception&) { throw std::runtime_error("second failure"); }
  };
  std::vector<std::string> seen_in_test;
  CbTrainer<ThrowsInTest, RecordsShutdown> tester(test::quiet(), ThrowsInTest{}, RecordsShutdown{&seen_in_test});
  CHECK_THROWS_WITH(tester.test(model, loader(8)), "test failure");
  CHECK(seen_in_test == std::vector<std::string>{"on_exception: test failure"});
}

TEST_CASE("folders that cannot be created are refused when fit starts, naming who wants them (probe regressions)",
          "[callbacks][loggers][errors]") {
  const std::string root = test::temporary_directory("blocked_folders");
  std::ofstream(root + "/a_file") << "x";
  Scripted model;
  CbTrainer<CSVLogger> logging(test::quiet({.max_epochs = 1, .default_root_dir = root}),
                               CSVLogger({.save_dir = root + "/a_file/logs"}));
  const std::string logger_error = test::message_of<MisconfigurationError>([&] { logging.fit(model, loader(8)); });
  CHECK_THAT(logger_error, Catch::Contains("the logger's folder") && Catch::Contains("a_file' is a file"));
  CHECK(logging.callback<CSVLogger>().log_dir().empty());  // refused before a run began
  CbTrainer<ModelCheckpoint> checkpointing(test::quiet({.max_epochs = 1, .default_root_dir = root}),
                                           ModelCheckpoint({.dirpath = root + "/a_file"}));
  const std::string checkpoint_error = test::message_of<MisconfigurationError>([&] { checkpointing.fit(model, loader(8)); });
  CHECK_THAT(checkpoint_error, Catch::Contains("ModelCheckpoint's dirpath"));
}

TEST_CASE("messages that name the cause: EarlyStopping without validation data, a NaN in the sanity check, predict "
          "on empty data, a resume already past max_steps (probe regressions)", "[callbacks][errors]") {
  Scripted model;
  CbTrainer<EarlyStopping> stopping(test::quiet({.max_epochs = 2}), EarlyStopping({.monitor = "val_loss"}));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { stopping.fit(model, loader(8)); }),
             Catch::Contains("fit was given no validation data"));

  Scripted nan_model(std::vector<double>{1.0});
  auto nan_inputs = torch::full({8, 4}, std::nan(""));
  data::TensorLoader nan_val(nan_inputs, torch::zeros({8}, at::kLong), {.batch_size = 4});
  CbTrainer<> sane(test::quiet({.max_epochs = 1}));
  const FitResult result = sane.fit(nan_model, loader(8), nan_val);
  REQUIRE_FALSE(result.warnings.empty());
  CHECK_THAT(result.warnings.front(), Catch::Contains("in the sanity check before training"));

  Predicting predicting;
  CbTrainer<> predictor(test::quiet());
  data::TensorLoader empty(torch::randn({0, 4}), torch::zeros({0}, at::kLong), {.batch_size = 4});
  CHECK_THAT(test::message_of<DataError>([&] { predictor.predict(predicting, empty); }),
             Catch::Contains("predict data yielded no batches"));

  const std::string root = test::temporary_directory("past_max_steps");
  CbTrainer<> first(test::quiet({.max_steps = 6, .default_root_dir = root}));
  first.fit(model, loader(8));
  first.save_checkpoint("at6.ckpt");
  CbTrainer<> shorter(test::quiet({.max_steps = 4, .default_root_dir = root}));
  const FitResult resumed = shorter.fit(model, loader(8), FitOptions{.ckpt_path = "at6.ckpt"});
  CHECK(resumed.global_step == 6);
  REQUIRE(resumed.warnings.size() == 1);
  CHECK_THAT(resumed.warnings.front(), Catch::Contains("past max_steps = 4: nothing will train"));
  // The same past max_epochs, with epochs counted from 0 as everywhere else (a probe read "the end of epoch 2"
  // for a run that trained epochs 0 and 1).
  CbTrainer<> two_epochs(test::quiet({.max_epochs = 2, .default_root_dir = root}));
  two_epochs.fit(model, loader(8));
  two_epochs.save_checkpoint("after2.ckpt");
  CbTrainer<> again(test::quiet({.max_epochs = 2, .default_root_dir = root}));
  const FitResult past = again.fit(model, loader(8), FitOptions{.ckpt_path = "after2.ckpt"});
  INFO(Catch::Detail::stringify(past.warnings));
  CHECK(std::count_if(past.warnings.begin(), past.warnings.end(), [](const std::string& w) {
          return w.find("is after epoch 1 (2 epochs done), already at or past max_epochs = 2: nothing will train") !=
                 std::string::npos;
        }) == 1);
}
