#pragma once
// Where this process sits in a distributed run, read from the environment that launchers set:
// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT), SLURM (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS_PER_NODE, SLURM_NODELIST, SLURM_JOB_ID), or
// fulgur's own launcher (the torchrun variables).
#include <functional>
#include <optional>
#include <string>

namespace fulgur::distributed {

struct ClusterEnvironment {
  enum class Source { none, torchrun, slurm };
  Source source = Source::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool use_agent_store = false;  ///< torchrun's agent serves the store; every rank is a client
  int restart_count = 0;         ///< the agent store's key prefix is /worker/attempt_<restart_count>
};

/// Reads the environment (`getenv` by default; a test passes its own lookup). torchrun's
/// variables win over SLURM's. A malformed value is a MisconfigurationError naming the variable.
ClusterEnvironment detect_environment(
    const std::function<std::optional<std::string>(const std::string&)>& getenv = {});

/// SLURM's compressed node list ("node[01-03,07],gpu5") -> its first host name ("node01").
std::string first_slurm_host(const std::string& nodelist);

}  // namespace fulgur::distributed
