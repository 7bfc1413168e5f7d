#include "../matrix.hpp"
#include "gpt.hpp"
#include "workloads.hpp"

namespace fulgur::bench {
using namespace models;

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
