// One rank of a ShardedStrategy test, started by torchrun (2 or 3 ranks, Gloo) with the scenario as
// argv[1]. Each rank checks its own results; a failure exits non-zero with the reason. Global rank
// 0 prints "PASS <scenario>" at the end.
#include <fulgur/detail/files.hpp>
#include <fulgur/callbacks/backbone_finetuning.hpp>
#include <fulgur/callbacks/gradient_accumulation_scheduler.hpp>
#include <fulgur/fulgur.hpp>

// The internals a user never includes, whose sizes and statistics these tests measure.
#include "src/distributed/optimizer_shard.hpp"
#include "src/distributed/parameter_gatherer.hpp"
#include "src/distributed/reducer.hpp"
#include "src/distributed/shard_state.hpp"
#include "src/distributed/sharded_module_state.hpp"
#include "src/distributed/sharded_reducer.hpp"

#include "elastic.hpp"
#include "worker.hpp"
#include <torch/torch.h>

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <string>

using namespace fulgur;
using DDP = BasicDDPStrategy<backend::Gloo>;
template <int Stage>
using Zero = ShardedStrategy<Stage, backend::Gloo>;

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
std::vector<at::Tensor> train(TrainerConfig c, DDPOptions o = options(), std::int64_t batch = 8) {
  torch::manual_seed(3);
  M model;
  auto [x, y] = dataset(240);
  data::TensorLoader loader(x, y, {.batch_size = batch, .shuffle = true, .seed = 9});
  Trainer<CPUAccelerator, S, P> trainer(config(c), o);
  my_rank = trainer.global_rank();
  trainer.fit(model, loader);
  std::vector<at::Tensor> weights;
  for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
  return weights;
}

/// FSDPOptions with the test timeout (worker::options) and a wrap policy.
FSDPOptions fsdp(WrapPolicy policy) {
  FSDPOptions o;
  o.auto_wrap = std::move(policy);
  o.timeout = options().timeout;
  return o;
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

/// The largest difference ShardedStrategy<Stage> may have from DDP, and why.
///   Stage 1: none. The optimizer's update is element by element, so stepping a shard of the flat
///   parameters is the arithmetic of stepping each parameter; unscaling and clipping see the whole
///   gradients, as under DDP.
///   Stage 2: the reduce-scatter adds the ranks' gradients as DDP's all-reduce does: on 2 ranks a
///   sum of two terms, the same bits. On 3 ranks Gloo may add them in another order (about one
///   rounding of float32, ~1e-7 relative, growing over the steps). Clipping's norm is summed shard
///   by shard, not parameter by parameter (another rounding of the coefficient).
template <int Stage>
double tolerance(bool clipped) {
  if (Stage == 1) return 0.0;
  if (world_from_environment() == 2 && !clipped) return 0.0;
  return 1e-5;
}

template <class P, int Stage>
void parity_for(const std::string& precision) {
  const std::string who = precision + ": ShardedStrategy<" + std::to_string(Stage) + ">";
  const TrainerConfig plain{.max_epochs = 2};
  const auto ddp = train<DDP, P>(plain), sharded = train<Zero<Stage>, P>(plain);
  const double d = max_difference(ddp, sharded);
  check(d <= tolerance<Stage>(false), who + " weights equal DDP's within " + std::to_string(tolerance<Stage>(false)) +
                                          " (max difference " + std::to_string(d) + ")");
  TrainerConfig clipped{.max_epochs = 2};
  clipped.gradient_clip_val = 0.05;  // small enough to clip on most steps
  const auto ddp_clipped = train<DDP, P>(clipped), sharded_clipped = train<Zero<Stage>, P>(clipped);
  const double dc = max_difference(ddp_clipped, sharded_clipped);
  check(dc <= tolerance<Stage>(true), who + " with clipping by norm equals DDP within " +
                                          std::to_string(tolerance<Stage>(true)) + " (max difference " + std::to_string(dc) + ")");
  check(max_difference(ddp_clipped, ddp) > 1e-3, precision + ": clipping changed the run (else the check above is empty)");
  if (my_rank == 0) std::cout << who << ": max difference from DDP " << d << ", clipped " << dc << std::endl;
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

template <int Stage>
void variants() {
  TrainerConfig clipped{.max_epochs = 1};
  clipped.gradient_clip_val = 0.05;
  DDPOptions unused = options();
  unused.find_unused_parameters = true;  // each GAN half leaves the other without gradient
  // Many small buckets: stage 2's staging buffers are reused many times in one backward, and
  // gradients wait on their parameters for a buffer.
  DDPOptions small_buckets = options();
  small_buckets.first_bucket_bytes = 256;
  small_buckets.bucket_bytes = 512;
  TrainerConfig accumulate{.max_epochs = 1};
  accumulate.accumulate_grad_batches = 3;
  std::vector<std::pair<std::string, double>> results = {
      {"frozen parameter", max_difference(train<DDP, FloatPrecision, Frozen>({.max_epochs = 1}),
                                          train<Zero<Stage>, FloatPrecision, Frozen>({.max_epochs = 1}))},
      {"Adagrad", max_difference(train<DDP, FloatPrecision, AdagradNet>({.max_epochs = 1}),
                                 train<Zero<Stage>, FloatPrecision, AdagradNet>({.max_epochs = 1}))},
      {"manual optimization, two optimizers, toggled",
       max_difference(train<DDP, FloatPrecision, Gan>({.max_epochs = 1}, unused),
                      train<Zero<Stage>, FloatPrecision, Gan>({.max_epochs = 1}, unused))},
      // The same without find_unused_parameters: the half toggle_optimizer froze gets no gradient in
      // that backward, and is not waited for (stages 2 and 3 stopped with "got no gradient" before).
      {"manual optimization, two optimizers, toggled, find_unused_parameters off",
       max_difference(train<DDP, FloatPrecision, Gan>({.max_epochs = 1}),
                      train<Zero<Stage>, FloatPrecision, Gan>({.max_epochs = 1}))},
      {"buckets of 512 bytes", max_difference(train<DDP, FloatPrecision>({.max_epochs = 1}, small_buckets),
                                              train<Zero<Stage>, FloatPrecision>({.max_epochs = 1}, small_buckets))},
      {"gradient accumulation over 3 batches", max_difference(train<DDP, FloatPrecision>(accumulate),
                                                              train<Zero<Stage>, FloatPrecision>(accumulate))},
      // One row: LibTorch's CPU matmul picks its kernel by the weight's alignment (parameters start
      // on 64-byte boundaries in the flat buffers, as in their own storage).
      {"a per-rank batch of 1", max_difference(train<DDP, FloatPrecision>({.max_steps = 40}, options(), 1),
                                               train<Zero<Stage>, FloatPrecision>({.max_steps = 40}, options(), 1))},
  };
  if constexpr (Stage == 1)  // stage 2 leaves no gradient on the module for the hook to replace
    results.emplace_back("gradients replaced in on_after_backward, then clipped",
                         max_difference(train<DDP, FloatPrecision, GradHook>(clipped),
                                        train<Zero<Stage>, FloatPrecision, GradHook>(clipped)));
  train<Zero<Stage>, FloatPrecision, Tied>({.max_epochs = 1});  // packed once, stepped once (it threw before)
  for (const auto& [what, difference] : results) {
    check(difference <= tolerance<Stage>(what.find("toggled") != std::string::npos),
          what + ": ShardedStrategy<" + std::to_string(Stage) + "> equals DDP within " +
              std::to_string(tolerance<Stage>(true)) + " (max difference " + std::to_string(difference) + ")");
    if (my_rank == 0) std::cout << what << ": max difference " << difference << std::endl;
  }
}

template <int Stage>
void parity() {
  parity_for<FloatPrecision, Stage>("32-true");
  parity_for<BF16MixedPrecision, Stage>("bf16-mixed");
  parity_for<FP16MixedPrecision, Stage>("16-mixed");
  parity_for<DoublePrecision, Stage>("64-true");
}

/// Bytes of the gradients the module's parameters hold.
std::int64_t module_gradient_bytes(torch::nn::Module& module) {
  std::int64_t n = 0;
  for (const auto& p : module.parameters())
    if (p.grad().defined()) n += p.grad().numel() * static_cast<std::int64_t>(p.grad().element_size());
  return n;
}

/// Each rank keeps the optimizer state of its 1/N of the parameters (N equal chunks, each aligned
/// to 64 bytes, so at most 16 elements of padding per parameter and bucket and rank); stage 2 also
/// keeps only its 1/N of the gradients.
template <int Stage>
void memory() {
  const int world = world_from_environment();
  torch::manual_seed(3);
  Net model;
  Trainer<CPUAccelerator, Zero<Stage>, FloatPrecision> trainer(config(), options());
  my_rank = trainer.global_rank();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.01));
  trainer.setup(model, optimizer);
  auto [x, y] = dataset(16);
  trainer.backward(model->training_step({x, y}, 0));
  const std::int64_t full = 467;
  const auto& shards = trainer.strategy().optimizer_shards();
  check(shards.size() == 1 && shards[0]->full_numel() == full, "one optimizer of 467 elements");
  const std::int64_t shard = shards[0]->shard_numel();
  check(shard * world >= full && shard <= full / world + 4 * 16, "the shard holds 1/" + std::to_string(world) +
                                                                     " of the elements, with little padding: " +
                                                                     std::to_string(shard));
  if constexpr (Stage == 2) {
    check(module_gradient_bytes(*model) == 0, "after backward the module holds no gradient (" +
                                                  std::to_string(module_gradient_bytes(*model)) + " bytes)");
    std::int64_t shard_grad = 0;
    for (const auto& g : shards[0]->shard_grads()) shard_grad += g.numel();
    check(shard_grad == shard, "the rank's gradients are its shard's: " + std::to_string(shard_grad) + " elements");
  } else {
    check(module_gradient_bytes(*model) == full * 4, "stage 1: the module holds its whole gradients, as under DDP");
  }
  trainer.optimizer_step(optimizer);
  check(adam_state_elements(optimizer) == 2 * shard,
        "AdamW keeps exp_avg and exp_avg_sq for the shard only: " + std::to_string(adam_state_elements(optimizer)) +
            " elements, expected " + std::to_string(2 * shard));
  // The module's weights are whole on every rank, and equal on all.
  for (const auto& p : model->parameters()) {
    const auto gathered = trainer.all_gather(p.detach());
    for (int r = 1; r < world; ++r) check(torch::equal(gathered[0], gathered[r]), "replicas identical after the step");
  }
  if (my_rank == 0)
    std::cout << "stage " << Stage << ": optimizer state per rank: " << adam_state_elements(optimizer)
              << " elements of " << 2 * full << " (world " << world << ")" << std::endl;
}

// ---- the memory table (docs/sharding.md) ---------------------------------------------------------

