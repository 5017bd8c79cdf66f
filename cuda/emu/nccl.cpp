// NCCL in the emulator: a communicator is an MPI communicator over the same ranks, and each collective or
// transfer an MPI nonblocking operation on the buffers (emulated device memory is host memory), ordered on its CUDA
// stream: it starts when the stream's earlier work is done (the emulator runs that work first, on the calling
// thread) and the stream's later work waits for its completion. Operations start in the order the host issues
// them, which NCCL requires to be the same on every rank, so MPI matches them as NCCL would.
//
// Initialisation: ncclGetUniqueId writes the caller's world rank and a counter into the id; the communicator's
// rank 0 (which must be the id's maker, as in src/comm/nccl.cpp) collects the other members' world ranks over
// MPI_COMM_WORLD, sends them the table, and all of them create the MPI communicator of that group. Until then a
// nonblocking communicator reports ncclInProgress, so a member that never comes shows as a pending initialisation,
// not a hang; without MPI (a one-process test) a communicator of more than one rank never completes.
//
// Abort (ncclCommAbort), as NCCL's: callable while another thread waits in an operation of the communicator, it
// returns at once, and every operation of it still pending or queued ends without writing its output and without
// waiting for a peer that may never come. MPI cannot cancel a collective, so each operation works on buffers of
// its own (copied in when it starts, out when it completes): an abandoned one keeps them, and a peer that answers
// after the abort writes there, never into the caller's memory, which may be freed by then.
//
// bf16 and half sums, products, minima and maxima are reduced in fp32 and rounded back to nearest even, as NCCL does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "emulator.h"

namespace yuan::emu {
namespace {

constexpr char kIdMagic[8] = "yuanemu";
constexpr int kJoinTagBase = 16384, kJoinTags = 16000;  // MPI guarantees tags up to 32767
constexpr int kP2pTag = 7;

struct Id {
  char magic[8];
  int root_world;  // the maker's rank in MPI_COMM_WORLD, or -1 without MPI
  int serial;      // the maker's count of ids so far
};

bool mpi_running() {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  return up && !down;
}

}  // namespace
}  // namespace yuan::emu

struct ncclComm {
  int rank = 0, size = 1;
  bool blocking = true;
  MPI_Comm mpi = MPI_COMM_NULL;
  ncclResult_t state = ncclInProgress;  // ncclSuccess once every member has joined
  std::string last_error;
  // The join (see the file comment).
  int root_world = -1, tag = 0;
  std::vector<int> members;  // world rank of each comm rank
  std::vector<int> joins;    // rank 0: (comm rank, world rank) of each other member
  int mine[2] = {0, 0};      // other members: what they send rank 0
  std::vector<MPI_Request> requests;
  bool table_sent = false;
  // The last operation on each stream it enqueued on, which finalizing completes (ncclCommFinalize), and whether
  // that was asked for: its state stays ncclInProgress until they are done.
  std::vector<yuan::emu::StreamPoint> last_ops;
  bool finalizing = false;
  // Set by ncclCommAbort without the emulator's lock, which a thread waiting in an operation holds; shared with the
  // operations, which outlive the communicator.
  std::shared_ptr<std::atomic<bool>> aborted = std::make_shared<std::atomic<bool>>(false);
};

