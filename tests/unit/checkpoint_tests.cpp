// Trainer checkpoints: exact resume at any batch, what a checkpoint holds, Python's view of it.
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <algorithm>
#include <limits>

#include "support.hpp"

using namespace fulgur;
using test::CPU;
using test::Single;

namespace {

/// Dropout (random state), an LR scheduler stepping every optimizer step, values logged on step
/// and on epoch; with `inf_at`, one step's loss is infinite (a skipped step under '16-mixed').
struct ResumeNetImpl : torch::nn::Module {
  ResumeNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 16))),
        drop(register_module("drop", torch::nn::Dropout(0.25))),
        fc2(register_module("fc2", torch::nn::Linear(16, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(drop(torch::relu(fc1(x)))); }
  at::Tensor training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    at::Tensor loss = torch::nn::functional::cross_entropy(forward(b.input).to(at::kFloat), b.target);
    if (ctx.global_step == inf_at) loss = loss * std::numeric_limits<float>::infinity();
    ctx.log("train_loss", loss, {.prog_bar = true, .on_step = true, .on_epoch = true});
    ctx.log("batch_mean", b.input.mean().to(at::kDouble), {.on_step = false, .on_epoch = true, .reduce = ReduceOp::max});
    return loss;
  }
  at::Tensor validation_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    at::Tensor loss = torch::nn::functional::cross_entropy(forward(b.input).to(at::kFloat), b.target);
    ctx.log("val_loss", loss);
    return loss;
  }
  OptimizerConfig configure_optimizers() {
    auto optimizer = std::make_unique<torch::optim::Adam>(parameters(), 1e-2);
    auto scheduler = std::make_unique<torch::optim::StepLR>(*optimizer, 3, 0.5);
    return {std::move(optimizer), std::move(scheduler), SchedulerInterval::step};
  }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
  std::int64_t inf_at = -1;
};
TORCH_MODULE(ResumeNet);

/// Asks for a checkpoint at the end of the training batch number `at` (counted from 1 over the run),
/// or with `signal`, raises it there (a preemption).
struct SaveAtBatch {
  std::int64_t at = -1;
  std::string path;
  int signal = 0;
  std::int64_t seen = 0;
  void on_train_batch_end(TrainerView& trainer) {
    if (++seen != at) return;
    if (signal != 0) std::raise(signal);
    else trainer.save_checkpoint(path);
  }
};

/// What the loggers received: (step, name) -> value.
struct RecordingLogger {
  std::map<std::pair<std::int64_t, std::string>, double>* out;
  void log_metrics(const Metrics& metrics, std::int64_t step) {
    for (const auto& [name, value] : metrics) (*out)[{step, name}] = value;
  }
};

using test::scratch_folder;
using test::scratch_root;

struct Run {
  std::vector<at::Tensor> weights;
  std::vector<at::Tensor> adam;  // exp_avg, exp_avg_sq per parameter, and the step counts
  std::map<std::pair<std::int64_t, std::string>, double> logged;
  FitResult result;
  double lr = 0.0;
};

template <class P>
Run train(std::int64_t save_at, const std::string& path, const std::string& resume_from, std::int64_t inf_at,
          std::int64_t max_steps = 12, int signal = 0, const std::string& root = ".") {
  torch::manual_seed(resume_from.empty() ? 7 : 99);  // a resumed run starts from other weights
  ResumeNet net;
  net->inf_at = inf_at;
  auto [x, y] = test::classification_data(64, 3);
  auto [vx, vy] = test::classification_data(16, 4);
  data::TensorLoader train_data(x, y, {.batch_size = 8, .shuffle = true, .seed = 11});
  data::TensorLoader val_data(vx, vy, {.batch_size = 8});
  Run run;
  TrainerConfig config{.max_steps = max_steps, .accumulate_grad_batches = 2, .val_check_interval = 4,
                       .log_every_n_steps = 1, .default_root_dir = root, .enable_progress_bar = false,
                       .preemption = {.exit_process = false}};
  Trainer<CPU, Single, P, SaveAtBatch, RecordingLogger, EarlyStopping> trainer(
      config, SaveAtBatch{save_at, path, signal}, RecordingLogger{&run.logged},
      EarlyStopping(EarlyStoppingOptions{.monitor = "val_loss", .patience = 100}));
  run.result = trainer.fit(net, train_data, val_data, FitOptions{.ckpt_path = resume_from});
  run.weights = test::snapshot(*net);
  return run;
}

