// fulgur::activation_checkpoint and ActivationCheckpointing: the same gradients bit for bit as without
// checkpointing (32-true, bf16-mixed, 16-mixed autocast, dropout inside), parameters reached when no
// input requires grad, several inputs and outputs, activations really dropped (a counting CPU
// allocator), and fits through the Trainer under SingleDevice, DDP and ShardedStrategy<2>/<3>.
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <optional>

#include "fulgur/nn/activation_checkpointing.hpp"
#include "src/distributed/parameter_gatherer.hpp"  // stage 3's gather count
#include "counting_allocator.hpp"
#include "support.hpp"

using namespace fulgur;

namespace {

/// A pre-norm MLP block with dropout: what a transformer block saves for backward, in small.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(std::int64_t width)
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, 4 * width))),
        fc2(register_module("fc2", torch::nn::Linear(4 * width, width))),
        drop(register_module("drop", torch::nn::Dropout(0.2))) {}
  at::Tensor forward(const at::Tensor& x) {
    ++forward_calls;
    return x + drop(fc2(torch::gelu(fc1(ln(x)))));
  }
  std::int64_t forward_calls = 0;
  torch::nn::LayerNorm ln;
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

struct StackImpl : torch::nn::Module {
  StackImpl(std::int64_t layers, std::int64_t width)
      : in(register_module("in", torch::nn::Linear(8, width))), head(register_module("head", torch::nn::Linear(width, 3))) {
    for (std::int64_t i = 0; i < layers; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block(width)));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = in(x);
    for (Block& block : blocks) h = checkpointing(block, h);
    return head(h);
  }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input).to(at::kFloat), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  torch::nn::Linear in, head;
  std::vector<Block> blocks;
  ActivationCheckpointing checkpointing;  // none by default
};
TORCH_MODULE(Stack);

struct Gradients {
  at::Tensor loss, input_grad, next_draw;
  std::vector<at::Tensor> grads;
};

void check_identical(const Gradients& a, const Gradients& b) {
  CHECK(torch::equal(a.loss, b.loss));
  CHECK(torch::equal(a.next_draw, b.next_draw));  // the RNG goes on as without checkpointing
  if (a.input_grad.defined() || b.input_grad.defined()) CHECK(torch::equal(a.input_grad, b.input_grad));
  REQUIRE(a.grads.size() == b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(a.grads[i].defined());
    CHECK(torch::equal(a.grads[i], b.grads[i]));
  }
}

enum class Mode { plain, function, policy };

/// One forward and backward of the stack under an autocast dtype (none: 32-true), dropout drawing from
/// the global generator seeded with `seed`.
Gradients run(Stack& model, const at::Tensor& x, const at::Tensor& y, Mode mode,
              std::optional<at::ScalarType> autocast, std::uint64_t seed = 7) {
  model->zero_grad();
  if (x.requires_grad()) x.mutable_grad() = at::Tensor();
  model->checkpointing = mode == Mode::policy ? ActivationCheckpointing::by_type<Block>() : ActivationCheckpointing();
  torch::manual_seed(seed);
  at::Tensor loss;
  {
    std::optional<AutocastGuard> region;
    if (autocast) region.emplace(c10::DeviceType::CPU, *autocast);
    at::Tensor h = model->in(x);
    for (Block& block : model->blocks)
      h = mode == Mode::function ? activation_checkpoint([&block](const at::Tensor& t) { return block->forward(t); }, h)
                                 : model->checkpointing(block, h);
    loss = torch::nn::functional::cross_entropy(model->head(h).to(at::kFloat), y);
  }
  loss.backward();
  Gradients out{loss.detach(), x.requires_grad() ? x.grad().clone() : at::Tensor(), torch::rand({4}), {}};
  for (const auto& p : model->parameters())
    if (p.requires_grad()) out.grads.push_back(p.grad().clone());
  return out;
}

using test::CountingAllocator;
using test::CountingScope;

}  // namespace

TEST_CASE("activation_checkpoint gives the same gradients bit for bit as no checkpointing, with dropout, in "
          "32-true, bf16-mixed and 16-mixed",
          "[activation_checkpoint]") {
  torch::manual_seed(0);
  Stack model(3, 16);
  model->train();
  const at::Tensor x = torch::randn({32, 8}).requires_grad_(), y = torch::randint(0, 3, {32});
  for (const auto& [name, dtype] : {std::pair<const char*, std::optional<at::ScalarType>>{"32-true", std::nullopt},
                                    {"bf16-mixed", at::kBFloat16},
                                    {"16-mixed", at::kHalf}}) {
    INFO(name);
    const Gradients plain = run(model, x, y, Mode::plain, dtype);
    // Dropout matters: another seed gives other gradients, so equal ones below need the forward's RNG state.
    CHECK_FALSE(torch::equal(run(model, x, y, Mode::plain, dtype, /*seed=*/8).grads[1], plain.grads[1]));
    check_identical(plain, run(model, x, y, Mode::function, dtype));
    check_identical(plain, run(model, x, y, Mode::policy, dtype));
  }
}

