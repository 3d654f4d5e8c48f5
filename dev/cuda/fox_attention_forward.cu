/*
Forgetting Attention forward (FoX), causal, optional forget gate and sliding window.

    S_ij = q_i.k_j * scale + c_i - c_j     (j <= i, and i - w < j when a window w > 0)
    o_i  = sum_j softmax_j(S_ij) v_j,       lse_i = log sum_j exp(S_ij)

q, k, v, o: bf16 (B, T, H, hd) with a token stride; c, lse: fp32 (B, H, T); c == NULL is plain
causal attention. The bias c_i - c_j is not scaled. Built on train_fox.cu (common.h includes it):
its Hopper primitives serve every version here, and version 16 is train_fox.cu's own forward.

Build: make -C dev/cuda fox_attention_forward (the Makefile has the flags; sm_90a)

version 1 is a naive port of the CPU code: one thread per query row, two passes over the keys
(common.h: instantiated in fp64 it is both ladders' long-T reference)
version 2 is a tiled flash forward in fp32 on CUDA cores: K/V tiles in shared memory, online softmax
version 3 is a flash forward on tensor cores (mma.sync m16n8k16 bf16, FlashAttention-2's layout):
64-row query tile per block, a warp per 16 rows, 64-key K/V tiles double-buffered with cp.async
version 4 is version 3 with 32 rows per warp (128-row query tile): each K/V fragment feeds two mma's
version 5 moves version 4's softmax onto Hopper's warpgroup mma (wgmma): a warpgroup per 64 query
rows, Q and K read by descriptor from 128-byte-swizzled shared tiles, P from the accumulators as
register A fragments, V read N-major from its tile
version 6 is version 5 with two warpgroups (128 rows) per block sharing 64-key K/V tiles
version 8 is FlashAttention-3's structure: a producer warp loads Q and 128-key K/V tiles with the
tensor copy engine (TMA) into mbarrier rings, setmaxnreg moves registers to the two consumer
warpgroups, which ping-pong their matmuls; takes train_fox.cu's key_start pruning table
version 9 is version 6 on an element-wise diet: the gate as one FFMA per score, a lazy running
maximum (FlashAttention-4), key tiles from the diagonal backwards, one ex2.approx per score, masks
only where needed, 128-key tiles
version 10 is version 9's softmax in version 8's structure (FlashAttention-3's hd-64 shape): three
consumer warpgroups, each overlapping its softmax of tile n with its own P V of tile n-1; hd 64
(hd 128 runs version 9)
version 12 is version 10 with a quarter of the exponentials as an FMA polynomial (FlashAttention-4)
version 14 is version 10's kernel at hd 128 with two consumer warpgroups (FlashAttention-3's shape)
version 16 is train_fox.cu's fox_attention_forward: versions 10 and 14 made persistent, the (query
tile, head) pairs dealt in snake order (what it runs, exactly: the comment at its dispatch)

./fox_attention_forward         every version; ./fox_attention_forward 10: one; 9 12: a range
Each version is checked against the fp64 CPU reference on small shapes (T not a multiple of the
tiles, hd 64/128, gate on/off, windows, packed qkv, random pruning tables), then at T = 65536 with
extreme gates against the fp64 GPU reference, on poisoned outputs; then timed. The others
(archived, with their numbers): LOG.md, and git tag history-2026-12-04.
*/
#include "common.h"

// ----------------------------------------------------------------------------
// Version 2: tiled flash forward in fp32 on CUDA cores. A block owns 32 query rows, a quad of threads per row
// (each quad lane holds every 4th element of q and o); 32-key tiles of K and V go through shared
// memory in fp32, and the softmax is updated once per tile.

#define V2_BR 32
#define V2_BC 32

template<int HD>
__global__ void __launch_bounds__(128) fox_forward_kernel2(bf16* o, float* lse, const bf16* q, const bf16* k,
                                                            const bf16* v, const float* c, int T, int H,
                                                            int stride_qkv, int stride_o, int window, float scale) {
    __shared__ float sK[V2_BC][HD], sV[V2_BC][HD], sC[V2_BC];
    constexpr int DPT = HD / 4;  // elements of a row per quad lane
    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int r = threadIdx.x / 4, lq = threadIdx.x % 4;
    int i0 = qt * V2_BR, i = i0 + r;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    const float* cb = c ? c + (size_t)bh * T : nullptr;
    float qr[DPT], acc[DPT];
    for (int e = 0; e < DPT; e++) {
        qr[e] = i < T ? __bfloat162float(q[base + (size_t)i * stride_qkv + 4 * e + lq]) * scale : 0.f;
        acc[e] = 0.f;
    }
    float ci = (cb && i < T) ? cb[i] : 0.f;
    float m = -INFINITY, l = 0.f;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0, j_end = min(T, i0 + V2_BR);
    for (int j0 = (j_begin / V2_BC) * V2_BC; j0 < j_end; j0 += V2_BC) {
        __syncthreads();  // previous tile fully consumed
        for (int e = threadIdx.x; e < V2_BC * HD; e += blockDim.x) {
            int jj = e / HD, d = e % HD, j = j0 + jj;
            sK[jj][d] = j < T ? __bfloat162float(k[base + (size_t)j * stride_qkv + d]) : 0.f;
            sV[jj][d] = j < T ? __bfloat162float(v[base + (size_t)j * stride_qkv + d]) : 0.f;
        }
        if (threadIdx.x < V2_BC) sC[threadIdx.x] = (cb && j0 + threadIdx.x < T) ? cb[j0 + threadIdx.x] : 0.f;
        __syncthreads();
        float s[V2_BC], mt = -INFINITY;
        #pragma unroll
        for (int jj = 0; jj < V2_BC; jj++) {
            float part = 0.f;
            #pragma unroll
            for (int e = 0; e < DPT; e++) part += qr[e] * sK[jj][4 * e + lq];
            part += __shfl_xor_sync(0xffffffff, part, 1);
            part += __shfl_xor_sync(0xffffffff, part, 2);
            int j = j0 + jj;
            s[jj] = (j < T && fox_visible(i, j, window)) ? part + (ci - sC[jj]) : -INFINITY;
            mt = fmaxf(mt, s[jj]);
        }
        float m_new = fmaxf(m, mt);
        float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at 0
        float alpha = expf(m - m_use);
        l *= alpha;
        for (int e = 0; e < DPT; e++) acc[e] *= alpha;
        #pragma unroll
        for (int jj = 0; jj < V2_BC; jj++) {
            float p = expf(s[jj] - m_use);
            l += p;
            #pragma unroll
            for (int e = 0; e < DPT; e++) acc[e] += p * sV[jj][4 * e + lq];
        }
        m = m_new;
    }
    if (i < T) {
        bf16* oi = o + (size_t)b * T * stride_o + (size_t)i * stride_o + (size_t)h * HD;
        for (int e = 0; e < DPT; e++) oi[4 * e + lq] = __float2bfloat16(acc[e] / l);
        if (lq == 0) lse[(size_t)bh * T + i] = m + logf(l);
    }
}

static void fox_forward2(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                         int B, int T, int H, int hd, int stride_qkv, int stride_o, int window) {
    dim3 grid(ceil_div(T, V2_BR), B * H);
    float scale = 1.0f / sqrtf((float)hd);
    if (hd == 64) fox_forward_kernel2<64><<<grid, 128>>>(o, lse, q, k, v, c, T, H, stride_qkv, stride_o, window, scale);
    else fox_forward_kernel2<128><<<grid, 128>>>(o, lse, q, k, v, c, T, H, stride_qkv, stride_o, window, scale);
    launchCheck();
}

// ----------------------------------------------------------------------------
// Versions 3 and 4: flash forward on tensor cores (mma.sync m16n8k16 bf16, FlashAttention-2's
// layout). Block = 4 warps = one query tile of BR = 64 * WM rows of one (b, h); each warp owns
// 16 * WM rows and keeps their Q fragments, O accumulator and softmax state in registers. Key tiles
// of BC keys (K, V and c_j) stream through shared memory, double-buffered with cp.async. Every K/V
// fragment read from shared memory feeds WM mma's: with WM = 2 a warp needs half the shared-memory
// traffic per mma (version 4), which is what limits WM = 1 (version 3).
// Scores are kept in log2 units: x = (q.k * scale + c_i - c_j) * log2(e), so exp is one ex2.

