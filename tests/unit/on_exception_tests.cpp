// OnExceptionCheckpoint (a failed fit leaves a checkpoint of its last completed optimizer step, which
// resumes exactly), and loggers that cannot write (disk full, folder gone) never end a run.
#include <dirent.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>

#include "fulgur/callbacks/early_stopping.hpp"
#include "fulgur/callbacks/on_exception_checkpoint.hpp"
#include "support.hpp"

using namespace fulgur;
using test::CPU;
using test::Single;

namespace {

/// One injected failure: where, and at which training batch (counted from 1 over the run) or epoch
/// start (counted from 1). It fires once.
struct Fault {
  enum Where {
    none, setup, training_step, batch_start, epoch_start, optimizer_step, batch_end, sigint, train_end,
    // after a batch's optimizer step, before its end: counted in training batches (validation after
    // that batch), or in epoch ends
    validation_step, validation_end, epoch_end, nan_loss
  };
  Where where = none;
  std::int64_t at = -1;
  std::int64_t batches = 0, epochs = 0, epoch_ends = 0;
  bool fired = false;
  bool fires(Where here, std::int64_t count) {
    if (where != here || count != at || fired) return false;
    fired = true;
    return true;
  }
};

/// Adam whose step can fail half way through (one parameter already moved).
struct FaultyAdam : torch::optim::Adam {
  FaultyAdam(std::vector<at::Tensor> params, double lr, Fault* fault)
      : torch::optim::Adam(std::move(params), torch::optim::AdamOptions(lr)), fault_(fault) {}
  at::Tensor step(LossClosure closure = nullptr) override {
    if (fault_->fires(Fault::optimizer_step, fault_->batches)) {
      at::NoGradGuard no_grad;
      param_groups().front().params().front().add_(1.0);
      throw std::runtime_error("injected: the optimizer failed half way");
    }
    return torch::optim::Adam::step(closure);
  }
  Fault* fault_;
};

/// Dropout (random state), a step-interval scheduler, shuffled data: all must be as of the step.
struct FaultNetImpl : torch::nn::Module {
  explicit FaultNetImpl(Fault* f)
      : fc1(register_module("fc1", torch::nn::Linear(8, 16))),
        drop(register_module("drop", torch::nn::Dropout(0.25))),
        fc2(register_module("fc2", torch::nn::Linear(16, 3))),
        fault(f) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(drop(torch::relu(fc1(x)))); }
  at::Tensor training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    at::Tensor loss = torch::nn::functional::cross_entropy(forward(b.input), b.target);
    ctx.log("train_loss", loss);
    for (int i = 0; i < wide; ++i) ctx.log("m" + std::to_string(i), loss.detach() + i);  // more bytes a step
    if (late_from >= 0 && ctx.global_step >= late_from) ctx.log("late", loss.detach());  // a new CSV column
    if (plateau) ctx.log("epoch_loss", loss.detach(), {.on_step = false, .on_epoch = true});
    if (fault->fires(Fault::training_step, fault->batches)) throw std::runtime_error("injected: training_step failed");
    // A loss that reads NaN while its gradients stay those of the true loss: without the fault, the
    // run is the straight one.
    if (fault->fires(Fault::nan_loss, fault->batches)) return loss + std::numeric_limits<double>::quiet_NaN();
    return loss;
  }
  at::Tensor validation_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    if (fault->fires(Fault::validation_step, fault->batches))
      throw std::runtime_error("injected: validation_step failed");
    at::Tensor loss = torch::nn::functional::cross_entropy(forward(b.input), b.target);
    ctx.log("val_loss", loss);
    validated.emplace_back(ctx.global_step, loss.item<double>());
    return loss;
  }
  // Epoch-level logs, in the training steps and at the epoch's end: a resumed epoch end must count them once.
  void on_train_epoch_end(StepContext& ctx) {
    if (plateau) ctx.log("epoch_ends", at::ones({}), {.on_step = false, .on_epoch = true, .reduce = ReduceOp::sum});
  }
  OptimizerConfig configure_optimizers() {
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (fault->where == Fault::optimizer_step) optimizer = std::make_unique<FaultyAdam>(parameters(), 1e-2, fault);
    else optimizer = std::make_unique<torch::optim::Adam>(parameters(), 1e-2);
    if (plateau) {  // halves the rate at each epoch's end whose val_loss did not halve: it moves every epoch
      auto scheduler = std::make_unique<torch::optim::ReduceLROnPlateauScheduler>(
          *optimizer, torch::optim::ReduceLROnPlateauScheduler::min, /*factor=*/0.5F, /*patience=*/0,
          /*threshold=*/0.5);
      return {.optimizer = std::move(optimizer), .lr_scheduler = std::move(scheduler), .monitor = "val_loss"};
    }
    auto scheduler = std::make_unique<torch::optim::StepLR>(*optimizer, 3, 0.5);
    return {std::move(optimizer), std::move(scheduler), SchedulerInterval::step};
  }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
  Fault* fault;
  int wide = 0;
  std::int64_t late_from = -1;
  bool plateau = false;
  std::vector<std::pair<std::int64_t, double>> validated;  // (global_step, loss) of each validation batch in fit
};
TORCH_MODULE(FaultNet);

