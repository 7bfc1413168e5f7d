// fulgur::lr_find, the learning-rate finder (issue 34, "Tuning and fine-tuning"). Lightning's own
// code gives the expected values at test time (tests/unit/lr_finder_reference.py): the schedule
// (_ExponentialLR / _LinearLR), the smoothing and early stop (_LRCallback), the suggestion
// (_LRFinder.suggestion). The multi-rank cases re-run this binary under fulgur's launcher.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <unistd.h>

#include "fulgur/tuner/lr_finder.hpp"
#include "unit/support.hpp"

using namespace fulgur;

namespace {

struct Reference {
  std::vector<double> schedule, smoothed;
  std::optional<std::int64_t> stop, index;
  std::optional<double> suggestion;
  std::vector<double> run_lrs, run_losses;  // Lightning's own search on the same problem
  std::optional<double> run_suggestion;
};

std::vector<double> numbers(std::istringstream& in) {
  std::vector<double> out;
  std::string value;
  while (in >> value) out.push_back(std::strtod(value.c_str(), nullptr));
  return out;
}

std::string repr(double x) {
  std::ostringstream out;
  out << std::setprecision(17) << x;
  return out.str();
}
std::string join(const std::vector<double>& values) {
  std::string out;
  for (double v : values) out += " " + repr(v);
  return out;
}

/// One case for Lightning: options, optionally a run's raw losses, a recorded sequence and skips.
struct Case {
  std::string name;
  LRFindOptions options;
  std::vector<double> raw{};
  const LRFinderResult* recorded = nullptr;
  std::optional<std::pair<int, int>> skip{};
  std::string run{};  // a problem file: Lightning's whole Tuner.lr_find on it too
};

/// Lightning's answers for all the cases, from one Python start (importing Lightning is slow).
std::map<std::string, Reference> lightning(const std::vector<Case>& cases) {
  const std::string folder = test::scratch_folder("lr_finder_reference");
  const std::string in_path = folder + "/in.txt", out_path = folder + "/out.txt";
  {
    std::ofstream in(in_path);
    for (const Case& c : cases) {
      const LRFindOptions& o = c.options;
      in << "case " << c.name << "\nmode " << (o.mode == LRFindMode::linear ? "linear" : "exponential") << "\nmin_lr "
         << repr(o.min_lr) << "\nmax_lr " << repr(o.max_lr) << "\nnum_training " << o.num_training << "\nthreshold "
         << (o.early_stop_threshold ? repr(*o.early_stop_threshold) : "None") << "\n";
      if (!c.raw.empty()) in << "raw" << join(c.raw) << "\n";
      if (c.recorded) in << "lrs" << join(c.recorded->lrs) << "\nlosses" << join(c.recorded->losses) << "\n";
      if (c.skip) in << "skip " << c.skip->first << " " << c.skip->second << "\n";
      if (!c.run.empty()) in << "run " << c.run << "\n";
    }
  }
  const std::string line = std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR +
                           "/tests/unit/lr_finder_reference.py " + in_path + " " + out_path + " 2>/dev/null";
  if (std::system(line.c_str()) != 0) throw std::runtime_error("the Python reference failed: " + line);
  std::map<std::string, Reference> refs;
  std::ifstream out(out_path);
  std::string text;
  while (std::getline(out, text)) {
    std::istringstream fields(text);
    std::string name, key, value;
    fields >> name >> key;
    Reference& ref = refs[name];
    if (key == "schedule") ref.schedule = numbers(fields);
    else if (key == "smoothed") ref.smoothed = numbers(fields);
    else if (key == "stop" && fields >> value && value != "None") ref.stop = std::stoll(value);
    else if (key == "index" && fields >> value && value != "None") ref.index = std::stoll(value);
    else if (key == "suggestion" && fields >> value && value != "None") ref.suggestion = std::strtod(value.c_str(), nullptr);
    else if (key == "run_lrs") ref.run_lrs = numbers(fields);
    else if (key == "run_losses") ref.run_losses = numbers(fields);
    else if (key == "run_suggestion" && fields >> value && value != "None") ref.run_suggestion = std::strtod(value.c_str(), nullptr);
  }
  if (refs.size() != cases.size()) throw std::runtime_error("the Python reference did not answer every case: " + line);
  return refs;
}

/// Linear regression on a fixed problem; SGD with two parameter groups (weight, bias), and the
/// learning rates each group had at each step (read through the optimizer it made).
struct RegressionImpl : torch::nn::Module {
  RegressionImpl() : fc(register_module("fc", torch::nn::Linear(4, 1))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    if (optimizer)
      for (auto& group : optimizer->param_groups()) seen_lrs.push_back(group.options().get_lr());
    auto out = fc(b.input);
    if (dropout > 0) out = torch::dropout(out, dropout, is_training());
    auto loss = torch::mse_loss(out, b.target);
    ctx.log("train_loss", loss.detach(), {.prog_bar = true});  // as most modules do: lr_find accepts it
    return loss;
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{fc->weight});
    groups.emplace_back(std::vector<at::Tensor>{fc->bias}, std::make_unique<torch::optim::SGDOptions>(0.5));
    auto made = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(lr).momentum(0.9));
    optimizer = made.get();
    return made;
  }
  torch::nn::Linear fc;
  double lr = 0.01;
  double dropout = 0.0;
  torch::optim::Optimizer* optimizer = nullptr;  // the last one made (the test reads its groups)
  std::vector<double> seen_lrs;
};
TORCH_MODULE(Regression);