void require_same_training(const Run& straight, const Run& resumed, std::int64_t from_step) {
  REQUIRE(straight.weights.size() == resumed.weights.size());
  for (std::size_t i = 0; i < straight.weights.size(); ++i) CHECK(test::identical(straight.weights[i], resumed.weights[i]));
  CHECK(straight.result.global_step == resumed.result.global_step);
  CHECK(straight.result.skipped_optimizer_steps >= resumed.result.skipped_optimizer_steps);
  std::size_t compared = 0;
  for (const auto& [key, value] : resumed.logged) {
    INFO("step " << key.first << " " << key.second);
    REQUIRE(straight.logged.count(key) == 1);
    CHECK(straight.logged.at(key) == value);  // bit for bit
    ++compared;
  }
  for (const auto& [key, value] : straight.logged)
    if (key.first >= from_step) CHECK(resumed.logged.count(key) == 1);
  CHECK(compared > 0);
  for (const auto& [name, value] : straight.result.metrics) {
    INFO(name);
    REQUIRE(resumed.result.metrics.count(name) == 1);
    CHECK(resumed.result.metrics.at(name) == value);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("a run stopped at any batch and resumed equals the run straight through", "[checkpoint][resume]",
                   FloatPrecision, FP16MixedPrecision, BF16MixedPrecision) {
  // 8 batches an epoch, 2 per optimizer step, validation after batches 4 and 8 of each epoch.
  const std::int64_t inf_at = std::is_same_v<TestType, FP16MixedPrecision> ? 1 : -1;  // a skipped step before the stop
  const auto [where, batch] = GENERATE(table<const char*, std::int64_t>({{"inside an accumulation window", 3},
                                                                        {"after a validation, mid-epoch", 4},
                                                                        {"at an epoch boundary", 8},
                                                                        {"in the second epoch, mid-window", 11}}));
  INFO(where << " (batch " << batch << ") under " << TestType::name);
  const std::string folder = scratch_folder("resume");
  const std::string path = folder + "/at.ckpt";
  const Run straight = train<TestType>(batch, path, "", inf_at);
  REQUIRE(::access(path.c_str(), F_OK) == 0);
  const Run resumed = train<TestType>(-1, "", path, inf_at);
  require_same_training(straight, resumed, /*from_step=*/batch / 2);
}

TEST_CASE("SIGTERM or SIGUSR1 during fit: a checkpoint at the batch boundary that resumes exactly", "[checkpoint][preemption]") {
  const auto [signal, batch] = GENERATE(table<int, std::int64_t>({{SIGTERM, 3}, {SIGUSR1, 8}, {SIGTERM, 10}}));
  INFO("signal " << signal << " in batch " << batch);
  const std::string root = scratch_folder("preempted");
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  const Run straight = train<FP16MixedPrecision>(-1, "", "", 1);
  const Run stopped = train<FP16MixedPrecision>(batch, "", "", 1, 12, signal, root);
  CHECK(stopped.result.preempted);
  CHECK(stopped.result.interrupted);
  CHECK(stopped.result.global_step == batch / 2);  // the batch finished, nothing after it ran
  CHECK(stopped.result.checkpoint_path == root + "/hpc_ckpt_1.ckpt");
  CHECK_THAT(stopped.result.stop_reason, Catch::StartsWith(signal == SIGTERM ? "preempted by SIGTERM" : "preempted by SIGUSR1"));
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  CHECK(after.sa_handler == before.sa_handler);  // the handler is gone with fit
  // The next run finds it by itself with ckpt_path "hpc" and ends as the straight run did.
  const Run resumed = train<FP16MixedPrecision>(-1, "", "hpc", 1, 12, 0, root);
  CHECK_FALSE(resumed.result.preempted);
  require_same_training(straight, resumed, /*from_step=*/batch / 2);
  // A second preemption writes the next number; "hpc" takes the newest.
  const Run again = train<FP16MixedPrecision>(2, "", "", 1, 12, SIGTERM, root);
  CHECK(again.result.checkpoint_path == root + "/hpc_ckpt_2.ckpt");
}

namespace {
/// Runs the test from another current directory, and comes back.
struct InDirectory {
  explicit InDirectory(const std::string& folder) {
    char here[4096];
    REQUIRE(::getcwd(here, sizeof here) != nullptr);
    previous = here;
    REQUIRE(::chdir(folder.c_str()) == 0);
  }
  ~InDirectory() { (void)::chdir(previous.c_str()); }
  std::string previous;
};

struct CountsShutdown {
  int* exceptions;
  int* teardowns;
  void on_exception(TrainerView&, torch::nn::Module&, const std::exception&) { ++*exceptions; }
  void teardown(TrainerView&, Stage) { ++*teardowns; }
};
}  // namespace

TEST_CASE("relative default_root_dir: preemption, \"hpc\", ModelCheckpoint and \"last\" find their files (probe regressions)",
          "[checkpoint][preemption][model_checkpoint]") {
  const std::string folder = scratch_folder("relative");
  InDirectory here(folder);
  const Run straight = train<FloatPrecision>(-1, "", "", -1);
  const Run stopped = train<FloatPrecision>(5, "", "", -1, 12, SIGTERM, "runs/a");
  CHECK(stopped.result.checkpoint_path == "runs/a/hpc_ckpt_1.ckpt");
  CHECK(fulgur::detail::path_exists(folder + "/runs/a/hpc_ckpt_1.ckpt"));
  require_same_training(straight, train<FloatPrecision>(-1, "", "hpc", -1, 12, 0, "runs/a"), 2);
  // ModelCheckpoint's default folder under a relative root, and "last" in a new Trainer, also with
  // an explicit dirpath (known before any fit) and in a logger's version folder.
  auto fit_with = [&](ModelCheckpointOptions options, bool logger, const std::string& resume, std::int64_t steps) {
    torch::manual_seed(2);
    ResumeNet net;
    auto [x, y] = test::classification_data(32, 3);
    data::TensorLoader loader(x, y, {.batch_size = 8});
    TrainerConfig config{.max_steps = steps, .default_root_dir = "runs/b", .enable_progress_bar = false};
    options.save_last = true;
    if (logger) {
      Trainer<CPU, Single, FloatPrecision, ModelCheckpoint, CSVLogger> trainer(config, ModelCheckpoint(options), CSVLogger());
      return trainer.fit(net, loader, FitOptions{.ckpt_path = resume}).global_step;
    }
    Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> trainer(config, ModelCheckpoint(options));
    return trainer.fit(net, loader, FitOptions{.ckpt_path = resume}).global_step;
  };
  CHECK(fit_with({}, false, "", 2) == 2);
  CHECK(fulgur::detail::path_exists(folder + "/runs/b/checkpoints/last.ckpt"));
  CHECK(fit_with({}, false, "last", 3) == 3);  // resumed at step 2: one more step
  CHECK(fit_with({.dirpath = folder + "/elsewhere"}, false, "", 2) == 2);
  CHECK(fit_with({.dirpath = folder + "/elsewhere"}, false, "last", 4) == 4);
  CHECK(fit_with({.dirpath = "relative_to_cwd"}, false, "", 2) == 2);
  CHECK(fulgur::detail::path_exists(folder + "/relative_to_cwd/last.ckpt"));  // Lightning: from the current directory
  // A relative ckpt_path opens the file where the callback's relative dirpath wrote it, from the current directory,
  // as Lightning does (the probe: it was looked for under runs/b/relative_to_cwd); one that is there only under
  // default_root_dir is still found there.
  const auto said_while = [](auto&& run) {
    std::ostringstream captured;
    std::streambuf* const original = std::cerr.rdbuf(captured.rdbuf());
    run();
    std::cerr.rdbuf(original);
    return captured.str();
  };
  CHECK_THAT(said_while([&] { CHECK(fit_with({.dirpath = "relative_to_cwd"}, false, "relative_to_cwd/last.ckpt", 3) == 3); }),
             Catch::Contains("restoring states from the checkpoint path at " + folder + "/relative_to_cwd/last.ckpt"));
  CHECK_THAT(said_while([&] { CHECK(fit_with({}, false, "checkpoints/last.ckpt", 4) == 4); }),
             Catch::Contains("restoring states from the checkpoint path at " + folder + "/runs/b/checkpoints/last.ckpt"));
  // In both places: the current directory's, said with the other's name; in neither: both named.
  fulgur::detail::make_directories(folder + "/checkpoints");
  std::ofstream(folder + "/checkpoints/last.ckpt", std::ios::binary)
      << std::ifstream(folder + "/runs/b/checkpoints/last.ckpt", std::ios::binary).rdbuf();
  const std::string both = said_while([&] { CHECK(fit_with({}, false, "checkpoints/last.ckpt", 5) == 5); });
  CHECK_THAT(both, Catch::Contains("restoring states from the checkpoint path at " + folder + "/checkpoints/last.ckpt") &&
                       Catch::Contains("fit(ckpt_path = \"checkpoints/last.ckpt\") names two files: " + folder +
                                       "/checkpoints/last.ckpt (from the current directory, which is loaded) and " +
                                       folder + "/runs/b/checkpoints/last.ckpt"));
  CHECK_THAT(test::message_of<CheckpointError>([&] { fit_with({}, false, "nowhere/last.ckpt", 5); }),
             Catch::Contains("fit(ckpt_path = \"nowhere/last.ckpt\"): no such checkpoint: looked at " + folder +
                             "/nowhere/last.ckpt (from the current directory) and " + folder +
                             "/runs/b/nowhere/last.ckpt (under TrainerConfig::default_root_dir)"));
  CHECK(fit_with({}, true, "", 2) == 2);
  CHECK(fulgur::detail::path_exists(folder + "/runs/b/lightning_logs/version_0/checkpoints/last.ckpt"));
  CHECK(fit_with({}, true, "last", 5) == 5);
}

TEST_CASE("preemption edge cases: the checkpoint cannot be written, hpc numbers, accumulation changed (probe regressions)",
          "[checkpoint][preemption][errors]") {
  const std::string folder = scratch_folder("preemption_edges");
  // The root is a file: the error says the run was preempted and the save failed, after the shutdown hooks.
  std::ofstream(folder + "/a_file") << "x";
  int exceptions = 0, teardowns = 0;
  {
    ResumeNet net;
    auto [x, y] = test::classification_data(32, 3);
    data::TensorLoader loader(x, y, {.batch_size = 8});
    Trainer<CPU, Single, FloatPrecision, SaveAtBatch, CountsShutdown> trainer(
        TrainerConfig{.max_steps = 4, .default_root_dir = folder + "/a_file/root", .enable_progress_bar = false,
                      .preemption = {.exit_process = false}},
        SaveAtBatch{2, "", SIGTERM}, CountsShutdown{&exceptions, &teardowns});
    const std::string message = test::message_of<CheckpointError>([&] { trainer.fit(net, loader); });
    CHECK_THAT(message, Catch::Contains("preempted by SIGTERM") && Catch::Contains("could not be written"));
  }
  CHECK(exceptions == 1);
  CHECK(teardowns == 1);
  // A signal in the run's last batch: nothing is left to save, fit completes normally.
  const Run finished = train<FloatPrecision>(24, "", "", -1, 12, SIGTERM, folder);
  CHECK_FALSE(finished.result.preempted);
  CHECK(finished.result.global_step == 12);
  CHECK_FALSE(fulgur::detail::path_exists(folder + "/hpc_ckpt_1.ckpt"));
  CHECK(std::any_of(finished.result.warnings.begin(), finished.result.warnings.end(),
                    [](const std::string& w) { return w.find("as training finished") != std::string::npos; }));
  // hpc numbers beyond nine digits.
  fulgur::detail::make_directories(folder + "/hpc");
  std::ofstream(folder + "/hpc/hpc_ckpt_999999999.ckpt") << "x";
  std::ofstream(folder + "/hpc/hpc_ckpt_1000000000.ckpt") << "x";
  CHECK(fulgur::detail::hpc_checkpoint(folder + "/hpc", false) == folder + "/hpc/hpc_ckpt_1000000000.ckpt");
  CHECK(fulgur::detail::hpc_checkpoint(folder + "/hpc", true) == folder + "/hpc/hpc_ckpt_1000000001.ckpt");
  // A checkpoint inside an accumulation window resumes only with the same window.
  train<FloatPrecision>(3, folder + "/window.ckpt", "", -1, 4);
  torch::manual_seed(1);
  ResumeNet net;
  auto [x, y] = test::classification_data(64, 3);
  data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 11});
  Trainer<CPU, Single, FloatPrecision> other(TrainerConfig{.max_steps = 6, .accumulate_grad_batches = 3,
                                                           .enable_progress_bar = false});
  CHECK_THAT(test::message_of<CheckpointError>([&] { other.fit(net, loader, FitOptions{.ckpt_path = folder + "/window.ckpt"}); }),
             Catch::Contains("inside a gradient-accumulation window (batch 1 of 2") &&
                 Catch::Contains("accumulate_grad_batches = 2"));
}

