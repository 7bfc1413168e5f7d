// The loop contract (fulgur/loops/host.hpp): a host that misses part of it is refused with one error
// naming the part; the loops' plumbing is not the Trainer's public API. The twins compile.
#include <fulgur/fulgur.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

struct Net : torch::nn::Module {
  Net() { register_module("fc", fc); }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) { return fc(b.input).sum(); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), 0.1);
  }
  torch::nn::Linear fc{2, 1};
};
using CpuTrainer = fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision>;

#if defined(FULGUR_RULE_HOST)
#ifdef FULGUR_COMPILE_FAIL
// Has the config and nothing else of the contract.
struct Host {
  const fulgur::TrainerConfig& config() const { return config_; }
  fulgur::TrainerConfig config_;
};
#else
using Host = CpuTrainer;
#endif
std::int64_t run(Host& host, Net& net, fulgur::data::TensorLoader& loader) {
  fulgur::loops::NoData none;
  return fulgur::loops::fit(host, net, loader, none, {}).global_step;
}
#elif defined(FULGUR_RULE_PLUMBING)
void run(CpuTrainer& trainer) {
#ifdef FULGUR_COMPILE_FAIL
  trainer.callback_set();  // the loops' plumbing: private since the loop contract
#else
  trainer.callbacks();  // the callbacks, as the Trainer's arguments gave them
#endif
}
#else
#error "define one FULGUR_RULE_*"
#endif