std::pair<at::Tensor, at::Tensor> regression_tensors(std::int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto x = at::randn({n, 4}, gen);
  auto y = x.matmul(at::tensor({1.5f, -2.0f, 0.5f, 1.0f}).unsqueeze(1)) + 0.1 * at::randn({n, 1}, gen);
  return {x, y};
}
data::TensorLoader regression_data(std::int64_t n = 256, bool shuffle = false) {
  auto [x, y] = regression_tensors(n);
  return data::TensorLoader(x, y, {.batch_size = 8, .shuffle = shuffle, .seed = 3});
}

/// The regression's data and first weights (seed 0), for Lightning's own search on them.
std::string write_regression_problem(const std::string& path, std::int64_t accumulate = 1) {
  auto values = [](const at::Tensor& t) {
    const at::Tensor flat = t.detach().to(at::kDouble).contiguous().flatten();
    std::vector<double> out(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
    return join(out);
  };
  torch::manual_seed(0);
  Regression model;
  const auto [x, y] = regression_tensors(256);
  std::ofstream out(path);
  out << "x" << values(x) << "\ny" << values(y) << "\nweight" << values(model->fc->weight) << "\nbias"
      << values(model->fc->bias) << "\nbatch 8\naccumulate " << accumulate << "\n";
  return path;
}

bool same_bits(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i])) return false;
  return true;
}

/// Runs this binary's hidden test case `tag` under fulgur's launcher (devices = 2); its output.
std::pair<int, std::string> run_ranks(const std::string& tag) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  self[n] = '\0';
  const std::string log = test::scratch_folder("lr_finder_" + tag) + "/log.txt";
  const std::string line = "OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=60000 '" + std::string(self) + "' '[" + tag +
                           "]' > '" + log + "' 2>&1";
  const int status = std::system(line.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  return {status, text.str()};
}

/// What each rank checks under a data-parallel strategy S (accumulating 2 batches: the gradient sync
/// skipped inside a window): the ranks agree on the search, and a fit after lr_find is the fit without it.
template <class S>
void check_on_ranks() {
  Trainer<CPUAccelerator, S, FloatPrecision> trainer(test::quiet({.max_epochs = 1, .accumulate_grad_batches = 2, .devices = 2}));
  REQUIRE(trainer.world_size() == 2);
  torch::manual_seed(11);
  Regression plain;
  torch::manual_seed(11);
  Regression searched;
  auto loader = regression_data();
  trainer.fit(plain, loader);
  const auto found = lr_find(trainer, searched, loader, {.min_lr = 1e-4, .max_lr = 10.0, .num_training = 40});
  REQUIRE(found.lrs.size() == found.losses.size());
  REQUIRE(found.losses.size() >= 2);
  const auto gathered = trainer.all_gather(torch::tensor(found.losses, at::kDouble));
  CHECK(torch::equal(gathered[0], gathered[1]));  // one result on every rank (rank 0's)
  trainer.fit(searched, loader);
  CHECK(same_bits(*plain, *searched));
}

}  // namespace

