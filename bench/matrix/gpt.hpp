#pragma once
// The GPT of the benchmarks: pre-norm blocks of causal scaled_dot_product_attention and an MLP, learned
// positions, AdamW. Its default shape (GptOptions{}: 2 blocks, width 64, 4 heads, context 64, a 256-token
// vocabulary) is the small GPT of bench_matrix's "gpt" rows and bench/compare's --model gpt; compare.py's
// --model gpt-large builds it GPT-2-small-sized for a GPU (12 blocks, width 768, 12 heads, context 1024,
// vocabulary 50304). bench/compare/compare.py builds the same network in Python, under the same parameter
// names (blocks "block1".."blockN", in that order).
#include <fulgur/fulgur.hpp>
#include <fulgur/nn/activation_checkpointing.hpp>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace fulgur::bench::models {

constexpr std::int64_t kVocab = 256, kWidth = 64, kHeads = 4, kContext = 64, kBatch = 8;

/// The GPT's shape; the defaults are the small GPT's (kVocab, kWidth, ...). width must be a multiple of heads.
struct GptOptions {
  std::int64_t vocab = kVocab, width = kWidth, heads = kHeads, context = kContext, layers = 2;
};

/// Pre-norm transformer block: causal self-attention (scaled_dot_product_attention) and an MLP.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(std::int64_t width = kWidth, std::int64_t heads = kHeads)
      : width(width),
        heads(heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj(register_module("proj", torch::nn::Linear(width, width))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, 4 * width))),
        fc2(register_module("fc2", torch::nn::Linear(4 * width, width))) {}
  at::Tensor forward(const at::Tensor& x) {
    const auto b = x.size(0), t = x.size(1);
    auto parts = qkv(ln1(x)).view({b, t, 3, heads, width / heads}).permute({2, 0, 3, 1, 4}).unbind(0);
    const at::Tensor attended = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], {}, 0.0, /*is_causal=*/true);
    const at::Tensor y = x + proj(attended.transpose(1, 2).reshape({b, t, width}));
    return y + fc2(torch::gelu(fc1(ln2(y))));
  }
  std::int64_t width, heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  // The members are made (and initialized from the global generator) in the order tokens, positions,
  // block1..blockN, ln, head, as compare.py's GPT makes them.
  explicit GptImpl(const GptOptions& options = {})
      : options(options),
        tokens(register_module("tokens", torch::nn::Embedding(options.vocab, options.width))),
        positions(register_parameter("positions", torch::randn({options.context, options.width}) * 0.02)),
        blocks([&] {
          std::vector<Block> made;
          for (std::int64_t i = 1; i <= options.layers; ++i)
            made.push_back(register_module("block" + std::to_string(i), Block(options.width, options.heads)));
          return made;
        }()),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.width})))),
        head(register_module("head", torch::nn::Linear(options.width, options.vocab))) {
    TORCH_CHECK(options.layers >= 1 && options.heads >= 1 && options.width % options.heads == 0,
                "GptOptions: layers and heads must be >= 1 and width (", options.width, ") a multiple of heads (",
                options.heads, ")");
  }
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    at::Tensor x = tokens(b.input) + positions.narrow(0, 0, b.input.size(1));
    for (Block& block : blocks) x = checkpointing(block, x);
    const at::Tensor logits = head(ln(x));
    at::Tensor loss =
        torch::nn::functional::cross_entropy(logits.reshape({-1, options.vocab}), b.target.reshape({-1}));
    if (record_losses) losses.push_back(loss.detach());
    return loss;
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(3e-4));
  }
  GptOptions options;
  torch::nn::Embedding tokens;
  at::Tensor positions;
  std::vector<Block> blocks;  // registered as block1..blockN
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
  ActivationCheckpointing checkpointing;  // none by default; bench_activation_checkpoint: by_type<Block>()
  bool record_losses = false;  // bench/compare: each step's loss, read after the run
  std::vector<at::Tensor> losses;
};
TORCH_MODULE(Gpt);

}  // namespace fulgur::bench::models
