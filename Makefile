# train_fox: `make train` trains (GPU if present, else the CPU twin on a tiny model),
# `make test` runs the tests. Both prepare what they need first (see README.md).

CC ?= gcc
CXX ?= g++
# -fassociative-math lets the compiler vectorise the fp32 sums; NaN and inf keep their meaning
CFLAGS ?= -O3 -march=native -fno-math-errno -fassociative-math -fno-signed-zeros -fno-trapping-math
WARN = -Wall -Wextra
LDLIBS = -lm

# OpenMP on by default; NO_OMP=1 turns it off
ifeq ($(NO_OMP),1)
  OMP_FLAGS =
else
  OMP_FLAGS = -fopenmp
endif

# nvcc from PATH or the default CUDA location; the GPU file is built for Hopper (sm_90a)
ifeq ($(origin NVCC),undefined)
  NVCC := $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
endif
GPU_ARCH ?= -gencode=arch=compute_90a,code=sm_90a
# --default-stream per-thread: the trainer's work goes to the default stream of its thread, which
# (unlike the legacy default stream) a CUDA graph can capture (gpu_train_micro_step)
NVCC_FLAGS = -O3 -std=c++17 $(GPU_ARCH) -Xcompiler "$(CFLAGS) $(OMP_FLAGS) -Wno-unused-function"
NVCC_FLAGS += --default-stream per-thread
NVCC_LIBS = -lcublasLt -lcublas -lm
# NCCL (multi-GPU): NCCL_HOME=<dir>, else the CUDA toolkit's or the system's, else the pip
# wheel nvidia-nccl (PyTorch's); with none, train_fox builds for one GPU (-DNO_NCCL)
NCCL_SYSTEM_H := $(firstword $(wildcard $(dir $(NVCC))../include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h))
ifneq ($(NCCL_HOME),)
  NVCC_FLAGS += -I$(NCCL_HOME)/include
  NVCC_LIBS += -L$(NCCL_HOME)/lib -Xlinker -rpath=$(NCCL_HOME)/lib -lnccl
else ifneq ($(NCCL_SYSTEM_H),)
  NVCC_LIBS += -lnccl
else
  NCCL_WHEEL := $(shell python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null)
  NCCL_WHEEL_LIB := $(notdir $(firstword $(wildcard $(NCCL_WHEEL)/lib/libnccl.so $(NCCL_WHEEL)/lib/libnccl.so.2)))
  ifneq ($(and $(wildcard $(NCCL_WHEEL)/include/nccl.h),$(NCCL_WHEEL_LIB)),)
    NVCC_FLAGS += -I$(NCCL_WHEEL)/include
    NVCC_LIBS += -L$(NCCL_WHEEL)/lib -l:$(NCCL_WHEEL_LIB) -Xlinker -rpath=$(NCCL_WHEEL)/lib
  else
    NVCC_FLAGS += -DNO_NCCL
  endif
endif
# USE_MPI=1 adds launching through mpirun (the NCCL id goes out by MPI_Bcast); without it the
# processes meet through -F (see README.md, Multi-GPU). mpicc tells where MPI lives.
ifeq ($(USE_MPI),1)
  MPICC ?= mpicc
  MPI_INCDIRS := $(shell $(MPICC) --showme:incdirs 2>/dev/null)
  MPI_LIBDIRS := $(shell $(MPICC) --showme:libdirs 2>/dev/null)
  MPI_LIBS := $(shell $(MPICC) --showme:libs 2>/dev/null)
  ifeq ($(MPI_LIBS),)
    $(error USE_MPI=1 but '$(MPICC) --showme' gave nothing. HINT: install Open MPI (mpicc on PATH) or build without USE_MPI and launch with -W/-I/-F)
  endif
  NVCC_FLAGS += -DUSE_MPI $(addprefix -I,$(MPI_INCDIRS))
  NVCC_LIBS += $(addprefix -L,$(MPI_LIBDIRS)) $(addprefix -Xlinker -rpath=,$(MPI_LIBDIRS)) $(addprefix -l,$(MPI_LIBS))
