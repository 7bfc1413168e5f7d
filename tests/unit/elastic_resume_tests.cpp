// Elastic restarts' own resume point (include/fulgur/detail/elastic_resume.hpp): which restart this
// is, and which checkpoint a restarted group resumes from. The multi-process runs (a rank SIGKILLed,
// the launcher restarting the group) are tests/distributed/elastic.sh.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/detail/elastic_resume.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/detail/trainer_support.hpp"
#include "src/distributed/shard_state.hpp"  // the sharded format's tags, which a user never writes
#include "unit/support.hpp"

using namespace fulgur;

namespace {

auto lookup(std::map<std::string, std::string> values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    const auto it = values.find(name);
    return it == values.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

/// A training checkpoint's shape, as far as choosing one goes: its progress and optimizer states.
StateDict training_state(std::int64_t step, bool with_optimizer = true) {
  StateDict state;
  state.insert("global_step", step);
  state.insert("epoch", static_cast<std::int64_t>(0));
  if (with_optimizer) state.insert("optimizer_states", c10::impl::GenericList(c10::AnyType::get()));
  return state;
}

/// Saves, then waits past the file system's timestamp granularity, so that the files' order is their mtimes'.
void save_in_order(const std::string& path, const StateDict& state) {
  checkpoint::save(path, state);
  std::this_thread::sleep_for(std::chrono::milliseconds(15));
}

/// Sets an environment variable for a scope.
struct ScopedVariable {
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedVariable() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("elastic: a restart is read from torchrun's, fulgur's launcher's and SLURM's variables", "[elastic]") {
  using fulgur::detail::restart_of_this_process;
  CHECK(restart_of_this_process(lookup({})).count == 0);
  CHECK(restart_of_this_process(lookup({{"TORCHELASTIC_RESTART_COUNT", "0"}})).count == 0);
  const auto torchrun = restart_of_this_process(lookup({{"TORCHELASTIC_RESTART_COUNT", "2"}}));
  CHECK(torchrun.count == 2);
  CHECK(torchrun.by == "torchrun");
  const auto ours = restart_of_this_process(lookup({{"TORCHELASTIC_RESTART_COUNT", "1"}, {"FULGUR_LAUNCHER", "1"}}));
  CHECK(ours.count == 1);
  CHECK(ours.by == "fulgur launcher");
  const auto slurm = restart_of_this_process(lookup({{"SLURM_RESTART_COUNT", "3"}, {"SLURM_JOB_ID", "42"}}));
  CHECK(slurm.count == 3);
  CHECK(slurm.by == "SLURM requeue");
  // Garbage is no restart (a fit must not resume on a misread variable).
  for (const char* garbage : {"", "x", "-1", "1.5", "99999999999"})
    CHECK(restart_of_this_process(lookup({{"TORCHELASTIC_RESTART_COUNT", garbage}})).count == 0);
}

TEST_CASE("elastic: the restart resumes from the readable checkpoint with the most progress", "[elastic]") {
  const std::string root = test::scratch_folder("elastic_choice");
  const std::string folder = root + "/checkpoints", other = root + "/callback";
  fulgur::detail::make_directories(folder);
  fulgur::detail::make_directories(other);
  save_in_order(root + "/hpc_ckpt_1.ckpt", training_state(15));
  save_in_order(folder + "/epoch=0-step=10.ckpt", training_state(10));
  save_in_order(other + "/epoch=1-step=20.ckpt", training_state(20));
  save_in_order(root + "/not_an_hpc_checkpoint.ckpt", training_state(99));  // default_root_dir: only hpc_ckpt_*
  save_in_order(folder + "/weights.ckpt", training_state(30, /*with_optimizer=*/false));
  std::ofstream(folder + "/.epoch=2-step=40.ckpt.tmp.123") << "a write cut short";  // an atomic write's temporary
  // The newest file, of the most progress, is damaged: the next one is taken, and the damage named.
  save_in_order(folder + "/epoch=2-step=35.ckpt", training_state(35));
  const auto bytes = checkpoint::to_bytes(training_state(35));
  std::ofstream(folder + "/epoch=2-step=35.ckpt", std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));

  const auto point = fulgur::detail::newest_complete_checkpoint({folder, other}, root);
  CHECK(point.path == other + "/epoch=1-step=20.ckpt");
  CHECK(point.global_step == 20);
  REQUIRE(point.skipped.size() == 2);  // the truncated one and the weights-only one, newest first
  CHECK_THAT(point.skipped[0], Catch::StartsWith(folder + "/epoch=2-step=35.ckpt: ") && Catch::Contains("truncated"));
  CHECK_THAT(point.skipped[1], Catch::StartsWith(folder + "/weights.ckpt: ") && Catch::Contains("weights only"));

  // The hpc checkpoint counts as any other: the most progress wins wherever it is.
  save_in_order(root + "/hpc_ckpt_2.ckpt", training_state(25));
  CHECK(fulgur::detail::newest_complete_checkpoint({folder, other}, root).path == root + "/hpc_ckpt_2.ckpt");
  // Equal progress: the most recently written.
  save_in_order(folder + "/again.ckpt", training_state(25));
  CHECK(fulgur::detail::newest_complete_checkpoint({folder, other}, root).path == folder + "/again.ckpt");
  // Nothing there: start afresh.
  CHECK(fulgur::detail::newest_complete_checkpoint({root + "/none"}, root + "/none").path.empty());
}

TEST_CASE("elastic: a sharded checkpoint missing a rank's part is passed over", "[elastic]") {
  const std::string folder = test::scratch_folder("elastic_sharded");
  auto sharded = [&](std::int64_t step, const std::string& name, bool write_parts) {
    // The manifest's optimizer state names one file per rank, as write_sharded_checkpoint lays them out.
    StateDict part;
    part.insert("format", std::string(distributed::sharded_optimizer_format));
    part.insert("world_size", static_cast<std::int64_t>(2));
    part.insert("slot", static_cast<std::int64_t>(0));
    c10::impl::GenericList files(c10::StringType::get());
    for (int r = 0; r < 2; ++r) files.push_back(name + ".shards/1/rank" + std::to_string(r) + ".pt");
    part.insert("files", files);
    if (write_parts) {
      fulgur::detail::make_directories(folder + "/" + name + ".shards/1");
      for (int r = 0; r < 2; ++r) {
        StateDict rank_file;
        rank_file.insert("format", std::string(distributed::rank_file_format));
        rank_file.insert("rank", static_cast<std::int64_t>(r));
        rank_file.insert("world_size", static_cast<std::int64_t>(2));
        c10::impl::GenericList shards(c10::AnyType::get());
        shards.push_back(at::zeros({3}));
        rank_file.insert("shards", shards);
        checkpoint::save(folder + "/" + name + ".shards/1/rank" + std::to_string(r) + ".pt", rank_file);
      }
    }
    StateDict state = training_state(step);
    c10::impl::GenericList optimizers(c10::AnyType::get());
    optimizers.push_back(part.to_ivalue());
    state.insert("optimizer_states", optimizers);
    save_in_order(folder + "/" + name, state);
  };
  sharded(5, "epoch=0-step=5.ckpt", true);
  sharded(10, "epoch=0-step=10.ckpt", true);
  CHECK(fulgur::detail::newest_complete_checkpoint({folder}, "").global_step == 10);
  ::unlink((folder + "/epoch=0-step=10.ckpt.shards/1/rank1.pt").c_str());  // a rank's part lost
  const auto point = fulgur::detail::newest_complete_checkpoint({folder}, "");
  CHECK(point.path == folder + "/epoch=0-step=5.ckpt");
  REQUIRE(point.skipped.size() == 1);
  CHECK_THAT(point.skipped[0], Catch::StartsWith(folder + "/epoch=0-step=10.ckpt (global step 10): ") &&
                                   Catch::Contains("rank1.pt"));
}

TEST_CASE("elastic: fit resumes by itself only in a restarted run given no ckpt_path", "[elastic]") {
  const std::string root = test::scratch_folder("elastic_fit");
  fulgur::detail::make_directories(root + "/checkpoints");
  save_in_order(root + "/checkpoints/epoch=0-step=10.ckpt", training_state(10));
  TrainerConfig config;
  config.default_root_dir = root;
  std::vector<std::string> warnings;
  // The first attempt starts afresh, as any fit without a ckpt_path.
  CHECK(fulgur::detail::checkpoint_to_load(config, "fit", "", {}, true, warnings).empty());
  {
    ScopedVariable restarted("TORCHELASTIC_RESTART_COUNT", "1");
    CHECK(fulgur::detail::checkpoint_to_load(config, "fit", "", {}, true, warnings) == root + "/checkpoints/epoch=0-step=10.ckpt");
    // A path the user gave wins.
    save_in_order(root + "/mine.ckpt", training_state(3));
    CHECK(fulgur::detail::checkpoint_to_load(config, "fit", "mine.ckpt", {}, true, warnings) == root + "/mine.ckpt");
    // A restart before any checkpoint: afresh.
    TrainerConfig empty;
    empty.default_root_dir = test::scratch_folder("elastic_fit_empty");
    CHECK(fulgur::detail::checkpoint_to_load(empty, "fit", "", {}, true, warnings).empty());
  }
  {
    ScopedVariable requeued("SLURM_RESTART_COUNT", "1");
    CHECK(fulgur::detail::checkpoint_to_load(config, "fit", "", {}, false, warnings) ==
          root + "/checkpoints/epoch=0-step=10.ckpt");
  }
  CHECK(warnings.empty());
}

TEST_CASE("elastic: fulgur's launcher refuses max_restarts over several nodes", "[elastic]") {
  if (std::getenv("RANK") || std::getenv("SLURM_PROCID")) return;  // only where fulgur's launcher would start
  TrainerConfig config = test::quiet({.num_nodes = 2});
  config.max_restarts = 1;
  CHECK_THAT(test::message_of<MisconfigurationError>([&] {
               fulgur::Trainer<CPUAccelerator, DDPStrategy, FloatPrecision> t(config);
             }),
             Catch::Contains("max_restarts=1 restarts the workers of one node") &&
                 Catch::Contains("torchrun --nnodes=2 --max-restarts=1"));
}

namespace {
struct CountingImpl : test::ClassifierImpl {
  at::Tensor training_step(const data::Batch& b, std::int64_t i) {
    ++steps;
    return test::ClassifierImpl::training_step(b, i);
  }
  int steps = 0;
};
TORCH_MODULE(Counting);
}  // namespace

TEST_CASE("elastic: a restarted fit finds the checkpoints a logger's version folder holds", "[elastic]") {
  // ModelCheckpoint without a dirpath saves in the logger's version folder; the restarted run's
  // logger would start a new version, so the restart must look in the earlier ones.
  const std::string root = test::scratch_folder("elastic_logger");
  auto [x, y] = test::classification_data(64);
  data::TensorLoader loader(x, y, {.batch_size = 8});
  using T = Trainer<CPUAccelerator, SingleDeviceStrategy, FloatPrecision, ModelCheckpoint, CSVLogger>;
  {
    T first(test::quiet({.max_steps = 13, .default_root_dir = root}), ModelCheckpoint({.every_n_train_steps = 5}),
            CSVLogger());
    Counting model;
    first.fit(model, loader);
    CHECK(model->steps == 13);
  }
  ScopedVariable restarted("TORCHELASTIC_RESTART_COUNT", "1");
  T again(test::quiet({.max_steps = 20, .default_root_dir = root}), ModelCheckpoint({.every_n_train_steps = 5}),
          CSVLogger());
  Counting model;
  const auto result = again.fit(model, loader);
  CHECK(model->steps == 10);  // from the step-10 checkpoint to 20
  CHECK(result.global_step == 20);
  CHECK(fulgur::detail::subdirectories(root + "/lightning_logs").size() == 1);  // logging went on in version_0
}
