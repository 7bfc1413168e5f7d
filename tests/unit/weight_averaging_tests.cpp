// EMAWeightAveraging, StochasticWeightAveraging, optim::SWALR and update_bn against the venv's
// torch.optim.swa_utils and Lightning, whose values weight_averaging_reference.py computes at test
// time from the weight sequences these runs write.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "fulgur/callbacks/stochastic_weight_averaging.hpp"
#include "fulgur/callbacks/weight_averaging.hpp"
#include "fulgur/checkpoint/io.hpp"
#include "fulgur/optim/swalr.hpp"
#include "fulgur/update_bn.hpp"
#include "batch_norm_net.hpp"
#include "unit/support.hpp"

using namespace fulgur;

namespace {

using NetImpl = test::BatchNormNetImpl;
using Net = test::BatchNormNet;

using Tensors = std::vector<at::Tensor>;

Tensors clones(const Tensors& tensors) {
  Tensors out;
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

Tensors module_tensors(torch::nn::Module& m) { return clones(weight_averaging::averaged_tensors(m, true)); }

bool same(const Tensors& a, const Tensors& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!test::identical(a[i], b[i])) return false;
  return true;
}

/// What the module holds after each optimizer step (global step -> tensors), and at the epochs' starts.
struct Recorder {
  std::vector<std::pair<std::int64_t, Tensors>>* steps = nullptr;
  std::vector<Tensors>* epoch_starts = nullptr;
  std::vector<double>* epoch_lrs = nullptr;
  void on_train_batch_end(TrainerView& t, torch::nn::Module& m) {
    if (steps != nullptr) steps->emplace_back(t.global_step(), module_tensors(m));
  }
  void on_train_epoch_start(TrainerView& t, torch::nn::Module& m) {
    if (epoch_starts != nullptr) epoch_starts->push_back(clones(m.parameters()));
    if (epoch_lrs != nullptr) epoch_lrs->push_back(t.optimizers().front().optimizer->param_groups().front().options().get_lr());
  }
};

/// Runs weight_averaging_reference.py; throws if it fails.
void python(const std::string& args) {
  const std::string line = std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR +
                           "/tests/unit/weight_averaging_reference.py " + args;
  if (std::system(line.c_str()) != 0) throw std::runtime_error("the Python reference failed: " + line);
}

/// The recorded steps as the reference script reads them ("p:" parameters, "b:" buffers).
void write_steps(const std::string& path, torch::nn::Module& m, const std::vector<std::pair<std::int64_t, Tensors>>& steps,
                 bool with_buffers) {
  const auto names = weight_averaging::averaged_names(m, true);
  const std::size_t n_params = m.parameters().size();
  StateDict all;
  for (const auto& [step, tensors] : steps) {
    StateDict one;
    for (std::size_t i = 0; i < (with_buffers ? names.size() : n_params); ++i)
      one.insert((i < n_params ? "p:" : "b:") + names[i], tensors[i]);
    all.insert("step_" + std::to_string(step), one.to_ivalue());
  }
  checkpoint::save(path, all);
}

std::pair<data::TensorLoader, data::TensorLoader> loaders() {
  auto [x, y] = test::classification_data(64, 3);
  auto [vx, vy] = test::classification_data(16, 4);
  return {data::TensorLoader(x, y, {.batch_size = 8, .shuffle = true, .seed = 11}),
          data::TensorLoader(vx, vy, {.batch_size = 16})};
}

/// Saves a checkpoint at the end of the training batch number `at` (counted from 1 over the run).
struct SaveAt {
  std::int64_t at = -1;
  std::string path;
  Tensors* current = nullptr;  ///< the module's weights then
  std::int64_t seen = 0;
  void on_train_batch_end(TrainerView& trainer, torch::nn::Module& m) {
    if (++seen != at) return;
    if (current != nullptr) *current = module_tensors(m);
    trainer.save_checkpoint(path);
  }
};

/// Net whose training_step counts the calls made without gradients (StochasticWeightAveraging's own
/// batch-norm pass), notes the mode they ran in, logs, and fails in that pass when asked.
struct ProbeNetImpl : NetImpl {
  std::int64_t forward_only_steps = 0;
  bool trained_in_pass = false;
  bool fail_in_pass = false;
  bool peer_lost_in_pass = false;
  at::Tensor training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    if (!torch::GradMode::is_enabled()) {
      ++forward_only_steps;
      trained_in_pass = is_training();
      if (fail_in_pass) throw std::runtime_error("the probe's step failed");
      if (peer_lost_in_pass) throw DistributedError("fulgur: the probe's peer was lost");
    }
    at::Tensor loss = torch::nn::functional::cross_entropy(forward(b.input), b.target);
    ctx.log("step_loss", loss);
    return loss;
  }
};
TORCH_MODULE(ProbeNet);

