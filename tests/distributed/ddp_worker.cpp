// One rank of a multi-process test, started by torchrun (or tests/distributed/fault.sh) with the
// scenario as argv[1]. Each rank checks its own results; a failure exits non-zero with the reason,
// which fails the ctest case. Global rank 0 prints "PASS <scenario>" at the end.
#include <fulgur/detail/files.hpp>
#include <fulgur/callbacks/backbone_finetuning.hpp>
#include <fulgur/callbacks/gradient_accumulation_scheduler.hpp>
#include <fulgur/callbacks/on_exception_checkpoint.hpp>
#include <fulgur/fulgur.hpp>

#include "elastic.hpp"
#include "worker.hpp"
#include <torch/torch.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <chrono>
#include <fstream>
#include <thread>
#include <limits>
#include <map>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

using namespace fulgur;
using Gloo = BasicDDPStrategy<backend::Gloo>;

namespace {

using worker::check;
using worker::my_rank;
using worker::options;

TrainerConfig config(TrainerConfig c = {}) {
  c.enable_progress_bar = false;
  c.devices = 2;
  return c;
}

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 32))), fc2(register_module("fc2", torch::nn::Linear(32, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  at::Tensor validation_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

std::pair<at::Tensor, at::Tensor> dataset(std::int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto x = at::randn({n, 8}, gen);
  auto y = (x.select(1, 0) > 0).to(at::kLong) + (x.select(1, 1) > 0.5).to(at::kLong);
  return {x, y};
}

// ---- scenarios ----------------------------------------------------------------------------------

void collectives() {
  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config(), options());
  const int rank = trainer.global_rank(), world = trainer.world_size();
  check(world == 2, "world size 2");
  // Lightning's table: rank r holds r + 1; world 2 -> sum 3, max 2, min 1, mean 1.5 (1 for integers).
  for (auto dtype : {at::kLong, at::kInt, at::kFloat, at::kHalf}) {
    auto value = [&] { return at::full({3}, rank + 1, at::TensorOptions().dtype(dtype)); };
    const bool integer = !at::isFloatingType(dtype);
    std::ostringstream name;
    name << dtype;
    check(trainer.all_reduce(value(), ReduceOp::sum).equal(at::full({3}, 3, dtype)), "sum " + name.str());
    check(trainer.all_reduce(value(), ReduceOp::max).equal(at::full({3}, 2, dtype)), "max " + name.str());
    check(trainer.all_reduce(value(), ReduceOp::min).equal(at::full({3}, 1, dtype)), "min " + name.str());
    const auto mean = trainer.all_reduce(value(), ReduceOp::mean);
    check(mean.equal(integer ? at::full({3}, 1, dtype) : at::full({3}, 1.5, dtype)), "mean " + name.str());
    check(mean.scalar_type() == dtype, "mean keeps the dtype");
  }
  auto in_place = at::full({2}, rank + 1.0);
  trainer.all_reduce(in_place, ReduceOp::sum);
  check(in_place.equal(at::full({2}, 3.0)), "all_reduce is in place");

  // all_gather: equal shapes stack; uneven shapes are padded, gathered and trimmed.
  const auto stacked = trainer.all_gather(at::full({2, 2}, static_cast<float>(rank)));
  check(stacked.sizes() == at::IntArrayRef({2, 2, 2}) && stacked[1].equal(at::ones({2, 2})), "all_gather stacks");
  const auto scalars = trainer.all_gather(at::scalar_tensor(static_cast<float>(rank)));
  check(scalars.sizes() == at::IntArrayRef({2}) && scalars[1].item<float>() == 1.0f, "all_gather of a 0-dim tensor");
  const auto uneven = trainer.strategy().all_gather_uneven(at::full({rank + 1, 2}, static_cast<float>(rank)));
  check(uneven.size() == 2 && uneven[0].sizes() == at::IntArrayRef({1, 2}) && uneven[1].sizes() == at::IntArrayRef({2, 2}) &&
            uneven[1].equal(at::ones({2, 2})),
        "all_gather_uneven trims to each rank's shape");

  auto from_one = at::full({4}, static_cast<float>(rank * 10));
  trainer.broadcast(from_one, 1);
  check(from_one.equal(at::full({4}, 10.0f)), "broadcast tensor from rank 1");
  const std::string text = trainer.strategy().broadcast(rank == 0 ? std::string("hello from rank 0") : std::string(), 0);
  check(text == "hello from rank 0", "broadcast string, got '" + text + "'");
  StateDict state;
  if (rank == 1) {
    state.insert("epoch", static_cast<std::int64_t>(7));
    state.insert("name", std::string("run-a"));
    state.insert("weights", at::arange(4.0));
  }
  const StateDict received = trainer.strategy().broadcast(state, 1);
  check(received.size() == 3 && received.at("epoch").toInt() == 7 && received.at("name").toStringRef() == "run-a" &&
            torch::equal(received.at("weights").toTensor(), at::arange(4.0)),
        "broadcast a serialisable StateDict from rank 1");
  trainer.barrier();
  check(trainer.strategy().reduce_boolean_decision(rank == 0, /*all=*/true) == false, "all() of {true,false}");
  check(trainer.strategy().reduce_boolean_decision(rank == 0, /*all=*/false) == true, "any() of {true,false}");
  check(trainer.strategy().reduce_boolean_decision(true, true) == true, "all() of {true,true}");
}

// DDP with 2 ranks x batch B equals 1 process with batch 2B; both ranks end bit-identical.
void parity() {
  constexpr std::int64_t B = 16, N = 256, epochs = 2;
  auto [x, y] = dataset(N);
  torch::manual_seed(3);
  Net ddp_model;
  torch::manual_seed(3);
  Net reference;

  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config({.max_epochs = epochs}), options());
  data::TensorLoader loader(x, y, {.batch_size = B, .shuffle = true, .seed = 9});
  data::TensorLoader val(x, y, {.batch_size = 64});
  const auto result = trainer.fit(ddp_model, loader, val);  // process_dataloader shards both: rank r sees perm[r::2]
  check(result.global_step == epochs * N / (2 * B), "steps per epoch halve: " + std::to_string(result.global_step));

  // The reference: the same epochs, unsharded, batches of 2B, no communication.
  torch::optim::SGD optimizer(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  data::TensorLoader full(x, y, {.batch_size = 2 * B, .shuffle = true, .seed = 9});
  for (std::int64_t epoch = 0; epoch < epochs; ++epoch) {
    const auto order = full.order_for_epoch(epoch);
    for (std::int64_t i = 0; i < N / (2 * B); ++i) {
      // rank r's batch i holds order[2Bi + r + 2k]: the union is order[2Bi, 2B(i+1)), split by parity
      const auto ids = order.narrow(0, i * 2 * B, 2 * B);
      const auto even = ids.slice(0, 0, 2 * B, 2), odd = ids.slice(0, 1, 2 * B, 2);
      optimizer.zero_grad();
      auto loss = 0.5 * (reference->training_step({x.index_select(0, even), y.index_select(0, even)}, i) +
                         reference->training_step({x.index_select(0, odd), y.index_select(0, odd)}, i));
      loss.backward();
      optimizer.step();
    }
  }
  const auto params = ddp_model->parameters(), expected = reference->parameters();
  double max_diff = 0;
  for (std::size_t i = 0; i < params.size(); ++i)
    max_diff = std::max(max_diff, (params[i] - expected[i]).abs().max().item<double>());
  check(max_diff < 1e-5, "DDP weights equal the 2B-batch reference within 1e-5 (max difference " +
                             std::to_string(max_diff) + ")");
  // Validation: each rank evaluated its half; the weighted mean over both equals the full-data loss.
  {
    torch::NoGradGuard no_grad;
    const double full = torch::nn::functional::cross_entropy(reference->forward(x), y).item<double>();
    check(std::abs(*result.epochs.back().val_loss - full) < 1e-5,
          "the sharded validation loss equals the full-data loss: " + std::to_string(*result.epochs.back().val_loss) +
              " vs " + std::to_string(full));
    check(val.sampler().has_value() && val.num_samples() == N / 2, "the validation data was sharded");
  }
  for (const auto& p : params) {
    const auto gathered = trainer.all_gather(p.detach());
    check(torch::equal(gathered[0], gathered[1]), "replicas bit-identical");
  }
  for (const auto& item : checkpoint::module_state_dict(*ddp_model))
    check(item.key().toStringRef().rfind("fc", 0) == 0, "no wrapper prefix in '" + item.key().toStringRef() + "'");
  if (my_rank == 0) std::cout << "parity: max |ddp - reference| = " << max_diff << std::endl;
}

// Accumulating 2 micro-batches without communication (no_backward_sync) equals syncing on each.
void accumulation() {
  auto [x, y] = dataset(128);
  auto train = [&](bool skip_sync) {
    torch::manual_seed(5);
    Net model;
    Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config(), options());
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    trainer.setup(model, optimizer);
    data::TensorLoader loader(x, y, {.batch_size = 8});
    trainer.setup_dataloader(loader);
    std::int64_t i = 0;
    for (const auto& batch : loader) {
      const bool step = i % 2 == 1;
      auto loss = model->training_step(trainer.batch_to_device(batch), i) / 2.0;
      {
        auto guard = trainer.no_backward_sync(model, skip_sync && !step);
        trainer.backward(loss);
      }
      if (step) {
        trainer.optimizer_step(optimizer);
        optimizer.zero_grad();
      }
      ++i;
    }
    return model->parameters();
  };
  const auto with_skip = train(true), without = train(false);
  double max_diff = 0;
  for (std::size_t i = 0; i < with_skip.size(); ++i)
    max_diff = std::max(max_diff, (with_skip[i] - without[i]).abs().max().item<double>());
  check(max_diff < 1e-6, "no_backward_sync accumulation equals per-micro-batch sync (max difference " +
                             std::to_string(max_diff) + ")");
}

struct PartlyUsedImpl : NetImpl {
  PartlyUsedImpl() { spare = register_module("spare", torch::nn::Linear(8, 8)); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {  // weight decay would move a zero-gradient spare
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.1));
  }
  torch::nn::Linear spare{nullptr};
};
TORCH_MODULE(PartlyUsed);

