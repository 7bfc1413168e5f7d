#include "fulgur/accelerators/peak_flops.hpp"

#include <ATen/Context.h>

#include <cctype>
#include <cmath>
#include <initializer_list>
#include <sstream>
#include <utility>
#include <vector>

#if FULGUR_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace fulgur {
namespace {

struct ChipFlops {
  std::string_view chip;
  std::initializer_list<std::pair<std::string_view, double>> flops;
};

// Lightning 2.6's _CUDA_FLOPS (lightning/fabric/utilities/throughput.py), entry for entry; the unit
// tests compare every chip and dtype with the venv's Lightning.
const ChipFlops kCudaFlops[] = {
    {"h200 sxm1", {{"float64", 3.4e13}, {"float32", 6.7e13}, {"tfloat32", 9.9e14}, {"bfloat16", 2.0e15},
                   {"float16", 2.0e15}, {"int8", 4.0e15}}},
    {"h200 nvl1", {{"float64", 3.0e13}, {"float32", 6.0e13}, {"tfloat32", 8.4e14}, {"bfloat16", 1.7e15},
                   {"float16", 1.7e15}, {"int8", 3.3e15}}},
    {"h100 nvl", {{"float64", 67e12}, {"float32", 133.8e12}, {"tfloat32", 989.4e12}, {"bfloat16", 1978.8e12},
                  {"float16", 1978.8e12}, {"int8", 3957.8e12}}},
    {"h100 sxm", {{"float64", 33.5e12}, {"float32", 66.9e12}, {"tfloat32", 494.7e12}, {"bfloat16", 989.4e12},
                  {"float16", 989.4e12}, {"int8", 1978.9e12}}},
    {"h100 pcie", {{"float64", 25.6e12}, {"float32", 51.2e12}, {"tfloat32", 378e12}, {"bfloat16", 756e12},
                   {"float16", 756e12}, {"int8", 1513e12}}},
    {"rtx 4090", {{"float32", 82.6e12}, {"tfloat32", 82.6e12}, {"bfloat16", 82.6e12}, {"float16", 82.6e12},
                  {"int8", 660.6e12}, {"int4", 1321.2e12}}},
    {"rtx 4080", {{"float32", 48.7e12}, {"tfloat32", 48.7e12}, {"bfloat16", 48.7e12}, {"float16", 48.7e12},
                  {"int8", 389.9e12}, {"int4", 779.8e12}}},
    {"rtx 4080 super", {{"float32", 52.2e12}, {"tfloat32", 52.2e12}, {"bfloat16", 52.2e12}, {"float16", 52.2e12},
                        {"int8", 417.6e12}, {"int4", 835.2e12}}},
    {"l4", {{"float32", 30.3e12}, {"tfloat32", 60e12}, {"bfloat16", 121e12}, {"float16", 121e12}, {"int8", 242e12},
            {"int4", 484e12}}},
    {"l40", {{"float32", 90.5e12}, {"tfloat32", 90.5e12}, {"bfloat16", 181e12}, {"float16", 181e12},
             {"int8", 362e12}, {"int4", 724e12}}},
    {"a100", {{"float64", 9.7e12}, {"float32", 19.5e12}, {"tfloat32", 156e12}, {"bfloat16", 312e12},
              {"float16", 312e12}, {"int8", 624e12}}},
    {"a6000", {{"float32", 38.7e12}, {"tfloat32", 77.4e12}, {"bfloat16", 38.7e12}, {"float16", 38.7e12},
               {"int8", 309.7e12}, {"int4", 619.3e12}}},
    {"a40", {{"float32", 37.4e12}, {"tfloat32", 74.8e12}, {"bfloat16", 37.4e12}, {"float16", 37.4e12},
             {"int8", 299.3e12}, {"int4", 598.7e12}}},
    {"a10g", {{"float32", 31.2e12}, {"tfloat32", 62.5e12}, {"bfloat16", 125e12}, {"float16", 125e12},
              {"int8", 250e12}, {"int4", 500e12}}},
    {"rtx 3090 ti", {{"float32", 40e12}, {"tfloat32", 40e12}, {"bfloat16", 40e12}, {"float16", 40e12},
                     {"int8", 320e12}, {"int4", 640e12}}},
    {"rtx 3090", {{"float32", 35.6e12}, {"tfloat32", 35.6e12}, {"bfloat16", 35.6e12}, {"float16", 35.6e12},
                  {"int8", 284e12}, {"int4", 568e12}}},
    {"rtx 3080 ti", {{"float32", 34.1e12}, {"tfloat32", 34.1e12}, {"bfloat16", 34.1e12}, {"float16", 34.1e12},
                     {"int8", 272.8e12}, {"int4", 546.6e12}}},
    {"rtx 3080", {{"float32", 29.8e12}, {"tfloat32", 29.8e12}, {"bfloat16", 29.8e12}, {"float16", 29.8e12},
                  {"int8", 238e12}, {"int4", 476e12}}},
    {"rtx 3070", {{"float32", 20.3e12}, {"tfloat32", 20.3e12}, {"bfloat16", 20.3e12}, {"float16", 20.3e12},
                  {"int8", 162.6e12}, {"int4", 325.2e12}}},
    {"t4", {{"float32", 8.1e12}, {"float16", 65e12}, {"int8", 130e12}, {"int4", 260e12}}},
    {"quadro rtx 5000", {{"float32", 11.2e12}, {"float16", 89.2e12}}},
    {"rtx 2080 super", {{"float32", 11.2e12}, {"float16", 22.3e12}, {"int8", 178.4e12}, {"int4", 356.8e12}}},
    {"rtx 2080 ti", {{"float32", 14.2e12}, {"float16", 28.5e12}, {"int8", 227.7e12}, {"int4", 455.4e12}}},
    {"rtx 2080", {{"float32", 10.6e12}, {"float16", 21.2e12}, {"int8", 169.6e12}, {"int4", 339.1e12}}},
    {"rtx 2070 super", {{"float32", 9.1e12}, {"float16", 18.1e12}, {"int8", 145e12}, {"int4", 290e12}}},
    {"titan rtx", {{"float32", 16.3e12}, {"float16", 32.6e12}, {"int8", 261e12}, {"int4", 522e12}}},
    {"v100 sxm", {{"float64", 7.8e12}, {"float32", 15.7e12}, {"float16", 125e12}}},
    {"v100 pcie", {{"float64", 7e12}, {"float32", 14e12}, {"float16", 112e12}}},
    {"v100s pcie", {{"float64", 8.2e12}, {"float32", 16.4e12}, {"float16", 130e12}}},
};

bool has(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view dtype_key(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kDouble: return "float64";
    case c10::kFloat: return "float32";
    case c10::kBFloat16: return "bfloat16";
    case c10::kHalf: return "float16";
    case c10::kChar: return "int8";
    default: return "";
  }
}

}  // namespace

