// A checkpoint that Lightning 2.6 wrote (Trainer.save_checkpoint of a LightningModule holding its
// network as self.model, with hyperparameters that are Python objects) loads its weights into the
// matching C++ module bit for bit; a module that does not match gets an error that lists the missing
// and unexpected keys and says what to do. The checkpoint is written at test time by
// tests/checkpoint/lightning_checkpoint.py with the venv's Lightning (skipped without one).
#include <unistd.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/checkpoint/state.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/state_dict.hpp"

// After LibTorch: c10 defines a glog-style CHECK that must not replace Catch's.
#include <catch2/catch.hpp>

#include "support.hpp"


namespace {

using checkpoint_tests::TempFolder;
using checkpoint_tests::checkpoint_error;

using fulgur::StateDict;
namespace checkpoint = fulgur::checkpoint;



/// What the script wrote: the checkpoint, and the module's weights as Python had them.
struct Saved {
  std::string path;
  struct Tensor {
    std::string key, dtype;
    std::vector<std::int64_t> shape;
    std::string bytes;
  };
  std::vector<Tensor> expected;
};

std::string unhex(const std::string& hex) {
  std::string out(hex.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

/// Runs tests/checkpoint/lightning_checkpoint.py into `folder`; false (the test skipped) without a
/// Python that has Lightning.
bool write_lightning_checkpoint(const TempFolder& folder, Saved& saved) {
  const std::string python = FULGUR_TEST_PYTHON;
  if (python.empty() || ::access(python.c_str(), X_OK) != 0) {
    checkpoint_tests::skip("no Python to run Lightning with");
    return false;
  }
  if (std::system(("'" + python + "' -c 'import lightning' > /dev/null 2>&1").c_str()) != 0) {
    checkpoint_tests::skip("the Python at " + python + " has no Lightning");
    return false;
  }
  saved.path = folder / "lightning.ckpt";
  const std::string script = std::string(FULGUR_SOURCE_DIR) + "/tests/checkpoint/lightning_checkpoint.py";
  const std::string command = "'" + python + "' '" + script + "' '" + saved.path + "' '" + folder / "expected.txt" +
                              "' > '" + folder / "python.log" + "' 2>&1";
  if (std::system(command.c_str()) != 0) {
    std::ifstream log(folder / "python.log");
    FAIL("lightning_checkpoint.py failed:\n" << std::string(std::istreambuf_iterator<char>(log), {}));
  }
  std::ifstream expected(folder / "expected.txt");
  for (std::string line; std::getline(expected, line);) {
    std::istringstream fields(line);
    Saved::Tensor t;
    std::string shape, hex;
    fields >> t.key >> t.dtype >> shape >> hex;
    for (std::size_t at = 0; at < shape.size();) {
      const std::size_t x = shape.find('x', at);
      t.shape.push_back(std::stoll(shape.substr(at, x - at)));
      at = x == std::string::npos ? shape.size() : x + 1;
    }
    t.bytes = unhex(hex);
    saved.expected.push_back(t);
  }
  REQUIRE(saved.expected.size() == 4);
  return true;
}

/// The checkpoint, written once per process (each SECTION runs its test case again).
const Saved* lightning_checkpoint() {
  static TempFolder folder("fulgur-lightning");
  static Saved saved;
  static const bool written = write_lightning_checkpoint(folder, saved);
  if (!written) checkpoint_tests::skip("no Lightning checkpoint");
  return written ? &saved : nullptr;
}

/// The network the LightningModule holds as self.model, in C++.
torch::nn::Sequential network(std::int64_t hidden = 8) {
  return torch::nn::Sequential(torch::nn::Linear(4, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, 3));
}

std::string bytes_of(const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<std::size_t>(c.numel() * c.element_size()));
}

/// A C++ module that holds the network as a member "net": its keys are "net.0.weight", ...
struct WrapperImpl : torch::nn::Module {
  torch::nn::Sequential net{register_module("net", network())};
};
TORCH_MODULE(Wrapper);

const checkpoint::LoadOptions as_dicts{.python_objects = checkpoint::PythonObjects::as_dicts};

}  // namespace

TEST_CASE("a checkpoint saved by Lightning 2.6 loads its weights into the matching C++ module, bit for bit",
          "[lightning]") {
  const Saved* written = lightning_checkpoint();
  if (written == nullptr) return;
  const Saved& saved = *written;
  TempFolder tmp("fulgur-lightning");

  // Its hyperparameters hold Python objects: refused unless asked for, each named with where it is.
  const std::string refused = checkpoint_error([&] { checkpoint::load(saved.path); });
  CHECK_THAT(refused, Catch::Contains("checkpoint '" + saved.path + "' holds pickled Python objects") &&
                          Catch::Contains("pathlib.PosixPath at 'hyper_parameters'['data_dir']") &&
                          Catch::Contains("__main__.Activation at 'hyper_parameters'['activation']") &&
                          Catch::Contains("argparse.Namespace at 'hyper_parameters'['config']") &&
                          Catch::Contains("torch.float32 at 'hyper_parameters'['dtype']") &&
                          Catch::Contains("lightning.fabric.utilities.data.AttributeDict at 'hyper_parameters'['extra']") &&
                          Catch::Contains("PythonObjects::as_dicts") && Catch::Contains("never runs anything"));

  const StateDict c = checkpoint::load(saved.path, as_dicts);
  CHECK(c.at("pytorch-lightning_version").toStringRef().rfind("2.6", 0) == 0);
  CHECK(c.at("global_step").toInt() == 2);

  // The weights: the state_dict under "model.", loaded under strict, equal to Python's bit for bit.
  auto net = network();
  checkpoint::load_module_state_dict(*net, checkpoint::module_weights(c, "model."));
  const StateDict loaded = checkpoint::module_state_dict(*net);
  REQUIRE(loaded.size() == 4);
  for (const Saved::Tensor& t : saved.expected) {
    INFO(t.key);
    REQUIRE(t.key.rfind("model.", 0) == 0);
    const at::Tensor w = loaded.at(t.key.substr(6)).toTensor();
    CHECK(t.dtype == "float32");
    CHECK(w.scalar_type() == at::kFloat);
    CHECK(w.sizes() == c10::IntArrayRef(t.shape));
    CHECK(bytes_of(w) == t.bytes);
  }
  // "model" names the same submodule.
  auto again = network();
  checkpoint::load_module_state_dict(*again, checkpoint::module_weights(c, "model"));
  for (const auto& item : checkpoint::module_state_dict(*again))
    CHECK(bytes_of(item.value().toTensor()) == bytes_of(loaded.at(item.key().toStringRef()).toTensor()));

  // The Python objects, as dictionaries of their class and pickled contents.
  const StateDict hparams(c.at("hyper_parameters").toGenericDict());
  CHECK(hparams.at("hidden").toInt() == 8);
  CHECK(hparams.at("lr").toDouble() == 0.1);
  CHECK(hparams.at("name").toStringRef() == "tiny");
  const StateDict path(hparams.at("data_dir").toGenericDict());
  CHECK(path.at("__python__").toStringRef() == "pathlib.PosixPath");
  const auto parts = path.at("args").toTupleRef().elements();
  CHECK(parts.size() == 3);
  CHECK(parts.back().toStringRef() == "tiny");
  const StateDict activation(hparams.at("activation").toGenericDict());
  CHECK(activation.at("__python__").toStringRef() == "__main__.Activation");
  CHECK(activation.at("args").toTupleRef().elements().at(0).toStringRef() == "tanh");
  const StateDict config(hparams.at("config").toGenericDict());
  CHECK(config.at("__python__").toStringRef() == "argparse.Namespace");
  CHECK(config.at("state").toGenericDict().at("seed").toInt() == 7);
  CHECK(StateDict(hparams.at("dtype").toGenericDict()).at("__python__").toStringRef() == "torch.float32");
  const StateDict extra(hparams.at("extra").toGenericDict());
  CHECK(extra.at("__python__").toStringRef() == "lightning.fabric.utilities.data.AttributeDict");
  CHECK(extra.at("items").toGenericDict().at("note").toStringRef() == "kept");
  CHECK(extra.at("items").toGenericDict().at("scale").toDouble() == 2.5);

  // Callback states are read as they are.
  const StateDict callbacks(c.at("callbacks").toGenericDict());
  bool early_stopping = false;
  for (const auto& item : callbacks)
    if (item.key().toStringRef().rfind("EarlyStopping{", 0) == 0) {
      early_stopping = true;
      CHECK(item.value().toGenericDict().at("best_score").isTensor());
    }
  CHECK(early_stopping);

  // What fulgur read, it saves as plain dictionaries, which a default load reads.
  checkpoint::save(tmp / "resaved.ckpt", c);
  const StateDict resaved = checkpoint::load(tmp / "resaved.ckpt");
  CHECK(StateDict(resaved.at("hyper_parameters").toGenericDict()).at("data_dir").toGenericDict().at("__python__").toStringRef() ==
        "pathlib.PosixPath");

  // Not a fulgur training checkpoint, and Python's optimizer state is not LibTorch's: both say so.
  CHECK_THAT(checkpoint_error([&] { checkpoint::check_format(c, "checkpoint 'lightning.ckpt'"); }),
             Catch::Contains("written by Lightning") && Catch::Contains("module_weights(checkpoint, \"model.\")"));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const StateDict python_sgd(c.at("optimizer_states").toListRef().at(0).toGenericDict());
  CHECK_THAT(checkpoint_error([&] { checkpoint::load_optimizer_state_dict(sgd, python_sgd); }),
             Catch::Contains("PyTorch (Python) optimizer's state_dict()") && Catch::Contains("start afresh"));
}

TEST_CASE("a Lightning checkpoint and a module that does not match: strict lists the missing and unexpected keys "
          "and says what to do",
          "[lightning]") {
  const Saved* written = lightning_checkpoint();
  if (written == nullptr) return;
  const Saved& saved = *written;
  const StateDict c = checkpoint::load(saved.path, as_dicts);
  const StateDict weights = checkpoint::module_weights(c, "model.");

  SECTION("other layer sizes") {
    auto wider = network(16);
    const std::string m = checkpoint_error([&] { checkpoint::load_module_state_dict(*wider, weights); });
    CHECK_THAT(m, Catch::Contains("the state_dict does not fit the module Sequential") &&
                      Catch::Contains("size mismatch for 0.weight (expected shape [16, 4], got [8, 4])") &&
                      Catch::Contains("size mismatch for 2.weight (expected shape [3, 16], got [3, 8])") &&
                      Catch::Contains("build the module with the sizes it was trained with"));
    // Not even without strict: a layer of another size cannot take these weights.
    CHECK_THAT(checkpoint_error([&] { checkpoint::load_module_state_dict(*wider, weights, false); }),
               Catch::Contains("size mismatch for 0.bias"));
  }
  SECTION("a layer missing from the module") {
    torch::nn::Sequential shorter(torch::nn::Linear(4, 8), torch::nn::ReLU());
    const std::string m = checkpoint_error([&] { checkpoint::load_module_state_dict(*shorter, weights); });
    CHECK_THAT(m, Catch::Contains("Unexpected key(s) in state_dict: \"2.weight\", \"2.bias\".") &&
                      Catch::Contains("lacks layers the saved network has") &&
                      Catch::Contains("pass strict = false"));
    CHECK_THAT(m, !Catch::Contains("Missing key(s)"));
    // Without strict, the layers it has load, bit for bit.
    checkpoint::load_module_state_dict(*shorter, weights, false);
    CHECK(bytes_of(shorter[0]->as<torch::nn::Linear>()->weight) == saved.expected.at(0).bytes);
  }
  SECTION("a layer the saved network lacks") {
    torch::nn::Sequential longer(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3), torch::nn::ReLU(),
                                 torch::nn::Linear(3, 2));
    const std::string m = checkpoint_error([&] { checkpoint::load_module_state_dict(*longer, weights); });
    CHECK_THAT(m, Catch::Contains("Missing key(s) in state_dict: \"4.weight\", \"4.bias\".") &&
                      Catch::Contains("has layers the saved network lacks") && Catch::Contains("pass strict = false"));
    CHECK_THAT(m, !Catch::Contains("Unexpected key(s)"));
  }
  SECTION("the prefix not taken off") {
    auto net = network();
    const std::string m =
        checkpoint_error([&] { checkpoint::load_module_state_dict(*net, checkpoint::module_weights(c)); });
    CHECK_THAT(m, Catch::Contains("Missing key(s) in state_dict: \"0.weight\", \"0.bias\", \"2.weight\", \"2.bias\".") &&
                      Catch::Contains("Unexpected key(s) in state_dict: \"model.0.weight\", \"model.0.bias\", "
                                      "\"model.2.weight\", \"model.2.bias\".") &&
                      Catch::Contains("start with 'model.' where the module's do not") &&
                      Catch::Contains("fulgur::checkpoint::module_weights(checkpoint, \"model.\")"));
  }
  SECTION("a wrong prefix") {
    const std::string m = checkpoint_error([&] { checkpoint::module_weights(c, "net."); });
    CHECK_THAT(m, Catch::Contains("no key of the checkpoint's state_dict starts with 'net.'") &&
                      Catch::Contains("its 4 keys start with 'model.' (4 keys)") &&
                      Catch::Contains("module_weights(checkpoint, \"model.\")"));
    CHECK_THAT(checkpoint_error([&] { checkpoint::module_weights(c, "model.0.weights"); }),
               Catch::Contains("start with 'model.' (4 keys)"));
  }
  SECTION("a module that holds the network one level down") {
    Wrapper wrapper;
    const std::string m = checkpoint_error([&] { checkpoint::load_module_state_dict(*wrapper, weights); });
    CHECK_THAT(m, Catch::Contains("Missing key(s) in state_dict: \"net.0.weight\"") &&
                      Catch::Contains("Unexpected key(s) in state_dict: \"0.weight\"") &&
                      Catch::Contains("The module's keys start with 'net.' where the state_dict's do not"));
    checkpoint::load_module_state_dict(*wrapper->net, weights);
    CHECK(bytes_of(wrapper->net[2]->as<torch::nn::Linear>()->bias) == saved.expected.at(3).bytes);
  }
  SECTION("a module of nothing in common") {
    torch::nn::Sequential other(torch::nn::Linear(2, 2));
    StateDict foreign;
    foreign.insert("encoder.weight", at::zeros({2, 2}));
    foreign.insert("decoder.weight", at::zeros({2, 2}));
    const std::string m = checkpoint_error([&] { checkpoint::load_module_state_dict(*other, foreign); });
    CHECK_THAT(m, Catch::Contains("No key matches: the state_dict's keys start with 'encoder.' (1), 'decoder.' (1), "
                                  "the module's with '0.' (2)"));
  }
}
