// Pieces the precision policies share (include/fulgur/precision/common.hpp).
#include "fulgur/precision/common.hpp"

namespace fulgur::detail {

std::vector<at::Tensor> all_params(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> params;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) params.push_back(p);
  return params;
}

}  // namespace fulgur::detail
