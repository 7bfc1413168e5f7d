// fulgur::optim's schedulers against torch.optim.lr_scheduler, step for step: each group's learning
// rate (and OneCycleLR's momentum) after construction and after each of 12 steps, get_last_lr(),
// state_dict()'s keys in Python's order and its values, and a state_dict round trip mid-run (golden
// values from the venv's torch at test time: scripts/make_golden.py's scheduler scenarios).
#include <catch2/catch.hpp>

#include <sstream>

#include "unit/support.hpp"

using namespace fulgur;

namespace {

const std::vector<double> kPlateauMetrics{1.0, 0.9, 0.95, 0.97, 0.96, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1};
const std::vector<std::string> kScenarios{
    "step",          "multistep",    "exponential",    "cosine",     "warm_restarts",     "linear",
    "onecycle",      "onecycle_adam", "lambda",        "sequential", "plateau",           "plateau_max_abs",
    "constant",      "polynomial",   "multiplicative", "cyclic",     "cyclic_adam",       "cyclic_custom",
    "chained",       "sequential_new", "sequential_cyclic", "sequential_chained"};

bool adam_scenario(const std::string& name) { return name == "onecycle_adam" || name == "cyclic_adam"; }

/// Two param groups, lr 0.1 and 0.05: SGD with momentum 0.9, or Adam (make_golden.py's).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(bool adam) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (double lr : {0.1, 0.05}) {
    std::unique_ptr<torch::optim::OptimizerOptions> options;
    if (adam) options = std::make_unique<torch::optim::AdamOptions>(lr);
    else options = std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(lr).momentum(0.9));
    groups.emplace_back(std::vector<at::Tensor>{torch::zeros({2}).requires_grad_(true)}, std::move(options));
  }
  if (adam) return std::make_unique<torch::optim::Adam>(std::move(groups), torch::optim::AdamOptions(0.1));
  return std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(0.1).momentum(0.9));
}

/// One scenario's scheduler, made as make_golden.py makes Python's.
struct Scheduler {
  std::unique_ptr<optim::LRScheduler> stepwise;
  std::unique_ptr<optim::ReduceLROnPlateau> plateau;
  void step(int i) { plateau ? plateau->step(kPlateauMetrics[static_cast<std::size_t>(i)]) : stepwise->step(); }
  std::vector<double> last() const { return plateau ? plateau->get_last_lr() : stepwise->get_last_lr(); }
  std::int64_t last_epoch() const { return plateau ? plateau->last_epoch() : stepwise->last_epoch(); }
  StateDict state() const { return plateau ? plateau->state_dict() : stepwise->state_dict(); }
  void load(const StateDict& s) { plateau ? plateau->load_state_dict(s) : stepwise->load_state_dict(s); }
};

