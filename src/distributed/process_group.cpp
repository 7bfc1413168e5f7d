// ProcessGroup over c10d: TCPStore rendezvous, Gloo backend, timeouts turned into named errors.
#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "fulgur/distributed/process_group.hpp"

#include <ATen/ATen.h>

#include <cstdlib>
#include <condition_variable>
#include <atomic>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "fulgur/errors.hpp"
#include "src/distributed/backends.hpp"

namespace fulgur::distributed {

namespace {
const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

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

  // Liveness: every rank bumps a counter in the store once a second. When a collective fails,
  // the survivors look for counters that stopped moving, to name the rank that was lost.
  std::thread heartbeat;
  std::mutex heartbeat_mutex;  // only for the wake-up: never held across a store call
  std::condition_variable heartbeat_wakeup;
  std::atomic<bool> stopping{false};
  mutable std::atomic<bool> failed{false};  // a collective failed: the peers may be gone
  c10::Device device{c10::kCPU};

  static std::string alive_key(int r) { return "fulgur_alive/" + std::to_string(r); }

  void start_heartbeat() {
    if (size == 1) return;
    heartbeat = std::thread([this] {
      while (!stopping.load()) {
        try {
          store->add(alive_key(rank), 1);
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

  /// "rank 1 stopped responding" — or an empty string when it cannot be told within ~5 s.
  std::string lost_ranks() const {
    if (size == 1) return {};
    struct Probe {
      std::mutex mutex;
      std::condition_variable done_signal;
      bool done = false;
      std::string text;
    };
    auto probe = std::make_shared<Probe>();
    auto store_ref = store;
    const int self = rank, world = size;
    std::thread([probe, store_ref, self, world] {
      std::string text;
      try {
        std::vector<std::int64_t> before(static_cast<std::size_t>(world));
        for (int r = 0; r < world; ++r) before[static_cast<std::size_t>(r)] = store_ref->add(alive_key(r), 0);
        std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        for (int r = 0; r < world; ++r)
          if (r != self && store_ref->add(alive_key(r), 0) == before[static_cast<std::size_t>(r)])
            text += (text.empty() ? "rank " : ", rank ") + std::to_string(r);
      } catch (const std::exception&) {
        // the store went away mid-probe: keep what was found; without it, blame the store's host
        if (text.empty() && self != 0) text = "rank 0, which serves the rendezvous store, is unreachable";
      }
      if (!text.empty() && text.rfind("rank 0, which", 0) != 0) text += " stopped responding";
      std::lock_guard<std::mutex> lock(probe->mutex);
      probe->text = text;
      probe->done = true;
      probe->done_signal.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(probe->mutex);
    probe->done_signal.wait_for(lock, std::chrono::seconds(5), [&] { return probe->done; });
    return probe->text;
  }

  [[noreturn]] void fail(const std::string& op, const std::string& reason) const {
    failed.store(true);
    const std::string lost = lost_ranks();
    throw DistributedError("fulgur: " + op + " on rank " + std::to_string(rank) + " of " + std::to_string(size) +
                           " failed: " + (lost.empty() ? "a peer process probably ended" : lost) +
                           " (crashed, was killed, or raised an error); this run cannot continue. [" + reason + "]");
  }

  /// Waits for `work`; turns every failure into a DistributedError naming op, rank and the lost rank.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& op) const {
    bool finished = false;
    try {
      finished = work->wait(timeout);
    } catch (const std::exception& e) {
      fail(op, why(e));
    }
    if (!finished)
      fail(op, "no answer within the timeout of " + std::to_string(timeout.count()) +
                   " ms (TrainerConfig::ddp.timeout sets it)");
  }
  template <class F>
  c10::intrusive_ptr<c10d::Work> launch(const std::string& op, F&& f) const {
    try {
      return f();
    } catch (const std::exception& e) {
      fail(op, why(e));
    }
  }
};

struct PendingCollective::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  const ProcessGroup::Impl* group = nullptr;
  std::string op;
};

PendingCollective::PendingCollective() = default;
PendingCollective::~PendingCollective() = default;
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;
void PendingCollective::wait() {
  if (!impl_) return;
  auto impl = std::move(impl_);
  impl->group->wait(impl->work, impl->op);
}

ProcessGroup::ProcessGroup(BackendKind kind, const ClusterEnvironment& env, std::chrono::milliseconds timeout,
                           c10::Device device)
    : impl_(std::make_unique<Impl>()) {
  impl_->kind = kind;
  impl_->device = device;
  impl_->rank = env.rank;
  impl_->size = env.world_size;
  impl_->timeout = timeout;
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
    if (!store) {
      c10d::TCPStoreOptions options;
      options.port = static_cast<std::uint16_t>(env.master_port);
      options.timeout = timeout;
      if (env.source == ClusterEnvironment::Source::none && env.world_size == 1) {
        store = c10::make_intrusive<c10d::HashStore>();  // a world of one: nothing to meet, no port
      } else if (env.use_agent_store) {
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
    store->setTimeout(timeout);
    impl_->store = c10::make_intrusive<c10d::PrefixStore>("fulgur_group_" + std::to_string(generations[where]++), store);
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
  const std::string name = std::string("all_reduce(") + op_name(op) + ")";
  c10d::AllreduceOptions options;
  const bool divide = op == ReduceOp::mean;
  options.reduceOp = op == ReduceOp::max ? c10d::ReduceOp::MAX
                     : op == ReduceOp::min ? c10d::ReduceOp::MIN
                                           : c10d::ReduceOp::SUM;
  std::vector<at::Tensor> tensors{tensor};
  impl_->wait(impl_->launch(name, [&] { return impl_->backend->allreduce(tensors, options); }), name);
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
  pending.impl_->work = impl_->launch(pending.impl_->op, launch);
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
  impl_->wait(impl_->launch("broadcast", [&] { return impl_->backend->broadcast(tensors, options); }), "broadcast");
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < impl_->size; ++i) outputs[0].push_back(at::empty_like(tensor));
  std::vector<at::Tensor> inputs{tensor.contiguous()};
  impl_->wait(impl_->launch("all_gather", [&] { return impl_->backend->allgather(outputs, inputs); }), "all_gather");
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
  impl_->wait(impl_->launch("barrier", [&] { return impl_->backend->barrier(options); }), "barrier");
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
