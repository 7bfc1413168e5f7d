// fulgur::MLFlowLogger without LibTorch: its settings, the names and values it sends, a server that
// never answers, the buffer's bound, and (hidden, [.scenario]) the runs tests/loggers/check_mlflow.py
// logs against a real `mlflow server` or a file store and then reads back with MLflow's MlflowClient.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "fulgur/errors.hpp"
#include "fulgur/loggers/mlflow_logger.hpp"
#include "src/loggers/mlflow/json.hpp"
#include "src/loggers/mlflow/sender.hpp"
#include "src/loggers/mlflow/store.hpp"

using namespace fulgur;
namespace fs = std::filesystem;

namespace {

/// This process's scratch folders, under one root removed when the process exits.
const fs::path& scratch_root() {
  static const struct Root {
    fs::path path = fs::temp_directory_path() / ("fulgur_mlflow_tests_" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } root;
  return root.path;
}

fs::path scratch(const std::string& name) {
  const fs::path dir = scratch_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// A loopback port nothing listens on (bound, then let go).
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t size = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  ::close(fd);
  return ntohs(address.sin_port);
}

std::size_t count_containing(const std::vector<std::string>& texts, const std::string& part) {
  std::size_t n = 0;
  for (const auto& text : texts) n += text.find(part) != std::string::npos;
  return n;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

/// A server that times out every log-batch over `limit` metric values (a busy sqlite-backed server
/// that takes longer than request_timeout over a big batch), and takes every smaller one.
class SlowOverLimitStore final : public loggers::mlflow::Store {
 public:
  explicit SlowOverLimitStore(std::vector<std::size_t> limits) : limits_(std::move(limits)) {}
  std::vector<std::size_t> sizes;   // of each log-batch tried, in order
  std::vector<std::int64_t> steps;  // of each metric value taken, in order

  std::string describe() const override { return "the fake server"; }
  bool local() const override { return false; }
  loggers::mlflow::Result start_run(const loggers::mlflow::RunRequest&, loggers::mlflow::RunInfo& out) override {
    out.run_id = "run";
    return loggers::mlflow::Result::ok();
  }
  loggers::mlflow::Result log_batch(const loggers::mlflow::RunInfo&, const std::vector<loggers::mlflow::MetricRecord>& metrics,
                                    const std::vector<loggers::mlflow::KeyValue>&,
                                    const std::vector<loggers::mlflow::KeyValue>&) override {
    sizes.push_back(metrics.size());
    const std::size_t limit = limits_[std::min(taken_, limits_.size() - 1)];  // limits_[i] for the i-th batch taken
    if (metrics.size() > limit)
      return {loggers::mlflow::Outcome::retry, "runs/log-batch: Operation timed out after 1000 milliseconds", true};
    ++taken_;
    for (const auto& m : metrics) steps.push_back(m.step);
    return loggers::mlflow::Result::ok();
  }
  loggers::mlflow::Result end_run(const loggers::mlflow::RunInfo&, std::string_view, std::int64_t) override {
    return loggers::mlflow::Result::ok();
  }
  loggers::mlflow::Result log_artifact(const loggers::mlflow::RunInfo&, const std::string&, const std::string&,
                                       const std::string&) override {
    return loggers::mlflow::Result::ok();
  }

 private:
  std::vector<std::size_t> limits_;
  std::size_t taken_ = 0;
};

/// What a sender did with `count` values queued at once, then finished (its thread has ended).
struct SentThrough {
  std::vector<std::size_t> sizes;
  std::vector<std::int64_t> steps;
  std::vector<std::string> warnings;
  std::size_t unsent = 0;
};

SentThrough send_through(std::vector<std::size_t> limits, std::int64_t count) {
  auto store = std::make_unique<SlowOverLimitStore>(std::move(limits));
  const SlowOverLimitStore& seen = *store;
  loggers::mlflow::Sender sender(std::move(store), loggers::mlflow::RunRequest{}, loggers::mlflow::SenderSettings{});
  std::vector<loggers::mlflow::MetricRecord> values;
  for (std::int64_t step = 0; step < count; ++step) values.push_back({"loss", 1.0, 0, step});
  sender.add_metrics(std::move(values));
  sender.finish("FINISHED", std::chrono::seconds(30));
  return {seen.sizes, seen.steps, sender.take_warnings(), sender.unsent()};
}

std::vector<std::int64_t> steps_up_to(std::int64_t count) {
  std::vector<std::int64_t> steps(static_cast<std::size_t>(count));
  std::iota(steps.begin(), steps.end(), 0);
  return steps;
}

}  // namespace

TEST_CASE("python_float prints a float as Python's str() does", "[mlflow]") {
  using loggers::mlflow::python_float;
  CHECK(python_float(0.1) == "0.1");
  CHECK(python_float(1e-05) == "1e-05");
  CHECK(python_float(0.0001) == "0.0001");
  CHECK(python_float(3.0) == "3.0");
  CHECK(python_float(-0.0) == "-0.0");
  CHECK(python_float(1e16) == "1e+16");
  CHECK(python_float(1e15) == "1000000000000000.0");
  CHECK(python_float(123456.789) == "123456.789");
  CHECK(python_float(1.0 / 3) == "0.3333333333333333");
  CHECK(python_float(2.5e-300) == "2.5e-300");
  CHECK(python_float(std::nan("")) == "nan");
  CHECK(python_float(-HUGE_VAL) == "-inf");
}

TEST_CASE("valid_key follows MLflow's rule for names", "[mlflow]") {
  using loggers::mlflow::valid_key;
  CHECK(valid_key("train_loss"));
  CHECK(valid_key("val/acc 1:top-5.x"));
  CHECK_FALSE(valid_key(""));
  CHECK_FALSE(valid_key("a//b"));
  CHECK_FALSE(valid_key("/a"));
  CHECK_FALSE(valid_key("a/"));
  CHECK_FALSE(valid_key("../a"));
  CHECK_FALSE(valid_key("a/./b"));
  CHECK_FALSE(valid_key("acc@1"));
  CHECK_FALSE(valid_key(std::string(251, 'a')));
}

TEST_CASE("the JSON reader finds MLflow's answers' fields", "[mlflow]") {
  using namespace loggers::mlflow;
  const auto json = parse_json(R"({"run": {"info": {"run_id": "ab\u00e9\"c", "n": [1, 2.5e3, true, null]}}})");
  REQUIRE(json);
  CHECK(json->string_at("run.info.run_id") == "ab\xC3\xA9\"c");
  CHECK(json->find("run.info.n")->items.size() == 4);
  CHECK_FALSE(parse_json("{\"a\": }"));
  CHECK(json_string("a\"b\n") == "\"a\\\"b\\n\"");
  CHECK(json_number(std::nan("")) == "\"NaN\"");
  CHECK(json_number(0.1) == "0.1");
}

