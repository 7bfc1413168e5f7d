#include "fulgur/callbacks/measure_flops.hpp"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <cstdlib>

#include <set>
#include <string_view>

#include "fulgur/errors.hpp"

namespace fulgur {
namespace {

bool is_matmul_or_convolution(std::string_view name) {
  for (std::string_view op : {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::conv1d", "aten::conv2d",
                              "aten::conv3d", "aten::convolution"})
    if (name == op) return true;
  return false;
}

}  // namespace

FlopCount count_flops(const std::function<void()>& step) {
  namespace impl = torch::profiler::impl;
  namespace profiler = torch::autograd::profiler;
  if (impl::profilerEnabled())
    throw MisconfigurationError("measure_flops: a profiler is already running in this process (TorchProfiler, or "
                                "another measure_flops): count the FLOPs before it starts or after it stops.");
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true,
                                    /*profile_memory=*/false, /*with_stack=*/false, /*with_flops=*/true);
  const std::set<impl::ActivityType> activities{impl::ActivityType::CPU};  // the operators, not the kernels
  // Kineto (built with CUPTI) logs "gpuGetDeviceCount failed" as an error where there is no GPU: noise here
  // (TorchProfiler does the same; a user's own KINETO_LOG_LEVEL is kept).
  if (!torch::cuda::is_available()) ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  try {
    step();
  } catch (...) {
    (void)profiler::disableProfiler();
    throw;
  }
  const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  FlopCount count;
  for (const profiler::KinetoEvent& event : result->events()) {
    const auto flops = static_cast<std::int64_t>(event.flops());
    if (flops == 0) continue;
    const std::string name = event.name();
    count.by_operator[name] += flops;
    count.total += flops;
    if (is_matmul_or_convolution(name)) count.matmul += flops;
  }
  return count;
}

std::int64_t measure_flops(const std::function<void()>& step) { return count_flops(step).matmul; }

}  // namespace fulgur
