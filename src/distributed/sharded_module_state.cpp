// Stage 3's module state in a sharded checkpoint (include/fulgur/distributed/sharded_module_state.hpp).
#include "src/distributed/sharded_module_state.hpp"

#include <ATen/ATen.h>

#include <string>
#include <unordered_map>

#include "fulgur/checkpoint/io.hpp"
#include "src/distributed/shard_state.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::distributed {

namespace {
void collect_state_tensors(const torch::nn::Module& module, const std::string& prefix,
                           std::vector<std::pair<std::string, at::Tensor>>& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) out.emplace_back(prefix + item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/false)) out.emplace_back(prefix + item.key(), item.value());
  for (const auto& child : module.named_children()) collect_state_tensors(*child.value(), prefix + child.key() + ".", out);
}

struct Place {
  std::int64_t bucket = 0, offset = 0;
};

std::vector<std::string> strings(const c10::IValue& list) {
  std::vector<std::string> out;
  for (const auto& item : list.toList()) out.push_back(item.get().toStringRef());
  return out;
}

/// A list of ints as written (IntList) or as read back from a file (a generic list).
std::vector<std::int64_t> ints(const c10::IValue& list) {
  std::vector<std::int64_t> out;
  for (const auto& item : list.toList()) out.push_back(item.get().toInt());
  return out;
}

CheckpointError malformed(const std::string& what) {
  return CheckpointError("fulgur: a sharded module state (stage 3's weights) " + what +
                         "; it was not written by ShardedStrategy<3>, or was edited.");
}
}  // namespace

std::vector<std::pair<std::string, at::Tensor>> state_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  collect_state_tensors(module, "", out);
  return out;
}