// One weight registered twice (tied): it is reduced once, and training works with the defaults.
struct TiedImpl : NetImpl {
  TiedImpl() { register_module("fc1_again", fc1); }
};
TORCH_MODULE(Tied);

void tied_weights() {
  auto [x, y] = dataset(64);
  data::TensorLoader loader(x, y, {.batch_size = 8});
  Tied model;
  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config({.max_epochs = 1}), options());
  check(trainer.fit(model, loader).global_step == 4, "a model with tied weights trains under DDP");
  for (const auto& p : model->parameters())
    check(torch::equal(trainer.all_gather(p.detach())[0], trainer.all_gather(p.detach())[1]), "replicas identical");
}

// toggle_optimizer (a GAN's halves): each backward's frozen half is outside that backward's buckets,
// so it trains without find_unused_parameters (PyTorch's DDP: an error there); the reducer switches
// between the two layouts.
struct ToggledImpl : NetImpl {
  static constexpr bool automatic_optimization = false;
  void training_step(const data::Batch& b, std::int64_t, StepContext& ctx) {
    for (std::size_t i = 0; i < 2; ++i) {
      auto& optimizer = ctx.optimizer(i);
      ctx.toggle_optimizer(optimizer);
      optimizer.zero_grad();
      ctx.manual_backward(torch::nn::functional::cross_entropy(forward(b.input * (i == 0 ? 1.0 : 2.0)), b.target));
      optimizer.step();
      ctx.untoggle_optimizer(optimizer);
    }
  }
  std::vector<OptimizerConfig> configure_optimizers() {
    std::vector<OptimizerConfig> configs;
    configs.push_back({std::make_unique<torch::optim::SGD>(fc1->parameters(), 0.1)});
    configs.push_back({std::make_unique<torch::optim::SGD>(fc2->parameters(), 0.1)});
    return configs;
  }
};
TORCH_MODULE(Toggled);

void toggled_halves() {
  auto [x, y] = dataset(64);
  data::TensorLoader loader(x, y, {.batch_size = 8});
  torch::manual_seed(3);
  Toggled model;
  const auto before = model->fc1->weight.detach().clone();
  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config({.max_epochs = 1}), options());
  trainer.fit(model, loader);
  check(!torch::equal(before, model->fc1->weight), "both halves train");
  for (const auto& p : model->parameters())
    check(torch::equal(trainer.all_gather(p.detach())[0], trainer.all_gather(p.detach())[1]),
          "toggled halves: replicas identical");
}

// A parameter without gradient: an error that names it (find_unused_parameters off), or zeros (on).
void unused_parameters() {
  auto [x, y] = dataset(64);
  data::TensorLoader loader(x, y, {.batch_size = 8});
  {
    PartlyUsed model;
    Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config({.max_epochs = 1}), options());
    std::string message;
    try {
      trainer.fit(model, loader);
    } catch (const DistributedError& e) {
      message = e.what();
    }
    check(message.find("'spare.bias', 'spare.weight'") != std::string::npos &&
              message.find("find_unused_parameters = true") != std::string::npos,
          "the unused parameters are named: " + message);
  }
  {
    PartlyUsed model;
    const auto spare_before = model->spare->weight.detach().clone();
    Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config({.max_epochs = 1}),
                                                          options({.find_unused_parameters = true}));
    const auto result = trainer.fit(model, loader);
    check(result.global_step == 4, "find_unused_parameters trains");
    auto initial = spare_before.clone();
    trainer.broadcast(initial, 0);  // every rank started from rank 0's weights (broadcast at setup)
    check(torch::equal(initial, model->spare->weight),
          "a parameter no rank used keeps no gradient (weight decay and momentum leave it alone)");
  }
}