TEST_CASE("a malformed tracking URI or an unwritable file store is refused at set-up, naming it", "[mlflow]") {
  const fs::path dir = scratch("misconfigured");
  std::ofstream(dir / "a_file") << "x";
  const std::vector<std::string> bad = {"htp://x", "http://", "https:///path", "databricks://profile", "sqlite:///m.db",
                                        "file:" + (dir / "a_file" / "mlruns").string(),
                                        "file://otherhost/mlruns", "http://:5000"};
  for (const std::string& uri : bad) {
    MLFlowLogger logger({.tracking_uri = uri});
    try {
      logger.set_up({.root_dir = dir.string(), .global_rank = 0});
      FAIL("accepted " << uri);
    } catch (const MisconfigurationError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("'" + uri) != std::string::npos);
    }
  }
  // A server's host:port without its scheme is neither taken for a scheme nor for a folder (probe finding).
  for (const std::string uri : {"127.0.0.1:5077", "localhost:5077", "mlflow.internal:443/api"}) {
    MLFlowLogger logger({.tracking_uri = uri});
    CHECK_THROWS_WITH(logger.set_up({.root_dir = dir.string(), .global_rank = 0}),
                      Catch::Contains("did you mean http://" + uri));
  }
  MLFlowLogger tags({.tracking_uri = "file:" + (dir / "ok").string(), .tags = {{"bad key!", "v"}}});
  CHECK_THROWS_WITH(tags.set_up({.root_dir = dir.string()}), Catch::Contains("'bad key!'"));
  MLFlowLogger zero({.tracking_uri = "file:" + (dir / "ok").string(), .max_buffered_values = 0});
  CHECK_THROWS_AS(zero.set_up({.root_dir = dir.string()}), MisconfigurationError);
}

