// One rank of a ShardedStrategy test, started by torchrun (2 or 3 ranks, Gloo) with the scenario as
// argv[1]. Each rank checks its own results; a failure exits non-zero with the reason. Global rank
// 0 prints "PASS <scenario>" at the end.
#include <fulgur/detail/files.hpp>
#include <fulgur/fulgur.hpp>

#include "worker.hpp"
#include <torch/torch.h>

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>

using namespace fulgur;
using DDP = BasicDDPStrategy<backend::Gloo>;
using Zero1 = ShardedStrategy<1, backend::Gloo>;

namespace {

using worker::check;
using worker::my_rank;
using worker::options;

int world_from_environment() {
  const char* w = std::getenv("WORLD_SIZE");
  return w ? std::atoi(w) : 1;
}

TrainerConfig config(TrainerConfig c = {}) {
  c.enable_progress_bar = false;
  c.devices = world_from_environment();
  return c;
}

// 8*33 + 33 + 33*5 + 5 = 467 parameters: divisible by neither 2 nor 3, so shards are padded.
struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 33))), fc2(register_module("fc2", torch::nn::Linear(33, 5))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

std::pair<at::Tensor, at::Tensor> dataset(std::int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto x = at::randn({n, 8}, gen);
  auto y = (x.select(1, 0) > 0).to(at::kLong) + (x.select(1, 1) > 0.5).to(at::kLong) + (x.select(1, 2) > 1).to(at::kLong);
  return {x, y};
}

/// The weights after training a fresh M under strategy S and precision P (same seed, data, schedule).
template <class S, class P, class M = Net>
std::vector<at::Tensor> train(TrainerConfig c, DDPOptions o = options()) {
  torch::manual_seed(3);
  M model;
  auto [x, y] = dataset(240);
  data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
  Trainer<CPUAccelerator, S, P> trainer(config(c), o);
  my_rank = trainer.global_rank();
  trainer.fit(model, loader);
  std::vector<at::Tensor> weights;
  for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
  return weights;
}

double max_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i].to(at::kDouble) - b[i].to(at::kDouble)).abs().max().item<double>());
  return d;
}

/// Elements of Adam(W)'s per-parameter state (exp_avg, exp_avg_sq) the optimizer holds on this rank.
std::int64_t adam_state_elements(torch::optim::Optimizer& optimizer) {
  std::int64_t n = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*state);
    n += adam.exp_avg().numel() + adam.exp_avg_sq().numel();
  }
  return n;
}

// ---- scenarios ----------------------------------------------------------------------------------

/// Stage 1 trains exactly as DDP: the optimizer's update is element by element, so stepping a shard
/// of the flat parameters is the same arithmetic as stepping each parameter; unscaling and clipping
/// see the whole gradients, as under DDP.
template <class P>
void parity_for(const std::string& precision) {
  const TrainerConfig plain{.max_epochs = 2};
  const auto ddp = train<DDP, P>(plain), sharded = train<Zero1, P>(plain);
  check(max_difference(ddp, sharded) == 0.0, precision + ": ShardedStrategy<1> weights bit-identical to DDP's (max "
                                                          "difference " + std::to_string(max_difference(ddp, sharded)) + ")");
  TrainerConfig clipped{.max_epochs = 2};
  clipped.gradient_clip_val = 0.05;  // small enough to clip on most steps
  const auto ddp_clipped = train<DDP, P>(clipped), sharded_clipped = train<Zero1, P>(clipped);
  check(max_difference(ddp_clipped, sharded_clipped) == 0.0,
        precision + ": with clipping by norm, bit-identical to DDP (max difference " +
            std::to_string(max_difference(ddp_clipped, sharded_clipped)) + ")");
  check(max_difference(ddp_clipped, ddp) > 1e-3, precision + ": clipping changed the run (else the check above is empty)");
}

