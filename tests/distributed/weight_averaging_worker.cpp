// EMAWeightAveraging and StochasticWeightAveraging under DDPStrategy and ShardedStrategy<2> on 2
// Gloo ranks (torchrun): every rank keeps the same average, the one the averaging rule gives on the
// weights the rank trained (the module holds it after fit); a batch-norm module gets each rank's
// statistics recomputed over its shard; ShardedStrategy<3> is refused.
#include <fulgur/callbacks/stochastic_weight_averaging.hpp>
#include <fulgur/callbacks/weight_averaging.hpp>
#include <fulgur/checkpoint/io.hpp>
#include <fulgur/update_bn.hpp>

#include "batch_norm_net.hpp"
#include "worker.hpp"

using namespace fulgur;
using DDP = BasicDDPStrategy<backend::Gloo>;
template <int Stage>
using Zero = ShardedStrategy<Stage, backend::Gloo>;

namespace {

using worker::check;
using worker::my_rank;
using Tensors = std::vector<at::Tensor>;

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 3))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc2(torch::relu(fc1(b.input))), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

Tensors snapshot(torch::nn::Module& m) {
  Tensors out;
  for (const auto& t : weight_averaging::averaged_tensors(m, true)) out.push_back(t.detach().clone());
  return out;
}

/// The module's tensors after each optimizer step (global step, tensors) and at each epoch's start.
struct Recorder {
  std::vector<std::pair<std::int64_t, Tensors>>* steps;
  std::vector<Tensors>* epochs;
  void on_train_batch_end(TrainerView& t, torch::nn::Module& m) { steps->emplace_back(t.global_step(), snapshot(m)); }
  void on_train_epoch_start(TrainerView&, torch::nn::Module& m) { epochs->push_back(snapshot(m)); }
};

