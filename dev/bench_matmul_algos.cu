/*
dev/bench_matmul_algos.cu: how much does a timed search over cuBLASLt's candidates gain over
the heuristic's first choice (train_fox.cu's matmul tuning, -X 1, searches the first 8 in a
training step; with -X 0 it takes the first)? For every distinct matmul of one training step of
a fox-pro preset (the calls of gpu_forward and gpu_backward in the bf16 build, see build_calls,
with matmul_plan's descriptors, B's leading dimension and the pointer alignments the trainer's
buffers have), asks the heuristic for up to 16 algorithms and times each one that runs: CUDA
events, the median of 20 runs after 3 warm-ups, L2 flushed before each timed run, inputs of
random non-zero values. Each candidate also runs twice from the same inputs and the same
starting output, with the call's own beta (beta 0: two different stale outputs), and the two
results are compared bit for bit: the trainer promises same seed, same bits. Prints per matmul
the first choice and the fastest with their configurations, and the step's matmul milliseconds
(each matmul times its calls per step) for first, fastest and fastest deterministic. A
benchmark, not a test: numbers for deciding on an autotuner.

  mkdir -p build && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler "-O3 -march=x86-64-v3" \
      dev/bench_matmul_algos.cu -lcublasLt -lcublas -o build/bench_matmul_algos
  ./build/bench_matmul_algos                    # fox-pro-125m at N=32768, then fox-pro-760m at N=16384
  ./build/bench_matmul_algos fox-pro-360m 16384 # one preset (fox-pro-{tiny,125m,360m,760m}), N = B*T
  ALIGN256=1 ./build/bench_matmul_algos        # every operand 256-byte aligned
  FUSED_QKVG=1 ./build/bench_matmul_algos      # what if q, k, v and the gate were one forward matmul
                                               # (N, 4C) (the trainer has four): compare the step sums
*/
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cuda_check(cudaError_t e, const char* call, const char* file, int line) {
    if (e == cudaSuccess) { return; }
    fprintf(stderr, "CUDA error '%s' in %s at %s:%d\n", cudaGetErrorString(e), call, file, line);
    exit(1);
}
static void cublas_check(cublasStatus_t s, const char* call, const char* file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) { return; }
    fprintf(stderr, "cuBLAS error %s in %s at %s:%d\n", cublasLtGetStatusName(s), call, file, line);
    exit(1);
}
#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)
#define cublasCheck(call) cublas_check((call), #call, __FILE__, __LINE__)

static const size_t WORKSPACE_BYTES = 32u << 20; // as train_fox.cu
#define MAX_ALGOS 16
#define WARMUPS 3
#define REPS 20
#define FLUSH_BYTES (256u << 20) // more than the 50 MB L2 of an H100 / H200
#define MAX_CALLS 32

// a fox-pro preset (train_fox.c: apply_family "fox-pro", apply_size, derived_mlp_hidden)
typedef struct { const char* name; int L, C, H, I, Vp; size_t N; } Config;

static int derived_mlp_hidden(int C) { return 256 * ((C * 7 * 2 / 6 + 255) / 256); } // Pro block, r = 3.5

static int config_from_preset(Config* c, const char* preset, size_t N) {
    static const struct { const char* name; int L, C, H; } sizes[] = {
        {"fox-pro-tiny", 2, 128, 2}, {"fox-pro-125m", 12, 768, 12}, {"fox-pro-360m", 24, 1024, 16},
        {"fox-pro-760m", 24, 1536, 24}};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        if (strcmp(preset, sizes[i].name) != 0) { continue; }
        c->name = sizes[i].name; c->L = sizes[i].L; c->C = sizes[i].C; c->H = sizes[i].H;
        c->I = derived_mlp_hidden(c->C); c->Vp = (50257 + 127) / 128 * 128; c->N = N;
        return 1;
    }
    return 0;
}

// The trainer's parameter layout (train_fox.cu's layout_params for a fox-pro model, one process):
// BUCKET_FP32 (wte, each layer's six vectors, norm_f), then BUCKET_MATMUL: each layer's wq, wk,
// wv, wg, wk_shift, wv_shift, wf, wo, wgu, wdown, then lm_head; every slice at a multiple of 64
// elements of a 256-aligned buffer (bf16 copy and fp32 gradients at the same element offsets).
enum { P_WQ, P_WK, P_WV, P_WG, P_WK_SHIFT, P_WV_SHIFT, P_WF, P_WO, P_WGU, P_WDOWN, P_LM_HEAD, NUM_P };