/// Counts the batches and epochs, and fails in a callback hook where the fault says.
struct Injector {
  Fault* fault;
  void setup(TrainerView&, Stage) {
    if (fault->fires(Fault::setup, 0)) throw std::runtime_error("injected: setup failed");
  }
  void on_train_epoch_start(TrainerView&) {
    if (fault->fires(Fault::epoch_start, ++fault->epochs)) throw std::runtime_error("injected: on_train_epoch_start failed");
  }
  void on_train_end(TrainerView&) {
    if (fault->fires(Fault::train_end, 1)) throw std::runtime_error("injected: on_train_end failed");
  }
  void on_train_batch_start(TrainerView&) {
    if (fault->fires(Fault::batch_start, ++fault->batches)) throw std::runtime_error("injected: on_train_batch_start failed");
  }
  void on_validation_end(TrainerView&) {
    if (fault->fires(Fault::validation_end, fault->batches))
      throw std::runtime_error("injected: on_validation_end failed");
  }
  void on_train_epoch_end(TrainerView&) {
    if (fault->fires(Fault::epoch_end, ++fault->epoch_ends))
      throw std::runtime_error("injected: on_train_epoch_end failed");
  }
  void on_train_batch_end(TrainerView&) {
    if (fault->fires(Fault::batch_end, fault->batches)) throw std::runtime_error("injected: on_train_batch_end failed");
    if (fault->fires(Fault::sigint, fault->batches)) std::raise(SIGINT);
  }
};

/// std::cerr into a string while it lives.
struct CapturedErrors {
  CapturedErrors() : previous(std::cerr.rdbuf(text.rdbuf())) {}
  ~CapturedErrors() { std::cerr.rdbuf(previous); }
  std::string str() const { return text.str(); }
  std::ostringstream text;
  std::streambuf* previous;
};

struct Outcome {
  std::vector<at::Tensor> weights;
  std::int64_t global_step = -1;
  std::string error;   // what fit threw
  std::string stderr_text;
};

