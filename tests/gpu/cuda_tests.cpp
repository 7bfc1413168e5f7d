// CUDA: every precision trains on the GPU; the scaler's CUDA kernels agree with its CPU ones.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <ATen/record_function.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "src/distributed/parameter_gatherer.hpp"  // stage 3's gather statistics, which a user never reads
#include "unit/support.hpp"

using namespace fulgur;

template <class P>
using CudaTrainer = Trainer<CUDAAccelerator, SingleDeviceStrategy, P>;

// The single-device CUDA combinations, from the shipped policy lists (one source for the matrix).
inline constexpr auto cuda_trainers = compatible_trainers(boost::hana::tuple_t<CUDAAccelerator>,
                                                          boost::hana::tuple_t<SingleDeviceStrategy>, shipped_precisions);
using CudaTrainers = trainer_tuple_t<cuda_trainers>;

TEMPLATE_LIST_TEST_CASE("every precision trains on CUDA", "[cuda]", CudaTrainers) {
  using P = typename TestType::precision_type;
  torch::manual_seed(1);
  test::Classifier model(8, 32, 3, /*use_sgd=*/true, /*lr=*/0.05);
  auto [x, y] = test::classification_data(1024);
  data::TensorLoader train(x, y, {.batch_size = 64, .shuffle = true});
  data::TensorLoader val(x, y, {.batch_size = 256});
  TestType trainer(test::quiet({.max_epochs = 4}));
  const auto result = trainer.fit(model, train, val);
  CHECK(model->fc1->weight.device().is_cuda());
  CHECK(*result.epochs.back().val_loss < *result.epochs.front().val_loss);
  CHECK(*result.epochs.back().val_loss < 0.7);
  const auto dtype = model->fc1->weight.scalar_type();
  if constexpr (requires { P::uses_scaler; } || std::is_same_v<P, FloatPrecision>)
    CHECK(dtype == at::kFloat);  // mixed: float32 master weights
  else
    CHECK(dtype == P::dtype);
}

TEST_CASE("16-mixed on CUDA runs fp16 autocast and the scaler on the device", "[cuda]") {
  CudaTrainer<FP16MixedPrecision> trainer(test::quiet());
  torch::nn::Linear lin(16, 4);
  torch::optim::SGD opt(lin->parameters(), 0.1);
  trainer.setup(lin, opt);
  at::Tensor out;
  {
    auto ctx = trainer.forward_context();
    out = lin(torch::randn({8, 16}, at::kCUDA));
    CHECK(out.scalar_type() == at::kHalf);
  }
  trainer.backward(out.to(at::kFloat).pow(2).mean());
  CHECK(trainer.optimizer_step(opt));
  CHECK(trainer.precision().scaler().scale_tensor().is_cuda());
}

TEST_CASE("GradScaler: the CUDA kernels give the CPU results", "[cuda]") {
  auto run = [](c10::Device device) {
    torch::manual_seed(0);
    auto p = torch::randn({64}).to(device).requires_grad_(true);
    torch::optim::SGD opt({p}, 0.01);
    GradScaler scaler({.init_scale = 1024.0, .growth_interval = 2});
    for (int i = 0; i < 6; ++i) {
      auto loss = (p * p).sum() * (i == 3 ? std::numeric_limits<float>::infinity() : 1.0f);
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      opt.zero_grad();
    }
    return std::pair{p.detach().cpu(), scaler.get_scale()};
  };
  const auto [cpu_p, cpu_scale] = run(c10::Device(c10::kCPU));
  const auto [gpu_p, gpu_scale] = run(c10::Device(c10::kCUDA, 0));
  CHECK(cpu_scale == gpu_scale);
  CHECK(torch::allclose(cpu_p, gpu_p, 1e-6, 1e-7));
}

