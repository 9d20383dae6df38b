// Dependency Proxies for MXNet's engine (ByteScheduler paper, section 3.3, Figure 6).
//
// MXNet's engine decides when a gradient has been computed and when an operation that reads it
// may run. Python cannot hold an engine operation open, so the operations that stand between the
// engine and the bytesched Core live here. Everything is posted through MXNet's C API
// (MXEnginePushAsyncND / MXEnginePushSyncND, dlpack for avatars), with the engine's completion
// callback (CallbackOnComplete, inline in <mxnet/engine.h> of the same wheel). Where the wheel is
// built with MKLDNN, the NDArray class of its <mxnet/ndarray.h> brings arrays back to the default
// layout ("MKLDNN layouts" below), the one use of libmxnet.so's C++ symbols.
//
// Per communicated tensor (a CommTask of n partitions) the plugin posts, in program order:
//   bs_post_entry:
//     fence(mutable: framework arrays)      waits for every earlier reader/writer of the tensors
//     ready proxy i (const: framework arrays, mutable: avatars of partition i), i = 0..n-1
//       runs once the gradient exists; counts towards the task's READY event; then stays open
//       until the Core calls bs_release(task, i) from CommTask.start(), or completes at once
//       if the task is released on ready (the Core would start it then anyway)
//   the backend's push/pull or all-reduce of partition i, on the avatars (ordered after proxy i)
//   bs_post_exit:
//     finish proxy i (mutable: avatars of partition i)  posts a FINISH event: notify_finish()
//     fence(mutable: framework arrays, const: all avatars)  the framework sees the tensors again
// A task of one partition (most small tensors) needs no fences: its ready proxy writes the
// framework arrays besides the avatars (so it waits for their earlier readers, as the entry fence
// does) and its finish proxy writes them too (so their later users wait for it, as for the exit
// fence). Two engine operations instead of four; each costs a push here and a dispatch to an
// engine thread.
// Two calls, not one per operation: every call from Python pays ctypes' argument conversion,
// and the training thread makes these calls for every key of every step. A KVStore's chain is
// one call (bs_post_store_chain), which makes the store's own push/pull in between (bs_post_store).
//
// bs_post_fence posts one such fence alone (a store passing through, without proxies or events).
//
// MKLDNN (oneDNN) layouts. Where the wheel is built with MKLDNN, an inference forward pass
// (Gluon outside autograd.record, e.g. an evaluation between epochs) rewrites a convolution's
// weight array in place into a blocked layout and marks it so. Communication that writes that
// memory through a view fails MXNet's `!is_view` check, and through an avatar (its own chunk,
// no layout mark) it writes the default layout into memory the weight's chunk still reads as
// blocked: the next forward computes with scrambled weights. So every operation of ours that
// writes the framework arrays before communication touches them (the entry fence, a
// one-partition task's ready proxy, a store's pass-through entry fence) first brings each one
// that holds a blocked layout back to the default layout, in place (to_default_layout). It runs
// on the engine thread with the arrays held for writing, after the reorder the forward posted.
//
// bs_post_copies posts the copies a fusion bucket makes between its gradients and its flat
// buffer as one engine operation. MXNet's own concat and identity would do, but each draws one
// of the engine's few shared temp-space variables, and a copy posted before its gradients exist
// holds that variable until they do, stalling every later operation that draws it.
//
// Events go to a queue that the bytesched Core's thread drains with bs_next_events (a blocking
// call that releases the GIL), so engine threads never enter the Python interpreter and an event
// reaches the Core with one thread wake-up. The Core waits here rather than on its own Python
// queue; whoever puts an event on that queue from another thread calls bs_wake, which makes the
// current or next wait return (a flag, so a wake that comes before the wait is not lost).

#include <mxnet/c_api.h>
#include <mxnet/engine.h>
#if MXNET_USE_MKLDNN == 1
#include <mxnet/ndarray.h>
#endif

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using mxnet::Context;
using mxnet::FnProperty;
using mxnet::engine::CallbackOnComplete;