// A model whose training_step throws on rank 1 at batch 20 (FULGUR_FAULT=exception).
struct ThrowingImpl : NetImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t batch_idx) {
    static const bool raise = std::getenv("FULGUR_FAULT") && std::string(std::getenv("FULGUR_FAULT")) == "exception";
    if (raise && my_rank == 1 && batch_idx == 20) throw std::runtime_error("rank 1's training_step raised");
    return NetImpl::training_step(b, batch_idx);
  }
};
TORCH_MODULE(Throwing);

// Runs until killed (fault.sh SIGKILLs rank 1 once it trains) or until rank 1 raises; rank 0 must
// fail with an error, not hang.
void fault() {
  auto [x, y] = dataset(4096);
  Throwing model;
  // Preemption off: SIGTERM keeps its default action (launcher_faults.sh checks the forwarding).
  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config({.max_epochs = 1000, .preemption = {.enabled = false}}),
                                                         options());
  data::TensorLoader loader(x, y, {.batch_size = 8});
  std::cout << "rank " << my_rank << " training" << std::endl;
  try {
    trainer.fit(model, loader);
  } catch (const DistributedError& e) {
    std::cout << "rank " << my_rank << " stopped: " << e.what() << std::endl;
    std::exit(3);
  }
  std::exit(0);
}

// 16-mixed: an overflow on rank 1 alone makes both ranks skip the same step (gradients are
// all-reduced while still scaled); a sync_dist metric is averaged over ranks; only rank 0 writes.
struct OverflowOnRank1Impl : NetImpl {
  void setup(Stage, StepContext& ctx) { rank_in_setup = ctx.global_rank; }  // the set-up hooks know the rank
  int rank_in_setup = -1;
  at::Tensor training_step(const data::Batch& b, std::int64_t batch_idx, StepContext& ctx) {
    ctx.log("rank", static_cast<double>(ctx.global_rank), {.sync_dist = true});
    auto loss = NetImpl::training_step(b, batch_idx);
    return my_rank == 1 && batch_idx == 2 ? loss * std::numeric_limits<float>::infinity() : loss;
  }
};
TORCH_MODULE(OverflowOnRank1);

void amp_agreement() {
  auto [x, y] = dataset(128);
  OverflowOnRank1 model;
  Trainer<CPUAccelerator, Gloo, FP16MixedPrecision> trainer(config({.max_epochs = 1}), options());
  data::TensorLoader loader(x, y, {.batch_size = 16});
  const auto result = trainer.fit(model, loader);
  check(result.skipped_optimizer_steps == 1, "this rank skipped exactly the overflow step: " +
                                                 std::to_string(result.skipped_optimizer_steps));
  check(trainer.precision().scaler().get_scale() == 32768.0, "both scalers backed off once");
  for (const auto& p : model->parameters())
    check(torch::equal(trainer.all_gather(p.detach())[0], trainer.all_gather(p.detach())[1]), "replicas identical");
  check(result.metrics.at("rank") == 0.5, "sync_dist averages the logged value over ranks: " +
                                              std::to_string(result.metrics.at("rank")));
  check(model->rank_in_setup == my_rank, "setup(stage, ctx) sees this rank: " + std::to_string(model->rank_in_setup));
  const auto losses = trainer.all_gather(at::scalar_tensor(result.metrics.at("train_loss"), at::kDouble));
  check(losses[0].item<double>() == losses[1].item<double>(), "train_loss is averaged over the ranks (monitors agree)");
  // save_checkpoint: only global rank 0 writes (each rank names its own file to tell them apart).
  char folder[] = "/tmp/fulgur_ddp_ckpt_XXXXXX";
  std::string dir = trainer.strategy().broadcast(my_rank == 0 ? std::string(::mkdtemp(folder)) : std::string(), 0);
  StateDict state;
  state.insert("rank", static_cast<std::int64_t>(my_rank));
  trainer.strategy().save_checkpoint(dir + "/from_rank_" + std::to_string(my_rank) + ".ckpt", state);
  const bool mine_exists = ::access((dir + "/from_rank_" + std::to_string(my_rank) + ".ckpt").c_str(), F_OK) == 0;
  check(mine_exists == (my_rank == 0), "only rank 0 wrote its checkpoint");
  trainer.barrier();
  if (my_rank == 0) {
    ::unlink((dir + "/from_rank_0.ckpt").c_str());
    ::rmdir(dir.c_str());
  }
}

// A NaN loss on rank 1 alone: both ranks stop with the same NonFiniteLossError (the loss read is
// averaged over the ranks), not rank 0 with a lost-peer error.
struct NaNOnRank1Impl : NetImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t batch_idx) {
    auto loss = NetImpl::training_step(b, batch_idx);
    return my_rank == 1 && batch_idx == 2 ? loss * std::numeric_limits<float>::quiet_NaN() : loss;
  }
};
TORCH_MODULE(NaNOnRank1);

void nonfinite() {
  auto [x, y] = dataset(128);
  NaNOnRank1 model;
  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(
      config({.max_epochs = 1, .finite_loss_check = FiniteLossCheck::every_step}), options());
  data::TensorLoader loader(x, y, {.batch_size = 16});
  std::string message;
  try {
    trainer.fit(model, loader);
  } catch (const NonFiniteLossError& e) {
    message = e.what();
  }
  check(message.find("the loss is NaN at training_step at epoch 0, batch 2") != std::string::npos,
        "every rank names the NaN batch: '" + message + "'");
}

// Two "nodes" (network namespaces, tests/distributed/two_nodes.sh): num_nodes=2, one device each,
// each node's process started by fulgur's launcher with NODE_RANK, MASTER_ADDR and MASTER_PORT.
void two_nodes() {
  auto c = config({.max_epochs = 2});
  c.devices = 1;
  c.num_nodes = 2;
  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(c, options());
  my_rank = trainer.global_rank();
  check(trainer.world_size() == 2 && trainer.strategy().node_rank() == my_rank, "rank = node rank across 2 nodes");
  auto [x, y] = dataset(128);
  Net model;
  data::TensorLoader loader(x, y, {.batch_size = 16, .shuffle = true});
  check(trainer.fit(model, loader).global_step == 8, "each node trains on its half");
  for (const auto& p : model->parameters())
    check(torch::equal(trainer.all_gather(p.detach())[0], trainer.all_gather(p.detach())[1]), "replicas identical");
  std::cout << "node " << trainer.strategy().node_rank() << " done" << std::endl;
}