TEST_CASE("fused optimizers on CUDA: the CPU kernels' results, the scaler's skip on the device", "[cuda][optim]") {
  // FusedAdam, FusedAdamW and FusedSGD under the GradScaler, an inf at step 3 (skipped in the kernel, no host
  // decision): the CUDA kernels' parameters and step counts equal the CPU kernels' within float rounding.
  auto run = [](c10::Device device, int which) {
    torch::manual_seed(0);
    auto p = torch::randn({64}).to(device).requires_grad_(true);
    std::unique_ptr<optim::ScaledStepOptimizer> opt;
    if (which == 0) opt = std::make_unique<optim::FusedAdam>(std::vector<at::Tensor>{p}, torch::optim::AdamOptions(1e-2));
    else if (which == 1) opt = std::make_unique<optim::FusedAdamW>(std::vector<at::Tensor>{p}, torch::optim::AdamWOptions(1e-2));
    else opt = std::make_unique<optim::FusedSGD>(std::vector<at::Tensor>{p}, torch::optim::SGDOptions(0.01).momentum(0.9));
    GradScaler scaler({.init_scale = 1024.0, .growth_interval = 2});
    int stepped = 0;
    for (int i = 0; i < 6; ++i) {
      auto loss = (p * p).sum() * (i == 3 ? std::numeric_limits<float>::infinity() : 1.0f);
      scaler.scale(loss).backward();
      stepped += scaler.step(*opt) ? 1 : 0;
      scaler.update();
      opt->zero_grad();
    }
    return std::tuple{p.detach().cpu(), scaler.get_scale(), stepped};
  };
  for (int which = 0; which < 3; ++which) {
    INFO("optimizer " << which);
    const auto [cpu_p, cpu_scale, cpu_steps] = run(c10::Device(c10::kCPU), which);
    const auto [gpu_p, gpu_scale, gpu_steps] = run(c10::Device(c10::kCUDA, 0), which);
    CHECK(cpu_steps == 5);
    CHECK(gpu_steps == 5);
    CHECK(cpu_scale == gpu_scale);
    CHECK(torch::allclose(cpu_p, gpu_p, 1e-5, 1e-6));
  }
}

TEST_CASE("CUDA devices: parsing against the real device count, wrong-device batches are clear errors", "[cuda]") {
  CHECK(CUDAAccelerator::parse_devices(-1).size() == static_cast<std::size_t>(CUDAAccelerator::auto_device_count()));
  CHECK(CUDAAccelerator::supports_dtype(c10::Device(c10::kCUDA, 0), c10::kHalf));
  CudaTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
  struct PinnedImpl : test::ClassifierImpl {
    at::Tensor training_step(const data::Batch& b, std::int64_t) {
      // moves the model's output to the CPU: a device mismatch inside the step
      return torch::nn::functional::cross_entropy(forward(b.input).cpu(), b.target);
    }
  };
  auto model = std::make_shared<PinnedImpl>();
  auto [x, y] = test::classification_data(32);
  data::TensorLoader loader(x, y, {.batch_size = 16});
  CHECK_THAT(test::message_of<StepError>([&] { trainer.fit(model, loader); }), Catch::Contains("cuda:0"));
}

TEST_CASE("init_tensor and init_module create tensors and parameters on the GPU directly", "[cuda]") {
  CudaTrainer<BF16TruePrecision> trainer(test::quiet());
  {
    auto on_device = trainer.init_tensor();
    const auto t = torch::zeros({4});
    CHECK(t.is_cuda());
    CHECK(t.scalar_type() == at::kBFloat16);
  }
  {
    auto on_device = trainer.init_module();
    torch::nn::Linear layer(8, 4);
    CHECK(layer->weight.is_cuda());
    CHECK(layer->weight.scalar_type() == at::kBFloat16);
  }
  CHECK(torch::zeros({1}).is_cpu());
}

TEST_CASE("predict on CUDA returns CPU tensors in order, validate on a fresh module moves it", "[cuda]") {
  struct PredictorImpl : test::ClassifierImpl {
    at::Tensor predict_step(const data::Batch& b, std::int64_t) { return forward(b.input); }
  };
  auto model = std::make_shared<PredictorImpl>();
  auto [x, y] = test::classification_data(40);
  data::TensorLoader data(x, y, {.batch_size = 16});
  CudaTrainer<BF16MixedPrecision> trainer(test::quiet());
  CHECK(trainer.validate(model, data).loss.has_value());
  CHECK(model->fc1->weight.is_cuda());
  const auto predictions = trainer.predict(model, data);
  REQUIRE(predictions.size() == 3);
  CHECK(predictions[2].device().is_cpu());
  CHECK(predictions[2].size(0) == 8);
}