TEST_CASE("optimizer states of other parameters or another type: a CheckpointError before the first step (probe regression)",
          "[checkpoint][fabric][errors]") {
  Trainer<CPU, Single, FloatPrecision> trainer(TrainerConfig{.enable_progress_bar = false});
  test::Classifier a(8, 16, 3), b(4, 32, 5);  // as many tensors, other shapes
  torch::optim::Adam adam_a(a->parameters(), 1e-2), adam_b(b->parameters(), 1e-2);
  auto [x, y] = test::classification_data(8, 3);
  torch::nn::functional::cross_entropy(a->forward(x), y).backward();
  adam_a.step();
  const StateDict state = trainer.optimizer_state(adam_a);
  CHECK_THAT(test::message_of<CheckpointError>([&] { trainer.load_optimizer_state(adam_b, state); }),
             Catch::Contains("does not fit the optimizer's parameters") && Catch::Contains("parameter 0"));
  torch::optim::SGD sgd(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const std::string message = test::message_of<CheckpointError>([&] { trainer.load_optimizer_state(sgd, state); });
  CHECK_THAT(message, Catch::Contains("does not fit the optimizer"));
  CHECK_THAT(message, !Catch::Contains("report a bug"));
}

TEST_CASE("preemption: ckpt_path \"hpc\" without a checkpoint, and preemption off", "[checkpoint][preemption][errors]") {
  const std::string root = scratch_folder("no_hpc");
  CHECK_THROWS_WITH(train<FloatPrecision>(-1, "", "hpc", -1, 12, 0, root),
                    Catch::Contains("no HPC checkpoint was found") && Catch::Contains(root));
  // preemption.enabled = false leaves SIGTERM's action as it was during fit.
  struct Probe {
    sighandler_t* seen;
    void on_train_start(TrainerView&) {
      struct sigaction now {};
      sigaction(SIGTERM, nullptr, &now);
      *seen = now.sa_handler;
    }
  };
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);  // Catch2's own handler, or the default
  sighandler_t with = nullptr, without = nullptr;
  for (bool enabled : {true, false}) {
    ResumeNet net;
    auto [x, y] = test::classification_data(16, 3);
    data::TensorLoader loader(x, y, {.batch_size = 8});
    Trainer<CPU, Single, FloatPrecision, Probe> trainer(
        TrainerConfig{.max_steps = 1, .enable_progress_bar = false, .preemption = {.enabled = enabled}},
        Probe{enabled ? &with : &without});
    trainer.fit(net, loader);
  }
  CHECK(with != before.sa_handler);
  CHECK(without == before.sa_handler);
}

namespace {
/// The run of train(), logging to a CSV and a TensorBoard logger in root; returns the log directory.
std::string logged_run(const std::string& root, std::int64_t save_at, const std::string& resume_from) {
  torch::manual_seed(resume_from.empty() ? 7 : 99);
  ResumeNet net;
  auto [x, y] = test::classification_data(64, 3);
  auto [vx, vy] = test::classification_data(16, 4);
  data::TensorLoader train_data(x, y, {.batch_size = 8, .shuffle = true, .seed = 11});
  data::TensorLoader val_data(vx, vy, {.batch_size = 8});
  TrainerConfig config{.max_steps = 12, .accumulate_grad_batches = 2, .val_check_interval = 4, .log_every_n_steps = 1,
                       .default_root_dir = root, .enable_progress_bar = false};
  Trainer<CPU, Single, FloatPrecision, SaveAtBatch, CSVLogger, TensorBoardLogger> trainer(
      config, SaveAtBatch{save_at, root + "/at.ckpt"}, CSVLogger(), TensorBoardLogger());
  trainer.fit(net, train_data, val_data, FitOptions{.ckpt_path = resume_from});
  return trainer.callback<CSVLogger>().log_dir();
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}  // namespace

TEST_CASE("a resumed run's loggers write on in the checkpoint's version: one CSV and one TensorBoard history", "[checkpoint][loggers]") {
  const std::string straight_root = scratch_folder("logs_straight"), root = scratch_folder("logs_resumed");
  const std::string straight = logged_run(straight_root, -1, "");
  // The first run saves after batch 6 (logging step 3) and goes on to the end, logging past it; the
  // resumed run writes on in version_0 from step 3 and replaces what came after the checkpoint.
  const std::string first = logged_run(root, 6, "");
  const std::string resumed = logged_run(root, -1, root + "/at.ckpt");
  CHECK(resumed == first);
  CHECK(resumed == root + "/lightning_logs/version_0");
  CHECK_FALSE(fulgur::detail::path_exists(root + "/lightning_logs/version_1"));
  const std::string expected_csv = file_text(straight + "/metrics.csv");
  CHECK(expected_csv.size() > 100);
  CHECK(file_text(resumed + "/metrics.csv") == expected_csv);  // the same rows, values bit for bit
  const std::string command = std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR +
                              "/tests/loggers/compare_tensorboard.py " + straight + " " + resumed + " --purge-at 3";
  CHECK(std::system(command.c_str()) == 0);
  // A logger given its own version keeps it.
  torch::manual_seed(1);
  ResumeNet net;
  auto [x, y] = test::classification_data(16, 3);
  data::TensorLoader loader(x, y, {.batch_size = 8});
  Trainer<CPU, Single, FloatPrecision, CSVLogger> pinned(
      TrainerConfig{.max_steps = 1, .default_root_dir = root, .enable_progress_bar = false},
      CSVLogger(LoggerOptions{.version = std::int64_t{7}}));
  pinned.fit(net, loader);  // a fresh fit: version 7 as asked
  CHECK(pinned.callback<CSVLogger>().version() == "version_7");
}

namespace {
/// A user object with its own state (Lightning's _Stateful).
struct Counter {
  std::int64_t seen = 0;
  StateDict state_dict() const {
    StateDict s;
    s.insert("seen", seen);
    return s;
  }
  void load_state_dict(const StateDict& s) { seen = s.at("seen").toInt(); }
};

/// n steps of a hand-written loop on the Fabric-level verbs.
template <class T>
void hand_steps(T& trainer, test::Classifier& model, torch::optim::Optimizer& optimizer, std::int64_t& step,
                Counter& counter, int n) {
  auto [x, y] = test::classification_data(32, 5);
  for (int i = 0; i < n; ++i, ++step, ++counter.seen) {
    optimizer.zero_grad();
    const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x.narrow(0, (step % 4) * 8, 8)),
                                                                 y.narrow(0, (step % 4) * 8, 8));
    trainer.backward(loss);
    trainer.optimizer_step(optimizer);
  }
}
}  // namespace