constexpr int kEventReady = 1;
constexpr int kEventFinish = 2;

struct Event {
  int32_t kind;
  int32_t index;
  uint64_t task;
};

// The framework arrays an operation of ours brings back to the default layout before
// communication touches their memory (see "MKLDNN layouts" above): copies of the NDArray
// objects (they share the arrays' chunks), so the arrays stay valid while the operation waits.
#if MXNET_USE_MKLDNN == 1
using Layouts = std::vector<mxnet::NDArray>;

Layouts* layouts_of(NDArrayHandle* arrays, int n) {
  Layouts* held = new Layouts();
  held->reserve(n);
  for (int i = 0; i < n; ++i) held->push_back(*static_cast<mxnet::NDArray*>(arrays[i]));
  return held;
}

// Engine thread, with the arrays held for writing: reorder each array in a blocked layout into
// the default layout, in place (its chunk then reads its memory in the default layout).
void to_default_layout(Layouts* arrays) {
  if (arrays == nullptr) return;
  for (mxnet::NDArray& array : *arrays) {
    if (array.storage_type() != mxnet::kDefaultStorage || array.IsView() || !array.IsMKLDNNData()) continue;
    const mxnet::NDArray plain = array.Reorder2Default();  // a new array, default layout
    array.InvalidateMKLDNNData();
    std::memcpy(array.data().dptr_, plain.data().dptr_,
                array.shape().Size() * mshadow::mshadow_sizeof(array.dtype()));
  }
}

void delete_layouts(Layouts* arrays) { delete arrays; }
#else
struct Layouts {};
Layouts* layouts_of(NDArrayHandle* /*arrays*/, int /*n*/) { return nullptr; }
void to_default_layout(Layouts* /*arrays*/) {}
void delete_layouts(Layouts* /*arrays*/) {}
#endif

// A posted ready proxy: its partition, and the engine's completion callback once it has run.
struct Proxy {
  uint64_t task;
  int32_t index;
  bool released_on_ready = false;  // completes as soon as it has run; never in Hub::open
  bool ran = false;
  CallbackOnComplete done;
  Layouts* layouts = nullptr;  // a one-partition task's framework arrays (see "MKLDNN layouts")
  ~Proxy() { delete_layouts(layouts); }
};

struct Hub {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> events;
  std::unordered_map<uint64_t, int> waiting_ready;  // task -> ready proxies that have not run
  std::unordered_map<uint64_t, Proxy*> open;       // (task, index) -> proxy holding the engine
  bool closed = false;
  bool woken = false;     // bs_wake since the last bs_next_events returned
  bool draining = false;  // shutting down: proxies complete as soon as they run
};

Hub& hub() {
  static Hub* instance = new Hub();  // never destroyed: engine threads may outlive static dtors
  return *instance;
}

thread_local std::string last_error;

int fail(const std::string& message) {
  last_error = message;
  return -1;
}

int fail_mx(const char* what) {
  return fail(std::string(what) + ": " + MXGetLastError());
}

uint64_t slot(uint64_t task, int32_t index) {
  return (task << 24) | static_cast<uint64_t>(index);
}

const Context& cpu() {
  static const Context ctx = Context::CPU();
  return ctx;
}

const FnProperty kNormal = FnProperty::kNormal;

void push_event(Hub& h, Event ev) {
  h.events.push_back(ev);
  h.cv.notify_one();
}