// Callbacks and loggers under DDP: only rank 1's score stops improving, yet both ranks stop in the
// same epoch (EarlyStopping decides with any-rank); the loggers write on rank 0 only.
struct RankScoredImpl : NetImpl {
  at::Tensor validation_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    const double epoch = static_cast<double>(ctx.current_epoch);
    ctx.log("score", my_rank == 1 ? (epoch == 0 ? 1.0 : 2.0) : 1.0 / (1.0 + epoch));
    return NetImpl::validation_step(b, i);
  }
};
TORCH_MODULE(RankScored);

void callbacks() {
  const std::string root = "/tmp/fulgur_ddp_callbacks";
  std::ostringstream progress;
  TrainerConfig c = config({.max_epochs = 5, .default_root_dir = root});
  c.enable_progress_bar = true;
  Trainer<CPUAccelerator, Gloo, FloatPrecision, EarlyStopping, CSVLogger, ProgressBar> trainer(
      c, options(),
      EarlyStopping({.monitor = "score", .patience = 1}), CSVLogger(),
      ProgressBar({.plain_interval = std::chrono::seconds(0), .terminal = false, .stream = &progress}));
  my_rank = trainer.global_rank();
  if (my_rank == 0) fulgur::detail::remove_tree(root);
  trainer.barrier("clean");
  auto [x, y] = dataset(128);
  RankScored model;
  data::TensorLoader train(x, y, {.batch_size = 16}), val(x, y, {.batch_size = 32});
  const auto result = trainer.fit(model, train, val);
  check(result.epochs.size() == 2, "both ranks stop after epoch 1, got " + std::to_string(result.epochs.size()) + " epochs");
  check(result.stop_reason.rfind("EarlyStopping", 0) == 0, "the stop reason names EarlyStopping: " + result.stop_reason);
  check(result.stop_reason.find(my_rank == 1 ? "did not improve" : "asked to stop on rank 1 (one rank suffices)") != std::string::npos,
        "each rank's stop reason says why it stopped: " + result.stop_reason);
  check((my_rank == 0) == !progress.str().empty(), "the progress bar draws on rank 0 only");
  trainer.barrier("written");
  const std::string version0 = root + "/lightning_logs/version_0";
  check(trainer.callback<CSVLogger>().log_dir() == version0, "every rank resolves the same log directory");
  check(fulgur::detail::path_exists(version0 + "/metrics.csv"), "rank 0 wrote metrics.csv");
  check(!fulgur::detail::path_exists(root + "/lightning_logs/version_1"), "no other rank wrote a version of its own");
  trainer.barrier("checked");
  if (my_rank == 0) fulgur::detail::remove_tree(root);
}

// GradientAccumulationScheduler under DDP: its factor is the Trainer's own (a schedule {0: 2} trains
// as accumulate_grad_batches = 2, bit for bit), it changes by epoch, and the ranks stay identical.
struct StepsPerEpoch {
  std::map<std::int64_t, int> steps;
  void on_before_optimizer_step(TrainerView& trainer) { ++steps[trainer.current_epoch()]; }
};

void accumulation_schedule() {
  auto [x, y] = dataset(128);  // 64 samples a rank, batches of 8: 8 batches an epoch
  std::vector<at::Tensor> scheduled, fixed;
  {
    Trainer<CPUAccelerator, Gloo, FloatPrecision, GradientAccumulationScheduler> trainer(
        config({.max_epochs = 2}), options(), GradientAccumulationScheduler({{0, 2}}));
    my_rank = trainer.global_rank();
    torch::manual_seed(5);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8});
    check(trainer.fit(model, loader).global_step == 8, "{0: 2}: 4 steps an epoch");
    scheduled = model->parameters();
  }
  {
    Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config({.max_epochs = 2, .accumulate_grad_batches = 2}), options());
    torch::manual_seed(5);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8});
    trainer.fit(model, loader);
    fixed = model->parameters();
  }
  for (std::size_t i = 0; i < fixed.size(); ++i)
    check(torch::equal(scheduled[i], fixed[i]), "the schedule {0: 2} trains as accumulate_grad_batches = 2, bit for bit");
  {
    Trainer<CPUAccelerator, Gloo, FloatPrecision, GradientAccumulationScheduler, StepsPerEpoch> trainer(
        config({.max_epochs = 3}), options(), GradientAccumulationScheduler({{1, 4}, {2, 3}}), StepsPerEpoch{});
    torch::manual_seed(5);
    Net model;
    data::TensorLoader loader(x, y, {.batch_size = 8});
    trainer.fit(model, loader);
    const auto& steps = trainer.callback<StepsPerEpoch>().steps;
    check(steps.at(0) == 8 && steps.at(1) == 2 && steps.at(2) == 3, "steps per epoch 8, 2, 3 (a cut window steps at the end)");
    for (const auto& p : model->parameters()) {
      at::Tensor highest = p.detach().clone();
      trainer.all_reduce(highest, ReduceOp::max);
      check(torch::equal(highest, p), "the ranks hold the same weights");
    }
  }
}

// BackboneFinetuning under DDP: fc1 (the backbone) frozen at set-up, so outside the reducer's first
// layout, and unfrozen at epoch 1. The reducer lays its buckets out again at the next backward, so
// fc1's gradients are averaged from then on: the replicas stay bit-identical and train as one process
// on the whole batches (a reducer that kept its first layout leaves each rank's fc1 to its own half
// of the data). A fit resumed after the unfreeze (its backbone trainable again when the checkpoint
// is read, after the reducer was built) ends bit-identical to the straight one.
struct TrainableOnlyNetImpl : NetImpl {
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {  // the backbone is frozen now
    std::vector<at::Tensor> trainable;
    for (auto& p : parameters())
      if (p.requires_grad()) trainable.push_back(p);
    return std::make_unique<torch::optim::SGD>(trainable, torch::optim::SGDOptions(0.1).momentum(0.9));
  }
};
TORCH_MODULE(TrainableOnlyNet);

struct BackboneWeights {  // fc1.weight at each epoch's end
  std::map<std::int64_t, at::Tensor> at_end;
  void on_train_epoch_end(TrainerView& trainer, torch::nn::Module& module) {
    at_end[trainer.current_epoch()] = module.named_parameters()["fc1.weight"].detach().clone();
  }
};

struct SaveInEpoch {
  std::int64_t epoch = -1, batch = -1;
  std::string path;
  void on_train_batch_end(TrainerView& trainer) {
    if (trainer.current_epoch() == epoch && trainer.batch_idx() == batch) trainer.save_checkpoint(path);
  }
};

