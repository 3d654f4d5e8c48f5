// What both kernel ladders of dev/cuda share (llm.c's dev/cuda style): train_fox.cu itself (its
// Hopper primitives, its pruning tables and its attention API, which runs the top rungs), then the
// ladders' own pieces: the fp64 references, random test problems, poison, the checks, the timing.
#pragma once
#define FOX_NO_MAIN     // train_fox.cu without its main() (it includes its CPU twin train_fox.c)
#define FOX_TEST_HOOKS  // test_hooks.fwd_max_blocks: the checks run train_fox's persistent forward on 1 and 5 blocks
#include "../../train_fox.cu"
#include <algorithm>
#include <chrono>
#include <functional>
#include <type_traits>
#include <vector>
#include <unistd.h>
#include <omp.h>

// cudaDeviceSynchronize that gives up after `seconds`: a version that hangs ends the process with a
// message (the exit tears its context down) instead of holding the GPU until an outer timeout
static void sync_or_exit(const char* what, double seconds) {
    cudaEvent_t done;
    cudaCheck(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(done, 0));
    auto t0 = std::chrono::steady_clock::now();
    for (cudaError_t r; (r = cudaEventQuery(done)) != cudaSuccess; usleep(1000)) {
        if (r != cudaErrorNotReady) cudaCheck(r);
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) {
            fprintf(stderr, "%s: not finished after %.0f s\nHINT: a kernel that hangs (a barrier or an mbarrier "
                    "that never completes): run that version alone under compute-sanitizer --tool synccheck.\n",
                    what, seconds);
            fflush(stdout);
            _exit(EXIT_FAILURE);
        }
    }
    cudaCheck(cudaEventDestroy(done));
    cudaCheck(cudaDeviceSynchronize());
}

// ----------------------------------------------------------------------------
// host data (the twin's splitmix64: reproducible), device buffers, poison

static uint64_t g_rng = 0x853c49e6748fea9bULL;

// bf16 host buffer of N(0, std^2) values; `shadow` gets the exact (rounded) values as float
static void fill_bf16(std::vector<bf16>& x, std::vector<float>& shadow, size_t n, float std) {
    x.resize(n); shadow.resize(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = __float2bfloat16((float)rng_normal(&g_rng) * std);
        shadow[i] = __bfloat162float(x[i]);
    }
}

template<class T> static T* dmalloc(size_t n) { T* p; cudaCheck(cudaMalloc(&p, n * sizeof(T))); return p; }
template<class T> static void h2d(T* d, const std::vector<T>& h) {
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template<class T> static std::vector<T> d2h(const T* d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
// 0xFF bytes are NaN in bf16, fp32 and fp64: an element a kernel forgot to write fails the check
template<class T> static void poison(T* d, size_t n) { cudaCheck(cudaMemset(d, 0xFF, n * sizeof(T))); }

// ----------------------------------------------------------------------------
// comparison against a higher-precision reference

struct ErrStat { double rel_l2; double max_abs; size_t nonfinite; size_t n; };

// pair(e, &got, &ref) for e < n; relative L2 error ||got - ref|| / ||ref||
template<class F> static ErrStat compare(size_t n, F pair) {
    ErrStat st = {0, 0, 0, n};
    double num = 0, den = 0;
    for (size_t e = 0; e < n; e++) {
        double g, r; pair(e, &g, &r);
        if (!isfinite(g)) { st.nonfinite++; continue; }
        double d = g - r;
        num += d * d; den += r * r;
        st.max_abs = std::max(st.max_abs, fabs(d));
    }
    st.rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    return st;
}

static bool report(const char* what, ErrStat st, double tol) {
    bool ok = st.nonfinite == 0 && st.rel_l2 <= tol;
    printf("    %-6s rel_l2 %.3e  max_abs %.3e  nonfinite %zu/%zu  (tol %.0e) %s\n",
           what, st.rel_l2, st.max_abs, st.nonfinite, st.n, tol, ok ? "ok" : "FAIL");
    return ok;
}

// ----------------------------------------------------------------------------
// timing: the median ms of each launch in fs, timed in turns (repetition r runs fs[0], fs[1], ...
// once each), so a drift of the GPU's clocks during the run reaches every launch alike (timed one
// after another, a version timed later read a few percent slower than alone: LOG.md, versions 21-24)

static std::vector<float> time_medians(const std::vector<std::function<void()>>& fs, int warmup, int reps) {
    for (int i = 0; i < warmup; i++)
        for (const auto& f : fs) f();
    cudaCheck(cudaDeviceSynchronize());
    std::vector<std::vector<float>> ms(fs.size(), std::vector<float>(reps));
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a)); cudaCheck(cudaEventCreate(&b));
    for (int i = 0; i < reps; i++) {
        for (size_t k = 0; k < fs.size(); k++) {
            cudaCheck(cudaEventRecord(a));
            fs[k]();
            cudaCheck(cudaEventRecord(b));
            cudaCheck(cudaEventSynchronize(b));
            cudaCheck(cudaEventElapsedTime(&ms[k][i], a, b));
        }
    }
    cudaCheck(cudaEventDestroy(a)); cudaCheck(cudaEventDestroy(b));
    std::vector<float> med(fs.size());
    for (size_t k = 0; k < fs.size(); k++) {
        std::sort(ms[k].begin(), ms[k].end());
        med[k] = ms[k][reps / 2];
    }
    return med;
}

