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
  FP8=1 ./build/bench_matmul_algos             # each matmul in FP8 too (below): where FP8 would pay

FP8=1: after each bf16 line, the same product in FP8 as cuBLASLt takes it on Hopper: both operands K-major (op(A) T,
op(B) N), per-tensor scales by device pointer, D and C as the bf16 call's. A is E4M3 (a weight, or the activation of a
weight gradient); B is E4M3 in the forward and E5M2 (a gradient) in the backward. Operands are random FP8 codes of
+-[1/64, 1]. The line gives the fastest deterministic candidate's ms (of up to 8) with cuBLASLt's default
accumulation (partial sums promoted to fp32 in the epilogue's way; FAST_ACCUM off) and with FAST_ACCUM on, and each
one's error against the bf16 matmul of the same values decoded (exact in bf16): max |D - D_ref| / max |D_ref|. Then
the FP8 operands' casts as standalone kernels (bf16 in, FP8 and per-block amax out; L2 flushed): "rows" where a
producer could write the FP8 copy itself (the forward's and the input gradient's B), "transposes" that a weight
gradient needs (inp^T and dout^T, token-contiguous), "weights" the weight's cast (the forward) or cast and transpose
(the input gradient), once per optimizer step. The step sums: bf16 against FP8 with each kind of cast added.
*/
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
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

// random values in +-[1/64, 1], never zero; fp32, bf16, or the nearest E4M3 / E5M2 codes
__global__ void fill_kernel(void* p, size_t n, cudaDataType_t type, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32);
        h ^= h >> 31; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 29; h *= 0x94D049BB133111EBull; h ^= h >> 32;
        float v = (float)(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
        if (fabsf(v) < 1.0f / 64) { v = v < 0 ? -1.0f / 64 : 1.0f / 64; }
        if (type == CUDA_R_16BF) { ((__nv_bfloat16*)p)[i] = __float2bfloat16(v); }
        else if (type == CUDA_R_32F) { ((float*)p)[i] = v; }
        else {
            __nv_fp8_interpretation_t f = type == CUDA_R_8F_E5M2 ? __NV_E5M2 : __NV_E4M3;
            ((uint8_t*)p)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, f);
        }
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
    fill_kernel<<<1024, 256>>>(p, n, t, seed);
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

// the median ms of REPS runs of run(arg), after WARMUPS - 1 more (the caller ran it once), L2 flushed before each
static float median_ms(void (*run)(const void*), const void* arg) {
    for (int i = 1; i < WARMUPS; i++) { run(arg); }
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
    float t[REPS];
    for (int r = 0; r < REPS; r++) {
        cudaCheck(cudaMemsetAsync(g_flush, r, FLUSH_BYTES, 0));
        cudaCheck(cudaEventRecord(e0, 0));
        run(arg);
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

typedef struct { const Plan* p; const cublasLtMatmulAlgo_t* algo; void* D; } MatmulRun;
static void run_matmul(const void* arg) {
    const MatmulRun* r = (const MatmulRun*)arg;
    cublasCheck(matmul(r->p, r->algo, r->D));
}

// median ms over REPS runs into D, -1 when the algorithm fails to run
static float time_algo(const Plan* p, const cublasLtMatmulAlgo_t* algo, void* D) {
    if (matmul(p, algo, D) != CUBLAS_STATUS_SUCCESS) { cudaGetLastError(); return -1.0f; }
    MatmulRun r = {p, algo, D};
    return median_ms(run_matmul, &r);
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

static float* g_one; // a device 1.0f: the FP8 operands' scales

// p's descriptors for call c and the heuristic's candidates (up to max; their count returned). bf16 operands with
// the call's transposes (matmul_plan's), or K-major operands (op(A) T, op(B) N, leading dimension k: Hopper's FP8
// layout) of types a_type, b_type; FP8 operands get scale pointers (1.0) and fast accumulation when asked.
static int plan_make(Plan* p, const Call* c, int kmajor, cudaDataType_t a_type, cudaDataType_t b_type, int fast,
                     cublasLtMatmulHeuristicResult_t* cand, int max) {
    memset(p, 0, sizeof(*p));
    p->call = c;
    int m = c->m, n = c->n, k = c->k, ta = kmajor || c->trans_a, tb = !kmajor && c->trans_b;
    cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (a_type != CUDA_R_16BF) {
        int8_t fa = (int8_t)fast;
        const cublasLtMatmulDescAttributes_t scale[2] = {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                         CUBLASLT_MATMUL_DESC_B_SCALE_POINTER};
        for (int i = 0; i < 2; i++) {
            cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, scale[i], &g_one, sizeof(g_one)));
        }
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)));
    }
    cublasCheck(cublasLtMatrixLayoutCreate(&p->a, a_type, ta ? k : m, ta ? m : k, ta ? k : m));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->b, b_type, tb ? n : k, tb ? k : n, kmajor ? k : c->ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->c, c->d_type, m, n, m));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->d, c->d_type, m, n, m));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        uint32_t a = kmajor && i < 2 ? 256 : c->align[i]; // K-major copies are buffers of their own
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &a, sizeof(a)));
    }
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->a, p->b, p->c, p->d, pref, max, cand, &found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    return st == CUBLAS_STATUS_SUCCESS ? found : 0; // FP8: NOT_SUPPORTED for shapes it cannot take
}

