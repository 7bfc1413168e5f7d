// One rank of the SyncBatchNorm tests (tests/distributed/sync_batchnorm.sh, 2 and 3 Gloo ranks).
//   parity OUT_DIR  every case of sync_batchnorm_reference.py (run just before by the script, under
//                   torchrun on the same number of ranks): this rank's outputs, input gradients,
//                   local weight/bias gradients and running statistics equal PyTorch's SyncBatchNorm
//                   function's on the same data, and, gathered, one process with the whole batch.
//   fit             Trainer fits under DDP: DDPOptions::sync_batchnorm converting a Sequential's
//                   BatchNorm1d, and a SyncBatchNorm declared in the model, each end with the weights
//                   and running statistics of one process training on the whole batches; a typed
//                   BatchNorm member with sync_batchnorm is refused, named.
#include <fulgur/fulgur.hpp>
#include <fulgur/nn/sync_batchnorm.hpp>

#include "worker.hpp"
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

using namespace fulgur;
using Gloo = BasicDDPStrategy<backend::Gloo>;

namespace {

using worker::check;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : 0;
}

// The cases of sync_batchnorm_reference.py (same order and values).
struct Case {
  std::string name;
  int dims;
  std::int64_t channels;
  std::vector<std::int64_t> sample;
  std::optional<double> momentum;
  bool affine;
  at::ScalarType dtype;
  std::function<std::int64_t(int)> batch;
};
std::vector<Case> cases() {
  return {
      {"bn2d", 2, 3, {4, 5}, 0.1, true, at::kDouble, [](int r) { return 2 + r; }},
      {"bn1d", 1, 4, {6}, 0.3, true, at::kDouble, [](int r) { return 3 + 2 * r; }},
      {"flat_one_per_rank", 1, 5, {}, std::nullopt, true, at::kDouble, [](int) { return 1; }},
      {"bn3d_no_affine", 3, 2, {2, 3, 2}, 0.1, false, at::kDouble, [](int) { return 2; }},
      {"bn2d_float32", 2, 3, {4, 5}, 0.1, true, at::kFloat, [](int r) { return 2 + r; }},
  };
}

at::Tensor read(const std::string& path, std::vector<std::int64_t> shape, at::ScalarType dtype) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("missing reference file " + path);
  auto t = at::empty(shape, at::TensorOptions().dtype(dtype));
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  if (in.gcount() != static_cast<std::streamsize>(t.nbytes())) throw std::runtime_error("short file " + path);
  return t;
}

// |a - b| <= 1e-6, relative to the reference's size where it exceeds 1 (float32 sums of many terms).
void expect_close(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  const double scale = std::max(1.0, b.to(at::kDouble).abs().max().item<double>());
  check(a.sizes() == b.sizes() && diff <= 1e-6 * scale,
        what + ": max difference " + std::to_string(diff) + " (scale " + std::to_string(scale) + ")");
}

