/*
Forgetting Attention backward (FoX): dq, dk, dv and d(log f), deterministic (no atomics).

Forward line differentiated:  o_i = sum_j P_ij v_j,  P_ij = exp(S_ij - lse_i),
S_ij = q_i.k_j * scale + c_i - c_j  (c_t = sum_{s<=t} log f_s).
Derivation: dP_ij = dO_i.v_j; softmax gives dS_ij = P_ij (dP_ij - Delta_i), Delta_i = dO_i.O_i.
Then dq_i = scale sum_j dS_ij k_j, dk_j = scale sum_i dS_ij q_i, dv_j = sum_i P_ij dO_i, and
dc_t = sum_j dS_tj - sum_i dS_it. The row sum is 0 in exact arithmetic (softmax ignores c_i), but
not in ours: Delta comes from the bf16-rounded O, which shifts every dS_ij of row i by
P_ij (Delta_i - dO_i.O_i^exact), summing to a nonzero row total. Keeping it next to the column
sum cancels it exactly (both sums see the same dS, so sum_t dc_t = 0 and dlogf_0 = 0 up to fp32
rounding). So: the column sum is reduced in registers by the block that owns key tile t, the row
sum by the block that owns query tile t, no atomics; then dlogf_t = sum_{s>=t} dc_s (fp64 scan).
Built on train_fox.cu (common.h includes it): its Hopper primitives, Delta and scan kernels serve
every version here, and versions 20/22 are train_fox.cu's own backward.

Build: make -C dev/cuda fox_attention_backward (the Makefile has the flags; sm_90a)

version 1 is a naive port of the CPU code: a thread per query row for dq, a thread per key row
for dk, dv, dc, a thread per (b, h) for the cumulative sum (in fp64: the long-T reference)
version 2 is the flash backward on tensor cores (mma.sync bf16): one kernel per key tile for dk,
dv and the dc column sums, one per query tile for dq (recomputing P and dP: no atomics), the scan
version 3 is version 2 with 32 keys per warp in the dK/dV kernel at hd 64: no faster, the backward
is not limited by that shared-memory traffic
version 5 is the two kernels on Hopper's warpgroup mma (wgmma) with 128-byte-swizzled tiles: S^T,
dP^T (S, dP) read K, Q, V, dO by descriptor, P and dS go from the accumulators to register A
fragments of dV, dK (dQ); two commit groups a tile (exp(P) under dP^T, dS under dV)
version 6 is version 5 with two warpgroups (128 keys) per dK/dV block, sharing the Q/dO tiles
version 9 is version 6's kernels in forward version 8's structure: a producer warp loads by TMA
into mbarrier rings, setmaxnreg, two consumer warpgroups of 64 rows never synchronised with each
other; 128-row tiles; train_fox.cu's pruning tables (key_start, query_end)
version 12 is version 9 with lean consumers: masks as selects in straight-line loops, descriptors
built once and advanced by constants, gate terms per column and row (the same P in both kernels)
version 20 is train_fox.cu's fox_attention_backward (version 20 at hd 64, 22 at hd 128: what it
runs, exactly, the comment at its dispatch); `./fox_attention_backward 22` names the same rung

./fox_attention_backward        every version; ./fox_attention_backward 12: one; 9 20: a range
./fox_attention_backward 12 12 profile   no checks or timing: one backward of each version on each
timing shape, for ncu (ncu -k regex:"fox_backward_(dkdv|dq)_kernel" --launch-skip 4 ...)
Each version is checked against the fp64 CPU reference on small shapes (and with random pruning
tables), then at T = 65536 with extreme gates against the fp64 GPU reference (version 1 in
double), on poisoned outputs, checked for bitwise determinism, then timed (backward alone and
forward+backward, the forward being train_fox.cu's). The others (archived, with their numbers):
LOG.md, and git tag history-2026-12-04.
*/
#include "common.h"

// ----------------------------------------------------------------------------
// version 1: naive. acc_t = float for the ladder, double for the long-T reference. o_t/lse_t are
// the forward's outputs (bf16/float, or double for the reference); g_t the gradients' type.

template<class acc_t, class o_t>
__global__ void fox_backward_delta_kernel1(acc_t* delta, const bf16* dout, const o_t* o, int B, int T, int H, int hd,
                                           int stride_do, int stride_oo) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, i)
    if (idx >= (size_t)B * H * T) return;
    int i = idx % T; size_t bh = idx / T; int h = bh % H, b = bh / H;
    const bf16* g = dout + ((size_t)b * T + i) * stride_do + (size_t)h * hd;
    const o_t* x = o + ((size_t)b * T + i) * stride_oo + (size_t)h * hd;
    acc_t s = 0;
    for (int d = 0; d < hd; d++) s += ld_in<acc_t>(g + d) * ld_in<acc_t>(x + d);
    delta[idx] = s;
}

// P_ij and dS_ij of one visible pair, recomputed from scratch
template<class acc_t, int HD>
__device__ void naive_pds(acc_t* p, acc_t* ds, const bf16* qi, const bf16* kj, const bf16* vj, const bf16* gi,
                          acc_t ci, acc_t cj, acc_t lse_i, acc_t delta_i, acc_t scale) {
    acc_t s = 0, dp = 0;
    #pragma unroll 8
    for (int d = 0; d < HD; d++) {
        s += ld_in<acc_t>(qi + d) * ld_in<acc_t>(kj + d);
        dp += ld_in<acc_t>(gi + d) * ld_in<acc_t>(vj + d);
    }
    *p = exp(s * scale + (ci - cj) - lse_i);
    *ds = *p * (dp - delta_i);
}

template<class acc_t, class lse_t, class g_t, int HD>
__global__ void fox_backward_dq_kernel1(g_t* dq, acc_t* dc_row, const bf16* dout, const bf16* q, const bf16* k,
                                        const bf16* v, const lse_t* lse, const acc_t* delta, const float* c,
                                        int B, int T, int H, int stride_qkv, int stride_do, int stride_g, int window) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, i)
    if (idx >= (size_t)B * H * T) return;
    int i = idx % T; size_t bh = idx / T; int h = bh % H, b = bh / H;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    const bf16* qi = q + base + (size_t)i * stride_qkv;
    const bf16* gi = dout + ((size_t)b * T + i) * stride_do + (size_t)h * HD;
    const float* cb = c ? c + bh * T : nullptr;
    acc_t scale = (acc_t)1 / sqrt((acc_t)HD), acc[HD], rowsum = 0;
    for (int d = 0; d < HD; d++) acc[d] = 0;
    for (int j = window > 0 ? max(0, i - window + 1) : 0; j <= i; j++) {
        const bf16* kj = k + base + (size_t)j * stride_qkv;
        acc_t p, ds;
        naive_pds<acc_t, HD>(&p, &ds, qi, kj, v + base + (size_t)j * stride_qkv, gi, cb ? (acc_t)cb[i] : 0,
                                 cb ? (acc_t)cb[j] : 0, (acc_t)lse[idx], delta[idx], scale);
        for (int d = 0; d < HD; d++) acc[d] += ds * ld_in<acc_t>(kj + d);
        rowsum += ds;
    }
    dc_row[idx] = rowsum;
    g_t* out = dq + ((size_t)b * T + i) * stride_g + (size_t)h * HD;
    for (int d = 0; d < HD; d++) st_out(out + d, acc[d] * scale);
}

template<class acc_t, class lse_t, class g_t, int HD>
__global__ void fox_backward_dkdv_kernel1(g_t* dk, g_t* dv, acc_t* dc, const bf16* dout, const bf16* q, const bf16* k,
                                          const bf16* v, const lse_t* lse, const acc_t* delta, const float* c,
                                          int B, int T, int H, int stride_qkv, int stride_do, int stride_g,
                                          int window) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, j)
    if (idx >= (size_t)B * H * T) return;
    int j = idx % T; size_t bh = idx / T; int h = bh % H, b = bh / H;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    const bf16* kj = k + base + (size_t)j * stride_qkv;
    const bf16* vj = v + base + (size_t)j * stride_qkv;
    const float* cb = c ? c + bh * T : nullptr;
    acc_t scale = (acc_t)1 / sqrt((acc_t)HD), dka[HD], dva[HD], dcj = 0;
    for (int d = 0; d < HD; d++) dka[d] = dva[d] = 0;
    int i_end = window > 0 ? min(T, j + window) : T;
    for (int i = j; i < i_end; i++) {
        const bf16* qi = q + base + (size_t)i * stride_qkv;
        const bf16* gi = dout + ((size_t)b * T + i) * stride_do + (size_t)h * HD;
        acc_t p, ds;
        naive_pds<acc_t, HD>(&p, &ds, qi, kj, vj, gi, cb ? (acc_t)cb[i] : 0, cb ? (acc_t)cb[j] : 0,
                                 (acc_t)lse[bh * T + i], delta[bh * T + i], scale);
        for (int d = 0; d < HD; d++) {
            dka[d] += ds * ld_in<acc_t>(qi + d);
            dva[d] += p * ld_in<acc_t>(gi + d);
        }
        dcj -= ds;
    }
    g_t* ok = dk + ((size_t)b * T + j) * stride_g + (size_t)h * HD;
    g_t* ov = dv + ((size_t)b * T + j) * stride_g + (size_t)h * HD;
    for (int d = 0; d < HD; d++) { st_out(ok + d, dka[d] * scale); st_out(ov + d, dva[d]); }
    dc[idx] = dcj;
}

template<class acc_t>
__global__ void fox_backward_scan_kernel1(acc_t* dlogf, const acc_t* dc_col, const acc_t* dc_row, int BH, int T) {
    int bh = blockIdx.x * blockDim.x + threadIdx.x;
    if (bh >= BH) return;
    acc_t run = 0;
    for (size_t t = (size_t)bh * T + T; t-- > (size_t)bh * T;) { run += dc_row[t] + dc_col[t]; dlogf[t] = run; }
}

// scratch: 3 * B*H*T acc_t (Delta, column part of dc, row part of dc). stride_g: token stride of dq, dk, dv.
template<class acc_t, class o_t, class lse_t, class g_t>
static void fox_backward1(g_t* dq, g_t* dk, g_t* dv, acc_t* dlogf, acc_t* scratch, const bf16* dout, const bf16* q,
                          const bf16* k, const bf16* v, const o_t* o, const lse_t* lse, const float* c,
                          int B, int T, int H, int hd, int stride_qkv, int stride_do, int stride_oo, int stride_g,
                          int window) {
    size_t n = (size_t)B * H * T;
    acc_t *delta = scratch, *dc = scratch + n, *dc_row = scratch + 2 * n;
    int block = 128, grid = ceil_div((int)n, block);
    fox_backward_delta_kernel1<<<grid, block>>>(delta, dout, o, B, T, H, hd, stride_do, stride_oo);
    launchCheck();
    if (hd == 64) {
        fox_backward_dq_kernel1<acc_t, lse_t, g_t, 64><<<grid, block>>>(
            dq, dc_row, dout, q, k, v, lse, delta, c, B, T, H, stride_qkv, stride_do, stride_g, window);
        launchCheck();
        fox_backward_dkdv_kernel1<acc_t, lse_t, g_t, 64><<<grid, block>>>(
            dk, dv, dc, dout, q, k, v, lse, delta, c, B, T, H, stride_qkv, stride_do, stride_g, window);
    } else {
        fox_backward_dq_kernel1<acc_t, lse_t, g_t, 128><<<grid, block>>>(
            dq, dc_row, dout, q, k, v, lse, delta, c, B, T, H, stride_qkv, stride_do, stride_g, window);
        launchCheck();
        fox_backward_dkdv_kernel1<acc_t, lse_t, g_t, 128><<<grid, block>>>(
            dk, dv, dc, dout, q, k, v, lse, delta, c, B, T, H, stride_qkv, stride_do, stride_g, window);
    }
    launchCheck();
    if (c && dlogf) {
        fox_backward_scan_kernel1<<<ceil_div(B * H, 128), 128>>>(dlogf, dc, dc_row, B * H, T);
        launchCheck();
    }
}

// ----------------------------------------------------------------------------
// the fused versions' frame

// the arguments of a backward version (as fox_attention_backward's; tables: the pruning tables of
// versions 9-22, NULL: dense)
struct BwdArgs {
    bf16 *dq, *dk, *dv;
    float *dlogf, *scratch;
    const bf16 *dout, *q, *k, *v, *o;
    const float *lse, *c;
    int B, T, H, hd, stride_qkv, stride_o, window;
    const int* tables;
};

// Delta = rowsum(dO * O) (train_fox.cu's fox_bwd_delta_kernel), the version's kernels
// (kernels(dc, dc_row, delta)), then the fp64 d(log f) scan (fox_bwd_dlogf_gpu). scratch:
// 3 * B*H*T floats, as fox_attention_backward's: dc's column part, its row part, Delta.
template<class F> static void bwd_frame(const BwdArgs& a, F kernels) {
    int BHT = a.B * a.H * a.T;
    float *dc = a.scratch, *dc_row = a.scratch + (size_t)BHT, *delta = a.scratch + 2 * (size_t)BHT;
    unsigned blocks = (unsigned)ceil_div(BHT, 8);  // a warp per row, 8 warps a block
    if (a.hd == 64) fox_bwd_delta_kernel<64><<<blocks, 256>>>(delta, a.dout, a.o, BHT, a.T, a.H, a.stride_o);
    else fox_bwd_delta_kernel<128><<<blocks, 256>>>(delta, a.dout, a.o, BHT, a.T, a.H, a.stride_o);
    launchCheck();
    kernels(dc, dc_row, delta);
    if (a.c) {
        fox_bwd_dlogf_gpu(a.dlogf, dc, dc_row, a.B, a.T, a.H, nullptr, 0);
    }
}