/// 8 batches an epoch, 3 epochs, validation every 4 batches.
Outcome train(Fault fault, std::int64_t accumulate, const std::string& dir, const std::string& resume_from = "",
              std::int64_t max_steps = -1) {
  torch::manual_seed(resume_from.empty() ? 7 : 99);  // a resumed run starts from other weights
  FaultNet net(&fault);
  auto [x, y] = test::classification_data(64, 3);
  auto [vx, vy] = test::classification_data(16, 4);
  data::TensorLoader train_data(x, y, {.batch_size = 8, .shuffle = true, .seed = 11});
  data::TensorLoader val_data(vx, vy, {.batch_size = 8});
  TrainerConfig config{.max_epochs = 3, .max_steps = max_steps, .accumulate_grad_batches = accumulate, .val_check_interval = 4,
                       .log_every_n_steps = 1, .default_root_dir = dir, .enable_progress_bar = false};
  Trainer<CPU, Single, FloatPrecision, Injector, OnExceptionCheckpoint> trainer(
      config, Injector{&fault}, OnExceptionCheckpoint({.dirpath = dir}));
  Outcome out;
  CapturedErrors errors;
  try {
    out.global_step = trainer.fit(net, train_data, val_data, FitOptions{.ckpt_path = resume_from}).global_step;
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  out.stderr_text = errors.str();
  out.weights = test::snapshot(*net);
  return out;
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

struct Validated {
  Outcome outcome;
  std::vector<std::pair<std::int64_t, double>> validated;
  std::vector<double> epoch_val_loss;  // FitResult's, per epoch
  std::vector<Metrics> epoch_metrics;  // FitResult's callback metrics at each epoch's end
};

/// As train, with validation that logs val_loss every 4 batches and at each epoch's end, no sanity
/// check, an EarlyStopping on val_loss (stops at global_step 16: no later val_loss improves by 1), a
/// ReduceLROnPlateau (epoch interval) on it, and the fault after an optimizer step.
Validated train_validated(Fault fault, const std::string& dir, const std::string& resume_from = "",
                          std::int64_t accumulate = 1, std::int64_t max_steps = -1) {
  torch::manual_seed(resume_from.empty() ? 7 : 99);
  FaultNet net(&fault);
  net->plateau = true;
  auto [x, y] = test::classification_data(64, 3);
  auto [vx, vy] = test::classification_data(16, 4);
  data::TensorLoader train_data(x, y, {.batch_size = 8, .shuffle = true, .seed = 11});
  data::TensorLoader val_data(vx, vy, {.batch_size = 8});
  TrainerConfig config{.max_epochs = 3, .max_steps = max_steps, .accumulate_grad_batches = accumulate,
                       .val_check_interval = 4, .num_sanity_val_steps = 0, .log_every_n_steps = 1,
                       .default_root_dir = dir, .enable_progress_bar = false};
  Trainer<CPU, Single, FloatPrecision, EarlyStopping, Injector, OnExceptionCheckpoint> trainer(
      config, EarlyStopping({.monitor = "val_loss", .min_delta = 1.0, .patience = 3}), Injector{&fault},
      OnExceptionCheckpoint({.dirpath = dir}));
  Validated out;
  CapturedErrors errors;
  try {
    const FitResult result = trainer.fit(net, train_data, val_data, FitOptions{.ckpt_path = resume_from});
    out.outcome.global_step = result.global_step;
    for (const auto& epoch : result.epochs) {
      out.epoch_val_loss.push_back(epoch.val_loss.value_or(-1.0));
      out.epoch_metrics.push_back(epoch.metrics);
    }
  } catch (const std::exception& e) {
    out.outcome.error = e.what();
  }
  out.outcome.stderr_text = errors.str();
  out.outcome.weights = test::snapshot(*net);
  out.validated = net->validated;
  return out;
}

}  // namespace

TEST_CASE("OnExceptionCheckpoint: a failed fit leaves its last completed step, which resumes exactly",
          "[on_exception][checkpoint]") {
  // batch / epoch counted from 1 over the run; 8 batches an epoch.
  const auto [where, kind, at, accumulate, step] = GENERATE(table<const char*, Fault::Where, std::int64_t, std::int64_t,
                                                                  std::int64_t>({
      {"training_step, mid-epoch", Fault::training_step, 6, 1, 5},
      {"training_step, second batch of an accumulation window", Fault::training_step, 6, 2, 2},
      {"training_step, first batch of an accumulation window", Fault::training_step, 5, 2, 2},
      {"a callback's on_train_batch_start, second epoch", Fault::batch_start, 11, 2, 5},
      {"a callback's on_train_epoch_start, second epoch", Fault::epoch_start, 2, 1, 8},
  }));
  INFO(where);
  const std::string dir = test::scratch_folder("on_exception");
  const std::string path = dir + "/on_exception.ckpt";
  const Outcome straight = train({}, accumulate, test::scratch_folder("on_exception_straight"));
  REQUIRE(straight.error.empty());
  CHECK_FALSE(exists(path));

  const Outcome failed = train({.where = kind, .at = at}, accumulate, dir);
  CHECK_THAT(failed.error, Catch::Contains("injected"));  // the exception goes on to the caller unchanged
  REQUIRE(exists(path));
  CHECK_THAT(failed.stderr_text, Catch::Contains("OnExceptionCheckpoint wrote '" + path + "'") &&
                                     Catch::Contains("global_step " + std::to_string(step)));
  const StateDict written = checkpoint::load(path);
  CHECK(written.at("global_step").toInt() == step);

  const std::string copy = test::scratch_folder("on_exception_resume") + "/from.ckpt";
  REQUIRE(std::rename(path.c_str(), copy.c_str()) == 0);
  const Outcome resumed = train({}, accumulate, dir, copy);
  REQUIRE(resumed.error.empty());
  CHECK(resumed.global_step == straight.global_step);
  REQUIRE(resumed.weights.size() == straight.weights.size());
  for (std::size_t i = 0; i < straight.weights.size(); ++i) CHECK(test::identical(straight.weights[i], resumed.weights[i]));
}

TEST_CASE("OnExceptionCheckpoint: no checkpoint where no consistent state exists, and it says why", "[on_exception]") {
  const auto [kind, why] = GENERATE(table<Fault::Where, const char*>({
      {Fault::optimizer_step, "from inside the optimizer step of global step 5"},
      {Fault::batch_end, "after the optimizer step of global step 5"},
      {Fault::setup, "before the first training batch"},
  }));
  INFO(why);
  const std::string dir = test::scratch_folder("on_exception_none");
  const Outcome failed = train({.where = kind, .at = kind == Fault::setup ? 0 : 6}, 1, dir);
  CHECK_THAT(failed.error, Catch::Contains("injected"));
  CHECK_FALSE(exists(dir + "/on_exception.ckpt"));
  CHECK_THAT(failed.stderr_text, Catch::Contains("OnExceptionCheckpoint wrote no checkpoint: ") && Catch::Contains(why));
}

TEST_CASE("OnExceptionCheckpoint: a run stopped mid-epoch by max_steps that fails in on_train_end", "[on_exception]") {
  const std::string dir = test::scratch_folder("on_exception_train_end");
  const Outcome straight = train({}, 1, test::scratch_folder("on_exception_train_end_straight"), "", 13);
  const Outcome failed = train({.where = Fault::train_end, .at = 1}, 1, dir, "", 11);
  CHECK_THAT(failed.error, Catch::Contains("injected: on_train_end"));
  const std::string path = dir + "/on_exception.ckpt";
  REQUIRE(exists(path));
  CHECK_THAT(failed.stderr_text, Catch::Contains("global_step 11 (epoch 1, where the run stopped)"));
  const std::string copy = test::scratch_folder("on_exception_train_end_resume") + "/from.ckpt";
  REQUIRE(std::rename(path.c_str(), copy.c_str()) == 0);
  const Outcome resumed = train({}, 1, dir, copy, 13);  // on to a later max_steps: as if never stopped
  REQUIRE(resumed.error.empty());
  CHECK(resumed.global_step == 13);
  for (std::size_t i = 0; i < straight.weights.size(); ++i) CHECK(test::identical(straight.weights[i], resumed.weights[i]));
}

TEST_CASE("OnExceptionCheckpoint: on_train_epoch_end of an epoch a stop cut short says so", "[on_exception]") {
  // max_steps = 11 stops the second epoch after its third batch; its on_train_epoch_end then fails.
  const std::string dir = test::scratch_folder("on_exception_cut_epoch_end");
  const Outcome failed = train({.where = Fault::epoch_end, .at = 2}, 1, dir, "", 11);
  CHECK_THAT(failed.error, Catch::Contains("injected: on_train_epoch_end"));
  CHECK_FALSE(exists(dir + "/on_exception.ckpt"));
  CHECK_THAT(failed.stderr_text, Catch::Contains("OnExceptionCheckpoint wrote no checkpoint: the exception came in "
                                                 "the end of epoch 1, which a stop cut short after batch 2"));
  CHECK_THAT(failed.stderr_text, !Catch::Contains("had stepped its schedulers"));
}

TEST_CASE("OnExceptionCheckpoint: Ctrl-C writes where fit stopped, which resumes exactly, and keeps it", "[on_exception]") {
  const std::string dir = test::scratch_folder("on_exception_sigint");
  const Outcome straight = train({}, 2, test::scratch_folder("on_exception_sigint_straight"));
  const Outcome stopped = train({.where = Fault::sigint, .at = 7}, 2, dir);
  REQUIRE(stopped.error.empty());
  CHECK(stopped.global_step == 3);  // batch 7 finished (mid-window), nothing after it ran
  const std::string path = dir + "/on_exception.ckpt";
  REQUIRE(exists(path));  // not removed by the teardown an interrupted fit still runs
  CHECK_THAT(stopped.stderr_text, Catch::Contains("where the interrupted fit stopped"));
  const std::string copy = test::scratch_folder("on_exception_sigint_resume") + "/from.ckpt";
  REQUIRE(std::rename(path.c_str(), copy.c_str()) == 0);
  const Outcome resumed = train({}, 2, dir, copy);
  REQUIRE(resumed.error.empty());
  for (std::size_t i = 0; i < straight.weights.size(); ++i) CHECK(test::identical(straight.weights[i], resumed.weights[i]));
}

TEST_CASE("OnExceptionCheckpoint: a fit that ends well removes the file (Lightning's teardown)", "[on_exception]") {
  const std::string dir = test::scratch_folder("on_exception_teardown");
  { std::ofstream(dir + "/on_exception.ckpt") << "an earlier failure's"; }
  const Outcome ok = train({}, 1, dir);
  REQUIRE(ok.error.empty());
  CHECK_FALSE(exists(dir + "/on_exception.ckpt"));
}

TEST_CASE("OnExceptionCheckpoint's options are Lightning's (checked against the installed lightning)", "[on_exception]") {
  const std::string out = test::scratch_folder("on_exception_reference") + "/lightning.txt";
  const std::string line = std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR +
                           "/tests/unit/on_exception_reference.py " + out;
  REQUIRE(std::system(line.c_str()) == 0);
  std::map<std::string, std::string> lightning;
  std::ifstream in(out);
  for (std::string row; std::getline(in, row);) lightning[row.substr(0, row.find('='))] = row.substr(row.find('=') + 1);
  REQUIRE(lightning.size() == 4);
  const OnExceptionCheckpoint defaults({.dirpath = "some/dir"});
  CHECK(defaults.ckpt_path() == lightning.at("default_path"));
  CHECK(OnExceptionCheckpoint({.dirpath = "some/dir", .filename = "crash"}).ckpt_path() == lightning.at("named_path"));
  CHECK(std::string(OnExceptionCheckpoint::file_extension) == lightning.at("extension"));
  CHECK_THAT(test::message_of<MisconfigurationError>([] { OnExceptionCheckpoint({.dirpath = "d", .filename = ""}); }),
             Catch::Contains(lightning.at("empty_filename_error")));
  CHECK_THAT(test::message_of<MisconfigurationError>([] { OnExceptionCheckpoint({}); }), Catch::Contains("needs a dirpath"));
  CHECK_THAT(test::message_of<MisconfigurationError>([] { OnExceptionCheckpoint({.dirpath = "d", .filename = "a/b"}); }),
             Catch::Contains("holds a '/'"));
}

// ---- loggers that cannot write ----------------------------------------------------------------------

namespace {

/// At training batch `at` (from 1), breaks `folder`: removed and replaced by a regular file, or
/// (`fill`) its file system filled up.
struct BreakFolder {
  std::string folder;
  std::int64_t at;
  bool fill = false;
  std::int64_t seen = 0;
  void on_train_batch_end(TrainerView&) {
    if (++seen != at) return;
    if (fill) {
      std::FILE* f = std::fopen((folder + "/filler").c_str(), "wb");
      REQUIRE(f != nullptr);
      const std::string block(4096, 'x');
      while (std::fwrite(block.data(), 1, block.size(), f) == block.size() && std::fflush(f) == 0) {
      }
      std::fclose(f);
      return;
    }
    fulgur::detail::remove_tree(folder);
    std::ofstream(folder) << "not a folder";
  }
};

struct LoggedRun {
  FitResult result;
  std::string csv_dir, tb_dir, tb_file;
};

LoggedRun logged_fit(const std::string& csv_root, const std::string& tb_root, const std::string& ckpt_dir,
                     BreakFolder breaker, int wide = 0, std::int64_t late_from = -1) {
  torch::manual_seed(3);
  Fault none;
  FaultNet net(&none);
  net->wide = wide;
  net->late_from = late_from;
  auto [x, y] = test::classification_data(64, 3);
  data::TensorLoader train_data(x, y, {.batch_size = 8});
  TrainerConfig config{.max_epochs = 2, .log_every_n_steps = 1, .default_root_dir = ckpt_dir,
                       .enable_progress_bar = false};
  Trainer<CPU, Single, FloatPrecision, CSVLogger, TensorBoardLogger, BreakFolder, ModelCheckpoint> trainer(
      config, CSVLogger({.save_dir = csv_root}, /*flush_logs_every_n_steps=*/1), TensorBoardLogger({.save_dir = tb_root}),
      std::move(breaker), ModelCheckpoint({.dirpath = ckpt_dir, .save_top_k = -1, .every_n_train_steps = 2}));
  LoggedRun run;
  run.result = trainer.fit(net, train_data);
  run.csv_dir = trainer.callback<CSVLogger>().log_dir();
  run.tb_dir = trainer.callback<TensorBoardLogger>().log_dir();
  return run;
}

std::size_t count_containing(const std::vector<std::string>& lines, const std::string& part) {
  return static_cast<std::size_t>(
      std::count_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(part) != std::string::npos; }));
}

