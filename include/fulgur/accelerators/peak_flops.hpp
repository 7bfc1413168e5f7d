#pragma once
// A device's theoretical peak FLOP/s, for model FLOPs utilization (MFU): Lightning's
// get_available_flops — the same table (NVIDIA's data sheets, dense, without sparsity), the same
// reading of the CUDA device name and the same dtype keys. An optimistic upper limit, reachable only
// by thick matmuls. The CPU has none (Lightning returns None there): MFU is then not reported.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <string_view>

namespace fulgur {

/// The table's key for a CUDA device name, as Lightning derives it ("NVIDIA H100 80GB HBM3" -> "h100 sxm",
/// "NVIDIA GeForce RTX 4090" -> "rtx 4090"); empty for a name Lightning does not parse.
std::string cuda_chip_name(std::string_view device_name);

/// The peak FLOP/s of the CUDA device named `device_name` for `dtype`, one of Lightning's keys:
/// "float64", "float32", "tfloat32", "bfloat16", "float16", "int8", "int4". Truncated to an integer, as
/// Lightning's int(). None where the table has no entry; `why` (if given) then says what is missing.
std::optional<double> peak_flops(std::string_view device_name, std::string_view dtype, std::string* why = nullptr);

/// Lightning's get_available_flops(device, dtype): on CUDA the device's name and, for float32, "tfloat32"
/// on Ampere or newer unless the float32 matmul precision is "highest"; None on any other device.
std::optional<double> available_flops(const c10::Device& device, c10::ScalarType dtype, std::string* why = nullptr);

/// The dtype the matmuls of a precision run in (Lightning's _plugin_to_compute_dtype), by the
/// precision's name: "32-true" float32, "16-mixed" and "16-true" float16, "bf16-mixed" and "bf16-true"
/// bfloat16, "64-true" float64. Another name: float32 (Lightning's default for a plain Precision).
c10::ScalarType compute_dtype(std::string_view precision);

}  // namespace fulgur
