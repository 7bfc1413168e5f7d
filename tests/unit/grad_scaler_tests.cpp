// GradScaler, clipping and shuffling against Python golden values; GradScaler's error cases.
#include <catch2/catch.hpp>

#include "unit/support.hpp"

using namespace fulgur;

TEST_CASE("GradScaler follows torch.amp.GradScaler step for step (inf and NaN injected)", "[scaler][golden]") {
  auto g = test::read_golden("grad_scaler.txt");
  auto a = g["init.a"].clone().requires_grad_(true);
  auto b = g["init.b"].clone().requires_grad_(true);
  torch::optim::SGD opt({a, b}, torch::optim::SGDOptions(0.01).momentum(0.9));
  GradScaler scaler({.init_scale = 1024.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 3});
  const std::map<int, double> inject{{2, std::numeric_limits<double>::infinity()},
                                     {6, std::numeric_limits<double>::quiet_NaN()}};
  for (int step = 0; step < 12; ++step) {
    INFO("step " << step);
    auto loss = a.pow(2).sum() * 0.5;  // Python's ops in Python's order (optim_tests.cpp says why)
    loss = loss + (b * torch::arange(5.0)).sum();
    scaler.scale(loss).backward();
    if (inject.count(step)) {
      torch::NoGradGuard no_grad;
      b.mutable_grad()[1] = inject.at(step);
    }
    const bool stepped = scaler.step(opt);
    scaler.update();
    opt.zero_grad();
    const std::string k = "step" + std::to_string(step);
    CHECK(scaler.get_scale() == g[k + ".scale"].item<double>());
    CHECK(static_cast<double>(scaler.growth_tracker()) == g[k + ".tracker"].item<double>());
    CHECK(stepped == (g[k + ".stepped"].item<double>() == 1.0));
    CHECK(test::identical(a.detach(), g[k + ".a"]));
    CHECK(test::identical(b.detach(), g[k + ".b"]));
  }
  // state_dict: Python's five keys, in Python's order, with Python's values.
  std::ifstream keys_file(std::string(FULGUR_GOLDEN_DIR) + "/grad_scaler_keys.txt");
  std::vector<std::string> python_keys{std::istream_iterator<std::string>(keys_file), {}};
  const auto state = scaler.state_dict();
  std::vector<std::string> keys;
  for (const auto& item : state) keys.push_back(item.key().toStringRef());
  CHECK(keys == python_keys);
  for (const auto& key : keys) {
    const auto v = state.at(key);
    CHECK((v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt())) == g["state." + key].item<double>());
  }
}

TEST_CASE("GradScaler state round-trips, before and after the scale exists", "[scaler]") {
  GradScaler source({.init_scale = 8.0, .growth_interval = 2});
  auto p = torch::ones({2}).requires_grad_(true);
  torch::optim::SGD opt({p}, 0.1);
  for (int i = 0; i < 3; ++i) {
    source.scale(p.sum()).backward();
    source.step(opt);
    source.update();
    opt.zero_grad();
  }
  REQUIRE(source.get_scale() == 16.0);
  REQUIRE(source.growth_tracker() == 1);
  GradScaler fresh;
  fresh.load_state_dict(source.state_dict());
  CHECK(fresh.get_scale() == 16.0);
  CHECK(fresh.growth_tracker() == 1);
  CHECK(fresh.get_growth_interval() == 2);
  fresh.scale(p.sum()).backward();  // lazily created from the loaded values
  CHECK(fresh.scale_tensor().item<float>() == 16.0f);
  GradScaler live;
  live.scale(p.sum());
  live.load_state_dict(source.state_dict());
  CHECK(live.scale_tensor().item<float>() == 16.0f);
}

