// A rank that dies of a fatal signal says who it was. Without this a job's log shows only the launcher's line
// ("srun: error: node2: task 3: Segmentation fault"), and Open MPI's own report, where it is in place, names the
// host and pid but not where the process was. The report is one line naming the rank, its node, the pid and the
// signal (with the faulting address, or who sent it), then the backtrace, one frame a line
// ("bin/yuanlm(+0x1f2a3)[0x...]": `addr2line -f -C -e bin/yuanlm 0x1f2a3` names the function), written to stderr
// with async-signal-safe calls only. Then the signal's default action runs, so that the process still ends as the
// signal ends it (exit status 139 for SIGSEGV in a shell; jobs/train.sbatch reads it).
//
// Open MPI and the report: MPI_Init puts Open MPI's handler (the opal_signal MCA parameter, "6,7,8,11" by default:
// SIGABRT, SIGBUS, SIGFPE, SIGSEGV) only on signals that still have the default action then ("Open MPI will *not*
// replace signals if handlers are already installed by the time MPI_INIT is invoked", ompi_info --all). The report,
// installed at the start of main, is therefore the only handler, before MPI_Init and after it. Should a library
// replace it all the same while MPI starts, set_crash_identity() puts it back and calls the replacing handler
// after the report (as it does any handler that was in place when the report was installed). The CUDA emulator's
// SIGSEGV handler (cuda/emu/kernel.cpp), installed at its first launch, writes its kernel thread's line and then
// calls the report.
#pragma once
#include <csignal>
#include <cstddef>

namespace yuan {

// Installs the report on SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT (once; later calls do nothing), with an
// alternate signal stack for the calling thread, so that the main thread's stack overflow is reported too (another
// thread's ends the process with SIGSEGV and no report). Call it at the start of main, before any thread and
// before MPI_Init. Until set_crash_identity, the line names the rank the launcher's environment gives
// (OMPI_COMM_WORLD_RANK, PMIX_RANK, SLURM_PROCID; "?" without one) and gethostname's host.
void install_crash_report();

// The rank and node the report's line names from now on (comm::init, once MPI knows them); also takes back
// any of the signals whose handler was replaced since install_crash_report. Not async-signal-safe; any thread.
void set_crash_identity(int rank, const char* node);

// The report's first line, with its newline, into `out` (at most `size` bytes, always terminated); returns its
// length. `who` names the process ("rank 3 on node2 (pid 1234)"), `self` is this process's pid (a signal this
// process sent itself, as abort() does, is said so). Async-signal-safe: no allocation, no locale, no stdio.
size_t format_crash_line(char* out, size_t size, const char* who, int sig, const siginfo_t& info, int self);

// `who` for the line: "rank R on NODE (pid P)", R "?" when negative. Async-signal-safe, as format_crash_line.
size_t format_crash_who(char* out, size_t size, int rank, const char* node, int pid);

}  // namespace yuan
