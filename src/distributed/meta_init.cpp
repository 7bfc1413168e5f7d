// Materialising a meta-built model for ShardedStrategy<3> (include/fulgur/distributed/meta_init.hpp).
#include "src/distributed/meta_init.hpp"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/rnn.h>
#include <torch/nn/modules/transformer.h>
#include <torch/nn/modules/transformercoder.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/distributed/optimizer_shard.hpp"
#include "fulgur/device_guards.hpp"
#include "src/distributed/process_group.hpp"
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
  if (auto* attention = dynamic_cast<MultiheadAttentionImpl*>(&module)) {
    // Its constructor builds out_proj (a Linear, which draws), then draws its own projections and
    // zeroes out_proj's bias: one initialisation for both (materialize_meta opens out_proj too).
    attention->out_proj->reset_parameters();
    attention->_reset_parameters();
    return true;
  }
  if (auto* prelu = dynamic_cast<PReLUImpl*>(&module)) {
    prelu->weight.fill_(prelu->options.init());
    return true;
  }
  return reset_if_one_of<LinearImpl, BilinearImpl, Conv1dImpl, Conv2dImpl, Conv3dImpl, ConvTranspose1dImpl,
                         ConvTranspose2dImpl, ConvTranspose3dImpl, EmbeddingImpl, EmbeddingBagImpl, LayerNormImpl,
                         GroupNormImpl, BatchNorm1dImpl, BatchNorm2dImpl, BatchNorm3dImpl, InstanceNorm1dImpl,
                         InstanceNorm2dImpl, InstanceNorm3dImpl, RNNImpl, LSTMImpl, GRUImpl, RNNCellImpl,
                         LSTMCellImpl, GRUCellImpl>(module);
}