/// Net under manual optimization, whose training_step returns nothing.
struct ManualNetImpl : NetImpl {
  static constexpr bool automatic_optimization = false;
  void training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    auto& opt = ctx.optimizer(0);
    opt.zero_grad();
    ctx.manual_backward(torch::nn::functional::cross_entropy(forward(b.input), b.target));
    opt.step();
  }
};

/// Puts the module in eval mode at on_train_end (listed before the averaging callback): its pass must
/// put that mode back.
struct EvalAtTrainEnd {
  void on_train_end(TrainerView&, torch::nn::Module& m) { m.eval(); }
};

/// After the averaging callback at on_train_end: a checkpoint of the end of training.
struct SaveAtTrainEnd {
  std::string path;
  void on_train_end(TrainerView& trainer, torch::nn::Module&) { trainer.save_checkpoint(path); }
};

const EMAWeightAveragingOptions ema_options{.decay = 0.9, .update_every_n_steps = 2, .update_starting_at_step = 3};

}  // namespace

TEST_CASE("EMAWeightAveraging's average equals AveragedModel with get_ema_avg_fn bit for bit", "[weight_averaging]") {
  torch::manual_seed(1);
  Net net;
  auto [train, val] = loaders();
  std::vector<std::pair<std::int64_t, Tensors>> steps;
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, Recorder, EMAWeightAveraging> trainer(
      test::quiet({.max_epochs = 2}), Recorder{.steps = &steps}, EMAWeightAveraging(ema_options));
  trainer.fit(net, train, val);
  const EMAWeightAveraging& ema = trainer.callback<EMAWeightAveraging>();
  REQUIRE(steps.size() == 16);
  // Lightning's should_update: step_idx 4, 6, ..., 14 (0-based; multiples of 2 from 3 on), 6 updates.
  CHECK(ema.n_averaged() == 6);

  const std::string dir = test::scratch_folder("ema_reference");
  write_steps(dir + "/steps.pt", *net, steps, true);
  python("ema " + dir + "/steps.pt " + dir + "/out.pt 0.9 2 3");
  const StateDict reference = checkpoint::load(dir + "/out.pt");
  CHECK(reference.at("n_averaged").toTensor().item<std::int64_t>() == ema.n_averaged());
  const auto names = weight_averaging::averaged_names(*net, true);
  REQUIRE(names.size() == ema.average().size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    CHECK(test::identical(ema.average()[i], reference.at(names[i]).toTensor()));
  }
  // After fit the module holds the average (Lightning's on_train_end), not the last weights.
  CHECK(same(module_tensors(*net), ema.average()));
  CHECK_FALSE(same(module_tensors(*net), steps.back().second));
}

TEST_CASE("EMAWeightAveraging validates on the averaged weights and swaps the current ones back",
          "[weight_averaging]") {
  // Recorder before the callback: at on_validation_epoch_start it sees the current weights (before
  // the swap), at on_validation_epoch_end the ones validation ran on (before the swap back).
  struct Probe {
    std::vector<Tensors>* before;
    std::vector<Tensors>* during;
    void on_validation_epoch_start(TrainerView& t, torch::nn::Module& m) {
      if (!t.sanity_checking()) before->push_back(module_tensors(m));
    }
    void on_validation_epoch_end(TrainerView& t, torch::nn::Module& m) {
      if (!t.sanity_checking()) during->push_back(module_tensors(m));
    }
    void on_train_epoch_start(TrainerView&, torch::nn::Module& m) {
      if (!before->empty()) CHECK(same(module_tensors(m), before->back()));  // the current weights came back
    }
  };
  torch::manual_seed(2);
  Net net;
  auto [train, val] = loaders();
  std::vector<Tensors> before, during;
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, Probe, EMAWeightAveraging> trainer(
      test::quiet({.max_epochs = 2}), Probe{&before, &during}, EMAWeightAveraging(ema_options));
  const FitResult result = trainer.fit(net, train, val);
  REQUIRE(during.size() == 2);
  for (std::size_t e = 0; e < 2; ++e) CHECK_FALSE(same(before[e], during[e]));
  // The last validation ran on the final average, which the module holds now: its loss is val_loss.
  const Tensors& average = trainer.callback<EMAWeightAveraging>().average();
  CHECK(same(during.back(), average));
  net->eval();
  torch::NoGradGuard no_grad;
  auto [vx, vy] = test::classification_data(16, 4);
  const double loss = torch::nn::functional::cross_entropy(net->forward(vx), vy).item<double>();
  CHECK(result.metrics.at("val_loss") == loss);
}

