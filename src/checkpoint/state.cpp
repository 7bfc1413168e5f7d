// Random generators, LR schedulers and the format stamp of a trainer checkpoint.
#include "fulgur/checkpoint/state.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "fulgur/checkpoint/stateful.hpp"
#include "fulgur/checkpoint/format.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::checkpoint {

namespace {

// LibTorch keeps its schedulers' counters protected or private and offers no state_dict. An
// explicit instantiation may name a private member (access is not checked there), which gives a
// pointer to it without touching LibTorch's headers.
template <class Tag, typename Tag::type Member>
struct expose {
  friend typename Tag::type member(Tag) { return Member; }
};
using Plateau = torch::optim::ReduceLROnPlateauScheduler;
/// Names one member of Class of type T (Id tells members of one type apart).
// The friend is deliberately not a template: expose<> defines it, once per tag.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnon-template-friend"
template <class Class, class T, int Id>
struct member_tag {
  using type = T Class::*;
  friend type member(member_tag);
};
#pragma GCC diagnostic pop
using step_count_tag = member_tag<torch::optim::LRScheduler, unsigned, 0>;
using best_tag = member_tag<Plateau, float, 0>;
using bad_epochs_tag = member_tag<Plateau, int, 0>;
using cooldown_counter_tag = member_tag<Plateau, int, 1>;
using last_epoch_tag = member_tag<Plateau, int, 2>;
template struct expose<step_count_tag, &torch::optim::LRScheduler::step_count_>;
template struct expose<best_tag, &Plateau::best>;
template struct expose<bad_epochs_tag, &Plateau::num_bad_epochs>;
template struct expose<cooldown_counter_tag, &Plateau::cooldown_counter>;
template struct expose<last_epoch_tag, &Plateau::last_epoch>;

int cuda_devices() {
  const auto& hooks = at::detail::getCUDAHooks();
  return hooks.hasCUDA() ? hooks.deviceCount() : 0;
}

}  // namespace

c10::IValue require(const StateDict& state, const std::string& key, const std::string& what) {
  if (!state.contains(key))
    throw CheckpointError("fulgur: " + what + " has no '" + key + "' entry; it was not written by this kind of "
                          "fulgur checkpoint (or was cut short). Pass a checkpoint written by Trainer::save_checkpoint.");
  return state.at(key);
}

StateDict require_dict(const StateDict& state, const std::string& key, const std::string& what) {
  const c10::IValue value = require(state, key, what);
  if (!value.isGenericDict())
    throw CheckpointError("fulgur: " + what + "'s '" + key + "' entry is a " + value.tagKind() + ", not a dictionary.");
  return StateDict(value.toGenericDict());
}

std::int64_t require_int(const StateDict& state, const std::string& key, const std::string& what) {
  const c10::IValue value = require(state, key, what);
  if (!value.isInt())
    throw CheckpointError("fulgur: " + what + "'s '" + key + "' entry is a " + value.tagKind() + ", not an integer.");
  return value.toInt();
}

StateDict random_state() {
  StateDict out;
  out.insert("cpu", at::detail::getDefaultCPUGenerator().get_state());
  c10::impl::GenericList cuda(c10::TensorType::get());
  for (int i = 0, n = cuda_devices(); i < n; ++i)
    cuda.push_back(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i))).get_state());
  out.insert("cuda", cuda);
  return out;
}

void set_random_state(const StateDict& state, const std::string& what) {
  const c10::IValue cpu = require(state, "cpu", what + "'s random state");
  try {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(cpu.toTensor());
    if (!state.contains("cuda")) return;
    const auto cuda = state.at("cuda").toList();
    const int here = cuda_devices();
    for (std::size_t i = 0; i < cuda.size() && static_cast<int>(i) < here; ++i) {
      at::Generator device_generator =
          at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
      device_generator.set_state(cuda.get(i).toTensor());
    }
  } catch (const c10::Error& e) {
    throw CheckpointError("fulgur: " + what + "'s random state cannot be restored (" +
                          std::string(e.what_without_backtrace()).substr(0, 200) + ").");
  }
}

