// Lightning's `devices` parsing (lightning/fabric/utilities/device_parser.py, cpu.py).
#include <ATen/Context.h>
#include <ATen/cpu/Utils.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <numeric>
#include <set>
#include <string>

#include "fulgur/accelerators/cpu.hpp"
#include "fulgur/accelerators/cuda.hpp"
#include "fulgur/accelerators/defaults.hpp"
#include "fulgur/accelerators/device_parsing.hpp"
#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::detail {

namespace {
std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool parse_int(std::string_view s, int& out) {
  s = trim(s);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

std::string list_text(const std::vector<int>& ids) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + "]";
}

std::vector<int> all_ids(int available) {
  std::vector<int> ids(static_cast<std::size_t>(std::max(available, 0)));
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

/// Lightning's texts say "GPU"/"gpu" for CUDA; other device types are named as they are.
std::string upper(std::string_view name) {
  std::string out(name);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name == "cuda" ? "GPU" : out;
}

std::vector<int> sanitize_ids(std::vector<int> ids, int available, std::string_view name) {
  const std::string kind = upper(name);
  const std::string use_the_cpu = "train on the CPU (" +
                                  spelled("fulgur::CPUAccelerator", "--trainer.accelerator=cpu") +
                                  "), or run on a machine with one.";
  if (ids.empty()) throw AcceleratorError(kind + "s requested but none are available: " + use_the_cpu);
  if (std::set<int>(ids.begin(), ids.end()).size() != ids.size())
    throw MisconfigurationError("Device ID's (" + kind + ") must be unique.");
  for (int id : ids)
    if (id < 0 || id >= available)
      throw AcceleratorError("You requested " + (name == "cuda" ? std::string("gpu") : std::string(name)) + ": " +
                             list_text(ids) + "\n But your machine only has: " + list_text(all_ids(available)) +
                             (available > 0 ? std::string() : "\n There is no " + kind + " here: " + use_the_cpu));
  return ids;
}

std::string accelerator_class(std::string_view name) { return name == "cuda" ? "CUDAAccelerator" : upper(name) + " accelerator"; }
}  // namespace

std::vector<int> parse_cpu_devices(int devices) {
  // -1 is "all devices" for every accelerator, as TrainerConfig::devices says: on the CPU, its
  // auto_device_count() (1), as "auto". (Lightning's CPUAccelerator refuses -1 while its messages offer it.)
  if (devices == -1) return all_ids(CPUAccelerator::auto_device_count());
  if (devices <= 0)
    throw MisconfigurationError("`devices` selected with `CPUAccelerator` should be an int > 0 (or -1 for all, which "
                                "on the CPU is 1 process), got " + std::to_string(devices) + ".");
  return all_ids(devices);
}

std::vector<int> parse_cpu_devices(std::string_view devices) {
  if (trim(devices) == "auto") return parse_cpu_devices(CPUAccelerator::auto_device_count());
  int n = 0;
  if (!parse_int(devices, n))
    throw MisconfigurationError("`devices` selected with `CPUAccelerator` should be an int > 0 (or -1 or \"auto\" "
                                "for all, which on the CPU is 1 process), got \"" + std::string(devices) + "\".");
  return parse_cpu_devices(n);
}

std::vector<int> parse_indexed_devices(int devices, int available, std::string_view name) {
  if (devices == 0)
    throw MisconfigurationError("`devices=0` is not a valid input using " + accelerator_class(name) +
                                ": ask for at least one device (an int > 0, -1 for all of them, or a list such as "
                                "\"1,3\").");
  if (devices == -1) return sanitize_ids(all_ids(available), available, name);
  if (devices < -1)
    throw MisconfigurationError("`devices` selected with `" + accelerator_class(name) +
                                "` should be an int > 0 or -1, got " + std::to_string(devices) + ".");
  return sanitize_ids(all_ids(devices), available, name);
}

std::vector<int> parse_indexed_devices(std::string_view spec, int available, std::string_view name) {
  const std::string_view s = trim(spec);
  if (s == "-1" || s == "auto") return parse_indexed_devices(-1, available, name);
  if (s.find(',') == std::string_view::npos) {
    int n = 0;
    if (!parse_int(s, n))
      throw MisconfigurationError("`devices` selected with `" + accelerator_class(name) +
                                  "` should be an int, -1, or a comma-separated list of device ids such as \"1,3\"; "
                                  "got \"" + std::string(spec) + "\".");
    return parse_indexed_devices(n, available, name);
  }
  std::vector<int> ids;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = std::min(s.find(',', start), s.size());
    const std::string_view item = trim(s.substr(start, comma - start));
    if (!item.empty()) {
      int id = 0;
      if (!parse_int(item, id))
        throw MisconfigurationError("`devices`: \"" + std::string(item) + "\" in \"" + std::string(spec) +
                                    "\" is not a device id; write ids as \"1,3\".");
      ids.push_back(id);
    }
    start = comma + 1;
  }
  return sanitize_ids(std::move(ids), available, name);
}

