// bench_fused: fulgur with fulgur::optim's fused optimizers against the loop a LibTorch user writes
// today with torch::optim's (bench/matrix.hpp's rows: one process, both sides alternating, median
// microseconds per step and their ratio). Adam and SGD with momentum, on the tiny MLP (32-64-64-10,
// batch 64: where the optimizer's per-parameter ops weigh most) and the small GPT, in '32-true',
// 'bf16-mixed' and '16-mixed' (where the loss scaler hands its scale to the fused kernel), on the CPU
// and, with a GPU, CUDA. Same flags as bench_matrix (--threads=N, --benchmark_filter=...).
#include <benchmark/benchmark.h>

#include "matrix.hpp"
#include "matrix/gpt.hpp"
#include "matrix/mlp.hpp"

namespace {

using namespace fulgur::bench;

enum class Optimizer { adam, fused_adam, sgd, fused_sgd };

/// A benchmark model with the optimizer chosen at construction (both sides share the module type).
template <class Network>
struct WithOptimizer : Network {
  explicit WithOptimizer(Optimizer optimizer) : optimizer(optimizer) {}
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    const auto adam = torch::optim::AdamOptions(1e-3);
    const auto sgd = torch::optim::SGDOptions(1e-2).momentum(0.9);
    switch (optimizer) {
      case Optimizer::adam: return std::make_unique<torch::optim::Adam>(this->parameters(), adam);
      case Optimizer::fused_adam: return std::make_unique<fulgur::optim::FusedAdam>(this->parameters(), adam);
      case Optimizer::sgd: return std::make_unique<torch::optim::SGD>(this->parameters(), sgd);
      case Optimizer::fused_sgd: return std::make_unique<fulgur::optim::FusedSGD>(this->parameters(), sgd);
    }
    throw std::logic_error("unknown optimizer");
  }
  Optimizer optimizer;
};

inline constexpr auto trainers = fulgur::compatible_trainers(
    boost::hana::tuple_t<fulgur::CPUAccelerator, fulgur::CUDAAccelerator>,
    boost::hana::tuple_t<fulgur::SingleDeviceStrategy>,
    boost::hana::tuple_t<fulgur::FloatPrecision, fulgur::BF16MixedPrecision, fulgur::FP16MixedPrecision>);

std::vector<fulgur::data::Batch> mlp_batches() {
  torch::manual_seed(0);
  std::vector<fulgur::data::Batch> batches;
  for (int i = 0; i < 100; ++i) batches.push_back({torch::randn({64, 32}), torch::randint(10, {64}, at::kLong)});
  return batches;
}

std::vector<fulgur::data::Batch> gpt_batches() {
  torch::manual_seed(0);
  std::vector<fulgur::data::Batch> batches;
  for (int i = 0; i < 10; ++i) {
    const at::Tensor text = torch::randint(models::kVocab, {models::kBatch, models::kContext + 1}, at::kLong);
    batches.push_back({text.narrow(1, 0, models::kContext).contiguous(), text.narrow(1, 1, models::kContext).contiguous()});
  }
  return batches;
}

template <class Network>
void register_pair(const std::string& name, Optimizer fused, Optimizer unfused, std::vector<fulgur::data::Batch> (*batches)(),
                   double items_per_batch) {
  register_matrix_versus(
      name, [fused] { return std::make_shared<WithOptimizer<Network>>(fused); },
      [unfused] { return std::make_shared<WithOptimizer<Network>>(unfused); }, batches,
      {.items_per_batch = items_per_batch}, trainers);
}

}  // namespace

int main(int argc, char** argv) {
  register_pair<models::MlpImpl>("fused_adam_vs_adam/mlp", Optimizer::fused_adam, Optimizer::adam, mlp_batches, 64);
  register_pair<models::MlpImpl>("fused_sgd_vs_sgd/mlp", Optimizer::fused_sgd, Optimizer::sgd, mlp_batches, 64);
  register_pair<models::GptImpl>("fused_adam_vs_adam/gpt", Optimizer::fused_adam, Optimizer::adam, gpt_batches,
                                 models::kBatch * models::kContext);
  register_pair<models::GptImpl>("fused_sgd_vs_sgd/gpt", Optimizer::fused_sgd, Optimizer::sgd, gpt_batches,
                                 models::kBatch * models::kContext);
  return run_matrix(argc, argv);
}