/// The searches the comparisons use (each deterministic), and Lightning's answers for them: built
/// once, for one Python start.
struct Searches {
  static constexpr LRFindOptions schedules[] = {
      LRFindOptions{}, LRFindOptions{.min_lr = 1e-5, .max_lr = 3.0, .num_training = 7},
      LRFindOptions{.min_lr = 1e-3, .max_lr = 0.5, .num_training = 30, .mode = LRFindMode::linear},
      LRFindOptions{.min_lr = 0.1, .max_lr = 0.2, .num_training = 2, .mode = LRFindMode::linear}};
  // over 2.5 epochs of 8 batches, no early stop: the schedule as the optimizer's two groups saw it
  LRFindOptions over_epochs{.min_lr = 1e-6, .max_lr = 1e-2, .num_training = 20, .early_stop_threshold = std::nullopt};
  LRFinderResult over_epochs_result;
  std::vector<double> seen_lrs;
  // SGD diverges well before lr = 100: the default threshold, and a tighter one
  LRFindOptions diverging[2] = {{.min_lr = 1e-4, .max_lr = 100.0, .num_training = 100},
                                {.min_lr = 1e-4, .max_lr = 100.0, .num_training = 100, .early_stop_threshold = 1.5}};
  LRFinderResult diverged[2];
  // a sequence for suggestion(), as recorded and with non-finite losses put in
  LRFindOptions suggesting{.min_lr = 1e-5, .max_lr = 10.0, .num_training = 60};
  LRFinderResult recorded, edited;
  // the same under accumulate_grad_batches = 3 (32 batches an epoch: a window of 2 ends each epoch)
  LRFindOptions accumulating{.min_lr = 1e-5, .max_lr = 10.0, .num_training = 40};
  LRFinderResult accumulated;
  static constexpr std::pair<int, int> skips[] = {{10, 1}, {0, 3}, {2, 0}, {1, 200}};
  // 10 points: nothing left after skip_begin = 10
  LRFindOptions few{.num_training = 10};
  LRFinderResult few_result;
  std::map<std::string, Reference> lightning;

  Searches() {
    test::CpuTrainer<FloatPrecision> trainer(test::quiet());
    auto search = [&](const LRFindOptions& o, std::int64_t samples = 256) {
      torch::manual_seed(0);
      Regression model;
      auto loader = regression_data(samples);
      auto found = lr_find(trainer, model, loader, o);
      return std::pair{found, model->seen_lrs};
    };
    std::tie(over_epochs_result, seen_lrs) = search(over_epochs, 64);
    for (int i = 0; i < 2; ++i) diverged[i] = search(diverging[i]).first;
    recorded = search(suggesting).first;
    {
      test::CpuTrainer<FloatPrecision> accumulating_trainer(test::quiet({.accumulate_grad_batches = 3}));
      torch::manual_seed(0);
      Regression model;
      auto loader = regression_data();
      accumulated = lr_find(accumulating_trainer, model, loader, accumulating);
    }
    edited = recorded;
    edited.losses.at(15) = std::numeric_limits<double>::infinity();
    edited.losses.at(16) = std::numeric_limits<double>::quiet_NaN();
    few_result = search(few).first;

    std::vector<Case> cases;
    for (std::size_t i = 0; i < std::size(schedules); ++i) cases.push_back({"schedule" + std::to_string(i), schedules[i]});
    cases.push_back({"over_epochs", over_epochs});
    for (int i = 0; i < 2; ++i) cases.push_back({"diverged" + std::to_string(i), diverging[i], diverged[i].raw_losses});
    cases.push_back({"recorded", suggesting, {}, &recorded, std::nullopt,
                     write_regression_problem(test::scratch_folder("lr_finder_problem") + "/problem.txt")});
    cases.push_back({"accumulated", accumulating, {}, nullptr, std::nullopt,
                     write_regression_problem(test::scratch_folder("lr_finder_problem3") + "/problem.txt", 3)});
    for (std::size_t i = 0; i < std::size(skips); ++i)
      cases.push_back({"edited" + std::to_string(i), suggesting, {}, &edited, skips[i]});
    cases.push_back({"few", few, {}, &few_result});
    lightning = ::lightning(cases);
  }
};

