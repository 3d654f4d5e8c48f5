/*
dev/generate.cuh: generation, sampling and the evaluation modes of train_fox.cu on the GPU, which includes this file
after its main(): part of train_fox.cu's translation unit (its layers, model and launchers), in a file of its own so
that a reader of training never crosses it. main() reaches it through gpu_sample (the samples that training prints)
and gpu_eval_main (-M eval, niah and generate on the GPU; maps on the twin), declared before main. The twin's
counterparts (FoxDecoder, sample_token, the ForwardBackend modes) are in train_fox.c; test_fox.cu checks this file
against them.
*/
// Map: the sections in file order (each opens with a // ---- line and this title) and what they define.
// generation on the GPU
// defines: gemv_kernel, gemv_mma_kernel, decode_attention_kernel, decode_combine_kernel, decode_swiglu_kernel,
// defines: sample_kernel, decode_manage_kernel, prefill_first_kernel, prefill_fill_kernel, GpuDecoder,
// defines: gpu_decoder_init, gpu_decoder_begin, gpu_decoder_prefill, gpu_decoder_start_empty, gemv_gpu,
// defines: decode_attention_gpu, decode_step_kernels, gpu_decoder_step, gpu_decoder_report, gpu_decoder_free
// sampling on the GPU
// defines: gpu_sample_full, gpu_sample
// the evaluation modes on the GPU
// defines: GpuBackend, gpu_backend_generate, gpu_eval_main

// ----------------------------------------------------------------------------
// generation on the GPU: a paged KV cache, the prompts' prefill through gpu_forward, then one CUDA graph per generated
// token (embedding, every layer, the head, sampling, the cache's upkeep) for B sequences at once (GpuDecoder). The
// twin's FoxDecoder (train_fox.c) is the reference: the same cache (keys after KV-shift, QK-norm and RoPE at their
// positions, values, c_j per kept position; the running c and the last raw k and v carried from token to token), the
// same window and eviction rule, the same sampling rule (sample_token).
// Precision is the training forward's: the matvecs (for cuBLASLt; each fuses the RMSNorm or SwiGLU before it and the
// residual add after it) read bf16 and sum in fp32; every value the forward stores in bf16 is rounded at the same
// place; c, the softmax statistics, the residual stream and the logits are fp32. So the logits differ from the
// twin's by the forward's bf16 tolerance. Batch-1 decoding is bound by latency: six launches a layer, programmatic
// dependent launch in the graph.

#define KV_PAGE 64          // positions per cache page (a multiple of DEC_ALIGN)
#define DEC_ALIGN 32        // key splits start at multiples of this, so a tile never straddles a page
#define DEC_ATT_THREADS 128 // decode attention: 4 warps per (split, head, sequence)
#define DEC_MAX_SPLITS 64
#define GEMV_THREADS 256
#define GEMV_SMEM (128 * 1024)
#define GEMV_MAX_SEGS 8
#define SAMPLE_THREADS 1024
#define SAMPLE_SORT 1024    // top-k lists up to this long are sorted like the twin's (== SAMPLE_THREADS)

// the cache row (pool page and slot) of position j of the head whose page table is tb (its ring of max_pages)
__device__ static inline size_t kv_row(const int* tb, int j, int max_pages) {
    return (size_t)tb[(j / KV_PAGE) % max_pages] * KV_PAGE + j % KV_PAGE;
}

// W (OC, IC) of a matvec as up to GEMV_MAX_SEGS matrices stacked along the output rows: segment s holds rows
// end[s - 1] .. end[s] - 1 (one launch for q, k, v, the output gate and the per-head projections of a layer)
typedef struct {
    const floatX* w[GEMV_MAX_SEGS];
    int end[GEMV_MAX_SEGS];
    int count;
} GemvSegments;

enum { GEMV_X_PLAIN, GEMV_X_RMSNORM, GEMV_X_SWIGLU, GEMV_MODES };

// the instance of matvec kernel template K (gemv_kernel, gemv_mma_kernel) at input mode `mode` and batch parameter r,
// one of r0, r1, r2 (gemv_kernel's RB, gemv_mma_kernel's NT)
#define GEMV_PICK_R(K, M, r, r0, r1, r2) ((r) == (r0) ? K<M, r0> : (r) == (r1) ? K<M, r1> : K<M, r2>)
#define GEMV_PICK(K, mode, r, r0, r1, r2) \
    ((mode) == GEMV_X_PLAIN     ? GEMV_PICK_R(K, GEMV_X_PLAIN, r, r0, r1, r2)   \
     : (mode) == GEMV_X_RMSNORM ? GEMV_PICK_R(K, GEMV_X_RMSNORM, r, r0, r1, r2) \
                                : GEMV_PICK_R(K, GEMV_X_SWIGLU, r, r0, r1, r2))

// Programmatic dependent launch (sm_90): a kernel launched with it (decoder_launch) may start while the one before it
// still runs; pdl_wait blocks until that one has finished and its writes are visible (a no-op without the
// attribute), so before it a kernel reads only the weights. pdl_trigger (after the wait) lets the next kernel launch
// once every block has passed it: at most two grids overlap.
__device__ static inline void pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ static inline void pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// silu(g) u of four hidden units from the fp32 projections, g and u rounded to floatX first and the product too:
// swiglu_forward_kernel's arithmetic on the forward's bf16 gu
__device__ static inline Pack4X swiglu4(float4 g4, float4 u4) {
    float g[4] = {g4.x, g4.y, g4.z, g4.w}, u[4] = {u4.x, u4.y, u4.z, u4.w};
    Pack4X a4;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        float gk = to_float(to_floatX(g[k])), uk = to_float(to_floatX(u[k]));
        a4.v[k] = to_floatX(gk * sigmoid_gpu(gk) * uk);
    }
    return a4;
}