// A checkpoint taken inside an epoch keeps each rank's partial epoch aggregates (fit_loop's copy is
// global rank 0's): resumed from it, a value each rank logs for itself and one logged with sync_dist
// end that epoch as in the straight fit, on both ranks.
struct RankLoggedImpl : NetImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    ctx.log("own", 10.0 * my_rank + static_cast<double>(i), {.on_step = false, .on_epoch = true});
    ctx.log("synced", static_cast<double>(my_rank), {.on_step = false, .on_epoch = true, .sync_dist = true});
    return NetImpl::training_step(b, i);
  }
};
TORCH_MODULE(RankLogged);

void resume_metrics() {
  auto [x, y] = dataset(64);
  const char* port = std::getenv("MASTER_PORT");
  const std::string checkpoint = std::string("/tmp/fulgur_ddp_resume_metrics_") + (port ? port : "0") + ".ckpt";
  const auto ddp_fit = [&](SaveInEpoch save, const std::string& resume) {
    torch::manual_seed(3);
    RankLogged model;
    Trainer<CPUAccelerator, Gloo, FloatPrecision, SaveInEpoch> trainer(config({.max_epochs = 2}), options(),
                                                                       std::move(save));
    my_rank = trainer.global_rank();
    data::TensorLoader loader(x, y, {.batch_size = 8});
    auto result = trainer.fit(model, loader, FitOptions{.ckpt_path = resume});
    trainer.barrier();  // the checkpoint is written before any rank resumes from it
    return result.epochs.back().metrics;
  };
  const Metrics straight = ddp_fit({1, 1, checkpoint}, "");
  const Metrics resumed = ddp_fit({}, checkpoint);
  check(straight.at("own") == 10.0 * my_rank + 1.5, "each rank's own epoch mean (batches 0-3)");
  check(straight.at("synced") == 0.5, "the synced epoch mean is the ranks' mean");
  check(resumed.at("own") == straight.at("own"),
        "resumed after batch 1 of epoch 1, rank " + std::to_string(my_rank) + "'s own epoch mean is its own (" +
            std::to_string(resumed.at("own")) + ", straight " + std::to_string(straight.at("own")) + ")");
  check(resumed.at("synced") == straight.at("synced"),
        "resumed, the synced epoch mean is the straight fit's (" + std::to_string(resumed.at("synced")) + ")");
  if (my_rank == 0) std::remove(checkpoint.c_str());
}

// 17 samples on 2 ranks: predict shards without repeats (Lightning's UnrepeatedDistributedSampler:
// 9 + 8 predictions, each sample once); validate pads as DistributedSampler does and says so.
struct SampleIdsImpl : NetImpl {
  at::Tensor predict_step(const data::Batch& b, std::int64_t) { return b.input.select(1, 0); }
};
TORCH_MODULE(SampleIds);
struct TwoLoaderIdsImpl : SampleIdsImpl {  // several validation loaders
  at::Tensor validation_step(const data::Batch& b, std::int64_t i, std::int64_t) { return NetImpl::validation_step(b, i); }
};
TORCH_MODULE(TwoLoaderIds);

void uneven_evaluation() {
  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config(), options());
  my_rank = trainer.global_rank();
  const at::Tensor ids = at::arange(17, at::kFloat);
  const at::Tensor x = ids.unsqueeze(1).expand({17, 8}).contiguous();
  const at::Tensor y = at::zeros({17}, at::kLong);
  SampleIds model;
  data::TensorLoader loader(x, y, {.batch_size = 4});
  const auto predictions = trainer.predict(model, loader);
  std::vector<at::Tensor> mine(predictions.begin(), predictions.end());
  const at::Tensor local = at::cat(mine);
  check(local.numel() == (my_rank == 0 ? 9 : 8), "rank " + std::to_string(my_rank) + " predicts its share once: " +
                                                     std::to_string(local.numel()) + " samples");
  at::Tensor padded = at::full({9}, -1.0f);
  padded.narrow(0, 0, local.numel()).copy_(local);
  const auto all = trainer.all_gather(padded);
  at::Tensor seen = at::cat({all[0], all[1]});
  seen = std::get<0>(seen.masked_select(seen >= 0).sort());
  check(torch::equal(seen, ids), "the ranks' predictions together are every sample exactly once");
  const auto validated = trainer.validate(model, loader);
  check(validated.warnings.size() == 1 && validated.warnings[0].find("evaluated 1 sample twice") != std::string::npos,
        "validate says the padded sample was evaluated twice");
  // Several loaders (17 samples padded by one, 16 even): each loader's result says it (the warning reached
  // only a single loader's result before).
  TwoLoaderIds two;
  data::TensorLoader even(x.narrow(0, 0, 16), y.narrow(0, 0, 16), {.batch_size = 4});
  const auto both = trainer.validate(two, data::loaders(loader, even));
  check(both.size() == 2, "two loaders, two results");
  for (const auto& each : both)
    check(each.warnings.size() == 1 && each.warnings[0].find("evaluated 1 sample twice") != std::string::npos,
          "each loader's result of validate says the padded sample was evaluated twice");
  // Fewer samples than ranks: each rank predicts one (the sample repeated), rather than one rank getting
  // none and stopping the run with "the predict data yielded no batches" (the recheck of the fix).
  data::TensorLoader one(x.narrow(0, 0, 1), y.narrow(0, 0, 1), {.batch_size = 4});
  const auto single = trainer.predict(model, one);
  check(single.size() == 1 && single[0].numel() == 1 && single[0].item<float>() == 0.0f,
        "a 1-sample predict on 2 ranks gives each rank that sample");
}