std::string cuda_chip_name(std::string_view device_name) {
  const std::string chip = lower(device_name);
  if (has(chip, "h200")) {
    if (has(chip, "sxm1")) return "h200 sxm1";
    if (has(chip, "nvl1")) return "h200 nvl1";
    return chip;  // Lightning keeps the name, which the table then lacks
  }
  if (has(chip, "h100")) {
    if (has(chip, "hbm3")) return "h100 sxm";
    if (has(chip, "nvl")) return "h100 nvl";
    if (has(chip, "pcie") || has(chip, "hbm2e")) return "h100 pcie";
    return chip;
  }
  if (has(chip, "l4")) return has(chip, "tesla") ? "l40" : "l4";
  if (has(chip, "geforce rtx")) {
    std::istringstream words(chip);
    std::vector<std::string> split;
    for (std::string word; std::getline(words, word, ' ');) split.push_back(word);
    if (split.size() < 4) return {};  // Lightning's chip.split(" ")[3] fails there
    const std::string extra = has(chip, "super") ? " super" : has(chip, "ti") ? " ti" : "";
    return "rtx " + split[3] + extra;
  }
  for (std::string_view part : {"a6000", "a100", "a40", "a10g", "t4", "quadro rtx 5000", "titan rtx"})
    if (has(chip, part)) return std::string(part);
  if (has(chip, "v100-sxm")) return "v100 sxm";
  if (has(chip, "v100-pcie")) return "v100 pcie";
  if (has(chip, "v100s-pcie")) return "v100s pcie";
  return {};
}

std::optional<double> peak_flops(std::string_view device_name, std::string_view dtype, std::string* why) {
  const std::string chip = cuda_chip_name(device_name);
  auto say = [&](std::string text) {
    if (why != nullptr) *why = std::move(text);
    return std::nullopt;
  };
  if (chip.empty()) return say("FLOPs not found for '" + std::string(device_name) + "'");
  for (const ChipFlops& entry : kCudaFlops) {
    if (entry.chip != chip) continue;
    for (const auto& [key, flops] : entry.flops)
      if (key == dtype) return std::trunc(flops);
    return say("'" + std::string(device_name) + "' does not support " + std::string(dtype));
  }
  return say("FLOPs not found for '" + std::string(device_name) + "', chip is '" + chip + "'");
}

std::optional<double> available_flops(const c10::Device& device, c10::ScalarType dtype, std::string* why) {
  if (!device.is_cuda()) return std::nullopt;
#if FULGUR_WITH_CUDA
  const auto* properties = at::cuda::getDeviceProperties(device.has_index() ? device.index() : c10::DeviceIndex{0});
  std::string_view key = dtype_key(dtype);
  // Lightning asks the current device's capability (_is_ampere_or_later): the training device is current.
  if (dtype == c10::kFloat && properties->major >= 8 &&
      at::globalContext().float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST)
    key = "tfloat32";
  return peak_flops(properties->name, key, why);
#else
  (void)dtype;
  if (why != nullptr) *why = "this fulgur was built without CUDA (FULGUR_WITH_CUDA=OFF)";
  return std::nullopt;
#endif
}

c10::ScalarType compute_dtype(std::string_view precision) {
  if (precision == "16-mixed" || precision == "16-true") return c10::kHalf;
  if (precision == "bf16-mixed" || precision == "bf16-true") return c10::kBFloat16;
  if (precision == "64-true") return c10::kDouble;
  return c10::kFloat;
}

}  // namespace fulgur
