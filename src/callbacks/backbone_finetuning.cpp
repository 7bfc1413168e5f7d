// BackboneFinetuning (include/fulgur/callbacks/backbone_finetuning.hpp): lightning/pytorch/callbacks/
// finetuning.py (BaseFinetuning's freeze / make_trainable / filter_params, BackboneFinetuning's lrs).
#include "fulgur/callbacks/backbone_finetuning.hpp"
#include "src/callbacks/policy_names.hpp"

#include <torch/nn/modules/batchnorm.h>
#include <torch/optim/optimizer.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

#include "fulgur/errors.hpp"

namespace fulgur {
namespace {

torch::nn::BatchNormOptions* batch_norm_options(torch::nn::Module& m) {
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm1dImpl*>(&m)) return &bn->options;
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(&m)) return &bn->options;
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm3dImpl*>(&m)) return &bn->options;
  return nullptr;
}

// Lightning's flatten_modules: the leaves, and the modules holding parameters of their own.
std::vector<torch::nn::Module*> flatten_modules(torch::nn::Module& root) {
  std::vector<torch::nn::Module*> out;
  for (const auto& m : root.modules(/*include_self=*/true))
    if (m->children().empty() || !m->named_parameters(/*recurse=*/false).is_empty()) out.push_back(m.get());
  return out;
}

// Lightning turns a frozen BatchNorm's track_running_stats off: in training it normalizes by the
// batch and leaves its running statistics alone, in evaluation it uses them. LibTorch's BatchNorm
// with track_running_stats off would normalize by the batch in evaluation too, and in training still
// updates the statistics by the momentum; so a frozen one keeps track_running_stats and gets momentum
// 0 instead (x * 1 + batch * 0: the statistics unchanged). `momenta` keeps its own for make_trainable.
using Momenta = std::unordered_map<torch::nn::Module*, std::optional<double>>;

void freeze_module(torch::nn::Module& m, Momenta& momenta) {
  if (torch::nn::BatchNormOptions* bn = batch_norm_options(m);
      bn != nullptr && bn->track_running_stats() && !momenta.contains(&m)) {
    momenta[&m] = bn->momentum();
    bn->momentum(0.0);
  }
  for (auto& p : m.parameters(/*recurse=*/false)) p.set_requires_grad(false);
}

void make_trainable(torch::nn::Module& root, Momenta& momenta) {
  for (torch::nn::Module* m : flatten_modules(root)) {
    if (torch::nn::BatchNormOptions* bn = batch_norm_options(*m); bn != nullptr) {
      if (auto it = momenta.find(m); it != momenta.end()) {
        bn->momentum(it->second);
        momenta.erase(it);
      }
    }
    for (auto& p : m->parameters(/*recurse=*/false)) p.set_requires_grad(true);
  }
}

void freeze(torch::nn::Module& root, bool train_bn, Momenta& momenta) {
  for (torch::nn::Module* m : flatten_modules(root)) {
    if (batch_norm_options(*m) != nullptr && train_bn) make_trainable(*m, momenta);
    else freeze_module(*m, momenta);
  }
}

// Python's repr of a float: the shortest digits that read back, fixed or with an exponent as
// Python chooses (exponent below -4 or from 16 on), "x.0" for integral values.
std::string python_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, std::fabs(value), std::chars_format::scientific).ptr;
  const std::string text(buffer, end);
  const auto e = text.find('e');
  const int exponent = std::stoi(text.substr(e + 1));
  std::string digits;
  for (char c : text.substr(0, e))
    if (c != '.') digits += c;
  std::string out;
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += suffix;
  } else if (exponent < 0) {
    out = "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
  } else if (digits.size() <= static_cast<std::size_t>(exponent) + 1) {
    out = digits + std::string(static_cast<std::size_t>(exponent) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<std::size_t>(exponent) + 1) + "." + digits.substr(static_cast<std::size_t>(exponent) + 1);
  }
  return value < 0 ? "-" + out : out;
}