Scheduler make_scheduler(const std::string& name, torch::optim::Optimizer& o) {
  using namespace fulgur::optim;
  Scheduler s;
  if (name == "step") s.stepwise = std::make_unique<StepLR>(o, 2, 0.5);
  else if (name == "multistep") s.stepwise = std::make_unique<MultiStepLR>(o, std::vector<std::int64_t>{2, 5, 5}, 0.3);
  else if (name == "exponential") s.stepwise = std::make_unique<ExponentialLR>(o, 0.9);
  else if (name == "cosine") s.stepwise = std::make_unique<CosineAnnealingLR>(o, 4, 0.001);
  else if (name == "warm_restarts") s.stepwise = std::make_unique<CosineAnnealingWarmRestarts>(o, 3, 2, 0.001);
  else if (name == "linear") s.stepwise = std::make_unique<LinearLR>(o, 0.25, 1.0, 4);
  else if (name == "onecycle")
    s.stepwise = std::make_unique<OneCycleLR>(o, std::vector<double>{1.0, 0.5}, OneCycleOptions{.total_steps = 12});
  else if (name == "onecycle_adam")
    s.stepwise = std::make_unique<OneCycleLR>(
        o, 0.01,
        OneCycleOptions{.total_steps = 12, .anneal_strategy = OneCycleOptions::Anneal::linear, .three_phase = true});
  else if (name == "lambda")
    s.stepwise = std::make_unique<LambdaLR>(o, [](std::int64_t e) { return std::pow(0.95, static_cast<double>(e)); });
  else if (name == "sequential") {
    std::vector<std::unique_ptr<LRScheduler>> parts;
    parts.push_back(std::make_unique<LinearLR>(o, 0.1, 1.0, 3));
    parts.push_back(std::make_unique<CosineAnnealingLR>(o, 6));
    s.stepwise = std::make_unique<SequentialLR>(o, std::move(parts), std::vector<std::int64_t>{3});
  } else if (name == "plateau")
    s.plateau = std::make_unique<ReduceLROnPlateau>(
        o, ReduceLROnPlateauOptions{.factor = 0.5, .patience = 1, .threshold = 0.01, .cooldown = 1});
  else if (name == "cosine_long") s.stepwise = std::make_unique<CosineAnnealingLR>(o, 20, 0.001);
  else if (name == "sequential_late") {
    std::vector<std::unique_ptr<LRScheduler>> parts;
    parts.push_back(std::make_unique<StepLR>(o, 2, 0.5));
    parts.push_back(std::make_unique<ExponentialLR>(o, 0.9));
    s.stepwise = std::make_unique<SequentialLR>(o, std::move(parts), std::vector<std::int64_t>{6});
  } else if (name == "swalr") s.stepwise = std::make_unique<SWALR>(o, std::vector<double>{0.05}, 3);
  else if (name == "constant") s.stepwise = std::make_unique<ConstantLR>(o, 0.5, 4);
  else if (name == "polynomial") s.stepwise = std::make_unique<PolynomialLR>(o, 8, 2.0);
  else if (name == "multiplicative")
    s.stepwise = std::make_unique<MultiplicativeLR>(
        o, [](std::int64_t e) { return 0.95 - 0.01 * static_cast<double>(e % 3); });
  else if (name == "cyclic")
    s.stepwise = std::make_unique<CyclicLR>(o, CyclicLROptions{.base_lr = {0.01, 0.005}, .max_lr = {0.1, 0.05},
                                                               .step_size_up = 3, .step_size_down = 2,
                                                               .mode = CyclicLROptions::Mode::triangular2});
  else if (name == "cyclic_adam")
    s.stepwise = std::make_unique<CyclicLR>(
        o, CyclicLROptions{.base_lr = {0.001}, .max_lr = {0.01}, .step_size_up = 2,
                           .mode = CyclicLROptions::Mode::exp_range, .gamma = 0.9, .base_momentum = {0.85},
                           .max_momentum = {0.95}});
  else if (name == "cyclic_custom")
    s.stepwise = std::make_unique<CyclicLR>(
        o, CyclicLROptions{.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = 4,
                           .scale_fn = [](double x) { return 1.0 / (x + 1.0); },
                           .scale_mode = CyclicLROptions::ScaleMode::iterations, .cycle_momentum = false});
  else if (name == "chained") {
    std::vector<std::unique_ptr<LRScheduler>> parts;
    parts.push_back(std::make_unique<ConstantLR>(o, 0.5, 3));
    parts.push_back(std::make_unique<ExponentialLR>(o, 0.9));
    s.stepwise = std::make_unique<ChainedScheduler>(std::move(parts), &o);
  } else if (name == "sequential_new") {
    std::vector<std::unique_ptr<LRScheduler>> parts;
    parts.push_back(std::make_unique<ConstantLR>(o, 0.5, 2));
    parts.push_back(std::make_unique<PolynomialLR>(o, 6, 1.5));
    parts.push_back(std::make_unique<MultiplicativeLR>(o, [](std::int64_t) { return 0.9; }));
    s.stepwise = std::make_unique<SequentialLR>(o, std::move(parts), std::vector<std::int64_t>{3, 7});
  } else if (name == "sequential_cyclic") {
    std::vector<std::unique_ptr<LRScheduler>> parts;
    parts.push_back(std::make_unique<LinearLR>(o, 0.5, 1.0, 2));
    parts.push_back(std::make_unique<CyclicLR>(o, CyclicLROptions{.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = 2}));
    s.stepwise = std::make_unique<SequentialLR>(o, std::move(parts), std::vector<std::int64_t>{4});
  } else if (name == "sequential_chained") {
    std::vector<std::unique_ptr<LRScheduler>> chain, parts;
    chain.push_back(std::make_unique<ConstantLR>(o, 0.5, 2));
    chain.push_back(std::make_unique<ExponentialLR>(o, 0.9));
    parts.push_back(std::make_unique<ChainedScheduler>(std::move(chain)));
    parts.push_back(std::make_unique<StepLR>(o, 2, 0.5));
    s.stepwise = std::make_unique<SequentialLR>(o, std::move(parts), std::vector<std::int64_t>{5});
  } else if (name == "plateau_max_abs")
    s.plateau = std::make_unique<ReduceLROnPlateau>(
        o, ReduceLROnPlateauOptions{.mode = ReduceLROnPlateauOptions::Mode::max, .factor = 0.5, .patience = 0,
                                    .threshold = 0.05, .threshold_mode = ReduceLROnPlateauOptions::ThresholdMode::abs,
                                    .min_lr = {0.02, 0.01}});
  else throw std::invalid_argument(name);
  return s;
}

at::Tensor as_tensor(const std::vector<double>& values) { return torch::tensor(values, at::kDouble); }

at::Tensor group_lrs(torch::optim::Optimizer& o) {
  std::vector<double> lrs;
  for (auto& group : o.param_groups()) lrs.push_back(group.options().get_lr());
  return as_tensor(lrs);
}

at::Tensor group_momenta(torch::optim::Optimizer& o) {
  std::vector<double> momenta;
  for (auto& group : o.param_groups()) {
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&group.options())) momenta.push_back(sgd->momentum());
    else momenta.push_back(std::get<0>(static_cast<torch::optim::AdamOptions&>(group.options()).betas()));
  }
  return as_tensor(momenta);
}