template<int HD, int BC, int WM, bool GATE>
__global__ void __launch_bounds__(128) fox_forward_kernel3(bf16* o, float* lse, const bf16* q, const bf16* k,
                                                            const bf16* v, const float* c, int T, int H,
                                                            int stride_qkv, int stride_o, int window,
                                                            float scale_log2) {
    constexpr int BR = 64 * WM;
    constexpr int LD = HD + 8;  // padded row: the 8 rows of an ldmatrix land in distinct banks
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_raw;             // (BR, LD)
    bf16* sK = sQ + BR * LD;                // (2, BC, LD)
    bf16* sV = sK + 2 * BC * LD;            // (2, BC, LD)
    float* sC = (float*)(sV + 2 * BC * LD); // (2, BC)

    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first: causal tiles are uneven
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    const bf16 *qb = q + base, *kb = k + base, *vb = v + base;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0;
    int jt_begin = j_begin / BC, jt_end = (min(T, i0 + BR) + BC - 1) / BC;

    load_tile_async<BR, HD, LD, 128>(sQ, qb, i0, T, stride_qkv);
    load_tile_async<BC, HD, LD, 128>(sK, kb, jt_begin * BC, T, stride_qkv);
    load_tile_async<BC, HD, LD, 128>(sV, vb, jt_begin * BC, T, stride_qkv);
    if (GATE) load_vec_async<BC>(sC, cb, jt_begin * BC, T);
    cp_async_commit();

    // this thread's rows: rows[mt][r] = 16-row tile mt of the warp, r = 0 (row g) or 1 (row g + 8)
    int rows[WM][2];
    float cr[WM][2], m[WM][2], l[WM][2];
    float acc[WM][HD / 8][4];
    // Q fragments live in registers unless they would crowd out the accumulators (hd 128, WM 2):
    // then they are re-read from shared memory for every key tile
    constexpr bool Q_REGS = HD * WM <= 128;
    uint32_t qf[WM][Q_REGS ? HD / 16 : 1][4];
    #pragma unroll
    for (int mt = 0; mt < WM; mt++) {
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            rows[mt][r] = i0 + warp * 16 * WM + mt * 16 + g + 8 * r;
            cr[mt][r] = (GATE && rows[mt][r] < T) ? cb[rows[mt][r]] : 0.f;
            m[mt][r] = -INFINITY;
            l[mt][r] = 0.f;
        }
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) acc[mt][dt][0] = acc[mt][dt][1] = acc[mt][dt][2] = acc[mt][dt][3] = 0.f;
    }

    for (int jt = jt_begin; jt < jt_end; jt++) {
        int buf = (jt - jt_begin) & 1;
        if (jt + 1 < jt_end) {  // prefetch the next tile into the other buffer
            int nb = buf ^ 1, j1 = (jt + 1) * BC;
            load_tile_async<BC, HD, LD, 128>(sK + nb * BC * LD, kb, j1, T, stride_qkv);
            load_tile_async<BC, HD, LD, 128>(sV + nb * BC * LD, vb, j1, T, stride_qkv);
            if (GATE) load_vec_async<BC>(sC + nb * BC, cb, j1, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        auto load_q = [&](uint32_t r[4], int mt, int kk) {
            ldmatrix_x4(r, smem_u32(sQ + (warp * 16 * WM + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD +
                                    kk * 16 + (lane / 16) * 8));
        };
        if (Q_REGS && jt == jt_begin) {
            #pragma unroll
            for (int mt = 0; mt < WM; mt++)
                #pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) load_q(qf[mt][Q_REGS ? kk : 0], mt, kk);
        }
        const bf16* sKb = sK + buf * BC * LD;
        const bf16* sVb = sV + buf * BC * LD;
        const float* sCb = sC + buf * BC;

        // S = Q K^T, (16 WM, BC) per warp: BC/8 n-tiles of 8 keys
        float s[WM][BC / 8][4];
        #pragma unroll
        for (int mt = 0; mt < WM; mt++)
            #pragma unroll
            for (int nt = 0; nt < BC / 8; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            if (!Q_REGS)
                #pragma unroll
                for (int mt = 0; mt < WM; mt++) load_q(qf[mt][0], mt, kk);
            #pragma unroll
            for (int np = 0; np < BC / 16; np++) {
                uint32_t bk[4];  // b0, b1 of key tiles 2np and 2np+1
                ldmatrix_x4(bk, smem_u32(sKb + (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kk * 16 +
                                         ((lane / 8) % 2) * 8));
                #pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    mma_bf16_16816(s[mt][2 * np], qf[mt][Q_REGS ? kk : 0], bk[0], bk[1]);
                    mma_bf16_16816(s[mt][2 * np + 1], qf[mt][Q_REGS ? kk : 0], bk[2], bk[3]);
                }
            }
        }
        // scale, bias, mask (only tiles that touch the diagonal, the window edge or T need it),
        // so that nothing above the diagonal is ever exponentiated
        int j0 = jt * BC;
        bool need_mask = (j0 + BC - 1 > i0) || (j0 + BC > T) || (window > 0 && j0 <= i0 + BR - 1 - window);
        #pragma unroll
        for (int mt = 0; mt < WM; mt++) {
            float mx[2] = {-INFINITY, -INFINITY};
            #pragma unroll
            for (int nt = 0; nt < BC / 8; nt++) {
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    int jl = nt * 8 + 2 * tq + (e & 1);
                    float x = s[mt][nt][e] * scale_log2;
                    if (GATE) x = fmaf(cr[mt][e / 2] - sCb[jl], LOG2E, x);  // c_i - c_j exact near the diagonal
                    if (need_mask) {
                        int j = j0 + jl;
                        if (j >= T || !fox_visible(rows[mt][e / 2], j, window)) x = -INFINITY;
                    }
                    s[mt][nt][e] = x;
                    mx[e / 2] = fmaxf(mx[e / 2], x);
                }
            }
            float mu[2];
            #pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
                float m_new = fmaxf(m[mt][r], mx[r]);
                mu[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet: exp2(-inf - 0) = 0
                float alpha = exp2f(m[mt][r] - mu[r]);
                l[mt][r] *= alpha;
                #pragma unroll
                for (int dt = 0; dt < HD / 8; dt++) { acc[mt][dt][2 * r] *= alpha; acc[mt][dt][2 * r + 1] *= alpha; }
                m[mt][r] = m_new;
            }
            #pragma unroll
            for (int nt = 0; nt < BC / 8; nt++) {
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[mt][nt][e] = exp2f(s[mt][nt][e] - mu[e / 2]);
                    l[mt][e / 2] += s[mt][nt][e];  // per-thread partial; the quad sums once at the end
                }
            }
        }
        // O += P V: P straight from registers, V^T fragments by ldmatrix.trans
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t pa[WM][4];
            #pragma unroll
            for (int mt = 0; mt < WM; mt++) acc_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
            #pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t bv[4];
                ldmatrix_x4_trans(bv, smem_u32(sVb + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + dp * 16 +
                                               (lane / 16) * 8));
                #pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    mma_bf16_16816(acc[mt][2 * dp], pa[mt], bv[0], bv[1]);
                    mma_bf16_16816(acc[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
                }
            }
        }
        __syncthreads();  // everyone is done with this buffer before it is refilled
    }
    bf16* ob = o + (size_t)b * T * stride_o + (size_t)h * HD;
    #pragma unroll
    for (int mt = 0; mt < WM; mt++) {
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            l[mt][r] += __shfl_xor_sync(0xffffffff, l[mt][r], 1);
            l[mt][r] += __shfl_xor_sync(0xffffffff, l[mt][r], 2);
            int row = rows[mt][r];
            if (row >= T) continue;
            float inv = 1.f / l[mt][r];
            #pragma unroll
            for (int dt = 0; dt < HD / 8; dt++)
                *(__nv_bfloat162*)(ob + (size_t)row * stride_o + dt * 8 + 2 * tq) =
                    __floats2bfloat162_rn(acc[mt][dt][2 * r] * inv, acc[mt][dt][2 * r + 1] * inv);
            if (tq == 0) lse[(size_t)bh * T + row] = (m[mt][r] + log2f(l[mt][r])) * LN2;  // natural log
        }
    }
}

// versions 3 (WM = 1) and 4 (WM = 2): 64-key tiles (version 4 at hd 128: 32, for the registers)
template<int WM>
static void fox_forward3(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c, int B, int T,
                         int H, int hd, int stride_qkv, int stride_o, int window, const int* key_start) {
    by_shape(hd, c, [&](auto HD, auto GATE) {
        constexpr int BC = HD == 128 && WM == 2 ? 32 : 64, LD = HD + 8, BR = 64 * WM;
        size_t smem = (size_t)(BR + 4 * BC) * LD * sizeof(bf16) + 2 * BC * sizeof(float);
        auto kernel = fox_forward_kernel3<HD, BC, WM, GATE>;
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kernel<<<dim3(ceil_div(T, BR), B * H), 128, smem>>>(o, lse, q, k, v, c, T, H, stride_qkv, stride_o, window,
                                                            LOG2E / sqrtf((float)HD));
        launchCheck();
    });
}
// ----------------------------------------------------------------------------
// Versions 5 and 6: version 4's online softmax on Hopper's warpgroup mma (wgmma, sm_90a): a
// warpgroup owns 64 query rows (a warp 16, in the same accumulator layout as mma.sync), S = Q K^T
// with Q and K read by descriptor from 128-byte-swizzled shared tiles (no ldmatrix), P from the
// accumulators as register A fragments, O += P V with V read N-major from the same tile. Key tiles
// of BC double-buffered with cp.async; version 6 has two warpgroups (128 rows) per block.
template<int HD, int BC, int NWG, bool GATE>
__global__ void __launch_bounds__(128 * NWG) fox_forward_kernel5(bf16* o, float* lse, const bf16* q, const bf16* k,
                                                                 const bf16* v, const float* c, int T, int H,
                                                                 int stride_qkv, int stride_o, int window,
                                                                 float scale_log2) {
    constexpr int BR = 64 * NWG, NT = 128 * NWG;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_1k(smem_raw);    // (BR, HD) swizzled tiles
    bf16* sK = sQ + BR * HD;                // (2, BC, HD)
    bf16* sV = sK + 2 * BC * HD;            // (2, BC, HD)
    float* sC = (float*)(sV + 2 * BC * HD); // (2, BC)

    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first: causal tiles are uneven
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4, wg = warp / 4;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    const bf16 *qb = q + base, *kb = k + base, *vb = v + base;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0;
    int jt_begin = j_begin / BC, jt_end = (min(T, i0 + BR) + BC - 1) / BC;

    load_tile_swz<BR, HD, NT>(sQ, qb, i0, T, stride_qkv);
    auto load_kv = [&](int jt, int nb) {
        int j1 = jt * BC;
        load_tile_swz<BC, HD, NT>(sK + nb * BC * HD, kb, j1, T, stride_qkv);
        load_tile_swz<BC, HD, NT>(sV + nb * BC * HD, vb, j1, T, stride_qkv);
        if (GATE) load_vec_async<BC>(sC + nb * BC, cb, j1, T);
    };
    load_kv(jt_begin, 0);
    cp_async_commit();

    int rows[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
    float cr[2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, acc[HD / 2];
    #pragma unroll
    for (int r = 0; r < 2; r++) cr[r] = (GATE && rows[r] < T) ? cb[rows[r]] : 0.f;
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) acc[e] = 0.f;

    for (int jt = jt_begin; jt < jt_end; jt++) {
        int buf = (jt - jt_begin) & 1;
        if (jt + 1 < jt_end) { load_kv(jt + 1, buf ^ 1); cp_async_commit(); cp_async_wait<1>(); }
        else cp_async_wait<0>();
        fence_async_smem();
        __syncthreads();
        const bf16 *sKb = sK + buf * BC * HD, *sVb = sV + buf * BC * HD;
        const float* sCb = sC + buf * BC;

        float s[BC / 2];
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<BC>(s, desc_k<BR>(sQ, wg * 8, kk), desc_k<BC>(sKb, 0, kk), kk);
        wgmma_commit();
        wgmma_wait0();
        wgmma_pin<BC / 2>(s);

        // scale, bias, mask (only tiles touching the diagonal, the window edge or T), online softmax
        int j0 = jt * BC;
        bool need_mask = (j0 + BC - 1 > i0) || (j0 + BC > T) || (window > 0 && j0 <= i0 + BR - 1 - window);
        float mx[2] = {-INFINITY, -INFINITY};
        #pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int jl = nt * 8 + 2 * tq + (e & 1);
                float x = s[nt * 4 + e] * scale_log2;
                if (GATE) x = fmaf(cr[e / 2] - sCb[jl], LOG2E, x);  // c_i - c_j exact near the diagonal
                if (need_mask) {
                    int j = j0 + jl;
                    if (j >= T || !fox_visible(rows[e / 2], j, window)) x = -INFINITY;
                }
                s[nt * 4 + e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
        }
        float mu[2];
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
            float m_new = fmaxf(m[r], mx[r]);
            mu[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet: exp2(-inf - 0) = 0
            float alpha = exp2f(m[r] - mu[r]);
            l[r] *= alpha;
            #pragma unroll
            for (int dt = 0; dt < HD / 8; dt++) { acc[dt * 4 + 2 * r] *= alpha; acc[dt * 4 + 2 * r + 1] *= alpha; }
            m[r] = m_new;
        }
        #pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                s[nt * 4 + e] = exp2f(s[nt * 4 + e] - mu[e / 2]);
                l[e / 2] += s[nt * 4 + e];  // per-thread partial; the quad sums once at the end
            }
        }
        // O += P V
        uint32_t pa[BC / 16][4];
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) acc_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(acc, pa[kk], desc_mn<BC>(sVb, kk), 1);
        wgmma_commit();
        wgmma_wait0();
        wgmma_pin<HD / 2>(acc); wgmma_pin_a<BC / 16>(pa);
        __syncthreads();  // everyone is done with this buffer before it is refilled
    }
    bf16* ob = o + (size_t)b * T * stride_o + (size_t)h * HD;
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
        int row = rows[r];
        if (row >= T) continue;
        float inv = 1.f / l[r];
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *(__nv_bfloat162*)(ob + (size_t)row * stride_o + dt * 8 + 2 * tq) =
                __floats2bfloat162_rn(acc[dt * 4 + 2 * r] * inv, acc[dt * 4 + 2 * r + 1] * inv);
        if (tq == 0) lse[(size_t)bh * T + row] = (m[r] + log2f(l[r])) * LN2;  // natural log
    }
}

