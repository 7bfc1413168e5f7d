#pragma once
// SingleDeviceStrategy — Lightning's "single_device": one process, one device; the collectives
// are the identity. Everything it does is strategy_defaults' (strategies/defaults.hpp).
#include <string_view>

#include "fulgur/strategies/defaults.hpp"

namespace fulgur {

class SingleDeviceStrategy : public strategy_defaults<SingleDeviceStrategy> {
 public:
  static constexpr std::string_view name = "single_device";
  using strategy_defaults::strategy_defaults;
};

}  // namespace fulgur