// What a new user tried (each was wrong or refused before): a frozen parameter under weight decay,
// LibTorch's Adagrad (state made in its constructor), gradients replaced in a hook before clipping,
// manual optimization of a GAN (toggle_optimizer, each optimizer's zero_grad).
struct FrozenImpl : NetImpl {
  FrozenImpl() { fc1->bias.requires_grad_(false); }
};
TORCH_MODULE(Frozen);
struct AdagradNetImpl : NetImpl {
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::Adagrad>(parameters(), torch::optim::AdagradOptions(0.05).weight_decay(0.01));
  }
};
TORCH_MODULE(AdagradNet);
struct GradHookImpl : NetImpl {
  void on_after_backward() {
    for (auto& p : parameters()) p.mutable_grad() = p.grad() * 3.0;
  }
};
TORCH_MODULE(GradHook);
struct GanImpl : NetImpl {
  static constexpr bool automatic_optimization = false;
  void training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    auto& first = ctx.optimizer(0);
    auto& second = ctx.optimizer(1);
    ctx.toggle_optimizer(first);
    first.zero_grad();
    ctx.manual_backward(torch::nn::functional::cross_entropy(forward(b.input), b.target));
    first.step();
    ctx.untoggle_optimizer(first);
    ctx.toggle_optimizer(second);
    second.zero_grad();
    ctx.manual_backward(torch::nn::functional::cross_entropy(forward(b.input * 0.5), b.target));
    ctx.clip_gradients(second, {.max_norm = 0.05});
    second.step();
    ctx.untoggle_optimizer(second);
  }
  std::vector<OptimizerConfig> configure_optimizers() {
    std::vector<OptimizerConfig> configs;
    configs.push_back({std::make_unique<torch::optim::Adam>(fc1->parameters(), 1e-2)});
    configs.push_back({std::make_unique<torch::optim::SGD>(fc2->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9))});
    return configs;
  }
};
TORCH_MODULE(Gan);
struct TiedImpl : NetImpl {  // LibTorch's parameters() lists fc2's weights twice
  TiedImpl() { register_module("fc2_again", fc2); }
};
TORCH_MODULE(Tied);

void variants() {
  TrainerConfig clipped{.max_epochs = 1};
  clipped.gradient_clip_val = 0.05;
  DDPOptions unused = options();
  unused.find_unused_parameters = true;  // each GAN half leaves the other without gradient
  const std::pair<std::string, double> results[] = {
      {"frozen parameter", max_difference(train<DDP, FloatPrecision, Frozen>({.max_epochs = 1}),
                                          train<Zero1, FloatPrecision, Frozen>({.max_epochs = 1}))},
      {"Adagrad", max_difference(train<DDP, FloatPrecision, AdagradNet>({.max_epochs = 1}),
                                 train<Zero1, FloatPrecision, AdagradNet>({.max_epochs = 1}))},
      {"gradients replaced in on_after_backward, then clipped",
       max_difference(train<DDP, FloatPrecision, GradHook>(clipped), train<Zero1, FloatPrecision, GradHook>(clipped))},
      {"manual optimization, two optimizers, toggled",
       max_difference(train<DDP, FloatPrecision, Gan>({.max_epochs = 1}, unused),
                      train<Zero1, FloatPrecision, Gan>({.max_epochs = 1}, unused))},
  };
  train<Zero1, FloatPrecision, Tied>({.max_epochs = 1});  // packed once, stepped once (it threw before)
  for (const auto& [what, difference] : results)
    check(difference == 0.0, what + ": ShardedStrategy<1> equals DDP bit for bit (max difference " +
                                 std::to_string(difference) + ")");
}

void parity() {
  parity_for<FloatPrecision>("32-true");
  parity_for<BF16MixedPrecision>("bf16-mixed");
  parity_for<FP16MixedPrecision>("16-mixed");
  parity_for<DoublePrecision>("64-true");
}

