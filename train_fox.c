/*
train_fox.c: the CPU reference twin of train_fox.

A complete fp32 trainer of the Forgetting Transformer (FoX) and its Transformer baselines,
parallel with OpenMP. FoX is softmax attention with a forget gate: each head computes a scalar
f_t = sigmoid(w_f . x_t + b_f) per token, c_i is the running sum of log f_t, and the attention
logit of query i on key j gets c_i - c_j added, so that older keys fade at a rate the data
chooses (that is the full gate; the bias-only and fixed gates, and the baselines without a gate,
are options of FoxConfig). Every forward and backward here is written by hand and kept as simple
as exactness allows: it is what the GPU trainer (train_fox.cu) is diffed against. The model, its
variants and conventions are described in dev/fox.md; building, training and evaluating in
README.md.

Valid C and C++. A file that includes this one for its code (train_fox.cu, test_fox.cu, the
tools in dev/) defines FOX_NO_MAIN, which drops main(); the tests also define FOX_TEST_HOOKS
(the test hooks below, absent from the programs users run).

Map, in file order (a first reading: the model configuration, then the layers from
encoder_forward through fox_backward, then main):
  errors and checked system calls   fail, malloc_check, fopen_check, atomic_write, atomic_commit
  random numbers                    rng_next, rng_uniform, rng_normal
  model configuration               FoxConfig, config_from_preset, config_set, config_problem
  the parameter table               ParamSpec, param_table, param_hf_name
  activations                       ActivationTensors, activation_sizes
  threads                           parallel_pays (the if() of every parallel loop), threads_init
  FP8 numerics (-q)                 Fp8Format, fp8_encode, fp8_decode, fp8_scale_exp, fp8_round_tensor, Fp8State
  the model                         FoxModel, fox_build, fox_init, fox_ensure_activations
  layers, forward and backward      matmul_, rmsnorm_, kv_shift_, rope_apply; documents kept apart (-f 1):
                                    document_starts; the gate: forget_gate_forward / _backward; pruning: prune_tiles;
                                    attention_forward / attention_backward; swiglu_, crossentropy_
  the model's FP8 operands          fp8_matmul_weights, fp8_norm_output, fp8_delayed (called by the next two)
  the whole model                   fox_forward, fox_backward
  FP8 steps                         fp8_step_begin, fp8_calibrate, fp8_calibration_done, fp8_step_end
  optimiser                         fox_grad_norm, fox_clip_grads, fox_update (AdamW), lr_at_tokens
  numerical guards                  step_guard_check, nonfinite_grad_name
  data                              DataLoader: dataloader_init (every token id checked), dataloader_next_batch
  decode table                      Tokenizer: tokenizer_init, tokenizer_print
  checkpoints                       save_model, load_model, save_state, load_state, latest_checkpoint
  training samples, validation      fox_sample, evaluate
  command line                      Args, usage, parse_args, build_model
  the output directory              RunDir: run_dir_claim (made, locked, write-tested), log_line
  run helpers                       check_run_start, fox_train_micro_steps, step_guard_stop, save_checkpoint
  data-parallel processes           Topology, dist_topology, the NCCL id's rendezvous (train_fox.cu's)
  evaluation modes                  -M eval, generate, niah, maps (not needed to train): ForwardBackend,
                                    FoxDecoder, run_eval, run_generate, run_niah, run_maps, cpu_eval_main
  main                              the training loop of the CPU twin (other modes: cpu_eval_main)
*/
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
// the GPT-2 encoder, for the prompts (text in, below); a build without PCRE2 defines NO_GPT2_ENCODER
#ifndef NO_GPT2_ENCODER // the project's GPT-2 encoder, for prompts (data/gpt2_bpe.c, needs PCRE2)
#ifdef __cplusplus
extern "C" {
#endif
#include "data/gpt2_bpe.h"
#ifdef __cplusplus
}
#endif
#else
#define GPT2_EOT 50256 // as in data/gpt2_bpe.h
#endif

// ----------------------------------------------------------------------------
// errors and checked system calls

// ----------------------------------------------------------------------------
// test hooks: the only places where the tests reach into the programs. They exist only in
// builds with FOX_TEST_HOOKS (test_fox, dev/fuzz, the reliability test's CPU trainer); there
// TEST_HOOK(field, value) reads the field, elsewhere it is the value a user's program has.

#ifdef FOX_TEST_HOOKS
#include <setjmp.h>
typedef struct {
    jmp_buf* fail_jump;       // set: fail() formats its message into fail_message and jumps here (the fuzzers)
    char fail_message[1024];
    int fwd_max_blocks;       // > 0: at most this many blocks for the GPU's persistent attention forward
    int attention_any_head;   // the bf16 GPU build runs head sizes other than 64 and 128 on the simple kernel
    int tune_last;            // the GPU's matmul tuning keeps its last bit-equal candidate, not the fastest
    int ignore_checksums;     // checkpoint checksums are computed but not compared (the fuzzers reach the checks)
    int parallel_always;      // every parallel loop takes the whole team, however little its work (parallel_pays)
} TestHooks;
static TestHooks test_hooks;
#define TEST_HOOK(field, value) (test_hooks.field)
#else
#define TEST_HOOK(field, value) (value)
#endif

// the HINT of a check that only a bug in train_fox can trip
#define BUG_HINT "\nHINT: this is a bug in train_fox; please report it with the command line"
// the HINT of a failed seek in a file that was read before
#define SEEK_HINT "\nHINT: the file must be a regular file that does not change while train_fox runs"

static void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
#ifdef FOX_TEST_HOOKS
    if (test_hooks.fail_jump != NULL) {
        vsnprintf(test_hooks.fail_message, sizeof(test_hooks.fail_message), fmt, ap);
        va_end(ap);
        longjmp(*test_hooks.fail_jump, 1);
    }
#endif
    fflush(stdout); // what was said before the error stays before it
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(EXIT_FAILURE);
}

static void* malloc_check(size_t size, const char* what) {
    void* p = malloc(size > 0 ? size : 1);
    if (p == NULL) {
        fail("could not allocate %zu bytes for %s\nHINT: use a smaller model, micro-batch (-b) "
             "or sequence length (-t)", size, what);
    }
    return p;
}

static void* calloc_check(size_t count, size_t size, const char* what) {
    void* p = malloc_check(count * size, what);
    memset(p, 0, count * size);
    return p;
}

static FILE* fopen_check(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (f == NULL) {
        fail("could not open '%s' (%s): %s\nHINT: check the path and its permissions", path,
             mode[0] == 'r' ? "for reading" : "for writing", strerror(errno));
    }
    return f;
}

static void fread_check(void* dst, size_t size, size_t count, FILE* f, const char* path) {
    if (fread(dst, size, count, f) != count) {
        fail("'%s' is truncated or unreadable (%s)\nHINT: the file is damaged; regenerate it or "
             "use another one", path, ferror(f) ? strerror(errno) : "unexpected end of file");
    }
}

// plain outputs (evaluation files); checkpoints go through atomic_write below
static void fwrite_check(const void* src, size_t size, size_t count, FILE* f, const char* path) {
    if (fwrite(src, size, count, f) != count) {
        fail("could not write '%s': %s\nHINT: is the disk full?", path, strerror(errno));
    }
}

static long file_size_check(FILE* f, const char* path) {
    if (fseek(f, 0, SEEK_END) != 0) {
        fail("could not seek in '%s': %s" SEEK_HINT, path, strerror(errno));
    }
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) { fail("could not seek in '%s'" SEEK_HINT, path); }
    return size;
}

// Writes go to "<path>.tmp", are flushed to disk, then renamed over <path> and the rename
// flushed too: a crash at any moment leaves either the old complete file or the new complete
// file, never a partial one. A failed write removes its .tmp file before reporting.
static FILE* atomic_open(const char* path, char* tmp_path, size_t tmp_size) {
    if ((size_t)snprintf(tmp_path, tmp_size, "%s.tmp", path) >= tmp_size) {
        fail("path too long: '%s'\nHINT: use a shorter output directory (-o)", path);
    }
    return fopen_check(tmp_path, "wb");
}

static void atomic_abort(FILE* f, const char* tmp_path, const char* path, int err) {
    fclose(f);
    remove(tmp_path);
    fail("could not write '%s': %s\nHINT: is the disk full? '%s' is left as it was", tmp_path,
         strerror(err), path);
}

// Test hook: TRAIN_FOX_TEST_WRITE_DELAY_MS=<ms> pauses after each MiB written, so that the
// crash test (dev/test_reliability.sh) can kill the trainer inside its checkpoint writes.
static void test_write_delay(void) {
    const char* ms = getenv("TRAIN_FOX_TEST_WRITE_DELAY_MS");
    if (ms != NULL) { usleep((useconds_t)(1000 * atoi(ms))); }
}

static void atomic_write(const void* src, size_t size, size_t count, FILE* f, const char* tmp_path,
                         const char* path) {
    const size_t CHUNK = 1 << 20;
    const char* bytes = (const char*)src;
    for (size_t done = 0, total = size * count; done < total; done += CHUNK) {
        size_t n = total - done < CHUNK ? total - done : CHUNK;
        if (fwrite(bytes + done, 1, n, f) != n) { atomic_abort(f, tmp_path, path, errno); }
        test_write_delay();
    }
}

// makes a rename in dir durable
static void fsync_dir(const char* path) {
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char* slash = strrchr(dir, '/');
    if (slash == NULL) { snprintf(dir, sizeof(dir), "."); }
    else if (slash == dir) { slash[1] = '\0'; }
    else { *slash = '\0'; }
    int fd = open(dir, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0) {
        fail("could not flush the directory '%s': %s\nHINT: check the output directory", dir, strerror(errno));
    }
    close(fd);
}

static void atomic_commit(FILE* f, const char* tmp_path, const char* path) {
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) { atomic_abort(f, tmp_path, path, errno); }
    if (fclose(f) != 0) {
        int err = errno;
        remove(tmp_path);
        fail("could not close '%s': %s\nHINT: is the disk full? '%s' is left as it was", tmp_path, strerror(err), path);
    }
    if (rename(tmp_path, path) != 0) {
        fail("could not rename '%s' to '%s': %s\nHINT: check the output directory", tmp_path, path, strerror(errno));
    }
    fsync_dir(path);
}

// ----------------------------------------------------------------------------
// random numbers: splitmix64, deterministic on every platform

static uint64_t rng_next(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t* state) { // in [0, 1)
    return (double)(rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_normal(uint64_t* state) { // Box-Muller
    double u1 = rng_uniform(state), u2 = rng_uniform(state);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

static void shuffle_indices(int* idx, int n, uint64_t seed) { // Fisher-Yates
    uint64_t state = seed;
    for (int i = 0; i < n; i++) { idx[i] = i; }
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_next(&state) % (uint64_t)(i + 1));
        int t = idx[i]; idx[i] = idx[j]; idx[j] = t;
    }
}

// ----------------------------------------------------------------------------
// model configuration

enum { BLOCK_LLAMA, BLOCK_PRO };
enum { GATE_FULL, GATE_BIAS_ONLY, GATE_FIXED, GATE_NONE };
static const char* BLOCK_NAMES[] = {"llama", "pro"};
static const char* GATE_NAMES[] = {"full", "bias_only", "fixed", "none"};

typedef struct {
    int n_layer;           // L
    int n_embd;            // C
    int n_head;            // H, head size hd = C / H
    int vocab_size;        // V, 50257 for GPT-2 tokens
    int padded_vocab_size; // Vp, V rounded up to a multiple of 128
    int mlp_hidden;        // I, SwiGLU hidden size
    int block;             // BLOCK_LLAMA (MLP ratio 4) or BLOCK_PRO (3.5)
    int gate;              // forget gate type
    float decay_time_min;  // T_min, T_max: initial decay times of bias_only / fixed gates
    float decay_time_max;
    int k_shift, v_shift;  // Pro block: KV-shift on k and on v
    int qk_norm;           // Pro block: per-head RMSNorm on q and k
    int qk_norm_shared;    // one hd-sized scale shared by all heads (authors' checkpoints)
    int output_gate;       // Pro block: y = W_o(o * sigmoid(W_g x))
    int output_norm;       // Pro block: per-head RMSNorm on o
    int rope;              // rotary position embedding on q and k (Transformer baselines)
    float rope_theta;
    int window;            // sliding window size, 0 = full causal attention
} FoxConfig;

static int padded_vocab(int V) { return ((V + 127) / 128) * 128; }

// I = 256 * ceil(floor(C * r * 2/3) / 256), r = 4 (LLaMA) or 3.5 (Pro)
static int derived_mlp_hidden(int C, int block) {
    int twice_r = block == BLOCK_PRO ? 7 : 8; // r = twice_r / 2, kept in integers to be exact
    int base = (C * twice_r * 2) / 6;        // floor(C * r * 2/3)
    return 256 * ((base + 255) / 256);
}

static int apply_family(FoxConfig* c, const char* family) {
    int fox = 0, pro = 0;
    if (strcmp(family, "fox-pro") == 0) { fox = 1; pro = 1; }
    else if (strcmp(family, "fox-llama") == 0) { fox = 1; pro = 0; }
    else if (strcmp(family, "transformer-pro") == 0) { fox = 0; pro = 1; }
    else if (strcmp(family, "transformer-llama") == 0) { fox = 0; pro = 0; }
    else { return 0; }
    c->block = pro ? BLOCK_PRO : BLOCK_LLAMA;
    c->gate = fox ? GATE_FULL : GATE_NONE;
    c->k_shift = c->v_shift = c->qk_norm = c->output_gate = c->output_norm = pro;
    c->qk_norm_shared = 0;
    c->rope = !fox;
    c->rope_theta = 500000.0f;
    c->window = 0;
    c->decay_time_min = 2.0f;
    c->decay_time_max = 128.0f;
    return 1;
}

static int apply_size(FoxConfig* c, const char* size) {
    if (strcmp(size, "tiny") == 0) { c->n_layer = 2; c->n_embd = 128; c->n_head = 2; }
    else if (strcmp(size, "125m") == 0) { c->n_layer = 12; c->n_embd = 768; c->n_head = 12; }
    else if (strcmp(size, "360m") == 0) { c->n_layer = 24; c->n_embd = 1024; c->n_head = 16; }
    else if (strcmp(size, "760m") == 0) { c->n_layer = 24; c->n_embd = 1536; c->n_head = 24; }
    else { return 0; }
    return 1;
}

// A preset is "<family>-<size>", e.g. "fox-pro-125m" or "transformer-llama-tiny".
static int config_from_preset(FoxConfig* c, const char* preset) {
    char family[64];
    const char* dash = strrchr(preset, '-');
    if (dash == NULL || (size_t)(dash - preset) >= sizeof(family)) { return 0; }
    memcpy(family, preset, (size_t)(dash - preset));
    family[dash - preset] = '\0';
    memset(c, 0, sizeof(*c));
    if (!apply_family(c, family) || !apply_size(c, dash + 1)) { return 0; }
    c->vocab_size = 50257;
    c->padded_vocab_size = padded_vocab(c->vocab_size);
    c->mlp_hidden = derived_mlp_hidden(c->n_embd, c->block);
    return 1;
}

static int parse_choice(const char* value, const char* const* names, int n) {
    for (int i = 0; i < n; i++) {
        if (strcmp(value, names[i]) == 0) { return i; }
    }
    return -1;
}

static int parse_int_strict(const char* s, long* out) {
    char* end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') { return 0; }
    *out = v;
    return 1;
}

static int parse_float_strict(const char* s, double* out) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v)) { return 0; }
    *out = v;
    return 1;
}

// Sets one configuration field by its name (the keys of the checkpoint header and of the
// reference's debug states). Returns 0 for an unknown key, -1 for a bad value.
static int config_set(FoxConfig* c, const char* key, const char* value) {
    long iv = 0;
    double fv = 0;
    struct { const char* key; int* field; long lo, hi; } ints[] = {
        {"n_layer", &c->n_layer, 1, 1000}, {"n_embd", &c->n_embd, 1, 1 << 16},
        {"n_head", &c->n_head, 1, 4096}, {"vocab_size", &c->vocab_size, 2, 65536},
        {"mlp_hidden", &c->mlp_hidden, 0, 1 << 20}, {"k_shift", &c->k_shift, 0, 1},
        {"v_shift", &c->v_shift, 0, 1}, {"qk_norm", &c->qk_norm, 0, 1},
        {"qk_norm_shared", &c->qk_norm_shared, 0, 1}, {"output_gate", &c->output_gate, 0, 1},
        {"output_norm", &c->output_norm, 0, 1}, {"rope", &c->rope, 0, 1},
        {"window", &c->window, 0, 1 << 30},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        if (strcmp(key, ints[i].key) != 0) { continue; }
        if (!parse_int_strict(value, &iv) || iv < ints[i].lo || iv > ints[i].hi) { return -1; }
        *ints[i].field = (int)iv;
        if (strcmp(key, "vocab_size") == 0) { c->padded_vocab_size = padded_vocab(c->vocab_size); }
        return 1;
    }
    struct { const char* key; float* field; } floats[] = {
        {"decay_time_min", &c->decay_time_min}, {"decay_time_max", &c->decay_time_max},
        {"rope_theta", &c->rope_theta},
    };
    for (size_t i = 0; i < sizeof(floats) / sizeof(floats[0]); i++) {
        if (strcmp(key, floats[i].key) != 0) { continue; }
        if (!parse_float_strict(value, &fv) || fv <= 0) { return -1; }
        *floats[i].field = (float)fv;
        return 1;
    }
    if (strcmp(key, "block") == 0) {
        int b = parse_choice(value, BLOCK_NAMES, 2);
        if (b < 0) { return -1; }
        c->block = b;
        return 1;
    }
    if (strcmp(key, "gate") == 0) {
        int g = parse_choice(value, GATE_NAMES, 4);
        if (g < 0) { return -1; }
        c->gate = g;
        return 1;
    }
    return 0;
}

// Checks a configuration for consistency; returns NULL if fine, else a description.
// The bounds are config_set's: they also keep every size of the model far inside size_t.
static const char* config_problem(const FoxConfig* c) {
    static char msg[256];
    if (c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1) { return "n_layer, n_embd and n_head must be positive"; }
    if (c->n_layer > 1000 || c->n_embd > (1 << 16) || c->n_head > 4096 || c->mlp_hidden > (1 << 20)
        || c->window > (1 << 30)) {
        return "n_layer, n_embd, n_head, mlp_hidden or window is beyond its limit (train_fox -h)";
    }
    if (c->block < 0 || c->block > 1 || c->gate < 0 || c->gate > 3) {
        return "block or gate is not one of its choices";
    }
    int flags[] = {c->k_shift, c->v_shift, c->qk_norm, c->qk_norm_shared, c->output_gate, c->output_norm, c->rope};
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        if (flags[i] != 0 && flags[i] != 1) { return "a switch (k_shift, v_shift, qk_norm, ..., rope) is not 0 or 1"; }
    }
    if (!isfinite(c->rope_theta) || c->rope_theta <= 0) { return "rope_theta must be a positive number"; }
    if (c->n_embd % c->n_head != 0) {
        snprintf(msg, sizeof(msg), "n_embd %d is not divisible by n_head %d", c->n_embd, c->n_head);
        return msg;
    }
    if (c->rope && (c->n_embd / c->n_head) % 2 != 0) { return "RoPE needs an even head size"; }
    if (c->vocab_size < 2 || c->vocab_size > 65536) { return "vocab_size must be in [2, 65536] (tokens are uint16)"; }
    if (c->padded_vocab_size != padded_vocab(c->vocab_size)) {
        return "padded_vocab_size is not vocab_size rounded up to 128";
    }
    if (c->mlp_hidden < 1) { return "mlp_hidden must be positive"; }
    if (c->qk_norm_shared && !c->qk_norm) { return "qk_norm_shared needs qk_norm"; }
    if (!isfinite(c->decay_time_max) || !(c->decay_time_min > 0) || !(c->decay_time_max >= c->decay_time_min)) {
        return "need 0 < decay_time_min <= decay_time_max";
    }
    if (c->window < 0) { return "window must be >= 0"; }
    return NULL;
}

static void config_print(FILE* f, const FoxConfig* c) {
    fprintf(f, "model: L=%d C=%d H=%d hd=%d V=%d (padded %d) I=%d block=%s gate=%s",
            c->n_layer, c->n_embd, c->n_head, c->n_embd / c->n_head, c->vocab_size,
            c->padded_vocab_size, c->mlp_hidden, BLOCK_NAMES[c->block], GATE_NAMES[c->gate]);
    if (c->gate == GATE_BIAS_ONLY || c->gate == GATE_FIXED) {
        fprintf(f, " (decay times %g..%g)", c->decay_time_min, c->decay_time_max);
    }
    fprintf(f, " k_shift=%d v_shift=%d qk_norm=%d%s output_gate=%d output_norm=%d rope=%d",
            c->k_shift, c->v_shift, c->qk_norm, c->qk_norm_shared ? "(shared)" : "",
            c->output_gate, c->output_norm, c->rope);
    if (c->rope) { fprintf(f, "(theta %g)", c->rope_theta); }
    fprintf(f, " window=%d\n", c->window);
}

// ----------------------------------------------------------------------------
// the parameter table: one flat buffer, every tensor described once

enum {
    P_WTE, P_ATTN_NORM, P_WQ, P_WK, P_WK_SHIFT, P_WV, P_WV_SHIFT, P_WF, P_BF, P_Q_NORM, P_K_NORM,
    P_WG, P_O_NORM, P_WO, P_MLP_NORM, P_WGU, P_WDOWN, P_NORM_F, P_LM_HEAD, NUM_PARAM_TENSORS
};

typedef struct {
    const char* name;   // short name, used in messages
    int per_layer;      // stacked over layers: shape (L, rows, cols)
    size_t rows, cols;  // shape of one layer's tensor; 0 rows when the tensor is absent
    int decay;          // in the weight-decay group (matrices and the embedding)
    int trainable;      // 0 for the frozen "fixed" forget-gate bias
    int hf_rows;        // rows in the authors' HF layout (V instead of Vp for the vocabulary)
} ParamSpec;

typedef struct {
    float* wte;       // (Vp, C)        token embedding
    float* attn_norm; // (L, C)
    float* wq;        // (L, C, C)
    float* wk;        // (L, C, C)
    float* wk_shift;  // (L, H, C)      k shift
    float* wv;        // (L, C, C)
    float* wv_shift;  // (L, H, C)      v shift
    float* wf;        // (L, H, C)      forget gate, full
    float* bf;        // (L, H)         forget gate bias, full / bias_only / fixed
    float* q_norm;    // (L, C) or (L, hd) when shared
    float* k_norm;    // (L, C) or (L, hd)
    float* wg;        // (L, C, C)      output gate
    float* o_norm;    // (L, C)         output norm
    float* wo;        // (L, C, C)
    float* mlp_norm;  // (L, C)
    float* wgu;       // (L, 2I, C)     SwiGLU gate rows, then up rows
    float* wdown;     // (L, C, I)
    float* norm_f;    // (C)
    float* lm_head;   // (Vp, C)
} ParameterTensors;

static void param_pointers(ParameterTensors* p, float** out[NUM_PARAM_TENSORS]) {
    float** list[NUM_PARAM_TENSORS] = {
        &p->wte, &p->attn_norm, &p->wq, &p->wk, &p->wk_shift, &p->wv, &p->wv_shift, &p->wf,
        &p->bf, &p->q_norm, &p->k_norm, &p->wg, &p->o_norm, &p->wo, &p->mlp_norm, &p->wgu,
        &p->wdown, &p->norm_f, &p->lm_head};
    memcpy(out, list, sizeof(list));
}

static float* param_tensor(ParameterTensors* p, int tensor) {
    float** ptrs[NUM_PARAM_TENSORS];
    param_pointers(p, ptrs);
    return *ptrs[tensor];
}

static void param_table(const FoxConfig* c, ParamSpec spec[NUM_PARAM_TENSORS]) {
    size_t C = (size_t)c->n_embd, H = (size_t)c->n_head, hd = C / H, I = (size_t)c->mlp_hidden;
    size_t Vp = (size_t)c->padded_vocab_size;
    size_t qk = c->qk_norm ? (c->qk_norm_shared ? hd : C) : 0;
    int has_bias = c->gate != GATE_NONE;
    ParamSpec table[NUM_PARAM_TENSORS] = {
        {"wte", 0, Vp, C, 1, 1, c->vocab_size},
        {"attn_norm", 1, C, 1, 0, 1, (int)C},
        {"wq", 1, C, C, 1, 1, (int)C},
        {"wk", 1, C, C, 1, 1, (int)C},
        {"wk_shift", 1, c->k_shift ? H : 0, C, 1, 1, (int)H},
        {"wv", 1, C, C, 1, 1, (int)C},
        {"wv_shift", 1, c->v_shift ? H : 0, C, 1, 1, (int)H},
        {"wf", 1, c->gate == GATE_FULL ? H : 0, C, 1, 1, (int)H},
        {"bf", 1, has_bias ? H : 0, 1, 0, c->gate != GATE_FIXED, (int)H},
        {"q_norm", 1, qk, 1, 0, 1, (int)qk},
        {"k_norm", 1, qk, 1, 0, 1, (int)qk},
        {"wg", 1, c->output_gate ? C : 0, C, 1, 1, (int)C},
        {"o_norm", 1, c->output_norm ? C : 0, 1, 0, 1, (int)C},
        {"wo", 1, C, C, 1, 1, (int)C},
        {"mlp_norm", 1, C, 1, 0, 1, (int)C},
        {"wgu", 1, 2 * I, C, 1, 1, (int)(2 * I)},
        {"wdown", 1, C, I, 1, 1, (int)C},
        {"norm_f", 0, C, 1, 0, 1, (int)C},
        {"lm_head", 0, Vp, C, 1, 1, c->vocab_size},
    };
    memcpy(spec, table, sizeof(table));
}

// elements of one layer's slice (or of the whole tensor when not per layer)
static size_t param_slice_numel(const ParamSpec* s) { return s->rows * s->cols; }

static size_t param_numel(const ParamSpec* s, int L) {
    return param_slice_numel(s) * (s->per_layer ? (size_t)L : 1);
}

// The name of one layer's slice in the authors' HuggingFace layout (dev/fox.md, "HuggingFace layout").
void param_hf_name(const FoxConfig* c, int tensor, int layer, char* out, size_t n) {
    const char* name = "";
    switch (tensor) {
        case P_WTE: snprintf(out, n, "model.embeddings.weight"); return;
        case P_NORM_F: snprintf(out, n, "model.norm.weight"); return;
        case P_LM_HEAD: snprintf(out, n, "lm_head.weight"); return;
        case P_ATTN_NORM: name = "attn_norm.weight"; break;
        case P_WQ: name = "attn.q_proj.weight"; break;
        case P_WK: name = c->k_shift ? "attn.k_proj.linear.weight" : "attn.k_proj.weight"; break;
        case P_WK_SHIFT: name = "attn.k_proj.shift_proj.weight"; break;
        case P_WV: name = c->v_shift ? "attn.v_proj.linear.weight" : "attn.v_proj.weight"; break;
        case P_WV_SHIFT: name = "attn.v_proj.shift_proj.weight"; break;
        case P_WF: name = "attn.fgate_proj.weight"; break;
        case P_BF: name = c->gate == GATE_FULL ? "attn.fgate_proj.bias" : "attn.fgate_bias"; break;
        case P_Q_NORM: name = "attn.q_norm.weight"; break;
        case P_K_NORM: name = "attn.k_norm.weight"; break;
        case P_WG: name = "attn.ogate_proj.weight"; break;
        case P_O_NORM: name = "attn.output_norm.weight"; break;
        case P_WO: name = "attn.o_proj.weight"; break;
        case P_MLP_NORM: name = "mlp_norm.weight"; break;
        case P_WGU: name = "mlp.gate_proj.weight"; break;
        case P_WDOWN: name = "mlp.down_proj.weight"; break;
    }
    snprintf(out, n, "model.layers.%d.%s", layer, name);
}

// ----------------------------------------------------------------------------
// activations: everything the backward pass reads, one flat buffer
// N = B * T rows; per-layer tensors are stacked over L

#define NUM_ACTIVATION_TENSORS 33
typedef struct {
    float* resid;     // (L+1, N, C) residual stream entering each layer; [L] is the final one
    float* xa;        // (L, N, C)   RMSNorm_1 output, the attention input
    float* rstd_a;    // (L, N)
    float* q_raw;     // (L, N, C)   W_q x
    float* k_raw;     // (L, N, C)   W_k x, before the shift
    float* v_raw;     // (L, N, C)
    float* k_alpha;   // (L, N, H)   shift weights alpha = sigmoid(w_s . x)
    float* v_alpha;   // (L, N, H)
    float* k_shifted; // (L, N, C)   after the k shift
    float* v;         // (L, N, C)   attention values, after the v shift
    float* rstd_q;    // (L, N, H)   QK-norm statistics
    float* rstd_k;    // (L, N, H)
    float* q_normed;  // (L, N, C)   after QK-norm, before RoPE
    float* k_normed;  // (L, N, C)
    float* q;         // (L, N, C)   attention queries (after QK-norm and RoPE)
    float* k;         // (L, N, C)   attention keys
    float* gate_logit;// (L, N, H)   w_f . x + b_f (the bias alone for bias_only / fixed)
    float* c;         // (L, B, H, T) cumulative log forget gate, fp32
    float* lse;       // (L, B, H, T) log-sum-exp of each attention row
    float* o;         // (L, N, C)   attention output
    float* rstd_o;    // (L, N, H)   output norm statistics
    float* o_normed;  // (L, N, C)
    float* og_logit;  // (L, N, C)   W_g x
    float* y;         // (L, N, C)   input of W_o
    float* attproj;   // (L, N, C)   W_o y
    float* resid_mid; // (L, N, C)   residual after attention
    float* xm;        // (L, N, C)   RMSNorm_2 output, the MLP input
    float* rstd_m;    // (L, N)
    float* gu;        // (L, N, 2I)  SwiGLU gate and up projections
    float* act;       // (L, N, I)   silu(gate) * up
    float* mlpproj;   // (L, N, C)   W_down act
    float* xf;        // (N, C)      final RMSNorm output
    float* rstd_f;    // (N)
} ActivationTensors;
// The classifier's buffers are kept apart: the backward turns logits into dlogits in place.

static void activation_sizes(const FoxConfig* c, int B, int T, size_t sizes[NUM_ACTIVATION_TENSORS]) {
    size_t L = (size_t)c->n_layer, C = (size_t)c->n_embd, H = (size_t)c->n_head;
    size_t I = (size_t)c->mlp_hidden, N = (size_t)B * (size_t)T;
    size_t list[NUM_ACTIVATION_TENSORS] = {
        (L + 1) * N * C, L * N * C, L * N, L * N * C, L * N * C, L * N * C, L * N * H, L * N * H,
        L * N * C, L * N * C, L * N * H, L * N * H, L * N * C, L * N * C, L * N * C, L * N * C,
        L * N * H, L * N * H, L * N * H, L * N * C, L * N * H, L * N * C, L * N * C, L * N * C,
        L * N * C, L * N * C, L * N * C, L * N, L * N * 2 * I, L * N * I, L * N * C, N * C, N};
    memcpy(sizes, list, sizeof(list));
}

static float* point_tensors(float** ptrs[], const size_t* sizes, int n, float* memory) {
    for (int i = 0; i < n; i++) {
        *ptrs[i] = memory;
        memory += sizes[i];
    }
    return memory;
}

static void activation_pointers(ActivationTensors* a, float** out[NUM_ACTIVATION_TENSORS]) {
    float** list[NUM_ACTIVATION_TENSORS] = {
        &a->resid, &a->xa, &a->rstd_a, &a->q_raw, &a->k_raw, &a->v_raw, &a->k_alpha, &a->v_alpha,
        &a->k_shifted, &a->v, &a->rstd_q, &a->rstd_k, &a->q_normed, &a->k_normed, &a->q, &a->k,
        &a->gate_logit, &a->c, &a->lse, &a->o, &a->rstd_o, &a->o_normed, &a->og_logit, &a->y,
        &a->attproj, &a->resid_mid, &a->xm, &a->rstd_m, &a->gu, &a->act, &a->mlpproj, &a->xf,
        &a->rstd_f};
    memcpy(out, list, sizeof(list));
}

// ----------------------------------------------------------------------------
// threads. Waking a team and the barrier that ends its loop cost microseconds, more with more threads, and far
// more when threads outnumber the cores; so a loop runs on the whole team only when each thread gets at least
// PARALLEL_MIN_WORK of its inner iterations (some microseconds of arithmetic), else on the calling thread
// alone. Never a team of another size: libgomp ends the threads a smaller team leaves out and starts them again
// for the next larger one. Each loop computes every output alone, in an order of its own: the thread count
// never changes a bit (sum_squares splits its sum into fixed blocks for that).

#define PARALLEL_MIN_WORK 65536
// the default thread count caps at this: the twin's loops are too short to gain from more, and many-core hosts
// are often shared (OMP_NUM_THREADS still sets any count)
#define THREADS_DEFAULT_MAX 16

#ifdef _OPENMP
// the if() of every parallel loop; work: the loop's inner iterations in all (multiply-adds, elements, ...)
static int parallel_pays(size_t work) {
    if (TEST_HOOK(parallel_always, 0)) { return 1; }
    return work >= (size_t)PARALLEL_MIN_WORK * (size_t)omp_get_max_threads();
}

// multiply-adds of an attention pass: B * H heads of T queries, each over hd-wide keys, T / 2 of them on average
// (causal) or at most the window
static size_t attention_work(int B, int T, int H, int hd, int window) {
    size_t keys = window > 0 && window < T ? (size_t)window : (size_t)T / 2 + 1;
    return (size_t)B * H * T * keys * hd;
}

// the thread count when OMP_NUM_THREADS sets none, for `procs` processors to run on
static int threads_default(int procs) { return procs < THREADS_DEFAULT_MAX ? procs : THREADS_DEFAULT_MAX; }
#endif

// first thing in main: the default thread count (libgomp's own is every processor)
static void threads_init(void) {
#ifdef _OPENMP
    if (getenv("OMP_NUM_THREADS") == NULL) { omp_set_num_threads(threads_default(omp_get_num_procs())); }
#endif
}

// ----------------------------------------------------------------------------
// FP8 numerics (-q; dev/fox.md, "FP8 numerics"): the twin emulates the GPU's FP8 matmuls. An operand x of scale 2^k
// is stored as the codes enc(x 2^k); the GEMM multiplies decoded codes (exact in fp32) and scales its sums by
// 2^-(kA+kB). The twin rounds the operand to dec(enc(x 2^k)) 2^-k (fp8_round_tensor), which is exact apart from the
// rounding to FP8 itself: k is an integer kept in [-100, 100] here, so x 2^k (when it does not saturate) and the
// codes' values times 2^-k are fp32 numbers of the same significands. The fp32 matmul of rounded operands then differs
// from the GPU's only in the order of its sums.

// E4M3 is the "fn" variant (no inf; S.1111.111 is NaN, max 448); E5M2 is IEEE-like (inf, NaNs; max 57344).
// Both saturate: a finite value beyond the largest code and +-inf become the largest finite code (CUDA's
// __NV_SATFINITE, TransformerEngine's casts). A delayed scale is up to a step stale, so a value may exceed what its
// scale holds: inf (E5M2) or NaN (E4M3) there would poison every sum it enters, while the largest finite code is the
// nearest value the format has. Saturation is not silent: every delayed operand's amax is checked (fp8_step_end), and
// a non-finite one stops or skips the step like a non-finite gradient.
typedef struct {
    int m;              // mantissa bits
    int bias;           // exponent bias
    int emin, emax;     // exponents of the smallest normal and of the largest finite value
    unsigned max_code;  // the largest finite magnitude, 1.75 x 2^emax in both formats
    unsigned nan_code;  // the magnitude code of the NaN the encoder writes
    uint32_t sat_bits;  // fp32 magnitudes from these bits up saturate: max + half its ulp (a tie) and beyond, inf
    uint32_t zero_bits; // fp32 magnitudes up to these bits give 0: half the smallest subnormal (a tie: 0 is even)
    int has_inf;        // the exponent field all ones holds inf (mantissa 0) and NaNs (E5M2)
} Fp8Format;

// 464 = 448 + 16 is E4M3's tie between 448 (even) and the NaN code: 448. 61440 is E5M2's tie between 57344 and inf
// (even): round to nearest even would overflow, saturation gives 57344. Zero up to 2^-10 (E4M3) and 2^-17 (E5M2).
static const Fp8Format FP8_E4M3 = {3, 7, -6, 8, 0x7E, 0x7F, 0x43E80000u, 0x3A800000u, 0};
static const Fp8Format FP8_E5M2 = {2, 15, -14, 15, 0x7B, 0x7E, 0x47700000u, 0x37000000u, 1};
#define FP8_K_MAX 100 // scale exponents lie in [-FP8_K_MAX, FP8_K_MAX]

static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, sizeof(u)); return u; }
static float f32_from_bits(uint32_t u) { float x; memcpy(&x, &u, sizeof(x)); return x; }

