// One training run for bench_ddp: DDP over Gloo when started by torchrun (2 ranks, batch B each),
// else one process (batch 2B); FULGUR_BENCH_STRATEGY=zero1 / zero2 / zero3 trains under
// ShardedStrategy<1> / <2> / <3> instead of DDP, zero3-meta under <3> with the model built on the
// meta device (init_module(empty_init=true)). FULGUR_BENCH_MODEL=gpt trains bench/matrix/gpt.hpp's
// GPT at 4.2M parameters (4 blocks, width 256, 4 heads, context 64, vocabulary 2048; AdamW; 8
// sequences per rank; stage 3 wraps each block) instead of the MLP (stage 3: each Linear a unit).
// Prints from rank 0 "step_us <mean microseconds per step>", timed between barriers after a
// warm-up, and for the GPT the CPU tensor memory this rank held at most (every CPU allocation
// counted through an allocator installed first): "peak_bytes" over the whole run (building the
// model and set-up included) and "step_peak_bytes" during the timed steps.
#include <c10/core/CPUAllocator.h>
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "matrix/gpt.hpp"

namespace {
constexpr std::int64_t kIn = 256, kHidden = 512, kClasses = 10, kBatchPerRank = 64, kWarmup = 10, kSteps = 60;

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kIn, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kHidden))),
        fc3(register_module("fc3", torch::nn::Linear(kHidden, kClasses))) {}
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc3(torch::relu(fc2(torch::relu(fc1(b.input))))), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

/// Every CPU allocation's bytes, live and at most (the allocator LibTorch's CPU tensors use). The
/// context of what it returns is the data pointer itself, as LibTorch's raw_allocate requires; the
/// inner allocation is found again by that pointer.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) { self = this; }
  c10::DataPtr allocate(std::size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held_.emplace(data, Held{std::move(inner), static_cast<std::int64_t>(n)});
      live_ += static_cast<std::int64_t>(n);
      peak_ = std::max(peak_, live_);
      window_peak_ = std::max(window_peak_, live_);
    }
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  std::int64_t peak() {  ///< since the start
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }
  std::int64_t window_peak() {  ///< since restart_window
    std::lock_guard<std::mutex> lock(mutex_);
    return window_peak_;
  }
  void restart_window() {
    std::lock_guard<std::mutex> lock(mutex_);
    window_peak_ = live_;
  }

 private:
  struct Held {
    c10::DataPtr inner;
    std::int64_t bytes;
  };
  static void release(void* data) {
    if (data == nullptr) return;
    c10::DataPtr inner;  // freed outside the lock
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      const auto it = self->held_.find(data);
      if (it == self->held_.end()) return;
      inner = std::move(it->second.inner);
      self->live_ -= it->second.bytes;
      self->held_.erase(it);
    }
  }
  static inline CountingAllocator* self = nullptr;
  c10::Allocator* inner_;
  std::mutex mutex_;
  std::unordered_map<void*, Held> held_;
  std::int64_t live_ = 0, peak_ = 0, window_peak_ = 0;
};
CountingAllocator* counting = nullptr;

struct Measured {
  double step_us = 0;
  std::int64_t step_peak_bytes = 0;
};

const fulgur::bench::models::GptOptions kGpt{.vocab = 2048, .width = 256, .heads = 4, .context = 64, .layers = 4};
constexpr std::int64_t kGptBatchPerRank = 8, kGptWarmup = 2, kGptSteps = 10;
bool gpt_model() {
  const char* model = std::getenv("FULGUR_BENCH_MODEL");
  return model != nullptr && std::string(model) == "gpt";
}

template <class Trainer, class Model>
Measured time_fit(Trainer& trainer, Model& model, const std::vector<fulgur::data::Batch>& batches, std::int64_t warmup) {
  std::vector<fulgur::data::Batch> first(batches.begin(), batches.begin() + warmup);
  std::vector<fulgur::data::Batch> timed(batches.begin() + warmup, batches.end());
  trainer.fit(model, first);
  trainer.barrier();
  counting->restart_window();
  const auto start = std::chrono::steady_clock::now();
  trainer.fit(model, timed);
  trainer.barrier();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return {us / static_cast<double>(timed.size()), counting->window_peak()};
}