// 4 x (1024 x 1024 + 1024) + 1024 x 10 + 10 = 4,208,650 parameters.
struct WideImpl : torch::nn::Module {
  WideImpl() {
    for (int i = 0; i < 4; ++i) layers.push_back(register_module("layer" + std::to_string(i), torch::nn::Linear(1024, 1024)));
    head = register_module("head", torch::nn::Linear(1024, 10));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& layer : layers) x = torch::relu(layer(x));
    return head(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Wide);

struct Bytes {
  std::int64_t parameters = 0, gradients = 0, optimizer = 0;
  std::int64_t whole_during_step = 0;  // stage 3: the most bytes of gathered units at once
};

/// What one rank holds after backward (gradients) and after the step (optimizer state) of a
/// 4.2M-parameter model under AdamW: the module's parameters and gradients, the strategy's
/// gradient buffers (DDP's buckets, the shards' gradients, stage 2's staging buffers) and the
/// optimizer's state.
template <class S>
Bytes measure(typename S::options_type o) {
  torch::manual_seed(3);
  Wide model;
  Trainer<CPUAccelerator, S, FloatPrecision> trainer(config(), o);
  my_rank = trainer.global_rank();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  trainer.setup(model, optimizer);
  auto x = at::randn({16, 1024});
  auto y = at::randint(0, 10, {16});
  trainer.backward(torch::nn::functional::cross_entropy(model->forward(x), y));
  Bytes b;
  for (const auto& p : model->parameters()) b.parameters += p.numel() * 4;
  if constexpr (requires { trainer.strategy().parameter_gatherer(); }) {
    if (const auto* gatherer = trainer.strategy().parameter_gatherer()) {  // stage 3: its shards at rest
      b.parameters = 0;
      for (const auto& p : model->parameters()) b.parameters += static_cast<std::int64_t>(p.storage().nbytes());
      for (const auto& shard : trainer.strategy().optimizer_shards()) b.parameters += shard->shard_numel() * 4;
      b.whole_during_step = gatherer->peak_gathered_bytes();
    }
  }
  b.gradients = module_gradient_bytes(*model);
  if constexpr (requires { trainer.strategy().optimizer_shards(); }) {
    for (const auto& shard : trainer.strategy().optimizer_shards()) b.gradients += shard->shard_numel() * 4;
    if constexpr (requires { trainer.strategy().sharded_gradient_reducer(); })
      if (const auto* reducer = trainer.strategy().sharded_gradient_reducer()) b.gradients += reducer->staging_bytes();
  }
  if (const auto* reducer = trainer.strategy().reducer()) b.gradients += reducer->buffer_bytes();
  trainer.optimizer_step(optimizer);
  b.optimizer = adam_state_elements(optimizer) * 4;
  return b;
}

/// Per rank, for a model of a few million parameters: DDP keeps everything whole (and its bucket
/// copy of the gradients); stage 1 keeps 1/N of the optimizer state; stage 2 also 1/N of the
/// gradients, plus two staging buffers of one bucket each.
void memory_table() {
  const int world = world_from_environment();
  const DDPOptions defaults = options();
  DDPOptions small = options();
  small.bucket_bytes = std::size_t{2} << 20;
  const std::pair<std::string, Bytes> rows[] = {
      {"DDPStrategy", measure<DDP>(defaults)},
      {"ShardedStrategy<1>", measure<Zero<1>>(defaults)},
      {"ShardedStrategy<2>", measure<Zero<2>>(defaults)},
      {"ShardedStrategy<2>, bucket_bytes = 2 MiB", measure<Zero<2>>(small)},
      {"ShardedStrategy<3>, each Linear a unit", measure<Zero<3>>(fsdp(WrapPolicy::by_type<torch::nn::Linear>()))},
  };
  const Bytes& ddp = rows[0].second;
  const std::int64_t P = 4 * (1024 * 1024 + 1024) + 1024 * 10 + 10;
  check(ddp.parameters == 4 * P && ddp.optimizer == 8 * P, "DDP: whole parameters and AdamW state");
  check(ddp.gradients == 8 * P, "DDP: the gradients and the buckets' copy: " + std::to_string(ddp.gradients));
  const double padding = 1.0 + 1e-3;  // alignment and padding: a few elements per parameter and bucket
  auto d = [](std::int64_t bytes) { return static_cast<double>(bytes); };  // byte counts are far below 2^53
  for (int i = 1; i < 4; ++i)
    check(d(rows[i].second.optimizer) <= d(ddp.optimizer / world) * padding,
          rows[i].first + ": optimizer state 1/" + std::to_string(world) + " of DDP's: " +
              std::to_string(rows[i].second.optimizer));
  check(d(rows[1].second.gradients) <= d(ddp.gradients) + d(4 * P / world) * padding,
        "stage 1: DDP's gradients and its shard's: " + std::to_string(rows[1].second.gradients));
  // Stage 2: the shard and two staging buffers, each one bucket: at most bucket_bytes, or the
  // largest parameter (4 MiB) where it is larger; the defaults' first bucket is small.
  const std::int64_t shard = 4 * P / world;
  check(d(rows[2].second.gradients) <= d(shard + (1 << 20) + 4 * P) * padding,
        "stage 2, 25 MiB buckets: the shard, a 1 MiB bucket and the rest: " + std::to_string(rows[2].second.gradients));
  check(d(rows[3].second.gradients) <= d(shard + 2 * (std::int64_t{4} << 20)) * padding,
        "stage 2, 2 MiB buckets: the shard and two staging buffers of 4 MiB at most: " +
            std::to_string(rows[3].second.gradients));
  check(rows[2].second.gradients < ddp.gradients && rows[3].second.gradients < ddp.gradients / 2,
        "stage 2 holds less gradient memory than DDP");
  // Stage 3: 1/N of the weights at rest; during a step the root (nothing here) and one layer (4 MiB)
  // whole at a time; gradients as stage 2's with one unit (a layer) per bucket.
  const Bytes& s3 = rows[4].second;
  check(d(s3.parameters) <= d(4 * P / world) * padding, "stage 3: 1/N of the weights at rest: " + std::to_string(s3.parameters));
  check(d(s3.whole_during_step) <= 4 * (1024 * 1024 + 1024) * padding,
        "stage 3: one layer whole at a time: " + std::to_string(s3.whole_during_step));
  check(d(s3.optimizer) <= d(ddp.optimizer / world) * padding, "stage 3: optimizer state 1/N");
  check(d(s3.gradients) <= d(shard) * padding + 2 * 4 * (1024 * 1024 + 1024 + 64),
        "stage 3: the gradient shard and two staging buffers of a layer: " + std::to_string(s3.gradients));
  if (my_rank == 0) {
    auto mib = [](std::int64_t b) { return std::to_string(static_cast<double>(b) / (1 << 20)).substr(0, 5); };
    std::cout << "| " << world << " ranks, " << P << " parameters, AdamW | parameters | gradients | optimizer state | total | "
              << "+ whole during a step |\n"
              << "| --- | ---: | ---: | ---: | ---: | ---: |\n";
    for (const auto& [name, b] : rows)
      std::cout << "| " << name << " | " << mib(b.parameters) << " MiB | " << mib(b.gradients) << " MiB | "
                << mib(b.optimizer) << " MiB | " << mib(b.parameters + b.gradients + b.optimizer) << " MiB | "
                << (b.whole_during_step > 0 ? mib(b.whole_during_step) + " MiB" : std::string("—")) << " |\n";
    std::cout << std::flush;
  }
}

/// '16-mixed': one inf in one rank's gradient must make every rank skip the step and back off
/// alike, and no rank may gather a half-stepped model. Stage 1: the all-reduce carries the inf
/// into every rank's whole gradients. Stage 2: the inf lands in rank 0's chunk only (fc2.bias comes
/// first in the layout), so the ranks' inf flags must be summed.
template <int Stage>
void overflow() {
  const int world = world_from_environment();
  torch::manual_seed(3);
  Net model;
  Trainer<CPUAccelerator, Zero<Stage>, FP16MixedPrecision> trainer(config(), options());
  my_rank = trainer.global_rank();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.01));
  trainer.setup(model, optimizer);
  bool poison = false;
  model->fc2->bias.register_hook([&](const at::Tensor& g) {
    if (!poison) return g;
    auto h = g.clone();
    h.view({-1})[0] = std::numeric_limits<float>::infinity();
    return h;
  });
  auto [x, y] = dataset(16);
  auto step = [&](bool overflow_here) {
    optimizer.zero_grad();
    at::Tensor loss;
    {
      auto autocast = trainer.forward_context();
      loss = model->training_step({x, y}, 0);
    }
    poison = overflow_here;
    trainer.backward(loss);
    poison = false;
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

/// A checkpoint written under ShardedStrategy resumes bit for bit on as many ranks; its weights
/// load into a single-device model; a DDP optimizer state does not load into a sharded run (an
/// error). Stages 1 and 2 lay the parameters out alike, so each resumes the other's checkpoint.
template <int Stage>
void checkpoints(const std::string& dir) {
  if (std::getenv("RANK") && std::string(std::getenv("RANK")) == "0") fulgur::detail::remove_tree(dir);  // no stale files
  auto [x, y] = dataset(240);
  auto fit = [&](std::int64_t epochs, const std::string& resume, const std::string& save) {
    torch::manual_seed(3);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
    Trainer<CPUAccelerator, Zero<Stage>, FloatPrecision> trainer(config({.max_epochs = epochs, .default_root_dir = dir}), options());
    my_rank = trainer.global_rank();
    trainer.fit(model, loader, FitOptions{.ckpt_path = resume});
    if (!save.empty()) trainer.save_checkpoint(save);
    std::vector<at::Tensor> weights;
    for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
    return weights;
  };
  const auto straight = fit(3, "", "");
  fit(1, "", dir + "/one_epoch.ckpt");
  // A sharded checkpoint: the manifest names one file per rank, each rank wrote its own, and saving
  // again under the same name left only the new files.
  {
    const int world = world_from_environment();
    const StateDict manifest = checkpoint::load(dir + "/one_epoch.ckpt");
    const StateDict optimizer(manifest.at("optimizer_states").toList().get(0).toGenericDict());
    check(optimizer.contains("files") && !optimizer.contains("shard") && !optimizer.contains("shards") &&
              static_cast<int>(optimizer.at("files").toList().size()) == world,
          "the manifest names " + std::to_string(world) + " shard files and holds no optimizer state itself");
    for (int r = 0; r < world; ++r)
      check(fulgur::detail::path_exists(optimizer.at("files").toList().get(static_cast<std::size_t>(r)).toStringRef()),
            "rank " + std::to_string(r) + "'s shard file exists");
    const auto first = fulgur::detail::subdirectories(dir + "/one_epoch.ckpt.shards");
    fit(1, "", dir + "/one_epoch.ckpt");  // the same weights and state, written again
    const auto second = fulgur::detail::subdirectories(dir + "/one_epoch.ckpt.shards");
    check(first.size() == 1 && second.size() == 1 && first != second,
          "saving again replaced the shard files (" + std::to_string(second.size()) + " folder(s) left)");
  }
  // The manifest copied without its .shards folder: the error names the missing file and what to do.
  {
    if (my_rank == 0) {
      fulgur::detail::make_directories(dir + "/alone");
      std::ifstream in(dir + "/one_epoch.ckpt", std::ios::binary);
      std::ofstream(dir + "/alone/one_epoch.ckpt", std::ios::binary) << in.rdbuf();
    }
    std::string message;
    try {
      fit(3, dir + "/alone/one_epoch.ckpt", "");  // rank 0 copies before fit's first collective
    } catch (const CheckpointError& e) {
      message = e.what();
    }
    check(message.find("shard file") != std::string::npos && message.find("is missing") != std::string::npos &&
              message.find(".shards' folder beside it") != std::string::npos &&
              message.find("does not fit") == std::string::npos,
          "a manifest without its shards: " + message);
  }
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
  // A DDP checkpoint's optimizer state is whole: resumed under ShardedStrategy it is cut into this
  // rank's shards, and the run goes on as DDP's would.
  {
    torch::manual_seed(3);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
    Trainer<CPUAccelerator, DDP, FloatPrecision> ddp(config({.max_epochs = 1, .default_root_dir = dir}), options());
    ddp.fit(model, loader);
    ddp.save_checkpoint(dir + "/ddp.ckpt");
  }
  const auto from_ddp = fit(3, dir + "/ddp.ckpt", "");
  check(max_difference(straight, from_ddp) <= tolerance<Stage>(false),
        "a DDP checkpoint resumed under ShardedStrategy: max difference " + std::to_string(max_difference(straight, from_ddp)));
  // And the other way: a sharded checkpoint resumed under DDP is consolidated into whole states.
  {
    torch::manual_seed(3);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
    Trainer<CPUAccelerator, DDP, FloatPrecision> ddp(config({.max_epochs = 3, .default_root_dir = dir}), options());
    ddp.fit(model, loader, FitOptions{.ckpt_path = dir + "/one_epoch.ckpt"});
    std::vector<at::Tensor> weights;
    for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
    check(max_difference(straight, weights) <= tolerance<Stage>(false),
          "a sharded checkpoint resumed under DDP: max difference " + std::to_string(max_difference(straight, weights)));
  }
  std::string message;
  // The other stage's checkpoint (written by it, at epoch 1) resumes into this stage's run.
  {
    constexpr int other = Stage == 1 ? 2 : 1;
    {
      torch::manual_seed(3);
      Net model;
      data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
      Trainer<CPUAccelerator, Zero<other>, FloatPrecision> t(config({.max_epochs = 1, .default_root_dir = dir}), options());
      t.fit(model, loader);
      t.save_checkpoint(dir + "/other_stage.ckpt");
    }
    const auto crossed = fit(3, dir + "/other_stage.ckpt", "");
    check(max_difference(straight, crossed) <= tolerance<2>(false),
          "resumed from stage " + std::to_string(other) + "'s checkpoint: max difference " +
              std::to_string(max_difference(straight, crossed)));
  }
  // Other bucket sizes lay the shards out otherwise: the state goes through its whole form into
  // this run's layout, and the run goes on as the straight one.
  {
    torch::manual_seed(3);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
    DDPOptions other = options();
    other.bucket_bytes = 512;
    other.first_bucket_bytes = 256;
    Trainer<CPUAccelerator, Zero<Stage>, FloatPrecision> t(config({.max_epochs = 3, .default_root_dir = dir}), other);
    t.fit(model, loader, FitOptions{.ckpt_path = dir + "/one_epoch.ckpt"});
    std::vector<at::Tensor> weights;
    for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
    // tolerance<2>: other buckets are other collectives, whose 3-rank sums Gloo may order otherwise
    check(max_difference(straight, weights) <= tolerance<2>(false),
          "resumed with other bucket sizes (laid out again): max difference " +
              std::to_string(max_difference(straight, weights)));
  }
}

// BackboneFinetuning under ShardedStrategy<1> and <2>: fc1 (the backbone) frozen at set-up, so outside
// the optimizer's layout, and added as a param group at epoch 1's start. The strategy lays the group out
// at its next backward (stage 2) or step (stage 1), so its optimizer state and gradients are sharded as
// the others': the fit ends with DDP's weights (within tolerance<Stage>: bit for bit on 2 ranks), and
// fits resumed from sharded checkpoints written after the unfreeze (its optimizer state holds the
// group) and before it (the unfreeze happens again at epoch 1) end bit-identical to the straight one.
struct TrainableOnlyNetImpl : NetImpl {
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {  // the backbone is frozen now
    std::vector<at::Tensor> trainable;
    for (auto& p : parameters())
      if (p.requires_grad()) trainable.push_back(p);
    return std::make_unique<torch::optim::AdamW>(trainable, torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  }
};
TORCH_MODULE(TrainableOnlyNet);

struct BackboneWeights {  // fc1.weight at each epoch's end
  std::map<std::int64_t, at::Tensor> at_end;
  void on_train_epoch_end(TrainerView& trainer, torch::nn::Module& module) {
    at_end[trainer.current_epoch()] = module.named_parameters()["fc1.weight"].detach().clone();
  }
};

struct SaveInEpochs {  // a checkpoint at each (epoch, batch) given
  std::vector<std::tuple<std::int64_t, std::int64_t, std::string>> at;
  void on_train_batch_end(TrainerView& trainer) {
    for (const auto& [epoch, batch, path] : at)
      if (trainer.current_epoch() == epoch && trainer.batch_idx() == batch) trainer.save_checkpoint(path);
  }
};

struct BackboneRun {
  std::vector<at::Tensor> params;
  std::map<std::int64_t, at::Tensor> backbone;
  std::int64_t optimizer_elements = 0;  // the elements the optimizer's layout holds (sharded runs)
};

template <class S>
BackboneRun backbone_fit(const typename S::options_type& o, SaveInEpochs save = {}, const std::string& resume = "",
                         std::int64_t unfreeze_at = 1) {
  auto [x, y] = dataset(32 * world_from_environment());  // 4 batches a rank, an epoch
  torch::manual_seed(3);
  TrainableOnlyNet model;
  Trainer<CPUAccelerator, S, FloatPrecision, BackboneFinetuning, BackboneWeights, SaveInEpochs> trainer(
      config({.max_epochs = 3}), o, BackboneFinetuning({.unfreeze_backbone_at_epoch = unfreeze_at, .backbone = "fc1"}),
      BackboneWeights{}, std::move(save));
  my_rank = trainer.global_rank();
  data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
  trainer.fit(model, loader, FitOptions{.ckpt_path = resume});
  BackboneRun run{{}, trainer.template callback<BackboneWeights>().at_end, 0};
  for (const auto& p : model->parameters()) run.params.push_back(p.detach().clone());
  if constexpr (requires { trainer.strategy().optimizer_shards(); })
    for (const auto& shard : trainer.strategy().optimizer_shards()) run.optimizer_elements += shard->full_numel();
  trainer.barrier();  // the checkpoints are written before any rank resumes from them
  return run;
}

template <int Stage>
void backbone_finetuning(const std::string& dir) {
  torch::manual_seed(3);
  const at::Tensor initial = TrainableOnlyNet()->fc1->weight.detach().clone();
  DDPOptions small = options();  // fc1's 297 weights span several buckets (DDP's too: the same 3-rank sums)
  small.bucket_bytes = 512;
  small.first_bucket_bytes = 256;
  const std::string ddp_after = dir + "/backbone_ddp_after.ckpt";
  const BackboneRun ddp = backbone_fit<DDP>(small, SaveInEpochs{{{2, 1, ddp_after}}});
  const std::string after = dir + "/backbone_after.ckpt", before = dir + "/backbone_before.ckpt";
  const BackboneRun straight = backbone_fit<Zero<Stage>>(small, SaveInEpochs{{{2, 1, after}, {0, 2, before}}});
  check(torch::equal(straight.backbone.at(0), initial), "the backbone is frozen in epoch 0");
  check(!torch::equal(straight.backbone.at(1), straight.backbone.at(0)) &&
            !torch::equal(straight.backbone.at(2), straight.backbone.at(1)),
        "the backbone trains from epoch 1");
  check(straight.optimizer_elements == 467, "the backbone's group is laid out in the optimizer's shards: " +
                                                std::to_string(straight.optimizer_elements) + " of 467 elements");
  const double difference = max_difference(ddp.params, straight.params);
  check(difference <= tolerance<Stage>(false), "BackboneFinetuning under ShardedStrategy<" + std::to_string(Stage) +
                                                   "> ends with DDP's weights: max difference " +
                                                   std::to_string(difference));
  for (const auto& [name, path] : {std::pair<std::string, std::string>{"after", after}, {"before", before}}) {
    const BackboneRun resumed = backbone_fit<Zero<Stage>>(small, {}, path);
    check(max_difference(straight.params, resumed.params) == 0.0,
          "the fit resumed from the checkpoint written " + name + " the unfreeze ends bit-identical to the straight "
          "one: max difference " + std::to_string(max_difference(straight.params, resumed.params)));
    if (name == "before")
      check(torch::equal(resumed.backbone.at(0), initial) && !torch::equal(resumed.backbone.at(1), initial),
            "resumed before the unfreeze: the backbone unfreezes again at epoch 1");
  }
  {  // DDP's whole optimizer state, the backbone's group in it, cut into this rank's shards
    const double d = max_difference(ddp.params, backbone_fit<Zero<Stage>>(small, {}, ddp_after).params);
    check(d <= tolerance<Stage>(false), "resumed under ShardedStrategy<" + std::to_string(Stage) + "> from DDP's "
                                        "checkpoint written after the unfreeze: max difference " + std::to_string(d));
  }
  {  // unfrozen at epoch 0: the group is added before the first backward (stage 2's reducer not built yet)
    const double d = max_difference(backbone_fit<DDP>(small, {}, "", 0).params,
                                    backbone_fit<Zero<Stage>>(small, {}, "", 0).params);
    check(d <= tolerance<Stage>(false), "unfrozen at epoch 0: DDP's weights, max difference " + std::to_string(d));
  }
  if (my_rank == 0)
    std::cout << "backbone_finetuning<" << Stage << ">: max |sharded - ddp| = " << difference << std::endl;

  // An optimizer over every parameter, the frozen backbone's too: the callback adds no group (Lightning's
  // warning). Stage 1 steps the unfrozen backbone whole on every rank from its averaged gradients, as
  // DDP; stage 2 would leave its gradients unreduced, and refuses at the unfreeze's first backward.
  {
    const auto fit_all = [&]<class S>(const typename S::options_type& o) {
      auto [x, y] = dataset(32 * world_from_environment());
      torch::manual_seed(3);
      Net model;
      Trainer<CPUAccelerator, S, FloatPrecision, BackboneFinetuning> trainer(
          config({.max_epochs = 2}), o, BackboneFinetuning({.unfreeze_backbone_at_epoch = 1, .backbone = "fc1"}));
      data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
      trainer.fit(model, loader);
      return model->parameters();
    };
    const auto whole = fit_all.template operator()<DDP>(small);
    if constexpr (Stage == 1) {
      const double d = max_difference(whole, fit_all.template operator()<Zero<Stage>>(small));
      check(d == 0.0, "an optimizer over every parameter: stage 1 trains the unfrozen backbone as DDP does, "
                      "max difference " + std::to_string(d));
    } else {
      std::string message;
      try {
        fit_all.template operator()<Zero<Stage>>(small);
      } catch (const MisconfigurationError& e) {
        message = e.what();
      }
      check(message.find("'fc1.weight' was frozen when the strategy laid its optimizer out and requires grad now") !=
                std::string::npos,
            "an optimizer over every parameter: the unfrozen backbone is refused under stage 2: " + message);
    }
  }

  // The ranks add different groups (rank 0 fc1's weight and bias, the others its weight only): every
  // rank stops with an error that says so, at the backward (stage 2) or step (stage 1) that lays them out.
  {
    torch::manual_seed(3);
    Net model;
    model->fc1->weight.set_requires_grad(false);
    model->fc1->bias.set_requires_grad(false);
    Trainer<CPUAccelerator, Zero<Stage>, FloatPrecision> trainer(config(), options());
    torch::optim::SGD optimizer(model->fc2->parameters(), 0.1);
    trainer.setup(model, optimizer);
    auto [x, y] = dataset(8);
    trainer.backward(model->training_step({x, y}, 0));
    trainer.optimizer_step(optimizer);
    model->fc1->weight.set_requires_grad(true);
    model->fc1->bias.set_requires_grad(true);
    std::vector<at::Tensor> added{model->fc1->weight};
    if (my_rank == 0) added.push_back(model->fc1->bias);
    optimizer.add_param_group(torch::optim::OptimizerParamGroup(added, optimizer.defaults().clone()));
    std::string message;
    try {
      trainer.backward(model->training_step({x, y}, 1));
      trainer.optimizer_step(optimizer);
    } catch (const DistributedError& e) {
      message = e.what();
    }
    check(message.find("a param group was added to the optimizer on rank " + std::to_string(my_rank)) !=
                  std::string::npos &&
              message.find("but not in the same way on every rank") != std::string::npos,
          "param groups added differently on the ranks are an error, got: " + message);
  }
}

// ---- another world size (tests/distributed/reshard.sh: written on W ranks, read on W') ---------

template <class S>
typename S::options_type options_for() {
  if constexpr (std::is_same_v<S, Zero<3>>) return fsdp(WrapPolicy{});
  else return options();
}

/// Phase 1, on W ranks: one epoch under DDP and stages 1, 2 and 3, each saved.
void reshard_save(const std::string& dir) {
  const int world = world_from_environment();
  auto [x, y] = dataset(240);
  auto save = [&]<class S>(const std::string& name) {
    torch::manual_seed(3);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
    Trainer<CPUAccelerator, S, FloatPrecision> t(config({.max_epochs = 1, .default_root_dir = dir}), options_for<S>());
    my_rank = t.global_rank();
    t.fit(model, loader);
    t.save_checkpoint(dir + "/" + name + "_" + std::to_string(world) + ".ckpt");
  };
  save.template operator()<DDP>("ddp");
  save.template operator()<Zero<1>>("zero1");
  save.template operator()<Zero<2>>("zero2");
  save.template operator()<Zero<3>>("zero3");  // its weights sharded too: one file per rank
}

/// Twelve AdamW steps from a checkpoint's weights and optimizer state, loaded through the Fabric
/// verbs (Trainer::load_optimizer_state), each rank on its own rows of fixed batches.
template <class S>
std::vector<at::Tensor> continue_from(const std::string& path) {
  torch::manual_seed(5);
  Net model;
  const StateDict checkpoint = checkpoint::load(path);
  constexpr bool stage3 = std::is_same_v<S, Zero<3>>;
  if (!stage3) checkpoint::load_module_state_dict(*model, checkpoint::module_weights(checkpoint));
  auto trainer = [] {
    if constexpr (std::is_same_v<S, SingleDeviceStrategy>) return Trainer<CPUAccelerator, S, FloatPrecision>(config());
    else return Trainer<CPUAccelerator, S, FloatPrecision>(config(), options_for<S>());
  }();
  my_rank = trainer.global_rank();
  auto optimizer = model->configure_optimizers();
  trainer.setup(model, *optimizer);
  // Stage 3 through its own verb, the weights sharded already: a sharded state of another world
  // size is joined, then each rank keeps its chunk.
  if (stage3) trainer.load_module_state(*model, StateDict(checkpoint.at("state_dict").toGenericDict()));
  trainer.load_optimizer_state(*optimizer, StateDict(checkpoint.at("optimizer_states").toList().get(0).toGenericDict()));
  auto [x, y] = dataset(12 * 12);
  const std::int64_t world = trainer.world_size(), rank = trainer.global_rank();
  for (std::int64_t step = 0; step < 12; ++step) {
    const auto rows = at::arange(step * 12 + rank, (step + 1) * 12, world);
    optimizer->zero_grad();
    trainer.backward(model->training_step({x.index_select(0, rows), y.index_select(0, rows)}, step));
    trainer.optimizer_step(*optimizer);
  }
  std::vector<at::Tensor> weights;
  for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
  return weights;
}

/// Phase 2, on W' ranks (or one process): the sharded states of phase 1 (W ranks), resharded for
/// W' (or consolidated into whole states on one process), continue exactly as DDP's whole state
/// does under DDP on W' ranks. A stage-2 state written on 3 ranks differs from DDP's by Gloo's
/// summation order already (tolerance<2>).
void reshard_load(const std::string& dir, int written_on) {
  const int world = world_from_environment();
  const std::string suffix = "_" + std::to_string(written_on) + ".ckpt";
  const auto reference = world > 1 ? continue_from<DDP>(dir + "/ddp" + suffix)
                                   : continue_from<SingleDeviceStrategy>(dir + "/ddp" + suffix);
  for (int stage : {1, 2, 3}) {
    const std::string path = dir + "/zero" + std::to_string(stage) + suffix;
    const auto resharded = world == 1   ? continue_from<SingleDeviceStrategy>(path)
                           : stage == 1 ? continue_from<Zero<1>>(path)
                           : stage == 2 ? continue_from<Zero<2>>(path)
                                        : continue_from<Zero<3>>(path);
    // stages 2 and 3 reduce-scatter: on 3 ranks Gloo's sums may be ordered otherwise than DDP's
    const double allowed = stage >= 2 && (written_on == 3 || world == 3) ? 1e-5 : 0.0;
    const double d = max_difference(reference, resharded);
    check(d <= allowed, "stage " + std::to_string(stage) + "'s state written on " + std::to_string(written_on) +
                            " ranks, " + (world > 1 ? "resharded for " + std::to_string(world) : std::string("consolidated on one process")) +
                            ": max difference from DDP's " + std::to_string(d) + " (allowed " + std::to_string(allowed) + ")");
    if (my_rank == 0)
      std::cout << "stage " << stage << ", " << written_on << " -> " << world << " ranks: max difference " << d << std::endl;
  }
}

/// What cannot be sharded is refused with the reason.
template <int Stage>
void refusals() {
  Net model;
  Trainer<CPUAccelerator, Zero<Stage>, FloatPrecision> trainer(config(), options());
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
  if constexpr (Stage == 2) {  // a trainable parameter in no optimizer: no rank would keep its gradient
    Net other;
    Trainer<CPUAccelerator, Zero<Stage>, FloatPrecision> t(config(), options());
    torch::optim::SGD fc1_only(other->fc1->parameters(), 0.1);
    t.setup(other, fc1_only);
    auto [x, y] = dataset(8);
    message.clear();
    try {
      t.backward(other->training_step({x, y}, 0));
    } catch (const MisconfigurationError& e) {
      message = e.what();
    }
    check(message.find("'fc2.weight'") != std::string::npos && message.find("in no optimizer") != std::string::npos,
          "a parameter in no optimizer is named: " + message);
  }
}

// ---- stage 3 (parameters sharded) -----------------------------------------------------------------

// Three residual blocks between an input and an output layer: 136 + 3 x 306 + 90 parameters. The
// blocks are reached through a ModuleList, as a transformer's are.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(std::int64_t width) : fc(register_module("fc", torch::nn::Linear(width, width))) {}
  at::Tensor forward(const at::Tensor& x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);
struct DeepImpl : torch::nn::Module {
  DeepImpl()
      : inp(register_module("inp", torch::nn::Linear(7, 17))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        out(register_module("out", torch::nn::Linear(17, 5))) {
    for (int i = 0; i < 3; ++i) blocks->push_back(Block(17));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = inp(x);
    for (const auto& b : *blocks) h = b->as<BlockImpl>()->forward(h);
    return out(h);
  }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input.narrow(1, 0, 7)), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  }
  torch::nn::Linear inp;
  torch::nn::ModuleList blocks;
  torch::nn::Linear out;
};
TORCH_MODULE(Deep);

template <class S, class P, class M = Deep>
std::vector<at::Tensor> train_deep(TrainerConfig c, typename S::options_type o, std::int64_t epochs = 2,
                                   const std::string& resume = "", const std::string& save = "") {
  torch::manual_seed(3);
  M model;
  auto [x, y] = dataset(240);
  data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
  c.max_epochs = epochs;
  Trainer<CPUAccelerator, S, P> trainer(config(c), o);
  my_rank = trainer.global_rank();
  trainer.fit(model, loader, FitOptions{.ckpt_path = resume});
  if (!save.empty()) trainer.save_checkpoint(save);
  std::vector<at::Tensor> weights;
  for (const auto& p : model->parameters()) {
    check(p.storage().nbytes() > 0, "after fit the module is whole again");
    weights.push_back(p.detach().clone());
  }
  return weights;
}

// One op reads two units at once (a penalty over two blocks' weights, through cat's tensor list):
// both must be whole while it runs (found by review: the second gather freed the first).
struct PenalizedDeepImpl : DeepImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t i) {
    const auto& w0 = blocks[0]->as<BlockImpl>()->fc->weight;
    const auto& w2 = blocks[2]->as<BlockImpl>()->fc->weight;
    return DeepImpl::training_step(b, i) + 1e-2 * torch::cat({w0.reshape({-1}), w2.reshape({-1})}).pow(2).sum();
  }
};
TORCH_MODULE(PenalizedDeep);

