// Accelerators (devices parsing and errors), SingleDeviceStrategy, data traversal, state I/O.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include "src/distributed/reducer.hpp"  // the reducer's buckets, which a user never reads
#include "unit/support.hpp"

using namespace fulgur;

TEST_CASE("the shipped policies satisfy the contracts, every shipped combination is compatible", "[concepts]") {
  STATIC_REQUIRE(accelerator<CPUAccelerator>);
  STATIC_REQUIRE(accelerator<CUDAAccelerator>);
  STATIC_REQUIRE(strategy<SingleDeviceStrategy>);
  STATIC_REQUIRE(CPUAccelerator::name == "cpu");
  STATIC_REQUIRE(CUDAAccelerator::name == "cuda");
  STATIC_REQUIRE(SingleDeviceStrategy::name == "single_device");
  STATIC_REQUIRE(compatible<CPUAccelerator, SingleDeviceStrategy, FP16MixedPrecision>);  // for real, not bf16
  STATIC_REQUIRE(compatible<CUDAAccelerator, SingleDeviceStrategy, BF16TruePrecision>);
  STATIC_REQUIRE_FALSE(compatible<CPUAccelerator, SingleDeviceStrategy, MixedPrecision<c10::kBFloat16, GradScaler>>);
  STATIC_REQUIRE(compatibility_reason<CPUAccelerator, SingleDeviceStrategy, MixedPrecision<c10::kBFloat16, GradScaler>>() ==
                 FULGUR_MSG_BF16_SCALER);
  // The shipped policies in another order: one sentence on the order (a precision is no strategy, and no
  // shipped policy satisfies two of the concepts, so the order is unambiguous).
  STATIC_REQUIRE(compatibility_reason<CPUAccelerator, FloatPrecision, SingleDeviceStrategy>() ==
                 FULGUR_MSG_ARGUMENTS_OUT_OF_ORDER);
  STATIC_REQUIRE(compatibility_reason<BasicDDPStrategy<backend::Gloo>, CPUAccelerator, BF16MixedPrecision>() ==
                 FULGUR_MSG_ARGUMENTS_OUT_OF_ORDER);
  STATIC_REQUIRE_FALSE(accelerator<SingleDeviceStrategy>);
  STATIC_REQUIRE_FALSE(precision<CPUAccelerator>);
  STATIC_REQUIRE_FALSE(strategy<FloatPrecision>);
}

TEST_CASE("CPU devices: an int > 0, its string, or auto", "[accelerator]") {
  CHECK(CPUAccelerator::parse_devices(1) == std::vector<int>{0});
  CHECK(CPUAccelerator::parse_devices(3) == std::vector<int>{0, 1, 2});
  CHECK(CPUAccelerator::parse_devices(" 2 ") == std::vector<int>{0, 1});
  CHECK(CPUAccelerator::parse_devices("auto") == std::vector<int>{0});
  CHECK_THAT(test::message_of<MisconfigurationError>([] { CPUAccelerator::parse_devices(0); }),
             Catch::StartsWith("`devices` selected with `CPUAccelerator` should be an int > 0"));
  CHECK_THROWS_AS(CPUAccelerator::parse_devices("two"), MisconfigurationError);
  CHECK(CPUAccelerator::get_parallel_devices({0, 1}) == std::vector<c10::Device>(2, c10::Device(c10::kCPU)));
  CHECK(CPUAccelerator::is_available());
  CHECK(CPUAccelerator::auto_device_count() == 1);
  CPUAccelerator cpu;
  CHECK_NOTHROW(cpu.setup_device(c10::Device(c10::kCPU)));
  CHECK(test::message_of<AcceleratorError>([&] { cpu.setup_device(c10::Device(c10::kCUDA, 1)); }) ==
        "Device should be CPU, got cuda:1 instead.");
}

