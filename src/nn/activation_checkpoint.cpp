// activation_checkpoint's autograd node: the forward's states kept, fn recomputed in backward.
#include "fulgur/nn/activation_checkpoint.hpp"

#include <ATen/SequenceNumber.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/Context.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

#include "fulgur/errors.hpp"
#include "fulgur/precision/guards.hpp"

namespace fulgur::detail {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

/// What the recomputation must see as the forward saw it: the RNG states (CPU; CUDA for the devices
/// of the inputs, as Python's get_device_states) and the autocast state of each device type.
struct ForwardState {
  at::Tensor cpu_rng;
  std::vector<std::pair<at::Device, at::Tensor>> device_rng;
  struct Autocast {
    c10::DeviceType type;
    bool enabled;
    at::ScalarType dtype;
  };
  std::vector<Autocast> autocast;
  bool autocast_cache = true;

  static at::Tensor state_of(at::Generator generator) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }
  static void set_state(at::Generator generator, const at::Tensor& state) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }

  explicit ForwardState(const std::vector<at::Tensor>& inputs) {
    cpu_rng = state_of(at::detail::getDefaultCPUGenerator());
    for (const at::Tensor& t : inputs) {
      if (!t.defined() || !t.is_cuda()) continue;
      bool seen = false;
      for (const auto& [device, state] : device_rng) seen = seen || device == t.device();
      if (!seen) device_rng.emplace_back(t.device(), state_of(at::globalContext().defaultGenerator(t.device())));
    }
    autocast.push_back({c10::DeviceType::CPU, at::autocast::is_autocast_enabled(c10::DeviceType::CPU),
                        at::autocast::get_autocast_dtype(c10::DeviceType::CPU)});
    if (at::globalContext().hasCUDA())
      autocast.push_back({c10::DeviceType::CUDA, at::autocast::is_autocast_enabled(c10::DeviceType::CUDA),
                          at::autocast::get_autocast_dtype(c10::DeviceType::CUDA)});
    autocast_cache = at::autocast::is_autocast_cache_enabled();
  }
};

/// For the recomputation: the forward's RNG states set, then the present ones put back (Python's
/// torch.random.fork_rng), and the forward's autocast regions opened (Python's torch.autocast).
class Restored {
 public:
  explicit Restored(const ForwardState& forward) : grad_(true) {
    cpu_rng_ = ForwardState::state_of(at::detail::getDefaultCPUGenerator());
    for (const auto& [device, state] : forward.device_rng)
      device_rng_.emplace_back(device, ForwardState::state_of(at::globalContext().defaultGenerator(device)));
    ForwardState::set_state(at::detail::getDefaultCPUGenerator(), forward.cpu_rng);
    for (const auto& [device, state] : forward.device_rng)
      ForwardState::set_state(at::globalContext().defaultGenerator(device), state);
    for (const auto& a : forward.autocast) autocast_.emplace_back(a.type, a.dtype, a.enabled, forward.autocast_cache);
  }
  ~Restored() {
    while (!autocast_.empty()) autocast_.pop_back();  // closed in reverse: each puts back the cache flag it found
    ForwardState::set_state(at::detail::getDefaultCPUGenerator(), cpu_rng_);
    for (const auto& [device, state] : device_rng_) ForwardState::set_state(at::globalContext().defaultGenerator(device), state);
  }
  Restored(const Restored&) = delete;
  Restored& operator=(const Restored&) = delete;

 private:
  torch::autograd::AutoGradMode grad_;
  at::Tensor cpu_rng_;
  std::vector<std::pair<at::Device, at::Tensor>> device_rng_;
  std::deque<AutocastGuard> autocast_;
};

std::vector<at::Tensor> leaves_like(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> leaves;
  leaves.reserve(inputs.size());
  for (const at::Tensor& t : inputs) leaves.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);
  return leaves;
}

/// The node: its inputs (autograd's "next edges") are fn's tensor inputs, then the parameters.
struct ActivationCheckpointBackward : Node {
  CheckpointBody body;
  std::optional<ForwardState> forward;
  std::vector<torch::autograd::SavedVariable> saved_inputs;
  std::vector<bool> input_requires_grad;
  std::vector<at::Tensor> params;
  struct Shape {
    at::ScalarType dtype;
    std::vector<std::int64_t> sizes;
  };
  std::vector<Shape> output_shapes;  // Python's determinism check (shapes and dtypes)

  std::string name() const override { return "fulgur::ActivationCheckpointBackward"; }
  void release_variables() override {
    saved_inputs.clear();
    body = nullptr;
  }

