// yuanlm: one binary, one subcommand per job step. Every rank runs the same command line.
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "comm/watchdog.h"
#include "comm/world.h"
#include "prep/prep.h"
#include "run/commands.h"
#include "train/train.h"
#include "util/crash_report.h"
#include "util/error.h"
#include "util/threads.h"

#ifndef YUAN_VERSION
#define YUAN_VERSION "0.1.0"
#endif

namespace {

struct Command {
  const char* name;
  const char* help;
  int (*run)(const std::vector<std::string>&);
  bool stops;  // acts on SIGTERM/SIGUSR1 itself (checkpoint or stop, exit 75); the others keep the default action
};

const Command kCommands[] = {
    {"train", "train a GPT from a config deck (under mpirun/srun for data parallelism)", yuan::train_main, true},
    {"prep", "tokenize text into sharded HDF5 corpus files", yuan::prep_main, false},
    {"eval", "validation loss of a checkpoint (under mpirun or alone)", yuan::eval_main, true},
    {"sample", "generate text from a prompt with a checkpoint", yuan::sample_main, false},
    {"export", "write a checkpoint as a HuggingFace GPT-2 directory (safetensors + config.json)", yuan::export_main,
     false},
    {"plan", "a deck's modules, or its parallel layout with the memory of every rank, without running it",
     yuan::plan_main, false},
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "yuanlm %s: GPT pretraining for MPI clusters (backends: %s)\n\n"
               "usage: [mpirun -np N] yuanlm <command> [options]     yuanlm <command> --help\n\ncommands:\n",
               YUAN_VERSION, YUAN_BACKENDS);
  for (const Command& c : kCommands) std::fprintf(f, "  %-8s %s\n", c.name, c.help);
  std::fprintf(f, "\n  --version  print the version and the compiled-in backends\n");
}

}  // namespace

int main(int argc, char** argv) {
  // First, before MPI_Init and any thread: a rank that dies of SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT names
  // itself, its node and the signal with a backtrace, whenever it dies (util/crash_report.h; Open MPI then leaves
  // those signals to it).
  yuan::install_crash_report();
  // The environment OpenBLAS reads, set while this is the only thread: setenv with MPI's threads running could
  // crash them (util/threads.h).
  yuan::prepare_blas_environment();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(stdout);
    return argc < 2 ? 1 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("yuanlm %s (backends: %s)\n", YUAN_VERSION, YUAN_BACKENDS);
    return 0;
  }
  const Command* cmd = nullptr;
  for (const Command& c : kCommands)
    if (argv[1] == std::string(c.name)) cmd = &c;
  if (!cmd) {
    std::fprintf(stderr, "error: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 1;
  }
  // Before MPI and any work: a stop signal that arrives while MPI starts or a checkpoint loads is acted on at the
  // command's first check instead of killing the rank.
  if (cmd->stops) yuan::comm::install_stop_handlers();
  yuan::comm::init(&argc, &argv);
  int rc;
  try {
    yuan::comm::watch_waits(yuan::comm::kDefaultTimeoutSeconds);
    yuan::comm::check_same_command(cmd->name);
    yuan::configure_threads(yuan::comm::world().local_size);
    rc = cmd->run(std::vector<std::string>(argv + 2, argv + argc));
  } catch (const yuan::Error& e) {
    return yuan::comm::fail(e);
  } catch (const std::bad_alloc&) {
    // Where an allocation's size and purpose are known it says so (util/memory.h); elsewhere this is all there is.
    return yuan::comm::fail(yuan::Error("out of host memory (an allocation failed); `yuanlm plan` gives what a "
                                            "deck needs"));
  } catch (const std::exception& e) {
    return yuan::comm::fail(yuan::Error(e.what()));
  }
  yuan::comm::finalize();
  return rc;
}