TEST_CASE("EMAWeightAveraging's checkpoint holds the average as state_dict, the current weights as "
          "current_model_state, and a resumed fit ends bit-identical to a straight one",
          "[weight_averaging][resume]") {
  const std::string dir = test::scratch_folder("ema_resume");
  auto run = [&](std::int64_t save_at, const std::string& resume, Tensors* current) {
    torch::manual_seed(resume.empty() ? 3 : 99);  // a resumed run starts from other weights
    Net net;
    auto [train, val] = loaders();
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, EMAWeightAveraging, SaveAt> trainer(
        test::quiet({.max_steps = 12, .default_root_dir = dir}), EMAWeightAveraging(ema_options),
        SaveAt{save_at, dir + "/at.ckpt", current});
    trainer.fit(net, train, val, FitOptions{.ckpt_path = resume});
    return std::make_pair(module_tensors(*net), trainer.callback<EMAWeightAveraging>().n_averaged());
  };
  Tensors current;
  const auto straight = run(8, "", &current);
  // Batch 8's checkpoint: updates after global steps 5 and 7 (step_idx 4 and 6).
  const StateDict c = checkpoint::load(dir + "/at.ckpt");
  REQUIRE(c.contains("current_model_state"));
  REQUIRE(c.contains("averaging_state"));
  const StateDict weights(c.at("state_dict").toGenericDict()), now(c.at("current_model_state").toGenericDict());
  const StateDict averaging(c.at("averaging_state").toGenericDict());
  CHECK(averaging.at("n_averaged").toTensor().item<std::int64_t>() == 2);
  CHECK(StateDict(StateDict(c.at("callbacks").toGenericDict()).at("EMAWeightAveraging").toGenericDict())
            .at("latest_update_step")
            .toInt() == 7);
  torch::manual_seed(0);
  Net probe;
  const auto names = weight_averaging::averaged_names(*probe, true);
  REQUIRE(current.size() == names.size());
  bool differ = false;
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    CHECK(test::identical(now.at(names[i]).toTensor(), current[i]));
    differ = differ || !test::identical(weights.at(names[i]).toTensor(), current[i]);
  }
  CHECK(differ);  // the average is not the current weights

  const auto resumed = run(-1, dir + "/at.ckpt", nullptr);
  CHECK(resumed.second == straight.second);
  CHECK(same(resumed.first, straight.first));
}

TEST_CASE("optim::SWALR gives torch's SWALR learning rates bit for bit", "[weight_averaging]") {
  const std::string dir = test::scratch_folder("swalr_reference");
  python("swalr " + dir + "/lrs.txt 0.1,0.03 0.05,0.2 cos:0,cos:1,cos:3,linear:0,linear:1,linear:3 2 9");
  std::map<std::tuple<std::string, int, int>, double> expected;
  std::ifstream in(dir + "/lrs.txt");
  std::string config, value;
  int epoch = 0, group = 0;
  while (in >> config >> epoch >> group >> value) expected[{config, epoch, group}] = std::strtod(value.c_str(), nullptr);
  REQUIRE(expected.size() == 6 * 18);
  for (const std::string strategy : {"cos", "linear"}) {
    for (const std::int64_t anneal_epochs : {0, 1, 3}) {
      const std::string name = strategy + ":" + std::to_string(anneal_epochs);
      INFO(name);
      auto a = torch::zeros({1}, torch::requires_grad()), b = torch::zeros({1}, torch::requires_grad());
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<torch::optim::SGDOptions>(0.1));
      groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<torch::optim::SGDOptions>(0.03));
      torch::optim::SGD sgd(std::move(groups), torch::optim::SGDOptions(0.1));
      std::unique_ptr<optim::SWALR> scheduler;
      for (int e = 0; e < 9; ++e) {
        if (e == 2)  // as Lightning makes it: last_epoch = max_epochs for "cos"
          scheduler = std::make_unique<optim::SWALR>(sgd, std::vector<double>{0.05, 0.2}, anneal_epochs, strategy,
                                                     strategy == "cos" ? 9 : -1);
        for (int g = 0; g < 2; ++g) {
          INFO("epoch " << e << " group " << g);
          CHECK(sgd.param_groups()[static_cast<std::size_t>(g)].options().get_lr() == expected.at({name, e, g}));
        }
        if (scheduler) scheduler->step();
      }
    }
  }
}