// Manual optimization of two halves with toggle_optimizer (a GAN's pattern), find_unused_parameters
// off: the half toggled off in a backward is not waited for (stage 3 stopped with "got no gradient").
struct ToggledDeepImpl : DeepImpl {
  static constexpr bool automatic_optimization = false;
  void training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    for (std::size_t k = 0; k < 2; ++k) {
      auto& optimizer = ctx.optimizer(k);
      ctx.toggle_optimizer(optimizer);
      optimizer.zero_grad();
      const double scale = 1.0 - 0.5 * static_cast<double>(k);
      ctx.manual_backward(torch::nn::functional::cross_entropy(forward(b.input.narrow(1, 0, 7) * scale), b.target));
      optimizer.step();
      ctx.untoggle_optimizer(optimizer);
    }
  }
  std::vector<OptimizerConfig> configure_optimizers() {
    std::vector<at::Tensor> body = inp->parameters();
    for (const auto& p : blocks->parameters()) body.push_back(p);
    std::vector<OptimizerConfig> configs;
    configs.push_back({std::make_unique<torch::optim::Adam>(body, 1e-2)});
    configs.push_back({std::make_unique<torch::optim::SGD>(out->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9))});
    return configs;
  }
};
TORCH_MODULE(ToggledDeep);

/// Stage 3 against DDP: each policy's units, 32-true and bf16-mixed, with and without clipping.
/// The forward and backward see DDP's weights exactly (all-gathered copies of the same steps); the
/// gradients are reduce-scattered as stage 2's, so stage 2's tolerance applies.
template <class P>
void parity3_for(const std::string& precision) {
  const TrainerConfig plain{};
  const auto ddp = train_deep<DDP, P>(plain, options());
  const std::pair<std::string, WrapPolicy> policies[] = {
      {"by type (the blocks)", WrapPolicy::by_type<BlockImpl>()},
      {"by size (>= 200: the blocks' Linear)", WrapPolicy::by_size(200)},
      {"none (one unit)", WrapPolicy{}},
  };
  for (const auto& [name, policy] : policies) {
    const auto sharded = train_deep<Zero<3>, P>(plain, fsdp(policy));
    const double d = max_difference(ddp, sharded);
    check(d <= tolerance<2>(false), precision + ", wrap " + name + ": ShardedStrategy<3> equals DDP within " +
                                        std::to_string(tolerance<2>(false)) + " (max difference " + std::to_string(d) + ")");
    if (my_rank == 0) std::cout << precision << ", wrap " << name << ": max difference from DDP " << d << std::endl;
  }
  TrainerConfig clipped{};
  clipped.gradient_clip_val = 0.05;
  const auto ddp_clipped = train_deep<DDP, P>(clipped, options());
  const auto sharded_clipped = train_deep<Zero<3>, P>(clipped, fsdp(WrapPolicy::by_type<Block>()));
  const double dc = max_difference(ddp_clipped, sharded_clipped);
  check(dc <= tolerance<2>(true), precision + " clipped: ShardedStrategy<3> equals DDP within " +
                                      std::to_string(tolerance<2>(true)) + " (max difference " + std::to_string(dc) + ")");
  check(max_difference(ddp_clipped, ddp) > 1e-3, precision + ": clipping changed the run");
  if (my_rank == 0) std::cout << precision << ", clipped: max difference from DDP " << dc << std::endl;
}

