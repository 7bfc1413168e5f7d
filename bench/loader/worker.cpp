// The C++ side of bench/loader/loader.py: reads a .npy of uint8 images N x 3 x 64 x 64 and makes
// batches of augmented float images — a random 56 x 56 crop, a horizontal flip half the time, to
// float, normalised per channel — with fulgur::data::DataLoader or LibTorch's torch::data loader,
// and prints the samples per second of `--batches` batches after one warm-up batch.
//
//   bench_loader_worker --npy images.npy --loader fulgur|torch_data --workers W --batch B --batches K
//
// Both loaders shuffle and read the same per-sample work; one intra-op thread in the process (the
// workers' own parallelism is what is measured). Output: `samples_per_s=<x> checksum=<y>`.
#include <ATen/CPUGeneratorImpl.h>
#include <fulgur/data/data_loader.hpp>
#include <fulgur/data/npy_array.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr std::int64_t kCrop = 56;

/// The per-sample work both loaders do: crop, flip, to float, normalise. offsets: 3 random draws.
at::Tensor augment(const at::Tensor& image, std::uint64_t r0, std::uint64_t r1, std::uint64_t r2) {
  static const at::Tensor mean = at::tensor({0.485, 0.456, 0.406}, at::kFloat).view({3, 1, 1}) * 255;
  static const at::Tensor inv_std = 1 / (at::tensor({0.229, 0.224, 0.225}, at::kFloat).view({3, 1, 1}) * 255);
  const std::int64_t room = image.size(1) - kCrop + 1;
  at::Tensor crop = image.narrow(1, static_cast<std::int64_t>(r0 % static_cast<std::uint64_t>(room)), kCrop)
                        .narrow(2, static_cast<std::int64_t>(r1 % static_cast<std::uint64_t>(room)), kCrop);
  if (r2 % 2 == 1) crop = crop.flip({2});
  return (crop.to(at::kFloat) - mean) * inv_std;
}

/// fulgur's dataset: the sample's draws come from the generator the loader hands to get.
struct AugmentedImages {
  fulgur::data::NpyArray images;
  std::int64_t size() const { return images.size(); }
  std::pair<at::Tensor, std::int64_t> get(std::int64_t i, at::Generator& generator) const {
    auto* g = at::check_generator<at::CPUGeneratorImpl>(generator);
    return {augment(images.get(i), g->random64(), g->random64(), g->random64()), i % 10};
  }
};

/// The same for torch::data (its datasets draw from the global generator, under its lock).
struct TorchDataImages : torch::data::datasets::Dataset<TorchDataImages> {
  explicit TorchDataImages(fulgur::data::NpyArray a) : images(std::move(a)) {}
  torch::data::Example<> get(std::size_t index) override {
    const auto i = static_cast<std::int64_t>(index);
    auto draws = at::randint(1 << 30, {3}, at::kLong);
    const auto* d = draws.data_ptr<std::int64_t>();
    return {augment(images.get(i), static_cast<std::uint64_t>(d[0]), static_cast<std::uint64_t>(d[1]),
                    static_cast<std::uint64_t>(d[2])),
            at::scalar_tensor(i % 10, at::kLong)};
  }
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>(images.size()); }
  fulgur::data::NpyArray images;
};

template <class Next>
void time_batches(std::int64_t batches, std::int64_t batch, Next next) {
  double checksum = next();  // warm-up: workers started, first batch made
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t k = 0; k < batches; ++k) checksum += next();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("samples_per_s=%.1f checksum=%.6g\n", static_cast<double>(batches * batch) / seconds, checksum);
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_loader_worker: %s\nusage: bench_loader_worker --npy FILE --loader fulgur|torch_data "
               "--workers W --batch B --batches K\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string npy, loader;
  std::int64_t workers = -1, batch = 0, batches = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--npy") npy = value;
    else if (key == "--loader") loader = value;
    else if (key == "--workers") workers = std::stoll(value);
    else if (key == "--batch") batch = std::stoll(value);
    else if (key == "--batches") batches = std::stoll(value);
    else usage(("unknown option " + key).c_str());
  }
  if (argc % 2 == 0) usage("options come in pairs");
  if (npy.empty() || (loader != "fulgur" && loader != "torch_data") || workers < 0 || batch <= 0 || batches <= 0)
    usage("missing or bad option");
  at::set_num_threads(1);
  fulgur::data::NpyArray images(npy);
  if (images.dtype() != at::kByte || images.shape().size() != 4 || images.shape()[1] != 3)
    usage("the .npy must be uint8 N x 3 x H x W");
  if ((batches + 1) * batch > images.size()) usage("fewer images than (batches + 1) x batch");
  if (loader == "fulgur") {
    fulgur::data::DataLoader data(AugmentedImages{images},
                                  {.batch_size = batch, .shuffle = true, .num_workers = static_cast<int>(workers), .seed = 1});
    auto it = data.begin();
    time_batches(batches, batch, [&] {
      const double sum = (*it).first.sum().item<double>();
      ++it;
      return sum;
    });
  } else {
    auto data = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
        TorchDataImages(images).map(torch::data::transforms::Stack<>()),
        torch::data::DataLoaderOptions().batch_size(static_cast<std::size_t>(batch)).workers(static_cast<std::size_t>(workers)));
    auto it = data->begin();
    time_batches(batches, batch, [&] {
      const double sum = it->data.sum().item<double>();
      ++it;
      return sum;
    });
  }
}