TEST_CASE("GradScaler refuses misuse with torch.amp's messages", "[scaler]") {
  auto p = torch::ones({2}).requires_grad_(true);
  torch::optim::SGD opt({p}, 0.1);
  GradScaler scaler;
  CHECK(test::message_of<GradScalerError>([&] { scaler.unscale_(opt); }) ==
        "Attempted unscale_ but _scale is None.  This may indicate your script did not use scaler.scale(loss or "
        "outputs) earlier in the iteration.");
  CHECK_THROWS_AS(scaler.update(), GradScalerError);
  scaler.scale(p.sum()).backward();
  scaler.unscale_(opt);
  CHECK(test::message_of<GradScalerError>([&] { scaler.unscale_(opt); }) ==
        "unscale_() has already been called on this optimizer since the last update().");
  CHECK(scaler.step(opt));
  CHECK(test::message_of<GradScalerError>([&] { scaler.step(opt); }) ==
        "step() has already been called since the last update().");
  CHECK(test::message_of<GradScalerError>([&] { scaler.unscale_(opt); }) == "unscale_() is being called after step().");
  scaler.update();
  CHECK(scaler.stage(opt) == GradScaler::Stage::ready);

  opt.zero_grad();  // no gradient at all: nothing was checked
  CHECK_THAT(test::message_of<GradScalerError>([&] { scaler.step(opt); }),
             Catch::StartsWith("No inf checks were recorded for this optimizer"));

  auto half = torch::ones({2}, at::kHalf).requires_grad_(true);
  torch::optim::SGD half_opt({half}, 0.1);
  scaler.scale(half.sum().to(at::kFloat)).backward();
  CHECK_THAT(test::message_of<GradScalerError>([&] { scaler.unscale_(half_opt); }),
             Catch::StartsWith("Attempting to unscale FP16 gradients."));

  CHECK_THAT(test::message_of<GradScalerError>([&] { GradScaler().load_state_dict(StateDict()); }),
             Catch::StartsWith("The source state dict is empty"));
  CHECK_THROWS_AS(GradScaler({.growth_factor = 1.0}), MisconfigurationError);
  CHECK_THROWS_AS(GradScaler({.backoff_factor = 1.0}), MisconfigurationError);
}

TEST_CASE("a disabled GradScaler is transparent", "[scaler]") {
  GradScaler scaler({.enabled = false});
  auto p = torch::ones({2}).requires_grad_(true);
  torch::optim::SGD opt({p}, 0.5);
  auto loss = p.sum();
  CHECK(scaler.scale(loss).is_same(loss));
  loss.backward();
  CHECK(scaler.step(opt));
  CHECK(p[0].item<float>() == 0.5f);
  CHECK(scaler.state_dict().empty());
  CHECK(scaler.get_scale() == 1.0);
}

TEST_CASE("clipping equals torch.nn.utils.clip_grad_norm_/clip_grad_value_ bit for bit", "[clipping][golden]") {
  auto g = test::read_golden("clipping.txt");
  std::vector<at::Tensor> params{torch::zeros({3, 4}).requires_grad_(true), torch::zeros({7}).requires_grad_(true)};
  auto reset = [&] {
    params[0].mutable_grad() = g["grad0"].clone();
    params[1].mutable_grad() = g["grad1"].clone();
  };
  for (auto [tag, max_norm, norm_type] : {std::tuple{"l2", 0.5, 2.0},
                                          std::tuple{"inf", 0.25, std::numeric_limits<double>::infinity()},
                                          std::tuple{"l1", 100.0, 1.0}}) {
    INFO(tag);
    reset();
    const auto total = clip_grad_norm(params, max_norm, norm_type);
    CHECK(test::identical(total, g[std::string(tag) + ".total"]));
    CHECK(test::identical(params[0].grad(), g[std::string(tag) + ".g0"]));
    CHECK(test::identical(params[1].grad(), g[std::string(tag) + ".g1"]));
  }
  reset();
  clip_grad_value(params, 0.7);
  CHECK(test::identical(params[0].grad(), g["value.g0"]));
  CHECK(test::identical(params[1].grad(), g["value.g1"]));

  params[1].mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(test::message_of<Error>([&] { clip_grad_norm(params, 1.0, 2.0, /*error_if_nonfinite=*/true); }),
             Catch::StartsWith("The total norm of order 2.000000 for gradients from `parameters` is non-finite"));
}