namespace {
struct LogsParameterImpl : test::ClassifierImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t i, StepContext& ctx) {
    ctx.log("w", fc1->weight[0][0]);  // the optimizer changes it in place after this step
    ctx.log("running", running);
    running.add_(1.0);  // changed in place right after logging
    expected_w.push_back(fc1->weight[0][0].item<double>());
    return ClassifierImpl::training_step(b, i);
  }
  at::Tensor running = at::zeros({}, at::TensorOptions().device(at::kCUDA));
  std::vector<double> expected_w;
};
struct Reads {
  std::vector<double>* w;
  std::vector<double>* running;
  template <class Output>
  void on_train_batch_end(TrainerView& t, torch::nn::Module&, const Output&, const data::Batch&, std::int64_t) {
    w->push_back(*t.callback_metrics().item("w"));
    running->push_back(*t.callback_metrics().item("running"));
  }
};
}  // namespace

TEST_CASE("logged step values on CUDA are copies: a tensor changed after logging leaves the log alone", "[cuda]") {
  // On a device each new value is copied (asynchronously) into the metric's own tensor; an alias
  // would show the parameter after the optimizer step, or a running sum after its next update.
  auto model = std::make_shared<LogsParameterImpl>();
  auto [x, y] = test::classification_data(64);
  data::TensorLoader data(x, y, {.batch_size = 16});
  std::vector<double> w, running;
  Trainer<CUDAAccelerator, SingleDeviceStrategy, FloatPrecision, Reads> trainer(test::quiet({.max_epochs = 1}),
                                                                               Reads{&w, &running});
  trainer.fit(model, data);
  REQUIRE(w.size() == 4);
  for (std::size_t i = 0; i < w.size(); ++i) {
    CHECK(w[i] == model->expected_w[i]);               // the weight as logged, not as stepped
    CHECK(running[i] == static_cast<double>(i));  // the sum as logged
  }
}

namespace {
/// Dropout draws from the CUDA generator, so a resume is exact only if the checkpoint carries its state.
struct DropNetImpl : torch::nn::Module {
  DropNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 32))),
        drop(register_module("drop", torch::nn::Dropout(0.3))),
        fc2(register_module("fc2", torch::nn::Linear(32, 3))) {}
  at::Tensor training_step(const data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(fc2(drop(torch::relu(fc1(b.input)))).to(at::kFloat), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::Adam>(parameters(), 1e-2);
  }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};
TORCH_MODULE(DropNet);

struct SaveAtBatch {
  std::int64_t at = -1;
  std::string path;
  std::int64_t seen = 0;
  void on_train_batch_end(TrainerView& trainer) {
    if (++seen == at) trainer.save_checkpoint(path);
  }
};

/// Three epochs of six shuffled batches; with `save_at`, a checkpoint after that batch (counted over the run).
template <class P>
std::vector<at::Tensor> train_drop_net(std::int64_t save_at, const std::string& path, const std::string& resume_from) {
  torch::manual_seed(resume_from.empty() ? 3 : 77);  // a resumed run starts from other weights and random states
  DropNet net;
  auto [x, y] = test::classification_data(96, 5);
  data::TensorLoader loader(x, y, {.batch_size = 16, .shuffle = true, .seed = 2});
  Trainer<CUDAAccelerator, SingleDeviceStrategy, P, SaveAtBatch> trainer(test::quiet({.max_epochs = 3}),
                                                                         SaveAtBatch{save_at, path});
  trainer.fit(net, loader, FitOptions{.ckpt_path = resume_from});
  return test::snapshot(*net);
}
}  // namespace

TEMPLATE_TEST_CASE("a CUDA run resumed from a mid-epoch checkpoint ends bit for bit as the straight run",
                   "[cuda][checkpoint]", FloatPrecision, FP16MixedPrecision, BF16MixedPrecision) {
  const std::string folder = "/tmp/fulgur_gpu_tests_" + std::to_string(::getpid());
  fulgur::detail::make_directories(folder);
  const std::string path = folder + "/mid.ckpt";
  const auto straight = train_drop_net<TestType>(/*save_at=*/8, path, "");  // epoch 1, batch 2
  const auto resumed = train_drop_net<TestType>(-1, "", path);
  fulgur::detail::remove_tree(folder);
  REQUIRE(straight.size() == resumed.size());
  for (std::size_t i = 0; i < straight.size(); ++i) {
    INFO("parameter " << i);
    CHECK(straight[i].is_cuda());
    CHECK(test::identical(straight[i], resumed[i]));
  }
}