// the versions to run from the command line: none = all of `kept`, one number, or a range "first last"
static std::vector<int> pick_versions(int argc, char** argv, const std::vector<int>& kept) {
    int first = argc > 1 ? atoi(argv[1]) : kept.front(), last = argc > 2 ? atoi(argv[2]) : argc > 1 ? first : 1000;
    std::vector<int> run;
    for (int v : kept) if (v >= first && v <= last) run.push_back(v);
    if (run.empty()) {
        fprintf(stderr, "no kept version in %d..%d\nHINT: the kept versions are in dev/cuda/README.md; the others "
                "are archived (LOG.md, git tag history-2026-12-04)\n", first, last);
        exit(EXIT_FAILURE);
    }
    return run;
}

// f(HD, GATE) with the head size (64 or 128) and the gate (c != NULL) as compile-time constants
// (std::integral_constant): the ladders' launchers are templates over both
template<class F> static void by_shape(int hd, const float* c, F f) {
    using I64 = std::integral_constant<int, 64>;
    using I128 = std::integral_constant<int, 128>;
    if (hd == 64) { if (c) f(I64(), std::true_type()); else f(I64(), std::false_type()); }
    else { if (c) f(I128(), std::true_type()); else f(I128(), std::false_type()); }
}

// ----------------------------------------------------------------------------
// device pieces the ladders' cp.async versions add to train_fox.cu's primitives

// cp.async writes are generic-proxy writes; wgmma reads through the async proxy: fence in between
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// 16-byte chunk ch of row r of a swizzled (ROWS, HD) tile (train_fox.cu's layout), in elements
template<int ROWS> __device__ __forceinline__ int swz_off(int r, int ch) {
    return (ch >> 3) * ROWS * 64 + r * 64 + (((ch & 7) ^ (r & 7)) << 3);
}

// ROWS rows of one head of a (B, T, H, hd) tensor into a padded shared tile (ROWS, LD); rows past T
// are zero-filled so the tensor cores never read garbage
template<int ROWS, int HD, int LD, int NTHREADS>
__device__ __forceinline__ void load_tile_async(bf16* sm, const bf16* g, int row0, int T, int stride) {
    constexpr int CHUNKS = HD / 8;
    #pragma unroll
    for (int e = threadIdx.x; e < ROWS * CHUNKS; e += NTHREADS) {
        int r = e / CHUNKS, ch = e % CHUNKS, row = row0 + r;
        bool ok = row < T;
        cp_async16(sm + r * LD + ch * 8, g + (size_t)(ok ? row : 0) * stride + ch * 8, ok);
    }
}
// the same into a swizzled tile: lanes take consecutive chunks of a row (a warp writes 512
// contiguous bytes), no bank conflicts
template<int ROWS, int HD, int NTHREADS>
__device__ __forceinline__ void load_tile_swz(bf16* sm, const bf16* g, int row0, int T, int stride) {
    constexpr int CH = HD / 8;
    #pragma unroll
    for (int e = threadIdx.x; e < ROWS * CH; e += NTHREADS) {
        int r = e / CH, ch = e % CH, row = row0 + r;
        bool ok = row < T;
        cp_async16(sm + swz_off<ROWS>(r, ch), g + (size_t)(ok ? row : 0) * stride + ch * 8, ok);
    }
}
// ROWS fp32 values of a (B, H, T) vector; past T zero-filled
template<int ROWS> __device__ __forceinline__ void load_vec_async(float* sm, const float* g, int row0, int T) {
    if (threadIdx.x < ROWS) {
        int row = row0 + threadIdx.x;
        bool ok = row < T;
        cp_async4(sm + threadIdx.x, g + (ok ? row : 0), ok);
    }
}