// fp32 -> FP8 code: round to nearest, ties to even, saturating; NaN stays NaN. Integer operations only, so neither
// the twin's -fassociative-math nor FMA contraction can touch it. Past the three early exits x is a normal fp32.
static uint8_t fp8_encode(float x, const Fp8Format* f) {
    uint32_t u = f32_bits(x), s = (u >> 24) & 0x80, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) { return (uint8_t)(s | f->nan_code); }
    if (a >= f->sat_bits) { return (uint8_t)(s | f->max_code); }
    if (a <= f->zero_bits) { return (uint8_t)s; }                // fp32 denormals included
    int e = (int)(a >> 23) - 127;
    uint32_t sig = (a & 0x7FFFFFu) | 0x800000u;                   // 1.mantissa x 2^23
    int ee = e > f->emin ? e : f->emin;                           // below emin the FP8 value is subnormal
    int sh = 23 - f->m + (ee - e);                                // bits dropped: 20..24 (E4M3), 21..24 (E5M2)
    uint32_t q = sig >> sh, r = sig & ((1u << sh) - 1), h = 1u << (sh - 1);
    q += (r > h || (r == h && (q & 1))) ? 1 : 0;
    // subnormals have ee + bias - 1 = 0; a carry out of q moves into the exponent (or from subnormal to normal)
    return (uint8_t)(s | (((uint32_t)(ee + f->bias - 1) << f->m) + q));
}

// FP8 code -> fp32, exact: normal (2^m + M) 2^(E - bias - m), subnormal M 2^(emin - m), built as fp32 bits
static float fp8_decode(uint8_t c, const Fp8Format* f) {
    uint32_t s = (uint32_t)(c & 0x80) << 24, mag = c & 0x7Fu;
    uint32_t E = mag >> f->m, M = mag & ((1u << f->m) - 1), top = 0x7Fu >> f->m;
    if (f->has_inf && E == top) { return f32_from_bits(s | (M == 0 ? 0x7F800000u : 0x7FC00000u)); }
    if (!f->has_inf && mag == f->nan_code) { return f32_from_bits(s | 0x7FC00000u); }
    if (mag == 0) { return f32_from_bits(s); }
    int e = (int)E - f->bias;
    if (E == 0) { // subnormal: shift M up to 1.xxx, one binade down per step
        for (e = f->emin; M < (1u << f->m); e--) { M <<= 1; }
        M -= 1u << f->m;
    }
    return f32_from_bits(s | (uint32_t)(e + 127) << 23 | M << (23 - f->m));
}

// 2^k as an fp32, for |k| <= 126
static float fp8_pow2(int k) { return f32_from_bits((uint32_t)(k + 127) << 23); }

// The scale exponent of an operand whose magnitudes are at most amax: the largest k with amax 2^k <= max 2^-margin.
// Both formats' max is 1.75 x 2^emax, so k = emax - e(amax) - [significand(amax) > 1.75] - margin, clamped to
// [-FP8_K_MAX, FP8_K_MAX] (an fp32 denormal amax gives the upper end). 0 for an amax of 0, inf or NaN.
static int fp8_scale_exp(float amax, const Fp8Format* f, int margin) {
    uint32_t a = f32_bits(amax) & 0x7FFFFFFFu;
    if (a == 0 || a >= 0x7F800000u) { return 0; }
    int k = f->emax - ((int)(a >> 23) - 127) - ((a & 0x7FFFFFu) > 0x600000u ? 1 : 0) - margin;
    return k < -FP8_K_MAX ? -FP8_K_MAX : k > FP8_K_MAX ? FP8_K_MAX : k;
}

// fp32 -> the nearest bf16 (ties to even) as an fp32: the GPU's matmul copy of a weight (__float2bfloat16)
static float bf16_round(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) { return x; }
    u += 0x7FFFu + ((u >> 16) & 1);
    return f32_from_bits(u & 0xFFFF0000u);
}

// the larger of two magnitudes, NaN above inf: magnitudes' bit patterns order as unsigned integers
static float fp8_max(float a, float b) { return f32_bits(a) >= f32_bits(b) ? a : b; }

// max |x| over n values, NaN when one is NaN; exact and order-free (deterministic under OpenMP)
static float fp8_amax(const float* x, size_t n) {
    uint32_t mx = 0;
    #pragma omp parallel for reduction(max : mx) if(parallel_pays(n))
    for (size_t i = 0; i < n; i++) {
        uint32_t a = f32_bits(x[i]) & 0x7FFFFFFFu;
        mx = a > mx ? a : mx;
    }
    return f32_from_bits(mx);
}

// out = dec(enc(x 2^k)) 2^-k elementwise (out may be x): the values an FP8 operand of scale 2^k holds
static void fp8_round_tensor(float* out, const float* x, size_t n, int k, const Fp8Format* f) {
    float up = fp8_pow2(k), down = fp8_pow2(-k);
    #pragma omp parallel for if(parallel_pays(n))
    for (size_t i = 0; i < n; i++) { out[i] = fp8_decode(fp8_encode(x[i] * up, f), f) * down; }
}

// -q: which matmuls run in FP8. hybrid: E4M3 weights and activations, E5M2 gradients; e4m3: E4M3 gradients too
// (dlogits stay E5M2); body: hybrid with the lm head in fp32 (the GPU's bf16)
enum { FP8_MODE_OFF, FP8_MODE_HYBRID, FP8_MODE_E4M3, FP8_MODE_BODY, FP8_MODES };
static const char* FP8_MODE_NAMES[] = {"off", "hybrid", "e4m3", "body"};

// The operands of a layer with delayed scales, each with an amax history: the SwiGLU output act, y without the
// output norm (with it, y is bounded by the norm's weights), and the output gradients of W_down, W_gu, W_o and of
// q, k, v, g together (one operand of the GPU's fused backward).
enum { FP8_ACT, FP8_Y, FP8_DRES_DOWN, FP8_DGU, FP8_DRES_O, FP8_DQKVG, FP8_SLOTS };
static const char* FP8_SLOT_NAMES[] = {"act", "y", "dres (W_down)", "dgu", "dres (W_o)", "dqkvg"};
#define FP8_HISTORY 16       // steps of amax history a run keeps
#define FP8_MAX_HISTORY 1024 // the most a state file may hold

typedef struct {
    int mode;             // FP8_MODE_*; with FP8_MODE_OFF the rest is unused
    int on;               // set around a training step's micro-steps: fox_forward and fox_backward quantise
    int calibrating;      // fp8_calibrate's micro-step: amaxes taken, nothing rounded
    int history_len;      // U: amaxes kept per operand
    int calibrated;       // the histories hold at least one step (else the next step calibrates first)
    int pos;              // where the next step's amaxes go in the histories, a ring of U
    float* history;       // (L, FP8_SLOTS, U)
    float* amax;          // (L, FP8_SLOTS) of the current step, the max over its micro-steps
    int* k;               // (L, FP8_SLOTS) the current step's scale exponents, from the histories
    float* weights_memory;    // the FP8 matmul weights as fp32 values, in the parameters' layout
    ParameterTensors weights; // the matmul weights of an FP8 step: those copies, or the parameters (fp32 matmuls)
    float* xa;            // (N, C) the FP8 copy of one layer's attention input
} Fp8State;

// ----------------------------------------------------------------------------
// the model

typedef struct {
    FoxConfig config;
    ParamSpec spec[NUM_PARAM_TENSORS];
    size_t num_parameters;
    float* params_memory;
    ParameterTensors params;
    float* grads_memory;
    ParameterTensors grads;
    float* m_memory; // AdamW moments, allocated on the first update
    float* v_memory;
    // activations, allocated for (max_B, max_T) on the first forward
    int max_B, max_T;
    size_t act_sizes[NUM_ACTIVATION_TENSORS];
    float* acts_memory;
    ActivationTensors acts;
    float* grad_acts_memory;
    ActivationTensors grad_acts;
    float* logits;   // (N, Vp), turned into dlogits by the backward
    float* losses;   // (N)
    float* scratch;  // per-thread rows for attention, (threads, T) x 2
    int prune;          // adaptive computation pruning of attention (-A), set by the caller
    float prune_ln_eps; // ln eps of the pruning bound (-L)
    int doc_eot;        // -f 1: the token that starts a document (GPT-2's EOT); -1: documents not kept apart
    int* doc_start;     // (B, T) of the last forward when doc_eot >= 0: its document's first position (document_starts)
    float* prune_u;     // (B, H) the bound U of the current layer
    int* prune_tables;  // (B, H, nt) key_start, then (B, H, nt) query_end
    Fp8State fp8;       // FP8 matmuls (-q), set by fp8_setup
    int B, T;        // shape of the last forward
    const int* inputs;
    const int* targets;
    float mean_loss; // of the last forward with targets, -1 otherwise
} FoxModel;

// parameters of a (valid) configuration, without allocating anything
static size_t config_num_parameters(const FoxConfig* c) {
    ParamSpec spec[NUM_PARAM_TENSORS];
    param_table(c, spec);
    size_t n = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { n += param_numel(&spec[i], c->n_layer); }
    return n;
}

static void fox_build(FoxModel* m, const FoxConfig* config) {
    const char* problem = config_problem(config);
    if (problem != NULL) { fail("bad model configuration: %s\nHINT: fix the overrides or the checkpoint", problem); }
    memset(m, 0, sizeof(*m));
    m->config = *config;
    param_table(config, m->spec);
    size_t sizes[NUM_PARAM_TENSORS];
    m->num_parameters = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        sizes[i] = param_numel(&m->spec[i], config->n_layer);
        m->num_parameters += sizes[i];
    }
    m->params_memory = (float*)calloc_check(m->num_parameters, sizeof(float), "parameters");
    m->grads_memory = (float*)calloc_check(m->num_parameters, sizeof(float), "gradients");
    float** ptrs[NUM_PARAM_TENSORS];
    param_pointers(&m->params, ptrs);
    point_tensors(ptrs, sizes, NUM_PARAM_TENSORS, m->params_memory);
    param_pointers(&m->grads, ptrs);
    point_tensors(ptrs, sizes, NUM_PARAM_TENSORS, m->grads_memory);
    m->mean_loss = -1.0f;
    m->doc_eot = -1;
}

static void fox_free(FoxModel* m) {
    free(m->params_memory); free(m->grads_memory); free(m->m_memory); free(m->v_memory);
    free(m->acts_memory); free(m->grad_acts_memory); free(m->logits); free(m->losses);
    free(m->scratch); free(m->prune_u); free(m->prune_tables); free(m->doc_start);
    free(m->fp8.history); free(m->fp8.amax); free(m->fp8.k); free(m->fp8.weights_memory); free(m->fp8.xa);
    memset(m, 0, sizeof(*m));
}

// Number of parameters that take part in matmuls (the embedding lookup does not), for the
// FLOP count 6 * N + 6 * L * C * T per token (dev/fox.md, "FLOP and MFU conventions").
static size_t fox_matmul_params(const FoxModel* m) {
    size_t n = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const ParamSpec* s = &m->spec[i];
        if (i != P_WTE && s->cols > 1 && s->rows > 0) { n += param_numel(s, m->config.n_layer); }
    }
    return n;
}

// Forget-gate bias for bias_only / fixed: decay times T_h log-spaced from T_min to T_max
// across heads, b = -log(expm1(1 / T_h)) so that -1 / logsigmoid(b) = T_h.
static void gate_bias_init(float* b, int H, double t_min, double t_max) {
    for (int h = 0; h < H; h++) {
        double frac = H > 1 ? (double)h / (double)(H - 1) : 0.0;
        double t = t_min * pow(t_max / t_min, frac);
        b[h] = (float)(-log(expm1(1.0 / t)));
    }
}

// The paper's initialisation: every matrix and the embedding N(0, 0.02^2), norm scales 1,
// full-gate bias 0. Each tensor draws from its own stream, so that switching one component
// off leaves the initial values of all the others unchanged (clean ablations).
static void fox_init(FoxModel* m, uint64_t seed) {
    const FoxConfig* c = &m->config;
    int L = c->n_layer;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        const ParamSpec* s = &m->spec[t];
        float* p = param_tensor(&m->params, t);
        size_t n = param_numel(s, L);
        uint64_t state = seed * 0x100000001B3ull + (uint64_t)t * 0x9E3779B97F4A7C15ull;
        if (t == P_BF) {
            for (int l = 0; l < L && n > 0; l++) {
                if (c->gate == GATE_FULL) { memset(p + (size_t)l * s->rows, 0, s->rows * sizeof(float)); }
                else { gate_bias_init(p + (size_t)l * s->rows, c->n_head, c->decay_time_min, c->decay_time_max); }
            }
        } else if (s->cols == 1) {
            for (size_t i = 0; i < n; i++) { p[i] = 1.0f; }
        } else {
            for (size_t i = 0; i < n; i++) { p[i] = (float)(0.02 * rng_normal(&state)); }
        }
        if (t == P_WTE || t == P_LM_HEAD) { // pad rows stay 0: they are never used
            size_t used = (size_t)c->vocab_size * (size_t)c->n_embd;
            memset(p + used, 0, (n - used) * sizeof(float));
        }
    }
}

static void fox_ensure_activations(FoxModel* m, int B, int T) {
    if (m->acts_memory != NULL) {
        if (B > m->max_B || T > m->max_T) {
            fail("internal: batch %dx%d exceeds the activations allocated for %dx%d" BUG_HINT, B, T, m->max_B,
                 m->max_T);
        }
        return;
    }
    m->max_B = B;
    m->max_T = T;
    activation_sizes(&m->config, B, T, m->act_sizes);
    size_t total = 0;
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) { total += m->act_sizes[i]; }
    float** ptrs[NUM_ACTIVATION_TENSORS];
    m->acts_memory = (float*)calloc_check(total, sizeof(float), "activations");
    activation_pointers(&m->acts, ptrs);
    point_tensors(ptrs, m->act_sizes, NUM_ACTIVATION_TENSORS, m->acts_memory);
    m->grad_acts_memory = (float*)calloc_check(total, sizeof(float), "activation gradients");
    activation_pointers(&m->grad_acts, ptrs);
    point_tensors(ptrs, m->act_sizes, NUM_ACTIVATION_TENSORS, m->grad_acts_memory);
    size_t N = (size_t)B * (size_t)T;
    m->logits = (float*)calloc_check(N * (size_t)m->config.padded_vocab_size, sizeof(float), "logits");
    m->losses = (float*)calloc_check(N, sizeof(float), "losses");
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    m->scratch = (float*)calloc_check((size_t)threads * 2 * (size_t)T, sizeof(float), "attention rows");
    m->doc_start = (int*)calloc_check(N, sizeof(int), "document starts");
}

// ----------------------------------------------------------------------------
// layers, forward and backward. Every backward accumulates (+=) into its input gradients;
// fox_backward zeroes the activation gradients first.

static void encoder_forward(float* out, const int* tokens, const float* wte, size_t N, int C) {
    // out (N, C) = wte[tokens]
    #pragma omp parallel for if(parallel_pays(N * C))
    for (size_t n = 0; n < N; n++) {
        memcpy(out + n * C, wte + (size_t)tokens[n] * C, (size_t)C * sizeof(float));
    }
}

static void encoder_backward(float* dwte, const float* dout, const int* tokens, size_t N, int C) {
    // parallel over channels: two rows with the same token never race, and the order of the
    // sum over positions is fixed, so the result is deterministic
    #pragma omp parallel for if(parallel_pays(N * C))
    for (int c = 0; c < C; c++) {
        for (size_t n = 0; n < N; n++) { dwte[(size_t)tokens[n] * C + c] += dout[n * C + c]; }
    }
}

// out (N, OC) = inp (N, IC) @ w (OC, IC)^T + bias (OC). Rows are taken 8 at a time so that
// each row of w is read once per 8 outputs.
static void matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                           size_t N, int IC, int OC) {
    const size_t TILE = 8;
    size_t tiles = (N + TILE - 1) / TILE;
    #pragma omp parallel for if(parallel_pays(N * IC * OC))
    for (size_t tile = 0; tile < tiles; tile++) {
        size_t n0 = tile * TILE, n1 = n0 + TILE < N ? n0 + TILE : N;
        for (int o = 0; o < OC; o++) {
            const float* wrow = w + (size_t)o * IC;
            for (size_t n = n0; n < n1; n++) {
                const float* x = inp + n * IC;
                float acc = bias != NULL ? bias[o] : 0.0f;
                for (int i = 0; i < IC; i++) { acc += x[i] * wrow[i]; }
                out[n * OC + o] = acc;
            }
        }
    }
}

static void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                            const float* inp, const float* w, size_t N, int IC, int OC) {
    // forward: out = inp @ w^T + bias
    // dinp += dout @ w;  dw += dout^T @ inp;  dbias += sum over rows of dout
    #pragma omp parallel for if(parallel_pays(N * IC * OC))
    for (size_t n = 0; n < N; n++) {
        const float* d = dout + n * OC;
        float* di = dinp + n * IC;
        for (int o = 0; o < OC; o++) {
            const float* wrow = w + (size_t)o * IC;
            float g = d[o];
            for (int i = 0; i < IC; i++) { di[i] += g * wrow[i]; }
        }
    }
    #pragma omp parallel for if(parallel_pays(N * IC * OC))
    for (int o = 0; o < OC; o++) {
        float* dwrow = dw + (size_t)o * IC;
        float db = 0.0f;
        for (size_t n = 0; n < N; n++) {
            float g = dout[n * OC + o];
            const float* x = inp + n * IC;
            for (int i = 0; i < IC; i++) { dwrow[i] += g * x[i]; }
            db += g;
        }
        if (dbias != NULL) { dbias[o] += db; }
    }
}

// RMSNorm over rows of D values: out = x / sqrt(mean(x^2) + eps) * w. Row r uses the scale
// vector w + (r % groups) * D: groups = 1 for the model's norms; groups = H for per-head
// norms over (N, H, hd) rows, or 1 when the heads share one scale.
static void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, size_t rows,
                            int D, int groups, float eps) {
    #pragma omp parallel for if(parallel_pays(rows * D))
    for (size_t r = 0; r < rows; r++) {
        const float* xr = x + r * D;
        const float* wr = w + (r % (size_t)groups) * D;
        float ss = 0.0f;
        for (int i = 0; i < D; i++) { ss += xr[i] * xr[i]; }
        float s = 1.0f / sqrtf(ss / (float)D + eps);
        for (int i = 0; i < D; i++) { out[r * D + i] = xr[i] * s * wr[i]; }
        rstd[r] = s;
    }
}

static void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x,
                             const float* w, const float* rstd, size_t rows, int D, int groups) {
    // forward: out_i = x_i * s * w_i with s = (mean(x^2) + eps)^(-1/2), ds/dx_i = -s^3 x_i / D
    // dx_i = s * w_i dout_i - x_i * s^3 / D * sum_j(w_j dout_j x_j);  dw_i += dout_i x_i s
    #pragma omp parallel for if(parallel_pays(rows * D))
    for (size_t r = 0; r < rows; r++) {
        const float* xr = x + r * D;
        const float* dr = dout + r * D;
        const float* wr = w + (r % (size_t)groups) * D;
        float s = rstd[r], dot = 0.0f;
        for (int i = 0; i < D; i++) { dot += wr[i] * dr[i] * xr[i]; }
        float k = dot * s * s * s / (float)D;
        for (int i = 0; i < D; i++) { dx[r * D + i] += s * wr[i] * dr[i] - xr[i] * k; }
    }
    #pragma omp parallel for if(parallel_pays(rows * D))
    for (int gi = 0; gi < groups * D; gi++) {
        int g = gi / D, i = gi % D;
        float acc = 0.0f;
        for (size_t r = (size_t)g; r < rows; r += (size_t)groups) {
            acc += dout[r * D + i] * x[r * D + i] * rstd[r];
        }
        dw[gi] += acc;
    }
}

static void add_forward(float* out, const float* a, const float* b, size_t n) {
    #pragma omp parallel for if(parallel_pays(n))
    for (size_t i = 0; i < n; i++) { out[i] = a[i] + b[i]; }
}

// backward of out = a + b, and of out = a (pass b = NULL) for stages that are switched off
static void add_backward(float* da, float* db, const float* dout, size_t n) {
    #pragma omp parallel for if(parallel_pays(n))
    for (size_t i = 0; i < n; i++) {
        da[i] += dout[i];
        if (db != NULL) { db[i] += dout[i]; }
    }
}

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): finite for every finite x
static float logsigmoidf(float x) { return fminf(x, 0.0f) - log1pf(expf(-fabsf(x))); }

static void sigmoid_inplace(float* x, size_t n) {
    #pragma omp parallel for if(parallel_pays(n))
    for (size_t i = 0; i < n; i++) { x[i] = sigmoidf(x[i]); }
}

// Documents kept apart (-f 1; dev/fox.md, "Documents kept apart"). doc (B, T): for the token at position t of
// sequence b, the position in that sequence of its document's first token: the last t' <= t whose input is the EOT
// token, or 0 when the document began at or before the sequence's start. Each document follows its EOT separator, so
// an EOT is the first token of its document and attends only to itself. No query sees a key of an earlier document:
// attention's first key is at least doc; a document start t0 > 0 is a forget gate of -inf, so c restarts there from
// c_t0 = 0 and the gate logit of t0 gets no gradient; the KV-shift takes raw_{t-1} = 0 there, as at t = 0. RoPE is
// relative and keeps the sequence's positions. The layers take doc = NULL when documents are not kept apart.
static void document_starts(int* doc, const int* inputs, int B, int T, int eot) {
    for (int b = 0; b < B; b++) {
        int start = 0;
        for (int t = 0; t < T; t++) {
            if (inputs[(size_t)b * T + t] == eot) { start = t; }
            doc[(size_t)b * T + t] = start;
        }
    }
}

// whether token n = (b, t) starts its sequence or a document: nothing before it is seen
static int starts_context(const int* doc, size_t n, int t) { return t == 0 || (doc != NULL && doc[n] == t); }

// KV-shift, per head: out_t = alpha_t * raw_{t-1} + (1 - alpha_t) * raw_t, raw_{t-1} = 0 where t starts the
// sequence or a document (doc (B, T) or NULL)
static void kv_shift_forward(float* out, const float* raw, const float* alpha, const int* doc, int B, int T,
                             int H, int hd) {
    size_t C = (size_t)H * hd;
    #pragma omp parallel for collapse(2) if(parallel_pays((size_t)B * T * C))
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)b * T + t;
            for (int h = 0; h < H; h++) {
                float a = alpha[n * H + h];
                const float* cur = raw + n * C + (size_t)h * hd;
                float* o = out + n * C + (size_t)h * hd;
                for (int i = 0; i < hd; i++) {
                    float prev = starts_context(doc, n, t) ? 0.0f : cur[i - (ptrdiff_t)C];
                    o[i] = a * prev + (1.0f - a) * cur[i];
                }
            }
        }
    }
}

static void kv_shift_backward(float* draw, float* dalpha_logit, const float* dout, const float* raw,
                              const float* alpha, const int* doc, int B, int T, int H, int hd) {
    // forward: out_t = a_t raw_{t-1} + (1 - a_t) raw_t, a_t = sigmoid(z_t)
    // draw_t += (1 - a_t) dout_t + a_{t+1} dout_{t+1}   (gathered, so rows never race)
    // dz_t = a_t (1 - a_t) * sum_i dout_t,i (raw_{t-1},i - raw_t,i)
    // raw_{t-1} = 0 where t starts a context: then a_t takes no raw_{t-1} and t - 1 gets nothing from t
    size_t C = (size_t)H * hd;
    #pragma omp parallel for collapse(2) if(parallel_pays((size_t)B * T * C))
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)b * T + t;
            for (int h = 0; h < H; h++) {
                float a = alpha[n * H + h];
                int next = t + 1 < T && !starts_context(doc, n + 1, t + 1);
                float a_next = next ? alpha[(n + 1) * H + h] : 0.0f;
                size_t off = n * C + (size_t)h * hd;
                float da = 0.0f;
                for (int i = 0; i < hd; i++) {
                    float d_next = next ? dout[off + C + i] : 0.0f;
                    draw[off + i] += (1.0f - a) * dout[off + i] + a_next * d_next;
                    float prev = starts_context(doc, n, t) ? 0.0f : raw[off - C + i];
                    da += dout[off + i] * (prev - raw[off + i]);
                }
                dalpha_logit[n * H + h] += da * a * (1.0f - a);
            }
        }
    }
}

// RoPE, non-interleaved: dims (i, i + hd/2) rotate by angle t * theta^(-2i/hd)
static void rope_angle(int t, int i, int hd, float theta, float* cs, float* sn) {
    double angle = (double)t * pow((double)theta, -2.0 * i / (double)hd);
    *cs = (float)cos(angle);
    *sn = (float)sin(angle);
}

// direction +1: forward rotation; -1: its transpose (the backward)
static void rope_apply(float* out, const float* inp, int B, int T, int H, int hd, float theta,
                       int direction) {
    int half = hd / 2;
    #pragma omp parallel for collapse(2) if(parallel_pays((size_t)B * T * H * hd))
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < half; i++) {
                float cs, sn;
                rope_angle(t, i, hd, theta, &cs, &sn);
                sn *= (float)direction;
                for (int h = 0; h < H; h++) {
                    size_t off = (((size_t)b * T + t) * H + h) * hd;
                    float x1 = inp[off + i], x2 = inp[off + i + half];
                    out[off + i] += x1 * cs - x2 * sn;
                    out[off + i + half] += x2 * cs + x1 * sn;
                }
            }
        }
    }
}

// one past the last position of the context that starts at t: the next document start, or T (doc (T), a sequence's
// row of document starts, or NULL)
static int context_end(const int* doc, int T, int t) {
    int e = t + 1;
    while (doc != NULL && e < T && doc[e] != e) { e++; }
    return doc != NULL ? e : T;
}

// c (n) = the running sum of log f = logsigmoid(gate_logit) over n positions (gate_logit's stride H), from 0. restart:
// position 0 is a document start t0 > 0, whose gate is one of -inf, which the sum does not hold: c_t0 = 0 and c_t sums
// (t0, t], so c_i - c_j is exact within the document; at t = 0 of a sequence (restart = 0) log f_0 counts.
static void gate_running_sum(float* c, const float* gate_logit, int n, int H, int restart) {
    float acc = 0.0f;
    if (restart) { c[0] = 0.0f; }
    for (int t = restart; t < n; t++) {
        acc += logsigmoidf(gate_logit[(size_t)t * H]);
        c[t] = acc;
    }
}

// The forget gate: log f = logsigmoid(gate_logit), c = cumulative sum over time in fp32, restarted
// at each document start (doc (B, T) or NULL: only at t = 0). gate_logit (B, T, H) -> c (B, H, T)
static void forget_gate_forward(float* c, const float* gate_logit, const int* doc, int B, int T, int H) {
    #pragma omp parallel for collapse(2) if(parallel_pays((size_t)B * T * H))
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const int* db = doc != NULL ? doc + (size_t)b * T : NULL;
            for (int s = 0, e; s < T; s = e) {
                e = context_end(db, T, s);
                gate_running_sum(c + ((size_t)b * H + h) * T + s, gate_logit + ((size_t)b * T + s) * H + h, e - s, H,
                                 s > 0);
            }
        }
    }
}

// dlogf_t = sum_{s>=t} dc_s over n positions (reverse cumulative sum); dx_t += dlogf_t * sigmoid(-x_t), x the gate
// logits (stride H, as dgate_logit). restart: position 0 is a document start t0 > 0, whose gate c does not hold: its
// logit gets nothing (not even a rounded zero), and dc_t0, the gradient of the constant c_t0 = 0, goes nowhere.
static void gate_reverse_sum(float* dgate_logit, const float* dc, const float* gate_logit, int n, int H,
                             int restart) {
    float acc = 0.0f;
    for (int t = n - 1; t >= restart; t--) {
        acc += dc[t];
        dgate_logit[(size_t)t * H] += acc * sigmoidf(-gate_logit[(size_t)t * H]);
    }
}

static void forget_gate_backward(float* dgate_logit, const float* dc, const float* gate_logit, const int* doc,
                                 int B, int T, int H) {
    // forward: c_t = sum of log f_s over s <= t in t's document, less its start t0 > 0; log f_s = logsigmoid(x_s)
    // dlogf_t = sum_{s>=t} dc_s over s in t's document; dx_t = dlogf_t * sigmoid(-x_t), and dx_t0 = 0 exactly:
    // the boundary's gate of -inf is a constant.
    #pragma omp parallel for collapse(2) if(parallel_pays((size_t)B * T * H))
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const int* db = doc != NULL ? doc + (size_t)b * T : NULL;
            for (int s = 0, e; s < T; s = e) {
                e = context_end(db, T, s);
                size_t off = ((size_t)b * T + s) * H + h;
                gate_reverse_sum(dgate_logit + off, dc + ((size_t)b * H + h) * T + s, gate_logit + off, e - s, H,
                                 s > 0);
            }
        }
    }
}

// first key that query i may attend to
static int attention_first_key(int i, int window) { return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0; }

// Adaptive computation pruning (dev/fox.md, "Adaptive computation pruning"). With
// |q_i.k_j| scale <= U, a row's weight on key j is p_ij <= exp(s_ij - s_ii) <= exp(2U + c_i - c_j)
// (the diagonal key is always in the row's sum). In a tile of queries from i0 and keys up to j1,
// c_i - c_j <= c_i0 - c_j1 (c is non-increasing), so skipping every tile with
// c_i0 - c_j1 < delta = ln eps - ln T - 2U drops less than T exp(2U + delta) = eps of each row's
// weight. Tiles are square, PRUNE_BLOCK queries by PRUNE_BLOCK keys. The GPU kernels use tiles of
// their own (see fox_attention_forward / fox_attention_backward in train_fox.cu), aligned so that each
// of their query and key tiles lies within one pruning tile: every kernel then skips exactly the
// same (query, key) pairs as the others and as the twin.
#define PRUNE_BLOCK 128

typedef struct {
    int block;            // tile size, queries and keys
    const int* key_start; // (B, H, ceil(T / block)) first key tile a query tile visits
} AttnPrune;

// U (B, H) = max_i |q_i| max_j |k_j| / sqrt(hd), Euclidean norms of the rows of one head.
// Taken from q and k themselves (after QK-norm and RoPE): never looser than the QK-norm weight
// bound max|w_q| max|w_k| sqrt(hd), and valid for every model. q, k (B, T, H, hd).
static void prune_bound(float* U, const float* q, const float* k, int B, int T, int H, int hd) {
    size_t C = (size_t)H * hd;
    #pragma omp parallel for collapse(2) if(parallel_pays((size_t)B * T * C))
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            float mq = 0.0f, mk = 0.0f;
            for (int t = 0; t < T; t++) {
                const float* qt = q + ((size_t)b * T + t) * C + (size_t)h * hd;
                const float* kt = k + ((size_t)b * T + t) * C + (size_t)h * hd;
                float sq = 0.0f, sk = 0.0f;
                for (int d = 0; d < hd; d++) { sq += qt[d] * qt[d]; sk += kt[d] * kt[d]; }
                mq = fmaxf(mq, sq); mk = fmaxf(mk, sk);
            }
            U[(size_t)b * H + h] = sqrtf(mq) * sqrtf(mk) / sqrtf((float)hd);
        }
    }
}

// the part of delta that does not depend on (b, h); the GPU takes it from here too, so both
// compare c_i0 - c_j1 against the same float
static float prune_delta_base(float ln_eps, int T) { return ln_eps - logf((float)T); }

// Tile (query tile qt, key tile kt) is skipped; never the diagonal tile, so every row keeps a key. With documents
// (doc: the sequence's row of document starts, else NULL) a tile that ends before the document of its first query
// i0 starts holds no allowed pair (exactly zero weight, no eps). Else i0 and the tile's last key are in one document,
// the only one that can meet both tiles, inside which c is non-increasing: the decay bound holds as without
// documents (ch NULL: no decay bound, only the documents).
static int prune_skip(const float* ch, const int* doc, int block, int qt, int kt, float delta) {
    if (kt >= qt) { return 0; }
    if (doc != NULL && doc[qt * block] > kt * block + block - 1) { return 1; }
    return ch != NULL && ch[qt * block] - ch[kt * block + block - 1] < delta;
}

// key_start (B, H, nt): first key tile each query tile visits; query_end (B, H, nt): one past
// the last query tile that visits each key tile (the dk/dv loop's end). nt = ceil(T / block).
// c, U as above, or U = NULL: no decay bound; doc (B, T) or NULL as in prune_skip. Skipped tiles are a
// prefix of each query tile's keys and a suffix of each key tile's queries (c is non-increasing within a
// document, document starts non-decreasing), so the two tables describe the same tiles.
static void prune_tiles(int* key_start, int* query_end, const float* c, const float* U, const int* doc, int B, int H,
                        int T, int block, float ln_eps) {
    int nt = (T + block - 1) / block;
    float base = prune_delta_base(ln_eps, T);
    for (size_t bh = 0; bh < (size_t)B * H; bh++) {
        const float* ch = U != NULL ? c + bh * T : NULL;
        const int* db = doc != NULL ? doc + bh / H * T : NULL;
        float delta = U != NULL ? base - 2.0f * U[bh] : 0.0f;
        for (int t = 0; t < nt; t++) {
            int s = 0, e = t + 1;
            while (prune_skip(ch, db, block, t, s, delta)) { s++; }
            while (e < nt && !prune_skip(ch, db, block, e, t, delta)) { e++; }
            key_start[bh * nt + t] = s;
            query_end[bh * nt + t] = e;
        }
    }
}

// first key that query i of head bh visits, with the window, its document's start doc_i (0 without
// documents) and pruning
static int attention_first_key_pruned(int i, int window, int doc_i, const AttnPrune* pr, size_t bh, int T) {
    int j0 = attention_first_key(i, window);
    j0 = doc_i > j0 ? doc_i : j0;
    if (pr == NULL) { return j0; }
    int nt = (T + pr->block - 1) / pr->block;
    int jp = pr->key_start[bh * nt + i / pr->block] * pr->block;
    return jp > j0 ? jp : j0;
}

// Forgetting attention, one materialised row at a time:
// s_ij = q_i . k_j / sqrt(hd) + c_i - c_j for first_key(i) <= j <= i, o_i = softmax(s_i) v.
// q, k, v, o (B, T, H, hd); c, lse (B, H, T); c == NULL for no gate. doc (B, T): document starts, the
// first key of each row at least its document's start (for gate none too: a mask), or NULL.
// scratch: T floats a thread. pr: skip the pruned tiles, or NULL (dense).
static void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v,
                              const float* c, const int* doc, int B, int T, int H, int hd,
                              int window, const AttnPrune* pr, float* scratch) {
    size_t C = (size_t)H * hd;
    float scale = 1.0f / sqrtf((float)hd);
    #pragma omp parallel for collapse(3) if(parallel_pays(attention_work(B, T, H, hd, window)))
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            for (int i = 0; i < T; i++) {
                int tid = 0;
#ifdef _OPENMP
                tid = omp_get_thread_num();
#endif
                float* s = scratch + (size_t)tid * 2 * T;
                const float* qi = q + ((size_t)b * T + i) * C + (size_t)h * hd;
                const float* ch = c != NULL ? c + ((size_t)b * H + h) * T : NULL;
                int doc_i = doc != NULL ? doc[(size_t)b * T + i] : 0;
                int j0 = attention_first_key_pruned(i, window, doc_i, pr, (size_t)b * H + h, T);
                float mx = -INFINITY;
                for (int j = j0; j <= i; j++) {
                    const float* kj = k + ((size_t)b * T + j) * C + (size_t)h * hd;
                    float dot = 0.0f;
                    for (int d = 0; d < hd; d++) { dot += qi[d] * kj[d]; }
                    s[j] = dot * scale + (ch != NULL ? ch[i] - ch[j] : 0.0f);
                    mx = fmaxf(mx, s[j]);
                }
                float sum = 0.0f;
                for (int j = j0; j <= i; j++) { s[j] = expf(s[j] - mx); sum += s[j]; }
                float* oi = o + ((size_t)b * T + i) * C + (size_t)h * hd;
                for (int d = 0; d < hd; d++) { oi[d] = 0.0f; }
                for (int j = j0; j <= i; j++) {
                    const float* vj = v + ((size_t)b * T + j) * C + (size_t)h * hd;
                    float p = s[j] / sum;
                    for (int d = 0; d < hd; d++) { oi[d] += p * vj[d]; }
                }
                lse[((size_t)b * H + h) * T + i] = mx + logf(sum);
            }
        }
    }
}

static void attention_backward(float* dq, float* dk, float* dv, float* dc, const float* dout,
                               const float* q, const float* k, const float* v, const float* o,
                               const float* lse, const float* c, const int* doc, int B, int T, int H, int hd,
                               int window, const AttnPrune* pr) {
    // forward: s_ij = scale q_i.k_j + c_i - c_j, p_ij = exp(s_ij - lse_i), o_i = sum_j p_ij v_j
    // dp_ij = dout_i . v_j, Delta_i = dout_i . o_i, ds_ij = p_ij (dp_ij - Delta_i)
    // dq_i += scale sum_j ds_ij k_j, dk_j += scale ds_ij q_i, dv_j += p_ij dout_i
    // dc_i += sum_j ds_ij (as query), dc_j -= ds_ij (as key)
    // One thread owns a whole (b, h): every write stays inside it, so nothing races.
    size_t C = (size_t)H * hd;
    float scale = 1.0f / sqrtf((float)hd);
    #pragma omp parallel for collapse(2) if(parallel_pays(attention_work(B, T, H, hd, window)))
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const float* ch = c != NULL ? c + ((size_t)b * H + h) * T : NULL;
            float* dch = c != NULL ? dc + ((size_t)b * H + h) * T : NULL;
            for (int i = 0; i < T; i++) {
                size_t oi = ((size_t)b * T + i) * C + (size_t)h * hd;
                float row_lse = lse[((size_t)b * H + h) * T + i];
                float delta = 0.0f;
                for (int d = 0; d < hd; d++) { delta += dout[oi + d] * o[oi + d]; }
                float ds_row = 0.0f;
                int doc_i = doc != NULL ? doc[(size_t)b * T + i] : 0;
                for (int j = attention_first_key_pruned(i, window, doc_i, pr, (size_t)b * H + h, T); j <= i; j++) {
                    size_t oj = ((size_t)b * T + j) * C + (size_t)h * hd;
                    float dot = 0.0f, dp = 0.0f;
                    for (int d = 0; d < hd; d++) { dot += q[oi + d] * k[oj + d]; dp += dout[oi + d] * v[oj + d]; }
                    float p = expf(dot * scale + (ch != NULL ? ch[i] - ch[j] : 0.0f) - row_lse);
                    float ds = p * (dp - delta);
                    for (int d = 0; d < hd; d++) {
                        dq[oi + d] += scale * ds * k[oj + d];
                        dk[oj + d] += scale * ds * q[oi + d];
                        dv[oj + d] += p * dout[oi + d];
                    }
                    ds_row += ds;
                    if (dch != NULL) { dch[j] -= ds; }
                }
                if (dch != NULL) { dch[i] += ds_row; }
            }
        }
    }
}