// The epilogues of the consumers of versions 5-12 (a thread: rows g and g + 8 of its warp's 16, in
// the accumulator layout): dk = scale dka, dv = dva (bf16) of the thread's keys below T and dc's
// column part -sum_i dS_ij; dq = scale dqa and dc's row part sum_j dS_ij. The quad's partial sums
// in a fixed shuffle order: deterministic. dkb, dvb, dqb: this (b, h)'s rows at token 0.
template<int HD, bool GATE>
__device__ __forceinline__ void store_dkdv(bf16* dkb, bf16* dvb, float* dc_bh, const float* dka, const float* dva,
                                           float dcs[2], const int keys[2], int tq, int T, int stride, float scale) {
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        if (GATE) {
            dcs[r] += __shfl_xor_sync(0xffffffff, dcs[r], 1);
            dcs[r] += __shfl_xor_sync(0xffffffff, dcs[r], 2);
            if (tq == 0 && keys[r] < T) dc_bh[keys[r]] = -dcs[r];
        }
        if (keys[r] >= T) continue;
        bf16 *kr = dkb + (size_t)keys[r] * stride + 2 * tq, *vr = dvb + (size_t)keys[r] * stride + 2 * tq;
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            *(__nv_bfloat162*)(kr + dt * 8) = __floats2bfloat162_rn(dka[dt * 4 + 2 * r] * scale,
                                                                    dka[dt * 4 + 2 * r + 1] * scale);
            *(__nv_bfloat162*)(vr + dt * 8) = __floats2bfloat162_rn(dva[dt * 4 + 2 * r], dva[dt * 4 + 2 * r + 1]);
        }
    }
}
template<int HD, bool GATE>
__device__ __forceinline__ void store_dq(bf16* dqb, float* dcr_bh, const float* dqa, float rs[2], const int rows[2],
                                         int tq, int T, int stride, float scale) {
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        if (GATE) {
            rs[r] += __shfl_xor_sync(0xffffffff, rs[r], 1);
            rs[r] += __shfl_xor_sync(0xffffffff, rs[r], 2);
            if (tq == 0 && rows[r] < T) dcr_bh[rows[r]] = rs[r];
        }
        if (rows[r] >= T) continue;
        bf16* qr = dqb + (size_t)rows[r] * stride + 2 * tq;
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *(__nv_bfloat162*)(qr + dt * 8) = __floats2bfloat162_rn(dqa[dt * 4 + 2 * r] * scale,
                                                                    dqa[dt * 4 + 2 * r + 1] * scale);
    }
}

// ----------------------------------------------------------------------------
// Versions 2 and 3: the flash backward on tensor cores (mma.sync bf16): one kernel per key tile for
// dk, dv and the dc column sums, one kernel per query tile for dq (recomputing P and dP rather than
// accumulating dq with atomics), then the scan.

// dk, dv and dc of one key tile of BK = 64 * WM keys. A warp owns 16 * WM keys; S^T = K Q^T and
// dP^T = V dO^T put the keys in the rows, so dV += P^T dO and dK += dS^T Q take P^T, dS^T straight
// from registers as A fragments, and the dc column sum is a per-thread row sum. Query tiles of BQ
// stream through shared memory, double-buffered with cp.async. With WM = 2 (version 3, hd 64) each
// Q/dO fragment read from shared memory feeds two mma's instead of one.
template<int HD, int BQ, int WM, bool GATE>
__global__ void __launch_bounds__(128) fox_backward_dkdv_kernel2(bf16* dk, bf16* dv, float* dc, const bf16* dout,
                                                                 const bf16* q, const bf16* k, const bf16* v,
                                                                 const float* lse, const float* delta, const float* c,
                                                                 int T, int H, int stride_qkv, int stride_o, int window,
                                                                 float scale_log2, float scale) {
    constexpr int BK = 64 * WM, LD = HD + 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sK = (bf16*)smem_raw;             // (BK, LD)
    bf16* sV = sK + BK * LD;                // (BK, LD)
    bf16* sQ = sV + BK * LD;                // (2, BQ, LD)
    bf16* sG = sQ + 2 * BQ * LD;            // (2, BQ, LD) dO
    float* sL = (float*)(sG + 2 * BQ * LD); // (2, BQ) lse
    float* sD = sL + 2 * BQ;                // (2, BQ) Delta
    float* sC = sD + 2 * BQ;                // (2, BQ) c of the queries

    int kt = blockIdx.x;  // the first key tiles see the most queries and are scheduled first
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    size_t base_o = (size_t)b * T * stride_o + (size_t)h * HD;
    const float *lb = lse + (size_t)bh * T, *db = delta + (size_t)bh * T;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int j0 = kt * BK;
    int i_end = window > 0 ? min(T, j0 + BK - 1 + window) : T;  // last query that sees the tile, +1
    int it_begin = j0 / BQ, it_end = (i_end + BQ - 1) / BQ;

    load_tile_async<BK, HD, LD, 128>(sK, k + base, j0, T, stride_qkv);
    load_tile_async<BK, HD, LD, 128>(sV, v + base, j0, T, stride_qkv);
    auto load_q_tile = [&](int it, int nb) {
        int i1 = it * BQ;
        load_tile_async<BQ, HD, LD, 128>(sQ + nb * BQ * LD, q + base, i1, T, stride_qkv);
        load_tile_async<BQ, HD, LD, 128>(sG + nb * BQ * LD, dout + base_o, i1, T, stride_o);
        load_vec_async<BQ>(sL + nb * BQ, lb, i1, T);
        load_vec_async<BQ>(sD + nb * BQ, db, i1, T);
        if (GATE) load_vec_async<BQ>(sC + nb * BQ, cb, i1, T);
    };
    load_q_tile(it_begin, 0);
    cp_async_commit();

    // this thread's keys: keys[mt][r] = 16-key tile mt of the warp, r = 0 (key g) or 1 (key g + 8)
    int keys[WM][2];
    float cj[WM][2], dcs[WM][2];
    float dka[WM][HD / 8][4], dva[WM][HD / 8][4];
    #pragma unroll
    for (int mt = 0; mt < WM; mt++) {
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            keys[mt][r] = j0 + warp * 16 * WM + mt * 16 + g + 8 * r;
            cj[mt][r] = (GATE && keys[mt][r] < T) ? cb[keys[mt][r]] : 0.f;
            dcs[mt][r] = 0.f;
        }
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) dka[mt][dt][e] = dva[mt][dt][e] = 0.f;
    }

    for (int it = it_begin; it < it_end; it++) {
        int buf = (it - it_begin) & 1;
        if (it + 1 < it_end) { load_q_tile(it + 1, buf ^ 1); cp_async_commit(); cp_async_wait<1>(); }
        else cp_async_wait<0>();
        __syncthreads();
        const bf16 *sQb = sQ + buf * BQ * LD, *sGb = sG + buf * BQ * LD;
        const float *sLb = sL + buf * BQ, *sDb = sD + buf * BQ, *sCb = sC + buf * BQ;

        // S^T = K Q^T and dP^T = V dO^T, (16 WM keys, BQ queries) per warp
        float st[WM][BQ / 8][4], dpt[WM][BQ / 8][4];
        #pragma unroll
        for (int mt = 0; mt < WM; mt++)
            #pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++)
                #pragma unroll
                for (int e = 0; e < 4; e++) st[mt][nt][e] = dpt[mt][nt][e] = 0.f;
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t ka[WM][4], va[WM][4];
            #pragma unroll
            for (int mt = 0; mt < WM; mt++) {
                int arow = (warp * 16 * WM + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + kk * 16 +
                           (lane / 16) * 8;
                ldmatrix_x4(ka[mt], smem_u32(sK + arow));
                ldmatrix_x4(va[mt], smem_u32(sV + arow));
            }
            #pragma unroll
            for (int np = 0; np < BQ / 16; np++) {
                uint32_t bq[4], bg[4];
                int brow = (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kk * 16 + ((lane / 8) % 2) * 8;
                ldmatrix_x4(bq, smem_u32(sQb + brow));
                ldmatrix_x4(bg, smem_u32(sGb + brow));
                #pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    mma_bf16_16816(st[mt][2 * np], ka[mt], bq[0], bq[1]);
                    mma_bf16_16816(st[mt][2 * np + 1], ka[mt], bq[2], bq[3]);
                    mma_bf16_16816(dpt[mt][2 * np], va[mt], bg[0], bg[1]);
                    mma_bf16_16816(dpt[mt][2 * np + 1], va[mt], bg[2], bg[3]);
                }
            }
        }
        // P^T, dS^T in place; masked entries are selected to 0, never multiplied
        int i0 = it * BQ;
        bool need_mask = (i0 < j0 + BK - 1) || (i0 + BQ > T) || (window > 0 && i0 + BQ - 1 - j0 >= window);
        #pragma unroll
        for (int mt = 0; mt < WM; mt++) {
            #pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++) {
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    int il = nt * 8 + 2 * tq + (e & 1);
                    float x = fmaf(st[mt][nt][e], scale_log2, -sLb[il] * LOG2E);
                    if (GATE) x = fmaf(sCb[il] - cj[mt][e / 2], LOG2E, x);
                    float p = exp2f(x);
                    if (need_mask) {
                        int i = i0 + il;
                        if (i >= T || !fox_visible(i, keys[mt][e / 2], window)) p = 0.f;
                    }
                    float ds = p * (dpt[mt][nt][e] - sDb[il]);
                    dcs[mt][e / 2] += ds;
                    st[mt][nt][e] = p;
                    dpt[mt][nt][e] = ds;
                }
            }
        }
        // dV += P^T dO, dK += dS^T Q: B fragments (k = query, n = d) by ldmatrix.trans
        #pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t pa[WM][4], sa[WM][4];
            #pragma unroll
            for (int mt = 0; mt < WM; mt++) {
                acc_to_a(pa[mt], st[mt][2 * kk], st[mt][2 * kk + 1]);
                acc_to_a(sa[mt], dpt[mt][2 * kk], dpt[mt][2 * kk + 1]);
            }
            #pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t bg[4], bq[4];
                int brow = (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + dp * 16 + (lane / 16) * 8;
                ldmatrix_x4_trans(bg, smem_u32(sGb + brow));
                ldmatrix_x4_trans(bq, smem_u32(sQb + brow));
                #pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    mma_bf16_16816(dva[mt][2 * dp], pa[mt], bg[0], bg[1]);
                    mma_bf16_16816(dva[mt][2 * dp + 1], pa[mt], bg[2], bg[3]);
                    mma_bf16_16816(dka[mt][2 * dp], sa[mt], bq[0], bq[1]);
                    mma_bf16_16816(dka[mt][2 * dp + 1], sa[mt], bq[2], bq[3]);
                }
            }
        }
        __syncthreads();  // buffer free for the prefetch of the next iteration
    }
    bf16 *dkb = dk + base, *dvb = dv + base;
    #pragma unroll
    for (int mt = 0; mt < WM; mt++) {
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            int key = keys[mt][r];
            if (GATE) {  // fixed shuffle order: deterministic
                dcs[mt][r] += __shfl_xor_sync(0xffffffff, dcs[mt][r], 1);
                dcs[mt][r] += __shfl_xor_sync(0xffffffff, dcs[mt][r], 2);
                if (tq == 0 && key < T) dc[(size_t)bh * T + key] = -dcs[mt][r];
            }
            if (key >= T) continue;
            #pragma unroll
            for (int dt = 0; dt < HD / 8; dt++) {
                int col = dt * 8 + 2 * tq;
                *(__nv_bfloat162*)(dkb + (size_t)key * stride_qkv + col) =
                    __floats2bfloat162_rn(dka[mt][dt][2 * r] * scale, dka[mt][dt][2 * r + 1] * scale);
                *(__nv_bfloat162*)(dvb + (size_t)key * stride_qkv + col) =
                    __floats2bfloat162_rn(dva[mt][dt][2 * r], dva[mt][dt][2 * r + 1]);
            }
        }
    }
}

