#include "fulgur/distributed/environment.hpp"

#include <cstdlib>

#include "fulgur/errors.hpp"

namespace fulgur::distributed {

namespace {
int integer(const std::string& name, const std::string& value) {
  try {
    std::size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  throw MisconfigurationError("the environment variable " + name + "=\"" + value + "\" is not an integer.");
}
}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // "prefix[01-03,07]suffix,other" -> "prefix01suffix"; "host1,host2" -> "host1".
  const auto comma = nodelist.find(',');
  const auto bracket = nodelist.find('[');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket))
    return nodelist.substr(0, comma);
  const auto close = nodelist.find(']', bracket);
  if (close == std::string::npos) throw MisconfigurationError("SLURM_NODELIST=\"" + nodelist + "\" is malformed.");
  std::string first = nodelist.substr(bracket + 1, close - bracket - 1);
  first = first.substr(0, first.find_first_of(",-"));
  std::string suffix = nodelist.substr(close + 1);
  suffix = suffix.substr(0, suffix.find(','));
  return nodelist.substr(0, bracket) + first + suffix;
}

ClusterEnvironment detect_environment(const std::function<std::optional<std::string>(const std::string&)>& lookup) {
  auto get = [&](const std::string& name) -> std::optional<std::string> {
    if (lookup) return lookup(name);
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  auto get_int = [&](const std::string& name, int fallback) {
    const auto v = get(name);
    return v ? integer(name, *v) : fallback;
  };
  ClusterEnvironment env;
  if (get("RANK") && get("WORLD_SIZE")) {
    env.source = ClusterEnvironment::Source::torchrun;
    env.rank = get_int("RANK", 0);
    env.world_size = get_int("WORLD_SIZE", 1);
    env.local_rank = get_int("LOCAL_RANK", 0);
    env.local_world_size = get_int("LOCAL_WORLD_SIZE", env.world_size);
    env.node_rank = get_int("GROUP_RANK", env.local_world_size > 0 ? env.rank / env.local_world_size : 0);
    env.master_addr = get("MASTER_ADDR").value_or("127.0.0.1");
    env.master_port = get_int("MASTER_PORT", 29500);
    const auto agent = get("TORCHELASTIC_USE_AGENT_STORE");
    env.use_agent_store = agent && (*agent == "True" || *agent == "true" || *agent == "1");
    env.restart_count = get_int("TORCHELASTIC_RESTART_COUNT", 0);
  } else if (get("SLURM_PROCID") && get("SLURM_NTASKS")) {
    env.source = ClusterEnvironment::Source::slurm;
    env.rank = get_int("SLURM_PROCID", 0);
    env.world_size = get_int("SLURM_NTASKS", 1);
    env.local_rank = get_int("SLURM_LOCALID", 0);
    env.node_rank = get_int("SLURM_NODEID", 0);
    // SLURM_NTASKS_PER_NODE may read "2" or "2(x3)".
    if (const auto per_node = get("SLURM_NTASKS_PER_NODE"))
      env.local_world_size = integer("SLURM_NTASKS_PER_NODE", per_node->substr(0, per_node->find('(')));
    else
      env.local_world_size = env.world_size;
    if (const auto addr = get("MASTER_ADDR"))
      env.master_addr = *addr;
    else if (const auto nodes = get("SLURM_NODELIST"))
      env.master_addr = first_slurm_host(*nodes);
    // As Lightning: MASTER_PORT, else 15000 + the job id's last four digits.
    if (const auto port = get("MASTER_PORT")) {
      env.master_port = integer("MASTER_PORT", *port);
    } else if (const auto job = get("SLURM_JOB_ID")) {
      env.master_port = 15000 + integer("SLURM_JOB_ID", job->substr(job->size() > 4 ? job->size() - 4 : 0));
    } else {
      env.master_port = 15000;
    }
  }
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size)
    throw MisconfigurationError("the launcher's environment is inconsistent: rank " + std::to_string(env.rank) +
                                " of world size " + std::to_string(env.world_size) + ".");
  if (env.local_rank < 0 || env.local_rank >= env.local_world_size)
    throw MisconfigurationError("the launcher's environment is inconsistent: local rank " +
                                std::to_string(env.local_rank) + " of " + std::to_string(env.local_world_size) +
                                " processes on this node.");
  return env;
}

}  // namespace fulgur::distributed
