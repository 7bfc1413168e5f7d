// One rank of the activation checkpointing test under DDP, ShardedStrategy<2> and ShardedStrategy<3>,
// started by torchrun (Gloo) with the scenario "strategies" as argv[1]: a model whose blocks (with
// dropout) are checkpointed by ActivationCheckpointing ends a fit with the same weights, bit for bit,
// as the same fit without checkpointing; under stage 3 (the blocks as the wrap policy's units) the
// recomputation reads gathered parameters and costs no extra all-gather.
#include <fulgur/fulgur.hpp>
#include <fulgur/nn/activation_checkpointing.hpp>

#include "src/distributed/parameter_gatherer.hpp"  // stage 3's gather count
#include "worker.hpp"
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

using namespace fulgur;
template <int Stage>
using Zero = ShardedStrategy<Stage, backend::Gloo>;
using DDP = BasicDDPStrategy<backend::Gloo>;

namespace {

using worker::check;
using worker::my_rank;

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(std::int64_t width)
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, 4 * width))),
        fc2(register_module("fc2", torch::nn::Linear(4 * width, width))) {}
  at::Tensor forward(const at::Tensor& x) {
    ++forwards;
    return x + torch::dropout(fc2(torch::gelu(fc1(ln(x)))), 0.2, is_training());
  }
  torch::nn::LayerNorm ln;
  torch::nn::Linear fc1, fc2;
  std::int64_t forwards = 0;
};
TORCH_MODULE(Block);

// 8*24 + 24 + 3 blocks + 24*5 + 5 parameters: the shards are padded on 2 and 3 ranks.
struct NetImpl : torch::nn::Module {
  NetImpl() : in(register_module("in", torch::nn::Linear(8, 24))), head(register_module("head", torch::nn::Linear(24, 5))) {
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block(24)));
  }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    at::Tensor h = in(b.input);
    for (Block& block : blocks) h = checkpointing(block, h);
    return torch::nn::functional::cross_entropy(head(h).to(at::kFloat), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(0.01));
  }
  torch::nn::Linear in, head;
  std::vector<Block> blocks;
  ActivationCheckpointing checkpointing;
};
TORCH_MODULE(Net);

struct Run {
  std::vector<at::Tensor> weights;
  std::int64_t block_forwards = 0, gathers = 0;
};

template <class Strategy, class Precision, class Options>
Run fit(bool checkpointed, const Options& options) {
  torch::manual_seed(0);
  Net model;
  if (checkpointed) model->checkpointing = ActivationCheckpointing::by_type<Block>();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor x = at::randn({96, 8}, gen), y = at::randint(0, 5, {96}, gen);
  data::TensorLoader loader(x, y, {.batch_size = 8});
  TrainerConfig config{.max_epochs = 2, .enable_progress_bar = false};
  const char* world = std::getenv("WORLD_SIZE");
  config.devices = world ? std::atoi(world) : 1;
  Trainer<CPUAccelerator, Strategy, Precision> trainer(config, options);
  my_rank = static_cast<int>(trainer.global_rank());
  torch::manual_seed(static_cast<std::uint64_t>(100 + my_rank));  // dropout: each rank its own masks
  trainer.fit(model, loader);
  Run run;
  for (const auto& p : model->parameters()) run.weights.push_back(p.detach().clone());  // whole after fit
  for (const Block& block : model->blocks) run.block_forwards += block->forwards;
  if constexpr (requires { trainer.strategy().parameter_gatherer(); })
    run.gathers = trainer.strategy().parameter_gatherer()->gathers();
  return run;
}

template <class Strategy, class Precision, class Options>
void same_weights(const std::string& name, const Options& options) {
  const Run plain = fit<Strategy, Precision>(false, options), checkpointed = fit<Strategy, Precision>(true, options);
  check(checkpointed.block_forwards == 2 * plain.block_forwards,
        name + ": each block recomputed once in backward (" + std::to_string(checkpointed.block_forwards) + " forwards, " +
            std::to_string(plain.block_forwards) + " without)");
  bool equal = plain.weights.size() == checkpointed.weights.size();
  for (std::size_t i = 0; equal && i < plain.weights.size(); ++i) equal = torch::equal(plain.weights[i], checkpointed.weights[i]);
  check(equal, name + ": the same weights bit for bit with and without checkpointing");
  check(checkpointed.gathers == plain.gathers, name + ": no extra all-gather (" + std::to_string(checkpointed.gathers) +
                                                   " with, " + std::to_string(plain.gathers) + " without)");
  if (my_rank == 0)
    std::cout << name << ": equal weights; block forwards " << plain.block_forwards << " -> " << checkpointed.block_forwards
              << "; gathers " << plain.gathers << " -> " << checkpointed.gathers << std::endl;
}

void strategies() {
  same_weights<DDP, BF16MixedPrecision>("DDP bf16-mixed", worker::options());
  same_weights<Zero<2>, BF16MixedPrecision>("ShardedStrategy<2> bf16-mixed", worker::options());
  FSDPOptions per_block;
  per_block.auto_wrap = WrapPolicy::by_type<Block>();
  per_block.timeout = worker::options().timeout;
  same_weights<Zero<3>, FloatPrecision>("ShardedStrategy<3> 32-true", per_block);
  same_weights<Zero<3>, BF16MixedPrecision>("ShardedStrategy<3> bf16-mixed", per_block);
}

}  // namespace

int main(int argc, char** argv) {
  return worker::run(argc > 1 ? argv[1] : "", "usage: activation_checkpoint_worker strategies",
                     [](const std::string& scenario) {
                       if (scenario != "strategies") return false;
                       strategies();
                       return true;
                     });
}