// dq of one 64-query tile: a warp owns 16 queries, key tiles stream through shared memory
template<int HD, bool GATE>
__global__ void __launch_bounds__(128) fox_backward_dq_kernel2(bf16* dq, float* dc_row, const bf16* dout, const bf16* q,
                                                               const bf16* k, const bf16* v, const float* lse,
                                                               const float* delta, const float* c, int T, int H,
                                                               int stride_qkv, int stride_o, int window,
                                                               float scale_log2, float scale) {
    constexpr int BR = 64, BC = 64, LD = HD + 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_raw;                  // (BR, LD)
    bf16* sG = sQ + BR * LD;                 // (BR, LD) dO
    bf16* sK = sG + BR * LD;                 // (2, BC, LD)
    bf16* sV = sK + 2 * BC * LD;             // (2, BC, LD)
    float* sC = (float*)(sV + 2 * BC * LD);  // (2, BC) c of the keys

    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    size_t base_o = (size_t)b * T * stride_o + (size_t)h * HD;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0;
    int jt_begin = j_begin / BC, jt_end = (min(T, i0 + BR) + BC - 1) / BC;

    load_tile_async<BR, HD, LD, 128>(sQ, q + base, i0, T, stride_qkv);
    load_tile_async<BR, HD, LD, 128>(sG, dout + base_o, i0, T, stride_o);
    auto load_k_tile = [&](int jt, int nb) {
        int j1 = jt * BC;
        load_tile_async<BC, HD, LD, 128>(sK + nb * BC * LD, k + base, j1, T, stride_qkv);
        load_tile_async<BC, HD, LD, 128>(sV + nb * BC * LD, v + base, j1, T, stride_qkv);
        if (GATE) load_vec_async<BC>(sC + nb * BC, cb, j1, T);
    };
    load_k_tile(jt_begin, 0);
    cp_async_commit();

    int r0 = i0 + warp * 16 + g, r1 = r0 + 8;
    float rl[2], rd[2], rc[2];  // lse in log2 units, Delta, c of this thread's rows
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = r ? r1 : r0;
        bool ok = row < T;
        rl[r] = ok ? lse[(size_t)bh * T + row] * LOG2E : 0.f;
        rd[r] = ok ? delta[(size_t)bh * T + row] : 0.f;
        rc[r] = (GATE && ok) ? cb[row] : 0.f;
    }
    float dqa[HD / 8][4], rs[2] = {0.f, 0.f};  // rs: row sums of dS
    #pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) dqa[dt][0] = dqa[dt][1] = dqa[dt][2] = dqa[dt][3] = 0.f;

    for (int jt = jt_begin; jt < jt_end; jt++) {
        int buf = (jt - jt_begin) & 1;
        if (jt + 1 < jt_end) { load_k_tile(jt + 1, buf ^ 1); cp_async_commit(); cp_async_wait<1>(); }
        else cp_async_wait<0>();
        __syncthreads();
        const bf16 *sKb = sK + buf * BC * LD, *sVb = sV + buf * BC * LD;
        const float* sCb = sC + buf * BC;

        // S = Q K^T, dP = dO V^T, (16, 64) per warp
        float s[BC / 8][4], dp[BC / 8][4];
        #pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.f;
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t qa[4], ga[4];
            int arow = (warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + kk * 16 + (lane / 16) * 8;
            ldmatrix_x4(qa, smem_u32(sQ + arow));
            ldmatrix_x4(ga, smem_u32(sG + arow));
            #pragma unroll
            for (int np = 0; np < BC / 16; np++) {
                uint32_t bk[4], bv[4];
                int brow = (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kk * 16 + ((lane / 8) % 2) * 8;
                ldmatrix_x4(bk, smem_u32(sKb + brow));
                ldmatrix_x4(bv, smem_u32(sVb + brow));
                mma_bf16_16816(s[2 * np], qa, bk[0], bk[1]);
                mma_bf16_16816(s[2 * np + 1], qa, bk[2], bk[3]);
                mma_bf16_16816(dp[2 * np], ga, bv[0], bv[1]);
                mma_bf16_16816(dp[2 * np + 1], ga, bv[2], bv[3]);
            }
        }
        int j0 = jt * BC;
        bool need_mask = (j0 + BC - 1 > i0) || (j0 + BC > T) ||
                         (window > 0 && j0 <= i0 + BR - 1 - window);
        #pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int jl = nt * 8 + 2 * tq + (e & 1);
                float x = fmaf(s[nt][e], scale_log2, -rl[e / 2]);
                if (GATE) x = fmaf(rc[e / 2] - sCb[jl], LOG2E, x);
                float p = exp2f(x);
                if (need_mask) {
                    int j = j0 + jl;
                    if (j >= T || !fox_visible(e < 2 ? r0 : r1, j, window)) p = 0.f;
                }
                s[nt][e] = p * (dp[nt][e] - rd[e / 2]);  // dS
                rs[e / 2] += s[nt][e];
            }
        }
        // dQ += dS K: B fragments (k = key, n = d) by ldmatrix.trans
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t sa[4];
            acc_to_a(sa, s[2 * kk], s[2 * kk + 1]);
            #pragma unroll
            for (int dp2 = 0; dp2 < HD / 16; dp2++) {
                uint32_t bk[4];
                ldmatrix_x4_trans(bk, smem_u32(sKb + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + dp2 * 16 +
                                               (lane / 16) * 8));
                mma_bf16_16816(dqa[2 * dp2], sa, bk[0], bk[1]);
                mma_bf16_16816(dqa[2 * dp2 + 1], sa, bk[2], bk[3]);
            }
        }
        __syncthreads();
    }
    bf16* dqb = dq + base;
    #pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) {
        int col = dt * 8 + 2 * tq;
        if (r0 < T) *(__nv_bfloat162*)(dqb + (size_t)r0 * stride_qkv + col) =
            __floats2bfloat162_rn(dqa[dt][0] * scale, dqa[dt][1] * scale);
        if (r1 < T) *(__nv_bfloat162*)(dqb + (size_t)r1 * stride_qkv + col) =
            __floats2bfloat162_rn(dqa[dt][2] * scale, dqa[dt][3] * scale);
    }
    if (GATE) {
        #pragma unroll
        for (int r = 0; r < 2; r++) {  // fixed shuffle order: deterministic
            rs[r] += __shfl_xor_sync(0xffffffff, rs[r], 1);
            rs[r] += __shfl_xor_sync(0xffffffff, rs[r], 2);
        }
        if (tq == 0) {
            if (r0 < T) dc_row[(size_t)bh * T + r0] = rs[0];
            if (r1 < T) dc_row[(size_t)bh * T + r1] = rs[1];
        }
    }
}

// versions 2 (WM = 1) and 3 (WM = 2: 128-key dK/dV tiles, 32-query steps, at hd 64 only: 32 keys per warp
// at hd 128 would need 256 accumulator registers)
template<int WM>
static void fox_backward2(const BwdArgs& a) {
    bwd_frame(a, [&](float* dc, float* dc_row, const float* delta) {
        by_shape(a.hd, a.c, [&](auto HD, auto GATE) {
            constexpr int W = HD == 64 ? WM : 1, BQ = W == 2 ? 32 : 64, LD = HD + 8, BK = 64 * W;
            size_t smem_kv = (size_t)(2 * BK + 4 * BQ) * LD * sizeof(bf16) + 6 * BQ * sizeof(float);
            size_t smem_q = (size_t)(2 * 64 + 4 * 64) * LD * sizeof(bf16) + 2 * 64 * sizeof(float);
            auto kv = fox_backward_dkdv_kernel2<HD, BQ, W, GATE>;
            auto kq = fox_backward_dq_kernel2<HD, GATE>;
            cudaCheck(cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
            cudaCheck(cudaFuncSetAttribute(kq, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
            float scale = 1.0f / sqrtf((float)HD), scale_log2 = scale * LOG2E;
            kv<<<dim3(ceil_div(a.T, BK), a.B * a.H), 128, smem_kv>>>(a.dk, a.dv, dc, a.dout, a.q, a.k, a.v, a.lse,
                                                                     delta, a.c, a.T, a.H, a.stride_qkv, a.stride_o,
                                                                     a.window, scale_log2, scale);
            launchCheck();
            kq<<<dim3(ceil_div(a.T, 64), a.B * a.H), 128, smem_q>>>(a.dq, dc_row, a.dout, a.q, a.k, a.v, a.lse, delta,
                                                                    a.c, a.T, a.H, a.stride_qkv, a.stride_o, a.window,
                                                                    scale_log2, scale);
            launchCheck();
        });
    });
}

// ----------------------------------------------------------------------------
// Versions 5 and 6: the two kernels on Hopper's warpgroup mma (wgmma, 4 warps, 64 rows per
// instruction), which reads its B operand, and optionally A, straight from shared memory through a
// descriptor: no ldmatrix into registers, which is what saturated L1/shared in versions 2-3 (67% in
// the profile). Tiles are train_fox.cu's 128-byte-swizzled ones (archived version 4 stored 8x8 core
// matrices without swizzle: bank conflicts, slower than version 2). The same bytes serve as a
// K-major operand (K = HD: S = Q K^T, dP = dO V^T) and as an N-major one (N = HD, K = rows:
// dV += P^T dO, dK += dS^T Q, dQ += dS K), with the transpose bit of the instruction. P and dS go
// from the accumulators to the A registers of the second matmuls directly (mma.sync's layout).
// Each tile gets two commit groups so that exp(P) runs under the dP matmul and dS under the dV one.

// m64n32k16 with both operands K-major by descriptor: the 32-query steps of version 5's dK/dV
// kernel at hd 128 (the other widths are train_fox.cu's wgmma_ss)
__device__ __forceinline__ void wgmma_ss_n32(float* d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(acc) : "memory");
}
template<int N> __device__ __forceinline__ void wgmma_ss_w(float* d, uint64_t da, uint64_t db, int acc) {
    if constexpr (N == 32) wgmma_ss_n32(d, da, db, acc);
    else wgmma_ss<N>(d, da, db, acc);
}

// dk, dv and the dc column sums of one key tile of 64 * NWG keys; warpgroup wg owns keys
// 64wg..64wg+63 (a warp 16 of them, as in version 2). Query tiles of BQ stream through shared
// memory, double-buffered with cp.async, shared by the warpgroups.
// S^T = K Q^T, dP^T = V dO^T (SS wgmma, K-major), then P^T, dS^T in registers, then
// dV += P^T dO, dK += dS^T Q (RS wgmma, dO and Q N-major).
template<int HD, int BQ, int NWG, bool GATE>
__global__ void __launch_bounds__(128 * NWG, 1) fox_backward_dkdv_kernel5(bf16* dk, bf16* dv, float* dc,
                                                                          const bf16* dout, const bf16* q,
                                                                          const bf16* k, const bf16* v,
                                                                          const float* lse, const float* delta,
                                                                          const float* c, int T, int H, int stride_qkv,
                                                                          int stride_o, int window, float scale_log2,
                                                                          float scale) {
    constexpr int BK = 64 * NWG, NT = 128 * NWG;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sK = (bf16*)smem_1k(smem_raw);    // (BK, HD) tiles of layout SW
    bf16* sV = sK + BK * HD;                // (BK, HD)
    bf16* sQ = sV + BK * HD;                // (2, BQ, HD)
    bf16* sG = sQ + 2 * BQ * HD;            // (2, BQ, HD) dO
    float* sL = (float*)(sG + 2 * BQ * HD); // (2, BQ) lse
    float* sD = sL + 2 * BQ;                // (2, BQ) Delta
    float* sC = sD + 2 * BQ;                // (2, BQ) c of the queries

    int kt = blockIdx.x;  // the first key tiles see the most queries and are scheduled first
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4, wg = warp / 4;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    size_t base_o = (size_t)b * T * stride_o + (size_t)h * HD;
    const float *lb = lse + (size_t)bh * T, *db = delta + (size_t)bh * T;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int j0 = kt * BK;
    int i_end = window > 0 ? min(T, j0 + BK - 1 + window) : T;  // last query that sees the tile, +1
    int it_begin = j0 / BQ, it_end = (i_end + BQ - 1) / BQ;

    load_tile_swz<BK, HD, NT>(sK, k + base, j0, T, stride_qkv);
    load_tile_swz<BK, HD, NT>(sV, v + base, j0, T, stride_qkv);
    auto load_q_tile = [&](int it, int nb) {
        int i1 = it * BQ;
        load_tile_swz<BQ, HD, NT>(sQ + nb * BQ * HD, q + base, i1, T, stride_qkv);
        load_tile_swz<BQ, HD, NT>(sG + nb * BQ * HD, dout + base_o, i1, T, stride_o);
        load_vec_async<BQ>(sL + nb * BQ, lb, i1, T);
        load_vec_async<BQ>(sD + nb * BQ, db, i1, T);
        if (GATE) load_vec_async<BQ>(sC + nb * BQ, cb, i1, T);
    };
    load_q_tile(it_begin, 0);
    cp_async_commit();

    int keys[2];
    float cj[2], dcs[2] = {0.f, 0.f};
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        keys[r] = j0 + warp * 16 + g + 8 * r;
        cj[r] = (GATE && keys[r] < T) ? cb[keys[r]] : 0.f;
    }
    float dka[HD / 2], dva[HD / 2];
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) dka[e] = dva[e] = 0.f;
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];  // A fragments of P^T, dS^T

    for (int it = it_begin; it < it_end; it++) {
        int buf = (it - it_begin) & 1;
        if (it + 1 < it_end) { load_q_tile(it + 1, buf ^ 1); cp_async_commit(); cp_async_wait<1>(); }
        else cp_async_wait<0>();
        fence_async_smem();
        __syncthreads();
        const bf16 *sQb = sQ + buf * BQ * HD, *sGb = sG + buf * BQ * HD;
        const float *sLb = sL + buf * BQ, *sDb = sD + buf * BQ, *sCb = sC + buf * BQ;

        // S^T = K Q^T and dP^T = V dO^T: (64 keys, BQ queries) per warpgroup, two commit groups so
        // that the exponentials of P overlap the dP^T matmul, and dS the dV one
        float st[BQ / 2], dpt[BQ / 2];
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss_w<BQ>(st, desc_k<BK>(sK, wg * 8, kk), desc_k<BQ>(sQb, 0, kk), kk);
        wgmma_commit();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss_w<BQ>(dpt, desc_k<BK>(sV, wg * 8, kk), desc_k<BQ>(sGb, 0, kk), kk);
        wgmma_commit();
        wgmma_wait<1>();
        wgmma_pin<BQ / 2>(st);

        // P^T in place; masked entries are selected to 0, never multiplied
        int i0 = it * BQ;
        bool need_mask = (i0 < j0 + BK - 1) || (i0 + BQ > T) || (window > 0 && i0 + BQ - 1 - j0 >= window);
        #pragma unroll
        for (int nt = 0; nt < BQ / 8; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int il = nt * 8 + 2 * tq + (e & 1);
                float x = fmaf(st[nt * 4 + e], scale_log2, -sLb[il] * LOG2E);
                if (GATE) x = fmaf(sCb[il] - cj[e / 2], LOG2E, x);
                float p = exp2f(x);
                if (need_mask) {
                    int i = i0 + il;
                    if (i >= T || !fox_visible(i, keys[e / 2], window)) p = 0.f;
                }
                st[nt * 4 + e] = p;
            }
        }
        // dV += P^T dO
        #pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) acc_to_a(pa[kk], st + 8 * kk, st + 8 * kk + 4);
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(dva, pa[kk], desc_mn<BQ>(sGb, kk), 1);
        wgmma_commit();
        wgmma_wait<1>();  // dP^T done (dV may still run)
        wgmma_pin<BQ / 2>(dpt);
        // dS^T = P^T (dP^T - Delta)
        #pragma unroll
        for (int nt = 0; nt < BQ / 8; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int il = nt * 8 + 2 * tq + (e & 1);
                float ds = st[nt * 4 + e] * (dpt[nt * 4 + e] - sDb[il]);
                dcs[e / 2] += ds;
                dpt[nt * 4 + e] = ds;
            }
        }
        // dK += dS^T Q
        #pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) acc_to_a(sa[kk], dpt + 8 * kk, dpt + 8 * kk + 4);
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(dka, sa[kk], desc_mn<BQ>(sQb, kk), 1);
        wgmma_commit();
        wgmma_wait0();
        wgmma_pin<HD / 2>(dva); wgmma_pin<HD / 2>(dka);
        wgmma_pin_a<BQ / 16>(pa); wgmma_pin_a<BQ / 16>(sa);
        __syncthreads();  // buffer free for the prefetch of the next iteration
    }
    store_dkdv<HD, GATE>(dk + base, dv + base, dc + (size_t)bh * T, dka, dva, dcs, keys, tq, T, stride_qkv, scale);
}