// Engine thread: the gradient exists. Record the callback; the op stays open until released
// (unless the task is released on ready: its READY event is queued before the backend can run).
void run_ready(void* /*rctx*/, void* on_complete, void* param) {
  Proxy* proxy = static_cast<Proxy*>(param);
  const CallbackOnComplete done = *static_cast<CallbackOnComplete*>(on_complete);
  to_default_layout(proxy->layouts);
  Hub& h = hub();
  {
    std::lock_guard<std::mutex> lock(h.mu);
    if (!h.draining) {
      auto it = h.waiting_ready.find(proxy->task);
      if (it != h.waiting_ready.end() && --it->second == 0) {
        h.waiting_ready.erase(it);
        push_event(h, Event{kEventReady, 0, proxy->task});
      }
      if (!proxy->released_on_ready) {
        proxy->done = done;
        proxy->ran = true;
        return;
      }
    } else {
      h.open.erase(slot(proxy->task, proxy->index));
    }
  }
  delete proxy;
  done();
}

// Engine thread: the partition's communication wrote its avatars.
void run_finish(void* /*rctx*/, void* param) {
  const Event* ev = static_cast<const Event*>(param);
  Hub& h = hub();
  std::lock_guard<std::mutex> lock(h.mu);
  push_event(h, *ev);
}

void delete_event(void* param) { delete static_cast<Event*>(param); }

void run_nothing(void* /*rctx*/, void* /*param*/) {}

// Pieces of memory to copy, each from srcs[i] to dsts[i], bytes[i] long.
struct Copies {
  std::vector<const char*> srcs;
  std::vector<char*> dsts;
  std::vector<size_t> bytes;
};

void run_copies(void* /*rctx*/, void* param) {
  const Copies* copies = static_cast<const Copies*>(param);
  for (size_t i = 0; i < copies->bytes.size(); ++i) {
    std::memcpy(copies->dsts[i], copies->srcs[i], copies->bytes[i]);
  }
}

void delete_copies(void* param) { delete static_cast<Copies*>(param); }

void run_to_default_layout(void* /*rctx*/, void* param) { to_default_layout(static_cast<Layouts*>(param)); }

void delete_fence_layouts(void* param) { delete_layouts(static_cast<Layouts*>(param)); }

// Post an ordering fence: it waits for earlier users of `reads` (as a reader) and of `writes` (as
// a writer), and later operations on them wait for it. Its only work: the first `n_framework`
// writes, framework arrays, are brought back to the default layout (see "MKLDNN layouts").
int post_fence(NDArrayHandle* reads, int n_reads, NDArrayHandle* writes, int n_writes, int n_framework,
               int priority, const char* name) {
  Layouts* layouts = n_framework > 0 ? layouts_of(writes, n_framework) : nullptr;
  int status = layouts == nullptr
      ? MXEnginePushSyncND(run_nothing, nullptr, nullptr, &cpu(), reads, n_reads, writes, n_writes,
                           &kNormal, priority, name)
      : MXEnginePushSyncND(run_to_default_layout, layouts, delete_fence_layouts, &cpu(), reads, n_reads,
                           writes, n_writes, &kNormal, priority, name);
  if (status != 0) return fail_mx("posting a bytesched fence to the MXNet engine");
  return 0;
}

// Post the n finish proxies of `task`: proxy i mutates the `per_part` avatars of partition i
// and posts a FINISH event (task, i) once the partition's communication has written them.
int post_finish(uint64_t task, int n, NDArrayHandle* writes, int per_part, int priority) {
  for (int i = 0; i < n; ++i) {
    Event* ev = new Event{kEventFinish, i, task};
    if (MXEnginePushSyncND(run_finish, ev, delete_event, &cpu(), nullptr, 0,
                           writes + static_cast<size_t>(i) * per_part, per_part, &kNormal,
                           priority, "bytesched_finish_proxy") != 0) {
      return fail_mx("posting a bytesched finish proxy to the MXNet engine");
    }
  }
  return 0;
}