TEST_CASE("Fabric-level save(path, state) and load(path, state): objects restored in place, the rest returned", "[checkpoint][fabric]") {
  const std::string root = scratch_folder("fabric");
  Trainer<CPU, Single, FloatPrecision> trainer(TrainerConfig{.default_root_dir = root, .enable_progress_bar = false});
  torch::manual_seed(3);
  test::Classifier model;
  torch::optim::Adam adam(model->parameters(), 1e-2);
  trainer.setup(model, adam);
  std::int64_t step = 0;
  double best = 0.25;
  std::string note = "warm-up done";
  Counter counter;
  StateDict extra;
  extra.insert("dataset", std::string("digits"));
  hand_steps(trainer, model, adam, step, counter, 3);
  trainer.save("run.ckpt", {{"model", model}, {"optimizer", adam}, {"step", step}, {"best", best}, {"note", note},
                            {"counter", counter}, {"extra", extra}});
  REQUIRE(::access((root + "/run.ckpt").c_str(), F_OK) == 0);
  hand_steps(trainer, model, adam, step, counter, 3);
  const std::vector<at::Tensor> straight = test::snapshot(*model);

  // Another process, as it were: fresh objects, put back in place, and the loop goes on.
  torch::manual_seed(4);
  test::Classifier restored;
  torch::optim::Adam restored_adam(restored->parameters(), 1e-2);
  trainer.setup(restored, restored_adam);
  std::int64_t restored_step = 0;
  double restored_best = 0.0;
  std::string restored_note;
  Counter restored_counter;
  const StateDict rest = trainer.load("run.ckpt", {{"model", restored}, {"optimizer", restored_adam},
                                                   {"step", restored_step}, {"best", restored_best},
                                                   {"note", restored_note}, {"counter", restored_counter}});
  CHECK(restored_step == 3);
  CHECK(restored_best == 0.25);
  CHECK(restored_note == "warm-up done");
  CHECK(restored_counter.seen == 3);
  REQUIRE(rest.size() == 1);  // what no object took comes back
  CHECK(StateDict(rest.at("extra").toGenericDict()).at("dataset").toStringRef() == "digits");
  hand_steps(trainer, restored, restored_adam, restored_step, restored_counter, 3);
  const std::vector<at::Tensor> resumed = test::snapshot(*restored);
  for (std::size_t i = 0; i < straight.size(); ++i) CHECK(test::identical(straight[i], resumed[i]));  // Adam's moments came back

  // strict: a name the file lacks is an error naming it and what the file holds; strict = false loads the rest.
  std::int64_t epoch = 0;
  CHECK_THROWS_WITH(trainer.load("run.ckpt", {{"step", restored_step}, {"epoch", epoch}}),
                    Catch::Contains("'epoch'") && Catch::Contains("'optimizer'") && Catch::Contains("strict = false"));
  restored_step = 0;
  CHECK(trainer.load("run.ckpt", {{"step", restored_step}, {"epoch", epoch}}, /*strict=*/false).size() == 6);
  CHECK(restored_step == 3);
  // A value of another type, and a module that does not fit: errors naming the entry.
  std::string wrong;
  CHECK_THROWS_WITH(trainer.load("run.ckpt", {{"step", wrong}}), Catch::Contains("'step'") && Catch::Contains("a string"));
  torch::nn::Linear other(3, 3);
  CHECK_THROWS_AS(trainer.load("run.ckpt", {{"model", other}}), CheckpointError);
  CHECK_THROWS_AS((CheckpointState{{"step", step}, {"step", restored_step}}), MisconfigurationError);
}

TEST_CASE("fit with max_steps mid-epoch, save_checkpoint after fit, resume to more steps: as one run", "[checkpoint][resume]") {
  const std::string folder = scratch_folder("after_fit");
  const Run straight = train<FloatPrecision>(-1, "", "", -1, 12);
  // The first run stops at step 5 (batch 10, mid-epoch 2) and saves after fit.
  torch::manual_seed(7);
  ResumeNet net;
  auto [x, y] = test::classification_data(64, 3);
  auto [vx, vy] = test::classification_data(16, 4);
  data::TensorLoader train_data(x, y, {.batch_size = 8, .shuffle = true, .seed = 11});
  data::TensorLoader val_data(vx, vy, {.batch_size = 8});
  std::map<std::pair<std::int64_t, std::string>, double> first_logged;
  TrainerConfig config{.max_steps = 5, .accumulate_grad_batches = 2, .val_check_interval = 4, .log_every_n_steps = 1,
                       .enable_progress_bar = false};
  Trainer<CPU, Single, FloatPrecision, SaveAtBatch, RecordingLogger, EarlyStopping> trainer(
      config, SaveAtBatch{}, RecordingLogger{&first_logged},
      EarlyStopping(EarlyStoppingOptions{.monitor = "val_loss", .patience = 100}));
  CHECK(trainer.fit(net, train_data, val_data).global_step == 5);
  trainer.save_checkpoint(folder + "/stopped.ckpt");
  const Run resumed = train<FloatPrecision>(-1, "", folder + "/stopped.ckpt", -1, 12);
  for (std::size_t i = 0; i < straight.weights.size(); ++i) CHECK(test::identical(straight.weights[i], resumed.weights[i]));
  CHECK(resumed.result.global_step == 12);
  // The epoch the stop cut short ends in the resumed run with the means of all its batches.
  CHECK(resumed.logged.at({7, "train_loss_epoch"}) == straight.logged.at({7, "train_loss_epoch"}));
}

TEST_CASE("a checkpoint has Lightning's keys and fulgur's stamp", "[checkpoint]") {
  const std::string folder = scratch_folder("keys");
  train<FP16MixedPrecision>(4, folder + "/k.ckpt", "", -1, 3);
  const StateDict c = checkpoint::load(folder + "/k.ckpt");
  for (const char* key : {"epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops", "callbacks",
                          "optimizer_states", "lr_schedulers", "MixedPrecision", "fulgur"})
    CHECK(c.contains(key));
  CHECK(c.at("global_step").toInt() == 2);
  const StateDict weights(c.at("state_dict").toGenericDict());
  CHECK(weights.contains("fc1.weight"));
  CHECK(StateDict(c.at("callbacks").toGenericDict()).contains("EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"));
  const StateDict scaler(c.at("MixedPrecision").toGenericDict());
  CHECK(scaler.contains("scale"));
  const StateDict stamp(c.at("fulgur").toGenericDict());
  CHECK(stamp.at("format_version").toInt() == checkpoint::format_version);
  CHECK(stamp.at("combination").toStringRef() == "cpu/single_device/16-mixed");
}