static void plan_free(Plan* p) {
    cublasCheck(cublasLtMatmulDescDestroy(p->desc));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->a)); cublasCheck(cublasLtMatrixLayoutDestroy(p->b));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->c)); cublasCheck(cublasLtMatrixLayoutDestroy(p->d));
}

static Result bench_call(int index, const Call* call) {
    Result res = {-1.0f, -1.0f, -1.0f};
    Plan p;
    cublasLtMatmulHeuristicResult_t cand[MAX_ALGOS];
    int found = plan_make(&p, call, 0, CUDA_R_16BF, CUDA_R_16BF, 0, cand, MAX_ALGOS);
    int m = call->m, n = call->n, k = call->k, ta = call->trans_a, tb = call->trans_b;

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
    plan_free(&p);
    return res;
}

// ---- FP8 (FP8=1) ----
#define FP8_ALGOS 8
#define CAST_TILE 64 // cast_transpose_kernel's tile: 64 x 64 values, 256 threads

// FP8 codes -> bf16, exact (every E4M3 and E5M2 value is a bf16 value)
__global__ void fp8_to_bf16_kernel(const uint8_t* x, __nv_bfloat16* y, size_t n, cudaDataType_t type) {
    __nv_fp8_interpretation_t f = type == CUDA_R_8F_E5M2 ? __NV_E5M2 : __NV_E4M3;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        y[i] = __float2bfloat16(__half2float(__half(__nv_cvt_fp8_to_halfraw(x[i], f))));
    }
}

// out[0] = max |x - y|, out[1] = max |y| over n values (fp32 or bf16); non-negative floats order as their bits
__global__ void max_err_kernel(const void* x, const void* y, size_t n, int bf16, unsigned* out) {
    float e = 0.0f, r = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float a = bf16 ? __bfloat162float(((const __nv_bfloat16*)x)[i]) : ((const float*)x)[i];
        float b = bf16 ? __bfloat162float(((const __nv_bfloat16*)y)[i]) : ((const float*)y)[i];
        e = fmaxf(e, fabsf(a - b));
        r = fmaxf(r, fabsf(b));
    }
    atomicMax(&out[0], __float_as_uint(e));
    atomicMax(&out[1], __float_as_uint(r));
}

// the block's max of v into amax[blockIdx.x] (256 threads)
__device__ void block_amax(float v, float* amax) {
    __shared__ float warp_max[8];
    for (int o = 16; o > 0; o >>= 1) { v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o)); }
    if (threadIdx.x % 32 == 0) { warp_max[threadIdx.x / 32] = v; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++) { v = fmaxf(v, warp_max[w]); }
        amax[blockIdx.x] = v;
    }
}

// y = FP8(x * scale), row-major as x, 8 values a thread (n a multiple of 8), and the block's max |x|: a standalone
// cast, what a producer writing its FP8 copy itself would save
__global__ void cast_rows_kernel(const __nv_bfloat16* x, uint8_t* y, size_t n, float scale, cudaDataType_t type,
                                 float* amax) {
    __nv_fp8_interpretation_t f = type == CUDA_R_8F_E5M2 ? __NV_E5M2 : __NV_E4M3;
    float mx = 0.0f;
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        uint4 in = *(const uint4*)(x + i);
        const __nv_bfloat162* h = (const __nv_bfloat162*)&in;
        uint16_t out[4];
        for (int j = 0; j < 4; j++) {
            float2 v = __bfloat1622float2(h[j]);
            mx = fmaxf(mx, fmaxf(fabsf(v.x), fabsf(v.y)));
            out[j] = __nv_cvt_float2_to_fp8x2(make_float2(v.x * scale, v.y * scale), __NV_SATFINITE, f);
        }
        *(uint2*)(y + i) = *(const uint2*)out;
    }
    block_amax(mx, amax);
}