// The matvecs' input for batch rows b0 .. b0 + R - 1 into shared memory xs (row stride ldx), by the whole block (see
// gemv_kernel for the modes): every load 16 bytes with several in flight (the prologue is latency-bound). RMSNORM: one
// row by the whole block (a block sum), more rows a warp each (a warp sum, no block-wide syncs).
template <int MODE>
__device__ static void gemv_prologue(floatX* xs, int ldx, const void* in, const float* norm_w, int IC, int b0, int R,
                                     float* red) {
    const int WARPS = GEMV_THREADS / 32;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n4 = IC / 4;
    if (MODE == GEMV_X_PLAIN) {
        int packs = IC / XPACK;
        #pragma unroll 4
        for (int i = threadIdx.x; i < R * packs; i += GEMV_THREADS) {
            int r = i / packs, p = i % packs;
            ((PackX*)(xs + (size_t)r * ldx))[p] = ((const PackX*)((const floatX*)in + (size_t)(b0 + r) * IC))[p];
        }
    } else if (MODE == GEMV_X_RMSNORM && R == 1) {
        const float4* src = (const float4*)((const float*)in + (size_t)b0 * IC);
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n4; i += GEMV_THREADS) {
            float4 v = src[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        float sc = 1.0f / sqrtf(block_sum(ss, red) / (float)IC + 1e-6f);
        for (int i = threadIdx.x; i < n4; i += GEMV_THREADS) {
            float4 v = src[i];
            Pack4X x4 = {{to_floatX(v.x * sc * norm_w[4 * i]), to_floatX(v.y * sc * norm_w[4 * i + 1]),
                          to_floatX(v.z * sc * norm_w[4 * i + 2]), to_floatX(v.w * sc * norm_w[4 * i + 3])}};
            *(Pack4X*)(xs + 4 * i) = x4;
        }
    } else if (MODE == GEMV_X_RMSNORM) { // a warp a row, eight float4 loads in flight per lane, two passes
        for (int r = warp; r < R; r += WARPS) { // summed in rmsnorm_forward_kernel's order
            const float4* src = (const float4*)((const float*)in + (size_t)(b0 + r) * IC);
            float ss = 0.0f;
            for (int c0 = lane; c0 < n4; c0 += 32 * 8) {
                float4 v[8];
                #pragma unroll
                for (int j = 0; j < 8; j++) {
                    v[j] = c0 + 32 * j < n4 ? src[c0 + 32 * j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
                #pragma unroll
                for (int j = 0; j < 8; j++) {
                    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
                }
            }
            float sc = 1.0f / sqrtf(warp_sum(ss) / (float)IC + 1e-6f);
            for (int c0 = lane; c0 < n4; c0 += 32 * 8) {
                float4 v[8];
                #pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (c0 + 32 * j < n4) { v[j] = src[c0 + 32 * j]; }
                }
                #pragma unroll
                for (int j = 0; j < 8; j++) {
                    int i = 4 * (c0 + 32 * j);
                    if (i >= IC) { break; }
                    Pack4X x4 = {{to_floatX(v[j].x * sc * norm_w[i]), to_floatX(v[j].y * sc * norm_w[i + 1]),
                                  to_floatX(v[j].z * sc * norm_w[i + 2]), to_floatX(v[j].w * sc * norm_w[i + 3])}};
                    *(Pack4X*)(xs + (size_t)r * ldx + i) = x4;
                }
            }
        }
    } else { // SWIGLU: four hidden units a thread, float4 loads of g and u, eight groups in flight
        int total = R * n4;
        for (int q0 = threadIdx.x; q0 < total; q0 += GEMV_THREADS * 8) {
            float4 g4[8], u4[8];
            #pragma unroll
            for (int j = 0; j < 8; j++) {
                int q = q0 + GEMV_THREADS * j;
                if (q < total) {
                    const float* src = (const float*)in + (size_t)(b0 + q / n4) * 2 * IC + 4 * (q % n4);
                    g4[j] = *(const float4*)src;
                    u4[j] = *(const float4*)(src + IC);
                }
            }
            #pragma unroll
            for (int j = 0; j < 8; j++) {
                int q = q0 + GEMV_THREADS * j;
                if (q >= total) { break; }
                *(Pack4X*)(xs + (size_t)(q / n4) * ldx + 4 * (q % n4)) = swiglu4(g4[j], u4[j]);
            }
        }
    }
}

// the row o of W (OC rows of IC) given in segments (constant indices: no local copy of W)
__device__ static inline const floatX* gemv_row(const GemvSegments& W, int o, int IC) {
    const floatX* wseg = W.w[0];
    int start = 0;
    #pragma unroll
    for (int i = 1; i < GEMV_MAX_SEGS; i++) {
        if (i < W.count && o >= W.end[i - 1]) { wseg = W.w[i]; start = W.end[i - 1]; }
    }
    return wseg + (size_t)(o - start) * IC;
}

// out (B, OC) (row stride out_stride) = x (B, IC) @ W^T in fp32, or out += that with accumulate (the residual add in
// place: each output element is read and written by one thread). x comes from `in` by MODE: PLAIN: in (B, IC)
// floatX as is (y); RMSNORM: RMSNorm(in (B, IC) fp32; norm_w, eps 1e-6) rounded to floatX (the forward's xa, xm, xf);
// SWIGLU: swiglu4 of in (B, 2 IC) fp32 (act). A pass holds up to `rows` <= RB batch rows of x in shared memory; a warp
// takes one output row at a time, 16-byte loads of W along IC (IC % XPACK == 0, W 16-byte aligned), four in flight per
// lane, RB accumulators, a warp sum per batch row: a fixed order, deterministic. The first row's first loads are issued
// before pdl_wait. The CUDA-core path: the fp32 build, and IC % 32 != 0.
template <int MODE, int RB>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_kernel(float* out, int out_stride, int accumulate, GemvSegments W,
                                                            int OC, int IC, const void* in, const float* norm_w, int B,
                                                            int rows) {
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    floatX* xs = (floatX*)gemv_smem; // (rows, IC)
    __shared__ float red[32];
    const int WARPS = GEMV_THREADS / 32;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, packs = IC / XPACK;
    int o0 = blockIdx.x * WARPS + warp;
    PackX wp[4];
    int have = o0 < OC; // wp holds row o0's loads at lane, lane + 32, ...
    const PackX* wrow0 = NULL;
    if (have) {
        wrow0 = (const PackX*)gemv_row(W, o0, IC);
        #pragma unroll
        for (int u = 0; u < 4; u++) {
            if (lane + 32 * u < packs) { wp[u] = wrow0[lane + 32 * u]; }
        }
    }
    pdl_wait();
    pdl_trigger();
    for (int b0 = 0; b0 < B; b0 += rows) {
        int R = min(rows, B - b0);
        __syncthreads(); // the last pass is done with xs
        gemv_prologue<MODE>(xs, IC, in, norm_w, IC, b0, R, red);
        __syncthreads();
        for (int o = o0; o < OC; o += gridDim.x * WARPS) {
            const PackX* wrow = wrow0;
            if (o != o0) { wrow = (const PackX*)gemv_row(W, o, IC); }
            float acc[RB];
            #pragma unroll
            for (int r = 0; r < RB; r++) { acc[r] = 0.0f; }
            for (int p0 = lane; p0 < packs; p0 += 32 * 4) {
                if (!have) {
                    #pragma unroll
                    for (int u = 0; u < 4; u++) {
                        if (p0 + 32 * u < packs) { wp[u] = wrow[p0 + 32 * u]; }
                    }
                }
                have = 0;
                #pragma unroll
                for (int u = 0; u < 4; u++) {
                    int p = p0 + 32 * u;
                    if (p >= packs) { break; }
                    float wf[XPACK];
                    #pragma unroll
                    for (int k = 0; k < XPACK; k++) { wf[k] = to_float(wp[u].v[k]); }
                    #pragma unroll
                    for (int r = 0; r < RB; r++) {
                        if (r >= R) { break; }
                        PackX xp = ((const PackX*)(xs + (size_t)r * IC))[p];
                        #pragma unroll
                        for (int k = 0; k < XPACK; k++) { acc[r] += wf[k] * to_float(xp.v[k]); }
                    }
                }
            }
            #pragma unroll
            for (int r = 0; r < RB; r++) {
                if (r >= R) { break; }
                float v = warp_sum(acc[r]);
                if (lane == 0) {
                    float* dst = out + (size_t)(b0 + r) * out_stride + o;
                    *dst = accumulate ? *dst + v : v;
                }
            }
        }
    }
}

#ifndef ENABLE_FP32
// The matvec of gemv_kernel on tensor cores (bf16 build, IC % 32 == 0): out (B, OC) = x (B, IC) @ W^T in fp32 (+= with
// accumulate), one block per tile of 16 output rows (M) at a time, the batch rows of a pass as N (NT tiles of 8; rows
// past the batch hold anything: each output column is its own dot product, and they are not written), mma m16n8k16 with
// fp32 accumulation. K comes in chunks of 32, chunk c to warp c % 8, U chunks in flight per lane: lane 4 g + t loads 16
// bytes of rows g and g + 8 at k = 8 t .. 8 t + 7 of a chunk, and the same 16 bytes of batch row g of x from shared
// memory (rows g and g + 1 start 64 bytes apart in the banks: no conflicts, gemv_mma_ldx). The mma's k
// slots 2t, 2t+1 | 2t+8, 2t+9 of k-step j hold k = 8 t + 4 j + 0, 1 | 2, 3: one permutation of the chunk for A and B
// alike, so each k-step sums 16 distinct k and the two steps all 32. The warps' partial tiles are added in warp order
// (shared memory): deterministic. The first tile's weights are loaded before pdl_wait.
#define GEMV_MMA_U 4

// the row stride of x in shared memory: rows 16 banks apart modulo 32
__host__ __device__ static inline int gemv_mma_ldx(int IC) { return IC % 64 == 0 ? IC + 32 : IC; }

template <int MODE, int NT>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_mma_kernel(float* out, int out_stride, int accumulate,
                                                                GemvSegments W, int OC, int IC, const void* in,
                                                                const float* norm_w, int B, int rows) {
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    floatX* xs = (floatX*)gemv_smem; // (8 NT, gemv_mma_ldx(IC))
    const int WARPS = GEMV_THREADS / 32, U = GEMV_MMA_U;
    __shared__ float red[32];
    __shared__ float part[WARPS][NT * 4][32]; // the warps' partial tiles, fragment order
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int ldx = gemv_mma_ldx(IC), tiles = (OC + 15) / 16, chunks = IC / 32;
    uint4 a0[U], a1[U]; // rows g, g + 8: 8 bf16 of chunks warp + 8 u at k = 8 t ..
    int tile = blockIdx.x, have = tile < tiles;
    const floatX* w0 = NULL;
    const floatX* w1 = NULL;
    if (have) {
        w0 = gemv_row(W, min(16 * tile + g, OC - 1), IC) + 8 * t;
        w1 = gemv_row(W, min(16 * tile + g + 8, OC - 1), IC) + 8 * t;
        #pragma unroll
        for (int u = 0; u < U; u++) {
            int c = warp + WARPS * u;
            if (c < chunks) { a0[u] = *(const uint4*)(w0 + 32 * c); a1[u] = *(const uint4*)(w1 + 32 * c); }
        }
    }
    pdl_wait();
    pdl_trigger();
    for (int b0 = 0; b0 < B; b0 += rows) {
        int R = min(rows, B - b0);
        __syncthreads(); // the last pass is done with xs
        gemv_prologue<MODE>(xs, ldx, in, norm_w, IC, b0, R, red);
        __syncthreads();
        for (int tl = blockIdx.x; tl < tiles; tl += gridDim.x) {
            if (tl != blockIdx.x || b0 > 0) {
                w0 = gemv_row(W, min(16 * tl + g, OC - 1), IC) + 8 * t;
                w1 = gemv_row(W, min(16 * tl + g + 8, OC - 1), IC) + 8 * t;
            }
            float acc[NT][4];
            #pragma unroll
            for (int n = 0; n < NT; n++) { acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f; }
            for (int c0 = warp; c0 < chunks; c0 += WARPS * U) {
                if (!have) {
                    #pragma unroll
                    for (int u = 0; u < U; u++) {
                        int c = c0 + WARPS * u;
                        if (c < chunks) { a0[u] = *(const uint4*)(w0 + 32 * c); a1[u] = *(const uint4*)(w1 + 32 * c); }
                    }
                }
                have = 0;
                #pragma unroll
                for (int u = 0; u < U; u++) {
                    int c = c0 + WARPS * u;
                    if (c >= chunks) { break; }
                    #pragma unroll
                    for (int n = 0; n < NT; n++) {
                        uint4 xb = *(const uint4*)(xs + (size_t)(8 * n + g) * ldx + 32 * c + 8 * t);
                        uint32_t fa0[4] = {a0[u].x, a1[u].x, a0[u].y, a1[u].y};
                        uint32_t fa1[4] = {a0[u].z, a1[u].z, a0[u].w, a1[u].w};
                        mma_bf16_16816(acc[n], fa0, xb.x, xb.y);
                        mma_bf16_16816(acc[n], fa1, xb.z, xb.w);
                    }
                }
            }
            #pragma unroll
            for (int n = 0; n < NT; n++) {
                #pragma unroll
                for (int e = 0; e < 4; e++) { part[warp][4 * n + e][lane] = acc[n][e]; }
            }
            __syncthreads();
            if (warp == 0) { // d rows g (e = 0, 1) and g + 8 (e = 2, 3) at batch columns 2t, 2t + 1
                #pragma unroll
                for (int n = 0; n < NT; n++) {
                    #pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float v = 0.0f;
                        #pragma unroll
                        for (int w = 0; w < WARPS; w++) { v += part[w][4 * n + e][lane]; }
                        int o = 16 * tl + g + (e >= 2 ? 8 : 0), col = 8 * n + 2 * t + (e & 1);
                        if (o < OC && col < R) {
                            float* dst = out + (size_t)(b0 + col) * out_stride + o;
                            *dst = accumulate ? *dst + v : v;
                        }
                    }
                }
            }
            __syncthreads(); // part is free again
        }
    }
}
#endif

// What one decode-attention launch (one layer) reads and writes. The cache: pages of KV_PAGE positions of one (layer,
// sequence, head), keys and values (KV_PAGE, hd) floatX and c (KV_PAGE) fp32; a head's logical page p (positions p
// KV_PAGE ..) is pool page table[p % max_pages]; its live positions are first .. pos (the newest, written by this
// launch).
typedef struct {
    const float* proj;     // (B, proj_stride) the layer's projections: q at column 0, then k, v, ...
    int proj_stride, k_off, v_off, ks_off, vs_off, gate_off; // columns; -1: absent
    const float* bf;       // (H) the forget gate's bias (fp32), NULL without a gate
    int gate_full;         // 1: z = w_f . x + b_f (gate_off's column + bf), 0: z = bf
    const float* q_norm;   // (groups_qk, hd) QK-norm scales of the layer, NULL without QK-norm
    const float* k_norm;
    int groups_qk;
    const float* rope;     // (max_len, hd/2, 2) cos, sin; NULL without RoPE
    floatX* pool_k;        // (pages, KV_PAGE, hd)
    floatX* pool_v;
    float* pool_c;         // (pages, KV_PAGE)
    const int* table;      // (L, B, H, max_pages)
    const int* first;      // (L, B, H)
    const int* pos;        // (B) the position of the token being fed
    float* c_last;         // (2, L, B, H) c of the last token; parity pos & 1 is read, the other written
    floatX* kv_last;       // (2, L, B, 2C) raw k then raw v of the last token (the KV-shift's input)
    float* part_m;         // (B, H, S) per split: running max, sum and unnormalised output
    float* part_l;
    float* part_o;         // (B, H, S, hd)
    float scale;           // 1 / sqrt(hd)
    int l, L, B, H, C, max_pages, S;
    const int* tokens;     // (B) the tokens being fed (DOCS: an EOT starts a document)
    int eot;               // DOCS: the EOT token
} DecAttnArgs;

// One head's vector of the new token through the forward's steps, by the whole block: raw (hd) fp32 projection
// rounded to floatX (the forward's q_raw / k_raw / v_raw; also stored to raw_out when given: the next token's shift
// input), the KV-shift with the last raw vector when prev is given (alpha prev + (1 - alpha) x, rounded: k_shifted, v;
// prev_zero: a document's first token, whose last raw vector is 0), RMSNorm over hd (w != NULL, eps 1e-5), RoPE at pos
// (rope != NULL); out (hd) gets the result rounded to floatX (q, k). The arithmetic is that of kv_shift_forward_kernel
// and qk_norm_rope_forward_kernel. tmp: (hd) shared scratch.
template <int HD>
__device__ static void dec_head_vector(float* out, float* tmp, float* red, const float* raw, const floatX* prev,
                                       float alpha, const float* w, const float* rope, int pos, floatX* raw_out,
                                       bool prev_zero) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < HD; i += blockDim.x) {
        float xr = to_float(to_floatX(raw[i]));
        if (raw_out != NULL) { raw_out[i] = to_floatX(xr); }
        float p = prev != NULL && !prev_zero ? to_float(prev[i]) : 0.0f;
        float x = prev != NULL ? to_float(to_floatX(alpha * p + (1.0f - alpha) * xr)) : xr;
        tmp[i] = x;
        ss += x * x;
    }
    float s = 1.0f;
    if (w != NULL) { s = 1.0f / sqrtf(block_sum(ss, red) / (float)HD + 1e-5f); }
    __syncthreads();
    const int half = HD / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float lo = tmp[i], hi = tmp[half + i];
        if (w != NULL) { lo = lo * s * w[i]; hi = hi * s * w[half + i]; }
        if (rope != NULL) {
            float cs = rope[((size_t)pos * half + i) * 2], sn = rope[((size_t)pos * half + i) * 2 + 1];
            float rlo = lo * cs - hi * sn, rhi = hi * cs + lo * sn;
            lo = rlo; hi = rhi;
        }
        out[i] = to_float(to_floatX(lo));
        out[half + i] = to_float(to_floatX(hi));
    }
    __syncthreads();
}

