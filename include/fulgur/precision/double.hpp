#pragma once
// DoublePrecision — Lightning's "64-true": float64 parameters, inputs and default dtype.
#include "fulgur/precision/true_precision.hpp"

namespace fulgur {

using DoublePrecision = detail::TruePrecision<c10::kDouble>;

}  // namespace fulgur