// y (cols, rows) = FP8(x (rows, cols) * scale)^T through a 64 x 64 shared tile, and the block's max |x|: the
// token-contiguous copies a weight gradient needs
__global__ void cast_transpose_kernel(const __nv_bfloat16* x, uint8_t* y, int rows, int cols, float scale,
                                      cudaDataType_t type, float* amax) {
    __shared__ float tile[CAST_TILE][CAST_TILE + 1];
    __nv_fp8_interpretation_t f = type == CUDA_R_8F_E5M2 ? __NV_E5M2 : __NV_E4M3;
    int r0 = blockIdx.y * CAST_TILE, c0 = blockIdx.x * CAST_TILE;
    float mx = 0.0f;
    for (int i = threadIdx.x; i < CAST_TILE * CAST_TILE; i += blockDim.x) { // coalesced along cols
        int r = r0 + i / CAST_TILE, c = c0 + i % CAST_TILE;
        float v = r < rows && c < cols ? __bfloat162float(x[(size_t)r * cols + c]) : 0.0f;
        mx = fmaxf(mx, fabsf(v));
        tile[i / CAST_TILE][i % CAST_TILE] = v * scale;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < CAST_TILE * CAST_TILE / 4; i += blockDim.x) { // 4 codes a store, along rows
        int c = i / (CAST_TILE / 4), r = (i % (CAST_TILE / 4)) * 4;
        if (c0 + c >= cols || r0 + r >= rows) { continue; }
        uint16_t lo = __nv_cvt_float2_to_fp8x2(make_float2(tile[r][c], tile[r + 1][c]), __NV_SATFINITE, f);
        uint16_t hi = __nv_cvt_float2_to_fp8x2(make_float2(tile[r + 2][c], tile[r + 3][c]), __NV_SATFINITE, f);
        *(uint32_t*)(y + (size_t)(c0 + c) * rows + r0 + r) = lo | (uint32_t)hi << 16; // rows a multiple of 4
    }
    block_amax(mx, amax + (size_t)blockIdx.y * gridDim.x);
}

typedef struct { const __nv_bfloat16* x; uint8_t* y; int rows, cols, transpose; cudaDataType_t type; } Cast;
static float* g_amax; // per-block maxima of the casts (never reduced: a benchmark)

static void run_cast(const void* arg) {
    const Cast* c = (const Cast*)arg;
    if (c->transpose) {
        dim3 grid((c->cols + CAST_TILE - 1) / CAST_TILE, (c->rows + CAST_TILE - 1) / CAST_TILE);
        cast_transpose_kernel<<<grid, 256>>>(c->x, c->y, c->rows, c->cols, 1.0f, c->type, g_amax);
    } else {
        cast_rows_kernel<<<1024, 256>>>(c->x, c->y, (size_t)c->rows * c->cols, 1.0f, c->type, g_amax);
    }
    cudaCheck(cudaGetLastError());
}

// median ms of one cast of a (rows, cols) bf16 tensor to FP8
static float time_cast(const __nv_bfloat16* x, uint8_t* y, int rows, int cols, int transpose, cudaDataType_t type) {
    Cast c = {x, y, rows, cols, transpose, type};
    run_cast(&c);
    return median_ms(run_cast, &c);
}

typedef struct { float ms, fast_ms, rows, transposes, weights; } Fp8Result;

// the fastest candidate that gives the same bits twice (ms, or -1) and its error against the reference plan;
// *refused: a bit per candidate that cuBLASLt refused to run (bit 0 the heuristic's first)
static float fp8_fastest(const Plan* p, const cublasLtMatmulHeuristicResult_t* cand, int found, const Plan* ref,
                         const cublasLtMatmulAlgo_t* ref_algo, void* D0, void* D1, size_t nd, double* err,
                         unsigned* refused) {
    float best = -1.0f;
    int pick = -1;
    *refused = 0;
    for (int i = 0; i < found; i++) {
        if (cand[i].state != CUBLAS_STATUS_SUCCESS || cand[i].workspaceSize > WORKSPACE_BYTES) { continue; }
        float ms = time_algo(p, &cand[i].algo, D0);
        if (ms < 0) { *refused |= 1u << i; }
        if (ms < 0 || compare_algos(p, &cand[i].algo, &cand[i].algo, D0, D1, nd) != 0) { continue; }
        if (best < 0 || ms < best) { best = ms; pick = i; }
    }
    *err = -1.0;
    if (pick < 0) { return best; }
    int bf16 = p->call->d_type == CUDA_R_16BF;
    fill(D0, nd, p->call->d_type, 7); // the same C for both when beta is 1
    fill(D1, nd, p->call->d_type, 7);
    cublasCheck(matmul(p, &cand[pick].algo, D0));
    cublasCheck(matmul(ref, ref_algo, D1));
    unsigned h[2] = {0, 0}, *d;
    cudaCheck(cudaMalloc(&d, sizeof(h)));
    cudaCheck(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice));
    max_err_kernel<<<1024, 256>>>(D0, D1, nd, bf16, d);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(d));
    float e, r;
    memcpy(&e, &h[0], 4); memcpy(&r, &h[1], 4);
    *err = r > 0 ? (double)e / r : -1.0;
    return best;
}