// ----------------------------------------------------------------------------
// the references: the CPU in fp64 on the bf16 values, and forward version 1 (also in fp64 on the GPU)

// query i sees key j
__host__ __device__ __forceinline__ bool fox_visible(int i, int j, int window) {
    return j <= i && (window == 0 || j > i - window);
}

// o: (B, T, H, hd) compact; lse: (B, H, T). key_start (B*H, ceil(T / 128)): query tile i / 128
// skips the keys before 128 * key_start (train_fox.cu's pruning tiles), NULL: none
static void fox_forward_cpu(double* o, double* lse, const float* q, const float* k, const float* v,
                            const float* c, int B, int T, int H, int hd, int stride_qkv, int window,
                            const int* key_start = nullptr) {
    double scale = 1.0 / sqrt((double)hd);
    #pragma omp parallel for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
    for (int i = 0; i < T; i++) {
        const float* qi = q + ((size_t)b * T + i) * stride_qkv + (size_t)h * hd;
        const float* cb = c ? c + ((size_t)b * H + h) * T : nullptr;
        int jlo = key_start ? 128 * key_start[((size_t)b * H + h) * ((T + 127) / 128) + i / 128] : 0;
        std::vector<double> s(T);
        double m = -INFINITY;
        for (int j = jlo; j <= i; j++) {
            if (!fox_visible(i, j, window)) continue;
            const float* kj = k + ((size_t)b * T + j) * stride_qkv + (size_t)h * hd;
            double dot = 0;
            for (int d = 0; d < hd; d++) dot += (double)qi[d] * kj[d];
            s[j] = dot * scale + (cb ? (double)cb[i] - (double)cb[j] : 0.0);
            m = std::max(m, s[j]);
        }
        double l = 0;
        std::vector<double> acc(hd, 0.0);
        for (int j = jlo; j <= i; j++) {
            if (!fox_visible(i, j, window)) continue;
            const float* vj = v + ((size_t)b * T + j) * stride_qkv + (size_t)h * hd;
            double p = exp(s[j] - m);
            l += p;
            for (int d = 0; d < hd; d++) acc[d] += p * vj[d];
        }
        double* oi = o + (((size_t)b * T + i) * H + h) * hd;
        for (int d = 0; d < hd; d++) oi[d] = acc[d] / l;
        lse[((size_t)b * H + h) * T + i] = m + log(l);
    }
}