// y = x * sigmoid(g), the output gate
static void output_gate_forward(float* y, const float* x, const float* g, size_t n) {
    #pragma omp parallel for if(parallel_pays(n))
    for (size_t i = 0; i < n; i++) { y[i] = x[i] * sigmoidf(g[i]); }
}

static void output_gate_backward(float* dx, float* dg, const float* dy, const float* x,
                                 const float* g, size_t n) {
    // forward: y = x * sigmoid(g);  dx += dy sigmoid(g);  dg += dy x sigmoid(g) (1 - sigmoid(g))
    #pragma omp parallel for if(parallel_pays(n))
    for (size_t i = 0; i < n; i++) {
        float s = sigmoidf(g[i]);
        dx[i] += dy[i] * s;
        dg[i] += dy[i] * x[i] * s * (1.0f - s);
    }
}

// SwiGLU: act = silu(gate) * up, gu (N, 2I) holds the gate then the up projection of a row
static void swiglu_forward(float* act, const float* gu, size_t N, int I) {
    #pragma omp parallel for if(parallel_pays(N * I))
    for (size_t n = 0; n < N; n++) {
        for (int i = 0; i < I; i++) {
            float g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i];
            act[n * I + i] = g * sigmoidf(g) * u;
        }
    }
}

static void swiglu_backward(float* dgu, const float* dact, const float* gu, size_t N, int I) {
    // forward: act = g sigmoid(g) u
    // dg = dact u sigmoid(g) (1 + g (1 - sigmoid(g))),  du = dact g sigmoid(g)
    #pragma omp parallel for if(parallel_pays(N * I))
    for (size_t n = 0; n < N; n++) {
        for (int i = 0; i < I; i++) {
            float g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i], s = sigmoidf(g);
            float d = dact[n * I + i];
            dgu[n * 2 * I + i] += d * u * s * (1.0f + g * (1.0f - s));
            dgu[n * 2 * I + I + i] += d * g * s;
        }
    }
}

// Cross-entropy over the first V logits of each row; the pad logits V..Vp-1 are masked.
static void crossentropy_forward(float* losses, const float* logits, const int* targets,
                                 size_t N, int V, int Vp) {
    #pragma omp parallel for if(parallel_pays(N * V))
    for (size_t n = 0; n < N; n++) {
        const float* row = logits + n * Vp;
        float mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j < V; j++) { mx = fmaxf(mx, row[j]); }
        for (int j = 0; j < V; j++) { sum += expf(row[j] - mx); }
        losses[n] = mx + logf(sum) - row[targets[n]];
    }
}

// turns logits into dlogits in place: (softmax - onehot(target)) * dloss, pads 0
static void crossentropy_backward_inplace(float* logits, const int* targets, size_t N, int V,
                                          int Vp, float dloss) {
    #pragma omp parallel for if(parallel_pays(N * Vp))
    for (size_t n = 0; n < N; n++) {
        float* row = logits + n * Vp;
        float mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j < V; j++) { mx = fmaxf(mx, row[j]); }
        for (int j = 0; j < V; j++) { row[j] = expf(row[j] - mx); sum += row[j]; }
        for (int j = 0; j < V; j++) { row[j] = row[j] / sum * dloss; }
        row[targets[n]] -= dloss;
        for (int j = V; j < Vp; j++) { row[j] = 0.0f; }
    }
}

// pointer to layer l's slice of a stacked tensor of `per` elements per layer
#define LAYER(ptr, l, per) ((ptr) + (size_t)(l) * (per))

// ----------------------------------------------------------------------------
// the FP8 operands of the model (-q): where the GPU's matmuls take FP8 (dev/fox.md, "FP8 numerics"), fox_forward and
// fox_backward round the operands with the GPU's scales; the rest stays fp32. FP8 matmuls: W_q, W_k, W_v, W_g, W_o,
// W_gu, W_down and the lm head (not with -q body), with their inputs and output gradients; the head projections
// (KV-shift, forget gate) and every layer between the matmuls stay fp32. Scales, all powers of two:
//   weights          E4M3, current: the amax of their bf16 copy, in every forward (one value per step)
//   xa, xm, xf, y    E4M3, bounded by the RMSNorm (output norm) before them: |x| <= sqrt(D) max|w|
//   act, y (no norm) E4M3, delayed: the max of the amax history, margin 0
//   output grads     E5M2 (-q e4m3: E4M3), delayed, margin 1
//   dlogits          E5M2, bounded: |softmax - onehot| dloss <= dloss

// the FP8 state of a model for -q `mode`: the histories empty, so the first step calibrates
static void fp8_setup(FoxModel* m, int mode) {
    Fp8State* s = &m->fp8;
    s->mode = mode;
    if (mode == FP8_MODE_OFF) { return; }
    size_t slots = (size_t)m->config.n_layer * FP8_SLOTS;
    s->history_len = FP8_HISTORY;
    s->history = (float*)calloc_check(slots * FP8_HISTORY, sizeof(float), "FP8 amax histories");
    s->amax = (float*)calloc_check(slots, sizeof(float), "FP8 amaxes");
    s->k = (int*)calloc_check(slots, sizeof(int), "FP8 scales");
}

static const Fp8Format* fp8_slot_format(int mode, int slot) {
    return slot == FP8_ACT || slot == FP8_Y || mode == FP8_MODE_E4M3 ? &FP8_E4M3 : &FP8_E5M2;
}

// binades kept free below the format's max: 0 for activations, 1 for gradients (E5M2 has range to spare)
static int fp8_slot_margin(int slot) { return slot == FP8_ACT || slot == FP8_Y ? 0 : 1; }

// every delayed scale from its history: k = fp8_scale_exp(the history's max) (an empty history gives 0)
static void fp8_update_scales(FoxModel* m) {
    Fp8State* s = &m->fp8;
    size_t U = (size_t)s->history_len;
    for (size_t i = 0; i < (size_t)m->config.n_layer * FP8_SLOTS; i++) {
        int slot = (int)(i % FP8_SLOTS);
        float mx = fp8_amax(s->history + i * U, U);
        s->k[i] = fp8_scale_exp(mx, fp8_slot_format(s->mode, slot), fp8_slot_margin(slot));
    }
}

// The scale of an RMSNorm output over D values with the scale vector w (nw values): |x_i s w_i| <= sqrt(D) max|w|
// (s <= 1 / rms(x) makes |x_i| s <= sqrt(D)), and sqrt(D) <= 2^c for the least c with 4^c >= D, taken as a margin of
// c binades. It never saturates: an fp32 result an ulp past the bound still rounds to the largest code.
static int fp8_norm_exp(const float* w, size_t nw, int D) {
    int c = 0;
    while (((size_t)1 << (2 * c)) < (size_t)D) { c++; }
    return fp8_scale_exp(fp8_amax(w, nw), &FP8_E4M3, c);
}

// the FP8 copy of the operand x (n values) at scale 2^k into out (which may be x); x itself while calibrating
static const float* fp8_operand(const FoxModel* m, float* out, const float* x, size_t n, int k, const Fp8Format* f) {
    if (m->fp8.calibrating) { return x; }
    fp8_round_tensor(out, x, n, k, f);
    return out;
}

// an RMSNorm output x (n values) rounded in place with its bounded scale (the norm's weights w, nw values, over D)
static void fp8_norm_output(FoxModel* m, float* x, size_t n, const float* w, size_t nw, int D) {
    fp8_operand(m, x, x, n, fp8_norm_exp(w, nw, D), &FP8_E4M3);
}

// the FP8 copy of layer l's attention input xa (N, C), into scratch: xa itself feeds the fp32 head projections. The
// backward makes it again from the same xa and weights: the same codes.
static const float* fp8_attn_input(FoxModel* m, const float* xa, int l, size_t N) {
    int C = m->config.n_embd;
    if (m->fp8.xa == NULL) {
        m->fp8.xa = (float*)calloc_check((size_t)m->max_B * m->max_T * C, sizeof(float), "FP8 attention input");
    }
    int k = fp8_norm_exp(LAYER(m->params.attn_norm, l, C), (size_t)C, C);
    return fp8_operand(m, m->fp8.xa, xa, N * C, k, &FP8_E4M3);
}

// a delayed-scaled operand of layer l, rounded in place with the step's scale; its amax joins the step's
static void fp8_delayed(FoxModel* m, float* x, size_t n, int l, int slot) {
    size_t i = (size_t)l * FP8_SLOTS + slot;
    m->fp8.amax[i] = fp8_max(m->fp8.amax[i], fp8_amax(x, n));
    fp8_operand(m, x, x, n, m->fp8.k[i], fp8_slot_format(m->fp8.mode, slot));
}

// One weight group's FP8 copy (current scaling): bf16(w), the GPU's matmul copy, rounded to E4M3 at the scale of its
// amax. `parts` slices of n values share the scale (q, k, v, g: one operand of the GPU's fused backward).
static void fp8_weight_group(float* const* out, float* const* w, int parts, size_t n) {
    float amax = 0.0f;
    for (int i = 0; i < parts; i++) {
        #pragma omp parallel for if(parallel_pays(n))
        for (size_t j = 0; j < n; j++) { out[i][j] = bf16_round(w[i][j]); }
        amax = fp8_max(amax, fp8_amax(out[i], n));
    }
    int k = fp8_scale_exp(amax, &FP8_E4M3, 0);
    for (int i = 0; i < parts; i++) { fp8_round_tensor(out[i], out[i], n, k, &FP8_E4M3); }
}

// m's parameter tensors at the same offsets in another buffer of the parameters' layout
static ParameterTensors param_tensors_in(const FoxModel* m, float* memory) {
    ParameterTensors t = m->params;
    float** ptrs[NUM_PARAM_TENSORS];
    param_pointers(&t, ptrs);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { *ptrs[i] = memory + (*ptrs[i] - m->params_memory); }
    return t;
}

// The matmul weights of an FP8 micro-step (also kept in m->fp8.weights for the backward): FP8 copies of the FP8
// matmuls' weights, the fp32 parameters for the others. Made in each forward: the same for every micro-step of a step.
static ParameterTensors fp8_matmul_weights(FoxModel* m) {
    const FoxConfig* cf = &m->config;
    size_t C = (size_t)cf->n_embd, I = (size_t)cf->mlp_hidden, CC = C * C;
    if (m->fp8.weights_memory == NULL) {
        m->fp8.weights_memory = (float*)calloc_check(m->num_parameters, sizeof(float), "FP8 weights");
    }
    ParameterTensors p = m->params, q = param_tensors_in(m, m->fp8.weights_memory), w = p;
    for (int l = 0; l < cf->n_layer; l++) {
        float* qkvg_out[4] = {LAYER(q.wq, l, CC), LAYER(q.wk, l, CC), LAYER(q.wv, l, CC), LAYER(q.wg, l, CC)};
        float* qkvg[4] = {LAYER(p.wq, l, CC), LAYER(p.wk, l, CC), LAYER(p.wv, l, CC), LAYER(p.wg, l, CC)};
        fp8_weight_group(qkvg_out, qkvg, cf->output_gate ? 4 : 3, CC);
        float* out[3] = {LAYER(q.wo, l, CC), LAYER(q.wgu, l, 2 * I * C), LAYER(q.wdown, l, C * I)};
        float* in[3] = {LAYER(p.wo, l, CC), LAYER(p.wgu, l, 2 * I * C), LAYER(p.wdown, l, C * I)};
        size_t n[3] = {CC, 2 * I * C, C * I};
        for (int i = 0; i < 3; i++) { fp8_weight_group(&out[i], &in[i], 1, n[i]); }
    }
    w.wq = q.wq; w.wk = q.wk; w.wv = q.wv; w.wg = q.wg; w.wo = q.wo; w.wgu = q.wgu; w.wdown = q.wdown;
    if (m->fp8.mode != FP8_MODE_BODY) {
        fp8_weight_group(&q.lm_head, &p.lm_head, 1, (size_t)cf->padded_vocab_size * C);
        w.lm_head = q.lm_head;
    }
    m->fp8.weights = w;
    return w;
}

// ----------------------------------------------------------------------------
// forward and backward of the whole model

static void check_tokens(const int* tokens, size_t n, int V, const char* what) {
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            fail("%s token %d at position %zu is outside the vocabulary [0, %d)\nHINT: the data "
                 "was tokenized for another vocabulary", what, tokens[i], i, V);
        }
    }
}

// the document starts (B, T) of the last forward, or NULL when documents are not kept apart (-f 0)
static const int* fox_documents(const FoxModel* m) { return m->doc_eot >= 0 ? m->doc_start : NULL; }

// The skipped tiles of one layer into *pr: with -A 1 and a forget gate those the decay bound of q, k (B, T, H, hd)
// and c (B, H, T) drops; with documents (doc (B, T), else NULL) those wholly before the document of their first
// query (exact). NULL when neither applies (without a gate nothing decays).
static const AttnPrune* fox_prune(FoxModel* m, AttnPrune* pr, const float* q, const float* k, const float* c,
                                  const int* doc, int B, int T) {
    int decay = m->prune && c != NULL;
    if (!decay && doc == NULL) { return NULL; }
    int H = m->config.n_head, hd = m->config.n_embd / H;
    size_t nt = ((size_t)T + PRUNE_BLOCK - 1) / PRUNE_BLOCK;
    if (m->prune_u == NULL) { // for the largest batch, (max_B, max_T), like the activations
        size_t BH = (size_t)m->max_B * H, nt_max = ((size_t)m->max_T + PRUNE_BLOCK - 1) / PRUNE_BLOCK;
        m->prune_u = (float*)calloc_check(BH, sizeof(float), "pruning bound");
        m->prune_tables = (int*)calloc_check(2 * BH * nt_max, sizeof(int), "pruning tiles");
    }
    if (decay) { prune_bound(m->prune_u, q, k, B, T, H, hd); }
    prune_tiles(m->prune_tables, m->prune_tables + (size_t)B * H * nt, c, decay ? m->prune_u : NULL, doc, B, H, T,
                PRUNE_BLOCK, m->prune_ln_eps);
    pr->block = PRUNE_BLOCK;
    pr->key_start = m->prune_tables;
    return pr;
}

// inputs, targets (B, T); targets may be NULL (no loss). Returns nothing; logits and, with
// targets, m->losses and m->mean_loss are filled.
static void fox_forward(FoxModel* m, const int* inputs, const int* targets, int B, int T) {
    const FoxConfig* cf = &m->config;
    int L = cf->n_layer, C = cf->n_embd, H = cf->n_head, hd = C / H, I = cf->mlp_hidden;
    int V = cf->vocab_size, Vp = cf->padded_vocab_size;
    size_t N = (size_t)B * T, NC = N * C, NH = N * H, BHT = (size_t)B * H * T;
    int groups_qk = cf->qk_norm_shared ? 1 : H;
    fox_ensure_activations(m, B, T);
    check_tokens(inputs, N, V, "input");
    if (targets != NULL) { check_tokens(targets, N, V, "target"); }
    m->B = B; m->T = T; m->inputs = inputs; m->targets = targets;
    if (m->doc_eot >= 0) { document_starts(m->doc_start, inputs, B, T, m->doc_eot); }
    const int* doc = fox_documents(m);
    ParameterTensors p = m->params;
    ActivationTensors a = m->acts;
    int q8 = m->fp8.on; // an FP8 training micro-step: the FP8 matmuls' operands rounded (fp8_calibrate: amaxes only)
    ParameterTensors w = q8 && !m->fp8.calibrating ? fp8_matmul_weights(m) : p; // the weights of those matmuls
    encoder_forward(a.resid, inputs, p.wte, N, C);
    for (int l = 0; l < L; l++) {
        float* resid = LAYER(a.resid, l, NC);
        float* xa = LAYER(a.xa, l, NC);
        float* q_raw = LAYER(a.q_raw, l, NC); float* k_raw = LAYER(a.k_raw, l, NC);
        float* v_raw = LAYER(a.v_raw, l, NC);
        float* k_alpha = LAYER(a.k_alpha, l, NH); float* v_alpha = LAYER(a.v_alpha, l, NH);
        float* k_shifted = LAYER(a.k_shifted, l, NC); float* v = LAYER(a.v, l, NC);
        float* q_normed = LAYER(a.q_normed, l, NC); float* k_normed = LAYER(a.k_normed, l, NC);
        float* q = LAYER(a.q, l, NC); float* k = LAYER(a.k, l, NC);
        float* gate_logit = LAYER(a.gate_logit, l, NH); float* c = LAYER(a.c, l, BHT);
        float* o = LAYER(a.o, l, NC); float* o_normed = LAYER(a.o_normed, l, NC);
        float* og_logit = LAYER(a.og_logit, l, NC); float* y = LAYER(a.y, l, NC);
        float* resid_mid = LAYER(a.resid_mid, l, NC); float* xm = LAYER(a.xm, l, NC);
        float* gu = LAYER(a.gu, l, N * 2 * I); float* act = LAYER(a.act, l, N * I);
        size_t qk_per = (size_t)m->spec[P_Q_NORM].rows;
        // attention
        rmsnorm_forward(xa, LAYER(a.rstd_a, l, N), resid, LAYER(p.attn_norm, l, C), N, C, 1, 1e-6f);
        const float* xa8 = q8 ? fp8_attn_input(m, xa, l, N) : xa;
        matmul_forward(q_raw, xa8, LAYER(w.wq, l, (size_t)C * C), NULL, N, C, C);
        matmul_forward(k_raw, xa8, LAYER(w.wk, l, (size_t)C * C), NULL, N, C, C);
        matmul_forward(v_raw, xa8, LAYER(w.wv, l, (size_t)C * C), NULL, N, C, C);
        if (cf->k_shift) {
            matmul_forward(k_alpha, xa, LAYER(p.wk_shift, l, (size_t)H * C), NULL, N, C, H);
            sigmoid_inplace(k_alpha, NH);
            kv_shift_forward(k_shifted, k_raw, k_alpha, doc, B, T, H, hd);
        } else {
            memcpy(k_shifted, k_raw, NC * sizeof(float));
        }
        if (cf->v_shift) {
            matmul_forward(v_alpha, xa, LAYER(p.wv_shift, l, (size_t)H * C), NULL, N, C, H);
            sigmoid_inplace(v_alpha, NH);
            kv_shift_forward(v, v_raw, v_alpha, doc, B, T, H, hd);
        } else {
            memcpy(v, v_raw, NC * sizeof(float));
        }
        if (cf->qk_norm) {
            rmsnorm_forward(q_normed, LAYER(a.rstd_q, l, NH), q_raw, LAYER(p.q_norm, l, qk_per), NH, hd, groups_qk,
                            1e-5f);
            rmsnorm_forward(k_normed, LAYER(a.rstd_k, l, NH), k_shifted, LAYER(p.k_norm, l, qk_per), NH, hd,
                            groups_qk, 1e-5f);
        } else {
            memcpy(q_normed, q_raw, NC * sizeof(float));
            memcpy(k_normed, k_shifted, NC * sizeof(float));
        }
        if (cf->rope) {
            memset(q, 0, NC * sizeof(float));
            memset(k, 0, NC * sizeof(float));
            rope_apply(q, q_normed, B, T, H, hd, cf->rope_theta, 1);
            rope_apply(k, k_normed, B, T, H, hd, cf->rope_theta, 1);
        } else {
            memcpy(q, q_normed, NC * sizeof(float));
            memcpy(k, k_normed, NC * sizeof(float));
        }
        if (cf->gate == GATE_FULL) {
            matmul_forward(gate_logit, xa, LAYER(p.wf, l, (size_t)H * C), LAYER(p.bf, l, H), N, C, H);
        } else if (cf->gate != GATE_NONE) {
            for (size_t n = 0; n < N; n++) { memcpy(gate_logit + n * H, LAYER(p.bf, l, H), (size_t)H * sizeof(float)); }
        }
        if (cf->gate != GATE_NONE) { forget_gate_forward(c, gate_logit, doc, B, T, H); }
        AttnPrune pr;
        const float* cg = cf->gate != GATE_NONE ? c : NULL;
        attention_forward(o, LAYER(a.lse, l, BHT), q, k, v, cg, doc, B, T, H, hd, cf->window,
                          fox_prune(m, &pr, q, k, cg, doc, B, T), m->scratch);
        if (cf->output_norm) {
            rmsnorm_forward(o_normed, LAYER(a.rstd_o, l, NH), o, LAYER(p.o_norm, l, C), NH, hd, H, 1e-6f);
        } else {
            memcpy(o_normed, o, NC * sizeof(float));
        }
        if (cf->output_gate) {
            matmul_forward(og_logit, xa8, LAYER(w.wg, l, (size_t)C * C), NULL, N, C, C);
            output_gate_forward(y, o_normed, og_logit, NC);
        } else {
            memcpy(y, o_normed, NC * sizeof(float));
        }
        // y, xm, act and xf feed only their matmuls: rounded in place
        if (q8 && cf->output_norm) { fp8_norm_output(m, y, NC, LAYER(p.o_norm, l, C), (size_t)C, hd); }
        else if (q8) { fp8_delayed(m, y, NC, l, FP8_Y); }
        matmul_forward(LAYER(a.attproj, l, NC), y, LAYER(w.wo, l, (size_t)C * C), NULL, N, C, C);
        add_forward(resid_mid, resid, LAYER(a.attproj, l, NC), NC);
        // MLP
        rmsnorm_forward(xm, LAYER(a.rstd_m, l, N), resid_mid, LAYER(p.mlp_norm, l, C), N, C, 1, 1e-6f);
        if (q8) { fp8_norm_output(m, xm, NC, LAYER(p.mlp_norm, l, C), (size_t)C, C); }
        matmul_forward(gu, xm, LAYER(w.wgu, l, (size_t)2 * I * C), NULL, N, C, 2 * I);
        swiglu_forward(act, gu, N, I);
        if (q8) { fp8_delayed(m, act, N * I, l, FP8_ACT); }
        matmul_forward(LAYER(a.mlpproj, l, NC), act, LAYER(w.wdown, l, (size_t)C * I), NULL, N, I, C);
        add_forward(LAYER(a.resid, l + 1, NC), resid_mid, LAYER(a.mlpproj, l, NC), NC);
    }
    rmsnorm_forward(a.xf, a.rstd_f, LAYER(a.resid, L, NC), p.norm_f, N, C, 1, 1e-6f);
    if (q8 && m->fp8.mode != FP8_MODE_BODY) { fp8_norm_output(m, a.xf, NC, p.norm_f, (size_t)C, C); }
    matmul_forward(m->logits, a.xf, w.lm_head, NULL, N, C, Vp);
    m->mean_loss = -1.0f;
    if (targets != NULL) {
        crossentropy_forward(m->losses, m->logits, targets, N, V, Vp);
        double sum = 0.0;
        for (size_t n = 0; n < N; n++) { sum += m->losses[n]; }
        m->mean_loss = (float)(sum / (double)N);
    }
}

static void fox_zero_grad(FoxModel* m) { memset(m->grads_memory, 0, m->num_parameters * sizeof(float)); }

// Accumulates into the parameter gradients the gradient of loss_scale * mean_loss of the last
// forward (loss_scale = 1 / accumulation steps when accumulating micro-batches).
static void fox_backward(FoxModel* m, float loss_scale) {
    if (m->targets == NULL) { fail("internal: backward needs a forward with targets" BUG_HINT); }
    const FoxConfig* cf = &m->config;
    int B = m->B, T = m->T;
    int L = cf->n_layer, C = cf->n_embd, H = cf->n_head, hd = C / H, I = cf->mlp_hidden;
    size_t N = (size_t)B * T, NC = N * C, NH = N * H, BHT = (size_t)B * H * T;
    int groups_qk = cf->qk_norm_shared ? 1 : H;
    const int* doc = fox_documents(m);
    size_t total = 0;
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) { total += m->act_sizes[i]; }
    memset(m->grad_acts_memory, 0, total * sizeof(float));
    ParameterTensors p = m->params, g = m->grads;
    ActivationTensors a = m->acts, d = m->grad_acts;
    int q8 = m->fp8.on; // as in fox_forward, whose FP8 weights and rounded y, xm, act, xf the matmuls read here
    ParameterTensors w = q8 && !m->fp8.calibrating ? m->fp8.weights : p;
    size_t NVp = N * (size_t)cf->padded_vocab_size;
    float dloss = loss_scale / (float)N;
    crossentropy_backward_inplace(m->logits, m->targets, N, cf->vocab_size, cf->padded_vocab_size, dloss);
    if (q8 && m->fp8.mode != FP8_MODE_BODY) { // |dlogits| <= dloss: a bounded scale, E5M2 in every mode
        fp8_operand(m, m->logits, m->logits, NVp, fp8_scale_exp(dloss, &FP8_E5M2, 0), &FP8_E5M2);
    }
    matmul_backward(d.xf, g.lm_head, NULL, m->logits, a.xf, w.lm_head, N, C, cf->padded_vocab_size);
    rmsnorm_backward(LAYER(d.resid, L, NC), g.norm_f, d.xf, LAYER(a.resid, L, NC), p.norm_f, a.rstd_f, N, C, 1);
    for (int l = L - 1; l >= 0; l--) {
        size_t qk_per = (size_t)m->spec[P_Q_NORM].rows;
        float* xa = LAYER(a.xa, l, NC); float* dxa = LAYER(d.xa, l, NC);
        // MLP
        // the output gradients of the FP8 matmuls (dmlpproj, dgu, dattproj, dqkvg) feed only them: rounded in place
        add_backward(LAYER(d.resid_mid, l, NC), LAYER(d.mlpproj, l, NC), LAYER(d.resid, l + 1, NC), NC);
        if (q8) { fp8_delayed(m, LAYER(d.mlpproj, l, NC), NC, l, FP8_DRES_DOWN); }
        matmul_backward(LAYER(d.act, l, N * I), LAYER(g.wdown, l, (size_t)C * I), NULL, LAYER(d.mlpproj, l, NC),
                        LAYER(a.act, l, N * I), LAYER(w.wdown, l, (size_t)C * I), N, I, C);
        swiglu_backward(LAYER(d.gu, l, N * 2 * I), LAYER(d.act, l, N * I), LAYER(a.gu, l, N * 2 * I), N, I);
        if (q8) { fp8_delayed(m, LAYER(d.gu, l, N * 2 * I), N * 2 * I, l, FP8_DGU); }
        matmul_backward(LAYER(d.xm, l, NC), LAYER(g.wgu, l, (size_t)2 * I * C), NULL, LAYER(d.gu, l, N * 2 * I),
                        LAYER(a.xm, l, NC), LAYER(w.wgu, l, (size_t)2 * I * C), N, C, 2 * I);
        rmsnorm_backward(LAYER(d.resid_mid, l, NC), LAYER(g.mlp_norm, l, C), LAYER(d.xm, l, NC),
                         LAYER(a.resid_mid, l, NC), LAYER(p.mlp_norm, l, C), LAYER(a.rstd_m, l, N), N, C, 1);
        // attention
        add_backward(LAYER(d.resid, l, NC), LAYER(d.attproj, l, NC), LAYER(d.resid_mid, l, NC), NC);
        if (q8) { fp8_delayed(m, LAYER(d.attproj, l, NC), NC, l, FP8_DRES_O); }
        matmul_backward(LAYER(d.y, l, NC), LAYER(g.wo, l, (size_t)C * C), NULL, LAYER(d.attproj, l, NC),
                        LAYER(a.y, l, NC), LAYER(w.wo, l, (size_t)C * C), N, C, C);
        const float* xa8 = q8 ? fp8_attn_input(m, xa, l, N) : xa;
        if (cf->output_gate) {
            output_gate_backward(LAYER(d.o_normed, l, NC), LAYER(d.og_logit, l, NC), LAYER(d.y, l, NC),
                                 LAYER(a.o_normed, l, NC), LAYER(a.og_logit, l, NC), NC);
            if (q8) { fp8_delayed(m, LAYER(d.og_logit, l, NC), NC, l, FP8_DQKVG); }
            matmul_backward(dxa, LAYER(g.wg, l, (size_t)C * C), NULL, LAYER(d.og_logit, l, NC), xa8,
                            LAYER(w.wg, l, (size_t)C * C), N, C, C);
        } else {
            add_backward(LAYER(d.o_normed, l, NC), NULL, LAYER(d.y, l, NC), NC);
        }
        if (cf->output_norm) {
            rmsnorm_backward(LAYER(d.o, l, NC), LAYER(g.o_norm, l, C), LAYER(d.o_normed, l, NC), LAYER(a.o, l, NC),
                             LAYER(p.o_norm, l, C), LAYER(a.rstd_o, l, NH), NH, hd, H);
        } else {
            add_backward(LAYER(d.o, l, NC), NULL, LAYER(d.o_normed, l, NC), NC);
        }
        // the same tiles as the forward: recomputed from the saved q, k, c and document starts (deterministic)
        AttnPrune pr;
        const float* cg = cf->gate != GATE_NONE ? LAYER(a.c, l, BHT) : NULL;
        attention_backward(LAYER(d.q, l, NC), LAYER(d.k, l, NC), LAYER(d.v, l, NC), LAYER(d.c, l, BHT),
                           LAYER(d.o, l, NC), LAYER(a.q, l, NC), LAYER(a.k, l, NC), LAYER(a.v, l, NC),
                           LAYER(a.o, l, NC), LAYER(a.lse, l, BHT), cg, doc, B, T, H, hd, cf->window,
                           fox_prune(m, &pr, LAYER(a.q, l, NC), LAYER(a.k, l, NC), cg, doc, B, T));
        if (cf->gate != GATE_NONE) {
            float* dgl = LAYER(d.gate_logit, l, NH);
            forget_gate_backward(dgl, LAYER(d.c, l, BHT), LAYER(a.gate_logit, l, NH), doc, B, T, H);
            if (cf->gate == GATE_FULL) {
                matmul_backward(dxa, LAYER(g.wf, l, (size_t)H * C), LAYER(g.bf, l, H), dgl, xa,
                                LAYER(p.wf, l, (size_t)H * C), N, C, H);
            } else if (cf->gate == GATE_BIAS_ONLY) {
                float* dbf = LAYER(g.bf, l, H);
                for (size_t n = 0; n < N; n++) {
                    for (int h = 0; h < H; h++) { dbf[h] += dgl[n * H + h]; }
                }
            }
        }
        if (cf->rope) {
            rope_apply(LAYER(d.q_normed, l, NC), LAYER(d.q, l, NC), B, T, H, hd, cf->rope_theta, -1);
            rope_apply(LAYER(d.k_normed, l, NC), LAYER(d.k, l, NC), B, T, H, hd, cf->rope_theta, -1);
        } else {
            add_backward(LAYER(d.q_normed, l, NC), NULL, LAYER(d.q, l, NC), NC);
            add_backward(LAYER(d.k_normed, l, NC), NULL, LAYER(d.k, l, NC), NC);
        }
        if (cf->qk_norm) {
            rmsnorm_backward(LAYER(d.q_raw, l, NC), LAYER(g.q_norm, l, qk_per), LAYER(d.q_normed, l, NC),
                             LAYER(a.q_raw, l, NC), LAYER(p.q_norm, l, qk_per), LAYER(a.rstd_q, l, NH), NH, hd,
                             groups_qk);
            rmsnorm_backward(LAYER(d.k_shifted, l, NC), LAYER(g.k_norm, l, qk_per), LAYER(d.k_normed, l, NC),
                             LAYER(a.k_shifted, l, NC), LAYER(p.k_norm, l, qk_per), LAYER(a.rstd_k, l, NH), NH, hd,
                             groups_qk);
        } else {
            add_backward(LAYER(d.q_raw, l, NC), NULL, LAYER(d.q_normed, l, NC), NC);
            add_backward(LAYER(d.k_shifted, l, NC), NULL, LAYER(d.k_normed, l, NC), NC);
        }
        if (cf->k_shift) {
            kv_shift_backward(LAYER(d.k_raw, l, NC), LAYER(d.k_alpha, l, NH), LAYER(d.k_shifted, l, NC),
                              LAYER(a.k_raw, l, NC), LAYER(a.k_alpha, l, NH), doc, B, T, H, hd);
            matmul_backward(dxa, LAYER(g.wk_shift, l, (size_t)H * C), NULL, LAYER(d.k_alpha, l, NH), xa,
                            LAYER(p.wk_shift, l, (size_t)H * C), N, C, H);
        } else {
            add_backward(LAYER(d.k_raw, l, NC), NULL, LAYER(d.k_shifted, l, NC), NC);
        }
        if (cf->v_shift) {
            kv_shift_backward(LAYER(d.v_raw, l, NC), LAYER(d.v_alpha, l, NH), LAYER(d.v, l, NC),
                              LAYER(a.v_raw, l, NC), LAYER(a.v_alpha, l, NH), doc, B, T, H, hd);
            matmul_backward(dxa, LAYER(g.wv_shift, l, (size_t)H * C), NULL, LAYER(d.v_alpha, l, NH), xa,
                            LAYER(p.wv_shift, l, (size_t)H * C), N, C, H);
        } else {
            add_backward(LAYER(d.v_raw, l, NC), NULL, LAYER(d.v, l, NC), NC);
        }
        if (q8) {
            fp8_delayed(m, LAYER(d.q_raw, l, NC), NC, l, FP8_DQKVG);
            fp8_delayed(m, LAYER(d.k_raw, l, NC), NC, l, FP8_DQKVG);
            fp8_delayed(m, LAYER(d.v_raw, l, NC), NC, l, FP8_DQKVG);
        }
        matmul_backward(dxa, LAYER(g.wq, l, (size_t)C * C), NULL, LAYER(d.q_raw, l, NC), xa8,
                        LAYER(w.wq, l, (size_t)C * C), N, C, C);
        matmul_backward(dxa, LAYER(g.wk, l, (size_t)C * C), NULL, LAYER(d.k_raw, l, NC), xa8,
                        LAYER(w.wk, l, (size_t)C * C), N, C, C);
        matmul_backward(dxa, LAYER(g.wv, l, (size_t)C * C), NULL, LAYER(d.v_raw, l, NC), xa8,
                        LAYER(w.wv, l, (size_t)C * C), N, C, C);
        rmsnorm_backward(LAYER(d.resid, l, NC), LAYER(g.attn_norm, l, C), dxa, LAYER(a.resid, l, NC),
                         LAYER(p.attn_norm, l, C), LAYER(a.rstd_a, l, N), N, C, 1);
    }
    encoder_backward(g.wte, d.resid, m->inputs, N, C);
}

// ----------------------------------------------------------------------------
// FP8 steps (-q): the delayed scales stay fixed for a whole optimizer step; its amax per operand is the max over its
// micro-steps; an updating step pushes them into the histories (a ring of U), from which the next step's scales
// follow. Every function here does nothing without -q.

// the start of a training step's micro-steps: the step's amaxes cleared, fox_forward and fox_backward quantise
static void fp8_step_begin(FoxModel* m) {
    if (m->fp8.mode == FP8_MODE_OFF) { return; }
    memset(m->fp8.amax, 0, (size_t)m->config.n_layer * FP8_SLOTS * sizeof(float));
    m->fp8.on = 1;
}

// whether every amax of the step is finite (NaN and inf would otherwise hide in saturated codes)
static int fp8_amax_finite(const FoxModel* m) {
    if (m->fp8.mode == FP8_MODE_OFF) { return 1; }
    return f32_bits(fp8_amax(m->fp8.amax, (size_t)m->config.n_layer * FP8_SLOTS)) < 0x7F800000u;
}

// the step's amaxes into the histories at the ring's position; the scales follow
static void fp8_push(FoxModel* m) {
    Fp8State* s = &m->fp8;
    size_t U = (size_t)s->history_len;
    for (size_t i = 0; i < (size_t)m->config.n_layer * FP8_SLOTS; i++) { s->history[i * U + s->pos] = s->amax[i]; }
    s->pos = (s->pos + 1) % s->history_len;
    fp8_update_scales(m);
}

// The amaxes of a calibration's pass (in m's Fp8State) fill the histories, if finite; else the non-finite amax stays,
// and the step guard stops or skips this step (and the next step calibrates again)
static void fp8_calibration_done(FoxModel* m, long step) {
    Fp8State* s = &m->fp8;
    if (!fp8_amax_finite(m)) { return; }
    memset(s->history, 0, (size_t)m->config.n_layer * FP8_SLOTS * s->history_len * sizeof(float));
    s->pos = 0;
    fp8_push(m);
    s->calibrated = 1;
    printf("fp8: scales calibrated on the first micro-batch of step %ld\n", step);
    memset(s->amax, 0, (size_t)m->config.n_layer * FP8_SLOTS * sizeof(float));
}