void check_step(torch::optim::Optimizer& o, const Scheduler& s, std::map<std::string, at::Tensor>& g,
                const std::string& tag) {
  INFO(tag);
  CHECK(test::identical(group_lrs(o), g[tag + ".lr"]));
  CHECK(test::identical(as_tensor(s.last()), g[tag + ".last"]));
  CHECK(test::identical(group_momenta(o), g[tag + ".momentum"]));
  if (g.count(tag + ".epoch") != 0) CHECK(static_cast<double>(s.last_epoch()) == g[tag + ".epoch"].item<double>());
}

/// make_golden.py's grown scenarios: a third group (lr 0.02, the optimizer's defaults otherwise, as
/// PyTorch's add_param_group fills it) added after 3 steps.
const std::vector<std::string> kGrownScenarios{
    "step",       "multistep",       "exponential", "cosine",   "cosine_long",    "warm_restarts", "linear",
    "onecycle",   "onecycle_adam",   "lambda",      "sequential", "sequential_late", "swalr",       "plateau",
    "plateau_max_abs", "constant",   "polynomial",  "multiplicative", "cyclic",   "chained"};
constexpr int kGrownAfter = 3;

void add_group(torch::optim::Optimizer& o) {
  std::unique_ptr<torch::optim::OptimizerOptions> options = o.defaults().clone();
  options->set_lr(0.02);
  o.add_param_group(torch::optim::OptimizerParamGroup({torch::zeros({2}).requires_grad_(true)}, std::move(options)));
}

void check_grown(torch::optim::Optimizer& o, const Scheduler& s, std::map<std::string, at::Tensor>& g,
                 const std::string& tag) {
  REQUIRE(g.count(tag + ".epoch") == 1);
  check_step(o, s, g, tag);
}

/// Steps `s` from step `from` to 11 (the group added before step kGrownAfter when `from` is 0), each
/// step's lrs and last lrs checked against PyTorch's, and where PyTorch raised, fulgur's error there.
void run_grown(const std::string& name, torch::optim::Optimizer& o, Scheduler& s, int from) {
  auto g = test::read_golden("scheduler_grown_" + name + ".txt");
  std::ifstream message_file(std::string(FULGUR_GOLDEN_DIR) + "/scheduler_grown_" + name + "_message.txt");
  std::string python_message;
  std::getline(message_file, python_message);
  const int raised = g.count("raised") != 0 ? static_cast<int>(g["raised"].item<double>()) : -1;
  for (int i = from; i < 12; ++i) {
    INFO("step " << i);
    if (i == kGrownAfter && from == 0) {
      add_group(o);
      check_grown(o, s, g, "grown");
    }
    std::string message;
    try {
      s.step(i);
    } catch (const MisconfigurationError& error) {
      message = error.what();
    }
    if (message.empty()) {
      REQUIRE(i != raised);  // PyTorch raised at this step
      check_grown(o, s, g, "step" + std::to_string(i));
      continue;
    }
    INFO(message);
    REQUIRE(i == raised);
    check_grown(o, s, g, "fail");  // what PyTorch's failed step left: the pairs zip made set, last_lr as it was
    if (python_message.rfind("RuntimeError: ", 0) == 0)  // ReduceLROnPlateau's, word for word
      CHECK_THAT(message, Catch::StartsWith(python_message.substr(14)));
    else
      CHECK_THAT(message, Catch::Contains("a group was added to the optimizer after it was made") &&
                              Catch::Contains("fails there too"));
    if (python_message.rfind("ValueError: ", 0) == 0) CHECK_THAT(message, Catch::Contains(python_message.substr(12)));
    break;
  }
  if (raised < 0) CHECK(g.count("step11.lr") == 1);
}

/// make_golden.py's _flat_state: numbers and lists of numbers, nested schedulers as "_schedulers.i.".
void flatten(const StateDict& state, const std::string& prefix, std::map<std::string, at::Tensor>& out) {
  for (const auto& item : state) {
    const std::string key = prefix + item.key().toStringRef();
    const c10::IValue& v = item.value();
    if (v.isBool()) out[key] = torch::tensor(v.toBool() ? 1.0 : 0.0, at::kDouble);
    else if (v.isInt()) out[key] = torch::tensor(static_cast<double>(v.toInt()), at::kDouble);
    else if (v.isDouble()) out[key] = torch::tensor(v.toDouble(), at::kDouble);
    else if (v.isDoubleList() && !v.toDoubleList().empty()) out[key] = as_tensor(v.toDoubleList().vec());
    else if (v.isIntList() && !v.toIntList().empty()) out[key] = torch::tensor(v.toIntList().vec(), at::kDouble);
    else if (item.key().toStringRef() == "_schedulers")
      for (std::size_t i = 0; i < v.toListRef().size(); ++i)
        flatten(StateDict(v.toListRef()[i].toGenericDict()), key + "." + std::to_string(i) + ".", out);
  }
}

