// fulgur::optim's fused optimizers: step for step equal to torch.optim's fused=True (golden values
// from the venv at test time, scripts/make_golden.py), close to LibTorch's unfused optimizers, their
// archives interchangeable with those, and the GradScaler's in-kernel path (a skipped step leaves
// everything untouched, as Python's fused path does, bit for bit).
#include <catch2/catch.hpp>

#include <sstream>

#include "unit/support.hpp"

using namespace fulgur;

namespace {

using Params = std::vector<at::Tensor>;

/// scripts/make_golden.py's FUSED scenarios: the fused optimizer, or LibTorch's own with the same options.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name, const Params& params, bool fused) {
  using namespace torch::optim;
  auto pick = [&](auto* fused_type, auto* unfused_type, auto options) -> std::unique_ptr<Optimizer> {
    using Fused = std::remove_pointer_t<decltype(fused_type)>;
    using Unfused = std::remove_pointer_t<decltype(unfused_type)>;
    if (fused) return std::make_unique<Fused>(params, options);
    return std::make_unique<Unfused>(params, options);
  };
  if (name == "adam")
    return pick((optim::FusedAdam*)nullptr, (Adam*)nullptr,
                AdamOptions(1e-2).betas({0.9, 0.99}).eps(1e-8).weight_decay(0.01));
  if (name == "adam_amsgrad")
    return pick((optim::FusedAdam*)nullptr, (Adam*)nullptr, AdamOptions(1e-2).betas({0.8, 0.9}).eps(1e-6).amsgrad(true));
  if (name == "adamw")
    return pick((optim::FusedAdamW*)nullptr, (AdamW*)nullptr,
                AdamWOptions(1e-2).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.05));
  if (name == "sgd") return pick((optim::FusedSGD*)nullptr, (SGD*)nullptr, SGDOptions(0.1));
  if (name == "sgd_momentum")
    return pick((optim::FusedSGD*)nullptr, (SGD*)nullptr, SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(1e-3));
  if (name == "sgd_nesterov")
    return pick((optim::FusedSGD*)nullptr, (SGD*)nullptr, SGDOptions(0.05).momentum(0.8).nesterov(true).weight_decay(1e-2));
  throw std::invalid_argument(name);
}

const std::vector<std::string> kScenarios{"adam", "adam_amsgrad", "adamw", "sgd", "sgd_momentum", "sgd_nesterov"};

/// The optimizer state of `param` by Python's key (step, exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer).
at::Tensor state_tensor(torch::optim::Optimizer& optimizer, const at::Tensor& param, const std::string& key) {
  auto& state = *optimizer.state().at(param.unsafeGetTensorImpl());
  if (key == "momentum_buffer") return static_cast<torch::optim::SGDParamState&>(state).momentum_buffer();
  if (auto* adam = dynamic_cast<optim::detail::FusedStepState<torch::optim::AdamParamState>*>(&state)) {
    if (key == "step") return adam->step_count;
    if (key == "exp_avg") return adam->exp_avg();
    if (key == "exp_avg_sq") return adam->exp_avg_sq();
    if (key == "max_exp_avg_sq") return adam->max_exp_avg_sq();
  }
  if (auto* adamw = dynamic_cast<optim::detail::FusedStepState<torch::optim::AdamWParamState>*>(&state)) {
    if (key == "step") return adamw->step_count;
    if (key == "exp_avg") return adamw->exp_avg();
    if (key == "exp_avg_sq") return adamw->exp_avg_sq();
    if (key == "max_exp_avg_sq") return adamw->max_exp_avg_sq();
  }
  throw std::invalid_argument("no state '" + key + "'");
}

