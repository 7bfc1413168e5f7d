#pragma once
// The Trainer's policies by name, read from TrainerView::combination_name() ("cpu/ddp/bf16-mixed"),
// for the shipped callbacks that refuse a strategy or adapt to a precision. Internal to the library.
#include <string>

#include "fulgur/callbacks/trainer_view.hpp"

namespace fulgur::detail {

/// The strategy's name: "single_device", "ddp", "fsdp" (ShardedStrategy<3>), "deepspeed_stage_1"/"_2";
/// empty for a view of no trainer.
inline std::string strategy_name(const TrainerView& trainer) {
  const std::string combination = trainer.combination_name();
  const auto first = combination.find('/');
  if (first == std::string::npos) return {};
  return combination.substr(first + 1, combination.find('/', first + 1) - first - 1);
}

/// The precision's name ("32-true", "bf16-mixed", ...); empty for a view of no trainer.
inline std::string precision_name(const TrainerView& trainer) {
  const std::string combination = trainer.combination_name();
  const auto last = combination.find_last_of('/');
  return last == std::string::npos ? std::string() : combination.substr(last + 1);
}

}  // namespace fulgur::detail
