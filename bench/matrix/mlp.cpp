#include "../matrix.hpp"
#include "mlp.hpp"
#include "workloads.hpp"

namespace fulgur::bench {
using namespace models;

void register_mlp() {
  register_matrix("mlp", [] { return Mlp(); }, [] {
    torch::manual_seed(0);
    std::vector<data::Batch> batches;
    for (int i = 0; i < 100; ++i) batches.push_back({torch::randn({64, 32}), torch::randint(10, {64}, at::kLong)});
    return batches;
  }, {.items_per_batch = 64});
}
}  // namespace fulgur::bench