// dq and the dc row sums of one query tile of 64 * NWG queries (warpgroup wg owns 64 of them);
// key tiles of BC stream through shared memory. S = Q K^T, dP = dO V^T (SS, K-major), dS in
// registers, dQ += dS K (RS, K N-major).
template<int HD, int BC, int NWG, bool GATE>
__global__ void __launch_bounds__(128 * NWG, 1) fox_backward_dq_kernel5(bf16* dq, float* dc_row, const bf16* dout,
                                                                        const bf16* q, const bf16* k, const bf16* v,
                                                                        const float* lse, const float* delta,
                                                                        const float* c, int T, int H,
                                                                        int stride_qkv, int stride_o, int window,
                                                                        float scale_log2, float scale) {
    constexpr int BR = 64 * NWG, NT = 128 * NWG;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_1k(smem_raw);       // (BR, HD) tiles of layout SW
    bf16* sG = sQ + BR * HD;                   // (BR, HD) dO
    bf16* sK = sG + BR * HD;                   // (2, BC, HD)
    bf16* sV = sK + 2 * BC * HD;               // (2, BC, HD)
    float* sC = (float*)(sV + 2 * BC * HD);    // (2, BC) c of the keys

    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4, wg = warp / 4;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    size_t base_o = (size_t)b * T * stride_o + (size_t)h * HD;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0;
    int jt_begin = j_begin / BC, jt_end = (min(T, i0 + BR) + BC - 1) / BC;

    load_tile_swz<BR, HD, NT>(sQ, q + base, i0, T, stride_qkv);
    load_tile_swz<BR, HD, NT>(sG, dout + base_o, i0, T, stride_o);
    auto load_k_tile = [&](int jt, int nb) {
        int j1 = jt * BC;
        load_tile_swz<BC, HD, NT>(sK + nb * BC * HD, k + base, j1, T, stride_qkv);
        load_tile_swz<BC, HD, NT>(sV + nb * BC * HD, v + base, j1, T, stride_qkv);
        if (GATE) load_vec_async<BC>(sC + nb * BC, cb, j1, T);
    };
    load_k_tile(jt_begin, 0);
    cp_async_commit();

    int r0 = i0 + warp * 16 + g, r1 = r0 + 8;
    float rl[2], rd[2], rc[2];  // lse in log2 units, Delta, c of this thread's rows
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = r ? r1 : r0;
        bool ok = row < T;
        rl[r] = ok ? lse[(size_t)bh * T + row] * LOG2E : 0.f;
        rd[r] = ok ? delta[(size_t)bh * T + row] : 0.f;
        rc[r] = (GATE && ok) ? cb[row] : 0.f;
    }
    float dqa[HD / 2], rs[2] = {0.f, 0.f};  // rs: row sums of dS
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) dqa[e] = 0.f;
    uint32_t sa[BC / 16][4];  // A fragments of dS

    for (int jt = jt_begin; jt < jt_end; jt++) {
        int buf = (jt - jt_begin) & 1;
        if (jt + 1 < jt_end) { load_k_tile(jt + 1, buf ^ 1); cp_async_commit(); cp_async_wait<1>(); }
        else cp_async_wait<0>();
        fence_async_smem();
        __syncthreads();
        const bf16 *sKb = sK + buf * BC * HD, *sVb = sV + buf * BC * HD;
        const float* sCb = sC + buf * BC;

        float s[BC / 2], dp[BC / 2];
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<BC>(s, desc_k<BR>(sQ, wg * 8, kk), desc_k<BC>(sKb, 0, kk), kk);
        wgmma_commit();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<BC>(dp, desc_k<BR>(sG, wg * 8, kk), desc_k<BC>(sVb, 0, kk), kk);
        wgmma_commit();
        wgmma_wait<1>();  // S done; P's exponentials overlap the dP matmul
        wgmma_pin<BC / 2>(s);
        int j0 = jt * BC;
        bool need_mask = (j0 + BC - 1 > i0) || (j0 + BC > T) || (window > 0 && j0 <= i0 + BR - 1 - window);
        #pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int jl = nt * 8 + 2 * tq + (e & 1);
                float x = fmaf(s[nt * 4 + e], scale_log2, -rl[e / 2]);
                if (GATE) x = fmaf(rc[e / 2] - sCb[jl], LOG2E, x);
                float p = exp2f(x);
                if (need_mask) {
                    int j = j0 + jl;
                    if (j >= T || !fox_visible(e < 2 ? r0 : r1, j, window)) p = 0.f;
                }
                s[nt * 4 + e] = p;
            }
        }
        wgmma_wait0();
        wgmma_pin<BC / 2>(dp);
        #pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                float ds = s[nt * 4 + e] * (dp[nt * 4 + e] - rd[e / 2]);
                s[nt * 4 + e] = ds;
                rs[e / 2] += ds;
            }
        }
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) acc_to_a(sa[kk], s + 8 * kk, s + 8 * kk + 4);
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(dqa, sa[kk], desc_mn<BC>(sKb, kk), 1);
        wgmma_commit();
        wgmma_wait0();
        wgmma_pin<HD / 2>(dqa); wgmma_pin_a<BC / 16>(sa);
        __syncthreads();
    }
    int rows[2] = {r0, r1};
    store_dq<HD, GATE>(dq + base, dc_row + (size_t)bh * T, dqa, rs, rows, tq, T, stride_qkv, scale);
}

// versions 5 (NWG = 1) and 6 (NWG = 2 warpgroups, 128 keys, per dK/dV block); 64-query steps (hd 128:
// 32, dK and dV take 128 accumulator registers), dQ blocks of one warpgroup over 64-key tiles
template<int NWG>
static void fox_backward5(const BwdArgs& a) {
    bwd_frame(a, [&](float* dc, float* dc_row, const float* delta) {
        by_shape(a.hd, a.c, [&](auto HD, auto GATE) {
            constexpr int BQ = HD == 64 ? 64 : 32, BC = 64;
            constexpr size_t smem_kv = 1024 + (size_t)(2 * 64 * NWG + 4 * BQ) * HD * sizeof(bf16) +
                                       6 * BQ * sizeof(float);
            constexpr size_t smem_q = 1024 + (size_t)(2 * 64 + 4 * BC) * HD * sizeof(bf16) + 2 * BC * sizeof(float);
            auto kv = fox_backward_dkdv_kernel5<HD, BQ, NWG, GATE>;
            auto kq = fox_backward_dq_kernel5<HD, BC, 1, GATE>;
            cudaCheck(cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
            cudaCheck(cudaFuncSetAttribute(kq, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
            float scale = 1.0f / sqrtf((float)HD), scale_log2 = scale * LOG2E;
            kv<<<dim3(ceil_div(a.T, 64 * NWG), a.B * a.H), 128 * NWG, smem_kv>>>(
                a.dk, a.dv, dc, a.dout, a.q, a.k, a.v, a.lse, delta, a.c, a.T, a.H, a.stride_qkv, a.stride_o, a.window,
                scale_log2, scale);
            launchCheck();
            kq<<<dim3(ceil_div(a.T, 64), a.B * a.H), 128, smem_q>>>(a.dq, dc_row, a.dout, a.q, a.k, a.v, a.lse, delta,
                                                                    a.c, a.T, a.H, a.stride_qkv, a.stride_o, a.window,
                                                                    scale_log2, scale);
            launchCheck();
        });
    });
}
// ----------------------------------------------------------------------------
// Version 9: version 6's two kernels in forward version 8's structure. A block of three warpgroups owns one
// 128-row tile (128 keys in the dK/dV kernel, 128 queries in the dQ kernel: one pruning tile
// each). Warpgroup 0 is the producer: one warp issues the copy-engine (TMA) loads, setmaxnreg gives
// its registers away (24). Warpgroups 1 and 2 consume 64 rows each (setmaxnreg 240). The fixed tile
// (K, V; Q, dO) comes once; the streamed tiles (Q, dO and the queries' lse, Delta, c; K, V and the
// keys' c) through a ring of ST stages with a full and an empty mbarrier per stage. The per-row
// floats come by 4-byte cp.async from the producer's 32 lanes, arriving on the stage's full
// barrier (a tensor map needs 16-byte row strides, which (B, H, T) fp32 lacks for odd T).
// What version 6 lacks: nothing keeps the two consumers in lockstep (no __syncthreads). Each waits
// only for its stage's bytes and releases the stage when its last matmul on it is done, so one
// consumer's element-wise work runs under the other's matmuls and the loads under both, and the
// consumers spend no issue slots on address arithmetic for loads. Inside a consumer a tile is
// version 6's: two commit groups (P's exponentials under dP^T, dS under dV), and no accumulator of
// an in-flight wgmma is defined by other code in between (ptxas then keeps the wgmma's async:
// no C7515). A consumer skips the tiles it sees nothing of (above its diagonal or past the window)
// but still releases them.

// dk, dv and the dc column sums of the 128-key tile blockIdx.x; consumer cw owns keys 64cw..+63
// (a warp 16 of them). Query tiles of BQ stream through the ring. query_end (B*H, ceil(T / 128)):
// query tiles of 128 from query_end on are pruned (NULL: none).
template<int HD, int BQ, int ST, bool GATE>
__global__ void __launch_bounds__(384, 1) fox_backward_dkdv_kernel9(bf16* dk, bf16* dv, float* dc,
                                                                    const __grid_constant__ CUtensorMap tmQ,
                                                                    const __grid_constant__ CUtensorMap tmG,
                                                                    const __grid_constant__ CUtensorMap tmK,
                                                                    const __grid_constant__ CUtensorMap tmV,
                                                                    const float* lse, const float* delta,
                                                                    const float* c, int T, int H, int stride_qkv,
                                                                    int window, float scale_log2, float scale,
                                                                    const int* query_end) {
    constexpr int BK = 128;
    static_assert(BK == PRUNE_BLOCK && PRUNE_BLOCK % BQ == 0 && BQ % 32 == 0, "a key tile is one pruning tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sK = (bf16*)smem_1k(smem_raw);     // (BK, HD) swizzled tiles
    bf16* sV = sK + BK * HD;                 // (BK, HD)
    bf16* sQ = sV + BK * HD;                 // (ST, BQ, HD)
    bf16* sG = sQ + ST * BQ * HD;            // (ST, BQ, HD) dO
    float* sL = (float*)(sG + ST * BQ * HD); // (ST, BQ) lse
    float* sD = sL + ST * BQ;                // (ST, BQ) Delta
    float* sC = sD + ST * BQ;                // (ST, BQ) c of the queries
    uint64_t* bar = (uint64_t*)(sC + ST * BQ);
    uint64_t *barKV = bar, *full = bar + 1, *empty = full + ST;

    int kt = blockIdx.x;  // the first key tiles see the most queries and are scheduled first
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    const float *lb = lse + (size_t)bh * T, *db = delta + (size_t)bh * T;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int j0 = kt * BK;
    int i_end = window > 0 ? min(T, j0 + BK - 1 + window) : T;  // last query that sees the tile, +1
    int it_begin = j0 / BQ, it_end = (i_end + BQ - 1) / BQ;
    // pruned query tiles are never loaded (the diagonal one is kept, so it_begin < it_end)
    if (query_end) it_end = min(it_end, query_end[(size_t)bh * gridDim.x + kt] * (PRUNE_BLOCK / BQ));
    int ntiles = it_end - it_begin;

    // full: the copy engine's arrival + the 32 lanes' lse, Delta, c; empty: a warp of the consumers each
    fox_ring_init<ST>(barKV, full, empty, 1 + 32, 8);

    if (wg == 0) {  // producer
        setmaxnreg_dec<24>();
        if (warp != 0) return;
        if (lane == 0) {
            mbar_expect_tx(barKV, 2 * BK * HD * sizeof(bf16));
            tma_load_tile<BK, HD>(sK, &tmK, j0, h, b, barKV);
            tma_load_tile<BK, HD>(sV, &tmV, j0, h, b, barKV);
        }
        for (int n = 0; n < ntiles; n++) {
            int st = n % ST, i1 = (it_begin + n) * BQ;
            mbar_wait(&empty[st], ((n / ST) & 1) ^ 1);
            if (lane == 0) {
                mbar_expect_tx(&full[st], 2 * BQ * HD * sizeof(bf16));
                tma_load_tile<BQ, HD>(sQ + st * BQ * HD, &tmQ, i1, h, b, &full[st]);
                tma_load_tile<BQ, HD>(sG + st * BQ * HD, &tmG, i1, h, b, &full[st]);
            }
            #pragma unroll
            for (int e = lane; e < BQ; e += 32) {  // past T: zeros
                int i = min(i1 + e, T - 1);
                bool ok = i1 + e < T;
                cp_async4(sL + st * BQ + e, lb + i, ok);
                cp_async4(sD + st * BQ + e, db + i, ok);
                if (GATE) cp_async4(sC + st * BQ + e, cb + i, ok);
            }
            mbar_arrive_cp_async(&full[st]);
        }
        return;
    }

    // consumers
    setmaxnreg_inc<240>();
    int cw = wg - 1, cwarp = warp - 4, g = lane / 4, tq = lane % 4;
    int j0w = j0 + 64 * cw;  // this consumer's first key
    int keys[2];
    float cj[2], dcs[2] = {0.f, 0.f};
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        keys[r] = j0 + cwarp * 16 + g + 8 * r;
        cj[r] = (GATE && keys[r] < T) ? cb[keys[r]] : 0.f;
    }
    float dka[HD / 2], dva[HD / 2];
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) dka[e] = dva[e] = 0.f;
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];  // A fragments of P^T, dS^T
    mbar_wait(barKV, 0);

    for (int n = 0; n < ntiles; n++) {
        int st = n % ST, i0 = (it_begin + n) * BQ;
        mbar_wait(&full[st], (n / ST) & 1);
        // every query of the tile before this consumer's first key, or past the window of its last one: P = 0
        bool seen = i0 + BQ > j0w && !(window > 0 && i0 - (j0w + 63) >= window);
        if (seen) {
            const bf16 *sQb = sQ + st * BQ * HD, *sGb = sG + st * BQ * HD;
            const float *sLb = sL + st * BQ, *sDb = sD + st * BQ, *sCb = sC + st * BQ;
            // S^T = K Q^T and dP^T = V dO^T: (64 keys, BQ queries), two commit groups
            float s[BQ / 2], dp[BQ / 2];
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                wgmma_ss<BQ>(s, desc_k<BK>(sK, cw * 8, kk), desc_k<BQ>(sQb, 0, kk), kk);
            wgmma_commit();
            #pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                wgmma_ss<BQ>(dp, desc_k<BK>(sV, cw * 8, kk), desc_k<BQ>(sGb, 0, kk), kk);
            wgmma_commit();
            wgmma_wait<1>();
            wgmma_pin<BQ / 2>(s);

            // P^T in place; masked entries are selected to 0, never multiplied
            bool need_mask = (i0 < j0w + 63) || (i0 + BQ > T) || (window > 0 && i0 + BQ - 1 - j0w >= window);
            #pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++) {
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    int il = nt * 8 + 2 * tq + (e & 1);
                    float x = fmaf(s[nt * 4 + e], scale_log2, -sLb[il] * LOG2E);
                    if (GATE) x = fmaf(sCb[il] - cj[e / 2], LOG2E, x);
                    float p = ex2_ftz(x);  // one MUFU.EX2; P's denormals are 0
                    if (need_mask) {
                        int i = i0 + il;
                        if (i >= T || !fox_visible(i, keys[e / 2], window)) p = 0.f;
                    }
                    s[nt * 4 + e] = p;
                }
            }
            // dV += P^T dO
            #pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) acc_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(dva, pa[kk], desc_mn<BQ>(sGb, kk), 1);
            wgmma_commit();
            wgmma_wait<1>();  // dP^T done (dV may still run)
            wgmma_pin<BQ / 2>(dp);
            // dS^T = P^T (dP^T - Delta)
            #pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++) {
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    int il = nt * 8 + 2 * tq + (e & 1);
                    float ds = s[nt * 4 + e] * (dp[nt * 4 + e] - sDb[il]);
                    dcs[e / 2] += ds;
                    dp[nt * 4 + e] = ds;
                }
            }
            // dK += dS^T Q
            #pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) acc_to_a(sa[kk], dp + 8 * kk, dp + 8 * kk + 4);
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(dka, sa[kk], desc_mn<BQ>(sQb, kk), 1);
            wgmma_commit();
            wgmma_wait0();
            wgmma_pin<HD / 2>(dva); wgmma_pin<HD / 2>(dka);
            wgmma_pin_a<BQ / 16>(pa); wgmma_pin_a<BQ / 16>(sa);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]);  // this warp is done with the stage's Q, dO and floats
    }

    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    store_dkdv<HD, GATE>(dk + base, dv + base, dc + (size_t)bh * T, dka, dva, dcs, keys, tq, T, stride_qkv, scale);
}

