// CheckpointState's save and load (include/fulgur/checkpoint/stateful.hpp), through the trainer's
// detail::HostLink: the modules' and optimizers' states come from their strategy.
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "fulgur/checkpoint/stateful.hpp"
#include "fulgur/detail/describe.hpp"
#include "src/detail/error_text.hpp"

namespace fulgur {
namespace {

const c10::IValue& expect(bool ok, const c10::IValue& value, const std::string& where, const char* wanted) {
  if (!ok)
    throw CheckpointError("fulgur: " + where + " holds " + value.tagKind() + ", where the state has " + wanted +
                          "; load it into an object of that type, or leave it out of the state.");
  return value;
}

StateDict dict(const c10::IValue& value, const std::string& where) {
  if (!value.isGenericDict())
    throw CheckpointError("fulgur: " + where + " holds " + value.tagKind() + ", not the state of an object (a "
                          "dictionary); was it saved from a number, a string or a tensor?");
  return StateDict(value.toGenericDict());
}

}  // namespace

StateDict CheckpointState::collect(detail::HostLink& host) const {
  using Kind = Entry::Kind;
  StateDict out;
  for (const Entry& e : entries_) {
    void* o = e.object_;
    switch (e.kind_) {
      case Kind::module: out.insert(e.name_, host.module_state(*static_cast<torch::nn::Module*>(o)).to_ivalue()); break;
      case Kind::optimizer: out.insert(e.name_, host.optimizer_state(*static_cast<torch::optim::Optimizer*>(o)).to_ivalue()); break;
      case Kind::integer: out.insert(e.name_, *static_cast<std::int64_t*>(o)); break;
      case Kind::real: out.insert(e.name_, *static_cast<double*>(o)); break;
      case Kind::boolean: out.insert(e.name_, *static_cast<bool*>(o)); break;
      case Kind::text: out.insert(e.name_, *static_cast<std::string*>(o)); break;
      case Kind::tensor: out.insert(e.name_, *static_cast<at::Tensor*>(o)); break;
      case Kind::state: out.insert(e.name_, static_cast<StateDict*>(o)->to_ivalue()); break;
      case Kind::custom: out.insert(e.name_, e.custom_->save().to_ivalue()); break;
    }
  }
  return out;
}

StateDict CheckpointState::restore(detail::HostLink& host, StateDict checkpoint, const std::string& path,
                                   bool strict) const {
  using Kind = Entry::Kind;
  const std::string what = "checkpoint '" + path + "'";
  std::vector<std::string> missing;
  for (const Entry& e : entries_)
    if (!checkpoint.contains(e.name_)) missing.push_back(e.name_);
  if (strict && !missing.empty()) {
    std::string names, held;
    for (const auto& name : missing) names += (names.empty() ? "'" : ", '") + name + "'";
    for (const auto& item : checkpoint) held += (held.empty() ? "'" : ", '") + item.key().toStringRef() + "'";
    throw CheckpointError("fulgur: the requested state contains " + names + ", which " + what + " does not hold "
                          "(it holds " + (held.empty() ? std::string("nothing") : held) + "). To load the rest "
                          "anyway, pass strict = false.");
  }
  for (const Entry& e : entries_) {
    if (!checkpoint.contains(e.name_)) continue;
    const c10::IValue value = checkpoint.at(e.name_);
    const std::string where = what + "'s '" + e.name_ + "'";
    void* o = e.object_;
    switch (e.kind_) {
      case Kind::module: host.load_module_state(*static_cast<torch::nn::Module*>(o), dict(value, where), strict); break;
      case Kind::optimizer:
        try {
          host.load_optimizer_state(*static_cast<torch::optim::Optimizer*>(o), dict(value, where));
        } catch (const std::exception& failure) {
          throw CheckpointError("fulgur: " + where + ": " +
                                detail::without_fulgur_prefix(detail::first_line(failure.what())));
        }
        break;
      case Kind::integer: *static_cast<std::int64_t*>(o) = expect(value.isInt(), value, where, "an integer").toInt(); break;
      case Kind::real:
        *static_cast<double*>(o) = expect(value.isDouble() || value.isInt(), value, where, "a number").toScalar().toDouble();
        break;
      case Kind::boolean: *static_cast<bool*>(o) = expect(value.isBool(), value, where, "a bool").toBool(); break;
      case Kind::text: *static_cast<std::string*>(o) = expect(value.isString(), value, where, "a string").toStringRef(); break;
      case Kind::tensor: *static_cast<at::Tensor*>(o) = expect(value.isTensor(), value, where, "a tensor").toTensor(); break;
      case Kind::state: *static_cast<StateDict*>(o) = dict(value, where); break;
      case Kind::custom: e.custom_->load(dict(value, where)); break;
    }
    checkpoint.erase(e.name_);
  }
  return checkpoint;
}

void CheckpointState::check_names() const {
  for (std::size_t i = 0; i < entries_.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (entries_[i].name_ == entries_[j].name_)
        throw MisconfigurationError("fulgur: CheckpointState names '" + entries_[i].name_ + "' twice; give each "
                                    "object its own name.");
}

}  // namespace fulgur
