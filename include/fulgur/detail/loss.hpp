#pragma once
// The loss in a step's output, for the loops and for callbacks that show it.
#include <ATen/ATen.h>

#include <concepts>
#include <type_traits>

namespace fulgur::detail {

template <class Output>
inline constexpr bool has_loss = std::is_convertible_v<Output, at::Tensor> || requires(const Output& o) {
  { o.loss } -> std::convertible_to<at::Tensor>;
};

/// The tensor itself, or its `loss` member; none for other outputs.
template <class Output>
at::Tensor loss_of(const Output& output) {
  if constexpr (std::is_convertible_v<Output, at::Tensor>)
    return output;
  else if constexpr (requires { { output.loss } -> std::convertible_to<at::Tensor>; })
    return output.loss;
  else
    return {};
}

}  // namespace fulgur::detail