// The first micro-step of a run without histories (a fresh run, or a resume from a state without them): a forward and
// backward without rounding, thrown away (the gradients zeroed), whose amaxes alone fill the histories. Only finite
// amaxes calibrate; else the next step tries again. Call before the step's first micro-step, with its batch.
static void fp8_calibrate(FoxModel* m, const int* inputs, const int* targets, int B, int T, float loss_scale,
                          long step) {
    Fp8State* s = &m->fp8;
    if (s->mode == FP8_MODE_OFF || s->calibrated) { return; }
    s->calibrating = 1;
    fox_forward(m, inputs, targets, B, T);
    fox_backward(m, loss_scale);
    s->calibrating = 0;
    fox_zero_grad(m);
    fp8_calibration_done(m, step);
}

// Names the first FP8 operand whose amax is not finite, for the step guard's message; 0 if none.
static int fp8_nonfinite_name(const FoxModel* m, char* out, size_t n) {
    for (size_t i = 0; m->fp8.mode != FP8_MODE_OFF && i < (size_t)m->config.n_layer * FP8_SLOTS; i++) {
        if (isfinite(m->fp8.amax[i])) { continue; }
        snprintf(out, n, "the FP8 operand %s of layer %zu has amax %g", FP8_SLOT_NAMES[i % FP8_SLOTS], i / FP8_SLOTS,
                 m->fp8.amax[i]);
        return 1;
    }
    return 0;
}

// The end of a training step: with an update, its amaxes go into the histories (a skipped step leaves them) and each
// operand that saturated (its amax beyond what its scale held) is reported; the next step adapts.
static void fp8_step_end(FoxModel* m, long step, int updated) {
    Fp8State* s = &m->fp8;
    if (s->mode == FP8_MODE_OFF) { return; }
    s->on = 0;
    if (!updated) { return; }
    for (size_t i = 0; i < (size_t)m->config.n_layer * FP8_SLOTS; i++) {
        const Fp8Format* f = fp8_slot_format(s->mode, (int)(i % FP8_SLOTS));
        float held = fp8_decode((uint8_t)f->max_code, f) * fp8_pow2(-s->k[i]);
        if (s->amax[i] > held) {
            printf("fp8: %s of layer %zu saturated at step %ld (amax %g, its scale holds %g)\n",
                   FP8_SLOT_NAMES[i % FP8_SLOTS], i / FP8_SLOTS, step, s->amax[i], held);
        }
    }
    fp8_push(m);
}

// ----------------------------------------------------------------------------
// optimiser: AdamW with decay groups, global-norm clipping, token-driven schedule

typedef struct {
    float lr, weight_decay, beta1, beta2, eps, grad_clip;
} AdamWConfig;

// Sum of squares in double over a fixed split into blocks, added in a fixed order: the result
// is the same bit for bit for any thread count (an OpenMP reduction adds the threads' partial
// sums in the order they finish).
#define SUM_BLOCKS 64
static double sum_squares(const float* x, size_t n) {
    double partial[SUM_BLOCKS];
    #pragma omp parallel for schedule(static) if(parallel_pays(n))
    for (int b = 0; b < SUM_BLOCKS; b++) {
        size_t i0 = n * (size_t)b / SUM_BLOCKS, i1 = n * (size_t)(b + 1) / SUM_BLOCKS;
        double s = 0.0;
        for (size_t i = i0; i < i1; i++) { s += (double)x[i] * x[i]; }
        partial[b] = s;
    }
    double sum = 0.0;
    for (int b = 0; b < SUM_BLOCKS; b++) { sum += partial[b]; }
    return sum;
}

static double fox_grad_norm(FoxModel* m) {
    double sum = 0.0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        if (!m->spec[t].trainable) { continue; }
        sum += sum_squares(param_tensor(&m->grads, t), param_numel(&m->spec[t], m->config.n_layer));
    }
    return sqrt(sum);
}

// scales the gradients so that their global norm is at most max_norm (torch's rule)
static void fox_clip_grads(FoxModel* m, double norm, float max_norm) {
    double coef = max_norm / (norm + 1e-6);
    if (coef >= 1.0) { return; }
    float s = (float)coef;
    #pragma omp parallel for if(parallel_pays(m->num_parameters))
    for (size_t i = 0; i < m->num_parameters; i++) { m->grads_memory[i] *= s; }
}

// one AdamW step; step is 1-based (bias correction)
static void fox_update(FoxModel* m, const AdamWConfig* o, float lr, int step) {
    if (m->m_memory == NULL) {
        m->m_memory = (float*)calloc_check(m->num_parameters, sizeof(float), "AdamW m");
        m->v_memory = (float*)calloc_check(m->num_parameters, sizeof(float), "AdamW v");
    }
    float c1 = 1.0f - powf(o->beta1, (float)step), c2 = 1.0f - powf(o->beta2, (float)step);
    size_t offset = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        size_t n = param_numel(&m->spec[t], m->config.n_layer);
        float wd = m->spec[t].decay ? o->weight_decay : 0.0f;
        if (m->spec[t].trainable) {
            float* p = m->params_memory + offset;
            const float* gr = m->grads_memory + offset;
            float* mm = m->m_memory + offset;
            float* vv = m->v_memory + offset;
            #pragma omp parallel for if(parallel_pays(n))
            for (size_t i = 0; i < n; i++) {
                mm[i] = o->beta1 * mm[i] + (1.0f - o->beta1) * gr[i];
                vv[i] = o->beta2 * vv[i] + (1.0f - o->beta2) * gr[i] * gr[i];
                float mhat = mm[i] / c1, vhat = vv[i] / c2;
                p[i] -= lr * (mhat / (sqrtf(vhat) + o->eps) + wd * p[i]);
            }
        }
        offset += n;
    }
}

enum { SCHEDULE_COSINE, SCHEDULE_LINEAR, SCHEDULE_CONSTANT };
static const char* SCHEDULE_NAMES[] = {"cosine", "linear", "constant"};

typedef struct {
    int type;
    double peak_lr;
    double warmup_tokens;
    double total_tokens;
    double tokens_per_step;
} LRSchedule;

// Learning rate of a step that starts with `before` tokens seen (and trains on tokens_per_step):
// linear warmup from 0 over the first warmup_tokens (reaching the peak with the step that
// completes them), then decay by the tokens seen before the step, to 0 at total_tokens.
static double lr_at_tokens(const LRSchedule* s, double before) {
    double after = before + s->tokens_per_step;
    if (before < s->warmup_tokens) { return s->peak_lr * fmin(1.0, after / s->warmup_tokens); }
    if (s->type == SCHEDULE_CONSTANT) { return s->peak_lr; }
    double span = s->total_tokens - s->warmup_tokens;
    double progress = span > 0 ? fmin(1.0, (before - s->warmup_tokens) / span) : 1.0;
    if (s->type == SCHEDULE_LINEAR) { return s->peak_lr * (1.0 - progress); }
    return s->peak_lr * 0.5 * (1.0 + cos(M_PI * progress));
}

// ----------------------------------------------------------------------------
// numerical guards: each step's loss and gradient norm are checked before the update. Plain
// functions of host-side numbers, so that train_fox.cu calls them as the CPU twin does.

enum { NONFINITE_STOP, NONFINITE_SKIP };
static const char* NONFINITE_NAMES[] = {"stop", "skip"};
enum { STEP_UPDATE, STEP_SKIP, STEP_STOP };

// llm.c's outlier test: a value's z-score against the last SPIKE_WINDOW values
#define SPIKE_WINDOW 128
typedef struct {
    double values[SPIKE_WINDOW];
    int count, next;
} SpikeWindow;

// z-score of x against the window, 0 until the window is full or when it has no spread
static double spike_zscore(const SpikeWindow* w, double x) {
    if (w->count < SPIKE_WINDOW) { return 0.0; }
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < SPIKE_WINDOW; i++) { mean += w->values[i]; }
    mean /= SPIKE_WINDOW;
    for (int i = 0; i < SPIKE_WINDOW; i++) { var += (w->values[i] - mean) * (w->values[i] - mean); }
    double sd = sqrt(var / SPIKE_WINDOW);
    return sd > 0.0 ? (x - mean) / sd : 0.0;
}

static void spike_push(SpikeWindow* w, double x) {
    w->values[w->next] = x;
    w->next = (w->next + 1) % SPIKE_WINDOW;
    if (w->count < SPIKE_WINDOW) { w->count++; }
}

typedef struct {
    int on_nonfinite;   // NONFINITE_STOP or NONFINITE_SKIP (-G)
    double spike_z;     // skip a step whose loss or grad norm has a z-score above this (-Z); 0 = off
    SpikeWindow loss_window, norm_window;
    long skipped;       // steps skipped so far
} StepGuard;

static void step_guard_init(StepGuard* g, int on_nonfinite, double spike_z) {
    memset(g, 0, sizeof(*g));
    g->on_nonfinite = on_nonfinite;
    g->spike_z = spike_z;
}

// Decides the fate of a step from its loss and global grad norm: STEP_UPDATE, STEP_SKIP (the
// optimizer must not move; counted in g->skipped) or STEP_STOP; why says why for the last two.
// A non-finite norm means a non-finite gradient: name it with nonfinite_grad_name. Every finite
// value enters its window, spikes included, as in llm.c, so that a lasting shift of the loss
// level is skipped for a while and then accepted.
static int step_guard_check(StepGuard* g, double loss, double norm, char* why, size_t n) {
    if (!isfinite(loss) || !isfinite(norm)) {
        snprintf(why, n, "%s is not finite (loss %g, grad norm %g)", isfinite(loss) ? "the gradient" : "the loss",
                 loss, norm);
        if (g->on_nonfinite == NONFINITE_STOP) { return STEP_STOP; }
        g->skipped++;
        return STEP_SKIP;
    }
    double z_loss = spike_zscore(&g->loss_window, loss), z_norm = spike_zscore(&g->norm_window, norm);
    spike_push(&g->loss_window, loss);
    spike_push(&g->norm_window, norm);
    if (g->spike_z > 0.0 && (z_loss > g->spike_z || z_norm > g->spike_z)) {
        snprintf(why, n, "%s spike (loss %g z-score %.1f, grad norm %g z-score %.1f, limit %g)",
                 z_loss > g->spike_z ? "loss" : "grad norm", loss, z_loss, norm, z_norm, g->spike_z);
        g->skipped++;
        return STEP_SKIP;
    }
    return STEP_UPDATE;
}

// Names the first tensor slice of the flat gradient buffer grads (host memory, laid out as
// fox_build lays out the parameters) that holds a NaN or inf. Returns 0 if every value is finite.
static int nonfinite_grad_name(const FoxConfig* c, const float* grads, char* out, size_t n) {
    ParamSpec spec[NUM_PARAM_TENSORS];
    param_table(c, spec);
    size_t offset = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        size_t per = param_slice_numel(&spec[t]);
        int slices = spec[t].per_layer ? c->n_layer : 1;
        for (int l = 0; l < slices; l++, offset += per) {
            size_t bad = per;
            for (size_t i = 0; i < per && bad == per; i++) { if (!isfinite(grads[offset + i])) { bad = i; } }
            if (bad == per) { continue; }
            char hf[128];
            param_hf_name(c, t, l, hf, sizeof(hf));
            snprintf(out, n, "the gradient of %s (%s) has %g at element %zu", hf, spec[t].name, grads[offset + bad],
                     bad);
            return 1;
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// data: llm.c token shards (256 int32 header: magic 20240520, version 1, token count; then
// uint16 tokens). A sample is a window of T+1 tokens at a multiple of T; each shard's samples
// are split into batches of B * world samples and rank r takes the r-th block of B of each.

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES 1024
#define SHARD_CHECK_CHUNK ((size_t)1 << 20) // tokens the start-up check of a shard reads at a time (2 MiB)

// seconds on a monotonic clock, for timings
static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    int B, T, rank, world;
    int shuffle;   // shuffle shard order each epoch and sample order within each shard
    int roll;      // rotate each sample's window by a random offset (removes position bias)
    uint64_t seed;
    int vocab_size;
    int num_shards;
    char** paths;
    size_t* shard_tokens;
    double check_seconds; // the start-up check of every token id (check_shard_tokens)
    // position (saved in the optimiser state, so a resumed run sees the same batches)
    int epoch, shard_pos, batch_pos;
    // derived from the position
    int* shard_order;
    int* sample_order;
    int current_batches;
    FILE* file;
    uint16_t* window;
    int* inputs;  // (B, T)
    int* targets; // (B, T)
} DataLoader;

static size_t shard_samples(const DataLoader* d, int shard) {
    return d->shard_tokens[shard] > 0 ? (d->shard_tokens[shard] - 1) / (size_t)d->T : 0;
}

static int shard_batches(const DataLoader* d, int shard) {
    return (int)(shard_samples(d, shard) / ((size_t)d->B * d->world));
}

static size_t read_shard_header(const char* path) {
    FILE* f = fopen_check(path, "rb");
    int header[256];
    long size = file_size_check(f, path);
    if (size < SHARD_HEADER_BYTES) {
        fail("'%s' is too small to be a token shard (%ld bytes)\n"
             "HINT: shards are written by data/tokenize or llm.c's scripts", path, size);
    }
    fread_check(header, sizeof(int), 256, f, path);
    fclose(f);
    if (header[0] != SHARD_MAGIC) {
        fail("'%s' has magic %d, not %d: not a token shard\n"
             "HINT: shards are written by data/tokenize or llm.c's scripts", path, header[0], SHARD_MAGIC);
    }
    if (header[1] != SHARD_VERSION) {
        fail("'%s' has shard version %d, this build reads version %d (uint16 tokens)\nHINT: re-tokenize the data",
             path, header[1], SHARD_VERSION);
    }
    if (header[2] < 0 || (long)SHARD_HEADER_BYTES + 2L * header[2] != size) {
        fail("'%s' says it holds %d tokens but its size is %ld bytes (expected %ld)\n"
             "HINT: the shard is truncated or damaged; regenerate it",
             path, header[2], size, (long)SHARD_HEADER_BYTES + 2L * header[2]);
    }
    return (size_t)header[2];
}

// the largest of n token ids: a loop the compiler vectorises
static uint16_t max_token(const uint16_t* tokens, size_t n) {
    uint16_t m = 0;
    for (size_t i = 0; i < n; i++) { m = tokens[i] > m ? tokens[i] : m; }
    return m;
}

// Checks every token id of the shard at path (n tokens after its header) against the vocabulary,
// streamed SHARD_CHECK_CHUNK tokens at a time through buf: the first id >= vocab_size stops the run
// at its start, naming the file, the token's index and its value (not at the step that draws it).
static void check_shard_tokens(const char* path, size_t n, int vocab_size, uint16_t* buf) {
    if (vocab_size > UINT16_MAX) { return; } // every uint16 id fits
    FILE* f = fopen_check(path, "rb");
    if (fseek(f, SHARD_HEADER_BYTES, SEEK_SET) != 0) { fail("could not seek in '%s'" SEEK_HINT, path); }
    for (size_t done = 0; done < n; done += SHARD_CHECK_CHUNK) {
        size_t count = n - done < SHARD_CHECK_CHUNK ? n - done : SHARD_CHECK_CHUNK;
        fread_check(buf, sizeof(uint16_t), count, f, path);
        if (max_token(buf, count) < vocab_size) { continue; }
        size_t i = 0;
        while (buf[i] < vocab_size) { i++; }
        fclose(f);
        fail("'%s' holds token id %d at token %zu (byte offset %zu), outside the model's vocabulary of %d\n"
             "HINT: the shard was tokenized for another vocabulary or is damaged: regenerate it (data/tokenize), "
             "or leave it out of -i / -j", path, buf[i], done + i, SHARD_HEADER_BYTES + (done + i) * sizeof(uint16_t),
             vocab_size);
    }
    fclose(f);
}

static void dataloader_load_shard(DataLoader* d) {
    int shard = d->shard_order[d->shard_pos];
    if (d->file != NULL) { fclose(d->file); }
    d->file = fopen_check(d->paths[shard], "rb");
    size_t n = shard_samples(d, shard);
    free(d->sample_order);
    d->sample_order = (int*)malloc_check((n > 0 ? n : 1) * sizeof(int), "sample order");
    uint64_t s = d->seed ^ (((uint64_t)d->epoch + 1) * 0xD1B54A32D192ED03ull)
                 ^ ((uint64_t)(shard + 1) * 0x8CB92BA72F3D8DD7ull);
    if (d->shuffle) { shuffle_indices(d->sample_order, (int)n, s); }
    else { for (size_t i = 0; i < n; i++) { d->sample_order[i] = (int)i; } }
    d->current_batches = shard_batches(d, shard);
}

static void dataloader_set_position(DataLoader* d, int epoch, int shard_pos, int batch_pos) {
    // a position read from a state file may belong to other shards
    if (epoch < 0 || shard_pos < 0 || shard_pos >= d->num_shards || batch_pos < 0) {
        fail("data position (epoch %d, shard %d, batch %d) is outside the %d shard(s)\n"
             "HINT: resume with the -i shards, -b, -t and processes of the run that saved it",
             epoch, shard_pos, batch_pos, d->num_shards);
    }
    d->epoch = epoch;
    d->shard_pos = shard_pos;
    d->batch_pos = batch_pos;
    if (d->shuffle) { shuffle_indices(d->shard_order, d->num_shards, d->seed + (uint64_t)epoch * 7919u); }
    else { for (int i = 0; i < d->num_shards; i++) { d->shard_order[i] = i; } }
    dataloader_load_shard(d);
    if (batch_pos > d->current_batches) {
        fail("data position batch %d is past the %d batches of shard %d\n"
             "HINT: resume with the -i shards, -b, -t and processes of the run that saved it",
             batch_pos, d->current_batches, shard_pos);
    }
}

static void dataloader_init(DataLoader* d, const char* pattern, int B, int T, int rank, int world,
                            int shuffle, int roll, uint64_t seed, int vocab_size) {
    memset(d, 0, sizeof(*d));
    d->B = B; d->T = T; d->rank = rank; d->world = world;
    d->shuffle = shuffle; d->roll = roll; d->seed = seed; d->vocab_size = vocab_size;
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc != 0 || g.gl_pathc == 0) {
        fail("no token shards match '%s'\n"
             "HINT: run 'make data' for the default corpus, or pass -i / -j with a pattern of existing shards",
             pattern);
    }
    d->num_shards = (int)g.gl_pathc;
    d->paths = (char**)malloc_check(g.gl_pathc * sizeof(char*), "shard paths");
    d->shard_tokens = (size_t*)malloc_check(g.gl_pathc * sizeof(size_t), "shard sizes");
    for (size_t i = 0; i < g.gl_pathc; i++) {
        d->paths[i] = strdup(g.gl_pathv[i]);
        if (d->paths[i] == NULL) { fail("out of memory for the shard paths\nHINT: match fewer shards with -i"); }
    }
    globfree(&g); // before any header can fail
    size_t batches = 0;
    for (int i = 0; i < d->num_shards; i++) {
        d->shard_tokens[i] = read_shard_header(d->paths[i]);
        batches += (size_t)shard_batches(d, i);
    }
    double t0 = now_seconds();
    uint16_t* chunk = (uint16_t*)malloc_check(SHARD_CHECK_CHUNK * sizeof(uint16_t), "the token id check");
    for (int i = 0; i < d->num_shards; i++) { check_shard_tokens(d->paths[i], d->shard_tokens[i], vocab_size, chunk); }
    free(chunk);
    d->check_seconds = now_seconds() - t0;
    if (batches == 0) {
        fail("the shards of '%s' hold too few tokens for one batch of %d x %d tokens on %d process(es)\n"
             "HINT: use a smaller -b or -t",
             pattern, B, T + 1, world);
    }
    d->shard_order = (int*)malloc_check((size_t)d->num_shards * sizeof(int), "shard order");
    d->window = (uint16_t*)malloc_check((size_t)(T + 1) * sizeof(uint16_t), "token window");
    d->inputs = (int*)malloc_check((size_t)B * T * sizeof(int), "inputs");
    d->targets = (int*)malloc_check((size_t)B * T * sizeof(int), "targets");
    dataloader_set_position(d, 0, 0, 0);
}

// the data line of a run's start: what = "train" or "validation"; the shards, their tokens and the
// time the check of their ids took
static void dataloader_report(const DataLoader* d, const char* what) {
    size_t tokens = 0;
    for (int i = 0; i < d->num_shards; i++) { tokens += d->shard_tokens[i]; }
    printf("%s data: %d shard(s), %zu tokens, every id < %d (checked in %.3f s)\n", what, d->num_shards, tokens,
           d->vocab_size, d->check_seconds);
}

static size_t dataloader_total_batches(const DataLoader* d) {
    size_t n = 0;
    for (int i = 0; i < d->num_shards; i++) { n += (size_t)shard_batches(d, i); }
    return n;
}

// moves to the next shard with at least one batch, starting a new epoch after the last one
static void dataloader_advance_shard(DataLoader* d) {
    do {
        if (d->shard_pos + 1 < d->num_shards) { dataloader_set_position(d, d->epoch, d->shard_pos + 1, 0); }
        else { dataloader_set_position(d, d->epoch + 1, 0, 0); }
    } while (d->current_batches == 0);
}

static void dataloader_next_batch(DataLoader* d) {
    if (d->batch_pos >= d->current_batches) { dataloader_advance_shard(d); }
    int shard = d->shard_order[d->shard_pos];
    const char* path = d->paths[shard];
    int T = d->T;
    for (int b = 0; b < d->B; b++) {
        size_t slot = (size_t)d->batch_pos * d->B * d->world + (size_t)d->rank * d->B + b;
        size_t sample = (size_t)d->sample_order[slot];
        long offset = SHARD_HEADER_BYTES + (long)(sample * T * sizeof(uint16_t));
        if (fseek(d->file, offset, SEEK_SET) != 0) { fail("could not seek in '%s'" SEEK_HINT, path); }
        fread_check(d->window, sizeof(uint16_t), (size_t)T + 1, d->file, path);
        int shift = 0;
        if (d->roll) {
            uint64_t s = d->seed ^ (sample * 0x9E3779B97F4A7C15ull) ^ (((uint64_t)d->epoch + 1) << 40)
                         ^ (uint64_t)shard;
            shift = (int)(rng_next(&s) % (uint64_t)(T + 1));
        }
        for (int t = 0; t <= T; t++) {
            int tok = d->window[(t + shift) % (T + 1)];
            if (tok >= d->vocab_size) { // every id was checked at the start (check_shard_tokens)
                fail("'%s' holds token %d at sample %zu, outside the model's vocabulary of %d, but did not at the "
                     "start of the run" SEEK_HINT, path, tok, sample, d->vocab_size);
            }
            if (t < T) { d->inputs[b * T + t] = tok; }
            if (t > 0) { d->targets[b * T + t - 1] = tok; }
        }
    }
    d->batch_pos++;
}

// Identity of the training shards for a resume: FNV-1a over their count, file names (not
// directories: the data may move) and token counts, in glob order.
static uint64_t shards_identity(const DataLoader* d) {
    uint64_t h = 0xcbf29ce484222325ull;
    const uint64_t prime = 0x100000001b3ull;
    uint64_t count = (uint64_t)d->num_shards;
    for (size_t i = 0; i < sizeof(count); i++) { h = (h ^ ((count >> (8 * i)) & 0xff)) * prime; }
    for (int k = 0; k < d->num_shards; k++) {
        const char* name = strrchr(d->paths[k], '/') != NULL ? strrchr(d->paths[k], '/') + 1 : d->paths[k];
        for (const char* c = name; ; c++) { h = (h ^ (unsigned char)*c) * prime; if (*c == '\0') { break; } }
        uint64_t n = (uint64_t)d->shard_tokens[k];
        for (size_t i = 0; i < sizeof(n); i++) { h = (h ^ ((n >> (8 * i)) & 0xff)) * prime; }
    }
    return h;
}

static void dataloader_free(DataLoader* d) {
    for (int i = 0; i < d->num_shards; i++) { free(d->paths[i]); }
    free(d->paths); free(d->shard_tokens); free(d->shard_order); free(d->sample_order);
    free(d->window); free(d->inputs); free(d->targets);
    if (d->file != NULL) { fclose(d->file); }
    memset(d, 0, sizeof(*d));
}

// ----------------------------------------------------------------------------
// decode table (llm.c's tokenizer format): 256 uint32 header (magic 20240328, version 2,
// vocab size, EOT id), then per token a length byte and the bytes

typedef struct {
    int vocab_size;
    int eot;
    char** tokens; // NUL-terminated byte strings
} Tokenizer;

static int tokenizer_init(Tokenizer* tk, const char* path) {
    memset(tk, 0, sizeof(*tk));
    FILE* f = fopen(path, "rb");
    if (f == NULL) { return 0; }
    uint32_t header[256];
    fread_check(header, sizeof(uint32_t), 256, f, path);
    if (header[0] != 20240328 || header[1] != 2 || header[2] == 0 || header[2] > 65536 || header[3] >= header[2]) {
        fail("'%s' is not a version-2 decode table (magic %u, version %u, vocab %u, eot %u)\n"
             "HINT: run 'make data' to write it",
             path, header[0], header[1], header[2], header[3]);
    }
    tk->vocab_size = (int)header[2];
    tk->eot = (int)header[3];
    tk->tokens = (char**)malloc_check((size_t)tk->vocab_size * sizeof(char*), "decode table");
    for (int i = 0; i < tk->vocab_size; i++) {
        unsigned char len;
        fread_check(&len, 1, 1, f, path);
        if (len == 0) {
            fail("'%s': token %d has length 0\nHINT: the decode table is damaged; run 'make data'", path, i);
        }
        tk->tokens[i] = (char*)malloc_check((size_t)len + 1, "token");
        fread_check(tk->tokens[i], 1, len, f, path);
        tk->tokens[i][len] = '\0';
    }
    if (fgetc(f) != EOF) {
        fail("'%s' has bytes after the last token\nHINT: the decode table is damaged; run 'make data'", path);
    }
    fclose(f);
    return 1;
}

static void tokenizer_free(Tokenizer* tk) {
    for (int i = 0; i < tk->vocab_size && tk->tokens != NULL; i++) { free(tk->tokens[i]); }
    free(tk->tokens);
    memset(tk, 0, sizeof(*tk));
}

// prints a token, skipping lone control bytes that would garble the terminal
static void tokenizer_print(const Tokenizer* tk, int token) {
    if (token < 0 || token >= tk->vocab_size) { return; }
    const char* s = tk->tokens[token];
    if (s[1] == '\0' && !isprint((unsigned char)s[0]) && !isspace((unsigned char)s[0]) && (unsigned char)s[0] < 128) {
        return;
    }
    fputs(s, stdout);
}

// ----------------------------------------------------------------------------
// checkpoints: a model file (header with the whole configuration, then fp32 parameters) and
// an optimiser-state file (step, data position, what the position and the schedule depend on,
// the optimiser's and the guards' settings, AdamW moments, with -q the FP8 amax histories). Each file
// ends with the XXH64 checksum of all its bytes before it, checked on every load: a changed byte anywhere is found.

#define MODEL_MAGIC 20261101
#define MODEL_VERSION 2 // 2: the checksum at the end
#define STATE_MAGIC 20261102
#define STATE_VERSION 4 // 2: T, -R, seed, the shards' identity, -d, the warmup and the tokens seen;
                        // 3: the checksum, -l -k -c -a, the schedule's end, -A -L -G -Z, -f; 4: -q, FP8 histories
#define HEADER_INTS 256

// XXH64 (seed 0), streamed: xxHash's published 64-bit algorithm, four lanes over 32-byte stripes, so it
// runs near memory speed. Little-endian hosts, as the files' ints and floats are.
#define XXH_P1 0x9E3779B185EBCA87ull
#define XXH_P2 0xC2B2AE3D27D4EB4Full
#define XXH_P3 0x165667B19E3779F9ull
#define XXH_P4 0x85EBCA77C2B2AE63ull
#define XXH_P5 0x27D4EB2F165667C5ull

typedef struct {
    uint64_t lane[4];
    uint64_t total;           // bytes so far
    unsigned char tail[32];   // the bytes of an unfinished stripe
    size_t tail_len;
} Checksum;

static uint64_t xxh_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t xxh_read64(const unsigned char* p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint64_t xxh_round(uint64_t acc, uint64_t input) { return xxh_rotl(acc + input * XXH_P2, 31) * XXH_P1; }
static uint64_t xxh_merge(uint64_t h, uint64_t lane) { return (h ^ xxh_round(0, lane)) * XXH_P1 + XXH_P4; }

static void checksum_init(Checksum* c) {
    memset(c, 0, sizeof(*c));
    c->lane[0] = XXH_P1 + XXH_P2; c->lane[1] = XXH_P2; c->lane[2] = 0; c->lane[3] = 0 - XXH_P1;
}

// whole stripes: n is a multiple of 32
static void checksum_stripes(Checksum* c, const unsigned char* p, size_t n) {
    uint64_t l0 = c->lane[0], l1 = c->lane[1], l2 = c->lane[2], l3 = c->lane[3];
    for (size_t i = 0; i < n; i += 32) {
        l0 = xxh_round(l0, xxh_read64(p + i));
        l1 = xxh_round(l1, xxh_read64(p + i + 8));
        l2 = xxh_round(l2, xxh_read64(p + i + 16));
        l3 = xxh_round(l3, xxh_read64(p + i + 24));
    }
    c->lane[0] = l0; c->lane[1] = l1; c->lane[2] = l2; c->lane[3] = l3;
}

static void checksum_update(Checksum* c, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    c->total += n;
    if (c->tail_len > 0) {
        size_t take = 32 - c->tail_len < n ? 32 - c->tail_len : n;
        memcpy(c->tail + c->tail_len, p, take);
        c->tail_len += take; p += take; n -= take;
        if (c->tail_len < 32) { return; }
        checksum_stripes(c, c->tail, 32);
        c->tail_len = 0;
    }
    size_t whole = n & ~(size_t)31;
    checksum_stripes(c, p, whole);
    memcpy(c->tail, p + whole, n - whole);
    c->tail_len = n - whole;
}

static uint64_t checksum_digest(const Checksum* c) {
    const uint64_t* l = c->lane;
    uint64_t h = XXH_P5; // the seed (0) plus P5, for inputs shorter than a stripe
    if (c->total >= 32) {
        h = xxh_rotl(l[0], 1) + xxh_rotl(l[1], 7) + xxh_rotl(l[2], 12) + xxh_rotl(l[3], 18);
        for (int i = 0; i < 4; i++) { h = xxh_merge(h, l[i]); }
    }
    h += c->total;
    const unsigned char* p = c->tail;
    size_t n = c->tail_len;
    for (; n >= 8; p += 8, n -= 8) { h = xxh_rotl(h ^ xxh_round(0, xxh_read64(p)), 27) * XXH_P1 + XXH_P4; }
    if (n >= 4) {
        uint32_t k;
        memcpy(&k, p, 4);
        h = xxh_rotl(h ^ (uint64_t)k * XXH_P1, 23) * XXH_P2 + XXH_P3;
        p += 4; n -= 4;
    }
    for (; n > 0; p++, n--) { h = xxh_rotl(h ^ (uint64_t)*p * XXH_P5, 11) * XXH_P1; }
    h ^= h >> 33; h *= XXH_P2; h ^= h >> 29; h *= XXH_P3; h ^= h >> 32;
    return h;
}

// Why a checkpoint file cannot be read: the message, its HINT, and whether the file is damaged (then a
// resume falls back to an older checkpoint) rather than only not for this build (then it stops).
typedef struct {
    char why[768];
    const char* hint;
    int damaged;
} FileError;

static int file_error(FileError* e, int damaged, const char* hint, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->why, sizeof(e->why), fmt, ap);
    va_end(ap);
    e->hint = hint;
    e->damaged = damaged;
    return -1;
}

static void fail_file(const FileError* e) { fail("%s\nHINT: %s", e->why, e->hint); }

#define DAMAGED_HINT "the file is damaged; resume from another checkpoint or restore it from a copy"

// a checkpoint file opened and its header read, with the file's size; NULL (e set) when it cannot be
static FILE* open_checkpoint(const char* path, int* header, long* size, const char* kind, FileError* e) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        file_error(e, 1, "check the path and its permissions", "could not open '%s': %s", path, strerror(errno));
        return NULL;
    }
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) { n = ftell(f); }
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        file_error(e, 1, "the file must be a regular file", "could not seek in '%s'", path);
    } else if (n < (long)(HEADER_INTS * sizeof(int))) {
        file_error(e, 1, "pass a file written by train_fox", "'%s' is too small to be a train_fox %s file", path,
                   kind);
    } else if (fread(header, sizeof(int), HEADER_INTS, f) != HEADER_INTS) {
        file_error(e, 1, DAMAGED_HINT, "could not read the header of '%s'", path);
    } else {
        *size = n;
        return f;
    }
    fclose(f);
    return NULL;
}

// whether a checkpoint file of `size` bytes ends with the XXH64 of all its bytes before it: tells a file of another
// version or model (intact: not for this build) from one whose header a damaged byte changed
static int whole_file_intact(FILE* f, long size) {
    if (size < 8 || fseek(f, 0, SEEK_SET) != 0) { return 0; }
    Checksum c;
    checksum_init(&c);
    unsigned char buf[1 << 16];
    for (long left = size - 8; left > 0;) {
        size_t take = left < (long)sizeof(buf) ? (size_t)left : sizeof(buf);
        if (fread(buf, 1, take, f) != take) { return 0; }
        checksum_update(&c, buf, take);
        left -= (long)take;
    }
    uint64_t stored;
    return fread(&stored, sizeof(stored), 1, f) == 1 && stored == checksum_digest(&c);
}

// a header field that says "not for this build" (a version, a parameter count): so when the file is intact, else
// the field itself is damaged (then -y 1 goes on to an older checkpoint)
static int not_for_this_build(FileError* e, FILE* f, long size, const char* path, const char* hint, const char* why) {
    if (whole_file_intact(f, size)) { return file_error(e, 0, hint, "'%s' %s", path, why); }
    return file_error(e, 1, DAMAGED_HINT, "'%s' %s, and fails its checksum: the header is damaged", path, why);
}

// reads the rest of a checkpoint (`sizes[i]` bytes into each of `parts`), then the checksum stored after them, and
// compares it with the header's and the parts' (unless the file's version has none: has_checksum 0)
static int read_checked(FILE* f, const char* path, const int* header, void* const* parts, const size_t* sizes,
                        int num_parts, int has_checksum, FileError* e) {
    Checksum c;
    checksum_init(&c);
    checksum_update(&c, header, HEADER_INTS * sizeof(int));
    for (int i = 0; i < num_parts; i++) {
        if (fread(parts[i], 1, sizes[i], f) != sizes[i]) {
            return file_error(e, 1, DAMAGED_HINT, "could not read '%s'", path);
        }
        checksum_update(&c, parts[i], sizes[i]);
    }
    if (!has_checksum) { return 0; }
    uint64_t stored;
    if (fread(&stored, sizeof(stored), 1, f) != 1) {
        return file_error(e, 1, DAMAGED_HINT, "could not read the checksum of '%s'", path);
    }
    uint64_t computed = checksum_digest(&c);
    if (stored != computed && !TEST_HOOK(ignore_checksums, 0)) {
        return file_error(e, 1, DAMAGED_HINT, "'%s' fails its checksum (stored %016llx, its bytes give %016llx): "
                          "it changed after train_fox wrote it", path, (unsigned long long)stored,
                          (unsigned long long)computed);
    }
    return 0;
}

// the size of a checkpoint file: the header, `payload` bytes, and the checksum when the file's version has one
static size_t checkpoint_file_bytes(size_t payload, int has_checksum) {
    return HEADER_INTS * sizeof(int) + payload + (has_checksum ? sizeof(uint64_t) : 0);
}

static void float_to_header(int* slot, float v) { memcpy(slot, &v, sizeof(float)); }
static float float_from_header(const int* slot) { float v; memcpy(&v, slot, sizeof(float)); return v; }

static void config_to_header(const FoxConfig* c, int* h) {
    int ints[] = {c->n_layer, c->n_embd, c->n_head, c->vocab_size, c->padded_vocab_size,
                  c->mlp_hidden, c->block, c->gate, c->k_shift, c->v_shift, c->qk_norm,
                  c->qk_norm_shared, c->output_gate, c->output_norm, c->rope, c->window};
    memcpy(h, ints, sizeof(ints));
    float_to_header(h + 16, c->rope_theta);
    float_to_header(h + 17, c->decay_time_min);
    float_to_header(h + 18, c->decay_time_max);
}

static void config_from_header(FoxConfig* c, const int* h) {
    memset(c, 0, sizeof(*c));
    int* fields[] = {&c->n_layer, &c->n_embd, &c->n_head, &c->vocab_size, &c->padded_vocab_size,
                     &c->mlp_hidden, &c->block, &c->gate, &c->k_shift, &c->v_shift, &c->qk_norm,
                     &c->qk_norm_shared, &c->output_gate, &c->output_norm, &c->rope, &c->window};
    for (int i = 0; i < 16; i++) { *fields[i] = h[i]; }
    c->rope_theta = float_from_header(h + 16);
    c->decay_time_min = float_from_header(h + 17);
    c->decay_time_max = float_from_header(h + 18);
}

static void write_size(int* slot, size_t v) { slot[0] = (int)(v & 0x7fffffff); slot[1] = (int)(v >> 31); }
static size_t read_size(const int* slot) { return (size_t)(unsigned)slot[0] | ((size_t)(unsigned)slot[1] << 31); }
static void write_u64(int* slot, uint64_t v) { memcpy(slot, &v, sizeof(v)); }
static uint64_t read_u64(const int* slot) { uint64_t v; memcpy(&v, slot, sizeof(v)); return v; }

static void write_f64(int* slot, double v) { memcpy(slot, &v, sizeof(v)); }
static double read_f64(const int* slot) { double v; memcpy(&v, slot, sizeof(v)); return v; }

