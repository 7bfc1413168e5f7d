#pragma once
// The example's GPT: byte-level (a 256-token vocabulary, no tokenizer to ship), pre-norm blocks of
// causal scaled_dot_product_attention and a GELU MLP, learned positions, nanoGPT's initialisation
// (N(0, 0.02), the residual projections scaled by 1/sqrt(2 * layers), zero biases). bench/python/
// gpt_reference.py builds the same network in PyTorch for the side-by-side run (docs/gpt-example.md).
#include <fulgur/cli/fields.hpp>
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

/// layer(x) through at::linear, as Python's nn.Linear runs. LibTorch's torch::nn::Linear::forward
/// computes a 3-D input as matmul then `out += bias`; under bf16 autocast that adds a float32 bias
/// into a bfloat16 result outside autocast, a slow mixed-dtype add_ with two casts per layer (this
/// model trained 7 % slower that way). at::linear is autocast's own op: one addmm on bfloat16.
inline at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return at::linear(x, layer->weight, layer->bias);
}

/// The network's shape and the optimisation's hyper-parameters: one struct, the `model` section of the
/// program's config (--model.width=256), which the loggers and every checkpoint record.
struct GptConfig {
  std::int64_t vocab = 256, context = 128, width = 128, heads = 4, layers = 4;
  double lr = 2e-3, min_lr = 2e-4, weight_decay = 0.1, beta2 = 0.99;
  std::int64_t warmup_steps = 100, max_steps = 1500;
  std::int64_t sample_bytes = 300;  ///< generated after fit
  std::uint64_t sample_seed = 0;
  static constexpr auto fields() {
    using fulgur::cli::field;
    using C = GptConfig;
    return std::tuple(field("vocab", &C::vocab, "tokens (256: bytes)"), field("context", &C::context, "tokens a window sees"),
                      field("width", &C::width, "embedding width"), field("heads", &C::heads, "attention heads (divide width)"),
                      field("layers", &C::layers, "blocks"), field("lr", &C::lr, "peak learning rate"),
                      field("min_lr", &C::min_lr, "learning rate at the end of the cosine decay"),
                      field("weight_decay", &C::weight_decay, "AdamW's weight decay on the matrices"),
                      field("beta2", &C::beta2, "AdamW's second beta"),
                      field("warmup_steps", &C::warmup_steps, "linear warm-up steps"),
                      field("max_steps", &C::max_steps, "the schedule's length (stop earlier with trainer.max_steps)"),
                      field("sample_bytes", &C::sample_bytes, "bytes generated after fit (0: none)"),
                      field("sample_seed", &C::sample_seed, "seed of the sampling"));
  }
};

