// A sharded optimizer state read back whole (include/fulgur/distributed/shard_state.hpp).
#include "src/distributed/shard_state.hpp"

#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <string>
#include <type_traits>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::distributed {

namespace {
using ParamState = torch::optim::OptimizerParamState;
/// Makes one field of the new state from that field of every part.
using Combine = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

template <class S>
std::unique_ptr<ParamState> map_fields(const std::vector<const ParamState*>& parts, const Combine& combine) {
  auto out = std::make_unique<S>(static_cast<const S&>(*parts.front()));  // the step count and the rest as they are
  auto field = [&](auto get, auto set) {
    std::vector<at::Tensor> values;
    values.reserve(parts.size());
    for (const ParamState* part : parts) values.push_back(get(static_cast<const S&>(*part)));
    if (values.front().defined()) set(*out, combine(values));
  };
#define FULGUR_FIELD(name) field([](const S& s) { return s.name(); }, [](S& s, const at::Tensor& t) { s.name(t); })
  if constexpr (std::is_same_v<S, torch::optim::AdamParamState> || std::is_same_v<S, torch::optim::AdamWParamState>) {
    FULGUR_FIELD(exp_avg);
    FULGUR_FIELD(exp_avg_sq);
    FULGUR_FIELD(max_exp_avg_sq);
  } else if constexpr (std::is_same_v<S, torch::optim::SGDParamState>) {
    FULGUR_FIELD(momentum_buffer);
  } else if constexpr (std::is_same_v<S, torch::optim::AdagradParamState>) {
    FULGUR_FIELD(sum);
  } else {
    static_assert(std::is_same_v<S, torch::optim::RMSpropParamState>);
    FULGUR_FIELD(square_avg);
    FULGUR_FIELD(momentum_buffer);
    FULGUR_FIELD(grad_avg);
  }
#undef FULGUR_FIELD
  return out;
}

std::unique_ptr<ParamState> map_state(const std::vector<const ParamState*>& parts, const Combine& combine) {
  const ParamState* first = parts.front();
  if (dynamic_cast<const torch::optim::AdamWParamState*>(first)) return map_fields<torch::optim::AdamWParamState>(parts, combine);
  if (dynamic_cast<const torch::optim::AdamParamState*>(first)) return map_fields<torch::optim::AdamParamState>(parts, combine);
  if (dynamic_cast<const torch::optim::SGDParamState*>(first)) return map_fields<torch::optim::SGDParamState>(parts, combine);
  if (dynamic_cast<const torch::optim::AdagradParamState*>(first))
    return map_fields<torch::optim::AdagradParamState>(parts, combine);
  if (dynamic_cast<const torch::optim::RMSpropParamState*>(first))
    return map_fields<torch::optim::RMSpropParamState>(parts, combine);
  throw CheckpointError("fulgur: ShardedStrategy: this optimizer's state is of a type fulgur cannot reshard or "
                        "consolidate (it knows LibTorch's SGD, Adam, AdamW, Adagrad and RMSprop); resume on as many "
                        "ranks as wrote it, under ShardedStrategy.");
}

/// Swaps each param group's list with one of `lists` while alive, and back.
class GroupSwap {
 public:
  GroupSwap(torch::optim::Optimizer& optimizer, std::vector<std::vector<at::Tensor>>& lists)
      : optimizer_(optimizer), lists_(lists) {
    swap();
  }
  ~GroupSwap() { swap(); }
  GroupSwap(const GroupSwap&) = delete;
  GroupSwap& operator=(const GroupSwap&) = delete;

 private:
  void swap() {
    for (std::size_t g = 0; g < lists_.size(); ++g) optimizer_.param_groups()[g].params().swap(lists_[g]);
  }
  torch::optim::Optimizer& optimizer_;
  std::vector<std::vector<at::Tensor>>& lists_;
};
}  // namespace