// Version 7: version 6 with FlashAttention-3's pipeline inside a warpgroup: tile j's S = Q K^T is
// issued together with tile j-1's O += P V, and tile j's softmax runs while that P V matmul is in
// flight; O is rescaled (and P refilled) after it. K/V take three stages: V(j-1) is still read when

// versions 5 (NWG = 1; key tiles of 128 at hd 64, 64 at hd 128) and 6 (NWG = 2, key tiles of 64)
template<int NWG>
static void fox_forward5(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c, int B, int T,
                         int H, int hd, int stride_qkv, int stride_o, int window, const int* key_start) {
    by_shape(hd, c, [&](auto HD, auto GATE) {
        constexpr int BR = 64 * NWG, BC = NWG == 1 && HD == 64 ? 128 : 64, ST = 2;
        constexpr size_t smem = 1024 + (size_t)(BR + 2 * ST * BC) * HD * sizeof(bf16) + ST * BC * sizeof(float);
        auto kernel = fox_forward_kernel5<HD, BC, NWG, GATE>;
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kernel<<<dim3(ceil_div(T, BR), B * H), 128 * NWG, smem>>>(o, lse, q, k, v, c, T, H, stride_qkv, stride_o,
                                                                  window, LOG2E / sqrtf((float)HD));
        launchCheck();
    });
}
// Version 8: FlashAttention-3's structure around its pipeline inside a warpgroup (archived version 7:
// tile j's S matmul issued with tile j-1's P V, the softmax of tile j under that P V). A block of
// three warpgroups owns a 128-row query tile: warpgroup 0 is the producer (one warp issues the
// loads; setmaxnreg gives its registers to the others), warpgroups 1 and 2 are consumers of 64 rows
// each. The producer fills
// rings of ST stages for K (with c_j) and for V, signalled by mbarriers: a full barrier per stage
// completes when the copy engine's bytes (and the c lanes) have landed, an empty one when all eight
// consumer warps are done with the stage. K and V have separate rings because K(j) is free after
// tile j's S and softmax, V(j) only after tile j's P V, which runs one tile later.
// The two consumers ping-pong: each issues its matmuls (tile j's S = Q K^T with tile j-1's
// O += P V) only in its turn (named barriers 1 and 2), then passes the turn, so
// one warpgroup's softmax runs while the other's matmuls hold the tensor cores.
//
// Loads use the bulk tensor copy engine (TMA) with one tensor map per q, k, v over the packed
// (B, T, H, hd) layout: dims (hd, H, T, B), byte strides (hd * 2, stride * 2, T * stride * 2), box
// (64 columns, 1 head, rows, 1 batch). Its 128-byte swizzle writes exactly the tile layout of
// versions 5 and 6 (64-column blocks, chunk c of row r at c ^ r % 8, 1024-byte aligned), and rows past T
// come back as zeros. c (fp32 (B, H, T)) cannot have a tensor map for odd T (its row stride must be
// a multiple of 16 bytes): the producer warp loads it with 4-byte cp.async that arrive on K's full
// barrier when they land.

// named barriers of 256 threads (both consumer warpgroups): sync waits, arrive passes on
__device__ __forceinline__ void bar_sync256(int id) { asm volatile("bar.sync %0, 256;\n" :: "r"(id) : "memory"); }
__device__ __forceinline__ void bar_arrive256(int id) { asm volatile("bar.arrive %0, 256;\n" :: "r"(id) : "memory"); }

template<int HD, int BC, int ST, bool GATE>
__global__ void __launch_bounds__(384, 1) fox_forward_kernel8(bf16* o, float* lse,
                                                              const __grid_constant__ CUtensorMap tmQ,
                                                              const __grid_constant__ CUtensorMap tmK,
                                                              const __grid_constant__ CUtensorMap tmV, const float* c,
                                                              int T, int H, int stride_o, int window,
                                                              float scale_log2, const int* key_start) {
    constexpr int BR = 128;
    static_assert(BR == PRUNE_BLOCK && PRUNE_BLOCK % BC == 0, "a query tile is one pruning tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_1k(smem_raw);     // (BR, HD) swizzled tiles
    bf16* sK = sQ + BR * HD;                 // (ST, BC, HD)
    bf16* sV = sK + ST * BC * HD;            // (ST, BC, HD)
    float* sC = (float*)(sV + ST * BC * HD); // (ST, BC)
    uint64_t* bar = (uint64_t*)(sC + ST * BC);
    uint64_t *barQ = bar, *fullK = bar + 1, *emptyK = fullK + ST, *fullV = emptyK + ST, *emptyV = fullV + ST;

    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first: causal tiles are uneven
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0;
    int jt_begin = j_begin / BC, jt_end = (min(T, i0 + BR) + BC - 1) / BC;
    // pruned key tiles are never loaded (never the diagonal one, so jt_begin < jt_end)
    if (key_start) jt_begin = max(jt_begin, key_start[(size_t)bh * gridDim.x + qt] * (PRUNE_BLOCK / BC));
    int ntiles = jt_end - jt_begin;

    // full barriers: the copy engine's arrival (+ the 32 c lanes on K's); empty: a warp of the consumers each
    if (threadIdx.x == 0) fox_ring_barriers<ST>(fullV, emptyV, 1, 8);
    fox_ring_init<ST>(barQ, fullK, emptyK, 1 + (GATE ? 32 : 0), 8);

    if (wg == 0) {  // producer
        setmaxnreg_dec<24>();
        if (warp != 0) return;
        if (lane == 0) {
            mbar_expect_tx(barQ, BR * HD * sizeof(bf16));
            tma_load_tile<BR, HD>(sQ, &tmQ, i0, h, b, barQ);
        }
        for (int n = 0; n < ntiles; n++) {
            int st = n % ST, parity = ((n / ST) & 1) ^ 1, j0 = (jt_begin + n) * BC;
            mbar_wait(&emptyK[st], parity);
            if (lane == 0) {
                mbar_expect_tx(&fullK[st], BC * HD * sizeof(bf16));
                tma_load_tile<BC, HD>(sK + st * BC * HD, &tmK, j0, h, b, &fullK[st]);
            }
            if (GATE) {
                #pragma unroll
                for (int e = lane; e < BC; e += 32) cp_async4(sC + st * BC + e, cb + min(j0 + e, T - 1), j0 + e < T);
                mbar_arrive_cp_async(&fullK[st]);
            }
            mbar_wait(&emptyV[st], parity);
            if (lane == 0) {
                mbar_expect_tx(&fullV[st], BC * HD * sizeof(bf16));
                tma_load_tile<BC, HD>(sV + st * BC * HD, &tmV, j0, h, b, &fullV[st]);
            }
        }
        return;
    }

    // consumers: warpgroup cw = 0, 1 owns rows i0 + 64 cw ..; a warp 16 of them, as in version 6
    setmaxnreg_inc<240>();
    int cw = wg - 1, cwarp = warp - 4, g = lane / 4, tq = lane % 4;
    int i0w = i0 + 64 * cw;
    int rows[2] = {i0 + cwarp * 16 + g, i0 + cwarp * 16 + g + 8};
    float cr[2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, acc[HD / 2];
    #pragma unroll
    for (int r = 0; r < 2; r++) cr[r] = (GATE && rows[r] < T) ? cb[rows[r]] : 0.f;
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) acc[e] = 0.f;
    // turns: consumer cw issues its matmuls after bar_sync256(1 + cw), then passes the turn on
    auto turn_begin = [&]() { bar_sync256(1 + cw); };
    auto turn_end = [&]() { bar_arrive256(2 - cw); };
    if (cw == 1) bar_arrive256(1);  // consumer 0 goes first
    mbar_wait(barQ, 0);

    uint32_t pa[BC / 16][4];  // P of the previous tile, read by its P V matmul under this tile's S
    for (int n = 0; n < ntiles; n++) {
        int st = n % ST, pst = (n + ST - 1) % ST;  // this tile's stage, the previous tile's
        mbar_wait(&fullK[st], (n / ST) & 1);
        if (n > 0) mbar_wait(&fullV[pst], ((n - 1) / ST) & 1);
        const bf16* sKb = sK + st * BC * HD;
        const float* sCb = sC + st * BC;

        // S = Q K^T of this tile, then O += P V of the previous one: the softmax below runs under it
        float s[BC / 2];
        turn_begin();
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<BC>(s, desc_k<BR>(sQ, cw * 8, kk), desc_k<BC>(sKb, 0, kk), kk);
        wgmma_commit();
        if (n > 0) {
            const bf16* sVp = sV + pst * BC * HD;
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(acc, pa[kk], desc_mn<BC>(sVp, kk), 1);
            wgmma_commit();
            turn_end();  // in each branch: a join between the issue and the wait serializes the wgmma's (C7514)
            wgmma_wait<1>();
        } else {
            turn_end();
            wgmma_wait0();
        }
        wgmma_pin<BC / 2>(s);

        // scale, bias, mask (only tiles touching the diagonal, the window edge or T), online softmax
        int j0 = (jt_begin + n) * BC;
        bool need_mask = (j0 + BC - 1 > i0w) || (j0 + BC > T) || (window > 0 && j0 <= i0w + 63 - window);
        float mx[2] = {-INFINITY, -INFINITY};
        #pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int jl = nt * 8 + 2 * tq + (e & 1);
                float x = s[nt * 4 + e] * scale_log2;
                if (GATE) x = fmaf(cr[e / 2] - sCb[jl], LOG2E, x);  // c_i - c_j exact near the diagonal
                if (need_mask) {
                    int j = j0 + jl;
                    if (j >= T || !fox_visible(rows[e / 2], j, window)) x = -INFINITY;
                }
                s[nt * 4 + e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&emptyK[st]);  // K(j) read by S, c_j read above: the stage is free
        float mu[2], alpha[2];
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
            float m_new = fmaxf(m[r], mx[r]);
            mu[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet: exp2(-inf - 0) = 0
            alpha[r] = exp2f(m[r] - mu[r]);
            l[r] *= alpha[r];
            m[r] = m_new;
        }
        #pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                s[nt * 4 + e] = exp2f(s[nt * 4 + e] - mu[e / 2]);
                l[e / 2] += s[nt * 4 + e];  // per-thread partial; the quad sums once at the end
            }
        }
        wgmma_wait0();  // the previous tile's P V: its V stage is free, O can be rescaled, pa refilled
        wgmma_pin<HD / 2>(acc); wgmma_use_a<BC / 16>(pa);
        if (n > 0 && lane == 0) mbar_arrive(&emptyV[pst]);
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            acc[dt * 4] *= alpha[0]; acc[dt * 4 + 1] *= alpha[0];
            acc[dt * 4 + 2] *= alpha[1]; acc[dt * 4 + 3] *= alpha[1];
        }
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) acc_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
    }
    {  // the last tile's P V, in a turn of its own
        int pst = (ntiles - 1) % ST;
        mbar_wait(&fullV[pst], ((ntiles - 1) / ST) & 1);
        const bf16* sVp = sV + pst * BC * HD;
        turn_begin();
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(acc, pa[kk], desc_mn<BC>(sVp, kk), 1);
        wgmma_commit();
        turn_end();
        wgmma_wait0();
        wgmma_pin<HD / 2>(acc); wgmma_use_a<BC / 16>(pa);
    }
    if (cw == 0) bar_sync256(1);  // consume consumer 1's last pass of the turn: every arrive is matched

    bf16* ob = o + (size_t)b * T * stride_o + (size_t)h * HD;
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
        int row = rows[r];
        if (row >= T) continue;
        float inv = 1.f / l[r];
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *(__nv_bfloat162*)(ob + (size_t)row * stride_o + dt * 8 + 2 * tq) =
                __floats2bfloat162_rn(acc[dt * 4 + 2 * r] * inv, acc[dt * 4 + 2 * r + 1] * inv);
        if (tq == 0) lse[(size_t)bh * T + row] = (m[r] + log2f(l[r])) * LN2;  // natural log
    }
}

