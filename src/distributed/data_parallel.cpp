// DataParallel (include/fulgur/distributed/data_parallel.hpp).
#include "fulgur/distributed/data_parallel.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstring>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/nn/sync_batchnorm.hpp"
#include "src/distributed/launcher.hpp"
#include "src/distributed/process_group.hpp"
#include "src/distributed/reducer.hpp"

namespace fulgur::distributed {

// A named namespace, not an anonymous one: DataParallel::State holds it (GCC's -Wsubobject-linkage where
// this file is compiled in a unity batch).
namespace detail {
// The process group as SyncBatchNorm sees it; cut off when the DataParallel goes (a module that
// outlives the run then normalises as BatchNorm).
class SyncGroup final : public nn::BatchNormSyncGroup {
 public:
  explicit SyncGroup(ProcessGroup& group) : group_(&group) {}
  int world_size() const override { return group_ ? group_->size() : 1; }
  at::Tensor all_gather(const at::Tensor& tensor) override { return at::stack(group().all_gather(tensor)); }
  void all_reduce_sum(const at::Tensor& tensor) override { group().all_reduce(tensor, ReduceOp::sum); }
  void detach() { group_ = nullptr; }

 private:
  ProcessGroup& group() {
    if (!group_) throw MisconfigurationError("SyncBatchNorm: the strategy's process group is gone (teardown).");
    return *group_;
  }
  ProcessGroup* group_;
};
}  // namespace detail

struct DataParallel::State {
  DDPOptions options;
  ClusterEnvironment env;
  c10::Device device{c10::kCPU};
  std::unique_ptr<ProcessGroup> group;
  std::unique_ptr<GradientReducer> reducer;  // declared after the group: destroyed before it (its hooks first)
  std::shared_ptr<detail::SyncGroup> sync_group;     // given to the model's SyncBatchNorm layers
};

DataParallel::DataParallel(const ParallelDevices& parallel, const DDPOptions& options) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.options = options;
  s.env = detect_environment();
  const ClusterEnvironment& env = s.env;
  const int local = static_cast<int>(parallel.devices.size());
  const int expected = local * parallel.num_nodes;
  if (env.source == ClusterEnvironment::Source::none && expected > 1)
    launch_local_workers({local, parallel.num_nodes, parallel.max_restarts});
  if (env.world_size != expected)
    throw MisconfigurationError(
        "the launcher started " + std::to_string(env.world_size) + (env.world_size == 1 ? " process" : " processes") +
        " (WORLD_SIZE/SLURM_NTASKS), but the "
        "Trainer was configured for devices=" + std::to_string(local) + " x num_nodes=" +
        std::to_string(parallel.num_nodes) + " = " + std::to_string(expected) +
        "; make them agree (torchrun --nproc-per-node / #SBATCH --ntasks-per-node must equal devices).");
  if (env.local_rank >= local)
    throw MisconfigurationError("local rank " + std::to_string(env.local_rank) + " has no device: only " +
                                std::to_string(local) + " were given.");
  s.device = parallel.devices[static_cast<std::size_t>(env.local_rank)];
}

DataParallel::~DataParallel() {
  if (state_->sync_group) state_->sync_group->detach();
}

c10::Device DataParallel::device() const { return state_->device; }
const ClusterEnvironment& DataParallel::environment() const { return state_->env; }
const DDPOptions& DataParallel::options() const { return state_->options; }

void DataParallel::connect(DDPBackend backend) {
  State& s = *state_;
  const BackendKind kind = backend == DDPBackend::nccl   ? BackendKind::nccl
                           : backend == DDPBackend::gloo ? BackendKind::gloo
                           : s.device.is_cuda()         ? BackendKind::nccl
                                                         : BackendKind::gloo;
  s.group = std::make_unique<ProcessGroup>(kind, s.env, s.options.timeout, s.device);
  s.sync_group = std::make_shared<detail::SyncGroup>(*s.group);
}

ProcessGroup& DataParallel::group() {
  if (!state_->group)
    throw MisconfigurationError("DDPStrategy: the process group is not set up yet (setup_environment).");
  return *state_->group;
}

std::vector<std::pair<std::string, at::Tensor>> DataParallel::broadcast_module(torch::nn::Module& module) {
  // Lightning's sync_batchnorm: converted at set-up, before the parameters are listed (they stay the
  // same tensors); every SyncBatchNorm, converted or declared, then reduces over this group.
  if (state_->options.sync_batchnorm) nn::convert_sync_batchnorm_children(module);
  if (state_->sync_group) nn::attach_sync_group(module, state_->sync_group);
  at::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> named;
  std::vector<const void*> seen;
  for (const auto& item : module.named_parameters()) {
    const void* impl = item.value().unsafeGetTensorImpl();
    if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
    seen.push_back(impl);
    if (!item.value().is_meta()) group().broadcast(item.value().detach(), 0);  // meta: when materialised
    named.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers())
    if (!item.value().is_meta()) group().broadcast(item.value(), 0);
  return named;
}