// dq, dk, dv: (B, T, H, hd) compact; dlogf (B, H, T) (zeros when c == NULL); key_start as above.
// dc_t = sum_j dS_tj - sum_i dS_it in full (the row sum, 0 in exact arithmetic, checks that it is)
static void fox_backward_cpu(double* dq, double* dk, double* dv, double* dlogf, const float* dout, int stride_o,
                             const float* q, const float* k, const float* v, const float* c,
                             int B, int T, int H, int hd, int stride_qkv, int window, const int* key_start = nullptr) {
    std::vector<double> o((size_t)B * T * H * hd), lse((size_t)B * H * T);
    fox_forward_cpu(o.data(), lse.data(), q, k, v, c, B, T, H, hd, stride_qkv, window, key_start);
    double scale = 1.0 / sqrt((double)hd);
    size_t C = (size_t)H * hd;
    memset(dq, 0, sizeof(double) * B * T * C); memset(dk, 0, sizeof(double) * B * T * C);
    memset(dv, 0, sizeof(double) * B * T * C);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
        const float* cb = c ? c + ((size_t)b * H + h) * T : nullptr;
        std::vector<double> dc(T, 0.0);
        auto at = [&](const float* x, int t, int stride) { return x + ((size_t)b * T + t) * stride + (size_t)h * hd; };
        auto atd = [&](double* x, int t) { return x + ((size_t)b * T + t) * C + (size_t)h * hd; };
        for (int i = 0; i < T; i++) {
            double delta = 0;
            for (int d = 0; d < hd; d++) delta += (double)at(dout, i, stride_o)[d] * atd(o.data(), i)[d];
            double li = lse[((size_t)b * H + h) * T + i];
            int jlo = key_start ? 128 * key_start[((size_t)b * H + h) * ((T + 127) / 128) + i / 128] : 0;
            for (int j = jlo; j <= i; j++) {
                if (!fox_visible(i, j, window)) continue;
                double s = 0, dp = 0;
                for (int d = 0; d < hd; d++) {
                    s += (double)at(q, i, stride_qkv)[d] * at(k, j, stride_qkv)[d];
                    dp += (double)at(dout, i, stride_o)[d] * at(v, j, stride_qkv)[d];
                }
                double p = exp(s * scale + (cb ? (double)cb[i] - (double)cb[j] : 0.0) - li);
                double ds = p * (dp - delta);
                for (int d = 0; d < hd; d++) {
                    atd(dq, i)[d] += scale * ds * at(k, j, stride_qkv)[d];
                    atd(dk, j)[d] += scale * ds * at(q, i, stride_qkv)[d];
                    atd(dv, j)[d] += p * at(dout, i, stride_o)[d];
                }
                dc[i] += ds;
                dc[j] -= ds;
            }
        }
        double run = 0;
        for (int t = T - 1; t >= 0; t--) { run += dc[t]; dlogf[((size_t)b * H + h) * T + t] = cb ? run : 0.0; }
    }
}

// loads and stores in the accumulator type of the naive kernels (float in the ladder, double for the
// long-T references)
__device__ __forceinline__ void st_out(bf16* p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void st_out(bf16* p, double x) { *p = __float2bfloat16((float)x); }
__device__ __forceinline__ void st_out(float* p, float x) { *p = x; }
__device__ __forceinline__ void st_out(double* p, double x) { *p = x; }
template<class A> __device__ __forceinline__ A ld_in(const bf16* p) { return (A)__bfloat162float(*p); }
template<class A> __device__ __forceinline__ A ld_in(const float* p) { return (A)*p; }
template<class A> __device__ __forceinline__ A ld_in(const double* p) { return (A)*p; }

// Forward version 1: naive, one thread per (b, h, i); acc_t = float for the ladder, double for the
// long-T reference of both ladders (checked against the CPU on the small shapes). Pass 1 finds the
// row maximum, pass 2 sums exp and accumulates v.
template<class acc_t, class o_t, int HD>
__global__ void fox_forward_kernel1(o_t* o, acc_t* lse, const bf16* q, const bf16* k, const bf16* v,
                                    const float* c, int B, int T, int H, int stride_qkv, int stride_o, int window) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * H * T) return;
    int i = idx % T;
    size_t bh = idx / T;
    int h = bh % H, b = bh / H;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    const bf16* qi = q + base + (size_t)i * stride_qkv;
    const float* cb = c ? c + bh * T : nullptr;
    acc_t scale = (acc_t)1 / sqrt((acc_t)HD);
    int jlo = window > 0 ? max(0, i - window + 1) : 0;
    // c_i - c_j in fp32 is exact near the diagonal (Sterbenz), where the weights are large
    acc_t m = -INFINITY;
    for (int j = jlo; j <= i; j++) {
        const bf16* kj = k + base + (size_t)j * stride_qkv;
        acc_t dot = 0;
        #pragma unroll
        for (int d = 0; d < HD; d++) dot += ld_in<acc_t>(qi + d) * ld_in<acc_t>(kj + d);
        acc_t s = dot * scale + (cb ? (acc_t)cb[i] - (acc_t)cb[j] : (acc_t)0);
        m = s > m ? s : m;
    }
    acc_t l = 0, acc[HD];  // registers: every index below is a compile-time constant after unrolling
    #pragma unroll
    for (int d = 0; d < HD; d++) acc[d] = 0;
    for (int j = jlo; j <= i; j++) {
        const bf16* kj = k + base + (size_t)j * stride_qkv;
        const bf16* vj = v + base + (size_t)j * stride_qkv;
        acc_t dot = 0;
        #pragma unroll
        for (int d = 0; d < HD; d++) dot += ld_in<acc_t>(qi + d) * ld_in<acc_t>(kj + d);
        acc_t p = exp(dot * scale + (cb ? (acc_t)cb[i] - (acc_t)cb[j] : (acc_t)0) - m);
        l += p;
        #pragma unroll
        for (int d = 0; d < HD; d++) acc[d] += p * ld_in<acc_t>(vj + d);
    }
    o_t* oi = o + (size_t)b * T * stride_o + (size_t)i * stride_o + (size_t)h * HD;
    #pragma unroll
    for (int d = 0; d < HD; d++) st_out(oi + d, acc[d] / l);
    lse[idx] = m + log(l);
}