TEST_CASE("StochasticWeightAveraging: SWALR replaces the scheduler, the average equals AveragedModel's, "
          "batch-norm statistics as update_bn recomputes them",
          "[weight_averaging]") {
  torch::manual_seed(4);
  Net net;
  auto data = loaders();
  data::TensorLoader& train = data.first;
  std::vector<Tensors> epoch_starts;
  std::vector<double> lrs;
  // The batches update_bn sees: the training loader's (shuffled as the next epoch would be).
  std::vector<at::Tensor> bn_batches;
  auto recompute = [&](torch::nn::Module& m) {
    update_bn(train, m, [&](const data::Batch& batch) {
      bn_batches.push_back(batch.input.clone());
      net->forward(batch.input);
    });
  };
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, Recorder, StochasticWeightAveraging> trainer(
      test::quiet({.max_epochs = 5}), Recorder{.epoch_starts = &epoch_starts},
      StochasticWeightAveraging({.swa_lrs = {0.05}, .swa_epoch_start = std::int64_t{3}, .annealing_epochs = 2,
                                 .update_bn = recompute}));
  trainer.fit(net, train, data.second);
  const StochasticWeightAveraging& swa = trainer.callback<StochasticWeightAveraging>();
  CHECK(swa.swa_start() == 2);
  REQUIRE(epoch_starts.size() == 5);
  CHECK(swa.n_averaged() == 3);  // at the starts of epochs 2, 3, 4

  const std::string dir = test::scratch_folder("swa_reference");
  std::vector<std::pair<std::int64_t, Tensors>> steps;
  for (std::size_t e = 2; e < 5; ++e) steps.emplace_back(static_cast<std::int64_t>(e), epoch_starts[e]);
  write_steps(dir + "/steps.pt", *net, steps, false);
  // update_bn's statistics, from the same weights and batches.
  REQUIRE(bn_batches.size() == 8);
  StateDict weights, input;
  const char* python_names[] = {"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"};
  for (std::size_t i = 0; i < 6; ++i) weights.insert(python_names[i], net->parameters()[i].detach());
  input.insert("weights", weights.to_ivalue());
  input.insert("batches", c10::List<at::Tensor>(bn_batches));
  checkpoint::save(dir + "/bn_in.pt", input);
  python("swa " + dir + "/steps.pt " + dir + "/out.pt + update_bn " + dir + "/bn_in.pt " + dir + "/bn_out.pt");

  const StateDict reference = checkpoint::load(dir + "/out.pt");
  const auto names = weight_averaging::averaged_names(*net, false);
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    CHECK(test::identical(swa.average()[i], reference.at(names[i]).toTensor()));
    CHECK(test::identical(net->parameters()[i], reference.at(names[i]).toTensor()));  // transferred at the end
  }
  const StateDict bn = checkpoint::load(dir + "/bn_out.pt");
  CHECK(test::identical(net->bn->running_mean, bn.at("running_mean").toTensor()));
  CHECK(test::identical(net->bn->running_var, bn.at("running_var").toTensor()));
  CHECK(test::identical(net->bn->num_batches_tracked, bn.at("num_batches_tracked").toTensor()));
  CHECK(net->bn->options.momentum() == 0.1);  // put back
}

TEST_CASE("StochasticWeightAveraging's learning rates are Lightning's SWALR schedule", "[weight_averaging]") {
  struct LrProbe {  // after the SWA callback: sees SWALR once installed
    std::vector<double>* lrs;
    void on_train_epoch_start(TrainerView& t) {
      lrs->push_back(t.optimizers().front().optimizer->param_groups().front().options().get_lr());
    }
  };
  torch::manual_seed(5);
  test::Classifier net(8, 16, 3, /*use_sgd=*/true, /*lr=*/0.1);
  auto [train, val] = loaders();
  std::vector<double> lrs;
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, StochasticWeightAveraging, LrProbe> trainer(
      test::quiet({.max_epochs = 7}),
      StochasticWeightAveraging({.swa_lrs = {0.02}, .swa_epoch_start = 0.5, .annealing_epochs = 3,
                                 .annealing_strategy = "linear"}),
      LrProbe{&lrs});
  trainer.fit(net, train);
  // swa_epoch_start = int(0.5 * 7) = 3: SWA from epoch 2 (0-based).
  const std::string dir = test::scratch_folder("swa_lrs");
  python("swalr " + dir + "/lrs.txt 0.1 0.02 linear:3 2 7");
  std::ifstream in(dir + "/lrs.txt");
  int epoch = 0, group = 0;
  std::string config, value;
  std::vector<double> expected;
  while (in >> config >> epoch >> group >> value) expected.push_back(std::strtod(value.c_str(), nullptr));
  REQUIRE(expected.size() == 7);
  CHECK(lrs == expected);
}