void parity3() {
  parity3_for<FloatPrecision>("32-true");
  parity3_for<BF16MixedPrecision>("bf16-mixed");
  {
    const auto ddp = train_deep<DDP, FloatPrecision, PenalizedDeep>({}, options());
    const auto sharded = train_deep<Zero<3>, FloatPrecision, PenalizedDeep>({}, fsdp(WrapPolicy::by_type<Block>()));
    check(max_difference(ddp, sharded) <= tolerance<2>(false),
          "an op over two units' weights: stage 3 equals DDP (max difference " + std::to_string(max_difference(ddp, sharded)) + ")");
  }
  {
    const auto ddp = train_deep<DDP, FloatPrecision, ToggledDeep>({}, options());
    const auto sharded = train_deep<Zero<3>, FloatPrecision, ToggledDeep>({}, fsdp(WrapPolicy::by_type<Block>()));
    check(max_difference(ddp, sharded) <= tolerance<2>(false),
          "manual optimization, two optimizers toggled, find_unused_parameters off: stage 3 equals DDP (max "
          "difference " + std::to_string(max_difference(ddp, sharded)) + ")");
  }
  // the policies' units, by name
  Trainer<CPUAccelerator, Zero<3>, FloatPrecision> by_type(config(), fsdp(WrapPolicy::by_type<Block>()));
  Trainer<CPUAccelerator, Zero<3>, FloatPrecision> by_size(config(), fsdp(WrapPolicy::by_size(200)));
  Deep a, b;
  torch::optim::SGD sa(a->parameters(), 0.1), sb(b->parameters(), 0.1);
  by_type.setup(a, sa);
  by_size.setup(b, sb);
  const std::vector<std::string> blocks{"blocks.0", "blocks.1", "blocks.2"}, linears{"blocks.0.fc", "blocks.1.fc", "blocks.2.fc"};
  check(by_type.strategy().wrapped_units() == blocks, "by_type<Block>: the three blocks are the units");
  check(by_size.strategy().wrapped_units() == linears, "by_size(200): the blocks' Linear layers (innermost first)");
}

