#pragma once
// Library-internal: a fulgur error's text wrapped into another message.
#include <exception>
#include <string>

#include "fulgur/errors.hpp"

namespace fulgur::detail {

/// An error's text without its leading "fulgur: ", for a message that quotes it after its own prefix.
inline std::string without_fulgur_prefix(std::string text) {
  if (text.rfind("fulgur: ", 0) == 0) text.erase(0, 8);
  return text;
}

/// Takes the module-state loader's closing advice ("pass strict = false", for weights loaded by hand) out
/// of its message, for a caller that gives advice of its own; whether it was there (keys missing or
/// unexpected, rather than shapes that differ).
inline bool without_strict_advice(std::string& text) {
  const std::string advice = "\nTo load only the keys that match, pass strict = false.";
  const std::size_t at = text.find(advice);
  if (at == std::string::npos) return false;
  text.erase(at, advice.size());
  return true;
}

/// Inside a catch block: the exception being handled thrown again as the same fulgur error type, its
/// message after `prefix`, so that a caller's `catch (const DistributedError&)` still matches; an
/// Interrupted (or Preempted) goes on unchanged (fit reads its signal); anything that is not a fulgur
/// error becomes an Error. A new error type in errors.hpp gets its catch here, a derived type
/// before its base (else it comes out as the base).
[[noreturn]] inline void rethrow_with_prefix(const std::string& prefix) {
  try {
    throw;
  } catch (const Interrupted&) {
    throw;
  } catch (const TrainingSpikeError& e) {
    throw TrainingSpikeError(prefix + e.what(), e.batch_idx(), e.global_step());
  } catch (const NonFiniteGradientError& e) {
    throw NonFiniteGradientError(prefix + e.what());
  } catch (const StepError& e) {
    throw StepError(prefix + e.what());
  } catch (const CheckpointPartError& e) {
    throw CheckpointPartError(prefix + e.what());
  } catch (const CheckpointError& e) {
    throw CheckpointError(prefix + e.what());
  } catch (const MisconfigurationError& e) {
    throw MisconfigurationError(prefix + e.what());
  } catch (const AcceleratorError& e) {
    throw AcceleratorError(prefix + e.what());
  } catch (const NonFiniteLossError& e) {
    throw NonFiniteLossError(prefix + e.what());
  } catch (const DataError& e) {
    throw DataError(prefix + e.what());
  } catch (const GradScalerError& e) {
    throw GradScalerError(prefix + e.what());
  } catch (const DistributedError& e) {
    throw DistributedError(prefix + e.what());
  } catch (const std::exception& e) {
    throw Error(prefix + e.what());
  }
}

}  // namespace fulgur::detail
