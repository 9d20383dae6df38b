// The native Scheduler (see scheduler.h). Each function names the Python code it mirrors.
#include "scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace bytesched {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Python's float floor division ``a // b`` (Objects/floatobject.c), so that split_elements cuts
// exactly where Python does for any float size.
double py_floordiv(double a, double b) {
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0.0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div == 0.0) return std::copysign(0.0, a / b);
  double floordiv = std::floor(div);
  if (div - floordiv > 0.5) floordiv += 1.0;
  return floordiv;
}

// CreditPolicy (bytescheduler): one heap entry per ready task, with a cursor over its pieces.
class CreditPolicy : public Policy {
 public:
  using Policy::Policy;
  const char* name() const override { return "bytescheduler"; }
  double partition_bytes() const override {
    return std::isnan(params.partition_bytes) ? 4'000'000.0 : params.partition_bytes;
  }
  bool holds_back() const override { return params.credit_bytes < kInf; }

  void push(Task& task) override {
    heap_.push_back(Entry{task.priority, task.seq, 0, &task});
    std::push_heap(heap_.begin(), heap_.end(), Later());
  }

  // CreditPolicy.release: Window.fits inlined (a sub-task that uses up exactly the remaining
  // credit starts; one larger than the whole credit starts when nothing is in flight).
  void release(Window& window, std::vector<Start>& out) override {
    const double credit = params.credit_bytes;
    while (!heap_.empty()) {
      Entry& entry = heap_.front();
      std::vector<SubTask>& subs = entry.task->subs;
      int32_t piece = entry.piece;
      const int32_t end = static_cast<int32_t>(subs.size());
      while (piece < end) {
        int64_t nbytes = subs[piece].nbytes;
        if (window.inflight_count != 0 && static_cast<double>(window.inflight_bytes + nbytes) > credit) break;
        window.inflight_bytes += nbytes;
        window.inflight_count += 1;
        out.push_back(Start{entry.task, piece});
        ++piece;
      }
      if (piece < end) {  // the head does not fit
        entry.piece = piece;
        return;
      }
      std::pop_heap(heap_.begin(), heap_.end(), Later());
      heap_.pop_back();
    }
  }

 private:
  struct Entry {
    int64_t priority;
    int64_t seq;
    int32_t piece;
    Task* task;
  };
  struct Later {  // std heaps keep the greatest first: "greater" is "later" in (priority, seq)
    bool operator()(const Entry& a, const Entry& b) const {
      return a.priority != b.priority ? a.priority > b.priority : a.seq > b.seq;
    }
  };
  std::vector<Entry> heap_;
};

// FifoPolicy: readiness order, no partitioning, admits everything.
class FifoPolicy : public Policy {
 public:
  using Policy::Policy;
  const char* name() const override { return "fifo"; }
  double partition_bytes() const override { return kInf; }
  bool holds_back() const override { return false; }
  void push(Task& task) override {
    for (int32_t i = 0; i < static_cast<int32_t>(task.subs.size()); ++i) queue_.push_back(Start{&task, i});
  }
  void release(Window& window, std::vector<Start>& out) override {
    for (const Start& start : queue_) {
      window.inflight_bytes += start.task->subs[start.index].nbytes;
      window.inflight_count += 1;
      out.push_back(start);
    }
    queue_.clear();
  }

 private:
  std::deque<Start> queue_;
};

// A follower's policy on ``Base``: partitions like its leader, whose sizes it sets too, and never
// batches (it starts what rank 0 started, or what its own order says, one by one).
template <class Base>
class Following : public Base {
 public:
  explicit Following(std::shared_ptr<Policy> leader) : Base(leader->params), leader_(std::move(leader)) {}
  bool batches() const override { return false; }
  double partition_bytes() const override { return leader_->partition_bytes(); }
  void set_params(const Params& p) override {
    this->params = p;
    leader_->set_params(p);
  }
  std::shared_ptr<Policy> leader() override { return leader_; }

 private:
  std::shared_ptr<Policy> leader_;
};

// ImmediatePolicy: fifo, partitioned like the leader.
class ImmediatePolicy : public Following<FifoPolicy> {
 public:
  using Following::Following;
  const char* name() const override { return "immediate"; }
};