// dq and the dc row sums of the 128-query tile gridDim.x - 1 - blockIdx.x; consumer cw owns queries
// 64cw..+63. Key tiles of BC (with the keys' c) stream through the ring. key_start (B*H,
// ceil(T / 128)): the key tiles of 128 before key_start are pruned (NULL: none).
template<int HD, int BC, int ST, bool GATE>
__global__ void __launch_bounds__(384, 1) fox_backward_dq_kernel9(bf16* dq, float* dc_row,
                                                                  const __grid_constant__ CUtensorMap tmQ,
                                                                  const __grid_constant__ CUtensorMap tmG,
                                                                  const __grid_constant__ CUtensorMap tmK,
                                                                  const __grid_constant__ CUtensorMap tmV,
                                                                  const float* lse, const float* delta, const float* c,
                                                                  int T, int H, int stride_qkv, int window,
                                                                  float scale_log2, float scale, const int* key_start) {
    constexpr int BR = 128;
    static_assert(BR == PRUNE_BLOCK && PRUNE_BLOCK % BC == 0, "a query tile is one pruning tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_1k(smem_raw);     // (BR, HD) swizzled tiles
    bf16* sG = sQ + BR * HD;                 // (BR, HD) dO
    bf16* sK = sG + BR * HD;                 // (ST, BC, HD)
    bf16* sV = sK + ST * BC * HD;            // (ST, BC, HD)
    float* sC = (float*)(sV + ST * BC * HD); // (ST, BC) c of the keys
    uint64_t* bar = (uint64_t*)(sC + ST * BC);
    uint64_t *barQ = bar, *full = bar + 1, *empty = full + ST;

    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0;
    int jt_begin = j_begin / BC, jt_end = (min(T, i0 + BR) + BC - 1) / BC;
    // pruned key tiles are never loaded (never the diagonal one, so jt_begin < jt_end)
    if (key_start) jt_begin = max(jt_begin, key_start[(size_t)bh * gridDim.x + qt] * (PRUNE_BLOCK / BC));
    int ntiles = jt_end - jt_begin;

    // full: the copy engine's arrival + the 32 c lanes; empty: a warp of the consumers each
    fox_ring_init<ST>(barQ, full, empty, 1 + (GATE ? 32 : 0), 8);

    if (wg == 0) {  // producer
        setmaxnreg_dec<24>();
        if (warp != 0) return;
        if (lane == 0) {
            mbar_expect_tx(barQ, 2 * BR * HD * sizeof(bf16));
            tma_load_tile<BR, HD>(sQ, &tmQ, i0, h, b, barQ);
            tma_load_tile<BR, HD>(sG, &tmG, i0, h, b, barQ);
        }
        for (int n = 0; n < ntiles; n++) {
            int st = n % ST, j1 = (jt_begin + n) * BC;
            mbar_wait(&empty[st], ((n / ST) & 1) ^ 1);
            if (lane == 0) {
                mbar_expect_tx(&full[st], 2 * BC * HD * sizeof(bf16));
                tma_load_tile<BC, HD>(sK + st * BC * HD, &tmK, j1, h, b, &full[st]);
                tma_load_tile<BC, HD>(sV + st * BC * HD, &tmV, j1, h, b, &full[st]);
            }
            if (GATE) {
                #pragma unroll
                for (int e = lane; e < BC; e += 32) cp_async4(sC + st * BC + e, cb + min(j1 + e, T - 1), j1 + e < T);
                mbar_arrive_cp_async(&full[st]);
            }
        }
        return;
    }

    // consumers
    setmaxnreg_inc<240>();
    int cw = wg - 1, cwarp = warp - 4, g = lane / 4, tq = lane % 4;
    int i0w = i0 + 64 * cw;  // this consumer's first query
    int r0 = i0 + cwarp * 16 + g, r1 = r0 + 8;
    float rl[2], rd[2], rc[2];  // lse in log2 units, Delta, c of this thread's rows
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = r ? r1 : r0;
        bool ok = row < T;
        rl[r] = ok ? lse[(size_t)bh * T + row] * LOG2E : 0.f;
        rd[r] = ok ? delta[(size_t)bh * T + row] : 0.f;
        rc[r] = (GATE && ok) ? cb[row] : 0.f;
    }
    float dqa[HD / 2], rs[2] = {0.f, 0.f};  // rs: row sums of dS
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) dqa[e] = 0.f;
    uint32_t sa[BC / 16][4];  // A fragments of dS
    mbar_wait(barQ, 0);

    for (int n = 0; n < ntiles; n++) {
        int st = n % ST, j0 = (jt_begin + n) * BC;
        mbar_wait(&full[st], (n / ST) & 1);
        // every key of the tile after this consumer's last query, or before the window of its first one: P = 0
        bool seen = j0 <= i0w + 63 && !(window > 0 && i0w - (j0 + BC - 1) >= window);
        if (seen) {
            const bf16 *sKb = sK + st * BC * HD, *sVb = sV + st * BC * HD;
            const float* sCb = sC + st * BC;
            float s[BC / 2], dp[BC / 2];
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                wgmma_ss<BC>(s, desc_k<BR>(sQ, cw * 8, kk), desc_k<BC>(sKb, 0, kk), kk);
            wgmma_commit();
            #pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                wgmma_ss<BC>(dp, desc_k<BR>(sG, cw * 8, kk), desc_k<BC>(sVb, 0, kk), kk);
            wgmma_commit();
            wgmma_wait<1>();  // S done; P's exponentials overlap the dP matmul
            wgmma_pin<BC / 2>(s);
            bool need_mask = (j0 + BC - 1 > i0w) || (j0 + BC > T) || (window > 0 && j0 <= i0w + 63 - window);
            #pragma unroll
            for (int nt = 0; nt < BC / 8; nt++) {
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    int jl = nt * 8 + 2 * tq + (e & 1);
                    float x = fmaf(s[nt * 4 + e], scale_log2, -rl[e / 2]);
                    if (GATE) x = fmaf(rc[e / 2] - sCb[jl], LOG2E, x);
                    float p = ex2_ftz(x);  // one MUFU.EX2; P's denormals are 0
                    if (need_mask) {
                        int j = j0 + jl;
                        if (j >= T || !fox_visible(e < 2 ? r0 : r1, j, window)) p = 0.f;
                    }
                    s[nt * 4 + e] = p;
                }
            }
            wgmma_wait0();
            wgmma_pin<BC / 2>(dp);
            #pragma unroll
            for (int nt = 0; nt < BC / 8; nt++) {
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    float ds = s[nt * 4 + e] * (dp[nt * 4 + e] - rd[e / 2]);
                    s[nt * 4 + e] = ds;
                    rs[e / 2] += ds;
                }
            }
            // dQ += dS K
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) acc_to_a(sa[kk], s + 8 * kk, s + 8 * kk + 4);
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(dqa, sa[kk], desc_mn<BC>(sKb, kk), 1);
            wgmma_commit();
            wgmma_wait0();
            wgmma_pin<HD / 2>(dqa); wgmma_pin_a<BC / 16>(sa);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]);  // this warp is done with the stage's K, V and c
    }

    int rows[2] = {r0, r1};
    store_dq<HD, GATE>(dq + (size_t)b * T * stride_qkv + (size_t)h * HD, dc_row + (size_t)bh * T, dqa, rs, rows, tq, T,
                       stride_qkv, scale);
}


// ----------------------------------------------------------------------------
// Version 12: version 9's two kernels (same blocks, producer warp, rings, barriers, tile order and
// order of every reduction; the logits round differently) with less issue work per tile for the
// consumers, which at hd 64 were latency-bound on their own instruction stream (ncu of version 9 at
// 1 x 12 x 16384 x 64: BSSY/BSYNC/BRA 16-21% of the executed instructions and 37-43% of the stall
// samples, R2UR and integer address work ~15%; version 12 executes 33-34% fewer instructions):
// - masks without branches: version 9 tested every score (`if (need_mask) { if (i >= T ||
//   !visible) p = 0; }`), two branches per score in the PTX that cut the exponential loop into
//   basic blocks ptxas cannot schedule across; here a tile runs one of two straight-line loops and
//   the masked one selects against two integer bounds per row (as forward version 9);
// - descriptors computed once: version 9 built both 64-bit descriptors of each wgmma from the
//   address (~10 integer instructions each, 16 wgmma's a tile in each kernel); here each tile's
//   start is computed once per kernel, warp-uniform (the consumer index goes through a shuffle, so
//   the descriptors can live in uniform registers), and a k step or a stage adds a constant to the
//   address field (train_fox.cu's desc_add, kstep_bytes, mnstep_bytes);
// - gate terms per column and row, not per score: P = 2^(s scale log2 e + (A_i + B_j)) with a query
//   term A_i and a key term B_j relative to c_b, the c of the first key of j's 128-key block
//   (v12_qterm, v12_kterm): one FADD and one FFMA per score. Both kernels form these with the same
//   operations, so they see the same P and dS bits and the row and column sums of dc cancel
//   exactly, as in version 9 (the first form of version 12 used a reference per thread, different
//   in the two kernels: dlogf_0 grew up to 10x and a window-1 test of test_fox, whose dlogf is
//   exactly 0, saw 4e-12). Precision: c_b log2 e is rounded once and cancels exactly in A_i + B_j;
//   A_i and B_j are each rounded once at the magnitude of (c_i - c_b) and (c_b - c_j) log2 e, which
//   for a weight that matters spans the block's decay (127 |log f| log2 e, ~900 at log f = -5: an
//   error of ~6e-5 in log2 units, far below bf16's rounding of P).
// No turns (archived version 11's ping-pong): with these consumers they cost at hd 128 too (3-7%).
// train_fox.cu's kernels (versions 20 and 22) grew from these two.

// The logit of (query i, key j) in log2 units, computed with the same operations in both kernels:
// with cb_l2 = c_b log2 e, a query term A_i = (c_i log2 e - cb_l2) - lse_i log2 e and a key term
// B_j = cb_l2 - c_j log2 e (each one FFMA from exact products: cb_l2's rounding cancels in
// A_i + B_j), x = s scale_log2 + (A_i + B_j). Without gate A_i = -lse_i log2 e, B_j = 0.
// Intrinsics: no FMA contraction may differ between the kernels.
__device__ __forceinline__ float v12_qterm(float c_i, float lse_i, float cb_l2, bool gate) {
    float l2 = __fmul_rn(lse_i, LOG2E);
    return gate ? __fsub_rn(fmaf(c_i, LOG2E, -cb_l2), l2) : -l2;
}
__device__ __forceinline__ float v12_kterm(float c_j, float cb_l2) { return fmaf(-c_j, LOG2E, cb_l2); }

