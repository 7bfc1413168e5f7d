#pragma once
// The types the concepts speak of, named without including torch.
//
// Each concept is written once, generically, as `*_for<Policy, Vocabulary>`; the public concept
// (`fulgur::precision<P>`, ...) binds it to `torch_vocabulary`. Concept tests bind it to a
// vocabulary of small complete stand-ins instead, so they compile in a blink without LibTorch.
// A vocabulary names what the loops hand to a policy: tensors, the batch and loader types they
// pass, modules, optimizers, devices and state.
#include <cstdint>

namespace at { class Tensor; }
namespace c10 {
enum class DeviceType : std::int8_t;
enum class ScalarType : std::int8_t;
struct Device;
}  // namespace c10
namespace torch::nn { class Module; }
namespace torch::optim { class Optimizer; }

namespace fulgur {

class StateDict;        // fulgur/state_dict.hpp
struct ParallelDevices;  // fulgur/parallel_devices.hpp
namespace data {
struct Batch;        // fulgur/data/batch.hpp
class TensorLoader;  // fulgur/data/tensor_loader.hpp
}  // namespace data

struct torch_vocabulary {
  using tensor = at::Tensor;
  using device = c10::Device;
  using device_type = c10::DeviceType;
  using scalar_type = c10::ScalarType;  ///< a precision's compute dtype
  using module = torch::nn::Module;
  using optimizer = torch::optim::Optimizer;
  using state_dict = StateDict;
  using parallel_devices = ParallelDevices;
  using batch = data::Batch;          ///< what the loops move and convert
  using loader = data::TensorLoader;  ///< what the loops give process_dataloader
};

/// How `all_reduce` combines values across processes (Lightning's "sum", "mean", "max", "min"),
/// and how a logged metric is reduced over an epoch.
enum class ReduceOp { sum, mean, max, min };

}  // namespace fulgur