TEMPLATE_TEST_CASE("DDP over NCCL in one process trains on the GPU exactly as one device does", "[cuda][distributed]",
                   FloatPrecision, BF16MixedPrecision) {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // needs a world of one
  auto train = [](auto& trainer) {
    torch::manual_seed(5);
    test::Classifier model(8, 32, 3, /*use_sgd=*/false, /*lr=*/0.01);
    auto [x, y] = test::classification_data(256, 6);
    data::TensorLoader loader(x, y, {.batch_size = 32});
    trainer.fit(model, loader);
    return test::snapshot(*model);
  };
  Trainer<CUDAAccelerator, BasicDDPStrategy<backend::NCCL>, TestType> ddp(test::quiet({.max_epochs = 2}),
                                                                          {.first_bucket_bytes = 512});
  CHECK(ddp.world_size() == 1);
  const auto over_nccl = train(ddp);
  CudaTrainer<TestType> one(test::quiet({.max_epochs = 2}));
  const auto single = train(one);
  REQUIRE(over_nccl.size() == single.size());
  for (std::size_t i = 0; i < single.size(); ++i) {
    INFO("parameter " << i);
    CHECK(over_nccl[i].is_cuda());
    CHECK(test::identical(over_nccl[i], single[i]));
  }
}

namespace {
template <class Strategy, class P>
std::vector<at::Tensor> train_over_nccl(std::optional<double> clip, std::int64_t accumulate = 1,
                                        const std::string& save = "", const std::string& resume = "") {
  torch::manual_seed(5);
  test::Classifier model(8, 32, 3, /*use_sgd=*/false, /*lr=*/0.01);
  auto [x, y] = test::classification_data(256, 6);
  data::TensorLoader loader(x, y, {.batch_size = 32});
  TrainerConfig config = test::quiet({.max_epochs = 2});
  config.gradient_clip_val = clip;
  config.accumulate_grad_batches = accumulate;
  Trainer<CUDAAccelerator, Strategy, P> trainer(config, DDPOptions{.first_bucket_bytes = 512, .bucket_bytes = 2048});
  CHECK(trainer.world_size() == 1);
  trainer.fit(model, loader, FitOptions{.ckpt_path = resume});
  if (!save.empty()) trainer.save_checkpoint(save);
  return test::snapshot(*model);
}
}  // namespace

// One GPU cannot hold two NCCL ranks: a world of one still runs every CUDA path of the sharded
// strategies (flat shards aliasing the weights, staging buffers and reduce-scatters on NCCL's
// stream, the all-gather, the scaler's flags and the clipping norm summed over the group).
TEMPLATE_TEST_CASE("ShardedStrategy over NCCL in one process trains on the GPU as DDP does", "[cuda][distributed]",
                   FloatPrecision, BF16MixedPrecision, FP16MixedPrecision) {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // needs a world of one
  using DDP = BasicDDPStrategy<backend::NCCL>;
  const auto ddp = train_over_nccl<DDP, TestType>(std::nullopt);
  const auto stage1 = train_over_nccl<ShardedStrategy<1, backend::NCCL>, TestType>(std::nullopt);
  const auto stage2 = train_over_nccl<ShardedStrategy<2, backend::NCCL>, TestType>(std::nullopt);
  const auto ddp_acc = train_over_nccl<DDP, TestType>(std::nullopt, 3);
  const auto stage2_acc = train_over_nccl<ShardedStrategy<2, backend::NCCL>, TestType>(std::nullopt, 3);
  // clipped: the norm is summed shard by shard, so within float rounding of DDP's
  const auto ddp_clip = train_over_nccl<DDP, TestType>(0.05);
  const auto stage2_clip = train_over_nccl<ShardedStrategy<2, backend::NCCL>, TestType>(0.05);
  REQUIRE(stage1.size() == ddp.size());
  REQUIRE(stage2.size() == ddp.size());
  for (std::size_t i = 0; i < ddp.size(); ++i) {
    INFO("parameter " << i);
    CHECK(stage2[i].is_cuda());
    CHECK(test::identical(stage1[i], ddp[i]));
    CHECK(test::identical(stage2[i], ddp[i]));
    CHECK(test::identical(stage2_acc[i], ddp_acc[i]));
    CHECK_FALSE(test::identical(ddp_acc[i], ddp[i]));  // accumulation changed the run
    const double clipped = (stage2_clip[i] - ddp_clip[i]).abs().max().template item<double>();
    CHECK(clipped <= 1e-6);
    CHECK_FALSE(test::identical(ddp_clip[i], ddp[i]));  // clipping changed the run
  }
}