// Post the n ready proxies of `task`. Proxy i reads `reads` and mutates the `per_part` avatars
// writes[i*per_part .. (i+1)*per_part). One READY event is posted when all n have run.
// A one-partition task's proxy also brings `tensors` (its framework arrays, among `writes`) back
// to the default layout before anything else (n_tensors 0: none).
int post_ready(uint64_t task, int n, NDArrayHandle* reads, int n_reads, NDArrayHandle* writes,
               int per_part, int priority, bool released_on_ready, NDArrayHandle* tensors = nullptr,
               int n_tensors = 0) {
  Hub& h = hub();
  std::vector<Proxy*> proxies;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    if (h.waiting_ready.count(task)) return fail("bs_post_entry: task token already in use");
    h.waiting_ready[task] = n;
    for (int i = 0; i < n; ++i) {
      Proxy* proxy = new Proxy();
      proxy->task = task;
      proxy->index = i;
      proxy->released_on_ready = released_on_ready;
      if (n_tensors > 0) proxy->layouts = layouts_of(tensors, n_tensors);
      if (!released_on_ready) h.open[slot(task, i)] = proxy;
      proxies.push_back(proxy);
    }
  }
  for (int i = 0; i < n; ++i) {
    if (MXEnginePushAsyncND(run_ready, proxies[i], nullptr, &cpu(), reads, n_reads,
                            writes + static_cast<size_t>(i) * per_part, per_part, &kNormal,
                            priority, "bytesched_ready_proxy", false) != 0) {
      return fail_mx("posting a bytesched ready proxy to the MXNet engine");
    }
  }
  return 0;
}

// A one-partition task's avatars followed by its framework arrays: the variables its single
// ready or finish proxy writes, standing in for the fence beside it (distinct variables: avatars
// have their own).
std::vector<NDArrayHandle> with_tensors(NDArrayHandle* avatars, int per_part, NDArrayHandle* tensors,
                                        int n_tensors) {
  std::vector<NDArrayHandle> writes(avatars, avatars + per_part);
  writes.insert(writes.end(), tensors, tensors + n_tensors);
  return writes;
}

}  // namespace