namespace {
/// The block of activation_checkpoint_reference.py, in the same ops.
at::Tensor reference_block(const at::Tensor& x, const std::map<std::string, at::Tensor>& w) {
  const at::Tensor h = at::layer_norm(x, {x.size(-1)}, w.at("ln.weight"), w.at("ln.bias"));
  const at::Tensor mlp =
      at::linear(at::gelu(at::linear(h, w.at("fc1.weight"), w.at("fc1.bias"))), w.at("fc2.weight"), w.at("fc2.bias"));
  return x + at::dropout(mlp, 0.2, /*train=*/true);
}
std::string hex_values(const at::Tensor& t) {
  std::string out;
  const at::Tensor flat = t.detach().to(at::kFloat).contiguous().flatten();
  char text[64];
  for (std::int64_t i = 0; i < flat.numel(); ++i) {
    std::snprintf(text, sizeof text, " %a", static_cast<double>(flat.data_ptr<float>()[i]));
    out += text;
  }
  return out;
}
/// Values written by float.hex(), as a flat float32 tensor (exact: they were float32 values).
at::Tensor parse_values(const std::string& text) {
  std::istringstream in(text);
  std::vector<float> values;
  std::string value;
  while (in >> value) values.push_back(static_cast<float>(std::strtod(value.c_str(), nullptr)));
  return torch::tensor(values, at::kFloat);
}
}  // namespace