// Stage 3 on the GPU: the gathers run inside ops on this thread in forward and on autograd's
// device thread in backward (the callback travels with LibTorch's thread-local state), storage is
// freed to and taken from the CUDA caching allocator, the all-gathers run on NCCL's stream.
TEMPLATE_TEST_CASE("ShardedStrategy<3> over NCCL in one process trains on the GPU as DDP does", "[cuda][distributed]",
                   FloatPrecision, BF16MixedPrecision, FP16MixedPrecision) {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // needs a world of one
  const auto ddp = train_over_nccl<BasicDDPStrategy<backend::NCCL>, TestType>(std::nullopt);
  torch::manual_seed(5);
  test::Classifier model(8, 32, 3, /*use_sgd=*/false, /*lr=*/0.01);
  auto [x, y] = test::classification_data(256, 6);
  data::TensorLoader loader(x, y, {.batch_size = 32});
  FSDPOptions options;
  options.auto_wrap = WrapPolicy::by_type<torch::nn::Linear>();
  Trainer<CUDAAccelerator, ShardedStrategy<3, backend::NCCL>, TestType> trainer(test::quiet({.max_epochs = 2}), options);
  trainer.fit(model, loader);
  const auto* gatherer = trainer.strategy().parameter_gatherer();
  REQUIRE(gatherer != nullptr);
  CHECK(gatherer->gathers() > 0);
  CHECK(trainer.strategy().wrapped_units().size() >= 2);  // every Linear its own unit
  const auto sharded = test::snapshot(*model);  // whole after fit
  REQUIRE(sharded.size() == ddp.size());
  for (std::size_t i = 0; i < ddp.size(); ++i) {
    INFO("parameter " << i);
    CHECK(sharded[i].is_cuda());
    CHECK(test::identical(sharded[i], ddp[i]));
  }
}

// A model built on the meta device is given its memory on the GPU a unit at a time; with the same
// seed its weights are the eager build's (the CUDA generator draws in the same order), before and
// after training.
TEST_CASE("ShardedStrategy<3>: a model built on the meta device is materialised on the GPU as the eager build",
          "[cuda][distributed]") {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // needs a world of one
  auto run = [](bool meta) {
    FSDPOptions options;
    options.auto_wrap = WrapPolicy::by_type<torch::nn::Linear>();
    Trainer<CUDAAccelerator, ShardedStrategy<3, backend::NCCL>, BF16MixedPrecision> trainer(
        test::quiet({.max_epochs = 2}), options);
    torch::manual_seed(5);
    test::Classifier model{nullptr};
    {
      auto in_context = trainer.init_module(/*empty_init=*/meta);
      model = test::Classifier(8, 32, 3, /*use_sgd=*/false, /*lr=*/0.01);
    }
    CHECK(model->fc1->weight.is_meta() == meta);
    CHECK((meta || model->fc1->weight.is_cuda()));
    auto [x, y] = test::classification_data(256, 6);
    data::TensorLoader loader(x, y, {.batch_size = 32});
    trainer.fit(model, loader);
    const auto& stats = trainer.strategy().materialize_stats();
    CHECK(stats.modules == (meta ? 2 : 0));
    CHECK(model->fc1->weight.is_cuda());
    return test::snapshot(*model);
  };
  const auto eager = run(false), meta = run(true);
  REQUIRE(eager.size() == meta.size());
  for (std::size_t i = 0; i < eager.size(); ++i) {
    INFO("parameter " << i);
    CHECK(test::identical(eager[i], meta[i]));
  }
}