/// Every "<prefix>state.a.KEY" entry of the golden file equals the optimizer's state of `a`; with
/// none (SGD without momentum), the optimizer holds none either.
void check_state(torch::optim::Optimizer& optimizer, const at::Tensor& a, std::map<std::string, at::Tensor>& golden,
                 const std::string& prefix) {
  const bool has_state = optimizer.state().count(a.unsafeGetTensorImpl()) == 1;
  int checked = 0;
  for (const auto& [key, value] : golden) {
    if (key.rfind(prefix + "state.a.", 0) != 0) continue;
    const std::string name = key.substr(prefix.size() + 8);
    INFO("state " << name);
    REQUIRE(has_state);
    CHECK(test::identical(state_tensor(optimizer, a, name), value));
    ++checked;
  }
  CHECK(has_state == (checked > 0));
}

using test::archive_bytes;
void load_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes) { test::load_archive_bytes(optimizer, bytes); }

}  // namespace

TEST_CASE("Fused optimizers equal torch.optim's fused=True step for step", "[optim][golden]") {
  for (const auto& name : kScenarios) {
    INFO(name);
    auto g = test::read_golden("fused_" + name + ".txt");
    auto a = g["init.a"].clone().requires_grad_(true);
    auto b = g["init.b"].clone().requires_grad_(true);
    auto optimizer = make_optimizer(name, {a, b}, /*fused=*/true);
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      const std::string s = std::to_string(step);
      a.mutable_grad() = g["grad" + s + ".a"].clone();
      b.mutable_grad() = g["grad" + s + ".b"].clone();
      optimizer->step();
      CHECK(test::identical(a.detach(), g["step" + s + ".a"]));
      CHECK(test::identical(b.detach(), g["step" + s + ".b"]));
    }
    check_state(*optimizer, a, g, "");
  }
}

TEST_CASE("Fused optimizers stay within 1e-6 of LibTorch's unfused ones", "[optim]") {
  // The kernels fold each update into one expression per element (and vectorize it), where LibTorch's
  // optimizers round after each of their ten ops: the two drift apart by a few ulps a step.
  for (const auto& name : kScenarios) {
    INFO(name);
    auto g = test::read_golden("fused_" + name + ".txt");
    Params fused_params{g["init.a"].clone().requires_grad_(true), g["init.b"].clone().requires_grad_(true)};
    Params plain_params{g["init.a"].clone().requires_grad_(true), g["init.b"].clone().requires_grad_(true)};
    auto fused = make_optimizer(name, fused_params, true);
    auto plain = make_optimizer(name, plain_params, false);
    for (int step = 0; step < 5; ++step) {
      const std::string s = std::to_string(step);
      for (Params* params : {&fused_params, &plain_params}) {
        (*params)[0].mutable_grad() = g["grad" + s + ".a"].clone();
        (*params)[1].mutable_grad() = g["grad" + s + ".b"].clone();
      }
      fused->step();
      plain->step();
    }
    for (std::size_t i = 0; i < 2; ++i)
      CHECK(torch::allclose(fused_params[i], plain_params[i], /*rtol=*/1e-6, /*atol=*/1e-6));
  }
}

TEST_CASE("Fused and unfused optimizers load each other's archives", "[optim][checkpoint]") {
  for (const auto& name : kScenarios) {
    INFO(name);
    auto g = test::read_golden("fused_" + name + ".txt");
    auto run = [&](torch::optim::Optimizer& optimizer, Params& params, int from, int to) {
      for (int step = from; step < to; ++step) {
        params[0].mutable_grad() = g["grad" + std::to_string(step) + ".a"].clone();
        params[1].mutable_grad() = g["grad" + std::to_string(step) + ".b"].clone();
        optimizer.step();
      }
    };
    // LibTorch's optimizer for 2 steps, then the fused one from its archive for 3: equal to the
    // golden 5 fused steps within the unfused drift, and its archive back in LibTorch's optimizer
    // holds the step count 5.
    Params params{g["init.a"].clone().requires_grad_(true), g["init.b"].clone().requires_grad_(true)};
    auto plain = make_optimizer(name, params, false);
    run(*plain, params, 0, 2);
    auto fused = make_optimizer(name, params, true);
    load_bytes(*fused, archive_bytes(*plain));
    run(*fused, params, 2, 5);
    CHECK(torch::allclose(params[0], g["step4.a"], 1e-6, 1e-6));
    CHECK(torch::allclose(params[1], g["step4.b"], 1e-6, 1e-6));
    auto back = make_optimizer(name, params, false);
    load_bytes(*back, archive_bytes(*fused));
    REQUIRE(back->state().size() == fused->state().size());
    if (back->state().empty()) continue;  // SGD without momentum keeps none
    const auto& state = *back->state().at(params[0].unsafeGetTensorImpl());
    if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
      CHECK(adam->step() == 5);
      CHECK(test::identical(adam->exp_avg(), state_tensor(*fused, params[0], "exp_avg")));
    }
    if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) CHECK(adamw->step() == 5);
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&state))
      CHECK(test::identical(sgd->momentum_buffer(), state_tensor(*fused, params[0], "momentum_buffer")));
    // Fused to fused: the step count survives on the device.
    auto again = make_optimizer(name, params, true);
    load_bytes(*again, archive_bytes(*fused));
    if (name.rfind("adam", 0) == 0) {
      Params copy{params[0].detach().clone().requires_grad_(true), params[1].detach().clone().requires_grad_(true)};
      run(*again, params, 0, 1);  // the step makes the device count from the loaded integer
      CHECK(state_tensor(*again, params[0], "step").item<float>() == 6.0f);
    }
  }
}