TEST_CASE("weight averaging refuses bad options with Lightning's and PyTorch's messages", "[weight_averaging][errors]") {
  using test::message_of;
  CHECK(message_of<MisconfigurationError>([] { EMAWeightAveraging({.decay = 1.5}); }) ==
        "Invalid decay value 1.5 provided. Please provide a value in [0,1] range.");
  CHECK(message_of<MisconfigurationError>([] { StochasticWeightAveraging({.swa_lrs = {-0.1}}); }) ==
        "The `swa_lrs` should a positive float, or a list of positive floats");
  CHECK(message_of<MisconfigurationError>([] { StochasticWeightAveraging({.swa_lrs = {}}); }) ==
        "The `swa_lrs` should a positive float, or a list of positive floats");
  CHECK(message_of<MisconfigurationError>(
            [] { StochasticWeightAveraging({.swa_lrs = {0.1}, .swa_epoch_start = std::int64_t{0}}); }) ==
        "swa_epoch_start should be a >0 integer or a float between 0 and 1.");
  CHECK(message_of<MisconfigurationError>([] { StochasticWeightAveraging({.swa_lrs = {0.1}, .swa_epoch_start = 1.5}); }) ==
        "swa_epoch_start should be a >0 integer or a float between 0 and 1.");
  CHECK(message_of<MisconfigurationError>(
            [] { StochasticWeightAveraging({.swa_lrs = {0.1}, .annealing_strategy = "exp"}); }) ==
        "anneal_strategy must by one of 'cos' or 'linear', instead got exp");
  CHECK(message_of<MisconfigurationError>([] { StochasticWeightAveraging({.swa_lrs = {0.1}, .annealing_epochs = -1}); }) ==
        "anneal_epochs must be equal or greater than 0, got -1");
}

TEST_CASE("StochasticWeightAveraging resumes exactly: before SWA, at an epoch's end, inside an SWA epoch",
          "[weight_averaging][resume]") {
  struct LrProbe {
    std::vector<std::pair<std::int64_t, double>>* lrs;
    void on_train_epoch_start(TrainerView& t) {
      lrs->emplace_back(t.current_epoch(), t.optimizers().front().optimizer->param_groups().front().options().get_lr());
    }
  };
  struct Run {
    Tensors weights, average;
    std::int64_t n_averaged = 0;
    std::vector<std::pair<std::int64_t, double>> lrs;
  };
  const std::string dir = test::scratch_folder("swa_resume");
  auto run = [&](std::int64_t save_at, const std::string& resume) {
    torch::manual_seed(resume.empty() ? 6 : 99);
    test::Classifier net(8, 16, 3, /*use_sgd=*/true, /*lr=*/0.1);
    auto [train, val] = loaders();
    Run out;
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, StochasticWeightAveraging, LrProbe, SaveAt> trainer(
        test::quiet({.max_epochs = 6, .default_root_dir = dir}),
        StochasticWeightAveraging({.swa_lrs = {0.02}, .swa_epoch_start = std::int64_t{3}, .annealing_epochs = 2}),
        LrProbe{&out.lrs}, SaveAt{save_at, dir + "/at.ckpt"});
    trainer.fit(net, train, FitOptions{.ckpt_path = resume});
    out.weights = clones(net->parameters());
    out.average = clones(trainer.callback<StochasticWeightAveraging>().average());
    out.n_averaged = trainer.callback<StochasticWeightAveraging>().n_averaged();
    return out;
  };
  const std::int64_t save_at = GENERATE(12, 24, 27);  // epoch 1 (before SWA), epoch 2's end, inside epoch 3
  INFO("saved after batch " << save_at);
  const Run straight = run(save_at, "");
  CHECK(straight.n_averaged == 4);  // at the starts of epochs 2 to 5
  const StateDict state(StateDict(checkpoint::load(dir + "/at.ckpt").at("callbacks").toGenericDict())
                            .at("StochasticWeightAveraging")
                            .toGenericDict());
  CHECK(state.contains("n_averaged"));
  CHECK(state.contains("latest_update_epoch"));
  CHECK(state.at("scheduler_state").isNone() == (save_at == 12));
  CHECK(state.at("average_model_state").isGenericDict());
  const Run resumed = run(-1, dir + "/at.ckpt");
  CHECK(resumed.n_averaged == straight.n_averaged);
  CHECK(same(resumed.average, straight.average));
  CHECK(same(resumed.weights, straight.weights));
  for (const auto& [epoch, lr] : resumed.lrs) {
    INFO("epoch " << epoch);
    CHECK(lr == straight.lrs.at(static_cast<std::size_t>(epoch)).second);
  }
  CHECK(resumed.lrs.size() >= 3);
}