// version 8: 128-key tiles, 2 stages, at both head sizes
static void fox_forward8(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c, int B, int T,
                         int H, int hd, int stride_qkv, int stride_o, int window, const int* key_start) {
    by_shape(hd, c, [&](auto HD, auto GATE) {
        constexpr int BR = 128, BC = 128, ST = 2;
        // Q, ST stages of K, V and c, the barriers, + 1 KB to align the tiles to the swizzle pattern
        constexpr size_t smem = 1024 + (size_t)(BR + 2 * ST * BC) * HD * sizeof(bf16) + ST * BC * sizeof(float) +
                                (1 + 4 * ST) * sizeof(uint64_t);
        auto kernel = fox_forward_kernel8<HD, BC, ST, GATE>;
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUtensorMap tq = fox_tensor_map(q, B, T, H, HD, stride_qkv, BR),
                    tk = fox_tensor_map(k, B, T, H, HD, stride_qkv, BC),
                    tv = fox_tensor_map(v, B, T, H, HD, stride_qkv, BC);
        kernel<<<dim3(ceil_div(T, BR), B * H), 384, smem>>>(o, lse, tq, tk, tv, c, T, H, stride_o, window,
                                                            LOG2E / sqrtf((float)HD), GATE ? key_start : nullptr);
        launchCheck();
    });
}
// ----------------------------------------------------------------------------
// Version 9: version 6's block (two warpgroups of 64 query rows share cp.async K/V tiles; two blocks per SM)
// with less element-wise work per score, which at hd 64 costs as much issue time as the matmuls:
// - Gate terms per column, not per score. With c_ref = c of the thread's first row (a thread holds
//   rows g and g + 8 of its warp's 16),
//     d_j = (c_ref - c_j) log2(e)   once per key tile for the thread's BC/4 columns (both its rows),
//     x_ij = s_ij scale log2(e) + d_j   one FFMA per score,
//   and the row term r_i = (c_i - c_ref) log2(e) drops out of the softmax: x_ij + r_i is the true
//   logit in log2 units and P_ij = 2^(x_ij - m_i) with m_i the row maximum of x. Only lse needs it:
//   lse_i = (m_i + r_i + log2 l_i) ln 2.
//   Precision: c reaches ~ -3e5 at T = 65536 with log f ~ -5, so c_i - c_j is never formed from two
//   large absolutes inside a sum of large terms. c_ref log2(e) is rounded once (an error up to
//   ~0.02 there), but the same fp32 value enters every d_j and r_i of the thread with opposite
//   signs, so it cancels exactly in x_ij + r_i; d_j and r_i are each one FFMA (exact product)
//   rounded once at their own magnitude. r_i is 0 or spans 8 rows (|r_i| <= 8 |log f| log2(e)), and
//   every entry whose P is not negligible has |d_j| <= |r_i| + ~30 (<= ~90 at log f = -5), so its
//   logit is off by a few 1e-6 (log2 units), far below bf16's rounding of P (2^-8 relative). (With
//   one reference per block, c of row i0, r_i spans 127 rows and the error grows to ~1e-4; measured:
//   lse off by up to 4e-5 against version 6's 3e-6.)
// - Lazy maximum (FlashAttention-4): m_i moves only when a tile's row maximum exceeds it by more
//   than LAZY_RESCALE_LOG2, so most tiles skip rescaling O (HD/2 multiplies per thread). P then is at
//   most 2^8 (exact in fp32, fine in bf16); o = acc / l and lse stay exact. The test is per warp
//   (__any_sync): when one row needs it the warp rescales all its rows, which is also exact.
// - Key tiles from the diagonal backwards, so that under a decaying gate the first tile already
//   holds each row's maximum (nearly every later tile skips the rescale).
// - 2^x as one ex2.approx.ftz (exp2f adds a range test and two multiplies for denormal results,
//   which are zero in P anyway); the mask (diagonal, window edge, past T: only the tiles touching
//   them) as two integer compares against per-row bounds; a warpgroup skips the tiles none of its
//   rows sees (above its diagonal, before its window).
// - 128-key tiles at hd 64 in 128 registers, no spills (two blocks per SM still fit: 82 KB of
//   shared memory each with two stages), half the barriers and matmul issues per key of 64-key tiles.
// - ST K/V stages and one barrier per tile: tile n + ST - 1 is loaded, after the barrier, into the
//   stage of tile n - 1, which every warpgroup is done with.

#define LAZY_RESCALE_LOG2 8.0f  // O is rescaled only when a row maximum grows by more than this (log2 units)

// 2^x without MUFU, on the FMA and integer pipes (version 12: FlashAttention-4's idea of computing
// a share of the exponentials in software while MUFU.EX2 does the rest). For x < 128:
// - x is clamped to -127, so x <= -127 (and -inf, and NaN) gives exactly 0 as ex2.approx.ftz
//   flushes; x in (-127, -126) gives a denormal below 2^-126 where ex2.approx.ftz gives 0.
// - r = x + 1.5 * 2^23 rounded down (add.rm: one FADD) is 1.5 * 2^23 + floor(x) exactly, so
//   r - 1.5 * 2^23 = n = floor(x) and f = x - n in [0, 1] are exact (f = 1 only where x + 1 rounds
//   up, x in [-2^-25, 0): n = -1 and p(1) ~ 2 give ~1, within the error bound below).
// - p(f) = 1 + f (C1 + f (C2 + f C3)) ~ 2^f: minimax relative error on [0, 1] with p(0) = 1 fixed
//   (so 2^n is exact at integers: a row's maximum gives P = 1, x = -127 gives 0), coefficients from
//   our own Remez fit rounded to fp32. Measured over every fp32 x in [-126, 8] (on the host, the
//   same operations; the ladder repeats it on the device): max relative error 8.57e-5, 23x below
//   the 2^-9 = 1.95e-3 of bf16's rounding of P before P V. Degree 4 would give 3.0e-6 for one
//   FFMA more; degree 3 keeps the cost at 3 FADD, 3 FFMA, FMNMX and a shift-add per score.
// - The low bits of r hold n (two's complement, above 1.5 * 2^23's zero low bits), so
//   bits(r) << 23 = n << 23 mod 2^32: added to p's bits it scales p by 2^n. p(f) in [1, 2], so
//   the exponent field stays in [0, 255) for -127 <= n < 127.
#define EX2_POLY_C1 6.951167583e-01f  // 0x3f31f32c
#define EX2_POLY_C2 2.276449949e-01f  // 0x3e691bc5
#define EX2_POLY_C3 7.706703991e-02f  // 0x3d9dd553
__device__ __forceinline__ float ex2_poly(float x) {
    constexpr float RND = 12582912.f;  // 1.5 * 2^23
    x = fmaxf(x, -127.f);
    float r = __fadd_rd(x, RND);
    float f = x - (r - RND);
    float p = fmaf(fmaf(fmaf(EX2_POLY_C3, f, EX2_POLY_C2), f, EX2_POLY_C1), f, 1.f);
    return __uint_as_float(__float_as_uint(p) + (__float_as_uint(r) << 23));
}

// Logits of one warp's 16 rows of a BC-key tile in the accumulator layout (thread: rows g, g + 8;
// columns 2 tq, 2 tq + 1 of each 8-column block): x = s * scale_log2 + d_j (d_j as above, from the
// tile's c_j in sCb; 0 without gate), -inf where MASK and the column offset k (0..BC-1, less 2 tq)
// is outside [lo_r, hi_r]; mx: each row's maximum over the thread's entries
template<int BC, bool GATE, bool MASK>
__device__ __forceinline__ void v9_logits(float* s, float mx[2], const float* sCb, float cref_l2, int tq,
                                          float scale_log2, const int* hi, const int* lo) {
    mx[0] = mx[1] = -INFINITY;
    #pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
        float2 cj = GATE ? *(const float2*)(sCb + nt * 8 + 2 * tq) : make_float2(0.f, 0.f);
        float d[2] = {GATE ? fmaf(-cj.x, LOG2E, cref_l2) : 0.f, GATE ? fmaf(-cj.y, LOG2E, cref_l2) : 0.f};
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            int kc = nt * 8 + (e & 1);  // compile-time: the bounds carry the thread's 2 tq
            float x = fmaf(s[nt * 4 + e], scale_log2, d[e & 1]);
            x = MASK && (kc > hi[e / 2] || kc < lo[e / 2]) ? -INFINITY : x;
            s[nt * 4 + e] = x;
            mx[e / 2] = fmaxf(mx[e / 2], x);
        }
    }
}

// load_tile_swz with a compile-time trip count: a thread copies chunk tid % (HD/8) of rows
// tid / (HD/8) + i * NTHREADS / (HD/8), steps of whole 8-row groups, so its swizzled offset is
// computed once and the loop unrolls. load_tile_swz's loop (its trip count depends on threadIdx.x)
// stays a runtime loop with remainder handling: ~450 SASS instructions around the 8 cp.async of a
// 128-key K/V tile per thread (H200 build of version 9).
template<int ROWS, int HD, int NTHREADS>
__device__ __forceinline__ void load_tile_unrolled(bf16* sm, const bf16* g, int row0, int T, int stride) {
    constexpr int CH = HD / 8, RSTEP = NTHREADS / CH;
    static_assert(NTHREADS % CH == 0 && RSTEP % 8 == 0 && ROWS % RSTEP == 0, "whole 8-row groups per step");
    int r0 = threadIdx.x / CH, ch = threadIdx.x % CH;
    bf16* st = sm + swz_off<ROWS>(r0, ch);
    const bf16* gc = g + ch * 8;
    #pragma unroll
    for (int i = 0; i < ROWS / RSTEP; i++) {
        int row = row0 + r0 + i * RSTEP;
        bool ok = row < T;
        cp_async16(st + i * RSTEP * 64, gc + (size_t)(ok ? row : 0) * stride, ok);
    }
}

