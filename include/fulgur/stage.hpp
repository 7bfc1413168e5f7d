#pragma once
// What the Trainer is doing: the `stage` that setup(stage) and teardown(stage) receive
// (Lightning's TrainerFn: "fit", "validate", "test", "predict"). Torch-free.
#include <string_view>

namespace fulgur {

enum class Stage { fit, validate, test, predict };

constexpr std::string_view to_string(Stage stage) {
  switch (stage) {
    case Stage::fit: return "fit";
    case Stage::validate: return "validate";
    case Stage::test: return "test";
    case Stage::predict: return "predict";
  }
  return "";
}

}  // namespace fulgur