static unsigned byte_alignment(size_t offset) { // train_fox.cu's ptr_alignment of base + offset
    unsigned a = 256;
    while (a > 1 && offset % a != 0) { a /= 2; }
    return a;
}

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

// element offset of tensor t's layer-l slice (lm_head: l = 0)
static size_t param_offset(const Config* c, int t, int l) {
    size_t C = c->C, H = c->H, I = c->I, Vp = c->Vp;
    size_t slice[NUM_P] = {C * C, C * C, C * C, C * C, H * C, H * C, H * C, C * C, 2 * I * C, C * I, Vp * C};
    size_t fp32 = round64(round64(Vp * C) + (size_t)c->L * (5 * round64(C) + round64(H)) + round64(C));
    size_t layer = 0;
    for (int i = 0; i < P_LM_HEAD; i++) { layer += round64(slice[i]); }
    size_t off = fp32 + (t == P_LM_HEAD ? (size_t)c->L * layer : (size_t)l * layer);
    for (int i = 0; i < t && t != P_LM_HEAD; i++) { off += round64(slice[i]); }
    return off;
}

// smallest alignment over the layer slices of tensor t, elements of elem_bytes
static unsigned param_alignment(const Config* c, int t, size_t elem_bytes) {
    unsigned a = 256;
    for (int l = 0; l < (t == P_LM_HEAD ? 1 : c->L); l++) {
        unsigned al = byte_alignment(param_offset(c, t, l) * elem_bytes);
        if (al < a) { a = al; }
    }
    return a;
}

// one distinct matmul: D (m, n) = op(A) op(B) + beta C, column-major, as matmul_lt issues it
typedef struct {
    char name[40];
    int m, n, k, trans_a, trans_b, ldb; // ldb: B's leading dimension (a column block of a wider matrix)
    cudaDataType_t d_type;
    float beta;
    int sep_c;         // C is another buffer than D (the residual add)
    unsigned align[4]; // bytes, of A, B, C, D
    int calls;         // per training step
} Call;

static Call g_calls[MAX_CALLS];
static int g_num_calls;

// merges calls that the trainer's plan cache would share (same shape, ldb, type and alignments) and
// that do the same thing (beta, separate C); ldb 0: B is dense, as in matmul_lt
static void add_call(const char* name, int m, int n, int k, int ta, int tb, int ldb, cudaDataType_t dt, float beta,
                     int sep_c, unsigned aa, unsigned ab, unsigned ac, unsigned ad, int calls) {
    if (getenv("ALIGN256") != NULL) { aa = ab = ac = ad = 256; } // what the calls would take with aligned tensors
    if (ldb == 0) { ldb = tb ? n : k; }
    Call c = {"", m, n, k, ta, tb, ldb, dt, beta, sep_c, {aa, ab, ac, ad}, calls};
    for (int i = 0; i < g_num_calls; i++) {
        Call* p = &g_calls[i];
        if (p->m == m && p->n == n && p->k == k && p->trans_a == ta && p->trans_b == tb && p->ldb == ldb &&
            p->d_type == dt && p->beta == beta && p->sep_c == sep_c &&
            memcmp(p->align, c.align, sizeof(c.align)) == 0) {
            p->calls += calls;
            size_t len = strlen(p->name);
            snprintf(p->name + len, sizeof(p->name) - len, ",%s", strchr(name, ' ') + 1);
            return;
        }
    }
    if (g_num_calls == MAX_CALLS) { fprintf(stderr, "too many calls\n"); exit(1); }
    snprintf(c.name, sizeof(c.name), "%s", name);
    g_calls[g_num_calls++] = c;
}