// P in place for one warp's 16 rows x N columns of a tile in the accumulator layout (a thread:
// rows g, g + 8; columns 2 tq, 2 tq + 1 of each 8-column block nt): p = 2^(s scale_log2 + t) with
// t = A + B, the rows' terms `rt` and the columns' `col(ct, nt)`. ROWQ: the rows are queries (the
// dQ kernel: rt = A, ct = B), else keys (dK/dV: P^T, rt = B, ct = A); either way the same FADD,
// A first. MASK: p = 0 where the column offset (less 2 tq) is outside [lo, hi] of its row
// (selected, never multiplied).
template<int N, bool GATE, bool MASK, bool ROWQ, class Col>
__device__ __forceinline__ void v12_probs(float* s, const float rt[2], Col col, float scale_log2, const int* lo,
                                          const int* hi) {
    #pragma unroll
    for (int nt = 0; nt < N / 8; nt++) {
        float ct[2];
        col(ct, nt);
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            float a = ROWQ ? rt[e / 2] : ct[e & 1], b = ROWQ ? ct[e & 1] : rt[e / 2];
            int kc = nt * 8 + (e & 1);  // compile-time: the bounds carry the thread's 2 tq
            float p = ex2_ftz(fmaf(s[nt * 4 + e], scale_log2, GATE ? __fadd_rn(a, b) : a));  // denormals 0
            s[nt * 4 + e] = MASK && (kc < lo[e / 2] || kc > hi[e / 2]) ? 0.f : p;
        }
    }
}
// The first two matmuls of a tile, both operands K-major (K = HD), in two commit groups (so that P's
// exponentials run under the second): s = A B^T, dp = C D^T, with A, C the consumer's fixed 64 rows
// (of a ROWS-row tile, descriptors dA, dC) and B, D the streamed N-row tile at stage offset so.
// dK/dV: S^T = K Q^T, dP^T = V dO^T; dQ: S = Q K^T, dP = dO V^T.
template<int HD, int ROWS, int N>
__device__ __forceinline__ void v12_two_ss(float* s, float* dp, uint64_t dA, uint64_t dC, uint64_t dB, uint64_t dD,
                                           uint32_t so) {
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_ss<N>(s, desc_add(dA, kstep_bytes<ROWS>(kk)), desc_add(dB, so + kstep_bytes<N>(kk)), kk);
    wgmma_commit();
    #pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_ss<N>(dp, desc_add(dC, kstep_bytes<ROWS>(kk)), desc_add(dD, so + kstep_bytes<N>(kk)), kk);
    wgmma_commit();
}
// dQ: dS = P (dP - Delta) in place of P, Delta of the thread's rows; rs: the rows' sums of dS
template<int BC>
__device__ __forceinline__ void v12_ds_rows(float* s, const float* dp, const float rd[2], float rs[2]) {
    #pragma unroll
    for (int i = 0; i < BC / 2; i++) {
        float ds = s[i] * (dp[i] - rd[(i / 2) & 1]);
        s[i] = ds;
        rs[(i / 2) & 1] += ds;
    }
}
// dK/dV: dS^T = P^T (dP^T - Delta) in place of dP^T, Delta of the columns (queries) from the stage
// (sDb); dcs: the rows' (keys') sums of dS
template<int BQ>
__device__ __forceinline__ void v12_ds_cols(float* dp, const float* s, const float* sDb, float dcs[2], int tq) {
    #pragma unroll
    for (int nt = 0; nt < BQ / 8; nt++) {
        float2 d2 = *(const float2*)(sDb + nt * 8 + 2 * tq);
        const float d[2] = {d2.x, d2.y};
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            dp[nt * 4 + e] = s[nt * 4 + e] * (dp[nt * 4 + e] - d[e & 1]);
            dcs[e / 2] += dp[nt * 4 + e];
        }
    }
}
// dk, dv and the dc column sums of the 128-key tile blockIdx.x; consumer cw owns keys 64cw..+63
// (a warp 16 of them). Query tiles of BQ stream through the ring. query_end (B*H, ceil(T / 128)):
// query tiles of 128 from query_end on are pruned (NULL: none).
template<int HD, int BQ, int ST, bool GATE>
__global__ void __launch_bounds__(384, 1) fox_backward_dkdv_kernel12(bf16* dk, bf16* dv, float* dc,
                                                                     const __grid_constant__ CUtensorMap tmQ,
                                                                     const __grid_constant__ CUtensorMap tmG,
                                                                     const __grid_constant__ CUtensorMap tmK,
                                                                     const __grid_constant__ CUtensorMap tmV,
                                                                     const float* lse, const float* delta,
                                                                     const float* c, int T, int H, int stride_qkv,
                                                                     int window, float scale_log2, float scale,
                                                                     const int* query_end) {
    constexpr int BK = 128;
    static_assert(BK == PRUNE_BLOCK && PRUNE_BLOCK % BQ == 0 && BQ % 32 == 0, "a key tile is one pruning tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sK = (bf16*)smem_1k(smem_raw);     // (BK, HD) swizzled tiles
    bf16* sV = sK + BK * HD;                 // (BK, HD)
    bf16* sQ = sV + BK * HD;                 // (ST, BQ, HD)
    bf16* sG = sQ + ST * BQ * HD;            // (ST, BQ, HD) dO
    float* sL = (float*)(sG + ST * BQ * HD); // (ST, BQ) lse
    float* sD = sL + ST * BQ;                // (ST, BQ) Delta
    float* sC = sD + ST * BQ;                // (ST, BQ) c of the queries
    uint64_t* bar = (uint64_t*)(sC + ST * BQ);
    uint64_t *barKV = bar, *full = bar + 1, *empty = full + ST;

    int kt = blockIdx.x;  // the first key tiles see the most queries and are scheduled first
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    const float *lb = lse + (size_t)bh * T, *db = delta + (size_t)bh * T;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int j0 = kt * BK;
    int i_end = window > 0 ? min(T, j0 + BK - 1 + window) : T;  // last query that sees the tile, +1
    int it_begin = j0 / BQ, it_end = (i_end + BQ - 1) / BQ;
    // pruned query tiles are never loaded (the diagonal one is kept, so it_begin < it_end)
    if (query_end) it_end = min(it_end, query_end[(size_t)bh * gridDim.x + kt] * (PRUNE_BLOCK / BQ));
    int ntiles = it_end - it_begin;

    // full: the copy engine's arrival + the 32 lanes' lse, Delta, c; empty: a warp of the consumers each
    fox_ring_init<ST>(barKV, full, empty, 1 + 32, 8);

    if (wg == 0) {  // producer
        setmaxnreg_dec<24>();
        if (warp != 0) return;
        if (lane == 0) {
            mbar_expect_tx(barKV, 2 * BK * HD * sizeof(bf16));
            tma_load_tile<BK, HD>(sK, &tmK, j0, h, b, barKV);
            tma_load_tile<BK, HD>(sV, &tmV, j0, h, b, barKV);
        }
        for (int n = 0; n < ntiles; n++) {
            int st = n % ST, i1 = (it_begin + n) * BQ;
            mbar_wait(&empty[st], ((n / ST) & 1) ^ 1);
            if (lane == 0) {
                mbar_expect_tx(&full[st], 2 * BQ * HD * sizeof(bf16));
                tma_load_tile<BQ, HD>(sQ + st * BQ * HD, &tmQ, i1, h, b, &full[st]);
                tma_load_tile<BQ, HD>(sG + st * BQ * HD, &tmG, i1, h, b, &full[st]);
            }
            #pragma unroll
            for (int e = lane; e < BQ; e += 32) {  // past T: zeros
                int i = min(i1 + e, T - 1);
                bool ok = i1 + e < T;
                cp_async4(sL + st * BQ + e, lb + i, ok);
                cp_async4(sD + st * BQ + e, db + i, ok);
                if (GATE) cp_async4(sC + st * BQ + e, cb + i, ok);
            }
            mbar_arrive_cp_async(&full[st]);
        }
        return;
    }

    // consumers
    setmaxnreg_inc<240>();
    int cw = __shfl_sync(0xffffffff, wg - 1, 0);  // warp-uniform, so are the descriptors below
    int cwarp = warp - 4, g = lane / 4, tq = lane % 4;
    int j0w = j0 + 64 * cw;  // this consumer's first key
    int keys[2];
    int lo0[2], hi0[2];  // mask bounds: visible query offsets (less 2 tq) from query 0
    float cj[2];  // the keys' c
    float dcs[2] = {0.f, 0.f};  // the keys' sums of dS
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        keys[r] = j0 + cwarp * 16 + g + 8 * r;
        cj[r] = (GATE && keys[r] < T) ? cb[keys[r]] : 0.f;
        lo0[r] = keys[r] - 2 * tq;
        hi0[r] = (window > 0 ? min(T - 1, keys[r] + window - 1) : T - 1) - 2 * tq;
    }
    float cb_l2 = GATE ? __fmul_rn(cb[j0], LOG2E) : 0.f;  // c of the block's first key, log2 units
    float B[2] = {v12_kterm(cj[0], cb_l2), v12_kterm(cj[1], cb_l2)};  // the rows' key terms
    float dka[HD / 2], dva[HD / 2];
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) dka[e] = dva[e] = 0.f;
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];  // A fragments of P^T, dS^T
    // descriptors of k step 0: K, V (this consumer's 64 rows); Q, dO of stage 0 as K-major (S^T, dP^T)
    // and N-major (dK, dV) operands; a stage is BQ * HD * 2 bytes further
    const uint64_t dK0 = desc_k<BK>(sK, cw * 8, 0), dV0 = desc_k<BK>(sV, cw * 8, 0);
    const uint64_t dQ0 = desc_k<BQ>(sQ, 0, 0), dG0 = desc_k<BQ>(sG, 0, 0);
    const uint64_t dQn0 = desc_mn<BQ>(sQ, 0), dGn0 = desc_mn<BQ>(sG, 0);
    constexpr uint32_t STAGE = BQ * HD * sizeof(bf16);
    auto release = [&](int st) {  // this warp is done with the stage's Q, dO and floats
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]);
    };
    mbar_wait(barKV, 0);

    for (int n = 0; n < ntiles; n++) {
        int st = n % ST, i0 = (it_begin + n) * BQ;
        mbar_wait(&full[st], (n / ST) & 1);
        // every query of the tile before this consumer's first key, or past the window of its last one: P = 0
        bool seen = i0 + BQ > j0w && !(window > 0 && i0 - (j0w + 63) >= window);
        if (seen) {
            const float *sLb = sL + st * BQ, *sDb = sD + st * BQ, *sCb = sC + st * BQ;
            uint32_t so = st * STAGE;
            // S^T = K Q^T and dP^T = V dO^T: (64 keys, BQ queries), two commit groups
            float s[BQ / 2], dp[BQ / 2];
            v12_two_ss<HD, BK, BQ>(s, dp, dK0, dV0, dQ0, dG0, so);
            wgmma_wait<1>();
            wgmma_pin<BQ / 2>(s);
            // P^T in place from the columns' (queries') terms A_i; the tiles that touch the diagonal,
            // the window's edge or T are masked
            auto qterms = [&](float a[2], int nt) {
                float2 l = *(const float2*)(sLb + nt * 8 + 2 * tq);
                float2 ci = GATE ? *(const float2*)(sCb + nt * 8 + 2 * tq) : make_float2(0.f, 0.f);
                a[0] = v12_qterm(ci.x, l.x, cb_l2, GATE);
                a[1] = v12_qterm(ci.y, l.y, cb_l2, GATE);
            };
            if ((i0 < j0w + 63) || (i0 + BQ > T) || (window > 0 && i0 + BQ - 1 - j0w >= window)) {
                int lo[2] = {lo0[0] - i0, lo0[1] - i0}, hi[2] = {hi0[0] - i0, hi0[1] - i0};
                v12_probs<BQ, GATE, true, false>(s, B, qterms, scale_log2, lo, hi);
            } else {
                v12_probs<BQ, GATE, false, false>(s, B, qterms, scale_log2, nullptr, nullptr);
            }
            // dV += P^T dO
            #pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) acc_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(dva, pa[kk], desc_add(dGn0, so + mnstep_bytes(kk)), 1);
            wgmma_commit();
            wgmma_wait<1>();  // dP^T done (dV may still run)
            wgmma_pin<BQ / 2>(dp);
            v12_ds_cols<BQ>(dp, s, sDb, dcs, tq);
            // dK += dS^T Q
            #pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) acc_to_a(sa[kk], dp + 8 * kk, dp + 8 * kk + 4);
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(dka, sa[kk], desc_add(dQn0, so + mnstep_bytes(kk)), 1);
            wgmma_commit();
            wgmma_wait0();
            wgmma_pin<HD / 2>(dva); wgmma_pin<HD / 2>(dka);
            wgmma_pin_a<BQ / 16>(pa); wgmma_pin_a<BQ / 16>(sa);
            release(st);
        } else {
            release(st);  // nothing seen: every consumer warp arrives once per stage all the same
        }
    }

    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    store_dkdv<HD, GATE>(dk + base, dv + base, dc + (size_t)bh * T, dka, dva, dcs, keys, tq, T, stride_qkv, scale);
}

