// ShardedStrategy has stages 1, 2 and 3: a Trainer asking for another does not compile, and says
// which there are. Twin: stage 3.
#include <fulgur/fulgur.hpp>

#ifdef FULGUR_COMPILE_FAIL
constexpr int stage = 4;
#else
constexpr int stage = 3;
#endif
[[maybe_unused]] void make_trainer() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::ShardedStrategy<stage>, fulgur::FloatPrecision> trainer({.devices = 2});
}
