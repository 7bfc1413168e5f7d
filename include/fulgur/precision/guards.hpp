#pragma once
// The RAII contexts that precision policies return from *_context(). Each is non-copyable and
// non-movable: it is returned by value (guaranteed elision) and lives for the caller's scope.
#include <c10/core/DefaultDtype.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/typeid.h>

namespace fulgur {

/// A context that does nothing (the 32-true contexts).
struct [[nodiscard]] NullContext {
  NullContext() = default;
  // User-provided, so `auto ctx = p.forward_context();` is not flagged as unused.
  ~NullContext() {}  // NOLINT(modernize-use-equals-default)
  NullContext(const NullContext&) = delete;
  NullContext& operator=(const NullContext&) = delete;
};

/// Switches the global default dtype for its lifetime. The previous dtype is recorded at
/// construction and restored on destruction, also when the scope is left by an exception.
class [[nodiscard]] DefaultDtypeGuard {
 public:
  explicit DefaultDtypeGuard(c10::ScalarType dtype) : previous_(c10::get_default_dtype()) {
    c10::set_default_dtype(caffe2::TypeMeta::fromScalarType(dtype));
  }
  ~DefaultDtypeGuard() { c10::set_default_dtype(previous_); }
  DefaultDtypeGuard(const DefaultDtypeGuard&) = delete;
  DefaultDtypeGuard& operator=(const DefaultDtypeGuard&) = delete;

 private:
  caffe2::TypeMeta previous_;
};

/// Python's `torch.autocast(device_type, dtype, enabled, cache_enabled)` as an RAII guard:
/// on entry it saves the enabled/dtype/cache flags, sets them and increments the nesting; on
/// exit it clears the cast cache when the outermost region closes, then restores the flags.
/// Autocast state is thread-local, as in Python.
class [[nodiscard]] AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true,
                bool cache_enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
  bool previous_cache_enabled_;
};

}  // namespace fulgur
