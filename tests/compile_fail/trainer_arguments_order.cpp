// The real Trainer with its policies in another order gets one error about the order, not the member
// the precision lacks as a strategy. Twin: the same three in Trainer's order.
#include <fulgur/fulgur.hpp>

#ifdef FULGUR_COMPILE_FAIL
using Trainer = fulgur::Trainer<fulgur::CPUAccelerator, fulgur::FloatPrecision, fulgur::SingleDeviceStrategy>;
#else
using Trainer = fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision>;
#endif
void build() {
  Trainer trainer({.max_epochs = 1});
  (void)trainer;
}