extern "C" {

// The message of the last failed call on this thread.
const char* bs_last_error() { return last_error.c_str(); }

// Version of this library's C interface; the Python loader refuses a stale build.
int bs_abi_version() { return 9; }

// Post one engine operation that copies n pieces of memory, srcs[i] to dsts[i], bytes[i] each.
// It orders as a reader of `reads` and a writer of `writes`, the arrays that own that memory,
// and draws no shared resource.
int bs_post_copies(void** srcs, void** dsts, const uint64_t* bytes, int n, NDArrayHandle* reads,
                   int n_reads, NDArrayHandle* writes, int n_writes, int priority, const char* name) {
  if (n <= 0) return fail("bs_post_copies: nothing to copy");
  Copies* copies = new Copies();
  for (int i = 0; i < n; ++i) {
    copies->srcs.push_back(static_cast<const char*>(srcs[i]));
    copies->dsts.push_back(static_cast<char*>(dsts[i]));
    copies->bytes.push_back(static_cast<size_t>(bytes[i]));
  }
  if (MXEnginePushSyncND(run_copies, copies, delete_copies, &cpu(), reads, n_reads, writes, n_writes,
                         &kNormal, priority, name) != 0) {
    return fail_mx("posting bytesched copies to the MXNet engine");
  }
  return 0;
}

// Post one operation that orders: it runs after every earlier user of `reads` and `writes` (as a
// reader, a writer), and everything posted later on them waits for it; the first `n_framework`
// writes are framework arrays it brings back to the default layout. A store that passes a
// partitioned tensor straight to the backend brackets the partitions' operations on avatars with
// two of these, so they run concurrently but after the tensor's producer and before its next user.
int bs_post_fence(NDArrayHandle* reads, int n_reads, NDArrayHandle* writes, int n_writes, int n_framework,
                  int priority, const char* name) {
  return post_fence(reads, n_reads, writes, n_writes, n_framework, priority, name);
}

// Post the head of a task's chain: the entry fence on the n_tensors framework arrays, then the
// task's n ready proxies (post_ready); with released_on_ready != 0 they complete once they ran.
int bs_post_entry(uint64_t task, int n, NDArrayHandle* tensors, int n_tensors,
                  NDArrayHandle* avatars, int per_part, int priority, int released_on_ready) {
  if (n <= 0 || n >= (1 << 24)) return fail("bs_post_entry: partition count out of range");
  if (n == 1) {  // the one ready proxy is the entry fence too: a writer of the tensors
    std::vector<NDArrayHandle> writes = with_tensors(avatars, per_part, tensors, n_tensors);
    return post_ready(task, 1, nullptr, 0, writes.data(), static_cast<int>(writes.size()), priority,
                      released_on_ready != 0, tensors, n_tensors);
  }
  if (post_fence(nullptr, 0, tensors, n_tensors, n_tensors, priority, "bytesched_entry_fence") != 0) return -1;
  return post_ready(task, n, tensors, n_tensors, avatars, per_part, priority, released_on_ready != 0);
}

// Post the tail of a task's chain, after the backend's operations: the n finish proxies, then
// the exit fence, which reads every avatar and writes the framework arrays.
int bs_post_exit(uint64_t task, int n, NDArrayHandle* tensors, int n_tensors,
                 NDArrayHandle* avatars, int per_part, int priority) {
  if (n == 1) {  // the one finish proxy is the exit fence too: a writer of the tensors
    std::vector<NDArrayHandle> writes = with_tensors(avatars, per_part, tensors, n_tensors);
    return post_finish(task, 1, writes.data(), static_cast<int>(writes.size()), priority);
  }
  if (post_finish(task, n, avatars, per_part, priority) != 0) return -1;
  return post_fence(avatars, n * per_part, tensors, n_tensors, 0, priority, "bytesched_exit_fence");
}

// A KVStore's own operation: the push of `vals` to `vkeys` and the pull of `okeys` into `outs`,
// a pushpull where it has both (MXKVStorePushPull), else MXKVStorePush or MXKVStorePull. Keys
// are the store's int keys, one per array (repeated for several arrays of one key, as MXNet's
// Python API flattens them). A store passing through posts this alone (bs_post_store): MXNet's
// Python API converts its arguments on every call and lets go of the GIL for it.
int bs_post_store(KVStoreHandle store, uint32_t n_vals, const int* vkeys, NDArrayHandle* vals,
                  uint32_t n_outs, const int* okeys, NDArrayHandle* outs, int priority) {
  int status;
  if (n_vals != 0 && n_outs != 0) {
    status = MXKVStorePushPull(store, n_vals, vkeys, n_outs, okeys, vals, outs, priority);
  } else if (n_vals != 0) {
    status = MXKVStorePush(store, n_vals, vkeys, vals, priority);
  } else if (n_outs != 0) {
    status = MXKVStorePull(store, n_outs, okeys, outs, priority);
  } else {
    return fail("bs_post_store: nothing to push or pull");
  }
  return status == 0 ? 0 : fail_mx("the KVStore's push or pull");
}

// A task's whole chain around a KVStore's own operation on its avatars, in one call: the head
// (bs_post_entry), the store's operation (bs_post_store) and the tail (bs_post_exit).
int bs_post_store_chain(uint64_t task, int n, NDArrayHandle* tensors, int n_tensors,
                        NDArrayHandle* avatars, int per_part, KVStoreHandle store, uint32_t n_vals,
                        const int* vkeys, NDArrayHandle* vals, uint32_t n_outs, const int* okeys,
                        NDArrayHandle* outs, int priority, int released_on_ready) {
  if (n_vals == 0 && n_outs == 0) return fail("bs_post_store_chain: nothing to push or pull");
  if (bs_post_entry(task, n, tensors, n_tensors, avatars, per_part, priority, released_on_ready) != 0 ||
      bs_post_store(store, n_vals, vkeys, vals, n_outs, okeys, outs, priority) != 0) {
    return -1;
  }
  return bs_post_exit(task, n, tensors, n_tensors, avatars, per_part, priority);
}

// Let ready proxy (task, index) complete: the engine may now run that partition's push/pull.
int bs_release(uint64_t task, int index) {
  Hub& h = hub();
  Proxy* proxy;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    auto it = h.open.find(slot(task, index));
    if (it == h.open.end()) return fail("bs_release: no open proxy for this task and partition");
    if (!it->second->ran) return fail("bs_release: the proxy has not run yet (task not ready)");
    proxy = it->second;
    h.open.erase(it);
  }
  proxy->done();  // outside the lock: the engine may run dependent operations inline
  delete proxy;
  return 0;
}