StateDict sharded_module_state(const torch::nn::Module& module, const std::vector<std::unique_ptr<OptimizerShard>>& shards,
                               int world_size, bool with_shard) {
  std::unordered_map<const void*, Place> places;
  c10::List<std::int64_t> buckets;
  c10::impl::GenericList chunks(c10::TensorType::get());
  for (const auto& shard : shards)
    for (const OptimizerShard::Bucket* b : shard->buckets()) {
      for (const auto& slot : b->slots)
        places.emplace(slot.param.unsafeGetTensorImpl(), Place{static_cast<std::int64_t>(buckets.size()), slot.offset});
      buckets.push_back(b->numel);
      if (with_shard) chunks.push_back(b->shard.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
    }
  c10::List<std::string> keys;
  StateDict whole;
  c10::impl::GenericDict params(c10::StringType::get(), c10::ListType::ofInts());
  for (const auto& [key, t] : state_tensors(module)) {
    keys.push_back(key);
    const auto place = t.defined() ? places.find(t.unsafeGetTensorImpl()) : places.end();
    if (place == places.end()) {  // not sharded: whole on every rank
      if (with_shard) whole.insert(key, t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
      else whole.insert(key, at::Tensor());
      continue;
    }
    c10::List<std::int64_t> where({place->second.bucket, place->second.offset});
    for (const auto size : t.sizes()) where.push_back(size);
    params.insert(key, where);
  }
  StateDict out;
  out.insert("format", std::string(sharded_module_format));
  out.insert("world_size", static_cast<std::int64_t>(world_size));
  out.insert("keys", keys);
  out.insert("whole", whole.to_ivalue());
  out.insert("params", params);
  out.insert("buckets", buckets);
  if (with_shard) out.insert("shard", chunks);
  return out;
}

bool is_sharded_module_state(const StateDict& state) {
  return state.contains("format") && state.at("format").isString() &&
         state.at("format").toStringRef() == sharded_module_format;
}

bool same_module_layout(const StateDict& a, const StateDict& b) {
  for (const char* key : {"world_size", "keys", "whole", "params", "buckets"})
    if (!a.contains(key) || !b.contains(key)) return false;
  if (a.at("world_size").toInt() != b.at("world_size").toInt()) return false;
  if (strings(a.at("keys")) != strings(b.at("keys"))) return false;
  if (ints(a.at("buckets")) != ints(b.at("buckets"))) return false;
  const auto pa = a.at("params").toGenericDict(), pb = b.at("params").toGenericDict();
  const auto wa = a.at("whole").toGenericDict(), wb = b.at("whole").toGenericDict();
  if (pa.size() != pb.size() || wa.size() != wb.size()) return false;
  for (const auto& item : pa) {
    const auto other = pb.find(item.key());
    if (other == pb.end() || ints(item.value()) != ints(other->value())) return false;
  }
  for (const auto& item : wa)
    if (!wb.contains(item.key())) return false;
  return true;
}

std::vector<at::Tensor> sharded_module_chunks(const StateDict& state, int rank, bool own_rank) {
  c10::IValue list;
  if (state.contains("files")) {
    const auto files = state.at("files").toList();
    if (!state.contains("slot") || rank < 0 || static_cast<std::size_t>(rank) >= files.size())
      throw malformed("names " + std::to_string(files.size()) + " rank files, not rank " + std::to_string(rank) + "'s");
    list = rank_file_entry(files.get(static_cast<std::size_t>(rank)).toStringRef(), rank,
                           static_cast<std::size_t>(state.at("slot").toInt()), "weights");
  } else if (state.contains("shard") && (own_rank || state.at("world_size").toInt() == 1)) {
    list = state.at("shard");
  } else if (state.contains("shard")) {
    throw CheckpointError("fulgur: this sharded module state holds one rank's weights only (it was not saved); load "
                          "it on the rank that made it, or save the checkpoint and load that.");
  } else {
    throw malformed("has neither 'files' nor 'shard'");
  }
  if (!list.isList()) throw malformed("has rank " + std::to_string(rank) + "'s weights as a " + list.tagKind());
  std::vector<at::Tensor> out;
  for (const auto& item : list.toList()) out.push_back(item.get().toTensor());
  return out;
}

StateDict consolidate_module_state(const StateDict& state) {
  for (const char* key : {"world_size", "keys", "whole", "params", "buckets"})
    if (!state.contains(key)) throw malformed(std::string("has no '") + key + "'");
  const std::int64_t world = state.at("world_size").toInt();
  const std::vector<std::int64_t> sizes = ints(state.at("buckets"));
  std::vector<std::vector<at::Tensor>> parts(sizes.size());
  for (std::int64_t r = 0; r < world; ++r) {
    const auto chunks = sharded_module_chunks(state, static_cast<int>(r));
    if (chunks.size() != sizes.size())
      throw malformed("has " + std::to_string(chunks.size()) + " chunks from rank " + std::to_string(r) + " for " +
                      std::to_string(sizes.size()) + " buckets");
    for (std::size_t b = 0; b < sizes.size(); ++b) parts[b].push_back(chunks[b].reshape({-1}));
  }
  std::vector<at::Tensor> joined;
  for (std::size_t b = 0; b < sizes.size(); ++b) {
    joined.push_back(at::cat(parts[b]));
    parts[b].clear();
    if (joined.back().numel() != sizes[b])
      throw malformed("joins bucket " + std::to_string(b) + " to " + std::to_string(joined.back().numel()) +
                      " elements, not " + std::to_string(sizes[b]));
  }
  const auto whole = state.at("whole").toGenericDict();
  const auto params = state.at("params").toGenericDict();
  StateDict out;
  for (const std::string& key : strings(state.at("keys"))) {
    if (const auto w = whole.find(key); w != whole.end()) {
      out.insert(key, w->value());
      continue;
    }
    const auto p = params.find(key);
    if (p == params.end()) throw malformed("lists '" + key + "' but says nothing of where it is");
    const std::vector<std::int64_t> where = ints(p->value());
    if (where.size() < 2 || where[0] < 0 || static_cast<std::size_t>(where[0]) >= joined.size())
      throw malformed("places '" + key + "' in no bucket");
    const std::vector<std::int64_t> shape(where.begin() + 2, where.end());
    std::int64_t numel = 1;
    for (const auto s : shape) numel *= s;
    const at::Tensor& bucket = joined[static_cast<std::size_t>(where[0])];
    if (where[1] < 0 || where[1] + numel > bucket.numel())
      throw malformed("places '" + key + "' past its bucket's end");
    out.insert(key, bucket.narrow(0, where[1], numel).view(shape).clone());
  }
  return out;
}

}  // namespace fulgur::distributed
