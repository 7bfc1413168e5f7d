#include "fulgur/callbacks/model_summary.hpp"

#include <cmath>
#include <cstdio>
#include <functional>

#include "fulgur/errors.hpp"

namespace fulgur {
namespace {

std::string type_name(const torch::nn::Module& module) {
  std::string name = module.name();  // "torch::nn::Linear", or the demangled class of a user module
  if (const auto colon = name.rfind("::"); colon != std::string::npos) name = name.substr(colon + 2);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
  return name;
}

std::string padded(const std::string& text, std::size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

std::string with_commas(long long n) {
  std::string digits = std::to_string(n);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<std::size_t>(i), ",");
  return digits;
}

}  // namespace

std::string human_readable_count(std::int64_t number) {
  static const char* labels[] = {" ", "K", "M", "B", "T"};
  const int digits = number > 0 ? static_cast<int>(std::floor(std::log10(static_cast<double>(number)))) + 1 : 1;
  const int groups = std::min((digits + 2) / 3, 5);
  const double scaled = static_cast<double>(number) * std::pow(10.0, -3.0 * (groups - 1));
  const int index = groups - 1;
  if (index < 1 || scaled >= 100) return with_commas(static_cast<long long>(scaled)) + " " + labels[index];
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", scaled, labels[index]);
  return text;
}

ModelSummaryTable summarize(const torch::nn::Module& module, int max_depth) {
  if (max_depth < -1)
    throw MisconfigurationError("`max_depth` can be -1, 0 or > 0, got " + std::to_string(max_depth) + ".");
  ModelSummaryTable table;
  std::function<void(const torch::nn::Module&, const std::string&, int)> walk =
      [&](const torch::nn::Module& m, const std::string& prefix, int depth) {
        for (const auto& child : m.named_children()) {
          const std::string name = prefix.empty() ? child.key() : prefix + "." + child.key();
          if (max_depth < 0 || depth <= max_depth) {
            std::int64_t count = 0;
            for (const auto& p : child.value()->parameters()) count += p.numel();
            table.layers.push_back({name, type_name(*child.value()), count, child.value()->is_training()});
          }
          walk(*child.value(), name, depth + 1);
        }
      };
  if (max_depth != 0) walk(module, "", 1);
  for (const auto& p : module.parameters()) {
    table.total_parameters += p.numel();
    if (p.requires_grad()) table.trainable_parameters += p.numel();
    table.size_megabytes += static_cast<double>(p.numel() * static_cast<std::int64_t>(p.element_size())) / 1e6;
  }
  for (const auto& m : module.modules(/*include_self=*/false))
    (m->is_training() ? table.modules_in_train_mode : table.modules_in_eval_mode) += 1;
  return table;
}

std::string ModelSummaryTable::text() const {
  std::vector<std::vector<std::string>> columns = {{" "}, {"Name"}, {"Type"}, {"Params"}, {"Mode"}};
  for (std::size_t i = 0; i < layers.size(); ++i) {
    columns[0].push_back(std::to_string(i));
    columns[1].push_back(layers[i].name);
    columns[2].push_back(layers[i].type);
    columns[3].push_back(human_readable_count(layers[i].parameters));
    columns[4].emplace_back(layers[i].training ? "train" : "eval");
  }
  std::vector<std::size_t> widths;
  std::size_t total_width = 3 * (columns.size() + 1);  // Lightning's formula, index column included
  for (const auto& column : columns) {
    std::size_t width = 0;
    for (const auto& cell : column) width = std::max(width, cell.size());
    widths.push_back(width);
    total_width += width;
  }
  std::string out;
  for (std::size_t row = 0; row <= layers.size(); ++row) {
    for (std::size_t c = 0; c < columns.size(); ++c) out += (c ? " | " : "") + padded(columns[c][row], widths[c]);
    out += "\n";
    if (row == 0) out += std::string(total_width, '-') + "\n";
  }
  out += std::string(total_width, '-') + "\n";
  char size[32];
  std::snprintf(size, sizeof size, "%.3f", size_megabytes);
  out += padded(human_readable_count(trainable_parameters), 10) + "Trainable params\n";
  out += padded(human_readable_count(total_parameters - trainable_parameters), 10) + "Non-trainable params\n";
  out += padded(human_readable_count(total_parameters), 10) + "Total params\n";
  out += padded(size, 10) + "Total estimated model params size (MB)\n";
  out += padded(std::to_string(modules_in_train_mode), 10) + "Modules in train mode\n";
  out += padded(std::to_string(modules_in_eval_mode), 10) + "Modules in eval mode";
  return out;
}

void ModelSummary::on_fit_start(TrainerView& trainer, torch::nn::Module& module) {
  if (max_depth_ == 0) return;
  last_ = summarize(module, max_depth_).text();
  trainer.print(last_);
}

}  // namespace fulgur
