# yuanlm build. `make` builds bin/yuanlm and the test binaries; `make run` the demo (`make run-bpe`: the same with a
# GPT-2-style byte-level BPE); `make test` the tests; `make bench` the CPU benchmarks. CUDA=auto builds the CUDA
# backend when nvcc is found, CUDA=0 skips it.
# Library locations come from pkg-config, or from MPI_HOME / HDF5_HOME / CUDA_HOME / NCCL_HOME / OPENBLAS_HOME /
# BOOST_HOME / SPM_HOME / PCRE2_HOME / OPENSSL_HOME / JSON_HOME on machines with modules instead of Debian packages.

CUDA      ?= auto
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= sm_90
ARCH      ?= -march=native
JOBS      ?= $(shell nproc)

ifeq ($(CUDA),auto)
  CUDA := $(if $(wildcard $(NVCC)),1,0)
endif

CXX      ?= g++
CXXFLAGS ?= -O3 $(ARCH)
# -fno-math-errno lets sqrt vectorise (the AdamW kernel); nothing here reads errno after a math call.
CXXFLAGS += -std=c++17 -fopenmp -fno-math-errno -Wall -Wextra -Isrc -MMD -MP
LDFLAGS  += -fopenmp

pc = $(shell pkg-config $(1) $(2) 2>/dev/null)
# libdir DIR: link and run-time search flags for a library installed outside the default paths.
libdir = $(if $(1),-L$(1)/lib -Xlinker -rpath -Xlinker $(1)/lib)
ifdef MPI_HOME
  MPI_INC := -I$(MPI_HOME)/include
  MPI_LIB := $(call libdir,$(MPI_HOME)) -lmpi
else
  MPI_INC = $(call pc,--cflags,ompi)
  MPI_LIB = $(call pc,--libs,ompi)
endif
ifdef HDF5_HOME
  HDF5_INC := -I$(HDF5_HOME)/include
  HDF5_LIB := $(call libdir,$(HDF5_HOME)) -lhdf5
else
  HDF5_INC = $(call pc,--cflags,hdf5-serial)
  HDF5_LIB = $(call pc,--libs,hdf5-serial)
endif
BOOST_INC := $(if $(BOOST_HOME),-I$(BOOST_HOME)/include)
BOOST_LIB := $(call libdir,$(BOOST_HOME)) -lboost_program_options
SPM_INC   := $(if $(SPM_HOME),-I$(SPM_HOME)/include)
SPM_LIB   := $(call libdir,$(SPM_HOME)) -lsentencepiece -lsentencepiece_train
# OpenBLAS is dlopen()ed at run time (src/ops/matmul.cpp); only its header and its run-time path are needed.
BLAS_INC  := $(if $(OPENBLAS_HOME),-I$(OPENBLAS_HOME)/include)
BLAS_LIB  := $(call libdir,$(OPENBLAS_HOME)) -ldl
# libcrypto (checksums) is part of the core; nlohmann-json is header-only.
ifdef OPENSSL_HOME
  CRYPTO_INC := -I$(OPENSSL_HOME)/include
  CRYPTO_LIB := $(call libdir,$(OPENSSL_HOME)) -lcrypto
else
  CRYPTO_INC = $(call pc,--cflags,libcrypto)
  CRYPTO_LIB = $(or $(call pc,--libs,libcrypto),-lcrypto)
endif
JSON_INC  := $(if $(JSON_HOME),-I$(JSON_HOME)/include)
# PCRE2 (UTF, Unicode properties, JIT): the pre-tokenizer patterns of byte-level BPE tokenizers (src/prep/bpe.cpp).
ifdef PCRE2_HOME
  PCRE2_INC := -I$(PCRE2_HOME)/include
  PCRE2_LIB := $(call libdir,$(PCRE2_HOME)) -lpcre2-8
else
  PCRE2_INC = $(call pc,--cflags,libpcre2-8)
  PCRE2_LIB = $(or $(call pc,--libs,libpcre2-8),-lpcre2-8)
endif