// Flash-decoding, one block per (split s, head h, sequence b): the query of the token at pos against the head's live
// keys first .. pos, cut into S splits that start at multiples of DEC_ALIGN; the block of the split holding pos first
// computes the new key, value and c and writes them into the cache (and the next token's c_last and raw k, v), then
// reads them back like the others (__syncthreads orders a block's global writes before its reads). Logits
// s_ij = q.k_j / sqrt(hd) + c_i - c_j, q and k the bf16 values in fp32, masked to -inf outside the split's range (keys
// there may be stale or unwritten: a mask is a selection, never a product). Each group of G lanes (G = hd / XPACK)
// takes one key at a time, a warp KG = 32 / G keys: a tile of KG U <= DEC_ALIGN keys in one page, a lane's U keys and
// values loaded before any is used; each group keeps an online softmax (running max from -FLT_MAX: no inf - inf),
// combined in a fixed order into the split's (max, sum, unnormalised output) for decode_combine_kernel. No atomics.
// Evicted and out-of-window keys lie before `first` and are never read. DOCS (-f 1): a token EOT at pos > 0 starts a
// document (fox_decoder_restart): its key alone is live (first = pos; decode_manage_kernel frees the others' pages
// after the step), c_pos = 0 and its KV-shift takes k~_{pos-1} = 0.
template <int G, bool DOCS>
__global__ void __launch_bounds__(DEC_ATT_THREADS) decode_attention_kernel(DecAttnArgs a) {
    constexpr int HD = G * XPACK, KG = 32 / G, U = KG >= 8 ? 4 : 8, TILE = KG * U;
    constexpr int WARPS = DEC_ATT_THREADS / 32, GROUPS = WARPS * KG;
    __shared__ float q_s[HD], k_s[HD], v_s[HD], tmp[HD], red[32];
    __shared__ float grp_m[GROUPS], grp_l[GROUPS], grp_o[GROUPS * HD];
    pdl_wait();
    pdl_trigger();
    int s = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gi = lane / G, gl = lane % G;
    size_t LBH = (size_t)a.L * a.B * a.H, lbh = ((size_t)a.l * a.B + b) * a.H + h;
    int pos = a.pos[b], par = pos & 1;
    const float* pr = a.proj + (size_t)b * a.proj_stride;
    bool restart = DOCS && pos > 0 && a.tokens[b] == a.eot;
    float c_i = 0.0f;
    if (a.bf != NULL && !restart) {
        float z = a.gate_full ? pr[a.gate_off + h] + a.bf[h] : a.bf[h];
        c_i = a.c_last[par * LBH + lbh] + logsigmoid_gpu(z);
    }
    int first = restart ? pos : a.first[lbh], base = first & ~(DEC_ALIGN - 1);
    int chunk = ((pos + 1 - base + a.S - 1) / a.S + DEC_ALIGN - 1) & ~(DEC_ALIGN - 1);
    int j0 = max(first, base + s * chunk), j1 = min(pos + 1, base + (s + 1) * chunk);
    const int* table = a.table + lbh * a.max_pages;
    int qk = a.q_norm != NULL;
    dec_head_vector<HD>(q_s, tmp, red, pr + (size_t)h * HD, NULL, 0.0f,
                        qk ? a.q_norm + (size_t)(h % a.groups_qk) * HD : NULL, a.rope, pos, NULL, false);
    if ((pos - base) / chunk == s) { // this block owns the new token
        size_t next = (((size_t)(1 - par) * a.L + a.l) * a.B + b) * 2 * a.C + (size_t)h * HD;
        size_t last = (((size_t)par * a.L + a.l) * a.B + b) * 2 * a.C + (size_t)h * HD;
        float ak = a.ks_off >= 0 ? sigmoid_gpu(pr[a.ks_off + h]) : 0.0f;
        float av = a.vs_off >= 0 ? sigmoid_gpu(pr[a.vs_off + h]) : 0.0f;
        dec_head_vector<HD>(k_s, tmp, red, pr + a.k_off + (size_t)h * HD, a.ks_off >= 0 ? a.kv_last + last : NULL, ak,
                            qk ? a.k_norm + (size_t)(h % a.groups_qk) * HD : NULL, a.rope, pos, a.kv_last + next,
                            restart);
        dec_head_vector<HD>(v_s, tmp, red, pr + a.v_off + (size_t)h * HD,
                            a.vs_off >= 0 ? a.kv_last + last + a.C : NULL, av, NULL, NULL, pos,
                            a.kv_last + next + a.C, restart);
        size_t row = (size_t)table[(pos / KV_PAGE) % a.max_pages] * KV_PAGE + pos % KV_PAGE;
        for (int i = threadIdx.x; i < HD; i += blockDim.x) {
            a.pool_k[row * HD + i] = to_floatX(k_s[i]);
            a.pool_v[row * HD + i] = to_floatX(v_s[i]);
        }
        if (threadIdx.x == 0) {
            a.pool_c[row] = c_i;
            if (a.bf != NULL) { a.c_last[(1 - par) * LBH + lbh] = c_i; }
        }
        __syncthreads();
    }
    float qf[XPACK], o[XPACK], m = -FLT_MAX, l = 0.0f;
    #pragma unroll
    for (int k = 0; k < XPACK; k++) { qf[k] = q_s[gl * XPACK + k]; o[k] = 0.0f; }
    int gated = a.bf != NULL;
    for (int ts = (j0 & ~(TILE - 1)) + warp * TILE; ts < j1; ts += WARPS * TILE) {
        size_t row0 = (size_t)table[(ts / KV_PAGE) % a.max_pages] * KV_PAGE + ts % KV_PAGE;
        PackX kp[U], vp[U];
        float cj[U], sc[U], mt = m;
        #pragma unroll
        for (int u = 0; u < U; u++) {
            size_t r = row0 + u * KG + gi;
            kp[u] = *(const PackX*)(a.pool_k + r * HD + gl * XPACK);
            vp[u] = *(const PackX*)(a.pool_v + r * HD + gl * XPACK);
            cj[u] = a.pool_c[r];
        }
        #pragma unroll
        for (int u = 0; u < U; u++) {
            int j = ts + u * KG + gi;
            float dot = 0.0f;
            #pragma unroll
            for (int k = 0; k < XPACK; k++) { dot += qf[k] * to_float(kp[u].v[k]); }
            dot = group_sum(dot, G);
            float sv = dot * a.scale + (gated ? c_i - cj[u] : 0.0f);
            sc[u] = j >= j0 && j < j1 ? sv : -INFINITY;
            mt = fmaxf(mt, sc[u]);
        }
        float f = expf(m - mt);
        l *= f;
        #pragma unroll
        for (int k = 0; k < XPACK; k++) { o[k] *= f; }
        #pragma unroll
        for (int u = 0; u < U; u++) {
            int ok = sc[u] != -INFINITY;
            float p = ok ? expf(sc[u] - mt) : 0.0f;
            l += p;
            #pragma unroll
            for (int k = 0; k < XPACK; k++) { o[k] += ok ? p * to_float(vp[u].v[k]) : 0.0f; }
        }
        m = mt;
    }
    int grp = warp * KG + gi;
    if (gl == 0) { grp_m[grp] = m; grp_l[grp] = l; }
    #pragma unroll
    for (int k = 0; k < XPACK; k++) { grp_o[grp * HD + gl * XPACK + k] = o[k]; }
    __syncthreads();
    size_t part = ((size_t)b * a.H + h) * a.S + s;
    for (int i = threadIdx.x; i < HD; i += blockDim.x) {
        float M = -FLT_MAX, L = 0.0f, O = 0.0f;
        for (int q = 0; q < GROUPS; q++) { M = fmaxf(M, grp_m[q]); }
        for (int q = 0; q < GROUPS; q++) {
            float w = expf(grp_m[q] - M);
            L += grp_l[q] * w;
            O += grp_o[q * HD + i] * w;
        }
        a.part_o[part * HD + i] = O;
        if (i == 0) { a.part_m[part] = M; a.part_l[part] = L; }
    }
}

// act (B, I) = swiglu4 of gu (B, 2I) fp32 (gemv_prologue's SWIGLU mode) once for the batch, which the W_down matvec's
// blocks would each redo; a thread four hidden units
__global__ void decode_swiglu_kernel(floatX* act, const float* gu, int B, int I) {
    pdl_wait();
    pdl_trigger();
    int n4 = I / 4;
    size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= (size_t)B * n4) { return; }
    const float* src = gu + (q / n4) * 2 * (size_t)I + 4 * (q % n4);
    *(Pack4X*)(act + (q / n4) * (size_t)I + 4 * (q % n4)) = swiglu4(*(const float4*)src, *(const float4*)(src + I));
}

// The S splits of one (sequence, head) combined (m = max m_s, l = sum l_s e^(m_s - m), o = sum o_s e^(m_s - m) / l; the
// statistics by lanes, S <= DEC_MAX_SPLITS, then each lane's channels summed in split order with the loads of eight
// splits in flight), o rounded (the forward's o), then the output norm (w != NULL, eps 1e-6) and gate (og_off >= 0:
// y = on sigmoid(og), og the projection rounded like the forward's og_logit), y rounded:
// output_norm_gate_forward_kernel on one row. One warp per (b, h), lane the channels lane + 32 i (hd <= MAX_HD). Fixed
// order: deterministic.
__global__ void decode_combine_kernel(floatX* y, const float* part_m, const float* part_l, const float* part_o,
                                      const float* proj, int proj_stride, int og_off, const float* w, int B, int H,
                                      int hd, int S) {
    pdl_wait();
    pdl_trigger();
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= B * H) { return; }
    int b = row / H, h = row % H;
    const float* pm = part_m + (size_t)row * S;
    const float* pl = part_l + (size_t)row * S;
    const float* po = part_o + (size_t)row * S * hd;
    float m0 = lane < S ? pm[lane] : -FLT_MAX, m1 = lane + 32 < S ? pm[lane + 32] : -FLT_MAX;
    float l0 = lane < S ? pl[lane] : 0.0f, l1 = lane + 32 < S ? pl[lane + 32] : 0.0f;
    float M = warp_max(fmaxf(m0, m1));
    float e0 = expf(m0 - M), e1 = expf(m1 - M); // split lane's and lane + 32's weights
    float L = warp_sum(l0 * e0 + l1 * e1);
    float o[MAX_HD_LANE], ss = 0.0f;
    #pragma unroll
    for (int i = 0; i < MAX_HD_LANE; i++) { o[i] = 0.0f; }
    for (int s0 = 0; s0 < S; s0 += 8) {
        float ps[8][MAX_HD_LANE], es[8];
        #pragma unroll
        for (int u = 0; u < 8; u++) {
            int s = s0 + u < S ? s0 + u : S - 1; // past the end: loads of a valid split, weight 0 below
            float e = __shfl_sync(0xffffffffu, s < 32 ? e0 : e1, s % 32);
            es[u] = s0 + u < S ? e : 0.0f;
            #pragma unroll
            for (int i = 0; i < MAX_HD_LANE; i++) {
                ps[u][i] = lane + 32 * i < hd ? po[(size_t)s * hd + lane + 32 * i] : 0.0f;
            }
        }
        #pragma unroll
        for (int u = 0; u < 8; u++) {
            #pragma unroll
            for (int i = 0; i < MAX_HD_LANE; i++) { o[i] += ps[u][i] * es[u]; }
        }
    }
    #pragma unroll
    for (int i = 0; i < MAX_HD_LANE; i++) {
        if (lane + 32 * i < hd) { o[i] = to_float(to_floatX(o[i] / L)); ss += o[i] * o[i]; }
    }
    float sc = 1.0f;
    if (w != NULL) { sc = 1.0f / sqrtf(warp_sum(ss) / (float)hd + 1e-6f); }
    #pragma unroll
    for (int i = 0; i < MAX_HD_LANE; i++) {
        int c = lane + 32 * i;
        if (c >= hd) { continue; }
        float v = o[i];
        if (w != NULL) { v = v * sc * w[(size_t)h * hd + c]; }
        if (og_off >= 0) {
            float og = to_float(to_floatX(proj[(size_t)b * proj_stride + og_off + (size_t)h * hd + c]));
            v = v * sigmoid_gpu(og);
        }
        y[((size_t)b * H + h) * hd + c] = to_floatX(v);
    }
}

// sum, exclusive prefix sum and minimum over a block of up to 1024 threads (blockDim a multiple of 32), every thread
// gets the result; red: 32 entries of shared scratch. Integers: exact; the doubles are summed in a fixed order.
__device__ static int block_sum_int(int v, int* red) {
    return block_reduce(v, red, 0, [](int a, int b) { return a + b; });
}

__device__ static int block_min_int(int v, int* red) {
    return block_reduce(v, red, INT_MAX, [](int a, int b) { return min(a, b); });
}

template <typename TV>
__device__ static TV block_exclusive_scan(TV v, TV* red, TV* total) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    TV x = v;
    for (int o = 1; o < 32; o *= 2) {
        TV y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) { x += y; }
    }
    __syncthreads();
    if (lane == 31) { red[warp] = x; }
    __syncthreads();
    if (warp == 0) {
        TV w = lane < warps ? red[lane] : (TV)0;
        for (int o = 1; o < 32; o *= 2) {
            TV y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) { w += y; }
        }
        red[lane] = w;
    }
    __syncthreads();
    *total = red[warps - 1];
    return (warp > 0 ? red[warp - 1] : (TV)0) + x - v;
}

