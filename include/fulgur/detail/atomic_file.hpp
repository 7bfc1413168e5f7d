#pragma once
// One way to replace a file so that a crash never leaves it torn: checkpoints, the CSV logger's
// metrics.csv and hparams.yaml all go through it. Torch-free.
//
// The bytes go to a temporary file in the same folder (".<name>.tmp.<pid>"), are fsynced, the
// temporary is renamed onto the path, and the folder's entry is fsynced: after a crash at any
// point the path holds the old file or the new one, whole. A write first removes the temporary
// files of writers killed mid-write (dead pid, no lock held); writes in one process run one at a
// time. A failed write changes nothing at the path.
#include <string>
#include <string_view>

#include "fulgur/errors.hpp"

namespace fulgur::detail {

/// What atomic_write throws: the path, the step that failed and the OS's reason, and what to do.
struct FileWriteError : Error {
  using Error::Error;
};

/// Replaces `path` with `bytes`, atomically (see above). `what` names the file in messages
/// ("checkpoint", "metrics file"). A folder at `path` is refused before anything is written.
void atomic_write(const std::string& path, std::string_view bytes, std::string_view what = "file");

}  // namespace fulgur::detail
