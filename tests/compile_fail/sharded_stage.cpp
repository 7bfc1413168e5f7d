// ShardedStrategy's stage 3 is not there yet: a Trainer asking for it does not compile, and says
// so. Twin: stage 2.
#include <fulgur/fulgur.hpp>

#ifdef FULGUR_COMPILE_FAIL
constexpr int stage = 3;
#else
constexpr int stage = 2;
#endif
[[maybe_unused]] void make_trainer() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::ShardedStrategy<stage>, fulgur::FloatPrecision> trainer({.devices = 2});
}