// FollowOrderPolicy: rank 0's announced operations in order, each once every sub-task of it is
// ready here (a batch of rank 0's starts as one here too).
class FollowPolicy : public Following<Policy> {
 public:
  using Following::Following;
  const char* name() const override { return "rank0-follower"; }
  void announce(const std::vector<Key>& keys, const std::vector<bool>& joins) {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (joins[i] && !sizes_.empty()) ++sizes_.back();
      else sizes_.push_back(1);
      order_.push_back(keys[i]);
    }
  }
  void push(Task& task) override {
    for (int32_t i = 0; i < static_cast<int32_t>(task.subs.size()); ++i)
      ready_[Key{task.name, task.instance, i}] = Start{&task, i};
  }
  void release(Window& window, std::vector<Start>& out) override {
    while (!sizes_.empty() && head_ready()) {
      int64_t count = sizes_.front();
      sizes_.pop_front();
      for (int64_t i = 0; i < count; ++i) {
        auto found = ready_.find(order_.front());
        Start start = found->second;
        start.joins = i > 0;
        ready_.erase(found);
        order_.pop_front();
        window.inflight_bytes += start.task->subs[start.index].nbytes;
        window.inflight_count += 1;
        out.push_back(start);
      }
    }
  }
  // The first key of the next announced operation not ready here (FollowOrderPolicy.waiting_for).
  bool missing(Key* key) const {
    if (sizes_.empty()) return false;
    for (int64_t i = 0; i < sizes_.front(); ++i) {
      if (!ready_.count(order_[i])) {
        *key = order_[i];
        return true;
      }
    }
    return false;
  }

 private:
  bool head_ready() const {
    for (int64_t i = 0; i < sizes_.front(); ++i)
      if (!ready_.count(order_[i])) return false;
    return true;
  }

  std::deque<Key> order_;
  std::deque<int64_t> sizes_;  // the announced operations' sub-task counts, in order
  std::unordered_map<Key, Start, KeyHash> ready_;
};

// SequencePolicy: whole tasks in one fixed cycle of names.
class SequencePolicy : public Following<Policy> {
 public:
  SequencePolicy(std::shared_ptr<Policy> leader, std::vector<std::string> names)
      : Following(std::move(leader)), names_(std::move(names)) {
    std::unordered_set<std::string> distinct(names_.begin(), names_.end());
    if (names_.empty() || distinct.size() != names_.size())
      throw std::invalid_argument("a sequence needs distinct task names");
    for (const std::string& n : names_) ready_[n];
  }
  const char* name() const override { return "sequence"; }
  void push(Task& task) override {
    auto found = ready_.find(task.name);
    if (found == ready_.end())
      throw SchedulingError("task '" + task.name + "' is not in the sequence every rank agreed on (" +
                            std::to_string(names_.size()) + " names, e.g. '" + names_[0] +
                            "'): its collectives would be issued in different orders on different ranks");
    for (int32_t i = 0; i < static_cast<int32_t>(task.subs.size()); ++i) found->second.push_back(Start{&task, i});
  }
  void release(Window& window, std::vector<Start>& out) override {
    while (true) {
      std::deque<Start>& queue = ready_[names_[next_]];
      if (queue.empty()) return;
      Start start = queue.front();
      queue.pop_front();
      if (start.index == static_cast<int32_t>(start.task->subs.size()) - 1) next_ = (next_ + 1) % names_.size();
      window.inflight_bytes += start.task->subs[start.index].nbytes;
      window.inflight_count += 1;
      out.push_back(start);
    }
  }

 private:
  std::vector<std::string> names_;
  size_t next_ = 0;
  std::unordered_map<std::string, std::deque<Start>> ready_;
};

SchedulingError finish_error(const Task& task, const SubTask& sub) {
  std::string what = "SubTask('" + task.name + "'#" + std::to_string(task.instance) + "[" +
                     std::to_string(sub.index) + "], " + std::to_string(sub.nbytes) + "B)";
  return SchedulingError(std::isnan(sub.t_start) ? what + " finished but was never started" : what + " finished twice");
}

}  // namespace

Leader leader_named(const std::string& name) {
  if (name == "bytescheduler") return Leader::kByteScheduler;
  if (name == "fifo") return Leader::kFifo;
  throw SchedulingError("policy '" + name + "' has no native Scheduler");
}

