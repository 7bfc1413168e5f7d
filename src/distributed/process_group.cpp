// ProcessGroup over c10d: TCPStore rendezvous, Gloo backend, timeouts turned into named errors.
#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "src/distributed/process_group.hpp"

#include <ATen/ATen.h>
#include <c10/util/Logging.h>

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <condition_variable>
#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "fulgur/detail/host_terms.hpp"
#include "fulgur/detail/loop_position.hpp"
#include "fulgur/errors.hpp"
#include "src/distributed/backends.hpp"
#include "src/distributed/torchrun_error_file.hpp"

namespace fulgur::distributed {

namespace {
const char* all_reduce_name(ReduceOp op) {  // literals: the heartbeat publishes the last one by address
  switch (op) {
    case ReduceOp::sum: return "all_reduce(sum)";
    case ReduceOp::mean: return "all_reduce(mean)";
    case ReduceOp::max: return "all_reduce(max)";
    case ReduceOp::min: return "all_reduce(min)";
  }
  return "all_reduce";
}

/// What a rank publishes for its peers: its collectives so far, the last one's name, its loop position.
struct PeerPosition {
  std::uint64_t collectives = 0;
  std::string op, loop;
};
std::string encode(const PeerPosition& p) { return std::to_string(p.collectives) + "\n" + p.op + "\n" + p.loop; }
PeerPosition decode(const std::string& text) {
  PeerPosition p;
  const auto first = text.find('\n'), second = text.find('\n', first == std::string::npos ? first : first + 1);
  if (first == std::string::npos || second == std::string::npos) return p;
  p.collectives = std::strtoull(text.c_str(), nullptr, 10);
  p.op = text.substr(first + 1, second - first - 1);
  p.loop = text.substr(second + 1);
  return p;
}

/// While fulgur's own store calls run (after the rendezvous: heartbeat, lost-rank probe), c10's log
/// level is at least ERROR. When the rank serving the store is gone, c10d's TCPStore client logs a
/// WARNING before it throws ("[c10d] recvValue failed on SocketImpl(...): Failed to recv, got 0 bytes.
/// ... Exception raised from recvBytes ... frame #0: ..."): the socket error's what(), C++ stack trace
/// included. fulgur catches that exception and either stops quietly (the heartbeat: the collective
/// that fails next reports the cause) or names the cause once ("rank 0, which serves the rendezvous
/// store, is unreachable"), so the warning would be a second report of the same cause, as a library
/// stack trace. A store call cannot tell beforehand that the server is gone (it can be SIGKILLed at any
/// time), hence the level rather than a check. c10's level is process-wide: the guard is counted (the
/// heartbeat, a probe and the main thread may overlap) and each window lasts one store call; other
/// threads' c10 warnings in such a window are lost (c10 logs few, and ERROR still shows). A user who
/// sets TORCH_CPP_LOG_LEVEL (to debug c10d) keeps every message.
class QuietStoreCall {
 public:
  QuietStoreCall() {
    if (!enabled()) return;
    std::lock_guard<std::mutex> lock(mutex());
    if (depth()++ == 0) {
      saved() = FLAGS_caffe2_log_level;
      if (FLAGS_caffe2_log_level < c10::GLOG_ERROR) FLAGS_caffe2_log_level = c10::GLOG_ERROR;
    }
  }
  ~QuietStoreCall() {
    if (!enabled()) return;
    std::lock_guard<std::mutex> lock(mutex());
    if (--depth() == 0) FLAGS_caffe2_log_level = saved();
  }
  QuietStoreCall(const QuietStoreCall&) = delete;
  QuietStoreCall& operator=(const QuietStoreCall&) = delete;

 private:
  static bool enabled() {
    static const bool quiet = std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr;
    return quiet;
  }
  // Never destroyed: a detached probe may still use them while the process exits.
  static std::mutex& mutex() { static auto& m = *new std::mutex; return m; }
  static int& depth() { static int d = 0; return d; }
  static int& saved() { static int level = 0; return level; }
};

std::string why(const std::exception& e) {
  std::string text = e.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) text = c10_error->what_without_backtrace();
  return text.substr(0, text.find('\n'));
}
}  // namespace

struct ProcessGroup::Impl {
  BackendKind kind;
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;