// Python's round(value, digits) (correctly rounded, as printf's %.*f), then its repr: Lightning's log line.
std::string rounded(double value, int digits) {
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return python_repr(std::strtod(buffer, nullptr));
}

}  // namespace

BackboneFinetuning::BackboneFinetuning(BackboneFinetuningOptions options) : options_(std::move(options)) {
  if (options_.unfreeze_backbone_at_epoch < 0)
    throw MisconfigurationError("fulgur: BackboneFinetuning: unfreeze_backbone_at_epoch must be >= 0, got " +
                                std::to_string(options_.unfreeze_backbone_at_epoch) + ".");
  if (!options_.lambda_func) throw MisconfigurationError("fulgur: BackboneFinetuning: lambda_func is empty; give a function of the epoch.");
  if (options_.backbone_initial_lr && !(*options_.backbone_initial_lr > 0.0))
    throw MisconfigurationError("fulgur: BackboneFinetuning: backbone_initial_lr must be > 0.");
  if (!options_.backbone_initial_lr && !(options_.backbone_initial_ratio_lr > 0.0))
    throw MisconfigurationError("fulgur: BackboneFinetuning: backbone_initial_ratio_lr must be > 0.");
  if (options_.rounding < 0 || options_.rounding > 300)
    throw MisconfigurationError("fulgur: BackboneFinetuning: rounding must be in [0, 300] digits, got " +
                                std::to_string(options_.rounding) + ".");
  if (options_.backbone.empty()) throw MisconfigurationError("fulgur: BackboneFinetuning: the backbone's name is empty.");
}

torch::nn::Module& BackboneFinetuning::backbone_of(torch::nn::Module& module) const {
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    if (item.key() == options_.backbone) return *item.value();
  if (options_.backbone == "backbone")
    throw MisconfigurationError("The LightningModule should have a nn.Module `backbone` attribute (fulgur: register "
                                "it as register_module(\"backbone\", ...) in " + module.name() +
                                ", or name the submodule to fine-tune in BackboneFinetuningOptions::backbone).");
  throw MisconfigurationError("fulgur: BackboneFinetuning: " + module.name() + " has no submodule named `" +
                              options_.backbone + "` (BackboneFinetuningOptions::backbone); give a path from its "
                              "named_modules().");
}

void BackboneFinetuning::setup(TrainerView& trainer, torch::nn::Module& module) {
  const std::string strategy = detail::strategy_name(trainer);
  // DDP's reducer lays its buckets out again when the backbone is unfrozen (every rank unfreezes at
  // the same epoch's start); ShardedStrategy<1> and <2> lay the added param group out in shards of
  // its own at its next backward or step (Lightning refuses DeepSpeed, whose stages these are named after).
  if (strategy == "fsdp")
    throw MisconfigurationError("fulgur: BackboneFinetuning cannot run under ShardedStrategy<3>: its parameters are "
                                "sharded in the wrapped units laid out at set-up, which a backbone unfrozen later "
                                "cannot join; use ShardedStrategy<2> (gradients and optimizer state sharded) or "
                                "DDPStrategy.");
  if (!strategy.empty() && strategy != "single_device" && strategy != "ddp" && strategy != "deepspeed_stage_1" &&
      strategy != "deepspeed_stage_2")
    throw MisconfigurationError("fulgur: BackboneFinetuning runs under the single-device strategy, DDP and "
                                "ShardedStrategy<1> and <2> only: under " + strategy + " the backbone's parameters, "
                                "frozen when the strategy sets up, would not join its optimizer's layout once "
                                "unfrozen; use DDPStrategy, or unfreeze by hand before fit.");
  freeze(backbone_of(module), options_.train_bn, frozen_momenta_);
  // A new fit starts afresh (a resumed one then reads its state from the checkpoint).
  previous_backbone_lr_.reset();
  last_epoch_ = -1;
  added_groups_.clear();
}