std::shared_ptr<Policy> make_leader(Leader kind, Params params) {
  if (kind == Leader::kFifo) return std::make_shared<FifoPolicy>(params);
  return std::make_shared<CreditPolicy>(params);
}

std::shared_ptr<Policy> make_immediate(std::shared_ptr<Policy> leader) {
  return std::make_shared<ImmediatePolicy>(leader);
}

std::shared_ptr<Policy> make_follow(std::shared_ptr<Policy> leader) { return std::make_shared<FollowPolicy>(leader); }

std::shared_ptr<Policy> make_sequence(std::shared_ptr<Policy> leader, std::vector<std::string> names) {
  return std::make_shared<SequencePolicy>(leader, std::move(names));
}

void announce_to(Policy& follow, const std::vector<Key>& keys, const std::vector<bool>& joins) {
  auto* policy = dynamic_cast<FollowPolicy*>(&follow);
  if (policy == nullptr) throw SchedulingError("announce() is for followers in rank0 order mode");
  policy->announce(keys, joins);
}

bool announced_missing(Policy& follow, Key* key) {
  auto* policy = dynamic_cast<FollowPolicy*>(&follow);
  return policy != nullptr && policy->missing(key);
}

std::vector<std::pair<int64_t, int64_t>> split_elements(int64_t numel, int32_t itemsize, double size) {
  if (numel <= 0) return {{0, 0}};
  int64_t per_piece = numel;
  if (size != kInf) {
    double floordiv = py_floordiv(size, static_cast<double>(itemsize));
    per_piece = floordiv >= static_cast<double>(numel) ? numel : std::max<int64_t>(1, static_cast<int64_t>(floordiv));
  }
  int64_t pieces = (numel + per_piece - 1) / per_piece;
  int64_t base = numel / pieces, extra = numel % pieces;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  ranges.reserve(pieces);
  int64_t start = 0;
  for (int64_t i = 0; i < pieces; ++i) {
    int64_t stop = start + base + (i < extra ? 1 : 0);
    ranges.emplace_back(start, stop);
    start = stop;
  }
  return ranges;
}

Scheduler::Scheduler(std::shared_ptr<Policy> policy) { set_policy(std::move(policy)); }

// Scheduler.enqueue, with GradientTask.partition's rule: one piece where the partition size
// covers the buffer, else split_elements.
void Scheduler::enqueue(int64_t id, const std::string& name, int64_t priority, int64_t numel, int32_t itemsize,
                        int32_t batcher, double now) {
  if (tasks_.count(id)) throw SchedulingError("task " + std::to_string(id) + " ('" + name + "') was enqueued twice");
  Task& task = tasks_[id];
  task.id = id;
  task.name = name;
  task.priority = priority;
  task.numel = numel;
  task.itemsize = itemsize;
  task.batcher = batcher;
  task.nbytes = numel * itemsize;
  task.instance = instances_[name]++;
  task.seq = seq_++;
  task.t_enqueue = now;
  task.t_ready = kNaN;
  double size = policy_->partition_bytes();
  std::vector<std::pair<int64_t, int64_t>> ranges;
  if (size >= static_cast<double>(task.nbytes)) ranges.emplace_back(0, numel);
  else ranges = split_elements(numel, itemsize, size);
  task.subs.reserve(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    auto [a, b] = ranges[i];
    task.subs.push_back(SubTask{static_cast<int32_t>(i), a, b, (b - a) * itemsize, kNaN, kNaN});
  }
  task.remaining = static_cast<int32_t>(task.subs.size());
  unfinished_[task.seq] = &task;
}

void Scheduler::ready(int64_t id, double now, std::vector<Start>& out) {
  Task* task = find(id);
  if (task == nullptr) throw SchedulingError("task " + std::to_string(id) + " became ready before it was enqueued");
  if (!std::isnan(task->t_ready)) throw SchedulingError("task '" + task->name + "' was notified ready twice");
  task->t_ready = now;
  waiting_ += static_cast<int64_t>(task->subs.size());
  policy_->push(*task);
  schedule(now, out);
}