/// What a rank holds under stage 3: at rest 1/N of the weights (their storage freed); during a
/// step at most the root unit and one block whole; after backward and after the step nothing whole.
void memory3() {
  const int world = world_from_environment();
  torch::manual_seed(3);
  Deep model;
  FSDPOptions whole_states = fsdp(WrapPolicy::by_type<Block>());
  whole_states.state_dict_type = StateDictType::full;  // module_state below: the weights whole
  Trainer<CPUAccelerator, Zero<3>, FloatPrecision> trainer(config(), whole_states);
  my_rank = trainer.global_rank();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  trainer.setup(model, optimizer);
  const auto* gatherer = trainer.strategy().parameter_gatherer();
  check(gatherer != nullptr && gatherer->gathered_bytes() == 0, "at rest no unit is whole");
  for (const auto& p : model->parameters()) check(p.storage().nbytes() == 0, "at rest a parameter's storage is freed");
  std::int64_t elements = 0, root_bytes = 0, largest_block = 0;
  const auto& shard = *trainer.strategy().optimizer_shards().front();
  for (const auto* bucket : shard.buckets()) {
    const at::Tensor& first = bucket->slots.front().param;
    const bool root = first.is_same(model->inp->weight) || first.is_same(model->inp->bias) ||
                      first.is_same(model->out->weight) || first.is_same(model->out->bias);
    if (root) root_bytes += bucket->numel * 4;
    else largest_block = std::max(largest_block, bucket->numel * 4);
  }
  elements = shard.shard_numel();
  const std::int64_t whole = 136 + 3 * 306 + 90;
  check(shard.buckets().size() == 5, "a bucket per block, and the root's two (inp, out: not adjacent in the layout)");
  // each of the 8 parameters starts on 16 elements, each of the 5 buckets is padded to 16 x N
  check(elements * world >= whole && elements <= (whole + 8 * 16 + 5 * 16 * world) / world,
        "the shards hold 1/N of the weights (with alignment): " + std::to_string(elements));
  auto [x, y] = dataset(16);
  std::int64_t gathers_before = gatherer->gathers();
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    trainer.backward(model->training_step({x, y}, 0));
    check(gatherer->gathered_bytes() == 0, "after backward no unit is whole");
    for (const auto& p : model->parameters()) check(!p.grad().defined(), "after backward a parameter holds no gradient");
    trainer.optimizer_step(optimizer);
    check(gatherer->gathered_bytes() == 0, "after the step no unit is whole");
    check(adam_state_elements(optimizer) == 2 * elements, "AdamW's state: two per shard element");
  }
  // the root unit (inp + out), the block computing and the next one, gathered ahead: never the whole model
  const std::int64_t bound = root_bytes + 2 * largest_block;
  check(gatherer->peak_gathered_bytes() == bound,
        "at most the root unit and two blocks whole at a time: peak " + std::to_string(gatherer->peak_gathered_bytes()) +
            " bytes, the root and two blocks " + std::to_string(bound));
  const std::int64_t per_step = (gatherer->gathers() - gathers_before) / 3;
  // forward: root, block 0, 1, 2; backward: block 1, 0 (block 2 and the root are still whole)
  check(per_step == 6, "6 gathers a step (a unit at a time, not an op at a time): " + std::to_string(per_step));
  // the first step records the order; the next two gather all but the root ahead (5 each)
  check(gatherer->prefetches() == 10, "10 gathers ahead in steps 2 and 3: " + std::to_string(gatherer->prefetches()));
  // A weight written in place while whole (a hook, Embedding's max_norm) keeps the write: the
  // rank's chunk goes back into its shard when the unit is released (found by review).
  {
    const auto before = trainer.module_state(*model).at("blocks.1.fc.weight").toTensor();
    {
      at::NoGradGuard no_grad;
      model->blocks[1]->as<BlockImpl>()->fc->weight.mul_(0.5);
    }
    const auto after = trainer.module_state(*model).at("blocks.1.fc.weight").toTensor();
    check(torch::equal(after, before * 0.5), "an in-place write to a gathered weight is kept after its release");
    check(gatherer->gathered_bytes() == 0, "the module's state copied unit by unit, then released");
  }
  if (my_rank == 0)
    std::cout << "stage 3: " << elements << " of " << whole << " weights per rank; peak whole " << gatherer->peak_gathered_bytes()
              << " bytes; " << per_step << " gathers a step, " << gatherer->prefetches() << " ahead in 3 steps" << std::endl;
}