endif
# PRECISION=FP32 builds the GPU trainer with fp32 activations and matmuls, for tight diffs
ifeq ($(PRECISION),FP32)
  NVCC_FLAGS += -DENABLE_FP32
endif
HAVE_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
HAVE_GPU_TRAINER := $(wildcard train_fox.cu)

.PHONY: all train train-cpu train-gpu test docs-check plot-log-test fixtures-check hf-check multi-gpu-check reliability-test sanitize-test fuzz fuzz-seeds fuzz-regressions clean
all: train_fox_cpu test_fox fox_hf

include data/data.mk

# The GPT-2 encoder (prompts of -M generate and -M maps -P) is linked into every program when
# PCRE2 is there (make data installs libpcre2-dev). A GPU machine without it builds with
# NO_GPT2_ENCODER: then only -P stops, with a hint; eval, niah and maps work.
HASH := \#
HAVE_PCRE2 := $(shell printf '$(HASH)define PCRE2_CODE_UNIT_WIDTH 8\n$(HASH)include <pcre2.h>\nint main(void) { return pcre2_config(PCRE2_CONFIG_UNICODE, 0) < 0; }\n' | $(CC) -x c - -o /dev/null -lpcre2-8 >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_PCRE2),1)
  BPE_OBJ = build/gpt2_bpe.o
  BPE_LIBS = -lpcre2-8
else
  BPE_OBJ =
  BPE_LIBS =
  ENCODER_DEFS = -DNO_GPT2_ENCODER
endif
build/gpt2_bpe.o: data/gpt2_bpe.c data/gpt2_bpe.h
	@mkdir -p build
	$(CC) $(DATA_CFLAGS) -c $< -o $@

train_fox_cpu: train_fox.c $(BPE_OBJ)
	$(CC) $(CFLAGS) $(ENCODER_DEFS) $(WARN) $(OMP_FLAGS) $< $(BPE_OBJ) -o $@ $(LDLIBS) $(BPE_LIBS)

# export to / import from the authors' HuggingFace layout (README.md)
fox_hf: dev/fox_hf.c train_fox.c
	$(CC) $(CFLAGS) $(WARN) -Wno-unused-function $(OMP_FLAGS) $< -o $@ $(LDLIBS)

ifneq ($(HAVE_GPU_TRAINER),)
train_fox: train_fox.cu dev/generate.cuh train_fox.c $(BPE_OBJ)
	@test -n "$(NVCC)" || { echo "error: nvcc not found. HINT: install the CUDA toolkit or put nvcc on PATH"; exit 1; }
	@test -z "$(filter -DNO_NCCL,$(NVCC_FLAGS))" || echo "note: NCCL not found: train_fox is built for one GPU (NCCL_HOME=<dir> for several)"
	$(NVCC) $(NVCC_FLAGS) $(ENCODER_DEFS) $< $(BPE_OBJ) -o $@ $(NVCC_LIBS) $(BPE_LIBS)
endif

# The tests build with nvcc when there is one (so the GPU code is compiled everywhere and
# cannot rot), else with the C++ compiler (CPU part only).
TEST_DEPS = test_fox.cu train_fox.c dev/fox_hf.c $(HAVE_GPU_TRAINER) $(if $(HAVE_GPU_TRAINER),dev/generate.cuh) $(BPE_OBJ)
test_fox: $(TEST_DEPS)
ifneq ($(NVCC),)
	$(NVCC) $(NVCC_FLAGS) $(ENCODER_DEFS) $< $(BPE_OBJ) -o $@ $(NVCC_LIBS) $(BPE_LIBS)
