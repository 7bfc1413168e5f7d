// Context "gpt": the names docs/sharding.md's examples use, standing for the reader's transformer:
// module types `Block` (a transformer block), `Rotary` (a module with a parameter of its own and a
// reset_parameters() fulgur does not know) and `GPT`, built from a `GPTConfig`; declared before the
// block, in a function (compiled, never called): `config` (a GPTConfig), `cfg` (a TrainerConfig)
// and `loader` (batches of token ids).
struct GPTConfig {
  std::int64_t vocab_size = 16, width = 8;
};
struct RotaryImpl : torch::nn::Module {
  RotaryImpl() : scale(register_parameter("scale", torch::ones({1}))) {}
  void reset_parameters() {
    torch::NoGradGuard no_grad;
    scale.fill_(1.0);
  }
  at::Tensor scale;
};
TORCH_MODULE(Rotary);
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(std::int64_t width) : fc(register_module("fc", torch::nn::Linear(width, width))) {}
  at::Tensor forward(const at::Tensor& x) { return x + torch::relu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);
struct GPTImpl : torch::nn::Module {
  explicit GPTImpl(const GPTConfig& c)
      : embedding(register_module("embedding", torch::nn::Embedding(c.vocab_size, c.width))),
        rotary(register_module("rotary", Rotary())),
        block(register_module("block", Block(c.width))),
        head(register_module("head", torch::nn::Linear(c.width, c.vocab_size))) {}
  at::Tensor training_step(const fulgur::data::Batch& batch, std::int64_t) {
    const at::Tensor logits = head(block(embedding(batch.input) * rotary->scale));
    return torch::nn::functional::cross_entropy(logits.flatten(0, 1), batch.target.flatten());
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::AdamW>(parameters(), 1e-3);
  }
  torch::nn::Embedding embedding;
  Rotary rotary;
  Block block;
  torch::nn::Linear head;
};
TORCH_MODULE(GPT);
void block() {
  const GPTConfig config;
  const fulgur::TrainerConfig cfg{.max_epochs = 1, .devices = 2};
  const at::Tensor tokens = torch::randint(16, {8, 5}, at::kLong);
  fulgur::data::TensorLoader loader(tokens.slice(1, 0, 4), tokens.slice(1, 1, 5), {.batch_size = 4});
  {
// @block
  }
}