namespace yuan::emu {
namespace {

// One operation of a communicator, recorded in a group until ncclGroupEnd starts it. The MPI operations work on
// `stage` (see the file comment): `start` copies the input in and posts them, `finish` copies the output out.
struct Op {
  ncclComm_t comm;
  cudaStream_t stream;
  const void* input;   // what the operation reads, checked for initialisation when it starts
  size_t input_bytes;
  size_t stage_bytes;
  std::function<void(char* stage, std::vector<MPI_Request>&)> start;
  std::function<void(const char* stage)> finish;  // after the MPI operations completed: copies out, marks memory
  std::shared_ptr<std::atomic<bool>> aborted = nullptr;  // the communicator's (submit)
  std::vector<char> stage = {};
};

struct Group {
  int depth = 0;
  std::vector<Op> ops;
};

Group& group() {
  static Group g;
  return g;
}

ncclResult_t fail(ncclComm_t comm, ncclResult_t r, const std::string& what) {
  report(Check::Library, Where{}, 0, "NCCL: " + what, false, cudaErrorInvalidValue);
  if (comm) comm->last_error = what;
  return r;
}

// The MPI side of a join: advances without blocking; true once the communicator is ready.
bool progress_join(ncclComm_t c) {
  int done = 0;
  if (!c->requests.empty()) {
    MPI_Testall(static_cast<int>(c->requests.size()), c->requests.data(), &done, MPI_STATUSES_IGNORE);
    if (!done) return false;
    c->requests.clear();
  }
  if (c->rank == 0 && !c->table_sent) {  // every member has reported: tell them all who is who
    for (int i = 0; i + 1 < c->size; i++) {
      const int r = c->joins[2 * i], w = c->joins[2 * i + 1];
      if (r < 1 || r >= c->size || c->members[r] != -1) {
        c->state = ncclInvalidUsage;
        c->last_error = format("two members claim rank %d of the communicator", r);
        return false;
      }
      c->members[r] = w;
    }
    c->requests.resize(c->size - 1);
    for (int r = 1; r < c->size; r++)
      MPI_Isend(c->members.data(), c->size, MPI_INT, c->members[r], c->tag, MPI_COMM_WORLD, &c->requests[r - 1]);
    c->table_sent = true;
    return progress_join(c);
  }
  MPI_Group world, members;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_incl(world, c->size, c->members.data(), &members);
  MPI_Comm_create_group(MPI_COMM_WORLD, members, c->tag, &c->mpi);
  MPI_Group_free(&members);
  MPI_Group_free(&world);
  c->state = ncclSuccess;
  return true;
}

void poll(ncclComm_t c) {
  if (c->state == ncclInProgress && mpi_running() && c->size > 1) progress_join(c);
}

MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    case ncclFloat16: case ncclBfloat16: return MPI_UINT16_T;  // reduced by the operations below
  }
  return MPI_DATATYPE_NULL;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0;
}

// 16-bit floats reduce in fp32: one MPI_Op per (format, operation).
template <bool kBf16, ncclRedOp_t kOp>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; i++) {
    const float x = kBf16 ? bf16_bits_to_float(a[i]) : half_bits_to_float(a[i]);
    const float y = kBf16 ? bf16_bits_to_float(b[i]) : half_bits_to_float(b[i]);
    const float r = kOp == ncclSum ? x + y : kOp == ncclProd ? x * y : kOp == ncclMax ? std::max(x, y) : std::min(x, y);
    b[i] = kBf16 ? float_to_bf16_bits(r) : float_to_half_bits(r);
  }
}

template <bool kBf16>
MPI_Op op16(ncclRedOp_t op) {
  static MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static MPI_User_function* const fns[4] = {reduce16<kBf16, ncclSum>, reduce16<kBf16, ncclProd>,
                                            reduce16<kBf16, ncclMax>, reduce16<kBf16, ncclMin>};
  if (ops[op] == MPI_OP_NULL) MPI_Op_create(fns[op], 1, &ops[op]);
  return ops[op];
}

MPI_Op mpi_op(ncclRedOp_t op, ncclDataType_t t) {
  if (t == ncclBfloat16) return op16<true>(op);
  if (t == ncclFloat16) return op16<false>(op);
  switch (op) {
    case ncclSum: return MPI_SUM;
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    case ncclAvg: break;
  }
  return MPI_OP_NULL;
}

// The checks every operation makes before it is accepted.
ncclResult_t check(ncclComm_t c, const char* call, ncclDataType_t t, size_t count, cudaStream_t stream) {
  if (!c) return fail(c, ncclInvalidArgument, std::string(call) + ": null communicator");
  if (c->state != ncclSuccess)
    return fail(c, ncclInvalidUsage, std::string(call) + ": the communicator has not finished initialising");
  if (!type_bytes(t)) return fail(c, ncclInvalidArgument, format("%s: data type %d", call, t));
  if (count > static_cast<size_t>(INT32_MAX))
    return fail(c, ncclInvalidArgument, format("%s: %zu elements: more than the emulator's MPI transfers take", call,
                                               count));
  if (!valid_stream(stream)) return fail(c, ncclInvalidArgument, std::string(call) + ": not a live stream");
  return ncclSuccess;
}