TEST_CASE("weight averaging keeps the trained weights and says so when it has no average to give",
          "[weight_averaging][errors]") {
  using test::message_of;
  auto contains = [](const std::vector<std::string>& warnings, const std::string& text) {
    return std::any_of(warnings.begin(), warnings.end(), [&](const std::string& w) { return w.find(text) != std::string::npos; });
  };
  // Options that cannot work (a new-user probe: NaN passed the range check, 0 divided by).
  CHECK(message_of<MisconfigurationError>([] { EMAWeightAveraging({.decay = std::nan("")}); }) ==
        "Invalid decay value nan provided. Please provide a value in [0,1] range.");
  CHECK_THAT(message_of<MisconfigurationError>([] { EMAWeightAveraging({.update_every_n_steps = 0}); }),
             Catch::Contains("update_every_n_steps must be at least 1"));
  CHECK_THAT(message_of<MisconfigurationError>([] { EMAWeightAveraging({.update_starting_at_step = -5}); }),
             Catch::Contains("update_starting_at_step is a 0-based step index; got -5"));
  {  // An average never updated (its start beyond the run): Lightning would copy the starting weights in.
    torch::manual_seed(1);
    Net net;
    const at::Tensor initial = net->parameters()[0].detach().clone();
    auto [train, val] = loaders();
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, EMAWeightAveraging> trainer(
        test::quiet({.max_epochs = 2}), EMAWeightAveraging({.update_starting_at_step = 1000}));
    const auto result = trainer.fit(net, train, val);
    CHECK(trainer.callback<EMAWeightAveraging>().n_averaged() == 0);
    CHECK_FALSE(torch::equal(net->parameters()[0].detach(), initial));  // the trained weights kept
    CHECK(contains(result.warnings, "EMAWeightAveraging never updated its average in this fit (16 optimizer steps"));
  }
  {  // SWA in a fit that max_steps ends before its last epoch: no transfer (as Lightning), said.
    torch::manual_seed(1);
    Net net;
    auto [train, val] = loaders();
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, StochasticWeightAveraging> trainer(
        test::quiet({.max_epochs = 4, .max_steps = 20}),
        StochasticWeightAveraging({.swa_lrs = {0.1}, .swa_epoch_start = std::int64_t{1}, .update_bn = [](torch::nn::Module&) {}}));
    const auto result = trainer.fit(net, train);
    CHECK(trainer.callback<StochasticWeightAveraging>().n_averaged() > 0);
    CHECK(contains(result.warnings, "fit stopped in epoch 2, before its last (3): as in Lightning"));
  }
  {  // SWA that never starts.
    torch::manual_seed(1);
    Net net;
    auto [train, val] = loaders();
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, StochasticWeightAveraging> trainer(
        test::quiet({.max_epochs = 2}),
        StochasticWeightAveraging({.swa_lrs = {0.1}, .swa_epoch_start = std::int64_t{10}, .update_bn = [](torch::nn::Module&) {}}));
    const at::Tensor initial = net->parameters()[0].detach().clone();
    const auto result = trainer.fit(net, train);
    CHECK(trainer.callback<StochasticWeightAveraging>().n_averaged() == 0);
    CHECK_FALSE(torch::equal(net->parameters()[0].detach(), initial));  // not the starting weights put back
    CHECK(contains(result.warnings, "StochasticWeightAveraging never started"));
  }
}