std::size_t lines_in(const std::string& path) {
  std::ifstream in(path);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

/// The bytes of the event files in a TensorBoard folder.
long event_bytes(const std::string& folder) {
  long total = 0;
  if (DIR* dir = ::opendir(folder.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      struct stat file {};
      const std::string name = entry->d_name;
      if (name.rfind("events.out.tfevents", 0) == 0 && ::stat((folder + "/" + name).c_str(), &file) == 0)
        total += static_cast<long>(file.st_size);
    }
    ::closedir(dir);
  }
  return total;
}

std::size_t checkpoints_in(const std::string& folder) {
  std::size_t n = 0;
  for (std::int64_t step = 2; step <= 16; step += 2)
    n += exists(folder + "/epoch=" + std::to_string((step - 1) / 8) + "-step=" + std::to_string(step) + ".ckpt");
  return n;
}

}  // namespace

TEST_CASE("A logger whose folder is replaced by a file mid-run: one warning, the run and the rest go on",
          "[on_exception][loggers]") {
  const std::string root = test::scratch_folder("logger_folder_gone");
  const bool csv_breaks = GENERATE(true, false);
  INFO((csv_breaks ? "CSVLogger's" : "TensorBoardLogger's") << " folder replaced by a file");
  const std::string csv_root = root + "/csv", tb_root = root + "/tb", ckpt_dir = root + "/ckpt";
  CapturedErrors errors;
  const LoggedRun run = logged_fit(csv_root, tb_root, ckpt_dir,
                                   {.folder = (csv_breaks ? csv_root : tb_root) + "/lightning_logs", .at = 5});
  CHECK(run.result.global_step == 16);
  const std::string broken = csv_breaks ? "CSVLogger 'lightning_logs' cannot write to " + run.csv_dir
                                        : "TensorBoardLogger 'lightning_logs' cannot write to " + run.tb_dir;
  CHECK(count_containing(run.result.warnings, broken) == 1);
  CHECK(count_containing(run.result.warnings, "Not a directory") == 1);
  CHECK(count_containing(run.result.warnings, "cannot write to") == 1);  // the other logger is fine
  CHECK(errors.str().find(broken) != std::string::npos);  // said when it happened
  CHECK(checkpoints_in(ckpt_dir) == 8);  // every checkpoint, where it was asked for
  if (csv_breaks) {
    CHECK(event_bytes(run.tb_dir) > 16 * 2 * 30);  // TensorBoard took every step's train_loss and epoch
  } else {
    CHECK(lines_in(run.csv_dir + "/metrics.csv") == 1 + 16);  // the header, a row per step
  }
}