else
	@echo "note: nvcc not found, building the CPU tests only"
	$(CXX) -x c++ $(CFLAGS) $(ENCODER_DEFS) $(WARN) -Wno-unused-function $(OMP_FLAGS) $< -x none $(BPE_OBJ) -o $@ $(LDLIBS) $(BPE_LIBS)
endif

# --- the two commands ---------------------------------------------------------

# CPU twin: a tiny FoX (Pro) on the Gutenberg corpus, a few minutes on 2 cores
CPU_TRAIN_FLAGS ?= -e fox-pro-tiny -b 8 -t 64 -x 300 -l 3e-3 -u 8192 -v 50 -m 8 -s 100 -g 64 -o log_cpu
# GPU: FoX (Pro) at a small size (L=6, C=384) on the same corpus, a few minutes
GPU_TRAIN_FLAGS ?= -e fox-pro-tiny --n_layer 6 --n_embd 384 --n_head 6 -b 16 -t 1024 -x 400 -l 2e-3 -u 1000000 -v 50 -m 20 -s 200 -g 128 -n 400 -o log_gpu

ifneq ($(and $(filter-out 0,$(HAVE_GPU)),$(HAVE_GPU_TRAINER)),)
train: train-gpu
else
train: train-cpu
endif

train-cpu: data train_fox_cpu
	@echo "make train: no GPU trainer to run here, training the CPU twin on a tiny model"
	./train_fox_cpu $(CPU_TRAIN_FLAGS)

# A GPU machine may have no npm or PCRE2: shards and the decode table made elsewhere and
# copied over are enough.
DATA_READY := $(and $(wildcard data/gutenberg/gutenberg_train_000000.bin),$(wildcard data/gutenberg/gutenberg_val_000000.bin),$(wildcard data/gpt2_tokenizer.bin))
train-gpu: $(if $(DATA_READY),,data) train_fox
	./train_fox $(GPU_TRAIN_FLAGS)

# data parallel on 2-4 GPUs of one node: equal losses, exact resume, tokens/s per GPU (README.md)
multi-gpu-check: $(if $(DATA_READY),,data)
	dev/multi_gpu_check.sh $(MULTI_GPU_LOG)

# tokenizer-test also writes the decode table that test_fox checks
test: tokenizer-test test_fox hf-check docs-check plot-log-test
	./test_fox

# dev/plot_log.py on the main.log of a short CPU run
plot-log-test: data train_fox_cpu
	dev/test_plot_log.sh

# links and anchors of the .md files, no references outside the repo, README and line lengths
docs-check:
	python3 dev/check_docs.py

# fox_hf against the float64 reference: import, twin logits, export, reference logits
hf-check: fox_hf
	@if /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then /usr/bin/python3 dev/hf_check.py --fox-hf ./fox_hf; \
	else echo "skipped: hf-check (needs /usr/bin/python3 with torch and numpy: apt-get install python3-torch python3-numpy)"; fi
# bit-exact resume, SIGKILL at random moments, disk full, guards: the CPU trainer end to end
# (its crash between a checkpoint's two files needs the build with the test hooks)
build/train_fox_cpu_hooks: train_fox.c $(BPE_OBJ)
	@mkdir -p build
	$(CC) $(CFLAGS) $(ENCODER_DEFS) $(WARN) $(OMP_FLAGS) -DFOX_TEST_HOOKS $< $(BPE_OBJ) -o $@ $(LDLIBS) $(BPE_LIBS)
reliability-test: data train_fox_cpu build/train_fox_cpu_hooks
	dev/test_reliability.sh

# --- sanitizers and fuzzing ------------------------------------------------------

# the CPU tests and the CPU trainer under AddressSanitizer + UndefinedBehaviorSanitizer
SANITIZE = -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
SANITIZE_BPE = $(if $(BPE_OBJ),build/gpt2_bpe_sanitize.o)
build/gpt2_bpe_sanitize.o: data/gpt2_bpe.c data/gpt2_bpe.h
	@mkdir -p build
	$(CC) $(SANITIZE) $(WARN) -c $< -o $@
