// fulgur::nn::SyncBatchNorm and convert_sync_batchnorm (docs/sync_batchnorm.md) in one process:
// without a group (or with one of one rank) it is torch::nn::BatchNorm to the bit; over ranks
// simulated by threads it equals one BatchNorm over the whole batch; conversion keeps the very
// tensors and modes and refuses what would not be called; bad input is named. The multi-process
// checks against PyTorch's SyncBatchNorm are tests/distributed/sync_batchnorm_worker.cpp.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fulgur/errors.hpp>
#include <fulgur/nn/sync_batchnorm.hpp>

#include <barrier>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using fulgur::nn::SyncBatchNorm;
using fulgur::nn::SyncBatchNormImpl;
using fulgur::nn::SyncBatchNormOptions;

namespace {

// Ranks as threads of this process: a collective waits for all of them.
struct ThreadRanks {
  explicit ThreadRanks(int n) : world(n), sync(n), slots(static_cast<std::size_t>(n)) {}
  int world;
  std::barrier<> sync;
  std::vector<at::Tensor> slots;
  int gathers = 0, reductions = 0;  // rank 0's calls
};
struct ThreadRank final : fulgur::nn::BatchNormSyncGroup {
  ThreadRank(ThreadRanks& r, int rank) : ranks(r), rank(rank) {}
  int world_size() const override { return ranks.world; }
  at::Tensor all_gather(const at::Tensor& tensor) override {
    if (rank == 0) ++ranks.gathers;
    ranks.slots[static_cast<std::size_t>(rank)] = tensor.clone();
    ranks.sync.arrive_and_wait();
    auto all = at::stack(ranks.slots);
    ranks.sync.arrive_and_wait();
    return all;
  }
  void all_reduce_sum(const at::Tensor& tensor) override {
    if (rank == 0) ++ranks.reductions;
    ranks.slots[static_cast<std::size_t>(rank)] = tensor.clone();
    ranks.sync.arrive_and_wait();
    auto sum = at::stack(ranks.slots).sum(0);
    ranks.sync.arrive_and_wait();
    tensor.copy_(sum);
  }
  ThreadRanks& ranks;
  int rank;
};

// The same random weight, bias and running statistics in both.
template <class A, class B>
void same_state(A& a, B& b) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(7);
  for (auto* t : {&a->weight, &a->bias, &a->running_mean}) t->copy_(torch::randn_like(*t));
  a->running_var.copy_(torch::rand_like(a->running_var) + 0.5);
  b->weight.copy_(a->weight);
  b->bias.copy_(a->bias);
  b->running_mean.copy_(a->running_mean);
  b->running_var.copy_(a->running_var);
}

}  // namespace

TEST_CASE("SyncBatchNorm without a group of several ranks is BatchNorm2d to the bit", "[sync_batchnorm]") {
  for (const std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
    for (const bool world_of_one : {false, true}) {
      auto options = torch::nn::BatchNormOptions(3).momentum(momentum);
      SyncBatchNorm sync(options);
      torch::nn::BatchNorm2d reference(options);
      same_state(sync, reference);
      ThreadRanks one(1);
      if (world_of_one) sync->set_sync_group(std::make_shared<ThreadRank>(one, 0));
      for (int step = 0; step < 3; ++step) {  // momentum none: 1/1, 1/2, 1/3
        torch::manual_seed(static_cast<std::uint64_t>(step));
        auto x = torch::randn({4, 3, 5, 2}) * 3 + 1;
        auto dy = torch::randn({4, 3, 5, 2});
        auto xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
        auto ya = sync(xa), yb = reference(xb);
        ya.backward(dy);
        yb.backward(dy);
        CHECK(ya.equal(yb));
        CHECK(xa.grad().equal(xb.grad()));
        CHECK(sync->weight.grad().equal(reference->weight.grad()));
        CHECK(sync->bias.grad().equal(reference->bias.grad()));
        CHECK(sync->running_mean.equal(reference->running_mean));
        CHECK(sync->running_var.equal(reference->running_var));
        CHECK(sync->num_batches_tracked.equal(reference->num_batches_tracked));
      }
      CHECK(one.gathers == 0);  // a group of one rank: no collective
      sync->eval();
      reference->eval();
      auto x = torch::randn({2, 3, 4, 4});
      CHECK(sync(x).equal(reference(x)));
      CHECK(sync->num_batches_tracked.item<int64_t>() == 3);
    }
  }
}

