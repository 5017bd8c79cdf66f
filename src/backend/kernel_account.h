// The per-kernel account of a device's work over steps A..B of a training (profile.kernels=A:B): every kernel,
// library GEMM, copy and collective timed by the device, grouped by operation (name, phase, shape), and each
// operation held against the device's roofline (its FLOPs and ideal bytes, src/ops/op_cost.h):
//   achieved TFLOP/s = flops / time,  GB/s = ideal_bytes / time,
//   time_ideal = max(flops / peak_flops, ideal_bytes / peak_bytes_per_s),  roofline_fraction = time_ideal / time,
//   bound = "compute" or "memory" by which term is larger.
// Collectives and host copies move their bytes over a link, not HBM: their roofline is the link's rate where the
// device is known (bound "link"), none otherwise (a null fraction).
//
// The CUDA backend implements the account (cuda/kernel_account.cu); this header is the report it gives, rendered
// once here as the table rank 0 prints and as kernels.json.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace yuan {

// One kernel (or library call: "cublasLt gemm", "memcpy HtoD", "nccl AllReduce") of an operation, over the steps.
struct KernelTime {
  std::string name;
  int64_t launches = 0;
  double time_s = 0;
  // What the emulator counted of the launches' memory traffic (cuda/emu, Traffic), summed over them; `occupancy`
  // and `registers` negative where the emulator does not know the kernel. Absent on a GPU.
  uint64_t read_bytes = 0, written_bytes = 0, requests = 0, sectors = 0, used_bytes = 0, shared_requests = 0,
           bank_conflicts = 0;
  double occupancy = -1;
  int registers = -1;
  std::vector<std::string> findings;
};

// Bytes used over bytes in the 32-byte sectors fetched, of counts summed over launches (as the emulator's Traffic
// gives it for one): 1.0 with no sectors.
double sector_efficiency(const KernelTime& k);

// Which rate an operation's bytes are held to.
enum class Roof { Device, Link, Host };  // HBM and tensor peak; the link between devices (NCCL); host <-> device

struct AccountedOp {
  std::string name, family, phase, shape;
  std::string exempt;  // why the op cannot move only its ideal bytes, as its kernel's file states; empty: none
  Roof roof = Roof::Device;
  int64_t calls = 0, launches = 0;
  double time_s = 0, flops = 0, ideal_bytes = 0;
  std::vector<KernelTime> kernels;
};

// The emulator's traffic of an operation's kernels, summed into one KernelTime (name, launches and times left
// empty; occupancy and registers are per kernel and stay unset).
KernelTime op_traffic(const AccountedOp& op);

struct AccountPeak {
  double flops = 0, bytes_per_s = 0;  // the device's dense bf16 tensor peak and its memory bandwidth
  std::string source;
  double link_bytes_per_s = 0, host_bytes_per_s = 0;  // 0: not known
  std::string link_source;
};

struct KernelReport {
  std::string device;
  bool emulated = false;  // times are the emulator's host clock: meaningless
  int first = 0, last = 0;
  double step_s = 0, busy_s = 0;  // the profiled steps' time on the compute stream, and the union of the work in it
  int64_t untimed = 0;            // launches beyond the event pool (it grows after the step that ran short)
  AccountPeak peak;
  std::vector<AccountedOp> ops;  // by time, longest first
};

struct Roofline {
  double tflops = 0, gbps = 0;
  std::optional<double> fraction;  // none: no rate known for the op's roof
  const char* bound = "memory";    // "compute", "memory" or "link"
};
Roofline roofline(const AccountedOp& op, const AccountPeak& peak);

// The table (one line per operation, by time; then the unaccounted share and the totals) and kernels.json.
std::string kernel_table(const KernelReport& r);
std::string kernel_json(const KernelReport& r);

// A device's account while a training runs. begin_step before a profiled step's work, end_step after it: the
// step's events are read then (the step's work waited for), and the step is added to the report.
class KernelAccount {
 public:
  virtual ~KernelAccount() = default;
  virtual void begin_step() = 0;
  virtual void end_step() = 0;
  virtual KernelReport report() const = 0;
};

}  // namespace yuan