CPPFLAGS += -DOMPI_SKIP_MPICXX $(MPI_INC) $(HDF5_INC) $(BOOST_INC) $(SPM_INC) $(BLAS_INC) $(CRYPTO_INC) $(JSON_INC)
HOST_LIBS = $(MPI_LIB) $(HDF5_LIB) $(BOOST_LIB) $(SPM_LIB) $(PCRE2_LIB) $(BLAS_LIB) $(CRYPTO_LIB) -lpthread
LIBS      = $(HOST_LIBS)

# core: the model program, the backend registry with the CPU backend, the ZeRO-Offload optimizer and its one-rank
# communicator, with no MPI/HDF5/Boost, so GPU machines can link kernel tests and single-GPU benchmarks.
CORE_SRC := $(wildcard src/util/*.cpp src/model/*.cpp src/program/*.cpp src/ops/*.cpp src/backend/*.cpp \
                      src/optim/*.cpp) src/comm/communicator.cpp src/comm/comm_thread.cpp
APP_SRC  := $(filter-out src/main.cpp $(CORE_SRC),$(wildcard src/*/*.cpp))
TEST_SRC := $(wildcard tests/*.cpp)
BENCH_SRC:= $(wildcard tools/bench/*.cpp)

CORE_OBJ := $(CORE_SRC:%.cpp=build/%.o)
APP_OBJ  := $(APP_SRC:%.cpp=build/%.o)
TEST_OBJ := $(TEST_SRC:%.cpp=build/%.o)
BENCH_BIN:= $(BENCH_SRC:tools/bench/%.cpp=bin/%)

BACKENDS := cpu
ifeq ($(CUDA)$(if $(wildcard cuda/*.cu),+),1+)
  BACKENDS += cuda
  CU_SRC    := $(wildcard cuda/*.cu)
  CU_HOST   := $(wildcard cuda/*.cpp)
  CU_OBJ    := $(CU_SRC:%.cu=build/%.o) $(CU_HOST:%.cpp=build/%.o)
  CU_TEST   := $(wildcard tests/cuda/*.cu) $(wildcard tests/cuda/*.cpp)
  NVCCFLAGS ?= -O3 -arch=$(CUDA_ARCH) -std=c++17 -Xcompiler -fopenmp,-Wall,-Wextra -Isrc -Icuda -MMD -MP
  CPPFLAGS  += -DYUAN_CUDA -I$(CUDA_HOME)/include $(if $(NCCL_HOME),-I$(NCCL_HOME)/include)
  CUDA_LIB  := -L$(CUDA_HOME)/lib64 $(if $(NCCL_HOME),-L$(NCCL_HOME)/lib) -lcudart -lcublasLt -lcublas -lnccl
  LIBS      += $(CUDA_LIB)
endif

# Objects depend on the flags they were built with: switching CUDA=0/1 or ARCH rebuilds instead of mixing.
FLAGS_STAMP := build/.flags
FLAGS_NOW   := $(CXX) $(CPPFLAGS) $(CXXFLAGS) | $(BACKENDS) | $(NVCC) $(NVCCFLAGS)
$(shell mkdir -p build; [ "$$(cat $(FLAGS_STAMP) 2>/dev/null)" = '$(FLAGS_NOW)' ] || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP))

# cuDNN attention (cuda/cudnn_attention.cpp, model.attention): the cuDNN frontend's headers (env/fetch-cudnn-frontend.sh
# puts them in build/cudnn-frontend) and cuDNN 9's own headers. The GPU build loads libcudnn.so.9 at run time
# (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING), so the same binary starts, with own attention, where cuDNN is missing;
# the emulator's build links the frontend to the emulated cuDNN of cuda/emu/cudnn.cpp instead. Without either set of
# headers the build has no cuDNN path and says so at start-up.
CUDNN_HOME          ?= $(CUDA_HOME)
CUDNN_FRONTEND_HOME ?= build/cudnn-frontend
HAVE_CUDNN := $(and $(wildcard $(CUDNN_FRONTEND_HOME)/include/cudnn_frontend.h),$(wildcard $(CUDNN_HOME)/include/cudnn_graph.h))
# The frontend's headers are system headers: their own warnings are not this project's.
CUDNN_INC  := $(if $(HAVE_CUDNN),-isystem $(CUDNN_FRONTEND_HOME)/include)
ifneq ($(CU_OBJ),)
  CPPFLAGS += $(if $(HAVE_CUDNN),-DYUAN_CUDNN -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING \
                $(if $(filter-out $(CUDA_HOME),$(CUDNN_HOME)),-I$(CUDNN_HOME)/include))
endif

# Keep every object (make would delete the benchmarks' as intermediates and relink them each time).
.SECONDARY:

.PHONY: all emu deps test bench bench-gpu run run-bpe clean
all: bin/yuanlm bin/test_yuanlm $(BENCH_BIN) $(if $(CU_OBJ),bin/test_cuda)
	@echo "built backends: $(BACKENDS)"

bin/yuanlm: build/src/main.o $(APP_OBJ) $(CORE_OBJ) $(CU_OBJ)
	@mkdir -p $(@D)
	$(CXX) $(LDFLAGS) -o $@ $^ $(LIBS)

bin/test_yuanlm: $(TEST_OBJ) $(APP_OBJ) $(CORE_OBJ) $(CU_OBJ)
	@mkdir -p $(@D)
	$(CXX) $(LDFLAGS) -o $@ $^ $(LIBS) -lgtest

bin/%: build/tools/bench/%.o $(APP_OBJ) $(CORE_OBJ) $(CU_OBJ)
	@mkdir -p $(@D)
	$(CXX) $(LDFLAGS) -o $@ $^ $(LIBS)

# GPU benchmarks and CUDA kernel tests: CUDA runtime + core only (no MPI, HDF5, Boost), so they build on bare GPU machines.
bin/test_cuda: $(patsubst %.cpp,build/%.o,$(CU_TEST:%.cu=build/%.o)) $(CU_OBJ) $(CORE_OBJ)
	@mkdir -p $(@D)
	$(CXX) $(LDFLAGS) -o $@ $^ $(BLAS_LIB) $(CRYPTO_LIB) $(CUDA_LIB) -lgtest -lgtest_main -lpthread

bin/bench_gpu_%: build/tools/bench/bench_gpu_%.o $(CU_OBJ) $(CORE_OBJ)
	@mkdir -p $(@D)
	$(CXX) $(LDFLAGS) -o $@ $^ $(BLAS_LIB) $(CRYPTO_LIB) $(CUDA_LIB) -lpthread

build/%.o: %.cpp $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -DYUAN_BACKENDS='"$(BACKENDS)"' $(CXXFLAGS) -c -o $@ $<
# Only src/prep/bpe.cpp includes PCRE2's header.
build/src/prep/bpe.o: CPPFLAGS += $(PCRE2_INC)

# The CUDA backend's host-only files and tests (cuda/*.cpp, tests/cuda/*.cpp: the ones over the cuDNN frontend's
# headers, which nvcc's front end takes minutes to get through) by the host compiler; -O1 is all graph-building code
# needs.
build/cuda/%.o: cuda/%.cpp $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) $(CUDNN_INC) -Icuda $(CXXFLAGS) -O1 -c -o $@ $<
build/tests/cuda/%.o: tests/cuda/%.cpp $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) $(CUDNN_INC) -Icuda $(CXXFLAGS) -O1 -c -o $@ $<

build/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(NVCC) $(filter -I% -D%,$(CPPFLAGS)) $(CUDNN_INC) $(NVCCFLAGS) -c -o $@ $<

# The CUDA emulator (cuda/emu, docs/EMULATOR.md): the same .cu files built by g++ against the headers of
# cuda/emu/include and run on the CPU, every access checked; no nvcc needed. bin/test_cuda_emu is the GPU test suite
# on it, bin/yuanlm_emu the program whose cuda device it is. Its objects live in build/emu. -fsanitize=thread only
# instruments here: each load and store calls a hook that cuda/emu/checks.cpp defines (no ThreadSanitizer runtime).
# -fsanitize=alignment checks every typed access against its type's alignment (a 16-byte pack read at a 2-byte
# address), before the optimiser splits it into element accesses; checks.cpp defines its hook too. __shared__
# variables get a section each (-fdata-sections), which cuda/emu/gather_shared.sh moves into yuan_emu_shared.
# nvcc's #pragma unroll means nothing to g++; the toolkit's include directory stays out of the way of cuda/emu's.
EMU_FLAGS    := -std=c++17 -O2 -fopenmp -Wall -Wextra -MMD -MP -DYUAN_EMU -DYUAN_CUDA -Isrc -Icuda -Icuda/emu/include
# cuDNN's headers come from the toolkit one by one (links in build/emu/cudnn-include), so that what they include
# from CUDA resolves to cuda/emu/include.
ifneq ($(HAVE_CUDNN),)
  EMU_FLAGS  += -DYUAN_CUDNN $(CUDNN_INC) -Ibuild/emu/cudnn-include
  $(shell mkdir -p build/emu/cudnn-include && ln -sf $(abspath $(wildcard $(CUDNN_HOME)/include/cudnn*.h)) build/emu/cudnn-include/)
endif
EMU_CUFLAGS  := -x c++ -Wno-unknown-pragmas -fsanitize=thread --param=tsan-instrument-func-entry-exit=0 \
                -fsanitize=alignment -fdata-sections
EMU_RT_OBJ   := $(patsubst %.cpp,build/emu/%.o,$(wildcard cuda/emu/*.cpp))
EMU_CU_OBJ   := $(patsubst %.cu,build/emu/%.o,$(wildcard cuda/*.cu)) $(patsubst %.cpp,build/emu/%.o,$(wildcard cuda/*.cpp))
EMU_TEST_OBJ := $(patsubst %.cu,build/emu/%.o,$(wildcard tests/cuda/*.cu)) \
                $(patsubst %.cpp,build/emu/%.o,$(wildcard tests/cuda/*.cpp))
# Host files that list the backends are built again with the CUDA backend in; the others are shared with build/.
EMU_HOST_SRC := $(shell grep -l 'YUAN_CUDA\|YUAN_BACKENDS' src/main.cpp src/*/*.cpp)
emu_objs      = $(foreach o,$(1),$(if $(filter $(o:build/%.o=%.cpp),$(EMU_HOST_SRC)),build/emu/$(o:build/%=%),$(o)))
EMU_LIBS     := -lboost_context -lpthread
EMU_STAMP    := build/emu/.flags
$(shell mkdir -p build/emu; [ "$$(cat $(EMU_STAMP) 2>/dev/null)" = '$(CXX) $(EMU_FLAGS) $(EMU_CUFLAGS)' ] || echo '$(CXX) $(EMU_FLAGS) $(EMU_CUFLAGS)' > $(EMU_STAMP))