ncclResult_t check_buffer(ncclComm_t c, const char* call, const char* which, const void* p, size_t bytes) {
  const std::string bad = check_range(Space::Device, p, bytes, false);
  return bad.empty() ? ncclSuccess : fail(c, ncclInvalidArgument, format("%s: %s buffer: %s", call, which, bad.c_str()));
}

// What an operation's completion wrote: initialised, and its write for the happens-before check.
void written(void* p, size_t n) {
  mark_initialised(p, n);
  note_access(p, n, true);
}

// The uninitialised-input check and the posting of the MPI operations. Uninitialised input is reported like a
// kernel's read of it; the transfer still happens, since the peers wait for it.
void post(Op& op, std::vector<MPI_Request>& requests) {
  const std::string bad = check_range(Space::Device, op.input, op.input_bytes, true);
  if (!bad.empty())
    report(Check::Uninitialised, Where{"NCCL (emulated)", {}, {}}, reinterpret_cast<uintptr_t>(op.input),
           "the operation reads " + bad, true, cudaErrorLaunchFailure);
  op.stage.resize(op.stage_bytes);
  op.start(op.stage.data(), requests);
}

// The operations of aborted communicators with their MPI requests, kept for good: MPI may still complete them
// into their stages.
void abandon(std::shared_ptr<Op> op, std::shared_ptr<std::vector<MPI_Request>> requests) {
  static auto* abandoned = new std::vector<std::pair<std::shared_ptr<Op>, std::shared_ptr<std::vector<MPI_Request>>>>;
  if (!requests->empty()) abandoned->emplace_back(std::move(op), std::move(requests));
}

// Starts `op` now (after its stream's earlier work) and puts its completion in the stream's order; in the Latest
// stream mode both wait in the stream until something forces them, and so does an op whose stream's earlier work
// cannot finish yet (an earlier operation waiting for a peer): a GPU's enqueue returns at once whatever its stream
// holds, and the caller's wait, with its deadline, is where a stopped peer must surface, not the enqueue.
void start(Op op) {
  auto requests = std::make_shared<std::vector<MPI_Request>>();
  auto pending = std::make_shared<Op>(std::move(op));
  const bool late = stream_mode() == StreamMode::Latest || !run_until(stream_point(pending->stream), false);
  if (!late) post(*pending, *requests);
  enqueue(pending->stream, [requests, pending, posted = !late](bool block) mutable {
    const std::atomic<bool>& aborted = *pending->aborted;
    if (!posted && !aborted) {
      post(*pending, *requests);
      posted = true;
    }
    int done = 1;
    // Blocking, it still polls (as MPI_Waitall would): an abort from another thread must end the wait.
    do {
      if (aborted) {
        abandon(pending, requests);
        return true;
      }
      if (!requests->empty())
        MPI_Testall(static_cast<int>(requests->size()), requests->data(), &done, MPI_STATUSES_IGNORE);
    } while (!done && block);
    if (!done) return false;
    requests->clear();
    pending->finish(pending->stage.data());
    note_access(pending->input, pending->input_bytes, false);
    return true;
  });
  const StreamPoint now = stream_point(pending->stream);
  std::vector<StreamPoint>& last = pending->comm->last_ops;
  const auto same =
      std::find_if(last.begin(), last.end(), [&](const StreamPoint& p) { return p.stream == now.stream; });
  if (same != last.end())
    *same = now;
  else
    last.push_back(now);
}

// Runs the communicator's enqueued operations (without `block`, as far as they can go now); true once all are done.
bool flush(ncclComm_t c, bool block) {
  std::vector<StreamPoint>& last = c->last_ops;
  last.erase(std::remove_if(last.begin(), last.end(), [&](const StreamPoint& p) { return run_until(p, block); }),
             last.end());
  return last.empty();
}

ncclResult_t submit(Op op) {
  op.aborted = op.comm->aborted;
  if (group().depth > 0)
    group().ops.push_back(std::move(op));
  else
    start(std::move(op));
  return ncclSuccess;
}

// MPI operations of a communicator that goes away unfinished (an abort, a failed join) must not write into freed
// memory later.
void cancel(std::vector<MPI_Request>& requests) {
  for (MPI_Request& r : requests)
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  requests.clear();
}

}  // namespace
}  // namespace yuan::emu

