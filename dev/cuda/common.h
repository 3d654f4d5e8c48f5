// Helpers shared by the kernel ladders in dev/cuda (llm.c dev/cuda style).
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

static void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        fprintf(stderr, "[CUDA ERROR] at %s:%d: %s\n", file, line, cudaGetErrorString(err));
        fprintf(stderr, "HINT: run under compute-sanitizer to locate a bad access; check that the GPU is sm_90.\n");
        exit(EXIT_FAILURE);
    }
}
#define cudaCheck(err) (cuda_check((err), __FILE__, __LINE__))
// after every launch: catches bad launch configurations at once
#define cudaCheckLaunch() (cuda_check(cudaGetLastError(), __FILE__, __LINE__))

__host__ __device__ static inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

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
// host-side random data (xorshift, reproducible, never zeros)

static uint64_t rng_state = 0x853c49e6748fea9bULL;
static inline uint32_t rng_u32() {
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}
static inline float rng_uniform() { return (rng_u32() >> 8) * (1.0f / 16777216.0f); }  // [0, 1)
static inline float rng_normal() {
    float u1 = rng_uniform() + 1e-7f, u2 = rng_uniform();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

// bf16 host buffer of N(0, std^2) values; `shadow` gets the exact (rounded) values as float
static void fill_bf16(std::vector<bf16>& x, std::vector<float>& shadow, size_t n, float std) {
    x.resize(n); shadow.resize(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = __float2bfloat16(rng_normal() * std);
        shadow[i] = __bfloat162float(x[i]);
    }
}

// ----------------------------------------------------------------------------
// device buffers

template<class T>
static T* dmalloc(size_t n) {
    T* p; cudaCheck(cudaMalloc(&p, n * sizeof(T))); return p;
}
template<class T>
static void h2d(T* d, const std::vector<T>& h) {
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template<class T>
static std::vector<T> d2h(const T* d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
// 0xFF bytes are NaN in bf16, fp32 and fp64: an element a kernel forgot to write fails the check
template<class T>
static void poison(T* d, size_t n) { cudaCheck(cudaMemset(d, 0xFF, n * sizeof(T))); }

// ----------------------------------------------------------------------------
// comparison against a higher-precision reference

struct ErrStat { double rel_l2; double max_abs; size_t nonfinite; size_t n; };

// got[e] at index get(e) compared with ref[e]; relative L2 error ||got - ref|| / ||ref||
template<class F>
static ErrStat compare(size_t n, F pair) {
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
// timing: median of `reps` launches, each bracketed by events, after warm-up; or of several launches in turns

template<class F>
static float time_median_ms(F launch, int warmup, int reps) {
    for (int i = 0; i < warmup; i++) launch();
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> ms(reps);
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a)); cudaCheck(cudaEventCreate(&b));
    for (int i = 0; i < reps; i++) {
        cudaCheck(cudaEventRecord(a));
        launch();
        cudaCheck(cudaEventRecord(b));
        cudaCheck(cudaEventSynchronize(b));
        cudaCheck(cudaEventElapsedTime(&ms[i], a, b));
    }
    cudaCheck(cudaEventDestroy(a)); cudaCheck(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

// the median ms of each launch in fs, timed in turns: repetition r runs fs[0], fs[1], ... once each,
// so a drift of the GPU's clocks during the run reaches every launch alike (timed one after another,
// a version timed later read a few percent slower than alone: dev/cuda/LOG.md, versions 21-24)
static std::vector<float> time_medians_interleaved(const std::vector<std::function<void()>>& fs, int warmup,
                                                   int reps) {
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