// splitmix64, the twin's rng_next and rng_uniform
__device__ static uint64_t rng_next_gpu(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// an unsigned key in the order of the floats (larger float, larger key); NaN gets 0, below all
__device__ static inline unsigned float_order_key(float f) {
    unsigned u = __float_as_uint(f);
    if (f != f) { return 0u; }
    return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// the twin's sample order: a larger logit first, the lower id on ties
__device__ static inline int scored_first(float av, int aid, float bv, int bid) {
    return av > bv || (av == bv && aid < bid);
}

// the first (logit v, id i) of the warp's lanes in that order, to every lane
__device__ static inline void warp_first(float* v, int* i) {
    for (int o = 16; o > 0; o /= 2) {
        float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        int oi = __shfl_xor_sync(0xffffffffu, *i, o);
        if (scored_first(ov, oi, *v, *i)) { *v = ov; *i = oi; }
    }
}

// The twin's sample_token on row b of logits (B, Vp) fp32, one block per row, writing tokens[b]: temperature 0: the
// largest logit, the lowest id on ties (argmax_token; a coalesced pass). Else one draw u of the row's splitmix64 state
// rng[b], then the first token j in the twin's order whose running sum of exp((l_j - max) / T) (fp64) exceeds u times
// the total; the order is by id over all V, or with top-k k < V the k largest logits (k-th by a bitwise search on the
// keys, ties taken by lowest id) sorted by (logit down, id up) as the twin's qsort does, when k <= SAMPLE_SORT,
// else in id order (the same distribution, another token for a given u). Thread t takes ids t chunk .. (t + 1)
// chunk - 1, so prefix sums run in id order; the fp64 sums are summed in another order than the twin's, so a draw can
// differ only when u times the total falls within rounding (about 1e-16) of a boundary.
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_kernel(int* tokens, const float* logits, int Vp, int V,
                                                                uint64_t* rng, double temperature, int top_k) {
    __shared__ int ired[32];
    __shared__ double dred[32];
    __shared__ float bestv[32], sv[SAMPLE_SORT];
    __shared__ int besti[32], si[SAMPLE_SORT];
    __shared__ double u_s;
    pdl_wait();
    pdl_trigger();
    int b = blockIdx.x, t = threadIdx.x, warp = t / 32, lane = t % 32;
    const float* row = logits + (size_t)b * Vp;
    int chunk = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    int c0 = min(V, t * chunk), c1 = min(V, c0 + chunk);
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int j = t; j < V; j += SAMPLE_THREADS) { // coalesced; ids rise, so the first maximum is the lowest id
        if (row[j] > bv) { bv = row[j]; bi = j; }
    }
    warp_first(&bv, &bi);
    if (lane == 0) { bestv[warp] = bv; besti[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = bestv[lane]; bi = besti[lane];
        warp_first(&bv, &bi);
        if (lane == 0) { bestv[0] = bv; besti[0] = bi; }
    }
    __syncthreads();
    float mx = bestv[0];
    int argmax = besti[0] == INT_MAX ? 0 : besti[0];
    if (temperature == 0.0) {
        if (t == 0) { tokens[b] = argmax; }
        return;
    }
    if (t == 0) {
        uint64_t st = rng[b];
        u_s = (double)(rng_next_gpu(&st) >> 11) * (1.0 / 9007199254740992.0);
        rng[b] = st;
    }
    __syncthreads();
    double u = u_s;
    int k = top_k > 0 && top_k < V ? top_k : V;
    unsigned tau = 0u; // the k-th largest key (k < V): candidates are keys above it and the need lowest ids at it
    int need = 0, eq_before = 0;
    if (k < V) {
        for (int bit = 31; bit >= 0; bit--) {
            unsigned trial = tau | (1u << bit);
            int cnt = 0;
            for (int j = c0; j < c1; j++) { cnt += float_order_key(row[j]) >= trial; }
            if (block_sum_int(cnt, ired) >= k) { tau = trial; }
        }
        int gt = 0, eq = 0, eq_total;
        for (int j = c0; j < c1; j++) {
            unsigned key = float_order_key(row[j]);
            gt += key > tau;
            eq += key == tau;
        }
        need = k - block_sum_int(gt, ired);
        eq_before = block_exclusive_scan<int>(eq, ired, &eq_total);
    }
    int token = INT_MAX;
    if (k < V && k <= SAMPLE_SORT) { // the candidates, sorted as the twin's qsort sorts them
        int cnt = 0, cand_total, eqr = eq_before;
        for (int j = c0; j < c1; j++) {
            unsigned key = float_order_key(row[j]);
            cnt += key > tau || (key == tau && eqr++ < need);
        }
        int at = block_exclusive_scan<int>(cnt, ired, &cand_total);
        sv[t] = -INFINITY; si[t] = INT_MAX; // SAMPLE_SORT == SAMPLE_THREADS: one slot per thread
        __syncthreads();
        eqr = eq_before;
        for (int j = c0; j < c1; j++) {
            unsigned key = float_order_key(row[j]);
            if (key > tau || (key == tau && eqr++ < need)) { sv[at] = row[j]; si[at] = j; at++; }
        }
        for (int size = 2; size <= SAMPLE_SORT; size *= 2) { // bitonic sort, first in the twin's order at 0
            for (int stride = size / 2; stride > 0; stride /= 2) {
                __syncthreads();
                int j = t ^ stride;
                if (j > t) {
                    int up = (t & size) == 0;
                    int swap = up ? scored_first(sv[j], si[j], sv[t], si[t]) : scored_first(sv[t], si[t], sv[j], si[j]);
                    if (swap) {
                        float fv = sv[t]; sv[t] = sv[j]; sv[j] = fv;
                        int iv = si[t]; si[t] = si[j]; si[j] = iv;
                    }
                }
            }
        }
        __syncthreads();
        double e = t < k ? exp((double)(sv[t] - sv[0]) / temperature) : 0.0, total;
        double pre = block_exclusive_scan<double>(e, dred, &total);
        double r = u * total;
        int hit = t < k && r < pre + e ? t : INT_MAX;
        hit = block_min_int(hit, ired);
        token = si[hit == INT_MAX ? k - 1 : hit];
    } else { // every token (k = V), or the candidates in id order (k > SAMPLE_SORT)
        double e = 0.0, total;
        int eqr = eq_before, last = -1;
        for (int j = c0; j < c1; j++) {
            unsigned key = k < V ? float_order_key(row[j]) : 0u;
            if (k == V || key > tau || (key == tau && eqr++ < need)) {
                e += exp((double)(row[j] - mx) / temperature);
                last = j;
            }
        }
        double pre = block_exclusive_scan<double>(e, dred, &total);
        double r = u * total, acc = pre;
        int hit = INT_MAX;
        if (r < pre + e) {
            eqr = eq_before;
            for (int j = c0; j < c1; j++) {
                unsigned key = k < V ? float_order_key(row[j]) : 0u;
                if (k == V || key > tau || (key == tau && eqr++ < need)) {
                    acc += exp((double)(row[j] - mx) / temperature);
                    if (r < acc) { hit = j; break; }
                }
            }
        }
        hit = block_min_int(hit, ired);
        int last_all = -block_min_int(-last, ired); // the last candidate: the twin's fallback
        token = hit != INT_MAX ? hit : last_all;
    }
    if (t == 0) { tokens[b] = token; }
}

// The cache's upkeep after a step, one block: per (layer, sequence, head) the eviction of keys that can no longer
// matter (delta != NULL: the oldest while c_pos - c_f < delta and f < pos, FoxDecoder's rule), the window of the next
// position, the pages wholly before the new first pushed on the free stack and, when pos + 1 starts a page, a page
// popped for it; then pos += 1 for every sequence. Pushes and pops are placed by exclusive scans over the heads in
// order: the same pages every run. status[0] is the free count (the stack's top); status[1] is set if a pop finds the
// stack empty (the host grows the pool before each step, so that is a bug). DOCS: a sequence fed an EOT at pos > 0
// keeps pos only (a document starts there: decode_attention_kernel). It runs before the sampler, which overwrites the
// fed tokens.
typedef struct {
    int* first;           // (L, B, H)
    int* first_new;       // (L, B, H) scratch
    int* table;           // (L, B, H, max_pages)
    int* pos;             // (B)
    int* stack;           // (pages)
    int* status;          // [0] free pages, [1] ran out
    const float* pool_c;  // (pages, KV_PAGE)
    const float* delta;   // (L, H) eviction thresholds, NULL: no eviction
    int L, B, H, max_pages, window, max_len;
    const int* tokens;    // (B) the tokens fed this step
    int eot;              // DOCS: the EOT token
} DecManageArgs;

template <bool DOCS>
__global__ void __launch_bounds__(1024) decode_manage_kernel(DecManageArgs a) {
    __shared__ int red[32];
    pdl_wait();
    pdl_trigger();
    int heads = a.L * a.B * a.H, per = (heads + blockDim.x - 1) / blockDim.x;
    int i0 = min(heads, (int)threadIdx.x * per), i1 = min(heads, i0 + per);
    int nfree = 0, nneed = 0;
    for (int i = i0; i < i1; i++) {
        int l = i / (a.B * a.H), b = (i / a.H) % a.B, h = i % a.H, pos = a.pos[b], f = a.first[i];
        if (DOCS && pos > 0 && a.tokens[b] == a.eot) { f = pos; }
        const int* tb = a.table + (size_t)i * a.max_pages;
        if (a.delta != NULL) {
            float c_now = a.pool_c[kv_row(tb, pos, a.max_pages)], d = a.delta[l * a.H + h];
            while (f < pos && c_now - a.pool_c[kv_row(tb, f, a.max_pages)] < d) { f++; }
        }
        f = max(f, first_key_gpu(pos + 1, a.window));
        a.first_new[i] = f;
        nfree += f / KV_PAGE - a.first[i] / KV_PAGE;
        nneed += (pos + 1) % KV_PAGE == 0 && pos + 1 < a.max_len;
    }
    int total_free, total_need;
    int off_free = block_exclusive_scan<int>(nfree, red, &total_free);
    int off_need = block_exclusive_scan<int>(nneed, red, &total_need);
    int top0 = a.status[0], top1 = top0 + total_free;
    for (int i = i0; i < i1; i++) {
        const int* tb = a.table + (size_t)i * a.max_pages;
        for (int p = a.first[i] / KV_PAGE; p < a.first_new[i] / KV_PAGE; p++) {
            a.stack[top0 + off_free++] = tb[p % a.max_pages];
        }
    }
    __syncthreads(); // every push lands before the pops
    int enough = top1 >= total_need;
    for (int i = i0; i < i1; i++) {
        int b = (i / a.H) % a.B, pos = a.pos[b];
        if ((pos + 1) % KV_PAGE == 0 && pos + 1 < a.max_len && enough) {
            a.table[(size_t)i * a.max_pages + ((pos + 1) / KV_PAGE) % a.max_pages] = a.stack[top1 - 1 - off_need++];
        }
        a.first[i] = a.first_new[i];
    }
    __syncthreads(); // every head has read pos
    if (threadIdx.x == 0) {
        a.status[0] = enough ? top1 - total_need : top1;
        if (!enough) { a.status[1] = 1; }
    }
    for (int b = threadIdx.x; b < a.B; b += blockDim.x) { a.pos[b] += 1; }
}

// The prompt's first kept position per (layer, sequence, head) of a prefilled group (Bg sequences, the global
// index b0 + bg), as the twin's cache holds it after the prompt: the window of the next position, and eviction by c of
// the prompt's last token (c from gpu_forward: c_acts (L, Bg, H, Tp) or NULL without a gate). One thread per head.
// DOCS: nothing before the last token's document start (doc_start (Bg, Tp), gpu_forward's FoxDocs).
template <bool DOCS>
__global__ void prefill_first_kernel(int* first, const float* c_acts, const int* lens, const float* delta, int L,
                                     int B, int b0, int Bg, int H, int Tp, int window, const int* doc_start) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= L * Bg * H) { return; }
    int h = idx % H, bg = (idx / H) % Bg, l = idx / (H * Bg), n = lens[bg];
    int f = first_key_gpu(n - 1, window);
    if (DOCS) { f = max(f, doc_start[(size_t)bg * Tp + n - 1]); }
    if (delta != NULL && c_acts != NULL) {
        const float* c = c_acts + (((size_t)l * Bg + bg) * H + h) * Tp;
        float c_now = c[n - 1], d = delta[l * H + h];
        while (f < n - 1 && c_now - c[f] < d) { f++; }
    }
    first[((size_t)l * B + b0 + bg) * H + h] = max(f, first_key_gpu(n, window));
}

// What prefill_fill_kernel copies: gpu_forward's activations of a group (Bg sequences of Tp positions: k after shift,
// norm and RoPE, v, the raw k and v, c) into the cache.
typedef struct {
    const floatX* k;      // (L, Bg, Tp, C)
    const floatX* v;
    const floatX* k_raw;
    const floatX* v_raw;
    const float* c;       // (L, Bg, H, Tp) or NULL
    const int* lens;      // (Bg)
    const int* first;     // (L, B, H)
    const int* table;     // (L, B, H, max_pages)
    floatX* pool_k;
    floatX* pool_v;
    float* pool_c;
    float* c_last;        // (2, L, B, H)
    floatX* kv_last;      // (2, L, B, 2C)
    int L, B, b0, Bg, Tp, H, hd, C, max_pages;
} DecFillArgs;

// Block (head (l, bg, h), position slice y): the kept positions first .. n - 1 into their pages, XPACK channels per
// thread; block y = 0 also writes the next token's c_last and raw k, v (parity n & 1).
__global__ void prefill_fill_kernel(DecFillArgs a) {
    int i = blockIdx.x, h = i % a.H, bg = (i / a.H) % a.Bg, l = i / (a.H * a.Bg), b = a.b0 + bg;
    int n = a.lens[bg], packs = a.hd / XPACK, per = blockDim.x / packs;
    size_t lbh = ((size_t)l * a.B + b) * a.H + h, N = (size_t)a.Bg * a.Tp;
    const int* tb = a.table + lbh * a.max_pages;
    const float* c = a.c != NULL ? a.c + (((size_t)l * a.Bg + bg) * a.H + h) * a.Tp : NULL;
    int pk = threadIdx.x % packs, slot = threadIdx.x / packs;
    if (slot < per) {
        for (int j = a.first[lbh] + blockIdx.y * per + slot; j < n; j += gridDim.y * per) {
            size_t row = kv_row(tb, j, a.max_pages);
            size_t src = (size_t)l * N * a.C + ((size_t)bg * a.Tp + j) * a.C + (size_t)h * a.hd + pk * XPACK;
            *(PackX*)(a.pool_k + row * a.hd + pk * XPACK) = *(const PackX*)(a.k + src);
            *(PackX*)(a.pool_v + row * a.hd + pk * XPACK) = *(const PackX*)(a.v + src);
            if (pk == 0) { a.pool_c[row] = c != NULL ? c[j] : 0.0f; }
        }
    }
    if (blockIdx.y == 0) {
        int par = n & 1;
        size_t LBH = (size_t)a.L * a.B * a.H;
        size_t dst = (((size_t)par * a.L + l) * a.B + b) * 2 * a.C + (size_t)h * a.hd;
        size_t src = (size_t)l * N * a.C + ((size_t)bg * a.Tp + n - 1) * a.C + (size_t)h * a.hd;
        for (int e = threadIdx.x; e < a.hd; e += blockDim.x) {
            a.kv_last[dst + e] = a.k_raw[src + e];
            a.kv_last[dst + a.C + e] = a.v_raw[src + e];
        }
        if (threadIdx.x == 0) { a.c_last[par * LBH + lbh] = c != NULL ? c[n - 1] : 0.0f; }
    }
}

// The GPU decoder: the cache of up to max_B sequences of up to max_len tokens, the state each sequence carries from
// token to token, one step's activations, and the step's CUDA graph. The pool of pages is shared by every (layer,
// sequence, head); a head holds the pages of its live positions plus the page of its next position, and gives pages
// back as the window or eviction moves past them (decode_manage_kernel): the pages in use follow the live keys. Without
// eviction the pool is sized for the worst case at the start; with eviction it starts at what the prompts keep and
// doubles when a step could run short (the step's graph is captured again).
typedef struct {
    GPUModel* g;
    int L, C, H, hd, I, V, Vp;
    int max_B, max_len;      // sequences, tokens a sequence may reach (sizes the cache and RoPE table)
    int max_pages;           // pages a head holds at most: the ring size of its page table
    int worst_pages;         // pages of max_B sequences at the most every head can hold
    int splits;              // key splits per (sequence, head) of the current batch
    int part_rows;           // (sequence, head, split) rows the partial buffers hold
    cudaStream_t stream;
    int proj_cols, ks_off, vs_off, gate_off, og_off; // the attention projections' columns (-1: absent)
    int eot;                 // documents kept apart (-f 1): the EOT token, which starts a document; -1: not
    // the cache
    floatX* pool_k;          // (pool_pages, KV_PAGE, hd)
    floatX* pool_v;
    float* pool_c;           // (pool_pages, KV_PAGE)
    int pool_pages;
    int* table;              // (L, B, H, max_pages) of the run's B sequences, in a buffer for max_B
    int* table_host;         // its host copy (the prefill places pages on the host)
    int* first;              // (L, B, H), as table
    int* first_new;
    int* stack;              // (pool_pages) free pages
    int* status;             // [0] free pages, [1] ran out
    float* delta;            // (L, H) eviction thresholds, NULL: no eviction
    // per sequence
    int* pos;                // (max_B) position of the token fed next
    int* tokens;             // (max_B) token fed next (the sampler writes it)
    uint64_t* rng;           // (max_B) sampling states
    float* c_last;           // (2, L, max_B, H)
    floatX* kv_last;         // (2, L, max_B, 2C)
    // one step
    float* resid;            // (max_B, C)
    float* proj;             // (max_B, proj_cols)
    float* part_m;           // (part_rows)
    float* part_l;
    float* part_o;           // (part_rows, hd)
    floatX* y;               // (max_B, C)
    float* gu;               // (max_B, 2I)
    floatX* act;             // (max_B, I) silu(g) u, for batches of DEC_SWIGLU_APART sequences or more
    float* logits;           // (max_B, Vp)
    float* rope;             // (max_len, hd/2, 2) or NULL
    // the current run
    int B;
    double temperature;
    int top_k;
    int use_graph;           // 0: the step's kernels launched one by one (tests compare both)
    int pdl;                 // 1: programmatic dependent launch between the step's kernels (pdl_wait)
    int use_mma;             // 1: the tensor-core matvecs where they apply (bf16 build), 0: CUDA cores
    cudaGraphExec_t graph;
    int graph_ready;
    int* host_tokens;        // (max_B) pinned: the sampled tokens of the last step
    int* host_status;        // (2) pinned
    int* host_pos;           // (max_B)
    int peak_pages;          // pages in use at most since the start of the run
} GpuDecoder;

