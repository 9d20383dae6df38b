// An emulated accelerator for the MXNet benchmark (benchmarks/emulated/mxnet_compute.py).
//
// The benchmark's emulated layers own real parameter and gradient arrays with a profile's byte
// sizes, and take the profile's per-layer time. On a GPU-trained job that time is spent on the
// device: the host's CPU and Python's GIL are free for communication. Python custom operators
// cannot emulate that: each layer enters the interpreter several times per pass, so the layers
// compete with bytesched's Python threads for the GIL and ran 197 ms plain against 326 ms under
// bytesched (the emulated benchmark, docs/benchmarks.md). Here a layer is one asynchronous engine
// operation that, once its inputs are ready, hands its completion to a timer thread and returns:
// it holds no engine worker, no GIL and no CPU while it "computes".
//
// The layers run one at a time in the order they were posted, as kernels on one GPU stream do: a
// layer starts when its inputs are ready or when the device finishes the layer posted before
// it, whichever is later, and ends its time after that. The device keeps that clock itself,
// instead of chaining the operations through an engine variable: with a chain, every layer
// would also wait for the engine to dispatch it after its predecessor completed (about 55 us
// here), 8 ms per step of the emulated Transformer's 154 layer passes, which a GPU, with kernels
// queued ahead, does not spend.
//
// A forward layer reads its weights (so it waits for their pull or update); a backward layer
// writes its gradients (so the communication that reads them waits for it, and the layer waits
// for the previous step's communication to finish reading them). The values are left as they
// are: the benchmark's weights and gradients are zeros, and only their bytes and their timing
// matter.
//
// Only MXNet's C API and the inline CallbackOnComplete are used, as in proxies.cc.

#include <mxnet/c_api.h>
#include <mxnet/engine.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using mxnet::Context;
using mxnet::FnProperty;
using mxnet::engine::CallbackOnComplete;

// Completes engine operations at their deadlines, from its own thread.
class Timer {
 public:
  Timer() : worker_([this] { loop(); }) { worker_.detach(); }

  void complete_at(Clock::time_point deadline, const CallbackOnComplete& done) {
    std::lock_guard<std::mutex> lock(mu_);
    due_.emplace(deadline, done);
    cv_.notify_one();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (due_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto next = due_.begin();
      if (Clock::now() < next->first) {
        cv_.wait_until(lock, next->first);
        continue;
      }
      const CallbackOnComplete done = next->second;
      due_.erase(next);
      lock.unlock();
      done();  // outside the lock: the engine may post dependent operations from here
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, CallbackOnComplete> due_;
  std::thread worker_;
};

// A layer operation: its place in posting order and its time.
struct Layer {
  uint64_t sequence;
  Clock::duration time;
};

// The emulated device: starts the layers in posting order and keeps its own clock.
class Device {
 public:
  // The next layer in posting order.
  Layer* post(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    return new Layer{posted_++, std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds))};
  }

  // `layer`'s inputs are ready (now); `done` completes it. With `done` empty, the layer was
  // never posted to the engine and takes no time.
  void ready(const Layer& layer, const CallbackOnComplete* done) {
    std::lock_guard<std::mutex> lock(mu_);
    Waiting& w = waiting_[layer.sequence];
    w.ready = Clock::now();
    if (done != nullptr) {
      w.time = layer.time;
      w.done = *done;
    }
    for (auto next = waiting_.begin(); next != waiting_.end() && next->first == started_;
         next = waiting_.erase(next), ++started_) {
      free_ = std::max(free_, next->second.ready) + next->second.time;
      if (next->second.done) timer_.complete_at(free_, *next->second.done);
    }
  }

 private:
  struct Waiting {
    Clock::time_point ready;
    Clock::duration time = Clock::duration::zero();
    std::optional<CallbackOnComplete> done;
  };

  std::mutex mu_;
  uint64_t posted_ = 0;   // layers handed out by post()
  uint64_t started_ = 0;  // layers started, in posting order
  std::map<uint64_t, Waiting> waiting_;  // ready, but a layer posted earlier has not started
  Clock::time_point free_{};  // when the device finishes the last started layer
  Timer timer_;
};

Device& device() {
  static Device* instance = new Device();  // never destroyed: MXNet waits for operations at exit
  return *instance;
}

thread_local std::string last_error;

int fail_mx(const char* what) {
  last_error = std::string(what) + ": " + MXGetLastError();
  return -1;
}

// Engine thread: the layer's inputs are ready.
void run_layer(void* /*rctx*/, void* on_complete, void* param) {
  device().ready(*static_cast<const Layer*>(param), static_cast<const CallbackOnComplete*>(on_complete));
}

void delete_layer(void* param) { delete static_cast<Layer*>(param); }

}  // namespace

extern "C" {

// The message of the last failed call on this thread.
const char* bs_last_error() { return last_error.c_str(); }

// Post n layer operations, in order. Layer i takes seconds[i]; it reads
// reads[read_ends[i-1] .. read_ends[i]) and writes writes[write_ends[i-1] .. write_ends[i])
// (read_ends[-1] = write_ends[-1] = 0).
int bs_emulate_layers(int n, const double* seconds, NDArrayHandle* reads, const int* read_ends,
                      NDArrayHandle* writes, const int* write_ends, const char* name) {
  static const Context cpu = Context::CPU();
  static const FnProperty normal = FnProperty::kNormal;
  for (int i = 0; i < n; ++i) {
    const int read_from = i == 0 ? 0 : read_ends[i - 1];
    const int write_from = i == 0 ? 0 : write_ends[i - 1];
    Layer* layer = device().post(seconds[i]);
    const Layer posted = *layer;  // the engine may have deleted `layer` when the push fails
    if (MXEnginePushAsyncND(run_layer, layer, delete_layer, &cpu, reads + read_from,
                            read_ends[i] - read_from, writes + write_from,
                            write_ends[i] - write_from, &normal, 0, name, false) != 0) {
      device().ready(posted, nullptr);  // later layers must not wait for it
      return fail_mx("posting an emulated layer to the MXNet engine");
    }
  }
  return 0;
}

// Mark the gradients of n weight arrays as computed, as autograd's backward does, so that
// Gluon's Trainer accepts them.
int bs_mark_gradients_fresh(NDArrayHandle* weights, int n) {
  for (int i = 0; i < n; ++i) {
    if (MXNDArraySetGradState(weights[i], 1) != 0) return fail_mx("MXNDArraySetGradState");
  }
  return 0;
}

}  // extern "C"