const Searches& searches() {
  static const Searches built;
  return built;
}

// One test case, so that ctest (a process per case) starts Python once for the three comparisons.
TEST_CASE("lr_find agrees with Lightning's code: schedule, smoothing and early stop, suggestion, a whole search", "[lr_finder]") {
  const Searches& s = searches();
  SECTION("the schedule is Lightning's _ExponentialLR and _LinearLR, on every parameter group") {
  for (std::size_t i = 0; i < std::size(Searches::schedules); ++i) {
    const LRFindOptions& o = Searches::schedules[i];
    const Reference& ref = s.lightning.at("schedule" + std::to_string(i));
    REQUIRE(ref.schedule.size() == static_cast<std::size_t>(o.num_training));
    for (std::int64_t k = 0; k < o.num_training; ++k)
      CHECK(lr_finder::scheduled_lr(o, k) == ref.schedule[static_cast<std::size_t>(k)]);
  }
  // Through a search over epochs: the recorded lrs, and what both SGD groups (one with its own lr) used.
  const Reference& ref = s.lightning.at("over_epochs");
  CHECK(s.over_epochs_result.lrs == ref.schedule);
  REQUIRE(s.seen_lrs.size() == 2 * ref.schedule.size());
  for (std::size_t k = 0; k < ref.schedule.size(); ++k) {
    CHECK(s.seen_lrs[2 * k] == ref.schedule[k]);
    CHECK(s.seen_lrs[2 * k + 1] == ref.schedule[k]);
  }
  CHECK_FALSE(s.over_epochs_result.stopped_early);
  }
  SECTION("smoothed losses and the stop on divergence are Lightning's _LRCallback's") {
  for (int i = 0; i < 2; ++i) {
    const LRFinderResult& found = s.diverged[i];
    const Reference& ref = s.lightning.at("diverged" + std::to_string(i));
    CHECK(found.stopped_early);
    REQUIRE(ref.stop);
    CHECK(static_cast<std::int64_t>(found.losses.size()) == *ref.stop);
    CHECK(static_cast<std::int64_t>(found.losses.size()) < s.diverging[i].num_training);
    CHECK(found.losses == ref.smoothed);
    CHECK(found.lrs.size() == found.losses.size());
  }
  CHECK(s.diverged[1].losses.size() < s.diverged[0].losses.size());  // the tighter threshold stops sooner
  }
  SECTION("the whole search is Lightning's Tuner.lr_find on the same weights and batches") {
    const Reference& ref = s.lightning.at("recorded");
    REQUIRE(ref.run_lrs.size() > 20);
    CHECK(s.recorded.lrs == ref.run_lrs);
    CHECK(s.recorded.losses == ref.run_losses);
    CHECK(s.recorded.suggestion() == ref.run_suggestion);
    CHECK(s.recorded.stopped_early == (ref.run_lrs.size() < static_cast<std::size_t>(s.suggesting.num_training)));
    // accumulate_grad_batches = 3: a point per window, the loss divided by 3, the epochs' short windows
    const Reference& acc = s.lightning.at("accumulated");
    REQUIRE(acc.run_lrs.size() > 20);
    CHECK(s.accumulated.lrs == acc.run_lrs);
    CHECK(s.accumulated.losses == acc.run_losses);
    CHECK(s.accumulated.suggestion() == acc.run_suggestion);
  }
  SECTION("the suggestion is Lightning's _LRFinder.suggestion() on the same recorded sequence") {
  REQUIRE(s.recorded.losses.size() > 20);
  const Reference& ref = s.lightning.at("recorded");
  REQUIRE(ref.suggestion);
  CHECK(s.recorded.suggestion() == ref.suggestion);
  CHECK(s.recorded.suggestion_index() == std::optional<std::size_t>(static_cast<std::size_t>(*ref.index)));
  // Non-finite losses in the sequence, other skips, and too few points (none, as Lightning).
  for (std::size_t i = 0; i < std::size(Searches::skips); ++i) {
    const auto [begin, end] = Searches::skips[i];
    const Reference& edited = s.lightning.at("edited" + std::to_string(i));
    CHECK(s.edited.suggestion(begin, end) == edited.suggestion);
    const auto index = s.edited.suggestion_index(begin, end);
    REQUIRE(index.has_value() == edited.index.has_value());
    if (index) CHECK(static_cast<std::int64_t>(*index) == *edited.index);
  }
  CHECK_FALSE(s.lightning.at("edited3").suggestion);  // skip_end = 200: nothing left
  CHECK(s.few_result.lrs.size() == 10);
  CHECK_FALSE(s.lightning.at("few").suggestion);
  CHECK_FALSE(s.few_result.suggestion());
  }
}