// The decoder's copies, on its stream and finished on return: its kernels run on a non-blocking stream, which does not
// wait for the default stream's copies, and a copy from pinned memory would otherwise still be in flight when the host
// writes its source again. Set-up and per-run work only.
static void decoder_copy(const GpuDecoder* d, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, kind, d->stream));
    cudaCheck(cudaStreamSynchronize(d->stream));
}

// what the decoder cannot run (a message), or NULL: head sizes whose rows split into 4, 8, 16 or 32 lanes of XPACK
// channels
static const char* gpu_decoder_problem(const FoxConfig* cf) {
    int hd = cf->n_embd / cf->n_head, G = hd / XPACK;
    if (hd % XPACK != 0 || (G != 4 && G != 8 && G != 16 && G != 32)) {
        return "the GPU decoder takes head sizes of 4, 8, 16 or 32 times 16 bytes (32 to 256 in bf16)";
    }
    return NULL;
}

// pages one head holds at most: its live positions (all of max_len, or a window) plus the next one's
static int decoder_head_pages(const FoxConfig* cf, int max_len) {
    int all = (int)ceil_div((size_t)max_len, KV_PAGE);
    if (cf->window <= 0) { return all; }
    int w = (int)ceil_div((size_t)cf->window + 1, KV_PAGE) + 1;
    return w < all ? w : all;
}

// key splits per (sequence, head): about four blocks per SM over the batch, at most DEC_MAX_SPLITS and no more than
// the 512-key pieces of the longest live range (a block's fixed work, the query's norm and its share of the combine, is
// worth about that many keys)
static int decoder_splits(const GpuDecoder* d, int B) {
    int sms = g_prop.multiProcessorCount > 0 ? g_prop.multiProcessorCount : 132;
    int s = (int)ceil_div((size_t)4 * sms, (size_t)B * d->H);
    int kept = d->max_pages * KV_PAGE, cap = (int)ceil_div((size_t)kept, 512);
    s = s < cap ? s : cap;
    s = s < DEC_MAX_SPLITS ? s : DEC_MAX_SPLITS;
    return s > 0 ? s : 1;
}

static size_t decoder_page_bytes(const FoxConfig* cf) {
    return (size_t)KV_PAGE * ((size_t)2 * (cf->n_embd / cf->n_head) * sizeof(floatX) + sizeof(float));
}

// device bytes of a decoder for max_B sequences of max_len tokens with a pool of `pages` (the buffers besides the pool
// are small: one step's activations and the per-sequence state)
static size_t gpu_decoder_bytes(const FoxConfig* cf, int max_B, int max_len, size_t pages) {
    size_t L = (size_t)cf->n_layer, C = (size_t)cf->n_embd, H = (size_t)cf->n_head, hd = C / H, B = (size_t)max_B;
    size_t heads = L * B * H, mp = (size_t)decoder_head_pages(cf, max_len);
    size_t parts = H * (B + DEC_MAX_SPLITS) * DEC_MAX_SPLITS;
    size_t small = heads * (mp + 2) * sizeof(int) + 2 * heads * sizeof(float) + 2 * L * B * 2 * C * sizeof(floatX) +
                   B * ((4 * C + 3 * H) + 2 * (size_t)cf->mlp_hidden + (size_t)cf->padded_vocab_size + 2 * C) * 4 +
                   parts * (hd + 2) * sizeof(float) + (size_t)max_len * hd * sizeof(float) +
                   B * (size_t)cf->mlp_hidden * sizeof(floatX); // act
    return pages * (decoder_page_bytes(cf) + sizeof(int)) + small;
}

// the pool's worst case: every head of max_B sequences holding its most pages
static size_t decoder_worst_pages(const FoxConfig* cf, int max_B, int max_len) {
    return (size_t)cf->n_layer * max_B * cf->n_head * decoder_head_pages(cf, max_len);
}

// delta_h of every (layer, head) from the QK-norm weights, as fox_decoder_evict_init, with the bound U raised by 1%
// instead of 0.1%: here q and k are rounded to bf16 after the norm (at most 2^-8 relative
// each, (1 + 2^-8)^2 < 1.01), so the twin's margin would not cover them
static void gpu_decoder_evict_init(GpuDecoder* d, float ln_eps, int delta_len) {
    const FoxConfig* cf = &d->g->host->config;
    size_t L = (size_t)cf->n_layer, H = (size_t)cf->n_head;
    float* delta = evict_thresholds(d->g->host, ln_eps, delta_len, 1.01f);
    d->delta = (float*)gpu_malloc(L * H * sizeof(float), "eviction thresholds");
    decoder_copy(d, d->delta, delta, L * H * sizeof(float), cudaMemcpyHostToDevice);
    free(delta);
}

// Sets up a decoder on g's weights for up to max_B sequences of up to max_len tokens. evict: the eviction of -A 1
// (needs a forget gate and QK-norm: else off), thresholds from ln_eps and delta_len (the twin's max_len: -t). The host
// weights must be those on the device.
static void gpu_decoder_init(GpuDecoder* d, GPUModel* g, int max_B, int max_len, int evict, float ln_eps,
                             int delta_len) {
    const FoxConfig* cf = &g->config;
    const char* problem = gpu_decoder_problem(cf);
    if (problem != NULL) { fail("internal: %s" BUG_HINT, problem); }
    memset(d, 0, sizeof(*d));
    d->g = g;
    d->L = cf->n_layer; d->C = cf->n_embd; d->H = cf->n_head; d->hd = d->C / d->H; d->I = cf->mlp_hidden;
    d->V = cf->vocab_size; d->Vp = cf->padded_vocab_size;
    d->max_B = max_B; d->max_len = max_len;
    d->eot = g->host->doc_eot;
    d->max_pages = decoder_head_pages(cf, max_len);
    size_t worst = decoder_worst_pages(cf, max_B, max_len);
    if (worst > (size_t)INT32_MAX) { // page ids are ints
        fail("%d sequences of %d tokens would need %zu KV-cache pages, more than %d\n"
             "HINT: generate fewer prompts at once (-D) or fewer tokens (-g, -t)", max_B, max_len, worst, INT32_MAX);
    }
    d->worst_pages = (int)worst;
    d->use_graph = 1;
    d->pdl = 1;
    d->use_mma = 1;
    size_t L = (size_t)d->L, C = (size_t)d->C, H = (size_t)d->H, B = (size_t)max_B, heads = L * B * H;
    cudaCheck(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    int col = 3 * d->C;
    d->og_off = cf->output_gate ? col : -1; col += cf->output_gate ? d->C : 0;
    d->ks_off = cf->k_shift ? col : -1; col += cf->k_shift ? d->H : 0;
    d->vs_off = cf->v_shift ? col : -1; col += cf->v_shift ? d->H : 0;
    d->gate_off = cf->gate == GATE_FULL ? col : -1; col += cf->gate == GATE_FULL ? d->H : 0;
    d->proj_cols = col;
    int sms = g_prop.multiProcessorCount > 0 ? g_prop.multiProcessorCount : 132;
    size_t rows = H * (B + (size_t)8 * sms / H + 1); // room for up to eight blocks per SM (decoder_splits: four)
    d->part_rows = (int)(rows < H * B * DEC_MAX_SPLITS ? rows : H * B * DEC_MAX_SPLITS);
    d->table = (int*)gpu_malloc(heads * d->max_pages * sizeof(int), "page tables");
    d->first = (int*)gpu_malloc(heads * sizeof(int), "cache first positions");
    d->first_new = (int*)gpu_malloc(heads * sizeof(int), "cache first positions");
    d->status = (int*)gpu_malloc(2 * sizeof(int), "cache status");
    d->pos = (int*)gpu_malloc(B * sizeof(int), "positions");
    d->tokens = (int*)gpu_malloc(B * sizeof(int), "next tokens");
    d->rng = (uint64_t*)gpu_malloc(B * sizeof(uint64_t), "sampling states");
    d->c_last = (float*)gpu_malloc(2 * heads * sizeof(float), "running c");
    d->kv_last = (floatX*)gpu_malloc(2 * L * B * 2 * C * sizeof(floatX), "last raw k and v");
    d->resid = (float*)gpu_malloc(B * C * sizeof(float), "decoder residual");
    d->proj = (float*)gpu_malloc(B * col * sizeof(float), "decoder projections");
    d->part_m = (float*)gpu_malloc((size_t)d->part_rows * sizeof(float), "attention partials");
    d->part_l = (float*)gpu_malloc((size_t)d->part_rows * sizeof(float), "attention partials");
    d->part_o = (float*)gpu_malloc((size_t)d->part_rows * d->hd * sizeof(float), "attention partials");
    d->y = (floatX*)gpu_malloc(B * C * sizeof(floatX), "decoder attention output");
    d->gu = (float*)gpu_malloc(B * 2 * d->I * sizeof(float), "decoder MLP");
    d->act = (floatX*)gpu_malloc(B * d->I * sizeof(floatX), "decoder MLP activation");
    d->logits = (float*)gpu_malloc(B * d->Vp * sizeof(float), "decoder logits");
    if (cf->rope) { d->rope = rope_table_gpu(cf, max_len, d->stream, "decoder RoPE table"); }
    if (evict && cf->gate != GATE_NONE && cf->qk_norm) { gpu_decoder_evict_init(d, ln_eps, delta_len); }
    cudaCheck(cudaMallocHost(&d->host_tokens, B * sizeof(int)));
    cudaCheck(cudaMallocHost(&d->host_status, 2 * sizeof(int)));
    d->host_pos = (int*)malloc_check(B * sizeof(int), "positions");
    d->table_host = (int*)malloc_check(heads * d->max_pages * sizeof(int), "page tables");
    for (int mode = 0; mode < GEMV_MODES; mode++) { // every matvec instance may take GEMV_SMEM
        for (int i = 0; i < 3; i++) {
            int rb = i == 0 ? 1 : i == 1 ? 8 : 32;
            smem_limit(GEMV_SMEM, GEMV_PICK(gemv_kernel, mode, rb, 1, 8, 32));
#ifndef ENABLE_FP32
            smem_limit(GEMV_SMEM, GEMV_PICK(gemv_mma_kernel, mode, 1 << i, 1, 2, 4));
#endif
        }
    }
}

static void gpu_decoder_drop_graph(GpuDecoder* d) {
    if (d->graph_ready) { cudaCheck(cudaGraphExecDestroy(d->graph)); }
    d->graph_ready = 0;
}

// pushes pages lo .. hi - 1 on the free stack above its first `top` entries (popped lowest id first) and uploads the
// status: top + hi - lo free pages, none short
static void decoder_push_pages(GpuDecoder* d, int top, int lo, int hi) {
    int* ids = (int*)malloc_check((size_t)(hi - lo) * sizeof(int), "free pages");
    for (int i = 0; i < hi - lo; i++) { ids[i] = hi - 1 - i; }
    decoder_copy(d, d->stack + top, ids, (size_t)(hi - lo) * sizeof(int), cudaMemcpyHostToDevice);
    free(ids);
    d->host_status[0] = top + hi - lo;
    d->host_status[1] = 0;
    decoder_copy(d, d->status, d->host_status, 2 * sizeof(int), cudaMemcpyHostToDevice);
}

// Grows the pool to `pages` (at most worst_pages): the pages so far are copied, the new ones go on the free stack, and
// the step's graph is captured again (new pointers).
static void gpu_decoder_grow(GpuDecoder* d, int pages) {
    if (pages > d->worst_pages) { pages = d->worst_pages; }
    if (pages <= d->pool_pages) { return; }
    size_t old = (size_t)d->pool_pages, n = (size_t)pages, kv = (size_t)KV_PAGE * d->hd;
    floatX* k = (floatX*)gpu_malloc(n * kv * sizeof(floatX), "KV cache pages (keys)");
    floatX* v = (floatX*)gpu_malloc(n * kv * sizeof(floatX), "KV cache pages (values)");
    float* c = (float*)gpu_malloc(n * KV_PAGE * sizeof(float), "KV cache pages (c)");
    int* stack = (int*)gpu_malloc(n * sizeof(int), "KV cache free pages");
    int top = old > 0 ? d->host_status[0] : 0;
    if (old > 0) {
        decoder_copy(d, k, d->pool_k, old * kv * sizeof(floatX), cudaMemcpyDeviceToDevice);
        decoder_copy(d, v, d->pool_v, old * kv * sizeof(floatX), cudaMemcpyDeviceToDevice);
        decoder_copy(d, c, d->pool_c, old * KV_PAGE * sizeof(float), cudaMemcpyDeviceToDevice);
        decoder_copy(d, stack, d->stack, (size_t)top * sizeof(int), cudaMemcpyDeviceToDevice);
        cudaCheck(cudaFree(d->pool_k)); cudaCheck(cudaFree(d->pool_v)); cudaCheck(cudaFree(d->pool_c));
        cudaCheck(cudaFree(d->stack));
    }
    d->pool_k = k; d->pool_v = v; d->pool_c = c; d->stack = stack;
    d->pool_pages = pages;
    decoder_push_pages(d, top, (int)old, pages);
    gpu_decoder_drop_graph(d);
}

// Starts a run of B sequences: sampling by temperature (0: greedy) and top_k from the states seeds (B) (generate_seed).
// The cache is then filled by gpu_decoder_prefill or gpu_decoder_start_empty.
static void gpu_decoder_begin(GpuDecoder* d, int B, double temperature, int top_k, const uint64_t* seeds) {
    if (B < 1 || B > d->max_B) { fail("internal: %d sequences for a decoder of %d" BUG_HINT, B, d->max_B); }
    if (B != d->B || temperature != d->temperature || top_k != d->top_k) { gpu_decoder_drop_graph(d); }
    d->B = B; d->temperature = temperature; d->top_k = top_k;
    d->splits = decoder_splits(d, B);
    if ((size_t)B * d->H * d->splits > (size_t)d->part_rows) {
        fail("internal: attention partials too small" BUG_HINT);
    }
    decoder_copy(d, d->rng, seeds, (size_t)B * sizeof(uint64_t), cudaMemcpyHostToDevice);
    size_t heads = (size_t)d->L * B * d->H;
    cudaCheck(cudaMemsetAsync(d->c_last, 0, 2 * heads * sizeof(float), d->stream)); // c before the first token
    cudaCheck(cudaMemsetAsync(d->kv_last, 0, 2 * (size_t)d->L * B * 2 * d->C * sizeof(floatX), d->stream)); // k~_{-1}
    cudaCheck(cudaStreamSynchronize(d->stream));
    d->peak_pages = 0;
    if (d->pool_pages == 0) { // sized for the worst case unless eviction keeps it small
        gpu_decoder_grow(d, d->delta != NULL ? (int)(2 * heads) : d->worst_pages);
    } else { // a pool from an earlier run: every page free again
        decoder_push_pages(d, 0, 0, d->pool_pages);
    }
}

// Pops pages off the free stack (top first, as decode_manage_kernel does) for the live positions first[i] / KV_PAGE ..
// last[b] / KV_PAGE of every head i of sequences b0 .. b0 + Bg - 1 (first (L, B, H) on the host; last[b]: the
// position of b's next token, whose page must exist), in head order, growing the pool when it is short, and uploads the
// tables and first positions.
static void gpu_decoder_assign_pages(GpuDecoder* d, int b0, int Bg, const int* first, const int* last) {
    size_t heads = (size_t)d->L * d->B * d->H, need = 0;
    for (int l = 0; l < d->L; l++) {
        for (int b = b0; b < b0 + Bg; b++) {
            for (int h = 0; h < d->H; h++) {
                need += (size_t)(last[b] / KV_PAGE - first[((size_t)l * d->B + b) * d->H + h] / KV_PAGE + 1);
            }
        }
    }
    if ((size_t)d->host_status[0] < need) {
        gpu_decoder_grow(d, d->pool_pages + (int)(need - (size_t)d->host_status[0] + heads));
    }
    if ((size_t)d->host_status[0] < need) { fail("internal: the prompts need %zu cache pages" BUG_HINT, need); }
    int top = d->host_status[0];
    int* ids = (int*)malloc_check((need > 0 ? need : 1) * sizeof(int), "free pages");
    decoder_copy(d, ids, d->stack + (top - (int)need), need * sizeof(int), cudaMemcpyDeviceToHost);
    size_t k = need;
    for (int l = 0; l < d->L; l++) {
        for (int b = b0; b < b0 + Bg; b++) {
            for (int h = 0; h < d->H; h++) {
                size_t i = ((size_t)l * d->B + b) * d->H + h;
                int* row = d->table_host + i * d->max_pages;
                for (int p = 0; p < d->max_pages; p++) { row[p] = -1; }
                for (int p = first[i] / KV_PAGE; p <= last[b] / KV_PAGE; p++) { row[p % d->max_pages] = ids[--k]; }
            }
        }
    }
    free(ids);
    d->host_status[0] = top - (int)need;
    decoder_copy(d, d->table, d->table_host, heads * d->max_pages * sizeof(int), cudaMemcpyHostToDevice);
    decoder_copy(d, d->first, first, heads * sizeof(int), cudaMemcpyHostToDevice);
    decoder_copy(d, d->status, d->host_status, 2 * sizeof(int), cudaMemcpyHostToDevice);
}

static int decoder_pages_in_use(const GpuDecoder* d) { return d->pool_pages - d->host_status[0]; }

static GemvSegments gemv_one(const floatX* w, int rows) {
    GemvSegments s;
    memset(&s, 0, sizeof(s));
    s.w[0] = w; s.end[0] = rows; s.count = 1;
    return s;
}

// layer l's q, k, v, output-gate and per-head projections in the column order of proj
static GemvSegments decoder_attn_segments(const GpuDecoder* d, int l) {
    const FoxConfig* cf = &d->g->config;
    GemvSegments s;
    memset(&s, 0, sizeof(s));
    int rows = 0;
    GPUModel* g = d->g;
    const floatX* w[7] = {px(g, P_WQ, l), px(g, P_WK, l), px(g, P_WV, l), cf->output_gate ? px(g, P_WG, l) : NULL,
                          cf->k_shift ? px(g, P_WK_SHIFT, l) : NULL, cf->v_shift ? px(g, P_WV_SHIFT, l) : NULL,
                          cf->gate == GATE_FULL ? px(g, P_WF, l) : NULL};
    int n[7] = {d->C, d->C, d->C, d->C, d->H, d->H, d->H};
    for (int i = 0; i < 7; i++) {
        if (w[i] == NULL) { continue; }
        rows += n[i];
        s.w[s.count] = w[i];
        s.end[s.count++] = rows;
    }
    return s;
}

// kernel<<<grid, block, smem, d->stream>>>(args), with programmatic dependent launch when d->pdl
template <typename... KArgs, typename... Args>
static void decoder_launch(GpuDecoder* d, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                           Args... args) {
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.gridDim = grid; cfg.blockDim = block; cfg.dynamicSmemBytes = smem; cfg.stream = d->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = d->pdl;
    cfg.attrs = attr; cfg.numAttrs = 1;
    cudaCheck(cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...));
}

