#pragma once
// Shared by the unit tests: golden-value files, a small classifier module, data, comparisons.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "fulgur/detail/files.hpp"
#include "fulgur/fulgur.hpp"

namespace test {

/// Reads a file written by scripts/make_golden.py: key -> tensor (dtype and shape as written).
inline std::map<std::string, at::Tensor> read_golden(const std::string& name) {
  const std::string path = std::string(FULGUR_GOLDEN_DIR) + "/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("golden file " + path + " is missing: ctest runs golden.generate first");
  std::map<std::string, at::Tensor> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key, dtype, shape_text, value;
    fields >> key >> dtype >> shape_text;
    std::vector<double> values;
    while (fields >> value) values.push_back(std::strtod(value.c_str(), nullptr));
    std::vector<std::int64_t> shape;
    if (shape_text != "-") {
      std::istringstream dims(shape_text);
      std::string d;
      while (std::getline(dims, d, ',')) shape.push_back(std::stoll(d));
    }
    const std::map<std::string, at::ScalarType> dtypes{{"float32", at::kFloat},   {"float64", at::kDouble},
                                                       {"float16", at::kHalf},    {"bfloat16", at::kBFloat16},
                                                       {"int64", at::kLong},      {"bool", at::kBool}};
    out[key] = torch::tensor(values, at::kDouble).reshape(shape).to(dtypes.at(dtype));
  }
  return out;
}

/// Equality of values (NaN where the other has NaN, every other value equal), dtype and shape.
inline bool identical(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto x = a.to(at::kDouble), y = b.to(at::kDouble);
  const auto nan_x = x.isnan(), nan_y = y.isnan();
  return torch::equal(nan_x, nan_y) && torch::equal(x.masked_fill(nan_x, 0.0), y.masked_fill(nan_y, 0.0));
}

/// A small classifier: 2 linear layers with ReLU, Adam or SGD.
struct ClassifierImpl : torch::nn::Module {
  explicit ClassifierImpl(std::int64_t in = 8, std::int64_t hidden = 16, std::int64_t classes = 3,
                          bool use_sgd = false, double lr = 1e-2)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, classes))),
        use_sgd(use_sgd),
        lr(lr) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  at::Tensor validation_step(const fulgur::data::Batch& b, std::int64_t i) { return training_step(b, i); }
  at::Tensor test_step(const fulgur::data::Batch& b, std::int64_t i) { return training_step(b, i); }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    if (use_sgd) return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
    return std::make_unique<torch::optim::Adam>(parameters(), lr);
  }
  torch::nn::Linear fc1, fc2;
  bool use_sgd;
  double lr;
};
TORCH_MODULE(Classifier);

/// n samples of 8 features; 3 classes that depend on the features (learnable).
inline std::pair<at::Tensor, at::Tensor> classification_data(std::int64_t n, std::uint64_t seed = 0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = at::randn({n, 8}, gen);
  auto y = (x.select(1, 0) > 0).to(at::kLong) + (x.select(1, 1) > 0.5).to(at::kLong);
  return {x, y};
}

inline std::vector<at::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

template <class Exception>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Exception& e) {
    return e.what();
  }
  return "<no exception>";
}

using CPU = fulgur::CPUAccelerator;
using Single = fulgur::SingleDeviceStrategy;
template <class P, class... Callbacks>
using CpuTrainer = fulgur::Trainer<CPU, Single, P, Callbacks...>;

/// What a shell command prints on its standard output; throws if it cannot start or exits non-zero.
inline std::string run_command(const std::string& command) {
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run: " + command);
  std::string out;
  char buffer[4096];
  while (const std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  if (::pclose(pipe) != 0) throw std::runtime_error("failed (" + command + "), having printed: " + out);
  return out;
}

/// A fresh, empty directory under the build's test folder (removed first if a run left one).
inline std::string temporary_directory(const std::string& name) {
  // POSIX helpers, not std::filesystem (fulgur/detail/files.hpp says why)
  std::string golden = FULGUR_GOLDEN_DIR;
  const std::string path = golden.substr(0, golden.find_last_of('/')) + "/scratch/" + name;
  fulgur::detail::remove_tree(path);
  fulgur::detail::make_directories(path);
  return path;
}

/// An optimizer's LibTorch archive (Optimizer::save), as bytes; and loading such bytes.
inline std::string archive_bytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}
inline void load_archive_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  optimizer.load(archive);
}

inline fulgur::TrainerConfig quiet(fulgur::TrainerConfig c = {}) {
  c.enable_progress_bar = false;
  return c;
}

/// This process's scratch folders live under one root, removed when the process exits.
inline const std::string& scratch_root() {
  static const struct Root {
    std::string path = "/tmp/fulgur_unit_tests_" + std::to_string(::getpid());
    ~Root() { fulgur::detail::remove_tree(path); }
  } root{};
  return root.path;
}

/// An empty folder of that name under scratch_root().
inline std::string scratch_folder(const std::string& name) {
  const std::string folder = scratch_root() + "/" + name;
  fulgur::detail::remove_tree(folder);
  fulgur::detail::make_directories(folder);
  return folder;
}

}  // namespace test