// writes `sizes[i]` bytes of each of `parts` after the header, then the checksum of all of it, atomically
static void write_checked(const char* path, const int* header, const void* const* parts, const size_t* sizes,
                          int num_parts) {
    char tmp[4096];
    FILE* f = atomic_open(path, tmp, sizeof(tmp));
    Checksum c;
    checksum_init(&c);
    checksum_update(&c, header, HEADER_INTS * sizeof(int));
    atomic_write(header, sizeof(int), HEADER_INTS, f, tmp, path);
    for (int i = 0; i < num_parts; i++) {
        checksum_update(&c, parts[i], sizes[i]);
        atomic_write(parts[i], 1, sizes[i], f, tmp, path);
    }
    uint64_t digest = checksum_digest(&c);
    atomic_write(&digest, sizeof(digest), 1, f, tmp, path);
    atomic_commit(f, tmp, path);
}

static void save_model(const FoxModel* m, const char* path) {
    int header[HEADER_INTS] = {0};
    header[0] = MODEL_MAGIC;
    header[1] = MODEL_VERSION;
    config_to_header(&m->config, header + 2);
    write_size(header + 24, m->num_parameters);
    const void* parts[] = {m->params_memory};
    size_t sizes[] = {m->num_parameters * sizeof(float)};
    write_checked(path, header, parts, sizes, 1);
}

// A model file into m (built here; freed again on an error): its header, configuration and size checked
// before anything is allocated (a damaged header must not ask for gigabytes), then the parameters and the
// checksum. A version-1 file (before checksums) is read with a warning. Returns 0, or -1 with e set.
static int read_model(FoxModel* m, const char* path, FileError* e) {
    int header[HEADER_INTS];
    long size = 0;
    FILE* f = open_checkpoint(path, header, &size, "model", e);
    if (f == NULL) { return -1; }
    FoxConfig c;
    const char* problem = NULL;
    size_t n = 0;
    int version = header[1];
    int rc = 0;
    if (header[0] != MODEL_MAGIC) {
        rc = file_error(e, 1, "pass a model_*.bin written by train_fox, or a preset name",
                        "'%s' is not a train_fox model checkpoint (magic %d)", path, header[0]);
    } else if (version != 1 && version != MODEL_VERSION) {
        char why[128];
        snprintf(why, sizeof(why), "is checkpoint version %d; this build reads versions 1 and %d", version,
                 MODEL_VERSION);
        rc = not_for_this_build(e, f, size, path, "use the train_fox version that wrote it", why);
    } else if (config_from_header(&c, header + 2), (problem = config_problem(&c)) != NULL) {
        rc = file_error(e, 1, DAMAGED_HINT, "'%s' holds an invalid configuration (%s)", path, problem);
    } else if ((n = read_size(header + 24)) != config_num_parameters(&c)) {
        rc = file_error(e, 1, DAMAGED_HINT, "'%s' holds %zu parameters but its configuration needs %zu", path, n,
                        config_num_parameters(&c));
    } else {
        size_t expected = checkpoint_file_bytes(n * sizeof(float), version >= 2);
        if ((size_t)size != expected) {
            rc = file_error(e, 1, DAMAGED_HINT, "'%s' is %ld bytes, expected %zu for %zu parameters: it is "
                            "truncated or damaged", path, size, expected, n);
        }
    }
    if (rc == 0) {
        fox_build(m, &c);
        void* parts[] = {m->params_memory};
        size_t sizes[] = {n * sizeof(float)};
        rc = read_checked(f, path, header, parts, sizes, 1, version >= 2, e);
        if (rc != 0) { fox_free(m); }
        else if (version == 1) { printf("warning: '%s' is a version-1 model file: it has no checksum\n", path); }
    }
    fclose(f);
    return rc;
}

static void load_model(FoxModel* m, const char* path) {
    FileError e;
    if (read_model(m, path, &e) != 0) { fail_file(&e); }
}

// A run's position: the step, where the data loader stands, and everything that position and
// the learning rate depend on, so that a resume either continues exactly or says what differs.
typedef struct {
    int step;                        // optimizer steps done
    int epoch, shard_pos, batch_pos; // training data position, in batches of batch_samples
    int world;                       // processes that wrote it
    int batch_samples;               // samples per data-loader batch over all processes (B * world)
    int T;                           // sequence length (-t): samples are windows of T + 1 tokens
    int roll;                        // -R
    uint64_t seed;                   // -S: the shard and sample orders
    uint64_t shards;                 // shards_identity of the training shards (-i)
    int64_t total_batch_tokens;      // -d of the steps so far
    int64_t tokens_seen;             // tokens the steps so far trained on: the schedule's clock
    double warmup_tokens;            // the schedule's warmup (-u, or its default at the run's start)
    // what else shapes the steps (version 3; has_settings 0 in a version-2 file): resume_notes names changes
    int has_settings;
    double lr, weight_decay, grad_clip; // -l, -c, -a
    int schedule;                       // -k
    double end_tokens;                  // where the schedule ends, in tokens (from -x and -d)
    int prune; double prune_ln_eps;     // -A, -L
    int on_nonfinite; double spike_z;   // -G, -Z
    int documents;                      // -f; a version-3 file without it has 0 in its slot: -f 0, as that run had
    // the model's FP8 state (version 4; 0 before): -q, then its histories' length, calibrated flag and ring position
    // (save_state writes them from the model; the histories follow the moments in the file)
    int fp8, fp8_history, fp8_calibrated, fp8_pos;
} TrainState;

// the bytes of a state file's FP8 amax histories of U steps (with -q)
static size_t fp8_history_bytes(const FoxConfig* c, int U) {
    return (size_t)c->n_layer * FP8_SLOTS * (size_t)U * sizeof(float);
}

static void save_state(const FoxModel* m, const TrainState* s, const char* path) {
    int header[HEADER_INTS] = {0};
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = s->step;
    write_size(header + 3, m->num_parameters);
    header[5] = s->epoch; header[6] = s->shard_pos; header[7] = s->batch_pos; header[8] = s->world;
    header[9] = m->m_memory != NULL;
    header[10] = s->batch_samples;
    header[11] = s->T;
    header[12] = s->roll;
    write_u64(header + 13, s->seed);
    write_u64(header + 15, s->shards);
    write_u64(header + 17, (uint64_t)s->total_batch_tokens);
    write_u64(header + 19, (uint64_t)s->tokens_seen);
    write_f64(header + 21, s->warmup_tokens);
    write_f64(header + 23, s->lr);
    header[25] = s->schedule;
    write_f64(header + 26, s->weight_decay);
    write_f64(header + 28, s->grad_clip);
    write_f64(header + 30, s->end_tokens);
    header[32] = s->prune;
    write_f64(header + 33, s->prune_ln_eps);
    header[35] = s->on_nonfinite;
    write_f64(header + 36, s->spike_z);
    header[38] = s->documents;
    const Fp8State* q = &m->fp8;
    header[39] = q->mode; header[40] = q->history_len; header[41] = q->calibrated; header[42] = q->pos;
    const void* parts[3];
    size_t sizes[3];
    int n = 0;
    if (m->m_memory != NULL) {
        parts[n] = m->m_memory; sizes[n++] = m->num_parameters * sizeof(float);
        parts[n] = m->v_memory; sizes[n++] = m->num_parameters * sizeof(float);
    }
    if (q->mode != FP8_MODE_OFF) { parts[n] = q->history; sizes[n++] = fp8_history_bytes(&m->config, q->history_len); }
    write_checked(path, header, parts, sizes, n);
}

// the fields of a state file's header (version 2, 3 or 4) into s
static void state_from_header(TrainState* s, const int* header) {
    memset(s, 0, sizeof(*s));
    s->step = header[2]; s->epoch = header[5]; s->shard_pos = header[6]; s->batch_pos = header[7];
    s->world = header[8];
    s->batch_samples = header[10];
    s->T = header[11];
    s->roll = header[12];
    s->seed = read_u64(header + 13);
    s->shards = read_u64(header + 15);
    s->total_batch_tokens = (int64_t)read_u64(header + 17);
    s->tokens_seen = (int64_t)read_u64(header + 19);
    s->warmup_tokens = read_f64(header + 21);
    s->has_settings = header[1] >= 3;
    if (!s->has_settings) { return; }
    s->lr = read_f64(header + 23);
    s->schedule = header[25];
    s->weight_decay = read_f64(header + 26);
    s->grad_clip = read_f64(header + 28);
    s->end_tokens = read_f64(header + 30);
    s->prune = header[32];
    s->prune_ln_eps = read_f64(header + 33);
    s->on_nonfinite = header[35];
    s->spike_z = read_f64(header + 36);
    s->documents = header[38];
    if (header[1] < 4) { return; }
    s->fp8 = header[39]; s->fp8_history = header[40]; s->fp8_calibrated = header[41]; s->fp8_pos = header[42];
}

// the FP8 fields: none without -q; with it a history of 1 to FP8_MAX_HISTORY steps and a position in it
static int fp8_state_in_range(const TrainState* s) {
    if (s->fp8 == FP8_MODE_OFF) { return s->fp8_history == 0 && s->fp8_calibrated == 0 && s->fp8_pos == 0; }
    return s->fp8 > 0 && s->fp8 < FP8_MODES && s->fp8_history >= 1 && s->fp8_history <= FP8_MAX_HISTORY
           && (s->fp8_calibrated == 0 || s->fp8_calibrated == 1) && s->fp8_pos >= 0 && s->fp8_pos < s->fp8_history;
}

// whether a state's fields are in range (the checksum is checked after the moments are read)
static int state_in_range(const TrainState* s) {
    int ok = s->step >= 0 && s->epoch >= 0 && s->shard_pos >= 0 && s->batch_pos >= 0 && s->world >= 1
             && s->batch_samples >= 1 && s->T >= 1 && (s->roll == 0 || s->roll == 1) && s->total_batch_tokens >= 1
             && s->tokens_seen >= 0 && s->warmup_tokens >= 0.0 && s->warmup_tokens < 1e18;
    if (!s->has_settings) { return ok; }
    return ok && s->lr >= 0.0 && s->lr <= 10.0 && s->schedule >= 0 && s->schedule < 3 && s->weight_decay >= 0.0
           && s->weight_decay <= 10.0 && s->grad_clip >= 0.0 && s->grad_clip <= 1e9 && s->end_tokens >= 0.0
           && s->end_tokens < 1e30 && (s->prune == 0 || s->prune == 1) && s->prune_ln_eps >= -1e4
           && s->prune_ln_eps <= 0.0 && (s->on_nonfinite == 0 || s->on_nonfinite == 1) && s->spike_z >= 0.0
           && s->spike_z <= 1e9 && (s->documents == 0 || s->documents == 1) && fp8_state_in_range(s);
}

// The FP8 state of a state file (s, its header's fields; hist, its histories) into m when m trains with -q: taken
// when the file has calibrated histories of m's length (their amaxes do not depend on the format, so another -q
// mode keeps them); otherwise m calibrates on its next step (fp8_calibrate).
static void fp8_restore(FoxModel* m, const TrainState* s, const float* hist) {
    Fp8State* q = &m->fp8;
    if (q->mode == FP8_MODE_OFF) { return; }
    q->calibrated = s->fp8 != FP8_MODE_OFF && s->fp8_history == q->history_len && s->fp8_calibrated;
    if (!q->calibrated) { return; }
    memcpy(q->history, hist, fp8_history_bytes(&m->config, q->history_len));
    q->pos = s->fp8_pos;
    fp8_update_scales(m);
}

// A state file of m's model into s, m's AdamW moments (allocated here when m has none) and m's FP8 state
// (fp8_restore). A version-2 file (before checksums and the settings) is read with a warning; version 1 is
// refused with what to do. Returns 0, or -1 with e set; m's moments are then undefined.
static int read_state(FoxModel* m, TrainState* s, const char* path, FileError* e) {
    int header[HEADER_INTS];
    long size = 0;
    FILE* f = open_checkpoint(path, header, &size, "state", e);
    if (f == NULL) { return -1; }
    int version = header[1], has_moments = header[9], rc = 0;
    state_from_header(s, header);
    size_t moments = (has_moments == 1 ? 2 * m->num_parameters * sizeof(float) : 0);
    size_t fp8_bytes = s->fp8 != FP8_MODE_OFF ? fp8_history_bytes(&m->config, s->fp8_history) : 0;
    size_t expected = checkpoint_file_bytes(moments + fp8_bytes, version >= 3);
    if (header[0] != STATE_MAGIC) {
        rc = file_error(e, 1, "pass the state_*.bin written with the model",
                        "'%s' is not a train_fox state file (magic %d)", path, header[0]);
    } else if (version == 1) {
        rc = file_error(e, 0, "resume it with the train_fox that wrote it, or start a new run from its weights with "
                        "-e <its model_*.bin> (step 0, fresh AdamW moments)",
                        "'%s' is a version-1 state file: it lacks what an exact resume checks (-t, -R, -S, the "
                        "shards, the tokens seen); this build reads versions 2 to %d", path, STATE_VERSION);
    } else if (version < 2 || version > STATE_VERSION) {
        char why[128];
        snprintf(why, sizeof(why), "is state file version %d; this build reads versions 2 to %d", version,
                 STATE_VERSION);
        rc = not_for_this_build(e, f, size, path, "use the train_fox version that wrote it", why);
    } else if (read_size(header + 3) != m->num_parameters) {
        char why[128];
        snprintf(why, sizeof(why), "belongs to a model of %zu parameters, not %zu", read_size(header + 3),
                 m->num_parameters);
        rc = not_for_this_build(e, f, size, path, "resume with the model file of the same run", why);
    } else if (!state_in_range(s) || (has_moments != 0 && has_moments != 1)) {
        rc = file_error(e, 1, DAMAGED_HINT, "'%s' holds an invalid step, data position, run setting, moments "
                        "flag or FP8 state", path);
    } else if ((size_t)size != expected) {
        rc = file_error(e, 1, DAMAGED_HINT, "'%s' is %ld bytes, expected %zu: it is truncated or damaged", path,
                        size, expected);
    }
    if (rc == 0) {
        if (has_moments && m->m_memory == NULL) {
            m->m_memory = (float*)calloc_check(m->num_parameters, sizeof(float), "AdamW m");
            m->v_memory = (float*)calloc_check(m->num_parameters, sizeof(float), "AdamW v");
        } else if (!has_moments && m->m_memory != NULL) { // a state before the first update: fresh moments
            memset(m->m_memory, 0, m->num_parameters * sizeof(float));
            memset(m->v_memory, 0, m->num_parameters * sizeof(float));
        }
        float* hist = fp8_bytes > 0 ? (float*)malloc_check(fp8_bytes, "FP8 amax histories") : NULL;
        void* parts[3];
        size_t sizes[3];
        int n = 0;
        if (has_moments) {
            parts[n] = m->m_memory; sizes[n++] = m->num_parameters * sizeof(float);
            parts[n] = m->v_memory; sizes[n++] = m->num_parameters * sizeof(float);
        }
        if (hist != NULL) { parts[n] = hist; sizes[n++] = fp8_bytes; }
        rc = read_checked(f, path, header, parts, sizes, n, version >= 3, e);
        if (rc == 0) { fp8_restore(m, s, hist); }
        free(hist);
        if (rc == 0 && version == 2) {
            printf("warning: '%s' is a version-2 state file: it has no checksum, and another -l, -k, -c, -a, -x, "
                   "-A, -L, -G, -Z, -f or -q on resume cannot be noted\n", path);
        }
    }
    fclose(f);
    return rc;
}

#ifdef FOX_NO_MAIN // for the files that include the twin (the tests, the fuzzers): stops on any problem
static void load_state(FoxModel* m, TrainState* s, const char* path) {
    FileError e;
    if (read_state(m, s, path, &e) != 0) { fail_file(&e); }
}
#endif

static void checkpoint_paths(const char* dir, int step, char* model_path, char* state_path, size_t n) {
    snprintf(model_path, n, "%s/model_%08d.bin", dir, step);
    snprintf(state_path, n, "%s/state_%08d.bin", dir, step);
}

// the steps of the complete checkpoints in dir (a model file with its state file), newest first: a malloc'd
// array of *n steps (NULL when none)
static int* checkpoint_steps(const char* dir, int* n) {
    char pattern[4096];
    snprintf(pattern, sizeof(pattern), "%s/model_*.bin", dir);
    glob_t g;
    int* steps = NULL;
    *n = 0;
    if (glob(pattern, 0, NULL, &g) == 0) {
        steps = (int*)malloc_check(g.gl_pathc * sizeof(int), "checkpoint steps");
        for (size_t i = 0; i < g.gl_pathc; i++) {
            const char* base = strrchr(g.gl_pathv[i], '/');
            long step;
            char model_path[4096], state_path[4096], digits[32];
            // exactly "model_<digits>.bin" with a step that fits an int; anything else is not ours
            size_t len = base != NULL ? strlen(base) : 0;
            if (len < 12 || len - 11 >= sizeof(digits)) { continue; }
            memcpy(digits, base + 7, len - 11);
            digits[len - 11] = '\0';
            if (!isdigit((unsigned char)digits[0]) || !parse_int_strict(digits, &step) || step > INT32_MAX) {
                continue;
            }
            checkpoint_paths(dir, (int)step, model_path, state_path, sizeof(model_path));
            if (access(model_path, R_OK) != 0 || access(state_path, R_OK) != 0) { continue; }
            int k = (*n)++; // insertion, newest first (glob sorts by name, zero-padded names sort by step)
            for (; k > 0 && steps[k - 1] < (int)step; k--) { steps[k] = steps[k - 1]; }
            steps[k] = (int)step;
        }
        globfree(&g);
    }
    return steps;
}

#ifdef FOX_NO_MAIN // the GPU's ranks check that they see the same files; the tests
// the newest step for which both files exist, or -1
static int latest_checkpoint(const char* dir) {
    int n;
    int* steps = checkpoint_steps(dir, &n);
    int best = n > 0 ? steps[0] : -1;
    free(steps);
    return best;
}
#endif

// a saved data position (batches of `saved_samples` samples into the current shard) in
// batches of `samples` samples: -1 when it does not land on a batch boundary
static long translate_batch_pos(long batch_pos, long saved_samples, long samples) {
    if (saved_samples == samples) { return batch_pos; }
    if (saved_samples <= 0 || samples <= 0) { return -1; }
    long consumed = batch_pos * saved_samples;
    return consumed % samples == 0 ? consumed / samples : -1;
}

// Where a resumed run's data loader continues: the saved position, exact when the settings it
// depends on are those of the run that wrote it. Another -b or process count is translated when
// the sequences consumed in the current shard fill whole batches of the new size; another -t,
// -R, -S or set of shards would make the position mean other data: refused, naming the setting.
static int resume_data_position(const TrainState* s, const DataLoader* train, const char* path) {
    const char* hint = "HINT: resume with the settings of the run that wrote it, or start a new run (another -o) "
                       "from its weights with -e <its model_*.bin>";
    if (s->T != train->T) {
        fail("'%s' was written by a run with -t %d, this one has -t %d: its data position counts windows of %d "
             "tokens\n%s", path, s->T, train->T, s->T, hint);
    }
    if (s->roll != train->roll) {
        fail("'%s' was written by a run with -R %d, this one has -R %d\n%s", path, s->roll, train->roll, hint);
    }
    if (s->seed != train->seed) {
        fail("'%s' was written by a run with seed -S %llu, this one has -S %llu: the data order differs\n%s", path,
             (unsigned long long)s->seed, (unsigned long long)train->seed, hint);
    }
    if (s->shards != shards_identity(train)) {
        fail("'%s' was written by a run on other training shards (their names or sizes differ from the %d "
             "shard(s) of -i)\n%s", path, train->num_shards, hint);
    }
    long samples = (long)train->B * train->world;
    long batch_pos = translate_batch_pos(s->batch_pos, s->batch_samples, samples);
    if (batch_pos < 0) {
        fail("'%s' stopped %d batches of %d sequences into a shard, which is no whole number of batches of "
             "-b %d x %d process(es)\nHINT: resume with a -b and process count whose product divides %ld "
             "(the run that wrote it had %d sequences a batch over %d process(es))",
             path, s->batch_pos, s->batch_samples, train->B, train->world, (long)s->batch_pos * s->batch_samples,
             s->batch_samples, s->world);
    }
    return (int)batch_pos;
}

// A directory holds one run: a fresh run refuses one with a model checkpoint in it (whose files
// latest_checkpoint would otherwise pair with this run's). A lone state file is harmless: a run
// writes the state first, so its own state replaces it before its model file exists.
static void check_fresh_run_dir(const char* dir) {
    char pattern[4096];
    snprintf(pattern, sizeof(pattern), "%s/model_*.bin", dir);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0) {
        char first[4096];
        snprintf(first, sizeof(first), "%s", g.gl_pathv[0]);
        size_t n = g.gl_pathc;
        globfree(&g);
        fail("-o '%s' already holds %zu model checkpoint(s) of a run (%s)\nHINT: resume that run with -y 1, "
             "or write this one to another -o (or move the old files away)", dir, n, first);
    }
}

// -y 1 trains on from the checkpoint's step to -x; with nothing left to train, it says so
static void check_resume_steps(int start, long steps, const char* dir) {
    if (steps <= start) {
        fail("-y 1: the newest checkpoint in '%s' is at step %d and -x is %ld: no step is left to train\n"
             "HINT: pass -x above %d to train further (-x defaults to one epoch of the training shards)",
             dir, start, steps, start);
    }
}

// ----------------------------------------------------------------------------
// training samples and validation loss, as main prints them while it trains

static int sample_from_logits(const float* logits, int V, float temperature, uint64_t* rng) {
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) { mx = fmaxf(mx, logits[j]); }
    double sum = 0.0;
    for (int j = 0; j < V; j++) { sum += exp((logits[j] - mx) / temperature); }
    double r = rng_uniform(rng) * sum, acc = 0.0;
    for (int j = 0; j < V; j++) {
        acc += exp((logits[j] - mx) / temperature);
        if (r < acc) { return j; }
    }
    return V - 1;
}

// generates from the EOT token by recomputing the full forward at each step (simple, exact)
static void fox_sample(FoxModel* m, const Tokenizer* tk, int gen_tokens, uint64_t* rng) {
    int* tokens = (int*)malloc_check((size_t)gen_tokens * sizeof(int), "sample");
    tokens[0] = tk->eot;
    printf("sample: ");
    for (int t = 1; t < gen_tokens; t++) {
        fox_forward(m, tokens, NULL, 1, t);
        const float* row = m->logits + (size_t)(t - 1) * m->config.padded_vocab_size;
        tokens[t] = sample_from_logits(row, m->config.vocab_size, 1.0f, rng);
        tokenizer_print(tk, tokens[t]);
    }
    printf("\n---\n");
    free(tokens);
}

static float evaluate(FoxModel* m, DataLoader* val, int max_batches) {
    dataloader_set_position(val, 0, 0, 0);
    if (val->current_batches == 0) { dataloader_advance_shard(val); }
    size_t total = dataloader_total_batches(val);
    int n = max_batches > 0 && (size_t)max_batches < total ? max_batches : (int)total;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        dataloader_next_batch(val);
        fox_forward(m, val->inputs, val->targets, val->B, val->T);
        sum += m->mean_loss;
    }
    return (float)(sum / n);
}

// ----------------------------------------------------------------------------
// command line, shared with train_fox.cu: the modes, Args, usage (train_fox -h), parse_args, and
// the model a run starts from (build_model: a preset with overrides, or a checkpoint). Flags,
// messages and HINTs are the user interface: test_fox.cu and dev/test_reliability.sh check some.

enum { MODE_TRAIN, MODE_EVAL, MODE_GENERATE, MODE_NIAH, MODE_MAPS, NUM_MODES };
static const char* MODE_NAMES[] = {"train", "eval", "generate", "niah", "maps"};

typedef struct {
    const char* train_pattern; const char* val_pattern; const char* model; const char* out_dir;
    const char* tokenizer_path;
    int B, T; long total_batch_tokens; double lr; long steps; long warmup_tokens;
    int schedule; double weight_decay; double grad_clip;
    int val_every, val_batches, sample_every, gen_tokens, checkpoint_every, resume;
    int roll; uint64_t seed;
    int recompute; // activation recompute level of the GPU trainer (-r)
    int tune;      // the GPU trainer's timed search of matmul algorithms (-X)
    int graphs;    // the GPU trainer's CUDA graph of each training micro-step (-C)
    int prune; double prune_ln_eps; // adaptive computation pruning of attention (-A, -L)
    int documents;                  // documents kept apart: each EOT starts a fresh context (-f)
    int fp8;                        // FP8 matmuls in training (-q): FP8_MODE_OFF, _HYBRID, _E4M3, _BODY
    int world, rank, zero_stage; const char* rendezvous; // data parallel (GPU trainer); -1 / NULL: not given
    int mode; const char* prompt; double temperature; int top_k; const char* out_prefix;
    int depths; const char* list; // -E, -D: meaning depends on the mode
    int on_nonfinite; double spike_z;
    int num_overrides; const char* override_keys[64]; const char* override_values[64];
} Args;

static void usage(void) {
    printf(
"train_fox: trains a Forgetting Transformer (train_fox_cpu: the fp32 CPU twin; train_fox: the GPU trainer).\n"
"usage: train_fox [options] [--<model key> <value> ...]\n"
"  -i <glob>   train shards        (default data/gutenberg/gutenberg_train_*.bin)\n"
"  -j <glob>   validation shards   (default data/gutenberg/gutenberg_val_*.bin)\n"
"  -e <model>  preset <family>-<size> or a model_*.bin checkpoint (default fox-pro-tiny)\n"
"              families: fox-pro fox-llama transformer-pro transformer-llama\n"
"              sizes: tiny 125m 360m 760m\n"
"  -o <dir>    output directory for main.log and checkpoints, made if missing, locked while the run\n"
"              lasts (default: none)\n"
"  -b <int>    micro-batch size, sequences (default 4)\n"
"  -t <int>    sequence length (default 256)\n"
"  -d <int>    total batch in tokens, a multiple of b*t*processes (default: no accumulation)\n"
"  -l <float>  peak learning rate (default 2e-3)\n"
"  -x <int>    optimizer steps (default: one epoch of the train shards)\n"
"  -u <int>    warmup tokens (default: min(256 x 2^20, 10%% of the training tokens))\n"
"  -k <name>   schedule after warmup: cosine (default), linear, constant\n"
"  -c <float>  weight decay (default 0.1)\n"
"  -a <float>  gradient clipping global norm (default 1.0, 0 = off)\n"
"  -v <int>    validation loss every v steps (default 100, 0 = off)\n"
"  -m <int>    validation batches (default 20, 0 = the whole validation set)\n"
"  -s <int>    sample text every s steps (default 100, 0 = off)\n"
"  -g <int>    tokens to generate per sample (default 64)\n"
"  -n <int>    checkpoint every n steps, needs -o (default 0 = only at the end)\n"
"  -y <0|1>    resume from the newest checkpoint in -o (default 0)\n"
"  -R <0|1>    roll each sequence by a random offset (default 0)\n"
"  -S <int>    seed (default 1337)\n"
"  -G <name>   on a non-finite loss or gradient: stop (default) or skip the step\n"
"  -Z <float>  skip steps whose loss or grad norm z-score over the last 128 steps exceeds this (default 0 = off)\n"
"  -z <path>   decode table for samples (default data/gpt2_tokenizer.bin)\n"
"  -A <0|1>    adaptive computation pruning of attention: skip the tiles whose forget-gate decay\n"
"              bound leaves them less than eps of any row's weight (default 0; README.md)\n"
"  -L <float>  ln eps of the pruning bound, < 0 (default -10)\n"
"  -f <0|1>    documents kept apart (training and evaluation): each EOT token (50256) starts a fresh\n"
"              context that sees nothing before it, the EOT only itself (default 0)\n"
"  -q <mode>   FP8 matmuls in training (one GPU; train_fox_cpu emulates them): off (default),\n"
"              hybrid (E4M3 weights and activations, E5M2 gradients), e4m3 (E4M3 gradients too),\n"
"              body (hybrid with the lm head in bf16); per-tensor power-of-two scales, fp32 master weights\n"
"  -r <0|1>    activation recompute (train_fox on GPUs): 0 keeps every activation (default), 1 recomputes\n"
"              the element-wise and normalisation outputs in the backward (less memory, same gradients)\n"
"  -X <0|1>    matmul tuning (train_fox on GPUs): 1 times cuBLASLt's candidates for each matmul at start\n"
"              and keeps the fastest that sums as the heuristic's choice (same results); default 1\n"
"  -C <0|1>    CUDA graph (train_fox on GPUs): 1 launches each training micro-step's kernels as one\n"
"              captured graph (the same results, fewer launch gaps); default 1\n"
"evaluation (-e a model_*.bin checkpoint; README.md, section Evaluation):\n"
"  -M <mode>   train (default) | eval: per-token loss L(i) and P(l) over -j at length -t,\n"
"              -b sequences a batch, -m batches (0 = all) | generate: continue -P for -g\n"
"              tokens | niah: needle in a haystack, standard and easy | maps: forget-gate\n"
"              and attention maps of -P (default: the first -t tokens of -j)\n"
"  -P <text>   prompt text, or @file to read it from a file, or @shard.bin: the first tokens of a\n"
"              token shard, as many as fit before -g (generate, maps)\n"
"  -T <float>  sampling temperature, 0 = greedy (default 1.0)\n"
"  -K <int>    sample from the k most likely tokens only (default 0 = all)\n"
"  -O <prefix> output files <prefix>.loss.csv, .ppl.csv (eval), .niah.csv (niah), .maps.bin (maps)\n"
"  -E <int>    niah: needle depths from 0 to 1 (default 11)\n"
"  -D <list>   niah: context lengths, e.g. 512,1024,2048 (default 11 evenly spaced up to -t);\n"
"              maps: layer:head pairs or layers, e.g. 0:1,3 (default: every head of every layer);\n"
"              generate: prompt lengths, len or len*count, e.g. 2048*32 (several prompts at once)\n"
"  -h          this help\n"
"data parallel (train_fox on GPUs only; one process per GPU, see README.md):\n"
"  -W <int>    processes (default: the launcher's environment, else 1)\n"
"  -I <int>    this process's rank (default: the launcher's environment, else 0)\n"
"  -F <spec>   NCCL id rendezvous without MPI: a file path all processes see, or tcp://host:port of rank 0\n"
"  -Q <0|1>    ZeRO stage: 0 all-reduces gradients, 1 shards AdamW state (default 1)\n"
"model keys (override a preset): n_layer n_embd n_head vocab_size mlp_hidden block gate\n"
"  decay_time_min decay_time_max k_shift v_shift qk_norm qk_norm_shared output_gate\n"
"  output_norm rope rope_theta window\n");
}

static void bad_flag(const char* flag, const char* value, const char* expected) {
    fail("invalid value '%s' for %s: expected %s\nHINT: train_fox -h lists every flag", value, flag, expected);
}

static long flag_int(const char* flag, const char* value, long lo, long hi) {
    long v;
    if (!parse_int_strict(value, &v) || v < lo || v > hi) {
        char expected[128];
        snprintf(expected, sizeof(expected), "an integer in [%ld, %ld]", lo, hi);
        bad_flag(flag, value, expected);
    }
    return v;
}

static double flag_float(const char* flag, const char* value, double lo, double hi) {
    double v;
    if (!parse_float_strict(value, &v) || v < lo || v > hi) {
        char expected[128];
        snprintf(expected, sizeof(expected), "a number in [%g, %g]", lo, hi);
        bad_flag(flag, value, expected);
    }
    return v;
}

static void parse_args(Args* a, int argc, char** argv) {
    memset(a, 0, sizeof(*a));
    a->train_pattern = "data/gutenberg/gutenberg_train_*.bin";
    a->val_pattern = "data/gutenberg/gutenberg_val_*.bin";
    a->model = "fox-pro-tiny";
    a->tokenizer_path = "data/gpt2_tokenizer.bin";
    a->B = 4; a->T = 256; a->total_batch_tokens = -1; a->lr = 2e-3; a->steps = -1;
    a->warmup_tokens = -1; a->schedule = SCHEDULE_COSINE; a->weight_decay = 0.1; a->grad_clip = 1.0;
    a->val_every = 100; a->val_batches = 20; a->sample_every = 100; a->gen_tokens = 64;
    a->seed = 1337;
    a->world = -1; a->rank = -1; a->zero_stage = -1;
    a->mode = MODE_TRAIN; a->temperature = 1.0; a->depths = 11;
    a->prune_ln_eps = -10.0;
    a->tune = 1;
    a->graphs = 1;
    int checkpoint_every_given = 0; // -n's default, 0, means "at the end" of a run with -o
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) { usage(); exit(EXIT_SUCCESS); }
        if (i + 1 >= argc) { fail("flag %s needs a value\nHINT: train_fox -h lists every flag", arg); }
        const char* v = argv[++i];
        if (arg[0] == '-' && arg[1] == '-') {
            if (a->num_overrides == 64) {
                fail("too many model overrides (at most 64)\nHINT: pass fewer --key value pairs");
            }
            a->override_keys[a->num_overrides] = arg + 2;
            a->override_values[a->num_overrides++] = v;
            continue;
        }
        if (arg[0] != '-' || strlen(arg) != 2) {
            fail("unknown argument '%s'\nHINT: train_fox -h lists every flag", arg);
        }
        switch (arg[1]) {
            case 'i': a->train_pattern = v; break;
            case 'j': a->val_pattern = v; break;
            case 'e': a->model = v; break;
            case 'o':
                if (v[0] == '\0') {
                    fail("-o is empty\nHINT: pass the run's directory, e.g. -o runs/fox (an unset shell variable "
                         "gives an empty -o)");
                }
                a->out_dir = v;
                break;
            case 'b': a->B = (int)flag_int(arg, v, 1, 1 << 20); break;
            case 't': a->T = (int)flag_int(arg, v, 1, 1 << 24); break;
            case 'd': a->total_batch_tokens = flag_int(arg, v, 1, 1L << 40); break;
            case 'l': a->lr = flag_float(arg, v, 0.0, 10.0); break;
            case 'x': a->steps = flag_int(arg, v, 1, 1L << 40); break;
            case 'u': a->warmup_tokens = flag_int(arg, v, 0, 1L << 50); break;
            case 'k':
                a->schedule = parse_choice(v, SCHEDULE_NAMES, 3);
                if (a->schedule < 0) { bad_flag(arg, v, "cosine, linear or constant"); }
                break;
            case 'c': a->weight_decay = flag_float(arg, v, 0.0, 10.0); break;
            case 'a': a->grad_clip = flag_float(arg, v, 0.0, 1e9); break;
            case 'v': a->val_every = (int)flag_int(arg, v, 0, 1 << 30); break;
            case 'm': a->val_batches = (int)flag_int(arg, v, 0, 1 << 30); break;
            case 's': a->sample_every = (int)flag_int(arg, v, 0, 1 << 30); break;
            case 'g': a->gen_tokens = (int)flag_int(arg, v, 2, 1 << 20); break;
            case 'n':
                a->checkpoint_every = (int)flag_int(arg, v, 0, 1 << 30);
                checkpoint_every_given = 1;
                break;
            case 'y': a->resume = (int)flag_int(arg, v, 0, 1); break;
            case 'R': a->roll = (int)flag_int(arg, v, 0, 1); break;
            case 'S': a->seed = (uint64_t)flag_int(arg, v, 0, 1L << 62); break;
            case 'z': a->tokenizer_path = v; break;
            case 'W': a->world = (int)flag_int(arg, v, 1, 1 << 20); break;
            case 'I': a->rank = (int)flag_int(arg, v, 0, (1 << 20) - 1); break;
            case 'F': a->rendezvous = v; break;
            case 'Q': a->zero_stage = (int)flag_int(arg, v, 0, 1); break;
            case 'M':
                a->mode = parse_choice(v, MODE_NAMES, NUM_MODES);
                if (a->mode < 0) { bad_flag(arg, v, "train, eval, generate, niah or maps"); }
                break;
            case 'P': a->prompt = v; break;
            case 'T': a->temperature = flag_float(arg, v, 0.0, 100.0); break;
            case 'K': a->top_k = (int)flag_int(arg, v, 0, 1 << 20); break;
            case 'O': a->out_prefix = v; break;
            case 'E': a->depths = (int)flag_int(arg, v, 1, 1000); break;
            case 'D': a->list = v; break;
            case 'G':
                a->on_nonfinite = parse_choice(v, NONFINITE_NAMES, 2);
                if (a->on_nonfinite < 0) { bad_flag(arg, v, "stop or skip"); }
                break;
            case 'Z': a->spike_z = flag_float(arg, v, 0.0, 1e9); break;
            case 'r': a->recompute = (int)flag_int(arg, v, 0, 1); break;
            case 'X': a->tune = (int)flag_int(arg, v, 0, 1); break;
            case 'C': a->graphs = (int)flag_int(arg, v, 0, 1); break;
            case 'A': a->prune = (int)flag_int(arg, v, 0, 1); break;
            case 'f': a->documents = (int)flag_int(arg, v, 0, 1); break;
            case 'q':
                a->fp8 = parse_choice(v, FP8_MODE_NAMES, FP8_MODES);
                if (a->fp8 < 0) { bad_flag(arg, v, "off, hybrid, e4m3 or body"); }
                break;
            case 'L':
                a->prune_ln_eps = flag_float(arg, v, -1e4, 0.0);
                if (a->prune_ln_eps == 0.0) { bad_flag(arg, v, "a number < 0"); }
                break;
            default: fail("unknown flag '%s'\nHINT: train_fox -h lists every flag", arg);
        }
    }
    if (a->resume && a->out_dir == NULL) {
        fail("-y 1 needs -o, the directory of the run to resume\nHINT: add -o <dir>");
    }
    if (checkpoint_every_given && a->out_dir == NULL) {
        fail("-n %d needs -o: checkpoints are written there, and without -o none is\n"
             "HINT: add -o <dir>, or drop -n", a->checkpoint_every);
    }
    if (a->mode != MODE_TRAIN && a->fp8 != FP8_MODE_OFF) { // never silently ignored
        fail("-q %s is a training setting: the evaluation modes run the weights unrounded\nHINT: drop -q",
             FP8_MODE_NAMES[a->fp8]);
    }
}