// the trainer's wrappers (activations and gradient buffers are 256-aligned: arena_take)
static void fwd(const char* name, cudaDataType_t t, int add, unsigned w_al, size_t N, int IC, int OC, int calls) {
    add_call(name, OC, (int)N, IC, 1, 0, 0, t, add ? 1.0f : 0.0f, add, w_al, 256, 256, 256, calls);
}
static void bwd_in(const char* name, cudaDataType_t t, unsigned w_al, size_t N, int IC, int OC, float beta, int calls) {
    add_call(name, IC, (int)N, OC, 0, 0, 0, t, beta, 0, w_al, 256, 256, 256, calls);
}
static void bwd_w(const char* name, unsigned dw_al, size_t N, int IC, int OC, int calls) {
    add_call(name, IC, OC, (int)N, 0, 1, 0, CUDA_R_32F, 1.0f, 0, 256, 256, dw_al, dw_al, calls);
}

// gpu_forward and gpu_backward of a fox-pro model (QK-norm, k/v shift, full forget gate, output
// gate: q, k, v, g all have stage kernels). The attention input's gradient is one matmul, dqkvg
// (N, 4C) @ [W_q; W_k; W_v; W_g] (4C, C) (side by side in the layout), beta 1 onto the head
// projections' term, and their weights' gradient one matmul too; the head projections' weight
// gradients are one matmul, (3H, C) += dhp (N, 3H)^T x. The head projections' forward and input
// gradient are train_fox.cu's own kernels, not listed.
static void build_calls(const Config* c) {
    size_t N = c->N;
    int L = c->L, C = c->C, H = c->H, I = c->I, Vp = c->Vp, W = 4 * C;
    const cudaDataType_t X = CUDA_R_16BF, F = CUDA_R_32F;
#define WX(t) param_alignment(c, t, 2)
#define WG(t) param_alignment(c, t, 4)
    g_num_calls = 0;
    if (getenv("FUSED_QKVG") != NULL) {
        fwd("fwd qkvg", X, 0, WX(P_WQ), N, C, W, L);
    } else {
        fwd("fwd q", X, 0, WX(P_WQ), N, C, C, L);
        fwd("fwd k", X, 0, WX(P_WK), N, C, C, L);
        fwd("fwd v", X, 0, WX(P_WV), N, C, C, L);
        fwd("fwd g", X, 0, WX(P_WG), N, C, C, L);
    }
    fwd("fwd o+res", F, 1, WX(P_WO), N, C, C, L);
    fwd("fwd gu", X, 0, WX(P_WGU), N, C, 2 * I, L);
    fwd("fwd down+res", F, 1, WX(P_WDOWN), N, I, C, L);
    fwd("fwd lm", X, 0, WX(P_LM_HEAD), N, C, Vp, 1);
    bwd_in("bin lm", F, WX(P_LM_HEAD), N, C, Vp, 0.0f, 1);
    bwd_w("bw lm", WG(P_LM_HEAD), N, C, Vp, 1);
    bwd_in("bin down", X, WX(P_WDOWN), N, I, C, 0.0f, L);
    bwd_w("bw down", WG(P_WDOWN), N, I, C, L);
    bwd_in("bin gu", F, WX(P_WGU), N, C, 2 * I, 0.0f, L);
    bwd_w("bw gu", WG(P_WGU), N, C, 2 * I, L);
    bwd_in("bin o", X, WX(P_WO), N, C, C, 0.0f, L);
    bwd_w("bw o", WG(P_WO), N, C, C, L);
    bwd_w("bw hp", WG(P_WK_SHIFT), N, C, 3 * H, L);
    bwd_in("bin qkvg", F, WX(P_WQ), N, C, W, 1.0f, L);
    bwd_w("bw qkvg", WG(P_WQ), N, C, W, L);
#undef WX
#undef WG
}

// random values in +-[1/64, 1], never zero; bf16 or fp32
__global__ void fill_kernel(void* p, size_t n, int bf16, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32);
        h ^= h >> 31; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 29; h *= 0x94D049BB133111EBull; h ^= h >> 32;
        float v = (float)(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
        if (fabsf(v) < 1.0f / 64) { v = v < 0 ? -1.0f / 64 : 1.0f / 64; }
        if (bf16) { ((__nv_bfloat16*)p)[i] = __float2bfloat16(v); } else { ((float*)p)[i] = v; }
    }
}

__global__ void diff_kernel(const uint16_t* x, const uint16_t* y, size_t n, unsigned long long* count) {
    unsigned long long c = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        c += x[i] != y[i];
    }
    if (c > 0) { atomicAdd(count, c); }
}