TEST_CASE("clipping under 16-mixed acts on unscaled gradients and returns the unscaled norm", "[clipping][scaler]") {
  auto run = [](auto precision) {
    torch::manual_seed(3);
    torch::nn::Linear lin(5, 2);
    test::CpuTrainer<decltype(precision)> trainer(test::quiet());
    torch::optim::SGD opt(lin->parameters(), 0.1);
    trainer.setup(lin, opt);
    at::Tensor loss;
    {
      auto ctx = trainer.forward_context();
      loss = lin(torch::ones({4, 5})).pow(2).mean().to(at::kFloat) * 1e-3;  // scaled by 65536 it stays finite in fp16
    }
    trainer.backward(loss);
    const auto norm = trainer.clip_gradients(lin, opt, {.max_norm = 1e-4});
    trainer.optimizer_step(opt);
    return std::pair{norm.template item<double>(), lin->weight.detach().clone()};
  };
  const auto [norm32, weight32] = run(FloatPrecision{});
  const auto [norm16, weight16] = run(FP16MixedPrecision{});
  CHECK(norm16 == Approx(norm32).epsilon(1e-2));  // fp16 forward; scaled norm would be 65536 times larger
  CHECK(torch::allclose(weight16, weight32, 1e-2, 1e-3));
}

TEST_CASE("with a loss scaler, an inf gradient norm skips the step instead of raising", "[clipping][scaler]") {
  test::CpuTrainer<FP16MixedPrecision> trainer(test::quiet());
  torch::nn::Linear lin(5, 2);
  torch::optim::SGD opt(lin->parameters(), 0.1);
  trainer.setup(lin, opt);
  trainer.backward(lin(torch::ones({4, 5})).sum() * std::numeric_limits<float>::infinity());
  const auto before = lin->weight.detach().clone();
  CHECK_NOTHROW(trainer.clip_gradients(lin, opt, {.max_norm = 1.0, .error_if_nonfinite = true}));
  CHECK_FALSE(trainer.optimizer_step(opt));
  CHECK(torch::equal(before, lin->weight));
}

TEST_CASE("clip_gradients takes exactly one of clip_val and max_norm", "[clipping]") {
  torch::nn::Linear lin(2, 1);
  torch::optim::SGD opt(lin->parameters(), 0.1);
  test::CpuTrainer<FloatPrecision> trainer(test::quiet());
  CHECK(test::message_of<MisconfigurationError>([&] { trainer.clip_gradients(lin, opt, {.clip_val = 1, .max_norm = 1}); }) ==
        "Only one of `clip_val` or `max_norm` can be set as this specifies the underlying clipping algorithm!");
  CHECK(test::message_of<MisconfigurationError>([&] { trainer.clip_gradients(lin, opt, {}); }) ==
        "You have to specify either `clip_val` or `max_norm` to do gradient clipping!");
}

TEST_CASE("TensorLoader's epoch order equals Python's randperm with seed + epoch", "[data][golden]") {
  auto g = test::read_golden("shuffle.txt");
  for (auto [n, seed, epoch] : {std::tuple{10, 0, 0}, std::tuple{10, 0, 1}, std::tuple{97, 42, 3}, std::tuple{1000, 7, 0}}) {
    data::TensorLoader loader(torch::arange(n).unsqueeze(1), torch::arange(n),
                              {.batch_size = 4, .shuffle = true, .seed = static_cast<std::uint64_t>(seed)});
    const auto key = "perm." + std::to_string(n) + "." + std::to_string(seed) + "." + std::to_string(epoch);
    CHECK(torch::equal(loader.order_for_epoch(epoch), g[key].to(at::kLong)));
    // ...and the batches come in that order.
    loader.set_epoch(epoch);
    std::vector<at::Tensor> seen;
    for (const auto& batch : loader) seen.push_back(batch.target);
    CHECK(torch::equal(torch::cat(seen), g[key].to(at::kLong)));
  }
}