void parity(const std::string& dir) {
  DDPOptions o = worker::options();
  const int world = env_int("WORLD_SIZE");
  distributed::DataParallel dp(ParallelDevices{std::vector<c10::Device>(static_cast<std::size_t>(world), c10::kCPU)}, o);
  dp.connect(DDPBackend::gloo);
  const int rank = dp.environment().rank;
  for (const Case& c : cases()) {
    const std::string folder = dir + "/" + c.name + "/";
    std::int64_t n = 0, start = 0;
    for (int r = 0; r < world; ++r) {
      if (r < rank) start += c.batch(r);
      n += c.batch(r);
    }
    std::vector<std::int64_t> shape{n, c.channels};
    shape.insert(shape.end(), c.sample.begin(), c.sample.end());
    const std::vector<std::int64_t> per_channel{c.channels};
    const auto x = read(folder + "input.x.bin", shape, c.dtype);
    const auto dy = read(folder + "input.dy.bin", shape, c.dtype);

    nn::SyncBatchNorm bn(nn::SyncBatchNormOptions(c.channels).eps(1e-5).momentum(c.momentum).affine(c.affine));
    bn->to(c.dtype);
    {
      torch::NoGradGuard no_grad;
      for (const char* name : {"running_mean", "running_var"})
        bn->named_buffers()[name].copy_(read(folder + "input." + name + ".bin", per_channel, c.dtype));
      if (c.affine)
        for (const char* name : {"weight", "bias"})
          bn->named_parameters()[name].copy_(read(folder + "input." + name + ".bin", per_channel, c.dtype));
    }
    dp.broadcast_module(*bn);  // what the strategies do at set-up: gives it the group
    check(bn->sync_group() && bn->sync_group()->world_size() == world, c.name + ": the group attached");

    const auto part = x.narrow(0, start, c.batch(rank)).clone().requires_grad_(true);
    const auto y = bn(part);
    y.backward(dy.narrow(0, start, c.batch(rank)));

    auto mine = [&](const std::string& k) { return folder + k + ".rank" + std::to_string(rank) + ".bin"; };
    auto local_shape = shape;
    local_shape[0] = c.batch(rank);
    const std::string tag = c.name + " (" + std::to_string(world) + " ranks) ";
    expect_close(y, read(mine("y"), local_shape, c.dtype), tag + "output = PyTorch's SyncBatchNorm");
    expect_close(part.grad(), read(mine("grad_x"), local_shape, c.dtype), tag + "input gradient = PyTorch's");
    expect_close(bn->running_mean, read(mine("running_mean"), per_channel, c.dtype), tag + "running_mean = PyTorch's");
    expect_close(bn->running_var, read(mine("running_var"), per_channel, c.dtype), tag + "running_var = PyTorch's");
    if (c.affine) {
      expect_close(bn->weight.grad(), read(mine("grad_weight"), per_channel, c.dtype), tag + "weight gradient = PyTorch's");
      expect_close(bn->bias.grad(), read(mine("grad_bias"), per_channel, c.dtype), tag + "bias gradient = PyTorch's");
    }

    // One process with the whole batch: the parts gathered, the local parameter gradients summed.
    auto whole = [&](const std::string& k, const std::vector<std::int64_t>& s) {
      return read(folder + "whole." + k + ".bin", s, c.dtype);
    };
    auto gathered = [&](const at::Tensor& t) { return at::cat(dp.all_gather_uneven(t.detach()), 0); };
    expect_close(gathered(y), whole("y", shape), tag + "outputs = one process with the whole batch");
    expect_close(gathered(part.grad()), whole("grad_x", shape), tag + "input gradients = the whole batch's");
    expect_close(bn->running_mean, whole("running_mean", per_channel), tag + "running_mean = the whole batch's");
    expect_close(bn->running_var, whole("running_var", per_channel), tag + "running_var = the whole batch's");
    if (c.affine) {
      for (auto* p : {&bn->weight, &bn->bias}) {
        const auto sum = p->grad().clone();
        dp.all_reduce(sum, ReduceOp::sum);
        expect_close(sum, whole(p == &bn->weight ? "grad_weight" : "grad_bias", per_channel),
                     tag + (p == &bn->weight ? "weight" : "bias") + " gradient summed = the whole batch's");
      }
    }
    check(bn->training_forwards() == 1, tag + "one training forward");
    // Eval: the running statistics, no communication, as BatchNorm.
    bn->eval();
    torch::NoGradGuard no_grad;
    const auto expected = torch::nn::functional::batch_norm(
        part, bn->running_mean, bn->running_var,
        torch::nn::functional::BatchNormFuncOptions().weight(bn->weight).bias(bn->bias).training(false).eps(1e-5));
    check(bn(part).equal(expected), tag + "eval mode = batch_norm with the running statistics");
  }
}

// ---- fit under DDP --------------------------------------------------------------------------------

struct SeqNetImpl : torch::nn::Module {  // BatchNorm inside a Sequential: converted by the switch
  SeqNetImpl()
      : body(register_module("body", torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::BatchNorm1d(16),
                                                          torch::nn::Tanh(), torch::nn::Linear(16, 3)))) {}
  at::Tensor forward(const at::Tensor& x) { return body->forward(x); }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  torch::nn::Sequential body;
};
TORCH_MODULE(SeqNet);

template <class Norm>  // Norm: SyncBatchNorm declared in the model, or a typed BatchNorm1d member
struct TypedNetImpl : torch::nn::Module {
  TypedNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(6, 16))),
        norm(register_module("norm", Norm(16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::tanh(norm(fc1(x)))); }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  torch::nn::Linear fc1;
  Norm norm;
  torch::nn::Linear fc2;
};

