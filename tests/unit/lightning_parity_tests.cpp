// fulgur against Lightning itself: the order of every module hook, and logged metrics with their
// reductions and names, compared with what scripts/lightning_reference.py records from the venv's
// lightning at test time. The scenarios' numbers are the script's.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>

#include "unit/support.hpp"

using namespace fulgur;

namespace {

std::vector<std::string> reference_lines(const std::string& name) {
  const std::string path = std::string(FULGUR_GOLDEN_DIR) + "/lightning/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + " is missing: ctest runs lightning.reference first");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

/// What the metric views held, by "<view> <when>" ("callback final", "logged fit:val_end.0").
using Views = std::map<std::string, Metrics>;

/// The views scripts/lightning_reference.py recorded, one "view when name value" per line (a view
/// Lightning had empty has no line).
Views reference_views(const std::string& name) {
  Views views;
  for (const auto& line : reference_lines(name)) {
    std::istringstream fields(line);
    std::string view, when, metric;
    double value = 0;
    fields >> view >> when >> metric >> value;
    views[view + " " + when][metric] = value;
  }
  return views;
}

void record_views(Views& seen, TrainerView& trainer, const std::string& when) {
  seen["callback " + when] = trainer.callback_metrics().to_host();
  seen["logged " + when] = trainer.logged_metrics().to_host();
  seen["progress_bar " + when] = trainer.progress_bar_metrics().to_host();
}

/// Every view fulgur recorded holds Lightning's names and values, and no other name but `own`.
void check_views(const Views& expected, const Views& actual, const std::set<std::string>& own = {}) {
  const Metrics nothing;
  for (const auto& [view, metrics] : actual) {
    INFO(view);
    const Metrics& reference = expected.count(view) == 1 ? expected.at(view) : nothing;
    for (const auto& [name, value] : reference) {
      INFO(name);
      REQUIRE(metrics.count(name) == 1);
      CHECK(metrics.at(name) == Approx(value).epsilon(1e-6));
    }
    for (const auto& [name, value] : metrics) {
      INFO(name << " is not in Lightning's " << view);
      CHECK((reference.count(name) == 1 || own.count(name) == 1));
    }
  }
}

/// Records every hook fulgur calls, by name; does what Lightning's defaults do where a hook has one.
struct SpyImpl : torch::nn::Module {
  explicit SpyImpl(std::optional<std::pair<std::int64_t, std::int64_t>> stop = {})
      : fc(register_module("fc", torch::nn::Linear(4, 2))), stop_at(stop) {}
  void record(std::string name) { calls.push_back(std::move(name)); }
  at::Tensor loss(const data::Batch& b) { return torch::nn::functional::cross_entropy(fc(b.input), b.target); }

  at::Tensor training_step(const data::Batch& b, std::int64_t) { return record("training_step"), loss(b); }
  at::Tensor validation_step(const data::Batch& b, std::int64_t) { return record("validation_step"), loss(b); }
  at::Tensor test_step(const data::Batch& b, std::int64_t) { return record("test_step"), loss(b); }
  at::Tensor predict_step(const data::Batch& b, std::int64_t) { return record("predict_step"), fc(b.input); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    record("configure_optimizers");
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }

  void prepare_data() { record("prepare_data"); }
  void setup(Stage stage) { record("setup:" + std::string(to_string(stage))); }
  void configure_model() { record("configure_model"); }
  void teardown(Stage stage) { record("teardown:" + std::string(to_string(stage))); }
  void on_fit_start() { record("on_fit_start"); }
  void on_fit_end() { record("on_fit_end"); }
  void on_sanity_check_start() { record("on_sanity_check_start"); }
  void on_sanity_check_end() { record("on_sanity_check_end"); }
  void on_exception(const std::exception&) { record("on_exception"); }

  void on_train_start() { record("on_train_start"); }
  void on_train_end() { record("on_train_end"); }
  void on_train_epoch_start() { record("on_train_epoch_start"); }
  void on_train_epoch_end() { record("on_train_epoch_end"); }
  std::int64_t on_train_batch_start(const data::Batch&, std::int64_t batch_idx, StepContext& ctx) {
    record("on_train_batch_start");
    return stop_at && *stop_at == std::pair{ctx.current_epoch, batch_idx} ? -1 : 0;
  }
  template <class Output>
  void on_train_batch_end(const Output&, const data::Batch&, std::int64_t) { record("on_train_batch_end"); }
  void on_before_zero_grad(torch::optim::Optimizer&) { record("on_before_zero_grad"); }
  void on_before_backward(const at::Tensor&) { record("on_before_backward"); }
  void on_after_backward() { record("on_after_backward"); }
  void on_before_optimizer_step(torch::optim::Optimizer&) { record("on_before_optimizer_step"); }

  data::Batch on_before_batch_transfer(const data::Batch& b, std::int64_t) { return record("on_before_batch_transfer"), b; }
  data::Batch transfer_batch_to_device(const data::Batch& b, c10::Device device, std::int64_t) {
    record("transfer_batch_to_device");
    return {b.input.to(device), b.target.to(device)};
  }
  data::Batch on_after_batch_transfer(const data::Batch& b, std::int64_t) { return record("on_after_batch_transfer"), b; }

  void on_validation_model_zero_grad() { record("on_validation_model_zero_grad"), zero_grad(); }
  void on_validation_model_eval() { record("on_validation_model_eval"), eval(); }
  void on_validation_model_train() { record("on_validation_model_train"), train(); }
  void on_validation_start() { record("on_validation_start"); }
  void on_validation_end() { record("on_validation_end"); }
  void on_validation_epoch_start() { record("on_validation_epoch_start"); }
  void on_validation_epoch_end() { record("on_validation_epoch_end"); }
  void on_validation_batch_start(const data::Batch&, std::int64_t) { record("on_validation_batch_start"); }
  template <class Output>
  void on_validation_batch_end(const Output&, const data::Batch&, std::int64_t) { record("on_validation_batch_end"); }

  void on_test_model_eval() { record("on_test_model_eval"), eval(); }
  void on_test_model_train() { record("on_test_model_train"), train(); }
  void on_test_start() { record("on_test_start"); }
  void on_test_end() { record("on_test_end"); }
  void on_test_epoch_start() { record("on_test_epoch_start"); }
  void on_test_epoch_end() { record("on_test_epoch_end"); }
  void on_test_batch_start(const data::Batch&, std::int64_t) { record("on_test_batch_start"); }
  template <class Output>
  void on_test_batch_end(const Output&, const data::Batch&, std::int64_t) { record("on_test_batch_end"); }

  void on_predict_model_eval() { record("on_predict_model_eval"), eval(); }
  void on_predict_start() { record("on_predict_start"); }
  void on_predict_end() { record("on_predict_end"); }
  void on_predict_epoch_start() { record("on_predict_epoch_start"); }
  void on_predict_epoch_end() { record("on_predict_epoch_end"); }
  void on_predict_batch_start(const data::Batch&, std::int64_t) { record("on_predict_batch_start"); }
  template <class Output>
  void on_predict_batch_end(const Output&, const data::Batch&, std::int64_t) { record("on_predict_batch_end"); }

  torch::nn::Linear fc;
  std::optional<std::pair<std::int64_t, std::int64_t>> stop_at;
  std::vector<std::string> calls;
};
TORCH_MODULE(Spy);

data::TensorLoader loader(std::int64_t samples) {
  return data::TensorLoader(torch::randn({samples, 4}), torch::randint(2, {samples}, at::kLong), {.batch_size = 4});
}

using CpuTrainer = test::CpuTrainer<FloatPrecision>;

/// The first difference between two hook sequences, as a readable message (empty when equal).
std::string first_difference(const std::vector<std::string>& fulgur, const std::vector<std::string>& lightning) {
  for (std::size_t i = 0; i < std::max(fulgur.size(), lightning.size()); ++i) {
    const std::string f = i < fulgur.size() ? fulgur[i] : "<end>";
    const std::string l = i < lightning.size() ? lightning[i] : "<end>";
    if (f != l) return "at call " + std::to_string(i) + ": fulgur called " + f + ", Lightning " + l;
  }
  return {};
}

}  // namespace

TEST_CASE("hook order equals Lightning's: fit with validation, accumulation, two epochs and a sanity check",
          "[lightning][hooks]") {
  Spy spy;
  CpuTrainer trainer(test::quiet({.max_epochs = 2, .accumulate_grad_batches = 2, .limit_val_batches = 2}));
  trainer.fit(spy, loader(12), loader(12));
  CHECK(first_difference(spy->calls, reference_lines("hooks_fit.txt")) == "");
}

TEST_CASE("hook order equals Lightning's: validation every 2 batches, max_steps ending an epoch early",
          "[lightning][hooks]") {
  Spy spy;
  CpuTrainer trainer(test::quiet({.max_steps = 7, .val_check_interval = 2, .num_sanity_val_steps = 0}));
  const auto result = trainer.fit(spy, loader(20), loader(8));
  CHECK(first_difference(spy->calls, reference_lines("hooks_fit_interval.txt")) == "");
  CHECK(result.global_step == 7);
  CHECK(result.stop_reason == "max_steps=7 reached");
}

TEST_CASE("hook order equals Lightning's: on_train_batch_start returning -1 ends the epoch", "[lightning][hooks]") {
  Spy spy(std::pair<std::int64_t, std::int64_t>{0, 1});
  CpuTrainer trainer(test::quiet({.max_epochs = 2, .num_sanity_val_steps = 0}));
  const auto result = trainer.fit(spy, loader(12), loader(8));
  CHECK(first_difference(spy->calls, reference_lines("hooks_fit_batch_start_stop.txt")) == "");
  CHECK(result.global_step == 1 + 3);
}

TEST_CASE("hook order equals Lightning's: max_epochs = 0 runs the sanity check and trains nothing",
          "[lightning][hooks]") {
  Spy spy;
  CpuTrainer trainer(test::quiet({.max_epochs = 0}));
  const auto result = trainer.fit(spy, loader(12), loader(8));
  CHECK(first_difference(spy->calls, reference_lines("hooks_fit_max_epochs_0.txt")) == "");
  CHECK(result.global_step == 0);
  CHECK(result.stop_reason == "max_epochs=0 reached");
}

TEST_CASE("hook order equals Lightning's: validate, test and predict on a fresh module", "[lightning][hooks]") {
  for (const std::string stage : {"validate", "test", "predict"}) {
    Spy spy;
    CpuTrainer trainer(test::quiet());
    if (stage == "validate") trainer.validate(spy, loader(8));
    if (stage == "test") trainer.test(spy, loader(8));
    if (stage == "predict") trainer.predict(spy, loader(8));
    INFO(stage);
    CHECK(first_difference(spy->calls, reference_lines("hooks_" + stage + ".txt")) == "");
  }
}

namespace {
/// Logs values that depend only on where the loop is, as scripts/lightning_reference.py's Logging does.
struct LoggingImpl : torch::nn::Module {
  LoggingImpl() : fc(register_module("fc", torch::nn::Linear(4, 2))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    const double e = static_cast<double>(ctx.current_epoch), bi = static_cast<double>(i);
    ctx.log("a", bi + 10 * e);
    ctx.log("b", bi + e, {.prog_bar = true, .on_step = true, .on_epoch = true});
    ctx.log("c", bi + 1.0, {.on_step = false, .on_epoch = true, .reduce = ReduceOp::sum});
    ctx.log("m", bi * 2.0 - e, {.on_step = false, .on_epoch = true, .reduce = ReduceOp::max});
    ctx.log("n", bi * 2.0 + e, {.on_step = false, .on_epoch = true, .reduce = ReduceOp::min});
    ctx.log("w", bi * 3.0 + e, {.on_epoch = true});
    return torch::nn::functional::cross_entropy(fc(b.input), b.target);
  }
  void validation_step(const data::Batch&, std::int64_t i, StepContext& ctx) {
    ctx.log("v", static_cast<double>(i) * 2.0 + static_cast<double>(ctx.current_epoch));
    ctx.log("vs", static_cast<double>(i) + 0.5, {.prog_bar = true, .on_step = true});
    ctx.log("vm", static_cast<double>(i), {.logger = false, .reduce = ReduceOp::max});
  }
  void on_train_epoch_end(StepContext& ctx) { ctx.log("e", static_cast<double>(ctx.current_epoch) * 3.0); }
  void on_validation_epoch_end(StepContext& ctx) { ctx.log("ve", 1.5 + static_cast<double>(ctx.current_epoch)); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Logging);

/// What the three views hold at each training and validation batch end (they are live in
/// Lightning: a batch hook sees what this batch's step logged), as "callback train0.1".
struct ViewRecorder {
  Views* seen;
  void record(TrainerView& trainer, const std::string& when) { record_views(*seen, trainer, when); }
  template <class Output>
  void on_train_batch_end(TrainerView& trainer, torch::nn::Module&, const Output&, const data::Batch&, std::int64_t i) {
    record(trainer, "train" + std::to_string(trainer.current_epoch()) + "." + std::to_string(i));
  }
  template <class Output>
  void on_validation_batch_end(TrainerView& trainer, torch::nn::Module&, const Output&, const data::Batch&,
                               std::int64_t i) {
    record(trainer, "val" + std::to_string(trainer.current_epoch()) + "." + std::to_string(i));
  }
};
}  // namespace

TEST_CASE("logged metrics equal Lightning's: names, step/epoch forms, weighted means, sum/max/min, views",
          "[lightning][logging]") {
  Logging model;
  Views seen;  // the views at each batch end
  test::CpuTrainer<FloatPrecision, ViewRecorder> trainer(
      test::quiet({.max_epochs = 2, .num_sanity_val_steps = 0, .log_every_n_steps = 1}), ViewRecorder{&seen});
  auto train = loader(10);  // batches of 4, 4, 2: epoch means weighted by batch size
  const FitResult result = trainer.fit(model, train, loader(6));
  const Views expected = reference_views("metrics_logging.txt");
  auto without_fulgur_extras = [](Metrics m) {
    m.erase("train_loss");  // fulgur reports the loss the step returned; Lightning logs nothing by itself
    return m;
  };
  Views actual{
      {"callback epoch0", without_fulgur_extras(result.epochs.at(0).metrics)},
      {"callback final", without_fulgur_extras(result.metrics)},
      {"logged final", result.logged_metrics},
      {"progress_bar final", result.progress_bar_metrics}};
  for (auto& [when, metrics] : seen) actual[when] = without_fulgur_extras(metrics);
  for (const auto& [when, metrics] : expected) {  // every batch end Lightning recorded (an empty view has no lines)
    INFO(when << " was recorded by Lightning");
    if (when.find(" train") != std::string::npos || when.find(" val") != std::string::npos) CHECK(actual.count(when) == 1);
  }
  check_views(expected, actual);
}

namespace {
/// Training and validation log the same names, test its own (scripts/lightning_reference.py's SharedNames).
struct SharedNamesImpl : torch::nn::Module {
  SharedNamesImpl() : fc(register_module("fc", torch::nn::Linear(4, 2))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    ctx.log("x", 100.0 + static_cast<double>(i) + 10.0 * static_cast<double>(ctx.current_epoch));
    ctx.log("dup", 100.0 + static_cast<double>(i));
    return torch::nn::functional::cross_entropy(fc(b.input), b.target);
  }
  void validation_step(const data::Batch&, std::int64_t i, StepContext& ctx) {
    ctx.log("x", -1.0 - static_cast<double>(i));
    ctx.log("dup", -2.0, {.on_step = true, .on_epoch = false});
    ctx.log("vacc", 0.5 + static_cast<double>(i));
  }
  void test_step(const data::Batch&, std::int64_t i, StepContext& ctx) { ctx.log("tacc", 0.25 * static_cast<double>(i + 1)); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(SharedNames);

/// The views at each batch end and evaluation epoch end, as "<stage>:<hook>.<batch>.<epoch>".
struct BatchViews {
  Views* seen;
  void at(TrainerView& t, const std::string& what) {
    record_views(*seen, t, std::string(to_string(t.stage())) + ":" + what + std::to_string(t.current_epoch()));
  }
  template <class Output>
  void on_train_batch_end(TrainerView& t, torch::nn::Module&, const Output&, const data::Batch&, std::int64_t i) {
    at(t, "train_batch." + std::to_string(i) + ".");
  }
  template <class Output>
  void on_validation_batch_end(TrainerView& t, torch::nn::Module&, const Output&, const data::Batch&, std::int64_t i) {
    at(t, "val_batch." + std::to_string(i) + ".");
  }
  void on_validation_epoch_end(TrainerView& t) { at(t, "val_end."); }
  template <class Output>
  void on_test_batch_end(TrainerView& t, torch::nn::Module&, const Output&, const data::Batch&, std::int64_t i) {
    at(t, "test_batch." + std::to_string(i) + ".");
  }
  void on_test_epoch_end(TrainerView& t) { at(t, "test_end."); }
};
}  // namespace

TEST_CASE("the metric views follow Lightning's when training, validation and test log the same names",
          "[lightning][logging]") {
  // The views are live: after a validation run logged `x` and `dup`, training's next values show
  // again; validate() and test() have views of their own that callbacks see.
  Views seen;
  SharedNames model;
  test::CpuTrainer<FloatPrecision, BatchViews> trainer(
      test::quiet({.max_epochs = 2, .val_check_interval = 2, .num_sanity_val_steps = 0, .log_every_n_steps = 1}),
      BatchViews{&seen});
  trainer.fit(model, loader(16), loader(8));
  trainer.validate(model, loader(8));
  trainer.test(model, loader(8));
  const Views expected = reference_views("metrics_shared_names.txt");
  for (const auto& [when, metrics] : expected) {
    INFO(when << " was recorded by Lightning");
    CHECK(seen.count(when) == 1);
  }
  check_views(expected, seen, {"train_loss", "val_loss", "test_loss"});  // fulgur's own, unless logged
}

namespace {
/// Records every callback hook as "cb:<hook>" ("cb:setup:fit") into the spy module's list.
struct SpyCallback {
  std::vector<std::string>* calls;
  template <class... A>
  void record(const char* name, const A&... args) {
    std::string entry = std::string("cb:") + name;
    ((entry += stage_suffix(args)), ...);
    calls->push_back(entry);
  }
  template <class T>
  static std::string stage_suffix(const T& value) {
    if constexpr (std::is_same_v<T, Stage>)
      return ":" + std::string(to_string(value));
    else
      return "";
  }
#define FULGUR_TEST_SPY_HOOK(name)                       \
  template <class... A>                                  \
  void name(TrainerView&, torch::nn::Module&, const A&... args) { \
    record(#name, args...);                              \
  }
  FULGUR_CALLBACK_HOOK_NAMES(FULGUR_TEST_SPY_HOOK)
#undef FULGUR_TEST_SPY_HOOK
};

/// The spy module, logging "watched" in validation_step: 3, 2, 2.5, ... by epoch, so that
/// EarlyStopping(patience 1) stops after epoch 2.
struct WatchedImpl : SpyImpl {
  at::Tensor validation_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    ctx.log("watched", std::vector<double>{3.0, 2.0, 2.5, 2.6, 2.7}.at(static_cast<std::size_t>(ctx.current_epoch)));
    return SpyImpl::validation_step(b, i);
  }
};
TORCH_MODULE(Watched);
}  // namespace

TEST_CASE("callback hooks reach callbacks in Lightning's order, around the module's, up to an early stop",
          "[lightning][hooks][callbacks]") {
  Watched spy;
  test::CpuTrainer<FloatPrecision, SpyCallback, EarlyStopping> trainer(
      test::quiet({.max_epochs = 5, .accumulate_grad_batches = 2, .limit_val_batches = 2}), SpyCallback{&spy->calls},
      EarlyStopping({.monitor = "watched", .patience = 1}));
  const auto result = trainer.fit(spy, loader(12), loader(12));
  CHECK(first_difference(spy->calls, reference_lines("hooks_callbacks.txt")) == "");
  CHECK(result.epochs.size() == 3);
  CHECK(trainer.callback<EarlyStopping>().stopped_epoch() == 2);
  CHECK(result.stop_reason.rfind("EarlyStopping: Monitored metric watched did not improve in the last 1 records", 0) == 0);
}

namespace {
/// A CSV file as rows of name -> text (empty cells dropped).
std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + " is missing");
  auto split = [](const std::string& line) {
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream fields(line);
    while (std::getline(fields, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    return cells;
  };
  std::string line;
  std::getline(in, line);
  const auto header = split(line);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    const auto cells = split(line);
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < header.size() && i < cells.size(); ++i)
      if (!cells[i].empty()) row[header[i]] = cells[i];
    rows.push_back(row);
  }
  return rows;
}
}  // namespace

TEST_CASE("CSVLogger writes Lightning's metrics.csv: the same rows, steps, columns and values",
          "[lightning][loggers]") {
  const std::string root = test::temporary_directory("csv_parity");
  Logging model;
  test::CpuTrainer<FloatPrecision, CSVLogger> trainer(
      test::quiet({.max_epochs = 2, .num_sanity_val_steps = 0, .log_every_n_steps = 1, .default_root_dir = root}),
      CSVLogger());
  auto train = loader(10);
  trainer.fit(model, train, loader(6));
  const std::string path = trainer.callback<CSVLogger>().metrics_file();
  CHECK(path == root + "/lightning_logs/version_0/metrics.csv");
  const auto fulgur_rows = read_csv(path);
  const auto lightning_rows = read_csv(std::string(FULGUR_GOLDEN_DIR) + "/lightning/metrics_logging.csv");
  REQUIRE(fulgur_rows.size() == lightning_rows.size());
  for (std::size_t i = 0; i < fulgur_rows.size(); ++i) {
    INFO("row " << i);
    REQUIRE(fulgur_rows[i].size() == lightning_rows[i].size());
    for (const auto& [name, text] : lightning_rows[i]) {
      INFO(name);
      REQUIRE(fulgur_rows[i].count(name) == 1);
      CHECK(std::stod(fulgur_rows[i].at(name)) == Approx(std::stod(text)).epsilon(1e-6));
    }
  }
}

namespace {
/// The module of scripts/lightning_reference.py's several_loaders scenario.
struct SeveralLoadersImpl : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 2))};
  std::vector<std::string>* calls = nullptr;
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc(b.input), b.target);
  }
  void evaluate(const char* stage, const data::Batch& b, std::int64_t batch_idx, std::int64_t idx, StepContext& ctx) {
    calls->push_back(std::string(stage) + "_step " + std::to_string(batch_idx) + " " + std::to_string(idx));
    ctx.log("err", b.input.sum() * static_cast<double>(idx + 1));
  }
  void validation_step(const data::Batch& b, std::int64_t batch_idx, std::int64_t dataloader_idx, StepContext& ctx) {
    evaluate("validation", b, batch_idx, dataloader_idx, ctx);
  }
  void test_step(const data::Batch& b, std::int64_t batch_idx, std::int64_t dataloader_idx, StepContext& ctx) {
    evaluate("test", b, batch_idx, dataloader_idx, ctx);
  }
  void on_validation_batch_start(const data::Batch&, std::int64_t batch_idx, std::int64_t dataloader_idx) {
    calls->push_back("on_validation_batch_start " + std::to_string(batch_idx) + " " + std::to_string(dataloader_idx));
  }
  template <class Output>
  void on_validation_batch_end(const Output&, const data::Batch&, std::int64_t batch_idx, std::int64_t dataloader_idx) {
    calls->push_back("on_validation_batch_end " + std::to_string(batch_idx) + " " + std::to_string(dataloader_idx));
  }
  void on_validation_epoch_start() { calls->push_back("on_validation_epoch_start"); }
  void on_validation_epoch_end(StepContext& ctx) {
    calls->push_back("on_validation_epoch_end");
    ctx.log("summary", 1.5);
  }
  void on_test_epoch_end(StepContext& ctx) { ctx.log("summary", 2.5); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
};
TORCH_MODULE(SeveralLoaders);