#ifndef ENABLE_FP32
// batch tiles of 8 rows a pass of gemv_mma_kernel: 1, 2 or 4 as d->B needs, fewer where the pass's input rows would not
// fit GEMV_SMEM (the kernel loops over passes); 0: not even one fits
static int gemv_mma_tiles(const GpuDecoder* d, int IC) {
    int NT = d->B <= 8 ? 1 : d->B <= 16 ? 2 : 4;
    size_t row_bytes = (size_t)gemv_mma_ldx(IC) * sizeof(floatX);
    while (NT > 0 && (size_t)8 * NT * row_bytes > GEMV_SMEM) { NT /= 2; }
    return NT;
}
#endif

// The matvecs of a step: tensor cores in the bf16 build when IC is a multiple of 32 (gemv_mma_kernel: NT tiles of 8
// batch rows a pass, gemv_mma_tiles; a block per 16-row tile), else CUDA cores (gemv_kernel: RB accumulators for the
// batch, 1, 8 or 32 rows a pass); at most four blocks per SM (the rest loop).
static void gemv_gpu(GpuDecoder* d, int mode, float* out, int out_stride, int accumulate, const GemvSegments* W, int OC,
                     int IC, const void* in, const float* norm_w) {
    void (*kernel)(float*, int, int, GemvSegments, int, int, const void*, const float*, int, int);
    size_t smem, want;
    int rows;
#ifndef ENABLE_FP32
    int NT = IC % 32 == 0 && d->use_mma ? gemv_mma_tiles(d, IC) : 0;
    if (NT > 0) {
        kernel = GEMV_PICK(gemv_mma_kernel, mode, NT, 1, 2, 4);
        rows = 8 * NT;
        smem = (size_t)rows * gemv_mma_ldx(IC) * sizeof(floatX);
        want = ceil_div((size_t)OC, 16);
    } else
#endif
    {
        int RB = d->B <= 1 ? 1 : d->B <= 8 ? 8 : 32;
        rows = (int)(GEMV_SMEM / ((size_t)IC * sizeof(floatX)));
        rows = rows < RB ? rows : RB;
        if (rows < 1) { fail("internal: a matvec input of %d is too long for shared memory" BUG_HINT, IC); }
        kernel = GEMV_PICK(gemv_kernel, mode, RB, 1, 8, 32);
        smem = (size_t)rows * IC * sizeof(floatX);
        want = ceil_div((size_t)OC, GEMV_THREADS / 32);
    }
    size_t most = (size_t)g_prop.multiProcessorCount * 4;
    decoder_launch(d, kernel, (unsigned)(want < most ? want : most), GEMV_THREADS, smem, out, out_stride, accumulate,
                   *W, OC, IC, in, norm_w, d->B, rows);
}

// decode_attention_kernel<G, DOCS> for G = hd / XPACK lanes a key (4, 8, 16 or 32: gpu_decoder_problem)
typedef void (*DecAttnKernel)(DecAttnArgs);
template <bool DOCS>
static DecAttnKernel decode_attention_instance(int G) {
    return G == 4 ? decode_attention_kernel<4, DOCS> : G == 8 ? decode_attention_kernel<8, DOCS>
           : G == 16 ? decode_attention_kernel<16, DOCS> : decode_attention_kernel<32, DOCS>;
}

static void decode_attention_gpu(GpuDecoder* d, int l) {
    GPUModel* g = d->g;
    const FoxConfig* cf = &g->config;
    DecAttnArgs a;
    memset(&a, 0, sizeof(a));
    a.proj = d->proj; a.proj_stride = d->proj_cols;
    a.k_off = d->C; a.v_off = 2 * d->C; a.ks_off = d->ks_off; a.vs_off = d->vs_off; a.gate_off = d->gate_off;
    a.bf = cf->gate != GATE_NONE ? pm(g, P_BF, l) : NULL;
    a.gate_full = cf->gate == GATE_FULL;
    a.q_norm = cf->qk_norm ? pm(g, P_Q_NORM, l) : NULL;
    a.k_norm = cf->qk_norm ? pm(g, P_K_NORM, l) : NULL;
    a.groups_qk = cf->qk_norm_shared ? 1 : d->H;
    a.rope = d->rope;
    a.pool_k = d->pool_k; a.pool_v = d->pool_v; a.pool_c = d->pool_c;
    a.table = d->table; a.first = d->first; a.pos = d->pos;
    a.c_last = d->c_last; a.kv_last = d->kv_last;
    a.part_m = d->part_m; a.part_l = d->part_l; a.part_o = d->part_o;
    a.scale = 1.0f / sqrtf((float)d->hd);
    a.l = l; a.L = d->L; a.B = d->B; a.H = d->H; a.C = d->C; a.max_pages = d->max_pages; a.S = d->splits;
    a.tokens = d->tokens; a.eot = d->eot;
    dim3 grid((unsigned)d->splits, (unsigned)d->H, (unsigned)d->B);
    int G = d->hd / XPACK;
    decoder_launch(d, d->eot >= 0 ? decode_attention_instance<true>(G) : decode_attention_instance<false>(G), grid,
                   DEC_ATT_THREADS, 0, a);
}

// the head on d->resid: final RMSNorm, lm_head (the first V rows) into fp32 logits, then sampling
static void decode_logits_gpu(GpuDecoder* d) {
    GemvSegments head = gemv_one(px(d->g, P_LM_HEAD, 0), d->V);
    gemv_gpu(d, GEMV_X_RMSNORM, d->logits, d->Vp, 0, &head, d->V, d->C, d->resid, pm(d->g, P_NORM_F, 0));
}

static void decode_sample_gpu(GpuDecoder* d) {
    decoder_launch(d, sample_kernel, (unsigned)d->B, SAMPLE_THREADS, 0, d->tokens, (const float*)d->logits, d->Vp, d->V,
                   d->rng, d->temperature, d->top_k);
}

static void decode_head_gpu(GpuDecoder* d) {
    decode_logits_gpu(d);
    decode_sample_gpu(d);
}

// the stages of a step, each one launch on d->stream (dev/profile_generate.cu times them one by one)
static void decode_embed_gpu(GpuDecoder* d) {
    encoder_forward_gpu(d->resid, d->tokens, pm(d->g, P_WTE, 0), (size_t)d->B, d->C, d->stream);
}

static void decode_qkv_gpu(GpuDecoder* d, int l) {
    GemvSegments att = decoder_attn_segments(d, l);
    gemv_gpu(d, GEMV_X_RMSNORM, d->proj, d->proj_cols, 0, &att, d->proj_cols, d->C, d->resid,
             pm(d->g, P_ATTN_NORM, l));
}

static void decode_combine_gpu(GpuDecoder* d, int l) {
    const FoxConfig* cf = &d->g->config;
    decoder_launch(d, decode_combine_kernel, (unsigned)ceil_div((size_t)d->B * d->H, 8), 256, 0, d->y,
                   (const float*)d->part_m, (const float*)d->part_l, (const float*)d->part_o, (const float*)d->proj,
                   d->proj_cols, d->og_off, (const float*)(cf->output_norm ? pm(d->g, P_O_NORM, l) : NULL), d->B, d->H,
                   d->hd, d->splits);
}

