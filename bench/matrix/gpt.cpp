#include "../matrix.hpp"
#include "workloads.hpp"

namespace fulgur::bench {
namespace {
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
    return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), b.target.reshape({-1}));
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(3e-4));
  }
  torch::nn::Embedding tokens;
  at::Tensor positions;
  Block block1, block2;
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
};
TORCH_MODULE(Gpt);
}  // namespace

void register_gpt() {
  register_matrix("gpt", [] { return Gpt(); }, [] {
    torch::manual_seed(0);
    std::vector<data::Batch> batches;
    for (int i = 0; i < 10; ++i) {
      const at::Tensor text = torch::randint(kVocab, {kBatch, kContext + 1}, at::kLong);
      batches.push_back({text.narrow(1, 0, kContext).contiguous(), text.narrow(1, 1, kContext).contiguous()});
    }
    return batches;
  }, {.items_per_batch = kBatch * kContext});  // tokens
}
}  // namespace fulgur::bench
