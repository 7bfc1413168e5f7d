// ShardedStrategy's stages 2 and 3 are not there yet: a Trainer asking for one does not compile, and
// says so. Twin: stage 1.
#include <fulgur/fulgur.hpp>

#ifdef FULGUR_COMPILE_FAIL
constexpr int stage = 3;
#else
constexpr int stage = 1;
#endif
[[maybe_unused]] void make_trainer() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::ShardedStrategy<stage>, fulgur::FloatPrecision> trainer({.devices = 2});
}
