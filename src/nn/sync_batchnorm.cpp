// fulgur::nn::SyncBatchNorm (include/fulgur/nn/sync_batchnorm.hpp). torch's CUDA kernels
// (batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_backward_reduce/elemt) have no
// CPU version: their math is written here with plain ops, in torch's order of reductions.
#include "fulgur/nn/sync_batchnorm.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

#include "fulgur/errors.hpp"

namespace fulgur::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Carries the group from forward to backward in the autograd context (an IValue capsule).
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(std::shared_ptr<BatchNormSyncGroup> g) : group(std::move(g)) {}
  std::shared_ptr<BatchNormSyncGroup> group;
};

std::vector<int64_t> reduced_dims(const at::Tensor& x) {  // every dimension but the channels
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}
std::vector<int64_t> channel_shape(const at::Tensor& x) {  // (1, C, 1, ...)
  std::vector<int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape[1] = x.size(1);
  return shape;
}

// torch.nn.modules._functions.SyncBatchNorm, on any device.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static variable_list forward(AutogradContext* ctx, at::Tensor input, at::Tensor weight, at::Tensor bias,
                               at::Tensor running_mean, at::Tensor running_var, double eps, double momentum,
                               std::shared_ptr<BatchNormSyncGroup> group) {
    const at::Tensor x = input.contiguous();
    const int64_t channels = x.size(1);
    for (at::Tensor* t : {&weight, &bias, &running_mean, &running_var})
      if (t->numel() == 0) *t = at::Tensor();  // absent (see absent_as_empty)
    // Statistics in at least float32, as torch's accumulate type for half and bfloat16.
    const at::ScalarType stats_type = at::isReducedFloatingType(x.scalar_type()) ? at::kFloat : x.scalar_type();
    const auto dims = reduced_dims(x);
    const auto shape = channel_shape(x);

    at::Tensor combined;  // this rank's (mean, invstd, count): one all_gather
    if (x.numel() > 0) {
      const at::Tensor xs = x.to(stats_type);
      const at::Tensor local_mean = xs.mean(dims);
      const at::Tensor local_invstd = (xs.var(dims, /*unbiased=*/false) + eps).rsqrt();
      combined = at::cat({local_mean, local_invstd,
                          at::full({1}, static_cast<double>(x.numel() / channels), local_mean.options())});
    } else {
      combined = at::zeros({2 * channels + 1}, x.options().dtype(stats_type));
    }
    const at::Tensor all = group->all_gather(combined);  // (world, 2C + 1)
    const at::Tensor mean_all = all.narrow(1, 0, channels);
    const at::Tensor invstd_all = all.narrow(1, channels, channels);
    const at::Tensor count_all = all.narrow(1, 2 * channels, 1);  // (world, 1); ranks with 0 drop out

    // batch_norm_gather_stats_with_counts: Chan's combination of the ranks' means and variances.
    const at::Tensor count = count_all.sum();
    const at::Tensor var_all = at::where(count_all > 0, invstd_all.pow(-2) - eps, at::zeros_like(invstd_all));
    const at::Tensor mean = (mean_all * count_all).sum(0) / count;
    const at::Tensor m2 = (var_all * count_all).sum(0) + (count_all * (mean_all - mean).pow(2)).sum(0);
    const at::Tensor invstd = (m2 / count + eps).rsqrt();
    if (running_mean.defined()) {
      running_mean.copy_(mean * momentum + running_mean * (1 - momentum));
      running_var.copy_((m2 / (count - 1)) * momentum + running_var * (1 - momentum));  // unbiased
    }

    // batch_norm_elemt
    at::Tensor scale = weight.defined() ? invstd * weight.to(stats_type) : invstd;
    at::Tensor output = (x - mean.view(shape)) * scale.view(shape);
    if (bias.defined()) output = output + bias.to(stats_type).view(shape);

    ctx->save_for_backward({x, weight, mean, invstd, count});
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(std::move(group)));
    return {output.to(x.scalar_type())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const at::Tensor& count = saved[4];
    auto& group = static_cast<GroupCapsule&>(*ctx->saved_data["group"].toCapsule()).group;
    const int64_t channels = x.size(1);
    const bool input_grad = ctx->needs_input_grad(0);
    at::Tensor grad_input, grad_weight, grad_bias;

    if (x.numel() > 0) {
      const auto dims = reduced_dims(x);
      const auto shape = channel_shape(x);
      const at::Tensor dy = grad_outputs[0].contiguous().to(mean.scalar_type());
      const at::Tensor xmu = x.to(mean.scalar_type()) - mean.view(shape);
      // batch_norm_backward_reduce (this rank's part)
      at::Tensor sum_dy = dy.sum(dims);
      at::Tensor sum_dy_xmu = (dy * xmu).sum(dims);
      if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
      if (weight.defined() && ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
      if (input_grad) {
        const at::Tensor combined = at::cat({sum_dy, sum_dy_xmu});
        group->all_reduce_sum(combined);
        sum_dy = combined.narrow(0, 0, channels);
        sum_dy_xmu = combined.narrow(0, channels, channels);
        // batch_norm_backward_elemt
        const at::Tensor mean_dy = sum_dy / count;
        const at::Tensor mean_dy_xmu = sum_dy_xmu / count;
        const at::Tensor w = weight.defined() ? weight.to(mean.scalar_type()) : at::ones_like(invstd);
        grad_input = ((dy - mean_dy.view(shape) - xmu * (invstd * invstd * mean_dy_xmu).view(shape)) *
                      (w * invstd).view(shape))
                         .to(x.scalar_type());
      }
    } else if (input_grad) {  // the other ranks all-reduce: take part with zeros
      group->all_reduce_sum(at::zeros({2 * channels}, mean.options()));
      grad_input = at::zeros_like(x);
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Function::apply needs defined tensors: an absent weight or buffer travels as a 0-element one
// (never a real one: the channels are at least one).
at::Tensor absent_as_empty(const at::Tensor& tensor, const at::Tensor& input) {
  return tensor.defined() ? tensor : at::empty({0}, input.options());
}

template <class... Impl>
bool is_any_of(const torch::nn::Module& module) {
  return (... || (dynamic_cast<const Impl*>(&module) != nullptr));
}
bool is_batchnorm(const torch::nn::Module& module) {
  return is_any_of<torch::nn::BatchNorm1dImpl, torch::nn::BatchNorm2dImpl, torch::nn::BatchNorm3dImpl>(module);
}

// A SyncBatchNorm holding `bn`'s tensors, options and mode.
template <class BatchNormImpl>
std::shared_ptr<SyncBatchNormImpl> make_sync(const BatchNormImpl& bn) {
  auto sync = std::make_shared<SyncBatchNormImpl>(bn.options, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                                  bn.num_batches_tracked);
  sync->train(bn.is_training());
  return sync;
}
std::shared_ptr<SyncBatchNormImpl> make_sync(const torch::nn::Module& module) {
  if (auto* bn = dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module)) return make_sync(*bn);
  if (auto* bn = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module)) return make_sync(*bn);
  return make_sync(dynamic_cast<const torch::nn::BatchNorm3dImpl&>(module));
}

struct Replacement {
  torch::nn::Module* parent;
  std::string name;    // in the parent's registry
  std::string path;    // from the root, for messages
  std::shared_ptr<torch::nn::Module> old_child;
};

void collect(torch::nn::Module& module, const std::string& prefix, std::vector<Replacement>& out) {
  for (const auto& item : module.named_children()) {
    const std::string path = prefix.empty() ? item.key() : prefix + "." + item.key();
    if (is_batchnorm(*item.value())) out.push_back({&module, item.key(), path, item.value()});
    else collect(*item.value(), path, out);
  }
}

bool is_container(const torch::nn::Module& module) {
  return is_any_of<torch::nn::SequentialImpl, torch::nn::ModuleListImpl, torch::nn::ModuleDictImpl>(module);
}

// Puts `sync` where the container itself holds `old` (what its forward or indexing uses).
void replace_in_container(torch::nn::Module& parent, const std::shared_ptr<torch::nn::Module>& old,
                          const std::shared_ptr<SyncBatchNormImpl>& sync) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    for (auto& any : *seq)
      if (any.ptr() == old) any = torch::nn::AnyModule(sync);
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    for (auto& held : *list)
      if (held == old) held = sync;
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    for (auto& item : *dict)
      if (item.value() == old) item.value() = sync;
  }
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const SyncBatchNormOptions& options_) : options(options_) { reset(); }