void backbone_finetuning() {
  constexpr std::int64_t B = 8, N = 128, epochs = 3;
  auto [x, y] = dataset(N);
  const BackboneFinetuningOptions schedule{.unfreeze_backbone_at_epoch = 1, .backbone = "fc1"};
  const char* port = std::getenv("MASTER_PORT");
  const std::string checkpoint = std::string("/tmp/fulgur_ddp_backbone_") + (port ? port : "0") + ".ckpt";
  torch::manual_seed(3);
  const at::Tensor initial = TrainableOnlyNet()->fc1->weight.detach().clone();

  struct Run {
    std::vector<at::Tensor> params;
    std::map<std::int64_t, at::Tensor> backbone;
  };
  const auto ddp_fit = [&](SaveInEpoch save, const std::string& resume) {
    torch::manual_seed(3);
    TrainableOnlyNet model;
    Trainer<CPUAccelerator, Gloo, FloatPrecision, BackboneFinetuning, BackboneWeights, SaveInEpoch> trainer(
        config({.max_epochs = epochs}), options(), BackboneFinetuning(schedule), BackboneWeights{}, std::move(save));
    data::TensorLoader loader(x, y, {.batch_size = B, .shuffle = true, .seed = 9});
    trainer.fit(model, loader, FitOptions{.ckpt_path = resume});
    for (const auto& p : model->parameters()) {
      const auto gathered = trainer.all_gather(p.detach());
      check(torch::equal(gathered[0], gathered[1]), "the replicas are bit-identical after the unfreeze");
    }
    trainer.barrier();  // the checkpoint is written before any rank resumes from it
    return Run{model->parameters(), trainer.callback<BackboneWeights>().at_end};
  };
  const Run straight = ddp_fit({2, 3, checkpoint}, "");
  check(torch::equal(straight.backbone.at(0), initial), "the backbone is frozen in epoch 0");
  check(!torch::equal(straight.backbone.at(1), straight.backbone.at(0)) &&
            !torch::equal(straight.backbone.at(2), straight.backbone.at(1)),
        "the backbone trains from epoch 1");

  // One process, the whole batches (rank r's batch i is order[2Bi + r + 2k]: together, the 2B-batch i).
  {
    torch::manual_seed(3);
    TrainableOnlyNet reference;
    TrainerConfig single = config({.max_epochs = epochs});
    single.devices = 1;
    Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, BackboneFinetuning> trainer(single,
                                                                                              BackboneFinetuning(schedule));
    data::TensorLoader full(x, y, {.batch_size = 2 * B, .shuffle = true, .seed = 9});
    trainer.fit(reference, full);
    const auto expected = reference->parameters();
    double max_diff = 0;
    for (std::size_t i = 0; i < expected.size(); ++i)
      max_diff = std::max(max_diff, (straight.params[i] - expected[i]).abs().max().item<double>());
    check(max_diff < 1e-5, "DDP with the backbone unfrozen equals one process on the whole batches within 1e-5 (max "
                           "difference " + std::to_string(max_diff) + ")");
    if (my_rank == 0) std::cout << "backbone_finetuning: max |ddp - reference| = " << max_diff << std::endl;
  }

  const Run resumed = ddp_fit({}, checkpoint);
  for (std::size_t i = 0; i < straight.params.size(); ++i)
    check(torch::equal(straight.params[i], resumed.params[i]),
          "the fit resumed inside epoch 2 ends bit-identical to the straight one");
  if (my_rank == 0) std::remove(checkpoint.c_str());

  // Frozen differently on the two ranks: their new layouts would pair other parameters' gradients;
  // both ranks stop with an error that says so.
  {
    torch::manual_seed(3);
    Net model;
    Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config(), options());
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    trainer.setup(model, optimizer);
    const data::Batch batch{x.narrow(0, 0, B), y.narrow(0, 0, B)};
    trainer.backward(model->training_step(batch, 0));
    (my_rank == 0 ? model->fc1->bias : model->fc2->bias).set_requires_grad(false);
    std::string message;
    try {
      trainer.backward(model->training_step(batch, 1));
    } catch (const DistributedError& e) {
      message = e.what();
    }
    check(message.find("require grad changed on rank " + std::to_string(my_rank) +
                       " but not in the same way on every rank") != std::string::npos,
          "parameters frozen differently on the ranks are an error, got: " + message);
  }
}

// A SimpleProfiler under DDP: each rank times its own run and writes its own report, named by rank.
void profiled_fit() {
  const std::string root = "/tmp/fulgur_ddp_profiler";
  Trainer<CPUAccelerator, Gloo, FloatPrecision, SimpleProfiler> trainer(
      config({.max_epochs = 1, .default_root_dir = root}), options(), SimpleProfiler({.filename = "perf"}));
  my_rank = trainer.global_rank();
  if (my_rank == 0) fulgur::detail::remove_tree(root);
  trainer.barrier("clean");
  auto [x, y] = dataset(64);
  Net model;
  data::TensorLoader train(x, y, {.batch_size = 8});
  trainer.fit(model, train);
  trainer.barrier("written");
  const std::string mine = root + "/fit-perf-" + std::to_string(my_rank) + ".txt";
  check(trainer.callback<SimpleProfiler>().report_path() == mine, "each rank writes its own report: " + mine);
  std::ifstream in(mine);
  const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check(report.find("[Strategy]DDPStrategy.backward") != std::string::npos, "the report names DDP's backward");
  std::int64_t batches = 0;
  for (const auto& row : trainer.callback<SimpleProfiler>().rows())
    if (row.action == "run_training_batch") batches = row.calls;
  check(batches == 4, "each rank ran its half of the 8 batches: " + std::to_string(batches));
  trainer.barrier("checked");
  if (my_rank == 0) fulgur::detail::remove_tree(root);
}

// Several validation loaders under DDP: each is sharded as one loader would be, and each loader's
// loss is the mean over every rank's part — the mean over the whole loader.
struct TwoLoadersNetImpl : NetImpl {
  std::int64_t evaluated = 0;
  at::Tensor validation_step(const data::Batch& b, std::int64_t, std::int64_t dataloader_idx) {
    evaluated += b.input.size(0);
    return b.input.mean() + static_cast<double>(dataloader_idx);
  }
};
TORCH_MODULE(TwoLoadersNet);

void several_loaders() {
  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config({.max_epochs = 1}), options());
  my_rank = trainer.global_rank();
  auto [x, y] = dataset(64);
  auto [u, v] = dataset(32);
  data::TensorLoader a(x, y, {.batch_size = 8}), b(u * 2, v, {.batch_size = 8});
  TwoLoadersNet model;
  const auto results = trainer.validate(model, data::loaders(a, b));
  check(results.size() == 2, "one result per loader, got " + std::to_string(results.size()));
  check(model->evaluated == (64 + 32) / 2, "each rank evaluates its half of each loader, got " +
                                               std::to_string(model->evaluated) + " samples");
  check(results[0].loss && std::abs(*results[0].loss - x.mean().item<double>()) < 1e-6,
        "loader 0's loss is the mean over both ranks' parts");
  check(results[1].loss && std::abs(*results[1].loss - ((u * 2).mean().item<double>() + 1.0)) < 1e-6,
        "loader 1's loss is the mean over both ranks' parts");
  check(results[0].metrics.contains("val_loss/dataloader_idx_0") && !results[0].metrics.contains("val_loss/dataloader_idx_1"),
        "each result holds its own loader's loss");
}

// ctx.should_stop on one rank only (the new-user probe: that rank died in Gloo, the other got the
// lost-peer error): every rank stops, together, at the next point where they agree — a log step within
// an epoch, the epoch's end otherwise — with the reason, and no error.
struct StopsOnRank1Impl : NetImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    if (ctx.global_rank == 1 && ctx.current_epoch == stop_epoch && i == 2) ctx.should_stop = true;
    return NetImpl::training_step(b, i);
  }
  std::int64_t stop_epoch = 0;
};
TORCH_MODULE(StopsOnRank1);

