// The states of modules and optimizers in a checkpoint, and what a state that does not fit says
// (include/fulgur/checkpoint/io.hpp).
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <sstream>

#include "fulgur/checkpoint/format.hpp"
#include "fulgur/checkpoint/io.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::checkpoint {

namespace {
void collect_module_state(const torch::nn::Module& module, const std::string& prefix, StateDict& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) out.insert(prefix + item.key(), item.value().detach());
  for (const auto& item : module.named_buffers(/*recurse=*/false)) out.insert(prefix + item.key(), item.value().detach());
  for (const auto& child : module.named_children()) collect_module_state(*child.value(), prefix + child.key() + ".", out);
}

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (std::size_t i = 0; i < keys.size(); ++i) out += (i ? ", \"" : "\"") + keys[i] + "\"";
  return out;
}
}  // namespace

StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict out;
  collect_module_state(module, "", out);
  return out;
}

namespace {
/// The prefix P most keys of `longer` have where P + a key of `shorter` is one of them ("model." when
/// `longer` holds "model.0.weight" and `shorter` "0.weight"), and how many keys it explains; "" if none.
std::pair<std::string, std::size_t> common_prefix(const std::vector<std::string>& longer, const std::vector<std::string>& shorter) {
  const std::unordered_set<std::string> targets(shorter.begin(), shorter.end());
  std::vector<std::pair<std::string, std::size_t>> counts;
  for (const std::string& key : longer)
    for (std::size_t dot = key.find('.'); dot != std::string::npos && dot + 1 < key.size(); dot = key.find('.', dot + 1))
      if (targets.count(key.substr(dot + 1)) > 0) {
        const std::string prefix = key.substr(0, dot + 1);
        const auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == prefix; });
        if (it == counts.end()) counts.emplace_back(prefix, 1);
        else ++it->second;
      }
  if (counts.empty()) return {"", 0};
  return *std::max_element(counts.begin(), counts.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
}

/// "'model.' (4 keys), 'loss_fn.' (1 key)": what keys start with (up to their first dot).
std::string prefixes_of(const std::vector<std::string>& keys) {
  std::vector<std::pair<std::string, std::size_t>> prefixes;
  for (const std::string& key : keys) {
    const std::string prefix = key.substr(0, key.find('.') == std::string::npos ? key.size() : key.find('.') + 1);
    const auto it = std::find_if(prefixes.begin(), prefixes.end(), [&](const auto& p) { return p.first == prefix; });
    if (it == prefixes.end()) prefixes.emplace_back(prefix, 1);
    else ++it->second;
  }
  std::string out;
  for (std::size_t i = 0; i < prefixes.size() && i < 6; ++i)
    out += (i ? ", '" : "'") + prefixes[i].first + "' (" + std::to_string(prefixes[i].second) + ")";
  if (prefixes.size() > 6) out += ", ...";
  return out;
}

/// "Sequential" for torch::nn::SequentialImpl, as a user names it.
std::string module_name(const torch::nn::Module& module) {
  std::string name = module.name();
  if (name.starts_with("torch::nn::")) name = name.substr(11);
  if (name.size() > 4 && name.ends_with("Impl")) name.resize(name.size() - 4);
  return name;
}

std::string quoted_list_of(const std::vector<std::string>& keys) {
  constexpr std::size_t kShown = 40;
  if (keys.size() <= kShown) return quoted_list(keys);
  return quoted_list(std::vector<std::string>(keys.begin(), keys.begin() + kShown)) + ", and " +
         std::to_string(keys.size() - kShown) + " more";
}
}  // namespace