TEST_CASE("A logger that cannot write its first file is the config's error, said at once", "[on_exception][loggers]") {
  const std::string root = test::scratch_folder("logger_never_wrote");
  Fault none;
  FaultNet net(&none);
  auto [x, y] = test::classification_data(16, 3);
  data::TensorLoader train_data(x, y, {.batch_size = 8});
  Trainer<CPU, Single, FloatPrecision, TensorBoardLogger> trainer(
      TrainerConfig{.max_epochs = 1, .log_every_n_steps = 1, .default_root_dir = "/proc/fulgur",
                    .enable_progress_bar = false});
  CHECK_THROWS_WITH(trainer.fit(net, train_data), Catch::Contains("/proc/fulgur"));
}

TEST_CASE("A logger on a full disk (ENOSPC): one warning, the run and the checkpoints go on", "[on_exception][loggers]") {
  const std::string root = test::scratch_folder("logger_disk_full");
  const std::string disk = root + "/disk";
  fulgur::detail::make_directories(disk);
  if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=256k") != 0) {
    WARN("no tmpfs can be mounted here (" << std::strerror(errno) << "): the ENOSPC form is skipped");
    return;
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{disk};
  CapturedErrors errors;
  // Full after batch 5, once both have written: CSVLogger's next rewrite (a new column) and the event
  // file's next page (24 values a step) find no space.
  const LoggedRun run = logged_fit(disk + "/csv", disk + "/tb", root + "/ckpt", {.folder = disk, .at = 5, .fill = true},
                                   /*wide=*/24, /*late_from=*/6);
  CHECK(run.result.global_step == 16);
  CHECK(count_containing(run.result.warnings, "CSVLogger 'lightning_logs' cannot write to") == 1);
  CHECK(count_containing(run.result.warnings, "TensorBoardLogger 'lightning_logs' cannot write to") == 1);
  CHECK(count_containing(run.result.warnings, "No space left on device") == 2);
  CHECK(checkpoints_in(root + "/ckpt") == 8);
}