ShardLayout sharded_layout(const StateDict& state) {
  ShardLayout layout;
  if (state.contains("bucket_params") && state.at("bucket_params").isList()) {  // a generic list once read back
    for (const c10::IValue& n : state.at("bucket_params").toListRef()) {
      if (!n.isInt()) throw CheckpointError("fulgur: a sharded optimizer state's 'bucket_params' holds a " +
                                            std::string(n.tagKind()) + "; the checkpoint is damaged.");
      layout.bucket_params.push_back(n.toInt());
    }
    return layout;
  }
  if (!state.contains("bucket_bytes") || !state.contains("first_bucket_bytes"))
    throw CheckpointError("fulgur: this optimizer state was written under ShardedStrategy by an earlier fulgur, "
                          "which did not record its layout; resume it under ShardedStrategy on as many ranks, or "
                          "load only the checkpoint's weights (checkpoint::module_weights).");
  layout.first_bucket_bytes = static_cast<std::size_t>(state.at("first_bucket_bytes").toInt());
  layout.bucket_bytes = static_cast<std::size_t>(state.at("bucket_bytes").toInt());
  return layout;
}

c10::IValue rank_file_entry(const std::string& file, std::int64_t rank, std::size_t slot, const std::string& what) {
  if (!fulgur::detail::path_exists(file))
    throw CheckpointPartError("fulgur: rank " + std::to_string(rank) + "'s " + what + " shard file '" + file +
                          "' is missing: a sharded checkpoint is its file and the '.shards' folder beside it; "
                          "copy or move them together.");
  const StateDict part = checkpoint::load(file);
  const bool known = part.contains("format") && part.at("format").isString() &&
                     (part.at("format").toStringRef() == rank_file_format ||
                      part.at("format").toStringRef() == "fulgur-optimizer-shards");  // written before module shards
  if (!known || !part.contains("rank") || part.at("rank").toInt() != rank || !part.contains("shards"))
    throw CheckpointPartError("fulgur: '" + file + "' is not rank " + std::to_string(rank) +
                          "'s shard file; keep a sharded checkpoint's .shards folder beside it, as written.");
  const auto shards = part.at("shards").toList();
  if (slot >= shards.size())
    throw CheckpointPartError("fulgur: '" + file + "' holds " + std::to_string(shards.size()) + " shard(s), the manifest "
                          "names slot " + std::to_string(slot) + "; the file is not the one this checkpoint wrote.");
  return shards.get(slot);
}

std::vector<at::Tensor> sharded_archives(const StateDict& state, int only_rank) {
  const auto world = state.at("world_size").toInt();
  std::vector<at::Tensor> archives(static_cast<std::size_t>(world));
  if (state.contains("shards")) {
    const auto shards = state.at("shards").toList();
    for (std::size_t r = 0; r < shards.size() && r < archives.size(); ++r) archives[r] = shards.get(r).toTensor();
  } else if (state.contains("files")) {
    const auto files = state.at("files").toList();
    const auto slot = static_cast<std::size_t>(state.at("slot").toInt());
    if (static_cast<std::int64_t>(files.size()) != world)
      throw CheckpointError("fulgur: a sharded optimizer state lists " + std::to_string(files.size()) + " files for " +
                            std::to_string(world) + " ranks.");
    for (std::int64_t r = 0; r < world; ++r) {
      if (only_rank >= 0 && r != only_rank) continue;
      archives[static_cast<std::size_t>(r)] =
          rank_file_entry(files.get(static_cast<std::size_t>(r)).toStringRef(), r, slot, "optimizer").toTensor();
    }
  } else if (state.contains("shard")) {
    if (world != 1 && only_rank < 0)
      throw CheckpointError("fulgur: this sharded optimizer state holds one rank's shard only (it was not saved); "
                            "load it on the rank that made it, or save and load the checkpoint.");
    archives[static_cast<std::size_t>(std::max(only_rank, 0))] = state.at("shard").toTensor();
  } else {
    throw CheckpointError("fulgur: a sharded optimizer state without its shards (no 'shards', 'files' or 'shard').");
  }
  return archives;
}