void DataParallel::setup_module(torch::nn::Module& module) {
  State& s = *state_;
  s.reducer.reset();  // first: its destructor removes its hooks, which must not be the new ones
  s.reducer = std::make_unique<GradientReducer>(
      group(), broadcast_module(module),
      ReducerOptions{s.options.first_bucket_bytes, s.options.bucket_bytes, s.options.find_unused_parameters});
}

void DataParallel::prepare_for_backward() {
  if (state_->reducer) state_->reducer->prepare_for_backward();
}
void DataParallel::finalize_backward() {
  if (state_->reducer) state_->reducer->finalize_backward();
}
void DataParallel::abandon_backward() noexcept {
  if (state_->reducer) state_->reducer->abandon_backward();
}
bool* DataParallel::sync_flag() { return state_->reducer ? state_->reducer->sync_flag() : nullptr; }
const GradientReducer* DataParallel::reducer() const { return state_->reducer.get(); }
void DataParallel::all_reduce(const at::Tensor& tensor, ReduceOp op) { group().all_reduce(tensor, op); }
void DataParallel::broadcast(const at::Tensor& tensor, int src) { group().broadcast(tensor, src); }
void DataParallel::barrier() { group().barrier(); }

at::Tensor DataParallel::all_gather(const at::Tensor& tensor) {
  const auto parts = all_gather_uneven(tensor);
  for (const auto& part : parts)
    if (part.sizes() != tensor.sizes())
      throw MisconfigurationError("all_gather: ranks hold tensors of different shapes; use all_gather_uneven, which "
                                  "returns one tensor per rank.");
  return at::stack(parts);
}

std::vector<at::Tensor> DataParallel::all_gather_uneven(const at::Tensor& tensor) {
  if (tensor.dim() == 0) {  // a scalar: gather it as a 1-element vector
    auto parts = all_gather_uneven(tensor.unsqueeze(0));
    for (auto& part : parts) part = part.squeeze(0);
    return parts;
  }
  const auto local = tensor.contiguous();
  const auto dims = at::tensor(local.sizes().vec(), at::TensorOptions().dtype(at::kLong)).to(state_->device);
  const auto all_dims = group().all_gather(dims);  // every rank's shape (same rank count of dims required)
  std::vector<std::int64_t> max_shape = local.sizes().vec();
  for (const auto& d : all_dims)
    for (std::size_t i = 0; i < max_shape.size(); ++i)
      max_shape[i] = std::max(max_shape[i], d[static_cast<std::int64_t>(i)].item<std::int64_t>());
  at::Tensor padded = at::zeros(max_shape, local.options());
  std::vector<at::indexing::TensorIndex> region;
  for (auto s : local.sizes()) region.emplace_back(at::indexing::Slice(0, s));
  padded.index_put_(region, local);
  auto gathered = group().all_gather(padded);
  for (std::size_t r = 0; r < gathered.size(); ++r) {
    std::vector<at::indexing::TensorIndex> own;
    for (std::int64_t i = 0; i < all_dims[r].size(0); ++i)
      own.emplace_back(at::indexing::Slice(0, all_dims[r][i].item<std::int64_t>()));
    gathered[r] = gathered[r].index(own);
  }
  return gathered;
}

std::string DataParallel::broadcast(const std::string& text, int src) {
  auto size = at::scalar_tensor(static_cast<std::int64_t>(text.size()), at::kLong).to(state_->device);
  group().broadcast(size, src);
  auto bytes = at::empty({size.item<std::int64_t>()}, at::TensorOptions().dtype(at::kByte));
  if (state_->env.rank == src) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  auto on_device = bytes.to(state_->device);
  group().broadcast(on_device, src);
  bytes = on_device.cpu();
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
}

StateDict DataParallel::broadcast(const StateDict& state, int src) {
  const std::vector<char> bytes = state_->env.rank == src ? checkpoint::to_bytes(state) : std::vector<char>();
  const std::string received = broadcast(std::string(bytes.begin(), bytes.end()), src);
  return checkpoint::from_bytes(std::vector<char>(received.begin(), received.end()), "a broadcast value");
}

bool DataParallel::reduce_boolean_decision(bool decision, bool all) {
  auto votes = at::scalar_tensor(decision ? 1 : 0, at::kLong).to(state_->device);
  group().all_reduce(votes, ReduceOp::sum);
  const auto yes = votes.item<std::int64_t>();
  return all ? yes == state_->env.world_size : yes > 0;
}

}  // namespace fulgur::distributed
