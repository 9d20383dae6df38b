// The PyTorch plugin's native hot path over torch.distributed (bytesched/plugins/torch/native.py
// drives it; docs/architecture.md, "One gradient's way", the native path):
//
//   autograd thread   Core.enqueue(id, name, priority, wire)      -> an event on the Inbox
//   Core thread       the Scheduler (scheduler.h) partitions, orders and admits; rank 0 sends what
//                     it started to the followers (order_link.h), a follower starts what rank 0
//                     announced; each piece is c10d's ProcessGroup::allreduce on a slice of the
//                     task's wire buffer
//   backend thread    the Work's future callback                    -> a finish on the Inbox
//   Core thread       the credit returns, more pieces start; a task whose pieces all finished
//                     goes to the Outbox
//   update thread     Core.wait(...) returns it (the GIL released while it waits)
//
// No Python runs on the Core's thread or in the callbacks, and neither takes the GIL: the tensors
// they hold are the Core's own, over the plugin's memory (same_memory() says why). The module
// also exposes the bare Scheduler, which tests/test_native_scheduler.py drives against the Python one.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <thread>

#include "order_link.h"
#include "scheduler.h"

namespace py = pybind11;

namespace bytesched {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Python's time.monotonic(): the clock the Python Core, the timeline and the plan read.
double monotonic() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// ``tensor``'s memory under a tensor of its own, as ``tensor.data`` in Python: it shares the storage
// (which has a Python object only if Python code asked for it, ``untyped_storage()``) but neither
// the TensorImpl nor the autograd metadata. Letting go of the last C++ reference to a
// tensor that has a Python object takes the GIL (c10's intrusive_ptr hands the object back to
// Python), and a thread that takes the GIL while the interpreter finalizes is ended by
// pthread_exit, whose unwinding through a noexcept destructor aborts the process ("terminate called
// without an active exception"). Gloo's worker threads let go of a collective's tensors when they
// are done with it, which can be after the process began to exit; what they hold of a task is
// therefore this tensor and its slices, never the plugin's tensor (docs/experiments/native-core.md,
// "Exit").
at::Tensor same_memory(const at::Tensor& tensor) { return at::Tensor(tensor.variable_data()); }

struct Event {
  enum Kind : uint8_t { kEnqueue, kReady, kFinish, kParams, kAnnounce, kCall, kStop };
  Kind kind;
  int64_t id = 0;
  int32_t index = 0;
  int64_t priority = 0;
  bool ready = false;
  std::string text;  // a task's name, a collective's error
  at::Tensor tensor;
  Params params{kNaN, 0, 0};
  std::vector<Key> keys;
  std::vector<bool> joins;  // kAnnounce: each key starts in one operation with the one before it
  std::function<void()> call;  // kCall: run on the Core's thread, in order with the events
  double deadline = 0;
};

// Events for the Core's thread, from any thread. Shared with the backend's callbacks, which may
// outlive the Core.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Event> events;

  void post(Event&& event) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(std::move(event));
    }
    cv.notify_one();
  }

  void post_finish(int64_t id, int32_t index, std::string error) {
    Event event{Event::kFinish};
    event.id = id;
    event.index = index;
    event.text = std::move(error);
    post(std::move(event));
  }
};

// A task for the update thread: complete (``done``), or failed ahead of its completion.
struct Completion {
  int64_t id;
  bool done;
  std::string error;
  int64_t instance;
  double t_ready;
  std::vector<SubTask> spans;  // each piece's times, while recording (the timeline, the plan's observer)
};

struct TaskData {
  at::Tensor flat;  // a 1-D view of the task's wire buffer, which pieces slice
  bool failed = false;  // a piece failed (the update thread was told)
};

}  // namespace

