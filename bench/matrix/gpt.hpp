#pragma once
// The small GPT of the benchmarks (bench_matrix's "gpt" rows, bench/compare's --model gpt): 2 pre-norm
// blocks, width 64, 4 heads, causal scaled_dot_product_attention, a 256-token vocabulary, AdamW.
// bench/compare/compare.py builds the same network in Python, under the same parameter names.
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <vector>

namespace fulgur::bench::models {

constexpr std::int64_t kVocab = 256, kWidth = 64, kHeads = 4, kContext = 64, kBatch = 8;

/// Pre-norm transformer block: causal self-attention (scaled_dot_product_attention) and an MLP.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})))),
        qkv(register_module("qkv", torch::nn::Linear(kWidth, 3 * kWidth))),
        proj(register_module("proj", torch::nn::Linear(kWidth, kWidth))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})))),
        fc1(register_module("fc1", torch::nn::Linear(kWidth, 4 * kWidth))),
        fc2(register_module("fc2", torch::nn::Linear(4 * kWidth, kWidth))) {}
  at::Tensor forward(const at::Tensor& x) {
    const auto b = x.size(0), t = x.size(1);
    auto parts = qkv(ln1(x)).view({b, t, 3, kHeads, kWidth / kHeads}).permute({2, 0, 3, 1, 4}).unbind(0);
    const at::Tensor attended = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], {}, 0.0, /*is_causal=*/true);
    const at::Tensor y = x + proj(attended.transpose(1, 2).reshape({b, t, kWidth}));
    return y + fc2(torch::gelu(fc1(ln2(y))));
  }
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  GptImpl()
      : tokens(register_module("tokens", torch::nn::Embedding(kVocab, kWidth))),
        positions(register_parameter("positions", torch::randn({kContext, kWidth}) * 0.02)),
        block1(register_module("block1", Block())),
        block2(register_module("block2", Block())),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})))),
        head(register_module("head", torch::nn::Linear(kWidth, kVocab))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    const at::Tensor x = tokens(b.input) + positions.narrow(0, 0, b.input.size(1));
    const at::Tensor logits = head(ln(block2(block1(x))));
    at::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), b.target.reshape({-1}));
    if (record_losses) losses.push_back(loss.detach());
    return loss;
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(3e-4));
  }
  torch::nn::Embedding tokens;
  at::Tensor positions;
  Block block1, block2;
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
  bool record_losses = false;  // bench/compare: each step's loss, read after the run
  std::vector<at::Tensor> losses;
};
TORCH_MODULE(Gpt);

}  // namespace fulgur::bench::models