SyncBatchNormImpl::SyncBatchNormImpl(const SyncBatchNormOptions& options_, const at::Tensor& weight_,
                                     const at::Tensor& bias_, const at::Tensor& running_mean_,
                                     const at::Tensor& running_var_, const at::Tensor& num_batches_tracked_)
    : options(options_) {
  register_state(weight_, bias_, running_mean_, running_var_, num_batches_tracked_);
}

void SyncBatchNormImpl::register_state(const at::Tensor& weight_, const at::Tensor& bias_,
                                       const at::Tensor& running_mean_, const at::Tensor& running_var_,
                                       const at::Tensor& num_batches_tracked_) {
  weight = register_parameter("weight", weight_, weight_.defined() && weight_.requires_grad());
  bias = register_parameter("bias", bias_, bias_.defined() && bias_.requires_grad());
  running_mean = register_buffer("running_mean", running_mean_);
  running_var = register_buffer("running_var", running_var_);
  num_batches_tracked = register_buffer("num_batches_tracked", num_batches_tracked_);
}

void SyncBatchNormImpl::reset() {
  const int64_t n = options.num_features();
  const bool affine = options.affine(), track = options.track_running_stats();
  register_state(affine ? at::empty({n}).requires_grad_() : at::Tensor(),
                 affine ? at::empty({n}).requires_grad_() : at::Tensor(), track ? at::zeros({n}) : at::Tensor(),
                 track ? at::ones({n}) : at::Tensor(), track ? at::zeros({}, at::kLong) : at::Tensor());
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  at::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  at::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

void SyncBatchNormImpl::check_input(const at::Tensor& input) const {
  if (input.dim() < 2)
    throw MisconfigurationError("SyncBatchNorm: expected at least 2D input (got " + std::to_string(input.dim()) +
                                "D input)");
  if (input.size(1) == 0) throw MisconfigurationError("SyncBatchNorm number of input channels should be non-zero");
  if (input.size(1) != options.num_features())
    throw MisconfigurationError("SyncBatchNorm: the input has " + std::to_string(input.size(1)) +
                                " channels (dimension 1) but the module was built for num_features=" +
                                std::to_string(options.num_features()) + "; give it (N, " +
                                std::to_string(options.num_features()) + ", ...) or change num_features.");
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  check_input(input);
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    num_batches_tracked += 1;
    if (!options.momentum().has_value()) factor = 1.0 / num_batches_tracked.item<double>();  // cumulative
  }
  if (is_training()) ++training_forwards_;
  const bool bn_training = is_training() || !running_mean.defined();
  const bool track = !is_training() || options.track_running_stats();
  const at::Tensor mean_buffer = track ? running_mean : at::Tensor();
  const at::Tensor var_buffer = track ? running_var : at::Tensor();
  if (!(is_training() && group_ && group_->world_size() > 1))
    return torch::nn::functional::detail::batch_norm(input, mean_buffer, var_buffer, weight, bias, bn_training, factor,
                                                     options.eps());
  return SyncBatchNormFunction::apply(input, absent_as_empty(weight, input), absent_as_empty(bias, input),
                                      absent_as_empty(mean_buffer, input), absent_as_empty(var_buffer, input),
                                      options.eps(), factor, group_)[0];
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "fulgur::nn::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) stream << options.momentum().value();
  else stream << "None";
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats() << ')';
}