  variable_list apply(variable_list&& grads) override {
    // The engine runs a create_graph backward with grad mode on; the gradients below are first-order.
    TORCH_CHECK(!torch::autograd::GradMode::is_enabled(),
                "fulgur::activation_checkpoint: a backward with create_graph=true (a double backward) reached a "
                "checkpointed function, whose gradients are first-order only; run that part without "
                "activation_checkpoint");
    TORCH_CHECK(body, "fulgur::activation_checkpoint: backward through the checkpointed function a second time: its "
                      "inputs were released after the first (use retain_graph=true in the first backward)");
    std::vector<at::Tensor> inputs;
    for (const auto& saved : saved_inputs) inputs.push_back(saved.unpack(shared_from_this()));
    const std::vector<at::Tensor> leaves = leaves_like(inputs);
    std::vector<at::Tensor> outputs;
    {
      Restored restored(*forward);
      outputs = body(leaves);
    }
    if (outputs.size() != output_shapes.size())
      throw Error("fulgur::activation_checkpoint: the recomputation returned " + std::to_string(outputs.size()) +
                  " tensors, the forward " + std::to_string(output_shapes.size()) +
                  ": fn must compute the same thing when it runs again in backward");
    std::vector<at::Tensor> differentiable, grad_outputs;
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const at::Tensor& out = outputs[k];
      if (out.defined() && (out.scalar_type() != output_shapes[k].dtype || out.sizes() != output_shapes[k].sizes))
        throw Error("fulgur::activation_checkpoint: output " + std::to_string(k) +
                    " of the recomputation differs in shape or dtype from the forward's: fn must compute the same "
                    "thing when it runs again in backward (torch.utils.checkpoint's determinism check)");
      if (out.defined() && out.requires_grad() && grads[k].defined()) {
        differentiable.push_back(out);
        grad_outputs.push_back(grads[k]);
      }
    }
    variable_list result(inputs.size() + params.size());
    std::vector<at::Tensor> wrt;
    std::vector<std::size_t> slot;
    for (std::size_t i = 0; i < leaves.size(); ++i)
      if (input_requires_grad[i] && should_compute_output(i)) wrt.push_back(leaves[i]), slot.push_back(i);
    for (std::size_t j = 0; j < params.size(); ++j)
      if (should_compute_output(inputs.size() + j)) wrt.push_back(params[j]), slot.push_back(inputs.size() + j);
    if (differentiable.empty() || wrt.empty()) return result;
    // The gradients are returned, not accumulated here: the parameters' own accumulation (and the
    // strategies' hooks on it) happens in the outer backward, as without checkpointing.
    const variable_list computed = torch::autograd::grad(differentiable, wrt, grad_outputs, /*retain_graph=*/false,
                                                         /*create_graph=*/false, /*allow_unused=*/true);
    for (std::size_t k = 0; k < computed.size(); ++k) result[slot[k]] = computed[k];
    return result;
  }
};

/// The leaves fn's graph reaches (the parameters it read), other than its inputs' own leaves.
std::vector<at::Tensor> parameters_read(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& leaves,
                                        std::uint64_t first_sequence_nr) {
  std::unordered_set<const void*> inputs;
  for (const at::Tensor& t : leaves)
    if (t.defined()) inputs.insert(t.unsafeGetTensorImpl());
  std::vector<at::Tensor> params;
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  for (const at::Tensor& out : outputs)
    if (out.defined() && out.requires_grad()) stack.push_back(torch::autograd::impl::gradient_edge(out).function.get());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (auto* accumulate = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      if (!inputs.contains(accumulate->variable.unsafeGetTensorImpl())) params.push_back(accumulate->variable);
      continue;
    }
    if (node->sequence_nr() < first_sequence_nr)
      throw MisconfigurationError(
          "fulgur::activation_checkpoint: fn reads a tensor that requires grad, is not one of its arguments and was "
          "computed before it (its grad_fn is " + node->name() +
          "): pass that tensor to activation_checkpoint as an argument, so that its gradient can flow back");
    for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
  }
  return params;
}

}  // namespace

std::vector<at::Tensor> checkpoint_tensors(CheckpointBody body, std::vector<at::Tensor> inputs,
                                           const std::vector<at::Tensor>* given_params) {
  if (!torch::autograd::GradMode::is_enabled()) return body(inputs);
  ForwardState state(inputs);
  const std::vector<at::Tensor> leaves = leaves_like(inputs);
  std::vector<at::Tensor> outputs, params;
  if (given_params != nullptr) {
    params = *given_params;
    torch::autograd::AutoGradMode no_graph(false);
    outputs = body(leaves);
  } else {
    // The forward with its graph, to see which parameters fn reads; the graph (the activations) goes
    // when `outputs` are replaced by their detached values below.
    const std::uint64_t first = at::sequence_number::peek();
    outputs = body(leaves);
    params = parameters_read(outputs, leaves, first);
  }
  // Which outputs get a gradient edge: with the forward's graph, those that required grad in it (as
  // Python's, an output that depends on nothing differentiable does not require grad); without, every
  // floating-point one.
  std::vector<bool> differentiable(outputs.size());
  for (std::size_t k = 0; k < outputs.size(); ++k)
    differentiable[k] = outputs[k].defined() && torch::autograd::isDifferentiableType(outputs[k].scalar_type()) &&
                        (given_params != nullptr || outputs[k].requires_grad());
  bool any_input = false;
  for (const at::Tensor& t : inputs) any_input = any_input || (t.defined() && t.requires_grad());
  for (at::Tensor& out : outputs)
    if (out.defined()) out = out.detach();
  if (!any_input && params.empty()) return outputs;  // nothing to differentiate: as fn under no_grad

  std::shared_ptr<ActivationCheckpointBackward> node(new ActivationCheckpointBackward(), torch::autograd::deleteNode);
  std::vector<at::Tensor> edges = inputs;
  edges.insert(edges.end(), params.begin(), params.end());
  node->set_next_edges(torch::autograd::collect_next_edges(edges));
  node->body = std::move(body);
  node->forward.emplace(std::move(state));
  for (const at::Tensor& t : inputs) {
    node->saved_inputs.emplace_back(t, /*is_output=*/false);
    node->input_requires_grad.push_back(t.defined() && t.requires_grad());
  }
  node->params = std::move(params);
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    at::Tensor& out = outputs[k];
    node->output_shapes.push_back({out.defined() ? out.scalar_type() : at::kFloat,
                                   out.defined() ? out.sizes().vec() : std::vector<std::int64_t>{}});
    if (differentiable[k])
      torch::autograd::set_history(out, node);
    else
      node->add_input_metadata(Node::undefined_input());
  }
  return outputs;
}

}  // namespace fulgur::detail