TEST_CASE("activation_checkpoint's gradients equal torch.utils.checkpoint's (use_reentrant=False) bit for bit, "
          "computed by the venv's PyTorch at test time",
          "[activation_checkpoint]") {
  torch::manual_seed(0);
  std::map<std::string, at::Tensor> weights{{"ln.weight", 1 + 0.1 * torch::randn({16})},
                                            {"ln.bias", 0.1 * torch::randn({16})},
                                            {"fc1.weight", 0.25 * torch::randn({64, 16})},
                                            {"fc1.bias", 0.1 * torch::randn({64})},
                                            {"fc2.weight", 0.125 * torch::randn({16, 64})},
                                            {"fc2.bias", 0.1 * torch::randn({16})}};
  const at::Tensor x = torch::randn({12, 16});
  const std::string dir = test::temporary_directory("activation_checkpoint_reference");
  {
    std::ofstream in(dir + "/in.txt");
    auto write = [&](const std::string& key, const at::Tensor& t) {
      std::string shape;
      for (const auto d : t.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
      in << key << " " << shape << hex_values(t) << "\n";
    };
    for (const auto& [key, t] : weights) write(key, t);
    write("x", x);
  }
  const std::string command = std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR +
                              "/tests/unit/activation_checkpoint_reference.py " + dir + "/in.txt " + dir + "/out.txt";
  REQUIRE(std::system(command.c_str()) == 0);
  std::map<std::string, std::string> python;  // "<precision> <key>" -> its values, as written
  {
    std::ifstream out(dir + "/out.txt");
    std::string precision, key, rest;
    while (out >> precision >> key && std::getline(out, rest)) python[precision + " " + key] = rest;
  }
  for (auto& [key, t] : weights) t.requires_grad_();
  for (const auto& [name, dtype] : {std::pair<const char*, std::optional<at::ScalarType>>{"32-true", std::nullopt},
                                    {"bf16-mixed", at::kBFloat16},
                                    {"16-mixed", at::kHalf}}) {
    INFO(name);
    for (auto& [key, t] : weights) t.mutable_grad() = at::Tensor();
    const at::Tensor xi = x.clone().requires_grad_();
    torch::manual_seed(7);
    at::Tensor y;
    {
      std::optional<AutocastGuard> region;
      if (dtype) region.emplace(c10::DeviceType::CPU, *dtype);
      y = activation_checkpoint([&](const at::Tensor& t) { return reference_block(t, weights); }, xi);
    }
    y.to(at::kFloat).pow(2).sum().backward();
    for (const auto& [key, t] : weights) {
      INFO(key);
      CHECK(torch::equal(t.grad().flatten(), parse_values(python.at(std::string(name) + " " + key))));
    }
    CHECK(torch::equal(xi.grad().flatten(), parse_values(python.at(std::string(name) + " x"))));
  }
}

TEST_CASE("activation_checkpoint: parameters get gradients when no input requires grad, and autograd::grad "
          "reaches them",
          "[activation_checkpoint]") {
  torch::manual_seed(0);
  Stack model(2, 16);
  const at::Tensor x = torch::randn({16, 8}), y = torch::randint(0, 3, {16});  // x requires no grad
  model->in->weight.set_requires_grad(false);  // nor do in's weight: the first block's input needs none
  model->in->bias.set_requires_grad(false);
  const Gradients plain = run(model, x, y, Mode::plain, std::nullopt);
  check_identical(plain, run(model, x, y, Mode::function, std::nullopt));
  check_identical(plain, run(model, x, y, Mode::policy, std::nullopt));

  // torch::autograd::grad with respect to a parameter inside the checkpointed function (not possible
  // with use_reentrant=True) gives the same gradient.
  auto grad_of_fc1 = [&](bool checkpointed) {
    torch::manual_seed(3);
    Block& block = model->blocks[0];
    const at::Tensor h = model->in(x);
    const at::Tensor out = checkpointed ? activation_checkpoint([&](const at::Tensor& t) { return block->forward(t); }, h)
                                        : block->forward(h);
    return torch::autograd::grad({out.pow(2).sum()}, {block->fc1->weight})[0];
  };
  CHECK(torch::equal(grad_of_fc1(false), grad_of_fc1(true)));
}

TEST_CASE("activation_checkpoint: several inputs and outputs, non-tensor arguments, recomputation once in "
          "backward, nothing in no-grad mode",
          "[activation_checkpoint]") {
  torch::manual_seed(0);
  torch::nn::Linear layer(6, 6);
  const at::Tensor a = torch::randn({4, 6}).requires_grad_(), b = torch::randn({4, 6}).requires_grad_();
  int calls = 0;
  auto fn = [&](const at::Tensor& p, double scale, const at::Tensor& q, std::string mode) {
    ++calls;
    at::Tensor mixed = layer(p * scale + torch::dropout(q, 0.5, /*train=*/true));
    return std::make_tuple(mode == "tanh" ? torch::tanh(mixed) : mixed, (p * q).sum(1));
  };
  auto grads = [&](bool checkpointed) {
    layer->zero_grad();
    a.mutable_grad() = at::Tensor();
    b.mutable_grad() = at::Tensor();
    torch::manual_seed(5);
    auto [first, second] = checkpointed ? activation_checkpoint(fn, a, 0.5, b, std::string("tanh"))
                                        : fn(a, 0.5, b, std::string("tanh"));
    (first.sum() + second.pow(2).sum()).backward();
    return std::vector<at::Tensor>{a.grad().clone(), b.grad().clone(), layer->weight.grad().clone(),
                                   layer->bias.grad().clone()};
  };
  const auto plain = grads(false);
  calls = 0;
  const auto checkpointed = grads(true);
  CHECK(calls == 2);  // the forward, then the recomputation in backward
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::equal(plain[i], checkpointed[i]));

  // An output that depends on nothing differentiable does not require grad, as in Python.
  const auto [mixed, count] = activation_checkpoint(
      [&](const at::Tensor& p) { return std::make_tuple(layer(p), torch::ones({1}) * p.size(0)); }, a);
  CHECK(mixed.requires_grad());
  CHECK_FALSE(count.requires_grad());

  // A std::vector of outputs, one of them unused by the loss.
  auto halves = [](const at::Tensor& t) { return t.chunk(2, 1); };
  a.mutable_grad() = at::Tensor();
  activation_checkpoint(halves, a)[1].sum().backward();
  CHECK(torch::equal(a.grad(), torch::cat({torch::zeros({4, 3}), torch::ones({4, 3})}, 1)));

  calls = 0;
  torch::NoGradGuard no_grad;
  const auto [out, unused] = activation_checkpoint(fn, a, 0.5, b, std::string("none"));
  CHECK(calls == 1);
  CHECK_FALSE(out.requires_grad());
}

TEST_CASE("activation_checkpoint refuses a captured intermediate tensor that requires grad", "[activation_checkpoint]") {
  const at::Tensor w = torch::randn({3}).requires_grad_();
  const at::Tensor scaled = w * 2;  // computed outside fn: its gradient could not flow back
  CHECK_THAT(test::message_of<MisconfigurationError>(
                 [&] { activation_checkpoint([&](const at::Tensor& x) { return x * scaled; }, torch::randn({3})); }),
             Catch::Contains("pass that tensor to activation_checkpoint as an argument"));
}

