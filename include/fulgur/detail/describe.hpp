#pragma once
// Text for error messages: tensors and batches described as a user would write them.
#include <ATen/ATen.h>
#include <torch/data/example.h>

#include <string>
#include <string_view>

#include "fulgur/data/apply.hpp"

namespace fulgur::detail {

/// "float32[32, 64] on cpu"
std::string describe_tensor(const at::Tensor& t);
/// The first line of an exception text, without LibTorch's C++ backtrace.
std::string first_line(std::string_view what);
/// A number as a person writes it in a message ("%g"): 0.1, 0.125, 8, 1e-05.
std::string number_text(double v);
/// "float32" for at::kFloat, as Python spells dtypes.
std::string dtype_name(c10::ScalarType dtype);

/// "input float32[32, 64] on cpu, target int64[32] on cpu"
std::string describe_batch(const data::Batch& batch);

template <class Batch>
std::string describe_batch(const Batch& batch) {
  {
    std::string out;
    int i = 0;
    data::for_each_tensor(batch, [&](const at::Tensor& t) {
      if (i < 8) out += (i ? ", " : "") + std::string("tensor ") + std::to_string(i) + " " + describe_tensor(t);
      ++i;
    });
    if (i > 8) out += ", ... (" + std::to_string(i) + " tensors)";
    return i == 0 ? std::string("no tensors") : out;
  }
}

}  // namespace fulgur::detail