std::vector<int> parse_cuda_devices(int devices, int available) { return parse_indexed_devices(devices, available, "cuda"); }
std::vector<int> parse_cuda_devices(std::string_view devices, int available) {
  return parse_indexed_devices(devices, available, "cuda");
}

bool device_type_available(c10::DeviceType type) {
  if (type == c10::kCPU) return true;
  try {
    return at::globalContext().getAcceleratorHooksInterface(type).isAvailable();
  } catch (const c10::Error&) {
    return false;  // no hooks for this device type in this build
  }
}

int device_type_count(c10::DeviceType type) {
  if (type == c10::kCPU) return 1;
  if (!device_type_available(type)) return 0;
  return static_cast<int>(at::globalContext().getAcceleratorHooksInterface(type).deviceCount());
}

void set_current_device(const c10::Device& device) {
  if (device.is_cpu() || !device.has_index() || !c10::impl::hasDeviceGuardImpl(device.type())) return;
  c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
}

std::string available_accelerators_text() {
  return CUDAAccelerator::is_available() ? "['cpu', 'cuda']" : "['cpu']";
}

}  // namespace fulgur::detail

namespace fulgur {

bool CPUAccelerator::has_fast_reduced_precision() {
  // LibTorch's own test (mkldnn_bf16_device_check): AVX-512 BW, VL and DQ, or the native bf16/fp16 units.
  static const bool fast = [] {
    const auto capabilities = at::cpu::get_cpu_capabilities();
    const auto has = [&](const char* key) {
      const auto found = capabilities.find(key);
      return found != capabilities.end() && found->second.isBool() && found->second.toBool();
    };
    const auto architecture = capabilities.find("architecture");
    const bool x86 = architecture != capabilities.end() && architecture->second.isString() &&
                     architecture->second.toStringRef().find("x86") != std::string::npos;
    if (!x86) return true;  // no claim made about other CPUs
    return (has("avx512_bw") && has("avx512_vl") && has("avx512_dq")) || has("avx512_bf16") || has("amx_bf16") ||
           has("avx512_fp16") || has("amx_fp16");
  }();
  return fast;
}

}  // namespace fulgur

#if !FULGUR_WITH_CUDA
// Built without CUDA: the policy exists (so code naming it compiles) and reports no devices.
namespace fulgur {
bool CUDAAccelerator::is_available() { return false; }
int CUDAAccelerator::auto_device_count() { return 0; }
void CUDAAccelerator::setup_device(const c10::Device&) {
  throw AcceleratorError("fulgur was built without CUDA (FULGUR_WITH_CUDA=OFF): rebuild with a CUDA toolkit and "
                         "-DFULGUR_WITH_CUDA=ON, or use CPUAccelerator.");
}
void CUDAAccelerator::teardown() {}
bool CUDAAccelerator::supports_dtype(const c10::Device&, c10::ScalarType) { return false; }
}  // namespace fulgur
#endif