/// `state` flattened equals the golden file's "state." entries: the same keys, each number the same double.
void check_state_equals_golden(const StateDict& state, std::map<std::string, at::Tensor>& g) {
  std::map<std::string, at::Tensor> flat;
  flatten(state, "state.", flat);
  std::size_t golden_entries = 0;
  for (const auto& [key, value] : g) {
    if (key.rfind("state.", 0) != 0) continue;
    ++golden_entries;
    INFO(key);
    REQUIRE(flat.count(key) == 1);
    CHECK(test::identical(flat.at(key), value.reshape(flat.at(key).sizes())));
  }
  CHECK(flat.size() == golden_entries);
}

}  // namespace

TEST_CASE("fulgur::optim's schedulers equal torch.optim.lr_scheduler step for step", "[scheduler][golden]") {
  for (const auto& name : kScenarios) {
    INFO(name);
    auto g = test::read_golden("scheduler_" + name + ".txt");
    auto optimizer = make_optimizer(adam_scenario(name));
    Scheduler scheduler = make_scheduler(name, *optimizer);
    check_step(*optimizer, scheduler, g, "init");
    for (int i = 0; i < 12; ++i) {
      scheduler.step(i);
      check_step(*optimizer, scheduler, g, "step" + std::to_string(i));
    }
    // state_dict: Python's keys in Python's order, its numbers equal.
    std::ifstream keys_file(std::string(FULGUR_GOLDEN_DIR) + "/scheduler_" + name + "_keys.txt");
    const std::vector<std::string> python_keys{std::istream_iterator<std::string>(keys_file), {}};
    const StateDict state = scheduler.state();
    std::vector<std::string> keys;
    for (const auto& item : state) keys.push_back(item.key().toStringRef());
    CHECK(keys == python_keys);
    check_state_equals_golden(state, g);
  }
}

TEST_CASE("A scheduler's state_dict resumes the schedule mid-run, with the optimizer's state", "[scheduler][checkpoint]") {
  for (const auto& name : kScenarios) {
    INFO(name);
    auto g = test::read_golden("scheduler_" + name + ".txt");
    const bool adam = adam_scenario(name);
    auto optimizer = make_optimizer(adam);
    Scheduler scheduler = make_scheduler(name, *optimizer);
    for (int i = 0; i < 6; ++i) scheduler.step(i);
    const StateDict saved = scheduler.state();
    const std::string archive = test::archive_bytes(*optimizer);
    // A new run: the optimizer and scheduler made afresh, then both loaded (as fit's resume does).
    auto resumed_optimizer = make_optimizer(adam);
    Scheduler resumed = make_scheduler(name, *resumed_optimizer);
    test::load_archive_bytes(*resumed_optimizer, archive);
    resumed.load(saved);
    for (int i = 6; i < 12; ++i) {
      resumed.step(i);
      check_step(*resumed_optimizer, resumed, g, "step" + std::to_string(i));
    }
  }
}

TEST_CASE("LibTorch's StepLR decays one epoch late, fulgur::optim::StepLR as Python", "[scheduler]") {
  auto libtorch_optimizer = make_optimizer(false), fulgur_optimizer = make_optimizer(false);
  torch::optim::StepLR libtorch(*libtorch_optimizer, 2, 0.5);
  optim::StepLR exact(*fulgur_optimizer, 2, 0.5);
  std::vector<double> libtorch_lrs, fulgur_lrs;
  for (int epoch = 0; epoch < 5; ++epoch) {
    libtorch_lrs.push_back(libtorch_optimizer->param_groups()[0].options().get_lr());
    fulgur_lrs.push_back(fulgur_optimizer->param_groups()[0].options().get_lr());
    libtorch.step();
    exact.step();
  }
  CHECK(libtorch_lrs == std::vector<double>{0.1, 0.1, 0.1, 0.05, 0.05});
  CHECK(fulgur_lrs == std::vector<double>{0.1, 0.1, 0.05, 0.05, 0.025});
}