TEST_CASE("ShardedStrategy<2> on the GPU: a sharded checkpoint resumes bit for bit and loads under one device",
          "[cuda][distributed][checkpoint]") {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // needs a world of one
  const std::string folder = "/tmp/fulgur_gpu_sharded_" + std::to_string(::getpid());
  fulgur::detail::make_directories(folder);
  const std::string path = folder + "/last.ckpt";
  using Stage2 = ShardedStrategy<2, backend::NCCL>;
  train_over_nccl<Stage2, FloatPrecision>(std::nullopt, 1, path);
  CHECK(fulgur::detail::path_exists(path + ".shards"));
  // 2 epochs saved, 2 more resumed (max_epochs 2 -> 4 needs another config): resume and compare against
  // the one-device run resumed from the same checkpoint, consolidated
  auto resume = [&]<class Strategy>() {
    torch::manual_seed(9);
    test::Classifier model(8, 32, 3, /*use_sgd=*/false, /*lr=*/0.01);
    auto [x, y] = test::classification_data(256, 6);
    data::TensorLoader loader(x, y, {.batch_size = 32});
    auto fit = [&](auto& trainer) {
      trainer.fit(model, loader, FitOptions{.ckpt_path = path});
      return test::snapshot(*model);
    };
    if constexpr (std::is_same_v<Strategy, SingleDeviceStrategy>) {
      Trainer<CUDAAccelerator, Strategy, FloatPrecision> trainer(test::quiet({.max_epochs = 4}));
      return fit(trainer);
    } else {  // the bucket sizes it was saved with
      Trainer<CUDAAccelerator, Strategy, FloatPrecision> trainer(
          test::quiet({.max_epochs = 4}), DDPOptions{.first_bucket_bytes = 512, .bucket_bytes = 2048});
      return fit(trainer);
    }
  };
  const auto sharded = resume.operator()<Stage2>();
  const auto single = resume.operator()<SingleDeviceStrategy>();
  fulgur::detail::remove_tree(folder);
  REQUIRE(sharded.size() == single.size());
  for (std::size_t i = 0; i < single.size(); ++i) {
    INFO("parameter " << i);
    CHECK(sharded[i].is_cuda());
    CHECK(test::identical(sharded[i], single[i]));
  }
}

namespace {
/// The ATen ops run between start() and stop(), by name (RecordFunction, as the profiler sees them).
struct OpCounter {
  static inline std::atomic<bool> counting{false};
  static inline std::mutex mutex;
  static inline std::map<std::string, std::int64_t> counts;
  at::CallbackHandle handle;
  OpCounter() {
    handle = at::addGlobalCallback(at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                                     if (counting.load()) {
                                       std::lock_guard<std::mutex> lock(mutex);
                                       ++counts[fn.name()];
                                     }
                                     return nullptr;
                                   }).scopes({at::RecordScope::FUNCTION}));
  }
  ~OpCounter() { at::removeCallback(handle); }
  template <class F>
  std::map<std::string, std::int64_t> during(F&& f) {
    counts.clear();
    counting = true;
    f();
    counting = false;
    return counts;
  }
};
}  // namespace

TEST_CASE("fit on CUDA adds no per-step driver queries or host syncs: twice the steps, the same syncs", "[cuda]") {
  OpCounter counter;
  auto fit_ops = [&](std::int64_t batches) {
    torch::manual_seed(0);
    test::Classifier model;
    auto [x, y] = test::classification_data(16 * batches);
    data::TensorLoader loader(x, y, {.batch_size = 16});
    CudaTrainer<FloatPrecision> trainer(test::quiet({.max_epochs = 1}));  // log_every_n_steps 50
    return counter.during([&] { trainer.fit(model, loader); });
  };
  fit_ops(4);  // the first fit on the device pays its one-off costs
  auto ops20 = fit_ops(20), ops40 = fit_ops(40);
  // is_pinned() asks the CUDA driver about the pointer (a few µs): batches go non-blocking instead
  CHECK(ops40["aten::is_pinned"] == 0);
  // a host sync (item) per logged step only: steps 1 and the last read the loss, whatever the count
  CHECK(ops40["aten::_local_scalar_dense"] == ops20["aten::_local_scalar_dense"]);
  CHECK(ops40["aten::to"] > ops20["aten::to"]);  // the counter saw the steps
}

TEST_CASE("an NCCL DDP fit that fails in training_step reports it, and a new group in the process trains",
          "[cuda][distributed]") {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // needs a world of one
  struct FailsAtBatch2Impl : test::ClassifierImpl {
    at::Tensor training_step(const data::Batch& b, std::int64_t i) {
      if (i == 2) throw std::runtime_error("batch 2 fails on purpose");
      return ClassifierImpl::training_step(b, i);
    }
  };
  auto [x, y] = test::classification_data(64);
  data::TensorLoader loader(x, y, {.batch_size = 16});
  {
    Trainer<CUDAAccelerator, BasicDDPStrategy<backend::NCCL>, FloatPrecision> trainer(test::quiet({.max_epochs = 1}));
    auto failing = std::make_shared<FailsAtBatch2Impl>();
    CHECK_THROWS_WITH(trainer.fit(failing, loader), Catch::Contains("batch 2 fails on purpose"));
  }  // the group shuts down here (gpu_bench.sh fails on NCCL's exit warning)
  Trainer<CUDAAccelerator, BasicDDPStrategy<backend::NCCL>, FloatPrecision> again(test::quiet({.max_epochs = 1}));
  test::Classifier model;
  CHECK(again.fit(model, loader).global_step == 4);
}