TEST_CASE("SyncBatchNorm over ranks in threads equals one BatchNorm over the whole batch", "[sync_batchnorm]") {
  // Uneven parts (2 and 3 samples, then an empty rank of 0 beside them), float64; 1d, 2d and 3d inputs.
  const std::vector<std::vector<int64_t>> shapes{{5, 4}, {5, 3, 6}, {5, 3, 4, 2}, {5, 2, 2, 3, 2}};
  for (const auto& shape : shapes) {
    for (const std::vector<int64_t>& parts : {std::vector<int64_t>{2, 3}, std::vector<int64_t>{2, 0, 3}}) {
      const int world = static_cast<int>(parts.size());
      const int64_t channels = shape[1];
      auto options = torch::nn::BatchNormOptions(channels).momentum(0.2);
      torch::manual_seed(11);
      auto x = torch::randn(shape, torch::kDouble) * 2 + 0.5;
      auto dy = torch::randn(shape, torch::kDouble);

      torch::nn::BatchNorm1d whole(options);  // the functional path is the same for every dimension
      whole->to(torch::kDouble);
      std::vector<SyncBatchNorm> replicas;
      for (int r = 0; r < world; ++r) {
        replicas.emplace_back(options);
        replicas.back()->to(torch::kDouble);
        same_state(whole, replicas.back());
      }
      auto xw = x.clone().requires_grad_(true);
      auto yw = torch::nn::functional::batch_norm(
          xw, whole->running_mean, whole->running_var,
          torch::nn::functional::BatchNormFuncOptions().weight(whole->weight).bias(whole->bias).training(true).momentum(0.2));
      yw.backward(dy);

      ThreadRanks ranks(world);
      std::vector<at::Tensor> ys(parts.size()), gxs(parts.size());
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r) {
        threads.emplace_back([&, r] {
          int64_t start = 0;
          for (int i = 0; i < r; ++i) start += parts[static_cast<std::size_t>(i)];
          auto& bn = replicas[static_cast<std::size_t>(r)];
          bn->set_sync_group(std::make_shared<ThreadRank>(ranks, r));
          auto part = x.narrow(0, start, parts[static_cast<std::size_t>(r)]).clone().requires_grad_(true);
          auto y = bn(part);
          y.backward(dy.narrow(0, start, parts[static_cast<std::size_t>(r)]));
          ys[static_cast<std::size_t>(r)] = y.detach();
          gxs[static_cast<std::size_t>(r)] = part.grad();
        });
      }
      for (auto& t : threads) t.join();
      INFO("shape dims " << shape.size() << ", ranks " << world);
      CHECK(ranks.gathers == 1);
      CHECK(ranks.reductions == 1);
      CHECK(torch::allclose(torch::cat(ys), yw, 0, 1e-12));
      CHECK(torch::allclose(torch::cat(gxs), xw.grad(), 0, 1e-12));
      at::Tensor grad_weight = torch::zeros_like(whole->weight), grad_bias = torch::zeros_like(whole->bias);
      for (std::size_t r = 0; r < replicas.size(); ++r) {
        auto& bn = replicas[r];
        CHECK(torch::allclose(bn->running_mean, whole->running_mean, 0, 1e-12));
        CHECK(torch::allclose(bn->running_var, whole->running_var, 0, 1e-12));  // unbiased, over all ranks
        if (parts[r] == 0) {  // as torch: an empty part gives no weight gradient (None), only takes part
          CHECK_FALSE(bn->weight.grad().defined());
          continue;
        }
        grad_weight += bn->weight.grad();
        grad_bias += bn->bias.grad();
      }
      CHECK(torch::allclose(grad_weight, whole->weight.grad(), 0, 1e-12));
      CHECK(torch::allclose(grad_bias, whole->bias.grad(), 0, 1e-12));
    }
  }
}

TEST_CASE("convert_sync_batchnorm keeps the tensors and modes in Sequential, ModuleList and ModuleDict", "[sync_batchnorm]") {
  torch::nn::Sequential inner(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6));
  torch::nn::Sequential model(torch::nn::Conv2d(2, 3, 1), torch::nn::BatchNorm2d(3), torch::nn::Flatten());
  torch::nn::ModuleList list(torch::nn::BatchNorm3d(2));
  torch::nn::ModuleDict dict(std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
      {"norm", torch::nn::BatchNorm1d(6).ptr()}});
  auto root = std::make_shared<torch::nn::Module>();
  root->register_module("model", model);
  root->register_module("inner", inner);
  root->register_module("list", list);
  root->register_module("dict", dict);
  auto bn2d = model[1]->as<torch::nn::BatchNorm2dImpl>();
  bn2d->weight.set_requires_grad(false);
  bn2d->eval();
  const auto weight = bn2d->weight, running_mean = bn2d->running_mean, counter = bn2d->num_batches_tracked;
  auto keys_before = root->named_parameters().keys();
  auto buffers_before = root->named_buffers().keys();

  CHECK(fulgur::nn::convert_sync_batchnorm(root) == root);
  auto* sync = model[1]->as<SyncBatchNormImpl>();
  REQUIRE(sync != nullptr);
  CHECK(model->named_children()["1"].get() == sync);  // the registry and the list agree
  CHECK(sync->weight.unsafeGetTensorImpl() == weight.unsafeGetTensorImpl());  // the same tensors
  CHECK(sync->running_mean.unsafeGetTensorImpl() == running_mean.unsafeGetTensorImpl());
  CHECK(sync->num_batches_tracked.unsafeGetTensorImpl() == counter.unsafeGetTensorImpl());
  CHECK_FALSE(sync->weight.requires_grad());
  CHECK(sync->bias.requires_grad());
  CHECK_FALSE(sync->is_training());
  CHECK(inner[1]->as<SyncBatchNormImpl>() != nullptr);
  CHECK(list[0]->as<SyncBatchNormImpl>() != nullptr);
  CHECK(list->named_children()["0"]->as<SyncBatchNormImpl>() != nullptr);
  CHECK(dict["norm"]->as<SyncBatchNormImpl>() != nullptr);
  CHECK(root->named_parameters().keys() == keys_before);  // state dicts load either way
  CHECK(root->named_buffers().keys() == buffers_before);

  // Sequential's forward now calls it.
  sync->train();
  model->forward(torch::randn({4, 2, 3, 3}));
  CHECK(sync->training_forwards() == 1);
  CHECK(counter.item<int64_t>() == 1);

  // A BatchNorm given itself comes back as a new SyncBatchNorm with its tensors.
  torch::nn::BatchNorm1d alone(torch::nn::BatchNormOptions(5).momentum(std::nullopt).affine(false));
  auto converted = fulgur::nn::convert_sync_batchnorm(alone.ptr());
  auto* converted_sync = converted->as<SyncBatchNormImpl>();
  REQUIRE(converted_sync != nullptr);
  CHECK_FALSE(converted_sync->options.momentum().has_value());
  CHECK_FALSE(converted_sync->weight.defined());
  CHECK(converted_sync->running_var.unsafeGetTensorImpl() == alone->running_var.unsafeGetTensorImpl());
}