TEST_CASE("Schedulers refuse arguments Python refuses, with the reason", "[scheduler][errors]") {
  auto o = make_optimizer(false);
  using namespace fulgur::optim;
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { LinearLR(*o, 0.0); }),
             Catch::Contains("starting multiplicative factor expected to be greater than 0"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { OneCycleLR(*o, 0.1, OneCycleOptions{}); }),
             Catch::Contains("you must define either total_steps OR (epochs AND steps_per_epoch)"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { OneCycleLR(*o, std::vector<double>{0.1}, {.total_steps = 4}); }),
             Catch::Contains("max_lr has 1 values, param_groups has 2"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] {
               OneCycleLR one(*o, 0.1, {.total_steps = 2});
               for (int i = 0; i < 3; ++i) one.step();
             }),
             Catch::Contains("tried to step 3 times. The specified number of total steps is 2"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { ReduceLROnPlateau(*o, {.factor = 1.0}); }),
             Catch::Contains("factor should be < 1.0"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { ReduceLROnPlateau(*o, {.min_lr = {0.1, 0.2, 0.3}}); }),
             Catch::Contains("expected 2 min_lrs, got 3"));
  auto other = make_optimizer(false);
  CHECK_THAT(test::message_of<MisconfigurationError>([&] {
               std::vector<std::unique_ptr<LRScheduler>> parts;
               parts.push_back(std::make_unique<StepLR>(*other, 2));
               SequentialLR(*o, std::move(parts), {});
             }),
             Catch::Contains("expects all schedulers to belong to the same optimizer"));
  StepLR step(*o, 2);
  StateDict broken = step.state_dict();
  broken.insert("last_epoch", std::string("three"));
  CHECK_THAT(test::message_of<CheckpointError>([&] { step.load_state_dict(broken); }),
             Catch::Contains("'last_epoch' is a String, not an integer"));
}

namespace {

/// The unit tests' classifier, its SGD stepped per epoch by fulgur::optim::StepLR; records each epoch's lr.
struct ScheduledClassifierImpl : test::ClassifierImpl {
  OptimizerConfig configure_optimizers() {
    auto sgd = std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto step = std::make_unique<optim::StepLR>(*sgd, 2, 0.5);
    return OptimizerConfig{std::move(sgd), std::move(step)};
  }
  void on_before_optimizer_step(torch::optim::Optimizer& optimizer) {
    lrs.push_back(optimizer.param_groups()[0].options().get_lr());
  }
  std::vector<double> lrs;  // at each optimizer step: 2 an epoch
};
TORCH_MODULE(ScheduledClassifier);

}  // namespace

TEST_CASE("fit steps a fulgur::optim scheduler per epoch as Lightning steps Python's", "[scheduler][fit]") {
  auto g = test::read_golden("scheduler_step.txt");
  const auto [x, y] = test::classification_data(64);
  ScheduledClassifier model;
  test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 5}));
  trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 32}));
  REQUIRE(model->lrs.size() == 10);
  // Epoch e trains with the lr after e scheduler steps: Python's init, step0, step1, ... (group 0).
  for (std::size_t e = 0; e < 5; ++e) {
    INFO("epoch " << e);
    const std::string tag = e == 0 ? "init" : "step" + std::to_string(e - 1);
    CHECK(model->lrs[2 * e] == g[tag + ".lr"][0].item<double>());
    CHECK(model->lrs[2 * e + 1] == model->lrs[2 * e]);
  }
}

TEST_CASE("Schedulers: a group added later, and a state of another kind, are errors", "[scheduler][errors]") {
  // Found by a probe: CosineAnnealingLR read past its base learning rates for a group added later.
  auto o = make_optimizer(false);
  optim::CosineAnnealingLR cosine(*o, 1);
  o->add_param_group(torch::optim::OptimizerParamGroup({torch::zeros({1}).requires_grad_(true)},
                                                       std::make_unique<torch::optim::SGDOptions>(0.2)));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { cosine.step(); cosine.step(); }),
             Catch::Contains("a group was added to the optimizer after it was made"));
  auto fresh = make_optimizer(false);
  optim::StepLR step(*fresh, 2);
  optim::CosineAnnealingLR other(*fresh, 4);
  CHECK_THAT(test::message_of<CheckpointError>([&] { step.load_state_dict(other.state_dict()); }),
             Catch::Contains("'step_size' is missing"));
  CHECK(step.last_epoch() == 0);  // unchanged
  // Python's load_state_dict restores the scheduler's own arguments too.
  optim::StepLR three(*fresh, 3, 0.5);
  step.load_state_dict(three.state_dict());
  CHECK(step.state_dict().at("step_size").toInt() == 3);
}

TEST_CASE("fit resumed from a checkpoint continues a fulgur::optim schedule exactly", "[scheduler][fit][checkpoint]") {
  // OneCycleLR stepped per batch (momentum cycled too) over 3 epochs of 4 steps; the second run
  // stops after epoch 1, a third resumes from its checkpoint: the lrs of the last epoch as the straight run's.
  struct OneCycleImpl : test::ClassifierImpl {
    OptimizerConfig configure_optimizers() {
      auto sgd = std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      auto cycle = std::make_unique<optim::OneCycleLR>(*sgd, 0.5, optim::OneCycleOptions{.total_steps = 12});
      return {std::move(sgd), std::move(cycle), SchedulerInterval::step};
    }
    void on_before_optimizer_step(torch::optim::Optimizer& optimizer) {
      lrs.push_back(optimizer.param_groups()[0].options().get_lr());
    }
    std::vector<double> lrs;
  };
  const auto [x, y] = test::classification_data(64);
  const std::string dir = test::temporary_directory("scheduler_resume");
  auto run = [&](std::int64_t epochs, const std::string& resume, const std::string& save) {
    torch::manual_seed(0);
    auto model = std::make_shared<OneCycleImpl>();
    test::CpuTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = epochs, .default_root_dir = dir}));
    trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 16}), FitOptions{.ckpt_path = resume});
    if (!save.empty()) trainer.save_checkpoint(save);
    return model->lrs;
  };
  const std::vector<double> straight = run(3, "", "");
  REQUIRE(straight.size() == 12);
  run(2, "", dir + "/two_epochs.ckpt");
  const std::vector<double> resumed = run(3, dir + "/two_epochs.ckpt", "");
  REQUIRE(resumed.size() == 4);
  CHECK(std::vector<double>(straight.begin() + 8, straight.end()) == resumed);
}

