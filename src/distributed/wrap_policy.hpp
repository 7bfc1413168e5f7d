#pragma once
// The units a WrapPolicy (strategies/sharded/options.hpp) makes of a module. Private to libfulgur.
#include "fulgur/strategies/sharded/options.hpp"

#include <cstdint>
#include <string>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <vector>

namespace torch::nn {
class Module;
}

namespace fulgur::distributed {

/// The units a policy makes of a module: each parameter's unit (by its TensorImpl; 0: the root)
/// and each unit's submodule name (names[u - 1]).
struct WrappedUnits {
  std::unordered_map<const void*, std::int64_t> unit_of;
  std::vector<std::string> names;
  std::int64_t of(const void* param) const {
    const auto it = unit_of.find(param);
    return it == unit_of.end() ? 0 : it->second;
  }
};
WrappedUnits wrap_units(const torch::nn::Module& root, const WrapPolicy& policy);

}  // namespace fulgur::distributed
