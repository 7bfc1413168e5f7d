#pragma once
// Which checkpoint files log_model uploads, and when again: each *.ckpt in the folders looked at,
// or named by after_save_checkpoint, once per modification time (last.ckpt is rewritten in place;
// Lightning keys its uploads by path and time the same way). Each goes to the artifact folder named
// by its stem with Lightning's metadata.yaml and aliases.txt beside it.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fulgur/loggers/mlflow_logger.hpp"
#include "sender.hpp"

namespace fulgur::loggers::mlflow {

class CheckpointFiles {
 public:
  CheckpointFiles() = default;
  ~CheckpointFiles();
  CheckpointFiles(CheckpointFiles&&) noexcept = default;
  CheckpointFiles& operator=(CheckpointFiles&&) = delete;

  /// The files a checkpoint callback keeps now, with their scores.
  void note(const std::vector<MLFlowCheckpointFile>& kept);
  /// The uploads of the files, noted or in `folders`, not uploaded yet as they are now.
  std::vector<ArtifactJob> new_uploads(const std::vector<std::string>& folders);

 private:
  std::string side_file(const std::string& name, const std::string& text);

  std::map<std::string, MLFlowCheckpointFile> noted_;  // by absolute path
  std::map<std::string, std::int64_t> uploaded_;  // path -> modification time (ns) uploaded
  std::string scratch_;  // metadata.yaml and aliases.txt wait here for their upload
  std::size_t files_ = 0;
};

}  // namespace fulgur::loggers::mlflow