  // Liveness and position: every rank bumps a counter in the store once a second, and writes how
  // many collectives it has started, the last one's name and its loop position. When a collective
  // fails, the survivors look for counters that stopped moving, to name the rank that was lost; if
  // none did, for the ranks behind or elsewhere, to name the one that is stuck.
  std::thread heartbeat;
  std::mutex heartbeat_mutex;  // only for the wake-up: never held across a store call
  std::condition_variable heartbeat_wakeup;
  std::atomic<bool> stopping{false};
  mutable std::atomic<bool> failed{false};  // a collective failed: the peers may be gone
  c10::Device device{c10::kCPU};
  std::atomic<std::uint64_t> collectives{0};   // started by this rank
  std::atomic<const char*> last_op{"none yet"};  // a string literal
  bool serves_store = false;                     // this process is the TCPStore's server

  static std::string alive_key(int r) { return "fulgur_alive/" + std::to_string(r); }
  static std::string position_key(int r) { return "fulgur_position/" + std::to_string(r); }
  PeerPosition own_position() const {
    return {collectives.load(std::memory_order_relaxed), last_op.load(std::memory_order_relaxed),
            fulgur::detail::loop_position().describe()};
  }

  void start_heartbeat() {
    if (size == 1) return;
    heartbeat = std::thread([this] {
      while (!stopping.load()) {
        try {
          const QuietStoreCall quiet;
          store->add(alive_key(rank), 1);
          const std::string position = encode(own_position());
          store->set(position_key(rank), std::vector<std::uint8_t>(position.begin(), position.end()));
        } catch (const std::exception&) {
          return;  // the store is gone: nothing left to report to
        }
        std::unique_lock<std::mutex> lock(heartbeat_mutex);
        heartbeat_wakeup.wait_for(lock, std::chrono::seconds(1), [this] { return stopping.load(); });
      }
    });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(heartbeat_mutex);
      stopping.store(true);
    }
    heartbeat_wakeup.notify_all();
    if (heartbeat.joinable()) heartbeat.join();
    // NCCL's group warns at exit ("destroy_process_group() was not called ...") unless it was shut
    // down. On a normal end, shutdown() as Python's destroy_process_group: it lets this rank's NCCL
    // work finish before the communicators go (a peer may still be reading from our buffers). After a
    // failed collective, or while an exception unwinds, abort(): it never waits on a lost peer.
    if (backend && kind == BackendKind::nccl) {
      try {
        if (failed.load() || std::uncaught_exceptions() > 0)
          backend->abort();
        else
          backend->shutdown();
      } catch (const std::exception&) {
        // a destructor: the communicators are being released either way
      }
    }
  }

  /// Why collective number `number` (`op`) failed, as far as the peers tell within ~5 s: "rank 1
  /// stopped responding" (its heartbeat stopped), or where the live peers are — behind, or in
  /// another collective — or an empty string when it cannot be told.
  struct Diagnosis {
    std::string text;
    std::vector<int> stuck;  ///< the live ranks behind or in another collective
  };
  Diagnosis diagnose(const char* op, std::uint64_t number) const {
    if (size == 1) return {};
    struct Probe {
      std::mutex mutex;
      std::condition_variable done_signal;
      bool done = false;
      Diagnosis found;
    };
    auto probe = std::make_shared<Probe>();
    auto store_ref = store;
    const int self = rank, world = size;
    const PeerPosition mine = own_position();
    const std::string failed_op = op;
    std::thread([probe, store_ref, self, world, mine, failed_op, number] {
      std::string text;
      std::vector<int> stuck;
      try {
        std::vector<std::int64_t> before(static_cast<std::size_t>(world));
        {
          const QuietStoreCall quiet;  // the store may be gone: its loss is what this finds out
          for (int r = 0; r < world; ++r) before[static_cast<std::size_t>(r)] = store_ref->add(alive_key(r), 0);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        const QuietStoreCall quiet;
        std::vector<int> alive;
        for (int r = 0; r < world; ++r) {
          if (r == self) continue;
          if (store_ref->add(alive_key(r), 0) == before[static_cast<std::size_t>(r)])
            text += (text.empty() ? "rank " : ", rank ") + std::to_string(r);
          else
            alive.push_back(r);
        }
        if (!text.empty()) {
          text += " stopped responding (crashed, was killed, or raised an error)";
        } else {
          const std::string where = failed_op + " #" + std::to_string(number);
          for (int r : alive) {
            if (!store_ref->check({position_key(r)})) continue;
            const auto bytes = store_ref->get(position_key(r));
            const PeerPosition peer = decode(std::string(bytes.begin(), bytes.end()));
            const std::string who = "rank " + std::to_string(r);
            if (peer.collectives != number || peer.op != failed_op) stuck.push_back(r);
            if (peer.collectives < number)
              text += (text.empty() ? "" : "; ") + who + " is alive but has not reached it: its last collective is " +
                      (peer.collectives == 0 ? std::string("none") : peer.op + " #" + std::to_string(peer.collectives)) +
                      ", its last position " + peer.loop;
            else if (peer.collectives != number || peer.op != failed_op)
              text += (text.empty() ? "" : "; ") + who + " is in " + peer.op + " #" + std::to_string(peer.collectives) +
                      ", not " + where + ": the ranks called different collectives (mismatched order) — rank " +
                      std::to_string(self) + " at " + mine.loop + ", " + who + " at " + peer.loop;
          }
        }
      } catch (const std::exception&) {
        // the store went away mid-probe: keep what was found; without it, blame the store's host
        if (text.empty() && self != 0) text = "rank 0, which serves the rendezvous store, is unreachable";
      }
      std::lock_guard<std::mutex> lock(probe->mutex);
      probe->found = {text, stuck};
      probe->done = true;
      probe->done_signal.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(probe->mutex);
    probe->done_signal.wait_for(lock, std::chrono::seconds(5), [&] { return probe->done; });
    return probe->found;
  }

  [[noreturn]] void fail(const char* op, std::uint64_t number, const std::string& reason) const {
    failed.store(true);
    const auto [found, stuck] = diagnose(op, number);
    const std::string head = "fulgur: " + std::string(op) + " #" + std::to_string(number) + " on rank " +
                             std::to_string(rank) + " of " + std::to_string(size) + " failed: ";
    if (!stuck.empty()) {
      report_stuck(stuck, found);
      let_peers_diagnose(static_cast<int>(stuck.size()));
    }
    std::string message = head +
                          (found.empty() ? "a peer process probably ended (crashed, was killed, or raised an error)"
                                         : found) +
                          "; this run cannot continue (rank " + std::to_string(rank) + " was at " +
                          fulgur::detail::loop_position().describe() + "). [" + reason + "]";
    // torchrun's summary shows this rank's cause (torchrun_error_file.hpp): the rank that saw the failure
    // writes first, so the cause it names (a rank stuck or lost) is what the summary shows.
    detail::write_torchrun_error_file(message, /*replace=*/true);
    throw DistributedError(message);
  }

  /// The rank serving the store ends last among those that saw a stuck peer: its exit takes the
  /// store, and the others' diagnosis with it. Waits at most 3 s.
  void let_peers_diagnose(int stuck_ranks) const {
    const auto diagnosed = [this](std::int64_t more) {
      const QuietStoreCall quiet;
      return store->add("fulgur_diagnosed", more);
    };
    try {
      const std::int64_t done = diagnosed(1);
      if (!serves_store) return;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      for (std::int64_t seen = done; seen < size - stuck_ranks && std::chrono::steady_clock::now() < deadline;
           seen = diagnosed(0))
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } catch (const std::exception&) {
      // the store is gone: nobody is left to wait for
    }
  }

  /// For the built-in launcher, in the file it named: which ranks are stuck (the cause, not this
  /// rank, which only saw it), then why.
  void report_stuck(const std::vector<int>& stuck, const std::string& why) const {
    const char* file = std::getenv("FULGUR_FAILURE_REPORT");
    if (file == nullptr || *file == '\0') return;
    std::string ranks;  // "1" or "1, 2": the launcher's first line
    for (const int r : stuck) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (std::FILE* out = std::fopen(file, "w")) {
      std::fprintf(out, "%s\nrank %d reported: %s\n", ranks.c_str(), rank, why.c_str());
      std::fclose(out);
    }
  }

  /// Waits for `work`; turns every failure into a DistributedError naming op, rank and the lost rank.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* op, std::uint64_t number) const {
    bool finished = false;
    try {
      finished = work->wait(timeout);
    } catch (const std::exception& e) {
      fail(op, number, why(e));
    }
    if (!finished)
      fail(op, number, "no answer within the timeout of " + std::to_string(timeout.count()) +
                           " ms (" +
                           fulgur::detail::spelled("the strategy's timeout option: Trainer(config, {.timeout = ...})",
                                                   "trainer.strategy.timeout") +
                           " sets it)");
  }
  /// Starts collective number collectives + 1, named `op` (a string literal).
  template <class F>
  std::pair<c10::intrusive_ptr<c10d::Work>, std::uint64_t> launch(const char* op, F&& f) {
    const std::uint64_t number = collectives.fetch_add(1, std::memory_order_relaxed) + 1;
    last_op.store(op, std::memory_order_relaxed);
    try {
      return {f(), number};
    } catch (const std::exception& e) {
      fail(op, number, why(e));
    }
  }
  template <class F>
  void run(const char* op, F&& f) {
    auto [work, number] = launch(op, std::forward<F>(f));
    wait(work, op, number);
  }
};

struct PendingCollective::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  const ProcessGroup::Impl* group = nullptr;
  const char* op = "";
  std::uint64_t number = 0;
};