// p = 2^(x - m) and l += its row sums (per-thread partials; the quad sums once at the end).
// EMU of every 8 scores of a thread (two 8-column blocks: 4 columns of rows g and g + 8) take
// ex2_poly, the others ex2.approx.ftz: EMU = 2 (version 12) computes 1/4 of them on the FMA pipe,
// the same count in both rows; EMU = 0 is version 9's and 10's code. l sums the very p that is
// rounded to bf16 for P V, whichever function made it.
template<int BC, int EMU = 0>
__device__ __forceinline__ void v9_exp(float* s, float l[2], const float m[2]) {
    static_assert(EMU >= 0 && EMU <= 8 && EMU % 2 == 0, "EMU: an even count out of 8");
    #pragma unroll
    for (int i = 0; i < BC / 2; i++) {
        // the thread's 4 columns of two blocks are slots 0..3; the first EMU / 2 slots take the
        // polynomial in both rows (compile-time after unrolling)
        bool emu = ((i / 4) % 2) * 2 + (i & 1) < EMU / 2;
        float x = s[i] - m[(i / 2) & 1];
        s[i] = emu ? ex2_poly(x) : ex2_ftz(x);
        l[(i / 2) & 1] += s[i];
    }
}

// o = acc / l (bf16) and lse = ln(sum) of the thread's rows below T (m: the row maximum in
// absolute log2 units); ob, lse_bh: this (b, h)'s o at token 0 and lse row
template<int HD>
__device__ __forceinline__ void v9_store(bf16* ob, float* lse_bh, const float* acc, const float l[2], const float m[2],
                                         const int rows[2], int tq, int T, int stride_o) {
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = l[r] + __shfl_xor_sync(0xffffffff, l[r], 1);  // the quad's partial sums, fixed order
        sum += __shfl_xor_sync(0xffffffff, sum, 2);
        if (rows[r] >= T) continue;
        bf16* orow = ob + (size_t)rows[r] * stride_o + 2 * tq;
        float inv = 1.f / sum;
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *(__nv_bfloat162*)(orow + dt * 8) = __floats2bfloat162_rn(acc[dt * 4 + 2 * r] * inv,
                                                                      acc[dt * 4 + 2 * r + 1] * inv);
        if (tq == 0) lse_bh[rows[r]] = (m[r] + log2f(sum)) * LN2;  // natural log
    }
}

template<int HD, int BC, int ST, bool GATE>
__global__ void __launch_bounds__(256, HD == 64 ? 2 : 1) fox_forward_kernel9(bf16* o, float* lse, const bf16* q,
                                                                             const bf16* k, const bf16* v,
                                                                             const float* c, int T, int H,
                                                                             int stride_qkv, int stride_o, int window,
                                                                             float scale_log2, const int* key_start) {
    constexpr int BR = 128;
    constexpr int PD = ST - 1;  // tile n + PD is loaded into the stage of tile n - 1 once all are past it
    static_assert(PD >= 1, "at least one tile in flight");
    static_assert(BR == PRUNE_BLOCK && PRUNE_BLOCK % BC == 0, "a query tile is one pruning tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_1k(smem_raw);     // (BR, HD) swizzled tiles
    bf16* sK = sQ + BR * HD;                 // (ST, BC, HD)
    bf16* sV = sK + ST * BC * HD;            // (ST, BC, HD)
    float* sC = (float*)(sV + ST * BC * HD); // (ST, BC)

    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first: causal tiles are uneven
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4, wg = warp / 4;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    const bf16 *qb = q + base, *kb = k + base, *vb = v + base;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR, i0w = i0 + 64 * wg;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0;
    int jt_begin = j_begin / BC, jt_end = (min(T, i0 + BR) + BC - 1) / BC;
    // pruned key tiles are never loaded (never the diagonal one, so jt_begin < jt_end)
    if (key_start) jt_begin = max(jt_begin, key_start[(size_t)bh * gridDim.x + qt] * (PRUNE_BLOCK / BC));
    int ntiles = jt_end - jt_begin;  // tile n is key tile jt_end - 1 - n: from the diagonal backwards

    load_tile_unrolled<BR, HD, 256>(sQ, qb, i0, T, stride_qkv);
    auto load_kv = [&](int n) {
        int st = n % ST, j1 = (jt_end - 1 - n) * BC;
        load_tile_unrolled<BC, HD, 256>(sK + st * BC * HD, kb, j1, T, stride_qkv);
        load_tile_unrolled<BC, HD, 256>(sV + st * BC * HD, vb, j1, T, stride_qkv);
        if (GATE) load_vec_async<BC>(sC + st * BC, cb, j1, T);
    };
    #pragma unroll
    for (int n = 0; n < PD; n++) {
        if (n < ntiles) load_kv(n);
        cp_async_commit();  // possibly empty: one group per tile keeps the wait counts fixed
    }

    int rows[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
    float cref_l2 = GATE ? cb[min(rows[0], T - 1)] * LOG2E : 0.f;  // c_ref log2(e), rounded once
    // m: row maxima of x so far (lazy); below any logit until the first visible key
    float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.f, 0.f}, acc[HD / 2];
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) acc[e] = 0.f;

    for (int n = 0; n < ntiles; n++) {
        cp_async_wait<PD - 1>();  // this thread's part of tile n has landed
        fence_async_smem();
        __syncthreads();  // tile n visible to all; everyone is past the tile whose stage is refilled now
        if (n + PD < ntiles) load_kv(n + PD);
        cp_async_commit();
        int st = n % ST, j0 = (jt_end - 1 - n) * BC;
        // none of this warpgroup's rows sees the tile (above its diagonal, before its window, past T)
        if (j0 > i0w + 63 || i0w >= T || (window > 0 && j0 + BC - 1 <= i0w - window)) continue;
        const bf16 *sKb = sK + st * BC * HD, *sVb = sV + st * BC * HD;
        const float* sCb = sC + st * BC;

        float s[BC / 2];
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<BC>(s, desc_k<BR>(sQ, wg * 8, kk), desc_k<BC>(sKb, 0, kk), kk);
        wgmma_commit();
        wgmma_wait0();
        wgmma_pin<BC / 2>(s);

        float mx[2];
        if ((j0 + BC - 1 > i0w) || (j0 + BC > T) || (window > 0 && j0 <= i0w + 63 - window)) {
            int hi[2], lo[2];  // visible column offsets of each row, less this thread's 2 tq
            #pragma unroll
            for (int r = 0; r < 2; r++) {
                hi[r] = min(rows[r], T - 1) - j0 - 2 * tq;
                lo[r] = (window > 0 ? rows[r] - window + 1 - j0 : -BC) - 2 * tq;
            }
            v9_logits<BC, GATE, true>(s, mx, sCb, cref_l2, tq, scale_log2, hi, lo);
        } else {
            v9_logits<BC, GATE, false>(s, mx, sCb, cref_l2, tq, scale_log2, nullptr, nullptr);
        }
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
        }
        if (__any_sync(0xffffffff, mx[0] > m[0] + LAZY_RESCALE_LOG2 || mx[1] > m[1] + LAZY_RESCALE_LOG2)) {
            #pragma unroll
            for (int r = 0; r < 2; r++) {
                float m_new = fmaxf(m[r], mx[r]);
                float alpha = ex2_ftz(m[r] - m_new);  // 0 from the -FLT_MAX start
                l[r] *= alpha;
                #pragma unroll
                for (int dt = 0; dt < HD / 8; dt++) { acc[dt * 4 + 2 * r] *= alpha; acc[dt * 4 + 2 * r + 1] *= alpha; }
                m[r] = m_new;
            }
        }
        v9_exp<BC>(s, l, m);
        // O += P V
        uint32_t pa[BC / 16][4];
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) acc_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(acc, pa[kk], desc_mn<BC>(sVb, kk), 1);
        wgmma_commit();
        wgmma_wait0();
        wgmma_pin<HD / 2>(acc); wgmma_pin_a<BC / 16>(pa);
    }
    float m_abs[2];  // m + r_i: the maximum in absolute log2 units
    #pragma unroll
    for (int r = 0; r < 2; r++) m_abs[r] = m[r] + ((GATE && rows[r] < T) ? fmaf(cb[rows[r]], LOG2E, -cref_l2) : 0.f);
    v9_store<HD>(o + (size_t)b * T * stride_o + (size_t)h * HD, lse + (size_t)bh * T, acc, l, m_abs, rows, tq, T,
                 stride_o);
}