bool initialises_children(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::MultiheadAttentionImpl*>(&module) != nullptr;
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
  // A parameter's bucket made whole (what it holds so far comes back); nullptr if it is in none.
  auto open = [&](const at::Tensor& t) -> const Place* {
    const auto it = place.find(t.unsafeGetTensorImpl());
    if (it == place.end()) return nullptr;
    if (!it->second.bucket->gathered) {
      it->second.owner->gather(*it->second.bucket);
      open_bytes += bytes_of(it->second.bucket->weights);
    }
    return &it->second;
  };
  // A bucket every parameter of which has its value: rank 0's broadcast, this rank's chunk kept.
  auto close_if_done = [&](const Place& p) {
    if (!p.bucket->gathered || remaining[p.bucket] != 0) return;
    open_bytes -= bytes_of(p.bucket->weights);
    p.owner->keep_initialized(*p.bucket);
  };

  // Built-ins whose construction is not "each module its own tensors, in registration order"; the
  // eager build's values come from the random numbers drawn, in the order drawn, so follow it:
  //  - MultiheadAttention initialises its out_proj too (initialises_children): one init, both open;
  //  - TransformerEncoder/Decoder clone a prototype layer: the prototype draws, then every clone's
  //    reset() draws again and takes the prototype's values. So each layer is drawn from where the
  //    generator stood at the start, and once the layers are done the generator is put where the
  //    eager build leaves it (found by building the prototype and its clones, a layer at a time);
  //  - Transformer redraws every matrix of its subtree (xavier_uniform_) once all of it is built.
  at::Generator generator = at::globalContext().defaultGenerator(device);
  auto generator_state = [&] {
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  };
  auto set_generator_state = [&](const at::Tensor& state) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  };
  std::unordered_map<const torch::nn::Module*, at::Tensor> clone_start;  // layer k > 0 -> where layer 0 began
  struct AfterSubtree {  // what to do once every module below `root` is initialised
    std::unordered_set<const torch::nn::Module*> subtree;
    std::function<void()> then;
  };
  std::vector<AfterSubtree> after;
  auto below = [](torch::nn::Module& m) {
    std::unordered_set<const torch::nn::Module*> out;
    for (const auto& d : m.modules(/*include_self=*/false)) out.insert(d.get());
    return out;
  };
  // The eager build of cloned layers: the prototype, then `count` clones, each drawing.
  auto follow_clones = [&](torch::nn::Module& coder, torch::nn::ModuleList layers, auto make_prototype) {
    if (layers.is_empty() || layers->is_empty()) return;
    const at::Tensor start = generator_state();
    {
      const DefaultDeviceGuard on_device(device);
      auto prototype = make_prototype();
      std::int64_t layer_bytes = 0;
      for (const auto& t : prototype->parameters()) layer_bytes += bytes_of(t);
      for (const auto& t : prototype->buffers()) layer_bytes += bytes_of(t);
      stats.peak_bytes = std::max(stats.peak_bytes, open_bytes + stats.whole_bytes + 2 * layer_bytes);
      for (std::size_t k = 0; k < layers->size(); ++k) (void)prototype->clone();
    }
    const at::Tensor end = generator_state();
    set_generator_state(start);
    for (std::size_t k = 1; k < layers->size(); ++k) clone_start[layers[k].get()] = start;
    after.push_back({below(coder), [&, end] { set_generator_state(end); }});
  };

  auto redraw_matrices = [&](torch::nn::Module& transformer) {  // a bucket whole at a time
    const auto params = transformer.parameters();
    std::map<OptimizerShard::Bucket*, std::size_t> last_use;
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params[i].dim() > 1 && was_meta.count(params[i].unsafeGetTensorImpl()) != 0) {
        const auto it = place.find(params[i].unsafeGetTensorImpl());
        if (it != place.end()) last_use[it->second.bucket] = i;
      }
    for (std::size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (p.dim() <= 1 || was_meta.count(p.unsafeGetTensorImpl()) == 0) continue;
      const Place* where = open(p);
      stats.peak_bytes = std::max(stats.peak_bytes, open_bytes + stats.whole_bytes);
      torch::nn::init::xavier_uniform_(p);
      if (where == nullptr) group.broadcast(p, 0);
      else if (last_use[where->bucket] == i) close_if_done(*where);
    }
  };

  std::unordered_set<const torch::nn::Module*> seen;  // a module registered twice was constructed once
  for (const auto& item : root.named_modules()) {
    torch::nn::Module& module = *item.value();
    if (!seen.insert(&module).second) continue;
    for (; !after.empty() && after.back().subtree.count(&module) == 0; after.pop_back()) after.back().then();
    if (const auto start = clone_start.find(&module); start != clone_start.end()) set_generator_state(start->second);
    using namespace torch::nn;
    if (auto* encoder = dynamic_cast<TransformerEncoderImpl*>(&module))
      follow_clones(module, encoder->layers, [&] { return TransformerEncoderLayer(encoder->options.encoder_layer()->options); });
    if (auto* decoder = dynamic_cast<TransformerDecoderImpl*>(&module))
      follow_clones(module, decoder->layers, [&] { return TransformerDecoderLayer(decoder->options.decoder_layer()->options); });
    if (dynamic_cast<TransformerImpl*>(&module) != nullptr)
      after.push_back({below(module), [&, transformer = &module] { redraw_matrices(*transformer); }});

    // The tensors it initialises (its own, and its children's if it initialises them) that were
    // meta: the new ones, and those an earlier module shares with it (a tied weight), which it
    // initialises again — its constructor drew those random numbers too — and which then keep the
    // earlier value.
    std::vector<std::pair<std::string, at::Tensor>> fresh, shared;
    auto collect = [&](const torch::nn::Module& m, const std::string& prefix) {
      for (auto& [name, t] : own_tensors(m)) {
        const void* impl = t.unsafeGetTensorImpl();
        if (pending.count(impl) != 0) fresh.emplace_back(prefix + name, t);
        else if (was_meta.count(impl) != 0) shared.emplace_back(prefix + name, t);
      }
    };
    collect(module, "");
    if (initialises_children(module))
      for (const auto& child : module.named_modules("", /*include_self=*/false)) {
        seen.insert(child.value().get());
        collect(*child.value(), child.key() + ".");
      }
    if (fresh.empty() && shared.empty()) continue;

    std::vector<const Place*> touched;
    auto touch = [&](const at::Tensor& t) {
      const Place* p = open(t);
      if (p != nullptr && std::find(touched.begin(), touched.end(), p) == touched.end()) touched.push_back(p);
      return p != nullptr;
    };
    for (auto& [name, t] : fresh)
      if (!touch(t)) {  // frozen, or in no optimizer: whole memory of its own
        t.unsafeGetTensorImpl()->shallow_copy_from(at::zeros(t.sizes(), t.options().device(device)).getIntrusivePtr());
        stats.whole_bytes += bytes_of(t);
      }
    for (auto& [name, t] : shared) touch(t);
    stats.peak_bytes = std::max(stats.peak_bytes, open_bytes + stats.whole_bytes);

    std::vector<at::Tensor> kept;
    kept.reserve(shared.size());
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
    for (const Place* p : touched) close_if_done(*p);
  }
  for (; !after.empty(); after.pop_back()) after.back().then();
  if (!pending.empty())
    throw MisconfigurationError("fulgur: ShardedStrategy<3>: " + std::to_string(pending.size()) +
                                " meta tensor(s) belong to no submodule of the module being set up; build every "
                                "parameter and buffer in the module given to fit.");
  return stats;
}

}  // namespace fulgur::distributed
