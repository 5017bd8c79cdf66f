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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "emulator.h"

namespace yuan::emu {

struct StreamState {
  bool blocking = true;
  bool running = false;
  std::deque<Step> queue;
  uint64_t enqueued = 0, done = 0;  // operations so far; done + queue.size() == enqueued
};

namespace {

struct Streams {
  StreamState legacy;
  std::set<StreamState*> live;  // created and not destroyed; destroyed ones stay allocated for events' sake
};

Streams& streams() {
  static Streams* s = new Streams;
  return *s;
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
    Step step = std::move(s.queue.front());
    s.queue.pop_front();
    if (sticky_error() == cudaSuccess && !step(block)) {
      s.queue.push_front(std::move(step));
      complete = false;
      break;
    }
    s.done++;
  }
  s.running = false;
  return complete;
}

void push(StreamState& s, Step step) {
  s.queue.push_back(std::move(step));
  s.enqueued++;
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

struct Call {
  const char* name = nullptr;
  const void* caller = nullptr;
};
thread_local Call t_call;

StreamState* stream_state(cudaStream_t s) {
  Streams& all = streams();
  if (s == nullptr || s == cudaStreamLegacy) return &all.legacy;
  StreamState* st = reinterpret_cast<StreamState*>(s);
  return all.live.count(st) ? st : nullptr;
}

}  // namespace

bool valid_stream(cudaStream_t s) { return stream_state(s) != nullptr; }

cudaStream_t create_stream(bool blocking) {
  auto* st = new StreamState;
  st->blocking = blocking;
  streams().live.insert(st);
  return reinterpret_cast<cudaStream_t>(st);
}

void destroy_stream(cudaStream_t s) {
  StreamState* st = stream_state(s);
  run_until(*st, st->enqueued, true);  // CUDA finishes a destroyed stream's work before releasing it
  streams().live.erase(st);
}

void enqueue(cudaStream_t s, Step step) {
  Streams& all = streams();
  StreamState& st = *stream_state(s);
  if (&st == &all.legacy) {
    for (StreamState* b : all.live)
      if (b->blocking && b->enqueued > b->done) push(st, wait_for(*b, b->enqueued));
  } else if (st.blocking && all.legacy.enqueued > all.legacy.done) {
    push(st, wait_for(all.legacy, all.legacy.enqueued));
  }
  push(st, std::move(step));
  // Earliest: now, without blocking on a peer's transfer (what cannot finish yet waits for the next run).
  if (mode() == StreamMode::Earliest && !st.running) run_until(st, st.enqueued, false);
}

StreamPoint stream_point(cudaStream_t s) {
  enqueue(s, [](bool) { return true; });  // a marker, so that the legacy stream's implicit waits come before it
  StreamState* st = stream_state(s);
  return StreamPoint{st, st->enqueued};
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

std::string current_call() {
  if (!t_call.name) return "a later call";
  return format("%s (called from %s)", t_call.name, function_name(t_call.caller).c_str());
}

}  // namespace yuan::emu