static void decode_out_gpu(GpuDecoder* d, int l) { // resid += W_o y
    GemvSegments wo = gemv_one(px(d->g, P_WO, l), d->C);
    gemv_gpu(d, GEMV_X_PLAIN, d->resid, d->C, 1, &wo, d->C, d->C, d->y, NULL);
}

static void decode_mlp_up_gpu(GpuDecoder* d, int l) {
    GemvSegments wgu = gemv_one(px(d->g, P_WGU, l), 2 * d->I);
    gemv_gpu(d, GEMV_X_RMSNORM, d->gu, 2 * d->I, 0, &wgu, 2 * d->I, d->C, d->resid, pm(d->g, P_MLP_NORM, l));
}

// resid += W_down act. A few sequences: the matvec's prologue forms act = silu(g) u in each of its blocks (no launch
// more); DEC_SWIGLU_APART or more: decode_swiglu_kernel forms it once (the same operations, the same bits), since every
// block redoing it for the whole batch costs more than a launch
#define DEC_SWIGLU_APART 8
static void decode_mlp_down_gpu(GpuDecoder* d, int l) {
    GemvSegments wd = gemv_one(px(d->g, P_WDOWN, l), d->C);
    if (d->B < DEC_SWIGLU_APART) {
        gemv_gpu(d, GEMV_X_SWIGLU, d->resid, d->C, 1, &wd, d->C, d->I, d->gu, NULL);
        return;
    }
    size_t units = (size_t)d->B * (d->I / 4);
    decoder_launch(d, decode_swiglu_kernel, (unsigned)ceil_div(units, 256), 256, 0, d->act, (const float*)d->gu, d->B,
                   d->I);
    gemv_gpu(d, GEMV_X_PLAIN, d->resid, d->C, 1, &wd, d->C, d->I, d->act, NULL);
}

// the prompts' first kept positions (heads of sequences b0 .. b0 + Bg - 1, lens_d their lengths on the device; c: the
// prefill forward's (L, Bg, H, Tp), NULL without a gate)
static void prefill_first_gpu(GpuDecoder* d, const float* c, const int* lens_d, int b0, int Bg, int Tp) {
    auto kernel = d->eot >= 0 ? prefill_first_kernel<true> : prefill_first_kernel<false>;
    kernel<<<(unsigned)ceil_div((size_t)d->L * Bg * d->H, 256), 256, 0, d->stream>>>(
        d->first, c, lens_d, d->delta, d->L, d->B, b0, Bg, d->H, Tp, d->g->config.window, d->g->docs_dev);
    launchCheck();
}

// the same group's kept positions from the prefill forward's activations ac into the cache
static void prefill_fill_gpu(GpuDecoder* d, const GPUActivations* ac, const float* c, const int* lens_d, int b0, int Bg,
                             int Tp) {
    DecFillArgs fa = {ac->k, ac->v, ac->k_raw, ac->v_raw, c, lens_d, d->first, d->table, d->pool_k, d->pool_v,
                      d->pool_c, d->c_last, d->kv_last, d->L, d->B, b0, Bg, Tp, d->H, d->hd, d->C, d->max_pages};
    unsigned slices = (unsigned)ceil_div((size_t)Tp, 256);
    prefill_fill_kernel<<<dim3((unsigned)(d->L * Bg * d->H), slices < 64 ? slices : 64), 128, 0, d->stream>>>(fa);
    launchCheck();
}

static void decode_manage_gpu(GpuDecoder* d) {
    DecManageArgs m = {d->first, d->first_new, d->table, d->pos, d->stack, d->status, d->pool_c, d->delta,
                       d->L, d->B, d->H, d->max_pages, d->g->config.window, d->max_len, d->tokens, d->eot};
    decoder_launch(d, d->eot >= 0 ? decode_manage_kernel<true> : decode_manage_kernel<false>, 1, 1024, 0, m);
}

// One token for every sequence: the kernels of a step, on d->stream (captured into the graph); the cache's upkeep
// before the head, whose sampler overwrites the fed tokens (the two touch no common buffer)
static void decode_step_kernels(GpuDecoder* d) {
    decode_embed_gpu(d);
    for (int l = 0; l < d->L; l++) {
        decode_qkv_gpu(d, l);
        decode_attention_gpu(d, l);
        decode_combine_gpu(d, l);
        decode_out_gpu(d, l);
        decode_mlp_up_gpu(d, l);
        decode_mlp_down_gpu(d, l);
    }
    decode_manage_gpu(d);
    decode_head_gpu(d);
    int B = d->B;
    cudaCheck(cudaMemcpyAsync(d->host_tokens, d->tokens, (size_t)B * sizeof(int), cudaMemcpyDeviceToHost, d->stream));
    cudaCheck(cudaMemcpyAsync(d->host_status, d->status, 2 * sizeof(int), cudaMemcpyDeviceToHost, d->stream));
}

// captures the step's graph when it is not there (at the start of a run, so that the first step does not pay for it,
// and after the pool grew)
static void gpu_decoder_capture(GpuDecoder* d) {
    if (!d->use_graph || d->graph_ready) { return; }
    cudaGraph_t graph;
    cudaCheck(cudaStreamBeginCapture(d->stream, cudaStreamCaptureModeThreadLocal));
    decode_step_kernels(d);
    cudaCheck(cudaStreamEndCapture(d->stream, &graph));
    cudaCheck(cudaGraphInstantiate(&d->graph, graph, 0));
    cudaCheck(cudaGraphDestroy(graph));
    d->graph_ready = 1;
}

// Feeds every sequence its next token (d->tokens) at its position: the logits (B, Vp) of what follows land in
// d->logits, the sampled tokens in d->tokens and d->host_tokens. One graph launch: the kernels' arguments never change
// between steps (positions, lengths and tokens are read from device memory).
static void gpu_decoder_step(GpuDecoder* d) {
    for (int b = 0; b < d->B; b++) {
        if (d->host_pos[b] >= d->max_len) {
            fail("internal: sequence %d reached the decoder's %d tokens" BUG_HINT, b, d->max_len);
        }
    }
    int heads = d->L * d->B * d->H; // a step takes at most one page per head
    if (d->host_status[0] < heads && d->pool_pages < d->worst_pages) {
        int want = 2 * d->pool_pages;
        gpu_decoder_grow(d, want > d->pool_pages + heads ? want : d->pool_pages + heads);
    }
    if (d->use_graph) {
        gpu_decoder_capture(d);
        cudaCheck(cudaGraphLaunch(d->graph, d->stream));
    } else {
        decode_step_kernels(d);
    }
    cudaCheck(cudaStreamSynchronize(d->stream));
    if (d->host_status[1] != 0) { fail("internal: the KV cache ran out of pages" BUG_HINT); }
    for (int b = 0; b < d->B; b++) { d->host_pos[b]++; }
    int used = decoder_pages_in_use(d);
    if (used > d->peak_pages) { d->peak_pages = used; }
}

// An empty cache: every sequence starts at position 0 with tokens[b] as its first token (a prompt is then fed through
// steps, the host writing d->tokens between them); gpu_sample's path.
static void gpu_decoder_start_empty(GpuDecoder* d, const int* tokens) {
    size_t heads = (size_t)d->L * d->B * d->H;
    int* zero = (int*)calloc_check(heads, sizeof(int), "cache first positions");
    gpu_decoder_assign_pages(d, 0, d->B, zero, zero);
    free(zero);
    for (int b = 0; b < d->B; b++) { d->host_pos[b] = 0; }
    decoder_copy(d, d->pos, d->host_pos, (size_t)d->B * sizeof(int), cudaMemcpyHostToDevice);
    decoder_copy(d, d->tokens, tokens, (size_t)d->B * sizeof(int), cudaMemcpyHostToDevice);
    d->peak_pages = decoder_pages_in_use(d);
    gpu_decoder_capture(d);
}

// Fills the cache with the prompts (B of them, prompt b in tokens[b * stride ..], lens[b] tokens) through
// gpu_forward, in groups of up to g->max_B sequences right-padded to the longest prompt (causal attention never lets
// the padding reach a prompt's positions), then samples every sequence's first new token from the logits after its
// prompt. gpu_forward must keep every layer's activations (no -r 1).
static void gpu_decoder_prefill(GpuDecoder* d, const int* tokens, int stride, const int* lens) {
    GPUModel* g = d->g;
    int B = d->B, H = d->H, L = d->L, Tp = 0;
    size_t heads = (size_t)L * B * H;
    if (g->acts.recompute) { fail("internal: the prefill needs every layer's activations (-r 0)" BUG_HINT); }
    for (int b = 0; b < B; b++) {
        if (lens[b] < 1 || lens[b] >= d->max_len) { fail("internal: prompt of %d tokens" BUG_HINT, lens[b]); }
        Tp = lens[b] > Tp ? lens[b] : Tp;
    }
    if (Tp > g->max_T) { fail("internal: prompt of %d tokens for a model built for %d" BUG_HINT, Tp, g->max_T); }
    int* first = (int*)calloc_check(heads, sizeof(int), "cache first positions");
    int* group = (int*)malloc_check((size_t)g->max_B * Tp * sizeof(int), "prefill batch");
    int* lens_d = (int*)gpu_malloc((size_t)g->max_B * sizeof(int), "prompt lengths");
    for (int b0 = 0; b0 < B; b0 += g->max_B) {
        int Bg = B - b0 < g->max_B ? B - b0 : g->max_B;
        for (int bg = 0; bg < Bg; bg++) {
            const int* src = tokens + (size_t)(b0 + bg) * stride;
            int n = lens[b0 + bg];
            for (int t = 0; t < Tp; t++) { group[(size_t)bg * Tp + t] = src[t < n ? t : n - 1]; }
        }
        gpu_forward(g, group, NULL, Bg, Tp);
        cudaCheck(cudaDeviceSynchronize()); // gpu_forward runs on the default stream
        decoder_copy(d, lens_d, lens + b0, (size_t)Bg * sizeof(int), cudaMemcpyHostToDevice);
        const GPUActivations* ac = &g->acts;
        const float* c = g->config.gate != GATE_NONE ? ac->c : NULL;
        prefill_first_gpu(d, c, lens_d, b0, Bg, Tp);
        cudaCheck(cudaMemcpyAsync(first, d->first, heads * sizeof(int), cudaMemcpyDeviceToHost, d->stream));
        cudaCheck(cudaStreamSynchronize(d->stream));
        gpu_decoder_assign_pages(d, b0, Bg, first, lens); // the page of each next position lens[b] too
        prefill_fill_gpu(d, ac, c, lens_d, b0, Bg, Tp);
        for (int bg = 0; bg < Bg; bg++) { // the residual after the prompt's last token, for the head
            size_t row = (size_t)bg * Tp + lens[b0 + bg] - 1;
            const float* src = LAYER(ac->resid, L, (size_t)Bg * Tp * d->C) + row * d->C;
            cudaCheck(cudaMemcpyAsync(d->resid + (size_t)(b0 + bg) * d->C, src, (size_t)d->C * sizeof(float),
                                      cudaMemcpyDeviceToDevice, d->stream));
        }
        cudaCheck(cudaStreamSynchronize(d->stream)); // the next group's forward overwrites the activations
    }
    decode_head_gpu(d);
    for (int b = 0; b < B; b++) { d->host_pos[b] = lens[b]; }
    cudaCheck(cudaMemcpyAsync(d->pos, d->host_pos, (size_t)B * sizeof(int), cudaMemcpyHostToDevice, d->stream));
    cudaCheck(cudaMemcpyAsync(d->host_tokens, d->tokens, (size_t)B * sizeof(int), cudaMemcpyDeviceToHost, d->stream));
    cudaCheck(cudaStreamSynchronize(d->stream));
    d->peak_pages = decoder_pages_in_use(d);
    cudaCheck(cudaFree(lens_d));
    free(first); free(group);
    gpu_decoder_capture(d);
}

static int compare_ints(const void* a, const void* b) {
    int x = *(const int*)a, y = *(const int*)b;
    return (x > y) - (x < y);
}

// under eviction: how the live keys spread over the (layer, head) caches of the first sequence (first[i]: the first
// live position of cache i), so a long-memory head shows as one that keeps all
static void decoder_report_heads(const GpuDecoder* d, const int* first) {
    int n = d->L * d->H, len = d->host_pos[0], all = 0, full = len - attention_first_key(len, d->g->config.window);
    int* live = (int*)malloc_check((size_t)n * sizeof(int), "live keys per head");
    for (int l = 0; l < d->L; l++) {
        for (int h = 0; h < d->H; h++) {
            live[l * d->H + h] = len - first[((size_t)l * d->B) * d->H + h];
            all += live[l * d->H + h] == full;
        }
    }
    qsort(live, (size_t)n, sizeof(int), compare_ints);
    printf("live keys per (layer, head) of sequence 0: median %d, 90th percentile %d, largest %d of %d; %d of %d "
           "heads keep every key\n", live[n / 2], live[(n * 9) / 10], live[n - 1], full, all, n);
    free(live);
}