TEST_CASE("resuming refuses what cannot continue, naming it", "[checkpoint][errors]") {
  const std::string folder = scratch_folder("refusals");
  train<FloatPrecision>(4, folder + "/good.ckpt", "", -1, 3);
  auto resume = [&](const std::string& path) { return test::message_of<CheckpointError>([&] { train<FloatPrecision>(-1, "", path, -1, 4); }); };
  // A newer format.
  StateDict c = checkpoint::load(folder + "/good.ckpt");
  StateDict stamp(c.at("fulgur").toGenericDict());
  stamp.insert("format_version", checkpoint::format_version + 1);
  c.insert("fulgur", stamp.to_ivalue());
  checkpoint::save(folder + "/newer.ckpt", c);
  CHECK_THAT(resume(folder + "/newer.ckpt"), Catch::Contains("written by a newer fulgur: upgrade fulgur"));
  // Another model's weights.
  StateDict other = checkpoint::load(folder + "/good.ckpt");
  StateDict weights(other.at("state_dict").toGenericDict());
  weights.insert("fc1.weight", torch::zeros({4, 4}));
  weights.insert("extra.bias", torch::zeros({2}));
  other.insert("state_dict", weights.to_ivalue());
  checkpoint::save(folder + "/other.ckpt", other);
  const std::string mismatch = resume(folder + "/other.ckpt");
  CHECK_THAT(mismatch, Catch::Contains("does not fit the module"));
  CHECK_THAT(mismatch, Catch::Contains(folder + "/other.ckpt"));  // the file is named (probe finding)
  CHECK_THAT(mismatch, Catch::Contains("extra.bias"));
  CHECK_THAT(mismatch, Catch::Contains("size mismatch for fc1.weight"));
  // The new-user probe: it advised "pass strict = false", which fit has no way to take; it says what fit can do.
  CHECK_THAT(mismatch, !Catch::Contains("pass strict = false"));
  CHECK_THAT(mismatch, Catch::Contains("load_module_state_dict(module, fulgur::checkpoint::module_weights(") &&
                           Catch::Contains("and call fit without ckpt_path"));
  // Not fulgur's, not a checkpoint, absent, a folder.
  checkpoint::save(folder + "/plain.ckpt", weights);
  CHECK_THAT(resume(folder + "/plain.ckpt"), Catch::Contains("is not a fulgur training checkpoint"));
  std::ofstream(folder + "/text.ckpt") << "hello";
  CHECK_THAT(resume(folder + "/text.ckpt"), Catch::Contains("is not a checkpoint"));
  CHECK_THAT(resume(folder + "/absent.ckpt"), Catch::Contains("cannot open checkpoint"));
  CHECK_THAT(resume(folder), Catch::Contains("is a directory"));
}

TEST_CASE("weights-only checkpoints and save_checkpoint outside fit", "[checkpoint]") {
  const std::string folder = scratch_folder("weights_only");
  Trainer<CPU, Single, FloatPrecision> trainer(TrainerConfig{.enable_progress_bar = false});
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { trainer.save_checkpoint(folder + "/x.ckpt"); }),
             Catch::Contains("during or after trainer.fit"));
  test::Classifier net;
  auto [x, y] = test::classification_data(32);
  trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}));
  trainer.save_checkpoint(folder + "/w.ckpt", /*weights_only=*/true);
  const StateDict c = checkpoint::load(folder + "/w.ckpt");
  CHECK(c.contains("state_dict"));
  CHECK_FALSE(c.contains("optimizer_states"));
  test::Classifier other;
  checkpoint::load_module_state_dict(*other, checkpoint::module_weights(c));
  CHECK(torch::equal(other->fc1->weight, net->fc1->weight));
  Trainer<CPU, Single, FloatPrecision> again(TrainerConfig{.enable_progress_bar = false});
  CHECK_THAT(test::message_of<CheckpointError>([&] {
               again.fit(other, data::TensorLoader(x, y, {.batch_size = 8}), FitOptions{.ckpt_path = folder + "/w.ckpt"});
             }),
             Catch::Contains("holds weights only"));
}

TEST_CASE("Python's torch.load(weights_only=True) reads a fulgur checkpoint, fulgur reads torch.save's", "[checkpoint][python]") {
  const std::string folder = scratch_folder("python");
  train<FP16MixedPrecision>(4, folder + "/py.ckpt", "", -1, 3);
  const std::string script = std::string(FULGUR_SOURCE_DIR) + "/tests/checkpoint/python_roundtrip.py";
  const std::string command = std::string(FULGUR_TEST_PYTHON) + " " + script + " " + folder + "/py.ckpt " + folder + "/back.pt";
  REQUIRE(std::system(command.c_str()) == 0);
  const StateDict original = checkpoint::load(folder + "/py.ckpt");
  const StateDict back = checkpoint::load(folder + "/back.pt");  // Python's torch.save of what it read
  const StateDict a(original.at("state_dict").toGenericDict()), b(back.at("state_dict").toGenericDict());
  REQUIRE(a.size() == b.size());
  for (const auto& item : a) CHECK(test::identical(item.value().toTensor(), b.at(item.key().toStringRef()).toTensor()));
  CHECK(back.at("global_step").toInt() == original.at("global_step").toInt());
}

namespace {

/// Logs `score` once per epoch from a script of values (epoch e -> scores[e]).
struct ScoredNetImpl : test::ClassifierImpl {
  std::vector<double> scores;
  at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    ctx.log("score", scores.at(static_cast<std::size_t>(ctx.current_epoch)), {.on_step = false, .on_epoch = true});
    return test::ClassifierImpl::training_step(b, i);
  }
};
TORCH_MODULE(ScoredNet);

std::vector<std::string> files_in(const std::string& folder) {
  std::vector<std::string> names;
  if (DIR* dir = ::opendir(folder.c_str())) {
    while (const dirent* entry = ::readdir(dir))
      if (entry->d_name[0] != '.' || std::string(entry->d_name).find(".tmp") != std::string::npos)
        if (std::string(entry->d_name) != "." && std::string(entry->d_name) != "..") names.push_back(entry->d_name);
    ::closedir(dir);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("a max_steps stop inside an epoch, resumed: its end counts once, as in a run that never stopped (probe)",
          "[checkpoint][resume][early_stopping]") {
  // The stop runs the epoch's end (as Lightning): EarlyStopping checks the partial epoch (wait 1). The
  // checkpoint resumes inside that epoch, so its end runs again at the real end; the callbacks' states
  // in it are from before the stop's end, so that check is not counted twice (the resumed run stopped
  // an epoch early before).
  const std::string folder = scratch_folder("stop_epoch_end");
  auto [x, y] = test::classification_data(32);
  auto run = [&](TrainerConfig config, const std::string& resume, const std::string& save) {
    torch::manual_seed(7);
    ScoredNet net;
    net->scores = {5.0, 4.0, 4.5, 4.6, 4.7, 4.8};
    config.enable_progress_bar = false;
    Trainer<CPU, Single, FloatPrecision, EarlyStopping> trainer(config, EarlyStopping({.monitor = "score", .patience = 2}));
    const FitResult result = trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}), FitOptions{.ckpt_path = resume});
    if (!save.empty()) trainer.save_checkpoint(save);
    return std::pair{result, trainer.callback<EarlyStopping>().stopped_epoch()};
  };
  const auto straight = run({.max_epochs = 6}, "", "");
  REQUIRE(straight.first.global_step == 16);  // epochs 2 and 3 do not improve on 4.0
  const auto stopped = run({.max_epochs = 6, .max_steps = 10}, "", folder + "/stopped.ckpt");
  CHECK(stopped.first.global_step == 10);  // after batch 1 of epoch 2
  const auto resumed = run({.max_epochs = 6}, folder + "/stopped.ckpt", "");
  CHECK(resumed.first.global_step == straight.first.global_step);
  CHECK(resumed.second == straight.second);
  CHECK(resumed.first.stop_reason == straight.first.stop_reason);
}