TEST_CASE("CUDA devices: Lightning's parsing rules and messages", "[accelerator]") {
  using fulgur::detail::parse_cuda_devices;
  CHECK(parse_cuda_devices(2, 4) == std::vector<int>{0, 1});
  CHECK(parse_cuda_devices(-1, 3) == std::vector<int>{0, 1, 2});
  CHECK(parse_cuda_devices("-1", 2) == std::vector<int>{0, 1});
  CHECK(parse_cuda_devices("2", 4) == std::vector<int>{0, 1});  // a bare number is a count, as in Lightning
  CHECK(parse_cuda_devices("3,1", 4) == std::vector<int>{3, 1});  // order kept
  CHECK(parse_cuda_devices("2,", 4) == std::vector<int>{2});
  CHECK(test::message_of<MisconfigurationError>([] { parse_cuda_devices("1,1", 4); }) ==
        "Device ID's (GPU) must be unique.");
  CHECK(test::message_of<AcceleratorError>([] { parse_cuda_devices(3, 2); }) ==
        "You requested gpu: [0, 1, 2]\n But your machine only has: [0, 1]");
  CHECK(test::message_of<AcceleratorError>([] { parse_cuda_devices(-1, 0); }) ==
        "GPUs requested but none are available: train on the CPU (fulgur::CPUAccelerator), or run on a machine with one.");
  CHECK(test::message_of<AcceleratorError>([] { parse_cuda_devices(1, 0); }) ==  // dispatch("gpu") here (probe 7)
        "You requested gpu: [0]\n But your machine only has: []\n There is no GPU here: train on the CPU "
        "(fulgur::CPUAccelerator), or run on a machine with one.");
  CHECK_THAT(test::message_of<MisconfigurationError>([] { parse_cuda_devices(0, 2); }),
             Catch::StartsWith("`devices=0` is not a valid input using CUDAAccelerator"));
  CHECK_THROWS_AS(parse_cuda_devices("a,b", 2), MisconfigurationError);
  CHECK(CUDAAccelerator::get_parallel_devices({1, 0}) ==
        std::vector<c10::Device>{c10::Device(c10::kCUDA, 1), c10::Device(c10::kCUDA, 0)});
  CUDAAccelerator cuda;
  CHECK(test::message_of<AcceleratorError>([&] { cuda.setup_device(c10::Device(c10::kCPU)); }) ==
        "Device should be CUDA, got cpu instead.");
}

TEST_CASE("a CUDA trainer without a GPU fails at construction, naming the available accelerators", "[accelerator]") {
  auto build = [] { fulgur::Trainer<CUDAAccelerator, SingleDeviceStrategy, FloatPrecision> trainer(test::quiet()); };
  if (CUDAAccelerator::is_available()) {
    CHECK_NOTHROW(build());
  } else {
    const auto message = test::message_of<AcceleratorError>(build);
    CHECK_THAT(message, Catch::StartsWith("`cuda` can not run on your system since the accelerator is not available."));
    CHECK_THAT(message, Catch::Contains("['cpu']"));
  }
}

namespace {
// An accelerator written outside the library that lacks bfloat16: the Trainer refuses bf16 on it.
struct NoBf16Accelerator : CPUAccelerator {
  static constexpr std::string_view name = "nobf16";
  static bool supports_dtype(const c10::Device&, c10::ScalarType dtype) { return dtype != c10::kBFloat16; }
};
}  // namespace

TEST_CASE("bf16 requested on hardware that lacks it is a clear error", "[accelerator]") {
  using T = fulgur::Trainer<NoBf16Accelerator, SingleDeviceStrategy, BF16MixedPrecision>;
  CHECK_THAT(test::message_of<AcceleratorError>([] { T trainer(test::quiet()); }),
             Catch::StartsWith("precision 'bf16-mixed' computes in BFloat16, which cpu does not support") &&
                 Catch::Contains("use '16-mixed'"));
  CHECK_NOTHROW(fulgur::Trainer<NoBf16Accelerator, SingleDeviceStrategy, FP16MixedPrecision>(test::quiet()));
}

namespace user {
struct Pair3 {
  at::Tensor a, b, c;
};
template <class F>
Pair3 fulgur_map_tensors(const Pair3& p, F&& f) {
  return {f(p.a), f(p.b), f(p.c)};
}
}  // namespace user

TEST_CASE("batch_to_device walks any nesting and keeps non-tensor leaves", "[strategy][data]") {
  SingleDeviceStrategy s{c10::Device(c10::kCPU)};
  const auto t = torch::ones({2});
  auto nested = std::make_tuple(t, std::vector<at::Tensor>{t, t}, std::map<std::string, at::Tensor>{{"k", t}},
                                std::pair{t, 3}, std::optional<at::Tensor>(t), std::string("label"));
  auto moved = s.batch_to_device(nested);
  STATIC_REQUIRE(std::is_same_v<decltype(moved), decltype(nested)>);
  CHECK(std::get<0>(moved).is_same(t));  // already on the device: no copy
  CHECK(std::get<5>(moved) == "label");
  CHECK(std::get<3>(moved).second == 3);
  auto example = s.batch_to_device(torch::data::Example<>(t, t));
  CHECK(example.data.is_same(t));
  auto custom = s.batch_to_device(user::Pair3{t, t, t});
  CHECK(custom.c.is_same(t));
  CHECK(data::extract_batch_size(data::Batch{torch::ones({5, 2}), torch::ones({5})}) == 5);
}

