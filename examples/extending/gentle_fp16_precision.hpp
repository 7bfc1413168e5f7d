// examples/extending/gentle_fp16_precision.hpp
// "16-mixed" with a loss scaler that starts low and grows slowly: a shipped policy configured by
// deriving from it. The Trainer builds it from the accelerator's device type, as it builds the
// original.
#pragma once
#include <fulgur/fulgur.hpp>

struct GentleFP16MixedPrecision : fulgur::FP16MixedPrecision {
  GentleFP16MixedPrecision(c10::DeviceType device_type)
      : fulgur::FP16MixedPrecision(device_type, fulgur::GradScaler({.init_scale = 1024.0, .growth_interval = 500})) {}
};