class TorchCore {
 public:
  // ``mode``: "leader" (rank 0, or a rank of a job without a common order), "follow" (rank-0
  // order) or "immediate"; ``partition`` NaN: the policy's default.
  TorchCore(c10::intrusive_ptr<c10d::ProcessGroup> group, const std::string& policy, double partition, double credit,
            double batch, const std::string& mode)
      : group_(std::move(group)), inbox_(std::make_shared<Inbox>()) {
    std::shared_ptr<Policy> leader = make_leader(leader_named(policy), Params{partition, credit, batch});
    std::shared_ptr<Policy> start = mode == "follow"    ? make_follow(leader)
                                    : mode == "immediate" ? make_immediate(leader)
                                                          : leader;
    if (mode != "leader" && mode != "follow" && mode != "immediate")
      throw std::invalid_argument("mode must be leader, follow or immediate, got " + mode);
    scheduler_ = std::make_unique<Scheduler>(start);
  }

  ~TorchCore() {
    if (thread_.joinable()) {
      Event stop{Event::kStop};
      stop.deadline = monotonic();
      inbox_->post(std::move(stop));
      thread_.join();
    }
    if (receiver_.joinable()) {
      link_.close();
      receiver_.join();
    }
  }

  // -- the order link (before start())
  int listen(const std::string& host) {
    int port = link_.listen(host);
    publish_ = true;
    return port;
  }
  void accept(int followers, const std::string& digest, double timeout_s) {
    py::gil_scoped_release nogil;
    link_.accept(followers, digest, timeout_s);
  }
  void connect(const std::string& host, int port, int rank, const std::string& digest, double timeout_s) {
    py::gil_scoped_release nogil;
    link_.connect(host, port, rank, digest, timeout_s);
    receives_ = true;
  }

  void start() {
    thread_ = std::thread([this] { run(); });
    if (receives_) receiver_ = std::thread([this] { receive(); });
  }

  // -- the plugin's events (any thread)
  // The Core holds ``wire``'s memory, not ``wire`` (same_memory()).
  void enqueue(int64_t id, std::string name, int64_t priority, const at::Tensor& wire, bool ready) {
    Event event{Event::kEnqueue};
    event.id = id;
    event.text = std::move(name);
    event.priority = priority;
    event.tensor = same_memory(wire);
    event.ready = ready;
    posted_enqueues_.fetch_add(1, std::memory_order_relaxed);
    inbox_->post(std::move(event));
  }

  void ready(int64_t id) {
    Event event{Event::kReady};
    event.id = id;
    inbox_->post(std::move(event));
  }

  void set_params(double partition, double credit, double batch) {
    Event event{Event::kParams};
    event.params = Params{partition, credit, batch};
    inbox_->post(std::move(event));
  }

  // Core.start_in_sequence / start_on_ready / restore_order: on the Core's thread, in order with
  // the events; returns once done, raising what the switch raised.
  void replace_order(const std::string& kind, std::vector<std::string> names) {
    call([this, kind, names]() mutable {
      std::shared_ptr<Policy> leader = scheduler_->policy().leader();
      if (!leader) leader = scheduler_->policy_ptr();
      std::shared_ptr<Policy> next = kind == "sequence" ? make_sequence(leader, std::move(names)) : make_immediate(leader);
      bool first = !replaced_;
      std::shared_ptr<Policy> previous = scheduler_->policy_ptr();
      scheduler_->set_policy(next);
      if (first) {
        replaced_ = previous;
        replaced_publish_ = publish_;
      }
      publish_ = false;
    });
  }

  void restore_order() {
    call([this] {
      if (!replaced_) return;
      replaced_->set_params(scheduler_->policy().params);  // the sizes set while replaced
      scheduler_->set_policy(replaced_);
      publish_ = replaced_publish_;
      replaced_.reset();
    });
  }

  void set_recording(bool on) { recording_.store(on); }

  // -- the update threads' side
  int add_consumer() {
    std::lock_guard<std::mutex> lock(out_mu_);
    woken_.push_back(false);
    return static_cast<int>(woken_.size()) - 1;
  }

  void wake(int consumer) {
    {
      std::lock_guard<std::mutex> lock(out_mu_);
      woken_.at(consumer) = true;
    }
    out_cv_.notify_all();
  }