void resolve_shard_files(StateDict& checkpoint, const std::string& folder) {
  // Sharded states sit at most a few levels down (optimizer_states[i], or a name in fabric.save's dict).
  std::function<void(c10::IValue&)> visit = [&](c10::IValue& value) {
    if (value.isGenericDict()) {
      auto dict = value.toGenericDict();
      auto format = dict.find(c10::IValue("format"));
      if (format != dict.end() && format->value().isString() && (format->value().toStringRef() == sharded_optimizer_format ||
                                                       format->value().toStringRef() == sharded_module_format) &&
          dict.contains(c10::IValue("files"))) {
        auto files = dict.at(c10::IValue("files")).toList();
        for (std::size_t i = 0; i < files.size(); ++i) {
          const std::string name = files.get(i).toStringRef();
          if (!name.empty() && name.front() != '/') files.set(i, folder + "/" + name);
        }
        return;
      }
      for (auto& item : dict) {
        c10::IValue inner = item.value();
        visit(inner);
      }
    } else if (value.isList()) {
      auto list = value.toList();
      for (std::size_t i = 0; i < list.size(); ++i) {
        c10::IValue inner = list.get(i);
        visit(inner);
      }
    }
  };
  c10::IValue root = checkpoint.to_ivalue();
  visit(root);
}

ShardedOptimizerState::ShardedOptimizerState(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& archives,
                                             const ShardLayout& layout)
    : plan_(ShardPlan::of(optimizer, static_cast<int>(archives.size()), layout)) {
  const auto world = static_cast<std::int64_t>(archives.size());
  for (const auto& group : plan_.groups)
    for (const auto& unit : group.units)
      for (const auto& bucket : unit.buckets) buckets_.push_back(&bucket);
  std::vector<std::vector<std::unique_ptr<ParamState>>> parts(buckets_.size());
  for (std::int64_t r = 0; r < world; ++r) {
    // Rank r's view when it saved: one shard per bucket, then the group's frozen parameters.
    std::vector<std::vector<at::Tensor>> lists;
    std::vector<at::Tensor> proxies;
    for (const auto& group : plan_.groups) {
      lists.emplace_back();
      for (const auto& unit : group.units)
        for (const auto& bucket : unit.buckets) {
          proxies.push_back(at::zeros({bucket.numel / world}, bucket.slots.front().param.options().requires_grad(false)));
          lists.back().push_back(proxies.back());
        }
      lists.back().insert(lists.back().end(), group.frozen.begin(), group.frozen.end());
    }
    if (lists.size() != optimizer.param_groups().size())
      throw CheckpointError("fulgur: ShardedStrategy: the optimizer has " + std::to_string(optimizer.param_groups().size()) +
                            " param groups, the layout " + std::to_string(lists.size()) + ".");
    {
      GroupSwap swap(optimizer, lists);
      optimizer.state().clear();
      StateDict archive;
      archive.insert("format", std::string("libtorch-optimizer-archive"));
      archive.insert("archive", archives[static_cast<std::size_t>(r)]);
      checkpoint::load_optimizer_state_dict(optimizer, archive);
      for (std::size_t k = 0; k < proxies.size(); ++k) {
        auto it = optimizer.state().find(proxies[k].unsafeGetTensorImpl());
        parts[k].push_back(it == optimizer.state().end() ? nullptr : std::move(it->second));
      }
      optimizer.state().clear();
    }
  }
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    const ShardPlan::Bucket& bucket = *buckets_[k];
    std::vector<const ParamState*> views;
    for (const auto& part : parts[k])
      if (part) views.push_back(part.get());
    if (views.empty()) {
      whole_.push_back(nullptr);  // an optimizer without state (SGD without momentum)
      continue;
    }
    if (views.size() != parts[k].size())
      throw CheckpointError("fulgur: ShardedStrategy: some ranks' optimizer states have a bucket's state and some do "
                            "not; the checkpoint was not written by one ShardedStrategy run.");
    whole_.push_back(map_state(views, [&](const std::vector<at::Tensor>& chunks) {
      for (const auto& c : chunks)
        if (c.dim() != 1 || c.numel() * world != bucket.numel)
          throw CheckpointError("fulgur: ShardedStrategy: the optimizer state's shards (" + std::to_string(c.numel()) +
                                " elements) do not fit this optimizer's parameters laid out over " +
                                std::to_string(world) + " ranks (" + std::to_string(bucket.numel / world) +
                                "); resume with the same module, optimizer and param groups.");
      return at::cat(chunks).narrow(0, 0, bucket.content).clone();
    }));
  }
}