// dq and the dc row sums of the 128-query tile gridDim.x - 1 - blockIdx.x; consumer cw owns queries
// 64cw..+63. Key tiles of BC (with the keys' c) stream through the ring. key_start (B*H,
// ceil(T / 128)): the key tiles of 128 before key_start are pruned (NULL: none).
template<int HD, int BC, int ST, bool GATE>
__global__ void __launch_bounds__(384, 1) fox_backward_dq_kernel12(bf16* dq, float* dc_row,
                                                                   const __grid_constant__ CUtensorMap tmQ,
                                                                   const __grid_constant__ CUtensorMap tmG,
                                                                   const __grid_constant__ CUtensorMap tmK,
                                                                   const __grid_constant__ CUtensorMap tmV,
                                                                   const float* lse, const float* delta, const float* c,
                                                                   int T, int H, int stride_qkv, int window,
                                                                   float scale_log2, float scale,
                                                                   const int* key_start) {
    constexpr int BR = 128;
    static_assert(BR == PRUNE_BLOCK && PRUNE_BLOCK % BC == 0, "a query tile is one pruning tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_1k(smem_raw);     // (BR, HD) swizzled tiles
    bf16* sG = sQ + BR * HD;                 // (BR, HD) dO
    bf16* sK = sG + BR * HD;                 // (ST, BC, HD)
    bf16* sV = sK + ST * BC * HD;            // (ST, BC, HD)
    float* sC = (float*)(sV + ST * BC * HD); // (ST, BC) c of the keys
    uint64_t* bar = (uint64_t*)(sC + ST * BC);
    uint64_t *barQ = bar, *full = bar + 1, *empty = full + ST;

    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0;
    int jt_begin = j_begin / BC, jt_end = (min(T, i0 + BR) + BC - 1) / BC;
    // pruned key tiles are never loaded (never the diagonal one, so jt_begin < jt_end)
    if (key_start) jt_begin = max(jt_begin, key_start[(size_t)bh * gridDim.x + qt] * (PRUNE_BLOCK / BC));
    int ntiles = jt_end - jt_begin;

    // full: the copy engine's arrival + the 32 c lanes; empty: a warp of the consumers each
    fox_ring_init<ST>(barQ, full, empty, 1 + (GATE ? 32 : 0), 8);

    if (wg == 0) {  // producer
        setmaxnreg_dec<24>();
        if (warp != 0) return;
        if (lane == 0) {
            mbar_expect_tx(barQ, 2 * BR * HD * sizeof(bf16));
            tma_load_tile<BR, HD>(sQ, &tmQ, i0, h, b, barQ);
            tma_load_tile<BR, HD>(sG, &tmG, i0, h, b, barQ);
        }
        for (int n = 0; n < ntiles; n++) {
            int st = n % ST, j1 = (jt_begin + n) * BC;
            mbar_wait(&empty[st], ((n / ST) & 1) ^ 1);
            if (lane == 0) {
                mbar_expect_tx(&full[st], 2 * BC * HD * sizeof(bf16));
                tma_load_tile<BC, HD>(sK + st * BC * HD, &tmK, j1, h, b, &full[st]);
                tma_load_tile<BC, HD>(sV + st * BC * HD, &tmV, j1, h, b, &full[st]);
            }
            if (GATE) {
                #pragma unroll
                for (int e = lane; e < BC; e += 32) cp_async4(sC + st * BC + e, cb + min(j1 + e, T - 1), j1 + e < T);
                mbar_arrive_cp_async(&full[st]);
            }
        }
        return;
    }

    // consumers
    setmaxnreg_inc<240>();
    int cw = __shfl_sync(0xffffffff, wg - 1, 0);  // warp-uniform, so are the descriptors below
    int cwarp = warp - 4, g = lane / 4, tq = lane % 4;
    int i0w = i0 + 64 * cw;  // this consumer's first query
    int rows[2] = {i0 + cwarp * 16 + g, i0 + cwarp * 16 + g + 8};
    float rl[2], rd[2], rc[2];  // lse, Delta, c of this thread's rows
    int lo0[2], hi0[2];  // mask bounds: visible key offsets (less 2 tq) from key 0
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = rows[r];
        bool ok = row < T;
        rl[r] = ok ? lse[(size_t)bh * T + row] : 0.f;
        rd[r] = ok ? delta[(size_t)bh * T + row] : 0.f;
        rc[r] = GATE ? cb[min(row, T - 1)] : 0.f;  // past T: a finite logit (its Q, dO rows are 0)
        hi0[r] = min(row, T - 1) - 2 * tq;
        lo0[r] = (window > 0 ? row - window + 1 : -BC) - 2 * tq;  // -BC: below every tile offset
    }
    float dqa[HD / 2], rs[2] = {0.f, 0.f};  // rs: row sums of dS
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) dqa[e] = 0.f;
    uint32_t sa[BC / 16][4];  // A fragments of dS
    // descriptors of k step 0: Q, dO (this consumer's 64 rows); K, V of stage 0 as K-major (S, dP)
    // and K as N-major (dQ) operands; a stage is BC * HD * 2 bytes further
    const uint64_t dQ0 = desc_k<BR>(sQ, cw * 8, 0), dG0 = desc_k<BR>(sG, cw * 8, 0);
    const uint64_t dK0 = desc_k<BC>(sK, 0, 0), dV0 = desc_k<BC>(sV, 0, 0);
    const uint64_t dKn0 = desc_mn<BC>(sK, 0);
    constexpr uint32_t STAGE = BC * HD * sizeof(bf16);
    auto release = [&](int st) {  // this warp is done with the stage's K, V and c
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]);
    };
    mbar_wait(barQ, 0);

    for (int n = 0; n < ntiles; n++) {
        int st = n % ST, j0 = (jt_begin + n) * BC;
        mbar_wait(&full[st], (n / ST) & 1);
        // all of this consumer's queries past T, every key of the tile after its last query, or before
        // the window of its first one: P = 0
        bool seen = i0w < T && j0 <= i0w + 63 && !(window > 0 && i0w - (j0 + BC - 1) >= window);
        if (seen) {
            const float* sCb = sC + st * BC;
            uint32_t so = st * STAGE;
            // c of the first key of the tile's 128-key block (the tile's own first key at BC = 128)
            float cb_l2 = GATE ? __fmul_rn((j0 % PRUNE_BLOCK) ? cb[j0 - j0 % PRUNE_BLOCK] : sCb[0], LOG2E) : 0.f;
            float A[2] = {v12_qterm(rc[0], rl[0], cb_l2, GATE), v12_qterm(rc[1], rl[1], cb_l2, GATE)};
            float s[BC / 2], dp[BC / 2];
            v12_two_ss<HD, BR, BC>(s, dp, dQ0, dG0, dK0, dV0, so);
            wgmma_wait<1>();  // S done; P's exponentials overlap the dP matmul
            wgmma_pin<BC / 2>(s);
            auto kterms = [&](float b[2], int nt) {  // the columns' (keys') terms B_j
                float2 cj = GATE ? *(const float2*)(sCb + nt * 8 + 2 * tq) : make_float2(0.f, 0.f);
                b[0] = v12_kterm(cj.x, cb_l2);
                b[1] = v12_kterm(cj.y, cb_l2);
            };
            if ((j0 + BC - 1 > i0w) || (j0 + BC > T) || (window > 0 && j0 <= i0w + 63 - window)) {
                int lo[2] = {lo0[0] - j0, lo0[1] - j0}, hi[2] = {hi0[0] - j0, hi0[1] - j0};
                v12_probs<BC, GATE, true, true>(s, A, kterms, scale_log2, lo, hi);
            } else {
                v12_probs<BC, GATE, false, true>(s, A, kterms, scale_log2, nullptr, nullptr);
            }
            wgmma_wait0();
            wgmma_pin<BC / 2>(dp);
            v12_ds_rows<BC>(s, dp, rd, rs);
            // dQ += dS K
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) acc_to_a(sa[kk], s + 8 * kk, s + 8 * kk + 4);
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(dqa, sa[kk], desc_add(dKn0, so + mnstep_bytes(kk)), 1);
            wgmma_commit();
            wgmma_wait0();
            wgmma_pin<HD / 2>(dqa); wgmma_pin_a<BC / 16>(sa);
            release(st);
        } else {
            release(st);  // nothing seen: every consumer warp arrives once per stage all the same
        }
    }

    store_dq<HD, GATE>(dq + (size_t)b * T * stride_qkv + (size_t)h * HD, dc_row + (size_t)bh * T, dqa, rs, rows, tq, T,
                       stride_qkv, scale);
}