TEST_CASE("a log-batch too big for a slow server is halved until it passes, and a bigger one is tried again later, quietly", "[mlflow]") {
  SECTION("the server stays slow over 300 values") {
    // 1000 and 500 time out (one outage, said once), then 250s pass; after 16 a 500 is tried, times out and
    // goes back to 250 unsaid; the next trial would wait for 32 passes, more than are left.
    const SentThrough sent = send_through({300}, 10'000);
    INFO(Catch::Detail::stringify(sent.sizes));
    CHECK(sent.steps == steps_up_to(10'000));  // each value once, in order: nothing lost
    CHECK(sent.unsent == 0);
    CHECK(count_containing(sent.warnings, "does not answer (runs/log-batch: Operation timed out") == 1);
    CHECK(sent.warnings.size() == 1);
    REQUIRE(sent.sizes.size() > 18);
    CHECK(std::vector<std::size_t>(sent.sizes.begin(), sent.sizes.begin() + 3) == std::vector<std::size_t>{1000, 500, 250});
    CHECK(sent.sizes[2 + 16] == 500);
    CHECK(std::count(sent.sizes.begin(), sent.sizes.end(), 500) == 2);  // the first halving, and one trial
    CHECK(std::count(sent.sizes.begin(), sent.sizes.end(), 1000) == 1);
  }
  SECTION("the server is quick again: the batches grow back to MLflow's 1000") {
    std::vector<std::size_t> limits(16, 300);  // the 16 batches after the slow spell still take at most 300
    limits.push_back(1000);
    const SentThrough sent = send_through(limits, 20'000);
    INFO(Catch::Detail::stringify(sent.sizes));
    CHECK(sent.steps == steps_up_to(20'000));
    CHECK(sent.warnings.size() == 1);
    CHECK(std::count(sent.sizes.begin() + 3, sent.sizes.end(), 1000) >= 5);  // 250s, 500s, then 1000s
  }
}

TEST_CASE("a server that never answers: one outage warning, training goes on, finalize waits a bounded time and says what is lost", "[mlflow]") {
  const std::string uri = "http://127.0.0.1:" + std::to_string(closed_port());
  MLFlowLogger logger({.tracking_uri = uri,
                       .max_buffered_values = 10,
                       .request_timeout = std::chrono::milliseconds(500),
                       .max_retry_interval = std::chrono::milliseconds(200),
                       .finalize_timeout = std::chrono::milliseconds(1500)});
  const auto began = std::chrono::steady_clock::now();
  logger.set_up({.root_dir = scratch("never").string(), .global_rank = 0});
  logger.log_hyperparams({{"lr", 0.1}});
  for (std::int64_t step = 0; step < 25; ++step) logger.log_metrics({{"loss", 1.0 / double(step + 1)}}, step);
  const auto logged = std::chrono::steady_clock::now();
  CHECK(logged - began < std::chrono::seconds(2));  // nothing on the training thread waits for the network
  CHECK(logger.version().empty());
  CHECK(logger.dropped_values() == 15);  // the bound: the 10 newest wait
  logger.finalize("success");
  CHECK(std::chrono::steady_clock::now() - logged < std::chrono::seconds(4));
  const std::vector<std::string> warnings = logger.take_warnings();
  INFO(Catch::Detail::stringify(warnings));
  CHECK(count_containing(warnings, "does not answer") == 1);
  CHECK(count_containing(warnings, uri) == 2);
  CHECK(count_containing(warnings, "10 metric values, 1 params and 0 artifacts were not sent") == 1);
  CHECK(count_containing(warnings, "15 more were dropped") == 1);
  CHECK(warnings.size() == 2);
  CHECK(logger.take_warnings().empty());  // taken once
}

TEST_CASE("metric names are cleaned as Lightning cleans them, once said per name", "[mlflow]") {
  const fs::path dir = scratch("names");
  MLFlowLogger logger({.tracking_uri = "file:" + (dir / "mlruns").string(), .prefix = "fit"});
  logger.set_up({.root_dir = dir.string()});
  logger.log_metrics({{"acc@1", 0.5}, {"loss", 1.0}}, 0);
  logger.log_metrics({{"acc@1", 0.6}}, 1);
  logger.finalize("success");
  const auto warnings = logger.take_warnings();
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("Replacing fit-acc@1 with fit-acc1."));
  const fs::path run = fs::path(logger.log_dir());
  CHECK(run.parent_path().parent_path() == dir / "mlruns");
  std::ifstream lines(run / "metrics" / "fit-acc1");
  std::string first, second;
  std::getline(lines, first), std::getline(lines, second);
  CHECK(first.substr(first.find(' ')) == " 0.5 0");
  CHECK(second.substr(second.find(' ')) == " 0.6 1");
}

TEST_CASE("only global rank 0 logs", "[mlflow]") {
  const fs::path dir = scratch("rank1");
  MLFlowLogger logger({.tracking_uri = "file:" + (dir / "mlruns").string()});
  logger.set_up({.root_dir = dir.string(), .global_rank = 1});
  logger.log_metrics({{"loss", 1.0}}, 0);
  logger.finalize("success");
  CHECK_FALSE(fs::exists(dir / "mlruns"));
  CHECK(logger.version().empty());
}

// ---- the runs check_mlflow.py reads back with MlflowClient ---------------------------------------

TEST_CASE("scenario: a run with params, tags, metrics and a checkpoint", "[.scenario]") {
  const std::string uri = env_or("FULGUR_MLFLOW_URI", "");
  const fs::path out = env_or("FULGUR_MLFLOW_OUT", "mlflow_scenario");
  const std::string mode = env_or("FULGUR_MLFLOW_MODE", "run");
  const int steps = std::stoi(env_or("FULGUR_MLFLOW_STEPS", "1200"));
  const int sleep_ms = std::stoi(env_or("FULGUR_MLFLOW_SLEEP_MS", "0"));
  REQUIRE(!uri.empty());
  fs::create_directories(out / "checkpoints");
  MLFlowOptions options{.experiment_name = "fulgur-" + mode,
                        .run_name = "run-" + mode,
                        .tracking_uri = uri,
                        .tags = {{"team", "fulgur"}, {"mlflow.runName", "replaced"}},
                        .log_model = MLFlowLogModel::at_end,
                        .checkpoint_dirs = {(out / "checkpoints").string()},
                        // a cold server on a busy machine is slow; server_slow times a request out on purpose
                        .request_timeout = std::chrono::milliseconds(std::stoi(env_or("FULGUR_MLFLOW_TIMEOUT_MS", "15000"))),
                        .max_retry_interval = std::chrono::milliseconds(500),
                        .finalize_timeout = std::chrono::seconds(40)};
  MLFlowLogger logger(options);
  logger.set_up({.root_dir = out.string(), .global_rank = 0});
  logger.log_hyperparams({{"lr", 0.001}, {"batch_size", std::int64_t{32}}, {"nesterov", true}, {"name", std::string("mlp")},
                          {"long", std::string(300, 'x')}, {"tiny", 1e-05}, {"model/hidden", std::int64_t{128}}});
  for (int step = 0; step < steps; ++step) {
    logger.log_metrics({{"train_loss", 1.0 / (step + 1)}, {"lr-SGD", 0.1 * step}, {"val/acc@1", step * 0.5}}, step);
    logger.save();
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
  std::ofstream(out / "checkpoints" / "epoch=0-step=10.ckpt") << "fulgur-checkpoint";
  std::ofstream(out / "checkpoints" / "last.ckpt") << "fulgur-last";
  logger.after_save_checkpoint({{(out / "checkpoints" / "epoch=0-step=10.ckpt").string(), 0.25, true}});
  logger.finalize(env_or("FULGUR_MLFLOW_STATUS", "success"));
  std::ofstream report(out / "report.txt");
  report << "run_id=" << logger.version() << "\nexperiment_id=" << logger.experiment_id() << "\nlog_dir=" << logger.log_dir()
         << "\nunsent=" << logger.unsent_values() << "\ndropped=" << logger.dropped_values() << "\n";
  for (const std::string& warning : logger.take_warnings()) report << "warning=" << warning << "\n";
  CHECK(!logger.version().empty());
}
