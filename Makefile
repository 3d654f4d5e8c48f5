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
NVCC_FLAGS = -O3 -std=c++17 $(GPU_ARCH) -Xcompiler "$(CFLAGS) $(OMP_FLAGS) -Wno-unused-function"
NVCC_LIBS = -lcublasLt -lcublas -lm
# PRECISION=FP32 builds the GPU trainer with fp32 activations and matmuls, for tight diffs
ifeq ($(PRECISION),FP32)
  NVCC_FLAGS += -DENABLE_FP32
endif
HAVE_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
HAVE_GPU_TRAINER := $(wildcard train_fox.cu)

.PHONY: all train train-cpu train-gpu test fixtures-check reliability-test sanitize-test fuzz fuzz-seeds fuzz-regressions clean
all: train_fox_cpu test_fox

include data/data.mk

train_fox_cpu: train_fox.c
	$(CC) $(CFLAGS) $(WARN) $(OMP_FLAGS) $< -o $@ $(LDLIBS)

ifneq ($(HAVE_GPU_TRAINER),)
train_fox: train_fox.cu train_fox.c
	@test -n "$(NVCC)" || { echo "error: nvcc not found. HINT: install the CUDA toolkit or put nvcc on PATH"; exit 1; }
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(NVCC_LIBS)
endif

# The tests build with nvcc when there is one (so the GPU code is compiled everywhere and
# cannot rot), else with the C++ compiler (CPU part only).
TEST_DEPS = test_fox.cu train_fox.c $(HAVE_GPU_TRAINER)
test_fox: $(TEST_DEPS)
ifneq ($(NVCC),)
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(NVCC_LIBS)
else
	@echo "note: nvcc not found, building the CPU tests only"
	$(CXX) -x c++ $(CFLAGS) $(WARN) -Wno-unused-function $(OMP_FLAGS) $< -o $@ $(LDLIBS)
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

# tokenizer-test also writes the decode table that test_fox checks
test: tokenizer-test test_fox
	./test_fox

# bit-exact resume, SIGKILL at random moments, disk full, guards: the CPU trainer end to end
reliability-test: data train_fox_cpu
	dev/test_reliability.sh

# --- sanitizers and fuzzing ------------------------------------------------------

# the CPU tests and the CPU trainer under AddressSanitizer + UndefinedBehaviorSanitizer
SANITIZE = -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
build/test_fox_sanitize: test_fox.cu train_fox.c
	@mkdir -p build
	$(CXX) -x c++ $(SANITIZE) $(WARN) -Wno-unused-function $(OMP_FLAGS) $< -o $@ $(LDLIBS)
build/train_fox_cpu_sanitize: train_fox.c
	@mkdir -p build
	$(CC) $(SANITIZE) $(WARN) $(OMP_FLAGS) $< -o $@ $(LDLIBS)
SANITIZE_TRAIN = -e fox-pro-tiny --n_layer 2 --n_embd 32 --n_head 2 -b 2 -t 16 -x 4 -v 2 -m 2 -s 4 -g 8 -n 2 -Z 3
sanitize-test: data build/test_fox_sanitize build/train_fox_cpu_sanitize
	./build/test_fox_sanitize
	rm -rf build/sanitize_run
	./build/train_fox_cpu_sanitize $(SANITIZE_TRAIN) -o build/sanitize_run > /dev/null
	./build/train_fox_cpu_sanitize $(SANITIZE_TRAIN) -x 6 -o build/sanitize_run -y 1 > /dev/null
	@echo "sanitize-test: the CPU tests and a trained, checkpointed and resumed run are clean under ASan + UBSan"

# libFuzzer harnesses: every dev/fuzz/fuzz_<reader>.c alone (they include what they test)
FUZZ_CC ?= clang
FUZZ_FLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DTESTING -DFUZZING -I.
FUZZ_LIBS = -lm -lpcre2-8
FUZZ_SECONDS ?= 60
FUZZ_READERS := $(patsubst dev/fuzz/fuzz_%.c,%,$(wildcard dev/fuzz/fuzz_*.c))
FUZZ_BINS := $(addprefix build/fuzz/fuzz_,$(FUZZ_READERS))
# (each rebuilt when any C source it could include changes)
build/fuzz/fuzz_%: dev/fuzz/fuzz_%.c $(wildcard dev/fuzz/*.h *.c *.h dev/*.c dev/*.h data/*.c data/*.h)
	@mkdir -p build/fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) $< -o $@ $(FUZZ_LIBS)
build/fuzz/make_seeds: dev/fuzz/make_seeds.c train_fox.c
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
	rm -rf build train_fox train_fox_cpu test_fox