/// Stage 3 checkpoints: resumed on as many ranks bit for bit; the weights in the checkpoint whole;
/// resumed under DDP (consolidated) and under stage 2 (laid out again).
void checkpoints3(const std::string& dir) {
  if (std::getenv("RANK") && std::string(std::getenv("RANK")) == "0") fulgur::detail::remove_tree(dir);
  const auto policy = fsdp(WrapPolicy::by_type<Block>());
  const TrainerConfig c{.default_root_dir = dir};
  const auto straight = train_deep<Zero<3>, FloatPrecision>(c, policy, 3);
  const auto one = train_deep<Zero<3>, FloatPrecision>(c, policy, 1, "", dir + "/one.ckpt");
  const auto resumed = train_deep<Zero<3>, FloatPrecision>(c, policy, 3, dir + "/one.ckpt");
  check(max_difference(straight, resumed) == 0.0,
        "stage 3 resumed from epoch 1 equals the straight run bit for bit (max difference " +
            std::to_string(max_difference(straight, resumed)) + ")");
  const int world = world_from_environment();
  // The manifest holds no weight: each rank wrote its own chunk of every bucket to its own file.
  {
    const StateDict weights(checkpoint::load(dir + "/one.ckpt").at("state_dict").toGenericDict());
    check(distributed::is_sharded_module_state(weights) && weights.contains("files") && !weights.contains("shard") &&
              weights.at("files").toList().size() == static_cast<std::size_t>(world),
          "a stage-3 manifest names one weights file per rank and holds no chunk itself");
    std::int64_t padded = 0;
    for (const auto& n : weights.at("buckets").toList()) padded += n.get().toInt();
    check(padded >= 136 + 3 * 306 + 90, "the buckets hold every parameter");
    for (int r = 0; r < world; ++r) {
      std::int64_t held = 0;
      for (const auto& chunk : distributed::sharded_module_chunks(weights, r)) held += chunk.numel();
      check(held * world == padded, "rank " + std::to_string(r) + " wrote 1/" + std::to_string(world) +
                                        " of the weights (" + std::to_string(held) + " of " + std::to_string(padded) + ")");
    }
  }
  {  // joined whole for a single-device model (each rank's file read once)
    Deep single;
    checkpoint::load_module_state_dict(*single, checkpoint::module_weights(checkpoint::load(dir + "/one.ckpt")));
    std::vector<at::Tensor> loaded;
    for (const auto& p : single->parameters()) loaded.push_back(p.detach().clone());
    check(max_difference(one, loaded) == 0.0, "a stage-3 checkpoint's weights, joined, load into a single-device model");
  }
  // Saving gathers nothing when sharded (every rank writes what it holds); full gathers every unit.
  auto gathers_to_save = [&](StateDictType type) {
    torch::manual_seed(3);
    Deep model;
    FSDPOptions o = policy;
    o.state_dict_type = type;
    Trainer<CPUAccelerator, Zero<3>, FloatPrecision> t(config(c), o);
    auto optimizer = model->configure_optimizers();
    t.setup(model, *optimizer);
    auto [x, y] = dataset(16);
    t.backward(model->training_step({x, y}, 0));
    t.optimizer_step(*optimizer);
    const std::int64_t before = t.strategy().parameter_gatherer()->gathers();
    StateDict state;
    state.insert("model", t.module_state(*model).to_ivalue());
    t.save(dir + "/fabric.ckpt", state);
    const std::int64_t saved = t.strategy().parameter_gatherer()->gathers() - before;
    t.load_module_state(*model, StateDict(t.load(dir + "/fabric.ckpt").at("model").toGenericDict()));
    return std::pair{saved, t.strategy().parameter_gatherer()->gathers() - before - saved};
  };
  const auto [sharded_save, sharded_load] = gathers_to_save(StateDictType::sharded);
  const auto [full_save, full_load] = gathers_to_save(StateDictType::full);
  // full: each block once, the root (inp, out) twice — once per end of the key order (full_load:
  // gather_all, which the op-driven count leaves out)
  (void)full_load;
  check(sharded_save == 0 && sharded_load == 0 && full_save == 5,
        "sharded, saving and loading the weights gathers no unit (" + std::to_string(sharded_save) + ", " +
            std::to_string(sharded_load) + "); full gathers the root twice and each block once (" +
            std::to_string(full_save) + ")");
  // state_dict_type full: whole weights in the manifest, equal to the sharded save's joined.
  FSDPOptions full = policy;
  full.state_dict_type = StateDictType::full;
  const auto one_full = train_deep<Zero<3>, FloatPrecision>(c, full, 1, "", dir + "/one_full.ckpt");
  check(max_difference(one, one_full) == 0.0, "the same epoch under state_dict_type full");
  {
    const StateDict joined = checkpoint::module_weights(checkpoint::load(dir + "/one.ckpt"));
    const StateDict whole(checkpoint::load(dir + "/one_full.ckpt").at("state_dict").toGenericDict());
    check(!distributed::is_sharded_module_state(whole) && whole.size() == joined.size(), "a full manifest holds the weights");
    for (const auto& item : whole)
      check(at::equal(item.value().toTensor(), joined.at(item.key().toStringRef()).toTensor()),
            "'" + item.key().toStringRef() + "' of the full save equals the sharded save's, joined");
  }
  // checkpoint::consolidate: one self-contained file, which Python's torch.load reads as tensors, and
  // from which the fit resumes as from the manifest.
  if (my_rank == 0) {
    checkpoint::consolidate(dir + "/one.ckpt", dir + "/one_consolidated.ckpt");
    const std::string script =
        "import sys, torch\n"
        "a = torch.load(sys.argv[1], weights_only=True, map_location='cpu')['state_dict']\n"
        "b = torch.load(sys.argv[2], weights_only=True, map_location='cpu')['state_dict']\n"
        "assert list(a) == list(b) and len(a) == 10, (list(a), list(b))\n"
        "assert all(torch.equal(a[k], b[k]) for k in a), 'values differ'\n"
        "print('python reads the consolidated weights')\n";
    std::ofstream(dir + "/read_consolidated.py") << script;
    const std::string command = std::string("\"") + FULGUR_TEST_PYTHON + "\" \"" + dir + "/read_consolidated.py\" \"" +
                                dir + "/one_consolidated.ckpt\" \"" + dir + "/one_full.ckpt\"";
    check(std::system(command.c_str()) == 0, "Python's torch.load reads the consolidated checkpoint's weights whole: " + command);
  }
  const auto from_consolidated = train_deep<Zero<3>, FloatPrecision>(c, policy, 3, dir + "/one_consolidated.ckpt");
  check(max_difference(straight, from_consolidated) == 0.0,
        "resumed from the consolidated file: bit for bit as the straight run (max difference " +
            std::to_string(max_difference(straight, from_consolidated)) + ")");
  const auto under_ddp = train_deep<DDP, FloatPrecision>(c, options(), 3, dir + "/one.ckpt");
  check(max_difference(straight, under_ddp) <= tolerance<2>(false),
        "a stage-3 checkpoint resumed under DDP: max difference " + std::to_string(max_difference(straight, under_ddp)));
  const auto under_stage2 = train_deep<Zero<2>, FloatPrecision>(c, options(), 3, dir + "/one.ckpt");
  check(max_difference(straight, under_stage2) <= tolerance<2>(false),
        "a stage-3 checkpoint resumed under stage 2: max difference " + std::to_string(max_difference(straight, under_stage2)));
  train_deep<Zero<2>, FloatPrecision>(c, options(), 1, "", dir + "/stage2.ckpt");
  const auto from_stage2 = train_deep<Zero<3>, FloatPrecision>(c, policy, 3, dir + "/stage2.ckpt");
  check(max_difference(straight, from_stage2) <= tolerance<2>(false),
        "a stage-2 checkpoint resumed under stage 3: max difference " + std::to_string(max_difference(straight, from_stage2)));
  // other units (another policy): laid out again through the whole state
  const auto other_units = train_deep<Zero<3>, FloatPrecision>(c, fsdp(WrapPolicy::by_size(200)), 3, dir + "/one.ckpt");
  check(max_difference(straight, other_units) <= tolerance<2>(false),
        "resumed with another wrap policy: max difference " + std::to_string(max_difference(straight, other_units)));
}

// ---- stage 3, a model built on the meta device ----------------------------------------------------

// A small GPT-like model: an embedding, three pre-norm blocks in a ModuleList, a final LayerNorm,
// a BatchNorm (buffers, which stay whole) and a head whose weight is the embedding's (tied: a
// module of its own that takes the tensor, so LibTorch's built-ins do not know it).
struct HeadImpl : torch::nn::Module {
  explicit HeadImpl(const at::Tensor& tied) : weight(register_parameter("weight", tied)) {}
  at::Tensor weight;
};
TORCH_MODULE(Head);
struct GBlockImpl : torch::nn::Module {
  GBlockImpl() : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})))),
                 fc(register_module("fc", torch::nn::Linear(16, 16))) {}
  at::Tensor forward(const at::Tensor& h) { return h + torch::tanh(fc(ln(h))); }
  torch::nn::LayerNorm ln;
  torch::nn::Linear fc;
};
TORCH_MODULE(GBlock);
struct TinyGPTImpl : torch::nn::Module {
  TinyGPTImpl()
      : tok(register_module("tok", torch::nn::Embedding(13, 16))),
        blocks(register_module("blocks", torch::nn::ModuleList())) {
    for (int i = 0; i < 3; ++i) blocks->push_back(GBlock());
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    head = register_module("head", Head(tok->weight));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = tok(((x * 3).floor().clamp(-6, 6) + 6).to(at::kLong));
    for (const auto& b : *blocks) h = b->as<GBlockImpl>()->forward(h);
    return torch::linear(bn(ln_f(h).mean(1)), head->weight);
  }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  at::Tensor validation_step(const data::Batch& b, std::int64_t i) { return training_step(b, i); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  }
  torch::nn::Embedding tok;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  Head head{nullptr};
};
TORCH_MODULE(TinyGPT);

FSDPOptions fsdp_gpt() {
  FSDPOptions o = fsdp(WrapPolicy::by_type<GBlock>());
  o.param_init = [](torch::nn::Module& m) {
    if (dynamic_cast<HeadImpl*>(&m) != nullptr) return true;  // took the embedding's weight: drew nothing
    return distributed::reset_builtin_parameters(m);
  };
  return o;
}

std::map<std::string, at::Tensor> state_of(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : m.named_parameters()) out[item.key()] = item.value().detach().clone();
  for (const auto& item : m.named_buffers()) out[item.key()] = item.value().detach().clone();
  return out;
}

/// The weights after fit under stage 3 of a TinyGPT built eagerly or on the meta device; each rank
/// seeds differently, so the weights are rank 0's only if set-up broadcast them.
template <class P>
std::map<std::string, at::Tensor> train_gpt(bool meta) {
  Trainer<CPUAccelerator, Zero<3>, P> trainer(config({.max_epochs = 2}), fsdp_gpt());
  my_rank = trainer.global_rank();
  torch::manual_seed(static_cast<std::uint64_t>(3 + 100 * my_rank));
  TinyGPT model{nullptr};
  {
    auto in_context = trainer.init_module(/*empty_init=*/meta);
    model = TinyGPT();
  }
  for (const auto& p : model->parameters()) check(p.is_meta() == meta, "init_module(empty_init) builds on the meta device");
  auto [x, y] = dataset(240);
  data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
  trainer.fit(model, loader);
  return state_of(*model);
}

double max_difference(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  check(a.size() == b.size(), "the same tensors");
  double d = 0;
  for (const auto& [name, t] : a) {
    check(b.count(name) == 1 && b.at(name).sizes() == t.sizes(), "the same tensor " + name);
    d = std::max(d, (t.to(at::kDouble) - b.at(name).to(at::kDouble)).abs().max().item<double>());
  }
  return d;
}

/// `run` throws E whose message holds every one of `parts`.
template <class E, class F>
void expect_error(F&& run, std::initializer_list<std::string> parts, const std::string& what) {
  std::string message;
  try {
    run();
  } catch (const E& e) {
    message = e.what();
  }
  check(!message.empty(), what + ": refused");
  for (const auto& part : parts)
    check(message.find(part) != std::string::npos, what + ": the error says " + part + " (it says: " + message + ")");
}