void stop_on_one_rank() {
  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config({.max_epochs = 4, .log_every_n_steps = 3}), options());
  my_rank = trainer.global_rank();
  auto [x, y] = dataset(256);  // 8 batches of 16 per rank
  data::TensorLoader train(x, y, {.batch_size = 16});
  StopsOnRank1 within;
  const auto first = trainer.fit(within, train);
  check(first.global_step == 3, "both ranks stop at the log step after rank 1's request (step 3), got global_step " +
                                    std::to_string(first.global_step));
  check(first.stop_reason == "should_stop was set", "the reason is the request: " + first.stop_reason);
  // Log steps that never come within the epoch: the epoch's end settles it.
  Trainer<CPUAccelerator, Gloo, FloatPrecision> sparse(config({.max_epochs = 4, .log_every_n_steps = 50}), options());
  StopsOnRank1 at_end;
  at_end->stop_epoch = 1;
  const auto second = sparse.fit(at_end, train);
  check(second.epochs.size() == 2 && second.global_step == 16,
        "both ranks stop at the end of epoch 1, got " + std::to_string(second.epochs.size()) + " epochs, global_step " +
            std::to_string(second.global_step));
  trainer.barrier("done");
}

// OnExceptionCheckpoint under DDP. The same batch fails on every rank: the ranks agree, rank 0
// writes the last completed step, and a run resumed from it ends bit-identical to a straight run.
// The same again with validation_step failing on every rank at epoch 1's end, after its last step:
// the checkpoint holds that step with its validation pending, which the resumed run runs first.
// Then one rank alone fails: the other waits in the gradients' all-reduce until the timeout
// (FULGUR_TEST_TIMEOUT_MS, short); each rank says why no checkpoint was written, and none hangs.
struct FailsOnceImpl : NetImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t batch_idx, StepContext& ctx) {
    if (fail_rank != -2 && ctx.current_epoch == 1 && batch_idx == 3 && (fail_rank == -1 || fail_rank == my_rank))
      throw std::runtime_error("injected on rank " + std::to_string(my_rank));
    return torch::nn::functional::cross_entropy(fc2(drop(torch::tanh(fc1(b.input)))), b.target);
  }
  at::Tensor validation_step(const data::Batch& b, std::int64_t batch_idx, StepContext& ctx) {
    if (fail_validation && ctx.current_epoch == 1 && batch_idx == 0)
      throw std::runtime_error("injected in validation on rank " + std::to_string(my_rank));
    return NetImpl::validation_step(b, batch_idx);
  }
  torch::nn::Dropout drop{register_module("drop", torch::nn::Dropout(0.2))};
  int fail_rank = -2;  // -2: none; -1: every rank; else that rank
  bool fail_validation = false;
};
TORCH_MODULE(FailsOnce);

std::vector<at::Tensor> test_snapshot(torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& p : module.parameters()) out.push_back(p.detach().clone());
  return out;
}

void on_exception() {
  const char* port = std::getenv("MASTER_PORT");
  const std::string root = std::string("/tmp/fulgur_ddp_on_exception_") + (port ? port : "0");
  const std::string path = root + "/on_exception.ckpt";
  if (const char* rank = std::getenv("RANK"); rank != nullptr && std::string(rank) == "0") fulgur::detail::remove_tree(root);
  auto [x, y] = dataset(256);  // 8 batches of 16 per rank
  auto [vx, vy] = dataset(64);
  auto fit = [&](int fail_rank, const std::string& resume_from, std::string* error, bool fail_validation = false) {
    torch::manual_seed(resume_from.empty() ? 5 : 77);
    FailsOnce model;
    model->fail_rank = fail_rank;
    model->fail_validation = fail_validation;
    Trainer<CPUAccelerator, Gloo, FloatPrecision, OnExceptionCheckpoint> trainer(
        config({.max_epochs = 3, .accumulate_grad_batches = 2, .default_root_dir = root}), options(),
        OnExceptionCheckpoint({.dirpath = root}));
    my_rank = trainer.global_rank();
    data::TensorLoader loader(x, y, {.batch_size = 16, .shuffle = true, .seed = 3});
    data::TensorLoader val(vx, vy, {.batch_size = 16});
    try {
      trainer.fit(model, loader, val, FitOptions{.ckpt_path = resume_from});
    } catch (const std::exception& e) {
      *error = e.what();
    }
    return test_snapshot(*model);
  };
  std::string error;
  const auto straight = fit(-2, "", &error);
  check(error.empty(), "the straight run trains: " + error);
  fit(-1, "", &error);
  check(error.find("injected on rank " + std::to_string(my_rank)) != std::string::npos,
        "fit rethrows the rank's own exception: " + error);
  if (my_rank == 0) check(::access(path.c_str(), F_OK) == 0, "the ranks agreed and rank 0 wrote " + path);
  const std::string kept = root + "/kept.ckpt";
  if (my_rank == 0) std::rename(path.c_str(), kept.c_str());
  error.clear();
  const auto resumed = fit(-2, kept, &error);  // its own barriers order the rename before the read
  check(error.empty(), "the resumed run trains: " + error);
  for (std::size_t i = 0; i < straight.size(); ++i)
    check(torch::equal(straight[i], resumed[i]), "resumed weights bit-identical to the straight run's");
  error.clear();
  fit(-2, "", &error, /*fail_validation=*/true);
  check(error.find("injected in validation on rank " + std::to_string(my_rank)) != std::string::npos,
        "fit rethrows the rank's own validation error: " + error);
  if (my_rank == 0) check(::access(path.c_str(), F_OK) == 0, "a validation failure on every rank: rank 0 wrote " + path);
  if (my_rank == 0) std::rename(path.c_str(), kept.c_str());
  error.clear();
  const auto after_validation = fit(-2, kept, &error);
  check(error.empty(), "the run resumed before its validation trains: " + error);
  for (std::size_t i = 0; i < straight.size(); ++i)
    check(torch::equal(straight[i], after_validation[i]), "resumed before validation: bit-identical weights");
  // One rank alone: no checkpoint, each rank says why, and fit returns (its error) on both.
  error.clear();
  fit(1, "", &error);
  check(!error.empty(), "fit fails on every rank when rank 1 fails alone");
  if (my_rank == 0) check(::access(path.c_str(), F_OK) != 0, "no checkpoint when the ranks cannot agree");
  std::cout << "rank " << my_rank << " ended: " << error.substr(0, error.find('\n')) << std::endl;
}

