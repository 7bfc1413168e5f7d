#pragma once
// fulgur::ParallelDevices: the devices a strategy runs on, as Lightning's accelerator connector
// hands them to a strategy (parallel_devices, num_nodes). The Trainer builds it from
// TrainerConfig::devices and num_nodes through the accelerator, and gives it to
// strategy.setup_environment.
#include <c10/core/Device.h>

#include <vector>

namespace fulgur {

struct ParallelDevices {
  std::vector<c10::Device> devices{};  ///< this node's devices, one per local process
  int num_nodes = 1;
  int max_restarts = 0;  ///< TrainerConfig::max_restarts: what fulgur's own launcher may restart
};

}  // namespace fulgur