TEST_CASE("activation_checkpoint refuses a double backward (create_graph) where it reaches it", "[activation_checkpoint]") {
  // A new-user probe: the gradient came back without a graph, and the error only came later, naming nothing.
  torch::manual_seed(0);
  torch::nn::Linear layer(4, 4);
  const at::Tensor x = torch::randn({2, 4}, torch::requires_grad());
  const at::Tensor out = activation_checkpoint([&](const at::Tensor& t) { return torch::tanh(layer(t)); }, x);
  std::string message;
  try {
    torch::autograd::grad({out.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  } catch (const c10::Error& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("a backward with create_graph=true (a double backward) reached a checkpointed function"));
  // A first-order backward through the same graph still works.
  const auto g = torch::autograd::grad({out.sum()}, {x});
  CHECK(g[0].defined());
}

TEST_CASE("activation_checkpoint keeps no activations: the bytes held between forward and backward", "[activation_checkpoint]") {
  torch::manual_seed(0);
  Stack model(4, 64);
  model->train();
  const at::Tensor x = torch::randn({256, 8}), y = torch::randint(0, 3, {256});
  CountingAllocator& counting = CountingAllocator::instance();
  auto held_after_forward = [&](bool checkpointed) {
    model->checkpointing = checkpointed ? ActivationCheckpointing::by_type<BlockImpl>() : ActivationCheckpointing();
    model->zero_grad();
    CountingScope scope(counting);
    const std::int64_t before = counting.held_bytes();
    at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    const std::int64_t held = counting.held_bytes() - before;
    loss.backward();
    return held;
  };
  const std::int64_t plain = held_after_forward(false), checkpointed = held_after_forward(true);
  INFO("bytes held after the forward: " << plain << " without, " << checkpointed << " with checkpointing");
  CHECK(plain > 0);
  CHECK(checkpointed * 4 < plain);  // each block keeps its input only (the GPT's figure is in docs/benchmarks.md)
}

namespace {
struct FitResult {
  std::vector<at::Tensor> weights;
  std::int64_t block_forwards = 0, gathers = 0;  // gathers: stage 3's
};
/// The weights after a fit of 4 steps (bf16-mixed, dropout).
template <class Strategy, class... Options>
FitResult fit(bool checkpointed, const Options&... options) {
  torch::manual_seed(0);
  Stack model(2, 16);
  if (checkpointed) model->checkpointing = ActivationCheckpointing::by_type<Block>();
  auto [x, y] = test::classification_data(64);
  data::TensorLoader loader(x, y, {.batch_size = 16});
  Trainer<CPUAccelerator, Strategy, BF16MixedPrecision> trainer(test::quiet({.max_epochs = 1}), options...);
  torch::manual_seed(1);  // dropout's draws
  CHECK(trainer.fit(model, loader).global_step == 4);
  FitResult result{test::snapshot(*model)};
  for (const Block& block : model->blocks) result.block_forwards += block->forward_calls;
  if constexpr (requires { trainer.strategy().parameter_gatherer(); })
    result.gathers = trainer.strategy().parameter_gatherer()->gathers();
  return result;
}
template <class Strategy, class... Options>
std::pair<FitResult, FitResult> check_fit_identical(const Options&... options) {
  FitResult plain = fit<Strategy>(false, options...), checkpointed = fit<Strategy>(true, options...);
  CHECK(checkpointed.block_forwards == 2 * plain.block_forwards);  // each block recomputed once in backward
  REQUIRE(plain.weights.size() == checkpointed.weights.size());
  for (std::size_t i = 0; i < plain.weights.size(); ++i) CHECK(torch::equal(plain.weights[i], checkpointed.weights[i]));
  return {std::move(plain), std::move(checkpointed)};
}
}  // namespace

TEST_CASE("ActivationCheckpointing in a fit: the same weights as without, under SingleDevice, DDP and "
          "ShardedStrategy 2 and 3 (bf16-mixed, dropout)",
          "[activation_checkpoint]") {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // a world of one
  SECTION("single device") { check_fit_identical<SingleDeviceStrategy>(); }
  SECTION("DDP") { check_fit_identical<DDPStrategy>(); }
  SECTION("ShardedStrategy<2>") { check_fit_identical<ShardedStrategy<2>>(); }
  SECTION("ShardedStrategy<3>") {
    const auto [plain, checkpointed] =
        check_fit_identical<ShardedStrategy<3>>(FSDPOptions{.auto_wrap = WrapPolicy::by_type<Block>()});
    // Each block is recomputed where its backward needs it whole anyway (the last block is still
    // gathered from the forward, each other is gathered for its backward): the recomputation reads
    // gathered parameters (the weights are equal) and costs no extra all-gather.
    INFO("gathers: " << plain.gathers << " without, " << checkpointed.gathers << " with checkpointing");
    CHECK(plain.gathers == 16);  // per step: block0, block1 (forward), root, block0 (backward)
    CHECK(checkpointed.gathers == plain.gathers);
  }
}
