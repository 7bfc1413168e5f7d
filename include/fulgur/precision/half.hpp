#pragma once
// HalfPrecision<dtype> — Lightning's "16-true" (float16) and "bf16-true" (bfloat16): the whole
// model in the low dtype, no float32 master weights, no scaler.
#include "fulgur/precision/true_precision.hpp"

namespace fulgur {

template <c10::ScalarType Dtype>
  requires(Dtype == c10::kHalf || Dtype == c10::kBFloat16)
using HalfPrecision = detail::TruePrecision<Dtype>;

using FP16TruePrecision = HalfPrecision<c10::kHalf>;
using BF16TruePrecision = HalfPrecision<c10::kBFloat16>;

}  // namespace fulgur