TEST_CASE("StochasticWeightAveraging recomputes batch-norm statistics itself with training_step, as the update_bn "
          "option does: bit for bit, mode and momenta put back, in the final checkpoint",
          "[weight_averaging][swa_bn]") {
  const std::int64_t limit = GENERATE(-1, 5);  // all 8 batches, limit_train_batches = 5
  INFO("limit_train_batches " << limit);
  const std::string dir = test::scratch_folder("swa_bn_pass");
  struct Run {
    Tensors tensors;
    bool training = true;
    std::optional<double> momentum;
    std::int64_t forward_only_steps = 0;
    bool trained_in_pass = false;
    Tensors saved_statistics;  // running_mean, running_var in the checkpoint written at the end
  };
  auto run = [&](bool with_option) {
    torch::manual_seed(8);
    ProbeNet net;
    auto [train, val] = loaders();
    // The option path: fulgur::update_bn over the same batches (limit_train_batches of them).
    auto recompute = [&](torch::nn::Module& m) {
      fulgur::detail::BatchNormPass pass(m);
      torch::NoGradGuard no_grad;
      std::int64_t seen = 0;
      for (auto&& batch : train) {
        if (limit >= 0 && seen++ == limit) break;
        net->forward(batch.input);
      }
    };
    TrainerConfig config = test::quiet({.max_epochs = 4, .default_root_dir = dir});
    if (limit >= 0) config.limit_train_batches = limit;
    StochasticWeightAveragingOptions options{
        .swa_lrs = {0.05}, .swa_epoch_start = std::int64_t{2}, .annealing_epochs = 1};
    if (with_option) options.update_bn = recompute;
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, EvalAtTrainEnd, StochasticWeightAveraging,
            SaveAtTrainEnd>
        trainer(config, EvalAtTrainEnd{}, StochasticWeightAveraging(options), SaveAtTrainEnd{dir + "/end.ckpt"});
    trainer.fit(net, train, val);
    const StateDict weights(checkpoint::load(dir + "/end.ckpt").at("state_dict").toGenericDict());
    return Run{module_tensors(*net), net->is_training(), net->bn->options.momentum(), net->forward_only_steps,
               net->trained_in_pass,
               {weights.at("bn.running_mean").toTensor(), weights.at("bn.running_var").toTensor()}};
  };
  const Run option = run(true);
  const Run own = run(false);
  CHECK(option.forward_only_steps == 0);
  CHECK(own.forward_only_steps == (limit >= 0 ? limit : 8));  // one pass over the epoch's batches
  CHECK(own.trained_in_pass);
  CHECK_FALSE(own.training);  // the mode the module had (EvalAtTrainEnd's) put back
  CHECK(own.momentum == 0.1);
  // The checkpoint written at the end (after the pass) holds the recomputed statistics.
  CHECK(test::identical(own.saved_statistics[0], option.saved_statistics[0]));
  CHECK(test::identical(own.saved_statistics[1], option.saved_statistics[1]));
  // Parameters (the average) and buffers (the statistics, num_batches_tracked) equal the option's,
  // which the first SWA test checks against torch's update_bn.
  REQUIRE(own.tensors.size() == option.tensors.size());
  for (std::size_t i = 0; i < own.tensors.size(); ++i) {
    INFO("tensor " << i);
    CHECK(test::identical(own.tensors[i], option.tensors[i]));
  }
}

