// Streams: a queue of operations each, run when the host needs their result (a synchronize, an event query, a
// blocking copy, a free, an operation of another stream that waits for them) and not before. This is one of the
// executions CUDA allows: work on a stream is ordered, and across streams only the waits (events, the legacy
// stream's implicit ones) order it. Running late is also the adversarial choice: work that should have waited for
// another stream but does not reads memory before that stream has written it, so a missing wait shows as a wrong
// result here rather than as a rare one on a GPU.
//
// That is the default mode (StreamMode, cuda_emu.h). Under Latest, what the default still runs early does not:
// pageable host-to-device copies and NCCL operations wait in their streams too (runtime.cpp, nccl.cpp). Under
// Earliest, every operation runs at its enqueue as far as its dependencies allow, the other extreme: work that
// should have waited for a later enqueue (a host buffer filled after the copy that reads it was enqueued) shows.
//
// The legacy default stream (0, cudaStreamLegacy) waits for all work enqueued before on blocking streams, and they
// for its (CUDA's implicit synchronisation); cudaStreamNonBlocking streams do neither.
//
// Apart from when work runs, each stream and the host keep a vector clock of what CUDA orders before their next
// operation: a stream's own earlier work, what its event waits and the legacy stream's implicit synchronisation
// join in, and what the host had seen when it enqueued (so host synchronisations carry over to the work it
// enqueues after them). Every operation takes the clock at its enqueue; order.cpp holds the accesses of memory to
// it, so a missing wait is a race in every mode, however the work happened to run.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "emulator.h"