TEST_CASE("Under the GradScaler a fused optimizer equals Python's fused path bit for bit, skipped step included",
          "[optim][scaler][golden]") {
  for (const auto& name : kScenarios) {
    INFO(name);
    auto g = test::read_golden("fused_" + name + "_scaled.txt");
    auto a = g["init.a"].clone().requires_grad_(true);
    auto b = g["init.b"].clone().requires_grad_(true);
    auto optimizer = make_optimizer(name, {a, b}, true);
    GradScaler scaler({.init_scale = 1024.0, .growth_interval = 2});
    at::Tensor a_before, b_before;
    std::map<std::string, at::Tensor> state_before;
    for (int step = 0; step < 6; ++step) {
      INFO("step " << step);
      const std::string s = "scaled" + std::to_string(step) + ".";
      // Python's loss op for op, term by term left to right: the operands of + have no evaluation order
      // in C++ (g++ and clang differ), and the graph's order decides the order in which a[i][0]'s
      // gradient contributions are summed, which moves the last bit (a * a's two would too).
      auto loss = a.pow(2).sum() * 0.5;
      loss = loss + (b * torch::arange(5.0)).sum();
      const at::Tensor column = a.select(1, 0), head = b.narrow(0, 0, 4);
      loss = loss + (column * head).sum();
      scaler.scale(loss).backward();
      if (step == 2) {
        torch::NoGradGuard no_grad;
        b.mutable_grad()[1] = std::numeric_limits<double>::infinity();
      }
      a_before = a.detach().clone();
      b_before = b.detach().clone();
      if (step == 2)
        for (const char* key : {"step", "exp_avg", "exp_avg_sq", "momentum_buffer"})
          if (g.count(s + "state.a." + key)) state_before[key] = state_tensor(*optimizer, a, key).clone();
      const bool stepped = scaler.step(*optimizer);
      scaler.update();
      optimizer->zero_grad();
      CHECK(stepped == (step != 2));
      CHECK(test::identical(a.detach(), g[s + "a"]));
      CHECK(test::identical(b.detach(), g[s + "b"]));
      CHECK(scaler.get_scale() == g[s + "scale"].item<double>());
      check_state(*optimizer, a, g, s);
      if (step == 2) {  // the skipped step: parameters and state as they were
        CHECK(test::identical(a.detach(), a_before));
        CHECK(test::identical(b.detach(), b_before));
        for (const auto& [key, before] : state_before) CHECK(test::identical(state_tensor(*optimizer, a, key), before));
      }
    }
  }
}