/// Samples first, first + 1, ...: x[i] = (first + i) / 10 * [1, 2, 3, 4] (the script's ramp).
data::TensorLoader ramp(std::int64_t first, std::int64_t n, std::int64_t batch_size) {
  auto x = torch::arange(first, first + n, torch::kFloat).unsqueeze(1) / 10 * torch::tensor({1.0F, 2.0F, 3.0F, 4.0F});
  return data::TensorLoader(x, torch::zeros({n}, torch::kLong), {.batch_size = batch_size});
}

/// "<what> <loader> <name>" -> value, from the reference's lines or from fulgur's results.
std::map<std::string, double> result_lines(const std::vector<std::string>& lines) {
  std::map<std::string, double> out;
  for (const auto& line : lines) {
    std::istringstream fields(line);
    std::string what, loader, name;
    double value = 0;
    fields >> what >> loader >> name >> value;
    out[what + " " + loader + " " + name] = value;
  }
  return out;
}
}  // namespace

TEST_CASE("several evaluation loaders equal Lightning's: dataloader_idx in the hooks, /dataloader_idx_N names, a "
          "result per loader",
          "[lightning][hooks][metrics]") {
  std::vector<std::string> calls;
  SeveralLoaders module;
  module->calls = &calls;
  std::map<std::string, double> results;
  auto record = [&](const std::string& what, const std::vector<EvaluationResult>& per_loader) {
    for (std::size_t i = 0; i < per_loader.size(); ++i)
      for (const auto& [name, value] : per_loader[i].metrics) results[what + " " + std::to_string(i) + " " + name] = value;
  };
  using T = Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision>;
  T trainer(test::quiet({.max_epochs = 1, .num_sanity_val_steps = 0}));
  record("validate", trainer.validate(module, data::loaders(ramp(0, 6, 4), ramp(6, 3, 4))));  // any loader types
  record("test", trainer.test(module, {ramp(0, 6, 4), ramp(6, 3, 4)}));                      // a braced list
  calls.push_back("fit");
  T fitting(test::quiet({.max_epochs = 1, .num_sanity_val_steps = 0}));
  const FitResult fit = fitting.fit(module, ramp(0, 4, 4), {ramp(0, 6, 4), ramp(6, 3, 4)});
  for (const auto& [name, value] : fit.metrics)
    if (name != "train_loss") results["fit -1 " + name] = value;  // fulgur's own, which Lightning has not
  CHECK(calls == reference_lines("calls_several_loaders.txt"));
  const auto expected = result_lines(reference_lines("results_several_loaders.txt"));
  REQUIRE(results.size() == expected.size());
  for (const auto& [key, value] : expected) {
    INFO(key);
    REQUIRE(results.contains(key));
    CHECK(results.at(key) == Approx(value).epsilon(1e-6));
  }
}