TEST_CASE("OneCycleLR resumed into a longer run: the error says the total came from the checkpoint (probe)",
          "[scheduler][fit][checkpoint][errors]") {
  // Found by the new-user probe: a run of 2 epochs, resumed with max_epochs 4 and a OneCycleLR made for 4 epochs,
  // failed in epoch 3 with Python's bare "Tried to step 9 times": the checkpoint had restored total_steps 8.
  struct CycleImpl : test::ClassifierImpl {
    explicit CycleImpl(std::int64_t epochs) : epochs(epochs) {}
    OptimizerConfig configure_optimizers() {
      auto sgd = std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      auto cycle = std::make_unique<optim::OneCycleLR>(*sgd, 0.5,
                                                       optim::OneCycleOptions{.epochs = epochs, .steps_per_epoch = 4});
      return {std::move(sgd), std::move(cycle), SchedulerInterval::step};
    }
    std::int64_t epochs;
  };
  const auto [x, y] = test::classification_data(64);
  const std::string dir = test::temporary_directory("one_cycle_longer");
  {
    test::CpuTrainer<FloatPrecision> first(test::quiet({.max_epochs = 2, .default_root_dir = dir}));
    auto model = std::make_shared<CycleImpl>(2);  // alive until save_checkpoint, which reads it
    first.fit(model, data::TensorLoader(x, y, {.batch_size = 16}));
    first.save_checkpoint(dir + "/two.ckpt");
  }
  test::CpuTrainer<FloatPrecision> longer(test::quiet({.max_epochs = 4, .default_root_dir = dir}));
  const std::string message = test::message_of<MisconfigurationError>([&] {
    longer.fit(std::make_shared<CycleImpl>(4), data::TensorLoader(x, y, {.batch_size = 16}),
               FitOptions{.ckpt_path = dir + "/two.ckpt"});
  });
  CHECK_THAT(message, Catch::StartsWith("OneCycleLR: tried to step 9 times. The specified number of total steps is 8. "
                                        "That total_steps (or epochs * steps_per_epoch) came from the checkpoint the "
                                        "run resumed from"));
  CHECK_THAT(message, Catch::Contains("the total this OneCycleLR was made with (16) was replaced by the first run's"));
  CHECK_THAT(message, Catch::Contains("make the OneCycleLR for the longer run's total from the first run on"));
  // Without a loaded state, Python's text alone: nothing came from a checkpoint.
  auto o = std::make_unique<torch::optim::SGD>(test::Classifier()->parameters(), torch::optim::SGDOptions(0.1));
  optim::OneCycleLR fresh(*o, 0.1, {.total_steps = 2});
  fresh.step();
  fresh.step();
  CHECK(test::message_of<MisconfigurationError>([&] { fresh.step(); }) ==
        "OneCycleLR: tried to step 3 times. The specified number of total steps is 2.");
}

TEST_CASE("A param group added after the scheduler was made: every group's lr as PyTorch's, or its error there",
          "[scheduler][grown]") {
  // PyTorch 2.11 zips the groups with the schedule's values (strict=True): StepLR, MultiStepLR, ExponentialLR,
  // LinearLR and CosineAnnealingLR's recursive form scale each group's own lr and take the new group in; the
  // forms built on lists made with the scheduler (LambdaLR, the closed forms, OneCycleLR, SWALR, a
  // ReduceLROnPlateau given one min_lr per group) raise at their next step.
  for (const auto& name : kGrownScenarios) {
    INFO(name);
    auto optimizer = make_optimizer(adam_scenario(name));
    Scheduler scheduler = make_scheduler(name, *optimizer);
    run_grown(name, *optimizer, scheduler, 0);
    // state_dict after the group was added (base_lrs as made, _last_lr one per group): Python's numbers.
    auto g = test::read_golden("scheduler_grown_" + name + ".txt");
    check_state_equals_golden(scheduler.state(), g);
  }
}