# What ptxas makes of each kernel file for CUDA_ARCH: registers, static shared memory, spills and __launch_bounds__
# per kernel, in build/emu/ptxas.txt (cuda/emu/ptxas_table.sh), against which the emulator checks every launch of
# the kernel and computes its occupancy (docs/EMULATOR.md, "The device it stands for"), and in which
# tests/cuda/test_codegen.sh checks for spills. Any nvcc will do: the toolkit's, or the one test_codegen.sh installs
# from NVIDIA's wheels (tests/run_tests.sh runs it before the emulator's tests, so that a fresh clone has the table);
# with neither there is no table, and the compiled limits go unchecked. Compiling only to a cubin costs about 18 s
# of one core for every kernel file.
# __launch_bounds__'s maximum threads is not in ptxas's report but in the cubin's attributes (EIATTR_MAX_THREADS),
# which cuobjdump -elf lists: the table needs both tools, and the emulator checks every launch against it.
PTXAS_NVCC   ?= $(firstword $(wildcard $(NVCC) build/cuda-tools/nvidia/cu13/bin/nvcc))
PTXAS_CUOBJDUMP ?= $(firstword $(wildcard $(dir $(PTXAS_NVCC))cuobjdump build/cuda-tools/nvidia/cu13/bin/cuobjdump))
KERNEL_CU    := $(shell grep -l __global__ cuda/*.cu)
PTXAS_TABLE  := $(if $(and $(PTXAS_NVCC),$(PTXAS_CUOBJDUMP)),build/emu/ptxas.txt)

emu: bin/test_cuda_emu bin/yuanlm_emu $(PTXAS_TABLE)

build/emu/ptxas.txt: $(KERNEL_CU:cuda/%.cu=build/codegen/%.elf) cuda/emu/ptxas_table.sh
	cuda/emu/ptxas_table.sh $(KERNEL_CU:cuda/%.cu=build/codegen/%.elf) $(KERNEL_CU:cuda/%.cu=build/codegen/%.ptxas) > $@

build/codegen/%.elf: build/codegen/%.cubin
	$(PTXAS_CUOBJDUMP) -elf $< > $@

# ptxas -v reports on stderr, where nvcc's warnings go too: both are shown when the compile fails.
build/codegen/%.cubin: cuda/%.cu
	@mkdir -p $(@D)
	$(PTXAS_NVCC) -arch=$(CUDA_ARCH) -cubin -std=c++17 -Xptxas -v -Isrc -Icuda -MMD -MP -MF $(@:.cubin=.d) -o $@ $< \
	  2> $(@:.cubin=.ptxas) || { cat $(@:.cubin=.ptxas); exit 1; }

# The emulator's own objects link first: of an inline function or template instance that several objects define
# (a std::string operator+), the linker keeps the first, and the emulator's code must not run a copy from a .cu
# file, instrumented, whose accesses would be checked as the running kernel's (a report that formats its message
# with such a copy checks that again, without end).
bin/test_cuda_emu: $(EMU_RT_OBJ) $(EMU_TEST_OBJ) $(EMU_CU_OBJ) $(call emu_objs,$(CORE_OBJ))
	@mkdir -p $(@D)
	$(CXX) $(LDFLAGS) -o $@ $^ $(BLAS_LIB) $(CRYPTO_LIB) $(MPI_LIB) -lgtest_main -lgtest $(EMU_LIBS)

bin/yuanlm_emu: $(EMU_RT_OBJ) build/emu/src/main.o $(call emu_objs,$(APP_OBJ) $(CORE_OBJ)) $(EMU_CU_OBJ)
	@mkdir -p $(@D)
	$(CXX) $(LDFLAGS) -o $@ $^ $(HOST_LIBS) $(EMU_LIBS)

build/emu/%.o: %.cu $(EMU_STAMP) cuda/emu/gather_shared.sh
	@mkdir -p $(@D)
	$(CXX) $(EMU_FLAGS) $(EMU_CUFLAGS) $(filter-out -I$(CUDA_HOME)/include -I$(CUDNN_HOME)/include -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING,$(filter -I% -D%,$(CPPFLAGS))) -c -o $@ $<
	cuda/emu/gather_shared.sh $@

# Host-only files of the backend and its tests: no device code to instrument.
build/emu/cuda/%.o: cuda/%.cpp $(EMU_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(EMU_FLAGS) -O1 -c -o $@ $<
build/emu/tests/cuda/%.o: tests/cuda/%.cpp $(EMU_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(EMU_FLAGS) -O1 -c -o $@ $<

build/emu/cuda/emu/%.o: cuda/emu/%.cpp $(EMU_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(EMU_FLAGS) -DOMPI_SKIP_MPICXX $(MPI_INC) -c -o $@ $<

# Where the emulator finds the ptxas table when YUAN_EMU_PTXAS does not say.
build/emu/cuda/emu/target.o: EMU_FLAGS += -DYUAN_EMU_PTXAS_TABLE='"$(CURDIR)/build/emu/ptxas.txt"'

build/emu/src/%.o: src/%.cpp $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -DYUAN_CUDA -DYUAN_BACKENDS='"cpu cuda (emulated)"' $(CXXFLAGS) -c -o $@ $<

deps:
	env/install-deps.sh
	env/fetch-cudnn-frontend.sh

test: deps
	$(MAKE) -j$(JOBS) all emu
	tests/run_tests.sh

bench: deps
	$(MAKE) -j$(JOBS) all
	tools/bench/run_bench.sh

# On a GPU machine: kernel throughput, MFU and the PyTorch ratio (tools/bench/run_bench_gpu.sh).
bench-gpu:
	$(MAKE) -j$(JOBS) bin/test_cuda $(filter bin/bench_gpu%,$(BENCH_BIN))
	tools/bench/run_bench_gpu.sh

run: deps
	$(MAKE) -j$(JOBS) bin/yuanlm
	tools/demo.sh

# The demo with a GPT-2-style byte-level BPE tokenizer (tools/demo_bpe.sh).
run-bpe: deps
	$(MAKE) -j$(JOBS) bin/yuanlm
	tools/demo_bpe.sh

clean:
	rm -rf build bin

-include $(shell find build -name '*.d' 2>/dev/null)
