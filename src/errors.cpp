#include "fulgur/detail/describe.hpp"

namespace fulgur::detail {

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    default: return c10::toString(dtype);
  }
}

std::string describe_batch(const data::Batch& batch) {
  return "input " + describe_tensor(batch.input) + ", target " + describe_tensor(batch.target);
}

std::string number_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  std::string shape = "[";
  for (std::int64_t d = 0; d < t.dim(); ++d) shape += (d ? ", " : "") + std::to_string(t.size(d));
  return dtype_name(t.scalar_type()) + shape + "] on " + t.device().str();
}

std::string first_line(std::string_view what) {
  const auto end = what.find('\n');
  return std::string(what.substr(0, end));
}

}  // namespace fulgur::detail