TEST_CASE("ModelCheckpoint across max_steps stops and resumes: last.ckpt overwritten, one top-k file (probe 7)",
          "[checkpoint][resume][model_checkpoint]") {
  // A job trained in chunks (max_steps 2, 10, 14, then to the end, each resumed from "last"): the files
  // the stops' epoch ends wrote are in ModelCheckpoint's record, so the next chunk overwrites last.ckpt
  // (not last-v1.ckpt beside it) and keeps one top-k file; the other callbacks' states stay from before
  // the stops' ends (the test above).
  const std::string folder = scratch_folder("chunks");
  auto [x, y] = test::classification_data(32);  // 4 batches an epoch
  auto run = [&](TrainerConfig config, const std::string& resume) {
    torch::manual_seed(7);
    ScoredNet net;
    net->scores = {5.0, 3.0, 1.0, 4.0, 2.0};
    config.enable_progress_bar = false;
    Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> trainer(
        config, ModelCheckpoint({.dirpath = folder, .filename = "{epoch}-{score:.2f}", .monitor = "score",
                                 .save_top_k = 1, .save_last = true}));
    const FitResult result = trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}), FitOptions{.ckpt_path = resume});
    return std::pair{result.global_step, trainer.callback<ModelCheckpoint>().best_model_path()};
  };
  CHECK(run({.max_epochs = 5, .max_steps = 2}, "").first == 2);  // inside epoch 0: its first files
  CHECK(files_in(folder) == std::vector<std::string>{"epoch=0-score=5.00.ckpt", "last.ckpt"});
  CHECK(run({.max_epochs = 5, .max_steps = 10}, "last").first == 10);  // inside epoch 2
  CHECK(files_in(folder) == std::vector<std::string>{"epoch=2-score=1.00.ckpt", "last.ckpt"});
  CHECK(run({.max_epochs = 5, .max_steps = 14}, "last").first == 14);  // inside epoch 3
  CHECK(files_in(folder) == std::vector<std::string>{"epoch=2-score=1.00.ckpt", "last.ckpt"});
  CHECK(checkpoint::load(folder + "/last.ckpt").at("global_step").toInt() == 14);
  const auto [steps, best] = run({.max_epochs = 5}, "last");
  CHECK(steps == 20);
  CHECK(files_in(folder) == std::vector<std::string>{"epoch=2-score=1.00.ckpt", "last.ckpt"});
  CHECK(best == folder + "/epoch=2-score=1.00.ckpt");
  CHECK(checkpoint::load(folder + "/last.ckpt").at("global_step").toInt() == 20);
}

TEST_CASE("a resume at or past a smaller limit_train_batches ends that epoch and goes on (probe 7)", "[checkpoint][resume]") {
  const std::string folder = scratch_folder("resume_past_limit");
  auto [x, y] = test::classification_data(32);
  auto run = [&](TrainerConfig config, const std::string& resume, const std::string& save) {
    torch::manual_seed(7);
    test::Classifier net;
    config.enable_progress_bar = false;
    Trainer<CPU, Single, FloatPrecision> trainer(config);
    const FitResult result = trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 4}), FitOptions{.ckpt_path = resume});
    if (!save.empty()) trainer.save_checkpoint(save);
    return result;
  };
  CHECK(run({.max_epochs = 5, .max_steps = 3}, "", folder + "/at3.ckpt").global_step == 3);  // 8 batches an epoch
  for (const std::int64_t limit : {3, 2}) {  // the position, batch 3, is the new limit or past it
    const FitResult resumed = run({.max_epochs = 2, .limit_train_batches = limit}, folder + "/at3.ckpt", "");
    CHECK(resumed.global_step == 3 + limit);  // epoch 0 is over; epoch 1 trains `limit` batches
    REQUIRE(resumed.warnings.size() == 1);
    CHECK_THAT(resumed.warnings.front(),
               Catch::StartsWith("fulgur: the checkpoint continues epoch 0 at batch 3, but this run trains " +
                                 std::to_string(limit) + " batches an epoch (TrainerConfig::limit_train_batches): "
                                 "epoch 0 is over") &&
                   Catch::EndsWith("fit goes on with epoch 1."));
  }
}

TEST_CASE("ModelCheckpoint keeps the best save_top_k by its monitor, and last.ckpt", "[checkpoint][model_checkpoint]") {
  const std::string folder = scratch_folder("top_k");
  ScoredNet net;
  net->scores = {5.0, 3.0, 4.0, 1.0, 2.0};
  auto [x, y] = test::classification_data(32);
  Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> trainer(
      TrainerConfig{.max_epochs = 5, .enable_progress_bar = false},
      ModelCheckpoint({.dirpath = folder, .filename = "{epoch}-{score:.2f}", .monitor = "score", .save_top_k = 2,
                       .save_last = true}));
  trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}));
  const auto& mc = trainer.callback<ModelCheckpoint>();
  CHECK(files_in(folder) == std::vector<std::string>{"epoch=3-score=1.00.ckpt", "epoch=4-score=2.00.ckpt", "last.ckpt"});
  CHECK(mc.best_model_path() == folder + "/epoch=3-score=1.00.ckpt");
  CHECK(mc.best_model_score() == 1.0);
  CHECK(mc.best_k_models().size() == 2);
  // Each file is the state at its epoch's end: it resumes at the next epoch.
  CHECK(checkpoint::load(folder + "/epoch=3-score=1.00.ckpt").at("global_step").toInt() == 16);
  CHECK(checkpoint::load(folder + "/last.ckpt").at("global_step").toInt() == 20);
  const StateDict saved_state(StateDict(checkpoint::load(folder + "/last.ckpt").at("callbacks").toGenericDict())
                                  .at(mc.state_key()).toGenericDict());
  CHECK(saved_state.at("best_model_path").toStringRef() == mc.best_model_path());
}

TEST_CASE("ModelCheckpoint: every_n_train_steps without a monitor, top_k -1 and 0, version counter", "[checkpoint][model_checkpoint]") {
  const std::string folder = scratch_folder("every_n");
  auto [x, y] = test::classification_data(32);
  SECTION("every 2 steps, all kept") {
    test::Classifier net;
    Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> trainer(
        TrainerConfig{.max_epochs = 2, .enable_progress_bar = false},
        ModelCheckpoint({.dirpath = folder, .save_top_k = -1, .every_n_train_steps = 3}));
    trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}));
    CHECK(files_in(folder) == std::vector<std::string>{"epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt"});
    // A second run into the same folder does not overwrite: "-v1".
    test::Classifier again;
    Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> second(
        TrainerConfig{.max_epochs = 1, .enable_progress_bar = false},
        ModelCheckpoint({.dirpath = folder, .save_top_k = -1, .every_n_train_steps = 3}));
    second.fit(again, data::TensorLoader(x, y, {.batch_size = 8}));
    CHECK(files_in(folder) == std::vector<std::string>{"epoch=0-step=3-v1.ckpt", "epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt"});
  }
  SECTION("top_k 0 with save_last: last.ckpt only, weights only") {
    test::Classifier net;
    Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> trainer(
        TrainerConfig{.max_epochs = 2, .enable_progress_bar = false},
        ModelCheckpoint({.dirpath = folder, .save_top_k = 0, .save_last = true, .save_weights_only = true}));
    trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}));
    CHECK(files_in(folder) == std::vector<std::string>{"last.ckpt"});
    CHECK_FALSE(checkpoint::load(folder + "/last.ckpt").contains("optimizer_states"));
  }
  CHECK_THAT(test::message_of<MisconfigurationError>([] { ModelCheckpoint({.save_top_k = 3}); }),
             Catch::Contains("No quantity for top_k to track"));
  CHECK_THAT(test::message_of<MisconfigurationError>([] { ModelCheckpoint({.save_top_k = -2}); }),
             Catch::Contains("Must be >= -1"));
  CHECK_THAT(test::message_of<MisconfigurationError>([] { ModelCheckpoint({.every_n_train_steps = 2, .every_n_epochs = 1}); }),
             Catch::Contains("mutually exclusive"));
}