// call c in FP8 (see the top): the fastest deterministic candidate with and without fast accumulation, each one's
// error against the bf16 matmul of the same values, and the standalone casts of its operands
static Fp8Result bench_fp8(const Call* c) {
    Fp8Result res = {-1.0f, -1.0f, 0.0f, 0.0f, 0.0f};
    int fwd = c->trans_a, wgrad = c->trans_b; // forward: A = W (op T); input gradient: N, N; weight gradient: N, T
    const cudaDataType_t E4 = CUDA_R_8F_E4M3, E5 = CUDA_R_8F_E5M2, BF = CUDA_R_16BF;
    cudaDataType_t b_type = fwd ? E4 : E5;
    size_t m = c->m, n = c->n, k = c->k, nd = m * n, d_elem = c->d_type == CUDA_R_32F ? 4 : 2;
    uint8_t *A8, *B8;
    __nv_bfloat16 *A16, *B16;
    void *Cin = NULL, *D0, *D1;
    cudaCheck(cudaMalloc(&A8, m * k)); cudaCheck(cudaMalloc(&B8, k * n));
    cudaCheck(cudaMalloc(&A16, m * k * 2)); cudaCheck(cudaMalloc(&B16, k * n * 2));
    cudaCheck(cudaMalloc(&D0, nd * d_elem)); cudaCheck(cudaMalloc(&D1, nd * d_elem));
    fill(A8, m * k, E4, 1);
    fill(B8, k * n, b_type, 2);
    fp8_to_bf16_kernel<<<1024, 256>>>(A8, A16, m * k, E4);
    fp8_to_bf16_kernel<<<1024, 256>>>(B8, B16, k * n, b_type);
    cudaCheck(cudaGetLastError());
    if (c->sep_c) { cudaCheck(cudaMalloc(&Cin, nd * d_elem)); fill(Cin, nd, c->d_type, 3); }
    Plan ref, p8, pf;
    cublasLtMatmulHeuristicResult_t rc[1], cand[FP8_ALGOS], candf[FP8_ALGOS];
    int nref = plan_make(&ref, c, 1, BF, BF, 0, rc, 1);
    int n8 = plan_make(&p8, c, 1, E4, b_type, 0, cand, FP8_ALGOS);
    int nf = plan_make(&pf, c, 1, E4, b_type, 1, candf, FP8_ALGOS);
    ref.A = A16; ref.B = B16; p8.A = pf.A = A8; p8.B = pf.B = B8; ref.Cin = p8.Cin = pf.Cin = Cin;
    double err8 = -1.0, errf = -1.0;
    unsigned refused = 0, refused_f = 0;
    if (nref > 0) {
        res.ms = fp8_fastest(&p8, cand, n8, &ref, &rc[0].algo, D0, D1, nd, &err8, &refused);
        res.fast_ms = fp8_fastest(&pf, candf, nf, &ref, &rc[0].algo, D0, D1, nd, &errf, &refused_f);
    }
    // the bf16 copies stand in for the tensors a cast reads (the same sizes); the FP8 buffers take the codes
    if (fwd) {        // B = inp (N, IC) from its producer; A = W (OC, IC)
        res.rows = time_cast(B16, B8, (int)n, (int)k, 0, E4);
        res.weights = time_cast(A16, A8, (int)m, (int)k, 0, E4);
    } else if (!wgrad) { // B = dout (N, OC); A = W^T (IC, OC) from W (OC, IC)
        res.rows = time_cast(B16, B8, (int)n, (int)k, 0, E5);
        res.weights = time_cast(A16, A8, (int)k, (int)m, 1, E4);
    } else {          // A = inp^T (IC, N) from inp (N, IC); B = dout^T (OC, N) from dout (N, OC)
        res.transposes = time_cast(A16, A8, (int)k, (int)m, 1, E4) + time_cast(B16, B8, (int)k, (int)n, 1, E5);
    }
    if (res.ms < 0) {
        printf("    fp8 E4M3 x %s: no deterministic candidate (%d found)\n", fwd ? "E4M3" : "E5M2", n8);
    } else {
        printf("    fp8 E4M3 x %s: %8.4f ms (err %.1e), fast accumulation %8.4f ms (err %.1e); casts: rows %.4f, "
               "transposes %.4f, weights %.4f\n", fwd ? "E4M3" : "E5M2", res.ms, err8, res.fast_ms, errf, res.rows,
               res.transposes, res.weights);
    }
    printf("    fp8 candidates refused at run time: %d of %d (first %s), fast accumulation %d of %d (first %s)\n",
           __builtin_popcount(refused), n8, refused & 1 ? "refused" : "ran", __builtin_popcount(refused_f), nf,
           refused_f & 1 ? "refused" : "ran");
    fflush(stdout);
    plan_free(&ref); plan_free(&p8); plan_free(&pf);
    cudaCheck(cudaFree(A8)); cudaCheck(cudaFree(B8)); cudaCheck(cudaFree(A16)); cudaCheck(cudaFree(B16));
    cudaCheck(cudaFree(D0)); cudaCheck(cudaFree(D1));
    if (Cin != NULL) { cudaCheck(cudaFree(Cin)); }
    return res;
}