TEST_CASE("lr_find: a fit after it is bit-identical to a fit without it (weights, random state, optimizer)", "[lr_finder]") {
  test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 2}));
  torch::manual_seed(5);
  Regression plain;
  torch::manual_seed(5);
  Regression searched;
  searched->dropout = plain->dropout = 0.2;  // the global random state is used by every step
  auto loader = regression_data(128, /*shuffle=*/true);
  torch::manual_seed(9);
  const auto plain_result = trainer.fit(plain, loader);

  torch::manual_seed(9);
  const auto before = test::snapshot(*searched);
  const auto found = lr_find(trainer, searched, loader, {.num_training = 30, .update_attr = true});
  const auto after = test::snapshot(*searched);
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(before[i], after[i]));
  for (const auto& p : searched->parameters()) CHECK_FALSE(p.grad().defined());
  REQUIRE(found.applied_lr);
  CHECK(searched->lr == *found.applied_lr);
  CHECK(found.applied_lr == found.suggestion());
  searched->lr = plain->lr;  // the fit to compare: same learning rate
  const auto searched_result = trainer.fit(searched, loader);
  CHECK(searched_result.global_step == plain_result.global_step);
  CHECK(same_bits(*plain, *searched));
}

TEST_CASE("lr_find under 16-mixed: the loss scaler is put back, and the fit after it is the fit without it", "[lr_finder]") {
  // Two Trainers built alike: one fits, the other searches first and then fits.
  test::CpuTrainer<FP16MixedPrecision> fitting(test::quiet({.max_epochs = 1})), searching(test::quiet({.max_epochs = 1}));
  torch::manual_seed(5);
  Regression plain;
  torch::manual_seed(5);
  Regression searched;
  auto loader = regression_data(128);
  const StateDict scaler_before = searching.precision().state_dict();
  // Up to lr = 1e4 with no early stop: fp16 gradients overflow at the scale of 65536 and later, the
  // scaler backs off and skips steps (the search changes its state).
  const auto found = lr_find(searching, searched, loader,
                             {.min_lr = 1e-3, .max_lr = 1e4, .num_training = 16, .early_stop_threshold = std::nullopt});
  CHECK(found.lrs.size() == 16);  // one epoch of 16 batches
  const StateDict scaler_after = searching.precision().state_dict();
  CHECK(scaler_after.at("scale").toDouble() == scaler_before.at("scale").toDouble());
  CHECK(scaler_after.at("_growth_tracker").toInt() == scaler_before.at("_growth_tracker").toInt());
  const auto plain_result = fitting.fit(plain, loader);
  const auto searched_result = searching.fit(searched, loader);
  CHECK(searched_result.global_step == plain_result.global_step);
  CHECK(same_bits(*plain, *searched));
  CHECK(searching.precision().state_dict().at("scale").toDouble() == fitting.precision().state_dict().at("scale").toDouble());
}