namespace {
/// The classifier, recording where its last training step was.
struct TrackedNetImpl : test::ClassifierImpl {
  std::int64_t last_epoch = -1, last_step = -1;
  at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    last_epoch = ctx.current_epoch;
    last_step = ctx.global_step;
    return test::ClassifierImpl::training_step(b, i);
  }
};
TORCH_MODULE(TrackedNet);
}  // namespace

TEST_CASE("ModelCheckpoint on a monitor nobody logs: Lightning's error once validation has run", "[checkpoint][model_checkpoint][errors]") {
  // Found by the new-user probe: a misspelt monitor printed a line per epoch, saved nothing, and fit succeeded.
  const std::string folder = scratch_folder("typo");
  auto [x, y] = test::classification_data(32);
  SECTION("with validation: a MisconfigurationError naming the key, the logged keys and ctx.log") {
    TrackedNet net;
    Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> trainer(
        TrainerConfig{.max_epochs = 3, .enable_progress_bar = false},
        ModelCheckpoint({.dirpath = folder, .monitor = "val_acc_typo"}));
    const std::string message = test::message_of<MisconfigurationError>([&] {
      trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}), data::TensorLoader(x, y, {.batch_size = 8}));
    });
    CHECK_THAT(message, Catch::Contains("`ModelCheckpoint(monitor='val_acc_typo')` could not find the monitored key in "
                                        "the returned metrics: ['train_loss', 'val_loss', 'epoch', 'step']"));
    CHECK_THAT(message, Catch::Contains("HINT: Did you call `ctx.log(\"val_acc_typo\", value)` in the module?"));
    CHECK(net->last_epoch == 0);  // at the first epoch's save, not after the run
    CHECK(files_in(folder).empty());
  }
  SECTION("before any validation (every_n_train_steps in the first epoch, or no validation at all): a warning, as Lightning") {
    test::Classifier net;
    Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> trainer(
        TrainerConfig{.max_epochs = 2, .enable_progress_bar = false},
        ModelCheckpoint({.dirpath = folder, .monitor = "val_acc_typo", .every_n_train_steps = 2}));
    const FitResult result = trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}));
    CHECK(result.global_step == 8);
    CHECK(files_in(folder).empty());
    // Once, and kept in FitResult::warnings (the new-user probe: it was printed only).
    REQUIRE(result.warnings.size() == 1);
    CHECK_THAT(result.warnings[0], Catch::Contains("could not find the monitored key"));
  }
  SECTION("the sanity check's validation does not count: the first real validation's save raises") {
    TrackedNet net;
    Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> trainer(
        TrainerConfig{.max_epochs = 2, .num_sanity_val_steps = 2, .enable_progress_bar = false},
        ModelCheckpoint({.dirpath = folder, .monitor = "val_acc_typo", .every_n_train_steps = 1}));
    const std::string message = test::message_of<MisconfigurationError>([&] {
      trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}), data::TensorLoader(x, y, {.batch_size = 8}));
    });
    CHECK_THAT(message, Catch::Contains("could not find the monitored key"));
    // Epoch 0's four saves warned; the first after epoch 0's validation (the fifth batch, global_step 4 in its
    // training_step) raised.
    CHECK(net->last_epoch == 1);
    CHECK(net->last_step == 4);
  }
  SECTION("'epoch' and 'step' are monitor candidates, as in Lightning") {
    test::Classifier net;
    Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> trainer(
        TrainerConfig{.max_epochs = 2, .enable_progress_bar = false},
        ModelCheckpoint({.dirpath = folder, .monitor = "step", .mode = MonitorMode::max}));
    trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}), data::TensorLoader(x, y, {.batch_size = 8}));
    CHECK(files_in(folder) == std::vector<std::string>{"epoch=1-step=8.ckpt"});
  }
}

TEST_CASE("fit(..., {.ckpt_path = \"last\"}) resumes from ModelCheckpoint's last.ckpt", "[checkpoint][model_checkpoint]") {
  const std::string folder = scratch_folder("last");
  auto [x, y] = test::classification_data(32);
  auto make = [&](std::int64_t epochs, const std::string& root) {
    return std::make_unique<Trainer<CPU, Single, FloatPrecision, ModelCheckpoint>>(
        TrainerConfig{.max_epochs = epochs, .default_root_dir = root, .enable_progress_bar = false},
        ModelCheckpoint({.save_top_k = 0, .save_last = true}));
  };
  torch::manual_seed(1);
  test::Classifier straight;
  make(3, folder + "/straight")->fit(straight, data::TensorLoader(x, y, {.batch_size = 8, .shuffle = true}));
  torch::manual_seed(1);
  test::Classifier first;
  make(2, folder)->fit(first, data::TensorLoader(x, y, {.batch_size = 8, .shuffle = true}));
  CHECK(files_in(folder + "/checkpoints") == std::vector<std::string>{"last.ckpt"});
  test::Classifier resumed;
  const FitResult result = make(3, folder)->fit(resumed, data::TensorLoader(x, y, {.batch_size = 8, .shuffle = true}),
                                        FitOptions{.ckpt_path = "last"});
  CHECK(result.global_step == 12);
  CHECK(result.epochs.size() == 1);  // only the third epoch ran
  for (std::size_t i = 0; i < 4; ++i) CHECK(torch::equal(test::snapshot(*straight)[i], test::snapshot(*resumed)[i]));
  CHECK(result.warnings.empty());
  // No last checkpoint anywhere: a fresh start, and the warning reaches FitResult::warnings (new-user probe).
  test::Classifier fresh;
  const FitResult afresh = make(1, folder + "/empty")->fit(fresh, data::TensorLoader(x, y, {.batch_size = 8}),
                                                        FitOptions{.ckpt_path = "last"});
  CHECK(afresh.global_step == 4);
  REQUIRE(afresh.warnings.size() == 1);
  CHECK_THAT(afresh.warnings[0], Catch::Contains("there is no last checkpoint available"));
}

namespace {
/// ScoredNet that predicts and counts its on_load_checkpoint calls.
struct EvaluatedNetImpl : ScoredNetImpl {
  int loads = 0;
  void on_load_checkpoint(const StateDict&) { ++loads; }
  at::Tensor predict_step(const data::Batch& b, std::int64_t) { return forward(b.input); }
};
TORCH_MODULE(EvaluatedNet);
struct TwoLoaderNetImpl : EvaluatedNetImpl {  // test() over several loaders
  at::Tensor test_step(const data::Batch& b, std::int64_t i, std::int64_t) { return test::ClassifierImpl::test_step(b, i); }
};
TORCH_MODULE(TwoLoaderNet);
struct CountsLoads {
  int* loads;
  void on_load_checkpoint(TrainerView&) { ++*loads; }
};
}  // namespace