StateDict scheduler_state(const AnyLRScheduler& scheduler) {
  if (auto* s = scheduler.exact()) return s->state_dict();  // Python's keys and values
  if (auto* p = scheduler.exact_plateau()) return p->state_dict();
  StateDict out;
  if (auto* s = scheduler.stepwise()) {
    const unsigned count = s->*member(step_count_tag{});
    out.insert("_step_count", static_cast<std::int64_t>(count));
    out.insert("last_epoch", static_cast<std::int64_t>(count) - 1);  // PyTorch's: steps taken, its constructor's included
  } else if (auto* p = scheduler.plateau()) {
    out.insert("best", static_cast<double>(p->*member(best_tag{})));
    out.insert("num_bad_epochs", static_cast<std::int64_t>(p->*member(bad_epochs_tag{})));
    out.insert("cooldown_counter", static_cast<std::int64_t>(p->*member(cooldown_counter_tag{})));
    out.insert("last_epoch", static_cast<std::int64_t>(p->*member(last_epoch_tag{})));
  }
  return out;
}

void load_scheduler_state(AnyLRScheduler& scheduler, const StateDict& state, const std::string& what) {
  try {
    if (auto* s = scheduler.exact()) return s->load_state_dict(state);
    if (auto* p = scheduler.exact_plateau()) return p->load_state_dict(state);
  } catch (const CheckpointError& e) {
    throw CheckpointError(std::string(e.what()) + " (" + what + ")");
  }
  if (auto* s = scheduler.stepwise()) {
    s->*member(step_count_tag{}) = static_cast<unsigned>(require_int(state, "_step_count", what));
  } else if (auto* p = scheduler.plateau()) {
    const c10::IValue best = require(state, "best", what);
    if (!best.isDouble()) throw CheckpointError("fulgur: " + what + "'s 'best' is not a number.");
    p->*member(best_tag{}) = static_cast<float>(best.toDouble());
    p->*member(bad_epochs_tag{}) = static_cast<int>(require_int(state, "num_bad_epochs", what));
    p->*member(cooldown_counter_tag{}) = static_cast<int>(require_int(state, "cooldown_counter", what));
    p->*member(last_epoch_tag{}) = static_cast<int>(require_int(state, "last_epoch", what));
  }
}

namespace {
/// What the keys start with (up to their first dot), with how many keys start so, in order.
std::vector<std::pair<std::string, std::size_t>> key_prefixes(const StateDict& weights) {
  std::vector<std::pair<std::string, std::size_t>> prefixes;
  for (const auto& item : weights) {
    const std::string& key = item.key().toStringRef();
    const std::size_t dot = key.find('.');
    const std::string prefix = dot == std::string::npos ? key : key.substr(0, dot + 1);
    const auto it = std::find_if(prefixes.begin(), prefixes.end(), [&](const auto& p) { return p.first == prefix; });
    if (it == prefixes.end()) prefixes.emplace_back(prefix, 1);
    else ++it->second;
  }
  return prefixes;
}

/// "'model.' (4 keys), 'loss_fn.' (1 key)"
std::string describe(const std::vector<std::pair<std::string, std::size_t>>& prefixes) {
  std::string out;
  for (std::size_t i = 0; i < prefixes.size() && i < 8; ++i)
    out += (i ? ", '" : "'") + prefixes[i].first + "' (" + std::to_string(prefixes[i].second) +
           (prefixes[i].second == 1 ? " key)" : " keys)");
  if (prefixes.size() > 8) out += ", and " + std::to_string(prefixes.size() - 8) + " more";
  return out;
}
}  // namespace