TEST_CASE("DistributedSampler gives Python's DistributedSampler indices", "[data][distributed][golden]") {
  auto g = test::read_golden("distributed_sampler.txt");
  REQUIRE(g.size() == 10);
  for (const auto& [key, expected] : g) {
    INFO(key);
    std::istringstream fields(key.substr(std::string("sampler.").size()));
    std::vector<std::int64_t> v;
    for (std::string item; std::getline(fields, item, '.');) v.push_back(std::stoll(item));
    const auto [n, world, rank, shuffle, seed, epoch, drop_last] = std::tuple{v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
    data::DistributedSampler sampler(n, {.rank = static_cast<int>(rank), .world_size = static_cast<int>(world),
                                         .shuffle = shuffle == 1, .seed = static_cast<std::uint64_t>(seed),
                                         .drop_last = drop_last == 1});
    CHECK(torch::equal(sampler.indices(epoch), expected.to(at::kLong)));
    CHECK(sampler.num_samples() == expected.size(0));
  }
  CHECK_THAT(test::message_of<DataError>([] { data::DistributedSampler(10, {.rank = 2, .world_size = 2}); }),
             Catch::StartsWith("Invalid rank 2, rank should be in the interval [0, 1]"));
}

TEST_CASE("a sharded TensorLoader: equal, disjoint shards covering the data, a new order each epoch", "[data][distributed]") {
  const auto x = torch::arange(10).unsqueeze(1), y = torch::arange(10);
  std::vector<at::Tensor> seen;
  for (int rank = 0; rank < 3; ++rank) {
    data::TensorLoader loader(x, y, {.batch_size = 2, .shuffle = true, .seed = 3});
    loader.shard(rank, 3);
    CHECK(loader.num_samples() == 4);  // ceil(10 / 3), padded
    CHECK(loader.size() == 2);
    loader.set_epoch(0);
    std::vector<at::Tensor> mine;
    for (const auto& b : loader) mine.push_back(b.target);
    seen.push_back(torch::cat(mine));
    loader.set_epoch(1);
    std::vector<at::Tensor> next;
    for (const auto& b : loader) next.push_back(b.target);
    CHECK_FALSE(torch::equal(torch::cat(next), seen.back()));
  }
  const auto all = std::get<0>(torch::_unique(torch::cat(seen)));
  CHECK(torch::equal(all, torch::arange(10)));  // every sample seen; 2 padded repeats
  data::TensorLoader even(x, y, {.batch_size = 4});
  even.shard(1, 3, /*drop_last=*/true);
  CHECK(even.num_samples() == 3);
  CHECK_THAT(even.describe(), Catch::EndsWith("shard 1 of 3 (3 samples)"));
}

TEST_CASE("TorchDistributedSampler: Python's rule inside a torch::data loader, set_epoch reaches its copy",
          "[data][distributed]") {
  const auto x = torch::arange(10).unsqueeze(1).to(at::kFloat);
  auto dataset = torch::data::datasets::TensorDataset(x);
  const data::DistributedSamplerOptions options{.rank = 1, .world_size = 3, .seed = 4};
  data::TorchDistributedSampler sampler(10, options);
  auto loader = torch::data::make_data_loader(std::move(dataset), sampler,
                                              torch::data::DataLoaderOptions().batch_size(2));
  const data::DistributedSampler reference(10, options);
  for (std::int64_t epoch : {0, 5}) {
    sampler.set_epoch(epoch);  // on our handle; the loader holds a copy
    std::vector<std::int64_t> seen;
    for (const auto& batch : *loader)
      for (const auto& example : batch) seen.push_back(static_cast<std::int64_t>(example.data.item<float>()));
    const auto expected = reference.indices(epoch);
    CHECK(seen == std::vector<std::int64_t>(expected.data_ptr<std::int64_t>(),
                                            expected.data_ptr<std::int64_t>() + expected.numel()));
  }
  CHECK(sampler.epoch() == 6);  // each pass advances the shared epoch
}
