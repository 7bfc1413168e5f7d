// A Trainer takes one profiler (Lightning's `profiler=`): a second is refused with one error.
#include <fulgur/fulgur.hpp>

#ifdef FULGUR_COMPILE_FAIL
using Second = fulgur::SimpleProfiler;
#else
using Second = fulgur::CSVLogger;
#endif

void make() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision, fulgur::SimpleProfiler,
                  Second>
      trainer;
  (void)trainer;
}
