#pragma once
// fulgur: a C++20 training library on LibTorch with compile-time policies.
#include "fulgur/concepts/accelerator.hpp"
#include "fulgur/concepts/precision.hpp"
#include "fulgur/concepts/strategy.hpp"
#include "fulgur/concepts/training_module.hpp"
#include "fulgur/compatibility.hpp"

#include "fulgur/accelerators/cpu.hpp"
#include "fulgur/accelerators/cuda.hpp"
#include "fulgur/strategies/single_device.hpp"
#include "fulgur/strategies/ddp.hpp"
#include "fulgur/precision/float.hpp"
#include "fulgur/precision/double.hpp"
#include "fulgur/precision/half.hpp"
#include "fulgur/precision/mixed.hpp"
#include "fulgur/precision/grad_scaler.hpp"

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/data/batch.hpp"
#include "fulgur/data/tensor_loader.hpp"
#include "fulgur/data/torch_distributed_sampler.hpp"
#include "fulgur/trainer.hpp"
#include "fulgur/dispatch.hpp"