static void bench_config(const Config* c) {
    build_calls(c);
    printf("\n%s: n_layer %d, n_embd %d, n_head %d, mlp_hidden %d, padded vocab %d, N = B*T = %zu; "
           "%d distinct matmuls\n", c->name, c->L, c->C, c->H, c->I, c->Vp, c->N, g_num_calls);
    printf("%2s %-22s %5s %6s %6s %s %s %-4s %-2s %-15s %5s %5s %8s %8s %2s %5s %-3s %s\n", "#", "call", "m", "n",
           "k", "A", "B", "D", "b", "align A/B/C/D", "calls", "algos", "1st ms", "best ms", "#", "gain", "det", "=1st");
    double first = 0.0, best = 0.0, best_det = 0.0, f8 = 0.0, f8_fast = 0.0, rows = 0.0, tr = 0.0, wc = 0.0;
    int fp8 = getenv("FP8") != NULL;
    for (int i = 0; i < g_num_calls; i++) {
        Result r = bench_call(i, &g_calls[i]);
        if (r.first < 0) { continue; }
        int calls = g_calls[i].calls;
        first += r.first * calls; best += r.best * calls; best_det += r.best_det * calls;
        if (!fp8) { continue; }
        Fp8Result q = bench_fp8(&g_calls[i]);
        int use = q.ms >= 0 && q.fast_ms >= 0; // else the call stays bf16 in the FP8 sums
        f8 += (use ? q.ms : r.best_det) * calls;
        f8_fast += (use ? q.fast_ms : r.best_det) * calls;
        if (use) { rows += q.rows * calls; tr += q.transposes * calls; wc += q.weights * calls; }
    }
    printf("(A B: transa transb; b: beta, 1r = plus a separate C (the residual); det: the best gives the same bits "
           "twice;\n =1st: the best gives the first choice's bits)\n");
    printf("%s, matmul ms per step (N = %zu tokens): first choice %.3f, best %.3f (%.3fx, -%.3f ms), "
           "best deterministic %.3f (%.3fx)\n", c->name, c->N, first, best, first / best, first - best, best_det,
           first / best_det);
    if (fp8) {
        printf("%s, FP8 matmul ms per step: %.3f (fast accumulation %.3f) against bf16 %.3f (best deterministic); "
               "standalone casts: rows %.3f, transposes %.3f, weights %.3f (once per optimizer step); with the rows "
               "fused into their producers: %.3f (fast %.3f)\n", c->name, f8, f8_fast, best_det, rows, tr, wc,
               f8 + tr + wc, f8_fast + tr + wc);
    }
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
    float one = 1.0f;
    cudaCheck(cudaMalloc(&g_one, sizeof(one)));
    cudaCheck(cudaMemcpy(g_one, &one, sizeof(one), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc(&g_amax, (1u << 20) * sizeof(float))); // a cast's blocks: up to 786 x 512 (the lm head's)
    for (int i = 0; i < n; i++) { bench_config(&configs[i]); }
    cudaCheck(cudaFree(g_one)); cudaCheck(cudaFree(g_amax));
    cudaCheck(cudaFree(g_count)); cudaCheck(cudaFree(g_flush)); cudaCheck(cudaFree(g_workspace));
    cublasCheck(cublasLtDestroy(g_lt));
    return 0;
}