namespace {

/// A ScaledStepOptimizer that records what the GradScaler hands it.
struct RecordingOptimizer : optim::ScaledStepOptimizer {
  explicit RecordingOptimizer(std::vector<at::Tensor> params)
      : ScaledStepOptimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                            std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  at::Tensor step(LossClosure) override {
    ++plain_steps;
    return {};
  }
  void scaled_step(const std::optional<at::Tensor>& grad_scale, const at::Tensor& found_inf) override {
    scale = grad_scale ? std::optional<double>(grad_scale->item<double>()) : std::nullopt;
    inf = found_inf.item<double>();
    grad_seen = param_groups()[0].params()[0].grad().clone();
  }
  int plain_steps = 0;
  std::optional<double> scale;
  double inf = -1;
  at::Tensor grad_seen;
};

}  // namespace

TEST_CASE("GradScaler hands a ScaledStepOptimizer the scale and the flag instead of unscaling", "[optim][scaler]") {
  auto p = torch::ones({3}).requires_grad_(true);
  RecordingOptimizer optimizer({p});
  GradScaler scaler({.init_scale = 8.0});
  scaler.scale((p * 2).sum()).backward();
  CHECK(scaler.step(optimizer));
  CHECK(optimizer.plain_steps == 0);
  REQUIRE(optimizer.scale.has_value());
  CHECK(*optimizer.scale == 8.0);
  CHECK(optimizer.inf == 0.0);
  CHECK(test::identical(optimizer.grad_seen, torch::full({3}, 16.0)));  // still scaled: no unscaling pass
  scaler.update();
  // After unscale_ (as clipping does), no scale: the gradients are true ones already.
  p.mutable_grad() = at::Tensor();
  scaler.scale((p * 2).sum()).backward();
  scaler.unscale_(optimizer);
  CHECK(scaler.step(optimizer));
  CHECK_FALSE(optimizer.scale.has_value());
  CHECK(optimizer.inf == 0.0);  // the flag unscale_ recorded
  CHECK(test::identical(optimizer.grad_seen, torch::full({3}, 2.0)));
  scaler.update();
  // An inf among the scaled gradients: flagged for the kernel, which skips on the device.
  p.mutable_grad() = at::Tensor();
  scaler.scale((p * 2).sum()).backward();
  p.mutable_grad()[1] = std::numeric_limits<double>::quiet_NaN();
  CHECK_FALSE(scaler.step(optimizer));
  CHECK(optimizer.inf == 1.0);
  CHECK(optimizer.plain_steps == 0);
}

TEST_CASE("FusedSGD: a skipped first step leaves no momentum buffer (Python's keeps uninitialised memory)",
          "[optim][scaler]") {
  // With momentum, the first real step must start the buffer from the gradient: as LibTorch's SGD does.
  auto run = [](bool fused) {
    auto p = torch::ones({3}).requires_grad_(true);
    auto optimizer = make_optimizer("sgd_momentum", {p}, fused);
    GradScaler scaler({.init_scale = 8.0});
    for (int step = 0; step < 3; ++step) {
      scaler.scale((p * torch::arange(1.0, 4.0)).sum()).backward();
      if (step == 0) {
        torch::NoGradGuard no_grad;
        p.mutable_grad()[0] = std::numeric_limits<double>::quiet_NaN();
      }
      const bool stepped = scaler.step(*optimizer);
      CHECK(stepped == (step != 0));
      if (step == 0) CHECK(optimizer->state().count(p.unsafeGetTensorImpl()) == 0);
      scaler.update();
      optimizer->zero_grad();
    }
    return p.detach().clone();
  };
  const auto fused = run(true), plain = run(false);
  CHECK(torch::allclose(fused, plain, 1e-6, 1e-7));
  CHECK(fused.isfinite().all().item<bool>());
}