// version 9: 128-key tiles, 2 stages, at both head sizes
static void fox_forward9(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c, int B, int T,
                         int H, int hd, int stride_qkv, int stride_o, int window, const int* key_start) {
    by_shape(hd, c, [&](auto HD, auto GATE) {
        constexpr int BR = 128, BC = 128, ST = 2;
        // Q, ST K/V stages and c stages, + 1 KB to align the tiles to the swizzle pattern
        constexpr size_t smem = 1024 + (size_t)(BR + 2 * ST * BC) * HD * sizeof(bf16) + ST * BC * sizeof(float);
        auto kernel = fox_forward_kernel9<HD, BC, ST, GATE>;
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kernel<<<dim3(ceil_div(T, BR), B * H), 256, smem>>>(o, lse, q, k, v, c, T, H, stride_qkv, stride_o, window,
                                                            LOG2E / sqrtf((float)HD), GATE ? key_start : nullptr);
        launchCheck();
    });
}
// Versions 10, 12 and 14: version 9's softmax in version 8's structure, shaped as FlashAttention-3
// shapes hd 64. What changed against version 9 (hd 64; hd 128: version 14 below; versions 10 and 12
// run version 9 there):
// - Why: version 9 is latency-bound (ncu: 47% issue slots, 1.2 eligible warps per scheduler,
//   tensor pipe 35%). Each warpgroup waits for its S, then for its P V, and the two warpgroups of a
//   block meet at __syncthreads per tile, so a block's warpgroups run their softmax at the same
//   time and their matmuls at the same time. At hd 64 the exponentials alone (MUFU, 16 per clock
//   per SM) take as long as the two matmuls (2 * 64 * 128 * 64 MACs per warpgroup and tile at
//   2048 MACs per clock per SM): the two pipes must overlap, not take turns.
// - Intra-warpgroup overlap (version 8's pipeline): a consumer issues tile n's S = Q K^T and
//   tile n-1's O += P V back to back, waits only for S (wgmma groups retire in order), runs tile
//   n's softmax while P V still holds the tensor cores, then waits for P V, rescales O (lazily)
//   and refills P. So each warpgroup keeps the tensor pipe busy under its own exponentials.
// - The register cost: S of tile n (64 fp32 per thread at 128-key tiles), P of tile n-1 (32 bf16x2
//   A fragments, read by the in-flight P V) and O (32) are live together: 128 registers before
//   any address, maximum or sum, which version 9's 128-register budget (two blocks of 256 threads
//   per SM) cannot hold. Hence one block per SM of NWG consumer warpgroups and a producer
//   warpgroup, with setmaxnreg moving registers to the consumers: NWG = 3 (version 10, BR = 192
//   rows: FlashAttention-3's hd-64 shape): 24 for the producer, 160 for the consumers (24 * 128 +
//   160 * 384 = 64512 <= 65536); NWG = 2 (archived version 11, BR = 128, version 8's split): 24 / 240.
//   Version 10 keeps 12 consumer warps per SM (version 9: 16), each with its own overlap.
// - No block-wide barrier: a producer warp loads Q and K/V tiles by TMA into separate K and V
//   rings (ST stages each) with full/empty mbarriers (version 8's helpers and tensor maps; c_j by
//   4-byte cp.async arriving on K's full barrier). K(n) is released after tile n's logits, V(n-1)
//   after the P V wait, so a warpgroup that is ahead runs on without waiting for the others, and
//   the warpgroups drift out of phase (one's softmax under another's matmuls). One block per SM
//   makes the shared memory cheap: ST = 3 (version 10: 24 + 6 * 16 KB).
// - Tiles from the diagonal backwards (as version 9); each warpgroup computes only the contiguous
//   range of tiles [na, nb) its rows see (its diagonal, its window, the key_start of its own
//   128-row pruning tile: with BR = 192 a block spans two pruning tiles, so the block loads from
//   the smallest start of its warpgroups) and releases the other stages after their full barrier.
// - Descriptors built once per kernel (the consumer index made warp-uniform by a shuffle, so they
//   sit in uniform registers) and advanced by constants per k step and stage, as backward
//   version 12 does.
// Kept from version 9: gate terms per column with c_ref = c of the thread's first row (its precision
// argument is per thread and unchanged), the lazy maximum with threshold 2^8 (LAZY_RESCALE_LOG2,
// decided per warp; the rescale of O moves after the P V wait, with alpha kept from before it),
// ex2.approx.ftz, masks as two integer compares only on tiles touching the diagonal, the window
// edge or T, v9_store.
// EMU (version 12, 0 otherwise): EMU of every 8 scores of a thread take ex2_poly (FMA pipe) instead
// of ex2.approx.ftz (MUFU), in v9_exp; nothing else changes. At hd 64 MUFU.EX2 (16 per clock per
// SM) is as busy as the tensor pipe; the polynomial moves a share of that work onto the FMA pipe
// (128 per clock), about 9 issue slots each instead of 2.
// Version 14 is this kernel at hd 128 with NWG = 2, BC = 128, ST = 2 (FlashAttention-3's hd-128
// shape; the budget: at fox_forward10). Nothing but the K-major descriptors' k steps depends on HD
// beyond the template arithmetic: a k16 step moves 32 bytes inside a 64-column block, and at hd 128
// steps 4-7 are in the tile's second block, ROWS * 128 bytes on (kstep_bytes).

template<int HD, int BC, int ST, int NWG, bool GATE, int EMU = 0>
__global__ void __launch_bounds__(128 * (NWG + 1), 1) fox_forward_kernel10(bf16* o, float* lse,
                                                                           const __grid_constant__ CUtensorMap tmQ,
                                                                           const __grid_constant__ CUtensorMap tmK,
                                                                           const __grid_constant__ CUtensorMap tmV,
                                                                           const float* c, int T, int H, int stride_o,
                                                                           int window, float scale_log2,
                                                                           const int* key_start) {
    constexpr int BR = 64 * NWG;
    constexpr int CREG = NWG == 3 ? 160 : 240;  // consumer registers: (65536 - 24 * 128) / (128 NWG), multiple of 8
    // the register budgets argued: hd 64 (versions 10-12) and hd 128 with two consumers (version 14)
    static_assert(BC == 128 && (HD == 64 || (HD == 128 && NWG == 2)), "hd 64, or hd 128 with NWG = 2; 128-key tiles");
    static_assert(NWG == 2 || NWG == 3, "setmaxnreg split for 2 or 3 consumer warpgroups");
    static_assert(ST >= 2, "the producer loads K(n+1) before V(n)'s stage is free");
    static_assert(PRUNE_BLOCK % BC == 0 && PRUNE_BLOCK % 64 == 0, "a warpgroup's rows lie in one pruning tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_1k(smem_raw);     // (BR, HD) swizzled tiles
    bf16* sK = sQ + BR * HD;                 // (ST, BC, HD)
    bf16* sV = sK + ST * BC * HD;            // (ST, BC, HD)
    float* sC = (float*)(sV + ST * BC * HD); // (ST, BC)
    uint64_t* bar = (uint64_t*)(sC + ST * BC);
    uint64_t *barQ = bar, *fullK = bar + 1, *emptyK = fullK + ST, *fullV = emptyK + ST, *emptyV = fullV + ST;

    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first: causal tiles are uneven
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR;
    int jt_end = (min(T, i0 + BR) + BC - 1) / BC;
    // first key tile the rows i0w .. i0w + 63 see: their window, the key_start of their pruning tile
    auto first_tile = [&](int i0w) {
        int jt = window > 0 ? max(0, i0w - window + 1) / BC : 0;
        if (key_start) jt = max(jt, key_start[(size_t)bh * ((T + PRUNE_BLOCK - 1) / PRUNE_BLOCK) + i0w / PRUNE_BLOCK] *
                                    (PRUNE_BLOCK / BC));
        return jt;
    };
    int jt_begin = first_tile(i0);  // the block's: the smallest over its warpgroups with rows below T
    #pragma unroll
    for (int w = 1; w < NWG; w++)
        if (i0 + 64 * w < T) jt_begin = min(jt_begin, first_tile(i0 + 64 * w));
    int ntiles = jt_end - jt_begin;  // tile n is key tile jt_end - 1 - n: from the diagonal backwards

    // full barriers: the copy engine's arrival (+ the 32 c lanes on K's); empty: a warp of the consumers each
    if (threadIdx.x == 0) fox_ring_barriers<ST>(fullV, emptyV, 1, 4 * NWG);
    fox_ring_init<ST>(barQ, fullK, emptyK, 1 + (GATE ? 32 : 0), 4 * NWG);

    if (wg == 0) {  // producer: one warp issues every load, in tile order; K(n) before V(n)
        setmaxnreg_dec<24>();
        if (warp != 0) return;
        if (lane == 0) {
            mbar_expect_tx(barQ, BR * HD * sizeof(bf16));
            tma_load_tile<BR, HD>(sQ, &tmQ, i0, h, b, barQ);
        }
        for (int n = 0; n < ntiles; n++) {
            int st = n % ST, parity = ((n / ST) & 1) ^ 1, j0 = (jt_end - 1 - n) * BC;
            mbar_wait(&emptyK[st], parity);
            if (lane == 0) {
                mbar_expect_tx(&fullK[st], BC * HD * sizeof(bf16));
                tma_load_tile<BC, HD>(sK + st * BC * HD, &tmK, j0, h, b, &fullK[st]);
            }
            if (GATE) {
                #pragma unroll
                for (int e = lane; e < BC; e += 32) cp_async4(sC + st * BC + e, cb + min(j0 + e, T - 1), j0 + e < T);
                mbar_arrive_cp_async(&fullK[st]);
            }
            mbar_wait(&emptyV[st], parity);
            if (lane == 0) {
                mbar_expect_tx(&fullV[st], BC * HD * sizeof(bf16));
                tma_load_tile<BC, HD>(sV + st * BC * HD, &tmV, j0, h, b, &fullV[st]);
            }
        }
        return;
    }

    // consumers: warpgroup cw owns rows i0 + 64 cw ..; a warp 16 of them (rows g, g + 8 per thread)
    setmaxnreg_inc<CREG>();
    int cw = __shfl_sync(0xffffffff, wg - 1, 0);  // warp-uniform for the compiler: descriptors in uniform registers
    int cwarp = warp - 4, g = lane / 4, tq = lane % 4;
    int i0w = i0 + 64 * cw;
    int rows[2] = {i0 + cwarp * 16 + g, i0 + cwarp * 16 + g + 8};
    // visible tiles [na, nb): from the one holding the last row's diagonal to the first tile seen
    int na = ntiles, nb = ntiles;  // none when every row is past T
    if (i0w < T) {
        na = jt_end - 1 - min(i0w + 63, T - 1) / BC;
        nb = jt_end - first_tile(i0w);
    }
    // descriptors of k step 0: the swizzled K-major start moves 32 bytes per k16 step inside a
    // 64-column block (kstep_bytes), the N-major one 16 rows (mnstep_bytes); a stage is BC * HD * 2 bytes
    constexpr uint32_t STAGE = BC * HD * sizeof(bf16);
    const uint64_t dQ = desc_k<BR>(sQ, cw * 8, 0), dK0 = desc_k<BC>(sK, 0, 0),
                   dV0 = desc_mn<BC>(sV, 0);
    // a tile none of this warpgroup's rows sees: release its stages once loaded (a tile every
    // warpgroup skipped could otherwise be refilled under a copy still in flight)
    auto skip = [&](int n) {
        int st = n % ST, par = (n / ST) & 1;
        mbar_wait(&fullK[st], par);
        mbar_wait(&fullV[st], par);
        __syncwarp();
        if (lane == 0) { mbar_arrive(&emptyK[st]); mbar_arrive(&emptyV[st]); }
    };

    float cref_l2 = GATE ? cb[min(rows[0], T - 1)] * LOG2E : 0.f;  // c_ref log2(e), rounded once
    // m: row maxima of x so far (lazy); below any logit until the first visible key
    float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.f, 0.f}, acc[HD / 2];
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) acc[e] = 0.f;
    uint32_t pa[BC / 16][4];  // P of the previous tile, read by its P V matmul under this tile's softmax
    for (int n = 0; n < na; n++) skip(n);
    mbar_wait(barQ, 0);
    for (int n = na; n < nb; n++) {
        int st = n % ST, pst = (n + ST - 1) % ST;  // this tile's stage, the previous tile's
        mbar_wait(&fullK[st], (n / ST) & 1);
        if (n > na) mbar_wait(&fullV[pst], ((n - 1) / ST) & 1);
        const float* sCb = sC + st * BC;
        const uint64_t dK = desc_add(dK0, st * STAGE);

        // S = Q K^T of this tile, then O += P V of the previous one: the softmax below runs under it
        float s[BC / 2];
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<BC>(s, desc_add(dQ, kstep_bytes<BR>(kk)), desc_add(dK, kstep_bytes<BC>(kk)), kk);
        wgmma_commit();
        if (n > na) {
            const uint64_t dV = desc_add(dV0, pst * STAGE);
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(acc, pa[kk], desc_add(dV, mnstep_bytes(kk)), 1);
            wgmma_commit();
            wgmma_wait<1>();  // in each branch: a join between the issue and the wait serializes the wgmma's (C7514)
        } else {
            wgmma_wait0();
        }
        wgmma_pin<BC / 2>(s);

        int j0 = (jt_end - 1 - n) * BC;
        float mx[2];
        if ((j0 + BC - 1 > i0w) || (j0 + BC > T) || (window > 0 && j0 <= i0w + 63 - window)) {
            int hi[2], lo[2];  // visible column offsets of each row, less this thread's 2 tq
            #pragma unroll
            for (int r = 0; r < 2; r++) {
                hi[r] = min(rows[r], T - 1) - j0 - 2 * tq;
                lo[r] = (window > 0 ? rows[r] - window + 1 - j0 : -BC) - 2 * tq;
            }
            v9_logits<BC, GATE, true>(s, mx, sCb, cref_l2, tq, scale_log2, hi, lo);
        } else {
            v9_logits<BC, GATE, false>(s, mx, sCb, cref_l2, tq, scale_log2, nullptr, nullptr);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&emptyK[st]);  // K(n) read by S, c_j read above: the stage is free
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
        }
        // lazy maximum: O is scaled by alpha after the P V wait (P V adds P of the old maximum)
        bool resc = __any_sync(0xffffffff, mx[0] > m[0] + LAZY_RESCALE_LOG2 || mx[1] > m[1] + LAZY_RESCALE_LOG2);
        float alpha[2] = {1.f, 1.f};
        if (resc) {
            #pragma unroll
            for (int r = 0; r < 2; r++) {
                float m_new = fmaxf(m[r], mx[r]);
                alpha[r] = ex2_ftz(m[r] - m_new);  // 0 from the -FLT_MAX start
                l[r] *= alpha[r];
                m[r] = m_new;
            }
        }
        v9_exp<BC, EMU>(s, l, m);
        wgmma_wait0();  // the previous tile's P V: its V stage is free, O can be rescaled, pa refilled
        wgmma_pin<HD / 2>(acc); wgmma_use_a<BC / 16>(pa);
        if (n > na && lane == 0) mbar_arrive(&emptyV[pst]);
        if (resc) {
            #pragma unroll
            for (int dt = 0; dt < HD / 8; dt++) {
                acc[dt * 4] *= alpha[0]; acc[dt * 4 + 1] *= alpha[0];
                acc[dt * 4 + 2] *= alpha[1]; acc[dt * 4 + 3] *= alpha[1];
            }
        }
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) acc_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
    }
    if (na < nb) {  // the last tile's P V
        int pst = (nb - 1) % ST;
        mbar_wait(&fullV[pst], ((nb - 1) / ST) & 1);
        const uint64_t dV = desc_add(dV0, pst * STAGE);
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(acc, pa[kk], desc_add(dV, mnstep_bytes(kk)), 1);
        wgmma_commit();
        wgmma_wait0();
        wgmma_pin<HD / 2>(acc); wgmma_use_a<BC / 16>(pa);
        __syncwarp();
        if (lane == 0) mbar_arrive(&emptyV[pst]);
    }
    for (int n = nb; n < ntiles; n++) skip(n);
    if (i0w >= T) return;
    float m_abs[2];  // m + r_i: the maximum in absolute log2 units
    #pragma unroll
    for (int r = 0; r < 2; r++) m_abs[r] = m[r] + ((GATE && rows[r] < T) ? fmaf(cb[rows[r]], LOG2E, -cref_l2) : 0.f);
    v9_store<HD>(o + (size_t)b * T * stride_o + (size_t)h * HD, lse + (size_t)bh * T, acc, l, m_abs, rows, tq, T,
                 stride_o);
}