TEST_CASE("validate/test/predict(ckpt_path): the weights of \"best\", \"last\" or a path, as Lightning's",
          "[checkpoint][evaluation]") {
  const std::string folder = scratch_folder("evaluate_ckpt");
  auto [x, y] = test::classification_data(32);
  auto [tx, ty] = test::classification_data(16, 5);
  data::TensorLoader test_data(tx, ty, {.batch_size = 8});
  int callback_loads = 0;
  Trainer<CPU, Single, FloatPrecision, ModelCheckpoint, CountsLoads> trainer(
      TrainerConfig{.max_epochs = 5, .default_root_dir = folder, .enable_progress_bar = false},
      ModelCheckpoint({.filename = "{epoch}-{score:.2f}", .monitor = "score", .save_top_k = 1, .save_last = true}),
      CountsLoads{&callback_loads});
  // Before any fit there is no best checkpoint (a command line's validate --ckpt_path=best).
  EvaluatedNet fresh;
  CHECK_THROWS_WITH(trainer.test(fresh, test_data, {.ckpt_path = "best"}),
                    Catch::Contains("test(ckpt_path = \"best\") is set but the ModelCheckpoint has saved no best "
                                    "checkpoint") && Catch::Contains("fit first"));
  EvaluatedNet net;
  net->scores = {5.0, 3.0, 4.0, 1.0, 2.0};
  trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}));
  const std::string best = folder + "/checkpoints/epoch=3-score=1.00.ckpt";
  REQUIRE(trainer.callback<ModelCheckpoint>().best_model_path() == best);

  // What each file's weights give, loaded by hand.
  auto by_hand = [&](const std::string& path) {
    EvaluatedNet loaded;
    checkpoint::load_module_state_dict(*loaded, checkpoint::module_weights(checkpoint::load(path)));
    Trainer<CPU, Single, FloatPrecision> plain(TrainerConfig{.enable_progress_bar = false});
    return std::pair{plain.test(loaded, test_data).metrics.at("test_loss"),
                     plain.predict(loaded, test_data)};
  };
  const auto [best_loss, best_predictions] = by_hand(best);
  const auto [last_loss, last_predictions] = by_hand(folder + "/checkpoints/last.ckpt");
  const double own_loss = trainer.test(fresh, test_data).metrics.at("test_loss");
  REQUIRE(best_loss != last_loss);
  REQUIRE(best_loss != own_loss);

  const EvaluationResult tested = trainer.test(fresh, test_data, {.ckpt_path = "best"});
  CHECK(tested.metrics.at("test_loss") == best_loss);
  CHECK(tested.warnings.empty());
  CHECK(fresh->loads == 1);      // the module's on_load_checkpoint, as Lightning's restore_model
  CHECK(callback_loads == 0);    // callbacks' states are restored by fit only
  EvaluatedNet other;
  CHECK(trainer.validate(other, test_data, {.ckpt_path = "last"}).metrics.at("val_loss") == last_loss);
  EvaluatedNet relative;  // a relative path is under default_root_dir
  CHECK(trainer.test(relative, test_data, {.ckpt_path = "checkpoints/epoch=3-score=1.00.ckpt"}).metrics.at("test_loss") ==
        best_loss);
  EvaluatedNet predicting;
  const auto predictions = trainer.predict(predicting, test_data, {.ckpt_path = "best"});
  REQUIRE(predictions.size() == best_predictions.size());
  for (std::size_t i = 0; i < predictions.size(); ++i) CHECK(torch::equal(predictions[i], best_predictions[i]));

  // "last" with no last checkpoint: Lightning's warning, and the module's own weights.
  Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> elsewhere(
      TrainerConfig{.default_root_dir = folder + "/elsewhere", .enable_progress_bar = false},
      ModelCheckpoint(ModelCheckpointOptions{}));
  EvaluatedNet unloaded;
  const EvaluationResult own = elsewhere.test(unloaded, test_data, {.ckpt_path = "last"});
  CHECK(own.metrics.at("test_loss") == trainer.test(unloaded, test_data).metrics.at("test_loss"));
  CHECK(unloaded->loads == 0);
  REQUIRE(own.warnings.size() == 1);
  CHECK_THAT(own.warnings[0], Catch::Contains("test(ckpt_path = \"last\") is set, but there is no last checkpoint") &&
                                  Catch::Contains("test uses the module's own weights"));
  TwoLoaderNet two;  // several loaders: each result says it
  const std::vector<EvaluationResult> both = elsewhere.test(two, data::loaders(test_data, test_data), {.ckpt_path = "last"});
  REQUIRE(both.size() == 2);
  for (const EvaluationResult& each : both) {
    REQUIRE(each.warnings.size() == 1);
    CHECK_THAT(each.warnings[0], Catch::Contains("test(ckpt_path = \"last\") is set, but there is no last checkpoint"));
  }

  // What cannot work says what and where.
  Trainer<CPU, Single, FloatPrecision> without(TrainerConfig{.enable_progress_bar = false});
  CHECK_THROWS_WITH(without.validate(unloaded, test_data, {.ckpt_path = "best"}),
                    Catch::Contains("validate(ckpt_path = \"best\") is set but no ModelCheckpoint is configured"));
  test::Classifier wider(8, 32);
  CHECK_THROWS_AS(trainer.test(wider, test_data, {.ckpt_path = best}), CheckpointError);
  CHECK_THROWS_WITH(trainer.test(wider, test_data, {.ckpt_path = best}),
                    Catch::Contains("test(ckpt_path = '" + best + "'): the state_dict does not fit the module") &&
                        Catch::Contains("size mismatch for fc1.weight"));
  EvaluatedNet extra;  // a parameter the checkpoint lacks: the weights that match can be loaded by hand
  extra->register_parameter("extra", torch::zeros({1}));
  CHECK_THROWS_WITH(trainer.validate(extra, test_data, {.ckpt_path = best}),
                    Catch::Contains("validate(ckpt_path = '" + best + "')") && Catch::Contains("extra") &&
                        Catch::Contains("To validate on the weights that match, load them into the module first") &&
                        !Catch::Contains("pass strict = false"));
  StateDict not_weights;
  not_weights.insert("epoch", 1);
  without.save(folder + "/not_weights.ckpt", not_weights);
  CHECK_THROWS_WITH(without.predict(unloaded, test_data, {.ckpt_path = folder + "/not_weights.ckpt"}),
                    Catch::Contains("holds no 'state_dict'"));
  CHECK_THROWS_WITH(without.test(unloaded, test_data, {.ckpt_path = "hpc"}),
                    Catch::Contains("`test(..., {.ckpt_path = \"hpc\"})` is set but no HPC checkpoint was found"));
}

TEST_CASE("fit(..., {.ckpt_path = \"best\"}) continues from the best checkpoint, as Lightning's", "[checkpoint][model_checkpoint]") {
  const std::string folder = scratch_folder("fit_best");
  auto [x, y] = test::classification_data(32);
  ScoredNet net;
  net->scores = {5.0, 3.0, 4.0, 1.0, 2.0, 0.0};
  Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> trainer(
      TrainerConfig{.max_epochs = 5, .default_root_dir = folder, .enable_progress_bar = false},
      ModelCheckpoint({.monitor = "score"}));
  trainer.fit(net, data::TensorLoader(x, y, {.batch_size = 8}));
  ScoredNet again;
  again->scores = net->scores;
  Trainer<CPU, Single, FloatPrecision, ModelCheckpoint> more(
      TrainerConfig{.max_epochs = 6, .default_root_dir = folder, .enable_progress_bar = false},
      ModelCheckpoint({.monitor = "score"}));
  CHECK_THROWS_WITH(more.fit(again, data::TensorLoader(x, y, {.batch_size = 8}), FitOptions{.ckpt_path = "best"}),
                    Catch::Contains("fit(ckpt_path = \"best\") is set but the ModelCheckpoint has saved no best checkpoint"));
  // The same Trainer: its ModelCheckpoint's best (epoch 3, global step 16) is where the run goes on.
  const FitResult result = trainer.fit(again, data::TensorLoader(x, y, {.batch_size = 8}), FitOptions{.ckpt_path = "best"});
  CHECK(result.epochs.size() == 1);  // epoch 4 only, up to max_epochs 5
  CHECK(result.global_step == 20);
}