PendingCollective::PendingCollective() = default;
PendingCollective::~PendingCollective() = default;
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;
void PendingCollective::wait() {
  if (!impl_) return;
  auto impl = std::move(impl_);
  impl->group->wait(impl->work, impl->op, impl->number);
}

ProcessGroup::ProcessGroup(BackendKind kind, const ClusterEnvironment& env, std::chrono::milliseconds timeout,
                           c10::Device device)
    : impl_(std::make_unique<Impl>()) {
  impl_->kind = kind;
  impl_->device = device;
  impl_->rank = env.rank;
  impl_->size = env.world_size;
  impl_->timeout = timeout;
  // A user's exception that ends this worker under torchrun is its summary's cause, as Python's @record does.
  if (env.world_size > 1) detail::report_uncaught_exceptions_to_torchrun();
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    // One store per process, as Python's default group has; each group gets its own key prefix,
    // so a second Trainer in the same processes never reads the first one's addresses.
    // Never destroyed: a lost-rank probe may still hold a store while the process exits.
    static std::mutex& stores_mutex = *new std::mutex;
    static auto& stores = *new std::map<std::string, c10::intrusive_ptr<c10d::Store>>;
    static auto& generations = *new std::map<std::string, int>;
    std::lock_guard<std::mutex> lock(stores_mutex);
    auto& store = stores[where];
    if (env.world_size == 1) {
      // A world of one: nothing to meet, no port, and a store of the group's own, gone with it (in the shared
      // one each Trainer's keys stayed: ~5 KiB a fit, found by the soak test's 1,000 fits).
      impl_->serves_store = false;
      impl_->store = c10::make_intrusive<c10d::HashStore>();
    } else if (!store) {
      c10d::TCPStoreOptions options;
      options.port = static_cast<std::uint16_t>(env.master_port);
      options.timeout = timeout;
      if (env.use_agent_store) {
        // torchrun's agent already serves the store; its keys live under /worker/attempt_<n>.
        options.isServer = false;
        options.waitWorkers = false;
        auto client = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
        store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(env.restart_count),
                                                       std::move(client));
      } else {
        options.isServer = env.rank == 0;
        options.numWorkers = static_cast<std::size_t>(env.world_size);
        options.waitWorkers = true;
        options.multiTenant = true;
        store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
      }
    }
    if (env.world_size > 1) {
      store->setTimeout(timeout);
      impl_->serves_store = env.rank == 0 && !env.use_agent_store;
      impl_->store =
          c10::make_intrusive<c10d::PrefixStore>("fulgur_group_" + std::to_string(generations[where]++), store);
    }
  } catch (const std::exception& e) {
    throw DistributedError("fulgur: rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
                           " could not meet the others at " + where + " within " +
                           std::to_string(timeout.count()) + " ms: " + why(e) +
                           ". Check MASTER_ADDR/MASTER_PORT and that every rank was started.");
  }
  try {
    impl_->backend = kind == BackendKind::gloo
                         ? detail::make_gloo_backend(impl_->store, env.rank, env.world_size, timeout)
                         : detail::make_nccl_backend(impl_->store, env.rank, env.world_size, timeout, device);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError("fulgur: rank " + std::to_string(env.rank) + " could not connect the " +
                           (kind == BackendKind::gloo ? "Gloo" : "NCCL") + " backend through " + where + ": " +
                           why(e) + ".");
  }
  impl_->start_heartbeat();
}