namespace yuan::emu {

struct StreamState {
  int id = 0;  // its index in the vector clocks (0 is the host, 1 the legacy stream)
  bool blocking = true;
  bool running = false;
  struct Entry {
    Step step;
    std::shared_ptr<Operation> op;
  };
  std::deque<Entry> queue;
  uint64_t enqueued = 0, done = 0;  // operations so far; done + queue.size() == enqueued
  std::shared_ptr<const VectorClock> seen = std::make_shared<VectorClock>();  // ordered before its next operation
  uint64_t host_version = 0;  // the host clock's version it last joined
};

thread_local Operation* t_operation = nullptr;

namespace {

struct Streams {
  StreamState legacy;
  std::set<StreamState*> live;  // created and not destroyed; destroyed ones stay allocated for events' sake
  std::vector<StreamState*> by_id{nullptr, &legacy};  // every stream ever created, by clock index
  // The host: what it has synchronised with, its accesses so far, and a version that changes with either.
  std::shared_ptr<const VectorClock> host_seen = std::make_shared<VectorClock>();
  uint64_t host_seq = 0, host_version = 0;
  Streams() { legacy.id = 1; }
};

Streams& streams() {
  static Streams* s = new Streams;
  return *s;
}

uint64_t entry(const VectorClock& c, int i) { return static_cast<size_t>(i) < c.size() ? c[i] : 0; }

// `into` joined with `from` and point (id, seq): copied only when something grows, since operations share it.
void join(std::shared_ptr<const VectorClock>& into, const VectorClock& from, int id, uint64_t seq) {
  const VectorClock& now = *into;
  bool grows = entry(now, id) < seq;
  for (size_t i = 0; i < from.size() && !grows; i++) grows = from[i] > entry(now, static_cast<int>(i));
  if (!grows) return;
  auto c = std::make_shared<VectorClock>(std::max({now.size(), from.size(), static_cast<size_t>(id) + 1}), 0);
  for (size_t i = 0; i < c->size(); i++)
    (*c)[i] = std::max(entry(now, static_cast<int>(i)), entry(from, static_cast<int>(i)));
  (*c)[id] = std::max((*c)[id], seq);
  into = std::move(c);
}

// What the host has seen joined into a stream, before the stream's next operation.
void join_host(StreamState& s) {
  Streams& all = streams();
  if (s.host_version == all.host_version) return;
  join(s.seen, *all.host_seen, 0, all.host_seq);
  s.host_version = all.host_version;
}

// The host synchronised with stream `id` up to `seq`, which had seen `seen`.
void host_join(const VectorClock& seen, int id, uint64_t seq) {
  Streams& all = streams();
  const auto before = all.host_seen;
  join(all.host_seen, seen, id, seq);
  if (all.host_seen == before) return;
  all.host_version++;
  check_owned_pinned();
}

// Runs s's operations up to number `upto`.
bool run_until(StreamState& s, uint64_t upto, bool block) {
  if (s.done >= upto) return true;
  if (s.running) {  // an operation waiting for a later one of its own stream: recorded events cannot ask that
    std::fprintf(stderr, "cuda emulator: a stream waits for itself\n");
    std::abort();
  }
  s.running = true;
  bool complete = true;
  while (s.done < upto) {
    // After a failed kernel the context is gone: what was enqueued behind it never runs.
    StreamState::Entry e = std::move(s.queue.front());
    s.queue.pop_front();
    if (sticky_error() == cudaSuccess) {
      Operation* outer = t_operation;  // a wait runs another stream's work inside this one's step
      t_operation = e.op.get();
      const bool finished = e.step(block);
      t_operation = outer;
      if (!finished) {
        s.queue.push_front(std::move(e));
        complete = false;
        break;
      }
      if (sticky_error() == cudaSuccess) settle(e.op);
    }
    s.done++;
  }
  s.running = false;
  return complete;
}

struct Call {
  const char* name = nullptr;
  const void* caller = nullptr;
};
thread_local Call t_call;

StreamState::Entry& push(StreamState& s, Step step) {
  auto op = std::make_shared<Operation>();
  op->stream = s.id;
  op->seq = ++s.enqueued;
  op->seen = s.seen;
  op->call = t_call.name;
  op->caller = t_call.caller;
  s.queue.push_back({std::move(step), std::move(op)});
  return s.queue.back();
}

Step wait_for(StreamState& other, uint64_t upto) {
  return [&other, upto](bool block) { return run_until(other, upto, block); };
}

StreamMode mode_from_env() {
  const char* v = std::getenv("YUAN_EMU_STREAMS");
  if (!v || !*v || !std::strcmp(v, "default")) return StreamMode::Default;
  if (!std::strcmp(v, "latest")) return StreamMode::Latest;
  if (!std::strcmp(v, "earliest")) return StreamMode::Earliest;
  std::fprintf(stderr, "cuda emulator: YUAN_EMU_STREAMS=%s: expected default, latest or earliest\n", v);
  std::exit(2);
}

StreamMode& mode() {
  static StreamMode m = mode_from_env();
  return m;
}

StreamState* stream_state(cudaStream_t s) {
  Streams& all = streams();
  if (s == nullptr || s == cudaStreamLegacy) return &all.legacy;
  StreamState* st = reinterpret_cast<StreamState*>(s);
  return all.live.count(st) ? st : nullptr;
}

}  // namespace

bool valid_stream(cudaStream_t s) { return stream_state(s) != nullptr; }

cudaStream_t create_stream(bool blocking) {
  Streams& all = streams();
  auto* st = new StreamState;
  st->blocking = blocking;
  st->id = static_cast<int>(all.by_id.size());
  all.by_id.push_back(st);
  all.live.insert(st);
  return reinterpret_cast<cudaStream_t>(st);
}

void destroy_stream(cudaStream_t s) {
  StreamState* st = stream_state(s);
  run_until(*st, st->enqueued, true);  // CUDA finishes a destroyed stream's work before releasing it
  streams().live.erase(st);
}

std::shared_ptr<Operation> enqueue(cudaStream_t s, Step step, const void* kernel) {
  Streams& all = streams();
  StreamState& st = *stream_state(s);
  join_host(st);
  // The implicit synchronisation orders the work whether or not it has run yet; only unfinished work is waited for.
  if (&st == &all.legacy) {
    for (StreamState* b : all.live)
      if (b->blocking) {
        if (b->enqueued > entry(*st.seen, b->id)) join(st.seen, *b->seen, b->id, b->enqueued);
        if (b->enqueued > b->done) push(st, wait_for(*b, b->enqueued));
      }
  } else if (st.blocking) {
    if (all.legacy.enqueued > entry(*st.seen, all.legacy.id))
      join(st.seen, *all.legacy.seen, all.legacy.id, all.legacy.enqueued);
    if (all.legacy.enqueued > all.legacy.done) push(st, wait_for(all.legacy, all.legacy.enqueued));
  }
  std::shared_ptr<Operation> op = push(st, std::move(step)).op;
  op->kernel = kernel;
  // Earliest: now, without blocking on a peer's transfer (what cannot finish yet waits for the next run).
  if (mode() == StreamMode::Earliest && !st.running) run_until(st, st.enqueued, false);
  return op;
}

StreamPoint stream_point(cudaStream_t s) {
  // A marker, so that the legacy stream's implicit waits come before it.
  std::shared_ptr<Operation> op = enqueue(s, [](bool) { return true; });
  return StreamPoint{stream_state(s), op->seq, std::move(op)};
}

void stream_waits(cudaStream_t s, const StreamPoint& p) {
  StreamState& st = *stream_state(s);
  if (p.op) join(st.seen, *p.op->seen, p.op->stream, p.op->seq);
  enqueue(s, [p](bool block) { return run_until(p, block); });
}

void host_sees(const StreamPoint& p) {
  if (p.op) host_join(*p.op->seen, p.op->stream, p.op->seq);
}

std::shared_ptr<Operation> host_operation() {
  Streams& all = streams();
  auto op = std::make_shared<Operation>();
  op->seq = ++all.host_seq;
  op->seen = all.host_seen;
  all.host_version++;
  return op;
}

bool host_has_seen(int stream, uint64_t seq) { return entry(*streams().host_seen, stream) >= seq; }

// A stream's clock has joined nothing since its last operation's enqueue beyond what that operation saw (joins come
// with an enqueue), so it stands for that operation.
void host_sees_stream(cudaStream_t s) {
  const StreamState& st = *stream_state(s);
  host_join(*st.seen, st.id, st.enqueued);
}

void host_sees_all() {
  Streams& all = streams();
  for (size_t i = 1; i < all.by_id.size(); i++) {
    const StreamState& s = *all.by_id[i];
    host_join(*s.seen, s.id, s.enqueued);
  }
}

bool run_until(const StreamPoint& p, bool block) { return !p.stream || run_until(*p.stream, p.seq, block); }

bool run_stream(cudaStream_t s, bool block) {
  StreamState& st = *stream_state(s);
  return run_until(st, st.enqueued, block);
}

void run_all_streams() {
  Streams& all = streams();
  run_until(all.legacy, all.legacy.enqueued, true);
  for (StreamState* s : std::vector<StreamState*>(all.live.begin(), all.live.end()))
    run_until(*s, s->enqueued, true);
}

void set_stream_mode(StreamMode m) {
  Lock lock(mutex());
  mode() = m;
}

StreamMode stream_mode() { return mode(); }

Calling::Calling(const char* call, const void* caller) { t_call = Call{call, caller}; }
Calling::~Calling() { t_call = Call{}; }

std::string stream_name(int stream) {
  if (stream == 0) return "the host";
  if (stream == 1) return "the legacy default stream";
  return format("stream %d (%p)", stream - 1, static_cast<void*>(streams().by_id[stream]));
}

std::string current_call() {
  if (!t_call.name) return "a later call";
  return format("%s (called from %s)", t_call.name, function_name(t_call.caller).c_str());
}

}  // namespace yuan::emu
