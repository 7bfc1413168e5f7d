#pragma once
// ModelSummary: the module's layers with their parameter counts, as Lightning prints it when fit
// starts (its ModelSummary callback and model_summary table, without the FLOPs column, which needs
// an example input).
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fulgur/callbacks/trainer_view.hpp"

namespace fulgur {

/// One row of the table: a submodule down to the summary's depth.
struct LayerSummary {
  std::string name;        ///< "encoder.0"
  std::string type;        ///< "Linear"
  std::int64_t parameters = 0;
  bool training = true;
};

struct ModelSummaryTable {
  std::vector<LayerSummary> layers;
  std::int64_t trainable_parameters = 0;
  std::int64_t total_parameters = 0;
  double size_megabytes = 0.0;  ///< the parameters' bytes in their own dtypes / 1e6
  std::int64_t modules_in_train_mode = 0, modules_in_eval_mode = 0;
  /// Lightning's text for it.
  std::string text() const;
};

/// The table for `module`, layers down to max_depth (1: its children; -1: every level).
ModelSummaryTable summarize(const torch::nn::Module& module, int max_depth = 1);
/// Lightning's get_human_readable_count: 2100 -> "2.1 K", 330 -> "330  ".
std::string human_readable_count(std::int64_t number);

class ModelSummary {
 public:
  explicit ModelSummary(int max_depth = 1) : max_depth_(max_depth) {}
  void on_fit_start(TrainerView& trainer, torch::nn::Module& module);
  /// The table printed at the last fit start.
  const std::string& last_summary() const { return last_; }

 private:
  int max_depth_;
  std::string last_;
};

}  // namespace fulgur