void meta3() {
  const int world = world_from_environment();
  // 1. Materialised at set-up: rank 0's eager values, bit for bit, never the whole model at once.
  {
    FSDPOptions whole_states = fsdp_gpt();
    whole_states.state_dict_type = StateDictType::full;  // module_state below: the weights whole
    Trainer<CPUAccelerator, Zero<3>, FloatPrecision> trainer(config(), whole_states);
    my_rank = trainer.global_rank();
    torch::manual_seed(3);
    TinyGPT eager;  // what rank 0 builds eagerly
    const auto expected = state_of(*eager);
    torch::manual_seed(static_cast<std::uint64_t>(3 + 100 * my_rank));
    TinyGPT model{nullptr};
    {
      auto in_context = trainer.init_module(/*empty_init=*/true);
      model = TinyGPT();
    }
    for (const auto& t : model->parameters()) check(t.is_meta(), "built on the meta device (shapes, no memory)");
    for (const auto& t : model->buffers()) check(t.is_meta(), "buffers too");
    check(model->head->weight.is_same(model->tok->weight), "the tie survives the meta device");
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    trainer.setup(model, optimizer);
    for (const auto& t : model->parameters()) check(!t.is_meta() && t.storage().nbytes() == 0, "sharded at rest");
    for (const auto& t : model->buffers()) check(!t.is_meta() && t.storage().nbytes() > 0, "buffers whole");
    check(model->head->weight.is_same(model->tok->weight), "still tied after set-up");
    const auto state = trainer.module_state(*model);
    for (const auto& [name, value] : expected)
      check(torch::equal(state.at(name).toTensor(), value),
            name + ": materialised on rank " + std::to_string(my_rank) + " equals rank 0's eager build bit for bit");
    // what was whole at once: the root unit's buckets, one block's, the BatchNorm's buffers
    std::int64_t root = 0, block = 0, all = 0;
    for (const auto* bucket : trainer.strategy().optimizer_shards().front()->buckets()) {
      const at::Tensor& first = bucket->slots.front().param;
      const bool in_root = first.is_same(model->tok->weight) || first.is_same(model->ln_f->weight) ||
                           first.is_same(model->ln_f->bias) || first.is_same(model->bn->weight) ||
                           first.is_same(model->bn->bias);
      (in_root ? root : block) = in_root ? root + bucket->numel * 4 : std::max(block, bucket->numel * 4);
      all += bucket->numel * 4;
    }
    const auto& stats = trainer.strategy().materialize_stats();
    const std::int64_t buffers = 2 * 16 * 4 + 8;  // running mean and var, num_batches_tracked
    check(stats.whole_bytes == buffers, "the buffers kept whole: " + std::to_string(stats.whole_bytes));
    check(stats.peak_bytes >= block && stats.peak_bytes <= root + block + buffers,
          "at most the root unit, one block and the buffers whole while initialising: peak " +
              std::to_string(stats.peak_bytes) + ", bound " + std::to_string(root + block + buffers) + " of " +
              std::to_string(all + buffers));
    check(stats.peak_bytes < all, "never the whole model");
    check(stats.modules == 10, "10 modules initialised (tok, 3 x (ln, fc), ln_f, bn, head): " + std::to_string(stats.modules));
    auto [x, y] = dataset(16);
    optimizer.zero_grad();
    trainer.backward(model->training_step({x, y}, 0));
    trainer.optimizer_step(optimizer);
    if (my_rank == 0)
      std::cout << "meta: peak whole while materialising " << stats.peak_bytes << " of " << all + buffers
                << " bytes, " << stats.modules << " modules" << std::endl;
  }
  // 2. Trained from a meta build: as the eager build, bit for bit, 32-true and bf16-mixed.
  {
    const double d = max_difference(train_gpt<FloatPrecision>(false), train_gpt<FloatPrecision>(true));
    check(d == 0.0, "32-true: a meta-built model trains as the eager one bit for bit (max difference " + std::to_string(d) + ")");
    const double db = max_difference(train_gpt<BF16MixedPrecision>(false), train_gpt<BF16MixedPrecision>(true));
    check(db == 0.0, "bf16-mixed: a meta-built model trains as the eager one bit for bit (max difference " + std::to_string(db) + ")");
  }
  // 3. A module type the initialiser does not know: named, with what to do.
  {
    Trainer<CPUAccelerator, Zero<3>, FloatPrecision> trainer(config(), fsdp(WrapPolicy::by_type<GBlock>()));
    TinyGPT model{nullptr};
    {
      auto in_context = trainer.init_module(true);
      model = TinyGPT();
    }
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    expect_error<MisconfigurationError>([&] { trainer.setup(model, optimizer); },
                                                {"'head'", "HeadImpl", "FSDPOptions::param_init"},
                                                "a module the default initialiser does not know");
  }
  // 4. Nowhere else does a meta tensor pass silently.
  {
    Trainer<CPUAccelerator, DDP, FloatPrecision> trainer(config({.max_epochs = 1}), options());
    TinyGPT built{nullptr};
    {
      auto in_context = trainer.init_module(true);  // accepted; DDP always initialises
      built = TinyGPT();
    }
    check(!built->tok->weight.is_meta(), "init_module(true) under DDP builds real tensors");
    torch::manual_seed(3);
    TinyGPT meta{nullptr};
    {
      DefaultDeviceGuard on_meta{c10::Device(c10::kMeta)};
      meta = TinyGPT();
    }
    auto [x, y] = dataset(16);
    data::TensorLoader loader(x, y, {.batch_size = 8});
    expect_error<MisconfigurationError>([&] { trainer.fit(meta, loader); },
                                                {"'tok.weight'", "meta device", "ShardedStrategy<3>"},
                                                "DDP given a meta model");
    Trainer<CPUAccelerator, Zero<3>, FloatPrecision> sharded(config(), fsdp_gpt());
    TinyGPT unfit{nullptr};
    {
      auto in_context = sharded.init_module(true);
      unfit = TinyGPT();
    }
    expect_error<MisconfigurationError>([&] { sharded.validate(unfit, loader); },
                                                {"'tok.weight'", "fit it before validate"},
                                                "validate on a meta model");
  }
  (void)world;
}

/// LibTorch's built-ins that do not initialise "each module its own tensors, in registration order"
/// (MultiheadAttention, PReLU, the Transformer family), built on the meta device and materialised by
/// the default initialiser: every rank's weights equal rank 0's eager build bit for bit, whatever
/// the units (an attention module and its out_proj in different units; layers a unit each).
struct HoldsImpl : torch::nn::Module {
  explicit HoldsImpl(std::shared_ptr<torch::nn::Module> m) { register_module("m", std::move(m)); }
};
TORCH_MODULE(Holds);

/// A small attention model: 8 features as 4 tokens of 2, two encoder layers, a head.
struct AttentionNetImpl : torch::nn::Module {
  AttentionNetImpl() {
    using namespace torch::nn;
    embed = register_module("embed", Linear(2, 8));
    // The prototype layer built where the encoder is: its draws are the encoder's first layer's.
    TransformerEncoderLayer layer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0));
    encoder = register_module("encoder", TransformerEncoder(layer, 2));
    head = register_module("head", Linear(8, 4));
  }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    const at::Tensor tokens = embed(b.input.view({-1, 4, 2})).transpose(0, 1);  // (sequence, batch, features)
    return torch::nn::functional::cross_entropy(head(encoder(tokens).mean(0)), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(0.01));
  }
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::nn::TransformerEncoder encoder{nullptr};
};
TORCH_MODULE(AttentionNet);

std::map<std::string, at::Tensor> train_attention(bool meta) {
  FSDPOptions o = fsdp(WrapPolicy::by_type<torch::nn::TransformerEncoderLayer>());
  o.state_dict_type = StateDictType::full;
  Trainer<CPUAccelerator, Zero<3>, FloatPrecision> trainer(config({.max_epochs = 2}), o);
  my_rank = trainer.global_rank();
  torch::manual_seed(static_cast<std::uint64_t>(meta ? 5 + 100 * my_rank : 5));
  AttentionNet model{nullptr};
  {
    auto in_context = trainer.init_module(/*empty_init=*/meta);
    model = AttentionNet();
  }
  auto [x, y] = dataset(96);
  data::TensorLoader loader(x, y, {.batch_size = 8, .shuffle = true, .seed = 9});
  trainer.fit(model, loader);
  std::map<std::string, at::Tensor> out;
  for (const auto& entry : trainer.module_state(*model)) out[entry.key().toStringRef()] = entry.value().toTensor();
  return out;
}

void builtins3() {
  using namespace torch::nn;
  struct Case {
    std::string name;
    std::function<std::shared_ptr<Module>()> build;
    WrapPolicy wrap;
  };
  const std::vector<Case> cases = {
      {"MultiheadAttention", [] { return MultiheadAttention(8, 2).ptr(); }, {}},
      {"MultiheadAttention, bias_kv, kdim/vdim, out_proj its own unit",
       [] { return MultiheadAttention(MultiheadAttentionOptions(8, 2).add_bias_kv(true).kdim(4).vdim(6)).ptr(); },
       WrapPolicy::by_type<Linear>()},
      {"PReLU beside a Linear",
       [] {
         auto s = Sequential(Linear(4, 3), PReLU(PReLUOptions().num_parameters(3).init(0.1)));
         return s.ptr();
       },
       {}},
      {"TransformerEncoderLayer, Linears their own units",
       [] { return TransformerEncoderLayer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16)).ptr(); },
       WrapPolicy::by_type<Linear>()},
      {"TransformerDecoderLayer, attention its own unit",
       [] { return TransformerDecoderLayer(TransformerDecoderLayerOptions(8, 2).dim_feedforward(16)).ptr(); },
       WrapPolicy::by_type<MultiheadAttention>()},
      {"TransformerEncoder: three cloned layers",
       [] {
         TransformerEncoderLayer layer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16));
         return TransformerEncoder(TransformerEncoderOptions(layer, 3).norm(AnyModule(LayerNorm(LayerNormOptions({8})))))
             .ptr();
       },
       WrapPolicy::by_type<TransformerEncoderLayer>()},
      {"TransformerDecoder: two cloned layers",
       [] {
         TransformerDecoderLayer layer(TransformerDecoderLayerOptions(8, 2).dim_feedforward(16));
         return TransformerDecoder(TransformerDecoderOptions(layer, 2)).ptr();
       },
       WrapPolicy::by_type<TransformerDecoderLayer>()},
      {"Transformer: every matrix redrawn, a layer a unit",
       [] { return Transformer(TransformerOptions(8, 2, 2, 2).dim_feedforward(16)).ptr(); },
       WrapPolicy::by_type<TransformerEncoderLayer, TransformerDecoderLayer>()},
      {"Transformer, one unit", [] { return Transformer(TransformerOptions(8, 2, 1, 1).dim_feedforward(16)).ptr(); }, {}},
  };
  for (const Case& c : cases) {
    FSDPOptions o = fsdp(c.wrap);
    o.state_dict_type = StateDictType::full;
    Trainer<CPUAccelerator, Zero<3>, FloatPrecision> trainer(config(), o);
    my_rank = trainer.global_rank();
    torch::manual_seed(5);
    Holds eager(c.build());
    const auto expected = state_of(*eager);
    torch::manual_seed(static_cast<std::uint64_t>(5 + 100 * my_rank));
    Holds model{nullptr};
    {
      auto on_meta = trainer.init_module(/*empty_init=*/true);
      model = Holds(c.build());
    }
    check(!fulgur::detail::first_meta_tensor(*model).empty(), c.name + ": built on the meta device");
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    trainer.setup(model, optimizer);
    const auto state = trainer.module_state(*model);
    check(state.size() == expected.size(), c.name + ": every tensor");
    for (const auto& [name, value] : expected)
      check(torch::equal(state.at(name).toTensor(), value),
            c.name + ": " + name + " materialised on rank " + std::to_string(my_rank) +
                " equals rank 0's eager build bit for bit");
    std::int64_t all = 0;
    for (const auto* bucket : trainer.strategy().optimizer_shards().front()->buckets()) all += bucket->numel * 4;
    const auto& stats = trainer.strategy().materialize_stats();
    if (c.wrap.module_types.size() > 0 && c.name.find("out_proj its own unit") == std::string::npos)  // one init for both
      check(stats.peak_bytes < all, c.name + ": never the whole model at once (peak " +
                                        std::to_string(stats.peak_bytes) + " of " + std::to_string(all) + " bytes)");
    if (my_rank == 0)
      std::cout << "builtins: " << c.name << ": " << expected.size() << " tensors as eager, peak whole "
                << stats.peak_bytes << " of " << all << " bytes" << std::endl;
  }
  // Trained: a meta-built attention model (gathered a layer at a time) as the eager one, bit for bit.
  const auto eager = train_attention(false), meta = train_attention(true);
  const double d = max_difference(eager, meta);
  check(d == 0.0, "a meta-built TransformerEncoder trains as the eager one bit for bit (max difference " +
                      std::to_string(d) + ")");
  check(max_difference(eager, state_of(*AttentionNet())) > 0, "the training moved the weights");
}