template<class acc_t, class o_t>
static void fox_forward1(o_t* o, acc_t* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                         int B, int T, int H, int hd, int stride_qkv, int stride_o, int window) {
    int block = 128, grid = ceil_div(B * H * T, block);
    if (hd == 64) fox_forward_kernel1<acc_t, o_t, 64><<<grid, block>>>(o, lse, q, k, v, c, B, T, H, stride_qkv,
                                                                       stride_o, window);
    else fox_forward_kernel1<acc_t, o_t, 128><<<grid, block>>>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o,
                                                               window);
    launchCheck();
}

// ----------------------------------------------------------------------------
// test problems

struct FoxProblem {
    int B, T, H, hd, window;
    bool packed, gate;
    int stride_qkv, stride_o;
    size_t n_qkv, n_o, n_bht;             // element counts of the qkv buffer, of o, of (B, H, T)
    size_t q_off, k_off, v_off;           // q, k, v inside the qkv buffer
    std::vector<bf16> qkv, dout;          // device data
    std::vector<float> qkvf, doutf, c;    // the same values as float; c empty when no gate
};

// gate_rate > 0: log f_t = -gate_rate * U(0.5, 1.5); gate_rate < 0: per head, rates log-spaced
// from 1e-3 to 3 (both regimes in one problem); gate_rate == 0: no gate
static FoxProblem make_problem(int B, int T, int H, int hd, int window, bool packed, double gate_rate, int o_pad = 0) {
    FoxProblem p;
    p.B = B; p.T = T; p.H = H; p.hd = hd; p.window = window; p.packed = packed; p.gate = gate_rate != 0;
    size_t C = (size_t)H * hd, BT = (size_t)B * T;
    p.stride_qkv = packed ? 3 * (int)C : (int)C;
    p.stride_o = (int)C + o_pad;
    p.n_qkv = 3 * BT * C;
    p.n_o = BT * p.stride_o;
    p.n_bht = BT * H;
    p.q_off = 0;
    p.k_off = packed ? C : BT * C;
    p.v_off = packed ? 2 * C : 2 * BT * C;
    fill_bf16(p.qkv, p.qkvf, p.n_qkv, 1.0f);
    fill_bf16(p.dout, p.doutf, p.n_o, 1.0f);
    if (p.gate) {
        p.c.resize(p.n_bht);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                double rate = gate_rate > 0 ? gate_rate : 1e-3 * pow(3e3, H > 1 ? (double)h / (H - 1) : 0.5);
                float acc = 0.f;  // fp32 cumulative sum, as the trainer computes it
                for (int t = 0; t < T; t++) {
                    acc += (float)(-rate * (0.5 + rng_uniform(&g_rng)));
                    p.c[((size_t)b * H + h) * T + t] = acc;
                }
            }
    }
    return p;
}