bool same(const Tensors& a, const Tensors& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

/// Whether every rank holds these tensors (rank 0's, compared by all ranks).
template <class T>
bool same_on_every_rank(T& trainer, const Tensors& tensors, const std::string& name) {
  const std::string path = "/tmp/fulgur_weight_averaging_" + name + ".pt";
  if (my_rank == 0) {
    StateDict s;
    for (std::size_t i = 0; i < tensors.size(); ++i) s.insert(std::to_string(i), tensors[i]);
    checkpoint::save(path, s);
  }
  trainer.barrier("written");
  const StateDict s = checkpoint::load(path);
  bool ok = s.size() == tensors.size();
  for (std::size_t i = 0; ok && i < tensors.size(); ++i) ok = torch::equal(s.at(std::to_string(i)).toTensor(), tensors[i]);
  trainer.barrier("read");
  return ok;
}

std::pair<at::Tensor, at::Tensor> dataset(std::int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto x = at::randn({n, 8}, gen);
  return {x, (x.select(1, 0) > 0).to(at::kLong) + (x.select(1, 1) > 0.5).to(at::kLong)};
}

TrainerConfig config() { return TrainerConfig{.max_epochs = 3, .devices = 2, .enable_progress_bar = false}; }

template <class S>
void ema(const std::string& name) {
  const EMAWeightAveragingOptions ema_options{.decay = 0.8, .update_every_n_steps = 2, .update_starting_at_step = 1};
  std::vector<std::pair<std::int64_t, Tensors>> steps;
  std::vector<Tensors> epochs;
  Trainer<CPUAccelerator, S, FloatPrecision, Recorder, EMAWeightAveraging> trainer(
      config(), worker::options(), Recorder{&steps, &epochs}, EMAWeightAveraging(ema_options));
  my_rank = trainer.global_rank();
  torch::manual_seed(1);
  Net net;
  auto [x, y] = dataset(64);
  data::TensorLoader train(x, y, {.batch_size = 8});
  trainer.fit(net, train);
  const EMAWeightAveraging& callback = trainer.template callback<EMAWeightAveraging>();
  // The rule applied to the weights this rank trained, step by step.
  Tensors expected = snapshot(*net);
  std::int64_t n = 0;
  for (const auto& [step, tensors] : steps)
    if (callback.should_update(step - 1, std::nullopt)) weight_averaging::ema_update(expected, tensors, 0.8, n++);
  check(n > 1 && callback.n_averaged() == n, name + ": n_averaged " + std::to_string(callback.n_averaged()) +
                                                 ", the rule gives " + std::to_string(n));
  check(same(callback.average(), expected), name + ": the average is the EMA of the weights trained");
  check(same(snapshot(*net), expected), name + ": the module holds the average after fit");
  check(!same(expected, steps.back().second), name + ": the average differs from the last weights");
  check(same_on_every_rank(trainer, callback.average(), name), name + ": every rank holds rank 0's average");
  if constexpr (std::is_same_v<S, DDP>) {  // rank 0 writes the average as state_dict, Lightning's keys beside it
    const std::string path = "/tmp/fulgur_weight_averaging_ddp.ckpt";
    trainer.save_checkpoint(path);
    trainer.barrier("saved");
    const StateDict c = checkpoint::load(path);
    check(c.contains("current_model_state") && c.contains("averaging_state"), name + ": Lightning's keys in the checkpoint");
    const StateDict weights(c.at("state_dict").toGenericDict());
    const auto names = weight_averaging::averaged_names(*net, true);
    for (std::size_t i = 0; i < names.size(); ++i)
      check(torch::equal(weights.at(names[i]).toTensor(), callback.average()[i]), name + ": state_dict holds the average");
    trainer.barrier("checked");
  }
}

void swa() {
  std::vector<std::pair<std::int64_t, Tensors>> steps;
  std::vector<Tensors> epochs;
  Trainer<CPUAccelerator, DDP, FloatPrecision, Recorder, StochasticWeightAveraging> trainer(
      config(), worker::options(), Recorder{&steps, &epochs},
      StochasticWeightAveraging({.swa_lrs = {0.05}, .swa_epoch_start = std::int64_t{1}, .annealing_epochs = 1}));
  my_rank = trainer.global_rank();
  torch::manual_seed(2);
  Net net;
  auto [x, y] = dataset(64);
  data::TensorLoader train(x, y, {.batch_size = 8});
  trainer.fit(net, train);
  const auto& callback = trainer.callback<StochasticWeightAveraging>();
  check(callback.n_averaged() == 3, "swa: averaged at the start of each of the 3 epochs");
  // Equal weights over the epochs' starting weights (parameters only).
  const std::size_t params = net->parameters().size();
  for (std::size_t i = 0; i < params; ++i) {
    const at::Tensor mean = (epochs[0][i] + epochs[1][i] + epochs[2][i]) / 3;
    check(torch::allclose(callback.average()[i], mean, 1e-6, 1e-7), "swa: the average is the mean of the epochs' weights");
    check(torch::equal(net->parameters()[i].detach(), callback.average()[i]), "swa: the module holds the average after fit");
  }
  check(same_on_every_rank(trainer, callback.average(), "swa"), "swa: every rank holds rank 0's average");
}

using test::BatchNormNet;

/// SWA on a batch-norm module without the update_bn option: the callback's own pass over each rank's
/// shard gives each rank fulgur::update_bn's statistics over that shard (per-rank, no SyncBatchNorm).
template <class S>
void swa_batch_norm(const std::string& name) {
  Trainer<CPUAccelerator, S, FloatPrecision, StochasticWeightAveraging> trainer(
      config(), worker::options(),
      StochasticWeightAveraging({.swa_lrs = {0.05}, .swa_epoch_start = std::int64_t{2}, .annealing_epochs = 1}));
  my_rank = trainer.global_rank();
  torch::manual_seed(3);
  BatchNormNet net;
  auto [x, y] = dataset(64);
  data::TensorLoader train(x, y, {.batch_size = 8});
  trainer.fit(net, train);
  const Tensors recomputed{net->bn->running_mean.clone(), net->bn->running_var.clone(),
                           net->bn->num_batches_tracked.clone()};
  check(net->bn->num_batches_tracked.item<std::int64_t>() == 4, name + ": the pass ran this rank's 4 batches");
  check(net->bn->options.momentum() == 0.1 && net->is_training(), name + ": momentum and mode put back");
  data::TensorLoader mine(x, y, {.batch_size = 8});
  mine.shard(trainer.global_rank(), trainer.world_size());
  update_bn(mine, *net, [&](const data::Batch& b) { net->forward(b.input); });
  check(torch::equal(recomputed[0], net->bn->running_mean) && torch::equal(recomputed[1], net->bn->running_var),
        name + ": the statistics are update_bn's over this rank's shard, bit for bit");
  const bool as_rank_0 = same_on_every_rank(trainer, {recomputed[0]}, "swa_bn_" + std::to_string(name.size()));  // every rank takes part
  check(my_rank == 0 || !as_rank_0, name + ": rank 1's statistics (its shard's) differ from rank 0's");
}

template <class Callback>
void refused_by_stage3(Callback callback, const std::string& expected) {
  FSDPOptions fsdp;
  fsdp.timeout = worker::options().timeout;
  Trainer<CPUAccelerator, Zero<3>, FloatPrecision, Callback> trainer(config(), fsdp, std::move(callback));
  my_rank = trainer.global_rank();
  Net net;
  auto [x, y] = dataset(32);
  data::TensorLoader train(x, y, {.batch_size = 8});
  std::string message;
  try {
    trainer.fit(net, train);
  } catch (const MisconfigurationError& e) {
    message = e.what();
  }
  check(message.find(expected) != std::string::npos, "ShardedStrategy<3> refused with \"" + expected + "\", got \"" + message + "\"");
}

}  // namespace

int main(int argc, char** argv) {
  return worker::run(argc > 1 ? argv[1] : "", "usage: weight_averaging_worker ddp|sharded2|sharded3",
                     [&](const std::string& scenario) {
                       if (scenario == "ddp") {
                         ema<DDP>("ema ddp");
                         swa();
                         swa_batch_norm<DDP>("swa bn ddp");
                       } else if (scenario == "sharded2") {
                         ema<Zero<2>>("ema sharded2");
                         swa_batch_norm<Zero<2>>("swa bn sharded2");
                       } else if (scenario == "sharded3") {
                         refused_by_stage3(EMAWeightAveraging(), "EMAWeightAveraging does not support ShardedStrategy<3>");
                         refused_by_stage3(StochasticWeightAveraging({.swa_lrs = {0.1}}),
                                           "SWA does not currently support sharded models.");
                       } else {
                         return false;
                       }
                       return true;
                     });
}