// Version 14 is kernel 10 at hd 128 with NWG = 2 consumer warpgroups (BR = 128 query rows),
// 128-key tiles, ST = 2 stages (FlashAttention-3's hd-128 causal shape); at hd 64 it is version 10.
// Why this shape, per consumer thread (a 64-row warpgroup):
// - Registers: O (64 x 128 fp32) 64, S of a 64 x BC tile BC / 2, P of the previous tile (bf16 A
//   fragments, read by the in-flight P V) BC / 4, live together in the overlap; + ~30 for maxima,
//   sums, bounds, c_ref, addresses. NWG = 3 leaves 160 per consumer (producer 24): BC = 128 needs
//   ~190 (no), BC = 64 ~145 (fits). NWG = 2 leaves 240 (24 x 128 + 240 x 256 = 64512): BC = 128
//   fits with ~50 to spare (ptxas with the cap lowered: no spills down to 192, spills at 184).
//   Chosen NWG = 2, BC = 128: per key half the mbarrier waits, row-maximum shuffles and wgmma
//   issues of 64-key tiles, and S as m64n128k16 (6 KB of shared memory per 64 tensor clocks, 96 B a
//   clock; m64n64k16 reads 4 KB per 32, 128 B a clock: all of the SM's shared-memory bandwidth).
//   At hd 128 a tile's two matmuls (2 x 64 x 128 x 128 MACs per warpgroup, 1024 clocks at 2048 per
//   clock per SM) take twice its exponentials (64 x 128 MUFU.EX2 at 16 per clock: 512), so the
//   tensor pipe bounds it and two overlapping warpgroups can keep it busy; at hd 64 the two took
//   equally long and three warpgroups won (version 11, archived).
// - Shared memory: Q 128 x 128 bf16 = 32 KB, a K or V stage 32 KB, c 512 bytes a stage: ST = 2 is
//   1 KB (alignment) + 32 + 4 x 32 KB + 1 KB + 72 bytes of barriers = 165960 bytes (162.1 KB).
// - Precision, masks, windows, key_start, lse: version 10's code unchanged (per thread c_ref, so its
//   argument does not depend on the head size; BR = 128 is one pruning tile).
// Versions 10 (EMU = 0) and 12 (EMU = 2) run version 9 at hd 128; V14: this kernel there.
template<int EMU, bool V14 = false>
static void fox_forward10(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c, int B,
                          int T, int H, int hd, int stride_qkv, int stride_o, int window, const int* key_start) {
    by_shape(hd, c, [&](auto HD, auto GATE) {
        if constexpr (HD == 128 && !V14) {
            fox_forward9(o, lse, q, k, v, c, B, T, H, hd, stride_qkv, stride_o, window, key_start);
        } else {
            constexpr int BC = 128, NWG = HD == 64 ? 3 : 2, ST = HD == 64 ? 3 : 2, BR = 64 * NWG;
            // Q, ST stages of K, V and c, the barriers, + 1 KB to align the tiles to the swizzle pattern
            constexpr size_t smem = 1024 + (size_t)(BR + 2 * ST * BC) * HD * sizeof(bf16) + ST * BC * sizeof(float) +
                                    (1 + 4 * ST) * sizeof(uint64_t);
            auto kernel = fox_forward_kernel10<HD, BC, ST, NWG, GATE, EMU>;
            cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            CUtensorMap tq = fox_tensor_map(q, B, T, H, HD, stride_qkv, BR),
                        tk = fox_tensor_map(k, B, T, H, HD, stride_qkv, BC),
                        tv = fox_tensor_map(v, B, T, H, HD, stride_qkv, BC);
            kernel<<<dim3(ceil_div(T, BR), B * H), 128 * (NWG + 1), smem>>>(o, lse, tq, tk, tv, c, T, H, stride_o,
                                                                             window, LOG2E / sqrtf((float)HD),
                                                                             GATE ? key_start : nullptr);
            launchCheck();
        }
    });
}
// ----------------------------------------------------------------------------
// the ladder

static const std::vector<int> FWD_KEPT = {1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 14, 16};

// key_start: a pruning table (versions 8-16; NULL: dense)
static void run_forward(int version, bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                        int B, int T, int H, int hd, int sq, int so, int w, const int* key_start = nullptr) {
    switch (version) {
        case 1: fox_forward1<float, bf16>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w); break;
        case 2: fox_forward2(o, lse, q, k, v, c, B, T, H, hd, sq, so, w); break;
        case 3: fox_forward3<1>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr); break;
        case 4: fox_forward3<2>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr); break;
        case 5: fox_forward5<1>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr); break;
        case 6: fox_forward5<2>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr); break;
        case 8: fox_forward8(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, key_start); break;
        case 9: fox_forward9(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, key_start); break;
        case 10: fox_forward10<0>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, key_start); break;
        // version 10 with 2 of every 8 exponentials by ex2_poly
        case 12: fox_forward10<2>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, key_start); break;
        case 14: fox_forward10<0, true>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, key_start); break;
        // train_fox.cu's forward, exactly as it trains (pruned only where c is given)
        case 16: fox_attention_forward(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, c ? key_start : nullptr, nullptr, 0);
                 break;
        default: fprintf(stderr, "version %d is not in this ladder\nHINT: see dev/cuda/README.md\n", version);
                 exit(EXIT_FAILURE);
    }
}

// o_ref: (B, T, H, hd) compact, lse_ref (B, H, T); both double
static bool check_forward(const FoxProblem& p, const FoxDev& d, const double* o_ref, const double* lse_ref) {
    std::vector<bf16> o = d2h(d.o, p.n_o);
    std::vector<float> lse = d2h(d.lse, p.n_bht);
    size_t C = (size_t)p.H * p.hd;
    ErrStat so = compare((size_t)p.B * p.T * C, [&](size_t e, double* g, double* r) {
        size_t bt = e / C, x = e % C;
        *g = __bfloat162float(o[bt * p.stride_o + x]); *r = o_ref[e];
    });
    ErrStat sl = compare(p.n_bht, [&](size_t e, double* g, double* r) { *g = lse[e]; *r = lse_ref[e]; });
    bool ok = report("o", so, TOL_BF16);
    bool ok2 = sl.nonfinite == 0 && sl.max_abs <= TOL_LSE_ABS;
    printf("    %-6s max_abs %.3e  nonfinite %zu/%zu  (tol %.0e abs) %s\n", "lse", sl.max_abs, sl.nonfinite, sl.n,
           TOL_LSE_ABS, ok2 ? "ok" : "FAIL");
    return ok && ok2;
}

// poisoned outputs, one run of `version` (on `cap` blocks for version 16's persistent grid when > 0), the check
static bool run_and_check(int version, const FoxProblem& p, const FoxDev& d, const double* o_ref,
                          const double* lse_ref, const int* key_start, int cap) {
    test_hooks.fwd_max_blocks = cap;
    poison(d.o, p.n_o); poison(d.lse, p.n_bht);
    printf("  version %d", version);
    if (cap) printf(" on %d block(s)", cap);
    printf("\n");
    run_forward(version, d.o, d.lse, d.qkv + p.q_off, d.qkv + p.k_off, d.qkv + p.v_off, d.c, p.B, p.T, p.H, p.hd,
                p.stride_qkv, p.stride_o, p.window, key_start);
    sync_or_exit("the version above", 120);
    test_hooks.fwd_max_blocks = 0;
    return check_forward(p, d, o_ref, lse_ref);
}