TEST_CASE("lr_find: refused options and modules, with Lightning's messages where it has them", "[lr_finder]") {
  test::CpuTrainer<FloatPrecision> trainer(test::quiet());
  Regression model;
  auto loader = regression_data(32);
  auto message = [&](LRFindOptions o) {
    return test::message_of<MisconfigurationError>([&] { (void)lr_find(trainer, model, loader, o); });
  };
  CHECK_THAT(message({.min_lr = 1.0, .max_lr = 0.5}), Catch::Contains("max_lr (0.500000) must be finite and larger than min_lr"));
  CHECK_THAT(message({.min_lr = 0.0}), Catch::Contains("min_lr must be a positive finite number"));
  CHECK_THAT(message({.num_training = 1}), Catch::Contains("num_training must be at least 2"));
  CHECK_THAT(message({.early_stop_threshold = -1.0}), Catch::Contains("early_stop_threshold must be a positive"));

  struct TwoOptimizersImpl : RegressionImpl {
    std::vector<OptimizerConfig> configure_optimizers() {
      std::vector<OptimizerConfig> out;
      out.push_back({std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{fc->weight}, 0.1)});
      out.push_back({std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{fc->bias}, 0.1)});
      return out;
    }
  };
  auto two = std::make_shared<TwoOptimizersImpl>();
  const auto weights = test::snapshot(*two);
  CHECK(test::message_of<MisconfigurationError>([&] { (void)lr_find(trainer, two, loader); }) ==
        "`model.configure_optimizers()` returned 2, but learning rate finder only works with single optimizer");
  const auto unchanged = test::snapshot(*two);
  for (std::size_t i = 0; i < weights.size(); ++i) CHECK(torch::equal(weights[i], unchanged[i]));

  struct NoLrImpl : torch::nn::Module {
    NoLrImpl() : fc(register_module("fc", torch::nn::Linear(4, 1))) {}
    at::Tensor training_step(const data::Batch& b, std::int64_t) { return torch::mse_loss(fc(b.input), b.target); }
    std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
      return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
    }
    torch::nn::Linear fc;
    double base_lr = 0.1;
  };
  auto no_lr = std::make_shared<NoLrImpl>();
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { (void)lr_find(trainer, no_lr, loader, {.update_attr = true}); }),
             Catch::Contains("either `model` or `model.hparams` should have one of these fields: ('lr', 'learning_rate')"));
  CHECK_NOTHROW(lr_find(trainer, no_lr, loader, {.num_training = 3}));  // without update_attr it needs no lr
  // Lightning's attr_name: the member given.
  const auto named = lr_find(trainer, no_lr, loader, {.num_training = 20, .update_attr = true}, &NoLrImpl::base_lr);
  REQUIRE(named.applied_lr);
  CHECK(no_lr->base_lr == *named.applied_lr);
  CHECK(named.applied_lr == named.suggestion());
  CHECK_THROWS_WITH(lr_find(trainer, no_lr, loader, {.update_attr = true}, static_cast<double NoLrImpl::*>(nullptr)),
                    Catch::Contains("null member pointer"));

  // Lightning's epochs: limit_train_batches applies (4 batches an epoch, 3 epochs at most: 12 steps).
  test::CpuTrainer<FloatPrecision> limited(test::quiet({.max_epochs = 3, .limit_train_batches = 4}));
  {  // ... and says that the search ended short of max_lr (a new-user probe)
    std::ostringstream captured;
    std::streambuf* const original = std::cerr.rdbuf(captured.rdbuf());
    const auto short_search = lr_find(limited, model, loader, {.num_training = 20});
    const bool suggested = short_search.suggestion().has_value();
    const bool suggested_without_skip_end = short_search.suggestion(0, 0).has_value();  // [0:-0]: nothing
    std::cerr.rdbuf(original);
    CHECK_FALSE(suggested_without_skip_end);
    CHECK_THAT(captured.str(), Catch::Contains("skip_end = 0 leaves no point"));
    CHECK(short_search.lrs.size() == 12);
    CHECK_THAT(captured.str(), Catch::Contains("fulgur: lr_find ran 12 of num_training = 20 steps: the training data "
                                               "ran out after 3 epochs"));
    // 12 points, 1 between skip_begin = 10 and skip_end = 1: the advice is about the points, not
    // num_training, which is already larger (a new-user probe: it blamed num_training).
    CHECK_FALSE(suggested);
    CHECK_THAT(captured.str(), Catch::Contains("a suggestion needs more than skip_begin + skip_end + 1 = 12 points: "
                                               "more steps (num_training, and training data that lasts that long)"));
    CHECK_THAT(captured.str(), !Catch::Contains("num_training must exceed"));
  }
  test::CpuTrainer<FloatPrecision> empty_epochs(test::quiet({.limit_train_batches = 0}));
  CHECK_THROWS_AS(lr_find(empty_epochs, model, loader), DataError);
  data::TensorLoader nothing(at::zeros({0, 4}), at::zeros({0, 1}), {.batch_size = 8});
  CHECK_THROWS_AS(lr_find(trainer, model, nothing), DataError);
}