TEST_CASE("StochasticWeightAveraging's batch-norm pass: no loss, manual optimization, a failure in it, SWA never "
          "started, asked for inside an epoch",
          "[weight_averaging][swa_bn][errors]") {
  using test::message_of;
  {  // Manual optimization with a training_step that returns nothing: its backward and step skipped in the pass.
    torch::manual_seed(9);
    auto net = std::make_shared<ManualNetImpl>();
    auto [x, y] = test::classification_data(64, 3);
    data::TensorLoader train(x, y, {.batch_size = 8});
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, StochasticWeightAveraging> trainer(
        test::quiet({.max_epochs = 3}),
        StochasticWeightAveraging({.swa_lrs = {0.05}, .swa_epoch_start = std::int64_t{2}, .annealing_epochs = 1}));
    const auto result = trainer.fit(*net, train);
    CHECK(result.global_step == 24);  // the pass took no optimizer step
    const Tensors after = module_tensors(*net);
    CHECK(net->bn->num_batches_tracked.item<std::int64_t>() == 8);
    CHECK(test::identical(net->parameters()[0].detach(), trainer.callback<StochasticWeightAveraging>().average()[0]));
    update_bn(train, *net, [&](const data::Batch& b) { net->forward(b.input); });
    CHECK(same(module_tensors(*net), after));  // update_bn's statistics
  }
  {  // A failure inside the pass names it; the module's mode and the momenta are put back.
    torch::manual_seed(10);
    ProbeNet net;
    net->fail_in_pass = true;
    auto [train, val] = loaders();
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, EvalAtTrainEnd, StochasticWeightAveraging> trainer(
        test::quiet({.max_epochs = 2}), EvalAtTrainEnd{},
        StochasticWeightAveraging({.swa_lrs = {0.05}, .swa_epoch_start = std::int64_t{1}}));
    const std::string message = message_of<Error>([&] { trainer.fit(net, train); });
    CHECK_THAT(message, Catch::Contains("StochasticWeightAveraging: recomputing the batch-norm statistics of the "
                                        "averaged weights (a forward-only pass of training_step"));
    CHECK_THAT(message, Catch::Contains("the probe's step failed"));
    CHECK(net->forward_only_steps == 1);
    CHECK_FALSE(net->is_training());
    CHECK(net->bn->options.momentum() == 0.1);
  }
  {  // A fulgur error inside the pass keeps its type (a lost peer stays a DistributedError), prefixed.
    torch::manual_seed(10);
    ProbeNet net;
    net->peer_lost_in_pass = true;
    auto [train, val] = loaders();
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, StochasticWeightAveraging> trainer(
        test::quiet({.max_epochs = 2}), StochasticWeightAveraging({.swa_lrs = {0.05}, .swa_epoch_start = std::int64_t{1}}));
    const std::string message = message_of<DistributedError>([&] { trainer.fit(net, train); });
    CHECK_THAT(message, Catch::StartsWith("StochasticWeightAveraging: recomputing the batch-norm statistics"));
    CHECK_THAT(message, Catch::EndsWith("failed: fulgur: the probe's peer was lost"));
  }
  {  // SWA never started: no pass, the warning.
    torch::manual_seed(11);
    ProbeNet net;
    auto [train, val] = loaders();
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, StochasticWeightAveraging> trainer(
        test::quiet({.max_epochs = 2}),
        StochasticWeightAveraging({.swa_lrs = {0.1}, .swa_epoch_start = std::int64_t{5}}));
    const auto result = trainer.fit(net, train);
    CHECK(net->forward_only_steps == 0);
    CHECK(std::any_of(result.warnings.begin(), result.warnings.end(),
                      [](const std::string& w) { return w.find("never started") != std::string::npos; }));
  }
  {  // The service refuses to run inside a training epoch (the epoch's own pass over the loader).
    struct PassInEpoch {
      void on_train_epoch_start(TrainerView& trainer) { trainer.forward_training_pass("PassInEpoch"); }
    };
    Net net;
    auto [train, val] = loaders();
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, PassInEpoch> trainer(test::quiet({.max_epochs = 1}),
                                                                                      PassInEpoch{});
    CHECK_THAT(message_of<MisconfigurationError>([&] { trainer.fit(net, train); }),
               Catch::Contains("PassInEpoch: a forward pass over the training data cannot run inside a "
                               "training epoch"));
  }
}

TEST_CASE("StochasticWeightAveraging's batch-norm pass: a profiler counts its training_step calls with training's",
          "[weight_averaging][swa_bn]") {
  // docs/weight_averaging.md says so, as Lightning's extra epoch is profiled.
  torch::manual_seed(13);
  ProbeNet net;
  auto [train, val] = loaders();
  const std::string dir = test::scratch_folder("swa_bn_profiler");
  Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, SimpleProfiler, StochasticWeightAveraging> trainer(
      test::quiet({.max_epochs = 2, .default_root_dir = dir}), SimpleProfiler({.filename = "perf", .print = false}),
      StochasticWeightAveraging({.swa_lrs = {0.05}, .swa_epoch_start = std::int64_t{1}}));
  const auto result = trainer.fit(net, train);
  REQUIRE(net->forward_only_steps == 8);
  int rows = 0;
  for (const auto& row : trainer.callback<SimpleProfiler>().rows())
    if (row.action.ends_with(".training_step")) {
      CAPTURE(row.action);
      CHECK(row.calls == result.global_step + net->forward_only_steps);  // 16 trained + 8 in the pass
      ++rows;
    }
  CHECK(rows > 0);
}

TEST_CASE("StochasticWeightAveraging's batch-norm pass converts the batches as training does (double precision)",
          "[weight_averaging][swa_bn]") {
  // A new user's run: DoublePrecision makes the module double; the pass must convert the float batches
  // as training does (a forward on the raw batch would fail with a dtype mismatch).
  torch::manual_seed(12);
  ProbeNet net;
  auto [train, val] = loaders();
  Trainer<CPUAccelerator, SingleDeviceStrategy, DoublePrecision, StochasticWeightAveraging> trainer(
      test::quiet({.max_epochs = 2}),
      StochasticWeightAveraging({.swa_lrs = {0.05}, .swa_epoch_start = std::int64_t{1}, .annealing_epochs = 1}));
  trainer.fit(net, train, val);
  CHECK(net->forward_only_steps == 8);
  CHECK(net->bn->running_mean.scalar_type() == at::kDouble);
  CHECK(net->bn->num_batches_tracked.item<std::int64_t>() == 8);
  CHECK(torch::isfinite(net->bn->running_var).all().item<bool>());
}
