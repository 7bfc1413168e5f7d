#include "checkpoint_files.hpp"

#include <unistd.h>

#include "files.hpp"
#include "store.hpp"

namespace fulgur::loggers::mlflow {

CheckpointFiles::~CheckpointFiles() {
  if (!scratch_.empty()) files::remove_tree(scratch_);
}

void CheckpointFiles::note(const std::vector<MLFlowCheckpointFile>& kept) {
  for (const MLFlowCheckpointFile& file : kept) noted_[files::absolute(file.path)] = file;
}

std::string CheckpointFiles::side_file(const std::string& name, const std::string& text) {
  if (scratch_.empty())
    scratch_ = files::join(files::temp_folder(),
                           "fulgur-mlflow-" + std::to_string(::getpid()) + "-" + std::to_string(now_ms()));
  const std::string path = files::join(files::join(scratch_, std::to_string(files_++)), name);
  files::write_atomically(path, text);
  return path;
}

std::vector<ArtifactJob> CheckpointFiles::new_uploads(const std::vector<std::string>& folders) {
  std::map<std::string, MLFlowCheckpointFile> candidates = noted_;
  for (const std::string& folder : folders)
    for (const files::Entry& entry : files::list(folder)) {
      const std::string path = files::absolute(files::join(folder, entry.name));
      const bool checkpoint = entry.name.size() > 5 && entry.name.ends_with(".ckpt");
      if (entry.regular && checkpoint && !candidates.contains(path)) candidates[path] = {path, std::nullopt, false};
    }
  std::vector<ArtifactJob> jobs;
  for (const auto& [path, file] : candidates) {
    const std::optional<std::int64_t> time = files::modified_ns(path);
    if (!time) continue;  // gone: a better checkpoint replaced it
    if (const auto at = uploaded_.find(path); at != uploaded_.end() && at->second == *time) continue;
    uploaded_[path] = *time;
    const std::string dir = files::stem(path), name = files::file_name(path);
    jobs.push_back({dir, name, path});
    // Lightning's side files: the score and file name (its Checkpoint settings are the callback's,
    // not known here), and the aliases.
    const std::string score = file.score ? python_float(*file.score) : "null";
    std::string quoted_name = "'";  // a YAML single-quoted scalar
    for (const char c : name) quoted_name += c == '\'' ? std::string("''") : std::string(1, c);
    quoted_name += "'";
    try {
      jobs.push_back({dir, "metadata.yaml",
                      side_file("metadata.yaml", "original_filename: " + quoted_name + "\nscore: " + score + "\n")});
      jobs.push_back({dir, "aliases.txt", side_file("aliases.txt", file.best ? "['latest', 'best']" : "['latest']")});
    } catch (const std::exception&) {  // no temporary folder: the checkpoint itself still goes
    }
  }
  return jobs;
}

}  // namespace fulgur::loggers::mlflow