namespace {
struct TypedImpl : torch::nn::Module {
  TypedImpl()
      : fc(register_module("fc", torch::nn::Linear(3, 4))), norm(register_module("norm", torch::nn::BatchNorm1d(4))),
        tail(register_module("tail", torch::nn::Sequential(torch::nn::BatchNorm1d(4)))) {}
  at::Tensor forward(const at::Tensor& x) { return tail->forward(norm(fc(x))); }
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d norm;
  torch::nn::Sequential tail;
};
}  // namespace

TEST_CASE("convert_sync_batchnorm refuses a BatchNorm that a typed member holds, changing nothing", "[sync_batchnorm]") {
  auto model = std::make_shared<TypedImpl>();
  try {
    fulgur::nn::convert_sync_batchnorm(model);
    FAIL("no error");
  } catch (const fulgur::MisconfigurationError& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Catch::Contains("'norm' (torch::nn::BatchNorm1dImpl) is also held outside the module registry"));
    CHECK_THAT(message, Catch::Contains("declare that layer as fulgur::nn::SyncBatchNorm"));
  }
  CHECK(model->named_children()["norm"]->as<torch::nn::BatchNorm1dImpl>() != nullptr);  // nothing changed
  CHECK(model->tail[0]->as<torch::nn::BatchNorm1dImpl>() != nullptr);
}

TEST_CASE("SyncBatchNorm names bad input", "[sync_batchnorm]") {
  SyncBatchNorm bn(3);
  try {
    bn(torch::randn({4, 5, 2}));
    FAIL("no error");
  } catch (const fulgur::MisconfigurationError& e) {
    CHECK_THAT(e.what(), Catch::Contains("the input has 5 channels (dimension 1) but the module was built for num_features=3"));
  }
  CHECK_THROWS_WITH(bn(torch::randn({3})), Catch::Contains("expected at least 2D input (got 1D input)"));
  CHECK_THROWS_WITH(bn(torch::randn({4, 0})), Catch::Contains("number of input channels should be non-zero"));
  // One value per channel in training: torch's error (over ranks, the values of every rank count).
  CHECK_THROWS_WITH(bn(torch::randn({1, 3})), Catch::Contains("Expected more than 1 value per channel when training"));
  bn->eval();
  CHECK_NOTHROW(bn(torch::randn({1, 3})));
}

TEST_CASE("SyncBatchNorm loads what BatchNorm2d saved, and the other way", "[sync_batchnorm]") {
  torch::nn::BatchNorm2d bn(3);
  SyncBatchNorm sync(3);
  same_state(sync, bn);  // random state in sync; bn gets a copy, then is overwritten by the load below
  bn->num_batches_tracked.fill_(5);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : bn->parameters()) p.mul_(2);
  }
  std::stringstream saved;
  torch::save(bn, saved);
  torch::load(sync, saved);
  for (const auto& item : bn->named_parameters()) CHECK(sync->named_parameters()[item.key()].equal(item.value()));
  for (const auto& item : bn->named_buffers()) CHECK(sync->named_buffers()[item.key()].equal(item.value()));
  std::stringstream back;
  torch::save(sync, back);
  torch::nn::BatchNorm2d again(3);
  torch::load(again, back);
  CHECK(again->weight.equal(bn->weight));
  CHECK(again->num_batches_tracked.item<int64_t>() == 5);
}
