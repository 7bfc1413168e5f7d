#pragma once
// fulgur's own launcher, for `devices > 1` without torchrun or SLURM (Lightning's subprocess
// launcher, in the shape of torchrun's agent): the calling process becomes a supervisor that
// re-executes this program once per local rank with torchrun's variables set (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), forwards SIGINT, SIGTERM,
// SIGHUP, SIGQUIT and SIGUSR1 to them, and waits. If a worker fails, the others are ended and the
// supervisor exits 1 naming the failing rank; if every worker was preempted (exit code 75, after
// its checkpoint), it exits 75; otherwise 0. It never returns.
//
// With max_restarts = N (TrainerConfig::max_restarts), a failed worker (an exit code other than 0
// and 75, or a signal the supervisor did not forward) ends the others and starts them all again, up
// to N times, as torchrun --max-restarts does: each attempt gets TORCHELASTIC_RESTART_COUNT (and
// FULGUR_LAUNCHER), so the restarted fit resumes from the newest complete checkpoint by itself
// (detail/elastic_resume.hpp), and a fresh rendezvous port. One node only.
//
// Several nodes: start the program on each with NODE_RANK, MASTER_ADDR and MASTER_PORT set.
namespace fulgur::distributed {

struct LaunchPlan {
  int processes_per_node = 1;
  int num_nodes = 1;
  int max_restarts = 0;
};

[[noreturn]] void launch_local_workers(const LaunchPlan& plan);

}  // namespace fulgur::distributed