/// Each rank keeps the optimizer state of its 1/N of the parameters (padded to N equal shards).
void memory() {
  const int world = world_from_environment();
  torch::manual_seed(3);
  Net model;
  Trainer<CPUAccelerator, Zero1, FloatPrecision> trainer(config(), options());
  my_rank = trainer.global_rank();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.01));
  trainer.setup(model, optimizer);
  auto [x, y] = dataset(16);
  trainer.backward(model->training_step({x, y}, 0));
  trainer.optimizer_step(optimizer);
  const std::int64_t full = 467, shard = (full + world - 1) / world;
  const auto& shards = trainer.strategy().optimizer_shards();
  check(shards.size() == 1 && shards[0]->full_numel() == full && shards[0]->shard_numel() == shard,
        "one shard of " + std::to_string(shard) + " of " + std::to_string(full) + " elements");
  check(adam_state_elements(optimizer) == 2 * shard,
        "AdamW keeps exp_avg and exp_avg_sq for the shard only: " + std::to_string(adam_state_elements(optimizer)) +
            " elements, expected " + std::to_string(2 * shard));
  // The module's weights are whole on every rank, and equal on all.
  for (const auto& p : model->parameters()) {
    const auto gathered = trainer.all_gather(p.detach());
    for (int r = 1; r < world; ++r) check(torch::equal(gathered[0], gathered[r]), "replicas identical after the step");
  }
  if (my_rank == 0)
    std::cout << "optimizer state per rank: " << adam_state_elements(optimizer) << " elements of " << 2 * full
              << " (world " << world << ")" << std::endl;
}

/// '16-mixed': an overflow on one rank reaches every rank's whole gradients through the all-reduce,
/// so every rank's scaler (which checks the whole gradients, not its shard) skips the step and
/// backs off alike, and no rank gathers a half-stepped model.
void overflow() {
  const int world = world_from_environment();
  torch::manual_seed(3);
  Net model;
  Trainer<CPUAccelerator, Zero1, FP16MixedPrecision> trainer(config(), options());
  my_rank = trainer.global_rank();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.01));
  trainer.setup(model, optimizer);
  auto [x, y] = dataset(16);
  auto step = [&](bool overflow_here) {
    optimizer.zero_grad();
    at::Tensor loss;
    {
      auto autocast = trainer.forward_context();
      loss = model->training_step({x, y}, 0);
    }
    if (overflow_here) loss = loss * std::numeric_limits<float>::max();
    trainer.backward(loss);
    return trainer.optimizer_step(optimizer);
  };
  check(step(false), "a clean step runs");
  std::vector<at::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
  const double scale = trainer.precision().scaler().get_scale();
  check(!step(my_rank == world - 1), "every rank skips the step that overflowed on the last rank");
  check(trainer.precision().scaler().get_scale() == scale / 2, "every rank backed off its scale");
  check(max_difference(before, model->parameters()) == 0.0, "the skipped step left the weights alone");
  check(step(false), "the next step runs");
  for (const auto& p : model->parameters()) {
    const auto gathered = trainer.all_gather(p.detach());
    for (int r = 1; r < world; ++r) check(torch::equal(gathered[0], gathered[r]), "replicas identical");
  }
}