/// The model built (on the meta device if `meta`), trained for a warm-up, then timed.
template <class Trainer>
Measured run(Trainer& trainer, std::int64_t batch, bool meta = false) {
  torch::manual_seed(0);
  if (gpt_model()) {
    namespace models = fulgur::bench::models;
    models::Gpt model{nullptr};
    {
      auto context = trainer.init_module(/*empty_init=*/meta);
      model = models::Gpt(kGpt);
    }
    std::vector<fulgur::data::Batch> batches;
    for (std::int64_t i = 0; i < kGptWarmup + kGptSteps; ++i) {
      const at::Tensor text = torch::randint(kGpt.vocab, {batch, kGpt.context + 1}, at::kLong);
      batches.push_back({text.narrow(1, 0, kGpt.context).contiguous(), text.narrow(1, 1, kGpt.context).contiguous()});
    }
    return time_fit(trainer, model, batches, kGptWarmup);
  }
  Mlp model;
  std::vector<fulgur::data::Batch> batches;
  for (std::int64_t i = 0; i < kWarmup + kSteps; ++i)
    batches.push_back({torch::randn({batch, kIn}), torch::randint(kClasses, {batch}, at::kLong)});
  return time_fit(trainer, model, batches, kWarmup);
}

/// Stage 3's units: each GPT block, or each Linear of the MLP; the GPT's own tensor (its learned
/// positions) initialised as its constructor does, for a build on the meta device.
fulgur::FSDPOptions stage3_options() {
  namespace models = fulgur::bench::models;
  fulgur::FSDPOptions options;
  options.auto_wrap = gpt_model() ? fulgur::WrapPolicy::by_type<models::Block>()
                                  : fulgur::WrapPolicy::by_type<torch::nn::Linear>();
  options.param_init = [](torch::nn::Module& m) {
    if (auto* gpt = dynamic_cast<models::GptImpl*>(&m)) {
      gpt->positions.normal_(0.0, 0.02);
      return true;
    }
    return fulgur::distributed::reset_builtin_parameters(m);
  };
  return options;
}
}  // namespace

int main() {
  // The GPT rows only: the MLP rows keep the allocator their Python counterparts use.
  static CountingAllocator allocator(c10::GetCPUAllocator());
  counting = &allocator;
  if (gpt_model()) c10::SetCPUAllocator(&allocator, /*priority=*/100);
  fulgur::TrainerConfig config{.max_epochs = 1, .enable_progress_bar = false};
  const std::int64_t batch = gpt_model() ? kGptBatchPerRank : kBatchPerRank;
  Measured measured;
  int rank = 0;
  if (std::getenv("RANK")) {
    config.devices = std::atoi(std::getenv("WORLD_SIZE"));
    const char* strategy = std::getenv("FULGUR_BENCH_STRATEGY");
    const std::string which = strategy != nullptr ? strategy : "";
    if (which == "zero1") {  // ShardedStrategy<1>: optimizer state sharded
      fulgur::Trainer<fulgur::CPUAccelerator, fulgur::ShardedStrategy<1, fulgur::backend::Gloo>, fulgur::FloatPrecision>
          trainer(config);
      rank = trainer.global_rank();
      measured = run(trainer, batch);
    } else if (which == "zero2") {  // ShardedStrategy<2>: gradients sharded too
      fulgur::Trainer<fulgur::CPUAccelerator, fulgur::ShardedStrategy<2, fulgur::backend::Gloo>, fulgur::FloatPrecision>
          trainer(config);
      rank = trainer.global_rank();
      measured = run(trainer, batch);
    } else if (which == "zero3" || which == "zero3-meta") {  // ShardedStrategy<3>: parameters too
      fulgur::Trainer<fulgur::CPUAccelerator, fulgur::ShardedStrategy<3, fulgur::backend::Gloo>, fulgur::FloatPrecision>
          trainer(config, stage3_options());
      rank = trainer.global_rank();
      measured = run(trainer, batch, /*meta=*/which == "zero3-meta");
    } else {
      fulgur::Trainer<fulgur::CPUAccelerator, fulgur::BasicDDPStrategy<fulgur::backend::Gloo>, fulgur::FloatPrecision>
          trainer(config);
      rank = trainer.global_rank();
      measured = run(trainer, batch);
    }
  } else {
    fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer(config);
    measured = run(trainer, 2 * batch);
  }
  if (rank == 0) {
    std::cout << "step_us " << measured.step_us << std::endl;
    if (gpt_model())
      std::cout << "peak_bytes " << allocator.peak() << "\nstep_peak_bytes " << measured.step_peak_bytes << std::endl;
  }
}