/// tests/distributed/fault.sh, mode "self": rank 1 SIGKILLs itself inside a stage-3 forward, after
/// the first block ran and before the second is gathered; rank 0 must stop with the lost rank
/// named (its gather fails inside an op, where LibTorch cannot take the error: the strategy throws
/// it from backward), not hang and not step on the zeros the failed gather left.
struct DyingDeepImpl : DeepImpl {
  std::int64_t steps = 0;
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = inp(x);
    for (std::size_t i = 0; i < blocks->size(); ++i) {
      if (i == 1 && my_rank == 1 && steps == 5) ::raise(SIGKILL);
      h = blocks[i]->as<BlockImpl>()->forward(h);
    }
    return out(h);
  }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    ++steps;
    return torch::nn::functional::cross_entropy(forward(b.input.narrow(1, 0, 7)), b.target);
  }
};
TORCH_MODULE(DyingDeep);

void fault3() {
  auto [x, y] = dataset(4096);
  DyingDeep model;
  Trainer<CPUAccelerator, Zero<3>, FloatPrecision> trainer(
      config({.max_epochs = 1000, .preemption = {.enabled = false}}), fsdp(WrapPolicy::by_type<Block>()));
  my_rank = trainer.global_rank();
  data::TensorLoader loader(x, y, {.batch_size = 8});
  std::cout << "rank " << my_rank << " training" << std::endl;
  try {
    trainer.fit(model, loader);
  } catch (const DistributedError& e) {
    std::cout << "rank " << my_rank << " stopped at step " << model->steps << ": " << e.what() << std::endl;
    // the gather in forward failed first: its error, not a later collective's
    if (std::string(e.what()).find("all_gather #") == std::string::npos || std::string(e.what()).find(" on rank 0 of 2 failed") == std::string::npos)
      std::cout << "rank 0 FAILED: the error is not the forward's gather" << std::endl;
    std::exit(3);
  }
  std::exit(0);
}

// GradientAccumulationScheduler on sharded ranks: a schedule {0: 2} trains as accumulate_grad_batches
// = 2, bit for bit, and {1: 4} steps 8 then 2 times; BackboneFinetuning is refused under stage 3.
struct StepsPerEpoch {
  std::map<std::int64_t, int> steps;
  void on_before_optimizer_step(TrainerView& trainer) { ++steps[trainer.current_epoch()]; }
};

template <int Stage>
void accumulation_schedule() {
  auto [x, y] = dataset(64 * world_from_environment());  // 64 samples a rank, batches of 8
  const auto fit = [&](auto& trainer) {
    my_rank = trainer.global_rank();
    torch::manual_seed(3);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8});
    trainer.fit(model, loader);
    return model->parameters();
  };
  std::vector<at::Tensor> scheduled, fixed;
  {
    Trainer<CPUAccelerator, Zero<Stage>, FloatPrecision, GradientAccumulationScheduler> trainer(
        config({.max_epochs = 2}), options(), GradientAccumulationScheduler({{0, 2}}));
    scheduled = fit(trainer);
  }
  {
    Trainer<CPUAccelerator, Zero<Stage>, FloatPrecision> trainer(config({.max_epochs = 2, .accumulate_grad_batches = 2}), options());
    fixed = fit(trainer);
  }
  for (std::size_t i = 0; i < fixed.size(); ++i)
    check(torch::equal(scheduled[i], fixed[i]), "the schedule {0: 2} trains as accumulate_grad_batches = 2, bit for bit");
  {
    Trainer<CPUAccelerator, Zero<Stage>, FloatPrecision, GradientAccumulationScheduler, StepsPerEpoch> trainer(
        config({.max_epochs = 2}), options(), GradientAccumulationScheduler({{1, 4}}), StepsPerEpoch{});
    fit(trainer);
    const auto& steps = trainer.template callback<StepsPerEpoch>().steps;
    check(steps.at(0) == 8 && steps.at(1) == 2, "steps per epoch 8, then 2");
  }
  {  // stage 3 keeps its refusal (stages 1 and 2 take the backbone's group: backbone_finetuning)
    Trainer<CPUAccelerator, Zero<3>, FloatPrecision, BackboneFinetuning> trainer(
        config({.max_epochs = 1}), fsdp({}), BackboneFinetuning({.backbone = "fc1"}));
    std::string message;
    try {
      fit(trainer);
    } catch (const MisconfigurationError& e) {
      message = e.what();
    }
    check(message.find("BackboneFinetuning cannot run under ShardedStrategy<3>") != std::string::npos &&
              message.find("use ShardedStrategy<2>") != std::string::npos,
          "BackboneFinetuning is refused under ShardedStrategy<3>: " + message);
  }
}

// TrainerConfig::detect_anomaly: an infinite gradient of fc2.bias made on the last rank only, at
/// global step 1, stops every rank with the parameter named. Stages 2 and 3 keep no gradient on the
/// module: each rank checks its shard (fc2.bias lies in the last rank's), and the ranks agree.
struct PoisonedNetImpl : NetImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    at::Tensor loss = NetImpl::training_step(b, i);
    if (ctx.global_step != 1 || ctx.global_rank != ctx.world_size - 1) return loss;
    const at::Tensor zero = fc2->bias[0] - fc2->bias[0].detach();  // 0, with d/dbias[0] = 1
    return loss + zero.sqrt();  // finite loss; d sqrt/dz at 0 = inf, no NaN for anomaly mode to catch
  }
};

template <class Strategy, class Options>
void detect_anomaly(const Options& strategy_options) {
  torch::manual_seed(3);
  auto model = std::make_shared<PoisonedNetImpl>();
  auto [x, y] = dataset(16 * world_from_environment());
  Trainer<CPUAccelerator, Strategy, FloatPrecision> trainer(config({.max_steps = 3, .detect_anomaly = true}),
                                                            strategy_options);
  my_rank = trainer.global_rank();
  std::string message = "<no error>";
  try {
    trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 8}));
  } catch (const NonFiniteGradientError& e) {
    message = e.what();
  }
  check(message.find("the gradient of 1 parameter is NaN or infinite ('fc2.bias') after the backward of "
                     "training_step at epoch 0, batch 1 (global_step 1)") != std::string::npos,
        "detect_anomaly names fc2.bias on every rank: " + message);
}

template <int Stage>
bool dispatch(const std::string& scenario, int argc, char** argv) {
  if (scenario == "parity") parity<Stage>();
  else if (scenario == "variants") variants<Stage>();
  else if (scenario == "memory") memory<Stage>();
  else if (scenario == "overflow") {
    overflow<Stage>();
    detect_anomaly<Zero<Stage>>(options());
  }
  else if (scenario == "checkpoints" && argc > 2) {
    checkpoints<Stage>(argv[2]);
    backbone_finetuning<Stage>(argv[2]);
  }
  else if (scenario == "refusals") refusals<Stage>();
  else if (scenario == "accumulation_schedule") accumulation_schedule<Stage>();
  else return false;
  return true;
}

}  // namespace

// argv[1]: "<scenario>" (stage 1) or "<scenario>@2" (stage 2).
int main(int argc, char** argv) {
  const std::string argument = argc > 1 ? argv[1] : "";
  return worker::run(argument,
                     "usage: sharded_worker parity|variants|memory|overflow|checkpoints <folder>|refusals[@2] | memory_table | reshard_save <folder> | reshard_load <folder> <W>",
                     [&](const std::string& scenario) {
                       if (scenario == "memory_table") {
                         memory_table();
                         return true;
                       }
                       if (scenario == "elastic" && argc > 2) {  // elastic.sh: ShardedStrategy<2>
                         elastic::run<Zero<2>>(argv[2]);
                         return true;
                       }
                       if (scenario == "reshard_save" && argc > 2) {
                         reshard_save(argv[2]);
                         return true;
                       }
                       if (scenario == "reshard_load" && argc > 3) {
                         reshard_load(argv[2], std::atoi(argv[3]));
                         return true;
                       }
                       const auto at = scenario.find('@');
                       if (at == std::string::npos) return dispatch<1>(scenario, argc, argv);
                       if (scenario.substr(at) == "@2") return dispatch<2>(scenario.substr(0, at), argc, argv);
                       if (scenario == "parity@3") parity3();
                       else if (scenario == "fault@3") fault3();
                       else if (scenario == "memory@3") memory3();
                       else if (scenario == "meta@3") meta3();
                       else if (scenario == "builtins@3") {
                         builtins3();
                         detect_anomaly<Zero<3>>(fsdp({}));
                       }
                       else if (scenario == "checkpoints@3" && argc > 2) checkpoints3(argv[2]);
                       else return false;
                       return true;
                       return false;
                     });
}