ShardedOptimizerState::~ShardedOptimizerState() = default;
ShardedOptimizerState::ShardedOptimizerState(ShardedOptimizerState&&) noexcept = default;

ShardedOptimizerState ShardedOptimizerState::from_whole(const torch::optim::Optimizer& optimizer,
                                                       const ShardLayout& layout) {
  ShardedOptimizerState out;
  out.plan_ = ShardPlan::of(optimizer, 1, layout);
  for (const auto& group : out.plan_.groups)
    for (const auto& unit : group.units)
      for (const auto& bucket : unit.buckets) out.buckets_.push_back(&bucket);
  for (const ShardPlan::Bucket* bucket : out.buckets_) {
    std::vector<const ParamState*> parts;
    for (const auto& slot : bucket->slots) {
      auto it = optimizer.state().find(slot.param.unsafeGetTensorImpl());
      if (it != optimizer.state().end()) parts.push_back(it->second.get());
    }
    if (parts.empty()) {
      out.whole_.push_back(nullptr);
      continue;
    }
    if (parts.size() != bucket->slots.size())
      throw CheckpointError("fulgur: ShardedStrategy: the optimizer state covers some parameters of a bucket and not "
                            "others (parameters that never stepped); it cannot be sharded. Resume it under the "
                            "strategy that wrote it.");
    out.whole_.push_back(map_state(parts, [&](const std::vector<at::Tensor>& fields) {
      at::Tensor content = at::zeros({bucket->content}, fields.front().options());
      for (std::size_t i = 0; i < fields.size(); ++i)
        content.narrow(0, bucket->slots[i].offset, bucket->slots[i].param.numel()).copy_(fields[i].reshape({-1}));
      return content;
    }));
  }
  return out;
}

void ShardedOptimizerState::load_whole(torch::optim::Optimizer& optimizer) const {
  optimizer.state().clear();
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    if (!whole_[k]) continue;
    for (const auto& slot : buckets_[k]->slots)
      optimizer.state()[slot.param.unsafeGetTensorImpl()] =
          map_state({whole_[k].get()}, [&](const std::vector<at::Tensor>& v) {
            return v.front().narrow(0, slot.offset, slot.param.numel()).view(slot.param.sizes()).clone();
          });
  }
}

void ShardedOptimizerState::load_shards(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& shards,
                                        int world, int rank) const {
  if (shards.size() != buckets_.size())
    throw CheckpointError("fulgur: ShardedStrategy: the optimizer state has " + std::to_string(buckets_.size()) +
                          " buckets, this run's layout " + std::to_string(shards.size()) +
                          "; resume with the same bucket sizes.");
  optimizer.state().clear();
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    if (!whole_[k]) continue;
    const std::int64_t chunk = shards[k].numel(), content = buckets_[k]->content;
    optimizer.state()[shards[k].unsafeGetTensorImpl()] = map_state({whole_[k].get()}, [&](const std::vector<at::Tensor>& v) {
      at::Tensor padded = at::zeros({chunk * world}, v.front().options());
      padded.narrow(0, 0, content).copy_(v.front());
      return padded.narrow(0, rank * chunk, chunk).clone();
    });
  }
}

}  // namespace fulgur::distributed