ProcessGroup::~ProcessGroup() = default;
int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
BackendKind ProcessGroup::kind() const { return impl_->kind; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->timeout; }

void ProcessGroup::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  const char* name = all_reduce_name(op);
  c10d::AllreduceOptions options;
  const bool divide = op == ReduceOp::mean;
  options.reduceOp = op == ReduceOp::max ? c10d::ReduceOp::MAX
                     : op == ReduceOp::min ? c10d::ReduceOp::MIN
                                           : c10d::ReduceOp::SUM;
  std::vector<at::Tensor> tensors{tensor};
  impl_->run(name, [&] { return impl_->backend->allreduce(tensors, options); });
  if (divide) {
    if (at::isFloatingType(tensor.scalar_type()) || at::isComplexType(tensor.scalar_type()))
      tensor.div_(impl_->size);
    else
      tensor.copy_(tensor / impl_->size);  // integer mean truncates, as Lightning's
  }
}

template <class Launch>
PendingCollective ProcessGroup::start(const char* op, Launch&& launch) {
  PendingCollective pending;
  pending.impl_ = std::make_unique<PendingCollective::Impl>();
  pending.impl_->op = op;
  pending.impl_->group = impl_.get();
  std::tie(pending.impl_->work, pending.impl_->number) = impl_->launch(op, launch);
  return pending;
}