/// Pre-norm block: x + attention(ln1(x)), then + mlp(ln2(.)).
struct BlockImpl : torch::nn::Module {
  BlockImpl(const GptConfig& config)
      : heads(config.heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.width})))),
        qkv(register_module("qkv", torch::nn::Linear(config.width, 3 * config.width))),
        proj(register_module("proj", torch::nn::Linear(config.width, config.width))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.width})))),
        fc1(register_module("fc1", torch::nn::Linear(config.width, 4 * config.width))),
        fc2(register_module("fc2", torch::nn::Linear(4 * config.width, config.width))) {}

  at::Tensor forward(const at::Tensor& x) {
    const auto batch = x.size(0), time = x.size(1), width = x.size(2);
    // {3, batch, heads, time, head width}: q, k, v as scaled_dot_product_attention takes them.
    const auto qkv_heads = linear(qkv, ln1(x)).view({batch, time, 3, heads, width / heads}).permute({2, 0, 3, 1, 4}).unbind(0);
    const at::Tensor attended =
        at::scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2], {}, 0.0, /*is_causal=*/true);
    const at::Tensor y = x + linear(proj, attended.transpose(1, 2).reshape({batch, time, width}));
    return y + linear(fc2, torch::gelu(linear(fc1, ln2(y))));
  }

  std::int64_t heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  using config_type = GptConfig;
  explicit GptImpl(const GptConfig& config = {}) : config(config) {
    if (config.warmup_steps < 1 || config.warmup_steps >= config.max_steps)
      throw std::invalid_argument("GptConfig: warmup_steps (" + std::to_string(config.warmup_steps) +
                                  ") must be at least 1 and below max_steps (" + std::to_string(config.max_steps) + ")");
    if (config.width % config.heads != 0)
      throw std::invalid_argument("GptConfig: width (" + std::to_string(config.width) +
                                  ") must be a multiple of heads (" + std::to_string(config.heads) + ")");
    tokens = register_module("tokens", torch::nn::Embedding(config.vocab, config.width));
    positions = register_parameter("positions", torch::empty({config.context, config.width}));
    for (std::int64_t i = 0; i < config.layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), Block(config)));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.width})));
    head = register_module("head", torch::nn::Linear(config.width, config.vocab));
    initialise();
  }

  /// Logits {batch, time, vocab} for token ids {batch, time}, time <= context.
  at::Tensor forward(const at::Tensor& ids) {
    at::Tensor x = tokens(ids) + positions.narrow(0, 0, ids.size(1));
    for (Block& block : blocks) x = block(x);
    return linear(head, ln(x));
  }
  at::Tensor loss(const fulgur::data::Batch& batch) {
    return torch::nn::functional::cross_entropy(forward(batch.input).flatten(0, 1), batch.target.flatten());
  }

  // ---- what fulgur's loops call ----------------------------------------------------------------
  at::Tensor training_step(const fulgur::data::Batch& batch, std::int64_t, fulgur::StepContext& ctx) {
    trained_tokens += batch.input.numel();
    at::Tensor value = loss(batch);
    ctx.log("train_loss", value);
    return value;
  }
  /// The mean over the validation set is reported as val_loss (what ModelCheckpoint monitors).
  at::Tensor validation_step(const fulgur::data::Batch& batch, std::int64_t) { return loss(batch); }

  /// AdamW (the fused kernel) with weight decay on the matrices only — not on biases, LayerNorm or
  /// positions, as nanoGPT — and a linear warm-up into a cosine decay to min_lr, stepped every batch.
  fulgur::OptimizerConfig configure_optimizers() {
    std::vector<at::Tensor> decayed, kept;
    for (const auto& item : named_parameters())
      (item.value().dim() >= 2 && item.key() != "positions" ? decayed : kept).push_back(item.value());
    auto decay_options = [&](double weight_decay) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(config.lr).betas({0.9, config.beta2}).weight_decay(weight_decay));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decayed, decay_options(config.weight_decay));
    groups.emplace_back(kept, decay_options(0.0));
    auto adamw = std::make_unique<fulgur::optim::FusedAdamW>(groups, torch::optim::AdamWOptions(config.lr));

    std::vector<std::unique_ptr<fulgur::optim::LRScheduler>> phases;
    phases.push_back(std::make_unique<fulgur::optim::LinearLR>(*adamw, 1.0 / static_cast<double>(config.warmup_steps),
                                                               1.0, config.warmup_steps));
    phases.push_back(std::make_unique<fulgur::optim::CosineAnnealingLR>(*adamw, config.max_steps - config.warmup_steps,
                                                                        config.min_lr));
    auto schedule = std::make_unique<fulgur::optim::SequentialLR>(*adamw, std::move(phases),
                                                                  std::vector<std::int64_t>{config.warmup_steps});
    return {.optimizer = std::move(adamw),
            .lr_scheduler = std::move(schedule),
            .interval = fulgur::SchedulerInterval::step};
  }

  // ---- the run's speed and a sample of what it learnt ----------------------------------------------
  /// Training tokens/s over this process's fit, its validation runs left out.
  void on_train_start() { clock = std::chrono::steady_clock::now(), trained_tokens = 0, validating_seconds = 0; }
  void on_validation_start() { validation_started = std::chrono::steady_clock::now(); }
  void on_validation_end() {
    validating_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - validation_started).count();
  }
  void on_train_end() {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock).count();
    tokens_per_second = static_cast<double>(trained_tokens) / (seconds - validating_seconds);
  }
  void on_fit_end() {
    std::printf("gpt: %.0f training tokens/s\n", tokens_per_second);
    if (config.sample_bytes <= 0) return;
    at::Generator sampling = at::make_generator<at::CPUGeneratorImpl>(config.sample_seed);
    const std::string prompt = "The ";
    const auto text = generate(std::vector<std::int64_t>(prompt.begin(), prompt.end()), config.sample_bytes, 0.8, 40, sampling);
    std::string bytes;
    for (const std::int64_t t : text) bytes += static_cast<char>(t);
    std::printf("---- generated ----\n%s\n-------------------\n", bytes.c_str());
    std::fflush(stdout);
  }

  // ---- after training ------------------------------------------------------------------------------
  /// `count` tokens after `prompt`, sampled at `temperature` from the `top_k` likeliest, each step
  /// seeing the last `context` tokens. Runs in evaluation mode without autograd, on the model's device.
  std::vector<std::int64_t> generate(std::vector<std::int64_t> prompt, std::int64_t count, double temperature,
                                     std::int64_t top_k, at::Generator& generator) {
    torch::NoGradGuard no_grad;
    const bool was_training = is_training();
    eval();
    const auto device = positions.device();
    for (std::int64_t i = 0; i < count; ++i) {
      const auto start = static_cast<std::int64_t>(prompt.size()) > config.context
                             ? static_cast<std::int64_t>(prompt.size()) - config.context
                             : 0;
      const at::Tensor window = torch::tensor(std::vector<std::int64_t>(prompt.begin() + start, prompt.end()))
                                    .unsqueeze(0)
                                    .to(device);
      at::Tensor logits = forward(window).select(1, -1).squeeze(0).to(at::kFloat).cpu() / temperature;
      const auto [kth, unused] = logits.topk(top_k);
      logits.masked_fill_(logits < kth.select(0, -1), -INFINITY);
      prompt.push_back(at::multinomial(logits.softmax(0), 1, false, generator).item<std::int64_t>());
    }
    train(was_training);
    return prompt;
  }

  GptConfig config;
  std::int64_t trained_tokens = 0;
  double validating_seconds = 0, tokens_per_second = 0;
  std::chrono::steady_clock::time_point clock{}, validation_started{};
  torch::nn::Embedding tokens{nullptr};
  at::Tensor positions;
  std::vector<Block> blocks;  // registered as block0..block{layers-1}
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  void initialise() {
    torch::NoGradGuard no_grad;
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers));
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      at::Tensor& value = item.value();
      const bool residual_projection = name.ends_with("proj.weight") || name.ends_with("fc2.weight");
      if (name.starts_with("ln") || name.find(".ln") != std::string::npos) continue;  // LayerNorm: ones and zeros
      if (name.ends_with(".bias")) value.zero_();
      else value.normal_(0.0, residual_projection ? residual_std : 0.02);
    }
  }
};
TORCH_MODULE(Gpt);

}  // namespace gpt