static void fill(void* p, size_t n, cudaDataType_t t, uint32_t seed) {
    fill_kernel<<<1024, 256>>>(p, n, t == CUDA_R_16BF, seed);
    cudaCheck(cudaGetLastError());
}

static unsigned long long* g_count;
static unsigned long long count_diffs(const void* x, const void* y, size_t bytes) {
    cudaCheck(cudaMemset(g_count, 0, sizeof(*g_count)));
    diff_kernel<<<1024, 256>>>((const uint16_t*)x, (const uint16_t*)y, bytes / 2, g_count);
    cudaCheck(cudaGetLastError());
    unsigned long long c = 0;
    cudaCheck(cudaMemcpy(&c, g_count, sizeof(c), cudaMemcpyDeviceToHost));
    return c;
}

// buffers with the trainer's alignment: `align` bytes past a 256-aligned allocation
static void* alloc_aligned(void** base, size_t bytes, unsigned align) {
    cudaCheck(cudaMalloc(base, bytes + 256));
    return (char*)*base + (align < 256 ? align : 0);
}

static cublasLtHandle_t g_lt;
static void* g_workspace;
static void* g_flush;

typedef struct {
    const Call* call;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
    const void *A, *B, *Cin; // Cin: the separate C, else NULL
} Plan;

static cublasStatus_t matmul(const Plan* p, const cublasLtMatmulAlgo_t* algo, void* D) {
    float alpha = 1.0f, beta = p->call->beta;
    const void* C = p->Cin != NULL ? p->Cin : D;
    return cublasLtMatmul(g_lt, p->desc, &alpha, p->A, p->a, p->B, p->b, &beta, C, p->c, D, p->d, algo,
                          g_workspace, WORKSPACE_BYTES, 0);
}

// median ms over REPS runs into D, -1 when the algorithm fails to run
static float time_algo(const Plan* p, const cublasLtMatmulAlgo_t* algo, void* D) {
    if (matmul(p, algo, D) != CUBLAS_STATUS_SUCCESS) { cudaGetLastError(); return -1.0f; }
    for (int i = 1; i < WARMUPS; i++) { cublasCheck(matmul(p, algo, D)); }
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
    float t[REPS];
    for (int r = 0; r < REPS; r++) {
        cudaCheck(cudaMemsetAsync(g_flush, r, FLUSH_BYTES, 0));
        cudaCheck(cudaEventRecord(e0, 0));
        cublasCheck(matmul(p, algo, D));
        cudaCheck(cudaEventRecord(e1, 0));
        cudaCheck(cudaEventSynchronize(e1));
        cudaCheck(cudaEventElapsedTime(&t[r], e0, e1));
    }
    cudaCheck(cudaEventDestroy(e0)); cudaCheck(cudaEventDestroy(e1));
    for (int i = 1; i < REPS; i++) { // insertion sort
        float v = t[i];
        int j = i - 1;
        while (j >= 0 && t[j] > v) { t[j + 1] = t[j]; j--; }
        t[j + 1] = v;
    }
    return 0.5f * (t[REPS / 2 - 1] + t[REPS / 2]);
}

// the two algorithms' outputs from the same inputs and the same starting output (bitwise
// equal when x == y means deterministic)
static unsigned long long compare_algos(const Plan* p, const cublasLtMatmulAlgo_t* x, const cublasLtMatmulAlgo_t* y,
                                        void* D0, void* D1, size_t n) {
    fill(D0, n, p->call->d_type, 7);
    fill(D1, n, p->call->d_type, p->call->beta != 0.0f && !p->call->sep_c ? 7 : 8); // fresh unless D is C
    cublasCheck(matmul(p, x, D0));
    cublasCheck(matmul(p, y, D1));
    return count_diffs(D0, D1, n * (p->call->d_type == CUDA_R_32F ? 4 : 2));
}

static unsigned algo_attr(const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, size_t bytes) {
    uint64_t v = 0;
    size_t written = 0;
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(algo, attr, &v, bytes, &written));
    return (unsigned)v;
}