static int is_file(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// a preset with the model-key overrides, freshly initialised
static void build_preset(FoxModel* m, const Args* a) {
    FoxConfig c;
    if (!config_from_preset(&c, a->model)) {
        fail("'%s' is neither a file nor a preset\n"
             "HINT: presets are <family>-<size>: fox-pro, fox-llama, transformer-pro, transformer-llama "
             "with tiny, 125m, 360m, 760m (e.g. fox-pro-125m)", a->model);
    }
    int mlp_given = 0;
    for (int i = 0; i < a->num_overrides; i++) {
        int r = config_set(&c, a->override_keys[i], a->override_values[i]);
        if (r == 0) { fail("unknown model key --%s\nHINT: train_fox -h lists the model keys", a->override_keys[i]); }
        if (r < 0) {
            fail("invalid value '%s' for --%s\nHINT: train_fox -h lists the model keys", a->override_values[i],
                 a->override_keys[i]);
        }
        if (strcmp(a->override_keys[i], "mlp_hidden") == 0) { mlp_given = 1; }
    }
    if (!mlp_given) { c.mlp_hidden = derived_mlp_hidden(c.n_embd, c.block); }
    fox_build(m, &c);
    fox_init(m, a->seed);
}

static void build_model(FoxModel* m, const Args* a) {
    if (is_file(a->model)) {
        if (a->num_overrides > 0) {
            fail("model overrides (--%s) apply to presets, not to the checkpoint '%s'\nHINT: drop the overrides",
                 a->override_keys[0], a->model);
        }
        load_model(m, a->model);
        printf("loaded %s\n", a->model);
    } else {
        build_preset(m, a);
    }
    m->prune = a->prune;
    m->prune_ln_eps = (float)a->prune_ln_eps;
    if (a->documents && m->config.vocab_size <= GPT2_EOT) {
        fail("-f 1 keeps documents apart at the EOT token %d, which a vocabulary of %d cannot hold\n"
             "HINT: use a GPT-2 vocabulary (vocab_size 50257), or drop -f", GPT2_EOT, m->config.vocab_size);
    }
    m->doc_eot = a->documents ? GPT2_EOT : -1;
    fp8_setup(m, a->fp8);
}

// ----------------------------------------------------------------------------
// the output directory -o of a training run, claimed before anything is written there: made with
// its missing parents, locked for the whole run (a second run into it is refused, naming the
// holder), and shown to take a write and one checkpoint. Each check returns 0, or -1 with its
// message (the cause and a HINT) in why: the GPU trainer's rank 0 claims -o and tells the other
// ranks, so that all stop alike. Then main.log, whose every write is checked (log_line).

#define RUN_LOCK_NAME "train_fox.lock"
#define WRITE_PROBE_NAME ".train_fox_write_test"
#define WRITE_PROBE_BYTES ((size_t)64 << 10)
#define RUN_DIR_WHY_BYTES 16384 // room for a message that names two paths

typedef struct {
    int lock_fd;           // the lock on -o, held until run_dir_close or the process's end; -1: none
    FILE* log;             // main.log; NULL without one (no -o, or a rank > 0)
    char log_path[4096];
} RunDir;

// a RunDir that holds nothing (no -o, or a process that does not write)
static RunDir run_dir_unclaimed(void) {
    RunDir rd;
    memset(&rd, 0, sizeof(rd));
    rd.lock_fd = -1;
    return rd;
}

// "<dir>/<name>" into out, or -1 with the message when it does not fit
static int run_dir_path(const char* dir, const char* name, char* out, size_t size, char* why, size_t n) {
    if ((size_t)snprintf(out, size, "%s/%s", dir, name) < size) { return 0; }
    snprintf(why, n, "-o '%s' is too long (%zu characters)\nHINT: use a shorter output directory", dir, strlen(dir));
    return -1;
}

// mkdir -p: dir and each missing parent, each failure named with its cause
static int make_dirs(const char* dir, char* why, size_t n) {
    char path[4096], what[8400];
    if ((size_t)snprintf(path, sizeof(path), "%s", dir) >= sizeof(path)) {
        return run_dir_path(dir, "", path, sizeof(path), why, n); // too long: says so
    }
    for (char* p = path + 1; ; p++) {
        if (*p != '/' && *p != '\0') { continue; }
        char c = *p;
        *p = '\0';
        if (c != '\0') { snprintf(what, sizeof(what), "'%s' (a parent of -o '%s')", path, dir); }
        else { snprintf(what, sizeof(what), "-o '%s'", dir); }
        struct stat st;
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            snprintf(why, n, "could not make %s: %s\nHINT: -o's parents must be directories you may write to", what,
                     strerror(errno));
            return -1;
        }
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
            snprintf(why, n, "%s exists and is not a directory\nHINT: pass another -o, or move that file away", what);
            return -1;
        }
        *p = c;
        if (c == '\0') { return 0; }
    }
}

// Locks dir for this run: flock on dir/train_fox.lock, which then holds "pid <pid> on <host>" for
// a refused run's message. The kernel drops the lock when the process ends, however it ends, so a
// lock file left by a dead run never blocks a new one.
static int lock_run_dir(RunDir* rd, const char* dir, char* why, size_t n) {
    char path[4096], me[512], host[256] = "";
    if (run_dir_path(dir, RUN_LOCK_NAME, path, sizeof(path), why, n) != 0) { return -1; }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(why, n, "could not open the lock file '%s': %s\nHINT: -o must be a directory you may write to",
                 path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char holder[256] = "";
        ssize_t got = pread(fd, holder, sizeof(holder) - 1, 0);
        close(fd);
        holder[got > 0 ? got : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        if (err == EWOULDBLOCK) {
            snprintf(why, n, "-o '%s' is in use by another run: %s holds its lock '%s'\nHINT: wait for that run "
                     "to end (or stop it), or write this run to another -o", dir,
                     holder[0] != '\0' ? holder : "a run that is starting", path);
        } else {
            snprintf(why, n, "could not lock '%s': %s\nHINT: -o must be on a filesystem with file locks (flock)",
                     path, strerror(err));
        }
        return -1;
    }
    if (gethostname(host, sizeof(host) - 1) != 0) { snprintf(host, sizeof(host), "an unknown host"); }
    int len = snprintf(me, sizeof(me), "pid %ld on %s\n", (long)getpid(), host);
    errno = ENOSPC; // what a short write means
    if (ftruncate(fd, 0) != 0 || pwrite(fd, me, (size_t)len, 0) != (ssize_t)len || fsync(fd) != 0) {
        snprintf(why, n, "could not write the lock file '%s': %s\nHINT: is the disk full? free space or pass "
                 "another -o", path, strerror(errno));
        close(fd);
        return -1;
    }
    rd->lock_fd = fd;
    return 0;
}

// A write test of dir: WRITE_PROBE_BYTES written to a test file, flushed to disk, removed. A disk
// that is full, read-only or failing is found at the start, not at the run's first checkpoint.
static int probe_run_dir(const char* dir, char* why, size_t n) {
    char path[4096], block[4096];
    memset(block, 0, sizeof(block));
    if (run_dir_path(dir, WRITE_PROBE_NAME, path, sizeof(path), why, n) != 0) { return -1; }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = fd < 0 ? errno : 0;
    for (size_t done = 0; err == 0 && done < WRITE_PROBE_BYTES; done += sizeof(block)) {
        errno = ENOSPC; // what a short write means
        if (write(fd, block, sizeof(block)) != (ssize_t)sizeof(block)) { err = errno; }
    }
    if (err == 0 && fsync(fd) != 0) { err = errno; }
    if (fd >= 0 && close(fd) != 0 && err == 0) { err = errno; }
    if (fd >= 0) { unlink(path); }
    if (err == 0) { return 0; }
    snprintf(why, n, "could not write to -o '%s' (a test write of %zu KiB, flushed to disk): %s\nHINT: is the "
             "disk full or read-only? free space or pass another -o", dir, WRITE_PROBE_BYTES >> 10, strerror(err));
    return -1;
}

// the sizes of one checkpoint's files for a model of configuration c, as save_model and save_state
// write them: the fp32 parameters, or the two fp32 AdamW moments (checkpoint_file_bytes adds the rest; -q adds
// the FP8 histories, kilobytes: fp8_history_bytes)
static void checkpoint_sizes(const FoxConfig* c, size_t* model_bytes, size_t* state_bytes) {
    size_t params = config_num_parameters(c) * sizeof(float);
    *model_bytes = checkpoint_file_bytes(params, 1);
    *state_bytes = checkpoint_file_bytes(2 * params, 1);
}

// the free space of dir's filesystem (statvfs) against one checkpoint of a model of configuration c
static int check_free_space(const char* dir, const FoxConfig* c, char* why, size_t n) {
    size_t model_bytes, state_bytes;
    checkpoint_sizes(c, &model_bytes, &state_bytes);
    struct statvfs st;
    if (statvfs(dir, &st) != 0) {
        snprintf(why, n, "could not read the free space of -o '%s': %s\nHINT: check the output directory", dir,
                 strerror(errno));
        return -1;
    }
    double avail = (double)st.f_bavail * (double)st.f_frsize, need = (double)(model_bytes + state_bytes);
    if (avail >= need) { return 0; }
    snprintf(why, n, "-o '%s' has %.1f MiB free, one checkpoint of this model needs %.1f MiB (model file %.1f MiB, "
             "state file %.1f MiB)\nHINT: free space on that disk or pass another -o (a run keeps every checkpoint "
             "it writes)", dir, avail / 1048576.0, need / 1048576.0, model_bytes / 1048576.0, state_bytes / 1048576.0);
    return -1;
}

// closes main.log (its last writes checked) and releases the lock
static void run_dir_close(RunDir* rd) {
    if (rd->log != NULL && fclose(rd->log) != 0) {
        fail("could not write '%s': %s\nHINT: is the disk full?", rd->log_path, strerror(errno));
    }
    if (rd->lock_fd >= 0) { close(rd->lock_fd); }
    *rd = run_dir_unclaimed();
}

// Claims dir for a training run of a model of configuration c (the section's comment): 0, or -1
// with the message in why and nothing held
static int run_dir_claim(RunDir* rd, const char* dir, const FoxConfig* c, char* why, size_t n) {
    *rd = run_dir_unclaimed();
    if (make_dirs(dir, why, n) != 0) { return -1; }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(why, n, "-o '%s' is not writable: %s\nHINT: pass a directory you may write to", dir,
                 strerror(errno));
        return -1;
    }
    if (lock_run_dir(rd, dir, why, n) != 0) { return -1; }
    if (probe_run_dir(dir, why, n) != 0 || check_free_space(dir, c, why, n) != 0) {
        run_dir_close(rd);
        return -1;
    }
    return 0;
}

// opens dir's main.log, appended to on a resume
static void run_dir_open_log(RunDir* rd, const char* dir, int append) {
    char why[512];
    if (run_dir_path(dir, "main.log", rd->log_path, sizeof(rd->log_path), why, sizeof(why)) != 0) { fail("%s", why); }
    rd->log = fopen_check(rd->log_path, append ? "a" : "w");
}

// one record of main.log (none without one), flushed; a failed write or flush stops the run
static void log_line(RunDir* rd, const char* fmt, ...) {
    if (rd->log == NULL) { return; }
    va_list ap;
    va_start(ap, fmt);
    int written = vfprintf(rd->log, fmt, ap);
    va_end(ap);
    if (written < 0 || fflush(rd->log) != 0) {
        fail("could not write '%s': %s\nHINT: is the disk full? free space, then resume the run with -y 1",
             rd->log_path, strerror(errno));
    }
}

// ----------------------------------------------------------------------------
// run helpers of both trainers' main loops: the checks before a run, resume, the schedule,
// main.log, the end of a guarded step, the clock and progress, and (the twin's) checkpoint

// What must hold before a run trains (-o claimed by run_dir_claim before this looks into it): a fresh
// run owns its -o (check_fresh_run_dir), and a sample (which starts from the decode table's
// end-of-text token) can run on this model: a sample must never stop a run after it trained.
static void check_run_start(const Args* a, const FoxConfig* cf, const Tokenizer* tk, int have_tokenizer) {
    if (a->out_dir != NULL && !a->resume) { check_fresh_run_dir(a->out_dir); }
    if (have_tokenizer && a->sample_every > 0 && (tk->eot < 0 || tk->eot >= cf->vocab_size)) {
        fail("the decode table '%s' starts samples with token %d, outside the model's vocabulary of %d\n"
             "HINT: pass a decode table of this vocabulary with -z, or turn samples off with -s 0",
             a->tokenizer_path, tk->eot, cf->vocab_size);
    }
}

// the state of a run after `step` steps, whose data loader stands at the next batch
static TrainState train_state(int step, const DataLoader* d, const LRSchedule* sched, int64_t tokens_seen,
                              const Args* a) {
    TrainState s = {step, d->epoch, d->shard_pos, d->batch_pos, d->world, d->B * d->world, d->T, d->roll,
                    d->seed, shards_identity(d), (int64_t)sched->tokens_per_step, tokens_seen, sched->warmup_tokens,
                    1, sched->peak_lr, a->weight_decay, a->grad_clip, sched->type, sched->total_tokens,
                    a->prune, a->prune_ln_eps, a->on_nonfinite, a->spike_z, a->documents, a->fp8, 0, 0, 0};
    return s;
}

static LRSchedule run_schedule(const Args* a, const TrainState* resumed);

// The twin's micro-steps of optimizer step `step` (from 1): the gradients of `accum` batches of d summed, each
// scaled by 1 / accum; with -q the FP8 step begins (its scales calibrated first when there are none). Returns the
// mean loss. The step ends with fp8_step_end, after the update or the guard's skip.
static double fox_train_micro_steps(FoxModel* m, DataLoader* d, int accum, long step) {
    fox_zero_grad(m);
    fp8_step_begin(m);
    double loss = 0.0;
    for (int micro = 0; micro < accum; micro++) {
        dataloader_next_batch(d);
        if (micro == 0) { fp8_calibrate(m, d->inputs, d->targets, d->B, d->T, 1.0f / accum, step); }
        fox_forward(m, d->inputs, d->targets, d->B, d->T);
        fox_backward(m, 1.0f / accum);
        loss += m->mean_loss / accum;
    }
    return loss;
}

// one setting that a resume changes: said, so that a resume is exact, refused or noted; 1 when said
static int resume_note(const char* flag, double was, double is, const char* what) {
    if (was != is) { printf("note: the run had %s %g, this one %s %g: %s from here\n", flag, was, flag, is, what); }
    return was != is;
}

// -y 1 with settings other than the checkpoint's run had: each that changes the steps from here is noted (the
// data's settings are checked by resume_data_position, the model's by resume_run); returns how many
static int resume_notes(const TrainState* s, const Args* a) {
    int n = 0;
    if (s->total_batch_tokens != a->total_batch_tokens) {
        printf("note: the run had -d %lld, this one -d %ld: the schedule goes on from the tokens seen\n",
               (long long)s->total_batch_tokens, a->total_batch_tokens);
        n++;
    }
    if (!s->has_settings) { return n; } // a version-2 file: read_state warned
    LRSchedule now = run_schedule(a, s);
    n += resume_note("-l", s->lr, a->lr, "the peak learning rate changes");
    if (s->schedule != a->schedule) {
        printf("note: the run had -k %s, this one -k %s: the schedule's shape changes from here\n",
               SCHEDULE_NAMES[s->schedule], SCHEDULE_NAMES[a->schedule]);
        n++;
    }
    n += resume_note("-u", s->warmup_tokens, now.warmup_tokens, "the warmup changes");
    if (s->end_tokens != now.total_tokens) {
        printf("note: the run's schedule ended at %.0f tokens, this one's at %.0f (another -x or -d): the learning "
               "rate follows the new end from here\n", s->end_tokens, now.total_tokens);
        n++;
    }
    n += resume_note("-c", s->weight_decay, a->weight_decay, "the weight decay changes");
    n += resume_note("-a", s->grad_clip, a->grad_clip, "the gradient clipping changes");
    n += resume_note("-A", s->prune, a->prune, "attention pruning changes");
    if (a->prune) { n += resume_note("-L", s->prune_ln_eps, a->prune_ln_eps, "the pruning bound changes"); }
    if (s->on_nonfinite != a->on_nonfinite) {
        printf("note: the run had -G %s, this one -G %s\n", NONFINITE_NAMES[s->on_nonfinite],
               NONFINITE_NAMES[a->on_nonfinite]);
        n++;
    }
    n += resume_note("-Z", s->spike_z, a->spike_z, "the spike guard changes");
    n += resume_note("-f", s->documents, a->documents, "what attention sees across documents changes");
    if (s->fp8 != a->fp8) {
        printf("note: the run had -q %s, this one -q %s: the matmuls' precision changes from here%s\n",
               FP8_MODE_NAMES[s->fp8], FP8_MODE_NAMES[a->fp8], s->fp8 == FP8_MODE_OFF ? " (FP8 scales calibrated "
               "on the first step)" : a->fp8 == FP8_MODE_OFF ? " (the FP8 amax histories are dropped)" : "");
        n++;
    }
    return n;
}

// One checkpoint of -y 1 into the model and s: 0, or -1 with e set (e->damaged: a resume may go on to an
// older one). Another model than the run's stops the run: that is no damage but another run.
static int resume_candidate(FoxModel* model, const Args* a, const char* model_path, const char* state_path,
                            TrainState* s, FileError* e) {
    FoxModel loaded;
    if (read_model(&loaded, model_path, e) != 0) { return -1; }
    if (loaded.num_parameters != model->num_parameters
        || memcmp(&loaded.config, &model->config, sizeof(FoxConfig)) != 0) {
        fail("the checkpoint '%s' holds another model than -e %s\n"
             "HINT: resume with the same -e and overrides as the run that wrote it", model_path, a->model);
    }
    memcpy(model->params_memory, loaded.params_memory, model->num_parameters * sizeof(float));
    fox_free(&loaded);
    return read_state(model, s, state_path, e);
}

// -y 1, both trainers: the newest intact checkpoint of -o into the model (weights and AdamW moments) and
// the data loader where that run stopped (resume_data_position); returns the run's state. A damaged
// checkpoint (checksum, size, header) is skipped, with the reason, for the next older one; it stays in place
// until the run writes its step again.
static TrainState resume_run(FoxModel* model, const Args* a, DataLoader* train) {
    int n;
    int* steps = checkpoint_steps(a->out_dir, &n);
    if (n == 0) {
        fail("-y 1: no checkpoint (model_*.bin with its state_*.bin) in '%s'\nHINT: start without -y", a->out_dir);
    }
    char model_path[4096], state_path[4096];
    TrainState s;
    int found = 0;
    for (int i = 0; i < n && !found; i++) {
        checkpoint_paths(a->out_dir, steps[i], model_path, state_path, sizeof(model_path));
        FileError e;
        found = resume_candidate(model, a, model_path, state_path, &s, &e) == 0;
        if (!found && !e.damaged) { fail("-y 1: %s\nHINT: %s", e.why, e.hint); }
        if (!found) { printf("warning: -y 1 skips the checkpoint of step %d: %s\n", steps[i], e.why); }
    }
    free(steps);
    if (!found) {
        fail("-y 1: none of the %d checkpoint(s) in '%s' is intact (the reasons are above)\nHINT: restore them "
             "from a copy, or start a new run (another -o) from weights you trust with -e", n, a->out_dir);
    }
    int batch_pos = resume_data_position(&s, train, state_path);
    check_resume_steps(s.step, a->steps, a->out_dir);
    dataloader_set_position(train, s.epoch, s.shard_pos, batch_pos);
    printf("resumed from %s at step %d, %lld tokens seen (written by %d process(es))\n", model_path, s.step,
           (long long)s.tokens_seen, s.world);
    resume_notes(&s, a);
    return s;
}

// The schedule of a run, fresh (resumed = NULL) or resumed: the remaining steps of -d tokens each end
// it, and the rate of each step follows the tokens seen before it (lr_at_tokens), so a resume with
// another -d goes on where the tokens say. The warmup is -u, else the resumed run's, else
// min(256 x 2^20, 10% of the run's tokens).
static LRSchedule run_schedule(const Args* a, const TrainState* resumed) {
    long start = resumed != NULL ? resumed->step : 0;
    double seen = resumed != NULL ? (double)resumed->tokens_seen : 0.0;
    LRSchedule s = {a->schedule, a->lr, 0, seen + (double)(a->steps - start) * (double)a->total_batch_tokens,
                    (double)a->total_batch_tokens};
    if (a->warmup_tokens >= 0) { s.warmup_tokens = (double)a->warmup_tokens; }
    else if (resumed != NULL) { s.warmup_tokens = resumed->warmup_tokens; }
    else { s.warmup_tokens = fmin(268435456.0, 0.1 * s.total_tokens); }
    return s;
}

// The end of a guarded step, shared by both trainers: STEP_STOP ends the run with the reason
// (and the non-finite tensor when one was named); otherwise the step line printed so far gets
// its ending and main.log its record (llm.c's "s:<step> trl:<loss>", then the step's fields).
static void step_guard_stop(long step, const char* why, const char* grad) {
    fail("step %ld: %s%s%s: training diverged\n"
         "HINT: lower the learning rate (-l), resume from an earlier checkpoint, or pass -G skip",
         step, why, grad[0] ? "; " : "", grad);
}

static void step_guard_log(RunDir* out, const StepGuard* g, int verdict, long step, double loss, const char* why,
                           const char* grad, const char* fields) {
    if (verdict == STEP_SKIP) {
        printf(" | skipped (%ld so far): %s%s%s\n", g->skipped, why, grad[0] ? "; " : "", grad);
        log_line(out, "s:%ld trl:%.6f skip:%ld%s\n", step, loss, g->skipped, fields);
    } else {
        printf("\n");
        log_line(out, "s:%ld trl:%.6f%s\n", step, loss, fields);
    }
}

// main.log's fields of a step after its loss: what dev/plot_log.py draws
static void step_log_fields(char* buf, size_t n, float lr, double norm, double tok_s, int64_t tokens_seen) {
    snprintf(buf, n, " lr:%.4e norm:%.4f tokps:%.0f tokens:%lld", lr, norm, tok_s, (long long)tokens_seen);
}

// The run's clock: when it started and when its last steps ended (validation, samples and
// checkpoints included), so the time left is the mean of the recent steps times the steps left.
#define CLOCK_STEPS 16
typedef struct {
    double start;
    double ends[CLOCK_STEPS + 1]; // a ring of the last step ends
    int count;                    // step ends seen
} RunClock;

static void run_clock_start(RunClock* c) { memset(c, 0, sizeof(*c)); c->start = now_seconds(); }

static void run_clock_tick(RunClock* c) { c->ends[c->count++ % (CLOCK_STEPS + 1)] = now_seconds(); }

static void format_duration(char* buf, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) { snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60); }
    else if (t >= 60) { snprintf(buf, n, "%ldm%02lds", t / 60, t % 60); }
    else { snprintf(buf, n, "%lds", t); }
}

// " | 1.64M tok | 1m23s, ETA 9m12s": tokens seen, time since the start, time left
static void format_progress(char* buf, size_t n, const RunClock* c, long steps_left, int64_t tokens_seen) {
    double tok = (double)tokens_seen;
    char count[32], elapsed[32], eta[48] = "";
    if (tok >= 1e9) { snprintf(count, sizeof(count), "%.2fB", tok / 1e9); }
    else if (tok >= 1e6) { snprintf(count, sizeof(count), "%.2fM", tok / 1e6); }
    else if (tok >= 1e4) { snprintf(count, sizeof(count), "%.1fk", tok / 1e3); }
    else { snprintf(count, sizeof(count), "%lld", (long long)tokens_seen); }
    double now = c->count > 0 ? c->ends[(c->count - 1) % (CLOCK_STEPS + 1)] : now_seconds();
    format_duration(elapsed, sizeof(elapsed), now - c->start);
    int span = c->count - 1 < CLOCK_STEPS ? c->count - 1 : CLOCK_STEPS; // step periods in the ring
    if (span > 0 && steps_left > 0) {
        double first = c->ends[(c->count - 1 - span) % (CLOCK_STEPS + 1)];
        char left[32];
        format_duration(left, sizeof(left), (now - first) / span * (double)steps_left);
        snprintf(eta, sizeof(eta), ", ETA %s", left);
    }
    snprintf(buf, n, " | %s tok | %s%s", count, elapsed, eta);
}

// Test hook: TRAIN_FOX_TEST_KILL_BETWEEN=<step> kills the process between the two files of that
// step's checkpoint, as a crash there would (dev/test_reliability.sh)
static void test_kill_between(int step) {
#ifdef FOX_TEST_HOOKS
    const char* at = getenv("TRAIN_FOX_TEST_KILL_BETWEEN");
    if (at != NULL && atoi(at) == step) { raise(SIGKILL); }
#else
    (void)step;
#endif
}

static void save_checkpoint(const FoxModel* m, const char* dir, const TrainState* s) {
    char model_path[4096], state_path[4096];
    checkpoint_paths(dir, s->step, model_path, state_path, sizeof(model_path));
    save_state(m, s, state_path); // first: the checkpoint is complete once its model file exists
    test_kill_between(s->step);
    save_model(m, model_path);
    printf("saved %s\n", model_path);
}

// ----------------------------------------------------------------------------
// data-parallel processes, for train_fox.cu (one process per GPU; plain C, no CUDA or NCCL, so
// that the CPU tests run it): the process's rank, world size and local rank (from flags or the
// launcher's environment) and the exchange of the NCCL unique id through a shared file or a TCP
// rendezvous. A saved data position is translated to another process count by resume_data_position.
// Compiled where another file includes this one (FOX_NO_MAIN): the twin itself trains in one process.
#ifdef FOX_NO_MAIN

#define RENDEZVOUS_TIMEOUT_S 300

// ----------------------------------------------------------------------------
// who am I: flags win over the environment; the environment names of Open MPI, Slurm and
// torchrun-style launchers are read in that order

typedef struct {
    int rank, world;
    int local_rank; // rank among the processes of this node: picks the GPU
} Topology;

static const char* const WORLD_ENV[] = {"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "WORLD_SIZE"};
static const char* const RANK_ENV[] = {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "RANK"};
static const char* const LOCAL_RANK_ENV[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"};

// the value of the first of `names` that is set (its name in *which), or -1 when none is
static long env_first_int(const char* const* names, int n, const char** which) {
    for (int i = 0; i < n; i++) {
        const char* v = getenv(names[i]);
        if (v == NULL || v[0] == '\0') { continue; }
        long x;
        if (!parse_int_strict(v, &x) || x < 0 || x > (1 << 20)) {
            fail("environment variable %s=%s is not a process count or rank\nHINT: unset it, or pass -W and -I",
                 names[i], v);
        }
        *which = names[i];
        return x;
    }
    return -1;
}

// flag_world < 1 and flag_rank < 0 mean "not given". The local rank comes from the launcher
// that gave the rank; with -I it is the rank (one node, or GPUs picked modulo their count).
static void resolve_topology(Topology* t, int flag_world, int flag_rank) {
    const char* world_from = "-W";
    const char* rank_from = "-I";
    const char* local_from = "";
    long world = flag_world >= 1 ? flag_world : env_first_int(WORLD_ENV, 3, &world_from);
    if (world < 0) { world = 1; world_from = "default"; }
    if (world == 0) { fail("a world of 0 processes (from %s)\nHINT: the process count is at least 1", world_from); }
    long rank = flag_rank >= 0 ? flag_rank : env_first_int(RANK_ENV, 3, &rank_from);
    if (rank < 0) {
        if (world > 1) {
            fail("%ld processes (from %s) but no rank for this one\n"
                 "HINT: pass -I <rank> to each process, or launch with mpirun / srun",
                 world, world_from);
        }
        rank = 0;
    }
    if (rank >= world) {
        fail("rank %ld (from %s) is not below the world size %ld (from %s)\n"
             "HINT: ranks run from 0 to world-1; check -I and -W",
             rank, rank_from, world, world_from);
    }
    long local = flag_rank >= 0 ? -1 : env_first_int(LOCAL_RANK_ENV, 3, &local_from);
    t->world = (int)world;
    t->rank = (int)rank;
    t->local_rank = local >= 0 ? (int)local : (int)rank;
}

// ----------------------------------------------------------------------------
// rendezvous: rank 0 hands its NCCL unique id to the others. "-F tcp://host:port": rank 0
// listens on port, the others connect to host:port. "-F <path>" on a filesystem all
// processes share: rank 0 writes the id atomically, each other rank reads it and leaves an
// acknowledgement file "<path>.ack<rank>"; rank 0 waits for all of them (so a missing
// process is reported instead of hanging in NCCL's init) and removes the files after init.

// 1 with host and port filled for "tcp://host:port", 0 for a file path
static int rendezvous_is_tcp(const char* spec, char* host, size_t host_size, int* port) {
    if (strncmp(spec, "tcp://", 6) != 0) { return 0; }
    const char* hp = spec + 6;
    const char* colon = strrchr(hp, ':');
    long p;
    if (colon == NULL || colon == hp || (size_t)(colon - hp) >= host_size || !parse_int_strict(colon + 1, &p)
        || p < 1 || p > 65535) {
        fail("-F %s: expected tcp://<host of rank 0>:<port 1-65535>\n"
             "HINT: e.g. -F tcp://node001:29500, or a file path on a shared filesystem", spec);
    }
    memcpy(host, hp, (size_t)(colon - hp));
    host[colon - hp] = '\0';
    *port = (int)p;
    return 1;
}

static void rendezvous_ack_path(const char* path, int rank, char* out, size_t n) {
    if ((size_t)snprintf(out, n, "%s.ack%d", path, rank) >= n) {
        fail("rendezvous path too long: '%s'\nHINT: pass a shorter -F path", path);
    }
}

static void rendezvous_file_cleanup(const char* path, int world) {
    char ack[4096];
    unlink(path);
    for (int r = 1; r < world; r++) { rendezvous_ack_path(path, r, ack, sizeof(ack)); unlink(ack); }
}

static void rendezvous_file_publish(const char* path, const void* id, size_t n, int world) {
    if (access(path, F_OK) == 0) {
        fail("rendezvous file '%s' already exists, probably left by a run that crashed\n"
             "HINT: delete it, or pass a fresh path to -F (e.g. with the job id in it)", path);
    }
    char ack[4096];
    for (int r = 1; r < world; r++) { rendezvous_ack_path(path, r, ack, sizeof(ack)); unlink(ack); }
    char tmp[4096];
    FILE* f = atomic_open(path, tmp, sizeof(tmp));
    fwrite_check(id, 1, n, f, tmp);
    atomic_commit(f, tmp, path);
}

static void rendezvous_file_await_acks(const char* path, int world, double timeout_s) {
    double start = now_seconds();
    for (;;) {
        int missing = 0, first_missing = -1;
        char ack[4096];
        for (int r = 1; r < world; r++) {
            rendezvous_ack_path(path, r, ack, sizeof(ack));
            if (access(ack, F_OK) != 0) { missing++; if (first_missing < 0) { first_missing = r; } }
        }
        if (missing == 0) { return; }
        if (now_seconds() - start > timeout_s) {
            rendezvous_file_cleanup(path, world);
            fail("rank 0 waited %g s at rendezvous '%s': %d of %d processes never joined "
                 "(the first missing is rank %d)\n"
                 "HINT: start every process with the same -W and -F and its own -I; "
                 "the path must be on a filesystem they all see",
                 timeout_s, path, missing, world - 1, first_missing);
        }
        usleep(20000);
    }
}

static void rendezvous_file_fetch(const char* path, void* id, size_t n, int rank, double timeout_s) {
    double start = now_seconds();
    for (;;) {
        struct stat st;
        if (stat(path, &st) == 0 && (size_t)st.st_size == n) { break; }
        if (now_seconds() - start > timeout_s) {
            fail("rank %d waited %g s for rank 0 to write the rendezvous file '%s'\n"
                 "HINT: start rank 0 with the same -F; the path must be on a filesystem all processes see",
                 rank, timeout_s, path);
        }
        usleep(20000);
    }
    FILE* f = fopen_check(path, "rb");
    fread_check(id, 1, n, f, path);
    fclose(f);
    char ack[4096];
    rendezvous_ack_path(path, rank, ack, sizeof(ack));
    FILE* a = fopen_check(ack, "wb");
    if (fclose(a) != 0) {
        fail("could not write '%s': %s\nHINT: every process must be able to write in the -F path's directory", ack,
             strerror(errno));
    }
}

// sends or receives exactly n bytes; 0 on a closed or broken connection
static int socket_send_all(int fd, const void* buf, size_t n) {
    const char* p = (const char*)buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) { if (k < 0 && errno == EINTR) { continue; } return 0; }
        p += k; n -= (size_t)k;
    }
    return 1;
}

static int socket_recv_all(int fd, void* buf, size_t n) {
    char* p = (char*)buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k <= 0) { if (k < 0 && errno == EINTR) { continue; } return 0; }
        p += k; n -= (size_t)k;
    }
    return 1;
}

// a peer that connects and then says nothing must not block the rendezvous
static void socket_set_timeout(int fd, int seconds) {
    struct timeval tv = {seconds, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// a socket listening on port on every address: IPv6 dual stack (IPv4 peers too), else IPv4
static int listen_any(int port, int backlog) {
    int one = 1, zero = 0;
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
        struct sockaddr_in6 addr;
        memset(&addr, 0, sizeof(addr));
        addr.sin6_family = AF_INET6; addr.sin6_addr = in6addr_any; addr.sin6_port = htons((uint16_t)port);
        if (bind(fd, (struct sockaddr*)&addr, sizeof(addr)) == 0 && listen(fd, backlog) == 0) { return fd; }
        close(fd);
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        fail("rendezvous: could not open a socket: %s\nHINT: use a -F file path all processes see instead",
             strerror(errno));
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET; addr.sin_addr.s_addr = htonl(INADDR_ANY); addr.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr*)&addr, sizeof(addr)) != 0 || listen(fd, backlog) != 0) {
        fail("rendezvous: rank 0 could not listen on port %d: %s\nHINT: pick a free port in -F tcp://host:port", port,
             strerror(errno));
    }
    return fd;
}

// rank 0: accepts one connection from every other rank (each sends its rank as an int32)
// and sends each the id
static void rendezvous_tcp_serve(int port, const void* id, size_t n, int world, double timeout_s) {
    int fd = listen_any(port, world);
    char* joined = (char*)calloc_check((size_t)world, 1, "rendezvous ranks");
    int remaining = world - 1;
    double start = now_seconds();
    while (remaining > 0) {
        double left = timeout_s - (now_seconds() - start);
        struct pollfd pfd = {fd, POLLIN, 0};
        int ready = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
        if (ready < 0 && errno == EINTR) { continue; }
        if (ready <= 0) {
            int first = 1;
            while (first < world && joined[first]) { first++; }
            fail("rank 0 waited %g s on port %d: %d of %d processes never joined (the first missing is rank %d)\n"
                 "HINT: start every process with the same -W and -F and its own -I; "
                 "the host in -F must be rank 0's, reachable from all",
                 timeout_s, port, remaining, world - 1, first);
        }
        int c = accept(fd, NULL, NULL);
        if (c < 0) { continue; }
        socket_set_timeout(c, 10);
        int32_t r = -1;
        if (socket_recv_all(c, &r, sizeof(r)) && r >= 1 && r < world && !joined[r] && socket_send_all(c, id, n)) {
            joined[r] = 1;
            remaining--;
        } else if (r >= 1 && r < world && joined[r]) {
            fail("rendezvous: two processes claim rank %d\nHINT: give each process its own -I", (int)r);
        }
        close(c);
    }
    free(joined);
    close(fd);
}

// ranks > 0: connects to rank 0 (retrying while it is not listening yet) and receives the id
static void rendezvous_tcp_fetch(const char* host, int port, void* id, size_t n, int rank, double timeout_s) {
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    double start = now_seconds();
    for (;;) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC; hints.ai_socktype = SOCK_STREAM;
        int gai = getaddrinfo(host, port_s, &hints, &res);
        if (gai != 0) {
            fail("rendezvous: cannot resolve '%s': %s\n"
                 "HINT: the host in -F tcp://host:port must be rank 0's name or address", host, gai_strerror(gai));
        }
        for (struct addrinfo* ai = res; ai != NULL; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
            if (fd < 0) { continue; }
            socket_set_timeout(fd, 10);
            int32_t r = rank;
            int got = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && socket_send_all(fd, &r, sizeof(r)) &&
                      socket_recv_all(fd, id, n);
            close(fd);
            if (got) { freeaddrinfo(res); return; }
        }
        freeaddrinfo(res);
        if (now_seconds() - start > timeout_s) {
            fail("rank %d could not get the NCCL id from %s:%d within %g s\n"
                 "HINT: start rank 0 with the same -F; check the host name, the port and the firewall",
                 rank, host, port, timeout_s);
        }
        usleep(100000);
    }
}

#endif // FOX_NO_MAIN