/// A checkpoint written under stage 1 resumes bit for bit on as many ranks; its weights load
/// into a single-device model; a DDP optimizer state does not load into a sharded run (an error).
void checkpoints(const std::string& dir) {
  if (std::getenv("RANK") && std::string(std::getenv("RANK")) == "0") fulgur::detail::remove_tree(dir);  // no stale files
  auto [x, y] = dataset(240);
  auto fit = [&](std::int64_t epochs, const std::string& resume, const std::string& save) {
    torch::manual_seed(3);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
    Trainer<CPUAccelerator, Zero1, FloatPrecision> trainer(config({.max_epochs = epochs, .default_root_dir = dir}), options());
    my_rank = trainer.global_rank();
    trainer.fit(model, loader, FitOptions{.ckpt_path = resume});
    if (!save.empty()) trainer.save_checkpoint(save);
    std::vector<at::Tensor> weights;
    for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
    return weights;
  };
  const auto straight = fit(3, "", "");
  fit(1, "", dir + "/one_epoch.ckpt");
  const auto resumed = fit(3, dir + "/one_epoch.ckpt", "");
  check(max_difference(straight, resumed) == 0.0,
        "resumed from epoch 1 equals the straight run bit for bit (max difference " +
            std::to_string(max_difference(straight, resumed)) + ")");
  // The checkpoint's weights are whole: a single-device model loads them.
  {
    torch::manual_seed(4);
    Net single;
    checkpoint::load_module_state_dict(*single, checkpoint::module_weights(checkpoint::load(dir + "/one_epoch.ckpt")));
    const auto after_one = fit(1, "", "");
    std::vector<at::Tensor> loaded;
    for (const auto& p : single->parameters()) loaded.push_back(p.detach().clone());
    check(max_difference(after_one, loaded) == 0.0, "the checkpoint's weights load into a single-device model");
  }
  // A DDP checkpoint's optimizer state is whole, not sharded: resuming it under stage 1 is an error.
  {
    torch::manual_seed(3);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8});
    Trainer<CPUAccelerator, DDP, FloatPrecision> ddp(config({.max_epochs = 1, .default_root_dir = dir}), options());
    ddp.fit(model, loader);
    ddp.save_checkpoint(dir + "/ddp.ckpt");
  }
  std::string message;
  try {
    fit(2, dir + "/ddp.ckpt", "");
  } catch (const CheckpointError& e) {
    message = e.what();
  }
  check(message.find("not a sharded one") != std::string::npos, "a DDP optimizer state is refused: " + message);
  // And the other way: a sharded optimizer state resumed under DDP says what it is.
  message.clear();
  try {
    torch::manual_seed(3);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8});
    Trainer<CPUAccelerator, DDP, FloatPrecision> ddp(config({.max_epochs = 2, .default_root_dir = dir}), options());
    ddp.fit(model, loader, FitOptions{.ckpt_path = dir + "/one_epoch.ckpt"});
  } catch (const CheckpointError& e) {
    message = e.what();
  }
  check(message.find("written under ShardedStrategy") != std::string::npos, "a sharded state under DDP: " + message);
}

/// What cannot be sharded is refused with the reason.
void refusals() {
  Net model;
  Trainer<CPUAccelerator, Zero1, FloatPrecision> trainer(config(), options());
  my_rank = trainer.global_rank();
  torch::optim::LBFGS lbfgs(model->parameters(), torch::optim::LBFGSOptions(0.1));
  std::string message;
  try {
    trainer.setup(model, lbfgs);
  } catch (const MisconfigurationError& e) {
    message = e.what();
  }
  check(message.find("cannot shard LBFGS") != std::string::npos, "LBFGS is refused: " + message);
  torch::optim::SGD unknown(model->parameters(), 0.1);
  message.clear();
  try {
    trainer.optimizer_step(unknown);
  } catch (const MisconfigurationError& e) {
    message = e.what();
  }
  check(message.find("not set up by the strategy") != std::string::npos, "an optimizer never set up: " + message);
}

}  // namespace

int main(int argc, char** argv) {
  return worker::run(argc > 1 ? argv[1] : "", "usage: sharded_worker parity|variants|memory|overflow|checkpoints <folder>|refusals",
                     [&](const std::string& scenario) {
                       if (scenario == "parity") parity();
                       else if (scenario == "variants") variants();
                       else if (scenario == "memory") memory();
                       else if (scenario == "overflow") overflow();
                       else if (scenario == "checkpoints" && argc > 2) checkpoints(argv[2]);
                       else if (scenario == "refusals") refusals();
                       else return false;
                       return true;
                     });
}