TEST_CASE("OnExceptionCheckpoint: a failure after a step, before its batch or epoch ended, resumes exactly",
          "[on_exception][checkpoint]") {
  // batch / epoch counted from 1 over the run; 8 batches an epoch, validation after batches 4 and 8.
  // accumulate: accumulate_grad_batches; max_steps: the failed run's (the straight and resumed runs have none).
  const auto [where, kind, at, step, pending, accumulate, max_steps] =
      GENERATE(table<const char*, Fault::Where, std::int64_t, std::int64_t, const char*, std::int64_t, std::int64_t>({
      {"validation_step at a mid-epoch val_check_interval point", Fault::validation_step, 12, 12, "its validation", 1,
       -1},
      {"validation_step at the epoch's end (the validation EarlyStopping stops at)", Fault::validation_step, 16, 16,
       "its validation and the epoch's end", 1, -1},
      {"a callback's on_validation_end, mid-epoch", Fault::validation_end, 12, 12, "its validation", 1, -1},
      {"a callback's on_train_epoch_end (ReduceLROnPlateau steps after it)", Fault::epoch_end, 1, 8,
       "its end runs first", 1, -1},
      {"a NaN loss (read after the step)", Fault::nan_loss, 6, 6, "after the optimizer step of batch 5)", 1, -1},
      {"validation_step mid-epoch, accumulate_grad_batches = 2", Fault::validation_step, 12, 6, "its validation", 2,
       -1},
      {"validation_step where max_steps stops the failed run mid-epoch (resumed without the limit, it goes on)",
       Fault::validation_step, 12, 12, "its validation", 1, 12},
  }));
  INFO(where);
  const std::string dir = test::scratch_folder("on_exception_pending");
  const std::string path = dir + "/on_exception.ckpt";
  const Validated straight =
      train_validated({}, test::scratch_folder("on_exception_pending_straight"), "", accumulate);
  REQUIRE(straight.outcome.error.empty());
  REQUIRE(straight.outcome.global_step == 16 / accumulate);  // EarlyStopping stopped the run at the end of epoch 1

  const Validated failed = train_validated({.where = kind, .at = at}, dir, "", accumulate, max_steps);
  CHECK_THAT(failed.outcome.error, Catch::Contains(kind == Fault::nan_loss ? "the loss is NaN" : "injected"));
  INFO(failed.outcome.stderr_text);
  REQUIRE(exists(path));
  CHECK_THAT(failed.outcome.stderr_text, Catch::Contains("OnExceptionCheckpoint wrote '" + path + "'") &&
                                             Catch::Contains("global_step " + std::to_string(step)) &&
                                             Catch::Contains(pending));
  if (kind == Fault::nan_loss)
    CHECK_THAT(failed.outcome.stderr_text, Catch::Contains("the step with the non-finite loss left"));
  CHECK(checkpoint::load(path).at("global_step").toInt() == step);

  const std::string copy = test::scratch_folder("on_exception_pending_resume") + "/from.ckpt";
  REQUIRE(std::rename(path.c_str(), copy.c_str()) == 0);
  const Validated resumed = train_validated({}, dir, copy, accumulate);
  REQUIRE(resumed.outcome.error.empty());
  CHECK(resumed.outcome.global_step == straight.outcome.global_step);
  REQUIRE(resumed.outcome.weights.size() == straight.outcome.weights.size());
  for (std::size_t i = 0; i < straight.outcome.weights.size(); ++i)
    CHECK(test::identical(straight.outcome.weights[i], resumed.outcome.weights[i]));
  // What the resumed run validated (the pending validation first) is what the straight run did from that step on.
  std::vector<std::pair<std::int64_t, double>> expected;
  for (const auto& entry : straight.validated)
    if (entry.first > step || (entry.first == step && kind != Fault::epoch_end)) expected.push_back(entry);
  CHECK(resumed.validated == expected);
  // The epoch the checkpoint was in, and those after it, end with the straight run's val_loss.
  const std::size_t first_epoch = static_cast<std::size_t>((step - 1) / (8 / accumulate));
  REQUIRE(resumed.epoch_val_loss.size() == straight.epoch_val_loss.size() - first_epoch);
  for (std::size_t e = 0; e < resumed.epoch_val_loss.size(); ++e) {
    CHECK(resumed.epoch_val_loss[e] == straight.epoch_val_loss[first_epoch + e]);
    CHECK(resumed.epoch_metrics[e] == straight.epoch_metrics[first_epoch + e]);  // epoch_loss, epoch_ends (1)
    CHECK(resumed.epoch_metrics[e].at("epoch_ends") == 1.0);
  }
}