TEST_CASE("Fused optimizers refuse bad options and parameters with the reason", "[optim][errors]") {
  auto p = torch::ones({2}).requires_grad_(true);
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { optim::FusedAdam({p}, torch::optim::AdamOptions(-1)); }),
             Catch::Contains("FusedAdam: lr must be >= 0, got -1"));
  CHECK_THAT(test::message_of<MisconfigurationError>(
                 [&] { optim::FusedAdamW({p}, torch::optim::AdamWOptions(1e-3).betas({0.9, 1.0})); }),
             Catch::Contains("FusedAdamW: betas[1] must be in [0, 1), got 1"));
  CHECK_THAT(test::message_of<MisconfigurationError>(
                 [&] { optim::FusedSGD({p}, torch::optim::SGDOptions(0.1).nesterov(true)); }),
             Catch::Contains("Nesterov momentum requires a momentum > 0 and zero dampening"));
  auto whole = torch::ones({2}, at::kLong);
  auto floating = torch::ones({2}).requires_grad_(true);
  optim::FusedSGD sgd({floating}, torch::optim::SGDOptions(0.1));
  floating.mutable_grad() = torch::ones({2});
  sgd.param_groups()[0].params().push_back(whole);
  whole.mutable_grad() = torch::ones({2}, at::kLong);
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { sgd.step(); }),
             Catch::Contains("runs on floating-point tensors on the CPU or a CUDA device; a parameter is Long on cpu"));
  auto sparse = torch::ones({2}).requires_grad_(true);
  optim::FusedAdam adam({sparse});
  sparse.mutable_grad() = torch::ones({2}).to_sparse();
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { adam.step(); }), Catch::Contains("sparse gradients"));
}

namespace {

/// The unit tests' classifier with a fused optimizer, and what on_before_optimizer_step saw.
struct FusedClassifierImpl : test::ClassifierImpl {
  explicit FusedClassifierImpl(bool fused) : fused(fused) {}
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    if (fused) return std::make_unique<optim::FusedAdam>(parameters(), torch::optim::AdamOptions(1e-2));
    return std::make_unique<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2));
  }
  void on_before_optimizer_step(torch::optim::Optimizer&) { grad_norms.push_back(fc1->weight.grad().norm().item<double>()); }
  bool fused;
  std::vector<double> grad_norms;
};
TORCH_MODULE(FusedClassifier);

}  // namespace

TEST_CASE("fit with a fused optimizer under '16-mixed': no unscaling pass, the same run as the unfused one",
          "[optim][fit]") {
  const auto [x, y] = test::classification_data(256);
  auto run = [&](bool fused, std::optional<double> clip) {
    torch::manual_seed(0);
    FusedClassifier model(fused);
    test::CpuTrainer<FP16MixedPrecision> trainer(
        test::quiet({.max_epochs = 2, .gradient_clip_val = clip}));
    trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 32}));
    return std::pair{test::snapshot(*model), model->grad_norms};
  };
  const auto [plain, plain_norms] = run(false, std::nullopt);
  const auto [fused, fused_norms] = run(true, std::nullopt);
  REQUIRE(plain_norms.size() == fused_norms.size());
  // The hook saw the gradients still scaled (by 65536 at first), as in Lightning with a fused optimizer.
  CHECK(fused_norms.front() == Approx(plain_norms.front() * 65536.0).epsilon(1e-4));
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::allclose(plain[i], fused[i], 1e-4, 1e-5));
  // Clipping unscales first (Lightning refuses clipping with fused optimizers): the same run again.
  const auto [plain_clipped, plain_clipped_norms] = run(false, 0.5);
  const auto [fused_clipped, fused_clipped_norms] = run(true, 0.5);
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::allclose(plain_clipped[i], fused_clipped[i], 1e-4, 1e-5));
}