// the problem on the device; grads: also the backward's buffers
struct FoxDev { bf16 *qkv, *o, *dqkv, *dout; float *c, *lse, *dlogf, *scratch; };
static FoxDev upload(const FoxProblem& p, bool grads) {
    FoxDev d = {};
    d.qkv = dmalloc<bf16>(p.n_qkv); h2d(d.qkv, p.qkv);
    d.o = dmalloc<bf16>(p.n_o);
    d.lse = dmalloc<float>(p.n_bht);
    if (p.gate) { d.c = dmalloc<float>(p.n_bht); h2d(d.c, p.c); }
    if (grads) {
        d.dqkv = dmalloc<bf16>(p.n_qkv);
        d.dout = dmalloc<bf16>(p.n_o); h2d(d.dout, p.dout);
        d.dlogf = dmalloc<float>(p.n_bht);
        d.scratch = dmalloc<float>(3 * p.n_bht);
    }
    return d;
}
static void release(FoxDev& d) {
    for (void* x : {(void*)d.qkv, (void*)d.o, (void*)d.dqkv, (void*)d.dout, (void*)d.c, (void*)d.lse,
                    (void*)d.dlogf, (void*)d.scratch})
        cudaCheck(cudaFree(x));
}

// Random pruning tables as fox_prune_tables lays them out (2, B*H, nt = ceil(T / 128)): key_start
// up to the diagonal tile, non-decreasing when `monotone` (as the real ones: c is non-increasing),
// then query_end derived from it (the first query tile that prunes each key tile)
static std::vector<int> random_tables(int BH, int T, bool monotone) {
    int nt = ceil_div(T, PRUNE_BLOCK);
    std::vector<int> tables(2 * (size_t)BH * nt);
    for (int bh = 0; bh < BH; bh++) {
        int* ks = tables.data() + (size_t)bh * nt;
        int* qe = tables.data() + (size_t)(BH + bh) * nt;
        for (int qt = 0; qt < nt; qt++) {
            int r = (int)(rng_next(&g_rng) % (qt + 1));
            ks[qt] = monotone ? std::max(qt ? ks[qt - 1] : 0, r) : r;
        }
        for (int kt = 0; kt < nt; kt++) {
            qe[kt] = nt;
            for (int qt = nt - 1; qt >= 0; qt--) if (ks[qt] > kt) qe[kt] = qt;
        }
    }
    return tables;
}

// The small shapes of both ladders' checks against the CPU: T not a multiple of any tile, both
// head sizes, gates none / moderate / strong / both regimes, windows, packed qkv, padded o stride
struct SmallCase { int B, T, H, hd, window; bool packed; double gate; int o_pad; };
static const SmallCase SMALL_CASES[] = {
    {2, 197, 3, 64, 0, true, -1, 0},     // T not a multiple of any tile, packed qkv, both gate regimes
    {1, 256, 2, 128, 0, false, -1, 8},   // hd 128, padded o stride
    {2, 130, 2, 64, 0, false, 0, 0},     // no gate (c == NULL)
    {1, 300, 2, 128, 37, true, -1, 0},   // sliding window smaller than a tile
    {1, 333, 2, 64, 100, false, 0.5, 0}, // window spanning tiles, T ragged
    {1, 70, 1, 64, 1, false, 0.1, 0},    // window 1: only the diagonal
    {3, 1, 2, 128, 0, false, 1, 0},      // T = 1
};
// the timing shapes B, H, T, hd (those of dev/bench_attention.py), gate on (log f ~ -0.05)
static const int BENCH_SHAPES[5][4] = {{8, 12, 2048, 64}, {2, 12, 8192, 64}, {1, 12, 16384, 64},
                                       {1, 16, 16384, 128}, {4, 16, 4096, 128}};

// bf16 outputs: the output rounding alone is ~2e-3 rms relative and P is rounded to bf16 before
// P V, so 1e-2 leaves room without hiding an indexing error (those give O(1)). lse is fp32 from
// exact bf16 products, so an absolute 1e-3 on values O(1..10) is loose but catches any mask error.
#define TOL_BF16 1e-2
#define TOL_LSE_ABS 1e-3

// FLOPs of a causal forward (FlashAttention's convention; a backward is 2.5x, forward+backward 3.5x)
static double attn_fwd_flops(int B, int T, int H, int hd) { return 4.0 * B * H * (double)T * T * hd / 2; }