// Shutdown: release every open proxy, and complete proxies that run from now on at once, so
// that nothing stays blocked in the engine (MXNet waits for all operations at exit). Returns
// how many proxies were released.
int bs_drain() {
  Hub& h = hub();
  std::deque<Proxy*> ran;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.draining = true;
    h.waiting_ready.clear();
    for (auto it = h.open.begin(); it != h.open.end();) {
      if (it->second->ran) {
        ran.push_back(it->second);
        it = h.open.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Proxy* proxy : ran) {
    proxy->done();
    delete proxy;
  }
  return static_cast<int>(ran.size());
}

// Wait up to timeout_us (forever if negative) for events or a bs_wake; copy up to `capacity`
// into (kinds, indices, tasks). Returns the number copied (0 on timeout or wake), -2 once closed
// and drained.
int bs_next_events(int32_t* kinds, int32_t* indices, uint64_t* tasks, int capacity,
                   int64_t timeout_us) {
  Hub& h = hub();
  std::unique_lock<std::mutex> lock(h.mu);
  auto woken = [&h] { return !h.events.empty() || h.closed || h.woken; };
  if (timeout_us < 0) {
    h.cv.wait(lock, woken);
  } else {
    h.cv.wait_for(lock, std::chrono::microseconds(timeout_us), woken);
  }
  h.woken = false;
  if (h.events.empty()) return h.closed ? -2 : 0;
  int n = 0;
  while (n < capacity && !h.events.empty()) {
    const Event& ev = h.events.front();
    kinds[n] = ev.kind;
    indices[n] = ev.index;
    tasks[n] = ev.task;
    h.events.pop_front();
    ++n;
  }
  return n;
}

// Make the current bs_next_events return now, or the next one at once.
void bs_wake() {
  Hub& h = hub();
  std::lock_guard<std::mutex> lock(h.mu);
  h.woken = true;
  h.cv.notify_all();
}

// Wake bs_next_events callers and make them return -2 once the queue is drained.
void bs_close() {
  Hub& h = hub();
  std::lock_guard<std::mutex> lock(h.mu);
  h.closed = true;
  h.cv.notify_all();
}

// An avatar of `src`: a new NDArray over the same memory with its own engine variable, so the
// engine tracks the communicated buffer separately from the tensor the framework computes with.
// `src` must be allocated (the memory is taken now); the avatar keeps `src`'s storage alive.
int bs_make_avatar(NDArrayHandle src, NDArrayHandle* out) {
#if MXNET_USE_MKLDNN == 1
  // An array already in a blocked layout has no default-layout memory to share yet: reorder it
  // first, as MXNet's own MXNDArrayGetData does (rare: avatars are made once per key and layout).
  mxnet::NDArray* array = static_cast<mxnet::NDArray*>(src);
  if (array->storage_type() == mxnet::kDefaultStorage && array->IsMKLDNNData()) {
    array->Reorder2DefaultAsync();
    array->WaitToRead();
  }
#endif
  DLManagedTensorHandle dl = nullptr;
  if (MXNDArrayToDLPack(src, &dl) != 0) return fail_mx("bs_make_avatar: MXNDArrayToDLPack");
  if (MXNDArrayFromDLPackEx(dl, false, out) != 0) {
    MXNDArrayCallDLPackDeleter(dl);
    return fail_mx("bs_make_avatar: MXNDArrayFromDLPackEx");
  }
  return 0;
}

}  // extern "C"