PendingCollective ProcessGroup::all_reduce_sum_async(const at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  return start("all_reduce(gradients)", [&] { return impl_->backend->allreduce(tensors); });
}

void ProcessGroup::broadcast(const at::Tensor& tensor, int src) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = src;
  impl_->run("broadcast", [&] { return impl_->backend->broadcast(tensors, options); });
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < impl_->size; ++i) outputs[0].push_back(at::empty_like(tensor));
  std::vector<at::Tensor> inputs{tensor.contiguous()};
  impl_->run("all_gather", [&] { return impl_->backend->allgather(outputs, inputs); });
  return outputs[0];
}

void ProcessGroup::all_gather_into(const at::Tensor& output, const at::Tensor& input) {
  all_gather_into_async(output, input).wait();
}

PendingCollective ProcessGroup::all_gather_into_async(const at::Tensor& output, const at::Tensor& input) {
  if (!output.is_contiguous() || !input.is_contiguous() || output.numel() != input.numel() * impl_->size ||
      output.scalar_type() != input.scalar_type())
    throw Error("fulgur: all_gather_into: the output and input must be contiguous, of one dtype, the output world "
                "size times the input's number of elements.");
  at::Tensor out = output, in = input;  // c10d takes them by non-const reference; no copy is made
  return start("all_gather", [&] { return impl_->backend->_allgather_base(out, in); });
}

PendingCollective ProcessGroup::reduce_scatter_sum_async(const at::Tensor& output, const at::Tensor& input) {
  if (!output.is_contiguous() || !input.is_contiguous() || input.numel() != output.numel() * impl_->size ||
      output.scalar_type() != input.scalar_type())
    throw Error("fulgur: reduce_scatter: the output and input must be contiguous, of one dtype, the input world "
                "size times the output's number of elements.");
  at::Tensor out = output, in = input;
  return start("reduce_scatter(gradients)", [&] { return impl_->backend->_reduce_scatter_base(out, in); });
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions options;
  options.timeout = impl_->timeout;
  if (impl_->kind == BackendKind::nccl) options.device_ids = {impl_->device.index()};  // this rank's GPU
  impl_->run("barrier", [&] { return impl_->backend->barrier(options); });
}

namespace detail {
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // As Python's init_process_group: GLOO_SOCKET_IFNAME ("eth0" or "eth0,eth1") picks the
  // interfaces; otherwise the device of this host's name.
  if (const char* interfaces = std::getenv("GLOO_SOCKET_IFNAME"); interfaces && *interfaces) {
    std::string list = interfaces;
    for (std::size_t start = 0; start <= list.size();) {
      const std::size_t comma = std::min(list.find(',', start), list.size());
      if (comma > start)
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(list.substr(start, comma - start)));
      start = comma + 1;
    }
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}
}  // namespace detail

}  // namespace fulgur::distributed