// ----------------------------------------------------------------------------
// the evaluation modes of both trainers: -M eval, generate, niah and maps. Training needs
// nothing from here on; the GPU trainer adds its own backend (train_fox.cu, gpu_eval_main).
// In order:
//   evaluation backends   ForwardBackend: the interface the modes run on (the GPU backend is in
//                         train_fox.cu, the CPU backend below)
//   the twin's KV cache   FoxDecoder, HeadCache, fox_decode_step: one token at a time, the
//                         forget-gate state carried in O(1), eviction under -A 1
//   the CPU backend       CpuBackend, cpu_backend_init
//   sampling              argmax_token, sample_token: greedy, temperature, top-k
//   text in               the GPT-2 encoder (data/gpt2_bpe.c), prompt_tokens, read_token_stream
//   -M eval               per_token_loss, run_eval
//   -M generate           run_generate
//   -M niah               niah_build_prompt, niah_score, run_niah
//   -M maps               attention_maps, run_maps
//   entry points          eval_mode_shape, check_eval_args, run_eval_mode, cpu_eval_main
// What the modes measure and how is in dev/fox.md, "Evaluation conventions"; how to run them
// is in README.md.

// ----------------------------------------------------------------------------
// evaluation backends: the evaluation modes (eval, generate, niah) run on either trainer
// through this interface; the CPU backend is the twin (fox_forward and a KV cache), the GPU
// backend is in train_fox.cu (gpu_forward)

// -M generate's work for a backend: B prompts continued by `gen` tokens each, sampled with the
// same rule (sample_token) from the seed of each sequence (generate_seed)
typedef struct {
    int B, gen;            // sequences, new tokens per sequence
    int cap;               // row stride of tokens: the longest prompt plus gen
    int* tokens;           // (B, cap): prompt b in its first lens[b] entries, its new tokens written after them
    const int* lens;       // (B)
    double temperature;    // 0: greedy
    int top_k;             // 0: all V
    uint64_t seed;         // -S
    void (*on_token)(void* user, int b, int token); // each new token as it comes (NULL: none), step by step
    void* user;
    double t_prompt;       // set by the backend: seconds until every sequence has its first new token
} GenerateJob;

typedef struct {
    void* ctx;
    int vocab_size;
    // runs inputs, targets (B, T) (targets may be NULL); with targets, copies the per-token
    // losses to losses (B * T) on the host
    void (*forward)(void* ctx, const int* inputs, const int* targets, int B, int T, float* losses);
    // copies the first V logits of row n (of B * T) of the last forward to out (V)
    void (*logits_row)(void* ctx, size_t n, float* out);
    // starts a new sequence for next_logits
    void (*reset)(void* ctx);
    // logits (V) of the token that follows tokens[0 .. t-1]; between resets t only grows, so a
    // backend may cache what it computed for the earlier tokens
    void (*next_logits)(void* ctx, const int* tokens, int t, float* out);
    // runs a whole GenerateJob (above) itself, or NULL: run_generate then feeds next_logits one
    // sequence at a time (the GPU backend's decoder generates every sequence in one loop)
    void (*generate)(void* ctx, GenerateJob* job);
} ForwardBackend;

// the sampling state of sequence b: the seed's stream for the first (as before batches existed), a
// splitmix64 mix of the seed and b for the others
static uint64_t generate_seed(uint64_t seed, int b) {
    uint64_t s = seed ^ 0x5DEECE66Dull, mix = (uint64_t)b;
    return b == 0 ? s : s ^ rng_next(&mix);
}

// ----------------------------------------------------------------------------
// incremental decoding on the CPU twin: a KV cache whose forget-gate state advances in O(1)
// per token. Per layer and head it keeps the attention keys (after KV-shift, QK-norm and RoPE at
// their own positions), the values, and c_j of each kept position; the running sum c continues
// from the last token, and the KV-shift keeps the last raw k and v. A step runs the same layer
// functions as fox_forward on one row, in the same order.
// Each (layer, head) keeps the positions first .. len - 1 in a buffer of its own that compacts:
// positions before `first` are dropped for good, by the sliding window (first > len - window) or
// by eviction, and their memory is reused or returned (HeadCache).
// Eviction (-A 1, forget gate and QK-norm): with QK-norm every query and key of head h obeys
// |q.k| / sqrt(hd) <= U_h = max|w_q| max|w_k| sqrt(hd), so any later query i weighs key j at most
// exp(2U_h + c_i - c_j) <= exp(2U_h + c_now - c_j) (c only decreases). Once c_now - c_j < delta_h
// = ln eps - ln max_len - 2U_h, key j carries less than eps / max_len of every later row, less
// than eps all evicted keys together: it is dropped (the head's first kept position moves past it).
// Documents (-f 1): a step whose token is the EOT restarts the context at its position (fox_decoder_restart), as
// fox_forward's document starts do; the cache of what no later query sees is freed.

typedef struct {
    float *resid, *xa, *rstd, *q_raw, *k_raw, *v_raw, *alpha, *k_shifted, *v_shifted;
    float *q_normed, *k_normed, *q, *k_new, *v_new, *gate_logit, *o, *o_normed, *og_logit, *y, *attproj;
    float *resid_mid, *xm, *gu, *act, *mlpproj, *xf, *scores, *logits;
} DecoderRow; // one token's activations: (C), (2I), (I), (H), scores (H, max kept), (Vp)

// One (layer, head)'s cache: positions base .. base + slots - 1 may sit in the slots, those from
// `first` to the newest are live. Appending past the last slot first slides the live positions
// to slot 0 when at least half the slots are dead, else doubles the slots; after a slide a buffer
// more than 4x too large is halved. So memory follows the live positions (within 4x) and each
// position is moved O(1) times on average.
typedef struct {
    float* k;   // (slots, hd)
    float* v;   // (slots, hd)
    float* c;   // (slots), c_j of each position (0 without a forget gate)
    int base;   // position in slot 0
    int slots;  // allocated
    int first;  // oldest live position
} HeadCache;

typedef struct {
    const FoxModel* m;
    int max_len;        // tokens a sequence may reach
    int max_kept;       // positions a head can keep: max_len, or the window
    int slot_cap;       // slots a head may allocate: twice the window (then a slide frees half), at most max_len
    int len;            // tokens consumed since the reset
    HeadCache* heads;   // (L, H)
    float* c_last;      // (L, H) running sum c of the last token
    float* k_raw_last;  // (L, C) raw k and v of the last token, for the KV-shift
    float* v_raw_last;  // (L, C)
    float* evict_delta; // (L, H) eviction threshold delta_h, or NULL: no eviction
    size_t peak_bytes;  // the most the heads' buffers held since the reset
    DecoderRow row;
} FoxDecoder;

static size_t head_cache_bytes(const HeadCache* hc, int hd) {
    return (size_t)hc->slots * (2 * (size_t)hd + 1) * sizeof(float);
}

static size_t fox_decoder_bytes(const FoxDecoder* d) {
    const FoxConfig* cf = &d->m->config;
    size_t bytes = 0;
    for (int i = 0; i < cf->n_layer * cf->n_head; i++) {
        bytes += head_cache_bytes(&d->heads[i], cf->n_embd / cf->n_head);
    }
    return bytes;
}

static void head_cache_resize(HeadCache* hc, int slots, int hd) {
    hc->k = (float*)realloc(hc->k, (size_t)slots * hd * sizeof(float));
    hc->v = (float*)realloc(hc->v, (size_t)slots * hd * sizeof(float));
    hc->c = (float*)realloc(hc->c, (size_t)slots * sizeof(float));
    if (hc->k == NULL || hc->v == NULL || hc->c == NULL) {
        fail("could not allocate the KV cache (%d positions of a head)\nHINT: shorten -t or the prompt", slots);
    }
    hc->slots = slots;
}

// makes room for position pos (the newest); returns its slot
static int head_cache_slot(HeadCache* hc, int pos, int hd, int slot_cap) {
    if (pos - hc->base < hc->slots) { return pos - hc->base; }
    int live = pos - hc->first, dead = hc->first - hc->base;
    if (dead > 0 && dead >= hc->slots / 2) { // slide the live positions to slot 0
        memmove(hc->k, hc->k + (size_t)dead * hd, (size_t)live * hd * sizeof(float));
        memmove(hc->v, hc->v + (size_t)dead * hd, (size_t)live * hd * sizeof(float));
        memmove(hc->c, hc->c + dead, (size_t)live * sizeof(float));
        hc->base = hc->first;
        if (hc->slots > 4 * (live + 1) && hc->slots > 16) { head_cache_resize(hc, hc->slots / 2, hd); }
    } else {
        int slots = hc->slots > 0 ? 2 * hc->slots : 16;
        head_cache_resize(hc, slots < slot_cap ? slots : slot_cap, hd);
    }
    if (pos - hc->base >= hc->slots) { fail("internal: the KV cache of a head is full at position %d" BUG_HINT, pos); }
    return pos - hc->base;
}

// A fresh context from position pos on: c and the KV-shift's last raw k and v restart from 0 (k~_{pos-1} = 0), and
// every head's buffers are freed, its first kept position pos. At pos 0 a new sequence; later the start of a
// document (-f 1: its EOT token), which sees nothing before it, at the sequence's positions (RoPE is relative), and
// whose gate c does not hold (c_pos = 0: fox_decode_step adds no log f there).
static void fox_decoder_restart(FoxDecoder* d, int pos) {
    const FoxConfig* cf = &d->m->config;
    size_t L = (size_t)cf->n_layer;
    memset(d->c_last, 0, L * cf->n_head * sizeof(float));
    memset(d->k_raw_last, 0, L * cf->n_embd * sizeof(float));
    memset(d->v_raw_last, 0, L * cf->n_embd * sizeof(float));
    for (size_t i = 0; i < L * cf->n_head; i++) {
        HeadCache* hc = &d->heads[i];
        free(hc->k); free(hc->v); free(hc->c);
        memset(hc, 0, sizeof(*hc));
        hc->base = hc->first = pos;
    }
}

static void fox_decoder_reset(FoxDecoder* d) {
    fox_decoder_restart(d, 0);
    d->len = 0;
    d->peak_bytes = 0;
}

// delta_h (L, H) of every (layer, head) from the QK-norm weights (FoxDecoder's comment), for
// sequences up to max_len; the bound U is raised by `margin` for the rounding of q and k (both
// decoders: the twin's fp32 RMSNorm and RoPE, the GPU's bf16 q and k)
static float* evict_thresholds(const FoxModel* m, float ln_eps, int max_len, float margin) {
    const FoxConfig* cf = &m->config;
    int L = cf->n_layer, H = cf->n_head, hd = cf->n_embd / H, groups = cf->qk_norm_shared ? 1 : H;
    size_t qk_per = m->spec[P_Q_NORM].rows;
    float* delta = (float*)malloc_check((size_t)L * H * sizeof(float), "eviction thresholds");
    for (int l = 0; l < L; l++) {
        for (int h = 0; h < H; h++) {
            const float* wq = LAYER(m->params.q_norm, l, qk_per) + (size_t)(h % groups) * hd;
            const float* wk = LAYER(m->params.k_norm, l, qk_per) + (size_t)(h % groups) * hd;
            float mq = 0.0f, mk = 0.0f;
            for (int i = 0; i < hd; i++) { mq = fmaxf(mq, fabsf(wq[i])); mk = fmaxf(mk, fabsf(wk[i])); }
            float U = mq * mk * sqrtf((float)hd) * margin;
            delta[(size_t)l * H + h] = prune_delta_base(ln_eps, max_len) - 2.0f * U;
        }
    }
    return delta;
}

// the twin's thresholds: U raised by 1e-3 for the float rounding of RMSNorm and RoPE
static void fox_decoder_evict_init(FoxDecoder* d, float ln_eps) {
    d->evict_delta = evict_thresholds(d->m, ln_eps, d->max_len, 1.001f);
}

static void fox_decoder_init(FoxDecoder* d, const FoxModel* m, int max_len) {
    const FoxConfig* cf = &m->config;
    size_t L = (size_t)cf->n_layer, C = (size_t)cf->n_embd, H = (size_t)cf->n_head, I = (size_t)cf->mlp_hidden;
    memset(d, 0, sizeof(*d));
    d->m = m;
    d->max_len = max_len;
    d->max_kept = cf->window > 0 && cf->window < max_len ? cf->window : max_len;
    d->slot_cap = 2 * d->max_kept < max_len ? 2 * d->max_kept : max_len;
    d->heads = (HeadCache*)calloc_check(L * H, sizeof(HeadCache), "KV cache heads");
    d->c_last = (float*)malloc_check(L * H * sizeof(float), "KV cache c");
    d->k_raw_last = (float*)malloc_check(L * C * sizeof(float), "KV cache shift");
    d->v_raw_last = (float*)malloc_check(L * C * sizeof(float), "KV cache shift");
    if (m->prune && cf->gate != GATE_NONE && cf->qk_norm) { fox_decoder_evict_init(d, m->prune_ln_eps); }
    DecoderRow* r = &d->row;
    float** rows_c[] = {&r->resid, &r->xa, &r->q_raw, &r->k_raw, &r->v_raw, &r->k_shifted, &r->v_shifted,
                        &r->q_normed, &r->k_normed, &r->q, &r->k_new, &r->v_new, &r->o, &r->o_normed, &r->og_logit,
                        &r->y, &r->attproj, &r->resid_mid, &r->xm, &r->mlpproj, &r->xf};
    for (size_t i = 0; i < sizeof(rows_c) / sizeof(rows_c[0]); i++) {
        *rows_c[i] = (float*)malloc_check(C * sizeof(float), "decoder row");
    }
    r->rstd = (float*)malloc_check(H * sizeof(float), "decoder row");
    r->alpha = (float*)malloc_check(H * sizeof(float), "decoder row");
    r->gate_logit = (float*)malloc_check(H * sizeof(float), "decoder row");
    r->gu = (float*)malloc_check(2 * I * sizeof(float), "decoder row");
    r->act = (float*)malloc_check(I * sizeof(float), "decoder row");
    r->scores = (float*)malloc_check(H * (size_t)d->max_kept * sizeof(float), "decoder row");
    r->logits = (float*)malloc_check((size_t)cf->padded_vocab_size * sizeof(float), "decoder row");
    fox_decoder_reset(d);
}

static void fox_decoder_free(FoxDecoder* d) {
    DecoderRow* r = &d->row;
    float* rows[] = {r->resid, r->xa, r->rstd, r->q_raw, r->k_raw, r->v_raw, r->alpha, r->k_shifted, r->v_shifted,
                     r->q_normed, r->k_normed, r->q, r->k_new, r->v_new, r->gate_logit, r->o, r->o_normed, r->og_logit,
                     r->y, r->attproj, r->resid_mid, r->xm, r->gu, r->act, r->mlpproj, r->xf, r->scores, r->logits};
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) { free(rows[i]); }
    fox_decoder_reset(d); // frees the heads' buffers
    free(d->heads); free(d->c_last); free(d->k_raw_last); free(d->v_raw_last); free(d->evict_delta);
    memset(d, 0, sizeof(*d));
}

// out (OC) = w (OC, IC) @ x (IC) + bias (OC): matmul_forward's sum for one row, parallel over
// the outputs (matmul_forward parallelises over rows, and a step has one)
static void matvec_forward(float* out, const float* x, const float* w, const float* bias, int IC, int OC) {
    #pragma omp parallel for if(parallel_pays((size_t)IC * OC))
    for (int o = 0; o < OC; o++) {
        const float* wrow = w + (size_t)o * IC;
        float acc = bias != NULL ? bias[o] : 0.0f;
        for (int i = 0; i < IC; i++) { acc += x[i] * wrow[i]; }
        out[o] = acc;
    }
}

// KV-shift of one token (kv_shift_forward's expression): out = alpha raw_last + (1 - alpha) raw;
// then raw becomes raw_last
static void kv_shift_step(float* out, const float* raw, float* raw_last, const float* alpha, int H, int hd) {
    for (int h = 0; h < H; h++) {
        float a = alpha[h];
        for (int i = 0; i < hd; i++) {
            size_t n = (size_t)h * hd + i;
            out[n] = a * raw_last[n] + (1.0f - a) * raw[n];
        }
    }
    memcpy(raw_last, raw, (size_t)H * hd * sizeof(float));
}

// RoPE of one row (H, hd) at position pos
static void rope_row(float* out, const float* inp, int pos, int H, int hd, float theta) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float cs, sn;
        rope_angle(pos, i, hd, theta, &cs, &sn);
        for (int h = 0; h < H; h++) {
            size_t off = (size_t)h * hd;
            float x1 = inp[off + i], x2 = inp[off + i + half];
            out[off + i] = x1 * cs - x2 * sn;
            out[off + i + half] = x2 * cs + x1 * sn;
        }
    }
}

// The query of one head at position pos (the newest in hc) against the head's live keys
// first .. pos, summed in position order as attention_forward does. q, o (hd); s: scratch
// (pos - first + 1); gated: add c_i - c_j.
static void decode_attention_head(float* o, const float* q, const HeadCache* hc, int pos, int hd, int gated, float* s) {
    float scale = 1.0f / sqrtf((float)hd);
    int j0 = hc->first - hc->base, n = pos - hc->first + 1;
    float c_i = hc->c[pos - hc->base];
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float* kj = hc->k + (size_t)(j0 + j) * hd;
        float dot = 0.0f;
        for (int d = 0; d < hd; d++) { dot += q[d] * kj[d]; }
        s[j] = dot * scale + (gated ? c_i - hc->c[j0 + j] : 0.0f);
        mx = fmaxf(mx, s[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < n; j++) { s[j] = expf(s[j] - mx); sum += s[j]; }
    for (int d = 0; d < hd; d++) { o[d] = 0.0f; }
    for (int j = 0; j < n; j++) {
        const float* vj = hc->v + (size_t)(j0 + j) * hd;
        float p = s[j] / sum;
        for (int d = 0; d < hd; d++) { o[d] += p * vj[d]; }
    }
}

// Drops the head's oldest keys that no later query can weigh above the bound (FoxDecoder's
// comment); never the newest, pos.
static void head_cache_evict(HeadCache* hc, int pos, float delta) {
    float c_now = hc->c[pos - hc->base];
    while (hc->first < pos && c_now - hc->c[hc->first - hc->base] < delta) { hc->first++; }
}

// (position, head) entries the attention of the next token reads, summed over layers: the live
// cache (at most `window` positions back, from each head's first kept position)
static size_t fox_decoder_live(const FoxDecoder* d) {
    const FoxConfig* cf = &d->m->config;
    size_t live = 0;
    int j_window = attention_first_key(d->len, cf->window);
    for (int i = 0; i < cf->n_layer * cf->n_head; i++) {
        int j0 = d->heads[i].first > j_window ? d->heads[i].first : j_window;
        live += (size_t)(d->len - j0);
    }
    return live;
}

// the live cache against the full one, and the memory the cache's buffers hold, for generate
static void fox_decoder_report(const FoxDecoder* d) {
    const FoxConfig* cf = &d->m->config;
    int hd = cf->n_embd / cf->n_head;
    size_t full = (size_t)cf->n_layer * cf->n_head * (size_t)(d->len - attention_first_key(d->len, cf->window));
    size_t live = fox_decoder_live(d);
    double mib = (2.0 * hd + 1.0) * sizeof(float) / 1048576.0; // k, v and c of one (position, head)
    printf("KV cache after %d tokens: %zu of %zu (position, head) entries live (%.1f%%), %.2f of %.2f MiB "
           "(keys, values, c); buffers %.2f MiB now, %.2f MiB at most; eviction %s\n",
           d->len, live, full, full > 0 ? 100.0 * live / full : 0.0,
           live * mib, full * mib, fox_decoder_bytes(d) / 1048576.0, d->peak_bytes / 1048576.0,
           d->evict_delta != NULL ? "on (-A 1)" : d->m->prune ? "off (needs a forget gate and QK-norm)" : "off");
}

// One layer's attention for the token at pos: appends its key, value and c to each head's cache
// (after dropping what the window no longer shows), attends, then evicts. q, k_new, v_new, o (C);
// c_new (H) or NULL without a forget gate.
static void decode_attention_layer(FoxDecoder* d, int l, int pos, const float* q, const float* k_new,
                                   const float* v_new, const float* c_new, float* o) {
    const FoxConfig* cf = &d->m->config;
    int H = cf->n_head, hd = cf->n_embd / H;
    HeadCache* heads = d->heads + (size_t)l * H;
    for (int h = 0; h < H; h++) {
        HeadCache* hc = &heads[h];
        int j_window = attention_first_key(pos, cf->window);
        if (hc->first < j_window) { hc->first = j_window; }
        size_t slot = (size_t)head_cache_slot(hc, pos, hd, d->slot_cap);
        memcpy(hc->k + slot * hd, k_new + (size_t)h * hd, (size_t)hd * sizeof(float));
        memcpy(hc->v + slot * hd, v_new + (size_t)h * hd, (size_t)hd * sizeof(float));
        hc->c[slot] = c_new != NULL ? c_new[h] : 0.0f;
    }
    #pragma omp parallel for if(parallel_pays((size_t)H * hd * (pos + 1)))
    for (int h = 0; h < H; h++) {
        decode_attention_head(o + (size_t)h * hd, q + (size_t)h * hd, &heads[h], pos, hd, c_new != NULL,
                              d->row.scores + (size_t)h * d->max_kept);
    }
    if (d->evict_delta != NULL) {
        for (int h = 0; h < H; h++) { head_cache_evict(&heads[h], pos, d->evict_delta[(size_t)l * H + h]); }
    }
}

// Feeds one token; its logits (Vp) land in d->row.logits.
static void fox_decode_step(FoxDecoder* d, int token) {
    const FoxConfig* cf = &d->m->config;
    int L = cf->n_layer, C = cf->n_embd, H = cf->n_head, hd = C / H, I = cf->mlp_hidden;
    int groups_qk = cf->qk_norm_shared ? 1 : H;
    size_t qk_per = d->m->spec[P_Q_NORM].rows;
    check_tokens(&token, 1, cf->vocab_size, "input");
    if (d->len >= d->max_len) { fail("internal: the KV cache holds at most %d tokens" BUG_HINT, d->max_len); }
    int pos = d->len;
    int doc_start = token == d->m->doc_eot && pos > 0; // a document starts: a fresh context from c_pos = 0
    if (token == d->m->doc_eot) { fox_decoder_restart(d, pos); }
    ParameterTensors p = d->m->params;
    DecoderRow* r = &d->row;
    memcpy(r->resid, p.wte + (size_t)token * C, (size_t)C * sizeof(float));
    for (int l = 0; l < L; l++) {
        // attention
        rmsnorm_forward(r->xa, r->rstd, r->resid, LAYER(p.attn_norm, l, C), 1, C, 1, 1e-6f);
        matvec_forward(r->q_raw, r->xa, LAYER(p.wq, l, (size_t)C * C), NULL, C, C);
        matvec_forward(r->k_raw, r->xa, LAYER(p.wk, l, (size_t)C * C), NULL, C, C);
        matvec_forward(r->v_raw, r->xa, LAYER(p.wv, l, (size_t)C * C), NULL, C, C);
        if (cf->k_shift) {
            matvec_forward(r->alpha, r->xa, LAYER(p.wk_shift, l, (size_t)H * C), NULL, C, H);
            sigmoid_inplace(r->alpha, (size_t)H);
            kv_shift_step(r->k_shifted, r->k_raw, LAYER(d->k_raw_last, l, C), r->alpha, H, hd);
        } else {
            memcpy(r->k_shifted, r->k_raw, (size_t)C * sizeof(float));
        }
        float* v_new = r->v_new;
        if (cf->v_shift) {
            matvec_forward(r->alpha, r->xa, LAYER(p.wv_shift, l, (size_t)H * C), NULL, C, H);
            sigmoid_inplace(r->alpha, (size_t)H);
            kv_shift_step(v_new, r->v_raw, LAYER(d->v_raw_last, l, C), r->alpha, H, hd);
        } else {
            memcpy(v_new, r->v_raw, (size_t)C * sizeof(float));
        }
        if (cf->qk_norm) {
            rmsnorm_forward(r->q_normed, r->rstd, r->q_raw, LAYER(p.q_norm, l, qk_per), H, hd, groups_qk, 1e-5f);
            rmsnorm_forward(r->k_normed, r->rstd, r->k_shifted, LAYER(p.k_norm, l, qk_per), H, hd, groups_qk, 1e-5f);
        } else {
            memcpy(r->q_normed, r->q_raw, (size_t)C * sizeof(float));
            memcpy(r->k_normed, r->k_shifted, (size_t)C * sizeof(float));
        }
        float* k_new = r->k_new;
        if (cf->rope) {
            rope_row(r->q, r->q_normed, pos, H, hd, cf->rope_theta);
            rope_row(k_new, r->k_normed, pos, H, hd, cf->rope_theta);
        } else {
            memcpy(r->q, r->q_normed, (size_t)C * sizeof(float));
            memcpy(k_new, r->k_normed, (size_t)C * sizeof(float));
        }
        float* c_last = LAYER(d->c_last, l, H);
        if (cf->gate != GATE_NONE) { // c continues from the last token (O(1) per token); a document start's stays 0
            if (cf->gate == GATE_FULL) {
                matvec_forward(r->gate_logit, r->xa, LAYER(p.wf, l, (size_t)H * C), LAYER(p.bf, l, H), C, H);
            } else {
                memcpy(r->gate_logit, LAYER(p.bf, l, H), (size_t)H * sizeof(float));
            }
            if (!doc_start) {
                for (int h = 0; h < H; h++) { c_last[h] += logsigmoidf(r->gate_logit[h]); }
            }
        }
        decode_attention_layer(d, l, pos, r->q, k_new, v_new, cf->gate != GATE_NONE ? c_last : NULL, r->o);
        if (cf->output_norm) {
            rmsnorm_forward(r->o_normed, r->rstd, r->o, LAYER(p.o_norm, l, C), H, hd, H, 1e-6f);
        } else {
            memcpy(r->o_normed, r->o, (size_t)C * sizeof(float));
        }
        if (cf->output_gate) {
            matvec_forward(r->og_logit, r->xa, LAYER(p.wg, l, (size_t)C * C), NULL, C, C);
            output_gate_forward(r->y, r->o_normed, r->og_logit, (size_t)C);
        } else {
            memcpy(r->y, r->o_normed, (size_t)C * sizeof(float));
        }
        matvec_forward(r->attproj, r->y, LAYER(p.wo, l, (size_t)C * C), NULL, C, C);
        add_forward(r->resid_mid, r->resid, r->attproj, (size_t)C);
        // MLP
        rmsnorm_forward(r->xm, r->rstd, r->resid_mid, LAYER(p.mlp_norm, l, C), 1, C, 1, 1e-6f);
        matvec_forward(r->gu, r->xm, LAYER(p.wgu, l, (size_t)2 * I * C), NULL, C, 2 * I);
        swiglu_forward(r->act, r->gu, 1, I);
        matvec_forward(r->mlpproj, r->act, LAYER(p.wdown, l, (size_t)C * I), NULL, I, C);
        add_forward(r->resid, r->resid_mid, r->mlpproj, (size_t)C);
    }
    rmsnorm_forward(r->xf, r->rstd, r->resid, p.norm_f, 1, C, 1, 1e-6f);
    matvec_forward(r->logits, r->xf, p.lm_head, NULL, C, cf->padded_vocab_size);
    d->len++;
    size_t bytes = fox_decoder_bytes(d);
    if (bytes > d->peak_bytes) { d->peak_bytes = bytes; }
}

// ----------------------------------------------------------------------------
// the CPU backend: fox_forward for batches, the KV cache for next_logits

typedef struct {
    FoxModel* m;
    int max_T;
    FoxDecoder dec; // made on first use: only generation needs it
} CpuBackend;

static FoxDecoder* cpu_backend_decoder(CpuBackend* cb) {
    if (cb->dec.m == NULL) { fox_decoder_init(&cb->dec, cb->m, cb->max_T); }
    return &cb->dec;
}

static void cpu_backend_forward(void* ctx, const int* inputs, const int* targets, int B, int T, float* losses) {
    FoxModel* m = ((CpuBackend*)ctx)->m;
    fox_forward(m, inputs, targets, B, T);
    if (targets != NULL) { memcpy(losses, m->losses, (size_t)B * T * sizeof(float)); }
}

static void cpu_backend_logits_row(void* ctx, size_t n, float* out) {
    FoxModel* m = ((CpuBackend*)ctx)->m;
    memcpy(out, m->logits + n * m->config.padded_vocab_size, (size_t)m->config.vocab_size * sizeof(float));
}

static void cpu_backend_reset(void* ctx) { fox_decoder_reset(cpu_backend_decoder((CpuBackend*)ctx)); }

static void cpu_backend_next_logits(void* ctx, const int* tokens, int t, float* out) {
    FoxDecoder* d = cpu_backend_decoder((CpuBackend*)ctx);
    if (t <= d->len) { fail("internal: next_logits for %d tokens after %d without a reset" BUG_HINT, t, d->len); }
    if (t > d->max_len) { fail("%d tokens exceed the context of %d\nHINT: raise -t", t, d->max_len); }
    while (d->len < t) { fox_decode_step(d, tokens[d->len]); }
    memcpy(out, d->row.logits, (size_t)d->m->config.vocab_size * sizeof(float));
}

// batches up to (max_B, max_T) for forward (max_B 0: none), sequences up to max_T for next_logits
static ForwardBackend cpu_backend_init(CpuBackend* cb, FoxModel* m, int max_B, int max_T) {
    memset(cb, 0, sizeof(*cb));
    cb->m = m;
    cb->max_T = max_T;
    if (max_B > 0) { fox_ensure_activations(m, max_B, max_T); }
    ForwardBackend be = {cb, m->config.vocab_size, cpu_backend_forward, cpu_backend_logits_row,
                         cpu_backend_reset, cpu_backend_next_logits, NULL};
    return be;
}

// ----------------------------------------------------------------------------
// sampling: greedy, temperature, top-k

typedef struct { float logit; int id; } ScoredToken;

static int scored_descending(const void* a, const void* b) {
    const ScoredToken* x = (const ScoredToken*)a;
    const ScoredToken* y = (const ScoredToken*)b;
    if (x->logit != y->logit) { return x->logit > y->logit ? -1 : 1; }
    return x->id - y->id;
}

// the most likely token, the lowest id on ties
static int argmax_token(const float* logits, int V) {
    int best = 0;
    for (int j = 1; j < V; j++) {
        if (logits[j] > logits[best]) { best = j; }
    }
    return best;
}

// temperature 0: greedy; else a draw from softmax(logits / temperature) restricted to the
// top_k largest logits (top_k 0: all V)
static int sample_token(const float* logits, int V, double temperature, int top_k, uint64_t* rng) {
    if (temperature == 0.0) { return argmax_token(logits, V); }
    int k = top_k > 0 && top_k < V ? top_k : V;
    ScoredToken* s = (ScoredToken*)malloc_check((size_t)V * sizeof(ScoredToken), "sampling");
    for (int j = 0; j < V; j++) { s[j].logit = logits[j]; s[j].id = j; }
    if (k < V) { qsort(s, (size_t)V, sizeof(ScoredToken), scored_descending); }
    float mx = -INFINITY;
    for (int j = 0; j < k; j++) { mx = fmaxf(mx, s[j].logit); }
    double sum = 0.0;
    for (int j = 0; j < k; j++) { sum += exp((s[j].logit - mx) / temperature); }
    double r = rng_uniform(rng) * sum, acc = 0.0;
    int token = s[k - 1].id;
    for (int j = 0; j < k; j++) {
        acc += exp((s[j].logit - mx) / temperature);
        if (r < acc) { token = s[j].id; break; }
    }
    free(s);
    return token;
}

// ----------------------------------------------------------------------------
// text in: the GPT-2 encoder (data/gpt2_bpe.c), prompts, held-out token streams

#ifndef NO_GPT2_ENCODER
static void bpe_load_checked(GPT2BPE* bpe) {
    if (access(GPT2_DEFAULT_RANKS, R_OK) != 0) {
        fail("the GPT-2 merge ranks %s are missing (needed to encode text)\nHINT: run `make data`", GPT2_DEFAULT_RANKS);
    }
    gpt2_bpe_load(bpe, GPT2_DEFAULT_RANKS);
}

// the tokens of text, appended to out at *n (capacity cap); returns the new count
static int encode_append(GPT2Worker* w, const char* text, int* out, int n, int cap) {
    GPT2Ids ids = {NULL, 0, 0};
    gpt2_encode(w, (const uint8_t*)text, strlen(text), &ids);
    if ((size_t)n + ids.len > (size_t)cap) {
        fail("the text encodes to %zu tokens, more than the %d that fit\nHINT: shorten the prompt or raise -t",
             (size_t)n + ids.len, cap);
    }
    for (size_t i = 0; i < ids.len; i++) { out[n + i] = (int)ids.ids[i]; }
    int total = n + (int)ids.len;
    gpt2_ids_free(&ids);
    return total;
}

// -P's text, or the contents of the file after '@'; free it
static char* prompt_text(const char* arg) {
    if (arg[0] != '@') { return strdup(arg); }
    FILE* f = fopen_check(arg + 1, "rb");
    long size = file_size_check(f, arg + 1);
    char* text = (char*)malloc_check((size_t)size + 1, "prompt");
    fread_check(text, 1, (size_t)size, f, arg + 1);
    fclose(f);
    text[size] = '\0';
    if (strlen(text) != (size_t)size) { fail("'%s' holds a NUL byte\nHINT: the prompt must be text", arg + 1); }
    return text;
}

// EOT, then the prompt's tokens (documents in the corpus follow an EOT); at most cap tokens
static int encode_prompt(const char* arg, int eot, int* out, int cap) {
    GPT2BPE bpe;
    GPT2Worker w;
    bpe_load_checked(&bpe);
    gpt2_worker_init(&w, &bpe);
    char* text = prompt_text(arg);
    out[0] = eot;
    int n = encode_append(&w, text, out, 1, cap);
    free(text);
    gpt2_worker_free(&w);
    gpt2_bpe_free(&bpe);
    return n;
}
#else
static int encode_prompt(const char* arg, int eot, int* out, int cap) {
    (void)arg; (void)eot; (void)out; (void)cap;
    fail("this build has no GPT-2 encoder (PCRE2 was missing when it was built), so it cannot encode -P\n"
         "HINT: install libpcre2-dev (sh data/ensure_deps.sh pcre2) and rebuild, or pass a token shard (-P @file.bin); "
         "eval, niah and maps without -P work as is");
    return 0;
}
#endif

// up to n tokens of the shard at path into out, EOT separators dropped when drop_eot; returns the count
static size_t read_shard_tokens(const char* path, size_t n, int drop_eot, int eot, int* out) {
    size_t count = read_shard_header(path), got = 0;
    uint16_t buf[4096];
    FILE* f = fopen_check(path, "rb");
    if (fseek(f, SHARD_HEADER_BYTES, SEEK_SET) != 0) { fail("could not seek in '%s'" SEEK_HINT, path); }
    for (size_t done = 0; done < count && got < n;) {
        size_t chunk = count - done < 4096 ? count - done : 4096;
        fread_check(buf, sizeof(uint16_t), chunk, f, path);
        for (size_t i = 0; i < chunk && got < n; i++) {
            if (!(drop_eot && buf[i] == eot)) { out[got++] = buf[i]; }
        }
        done += chunk;
    }
    fclose(f);
    return got;
}

// the first n tokens of the shards matching pattern (in name order), EOT separators dropped
// when drop_eot; fails if they hold fewer
static void read_token_stream(const char* pattern, size_t n, int drop_eot, int eot, int* out) {
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        fail("no token shards match '%s'\n"
             "HINT: run 'make data' for the default corpus, or pass -j with a pattern of existing shards", pattern);
    }
    size_t got = 0;
    for (size_t s = 0; s < g.gl_pathc && got < n; s++) {
        got += read_shard_tokens(g.gl_pathv[s], n - got, drop_eot, eot, out + got);
    }
    globfree(&g);
    if (got < n) {
        fail("the shards of '%s' hold %zu usable tokens, %zu are needed\n"
             "HINT: use a smaller -t or more held-out text (-j)", pattern, got, n);
    }
}

// -P's tokens: for @file of a token shard (llm.c's format, as data/tokenize writes) its first
// cap - reserve tokens as they are (a corpus shard starts with EOT), which needs no encoder;
// else EOT and the encoded text, at most cap tokens
static int prompt_tokens(const char* arg, int* out, int cap, int reserve) {
    if (arg[0] == '@') {
        FILE* f = fopen_check(arg + 1, "rb");
        int magic = 0;
        size_t got = fread(&magic, sizeof(int), 1, f);
        fclose(f);
        if (got == 1 && magic == SHARD_MAGIC) {
            if (cap - reserve < 1) {
                fail("no room for a prompt: -t %d leaves none after -g %d\nHINT: raise -t", cap, reserve);
            }
            int n = (int)read_shard_tokens(arg + 1, (size_t)(cap - reserve), 0, 0, out);
            if (n == 0) { fail("the shard '%s' holds no tokens\nHINT: pass another prompt", arg + 1); }
            return n;
        }
    }
    return encode_prompt(arg, GPT2_EOT, out, cap);
}

// comma-separated integers in [lo, hi]; returns the count
static int parse_int_list(const char* s, const char* flag, long lo, long hi, int* out, int cap) {
    int n = 0;
    char* copy = strdup(s);
    for (char* item = strtok(copy, ","); item != NULL; item = strtok(NULL, ",")) {
        if (n == cap) { fail("%s: more than %d values\nHINT: pass fewer", flag, cap); }
        out[n++] = (int)flag_int(flag, item, lo, hi);
    }
    free(copy);
    if (n == 0) { bad_flag(flag, s, "a comma-separated list"); }
    return n;
}

static FILE* open_output(const Args* a, const char* suffix, char* path, size_t n) {
    if ((size_t)snprintf(path, n, "%s%s", a->out_prefix, suffix) >= n) {
        fail("-O path too long\nHINT: use a shorter -O prefix");
    }
    return fopen_check(path, "w");
}

