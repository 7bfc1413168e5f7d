#pragma once
// fulgur::cli::SaveConfig: Lightning's SaveConfigCallback, added by the CLI to every Trainer it builds.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <variant>

#include "fulgur/callbacks/trainer_view.hpp"
#include "fulgur/detail/atomic_file.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/loggers/hyperparameters.hpp"
#include "fulgur/stage.hpp"
#include "fulgur/state_dict.hpp"

namespace fulgur::cli {

/// The CLI's own callback: writes config.yaml where the loggers write (global rank 0, fit only), adds
/// the config to each checkpoint's hyper_parameters and to the loggers' hyper-parameters.
class SaveConfig {
 public:
  SaveConfig(std::string yaml, Hyperparameters flat, Hyperparameters model, bool enabled)
      : yaml_(std::move(yaml)), flat_(std::move(flat)), model_(std::move(model)), enabled_(enabled) {}
  void setup(TrainerView& trainer, torch::nn::Module&, Stage stage) {
    if (!enabled_ || stage != Stage::fit || !trainer.is_global_zero() || written_) return;
    written_ = true;
    // POSIX, not std::filesystem (fulgur/detail/files.hpp says why), and a folder that cannot be made is named
    // by the keys that place it (a probe found std::filesystem's raw "cannot create directories").
    const std::string dir = trainer.log_dir();
    try {
      fulgur::detail::make_directories(dir);
    } catch (const std::exception& e) {  // e names the folder, the OS's reason and what to check
      throw MisconfigurationError(std::string(e.what()) + " (the run's log directory, where the resolved config is "
                                  "written: trainer.default_root_dir, or the logger's save_dir)");
    }
    // Never over another run's config (a resumed run writes into the same log directory): the next free name.
    std::string path = dir + "/config.yaml";
    for (int version = 1; fulgur::detail::path_exists(path); ++version) {
      std::ifstream in(path);
      std::stringstream old;
      old << in.rdbuf();
      if (old.str() == yaml_) return;  // this config, kept already (a resumed run)
      path = dir + "/config-v" + std::to_string(version) + ".yaml";
    }
    fulgur::detail::atomic_write(path, yaml_, "the resolved config");
    if (path != dir + "/config.yaml")  // said: runs sharing a folder leave config-v1, -v2, ... beside each other
      std::cerr << "fulgur::cli: " << dir << "/config.yaml holds another run's config; this run's is " << path
                << (trainer.has_loggers() ? "" : " (with a logger each run has a version folder of its own)")
                << std::endl;
  }
  Hyperparameters hyperparameters() const { return enabled_ ? flat_ : Hyperparameters{}; }
  /// hyper_parameters: the model's keys (as Lightning's save_hyperparameters stores its init args) and
  /// "config", the resolved YAML that --config reruns.
  void on_save_checkpoint(TrainerView&, torch::nn::Module&, StateDict& checkpoint) const {
    if (!enabled_) return;
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    if (checkpoint.contains("hyper_parameters") && checkpoint.at("hyper_parameters").isGenericDict())
      dict = checkpoint.at("hyper_parameters").toGenericDict();
    for (const auto& [key, value] : model_)
      std::visit([&, k = key](const auto& v) { dict.insert_or_assign(k, c10::IValue(v)); }, value);
    dict.insert_or_assign("config", yaml_);
    checkpoint.insert("hyper_parameters", dict);
  }

 private:
  std::string yaml_;
  Hyperparameters flat_, model_;
  bool enabled_;
  bool written_ = false;
};


}  // namespace fulgur::cli