static void print_algo(const char* label, int index, const cublasLtMatmulAlgo_t* algo) {
    printf("    %s #%-2d id %3u tile %3u stages %3u splitK %2d reduction %u swizzle %u cluster %2u custom %u\n",
           label, index, algo_attr(algo, CUBLASLT_ALGO_CONFIG_ID, 4), algo_attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, 4),
           algo_attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, 4), (int)algo_attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4),
           algo_attr(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 4),
           algo_attr(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, 4),
           algo_attr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, 2),
           algo_attr(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, 4));
}

typedef struct { float first, best, best_det; } Result;

static Result bench_call(int index, const Call* call) {
    Result res = {-1.0f, -1.0f, -1.0f};
    Plan p;
    memset(&p, 0, sizeof(p));
    p.call = call;
    int m = call->m, n = call->n, k = call->k, ta = call->trans_a, tb = call->trans_b;
    cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, ta ? k : m, ta ? m : k, ta ? k : m));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, tb ? n : k, tb ? k : n, call->ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.c, call->d_type, m, n, m));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.d, call->d_type, m, n, m));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        uint32_t a = call->align[i];
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &a, sizeof(a)));
    }
    cublasLtMatmulHeuristicResult_t cand[MAX_ALGOS];
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(g_lt, p.desc, p.a, p.b, p.c, p.d, pref, MAX_ALGOS, cand, &found));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));

    size_t d_elem = call->d_type == CUDA_R_32F ? 4 : 2, nd = (size_t)m * n;
    size_t nb = (size_t)call->ldb * (tb ? k : n); // B as stored: its columns ldb apart (those of a wider matrix)
    void *base_a, *base_b, *base_c = NULL, *base_d0, *base_d1;
    p.A = alloc_aligned(&base_a, (size_t)m * k * 2, call->align[0]);
    p.B = alloc_aligned(&base_b, nb * 2, call->align[1]);
    if (call->sep_c) { p.Cin = alloc_aligned(&base_c, nd * d_elem, call->align[2]); }
    void* D0 = alloc_aligned(&base_d0, nd * d_elem, call->align[3]);
    void* D1 = alloc_aligned(&base_d1, nd * d_elem, call->align[3]);
    fill((void*)p.A, (size_t)m * k, CUDA_R_16BF, 1);
    fill((void*)p.B, nb, CUDA_R_16BF, 2);
    if (call->sep_c) { fill((void*)p.Cin, nd, call->d_type, 3); }

    float ms[MAX_ALGOS];
    int det[MAX_ALGOS], usable = 0, best = -1, best_det = -1;
    for (int i = 0; i < found; i++) {
        ms[i] = -1.0f; det[i] = 0;
        if (cand[i].state != CUBLAS_STATUS_SUCCESS || cand[i].workspaceSize > WORKSPACE_BYTES) { continue; }
        fill(D0, nd, call->d_type, 7);
        ms[i] = time_algo(&p, &cand[i].algo, D0);
        if (ms[i] < 0) { continue; }
        usable++;
        det[i] = compare_algos(&p, &cand[i].algo, &cand[i].algo, D0, D1, nd) == 0;
        if (best < 0 || ms[i] < ms[best]) { best = i; }
        if (det[i] && (best_det < 0 || ms[i] < ms[best_det])) { best_det = i; }
    }
    const char* dt = call->d_type == CUDA_R_32F ? "fp32" : "bf16";
    char al[24];
    snprintf(al, sizeof(al), "%u/%u/%u/%u", call->align[0], call->align[1], call->align[2], call->align[3]);
    printf("%2d %-22s %5d %6d %6d %d %d %s %s %-15s %5d %2d/%-2d", index, call->name, m, n, k, ta, tb, dt,
           call->beta == 0.0f ? "0 " : call->sep_c ? "1r" : "1 ", al, call->calls, usable, found);
    if (found == 0 || ms[0] < 0 || best < 0) {
        printf("  first choice %s\n", found == 0 ? "missing" : "fails");
    } else {
        unsigned long long vs_first = compare_algos(&p, &cand[best].algo, &cand[0].algo, D0, D1, nd);
        printf(" %8.4f %8.4f %2d %5.3f %s %s\n", ms[0], ms[best], best, ms[0] / ms[best], det[best] ? "yes" : "NO ",
               vs_first == 0 ? "yes" : "no");
        res.first = ms[0]; res.best = ms[best]; res.best_det = best_det >= 0 ? ms[best_det] : ms[0];
        if (!det[0]) { printf("    warning: the first choice is not deterministic\n"); }
        print_algo("first", 0, &cand[0].algo);
        if (best != 0) { print_algo("best ", best, &cand[best].algo); }
        if (best_det != best && best_det >= 0) {
            printf("    fastest deterministic #%d: %.4f ms\n", best_det, ms[best_det]);
            print_algo("det  ", best_det, &cand[best_det].algo);
        }
    }
    fflush(stdout);
    cudaCheck(cudaFree(base_a)); cudaCheck(cudaFree(base_b));
    cudaCheck(cudaFree(base_d0)); cudaCheck(cudaFree(base_d1));
    if (base_c != NULL) { cudaCheck(cudaFree(base_c)); }
    cublasCheck(cublasLtMatmulDescDestroy(p.desc));
    cublasCheck(cublasLtMatrixLayoutDestroy(p.a)); cublasCheck(cublasLtMatrixLayoutDestroy(p.b));
    cublasCheck(cublasLtMatrixLayoutDestroy(p.c)); cublasCheck(cublasLtMatrixLayoutDestroy(p.d));
    return res;
}

