#pragma once
// Library-internal: the error file torchrun gives each worker (TORCHELASTIC_ERROR_FILE). What a worker
// writes there is the "traceback" of torchrun's failure summary, and the earliest one its root cause,
// instead of "Signal 6" and a link to its docs. Python's @record writes it for an uncaught exception;
// fulgur writes it for a failed collective (process_group.cpp) and, once a process group is up under
// torchrun, for any exception that leaves main uncaught.
#include <string>

namespace fulgur::distributed::detail {

/// Writes `message` to TORCHELASTIC_ERROR_FILE (nothing without one), unless a message is there already
/// and `replace` is false: the first cause a worker saw is the one to show.
void write_torchrun_error_file(const std::string& message, bool replace);

/// Under torchrun, from now on: an exception that reaches std::terminate (uncaught in main, or thrown
/// out of a noexcept function) is written to the error file, with its type, before the usual abort.
/// Installed once; the handler before it still runs.
void report_uncaught_exceptions_to_torchrun();

}  // namespace fulgur::distributed::detail