// Scheduler.finish_many: the policy is asked after every finish while a ready sub-task waits.
void Scheduler::finish_many(const std::vector<std::pair<int64_t, int32_t>>& subs, double now,
                            std::vector<Start>& out, std::vector<Task*>& completed) {
  for (const auto& [id, index] : subs) {
    Task* task = find(id);
    if (task == nullptr || index < 0 || index >= static_cast<int32_t>(task->subs.size()))
      throw SchedulingError("finish of an unknown sub-task " + std::to_string(id) + "[" + std::to_string(index) + "]");
    SubTask& sub = task->subs[index];
    if (std::isnan(sub.t_start) || !std::isnan(sub.t_finish)) throw finish_error(*task, sub);
    sub.t_finish = now;
    window_.inflight_bytes -= sub.nbytes;
    window_.inflight_count -= 1;
    if (--task->remaining == 0) {
      unfinished_.erase(task->seq);
      completed.push_back(task);
    }
    if (waiting_) schedule(now, out);
  }
  if (!open_.empty() && window_.inflight_count == static_cast<int64_t>(open_.size())) {  // nothing else in flight
    size_t before = out.size();
    batched({}, out);
    stamp(out, before, now);
  }
}

void Scheduler::set_params(const Params& params, double now, std::vector<Start>& out) {
  policy_->set_params(params);
  schedule(now, out);
}

void Scheduler::announce(const std::vector<Key>& keys, const std::vector<bool>& joins, double now,
                         std::vector<Start>& out) {
  announce_to(*policy_, keys, joins);
  schedule(now, out);
}

void Scheduler::set_policy(std::shared_ptr<Policy> policy) {
  if (waiting_ || !open_.empty())
    throw SchedulingError("cannot change the policy while " + std::to_string(waiting_ + open_.size()) +
                          " ready sub-task(s) wait");
  policy_ = std::move(policy);
  batching_ = policy_->batches();
}

// Scheduler.schedule: what the policy releases, in batches where batching while busy is on.
void Scheduler::schedule(double now, std::vector<Start>& out) {
  size_t before = out.size();
  released_.clear();
  policy_->release(window_, released_);
  waiting_ -= static_cast<int64_t>(released_.size());
  if (!open_.empty() || (!released_.empty() && batching_ && policy_->params.batch_bytes != 0)) batched(released_, out);
  else out.insert(out.end(), released_.begin(), released_.end());
  stamp(out, before, now);
}

// Scheduler._batched: consecutive small sub-tasks of one batcher gather in the open batch (at
// most batch_bytes together), which starts once nothing else is in flight.
void Scheduler::batched(const std::vector<Start>& released, std::vector<Start>& out) {
  const double limit = batching_ ? policy_->params.batch_bytes : 0.0;
  for (const Start& start : released) {
    const int32_t batcher = start.task->batcher;
    const int64_t nbytes = start.task->subs[start.index].nbytes;
    if (batcher >= 0 && static_cast<double>(nbytes) < limit) {
      if (!open_.empty() &&
          (open_[0].task->batcher != batcher || static_cast<double>(open_bytes_ + nbytes) > limit))
        emit_open(out);
      open_.push_back(start);
      open_bytes_ += nbytes;
      continue;
    }
    emit_open(out);
    out.push_back(Start{start.task, start.index, false});
  }
  if (!open_.empty() && (limit == 0.0 || window_.inflight_count == static_cast<int64_t>(open_.size())))
    emit_open(out);
}

void Scheduler::emit_open(std::vector<Start>& out) {
  for (size_t i = 0; i < open_.size(); ++i) out.push_back(Start{open_[i].task, open_[i].index, i > 0});
  open_.clear();
  open_bytes_ = 0;
}

void Scheduler::stamp(std::vector<Start>& out, size_t from, double now) {
  for (size_t i = from; i < out.size(); ++i) out[i].task->subs[out[i].index].t_start = now;
}

void Scheduler::forget(int64_t id) {
  auto found = tasks_.find(id);
  if (found != tasks_.end() && found->second.remaining == 0) tasks_.erase(found);
}

Task* Scheduler::find(int64_t id) {
  auto found = tasks_.find(id);
  return found == tasks_.end() ? nullptr : &found->second;
}

int64_t Scheduler::instances(const std::string& name) const {
  auto found = instances_.find(name);
  return found == instances_.end() ? 0 : found->second;
}

std::vector<Task*> Scheduler::unfinished() {
  std::vector<Task*> tasks;
  tasks.reserve(unfinished_.size());
  for (auto& [seq, task] : unfinished_) tasks.push_back(task);
  return tasks;
}

}  // namespace bytesched