namespace {
struct StatsRecorder {
  std::vector<std::pair<std::int64_t, Metrics>> calls;
  void log_metrics(const Metrics& metrics, std::int64_t step) { calls.emplace_back(step, metrics); }
};
}  // namespace

TEST_CASE("DeviceStatsMonitor on CUDA: torch.cuda.memory_stats' names, the allocator's bytes, ThroughputMonitor's MFU",
          "[cuda][monitors]") {
  const at::Tensor big = torch::empty({64 << 20}, at::TensorOptions(at::kCUDA).dtype(at::kByte));  // 64 MiB
  const Metrics stats = cuda_memory_stats(0);
  for (const char* name : {"allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                           "reserved_bytes.all.peak", "active_bytes.large_pool.peak", "num_alloc_retries", "num_ooms",
                           "inactive_split_bytes.all.current", "requested_bytes.small_pool.freed"})
    CHECK(stats.count(name) == 1);
  CHECK(stats.at("allocated_bytes.all.current") >= double(64 << 20));
  CHECK(stats.at("reserved_bytes.all.current") >= stats.at("allocated_bytes.all.current"));
  CHECK(stats.at("allocated_bytes.all.peak") >= stats.at("allocated_bytes.all.current"));
  CHECK(stats.at("num_ooms") == 0.0);

  torch::manual_seed(1);
  test::Classifier model(8, 32, 3, /*use_sgd=*/true);
  auto [x, y] = test::classification_data(64);
  Trainer<CUDAAccelerator, SingleDeviceStrategy, BF16MixedPrecision, DeviceStatsMonitor, ThroughputMonitor, StatsRecorder>
      trainer(test::quiet({.max_epochs = 1, .log_every_n_steps = 1}), DeviceStatsMonitor({.cpu_stats = true}),
              ThroughputMonitor({.flops_per_batch = 1'000'000, .window_size = 2}), StatsRecorder());
  trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 16}));
  const Metrics& last = trainer.callback<DeviceStatsMonitor>().last_values();
  CHECK(last.at("DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.current") > 0.0);
  CHECK(last.count("DeviceStatsMonitor.on_train_batch_end/cpu_rss_bytes") == 1);  // cpu_stats = true
  // The table knows the H100 and H200 SXM parts (Lightning's: an "NVIDIA H200" name has no entry): MFU there.
  const auto peak = available_flops(c10::Device(c10::kCUDA, 0), c10::kBFloat16);
  const Metrics& rates = trainer.callback<ThroughputMonitor>().last_metrics("train");
  CHECK(rates.count("train/device/flops_per_sec") == 1);
  CHECK(rates.count("train/device/mfu") == (peak ? 1u : 0u));
}

TEST_CASE("TorchProfiler on CUDA: the trace holds the kernels under fulgur's ranges, NVTX ranges do not disturb it",
          "[cuda][profilers]") {
  const std::string dir = test::temporary_directory("cuda_torch_profiler");
  torch::manual_seed(1);
  test::Classifier model(8, 32, 3, /*use_sgd=*/true);
  auto [x, y] = test::classification_data(128);
  Trainer<CUDAAccelerator, SingleDeviceStrategy, BF16MixedPrecision, TorchProfiler> trainer(
      test::quiet({.max_epochs = 1, .default_root_dir = dir}),
      TorchProfiler({.filename = "cuda", .schedule = {.wait = 1, .warmup = 1, .active = 2}, .emit_nvtx = true}));
  trainer.fit(model, data::TensorLoader(x, y, {.batch_size = 16}));
  const TorchProfiler& profiler = trainer.callback<TorchProfiler>();
  REQUIRE(profiler.trace_files().size() == 1);
  std::int64_t kernel_ns = 0;
  for (const auto& row : profiler.operators()) kernel_ns += row.self_device_ns;
  CHECK(kernel_ns > 0);  // Kineto saw the kernels (CUPTI)
  const std::string command = std::string(FULGUR_TEST_PYTHON) + " " + FULGUR_SOURCE_DIR +
                              "/tests/profilers/check_trace.py " + profiler.trace_files()[0] +
                              " run_training_batch=2 --kernels";
  CHECK(std::system(command.c_str()) == 0);
}