static void bench_config(const Config* c) {
    build_calls(c);
    printf("\n%s: n_layer %d, n_embd %d, n_head %d, mlp_hidden %d, padded vocab %d, N = B*T = %zu; "
           "%d distinct matmuls\n", c->name, c->L, c->C, c->H, c->I, c->Vp, c->N, g_num_calls);
    printf("%2s %-22s %5s %6s %6s %s %s %-4s %-2s %-15s %5s %5s %8s %8s %2s %5s %-3s %s\n", "#", "call", "m", "n",
           "k", "A", "B", "D", "b", "align A/B/C/D", "calls", "algos", "1st ms", "best ms", "#", "gain", "det", "=1st");
    double first = 0.0, best = 0.0, best_det = 0.0;
    for (int i = 0; i < g_num_calls; i++) {
        Result r = bench_call(i, &g_calls[i]);
        if (r.first < 0) { continue; }
        int calls = g_calls[i].calls;
        first += r.first * calls; best += r.best * calls; best_det += r.best_det * calls;
    }
    printf("(A B: transa transb; b: beta, 1r = plus a separate C (the residual); det: the best gives the same bits "
           "twice;\n =1st: the best gives the first choice's bits)\n");
    printf("%s, matmul ms per step (N = %zu tokens): first choice %.3f, best %.3f (%.3fx, -%.3f ms), "
           "best deterministic %.3f (%.3fx)\n", c->name, c->N, first, best, first / best, first - best, best_det,
           first / best_det);
}

int main(int argc, char** argv) {
    Config configs[2];
    int n = 0;
    if (argc == 1) {
        config_from_preset(&configs[n++], "fox-pro-125m", 32768);
        config_from_preset(&configs[n++], "fox-pro-760m", 16384);
    } else {
        long N = argc > 2 ? atol(argv[2]) : 16384;
        if (argc > 3 || N <= 0 || N % 8 != 0 || !config_from_preset(&configs[n++], argv[1], (size_t)N)) {
            fprintf(stderr, "usage: %s [fox-pro-{tiny,125m,360m,760m} [N = B*T tokens, a multiple of 8]]\n", argv[0]);
            return 1;
        }
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    int lt_version = (int)cublasLtGetVersion();
    printf("%s, cuBLASLt %d; median of %d runs after %d warm-ups, L2 flushed before each\n", prop.name, lt_version,
           REPS, WARMUPS);
    cublasCheck(cublasLtCreate(&g_lt));
    cudaCheck(cudaMalloc(&g_workspace, WORKSPACE_BYTES));
    cudaCheck(cudaMalloc(&g_flush, FLUSH_BYTES));
    cudaCheck(cudaMalloc(&g_count, sizeof(*g_count)));
    for (int i = 0; i < n; i++) { bench_config(&configs[i]); }
    cudaCheck(cudaFree(g_count)); cudaCheck(cudaFree(g_flush)); cudaCheck(cudaFree(g_workspace));
    cublasCheck(cublasLtDestroy(g_lt));
    return 0;
}