StateDict module_weights(const StateDict& checkpoint, const std::string& prefix) {
  StateDict weights = checkpoint;
  if (checkpoint.contains("state_dict")) {
    const c10::IValue state = checkpoint.at("state_dict");
    if (!state.isGenericDict())
      throw CheckpointError("fulgur: the checkpoint's 'state_dict' entry is a " + std::string(state.tagKind()) +
                            ", not a dictionary of tensors; pass a checkpoint whose 'state_dict' holds the weights.");
    weights = StateDict(state.toGenericDict());
    if (const Format* format = format_of(weights))  // a format's module state (stage 3's chunks): joined whole
      if (const auto whole = format->whole_module_state(weights)) weights = *whole;
  }
  for (const auto& item : weights)
    if (!item.key().isString())
      throw CheckpointError("fulgur: the checkpoint's state_dict has a key that is not a string (a " +
                            std::string(item.key().tagKind()) + "), so it holds no module's weights.");
  if (prefix.empty()) return weights;
  const auto any_starts = [&](const std::string& p) {
    return std::any_of(weights.begin(), weights.end(), [&](const auto& item) { return item.key().toStringRef().starts_with(p); });
  };
  // "model" means the submodule model: its keys are "model.0.weight", not "model_ema.0.weight".
  const std::string p = prefix.back() != '.' && any_starts(prefix + ".") ? prefix + "." : prefix;
  if (!any_starts(p)) {
    if (weights.empty()) throw CheckpointError("fulgur: the checkpoint's state_dict is empty: it holds no weights.");
    const auto prefixes = key_prefixes(weights);
    const auto most = std::max_element(prefixes.begin(), prefixes.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    throw CheckpointError("fulgur: no key of the checkpoint's state_dict starts with '" + p + "': its " +
                          std::to_string(weights.size()) + " keys start with " + describe(prefixes) +
                          ". Pass the prefix of the network's keys (module_weights(checkpoint, \"" + most->first +
                          "\")), or none to take the keys as they are.");
  }
  StateDict out;
  for (const auto& item : weights) {
    const std::string& key = item.key().toStringRef();
    if (key.starts_with(p)) out.insert(key.substr(p.size()), item.value());
  }
  return out;
}

StateDict stamp(const std::string& combination, int world_size) {
  StateDict out;
  out.insert("format_version", format_version);
  out.insert("fulgur_version", std::string(fulgur_version));
  out.insert("torch_version", std::string(TORCH_VERSION));
  out.insert("combination", combination);
  out.insert("world_size", static_cast<std::int64_t>(world_size));
  return out;
}

void check_format(const StateDict& checkpoint, const std::string& what) {
  if (!checkpoint.contains("fulgur") || !checkpoint.at("fulgur").isGenericDict()) {
    const bool lightning = checkpoint.contains("pytorch-lightning_version");
    throw CheckpointError("fulgur: " + what + " is not a fulgur training checkpoint" +
                          (lightning ? " (it was written by Lightning)" : "") +
                          ", so training cannot resume from it. To take its weights only, load them with "
                          "fulgur::checkpoint::load_module_state_dict(module, fulgur::checkpoint::module_weights(checkpoint" +
                          (lightning ? ", \"model.\"" : "") + ")) before fit.");
  }
  const StateDict stamp(checkpoint.at("fulgur").toGenericDict());
  const std::int64_t version = require_int(stamp, "format_version", what + "'s 'fulgur' entry");
  if (version > format_version)
    throw CheckpointError("fulgur: " + what + " has checkpoint format " + std::to_string(version) +
                          ", newer than this fulgur reads (" + std::to_string(format_version) +
                          "); it was written by a newer fulgur: upgrade fulgur to resume from it.");
}

}  // namespace fulgur::checkpoint

namespace fulgur::detail {

void check_optimizer_state_shapes(torch::optim::Optimizer& optimizer) {
  std::size_t index = 0;
  for (auto& group : optimizer.param_groups())
    for (const at::Tensor& p : group.params()) {
      const auto found = optimizer.state().find(p.unsafeGetTensorImpl());
      ++index;
      if (found == optimizer.state().end()) continue;
      std::vector<at::Tensor> buffers;
      const torch::optim::OptimizerParamState* state = found->second.get();
      if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state))
        buffers = {adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()};
      else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state))
        buffers = {adamw->exp_avg(), adamw->exp_avg_sq(), adamw->max_exp_avg_sq()};
      else if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state))
        buffers = {sgd->momentum_buffer()};
      else if (const auto* rms = dynamic_cast<const torch::optim::RMSpropParamState*>(state))
        buffers = {rms->square_avg(), rms->momentum_buffer(), rms->grad_avg()};
      else if (const auto* adagrad = dynamic_cast<const torch::optim::AdagradParamState*>(state))
        buffers = {adagrad->sum()};
      for (const at::Tensor& buffer : buffers)
        if (buffer.defined() && buffer.sizes() != p.sizes())
          throw CheckpointError("fulgur: the optimizer state does not fit the optimizer's parameters: parameter " +
                                std::to_string(index - 1) + " has shape " + c10::str(p.sizes()) + ", its state " +
                                c10::str(buffer.sizes()) + "; load the state of an optimizer over the same "
                                "parameters (the same model).");
    }
}

}  // namespace fulgur::detail