// Started without torchrun: the Trainer launches the 2 ranks itself (and this process supervises).
void launched() {
  const char* fail = std::getenv("FULGUR_TEST_FAIL_RANK");
  TrainerConfig c = config({.max_epochs = 2});
  if (const char* restarts = std::getenv("FULGUR_TEST_MAX_RESTARTS")) c.max_restarts = std::atoi(restarts);
  Trainer<CPUAccelerator, DDPStrategy, FloatPrecision> trainer(c, options());
  my_rank = trainer.global_rank();
  check(trainer.world_size() == 2, "the launcher started 2 ranks");
  if (fail && std::atoi(fail) == my_rank) {
    std::cerr << "rank " << my_rank << " exits with 7 on purpose" << std::endl;
    std::exit(7);
  }
  auto [x, y] = dataset(256);
  Net model;
  data::TensorLoader loader(x, y, {.batch_size = 16, .shuffle = true});
  const auto result = trainer.fit(model, loader);
  check(result.global_step == 16, "each rank trains on its half");
  for (const auto& p : model->parameters()) {
    const auto gathered = trainer.all_gather(p.detach());
    check(torch::equal(gathered[0], gathered[1]), "replicas identical");
  }
}

// A stuck rank (tests/distributed/stuck.sh): 3 ranks under the built-in launcher, a 10 s collective
// timeout. argv[2] = sleep: rank 1 sleeps in training_step at epoch 1, batch 3 (alive, not crashed);
// skip: rank 1 skips a barrier the others wait in. The others must stop naming rank 1 and where it is.
struct SleepyImpl : NetImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t batch_idx, StepContext& ctx) {
    if (my_rank == 1 && ctx.current_epoch == 1 && batch_idx == 3) std::this_thread::sleep_for(std::chrono::minutes(2));
    return NetImpl::training_step(b, batch_idx);
  }
};
TORCH_MODULE(Sleepy);

void stuck(const std::string& how) {
  TrainerConfig c = config({.max_epochs = 3, .preemption = {.enabled = false}});
  c.devices = 3;
  Trainer<CPUAccelerator, DDPStrategy, FloatPrecision> trainer(c, options());
  my_rank = trainer.global_rank();
  auto [x, y] = dataset(240);
  Sleepy model;
  data::TensorLoader loader(x, y, {.batch_size = 8});
  try {
    if (how == "skip" && my_rank != 1) trainer.barrier("rank 1 skips this one");
    trainer.fit(model, loader);
  } catch (const DistributedError& e) {
    std::cout << "rank " << my_rank << " stopped: " << e.what() << std::endl;
    std::exit(3);
  }
  std::exit(0);
}

// Preemption under the built-in launcher (preemption.sh): argv[2] = straight | run | resume,
// argv[3] = the root folder. "run" trains slowly until the script's SIGTERM/SIGUSR1 ends it
// (exit code 75 after the checkpoint); "straight" and "resume" (which finds the checkpoint by
// itself: the script sets SLURM_JOB_ID) write the final weights to root/<mode>.weights.
struct DropoutNetImpl : NetImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    return torch::nn::functional::cross_entropy(fc2(drop(torch::tanh(fc1(b.input)))), b.target);
  }
  torch::nn::Dropout drop{register_module("drop", torch::nn::Dropout(0.2))};
  bool slow = false;
};
TORCH_MODULE(DropoutNet);

void preempt(const std::string& mode, const std::string& root) {
  torch::manual_seed(5);
  auto [x, y] = dataset(512);
  DropoutNet model;
  model->slow = mode == "run";
  Trainer<CPUAccelerator, DDPStrategy, FloatPrecision> trainer(
      config({.max_steps = 40, .accumulate_grad_batches = 2, .log_every_n_steps = 2, .default_root_dir = root}),
      options());
  my_rank = trainer.global_rank();
  data::TensorLoader loader(x, y, {.batch_size = 16, .shuffle = true, .seed = 3});
  std::cout << "rank " << my_rank << " training" << std::endl;
  const auto result = trainer.fit(model, loader);
  check(mode != "run", "the run was not preempted (no signal arrived in time)");
  check(result.global_step == 40, "trained to max_steps: " + std::to_string(result.global_step));
  if (trainer.is_global_zero()) {
    std::ofstream out(root + "/" + mode + ".weights");
    out << std::hexfloat;
    for (const auto& p : model->parameters()) {
      const at::Tensor flat = p.detach().flatten().contiguous();
      for (std::int64_t i = 0; i < flat.numel(); ++i) out << flat[i].item<float>() << "\n";
    }
  }
}

// Under torchrun (uncaught.sh): rank 1's training_step raises and nothing catches it, as in a user's
// program without a try in main; torchrun's summary must show that exception, not only "Signal 6".
[[noreturn]] void uncaught() {
  if (const char* r = std::getenv("RANK")) my_rank = std::atoi(r);
  setenv("FULGUR_FAULT", "exception", 1);
  auto [x, y] = dataset(512);
  Throwing model;
  Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config({.max_epochs = 1, .preemption = {.enabled = false}}),
                                                         options());
  data::TensorLoader loader(x, y, {.batch_size = 8});
  try {
    trainer.fit(model, loader);  // rank 1 throws out of here, uncaught
  } catch (const DistributedError& e) {
    std::cout << "rank " << my_rank << " stopped: " << e.what() << std::endl;
    std::exit(3);
  }
  std::exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "uncaught") uncaught();  // outside worker::run's catch
  return worker::run(argc > 1 ? argv[1] : "", "usage: ddp_worker collectives|parity|accumulation|unused|fault|...",
                     [&](const std::string& scenario) {
                       if (scenario == "collectives") collectives();
                       else if (scenario == "parity") parity();
                       else if (scenario == "accumulation") accumulation();
                       else if (scenario == "unused") {
                         unused_parameters();
                         tied_weights();
                         toggled_halves();
                       }
                       else if (scenario == "fault") fault();
                       else if (scenario == "launched") launched();
                       else if (scenario == "stuck" && argc > 2) stuck(argv[2]);
                       else if (scenario == "amp") amp_agreement();
                       else if (scenario == "nonfinite") nonfinite();
                       else if (scenario == "callbacks") callbacks();
                       else if (scenario == "several_loaders") several_loaders();
                       else if (scenario == "profiler") profiled_fit();
                       else if (scenario == "accumulation_schedule") accumulation_schedule();
                       else if (scenario == "backbone_finetuning") backbone_finetuning();
                       else if (scenario == "resume_metrics") resume_metrics();
                       else if (scenario == "uneven_evaluation") uneven_evaluation();
                       else if (scenario == "stop_on_one_rank") stop_on_one_rank();
                       else if (scenario == "on_exception") on_exception();
                       else if (scenario == "two_nodes") two_nodes();
                       else if (scenario == "preempt" && argc > 3) preempt(argv[2], argv[3]);
                       else if (scenario == "elastic" && argc > 2) elastic::run<DDPStrategy>(argv[2]);
                       else return false;
                       return true;
                     });
}