using namespace yuan::emu;

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) { return comm ? comm->last_error.c_str() : ""; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* out) {
  Lock lock(mutex());
  static int serial = 0;
  Id id{};
  std::memcpy(id.magic, kIdMagic, sizeof id.magic);
  id.root_world = -1;
  if (mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &id.root_world);
  id.serial = serial++;
  std::memset(out, 0, sizeof *out);
  std::memcpy(out->internal, &id, sizeof id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId uid, int rank, ncclConfig_t* config) {
  Lock lock(mutex());
  *out = nullptr;
  Id id;
  std::memcpy(&id, uid.internal, sizeof id);
  if (std::memcmp(id.magic, kIdMagic, sizeof id.magic) != 0)
    return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: the id was not made by ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(nullptr, ncclInvalidArgument, format("ncclCommInitRank: rank %d of %d", rank, nranks));
  auto c = std::make_unique<ncclComm>();
  c->rank = rank;
  c->size = nranks;
  c->blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  c->root_world = id.root_world;
  c->tag = kJoinTagBase + id.serial % kJoinTags;
  if (nranks == 1) {
    c->state = ncclSuccess;
  } else if (mpi_running()) {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if ((rank == 0) != (world_rank == id.root_world))
      return fail(nullptr, ncclInvalidUsage,
                  "ncclCommInitRank: the emulator needs the id made by the communicator's rank 0");
    c->members.assign(nranks, -1);
    c->members[0] = id.root_world;
    if (rank == 0) {
      c->joins.resize(2 * (nranks - 1));
      c->requests.resize(nranks - 1);
      for (int i = 0; i + 1 < nranks; i++)
        MPI_Irecv(&c->joins[2 * i], 2, MPI_INT, MPI_ANY_SOURCE, c->tag, MPI_COMM_WORLD, &c->requests[i]);
    } else {
      c->mine[0] = rank;
      c->mine[1] = world_rank;
      c->requests.resize(2);
      MPI_Isend(c->mine, 2, MPI_INT, id.root_world, c->tag, MPI_COMM_WORLD, &c->requests[0]);
      MPI_Irecv(c->members.data(), nranks, MPI_INT, id.root_world, c->tag, MPI_COMM_WORLD, &c->requests[1]);
    }
  }
  *out = c.release();
  if ((*out)->blocking) {
    while ((*out)->state == ncclInProgress && mpi_running()) poll(*out);
    return (*out)->state == ncclInProgress ? ncclInvalidUsage : (*out)->state;
  }
  poll(*out);
  return (*out)->state;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  Lock lock(mutex());
  if (!comm) return ncclInvalidArgument;
  poll(comm);
  *state = comm->state;
  if (comm->finalizing && *state == ncclSuccess && !flush(comm, false)) *state = ncclInProgress;
  return ncclSuccess;
}

// As NCCL's: every operation already enqueued completes (a GPU runs them whatever the host does next), before the
// communicator's resources may go; a nonblocking communicator reports ncclInProgress until then.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  Lock lock(mutex());
  if (!comm) return ncclInvalidArgument;
  comm->finalizing = true;
  return flush(comm, comm->blocking) ? ncclSuccess : ncclInProgress;
}

// Finalizes first when the caller did not (NCCL does the same), so no enqueued operation runs on a freed
// communicator.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  Lock lock(mutex());
  if (!comm) return ncclInvalidArgument;
  if (mpi_running()) {
    flush(comm, true);
    cancel(comm->requests);
    if (comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
  }
  delete comm;
  return ncclSuccess;
}