TEST_CASE("A scheduler's state saved after a group was added resumes exactly", "[scheduler][grown][checkpoint]") {
  constexpr int kSaveAfter = 6;  // steps 0-5 taken, the group added before step 3
  for (const auto& name : kGrownScenarios) {
    auto g = test::read_golden("scheduler_grown_" + name + ".txt");
    if (g.count("raised") != 0 && g["raised"].item<double>() < kSaveAfter) continue;  // PyTorch stopped before
    INFO(name);
    const bool adam = adam_scenario(name);
    auto optimizer = make_optimizer(adam);
    Scheduler scheduler = make_scheduler(name, *optimizer);
    for (int i = 0; i < kSaveAfter; ++i) {
      if (i == kGrownAfter) add_group(*optimizer);
      scheduler.step(i);
    }
    const StateDict saved = scheduler.state();
    const std::string archive = test::archive_bytes(*optimizer);
    // The resumed run: optimizer and scheduler made afresh, the group added again (as BackboneFinetuning does
    // before the optimizer's state is loaded), then both states loaded.
    auto resumed_optimizer = make_optimizer(adam);
    Scheduler resumed = make_scheduler(name, *resumed_optimizer);
    add_group(*resumed_optimizer);
    test::load_archive_bytes(*resumed_optimizer, archive);
    resumed.load(saved);
    run_grown(name, *resumed_optimizer, resumed, kSaveAfter);
  }
  // A state with more learning rates than the optimizer has groups is another optimizer's.
  auto three = make_optimizer(false);
  add_group(*three);
  optim::StepLR big(*three, 2);
  auto two = make_optimizer(false);
  optim::StepLR small(*two, 2);
  CHECK_THAT(test::message_of<CheckpointError>([&] { small.load_state_dict(big.state_dict()); }),
             Catch::Contains("'base_lrs' has 3 learning rates for the optimizer's 2 param groups"));
}

namespace {

/// make_golden.py's scheduler_errors.txt: what PyTorch raises on the new schedulers' bad arguments (first line).
std::map<std::string, std::string> python_errors() {
  std::ifstream file(std::string(FULGUR_GOLDEN_DIR) + "/scheduler_errors.txt");
  std::map<std::string, std::string> errors;
  std::string name, message;
  while (file >> name && std::getline(file >> std::ws, message)) {
    const auto colon = message.find(": ");  // "ValueError: ..." -> the text
    errors[name] = colon == std::string::npos ? message : message.substr(colon + 2);
    const auto repr = errors[name].find(" has SGD (");  // then Python prints the optimizer: fulgur names no repr
    if (repr != std::string::npos) errors[name] = errors[name].substr(0, repr);
  }
  return errors;
}

}  // namespace

TEST_CASE("ConstantLR, PolynomialLR, MultiplicativeLR, CyclicLR, ChainedScheduler refuse what Python refuses",
          "[scheduler][errors]") {
  using namespace fulgur::optim;
  auto python = python_errors();
  REQUIRE(python.size() == 8);
  auto o = make_optimizer(false);
  auto says = [&](const std::string& key, const std::function<void()>& make) {
    INFO(key << ": " << python[key]);
    CHECK_THAT(test::message_of<MisconfigurationError>(make), Catch::Contains(python[key], Catch::CaseSensitive::No));
  };
  says("constant_factor", [&] { ConstantLR(*o, 1.5); });
  says("constant_zero", [&] {
    ConstantLR zero(*o, 0.0, 2);
    zero.step();
    zero.step();
  });
  says("multiplicative_lambdas",
       [&] { MultiplicativeLR(*o, std::vector<MultiplicativeLR::Lambda>(3, [](std::int64_t) { return 1.0; })); });
  auto adagrad = std::make_unique<torch::optim::Adagrad>(
      std::vector<at::Tensor>{torch::zeros({2}).requires_grad_(true)}, torch::optim::AdagradOptions(0.1));
  says("cyclic_no_momentum", [&] { CyclicLR(*adagrad, {.base_lr = {0.01}, .max_lr = {0.1}}); });
  says("cyclic_max_lr", [&] { CyclicLR(*o, {.base_lr = {0.01}, .max_lr = {0.1, 0.2, 0.3}}); });
  says("cyclic_base_momentum",
       [&] { CyclicLR(*o, {.base_lr = {0.01}, .max_lr = {0.1}, .base_momentum = {0.8, 0.8, 0.8}}); });
  says("chained_empty", [&] { ChainedScheduler({}); });
  auto other = make_optimizer(false);
  says("chained_optimizers", [&] {
    std::vector<std::unique_ptr<LRScheduler>> parts;
    parts.push_back(std::make_unique<StepLR>(*o, 2));
    parts.push_back(std::make_unique<ExponentialLR>(*other, 0.9));
    ChainedScheduler(std::move(parts));
  });
  // Without momentum cycling an optimizer without momentum is fine, as in Python.
  CyclicLR plain(*adagrad, {.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = 2, .cycle_momentum = false});
  plain.step();
  CHECK(plain.get_last_lr() == std::vector<double>{0.01 + (0.1 - 0.01) * 0.5});  // halfway up: x 0.25 of a cycle of 4
  // Python's ZeroDivisionError for step_size_up 0, at the first step: refused when made.
  CHECK_THAT(test::message_of<MisconfigurationError>(
                 [&] { CyclicLR(*o, {.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = 0}); }),
             Catch::Contains("step_size_up must be a positive number of iterations, got 0"));
  // A ChainedScheduler restarted by SequentialLR at its milestone: Python's NotImplementedError, said plainly.
  CHECK_THAT(test::message_of<MisconfigurationError>([&] {
               std::vector<std::unique_ptr<LRScheduler>> chain, parts;
               chain.push_back(std::make_unique<ExponentialLR>(*o, 0.9));
               parts.push_back(std::make_unique<StepLR>(*o, 2));
               parts.push_back(std::make_unique<ChainedScheduler>(std::move(chain)));
               SequentialLR sequential(*o, std::move(parts), {1});
               sequential.step();
             }),
             Catch::Contains("Put the ChainedScheduler first in the SequentialLR"));
}