void BackboneFinetuning::on_fit_start(TrainerView& trainer) {
  // fulgur::optim's schedulers take the backbone's group as PyTorch's do (those that scale each group's
  // own lr take it in; those built on per-group lists fail at their next step, as PyTorch's). LibTorch's
  // ReduceLROnPlateauScheduler would read its per-group min_lrs past their end: refused here.
  for (const OptimizerConfig& config : trainer.optimizers())
    if (config.lr_scheduler.plateau() != nullptr)
      throw MisconfigurationError(
          "fulgur: BackboneFinetuning cannot run with LibTorch's torch::optim::ReduceLROnPlateauScheduler: it keeps "
          "a min_lr for each param group it was made with and reads past them once the backbone's group is added; "
          "use fulgur::optim::ReduceLROnPlateau (Python's: with one min_lr it takes the new group in).");
  if (trainer.max_epochs() >= 0 && options_.unfreeze_backbone_at_epoch >= trainer.max_epochs())
    trainer.warn("fulgur: BackboneFinetuning's unfreeze_backbone_at_epoch (" +
                 std::to_string(options_.unfreeze_backbone_at_epoch) + ") is not below max_epochs (" +
                 std::to_string(trainer.max_epochs()) + "): epochs are numbered from 0, so the backbone stays frozen "
                 "for the whole fit; lower unfreeze_backbone_at_epoch or raise max_epochs.");
}

void BackboneFinetuning::on_train_epoch_start(TrainerView& trainer, torch::nn::Module& module) {
  const std::int64_t epoch = trainer.current_epoch();
  if (epoch <= last_epoch_) return;  // a fit resumed inside this epoch: its start was applied already
  last_epoch_ = epoch;
  const auto optimizers = trainer.optimizers();
  if (added_groups_.size() < optimizers.size()) added_groups_.resize(optimizers.size());
  for (std::size_t i = 0; i < optimizers.size(); ++i) finetune(trainer, module, epoch, i);
}