void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict) {
  if (const Format* format = format_of(state))  // a format's module state (stage 3's chunks): joined whole
    if (const auto whole = format->whole_module_state(state)) return load_module_state_dict(module, *whole, strict);
  const StateDict own = module_state_dict(module);
  std::vector<std::string> missing, unexpected, mismatched, own_keys, state_keys;
  for (const auto& item : own) {
    own_keys.push_back(item.key().toStringRef());
    if (!state.contains(own_keys.back())) missing.push_back(own_keys.back());
  }
  for (const auto& item : state) {
    if (!item.key().isString())
      throw CheckpointError("fulgur: the state_dict to load into " + module_name(module) + " has a key that is not a string (a " +
                            std::string(item.key().tagKind()) + "): it is not a module's weights.");
    state_keys.push_back(item.key().toStringRef());
    if (!own.contains(state_keys.back())) unexpected.push_back(state_keys.back());
  }
  for (const auto& item : own) {
    const std::string& key = item.key().toStringRef();
    if (!state.contains(key)) continue;
    const c10::IValue source = state.at(key);
    const at::Tensor target = item.value().toTensor();
    if (!source.isTensor() || source.toTensor().sizes() != target.sizes())
      mismatched.push_back(key + " (expected shape " + c10::str(target.sizes()) +
                           (source.isTensor() ? ", got " + c10::str(source.toTensor().sizes()) : ", got a non-tensor") + ")");
  }
  const bool differ = strict && (!missing.empty() || !unexpected.empty());
  if (!mismatched.empty() || differ) {
    // The first line keeps "does not fit the module": fit's resume names the checkpoint with it.
    std::string message = "fulgur: the state_dict does not fit the module " + module_name(module) +
                          ". Error(s) in loading state_dict for " + module_name(module) + ":";
    if (differ && !missing.empty()) message += "\n\tMissing key(s) in state_dict: " + quoted_list_of(missing) + ".";
    if (differ && !unexpected.empty()) message += "\n\tUnexpected key(s) in state_dict: " + quoted_list_of(unexpected) + ".";
    for (const auto& m : mismatched) message += "\n\tsize mismatch for " + m + ".";
    const auto [extra, taken_off] = common_prefix(unexpected, missing);  // the state_dict's keys have it
    const auto [lacking, put_on] = common_prefix(missing, unexpected);   // the module's keys have it
    if (differ && taken_off > 0 && taken_off >= put_on) {
      message += "\nThe state_dict's keys start with '" + extra + "' where the module's do not (a LightningModule "
                 "holding the network as self." + extra.substr(0, extra.size() - 1) + "): take it off with "
                 "fulgur::checkpoint::module_weights(checkpoint, \"" + extra + "\").";
    } else if (differ && put_on > 0) {
      message += "\nThe module's keys start with '" + lacking + "' where the state_dict's do not: load it into the "
                 "submodule that holds them (" + lacking.substr(0, lacking.size() - 1) + "), or build the module "
                 "as the network that was saved.";
    } else if (differ && missing.size() == own_keys.size() && !state_keys.empty()) {
      message += "\nNo key matches: the state_dict's keys start with " + prefixes_of(state_keys) +
                 ", the module's with " + (own_keys.empty() ? std::string("nothing (it has no parameters)") : prefixes_of(own_keys)) +
                 ". Is it this network's checkpoint? A prefix can be taken off with "
                 "fulgur::checkpoint::module_weights(checkpoint, prefix).";
    } else if (differ) {
      message += std::string("\nThe module ") +
                 (!missing.empty() && !unexpected.empty() ? "and the saved network have different layers"
                  : !missing.empty()                      ? "has layers the saved network lacks (the missing keys)"
                                                          : "lacks layers the saved network has (the unexpected keys)") +
                 ": build it as the network that was saved.";
    }
    if (!mismatched.empty())
      message += "\nThe saved network's layers have other sizes: build the module with the sizes it was trained "
                 "with (a Lightning checkpoint keeps them in 'hyper_parameters').";
    if (differ) message += "\nTo load only the keys that match, pass strict = false.";
    throw CheckpointError(message);
  }
  at::NoGradGuard no_grad;
  for (const auto& item : own) {
    const std::string& key = item.key().toStringRef();
    if (state.contains(key)) item.value().toTensor().copy_(state.at(key).toTensor());
  }
}

// LibTorch's optimizers keep their state in typed per-parameter objects that only its own
// archive format can round-trip exactly; the StateDict carries that archive as bytes.
StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream stream;
  archive.save_to(stream);
  const std::string bytes = stream.str();
  StateDict out;
  out.insert("format", std::string("libtorch-optimizer-archive"));
  out.insert("archive", at::from_blob(const_cast<char*>(bytes.data()), {static_cast<std::int64_t>(bytes.size())},
                                      at::kByte)
                            .clone());
  return out;
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state) {
  if (!state.contains("archive") && state.contains("state") && state.contains("param_groups"))
    throw CheckpointError(
        "fulgur: this optimizer state is a PyTorch (Python) optimizer's state_dict(), as Lightning checkpoints hold "
        "them in 'optimizer_states'; LibTorch's optimizers keep their state in another form, which fulgur does not "
        "convert. Load the checkpoint's weights (checkpoint::module_weights) and let the optimizer start afresh.");
  // A format's optimizer state (every rank's shards): joined into the optimizer's own parameters.
  if (const Format* format = format_of(state); format != nullptr && format->load_whole_optimizer_state(optimizer, state))
    return;
  if (!state.contains("archive") || !state.at("archive").isTensor())
    throw Error("fulgur: the optimizer state has no 'archive' entry; pass a state from optimizer_state_dict().");
  const at::Tensor bytes = state.at("archive").toTensor().contiguous();
  std::istringstream stream(std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel())));
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  optimizer.load(archive);
}

}  // namespace fulgur::checkpoint
