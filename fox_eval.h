/*
fox_eval.h: the evaluation modes of both trainers: -M eval, generate, niah and maps.

Training does not need anything here. train_fox.c includes this file just before main(), so
the code below sees the whole twin (fox_forward, the data loader, the decode table), the
command line (Args, flag_int) and the run helpers (now_seconds); it is not a header to include
on its own.

In order:
  evaluation backends   ForwardBackend: the interface the modes run on (the GPU backend is in
                        train_fox.cu, the CPU backend below)
  the twin's KV cache   FoxDecoder, HeadCache, fox_decode_step: one token at a time, the
                        forget-gate state carried in O(1), eviction under -A 1
  the CPU backend       CpuBackend, cpu_backend_init
  sampling              argmax_token, sample_token: greedy, temperature, top-k
  text in               the GPT-2 encoder (data/gpt2_bpe.c), prompt_tokens, read_token_stream
  -M eval               per_token_loss, run_eval
  -M generate           run_generate
  -M niah               niah_build_prompt, niah_score, run_niah
  -M maps               attention_maps, run_maps
  entry points          eval_mode_shape, check_eval_args, run_eval_mode, cpu_eval_main
What the modes measure and how is in doc/fox.md, "Evaluation conventions"; how to run them
is in README.md.
*/

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

static void fox_decoder_reset(FoxDecoder* d) {
    const FoxConfig* cf = &d->m->config;
    size_t L = (size_t)cf->n_layer;
    d->len = 0;
    memset(d->c_last, 0, L * cf->n_head * sizeof(float));
    memset(d->k_raw_last, 0, L * cf->n_embd * sizeof(float)); // k~_{-1} = 0
    memset(d->v_raw_last, 0, L * cf->n_embd * sizeof(float));
    for (size_t i = 0; i < L * cf->n_head; i++) {
        HeadCache* hc = &d->heads[i];
        free(hc->k); free(hc->v); free(hc->c);
        memset(hc, 0, sizeof(*hc));
    }
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
    #pragma omp parallel for
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
    #pragma omp parallel for
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
        if (cf->gate != GATE_NONE) { // c continues from the last token: O(1) per token
            if (cf->gate == GATE_FULL) {
                matvec_forward(r->gate_logit, r->xa, LAYER(p.wf, l, (size_t)H * C), LAYER(p.bf, l, H), C, H);
            } else {
                memcpy(r->gate_logit, LAYER(p.bf, l, H), (size_t)H * sizeof(float));
            }
            for (int h = 0; h < H; h++) { c_last[h] += logsigmoidf(r->gate_logit[h]); }
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
// -M niah: needle in a haystack (doc/fox.md, "Evaluation conventions"). A prompt of exactly
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
                double depth = nd > 1 ? (double)di / (nd - 1) : 0.5;
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
// lower triangle without a gate) and the attention A = softmax_j(q_i.k_j / sqrt(hd) + c_i - c_j)
// (zero outside the causal window) of chosen heads, on one sequence run by the twin.
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
    double scale = 1.0 / sqrt((double)hd);
    #pragma omp parallel for
    for (int i = 0; i < T; i++) {
        float* Fi = F + (size_t)i * T;
        float* Ai = A + (size_t)i * T;
        int j0 = attention_first_key(i, cf->window);
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < T; j++) {
            Fi[j] = j <= i ? (c != NULL ? (float)exp((double)c[i] - c[j]) : 1.0f) : 0.0f;
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