TEST_CASE("lr_find: the plot marks the suggestion (PNG via matplotlib, the CSV, else a text plot)", "[lr_finder]") {
  test::CpuTrainer<FloatPrecision> trainer(test::quiet());
  torch::manual_seed(0);
  Regression model;
  auto loader = regression_data();
  const auto found = lr_find(trainer, model, loader, {.min_lr = 1e-5, .max_lr = 10.0, .num_training = 60});
  REQUIRE(found.suggestion_index());
  const std::string folder = test::scratch_folder("lr_finder_plot");
  // The script compiled into libfulgur (an installed fulgur has no scripts/ folder; probe 7), into a folder
  // plot makes; the script's own file when one is given.
  const auto is_png = [](const std::string& path) {
    std::ifstream png(path, std::ios::binary);
    char magic[4] = {};
    png.read(magic, 4);
    return std::string(magic + 1, 3) == "PNG";
  };
  const std::string written = found.plot(folder + "/plots/lr.png", FULGUR_TEST_PYTHON);
  CHECK(written == folder + "/plots/lr.png");  // the venv has matplotlib
  CHECK(is_png(written));
  const std::string from_file =
      found.plot(folder + "/lr.png", FULGUR_TEST_PYTHON, std::string(FULGUR_SOURCE_DIR) + "/scripts/plot_lr_find.py");
  CHECK(is_png(from_file));
  CHECK_THROWS_WITH(found.plot(folder + "/lr2.png", FULGUR_TEST_PYTHON, folder + "/no_such_script.py"),
                    Catch::Contains("lr_find: the plot script failed: "));
  std::ifstream csv(folder + "/lr.png.csv");
  std::string header, columns, first;
  std::getline(csv, header);
  std::getline(csv, columns);
  std::getline(csv, first);
  CHECK(header == "# mode=exponential suggestion_index=" + std::to_string(*found.suggestion_index()));
  CHECK(columns == "lr,loss");
  CHECK(first == repr(found.lrs[0]) + "," + repr(found.losses[0]));
  // Without matplotlib (here: a Python that does not exist), the text plot, '*' at the suggestion.
  const std::string text = found.plot(folder + "/none.png", folder + "/no-python");
  CHECK(text == folder + "/none.png.txt");
  std::ifstream drawn(text);
  std::stringstream drawing;
  drawing << drawn.rdbuf();
  CHECK(drawing.str() == found.text_plot());
  CHECK_THAT(drawing.str(), Catch::Contains("*") && Catch::Contains("(log scale)") && Catch::Contains("; * suggestion "));
}

TEST_CASE("lr_find with DDPStrategy on 2 ranks: one result, and the fit after it is the fit without it", "[lr_finder]") {
  const auto [status, log] = run_ranks("lr_finder_ddp_ranks");
  INFO(log);
  CHECK(status == 0);
  CHECK_THAT(log, Catch::Contains("All tests passed"));
}

TEST_CASE("lr_find with ShardedStrategy<2> on 2 ranks: one result, and the fit after it is the fit without it", "[lr_finder]") {
  const auto [status, log] = run_ranks("lr_finder_sharded_ranks");
  INFO(log);
  CHECK(status == 0);
  CHECK_THAT(log, Catch::Contains("All tests passed"));
}

TEST_CASE("lr_find with ShardedStrategy<3> on 2 ranks: one result, and the fit after it is the fit without it", "[lr_finder]") {
  const auto [status, log] = run_ranks("lr_finder_fsdp_ranks");
  INFO(log);
  CHECK(status == 0);
  CHECK_THAT(log, Catch::Contains("All tests passed"));
}

TEST_CASE("lr_find rank: DDPStrategy", "[.][lr_finder_ddp_ranks]") { check_on_ranks<DDPStrategy>(); }
TEST_CASE("lr_find rank: ShardedStrategy<2>", "[.][lr_finder_sharded_ranks]") { check_on_ranks<ShardedStrategy<2>>(); }
TEST_CASE("lr_find rank: ShardedStrategy<3>", "[.][lr_finder_fsdp_ranks]") { check_on_ranks<ShardedStrategy<3>>(); }