// The launch of versions 9 and 12, whose kernels share their blocks and shared memory: the fixed
// 128-row tiles, ST = 2 stages of the streamed tiles (dK/dV: BQ = 64 queries; dQ: BC = 128 keys at
// hd 64, 64 at hd 128) and their floats, the barriers, + 1 KB to align the tiles to the swizzle
// pattern. tables: (2, B*H, ceil(T / 128)) ints, key_start then query_end, as train_fox.cu's
// fox_prune_tables (NULL: dense; needs c).
static void fox_backward9(const BwdArgs& a, int version) {
    bwd_frame(a, [&](float* dc, float* dc_row, const float* delta) {
        by_shape(a.hd, a.c, [&](auto HD, auto GATE) {
            constexpr int BQ = 64, BC = HD == 64 ? 128 : 64, ST = 2;
            constexpr size_t smem_kv = 1024 + (size_t)(2 * 128 + 2 * ST * BQ) * HD * sizeof(bf16) +
                                       3 * ST * BQ * sizeof(float) + (1 + 2 * ST) * sizeof(uint64_t);
            constexpr size_t smem_q = 1024 + (size_t)(2 * 128 + 2 * ST * BC) * HD * sizeof(bf16) +
                                      ST * BC * sizeof(float) + (1 + 2 * ST) * sizeof(uint64_t);
            auto kv = version == 9 ? fox_backward_dkdv_kernel9<HD, BQ, ST, GATE>
                                   : fox_backward_dkdv_kernel12<HD, BQ, ST, GATE>;
            auto kq = version == 9 ? fox_backward_dq_kernel9<HD, BC, ST, GATE>
                                   : fox_backward_dq_kernel12<HD, BC, ST, GATE>;
            cudaCheck(cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
            cudaCheck(cudaFuncSetAttribute(kq, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
            float scale = 1.0f / sqrtf((float)HD), scale_log2 = scale * LOG2E;
            int nt = ceil_div(a.T, PRUNE_BLOCK), BH = a.B * a.H;
            const int* key_start = GATE ? a.tables : nullptr;
            const int* query_end = GATE && a.tables ? a.tables + (size_t)BH * nt : nullptr;
            // the dK/dV kernel streams Q, dO in tiles of BQ rows; the dQ kernel holds 128 of them
            CUtensorMap tq = fox_tensor_map(a.q, a.B, a.T, a.H, HD, a.stride_qkv, BQ),
                        tg = fox_tensor_map(a.dout, a.B, a.T, a.H, HD, a.stride_o, BQ),
                        tk = fox_tensor_map(a.k, a.B, a.T, a.H, HD, a.stride_qkv, 128),
                        tv = fox_tensor_map(a.v, a.B, a.T, a.H, HD, a.stride_qkv, 128);
            kv<<<dim3(nt, BH), 384, smem_kv>>>(a.dk, a.dv, dc, tq, tg, tk, tv, a.lse, delta, a.c, a.T, a.H,
                                                a.stride_qkv, a.window, scale_log2, scale, query_end);
            launchCheck();
            tq = fox_tensor_map(a.q, a.B, a.T, a.H, HD, a.stride_qkv, 128);
            tg = fox_tensor_map(a.dout, a.B, a.T, a.H, HD, a.stride_o, 128);
            tk = fox_tensor_map(a.k, a.B, a.T, a.H, HD, a.stride_qkv, BC);
            tv = fox_tensor_map(a.v, a.B, a.T, a.H, HD, a.stride_qkv, BC);
            kq<<<dim3(nt, BH), 384, smem_q>>>(a.dq, dc_row, tq, tg, tk, tv, a.lse, delta, a.c, a.T, a.H, a.stride_qkv,
                                               a.window, scale_log2, scale, key_start);
            launchCheck();
        });
    });
}

// ----------------------------------------------------------------------------
// the ladder

static const std::vector<int> BWD_KEPT = {1, 2, 3, 5, 6, 9, 12, 20};

// tables: the pruning tables of versions 9-20 (NULL: dense)
static void run_backward(int version, const FoxProblem& p, const FoxDev& d, const int* tables = nullptr) {
    BwdArgs a = {d.dqkv + p.q_off, d.dqkv + p.k_off, d.dqkv + p.v_off, p.gate ? d.dlogf : nullptr, d.scratch, d.dout,
                 d.qkv + p.q_off, d.qkv + p.k_off, d.qkv + p.v_off, d.o, d.lse, d.c,
                 p.B, p.T, p.H, p.hd, p.stride_qkv, p.stride_o, p.window, p.gate ? tables : nullptr};
    switch (version) {
        case 1: fox_backward1<float, bf16, float, bf16>(a.dq, a.dk, a.dv, a.dlogf, a.scratch, a.dout, a.q, a.k, a.v,
                                                        a.o, a.lse, a.c, a.B, a.T, a.H, a.hd, a.stride_qkv, a.stride_o,
                                                        a.stride_o, a.stride_qkv, a.window); break;
        case 2: fox_backward2<1>(a); break;
        case 3: fox_backward2<2>(a); break;
        case 5: fox_backward5<1>(a); break;
        case 6: fox_backward5<2>(a); break;
        case 9: case 12: fox_backward9(a, version); break;
        // train_fox.cu's backward, exactly as it trains: version 20 at hd 64, 22 at hd 128
        case 20: fox_attention_backward(a.dq, a.dk, a.dv, a.dlogf, a.scratch, a.dout, a.q, a.k, a.v, a.o, a.lse, a.c,
                                        a.B, a.T, a.H, a.hd, a.stride_qkv, a.stride_o, a.window, a.tables, 0, nullptr,
                                        0); break;
        default: fprintf(stderr, "version %d is not in this ladder\nHINT: see dev/cuda/README.md\n", version);
                 exit(EXIT_FAILURE);
    }
}
// the forward the backward versions are checked and timed with: train_fox.cu's (key_start: the pruning tables)
static void run_fwd(const FoxProblem& p, const FoxDev& d, const int* key_start = nullptr) {
    fox_attention_forward(d.o, d.lse, d.qkv + p.q_off, d.qkv + p.k_off, d.qkv + p.v_off, d.c,
                          p.B, p.T, p.H, p.hd, p.stride_qkv, p.stride_o, p.window, key_start, nullptr, 0);
}

// references: dq, dk, dv (B, T, H, hd) compact, dlogf (B, H, T), all double. dq, dk, dv, dlogf in
// bf16/fp32 against fp64: tolerance 1e-2 relative L2 (TOL_BF16, common.h); dS is rounded to bf16
// before dS K and dS^T Q, adding ~2e-3 rms.
static bool check_backward(const FoxProblem& p, const FoxDev& d, const double* dq, const double* dk, const double* dv,
                           const double* dlogf, double tol_dqdk = TOL_BF16) {
    std::vector<bf16> g = d2h(d.dqkv, p.n_qkv);
    size_t C = (size_t)p.H * p.hd, n = (size_t)p.B * p.T * C;
    bool ok = true;
    const char* names[3] = {"dq", "dk", "dv"};
    const double* refs[3] = {dq, dk, dv};
    size_t offs[3] = {p.q_off, p.k_off, p.v_off};
    for (int x = 0; x < 3; x++) {
        ErrStat st = compare(n, [&](size_t e, double* gg, double* rr) {
            size_t bt = e / C, y = e % C;
            *gg = __bfloat162float(g[offs[x] + bt * p.stride_qkv + y]); *rr = refs[x][e];
        });
        ok &= report(names[x], st, x < 2 ? tol_dqdk : TOL_BF16);
    }
    if (p.gate) {
        std::vector<float> lf = d2h(d.dlogf, p.n_bht);
        ErrStat st = compare(p.n_bht, [&](size_t e, double* gg, double* rr) { *gg = lf[e]; *rr = dlogf[e]; });
        ok &= report("dlogf", st, TOL_BF16);
        // free check: dlogf_0 = sum of all dc = 0 (row and column sums of the same dS), up to the
        // fp32 rounding of those sums: 1e-3 of the gradient's scale
        double worst = 0, scale = 0;
        for (size_t e = 0; e < p.n_bht; e++) scale = std::max(scale, fabs(dlogf[e]));
        for (int bh = 0; bh < p.B * p.H; bh++) worst = std::max(worst, fabs((double)lf[(size_t)bh * p.T]));
        bool z = worst <= 1e-3 * scale + 1e-6;
        printf("    dlogf_0 max |.| %.3e vs max |dlogf| %.3e (tol 1e-3 relative) %s\n", worst, scale,
               z ? "ok" : "FAIL");
        ok &= z;
    }
    return ok;
}

// poisoned outputs, one run of `version`, the check against the references
static bool run_and_check(int version, const FoxProblem& p, const FoxDev& d, const double* ref_dq,
                          const double* ref_dk, const double* ref_dv, const double* ref_dlogf,
                          const int* tables = nullptr, double tol_dqdk = TOL_BF16) {
    poison(d.dqkv, p.n_qkv); poison(d.dlogf, p.n_bht); poison(d.scratch, 3 * p.n_bht);
    printf("  version %d\n", version);  // before the run: a hang is named
    run_backward(version, p, d, tables);
    sync_or_exit("the version above", 120);
    return check_backward(p, d, ref_dq, ref_dk, ref_dv, ref_dlogf, tol_dqdk);
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // line by line into a log too: a hung version shows where
    if (argc > 1 && atoi(argv[1]) == 22) argv[1] = (char*)"20";  // 22: version 20's call at hd 128
    std::vector<int> vers = pick_versions(argc, argv, BWD_KEPT);
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    bool all_ok = true;           // the references
    std::vector<bool> vok(64, true);  // per version: only those that pass are timed

    if (argc > 3 && strcmp(argv[3], "profile") == 0) {  // one backward per version and timing shape, for ncu
        for (const auto& sh : BENCH_SHAPES) {
            FoxProblem p = make_problem(sh[0], sh[2], sh[1], sh[3], 0, false, 0.05);
            FoxDev d = upload(p, true);
            run_fwd(p, d);
            for (int ver : vers) run_backward(ver, p, d);
            cudaCheck(cudaDeviceSynchronize());
            release(d);
        }
        printf("profile runs done\n");
        return 0;
    }

    // 1. small shapes against the fp64 CPU reference
    for (const SmallCase& cf : SMALL_CASES) {
        FoxProblem p = make_problem(cf.B, cf.T, cf.H, cf.hd, cf.window, cf.packed, cf.gate, cf.o_pad);
        size_t n = (size_t)p.B * p.T * p.H * p.hd;
        std::vector<double> dq(n), dk(n), dv(n), dlogf(p.n_bht);
        fox_backward_cpu(dq.data(), dk.data(), dv.data(), dlogf.data(), p.doutf.data(), p.stride_o,
                         p.qkvf.data() + p.q_off, p.qkvf.data() + p.k_off, p.qkvf.data() + p.v_off,
                         p.gate ? p.c.data() : nullptr, p.B, p.T, p.H, p.hd, p.stride_qkv, p.window);
        FoxDev d = upload(p, true);
        run_fwd(p, d);
        printf("B=%d T=%d H=%d hd=%d window=%d packed=%d gate=%s\n", p.B, p.T, p.H, p.hd, p.window, (int)p.packed,
               p.gate ? "yes" : "none");
        for (int ver : vers)
            vok[ver] = vok[ver] & run_and_check(ver, p, d, dq.data(), dk.data(), dv.data(), dlogf.data());
        release(d);
    }

    // 1b. the pruning tables of versions 9-20: per (b, h) a random non-decreasing key_start (up to the
    // diagonal tile, as the real tables: c is non-increasing), query_end derived from it, the forward
    // with the same key_start, against the CPU reference that skips the same tiles; hd 64, hd 128
    // with a window, hd 64 with one
    for (int ver : vers) {
        if (ver < 9) continue;
        for (int pc = 0; pc < 3; pc++) {
            int hd = pc == 1 ? 128 : 64;
            FoxProblem p = make_problem(2, 600, 2, hd, pc == 0 ? 0 : 300, true, -1);
            std::vector<int> tables = random_tables(p.B * p.H, p.T, true);
            size_t n = (size_t)p.B * p.T * p.H * p.hd;
            std::vector<double> dq(n), dk(n), dv(n), dlogf(p.n_bht);
            fox_backward_cpu(dq.data(), dk.data(), dv.data(), dlogf.data(), p.doutf.data(), p.stride_o,
                             p.qkvf.data() + p.q_off, p.qkvf.data() + p.k_off, p.qkvf.data() + p.v_off, p.c.data(),
                             p.B, p.T, p.H, p.hd, p.stride_qkv, p.window, tables.data());
            FoxDev d = upload(p, true);
            int* tables_d = dmalloc<int>(tables.size()); h2d(tables_d, tables);
            run_fwd(p, d, tables_d);
            printf("B=%d T=%d H=%d hd=%d window=%d packed, pruned (random key_start, query_end)\n", p.B, p.T, p.H,
                   p.hd, p.window);
            vok[ver] = vok[ver] & run_and_check(ver, p, d, dq.data(), dk.data(), dv.data(), dlogf.data(), tables_d);
            cudaCheck(cudaFree(tables_d));
            release(d);
        }
    }

    // 2. long sequences, extreme gates: fp64 GPU reference (forward and backward of version 1 in
    // double, the forward one validated in the forward ladder, this one against the CPU first).
    // With log f ~ -5 each row's P is nearly one-hot, so dS_ii = P_ii (dP_ii - Delta_i) is a
    // cancellation and the bf16 rounding of O inside Delta (FlashAttention's, SDPA's too) shows as
    // ~1.4e-2 on dq and dk: that case gets 2e-2 there (measured; everything else keeps 1e-2).
    struct Long { int T, H, hd, window; double gate; double tol_dqdk; const char* what; };
    Long longs[] = {
        {256, 2, 64, 0, -1, 0, "check of the fp64 GPU reference itself"},
        {65536, 2, 64, 0, 5.0, 2e-2, "log f ~ -5 (strong decay)"},
        {65536, 2, 64, 0, 1e-4, TOL_BF16, "log f ~ -1e-4 (nearly one)"},
        {16384, 2, 128, 2048, 1e-4, TOL_BF16, "hd 128, window 2048, nearly one"},
    };
    for (const Long& L : longs) {
        FoxProblem p = make_problem(1, L.T, L.H, L.hd, L.window, false, L.gate);
        FoxDev d = upload(p, true);
        size_t n = (size_t)p.T * p.H * p.hd;
        int C = p.H * p.hd;
        double *o64 = dmalloc<double>(n), *lse64 = dmalloc<double>(p.n_bht), *g64 = dmalloc<double>(3 * n + p.n_bht);
        double* s64 = dmalloc<double>(3 * p.n_bht);
        poison(g64, 3 * n + p.n_bht);
        const bf16 *q = d.qkv + p.q_off, *k = d.qkv + p.k_off, *v = d.qkv + p.v_off;
        fox_forward1<double, double>(o64, lse64, q, k, v, d.c, p.B, p.T, p.H, p.hd, p.stride_qkv, C, p.window);
        fox_backward1<double, double, double, double>(g64, g64 + n, g64 + 2 * n, g64 + 3 * n, s64, d.dout, q, k, v,
                                                      o64, lse64, d.c, p.B, p.T, p.H, p.hd, p.stride_qkv,
                                                      p.stride_o, C, C, p.window);
        std::vector<double> ref = d2h(g64, 3 * n + p.n_bht);
        printf("T=%d H=%d hd=%d window=%d %s\n", p.T, p.H, p.hd, p.window, L.what);
        if (L.T <= 256) {  // the reference against the CPU
            std::vector<double> dq(n), dk(n), dv(n), dlogf(p.n_bht);
            fox_backward_cpu(dq.data(), dk.data(), dv.data(), dlogf.data(), p.doutf.data(), p.stride_o,
                             p.qkvf.data() + p.q_off, p.qkvf.data() + p.k_off, p.qkvf.data() + p.v_off, p.c.data(),
                             p.B, p.T, p.H, p.hd, p.stride_qkv, p.window);
            const double* cpu[4] = {dq.data(), dk.data(), dv.data(), dlogf.data()};
            const char* names[4] = {"dq", "dk", "dv", "dlogf"};
            for (int x = 0; x < 4; x++) {
                size_t m = x < 3 ? n : p.n_bht;
                ErrStat st = compare(m, [&](size_t e, double* gg, double* rr) {
                    *gg = ref[x * n + e]; *rr = cpu[x][e];
                });
                all_ok &= report(names[x], st, 1e-10);
            }
        } else {
            run_fwd(p, d);
            for (int ver : vers)  // v1 in fp32 is the reference's twin, and slow
                if (ver > 1) vok[ver] = vok[ver] & run_and_check(ver, p, d, ref.data(), ref.data() + n,
                                                                 ref.data() + 2 * n, ref.data() + 3 * n, nullptr,
                                                                 L.tol_dqdk);
        }
        cudaCheck(cudaFree(o64)); cudaCheck(cudaFree(lse64)); cudaCheck(cudaFree(g64)); cudaCheck(cudaFree(s64));
        release(d);
    }

    // 3. determinism: same inputs, same bits, at both head sizes (the tiled versions)
    for (int ver : vers)
        for (int hd : {64, 128}) {
            if (ver == 1) continue;
            FoxProblem p = make_problem(2, 3000, 4, hd, 0, true, -1);
            FoxDev d = upload(p, true);
            run_fwd(p, d);
            std::vector<bf16> g[2];
            std::vector<float> l[2];
            for (int rep = 0; rep < 2; rep++) {
                poison(d.dqkv, p.n_qkv); poison(d.dlogf, p.n_bht);
                run_backward(ver, p, d);
                g[rep] = d2h(d.dqkv, p.n_qkv);
                l[rep] = d2h(d.dlogf, p.n_bht);
            }
            bool same = memcmp(g[0].data(), g[1].data(), g[0].size() * sizeof(bf16)) == 0 &&
                        memcmp(l[0].data(), l[1].data(), l[0].size() * sizeof(float)) == 0;
            printf("determinism of version %d, hd %d (two backward runs, bitwise): %s\n", ver, hd,
                   same ? "ok" : "FAIL");
            vok[ver] = vok[ver] & same;
            release(d);
        }
    bool any_ok = false;
    for (int ver : vers) {
        if (!vok[ver]) printf("VALIDATION FAILED for version %d: not timed\n", ver);
        any_ok |= vok[ver];
    }
    if (!all_ok || !any_ok) { printf("VALIDATION FAILED: no timing\n"); return EXIT_FAILURE; }

    // 4. timing on the benchmark shapes, every version but 1 in turns, backward and forward+backward,
    // 30 rounds (version 1: 3 runs at the first shape only)
    printf("\nbackward and forward+backward (forward = fox_attention_forward), causal, gate on: TFLOP/s (ms)\n%-22s",
           "B x H x T x hd");
    for (int ver : vers) printf("   v%-2d bwd            v%-2d fwd+bwd        ", ver, ver);
    printf("\n");
    for (const auto& sh : BENCH_SHAPES) {
        int B = sh[0], H = sh[1], T = sh[2], hd = sh[3];
        FoxProblem p = make_problem(B, T, H, hd, 0, false, 0.05);
        FoxDev d = upload(p, true);
        run_fwd(p, d);
        char name[64]; snprintf(name, sizeof(name), "%d x %d x %d x %d", B, H, T, hd);
        printf("%-22s", name);
        double f = attn_fwd_flops(B, T, H, hd);
        std::vector<std::function<void()>> fs;
        for (int ver : vers) {
            if (!vok[ver] || ver == 1) continue;
            fs.push_back([&, ver]() { run_backward(ver, p, d); });
            fs.push_back([&, ver]() { run_fwd(p, d); run_backward(ver, p, d); });
        }
        std::vector<float> med = time_medians(fs, 1, 30);
        size_t k = 0;
        for (int ver : vers) {
            if (!vok[ver] || (ver == 1 && &sh != &BENCH_SHAPES[0])) { printf("   %-19s%-19s", "-", "-"); continue; }
            float mb, mfb;
            if (ver == 1) {
                mb = time_medians({[&]() { run_backward(1, p, d); }}, 1, 3)[0];
                mfb = time_medians({[&]() { run_fwd(p, d); run_backward(1, p, d); }}, 1, 3)[0];
            } else {
                mb = med[k++];
                mfb = med[k++];
            }
            printf("   %6.1f (%8.3f)  %6.1f (%8.3f)", 2.5 * f / (mb * 1e-3) / 1e12, mb, 3.5 * f / (mfb * 1e-3) / 1e12,
                   mfb);
        }
        printf("\n");
        release(d);
    }
    for (int ver : vers) if (!vok[ver]) return EXIT_FAILURE;
    return 0;
}
