// activation_checkpoint refuses a function whose result is not a tensor, a tuple or a vector of them,
// in one error that says what fn must return.
#include <fulgur/nn/activation_checkpoint.hpp>

#include <ATen/ATen.h>

void checkpointed(const at::Tensor& x) {
#ifdef FULGUR_COMPILE_FAIL
  auto sum = fulgur::activation_checkpoint([](const at::Tensor& t) { return t.sum().item<double>(); }, x);
#else
  auto sum = fulgur::activation_checkpoint([](const at::Tensor& t) { return t.sum(); }, x);
#endif
  (void)sum;
}