void fit() {
  constexpr std::int64_t B = 8, N = 96, epochs = 2;
  const int world = env_int("WORLD_SIZE");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto x = at::randn({N, 6}, gen) * 3 + 1;
  const auto y = (x.select(1, 0) > 1).to(at::kLong) + (x.select(1, 1) > 2).to(at::kLong);
  TrainerConfig config;
  config.enable_progress_bar = false;
  config.devices = world;
  config.max_epochs = epochs;

  // The reference: one process, batches of world x B (the union of the ranks' batches), BatchNorm1d.
  torch::manual_seed(3);
  SeqNet reference;
  {
    torch::optim::SGD optimizer(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    data::TensorLoader full(x, y, {.batch_size = world * B, .shuffle = true, .seed = 9});
    for (std::int64_t epoch = 0; epoch < epochs; ++epoch) {
      const auto order = full.order_for_epoch(epoch);
      for (std::int64_t i = 0; i < N / (world * B); ++i) {
        const auto ids = order.narrow(0, i * world * B, world * B);  // rank r holds ids[r::world]
        optimizer.zero_grad();
        reference->training_step({x.index_select(0, ids), y.index_select(0, ids)}, i).backward();
        optimizer.step();
      }
    }
  }
  const auto ref_params = reference->parameters();
  const auto ref_buffers = reference->buffers();
  auto compare = [&](torch::nn::Module& model, const std::string& what) {
    const auto params = model.parameters();
    const auto buffers = model.buffers();
    double diff = 0;
    for (std::size_t i = 0; i < params.size(); ++i) diff = std::max(diff, (params[i] - ref_params[i]).abs().max().item<double>());
    check(diff < 1e-5, what + ": weights = one process on the whole batches within 1e-5 (" + std::to_string(diff) + ")");
    diff = 0;
    for (std::size_t i = 0; i < buffers.size(); ++i)
      diff = std::max(diff, (buffers[i].to(at::kDouble) - ref_buffers[i].to(at::kDouble)).abs().max().item<double>());
    check(diff < 1e-5, what + ": running statistics = the whole batches' within 1e-5 (" + std::to_string(diff) + ")");
  };

  {  // Lightning's switch: the Sequential's BatchNorm1d becomes a SyncBatchNorm at set-up.
    torch::manual_seed(3);
    SeqNet model;
    DDPOptions o = worker::options();
    o.sync_batchnorm = true;
    Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config, o);
    data::TensorLoader loader(x, y, {.batch_size = B, .shuffle = true, .seed = 9});
    trainer.fit(model, loader);
    auto* sync = model->body[1]->as<nn::SyncBatchNormImpl>();
    check(sync != nullptr && model->body->ptr(1).get() == model->named_children()["body"]->named_children()["1"].get(),
          "sync_batchnorm: the Sequential's BatchNorm1d became a SyncBatchNorm, in its list and its registry");
    check(sync && sync->training_forwards() == epochs * N / (world * B), "sync_batchnorm: the SyncBatchNorm ran each step");
    compare(*model, "DDP + sync_batchnorm");
  }
  // The sharded strategies: the switch converts at their set-up too (stage 3: BatchNorm's weight
  // gathered with its unit, a Linear's own unit here).
  auto sharded = [&]<int Stage>(auto options, const std::string& what) {
    torch::manual_seed(3);
    SeqNet model;
    options.sync_batchnorm = true;
    options.timeout = worker::options().timeout;
    Trainer<CPUAccelerator, ShardedStrategy<Stage, backend::Gloo>, FloatPrecision> trainer(config, options);
    data::TensorLoader loader(x, y, {.batch_size = B, .shuffle = true, .seed = 9});
    trainer.fit(model, loader);
    check(model->body[1]->as<nn::SyncBatchNormImpl>() != nullptr, what + ": converted");
    compare(*model, what + " + sync_batchnorm");
  };
  sharded.operator()<2>(DDPOptions{}, "ShardedStrategy<2>");
  FSDPOptions fsdp;
  fsdp.auto_wrap = WrapPolicy::by_type<torch::nn::Linear>();
  sharded.operator()<3>(fsdp, "ShardedStrategy<3>");

  {  // SyncBatchNorm declared in the model: synchronised under DDP without the switch.
    auto model = std::make_shared<TypedNetImpl<nn::SyncBatchNorm>>();
    torch::manual_seed(3);
    SeqNet initial;  // the reference's first weights (same order: fc1, norm, fc2)
    {
      torch::NoGradGuard no_grad;
      const auto from = initial->parameters();
      const auto to = model->parameters();
      for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
    }
    Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config, worker::options());
    data::TensorLoader loader(x, y, {.batch_size = B, .shuffle = true, .seed = 9});
    trainer.fit(*model, loader);
    compare(*model, "DDP + a declared SyncBatchNorm");
  }
  {  // A typed BatchNorm1d member with the switch: refused before training, naming it.
    auto model = std::make_shared<TypedNetImpl<torch::nn::BatchNorm1d>>();
    DDPOptions o = worker::options();
    o.sync_batchnorm = true;
    Trainer<CPUAccelerator, Gloo, FloatPrecision> trainer(config, o);
    data::TensorLoader loader(x, y, {.batch_size = B});
    std::string message;
    try {
      trainer.fit(*model, loader);
    } catch (const MisconfigurationError& e) {
      message = e.what();
    }
    check(message.find("'norm' (torch::nn::BatchNorm1dImpl)") != std::string::npos &&
              message.find("declare that layer as fulgur::nn::SyncBatchNorm") != std::string::npos,
          "a typed BatchNorm member is refused, named: " + message);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return worker::run(argc > 1 ? argv[1] : "", "usage: sync_batchnorm_worker parity OUT_DIR | fit",
                     [&](const std::string& scenario) {
                       if (scenario == "parity" && argc > 2) parity(argv[2]);
                       else if (scenario == "fit") fit();
                       else return false;
                       return true;
                     });
}
