// Materialising a meta-built model for ShardedStrategy<3> (include/fulgur/distributed/meta_init.hpp).
#include "fulgur/distributed/meta_init.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/rnn.h>

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fulgur/distributed/optimizer_shard.hpp"
#include "fulgur/distributed/process_group.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::distributed {

namespace {
template <class... Impls>
bool reset_if_one_of(torch::nn::Module& module) {
  return ([&] {
    auto* m = dynamic_cast<Impls*>(&module);
    if (m != nullptr) m->reset_parameters();
    return m != nullptr;
  }() || ...);
}

/// A module's own parameters and buffers (defined ones), not its children's.
std::vector<std::pair<std::string, at::Tensor>> own_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/false))
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/false))
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  return out;
}

std::int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<std::int64_t>(t.element_size()); }
}  // namespace

bool reset_builtin_parameters(torch::nn::Module& module) {
  using namespace torch::nn;
  return reset_if_one_of<LinearImpl, BilinearImpl, Conv1dImpl, Conv2dImpl, Conv3dImpl, ConvTranspose1dImpl,
                         ConvTranspose2dImpl, ConvTranspose3dImpl, EmbeddingImpl, EmbeddingBagImpl, LayerNormImpl,
                         GroupNormImpl, BatchNorm1dImpl, BatchNorm2dImpl, BatchNorm3dImpl, InstanceNorm1dImpl,
                         InstanceNorm2dImpl, InstanceNorm3dImpl, RNNImpl, LSTMImpl, GRUImpl, RNNCellImpl,
                         LSTMCellImpl, GRUCellImpl>(module);
}

std::string first_meta_tensor(const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters())
    if (item.value().defined() && item.value().is_meta()) return item.key();
  for (const auto& item : module.named_buffers())
    if (item.value().defined() && item.value().is_meta()) return item.key();
  return {};
}

void refuse_meta_tensors(const torch::nn::Module& module, const std::string& advice) {
  const std::string name = first_meta_tensor(module);
  if (!name.empty())
    throw MisconfigurationError("fulgur: the module's tensor '" + name +
                                "' is on the meta device (a shape without memory or value); " + advice);
}

std::unordered_set<const void*> meta_tensors(const torch::nn::Module& module) {
  std::unordered_set<const void*> out;
  for (const auto& item : module.named_parameters())
    if (item.value().defined() && item.value().is_meta()) out.insert(item.value().unsafeGetTensorImpl());
  for (const auto& item : module.named_buffers())
    if (item.value().defined() && item.value().is_meta()) out.insert(item.value().unsafeGetTensorImpl());
  return out;
}

MaterializeStats materialize_meta(torch::nn::Module& root, c10::Device device, const ParameterInit& init,
                                  std::span<const std::unique_ptr<OptimizerShard>> shards, ProcessGroup& group,
                                  std::unordered_set<const void*>& pending) {
  MaterializeStats stats;
  if (pending.empty()) return stats;
  at::NoGradGuard no_grad;

  // Where each pending parameter lives, and how many of each bucket's are still to initialise.
  struct Place {
    OptimizerShard* owner;
    OptimizerShard::Bucket* bucket;
  };
  std::unordered_map<const void*, Place> place;
  std::map<OptimizerShard::Bucket*, std::int64_t> remaining;
  for (const auto& shard : shards)
    for (auto* bucket : shard->buckets())
      for (const auto& slot : bucket->slots)
        if (pending.count(slot.param.unsafeGetTensorImpl()) != 0) {
          place.emplace(slot.param.unsafeGetTensorImpl(), Place{shard.get(), bucket});
          ++remaining[bucket];
        }

  const std::unordered_set<const void*> was_meta = pending;
  std::int64_t open_bytes = 0;
  std::vector<const torch::nn::Module*> seen;  // a module registered twice was constructed once
  for (const auto& item : root.named_modules()) {
    torch::nn::Module& module = *item.value();
    if (std::find(seen.begin(), seen.end(), &module) != seen.end()) continue;
    seen.push_back(&module);
    // Its own tensors that were meta: the new ones, and those an earlier module shares with it (a
    // tied weight), which it initialises again — its constructor drew those random numbers too —
    // and which then keep the earlier value.
    std::vector<std::pair<std::string, at::Tensor>> fresh, shared;
    for (auto& [name, t] : own_tensors(module)) {
      const void* impl = t.unsafeGetTensorImpl();
      if (pending.count(impl) != 0) fresh.emplace_back(name, t);
      else if (was_meta.count(impl) != 0) shared.emplace_back(name, t);
    }
    if (fresh.empty() && shared.empty()) continue;

    std::vector<Place> touched;
    auto open = [&](const at::Tensor& t) {
      const auto it = place.find(t.unsafeGetTensorImpl());
      if (it == place.end()) return false;
      if (!it->second.bucket->gathered) {
        it->second.owner->gather(*it->second.bucket);  // what the bucket holds so far comes back
        open_bytes += bytes_of(it->second.bucket->weights);
      }
      if (std::none_of(touched.begin(), touched.end(), [&](const Place& p) { return p.bucket == it->second.bucket; }))
        touched.push_back(it->second);
      return true;
    };
    for (auto& [name, t] : fresh)
      if (!open(t)) {  // frozen, or in no optimizer: whole memory of its own
        t.unsafeGetTensorImpl()->shallow_copy_from(at::zeros(t.sizes(), t.options().device(device)).getIntrusivePtr());
        stats.whole_bytes += bytes_of(t);
      }
    for (auto& [name, t] : shared) open(t);
    stats.peak_bytes = std::max(stats.peak_bytes, open_bytes + stats.whole_bytes);

    std::vector<at::Tensor> kept;
    for (const auto& [name, t] : shared) kept.push_back(t.clone());
    if (!init(module)) {
      const std::string path = item.key().empty() ? std::string("the root module") : "'" + item.key() + "'";
      const std::string& tensor = (fresh.empty() ? shared : fresh).front().first;
      throw MisconfigurationError(
          "fulgur: ShardedStrategy<3>: " + path + " (" + module.name() + ") was built on the meta device "
          "(init_module(/*empty_init=*/true)) with its own tensor '" + tensor +
          "', and fulgur does not know how to initialise it; set FSDPOptions::param_init to a function that "
          "initialises a module's own parameters and buffers in place and returns true (false for types it "
          "does not know), or build the model with init_module().");
    }
    for (std::size_t i = 0; i < shared.size(); ++i) shared[i].second.copy_(kept[i]);
    ++stats.modules;

    for (auto& [name, t] : fresh) {
      pending.erase(t.unsafeGetTensorImpl());
      const auto it = place.find(t.unsafeGetTensorImpl());
      if (it == place.end()) group.broadcast(t, 0);  // rank 0's value, as an eager model's at set-up
      else --remaining[it->second.bucket];
    }
    for (const Place& p : touched)
      if (remaining[p.bucket] == 0) {
        open_bytes -= bytes_of(p.bucket->weights);
        p.owner->keep_initialized(*p.bucket);
      }
  }
  if (!pending.empty())
    throw MisconfigurationError("fulgur: ShardedStrategy<3>: " + std::to_string(pending.size()) +
                                " meta tensor(s) belong to no submodule of the module being set up; build every "
                                "parameter and buffer in the module given to fit.");
  return stats;
}

}  // namespace fulgur::distributed
