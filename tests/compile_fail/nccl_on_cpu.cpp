// NCCL carries CUDA tensors only: DDP over NCCL with the CPU accelerator does not compile.
// Twin: the same on the CUDA accelerator.
#include <fulgur/fulgur.hpp>

#ifdef FULGUR_COMPILE_FAIL
using Accelerator = fulgur::CPUAccelerator;
#else
using Accelerator = fulgur::CUDAAccelerator;
#endif
static_assert(sizeof(fulgur::Trainer<Accelerator, fulgur::BasicDDPStrategy<fulgur::backend::NCCL>, fulgur::FloatPrecision>) > 0);
