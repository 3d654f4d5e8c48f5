/*
dev/bench_rmsnorm.cu: the RMSNorm kernels of train_fox.cu alone, for every register tile NV (NV
float4 per lane, RMS_TILE(NV) columns of a row kept in registers), at the widths of the fox-pro
presets and two others: microseconds per launch, bytes moved and their rate against the H200's
4.8 TB/s, and which NV the trainer picks (rms_nv). Every NV sums in the same order (the row is read
in tiles), but the compiler may fuse a different product of a sum into an FMA in each
instantiation, so the NVs agree to rounding, not bitwise: printed, the largest difference from NV 1
of the fp32 outputs (rstd, dresid, partial) over the largest output. Correctness is test_fox's
(gpu_test_rmsnorm: every NV against fp64). Inputs are random and non-zero, outputs poisoned before
each run that is compared; CUDA events, the median of 20 runs after 5, L2 flushed before each. A
benchmark, not a test.

  mkdir -p build && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --default-stream per-thread \
      -Xcompiler "-O3 -march=x86-64-v3 -fopenmp -Wno-unused-function" dev/bench_rmsnorm.cu build/gpt2_bpe.o \
      -o build/bench_rmsnorm -lcublasLt -lcublas -lm -lnccl -lpcre2-8
  ./build/bench_rmsnorm            # N = 32768 rows (16 x 2048)
  ./build/bench_rmsnorm 16384      # another N
*/
#define FOX_NO_MAIN
#include "../train_fox.cu"
#include <algorithm>
#include <vector>

static float* g_flush;

template <typename F>
static float median_ms(F launch) {
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    std::vector<float> ts;
    for (int r = 0; r < 25; r++) {
        cudaCheck(cudaMemset(g_flush, r, 256u << 20)); // more than the 50 MB L2
        cudaCheck(cudaEventRecord(a));
        launch();
        cudaCheck(cudaEventRecord(b));
        cudaCheck(cudaEventSynchronize(b));
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, a, b));
        if (r >= 5) { ts.push_back(ms); }
    }
    cudaCheck(cudaEventDestroy(a));
    cudaCheck(cudaEventDestroy(b));
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

// n values of magnitude in [lo, hi) (0 < lo < hi) with random signs: never zero
static void fill_random(float* d, size_t n, float lo, float hi, uint64_t seed) {
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)(seed >> 40) / 16777216.0f;
        h[i] = (seed >> 39 & 1 ? -1.0f : 1.0f) * (lo + (hi - lo) * u);
    }
    cudaCheck(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
}

typedef struct { float *x, *dout, *dresid0, *dresid, *w, *rstd, *partial; floatX *out, *dresid_x; } Bufs;

template <int NV>
static void forward(const Bufs* b, size_t N, int C) {
    rmsnorm_forward_kernel<NV, false><<<warp_blocks(N), 32 * WARPS_PER_BLOCK>>>(b->out, b->rstd, b->x, b->w, N, C,
                                                                                1e-6f, Fp8Out{});
}

template <int NV>
static void backward(const Bufs* b, size_t N, int C) {
    size_t smem = sizeof(float) * WARPS_PER_BLOCK * C;
    cudaCheck(
        cudaFuncSetAttribute(rmsnorm_backward_kernel<NV, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem));
    rmsnorm_backward_kernel<NV, false><<<(unsigned)ceil_div(N, RMS_BWD_ROWS), 32 * WARPS_PER_BLOCK, smem>>>(
        b->dresid, b->dresid_x, b->partial, b->dout, b->x, b->w, b->rstd, N, C, Fp8Out{});
}