// An aborted communicator: its join, if unfinished, is cancelled, and its operations end (see the file comment).
// The flag is set before taking the lock: a thread waiting in one of the operations holds it until it sees the flag.
// The MPI communicator is not freed, as operations abandoned on it may still be in flight.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm->aborted->store(true);
  Lock lock(mutex());
  if (mpi_running()) cancel(comm->requests);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  Lock lock(mutex());
  group().depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  Lock lock(mutex());
  Calling calling("ncclGroupEnd", __builtin_return_address(0));  // names its operations in race reports
  Group& g = group();
  if (g.depth == 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g.depth > 0) return ncclSuccess;
  for (Op& op : std::exchange(g.ops, {})) start(std::move(op));
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("ncclAllReduce", __builtin_return_address(0));  // names its operations in race reports
  const size_t bytes = count * type_bytes(t);
  if (ncclResult_t r = check(comm, "ncclAllReduce", t, count, stream)) return r;
  if (op == ncclAvg && t != ncclFloat32 && t != ncclFloat64)
    return fail(comm, ncclInvalidArgument, "ncclAllReduce: ncclAvg of integers or 16-bit floats is not modelled");
  if (ncclResult_t r = check_buffer(comm, "ncclAllReduce", "send", send, bytes)) return r;
  if (ncclResult_t r = check_buffer(comm, "ncclAllReduce", "receive", recv, bytes)) return r;
  const bool avg = op == ncclAvg;
  const int size = comm->size;
  return submit(Op{comm, stream, send, bytes, bytes,
                   [=](char* stage, std::vector<MPI_Request>& rq) {
                     std::memcpy(stage, send, bytes);
                     if (size == 1) return;
                     rq.emplace_back();
                     MPI_Iallreduce(MPI_IN_PLACE, stage, static_cast<int>(count), mpi_type(t),
                                    mpi_op(avg ? ncclSum : op, t), comm->mpi, &rq.back());
                   },
                   [=](const char* stage) {
                     std::memcpy(recv, stage, bytes);
                     if (avg && size > 1) {  // NCCL's average: the sum divided by the ranks
                       for (size_t i = 0; i < count; i++) {
                         if (t == ncclFloat32) static_cast<float*>(recv)[i] /= size;
                         if (t == ncclFloat64) static_cast<double*>(recv)[i] /= size;
                       }
                     }
                     written(recv, bytes);
                   }});
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("ncclReduce", __builtin_return_address(0));  // names its operations in race reports
  const size_t bytes = count * type_bytes(t);
  if (ncclResult_t r = check(comm, "ncclReduce", t, count, stream)) return r;
  if (root < 0 || root >= comm->size) return fail(comm, ncclInvalidArgument, format("ncclReduce: root %d", root));
  if (op == ncclAvg) return fail(comm, ncclInvalidArgument, "ncclReduce: ncclAvg is not modelled");
  if (ncclResult_t r = check_buffer(comm, "ncclReduce", "send", send, bytes)) return r;
  const bool at_root = comm->rank == root;
  if (at_root)
    if (ncclResult_t r = check_buffer(comm, "ncclReduce", "receive", recv, bytes)) return r;
  return submit(Op{comm, stream, send, bytes, bytes,
                   [=](char* stage, std::vector<MPI_Request>& rq) {
                     std::memcpy(stage, send, bytes);
                     if (comm->size == 1) return;
                     rq.emplace_back();
                     // The root reduces in place in its stage; the others' stages are only read.
                     MPI_Ireduce(at_root ? MPI_IN_PLACE : stage, at_root ? stage : nullptr, static_cast<int>(count),
                                 mpi_type(t), mpi_op(op, t), root, comm->mpi, &rq.back());
                   },
                   [=](const char* stage) {
                     if (!at_root) return;
                     std::memcpy(recv, stage, bytes);
                     written(recv, bytes);
                   }});
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("ncclReduceScatter", __builtin_return_address(0));  // names its operations in race reports
  const size_t bytes = recvcount * type_bytes(t);
  if (ncclResult_t r = check(comm, "ncclReduceScatter", t, recvcount, stream)) return r;
  if (op == ncclAvg) return fail(comm, ncclInvalidArgument, "ncclReduceScatter: ncclAvg is not modelled");
  if (ncclResult_t r = check_buffer(comm, "ncclReduceScatter", "send", send, bytes * comm->size)) return r;
  if (ncclResult_t r = check_buffer(comm, "ncclReduceScatter", "receive", recv, bytes)) return r;
  // The stage holds the send buffer, then this rank's block of the result: MPI wants them apart, and in place the
  // receive buffer is this rank's block of the send buffer.
  const size_t in_bytes = bytes * comm->size;
  return submit(Op{comm, stream, send, in_bytes, in_bytes + bytes,
                   [=](char* stage, std::vector<MPI_Request>& rq) {
                     std::memcpy(stage, send, in_bytes);
                     if (comm->size == 1) {
                       std::memcpy(stage + in_bytes, stage, bytes);
                       return;
                     }
                     rq.emplace_back();
                     MPI_Ireduce_scatter_block(stage, stage + in_bytes, static_cast<int>(recvcount), mpi_type(t),
                                               mpi_op(op, t), comm->mpi, &rq.back());
                   },
                   [=](const char* stage) {
                     std::memcpy(recv, stage + in_bytes, bytes);
                     written(recv, bytes);
                   }});
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("ncclAllGather", __builtin_return_address(0));  // names its operations in race reports
  const size_t bytes = sendcount * type_bytes(t);
  if (ncclResult_t r = check(comm, "ncclAllGather", t, sendcount, stream)) return r;
  if (ncclResult_t r = check_buffer(comm, "ncclAllGather", "send", send, bytes)) return r;
  if (ncclResult_t r = check_buffer(comm, "ncclAllGather", "receive", recv, bytes * comm->size)) return r;
  const int rank = comm->rank, size = comm->size;
  return submit(Op{comm, stream, send, bytes, bytes * size,
                   [=](char* stage, std::vector<MPI_Request>& rq) {
                     std::memcpy(stage + rank * bytes, send, bytes);
                     if (size == 1) return;
                     rq.emplace_back();
                     MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, stage, static_cast<int>(sendcount),
                                    mpi_type(t), comm->mpi, &rq.back());
                   },
                   [=](const char* stage) {
                     std::memcpy(recv, stage, bytes * size);
                     written(recv, bytes * size);
                   }});
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("ncclBroadcast", __builtin_return_address(0));  // names its operations in race reports
  const size_t bytes = count * type_bytes(t);
  if (ncclResult_t r = check(comm, "ncclBroadcast", t, count, stream)) return r;
  if (root < 0 || root >= comm->size) return fail(comm, ncclInvalidArgument, format("ncclBroadcast: root %d", root));
  const bool at_root = comm->rank == root;
  if (at_root)
    if (ncclResult_t r = check_buffer(comm, "ncclBroadcast", "send", send, bytes)) return r;
  if (ncclResult_t r = check_buffer(comm, "ncclBroadcast", "receive", recv, bytes)) return r;
  return submit(Op{comm, stream, at_root ? send : nullptr, at_root ? bytes : 0, bytes,
                   [=](char* stage, std::vector<MPI_Request>& rq) {
                     if (at_root) std::memcpy(stage, send, bytes);
                     if (comm->size == 1) return;
                     rq.emplace_back();
                     MPI_Ibcast(stage, static_cast<int>(count), mpi_type(t), root, comm->mpi, &rq.back());
                   },
                   [=](const char* stage) {
                     std::memcpy(recv, stage, bytes);
                     written(recv, bytes);
                   }});
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("ncclSend", __builtin_return_address(0));  // names its operations in race reports
  const size_t bytes = count * type_bytes(t);
  if (ncclResult_t r = check(comm, "ncclSend", t, count, stream)) return r;
  if (peer < 0 || peer >= comm->size || peer == comm->rank)
    return fail(comm, ncclInvalidArgument, format("ncclSend: peer %d of %d", peer, comm->size));
  if (ncclResult_t r = check_buffer(comm, "ncclSend", "send", send, bytes)) return r;
  return submit(Op{comm, stream, send, bytes, bytes,
                   [=](char* stage, std::vector<MPI_Request>& rq) {
                     std::memcpy(stage, send, bytes);
                     rq.emplace_back();
                     MPI_Isend(stage, static_cast<int>(count), mpi_type(t), peer, kP2pTag, comm->mpi, &rq.back());
                   },
                   [](const char*) {}});
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("ncclRecv", __builtin_return_address(0));  // names its operations in race reports
  const size_t bytes = count * type_bytes(t);
  if (ncclResult_t r = check(comm, "ncclRecv", t, count, stream)) return r;
  if (peer < 0 || peer >= comm->size || peer == comm->rank)
    return fail(comm, ncclInvalidArgument, format("ncclRecv: peer %d of %d", peer, comm->size));
  if (ncclResult_t r = check_buffer(comm, "ncclRecv", "receive", recv, bytes)) return r;
  return submit(Op{comm, stream, nullptr, 0, bytes,
                   [=](char* stage, std::vector<MPI_Request>& rq) {
                     rq.emplace_back();
                     MPI_Irecv(stage, static_cast<int>(count), mpi_type(t), peer, kP2pTag, comm->mpi, &rq.back());
                   },
                   [=](const char* stage) {
                     std::memcpy(recv, stage, bytes);
                     written(recv, bytes);
                   }});
}