TEST_CASE("SingleDeviceStrategy: identity collectives, rank 0 of 1, one device", "[strategy]") {
  SingleDeviceStrategy s;
  const auto t = torch::arange(4.0);
  CHECK(s.all_reduce(t, ReduceOp::sum).is_same(t));
  CHECK(s.all_gather(t).is_same(t));
  CHECK(s.broadcast(std::string("x")) == "x");
  CHECK(s.reduce_boolean_decision(false, true) == false);
  CHECK(s.is_global_zero());
  CHECK(s.world_size() == 1);
  CHECK(s.root_device() == c10::Device(c10::kCPU));
  CPUAccelerator cpu;
  CHECK_THAT(test::message_of<MisconfigurationError>([&] {
               s.setup_environment(cpu, ParallelDevices{std::vector<c10::Device>(2, c10::Device(c10::kCPU))});
             }),
             Catch::StartsWith("single_device runs in one process on exactly one device, but 2 device(s) x 1 node(s) "
                               "were requested"));
  CHECK_THROWS_AS(test::CpuTrainer<FloatPrecision>(test::quiet({.devices = 2})), MisconfigurationError);
}

TEST_CASE("module state: Python's names and order, strict loading lists what is wrong", "[checkpoint]") {
  torch::nn::Sequential net(torch::nn::Linear(2, 3), torch::nn::BatchNorm1d(3));
  const auto state = checkpoint::module_state_dict(*net);
  std::vector<std::string> keys;
  for (const auto& item : state) keys.push_back(item.key().toStringRef());
  CHECK(keys == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                                         "1.num_batches_tracked"});
  torch::nn::Sequential other(torch::nn::Linear(2, 3), torch::nn::BatchNorm1d(3));
  checkpoint::load_module_state_dict(*other, state);
  CHECK(torch::equal(other[0]->as<torch::nn::Linear>()->weight, net[0]->as<torch::nn::Linear>()->weight));

  StateDict partial;
  partial.insert("0.weight", torch::zeros({3, 2}));
  partial.insert("extra", torch::zeros({1}));
  const auto message = test::message_of<Error>([&] { checkpoint::load_module_state_dict(*other, partial); });
  CHECK_THAT(message, Catch::Contains("Missing key(s) in state_dict: \"0.bias\""));
  CHECK_THAT(message, Catch::Contains("Unexpected key(s) in state_dict: \"extra\""));
  StateDict wrong_shape;
  wrong_shape.insert("0.weight", torch::zeros({2, 2}));
  CHECK_THAT(test::message_of<Error>([&] { checkpoint::load_module_state_dict(*other, wrong_shape, false); }),
             Catch::Contains("size mismatch for 0.weight (expected shape [3, 2], got [2, 2])"));
}

