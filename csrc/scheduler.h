// The scheduling decision in C++: bytesched/core/scheduler.py's Scheduler and the policies the
// runtime Core uses on the hot path (bytescheduler's priority order under a credit window, fifo,
// and the followers' immediate, rank-0 and sequence orders), as a pure state machine: no thread,
// clock, lock or I/O. Events in (enqueue, ready, finish, set_params, announce, a change of
// order), the sub-tasks to start out, in order. The Python Scheduler stays the reference:
// tests/test_native_scheduler.py feeds both the same randomized event traces and asserts the same
// starts in the same order. Names and rules follow the Python modules they mirror; a rule is
// explained there, not repeated here.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace bytesched {

// An event that contradicts the protocol (Python's SchedulingError / SequenceError).
class SchedulingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// SchedulingParams: partition_bytes NaN means "the policy's default" (Python's None);
// batch_bytes 0: no batching while busy.
struct Params {
  double partition_bytes;
  double credit_bytes;
  double batch_bytes;
};

struct SubTask {
  int32_t index;
  int64_t begin, end;  // element range of the task's flat buffer
  int64_t nbytes;
  double t_start, t_finish;  // NaN until started / finished
};

struct Task {
  int64_t id;  // the driver's name for it
  std::string name;
  int64_t priority;
  int64_t numel;
  int32_t itemsize;
  int64_t nbytes;
  int64_t instance = 0;
  int64_t seq = 0;
  double t_enqueue, t_ready;
  std::vector<SubTask> subs;
  int32_t remaining = 0;
  int32_t batcher = -1;  // CommTask.batcher: tasks of one batcher may start in one batch; -1: none
};

// (task name, instance, partition index): one sub-task on every rank.
struct Key {
  std::string name;
  int64_t instance;
  int32_t index;
  bool operator==(const Key& other) const {
    return instance == other.instance && index == other.index && name == other.name;
  }
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    return std::hash<std::string>()(key.name) ^ (std::hash<int64_t>()(key.instance) * 31u) ^
           (std::hash<int32_t>()(key.index) * 1000003u);
  }
};

// A sub-task to start: its task and partition index; ``joins``: it starts in one operation with
// the Start before it (a batch, SubTask.batch).
struct Start {
  Task* task;
  int32_t index;
  bool joins = false;
};

struct Window {
  int64_t inflight_bytes = 0;
  int64_t inflight_count = 0;
};

// The leader policies this Scheduler implements (bytesched/core/policies: bytescheduler, fifo).
enum class Leader { kByteScheduler, kFifo };

Leader leader_named(const std::string& name);  // SchedulingError for a policy it does not implement

class Policy {
 public:
  explicit Policy(Params params) : params(params) {}
  virtual ~Policy() = default;
  virtual const char* name() const = 0;
  virtual double partition_bytes() const = 0;
  virtual void set_params(const Params& p) { params = p; }
  // Every sub-task of ``task`` became ready.
  virtual void push(Task& task) = 0;
  // Append, in order, every ready sub-task that may start now, counting each into ``window``.
  virtual void release(Window& window, std::vector<Start>& out) = 0;
  // May a ready sub-task wait (Policy.holds_back)?
  virtual bool holds_back() const { return true; }
  // The leader a follower policy partitions like (itself for a leader).
  virtual std::shared_ptr<Policy> leader() { return nullptr; }
  // May the Scheduler batch what it releases (Policy.batches)? Not a follower's.
  virtual bool batches() const { return true; }
  Params params;
};

// bytescheduler: priority order under a credit window (CreditPolicy), or fifo.
std::shared_ptr<Policy> make_leader(Leader kind, Params params);
// A follower's policies, partitioning like ``leader``.
std::shared_ptr<Policy> make_immediate(std::shared_ptr<Policy> leader);
std::shared_ptr<Policy> make_follow(std::shared_ptr<Policy> leader);
std::shared_ptr<Policy> make_sequence(std::shared_ptr<Policy> leader, std::vector<std::string> names);

// Follow order: rank 0 started these sub-tasks in this order, each ``joins``-flagged one in one
// operation with the one before it (FollowOrderPolicy.announce).
void announce_to(Policy& follow, const std::vector<Key>& keys, const std::vector<bool>& joins);
// A follower in rank-0 order: the announced key this rank has not made ready (none: false).
bool announced_missing(Policy& follow, Key* key);

// split_elements: element ranges of at most ``size`` bytes covering ``numel`` elements.
std::vector<std::pair<int64_t, int64_t>> split_elements(int64_t numel, int32_t itemsize, double size);

class Scheduler {
 public:
  explicit Scheduler(std::shared_ptr<Policy> policy);

  // -- events (each appends what starts now to ``out``)
  void enqueue(int64_t id, const std::string& name, int64_t priority, int64_t numel, int32_t itemsize,
               int32_t batcher, double now);
  void ready(int64_t id, double now, std::vector<Start>& out);
  // finish(): a run of finishes; appends the tasks they completed to ``completed`` (the driver
  // forget()s each once it has read it).
  void finish_many(const std::vector<std::pair<int64_t, int32_t>>& subs, double now, std::vector<Start>& out,
                   std::vector<Task*>& completed);
  void set_params(const Params& params, double now, std::vector<Start>& out);
  void announce(const std::vector<Key>& keys, const std::vector<bool>& joins, double now, std::vector<Start>& out);
  void set_policy(std::shared_ptr<Policy> policy);

  // -- queries
  void forget(int64_t id);
  Task* find(int64_t id);
  Policy& policy() { return *policy_; }
  std::shared_ptr<Policy> policy_ptr() { return policy_; }
  const Window& window() const { return window_; }
  int64_t waiting() const { return waiting_; }
  size_t open() const { return open_.size(); }
  int64_t instances(const std::string& name) const;
  std::vector<Task*> unfinished();  // oldest first
  bool idle() const { return unfinished_.empty(); }

 private:
  void schedule(double now, std::vector<Start>& out);
  void batched(const std::vector<Start>& released, std::vector<Start>& out);
  void emit_open(std::vector<Start>& out);
  void stamp(std::vector<Start>& out, size_t from, double now);

  std::shared_ptr<Policy> policy_;
  Window window_;
  std::unordered_map<std::string, int64_t> instances_;
  int64_t seq_ = 0;
  std::unordered_map<int64_t, Task> tasks_;  // by id; enqueued and not forgotten
  std::map<int64_t, Task*> unfinished_;      // by seq
  int64_t waiting_ = 0;
  bool batching_ = false;       // the policy's batches()
  std::vector<Start> open_;     // the open batch: admitted, waiting to start with the next ones
  int64_t open_bytes_ = 0;
  std::vector<Start> released_;  // scratch: what the policy released, before batching
};

}  // namespace bytesched