build/test_fox_sanitize: test_fox.cu train_fox.c dev/fox_hf.c $(SANITIZE_BPE)
	@mkdir -p build
	$(CXX) -x c++ $(SANITIZE) $(ENCODER_DEFS) $(WARN) -Wno-unused-function $(OMP_FLAGS) $< -x none $(SANITIZE_BPE) -o $@ $(LDLIBS) $(BPE_LIBS)
build/train_fox_cpu_sanitize: train_fox.c $(SANITIZE_BPE)
	@mkdir -p build
	$(CC) $(SANITIZE) $(ENCODER_DEFS) $(WARN) $(OMP_FLAGS) $< $(SANITIZE_BPE) -o $@ $(LDLIBS) $(BPE_LIBS)
SANITIZE_TRAIN = -e fox-pro-tiny --n_layer 2 --n_embd 32 --n_head 2 -b 2 -t 16 -x 4 -v 2 -m 2 -s 4 -g 8 -n 2 -Z 3
sanitize-test: data build/test_fox_sanitize build/train_fox_cpu_sanitize
	./build/test_fox_sanitize
	rm -rf build/sanitize_run
	./build/train_fox_cpu_sanitize $(SANITIZE_TRAIN) -o build/sanitize_run > /dev/null
	./build/train_fox_cpu_sanitize $(SANITIZE_TRAIN) -x 6 -o build/sanitize_run -y 1 > /dev/null
	@echo "sanitize-test: the CPU tests and a trained, checkpointed and resumed run are clean under ASan + UBSan"

# libFuzzer harnesses: every dev/fuzz/fuzz_<reader>.c alone (they include what they test)
FUZZ_CC ?= clang
FUZZ_FLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DFOX_NO_MAIN -DFOX_TEST_HOOKS -I.
FUZZ_LIBS = -lm -lpcre2-8
FUZZ_SECONDS ?= 60
FUZZ_READERS := $(patsubst dev/fuzz/fuzz_%.c,%,$(wildcard dev/fuzz/fuzz_*.c))
FUZZ_BINS := $(addprefix build/fuzz/fuzz_,$(FUZZ_READERS))
# (each rebuilt when any C source it could include changes)
build/fuzz/fuzz_%: dev/fuzz/fuzz_%.c $(wildcard dev/fuzz/*.h *.c *.h dev/*.c dev/*.h data/*.c data/*.h)
	@mkdir -p build/fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) $< -o $@ $(FUZZ_LIBS)
build/fuzz/make_seeds: dev/fuzz/make_seeds.c dev/fuzz/state_shards.h train_fox.c
	@mkdir -p build/fuzz
	$(CC) -O1 $(WARN) -Wno-unused-function -Wno-unknown-pragmas -Wno-format-truncation $< -o $@ $(LDLIBS)
# seeds: valid files of each format, written by the code of the day
fuzz-seeds: data build/fuzz/make_seeds
	rm -rf build/fuzz/seeds
	build/fuzz/make_seeds build/fuzz/seeds data/r50k_base.tiktoken
# each reader for FUZZ_SECONDS; a crash fails and lands in dev/fuzz/regressions/<reader>
fuzz: fuzz-seeds $(FUZZ_BINS)
	dev/fuzz/run.sh fuzz $(FUZZ_SECONDS) $(FUZZ_READERS)
# every input that ever crashed a reader, replayed
fuzz-regressions: $(FUZZ_BINS)
	dev/fuzz/run.sh regressions $(FUZZ_READERS)

# CI: the committed reference fixtures must equal what the reference computes now
fixtures-check:
	rm -rf build/fixtures && mkdir -p build/fixtures
	/usr/bin/python3 dev/fox_reference.py --all --out build/fixtures
	/usr/bin/python3 dev/compare_debug_states.py build/fixtures dev/fixtures

clean:
	rm -rf build train_fox train_fox_cpu test_fox fox_hf