  // What completed (or failed) since the last call, waiting up to ``timeout`` s (< 0: until
  // something comes) unless ``consumer`` was woken: [(id, done, error or None, instance, t_ready,
  // spans or None)], spans [(index, nbytes, t_start, t_finish)].
  py::list wait(int consumer, double timeout) {
    std::deque<Completion> taken;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lock(out_mu_);
      auto due = [&] { return !outbox_.empty() || woken_.at(consumer); };
      if (timeout < 0) out_cv_.wait(lock, due);
      else out_cv_.wait_for(lock, std::chrono::duration<double>(timeout), due);
      taken.swap(outbox_);
      woken_[consumer] = false;
    }
    py::list result;
    for (Completion& c : taken) {
      py::object error = c.error.empty() ? py::none() : py::object(py::str(c.error));
      py::object spans = py::none();
      if (!c.spans.empty()) {
        py::list list;
        for (const SubTask& s : c.spans) list.append(py::make_tuple(s.index, s.nbytes, s.t_start, s.t_finish));
        spans = list;
      }
      result.append(py::make_tuple(c.id, c.done, error, c.instance, c.t_ready, spans));
    }
    return result;
  }

  // -- queries (any thread)
  bool wait_idle(double timeout) {
    int64_t posted = posted_enqueues_.load();
    py::gil_scoped_release nogil;
    std::unique_lock<std::mutex> lock(state_mu_);
    return idle_cv_.wait_for(lock, std::chrono::duration<double>(timeout), [&] {
      return exited_ || (handled_enqueues_ >= posted && scheduler_->idle());
    });
  }

  // The unfinished tasks, oldest first: [(id, name, instance, priority, [(index, nbytes, t_start, t_finish)])].
  py::list snapshot() {
    std::vector<std::tuple<int64_t, std::string, int64_t, int64_t, std::vector<SubTask>>> copy;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(state_mu_);
      for (Task* t : scheduler_->unfinished()) copy.emplace_back(t->id, t->name, t->instance, t->priority, t->subs);
    }
    py::list result;
    for (auto& [id, name, instance, priority, subs] : copy) {
      py::list pieces;
      for (const SubTask& s : subs) pieces.append(py::make_tuple(s.index, s.nbytes, s.t_start, s.t_finish));
      result.append(py::make_tuple(id, name, instance, priority, pieces));
    }
    return result;
  }

  int64_t instances(const std::string& name) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(state_mu_);
    return scheduler_->instances(name);
  }

  // A follower in rank-0 order: (name, instance, index) rank 0 started that this rank has not
  // made ready, or None.
  py::object announced_missing() {
    Key key{"", 0, 0};
    bool missing;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(state_mu_);
      missing = bytesched::announced_missing(scheduler_->policy(), &key);
    }
    return missing ? py::object(py::make_tuple(key.name, key.instance, key.index)) : py::none();
  }

  // The backend operations (collectives) and the pieces started so far: an operation per piece,
  // or per batch.
  std::pair<int64_t, int64_t> started() const { return {operations_.load(), pieces_.load()}; }

  // Why the Core stopped on its own (a protocol error, a failed link, fail()); None while it runs.
  py::object failure() {
    if (!failed_.load()) return py::none();
    std::lock_guard<std::mutex> lock(state_mu_);
    return failure_.empty() ? py::none() : py::object(py::str(failure_));
  }

  // Stop the Core: every unfinished task is told ``message`` (as a failure) and the thread ends.
  void fail(std::string message) {
    Event event{Event::kCall};
    event.call = [this, message] { fail_all(message); };
    inbox_->post(std::move(event));
  }

  // Let what is in flight finish, up to ``timeout`` s, then stop; the ids of the tasks that did
  // not finish.
  std::vector<int64_t> stop(double timeout) {
    py::gil_scoped_release nogil;
    if (thread_.joinable()) {
      Event event{Event::kStop};
      event.deadline = monotonic() + timeout;
      inbox_->post(std::move(event));
      std::unique_lock<std::mutex> lock(state_mu_);
      if (idle_cv_.wait_for(lock, std::chrono::duration<double>(timeout + 5.0), [&] { return exited_; })) {
        lock.unlock();
        thread_.join();
      } else {
        lock.unlock();
        thread_.detach();  // stuck in the backend: leave it behind, as the Python Core does
      }
    }
    link_.close();
    if (receiver_.joinable()) receiver_.join();
    return left_;
  }

 private:
  void call(std::function<void()> fn) {
    auto done = std::make_shared<std::promise<std::string>>();
    std::future<std::string> answer = done->get_future();
    Event event{Event::kCall};
    event.call = [fn = std::move(fn), done] {
      try {
        fn();
        done->set_value("");
      } catch (const std::exception& error) {
        done->set_value(error.what());
      }
    };
    inbox_->post(std::move(event));
    std::string error;
    {
      py::gil_scoped_release nogil;
      if (answer.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
        throw std::runtime_error("the native bytesched Core did not answer within 10 s (is it running?)");
      error = answer.get();
    }
    if (!error.empty()) throw SchedulingError(error);
  }

  void run() {
    std::vector<Event> events;
    std::vector<Start> started;
    std::vector<Task*> completed;
    std::vector<std::pair<int64_t, int32_t>> finishes;
    double deadline = std::numeric_limits<double>::infinity();
    bool stopping = false;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(inbox_->mu);
        auto due = [&] { return !inbox_->events.empty(); };
        if (stopping) inbox_->cv.wait_for(lock, std::chrono::duration<double>(std::max(0.0, deadline - monotonic())), due);
        else inbox_->cv.wait(lock, due);
        events.swap(inbox_->events);
      }
      bool failed = false;
      {
        std::lock_guard<std::mutex> lock(state_mu_);
        try {
          for (Event& event : events) {
            if (event.kind == Event::kFinish) {
              finishes.emplace_back(event.id, event.index);
              if (!event.text.empty()) failed_piece(event.id, event.text);
              continue;
            }
            double now = monotonic();
            if (!finishes.empty()) finish(finishes, now, started, completed);
            handle(event, now, started, &stopping, &deadline);
          }
          if (!finishes.empty()) finish(finishes, monotonic(), started, completed);
          deliver(completed);
          if (publish_ && !started.empty()) publish(started);
        } catch (const std::exception& error) {
          fail_all(error.what());
        }
        failed = !failure_.empty();
      }
      events.clear();
      if (failed) break;
      start_all(started);
      started.clear();
      bool idle;
      {
        std::lock_guard<std::mutex> lock(state_mu_);
        idle = scheduler_->idle();
      }
      if (idle) idle_cv_.notify_all();
      if (stopping && (idle || monotonic() >= deadline)) break;
    }
    std::lock_guard<std::mutex> lock(state_mu_);
    for (Task* task : scheduler_->unfinished()) left_.push_back(task->id);
    exited_ = true;
    idle_cv_.notify_all();
  }

  void handle(Event& event, double now, std::vector<Start>& started, bool* stopping, double* deadline) {
    switch (event.kind) {
      case Event::kEnqueue: {
        at::Tensor& wire = event.tensor;
        // One batcher per element type (GradientBatcher's per type and device; the native Core runs on the CPU).
        scheduler_->enqueue(event.id, event.text, event.priority, wire.numel(),
                            static_cast<int32_t>(wire.element_size()), static_cast<int32_t>(wire.scalar_type()), now);
        ++handled_enqueues_;
        TaskData& data = data_[event.id];
        data.flat = wire.view(-1);
        if (event.ready) scheduler_->ready(event.id, now, started);
        break;
      }
      case Event::kReady:
        scheduler_->ready(event.id, now, started);
        break;
      case Event::kParams:
        scheduler_->set_params(event.params, now, started);
        break;
      case Event::kAnnounce:
        scheduler_->announce(event.keys, event.joins, now, started);
        break;
      case Event::kCall:
        event.call();
        break;
      case Event::kStop:
        *stopping = true;
        *deadline = event.deadline;
        break;
      case Event::kFinish:
        break;
    }
  }

  void finish(std::vector<std::pair<int64_t, int32_t>>& finishes, double now, std::vector<Start>& started,
              std::vector<Task*>& completed) {
    scheduler_->finish_many(finishes, now, started, completed);
    finishes.clear();
  }

  // A piece failed: the task's first error goes to the update thread at once (the plugin fails
  // the step), and the task still completes once every piece is over, so its credit returns.
  void failed_piece(int64_t id, const std::string& error) {
    auto found = data_.find(id);
    if (found == data_.end() || found->second.failed) return;
    found->second.failed = true;
    Task* task = scheduler_->find(id);
    push({id, false, error, task ? task->instance : 0, task ? task->t_ready : kNaN, {}});
  }

  void deliver(std::vector<Task*>& completed) {
    bool recording = recording_.load();
    for (Task* task : completed) {
      auto data = data_.find(task->id);
      Completion c{task->id, true, "", task->instance, task->t_ready, {}};  // a failure went ahead of it
      if (data != data_.end()) data_.erase(data);
      if (recording) c.spans = task->subs;
      push(std::move(c));
      scheduler_->forget(task->id);
    }
    completed.clear();
  }

  void push(Completion&& completion) {
    {
      std::lock_guard<std::mutex> lock(out_mu_);
      outbox_.push_back(std::move(completion));
    }
    out_cv_.notify_all();
  }

  // Core.announcement: the started keys, a batch's after its first marked as joining.
  void publish(const std::vector<Start>& started) {
    std::vector<Key> keys;
    std::vector<bool> joins;
    keys.reserve(started.size());
    for (const Start& s : started) {
      keys.push_back(Key{s.task->name, s.task->instance, s.index});
      joins.push_back(s.joins);
    }
    link_.send(encode_order(keys, joins));
  }

  // Each operation of ``started``: a piece alone, or a batch (a Start and those joining it).
  void start_all(const std::vector<Start>& started) {
    for (size_t first = 0; first < started.size();) {
      size_t end = first + 1;
      while (end < started.size() && started[end].joins) ++end;
      operations_.fetch_add(1, std::memory_order_relaxed);
      pieces_.fetch_add(static_cast<int64_t>(end - first), std::memory_order_relaxed);
      if (end - first == 1) start_piece(started[first]);
      else start_batch(started.data() + first, end - first);
      first = end;
    }
  }

  // A piece's slice of its task's wire buffer (the buffer itself for a task of one piece).
  at::Tensor piece(const Start& s) {
    TaskData& data = data_.at(s.task->id);
    const SubTask& sub = s.task->subs[s.index];
    return s.task->subs.size() == 1 ? data.flat : data.flat.slice(0, sub.begin, sub.end);
  }

  // One piece's all-reduce (sum, in place), as DistributedBackend.start issues it.
  void start_piece(const Start& s) {
    const int64_t id = s.task->id;
    const int32_t index = s.index;
    try {
      std::vector<at::Tensor> tensors{piece(s)};
      c10::intrusive_ptr<c10d::Work> work = group_->allreduce(tensors);
      std::shared_ptr<Inbox> inbox = inbox_;
      work->getFuture()->addCallback([inbox, id, index](c10::ivalue::Future& future) {
        inbox->post_finish(id, index, future.hasError() ? future.tryRetrieveErrorMessage() : std::string());
      });
    } catch (const std::exception& error) {
      inbox_->post_finish(id, index, std::string("starting the all-reduce failed: ") + error.what());
    }
  }

  // A batch's pieces as one all-reduce, as GradientBatcher starts one: copied into one buffer,
  // summed, and each piece's sum copied back before its task hears of it.
  void start_batch(const Start* batch, size_t count) {
    std::vector<std::pair<int64_t, int32_t>> subs;
    std::vector<at::Tensor> pieces;
    for (size_t i = 0; i < count; ++i) subs.emplace_back(batch[i].task->id, batch[i].index);
    try {
      for (size_t i = 0; i < count; ++i) pieces.push_back(piece(batch[i]));
      std::vector<at::Tensor> tensors{at::cat(pieces)};
      c10::intrusive_ptr<c10d::Work> work = group_->allreduce(tensors);
      std::shared_ptr<Inbox> inbox = inbox_;
      at::Tensor flat = tensors[0];
      work->getFuture()->addCallback([inbox, subs, pieces, flat](c10::ivalue::Future& future) {
        std::string error = future.hasError() ? future.tryRetrieveErrorMessage() : std::string();
        if (error.empty()) {
          try {
            int64_t offset = 0;
            for (const at::Tensor& piece : pieces) {
              piece.copy_(flat.narrow(0, offset, piece.numel()));
              offset += piece.numel();
            }
          } catch (const std::exception& copy_error) {
            error = std::string("copying a batch's sums back failed: ") + copy_error.what();
          }
        }
        for (const auto& [id, index] : subs) inbox->post_finish(id, index, error);
      });
    } catch (const std::exception& error) {
      for (const auto& [id, index] : subs)
        inbox_->post_finish(id, index, std::string("starting the all-reduce failed: ") + error.what());
    }
  }

  // Core thread, state lock held: the Core stops; every unfinished task is told why.
  void fail_all(const std::string& message) {
    if (!failure_.empty()) return;
    failure_ = message;
    failed_.store(true);
    for (Task* task : scheduler_->unfinished()) push({task->id, false, message, task->instance, task->t_ready, {}});
  }

  // A follower's thread: rank 0's frames become announce events.
  void receive() {
    std::string payload;
    try {
      while (link_.receive(&payload)) {
        Event event{Event::kAnnounce};
        decode_order(payload, &event.keys, &event.joins);
        inbox_->post(std::move(event));
      }
    } catch (const std::exception& error) {
      std::string message = std::string("rank 0's order link failed: ") + error.what();
      fail(message);
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::shared_ptr<Inbox> inbox_;
  OrderLink link_;
  bool publish_ = false;
  bool receives_ = false;
  std::thread thread_, receiver_;

  std::mutex state_mu_;  // the Scheduler, while the Core's thread handles events, and what queries read
  std::condition_variable idle_cv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::shared_ptr<Policy> replaced_;  // what replace_order() replaced
  bool replaced_publish_ = false;
  std::unordered_map<int64_t, TaskData> data_;  // the Core's thread's
  std::atomic<int64_t> posted_enqueues_{0};
  int64_t handled_enqueues_ = 0;
  std::string failure_;
  std::atomic<bool> failed_{false};  // failure_ is set (read without the lock)
  bool exited_ = false;
  std::vector<int64_t> left_;
  std::atomic<bool> recording_{false};
  std::atomic<int64_t> operations_{0};
  std::atomic<int64_t> pieces_{0};

  std::mutex out_mu_;
  std::condition_variable out_cv_;
  std::deque<Completion> outbox_;
  std::vector<bool> woken_;
};

// The bare Scheduler for the differential test: tasks by id, starts as [(id, index)].
class TestScheduler {
 public:
  TestScheduler(const std::string& policy, double partition, double credit, double batch, const std::string& mode) {
    leader_ = make_leader(leader_named(policy), Params{partition, credit, batch});
    scheduler_ = std::make_unique<Scheduler>(policy_for(mode, {}));
  }

  void enqueue(int64_t id, const std::string& name, int64_t priority, int64_t numel, int32_t itemsize,
               int32_t batcher, double now) {
    scheduler_->enqueue(id, name, priority, numel, itemsize, batcher, now);
  }
  py::list ready(int64_t id, double now) {
    std::vector<Start> out;
    scheduler_->ready(id, now, out);
    return starts(out);
  }
  py::tuple finish_many(const std::vector<std::pair<int64_t, int32_t>>& subs, double now) {
    std::vector<Start> out;
    std::vector<Task*> completed;
    scheduler_->finish_many(subs, now, out, completed);
    py::list done;
    for (Task* t : completed) done.append(t->id);
    py::list started = starts(out);
    for (Task* t : completed) scheduler_->forget(t->id);
    return py::make_tuple(started, done);
  }
  py::list set_params(double partition, double credit, double batch, double now) {
    std::vector<Start> out;
    scheduler_->set_params(Params{partition, credit, batch}, now, out);
    return starts(out);
  }
  // Keys as FollowOrderPolicy.announce takes them: a joining key's index has bit 31 set.
  py::list announce(const std::vector<std::tuple<std::string, int64_t, int64_t>>& keys, double now) {
    std::vector<Key> converted;
    std::vector<bool> joins;
    for (const auto& [name, instance, index] : keys) {
      converted.push_back(Key{name, instance, static_cast<int32_t>(index & 0x7fffffff)});
      joins.push_back((index & (int64_t{1} << 31)) != 0);
    }
    std::vector<Start> out;
    scheduler_->announce(converted, joins, now, out);
    return starts(out);
  }
  // Hand the ready queue to a new policy of ``mode`` partitioning like the leader (Scheduler.set_policy).
  void set_policy(const std::string& mode, std::vector<std::string> names) {
    scheduler_->set_policy(policy_for(mode, std::move(names)));
  }
  int64_t waiting() const { return scheduler_->waiting(); }
  bool idle() const { return scheduler_->idle(); }
  int64_t instances(const std::string& name) const { return scheduler_->instances(name); }
  std::pair<int64_t, int64_t> window() const {
    return {scheduler_->window().inflight_bytes, scheduler_->window().inflight_count};
  }
  double partition_bytes() { return scheduler_->policy().partition_bytes(); }

 private:
  std::shared_ptr<Policy> policy_for(const std::string& mode, std::vector<std::string> names) {
    if (mode == "leader") return leader_;
    if (mode == "immediate") return make_immediate(leader_);
    if (mode == "follow") return make_follow(leader_);
    if (mode == "sequence") return make_sequence(leader_, std::move(names));
    throw std::invalid_argument("unknown mode " + mode);
  }
  static py::list starts(const std::vector<Start>& out) {
    py::list list;
    for (const Start& s : out) list.append(py::make_tuple(s.task->id, s.index, s.joins));
    return list;
  }
  std::shared_ptr<Policy> leader_;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace bytesched

PYBIND11_MODULE(_native, m) {
  using bytesched::TestScheduler;
  using bytesched::TorchCore;
  m.doc() = "bytesched's native Scheduler and the PyTorch plugin's hot path over torch.distributed (csrc/)";
  py::register_exception<bytesched::SchedulingError>(m, "SchedulingError", PyExc_RuntimeError);
  py::register_exception<bytesched::LinkError>(m, "LinkError", PyExc_RuntimeError);
  m.def("split_elements", &bytesched::split_elements);
  m.def("monotonic", &bytesched::monotonic);

  py::class_<TestScheduler>(m, "Scheduler")
      .def(py::init<const std::string&, double, double, double, const std::string&>())
      .def("enqueue", &TestScheduler::enqueue)
      .def("ready", &TestScheduler::ready)
      .def("finish_many", &TestScheduler::finish_many)
      .def("set_params", &TestScheduler::set_params)
      .def("announce", &TestScheduler::announce)
      .def("set_policy", &TestScheduler::set_policy)
      .def_property_readonly("waiting", &TestScheduler::waiting)
      .def_property_readonly("idle", &TestScheduler::idle)
      .def_property_readonly("window", &TestScheduler::window)
      .def("instances", &TestScheduler::instances)
      .def("partition_bytes", &TestScheduler::partition_bytes);

  py::class_<TorchCore>(m, "Core")
      .def(py::init<c10::intrusive_ptr<c10d::ProcessGroup>, const std::string&, double, double, double,
                    const std::string&>())
      .def("listen", &TorchCore::listen)
      .def("accept", &TorchCore::accept)
      .def("connect", &TorchCore::connect)
      .def("start", &TorchCore::start)
      .def("enqueue", &TorchCore::enqueue)
      .def("ready", &TorchCore::ready)
      .def("set_params", &TorchCore::set_params)
      .def("replace_order", &TorchCore::replace_order)
      .def("restore_order", &TorchCore::restore_order)
      .def("set_recording", &TorchCore::set_recording)
      .def("add_consumer", &TorchCore::add_consumer)
      .def("wake", &TorchCore::wake)
      .def("wait", &TorchCore::wait)
      .def("wait_idle", &TorchCore::wait_idle)
      .def("snapshot", &TorchCore::snapshot)
      .def("instances", &TorchCore::instances)
      .def("announced_missing", &TorchCore::announced_missing)
      .def("failure", &TorchCore::failure)
      .def("started", &TorchCore::started)
      .def("fail", &TorchCore::fail)
      .def("stop", &TorchCore::stop);
}