static void close_output(FILE* f, const char* path) {
    if (ferror(f) || fclose(f) != 0) { fail("could not write '%s'\nHINT: is the disk full?", path); }
    printf("wrote %s\n", path);
}

// ----------------------------------------------------------------------------
// -M eval: per-token loss L(i) = mean over sequences of the loss at position i (the i-th
// predicted token, which sees i tokens), and perplexity P(l) = exp(mean_{i<=l} L(i))

// Adds the losses of up to max_batches (0 = all) batches of val, by position, to loss_sum
// (T, fp64); returns the number of sequences. losses: (B * T) scratch.
static size_t per_token_loss(ForwardBackend* be, DataLoader* val, int max_batches, double* loss_sum,
                             float* losses, int verbose) {
    dataloader_set_position(val, 0, 0, 0);
    if (val->current_batches == 0) { dataloader_advance_shard(val); }
    size_t total = dataloader_total_batches(val);
    size_t n = max_batches > 0 && (size_t)max_batches < total ? (size_t)max_batches : total;
    int B = val->B, T = val->T;
    double t0 = now_seconds(), sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        dataloader_next_batch(val);
        be->forward(be->ctx, val->inputs, val->targets, B, T, losses);
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                loss_sum[t] += losses[(size_t)b * T + t];
                sum += losses[(size_t)b * T + t];
            }
        }
        if (verbose) {
            double dt = now_seconds() - t0;
            printf("eval batch %zu/%zu | mean loss %.6f | %.0f tok/s\n", i + 1, n, sum / ((double)(i + 1) * B * T),
                   (double)(i + 1) * B * T / dt);
            fflush(stdout);
        }
    }
    return n * (size_t)B;
}

// P(l) from L(1 .. T) (mean_loss[i - 1] = L(i))
static double perplexity_upto(const double* mean_loss, int l) {
    double s = 0.0;
    for (int i = 0; i < l; i++) { s += mean_loss[i]; }
    return exp(s / l);
}

static int run_eval(const Args* a, ForwardBackend* be) {
    int T = a->T;
    DataLoader val;
    dataloader_init(&val, a->val_pattern, a->B, T, 0, 1, 0, 0, a->seed, be->vocab_size);
    double* loss_sum = (double*)calloc_check((size_t)T, sizeof(double), "per-token loss");
    float* losses = (float*)malloc_check((size_t)a->B * T * sizeof(float), "losses");
    printf("per-token loss over '%s' at length %d, %d sequences a batch\n", a->val_pattern, T, a->B);
    size_t seqs = per_token_loss(be, &val, a->val_batches, loss_sum, losses, 1);
    for (int t = 0; t < T; t++) { loss_sum[t] /= (double)seqs; } // now L(t + 1)
    FILE* ppl_f = NULL;
    char path[4096];
    if (a->out_prefix != NULL) {
        FILE* f = open_output(a, ".loss.csv", path, sizeof(path));
        fprintf(f, "position,loss\n");
        for (int t = 0; t < T; t++) { fprintf(f, "%d,%.9g\n", t + 1, loss_sum[t]); }
        close_output(f, path);
        ppl_f = open_output(a, ".ppl.csv", path, sizeof(path));
        fprintf(ppl_f, "context,perplexity,mean_loss,sequences\n");
    }
    printf("%zu sequences of %d tokens\n%10s %12s %12s\n", seqs, T, "context l", "P(l)", "mean loss");
    for (long pow2 = 1;; pow2 *= 2) { // powers of two below T, then T itself
        int l = pow2 < T ? (int)pow2 : T;
        double p = perplexity_upto(loss_sum, l);
        printf("%10d %12.4f %12.6f\n", l, p, log(p));
        if (ppl_f != NULL) { fprintf(ppl_f, "%d,%.9g,%.9g,%zu\n", l, p, log(p), seqs); }
        if (l == T) { break; }
    }
    if (ppl_f != NULL) { close_output(ppl_f, path); }
    free(loss_sum); free(losses);
    dataloader_free(&val);
    return 0;
}

// ----------------------------------------------------------------------------
// -M generate: continues -P for -g tokens (greedy, temperature, top-k); with -D, several prompts
// at once (the GPU decodes them in one loop)

// -D for generate: prompt lengths, "len" or "len*count" items separated by commas; returns the count
static int generate_lengths(const char* list, int* lens, int cap) {
    int n = 0;
    char* copy = strdup(list);
    if (copy == NULL) { fail("out of memory reading -D\nHINT: pass a shorter -D list"); }
    for (char* item = strtok(copy, ","); item != NULL; item = strtok(NULL, ",")) {
        char* star = strchr(item, '*');
        if (star != NULL) { *star = '\0'; }
        int len = (int)flag_int("-D (prompt length)", item, 1, 1 << 24);
        int count = star != NULL ? (int)flag_int("-D (prompt count)", star + 1, 1, 1 << 20) : 1;
        if (n + count > cap) { fail("-D: more than %d prompts\nHINT: pass fewer prompt lengths", cap); }
        for (int i = 0; i < count; i++) { lens[n++] = len; }
    }
    free(copy);
    if (n == 0) { bad_flag("-D", list, "prompt lengths, e.g. 2048*32 or 100,200"); }
    return n;
}

#define GENERATE_MAX_PROMPTS 65535 // the GPU's decode attention has a grid row per prompt (at most 65535)

// The prompts of -M generate: without -D one, -P's tokens (prompt_tokens); with -D one per length:
// from a token shard consecutive pieces of it, from a text the first len tokens of EOT + text.
// Every prompt plus -g must fit the context -t. tokens: (B, cap), cap = the longest prompt + -g.
static int generate_prompts(const Args* a, int** tokens_out, int** lens_out, int* cap_out) {
    int T = a->T, g = a->gen_tokens;
    int* lens = (int*)malloc_check(GENERATE_MAX_PROMPTS * sizeof(int), "prompt lengths");
    int B = 1;
    if (a->list != NULL) { B = generate_lengths(a->list, lens, GENERATE_MAX_PROMPTS); }
    int* src = NULL;
    size_t total = 0;
    int longest = 0, from_shard = 0;
    if (a->list == NULL) {
        src = (int*)malloc_check((size_t)T * sizeof(int), "tokens");
        lens[0] = prompt_tokens(a->prompt, src, T, g);
    } else {
        for (int b = 0; b < B; b++) {
            if (lens[b] + g > T) { // before anything is read for them
                fail("a prompt length of -D (%d tokens) plus -g %d tokens exceeds the context -t %d\n"
                     "HINT: raise -t or pass shorter lengths with -D", lens[b], g, T);
            }
            total += (size_t)lens[b];
        }
        FILE* f = a->prompt[0] == '@' ? fopen_check(a->prompt + 1, "rb") : NULL;
        int magic = 0;
        from_shard = f != NULL && fread(&magic, sizeof(int), 1, f) == 1 && magic == SHARD_MAGIC;
        if (f != NULL) { fclose(f); }
        if (from_shard) {
            src = (int*)malloc_check(total * sizeof(int), "tokens");
            size_t got = read_shard_tokens(a->prompt + 1, total, 0, 0, src);
            if (got < total) {
                fail("the shard '%s' holds %zu tokens, the %d prompts of -D need %zu\n"
                     "HINT: pass fewer or shorter prompt lengths with -D", a->prompt + 1, got, B, total);
            }
        } else {
            src = (int*)malloc_check((size_t)T * sizeof(int), "tokens");
            int n = prompt_tokens(a->prompt, src, T, 0);
            for (int b = 0; b < B; b++) {
                if (lens[b] > n) {
                    fail("-D asks for a prompt of %d tokens, the text has %d (with the leading EOT)\n"
                         "HINT: pass lengths of at most %d, or a longer text or a token shard with -P @file",
                         lens[b], n, n);
                }
            }
        }
    }
    for (int b = 0; b < B; b++) {
        if (lens[b] + g > T) {
            fail("the prompt%s (%d tokens with the leading EOT) plus -g %d tokens exceed the context -t %d\n"
                 "HINT: raise -t or shorten the prompt", B > 1 ? "s of -D" : "", lens[b], g, T);
        }
        longest = lens[b] > longest ? lens[b] : longest;
    }
    int cap = longest + g;
    int* tokens = (int*)malloc_check((size_t)B * cap * sizeof(int), "tokens");
    size_t off = 0;
    for (int b = 0; b < B; b++) {
        memcpy(tokens + (size_t)b * cap, src + off, (size_t)lens[b] * sizeof(int));
        if (from_shard) { off += (size_t)lens[b]; }
    }
    free(src);
    *tokens_out = tokens; *lens_out = lens; *cap_out = cap;
    return B;
}

// a GenerateJob through next_logits, one sequence after the other (the CPU backend)
static void generate_with_next_logits(ForwardBackend* be, GenerateJob* job) {
    float* row = (float*)malloc_check((size_t)be->vocab_size * sizeof(float), "logits row");
    double t_prompt = 0.0;
    for (int b = 0; b < job->B; b++) {
        int* tokens = job->tokens + (size_t)b * job->cap;
        int n = job->lens[b];
        uint64_t rng = generate_seed(job->seed, b);
        be->reset(be->ctx);
        for (int t = n; t < n + job->gen; t++) {
            double t0 = now_seconds();
            be->next_logits(be->ctx, tokens, t, row);
            if (t == n) { t_prompt += now_seconds() - t0; } // the prompt, and the first new token's logits
            tokens[t] = sample_token(row, be->vocab_size, job->temperature, job->top_k, &rng);
            if (job->on_token != NULL) { job->on_token(job->user, b, tokens[t]); }
        }
    }
    job->t_prompt = t_prompt;
    free(row);
}

// prints the tokens of one prompt as they come
static void generate_print_token(void* user, int b, int token) {
    (void)b;
    tokenizer_print((const Tokenizer*)user, token);
    fflush(stdout);
}

static int run_generate(const Args* a, ForwardBackend* be, const char* how) {
    if (a->prompt == NULL) { fail("-M generate needs a prompt\nHINT: add -P \"text\" or -P @file"); }
    int *tokens, *lens, cap;
    int B = generate_prompts(a, &tokens, &lens, &cap);
    Tokenizer tk;
    if (!tokenizer_init(&tk, a->tokenizer_path)) {
        fail("no decode table at '%s'\nHINT: run `make data`, or pass -z", a->tokenizer_path);
    }
    const char* rule = a->temperature == 0 ? "greedy" : "sampled";
    if (B == 1) {
        printf("prompt: %d tokens | %d new tokens, %s, temperature %g, top-k %d, seed %llu | %s\n---\n", lens[0],
               a->gen_tokens, rule, a->temperature, a->top_k, (unsigned long long)a->seed, how);
        for (int i = 1; i < lens[0]; i++) { tokenizer_print(&tk, tokens[i]); }
    } else {
        size_t sum = 0;
        for (int b = 0; b < B; b++) { sum += (size_t)lens[b]; }
        printf("prompts: %d of %zu tokens in all (-D) | %d new tokens each, %s, temperature %g, top-k %d, seed %llu | "
               "%s\n", B, sum, a->gen_tokens, rule, a->temperature, a->top_k, (unsigned long long)a->seed, how);
    }
    GenerateJob job = {B, a->gen_tokens, cap, tokens, lens, a->temperature, a->top_k, a->seed,
                       B == 1 ? generate_print_token : NULL, &tk, 0.0};
    double t0 = now_seconds();
    if (be->generate != NULL) { be->generate(be->ctx, &job); }
    else { generate_with_next_logits(be, &job); }
    double dt = now_seconds() - t0, t_new = dt - job.t_prompt;
    int steps = a->gen_tokens - 1; // new tokens after the first of each sequence
    if (B == 1) {
        printf("\n---\n%d tokens in %.2f s: the prompt (%d tokens) %.2f s, then %.2f ms per generated token\n",
               a->gen_tokens, dt, lens[0], job.t_prompt, steps > 0 ? 1e3 * t_new / steps : 0.0);
    } else {
        for (int b = 0; b < B; b++) {
            printf("--- sequence %d (prompt %d tokens):", b, lens[b]);
            const int* row = tokens + (size_t)b * cap;
            for (int t = lens[b]; t < lens[b] + a->gen_tokens; t++) { tokenizer_print(&tk, row[t]); }
            printf("\n");
        }
        printf("---\n%d sequences x %d tokens in %.2f s: the prompts %.2f s, then %.2f ms per step of %d tokens, "
               "%.0f generated tokens/s\n", B, a->gen_tokens, dt, job.t_prompt, steps > 0 ? 1e3 * t_new / steps : 0.0,
               B, steps > 0 && t_new > 0 ? (double)B * steps / t_new : 0.0);
    }
    free(tokens); free(lens);
    tokenizer_free(&tk);
    return 0;
}

// ----------------------------------------------------------------------------
// -M niah: needle in a haystack (dev/fox.md, "Evaluation conventions"). A prompt of exactly
// `context` tokens: EOT, haystack (held-out text, EOT separators dropped) with the needle
// inserted after round(depth * haystack length) of its tokens, then the question. Each piece
// is encoded on its own and the tokens concatenated; the tokens are written out below so that
// a build without the encoder runs it too (test_fox checks them against the encoder). A cell
// is scored by log p(answer | prompt) and by greedy decoding: the argmax at each answer
// position given the prompt and the answer so far (teacher forcing), which reproduces the
// answer exactly when greedy decoding would.

static const char* NIAH_NEEDLE =
    " The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
static const char* NIAH_NEEDLE_EASY =
    " What is the best thing to do in San Francisco? Answer: The best thing to do in San Francisco is eat a sandwich"
    " and sit in Dolores Park on a sunny day.";
static const char* NIAH_QUESTION =
    "\n\nAnswer the following question: What is the best thing to do in San Francisco? Answer: The best thing to do"
    " in San Francisco is";
static const char* NIAH_ANSWER = " eat a sandwich and sit in Dolores Park on a sunny day.";
static const int NIAH_NEEDLE_IDS[] = {383, 1266, 1517, 284, 466, 287, 2986, 6033, 318, 4483, 257, 20433, 290, 1650, 287,
                                     25143, 2850, 3250, 319, 257, 27737, 1110, 13};
static const int NIAH_NEEDLE_EASY_IDS[] = {1867, 318, 262, 1266, 1517, 284, 466, 287, 2986, 6033, 30, 23998, 25, 383,
                                          1266, 1517, 284, 466, 287, 2986, 6033, 318, 4483, 257, 20433, 290, 1650, 287,
                                          25143, 2850, 3250, 319, 257, 27737, 1110, 13};
static const int NIAH_QUESTION_IDS[] = {198, 198, 33706, 262, 1708, 1808, 25, 1867, 318, 262, 1266, 1517, 284, 466, 287,
                                       2986, 6033, 30, 23998, 25, 383, 1266, 1517, 284, 466, 287, 2986, 6033, 318};
static const int NIAH_ANSWER_IDS[] = {4483, 257, 20433, 290, 1650, 287, 25143, 2850, 3250, 319, 257, 27737, 1110, 13};
#define NIAH_MAX_PIECE 128 // tokens of one piece (needle, question or answer)
#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct {
    int easy;
    int needle[NIAH_MAX_PIECE], needle_n;
    int question[NIAH_MAX_PIECE], question_n;
    int answer[NIAH_MAX_PIECE], answer_n;
} NiahTexts;

static void niah_piece(int* dst, int* n, const int* ids, int count) {
    memcpy(dst, ids, (size_t)count * sizeof(int));
    *n = count;
}

static void niah_texts_init(NiahTexts* tx, int easy) {
    memset(tx, 0, sizeof(*tx));
    tx->easy = easy;
    if (easy) { niah_piece(tx->needle, &tx->needle_n, NIAH_NEEDLE_EASY_IDS, COUNT_OF(NIAH_NEEDLE_EASY_IDS)); }
    else { niah_piece(tx->needle, &tx->needle_n, NIAH_NEEDLE_IDS, COUNT_OF(NIAH_NEEDLE_IDS)); }
    niah_piece(tx->question, &tx->question_n, NIAH_QUESTION_IDS, COUNT_OF(NIAH_QUESTION_IDS));
    niah_piece(tx->answer, &tx->answer_n, NIAH_ANSWER_IDS, COUNT_OF(NIAH_ANSWER_IDS));
}

// the shortest prompt: EOT, needle, question
static int niah_min_context(const NiahTexts* tx) { return 1 + tx->needle_n + tx->question_n; }

// Writes the prompt (context tokens) to out from haystack (at least context tokens); returns
// the needle's first position.
static int niah_build_prompt(const NiahTexts* tx, const int* haystack, int context, double depth, int eot, int* out) {
    int hay = context - niah_min_context(tx);
    if (hay < 0) {
        fail("context %d is shorter than the needle and question (%d tokens)\nHINT: use longer contexts (-D)", context,
             niah_min_context(tx));
    }
    int split = (int)floor(depth * hay + 0.5);
    int n = 0;
    out[n++] = eot;
    memcpy(out + n, haystack, (size_t)split * sizeof(int)); n += split;
    int needle_pos = n;
    memcpy(out + n, tx->needle, (size_t)tx->needle_n * sizeof(int)); n += tx->needle_n;
    memcpy(out + n, haystack + split, (size_t)(hay - split) * sizeof(int)); n += hay - split;
    memcpy(out + n, tx->question, (size_t)tx->question_n * sizeof(int)); n += tx->question_n;
    return needle_pos;
}

typedef struct {
    double logprob;    // log p(answer | prompt), natural log
    int greedy_tokens; // answer tokens that greedy decoding reproduces before the first miss
} NiahScore;

// seq: (context + answer_n) scratch; losses, row: (context + answer_n), (V) scratch
static NiahScore niah_score(ForwardBackend* be, const NiahTexts* tx, const int* prompt, int context, int* seq,
                            float* losses, float* row) {
    int A = tx->answer_n, T = context + A - 1; // the last answer token is only a target
    memcpy(seq, prompt, (size_t)context * sizeof(int));
    memcpy(seq + context, tx->answer, (size_t)A * sizeof(int));
    be->forward(be->ctx, seq, seq + 1, 1, T, losses);
    NiahScore s = {0.0, 0};
    for (int k = 0; k < A; k++) { s.logprob -= losses[context - 1 + k]; }
    for (int k = 0; k < A; k++) {
        be->logits_row(be->ctx, (size_t)(context - 1 + k), row);
        if (argmax_token(row, be->vocab_size) != tx->answer[k]) { break; }
        s.greedy_tokens++;
    }
    return s;
}

// the context lengths of the grid: -D, or 11 evenly spaced up to -t
static int niah_lengths(const Args* a, int* lengths, int cap) {
    if (a->list != NULL) { return parse_int_list(a->list, "-D", 1, 1 << 24, lengths, cap); }
    for (int i = 0; i < 11; i++) { lengths[i] = (int)((long)a->T * (i + 1) / 11); }
    return 11;
}

static int niah_max_length(const Args* a) {
    int lengths[256], mx = 0;
    int n = niah_lengths(a, lengths, 256);
    for (int i = 0; i < n; i++) { mx = lengths[i] > mx ? lengths[i] : mx; }
    return mx;
}

// the needle's depth of depth i of n: 0 to 1 evenly (-E 3: 0, 0.5, 1), the middle for n = 1
static double niah_depth(int i, int n) { return n > 1 ? (double)i / (n - 1) : 0.5; }

static int run_niah(const Args* a, ForwardBackend* be) {
    int lengths[256];
    int nl = niah_lengths(a, lengths, 256), nd = a->depths, max_len = niah_max_length(a);
    NiahTexts texts[2];
    niah_texts_init(&texts[0], 0);
    niah_texts_init(&texts[1], 1);
    for (int i = 0; i < nl; i++) {
        if (lengths[i] < niah_min_context(&texts[1])) {
            fail("NIAH context %d is shorter than the easy needle and the question (%d tokens)\n"
                 "HINT: pass contexts of at least %d "
                 "with -D, or a larger -t (the default contexts are -t * i / 11, i = 1 .. 11)",
                 lengths[i], niah_min_context(&texts[1]), niah_min_context(&texts[1]));
        }
    }
    int* haystack = (int*)malloc_check((size_t)max_len * sizeof(int), "haystack");
    read_token_stream(a->val_pattern, (size_t)max_len, 1, GPT2_EOT, haystack);
    int* prompt = (int*)malloc_check((size_t)max_len * sizeof(int), "prompt");
    int* seq = (int*)malloc_check((size_t)(max_len + NIAH_MAX_PIECE) * sizeof(int), "sequence");
    float* losses = (float*)malloc_check((size_t)(max_len + NIAH_MAX_PIECE) * sizeof(float), "losses");
    float* row = (float*)malloc_check((size_t)be->vocab_size * sizeof(float), "logits row");
    FILE* f = NULL;
    char path[4096];
    if (a->out_prefix != NULL) {
        f = open_output(a, ".niah.csv", path, sizeof(path));
        fprintf(f, "mode,context,depth,needle_position,answer_tokens,answer_logprob,greedy_tokens,greedy_success\n");
    }
    printf("needle in a haystack: %d context lengths x %d depths, haystack from '%s'\n", nl, nd, a->val_pattern);
    printf("needle:%s\neasy needle:%s\nquestion:%s\nanswer:%s\n", NIAH_NEEDLE, NIAH_NEEDLE_EASY, NIAH_QUESTION,
           NIAH_ANSWER);
    for (int mode = 0; mode < 2; mode++) {
        const NiahTexts* tx = &texts[mode];
        const char* name = mode ? "easy" : "standard";
        printf("%s mode: greedy successes per context (of %d depths), mean log p(answer)\n", name, nd);
        for (int i = 0; i < nl; i++) {
            int successes = 0;
            double lp_sum = 0.0;
            for (int di = 0; di < nd; di++) {
                double depth = niah_depth(di, nd);
                int pos = niah_build_prompt(tx, haystack, lengths[i], depth, GPT2_EOT, prompt);
                NiahScore s = niah_score(be, tx, prompt, lengths[i], seq, losses, row);
                int ok = s.greedy_tokens == tx->answer_n;
                successes += ok;
                lp_sum += s.logprob;
                if (f != NULL) {
                    fprintf(f, "%s,%d,%.6g,%d,%d,%.9g,%d,%d\n", name, lengths[i], depth, pos, tx->answer_n, s.logprob,
                            s.greedy_tokens, ok);
                }
            }
            printf("  context %7d: %3d/%d  %10.4f\n", lengths[i], successes, nd, lp_sum / nd);
            fflush(stdout);
        }
    }
    if (f != NULL) { close_output(f, path); }
    free(haystack); free(prompt); free(seq); free(losses); free(row);
    return 0;
}

// ----------------------------------------------------------------------------
// -M maps: the forget-gate matrix F_ij = exp(c_i - c_j) (j <= i, 0 above the diagonal; 1 on the
// lower triangle without a gate; with -f 1, 0 before the query's document) and the attention
// A = softmax_j(q_i.k_j / sqrt(hd) + c_i - c_j) (zero outside the causal window and, with -f 1, the
// query's document) of chosen heads, on one sequence run by the twin.
// File: int32 header[256] (magic 20261121, version 1, T, number of maps, window), then per map
// int32 layer, int32 head, F (T, T) fp32, A (T, T) fp32, rows = queries.

#define MAPS_MAGIC 20261121

// F and A (T, T) of (layer, head) from the activations of m's last forward (B = 1)
static void attention_maps(const FoxModel* m, int layer, int head, float* F, float* A) {
    const FoxConfig* cf = &m->config;
    int T = m->T, H = cf->n_head, hd = cf->n_embd / H;
    size_t C = (size_t)cf->n_embd, NC = (size_t)T * C;
    const float* q = LAYER(m->acts.q, layer, NC) + (size_t)head * hd;
    const float* k = LAYER(m->acts.k, layer, NC) + (size_t)head * hd;
    const float* c = cf->gate != GATE_NONE ? LAYER(m->acts.c, layer, (size_t)H * T) + (size_t)head * T : NULL;
    const int* doc = fox_documents(m);
    double scale = 1.0 / sqrt((double)hd);
    #pragma omp parallel for if(parallel_pays((size_t)T * T * hd))
    for (int i = 0; i < T; i++) {
        float* Fi = F + (size_t)i * T;
        float* Ai = A + (size_t)i * T;
        int doc_i = doc != NULL ? doc[i] : 0;
        int j0 = attention_first_key_pruned(i, cf->window, doc_i, NULL, 0, T);
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < T; j++) {
            Fi[j] = j <= i && j >= doc_i ? (c != NULL ? (float)exp((double)c[i] - c[j]) : 1.0f) : 0.0f;
            Ai[j] = 0.0f;
        }
        for (int j = j0; j <= i; j++) {
            double dot = 0.0;
            for (int d = 0; d < hd; d++) { dot += (double)q[(size_t)i * C + d] * k[(size_t)j * C + d]; }
            double s = dot * scale + (c != NULL ? (double)c[i] - c[j] : 0.0);
            mx = s > mx ? s : mx;
        }
        for (int j = j0; j <= i; j++) {
            double dot = 0.0;
            for (int d = 0; d < hd; d++) { dot += (double)q[(size_t)i * C + d] * k[(size_t)j * C + d]; }
            double p = exp(dot * scale + (c != NULL ? (double)c[i] - c[j] : 0.0) - mx);
            Ai[j] = (float)p;
            sum += p;
        }
        for (int j = j0; j <= i; j++) { Ai[j] = (float)(Ai[j] / sum); }
    }
}

// -D for maps: "l:h" pairs and "l" (every head of layer l); NULL = all. Returns the count.
static int maps_heads(const Args* a, const FoxConfig* cf, int* layers, int* heads, int cap) {
    int n = 0;
    if (a->list == NULL) {
        for (int l = 0; l < cf->n_layer; l++) {
            for (int h = 0; h < cf->n_head && n < cap; h++) { layers[n] = l; heads[n++] = h; }
        }
        return n;
    }
    char* copy = strdup(a->list);
    for (char* item = strtok(copy, ","); item != NULL; item = strtok(NULL, ",")) {
        char* colon = strchr(item, ':');
        if (colon != NULL) { *colon = '\0'; }
        int l = (int)flag_int("-D (layer)", item, 0, cf->n_layer - 1);
        int h0 = colon != NULL ? (int)flag_int("-D (head)", colon + 1, 0, cf->n_head - 1) : 0;
        int h1 = colon != NULL ? h0 : cf->n_head - 1;
        for (int h = h0; h <= h1; h++) {
            if (n == cap) { fail("-D: more than %d maps\nHINT: choose fewer heads", cap); }
            layers[n] = l; heads[n++] = h;
        }
    }
    free(copy);
    return n;
}

// runs on the twin in both trainers: exact fp32, and the maps need every layer's q, k and c
static int run_maps(const Args* a, FoxModel* m) {
    if (a->out_prefix == NULL) { fail("-M maps writes a file\nHINT: add -O <prefix>"); }
    int layers[4096], heads[4096];
    int nmaps = maps_heads(a, &m->config, layers, heads, 4096);
    int* tokens = (int*)malloc_check((size_t)a->T * sizeof(int), "tokens");
    int T = a->T;
    if (a->prompt != NULL) { T = prompt_tokens(a->prompt, tokens, a->T, 0); }
    else { read_token_stream(a->val_pattern, (size_t)T, 0, GPT2_EOT, tokens); }
    printf("maps of %d head(s) on %d tokens of %s\n", nmaps, T, a->prompt != NULL ? "the prompt" : a->val_pattern);
    fox_forward(m, tokens, NULL, 1, T);
    float* F = (float*)malloc_check((size_t)T * T * sizeof(float), "F");
    float* A = (float*)malloc_check((size_t)T * T * sizeof(float), "A");
    char path[4096];
    FILE* f = open_output(a, ".maps.bin", path, sizeof(path));
    int header[256] = {0};
    header[0] = MAPS_MAGIC; header[1] = 1; header[2] = T; header[3] = nmaps; header[4] = m->config.window;
    fwrite_check(header, sizeof(int), 256, f, path);
    for (int i = 0; i < nmaps; i++) {
        attention_maps(m, layers[i], heads[i], F, A);
        int lh[2] = {layers[i], heads[i]};
        fwrite_check(lh, sizeof(int), 2, f, path);
        fwrite_check(F, sizeof(float), (size_t)T * T, f, path);
        fwrite_check(A, sizeof(float), (size_t)T * T, f, path);
    }
    close_output(f, path);
    free(F); free(A); free(tokens);
    return 0;
}

// ----------------------------------------------------------------------------
// the evaluation modes' entry points: the batch shape a mode needs from a backend (B = 0:
// none, only next_logits), and the dispatch shared by both trainers

static void eval_mode_shape(const Args* a, int* B, int* T) {
    *B = 0;
    *T = a->T;
    if (a->mode == MODE_EVAL) { *B = a->B; }
    if (a->mode == MODE_NIAH) { *B = 1; *T = niah_max_length(a) + NIAH_MAX_PIECE; }
}

static void check_eval_args(const Args* a) {
    if (a->mode == MODE_TRAIN) { fail("internal: train is not an evaluation mode" BUG_HINT); }
    if ((a->mode == MODE_EVAL || a->mode == MODE_NIAH) && a->out_prefix == NULL) {
        printf("note: no -O, results go to stdout only\n");
    }
}

// how: a word on the backend, for the log
static int run_eval_mode(const Args* a, FoxModel* m, ForwardBackend* be, const char* how) {
    config_print(stdout, &m->config);
    switch (a->mode) {
        case MODE_EVAL: return run_eval(a, be);
        case MODE_GENERATE: return run_generate(a, be, how);
        case MODE_NIAH: return run_niah(a, be);
        case MODE_MAPS: return run_maps(a, m);
    }
    fail("internal: unknown mode %d" BUG_HINT, a->mode);
    return 1;
}

static int cpu_eval_main(const Args* a) {
    check_eval_args(a);
    FoxModel m;
    build_model(&m, a);
    int B, T;
    eval_mode_shape(a, &B, &T);
    CpuBackend cb;
    ForwardBackend be = cpu_backend_init(&cb, &m, a->mode == MODE_MAPS ? 0 : B, T);
    int rc = run_eval_mode(a, &m, &be, "CPU twin, KV cache");
    if (cb.dec.m != NULL) {
        fox_decoder_report(&cb.dec);
        fox_decoder_free(&cb.dec);
    }
    fox_free(&m);
    return rc;
}


#ifndef FOX_NO_MAIN
int main(int argc, char** argv) {
    threads_init();
    Args a;
    parse_args(&a, argc, argv);
    if (a.world > 1 || a.rank > 0 || a.rendezvous != NULL || a.zero_stage >= 0) {
        fail("the CPU twin trains in one process\nHINT: drop -W, -I, -F and -Q, or use the GPU trainer train_fox");
    }
    if (a.mode != MODE_TRAIN) { return cpu_eval_main(&a); }
    FoxModel model;
    build_model(&model, &a);
    const FoxConfig* cf = &model.config;
    fox_ensure_activations(&model, a.B, a.T); // for the training batch, before a sample or validation runs
    if (a.total_batch_tokens < 0) { a.total_batch_tokens = (long)a.B * a.T; }
    long micro_tokens = (long)a.B * a.T;
    if (a.total_batch_tokens % micro_tokens != 0) {
        fail("total batch -d %ld is not a multiple of b*t = %ld\nHINT: choose -d as a multiple of -b times -t",
             a.total_batch_tokens, micro_tokens);
    }
    int accum = (int)(a.total_batch_tokens / micro_tokens);
    DataLoader train, val;
    dataloader_init(&train, a.train_pattern, a.B, a.T, 0, 1, 1, a.roll, a.seed, cf->vocab_size);
    int have_val = a.val_every > 0;
    if (have_val) { dataloader_init(&val, a.val_pattern, a.B, a.T, 0, 1, 0, 0, a.seed, cf->vocab_size); }
    dataloader_report(&train, "train");
    if (have_val) { dataloader_report(&val, "validation"); }
    if (a.steps < 0) {
        a.steps = (long)(dataloader_total_batches(&train) / (size_t)accum);
        if (a.steps < 1) { a.steps = 1; }
    }
    AdamWConfig opt = {(float)a.lr, (float)a.weight_decay, 0.9f, 0.95f, 1e-8f, (float)a.grad_clip};
    RunDir out = run_dir_unclaimed(); // claimed before check_run_start looks into it
    char why[RUN_DIR_WHY_BYTES];
    if (a.out_dir != NULL && run_dir_claim(&out, a.out_dir, cf, why, sizeof(why)) != 0) { fail("%s", why); }
    Tokenizer tk;
    int have_tokenizer = tokenizer_init(&tk, a.tokenizer_path);
    if (!have_tokenizer && a.sample_every > 0) {
        printf("no decode table at %s: samples off (run 'make data')\n", a.tokenizer_path);
    }
    check_run_start(&a, cf, &tk, have_tokenizer);

    config_print(stdout, cf);
    size_t act_sizes[NUM_ACTIVATION_TENSORS], acts = 0;
    activation_sizes(cf, a.B, a.T, act_sizes);
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) { acts += act_sizes[i]; }
    acts = 2 * acts + (size_t)a.B * a.T * cf->padded_vocab_size;
    printf("parameters: %zu (%zu in matmuls) | memory estimate %.1f MiB (weights, grads, AdamW, activations)\n",
           model.num_parameters, fox_matmul_params(&model), (4.0 * model.num_parameters + acts) * 4.0 / 1048576.0);
#ifdef _OPENMP
    printf("threads: %d\n", omp_get_max_threads());
#endif

    TrainState resumed;
    if (a.resume) { resumed = resume_run(&model, &a, &train); }
    int start = a.resume ? resumed.step : 0;
    int64_t tokens_seen = a.resume ? resumed.tokens_seen : 0;
    LRSchedule sched = run_schedule(&a, a.resume ? &resumed : NULL);
    printf("batch: %d x %d tokens, %d accumulation step(s), %ld tokens per step | %ld steps | warmup %.0f tokens | "
           "%s schedule, peak lr %g\n",
           a.B, a.T, accum, a.total_batch_tokens, a.steps, sched.warmup_tokens, SCHEDULE_NAMES[a.schedule], a.lr);
    if (a.out_dir != NULL) { run_dir_open_log(&out, a.out_dir, a.resume); }
    uint64_t sample_rng = a.seed ^ 0x5DEECE66Dull;
    StepGuard guard;
    step_guard_init(&guard, a.on_nonfinite, a.spike_z);
    RunClock clock;
    run_clock_start(&clock);
    for (long step = start; step <= a.steps; step++) {
        int last = step == a.steps;
        if (have_val && (step % a.val_every == 0 || last)) {
            float vl = evaluate(&model, &val, a.val_batches);
            printf("step %ld: val loss %.6f\n", step, vl);
            log_line(&out, "s:%ld tel:%.6f tokens:%lld\n", step, vl, (long long)tokens_seen);
        }
        // the checkpoint before the sample: a sample must never cost one
        int checkpoint_due = (a.checkpoint_every > 0 && step % a.checkpoint_every == 0) || last;
        if (a.out_dir != NULL && step > start && checkpoint_due) {
            TrainState s = train_state((int)step, &train, &sched, tokens_seen, &a);
            save_checkpoint(&model, a.out_dir, &s);
        }
        if (have_tokenizer && a.sample_every > 0 && (step % a.sample_every == 0 || last) && step > 0) {
            int gen = a.gen_tokens < a.T ? a.gen_tokens : a.T;
            fox_sample(&model, &tk, gen, &sample_rng);
        }
        if (last) { break; }
        double t0 = now_seconds();
        double loss = fox_train_micro_steps(&model, &train, accum, step + 1);
        // a non-finite FP8 amax counts as a non-finite gradient: the saturating casts would hide it
        double norm = fp8_amax_finite(&model) ? fox_grad_norm(&model) : NAN;
        char why[256], grad[320] = "";
        int verdict = step_guard_check(&guard, loss, norm, why, sizeof(why));
        if (verdict != STEP_UPDATE && !isfinite(norm) && !nonfinite_grad_name(cf, model.grads_memory, grad,
                                                                               sizeof(grad))) {
            fp8_nonfinite_name(&model, grad, sizeof(grad));
        }
        if (verdict == STEP_STOP) { step_guard_stop(step + 1, why, grad); }
        float lr = (float)lr_at_tokens(&sched, (double)tokens_seen);
        if (verdict == STEP_UPDATE) {
            if (a.grad_clip > 0) { fox_clip_grads(&model, norm, (float)a.grad_clip); }
            fox_update(&model, &opt, lr, (int)step + 1);
        }
        fp8_step_end(&model, step + 1, verdict == STEP_UPDATE);
        tokens_seen += a.total_batch_tokens;
        double dt = now_seconds() - t0;
        run_clock_tick(&clock);
        char progress[96], fields[160];
        format_progress(progress, sizeof(progress), &clock, a.steps - step - 1, tokens_seen);
        step_log_fields(fields, sizeof(fields), lr, norm, a.total_batch_tokens / dt, tokens_seen);
        printf("step %5ld/%ld | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s%s", step + 1, a.steps, loss,
               norm, lr, dt * 1e3, a.total_batch_tokens / dt, progress);
        step_guard_log(&out, &guard, verdict, step + 1, loss, why, grad, fields);
    }
    if (guard.skipped > 0) { printf("skipped %ld of %ld steps (-G skip, -Z)\n", guard.skipped, a.steps - start); }
    run_dir_close(&out);
    if (have_tokenizer) { tokenizer_free(&tk); }
    dataloader_free(&train);
    if (have_val) { dataloader_free(&val); }
    fox_free(&model);
    return 0;
}
#endif