// ex2_poly (version 12) against exp2 in fp64 on the device, over every fp32 x in [-126, 0] (n_neg
// values from -0 down) and [0, LAZY_RESCALE_LOG2] (n_pos from +0 up): the range of x - m in v9_exp
// with normal results (the lazy maximum keeps x <= 2^8). err_bits: the largest relative error as
// float bits (unsigned order = float order for values >= 0); bad: a wrong value at the flush end
// (x <= -127, -inf: 0) or at an integer x (exact powers of two)
__global__ void ex2_poly_check_kernel(unsigned* err_bits, int* bad, uint32_t n_neg, uint32_t n_pos) {
    float mx = 0.f;
    uint64_t n = (uint64_t)n_neg + n_pos, step = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        float x = __uint_as_float(i < n_neg ? 0x80000000u + (uint32_t)i : (uint32_t)(i - n_neg));
        mx = fmaxf(mx, (float)fabs((double)ex2_poly(x) / exp2((double)x) - 1.0));
    }
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
    if (threadIdx.x % 32 == 0) atomicMax(err_bits, __float_as_uint(mx));
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *bad = !(ex2_poly(-127.f) == 0.f && ex2_poly(-1000.f) == 0.f && ex2_poly(-INFINITY) == 0.f &&
                 ex2_poly(-126.f) == 0x1p-126f && ex2_poly(-3.f) == 0.125f && ex2_poly(0.f) == 1.f &&
                 ex2_poly(8.f) == 256.f);
}
#define TOL_EX2_POLY 1e-4  // ex2_poly's largest relative error (8.57e-5 measured on the host)

static bool check_ex2_poly(int sms) {
    float lo = -126.f, hi = LAZY_RESCALE_LOG2;
    uint32_t lo_bits, hi_bits;
    memcpy(&lo_bits, &lo, 4); memcpy(&hi_bits, &hi, 4);
    unsigned* err_d = dmalloc<unsigned>(1);
    int* bad_d = dmalloc<int>(1);
    cudaCheck(cudaMemset(err_d, 0, sizeof(unsigned)));
    ex2_poly_check_kernel<<<sms * 8, 256>>>(err_d, bad_d, lo_bits - 0x80000000u + 1, hi_bits + 1);
    launchCheck();
    unsigned err_bits = d2h(err_d, 1)[0];
    int bad = d2h(bad_d, 1)[0];
    float err;
    memcpy(&err, &err_bits, 4);
    bool ok = !bad && err <= TOL_EX2_POLY;
    printf("ex2_poly (version 12), every fp32 x in [-126, %g] against fp64: max rel error %.3e (tol %.0e), "
           "flush and powers of two %s: %s\n", hi, err, TOL_EX2_POLY, bad ? "wrong" : "exact", ok ? "ok" : "FAIL");
    cudaCheck(cudaFree(err_d)); cudaCheck(cudaFree(bad_d));
    return ok;
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // line by line into a log too: a hung version shows where
    std::vector<int> vers = pick_versions(argc, argv, FWD_KEPT);
    auto has = [&](int v) { return std::find(vers.begin(), vers.end(), v) != vers.end(); };
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    bool all_ok = true;
    if (has(12)) all_ok &= check_ex2_poly(prop.multiProcessorCount);  // 0. version 12's software 2^x

    // 1. small shapes against the fp64 CPU reference (version 16 also on 1 and 5 blocks: its rings
    // then cross pairs at every shape); the fp64 GPU reference against the CPU too
    for (const SmallCase& cf : SMALL_CASES) {
        FoxProblem p = make_problem(cf.B, cf.T, cf.H, cf.hd, cf.window, cf.packed, cf.gate, cf.o_pad);
        std::vector<double> o_ref((size_t)p.B * p.T * p.H * p.hd), lse_ref(p.n_bht);
        fox_forward_cpu(o_ref.data(), lse_ref.data(), p.qkvf.data() + p.q_off, p.qkvf.data() + p.k_off,
                        p.qkvf.data() + p.v_off, p.gate ? p.c.data() : nullptr,
                        p.B, p.T, p.H, p.hd, p.stride_qkv, p.window);
        FoxDev d = upload(p, false);
        printf("B=%d T=%d H=%d hd=%d window=%d packed=%d gate=%s\n", p.B, p.T, p.H, p.hd, p.window, (int)p.packed,
               p.gate ? "yes" : "none");
        for (int ver : vers)
            for (int cap : {0, 1, 5})
                if (!cap || ver == 16) all_ok &= run_and_check(ver, p, d, o_ref.data(), lse_ref.data(), nullptr, cap);
        double *o64 = dmalloc<double>(o_ref.size()), *lse64 = dmalloc<double>(p.n_bht);
        poison(o64, o_ref.size()); poison(lse64, p.n_bht);
        fox_forward1<double, double>(o64, lse64, d.qkv + p.q_off, d.qkv + p.k_off, d.qkv + p.v_off, d.c,
                                     p.B, p.T, p.H, p.hd, p.stride_qkv, p.H * p.hd, p.window);
        std::vector<double> og = d2h(o64, o_ref.size()), lg = d2h(lse64, p.n_bht);
        ErrStat s64 = compare(og.size(), [&](size_t e, double* g, double* r) { *g = og[e]; *r = o_ref[e]; });
        ErrStat l64 = compare(lg.size(), [&](size_t e, double* g, double* r) { *g = lg[e]; *r = lse_ref[e]; });
        printf("  fp64 GPU reference\n");
        all_ok &= report("o", s64, 1e-12) & report("lse", l64, 1e-12);
        cudaCheck(cudaFree(o64)); cudaCheck(cudaFree(lse64));
        release(d);
    }

    // 1b. the key_start pruning of versions 8-16: random first key tiles (up to the diagonal one)
    // against the CPU reference that skips the same keys; hd 64 and 128, with and without a window
    // (version 10's 192-row blocks span two pruning tiles)
    for (int ver : vers) {
        if (ver < 8) continue;
        for (int pc = 0; pc < 4; pc++)
            for (int cap : {0, 1, 5}) {
                if (cap && ver != 16) continue;
                int hd = pc == 1 || pc == 3 ? 128 : 64;
                FoxProblem p = make_problem(2, 600, 2, hd, pc == 0 || pc == 3 ? 0 : 300, true, -1);
                std::vector<int> ks = random_tables(p.B * p.H, p.T, false);  // key_start only
                std::vector<double> o_ref((size_t)p.B * p.T * p.H * p.hd), lse_ref(p.n_bht);
                fox_forward_cpu(o_ref.data(), lse_ref.data(), p.qkvf.data() + p.q_off, p.qkvf.data() + p.k_off,
                                p.qkvf.data() + p.v_off, p.c.data(), p.B, p.T, p.H, p.hd, p.stride_qkv, p.window,
                                ks.data());
                FoxDev d = upload(p, false);
                int* ks_d = dmalloc<int>(ks.size()); h2d(ks_d, ks);
                printf("B=%d T=%d H=%d hd=%d window=%d packed, pruned (random key_start)\n", p.B, p.T, p.H, p.hd,
                       p.window);
                all_ok &= run_and_check(ver, p, d, o_ref.data(), lse_ref.data(), ks_d, cap);
                cudaCheck(cudaFree(ks_d));
                release(d);
            }
    }

    // 2. long sequences with extreme gates, against the fp64 GPU reference
    struct Long { int T, H, hd, window; double gate; const char* what; };
    Long longs[] = {
        {65536, 2, 64, 0, 5.0, "log f ~ -5 (strong decay)"},
        {65536, 2, 64, 0, 1e-4, "log f ~ -1e-4 (nearly one)"},
        {16384, 2, 128, 2048, 1e-4, "hd 128, window 2048, nearly one"},
        {16384, 2, 128, 0, 5.0, "hd 128, log f ~ -5 (strong decay)"},
    };
    for (const Long& L : longs) {
        FoxProblem p = make_problem(1, L.T, L.H, L.hd, L.window, false, L.gate);
        FoxDev d = upload(p, false);
        size_t n_ref = (size_t)p.T * p.H * p.hd;
        double *o64 = dmalloc<double>(n_ref), *lse64 = dmalloc<double>(p.n_bht);
        fox_forward1<double, double>(o64, lse64, d.qkv + p.q_off, d.qkv + p.k_off, d.qkv + p.v_off, d.c,
                                     p.B, p.T, p.H, p.hd, p.stride_qkv, p.H * p.hd, p.window);
        std::vector<double> o_ref = d2h(o64, n_ref), lse_ref = d2h(lse64, p.n_bht);
        printf("T=%d H=%d hd=%d window=%d %s\n", p.T, p.H, p.hd, p.window, L.what);
        for (int ver : vers)  // v1 in fp32 is the reference's twin, and slow
            if (ver > 1) all_ok &= run_and_check(ver, p, d, o_ref.data(), lse_ref.data(), nullptr, 0);
        cudaCheck(cudaFree(o64)); cudaCheck(cudaFree(lse64));
        release(d);
    }
    if (!all_ok) { printf("VALIDATION FAILED: no timing\n"); return EXIT_FAILURE; }

    // 3. timing on the benchmark shapes, every version but 1 in turns, 30 rounds (version 1: 3 runs,
    // at the first shape only: seconds each)
    printf("\nforward, causal, gate on: TFLOP/s (ms)\n%-22s", "B x H x T x hd");
    for (int ver : vers) printf("   version %-2d        ", ver);
    printf("\n");
    for (const auto& sh : BENCH_SHAPES) {
        int B = sh[0], H = sh[1], T = sh[2], hd = sh[3];
        FoxProblem p = make_problem(B, T, H, hd, 0, false, 0.05);
        FoxDev d = upload(p, false);
        char name[64]; snprintf(name, sizeof(name), "%d x %d x %d x %d", B, H, T, hd);
        printf("%-22s", name);
        auto launch = [&](int ver) {
            run_forward(ver, d.o, d.lse, d.qkv + p.q_off, d.qkv + p.k_off, d.qkv + p.v_off, d.c,
                        B, T, H, hd, p.stride_qkv, p.stride_o, 0);
        };
        std::vector<std::function<void()>> fs;
        for (int ver : vers) if (ver > 1) fs.push_back([&, ver]() { launch(ver); });
        std::vector<float> med = time_medians(fs, 1, 30);
        size_t k = 0;
        for (int ver : vers) {
            if (ver == 1 && &sh != &BENCH_SHAPES[0]) { printf("   %19s", "-"); continue; }
            float ms = ver == 1 ? time_medians({[&]() { launch(1); }}, 1, 3)[0] : med[k++];
            printf("   %7.1f (%8.3f)", attn_fwd_flops(B, T, H, hd) / (ms * 1e-3) / 1e12, ms);
        }
        printf("\n");
        release(d);
    }
    return 0;
}