TEST_CASE("Fused optimizers refuse a loaded state of other shapes, and convert another dtype", "[optim][checkpoint]") {
  // Found by a probe: the kernels trust sizes, so a state saved over other parameters corrupted memory.
  auto small = torch::randn({4}).requires_grad_(true);
  torch::optim::Adam adam({small});
  torch::optim::SGD sgd({small}, torch::optim::SGDOptions(0.1).momentum(0.9));
  small.mutable_grad() = torch::randn({4});
  adam.step();
  sgd.step();
  auto large = torch::randn({7000}).requires_grad_(true);
  large.mutable_grad() = torch::ones_like(large);
  optim::FusedAdam fused_adam({large});
  test::load_archive_bytes(fused_adam, test::archive_bytes(adam));
  CHECK_THAT(test::message_of<CheckpointError>([&] { fused_adam.step(); }),
             Catch::Contains("FusedAdam: the optimizer state's exp_avg has shape [4], its parameter [7000]"));
  optim::FusedSGD fused_sgd({large}, torch::optim::SGDOptions(0.1).momentum(0.9));
  CHECK_THAT(test::message_of<CheckpointError>([&] { test::load_archive_bytes(fused_sgd, test::archive_bytes(sgd)); }),
             Catch::Contains("FusedSGD: the optimizer state's momentum_buffer has shape [4], its parameter [7000]"));
  // A float32 state into float64 parameters: converted (Python's load_state_dict casts it).
  auto wide = torch::randn({4}, at::kDouble).requires_grad_(true);
  wide.mutable_grad() = torch::ones_like(wide);
  optim::FusedAdam wide_adam({wide});
  test::load_archive_bytes(wide_adam, test::archive_bytes(adam));
  wide_adam.step();
  CHECK(state_tensor(wide_adam, wide, "exp_avg").scalar_type() == at::kDouble);
  CHECK(state_tensor(wide_adam, wide, "step").item<float>() == 2.0f);
  optim::FusedSGD wide_sgd({wide}, torch::optim::SGDOptions(0.1).momentum(0.9));
  test::load_archive_bytes(wide_sgd, test::archive_bytes(sgd));
  wide_sgd.step();
  CHECK(wide.isfinite().all().item<bool>());
}

TEST_CASE("Fused optimizers check every parameter when made, amsgrad may be turned on mid-run", "[optim][errors]") {
  auto whole = torch::ones({2}, at::kLong);
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { optim::FusedAdam({whole}); }),
             Catch::Contains("FusedAdam runs on floating-point tensors on the CPU or a CUDA device; a parameter is Long"));
  auto p = torch::ones({2}).requires_grad_(true);
  optim::FusedAdam adam({p});
  p.mutable_grad() = torch::ones({2});
  adam.step();
  static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options()).amsgrad(true);
  adam.step();
  CHECK(state_tensor(adam, p, "max_exp_avg_sq").defined());
}

TEST_CASE("Fused optimizers over no parameters are refused when made, as Python's optimizers are", "[optim][errors]") {
  // Found by the new-user probe: an optimizer over nothing (a module whose layers were not registered yet)
  // was made, and fit trained nothing.
  const std::vector<at::Tensor> none;
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { optim::FusedAdam made(none); }),
             Catch::Contains("fulgur: FusedAdam got an empty parameter list; pass it the tensors to optimize"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { optim::FusedAdamW(none, torch::optim::AdamWOptions(1e-3)); }),
             Catch::Contains("fulgur: FusedAdamW got an empty parameter list"));
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { optim::FusedSGD(none, torch::optim::SGDOptions(0.1)); }),
             Catch::Contains("fulgur: FusedSGD got an empty parameter list"));
  // Param groups, all empty: nothing to optimize either. Zero groups too.
  const std::vector<torch::optim::OptimizerParamGroup> empty_groups{torch::optim::OptimizerParamGroup(none),
                                                                    torch::optim::OptimizerParamGroup(none)};
  CHECK_THAT(test::message_of<MisconfigurationError>([&] { optim::FusedAdamW made(empty_groups); }),
             Catch::Contains("FusedAdamW got an empty parameter list"));
  CHECK_THAT(test::message_of<MisconfigurationError>(
                 [&] { optim::FusedSGD(std::vector<torch::optim::OptimizerParamGroup>{}, torch::optim::SGDOptions(0.1)); }),
             Catch::Contains("FusedSGD got an empty parameter list"));
  // One group with parameters is enough.
  auto p = torch::ones({2}).requires_grad_(true);
  const std::vector<torch::optim::OptimizerParamGroup> one_full{torch::optim::OptimizerParamGroup(none),
                                                                torch::optim::OptimizerParamGroup({p})};
  CHECK_NOTHROW(optim::FusedAdam(one_full, torch::optim::AdamOptions(1e-3)));
}