// the live cache against the full one and the pages the cache holds, as the twin's fox_decoder_report
static void gpu_decoder_report(const GpuDecoder* d) {
    const FoxConfig* cf = &d->g->config;
    size_t heads = (size_t)d->L * d->B * d->H, live = 0, full = 0;
    int* first = (int*)malloc_check(heads * sizeof(int), "cache first positions");
    decoder_copy(d, first, d->first, heads * sizeof(int), cudaMemcpyDeviceToHost);
    int len_min = d->host_pos[0], len_max = d->host_pos[0];
    for (size_t i = 0; i < heads; i++) {
        int len = d->host_pos[(i / d->H) % d->B];
        live += (size_t)(len - first[i]);
        full += (size_t)(len - attention_first_key(len, cf->window));
    }
    for (int b = 0; b < d->B; b++) {
        len_min = d->host_pos[b] < len_min ? d->host_pos[b] : len_min;
        len_max = d->host_pos[b] > len_max ? d->host_pos[b] : len_max;
    }
    double entry = (2.0 * d->hd * sizeof(floatX) + sizeof(float)) / 1048576.0;
    double page = decoder_page_bytes(cf) / 1048576.0;
    char lens[64];
    if (len_min == len_max) { snprintf(lens, sizeof(lens), "%d tokens", len_min); }
    else { snprintf(lens, sizeof(lens), "%d to %d tokens", len_min, len_max); }
    printf("KV cache (GPU, %d sequence%s) after %s: %zu of %zu (position, head) entries live (%.1f%%), %.2f of "
           "%.2f MiB (keys, values, c); pages %.2f MiB in use now, %.2f MiB at most, pool %.2f MiB; eviction %s\n",
           d->B, d->B > 1 ? "s" : "", lens, live, full, full > 0 ? 100.0 * live / full : 0.0, live * entry,
           full * entry, decoder_pages_in_use(d) * page, d->peak_pages * page, d->pool_pages * page,
           d->delta != NULL ? "on (-A 1)" : d->g->host->prune ? "off (needs a forget gate and QK-norm)" : "off");
    if (d->delta != NULL) { decoder_report_heads(d, first); }
    free(first);
}

static void gpu_decoder_free(GpuDecoder* d) {
    gpu_decoder_drop_graph(d);
    void* bufs[] = {d->pool_k, d->pool_v, d->pool_c, d->table, d->first, d->first_new, d->stack, d->status, d->delta,
                    d->pos, d->tokens, d->rng, d->c_last, d->kv_last, d->resid, d->proj, d->part_m, d->part_l,
                    d->part_o, d->y, d->gu, d->act, d->logits, d->rope};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { cudaCheck(cudaFree(bufs[i])); }
    cudaCheck(cudaFreeHost(d->host_tokens));
    cudaCheck(cudaFreeHost(d->host_status));
    free(d->host_pos); free(d->table_host);
    cudaCheck(cudaStreamDestroy(d->stream));
    memset(d, 0, sizeof(*d));
}

// ----------------------------------------------------------------------------
// sampling on the GPU: the samples that training prints

// out (V) = row n of the last forward's logits in fp32; row_x: (V) host scratch
static void gpu_logits_row(const GPUModel* g, size_t n, floatX* row_x, float* out) {
    int V = g->config.vocab_size, Vp = g->config.padded_vocab_size;
    cudaCheck(cudaMemcpy(row_x, g->acts.logits + n * Vp, (size_t)V * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (int j = 0; j < V; j++) { out[j] = to_float(row_x[j]); }
}

// generates from the EOT token, recomputing the full forward at each step (where the decoder cannot run:
// gpu_decoder_problem)
static void gpu_sample_full(GPUModel* g, const Tokenizer* tk, int gen_tokens, uint64_t* rng) {
    int V = g->config.vocab_size;
    int* tokens = (int*)malloc_check((size_t)gen_tokens * sizeof(int), "sample");
    floatX* row_x = (floatX*)malloc_check((size_t)V * sizeof(floatX), "logits row");
    float* row = (float*)malloc_check((size_t)V * sizeof(float), "logits row");
    tokens[0] = tk->eot;
    printf("sample: ");
    for (int t = 1; t < gen_tokens; t++) {
        gpu_forward(g, tokens, NULL, 1, t);
        gpu_logits_row(g, (size_t)(t - 1), row_x, row);
        tokens[t] = sample_from_logits(row, V, 1.0f, rng);
        tokenizer_print(tk, tokens[t]);
    }
    printf("\n---\n");
    free(tokens); free(row_x); free(row);
}

// generates from the EOT token as the twin's fox_sample does (temperature 1 over every token, the same draws of rng),
// with the KV cache of a GpuDecoder: one graph per token
static void gpu_sample(GPUModel* g, const Tokenizer* tk, int gen_tokens, uint64_t* rng) {
    if (gpu_decoder_problem(&g->config) != NULL) { gpu_sample_full(g, tk, gen_tokens, rng); return; }
    GpuDecoder d;
    gpu_decoder_init(&d, g, 1, gen_tokens, 0, 0.0f, gen_tokens);
    gpu_decoder_begin(&d, 1, 1.0, 0, rng);
    gpu_decoder_start_empty(&d, &tk->eot);
    printf("sample: ");
    for (int t = 1; t < gen_tokens; t++) {
        gpu_decoder_step(&d);
        tokenizer_print(tk, d.host_tokens[0]);
    }
    printf("\n---\n");
    cudaCheck(cudaMemcpy(rng, d.rng, sizeof(uint64_t), cudaMemcpyDeviceToHost));
    gpu_decoder_free(&d);
}

// ----------------------------------------------------------------------------
// the evaluation modes on the GPU: gpu_forward behind the twin's ForwardBackend, so eval and niah run the twin's
// code on GPU logits and losses; generation runs the GpuDecoder above (every prompt at once, gpu_backend_generate), or
// recomputes the full forward for every new token where the decoder cannot run. NIAH keeps its one teacher-forced
// forward over prompt and answer: the decoder would need the same forward over the prompt (its prefill) and then a step
// per answer token, never less work. Maps run on the twin (exact fp32).

// the device memory -M generate needs: the prefill's model for Bp sequences of Tp tokens (gpu_build's buffers) and a
// decoder for B sequences of up to max_len tokens whose pool starts at `pages`
static size_t gpu_generate_bytes(const FoxConfig* cf, int Bp, int Tp, int B, int max_len, size_t pages) {
    return gpu_memory_needed(cf, Bp, Tp, &g_single_process, FP8_MODE_OFF) + gpu_decoder_bytes(cf, B, max_len, pages);
}

#define GENERATE_MEMORY_HINT "pass fewer or shorter prompts (-D), a smaller -g, or -A 1 on a model with a forget " \
                             "gate and QK-norm (eviction keeps the cache small)"

// stops with a HINT when `need` bytes do not fit in `free_b`
static void gpu_generate_check_memory(size_t need, size_t free_b, int B, int max_len, size_t cache) {
    if (need <= free_b) { return; }
    fail("%d prompt%s of up to %d tokens need about %.1f MiB of GPU memory (the KV cache %.1f MiB of it, sized for "
         "the longest prompt plus -g), the GPU has %.1f MiB free\nHINT: %s", B, B > 1 ? "s" : "", max_len,
         need / 1048576.0, cache / 1048576.0, free_b / 1048576.0, GENERATE_MEMORY_HINT);
}

// the twin's ForwardBackend on the GPU: a model built for the mode's batch (own), or for the prompts by generation,
// which also keeps its decoder
typedef struct {
    GPUModel* g;        // &own once built
    floatX* row_x;      // (V) one row of logits, as stored on the device
    FoxModel* host;     // the host model, the context -t (the eviction bound's max_len)
    int max_T;
    GPUModel own;       // own.host != NULL once built
    GpuDecoder dec;     // dec.g != NULL once made
} GpuBackend;

// a model for B x T tokens, unless the one built holds them
static void gpu_backend_build(GpuBackend* gb, int B, int T) {
    if (gb->g != NULL && gb->g->max_B >= B && gb->g->max_T >= T) { return; }
    if (gb->own.host != NULL) { gpu_free(&gb->own); }
    gpu_build(&gb->own, gb->host, B, T);
    gb->g = &gb->own;
}

// -M generate (ForwardBackend.generate): sizes the prefill batch to the free memory, builds the model for it, prefills
// every prompt into the decoder and runs one graph per token
static void gpu_backend_generate(void* ctx, GenerateJob* job) {
    GpuBackend* gb = (GpuBackend*)ctx;
    const FoxConfig* cf = &gb->host->config;
    int B = job->B, Tp = 0, max_len = job->cap;
    for (int b = 0; b < B; b++) { Tp = job->lens[b] > Tp ? job->lens[b] : Tp; }
    int evict = gb->host->prune && cf->gate != GATE_NONE && cf->qk_norm;
    size_t heads = (size_t)cf->n_layer * B * cf->n_head, pages = decoder_worst_pages(cf, B, max_len);
    if (evict) { pages = heads * (ceil_div((size_t)Tp, KV_PAGE) + 2); } // at most the prompts' pages at the start
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    int Bp = B; // the prefill's batch: all prompts, or halves until it fits
    size_t cache = pages * decoder_page_bytes(cf);
    while (Bp > 1 && gpu_generate_bytes(cf, Bp, Tp, B, max_len, pages) > free_b) {
        Bp = (Bp + 1) / 2;
    }
    gpu_generate_check_memory(gpu_generate_bytes(cf, Bp, Tp, B, max_len, pages), free_b, B,
                              max_len, cache);
    double t0 = now_seconds();
    g_memory_hint = GENERATE_MEMORY_HINT; // the prefill's model, the decoder's buffers, the pool's growth
    gpu_backend_build(gb, Bp, Tp);
    g_memory_estimate = gpu_generate_bytes(cf, Bp, Tp, B, max_len, pages);
    GpuDecoder* d = &gb->dec;
    gpu_decoder_init(d, gb->g, B, max_len, evict, gb->host->prune_ln_eps, gb->max_T);
    uint64_t* seeds = (uint64_t*)malloc_check((size_t)B * sizeof(uint64_t), "seeds");
    for (int b = 0; b < B; b++) { seeds[b] = generate_seed(job->seed, b); }
    gpu_decoder_begin(d, B, job->temperature, job->top_k, seeds);
    free(seeds);
    gpu_decoder_prefill(d, job->tokens, job->cap, job->lens);
    job->t_prompt = now_seconds() - t0;
    for (int k = 0; k < job->gen; k++) {
        if (k > 0) { gpu_decoder_step(d); }
        for (int b = 0; b < B; b++) {
            job->tokens[(size_t)b * job->cap + job->lens[b] + k] = d->host_tokens[b];
            if (job->on_token != NULL) { job->on_token(job->user, b, d->host_tokens[b]); }
        }
    }
}

static void gpu_backend_forward(void* ctx, const int* inputs, const int* targets, int B, int T, float* losses) {
    GPUModel* g = ((GpuBackend*)ctx)->g;
    gpu_forward(g, inputs, targets, B, T);
    if (targets != NULL) { memcpy(losses, g->losses_host, (size_t)B * T * sizeof(float)); }
}

static void gpu_backend_logits_row(void* ctx, size_t n, float* out) {
    GpuBackend* gb = (GpuBackend*)ctx;
    gpu_logits_row(gb->g, n, gb->row_x, out);
}

static void gpu_backend_reset(void* ctx) { (void)ctx; } // nothing cached

static void gpu_backend_next_logits(void* ctx, const int* tokens, int t, float* out) {
    GpuBackend* gb = (GpuBackend*)ctx;
    if (gb->g == NULL) { gpu_backend_build(gb, 1, gb->max_T); }
    gpu_forward(gb->g, tokens, NULL, 1, t);
    gpu_backend_logits_row(ctx, (size_t)(t - 1), out);
}

static int gpu_eval_main(const Args* a) {
    check_eval_args(a);
    gpu_init();
    attention_set_pruning(a->prune, a->prune_ln_eps);
    FoxModel model;
    build_model(&model, a);
    if (a->mode == MODE_MAPS) {
        int rc = run_eval_mode(a, &model, NULL, "CPU twin");
        fox_free(&model);
        return rc;
    }
    GpuBackend gb;
    memset(&gb, 0, sizeof(gb));
    gb.host = &model;
    gb.max_T = a->T;
    gb.row_x = (floatX*)malloc_check((size_t)model.config.vocab_size * sizeof(floatX), "logits row");
    int generate = a->mode == MODE_GENERATE;
    const char* problem = generate ? gpu_decoder_problem(&model.config) : NULL;
    const char* how = "GPU, bf16 forward";
    if (generate) { // the model is built for the prompts (gpu_backend_generate)
        if (problem != NULL) { printf("note: %s: generation recomputes the full forward for every token\n", problem); }
        how = problem == NULL ? "GPU, paged KV cache, one CUDA graph per token"
                              : "GPU, full forward for every token (no KV cache)";
    } else {
        int B, T;
        eval_mode_shape(a, &B, &T);
        gpu_backend_build(&gb, B > 0 ? B : 1, T);
    }
    ForwardBackend be = {&gb, model.config.vocab_size, gpu_backend_forward, gpu_backend_logits_row, gpu_backend_reset,
                         gpu_backend_next_logits, generate && problem == NULL ? gpu_backend_generate : NULL};
    printf("device: %s, precision %s\n", g_prop.name, PRECISION_NAME);
    int rc = run_eval_mode(a, &model, &be, how);
    if (!generate && tiles_counted(a)) {
        unsigned long long tiles;
        double share = attention_pruned_share(&tiles);
        if (g_prune) { printf("attention pruning (-A 1, ln eps %g%s)", a->prune_ln_eps, a->documents ? ", -f 1" : ""); }
        else { printf("attention with documents kept apart (-f 1)"); }
        printf(": %.1f%% of %llu attention tiles (128 x 128) skipped\n", 100.0 * share, tiles);
    }
    if (gb.dec.g != NULL) {
        gpu_decoder_report(&gb.dec);
        gpu_decoder_free(&gb.dec);
    }
    if (gb.own.host != NULL) { gpu_free(&gb.own); }
    free(gb.row_x);
    fox_free(&model);
    return rc;
}