TEST_CASE("ReduceLROnPlateau::set_min_lrs: one per group after add_param_group, checked", "[scheduler][errors]") {
  auto o = make_optimizer(false);
  optim::ReduceLROnPlateau plateau(*o, {.factor = 0.5, .patience = 0, .min_lr = {0.06, 0.04}});
  add_group(*o);
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { plateau.set_min_lrs({0.01, 0.01}); }),
             Catch::Contains("expected 3 min_lrs (one per param group), got 2"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { plateau.set_min_lrs({0.01, -0.1, 0.01}); }),
             Catch::Contains("min_lrs[1] is -0.1"));
  // Without the setter the grown optimizer fails at the first reduction (Python's RuntimeError); with it, it reduces.
  plateau.set_min_lrs({0.06, 0.04, 0.015});
  CHECK(plateau.min_lrs() == std::vector<double>{0.06, 0.04, 0.015});
  plateau.step(1.0);
  plateau.step(2.0);  // worse: every group halved, down to its minimum
  CHECK(plateau.get_last_lr() == std::vector<double>{0.06, 0.04, 0.015});
  CHECK(plateau.state_dict().at("min_lrs").toDoubleList().vec() == std::vector<double>{0.06, 0.04, 0.015});
}

TEST_CASE("fit with CyclicLR per step, resumed mid-epoch from a checkpoint, ends as the straight run",
          "[scheduler][fit][checkpoint]") {
  // 3 epochs of 4 steps; the second run stops at step 6 (mid-epoch 1) by max_steps and saves; the third resumes:
  // each step's lr and momentum, and the final weights, as the straight run's.
  struct CyclicImpl : test::ClassifierImpl {
    OptimizerConfig configure_optimizers() {
      auto sgd = std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      auto cyclic = std::make_unique<optim::CyclicLR>(
          *sgd, optim::CyclicLROptions{.base_lr = {0.01}, .max_lr = {0.2}, .step_size_up = 3, .step_size_down = 2,
                                       .mode = optim::CyclicLROptions::Mode::triangular2});
      return {std::move(sgd), std::move(cyclic), SchedulerInterval::step};
    }
    void on_before_optimizer_step(torch::optim::Optimizer& optimizer) {
      auto& options = static_cast<torch::optim::SGDOptions&>(optimizer.param_groups()[0].options());
      lrs.push_back(options.lr());
      momenta.push_back(options.momentum());
    }
    std::vector<double> lrs, momenta;
  };
  const auto [x, y] = test::classification_data(64);
  const std::string dir = test::temporary_directory("cyclic_resume");
  struct Run {
    std::vector<double> lrs, momenta;
    std::vector<at::Tensor> weights;
  };
  auto run = [&](std::int64_t max_steps, const std::string& resume, const std::string& save) {
    torch::manual_seed(0);
    auto model = std::make_shared<CyclicImpl>();
    test::CpuTrainer<FloatPrecision> trainer(
        test::quiet({.max_epochs = 3, .max_steps = max_steps, .default_root_dir = dir}));
    trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 16}), FitOptions{.ckpt_path = resume});
    if (!save.empty()) trainer.save_checkpoint(save);
    Run r{model->lrs, model->momenta, {}};
    for (const auto& p : model->parameters()) r.weights.push_back(p.detach().clone());
    return r;
  };
  const Run straight = run(-1, "", "");
  REQUIRE(straight.lrs.size() == 12);
  CHECK(straight.lrs[0] == 0.01);  // base_lr, set by CyclicLR when made
  CHECK(straight.momenta[0] == 0.9);  // max_momentum
  run(6, "", dir + "/six_steps.ckpt");
  const Run resumed = run(-1, dir + "/six_steps.ckpt", "");
  REQUIRE(resumed.lrs.size() == 6);
  CHECK(std::vector<double>(straight.lrs.begin() + 6, straight.lrs.end()) == resumed.lrs);
  CHECK(std::vector<double>(straight.momenta.begin() + 6, straight.momenta.end()) == resumed.momenta);
  REQUIRE(resumed.weights.size() == straight.weights.size());
  for (std::size_t i = 0; i < straight.weights.size(); ++i)
    CHECK(test::identical(straight.weights[i], resumed.weights[i]));
}