// the fp32 outputs of one NV (rstd, dresid, partial), poisoned first, from the same inputs (out is
// rstd times fp32 values, rounded to bf16: it follows rstd)
static std::vector<float> outputs(const Bufs* b, size_t N, int C, void (*fwd)(const Bufs*, size_t, int),
                                  void (*bwd)(const Bufs*, size_t, int)) {
    size_t NC = N * C, chunks = ceil_div(N, RMS_BWD_ROWS);
    cudaCheck(cudaMemset(b->out, 0xff, NC * sizeof(floatX)));
    cudaCheck(cudaMemset(b->rstd, 0xff, N * sizeof(float)));
    fwd(b, N, C);
    cudaCheck(cudaMemcpy(b->dresid, b->dresid0, NC * sizeof(float), cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemset(b->partial, 0xff, chunks * C * sizeof(float)));
    bwd(b, N, C);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> part(N + NC + chunks * C);
    cudaCheck(cudaMemcpy(part.data(), b->rstd, N * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(part.data() + N, b->dresid, NC * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(part.data() + N + NC, b->partial, chunks * C * sizeof(float), cudaMemcpyDeviceToHost));
    return part;
}

// the largest |a - b| over the largest |b| (-1 if a NaN or infinity appears)
static double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) { return -1.0; }
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return worst / scale;
}

int main(int argc, char** argv) {
    size_t N = argc > 1 ? (size_t)atol(argv[1]) : 32768;
    if (argc > 2 || N == 0) {
        fprintf(stderr, "usage: %s [rows N]\n", argv[0]);
        return 1;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("%s, N = %zu rows; us per launch (TB/s, %% of 4.8 TB/s); * = the trainer's NV (rms_nv)\n", prop.name, N);
    const int widths[] = {160, 768, 1024, 1536, 2048, 4096};
    const int nvs[] = {1, 2, 4, 6, 8, 12};
    void (*fwds[])(const Bufs*, size_t, int) = {forward<1>, forward<2>, forward<4>, forward<6>, forward<8>,
                                                forward<12>};
    void (*bwds[])(const Bufs*, size_t, int) = {backward<1>, backward<2>, backward<4>, backward<6>, backward<8>,
                                                backward<12>};
    size_t maxNC = N * 4096, chunks = ceil_div(N, RMS_BWD_ROWS);
    Bufs b;
    cudaCheck(cudaMalloc(&g_flush, 256u << 20));
    cudaCheck(cudaMalloc(&b.x, maxNC * sizeof(float)));
    cudaCheck(cudaMalloc(&b.dout, maxNC * sizeof(float)));
    cudaCheck(cudaMalloc(&b.dresid0, maxNC * sizeof(float)));
    cudaCheck(cudaMalloc(&b.dresid, maxNC * sizeof(float)));
    cudaCheck(cudaMalloc(&b.w, 4096 * sizeof(float)));
    cudaCheck(cudaMalloc(&b.rstd, N * sizeof(float)));
    cudaCheck(cudaMalloc(&b.partial, chunks * 4096 * sizeof(float)));
    cudaCheck(cudaMalloc(&b.out, maxNC * sizeof(floatX)));
    cudaCheck(cudaMalloc(&b.dresid_x, maxNC * sizeof(floatX)));
    fill_random(b.x, maxNC, 0.1f, 2.0f, 1);
    fill_random(b.dout, maxNC, 0.1f, 1.0f, 2);
    fill_random(b.dresid0, maxNC, 0.1f, 1.0f, 3);
    fill_random(b.w, 4096, 0.5f, 1.5f, 4);
    int all_finite = 1;
    for (int C : widths) {
        size_t NC = N * C;
        // forward: x read, out written, rstd; backward: x, dout, dresid read, dresid, dresid_x written, partial
        double fwd_bytes = NC * (4.0 + sizeof(floatX)) + 4.0 * N;
        double bwd_bytes = NC * (16.0 + sizeof(floatX)) + 4.0 * N + 4.0 * chunks * C;
        std::vector<float> ref = outputs(&b, N, C, fwds[0], bwds[0]);
        printf("C = %4d  forward  ", C);
        for (int i = 0; i < 6; i++) {
            float ms = median_ms([&]() { fwds[i](&b, N, C); });
            printf(" NV %2d%c %7.1f (%4.2f, %2.0f%%)", nvs[i], nvs[i] == rms_nv(C) ? '*' : ' ', ms * 1e3,
                   fwd_bytes / ms / 1e9, fwd_bytes / ms / 1e9 / 4.8 * 100);
        }
        printf("\n          backward ");
        for (int i = 0; i < 6; i++) {
            float k = median_ms([&]() { bwds[i](&b, N, C); }); // each run adds into dresid: no refill needed
            printf(" NV %2d%c %7.1f (%4.2f, %2.0f%%)", nvs[i], nvs[i] == rms_nv(C) ? '*' : ' ', k * 1e3,
                   bwd_bytes / k / 1e9, bwd_bytes / k / 1e9 / 4.8 * 100);
        }
        printf("\n          largest difference from NV 1, over the largest output:");
        for (int i = 1; i < 6; i++) {
            double e = max_rel_diff(outputs(&b, N, C, fwds[i], bwds[i]), ref);
            all_finite &= e >= 0.0;
            printf(" NV %d: %.1e", nvs[i], e);
        }
        printf("\n");
    }
    return all_finite ? 0 : 1;
}
