#pragma once
// The torch types the concepts speak of, named without including torch.
//
// Each concept is written once, generically, as `*_for<Policy, Vocabulary>`; the public concept
// (`fulgur::precision<P>`, ...) binds it to `torch_vocabulary`. Concept tests bind it to a
// vocabulary of small complete stand-ins instead, so they compile in a blink without LibTorch.
#include <cstdint>

namespace at { class Tensor; }
namespace c10 {
enum class DeviceType : std::int8_t;
struct Device;
}  // namespace c10
namespace torch::nn { class Module; }
namespace torch::optim { class Optimizer; }

namespace fulgur {

class StateDict;  // fulgur/state_dict.hpp

struct torch_vocabulary {
  using tensor = at::Tensor;
  using device = c10::Device;
  using device_type = c10::DeviceType;
  using module = torch::nn::Module;
  using optimizer = torch::optim::Optimizer;
  using state_dict = StateDict;
};

/// How `all_reduce` combines values across processes (Lightning's "sum", "mean", "max", "min").
enum class ReduceOp { sum, mean, max, min };

}  // namespace fulgur