TEST_CASE("checkpoint files: atomic save, load, clear errors", "[checkpoint]") {
  // POSIX only: libtorch.so's own std::filesystem copy interposes (see docs/getting-started.md).
  char folder_template[] = "/tmp/fulgur_ckpt_XXXXXX";
  const std::string folder = ::mkdtemp(folder_template);
  const std::string path = folder + "/sub/model.ckpt";
  SingleDeviceStrategy s;
  StateDict state;
  state.insert("epoch", static_cast<std::int64_t>(3));
  state.insert("weights", torch::arange(6.0).reshape({2, 3}));
  s.save_checkpoint(path, state);
  const auto loaded = s.load_checkpoint(path);
  CHECK(loaded.at("epoch").toInt() == 3);
  CHECK(torch::equal(loaded.at("weights").toTensor(), torch::arange(6.0).reshape({2, 3})));
  std::vector<std::string> files;
  DIR* dir = ::opendir((folder + "/sub").c_str());
  REQUIRE(dir != nullptr);
  while (const dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.' || std::string(entry->d_name).find(".tmp.") != std::string::npos)
      files.emplace_back(entry->d_name);
  ::closedir(dir);
  CHECK(files == std::vector<std::string>{"model.ckpt"});  // no temporary left behind
  std::ofstream(folder + "/garbage.ckpt") << "not a checkpoint";
  CHECK_THAT(test::message_of<Error>([&] { s.load_checkpoint(folder + "/garbage.ckpt"); }),
             Catch::Contains("is not a checkpoint"));
  CHECK_THAT(test::message_of<Error>([&] { s.load_checkpoint(folder + "/absent.ckpt"); }),
             Catch::StartsWith("fulgur: cannot open checkpoint"));
  for (const auto* f : {"/sub/model.ckpt", "/garbage.ckpt"}) ::unlink((folder + f).c_str());
  ::rmdir((folder + "/sub").c_str());
  ::rmdir(folder.c_str());
}

TEST_CASE("optimizer state round-trips exactly", "[checkpoint]") {
  torch::manual_seed(0);
  torch::nn::Linear a(3, 2), b(3, 2);
  b->weight.data().copy_(a->weight.data());
  b->bias.data().copy_(a->bias.data());
  torch::optim::Adam opt_a(a->parameters(), 0.1), opt_b(b->parameters(), 0.1);
  const auto x = torch::randn({4, 3});
  for (int i = 0; i < 3; ++i) {
    opt_a.zero_grad();
    a(x).pow(2).sum().backward();
    opt_a.step();
  }
  b->weight.data().copy_(a->weight.data());
  b->bias.data().copy_(a->bias.data());
  SingleDeviceStrategy s;
  checkpoint::load_optimizer_state_dict(opt_b, s.get_optimizer_state(opt_a));
  for (auto* pair : {&opt_a, &opt_b}) (void)pair;
  opt_a.zero_grad();
  a(x).pow(2).sum().backward();
  opt_a.step();
  opt_b.zero_grad();
  b(x).pow(2).sum().backward();
  opt_b.step();
  CHECK(torch::equal(a->weight, b->weight));  // bias corrections and moments came along
}

// ---- distributed: environment and strategy set-up (single process) -------------------------------
namespace {
auto env_from(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}
}  // namespace

TEST_CASE("cluster environment: torchrun's variables, with its agent store", "[distributed][environment]") {
  using distributed::ClusterEnvironment;
  const auto env = distributed::detect_environment(env_from({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                                             {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"},
                                                             {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29555"},
                                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                             {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  CHECK(env.source == ClusterEnvironment::Source::torchrun);
  CHECK(env.rank == 3);
  CHECK(env.world_size == 4);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 2);
  CHECK(env.node_rank == 1);
  CHECK(env.master_addr == "10.1.2.3");
  CHECK(env.master_port == 29555);
  CHECK(env.use_agent_store);
  CHECK(env.restart_count == 2);
  const auto none = distributed::detect_environment(env_from({}));
  CHECK(none.source == ClusterEnvironment::Source::none);
  CHECK(none.world_size == 1);
}

TEST_CASE("cluster environment: SLURM's variables and node lists", "[distributed][environment]") {
  const auto env = distributed::detect_environment(env_from({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"},
                                                             {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
                                                             {"SLURM_NTASKS_PER_NODE", "2(x4)"},
                                                             {"SLURM_NODELIST", "gpu[07-10,12],cpu1"},
                                                             {"SLURM_JOB_ID", "1234567"}}));
  CHECK(env.source == distributed::ClusterEnvironment::Source::slurm);
  CHECK(env.rank == 5);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 2);
  CHECK(env.node_rank == 2);
  CHECK(env.master_addr == "gpu07");
  CHECK(env.master_port == 15000 + 4567);  // Lightning's rule: the job id's last four digits
  CHECK(distributed::first_slurm_host("node1,node2") == "node1");
  CHECK(distributed::first_slurm_host("a[3-4]-ib,b") == "a3-ib");
  CHECK(distributed::first_slurm_host("solo") == "solo");
  // torchrun's variables win over SLURM's (torchrun inside an allocation)
  CHECK(distributed::detect_environment(env_from({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"RANK", "0"},
                                                  {"WORLD_SIZE", "1"}}))
            .rank == 0);
  CHECK_THAT(test::message_of<MisconfigurationError>(
                 [] { distributed::detect_environment(env_from({{"RANK", "x"}, {"WORLD_SIZE", "2"}})); }),
             Catch::Contains("RANK=\"x\" is not an integer"));
  CHECK_THAT(test::message_of<MisconfigurationError>(
                 [] { distributed::detect_environment(env_from({{"RANK", "2"}, {"WORLD_SIZE", "2"}})); }),
             Catch::Contains("rank 2 of world size 2"));
}

TEST_CASE("DDPStrategy: names, compatibility, and a launch that does not match the configuration", "[distributed]") {
  STATIC_REQUIRE(strategy<DDPStrategy>);
  STATIC_REQUIRE(strategy<BasicDDPStrategy<backend::NCCL>>);
  STATIC_REQUIRE(DDPStrategy::name == "ddp");
  STATIC_REQUIRE(compatible<CPUAccelerator, DDPStrategy, BF16MixedPrecision>);
  STATIC_REQUIRE(compatible<CPUAccelerator, BasicDDPStrategy<backend::Gloo>, FloatPrecision>);
  STATIC_REQUIRE(compatible<CUDAAccelerator, BasicDDPStrategy<backend::NCCL>, FloatPrecision>);
  STATIC_REQUIRE_FALSE(compatible<CPUAccelerator, BasicDDPStrategy<backend::NCCL>, FloatPrecision>);
  STATIC_REQUIRE(compatibility_reason<CPUAccelerator, BasicDDPStrategy<backend::NCCL>, FloatPrecision>() ==
                 FULGUR_MSG_STRATEGY_ACCELERATOR);
  // Several nodes under the built-in launcher need the master's address on each node.
  if (!std::getenv("RANK") && !std::getenv("SLURM_PROCID") && !std::getenv("NODE_RANK")) {
    CHECK_THAT(test::message_of<MisconfigurationError>([] {
                 fulgur::Trainer<CPUAccelerator, DDPStrategy, FloatPrecision> t(test::quiet({.num_nodes = 2}));
               }),
               Catch::Contains("num_nodes=2 needs NODE_RANK, MASTER_ADDR and MASTER_PORT set on every node"));
  }
}

TEST_CASE("DDP in one process: buckets in reverse order, first about 1 MiB, and training works", "[distributed]") {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // needs a world of one
  fulgur::Trainer<CPUAccelerator, DDPStrategy, FloatPrecision> trainer(
      test::quiet({.max_epochs = 1}), {.first_bucket_bytes = 600, .bucket_bytes = 2000});  // 150 and 500 floats
  CHECK(trainer.world_size() == 1);
  test::Classifier model;  // fc1: 8x16 + 16, fc2: 16x3 + 3
  auto [x, y] = test::classification_data(64);
  data::TensorLoader loader(x, y, {.batch_size = 16});
  const auto before = test::snapshot(*model);
  CHECK(trainer.fit(model, loader).global_step == 4);
  CHECK_FALSE(torch::equal(before[0], model->fc1->weight));
  const auto after_first = test::snapshot(*model);
  CHECK(trainer.fit(model, loader).global_step == 4);  // a second fit re-installs the hooks
  CHECK_FALSE(torch::equal(after_first[0], model->fc1->weight));
  const auto layout = trainer.strategy().reducer()->bucket_layout();
  // reverse registration order: fc2.bias (3), fc2.weight (48) fill the first bucket (<= 150 floats)
  REQUIRE(layout.size() == 2);
  CHECK(layout[0] == std::vector<std::string>{"fc2.bias", "fc2.weight", "fc1.bias"});
  CHECK(layout[1] == std::vector<std::string>{"fc1.weight"});
}

namespace {
// Identity forward; its backward throws: placed between two layers, it fails backward after the
// last layer's gradient bucket has been sent.
struct ThrowInBackward : torch::autograd::Function<ThrowInBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    throw std::runtime_error("backward failed on purpose");
  }
};
}  // namespace

TEST_CASE("DDP: a backward that fails mid-graph drains what was sent and refuses to go on", "[distributed]") {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // needs a world of one
  // fc2's gradients fill the first bucket on their own
  fulgur::Trainer<CPUAccelerator, DDPStrategy, FloatPrecision> trainer(test::quiet(), {.first_bucket_bytes = 256});
  test::Classifier model;
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  trainer.setup(model, optimizer);
  REQUIRE(trainer.strategy().reducer()->bucket_count() >= 2);
  const auto x = torch::randn({4, 8});
  auto loss = model->fc2(ThrowInBackward::apply(torch::relu(model->fc1(x)))).sum();
  CHECK_THROWS_WITH(trainer.backward(loss), Catch::Contains("backward failed on purpose"));
  CHECK_THAT(test::message_of<DistributedError>([&] { trainer.backward(model->forward(x).sum()); }),
             Catch::Contains("an earlier backward failed on rank 0"));
}