void BackboneFinetuning::finetune(TrainerView& trainer, torch::nn::Module& module, std::int64_t epoch, std::size_t index) {
  torch::optim::Optimizer& optimizer = *trainer.optimizers()[index].optimizer;
  const double current_lr = optimizer.param_groups().front().options().get_lr();
  double backbone_lr = 0.0;
  if (epoch == options_.unfreeze_backbone_at_epoch) {
    backbone_lr = options_.backbone_initial_lr ? *options_.backbone_initial_lr : current_lr * options_.backbone_initial_ratio_lr;
    previous_backbone_lr_ = backbone_lr;
    torch::nn::Module& backbone = backbone_of(module);
    make_trainable(backbone, frozen_momenta_);
    // Lightning's filter_params and filter_on_optimizer: trainable, BatchNorm only with train_bn,
    // and not already in a group of this optimizer (by identity; Lightning compares values).
    std::unordered_set<const void*> present;
    for (const auto& group : optimizer.param_groups())
      for (const auto& p : group.params()) present.insert(p.unsafeGetTensorImpl());
    std::unordered_map<const void*, std::string> names;
    for (const auto& item : module.named_parameters()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
    std::vector<at::Tensor> params;
    std::vector<std::string> param_names;
    bool skipped = false;
    for (torch::nn::Module* m : flatten_modules(backbone)) {
      if (batch_norm_options(*m) != nullptr && !options_.train_bn) continue;
      for (const auto& p : m->parameters(/*recurse=*/false)) {
        if (!p.requires_grad()) continue;
        if (present.count(p.unsafeGetTensorImpl()) != 0) { skipped = true; continue; }
        params.push_back(p);
        param_names.push_back(names.count(p.unsafeGetTensorImpl()) != 0 ? names.at(p.unsafeGetTensorImpl()) : std::string());
      }
    }
    if (skipped)
      trainer.warn("The provided params to be frozen already exist within another group of this optimizer. Those "
                   "parameters will be skipped.\nHINT: Did you init your optimizer in `configure_optimizers` over "
                   "the parameters whose requires_grad() is true only?");
    if (!params.empty()) {
      torch::optim::OptimizerParamGroup group(params, optimizer.defaults().clone());
      group.options().set_lr(backbone_lr);  // params_lr / denom_lr, denom 1: an lr is always given
      optimizer.add_param_group(group);
      added_groups_[index] = std::move(param_names);
    }
  } else if (epoch > options_.unfreeze_backbone_at_epoch && previous_backbone_lr_) {
    backbone_lr = options_.lambda_func(epoch + 1) * *previous_backbone_lr_;
    if (options_.should_align && backbone_lr > current_lr) backbone_lr = current_lr;
    optimizer.param_groups().back().options().set_lr(backbone_lr);
    previous_backbone_lr_ = backbone_lr;
  } else {
    return;
  }
  if (options_.verbose)
    trainer.print("Current lr: " + rounded(current_lr, options_.rounding) + ", Backbone lr: " +
                  rounded(backbone_lr, options_.rounding));
}

void BackboneFinetuning::on_load_checkpoint(TrainerView& trainer, torch::nn::Module& module, const StateDict& checkpoint) {
  if (!checkpoint.contains("callbacks")) return;
  const StateDict callbacks(checkpoint.at("callbacks").toGenericDict());
  if (!callbacks.contains(state_key())) return;
  read_state(StateDict(callbacks.at(state_key()).toGenericDict()));
  std::unordered_map<std::string, at::Tensor> params;
  for (const auto& item : module.named_parameters()) params.emplace(item.key(), item.value());
  const auto optimizers = trainer.optimizers();
  bool unfrozen = false;
  for (std::size_t i = 0; i < added_groups_.size() && i < optimizers.size(); ++i) {
    if (added_groups_[i].empty()) continue;
    std::vector<at::Tensor> group_params;
    for (const std::string& name : added_groups_[i]) {
      auto found = params.find(name);
      if (found == params.end())
        throw CheckpointError("fulgur: BackboneFinetuning: the checkpoint's backbone param group holds `" + name +
                              "`, which the module does not have; resume with the module the run had.");
      group_params.push_back(found->second);
    }
    torch::optim::Optimizer& optimizer = *optimizers[i].optimizer;
    optimizer.add_param_group(torch::optim::OptimizerParamGroup(group_params, optimizer.defaults().clone()));
    unfrozen = true;
  }
  // Lightning restores the groups only; their parameters stayed frozen since setup. Here they train on.
  if (unfrozen) make_trainable(backbone_of(module), frozen_momenta_);
}

StateDict BackboneFinetuning::state_dict() const {
  StateDict s;
  s.insert("previous_backbone_lr", previous_backbone_lr_ ? c10::IValue(*previous_backbone_lr_) : c10::IValue());
  s.insert("last_epoch", last_epoch_);
  c10::impl::GenericList groups(c10::AnyType::get());
  for (const auto& names : added_groups_) {
    c10::impl::GenericList list(c10::StringType::get());
    for (const auto& name : names) list.push_back(c10::IValue(name));
    groups.push_back(c10::IValue(list));
  }
  s.insert("added_groups", c10::IValue(groups));
  return s;
}

void BackboneFinetuning::read_state(const StateDict& state) {
  const auto require = [&](const char* key) {
    if (!state.contains(key))
      throw CheckpointError(std::string("fulgur: the checkpoint's BackboneFinetuning state has no `") + key + "`.");
    return state.at(key);
  };
  const c10::IValue lr = require("previous_backbone_lr");
  previous_backbone_lr_ = lr.isNone() ? std::nullopt : std::optional<double>(lr.toDouble());
  last_epoch_ = require("last_epoch").toInt();
  added_groups_.clear();
  for (const c10::IValue& names : require("added_groups").toList()) {
    added_groups_.emplace_back();
    for (const c10::IValue& name : names.toList()) added_groups_.back().push_back(name.toStringRef());
  }
}

void BackboneFinetuning::load_state_dict(const StateDict& state) { read_state(state); }

}  // namespace fulgur