int attach_sync_group(torch::nn::Module& module, const std::shared_ptr<BatchNormSyncGroup>& group) {
  int found = 0;
  auto visit = [&](torch::nn::Module& m) {
    if (auto* sync = dynamic_cast<SyncBatchNormImpl*>(&m)) {
      sync->set_sync_group(group);
      ++found;
    }
  };
  visit(module);
  for (const auto& child : module.modules(/*include_self=*/false)) visit(*child);
  return found;
}

int convert_sync_batchnorm_children(torch::nn::Module& module) {
  std::vector<Replacement> found;
  collect(module, "", found);
  // Before changing anything: each BatchNorm must be held only by its parent's registry and, for a
  // container, by the container's own list (and by `found` here); another holder — a typed member
  // the parent's forward calls — would keep running the BatchNorm.
  for (const auto& r : found) {
    const long expected = 2 + (is_container(*r.parent) ? 1 : 0);
    if (r.old_child.use_count() > expected)
      throw MisconfigurationError(
          "convert_sync_batchnorm: '" + r.path + "' (" + r.old_child->name() +
          ") is also held outside the module registry, e.g. by a typed member that forward calls, which would keep "
          "running it unsynchronised; declare that layer as fulgur::nn::SyncBatchNorm in the model instead (it "
          "synchronises only under a strategy with more than one process).");
  }
  for (const auto& r : found) {
    auto sync = make_sync(*r.old_child);
    replace_in_container(*r.parent, r.old_child, sync);
    r.parent->replace_module(r.name, sync);
  }
  return static_cast<int>(found.size());
}

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module) {
  if (!module) throw MisconfigurationError("convert_sync_batchnorm: the module is null.");
  if (is_batchnorm(*module)) return make_sync(*module);
  convert_sync_batchnorm_children(*module);
  return module;
}

}  // namespace fulgur::nn
