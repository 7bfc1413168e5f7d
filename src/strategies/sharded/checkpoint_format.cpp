// ShardedStrategy's checkpoint format, as the generic reader sees it (checkpoint/format.hpp). A
// sharded checkpoint is a manifest (the checkpoint's file) and, beside it, a folder
// "<file>.shards/<id>/" of one file per rank; each sharded state in the manifest (an optimizer's,
// stage 3's module state) names the rank files ("files") and its place in them ("slot").
#include "src/strategies/sharded/checkpoint_format.hpp"

#include <ATen/core/ivalue.h>
#include <unistd.h>

#include <chrono>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/detail/files.hpp"
#include "src/distributed/shard_state.hpp"
#include "src/distributed/sharded_module_state.hpp"

namespace fulgur::distributed {
namespace {

/// Names a save: rank 0's clock and process, unique per checkpoint path in practice.
std::string checkpoint_id() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(now).count()) + "-" +
         std::to_string(::getpid());
}

/// `value` with each sharded state's "shard" moved into `mine` and replaced by the files of every
/// rank and its slot in them.
c10::IValue manifest_of(const c10::IValue& value, c10::impl::GenericList& mine, const c10::impl::GenericList& files) {
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    const auto format = dict.find(c10::IValue("format"));
    const bool sharded = format != dict.end() && format->value().isString() &&
                         (format->value().toStringRef() == sharded_optimizer_format ||
                          format->value().toStringRef() == sharded_module_format) &&
                         dict.contains(c10::IValue("shard"));
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& item : dict) {
      if (sharded && item.key().toStringRef() == "shard") continue;
      out.insert(item.key(), manifest_of(item.value(), mine, files));
    }
    if (sharded) {
      out.insert_or_assign(c10::IValue("files"), files.copy());
      out.insert_or_assign(c10::IValue("slot"), static_cast<std::int64_t>(mine.size()));
      mine.push_back(dict.at(c10::IValue("shard")));
    }
    return out;
  }
  if (value.isList()) {
    const auto list = value.toList();
    c10::impl::GenericList out(list.elementType());
    for (std::size_t i = 0; i < list.size(); ++i) out.push_back(manifest_of(list.get(i), mine, files));
    return out;
  }
  return value;
}

bool tagged(const StateDict& part, const char* format) {
  return part.contains("format") && part.at("format").isString() && part.at("format").toStringRef() == format;
}

class ShardedFormat final : public checkpoint::Format {
 public:
  bool owns(const StateDict& part) const override {
    return tagged(part, sharded_optimizer_format) || tagged(part, sharded_module_format);
  }
  StateDict opened(const StateDict& part, const std::string& folder) const override {
    if (!part.contains("files")) return part;
    StateDict out;
    for (const auto& item : part) out.insert(item.key().toStringRef(), item.value());
    c10::impl::GenericList files(c10::StringType::get());
    for (const auto& file : part.at("files").toListRef()) {
      const std::string name = file.toStringRef();
      files.push_back(name.empty() || name.front() == '/' ? name : folder + "/" + name);
    }
    out.insert("files", files);
    return out;
  }
  std::optional<StateDict> whole_module_state(const StateDict& part) const override {
    if (!tagged(part, sharded_module_format)) return std::nullopt;
    return consolidate_module_state(part);
  }
  bool load_whole_optimizer_state(torch::optim::Optimizer& optimizer, const StateDict& part) const override {
    if (!tagged(part, sharded_optimizer_format)) return false;
    ShardedOptimizerState(optimizer, sharded_archives(part), sharded_layout(part)).load_whole(optimizer);
    return true;
  }
  StateDict inlined(const StateDict& part) const override {
    if (tagged(part, sharded_module_format)) return consolidate_module_state(part);  // whole: torch.load reads it
    if (!part.contains("files")) return part;
    c10::impl::GenericList shards(c10::TensorType::get());
    for (const auto& archive : sharded_archives(part)) shards.push_back(archive);
    StateDict out;
    for (const auto& item : part)
      if (item.key().toStringRef() != "files" && item.key().toStringRef() != "slot")
        out.insert(item.key().toStringRef(), item.value());
    out.insert("shards", shards);
    return out;
  }
  void remove_beside(const std::string& path) const override { fulgur::detail::remove_tree(path + ".shards"); }
};

}  // namespace

void write_sharded_checkpoint(DataParallel& ddp, const std::string& path, const StateDict& state) {
  const int rank = ddp.environment().rank, world = ddp.environment().world_size;
  const std::string id = ddp.broadcast(rank == 0 ? checkpoint_id() : std::string(), 0);
  const std::string name = path.substr(path.find_last_of('/') + 1), folder = fulgur::detail::parent_folder(path);
  const std::string shards_folder = name + ".shards/" + id;
  c10::impl::GenericList mine(c10::AnyType::get());
  c10::impl::GenericList files(c10::StringType::get());
  for (int r = 0; r < world; ++r) files.push_back(shards_folder + "/rank" + std::to_string(r) + ".pt");
  const c10::IValue manifest = manifest_of(state.to_ivalue(), mine, files);
  if (!mine.empty()) {
    fulgur::detail::make_directories(folder + "/" + shards_folder);
    StateDict part;
    part.insert("format", std::string(rank_file_format));
    part.insert("rank", static_cast<std::int64_t>(rank));
    part.insert("world_size", static_cast<std::int64_t>(world));
    part.insert("shards", mine);
    checkpoint::save(folder + "/" + files.get(static_cast<std::size_t>(rank)).toStringRef(), part);
  }
  ddp.barrier();  // every rank's shards are written
  if (rank == 0) {
    checkpoint::save(path, StateDict(manifest.toGenericDict()));
    for (const auto& other : fulgur::detail::subdirectories(folder + "/" + name + ".shards"))
      if (other != id) fulgur::detail::remove_tree(folder + "/" + name + ".shards/" + other);
  }
  ddp.barrier();  // the manifest is written
}

const checkpoint::Format& sharded_checkpoint_format() {
  static const ShardedFormat format;
  return format;
}

}  // namespace fulgur::distributed
