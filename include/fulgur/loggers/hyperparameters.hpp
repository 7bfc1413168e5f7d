#pragma once
// Hyper-parameters as loggers record them (Lightning's save_hyperparameters / log_hyperparams):
// names with a number, a flag or a text, in the order given. Torch-free.
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace fulgur {

using HyperparameterValue = std::variant<bool, std::int64_t, double, std::string>;
using Hyperparameters = std::vector<std::pair<std::string, HyperparameterValue>>;

}  // namespace fulgur
