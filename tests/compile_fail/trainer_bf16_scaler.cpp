// The real Trainer refuses 'bf16-mixed' with a GradScaler at compile time (Lightning: ValueError
// at run time). Twin: BF16MixedPrecision as shipped, without a scaler.
#include <fulgur/fulgur.hpp>

#ifdef FULGUR_COMPILE_FAIL
using Precision = fulgur::MixedPrecision<c10::kBFloat16, fulgur::GradScaler>;
#else
using Precision = fulgur::BF16MixedPrecision;
#endif
static_assert(sizeof(fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, Precision>) > 0);
