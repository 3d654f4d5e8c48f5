/*
Forgetting Attention forward (FoX), causal, optional forget gate and sliding window.

    S_ij = q_i.k_j * scale + c_i - c_j     (j <= i, and i - w < j when a window w > 0)
    o_i  = sum_j softmax_j(S_ij) v_j,       lse_i = log sum_j exp(S_ij)

q, k, v, o: bf16 (B, T, H, hd) with a token stride; c, lse: fp32 (B, H, T); c == NULL is plain
causal attention. The bias c_i - c_j is not scaled.

Compile (sm_90a; the CPU reference uses OpenMP):
nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fopenmp fox_attention_forward.cu -o fox_attention_forward

version 1 is a naive port of the CPU code: one thread per query row, two passes over the keys
./fox_attention_forward 1

version 2 is a tiled flash forward in fp32 CUDA cores: K/V tiles in shared memory, online softmax
./fox_attention_forward 2

version 3 is a flash forward on tensor cores (mma.sync m16n8k16 bf16, FlashAttention-2 layout):
64-row query tile per block, a warp per 16 rows, 64-key K/V tiles double-buffered with cp.async
./fox_attention_forward 3

version 4 is version 3 with 32 rows per warp (128-row query tile; 32-key tiles at hd 128 to fit
the registers): each K/V fragment feeds two mma's, half the shared-memory traffic per mma
./fox_attention_forward 4

version 5 is version 4's online softmax on Hopper's warpgroup mma (wgmma, sm_90a): a warpgroup per
64 query rows, Q and K read by descriptor from 128-byte-swizzled shared tiles, P from the
accumulators as register A fragments, V read N-major from its tile; 128-key tiles at hd 64
./fox_attention_forward 5

version 6 is version 5 with two warpgroups (128 rows) per block sharing 64-key K/V tiles (the API at
hd 64 before version 9)
./fox_attention_forward 6

version 7 is version 6 with FlashAttention-3's pipeline inside a warpgroup: tile j's S matmul is
issued with tile j-1's P V, and the softmax of tile j runs while P V is in flight (3 K/V stages)
./fox_attention_forward 7

version 8 is version 7 with the rest of FlashAttention-3's structure: a producer warp loads Q and
128-key K/V tiles with the bulk tensor copy engine (TMA) into mbarrier-signalled rings, setmaxnreg
moves registers from the producer warpgroup to the two consumer warpgroups, and the consumers
ping-pong their matmuls (named barriers); takes train_fox.cu's key_start pruning table. The API
ran it at hd 128 before version 9
./fox_attention_forward 8

version 9 is version 6 on an element-wise diet, for hd 64, where the softmax costs as much issue time
as the matmuls: the gate enters as one FFMA per score (per-column terms d_j = (c_ref - c_j) log2(e)
computed once per tile, the row term only in lse), a lazy running maximum (O is rescaled only when a
row maximum grows by more than a factor 2^8, FlashAttention-4's trick), key tiles from the diagonal backwards,
one ex2.approx.ftz per score, cheaper masks, 128-key tiles (two blocks per SM still fit at hd 64),
one barrier per tile; takes key_start as version 8. The API ran it at hd 128 until version 14 (at hd 64 until 10)
./fox_attention_forward 9

version 10 is version 9's softmax in version 8's structure, FlashAttention-3's
hd-64 shape: one block per SM of three consumer warpgroups (192 query rows, 160 registers each by
setmaxnreg) and a producer warp loading 128-key K/V tiles by TMA into mbarrier rings (no block-wide
barrier), each consumer overlapping its softmax of tile n with its own P V of tile n-1; hd 64 only
(hd 128 runs version 9). The API ran it at hd 64 until version 16 (+7-9% over version 9 on the H200)
./fox_attention_forward 10

version 11 is version 10 with two consumer warpgroups (128 rows, 240 registers): slower than version 10
./fox_attention_forward 11

version 12 is version 10 with a quarter of the exponentials computed in software on the FMA pipe
(FlashAttention-4's idea: ex2_poly, floor split and a degree-3 polynomial, max relative error 8.6e-5),
the rest by MUFU.EX2; version 13 the same with half of them. hd 128 runs version 9
./fox_attention_forward 12
./fox_attention_forward 13

version 14 is version 10's kernel at hd 128, shaped as FlashAttention-3 shapes hd 128: two consumer
warpgroups (128 query rows, 240 registers each by setmaxnreg), 128-key K/V tiles in two TMA stages
(162 KB of shared memory), the same intra-warpgroup overlap of softmax and P V; hd 64 runs version 10
./fox_attention_forward 14

version 15 is versions 10 (hd 64) and 14 (hd 128) made persistent: one block per SM walks the
(query tile, head) pairs, the longest first, its K/V rings running on across pairs and the next
pair's Q loading while the consumers finish the last P V and store O
./fox_attention_forward 15

version 16 is version 15 with the pairs dealt in snake order (block x takes the x-th pair of even
rounds and the (G - 1 - x)-th of odd ones): in version 15 block 0 takes the longest pair of every round.
The API runs it at both head sizes
./fox_attention_forward 16

version 17 is version 15's kernel on a grid of one block per pair (not persistent), to tell its code
from its schedule
./fox_attention_forward 17

version 18 is version 16 with the pairs in sections of heads whose K and V take 24 MB (half the L2),
even sections longest tiles first, odd ones shortest first (so the static deal stays even), so that
the blocks in flight share a few heads' K and V in L2
./fox_attention_forward 18

version 19 is version 16 with the producer's per-column terms (backward version 15's idea): the
producer lanes load c_j before the wait for the stage and store d_j = (c_ref - c_j) log2(e) with the
pair's first row as c_ref, so the consumers' logit is one FFMA with a loaded d_j (version 16 forms
each d_j in every consumer thread: 2 FFMA per 8 columns). Rows are up to 191 tokens from c_ref, so x
carries a per-row offset (c_i - c_ref) log2(e) (about 1400 at log f ~ -5), removed again in lse: an
absolute error of ~1e-4 in x and lse there (version 16's reference is the thread's own row), growing
linearly with |log f|
./fox_attention_forward 19

A range: ./fox_attention_forward 3 11

With no argument every version runs. Each version is validated against an fp64 CPU reference on
small shapes (T not a multiple of the tiles, hd 64/128, gate on/off, windows, packed qkv), then at
T = 65536 with strongly decaying and nearly-one gates (hd 128: T = 16384, a window and strong decay)
against an fp64 GPU reference (version 1's kernel instantiated in double, itself validated against
the CPU), then timed.
*/
#include "common.h"
#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled (version 8)
#include <omp.h>
#include <float.h>

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// query i sees key j
__host__ __device__ __forceinline__ bool fox_visible(int i, int j, int window) {
    return j <= i && (window == 0 || j > i - window);
}

// ----------------------------------------------------------------------------
// CPU reference, fp64 on the bf16 values

static void fox_forward_cpu(double* o, double* lse, const float* q, const float* k, const float* v,
                            const float* c, int B, int T, int H, int hd, int stride_qkv, int window,
                            const int* key_start = nullptr) {
    // o: (B, T, H, hd) compact; lse: (B, H, T). key_start (B*H, ceil(T / 128)): query tile i / 128
    // skips the keys before 128 * key_start (version 8's pruning), NULL: none
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

// ----------------------------------------------------------------------------
// small device helpers shared by the versions (and by the backward file)

__device__ __forceinline__ void st_out(bf16* p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void st_out(bf16* p, double x) { *p = __float2bfloat16((float)x); }
__device__ __forceinline__ void st_out(float* p, float x) { *p = x; }
__device__ __forceinline__ void st_out(double* p, double x) { *p = x; }
template<class A> __device__ __forceinline__ A ld_in(const bf16* p) { return (A)__bfloat162float(*p); }
template<class A> __device__ __forceinline__ A ld_in(const float* p) { return (A)*p; }
template<class A> __device__ __forceinline__ A ld_in(const double* p) { return (A)*p; }

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// 16-byte global->shared copy; pred false writes zeros (rows past T)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool pred) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(pred ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template<int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
// four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m, register m receives
// (row lane/4, cols 2*(lane%4), +1) of matrix m (transposed with .trans)
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)) : "memory");
}
// d (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col)
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
// The accumulator of two adjacent n8 tiles (keys 16kk..16kk+15) is, repacked to bf16, exactly the
// A fragment of the k16 step kk: a0 = (row g, k 2t..), a1 = (row g+8, k 2t..), a2/a3 = same at k+8.
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = pack_bf16(lo[0], lo[1]); a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]); a[3] = pack_bf16(hi[2], hi[3]);
}

// ROWS rows of one head of a (B, T, H, hd) tensor into a padded shared tile (ROWS, LD); rows past T
// are zero-filled so the tensor cores never read garbage.
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
// ROWS fp32 values of a (B, H, T) vector; past T zero-filled
template<int ROWS>
__device__ __forceinline__ void load_vec_async(float* sm, const float* g, int row0, int T) {
    if (threadIdx.x < ROWS) {
        int row = row0 + threadIdx.x;
        bool ok = row < T;
        cp_async4(sm + threadIdx.x, g + (ok ? row : 0), ok);
    }
}

// Hopper warpgroup mma (wgmma, sm_90a), used by forward versions 5-9 and the backward versions
// (train_fox.cu needs this block for them).
// wgmma wrappers: d (64 x N fp32 accumulator fragment, N/2 registers per thread) += A (64 x 16) B (16 x N);
// acc = 0 overwrites d. SS: A and B by descriptor; RS: A from registers (mma.sync A-fragment layout
// per warp). TB = 1: B is N-major (transposed).
template<int TB> __device__ __forceinline__ void wgmma_ss_n32(float* d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "%16, %17, p, 1, 1, 0, %19;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(acc), "n"(TB) : "memory");
}
template<int TB> __device__ __forceinline__ void wgmma_rs_n32(float* d, const uint32_t a[4], uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "{%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB) : "memory");
}
template<int TB> __device__ __forceinline__ void wgmma_ss_n64(float* d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, %35;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
                   "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc), "n"(TB) : "memory");
}
template<int TB> __device__ __forceinline__ void wgmma_rs_n64(float* d, const uint32_t a[4], uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
                   "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB) : "memory");
}
template<int TB> __device__ __forceinline__ void wgmma_ss_n128(float* d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, %67;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
                   "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
                   "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
                   "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
                   "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(acc), "n"(TB) : "memory");
}
template<int TB> __device__ __forceinline__ void wgmma_rs_n128(float* d, const uint32_t a[4], uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
                   "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
                   "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
                   "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
                   "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB) : "memory");
}
template<int N, int TB> __device__ __forceinline__ void wgmma_ss(float* d, uint64_t da, uint64_t db, int acc) {
    if constexpr (N == 32) wgmma_ss_n32<TB>(d, da, db, acc);
    else if constexpr (N == 64) wgmma_ss_n64<TB>(d, da, db, acc);
    else wgmma_ss_n128<TB>(d, da, db, acc);
}
template<int N, int TB> __device__ __forceinline__ void wgmma_rs(float* d, const uint32_t a[4], uint64_t db, int acc) {
    if constexpr (N == 32) wgmma_rs_n32<TB>(d, a, db, acc);
    else if constexpr (N == 64) wgmma_rs_n64<TB>(d, a, db, acc);
    else wgmma_rs_n128<TB>(d, a, db, acc);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template<int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
__device__ __forceinline__ void wgmma_wait0() { wgmma_wait<0>(); }
// The compiler sees a wgmma as finished when issued; pinning its accumulators after the wait keeps
// every read of them below the wait.
template<int R> __device__ __forceinline__ void wgmma_pin(float* d) {
    #pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}
// A fragments read by an in-flight wgmma: a use after the wait keeps their registers from reuse
template<int R> __device__ __forceinline__ void wgmma_use_a(uint32_t (*a)[4]) {
    #pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" :: "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]) : "memory");
}
// the same for A fragments in registers: keeps them alive (unreused) until the wait
template<int R> __device__ __forceinline__ void wgmma_pin_a(uint32_t (*a)[4]) {
    #pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3]) :: "memory");
}
// cp.async writes are generic-proxy writes; wgmma reads through the async proxy
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Shared-memory matrix descriptor: start address, LBO, SBO (each >> 4), layout (bits 62-63:
// 0 none, 1 128-byte swizzle).
__device__ __forceinline__ uint64_t wg_desc(const void* p, uint32_t lbo, uint32_t sbo, int sw) {
    return (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           ((uint64_t)sw << 62);
}
// Two layouts of a (ROWS, HD) bf16 tile (SW picks):
// SW = 0 (version 4): 8x8 core matrices (8 rows of 16 bytes, 128 contiguous bytes, no swizzle),
//   core matrix (rb, cb) at byte (rb * HD/8 + cb) * 128.
// SW = 1 (version 5): 128-byte swizzle: blocks of 64 columns, ROWS * 128 bytes each; in a block,
//   row r takes 128 contiguous bytes and its 16-byte chunk c sits at chunk c ^ (r % 8). Tiles start
//   at 1024-byte boundaries (the swizzle pattern repeats every 8 rows).
// The same bytes serve as a K-major operand (K = HD: S = Q K^T, dP = dO V^T) and as an N-major one
// (N = HD, K = rows: dV += P^T dO, dK += dS^T Q, dQ += dS K), with the transpose bit.
// 16-byte chunk ch of row r, in elements
template<int HD, int ROWS, int SW> __device__ __forceinline__ int tile_off(int r, int ch) {
    if constexpr (SW == 0) return ((r >> 3) * (HD / 8) + ch) * 64 + (r & 7) * 8;
    else return (ch >> 3) * ROWS * 64 + r * 64 + (((ch & 7) ^ (r & 7)) << 3);
}
// K-major operand (K = HD): 64 rows from row 8*rb, k16 step kk. No swizzle: LBO = stride of core
// matrices along K, SBO along the rows. Swizzled: the k step moves the start inside the 128-byte
// row (the hardware applies the XOR on the address), SBO = 8 rows = 1024 bytes, LBO unused.
template<int HD, int ROWS, int SW> __device__ __forceinline__ uint64_t desc_k(const bf16* tile, int rb, int kk) {
    if constexpr (SW == 0) return wg_desc(tile + (rb * (HD / 8) + 2 * kk) * 64, 128, HD * 16, 0);
    else return wg_desc(tile + (kk / 4) * ROWS * 64 + rb * 8 * 64 + (kk % 4) * 16, 16, 1024, 1);
}
// N-major operand (N = HD, K = rows 16kk..16kk+15). No swizzle: LBO is again the K-direction
// stride, SBO the N-direction one (checked on the device: the swap faults). Swizzled: LBO = stride
// between 64-column blocks, SBO = 8 rows along K.
template<int HD, int ROWS, int SW> __device__ __forceinline__ uint64_t desc_mn(const bf16* tile, int kk) {
    if constexpr (SW == 0) return wg_desc(tile + kk * 2 * (HD / 8) * 64, HD * 16, 128, 0);
    else return wg_desc(tile + kk * 16 * 64, ROWS * 128, 1024, 1);
}

// ROWS rows of one head into a tile of layout SW; rows past T zero-filled. No swizzle: lanes take 8
// rows of one 16-byte chunk, then the next chunk (a warp writes 4 whole core matrices). Swizzled:
// lanes take consecutive chunks of a row (a warp writes 512 contiguous bytes). No bank conflicts.
template<int ROWS, int HD, int NTHREADS, int SW>
__device__ __forceinline__ void load_tile_wg(bf16* sm, const bf16* g, int row0, int T, int stride) {
    constexpr int CH = HD / 8;
    #pragma unroll
    for (int e = threadIdx.x; e < ROWS * CH; e += NTHREADS) {
        int r, ch;
        if constexpr (SW == 0) { r = (e >> 3) / CH * 8 + (e & 7); ch = (e >> 3) % CH; }
        else { r = e / CH; ch = e % CH; }
        int row = row0 + r;
        bool ok = row < T;
        cp_async16(sm + tile_off<HD, ROWS, SW>(r, ch), g + (size_t)(ok ? row : 0) * stride + ch * 8, ok);
    }
}
// the dynamic shared memory, rounded up to 1024 bytes (the swizzle's repeat); callers allocate 1 KB more
__device__ __forceinline__ unsigned char* smem_1k(unsigned char* raw) {
    return raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
}

// ----------------------------------------------------------------------------
// version 1: naive, one thread per (b, h, i); acc_t = float for the ladder, double for the
// long-T reference. Pass 1 finds the row max, pass 2 sums exp and accumulates v.

template<class acc_t, class o_t, int HD>
__global__ void fox_fwd_naive_kernel(o_t* o, acc_t* lse, const bf16* q, const bf16* k, const bf16* v,
                                     const float* c, int B, int T, int H, int stride_qkv, int stride_o,
                                     int window) {
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
    if (hd == 64) fox_fwd_naive_kernel<acc_t, o_t, 64><<<grid, block>>>(
        o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o, window);
    else fox_fwd_naive_kernel<acc_t, o_t, 128><<<grid, block>>>(
        o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o, window);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// version 2: tiled flash forward in fp32. A block owns 32 query rows, a quad of threads per row
// (each quad lane holds every 4th element of q and o); 32-key tiles of K and V go through shared
// memory in fp32, and the softmax is updated once per tile.

#define V2_BR 32
#define V2_BC 32

template<int HD>
__global__ void __launch_bounds__(128) fox_fwd_tiled_kernel(bf16* o, float* lse, const bf16* q, const bf16* k,
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
    if (hd == 64) fox_fwd_tiled_kernel<64><<<grid, 128>>>(
        o, lse, q, k, v, c, T, H, stride_qkv, stride_o, window, scale);
    else fox_fwd_tiled_kernel<128><<<grid, 128>>>(o, lse, q, k, v, c, T, H, stride_qkv, stride_o, window, scale);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// ---- begin: fused forward for train_fox.cu (versions 3 and 4) ----
// Flash forward on tensor cores. Block = 4 warps = one query tile of BR = 64 * WM rows of one
// (b, h); each warp owns 16 * WM rows and keeps their Q fragments, O accumulator and softmax state
// in registers. Key tiles of BC keys (K, V and c_j) stream through shared memory, double-buffered
// with cp.async. Every K/V fragment read from shared memory feeds WM mma's: with WM = 2 a warp
// needs half the shared-memory traffic per mma (version 4), which is what limits WM = 1 (v3).
// Scores are kept in log2 units: x = (q.k * scale + c_i - c_j) * log2(e), so exp is one ex2.

#define FOX_BR 64  // query tile of the backward kernels
#define FOX_BC 64  // key tile of the backward kernels

template<int HD, int BC, int WM, bool GATE>
__global__ void __launch_bounds__(128) fox_fwd_mma_kernel(bf16* o, float* lse, const bf16* q, const bf16* k,
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
    int jt_begin = j_begin / BC, jt_end = ceil_div(min(T, i0 + BR), BC);

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
            ldmatrix_x4(r, sQ + (warp * 16 * WM + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + kk * 16 +
                           (lane / 16) * 8);
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
                ldmatrix_x4(bk, sKb + (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kk * 16 + ((lane / 8) % 2) * 8);
                #pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    mma_bf16(s[mt][2 * np], qf[mt][Q_REGS ? kk : 0], bk[0], bk[1]);
                    mma_bf16(s[mt][2 * np + 1], qf[mt][Q_REGS ? kk : 0], bk[2], bk[3]);
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
                ldmatrix_x4_trans(bv, sVb + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + dp * 16 +
                                      (lane / 16) * 8);
                #pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    mma_bf16(acc[mt][2 * dp], pa[mt], bv[0], bv[1]);
                    mma_bf16(acc[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
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

static void fox_check_args(const char* who, const void* q, const void* k, const void* v, int B, int T, int H,
                           int hd, int stride_qkv, int stride_o, int window) {
    if (hd != 64 && hd != 128) {
        fprintf(stderr, "%s: head size %d is not supported\nHINT: use hd = 64 or 128 (C / H).\n", who, hd);
        exit(EXIT_FAILURE);
    }
    if (B < 1 || T < 1 || H < 1 || window < 0 || stride_qkv < H * hd || stride_o < H * hd) {
        fprintf(stderr, "%s: bad shape B=%d T=%d H=%d stride_qkv=%d stride_o=%d window=%d\n"
                "HINT: strides count elements between consecutive tokens (>= H*hd); window >= 0.\n",
                who, B, T, H, stride_qkv, stride_o, window);
        exit(EXIT_FAILURE);
    }
    if (stride_qkv % 8 || stride_o % 2 || ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) % 16) {
        fprintf(stderr, "%s: q/k/v must be 16-byte aligned with stride_qkv %% 8 == 0, stride_o even\n"
                "HINT: q, k, v are read in 16-byte chunks; allocate with cudaMalloc and keep strides multiples of 8.\n",
                who);
        exit(EXIT_FAILURE);
    }
}

template<int HD, int BC, int WM, bool GATE>
static void fox_fwd_mma_launch(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                               int B, int T, int H, int stride_qkv, int stride_o, int window, cudaStream_t s) {
    constexpr int LD = HD + 8, BR = 64 * WM;
    size_t smem = (size_t)(BR + 4 * BC) * LD * sizeof(bf16) + 2 * BC * sizeof(float);
    static bool configured = false;  // raise the dynamic shared memory limit once per instantiation
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(fox_fwd_mma_kernel<HD, BC, WM, GATE>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    dim3 grid(ceil_div(T, BR), B * H);
    float scale_log2 = LOG2E / sqrtf((float)HD);
    fox_fwd_mma_kernel<HD, BC, WM, GATE><<<grid, 128, smem, s>>>(
        o, lse, q, k, v, c, T, H, stride_qkv, stride_o, window, scale_log2);
    cudaCheckLaunch();
}

// tile shape (key tile BC, 16-row tiles per warp WM) -> launch, for hd 64/128, gate on/off
template<int BC64, int BC128, int WM>
static void fox_fwd_mma_dispatch(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                                 int B, int T, int H, int hd, int stride_qkv, int stride_o, int window,
                                 cudaStream_t s) {
    if (hd == 64) {
        if (c) fox_fwd_mma_launch<64, BC64, WM, true>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o, window, s);
        else fox_fwd_mma_launch<64, BC64, WM, false>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o, window, s);
    } else {
        if (c) fox_fwd_mma_launch<128, BC128, WM, true>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o, window, s);
        else fox_fwd_mma_launch<128, BC128, WM, false>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o, window, s);
    }
}

// ---- end: fused forward for train_fox.cu (versions 3 and 4) ----

// ----------------------------------------------------------------------------
// ---- begin: wgmma forward for train_fox.cu (versions 5-7) ----
// Version 4's online softmax on Hopper's warpgroup mma: a warpgroup owns 64 query rows (a warp
// 16, in the same accumulator layout as mma.sync), S = Q K^T with Q and K read by descriptor from
// 128-byte-swizzled shared tiles (no ldmatrix), P from the accumulators as register A fragments,
// O += P V with V read N-major from the same tile. Key tiles of BC double-buffered with cp.async.
template<int HD, int BC, int NWG, bool GATE>
__global__ void __launch_bounds__(128 * NWG) fox_fwd_wgmma_kernel(bf16* o, float* lse, const bf16* q, const bf16* k,
                                                                  const bf16* v, const float* c, int T, int H,
                                                                  int stride_qkv, int stride_o, int window,
                                                                  float scale_log2) {
    constexpr int BR = 64 * NWG, NT = 128 * NWG, SW = 1;
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
    int jt_begin = j_begin / BC, jt_end = ceil_div(min(T, i0 + BR), BC);

    load_tile_wg<BR, HD, NT, SW>(sQ, qb, i0, T, stride_qkv);
    auto load_kv = [&](int jt, int nb) {
        int j1 = jt * BC;
        load_tile_wg<BC, HD, NT, SW>(sK + nb * BC * HD, kb, j1, T, stride_qkv);
        load_tile_wg<BC, HD, NT, SW>(sV + nb * BC * HD, vb, j1, T, stride_qkv);
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
        fence_proxy_async();
        __syncthreads();
        const bf16 *sKb = sK + buf * BC * HD, *sVb = sV + buf * BC * HD;
        const float* sCb = sC + buf * BC;

        float s[BC / 2];
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<BC, 0>(s, desc_k<HD, BR, SW>(sQ, wg * 8, kk), desc_k<HD, BC, SW>(sKb, 0, kk), kk);
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
        for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD, 1>(acc, pa[kk], desc_mn<HD, BC, SW>(sVb, kk), 1);
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
// K/V(j+1) is loaded.
template<int HD, int BC, int NWG, bool GATE>
__global__ void __launch_bounds__(128 * NWG) fox_fwd_wgmma_pipe_kernel(bf16* o, float* lse, const bf16* q,
                                                                  const bf16* k, const bf16* v, const float* c,
                                                                  int T, int H, int stride_qkv, int stride_o,
                                                                  int window, float scale_log2) {
    constexpr int BR = 64 * NWG, NT = 128 * NWG, SW = 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_1k(smem_raw);    // (BR, HD) swizzled tiles
    bf16* sK = sQ + BR * HD;                // (3, BC, HD): three stages, V(j-1) is read while K(j) is
    bf16* sV = sK + 3 * BC * HD;            // (3, BC, HD)
    float* sC = (float*)(sV + 3 * BC * HD); // (3, BC)

    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first: causal tiles are uneven
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4, wg = warp / 4;
    size_t base = (size_t)b * T * stride_qkv + (size_t)h * HD;
    const bf16 *qb = q + base, *kb = k + base, *vb = v + base;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0;
    int jt_begin = j_begin / BC, jt_end = ceil_div(min(T, i0 + BR), BC);

    load_tile_wg<BR, HD, NT, SW>(sQ, qb, i0, T, stride_qkv);
    auto load_kv = [&](int jt, int nb) {
        int j1 = jt * BC;
        load_tile_wg<BC, HD, NT, SW>(sK + nb * BC * HD, kb, j1, T, stride_qkv);
        load_tile_wg<BC, HD, NT, SW>(sV + nb * BC * HD, vb, j1, T, stride_qkv);
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

    uint32_t pa[BC / 16][4];  // P of the previous tile, read by its P V matmul under this tile's S
    for (int jt = jt_begin; jt < jt_end; jt++) {
        int st = (jt - jt_begin) % 3;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // tile jt visible; every warpgroup is past tile jt-2's P V (its stage is refilled now)
        if (jt + 1 < jt_end) { load_kv(jt + 1, (st + 1) % 3); cp_async_commit(); }
        const bf16 *sKb = sK + st * BC * HD;
        const float* sCb = sC + st * BC;

        // S = Q K^T of this tile, then O += P V of the previous one: the softmax below runs under it
        float s[BC / 2];
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<BC, 0>(s, desc_k<HD, BR, SW>(sQ, wg * 8, kk), desc_k<HD, BC, SW>(sKb, 0, kk), kk);
        wgmma_commit();
        if (jt > jt_begin) {
            const bf16* sVp = sV + ((st + 2) % 3) * BC * HD;
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD, 1>(acc, pa[kk], desc_mn<HD, BC, SW>(sVp, kk), 1);
            wgmma_commit();
            wgmma_wait<1>();
        } else {
            wgmma_wait0();
        }
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
        wgmma_wait0();  // the previous tile's P V: now O can be rescaled and pa refilled
        wgmma_pin<HD / 2>(acc); wgmma_use_a<BC / 16>(pa);
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            acc[dt * 4] *= alpha[0]; acc[dt * 4 + 1] *= alpha[0];
            acc[dt * 4 + 2] *= alpha[1]; acc[dt * 4 + 3] *= alpha[1];
        }
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) acc_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
    }
    if (jt_end > jt_begin) {  // the last tile's P V
        const bf16* sVp = sV + ((jt_end - 1 - jt_begin) % 3) * BC * HD;
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD, 1>(acc, pa[kk], desc_mn<HD, BC, SW>(sVp, kk), 1);
        wgmma_commit();
        wgmma_wait0();
        wgmma_pin<HD / 2>(acc); wgmma_use_a<BC / 16>(pa);
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

template<int HD, int BC, int NWG, bool GATE, bool PIPE>
static void fox_fwd_wgmma_launch(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                                 int B, int T, int H, int stride_qkv, int stride_o, int window, cudaStream_t s) {
    constexpr int BR = 64 * NWG;
    constexpr int ST = PIPE ? 3 : 2;  // K/V stages
    constexpr size_t smem = 1024 + (size_t)(BR + 2 * ST * BC) * HD * sizeof(bf16) + ST * BC * sizeof(float);
    static bool configured = false;  // raise the dynamic shared memory limit once per instantiation
    if (!configured) {
        if (PIPE) cudaCheck(cudaFuncSetAttribute(fox_fwd_wgmma_pipe_kernel<HD, BC, NWG, GATE>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        else cudaCheck(cudaFuncSetAttribute(fox_fwd_wgmma_kernel<HD, BC, NWG, GATE>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    float scale_log2 = LOG2E / sqrtf((float)HD);
    if (PIPE) fox_fwd_wgmma_pipe_kernel<HD, BC, NWG, GATE><<<dim3(ceil_div(T, BR), B * H), 128 * NWG, smem, s>>>(
        o, lse, q, k, v, c, T, H, stride_qkv, stride_o, window, scale_log2);
    else fox_fwd_wgmma_kernel<HD, BC, NWG, GATE><<<dim3(ceil_div(T, BR), B * H), 128 * NWG, smem, s>>>(
        o, lse, q, k, v, c, T, H, stride_qkv, stride_o, window, scale_log2);
    cudaCheckLaunch();
}
// versions 5-7: key tile BC64 / BC128 at hd 64 / 128, NWG warpgroups (64 query rows each) per block,
// PIPE: version 7's pipeline
template<int BC64, int BC128, int NWG, bool PIPE = false>
static void fox_fwd_wgmma(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                          int B, int T, int H, int hd, int stride_qkv, int stride_o, int window, cudaStream_t s) {
    if (hd == 64) {
        if (c) fox_fwd_wgmma_launch<64, BC64, NWG, true, PIPE>(o, lse, q, k, v, c, B, T, H,
                                                               stride_qkv, stride_o, window, s);
        else fox_fwd_wgmma_launch<64, BC64, NWG, false, PIPE>(o, lse, q, k, v, c, B, T, H,
                                                              stride_qkv, stride_o, window, s);
    } else {
        if (c) fox_fwd_wgmma_launch<128, BC128, NWG, true, PIPE>(o, lse, q, k, v, c, B, T, H,
                                                                 stride_qkv, stride_o, window, s);
        else fox_fwd_wgmma_launch<128, BC128, NWG, false, PIPE>(o, lse, q, k, v, c, B, T, H,
                                                                stride_qkv, stride_o, window, s);
    }
}
// ---- end: wgmma forward (versions 5-7) ----

// ----------------------------------------------------------------------------
// ---- begin: warp-specialised forward for train_fox.cu (version 8) ----
// FlashAttention-3's structure around version 7's pipeline. A block of three warpgroups owns a
// 128-row query tile: warpgroup 0 is the producer (one warp issues the loads; setmaxnreg gives its
// registers to the others), warpgroups 1 and 2 are consumers of 64 rows each. The producer fills
// rings of ST stages for K (with c_j) and for V, signalled by mbarriers: a full barrier per stage
// completes when the copy engine's bytes (and the c lanes) have landed, an empty one when all eight
// consumer warps are done with the stage. K and V have separate rings because K(j) is free after
// tile j's S and softmax, V(j) only after tile j's P V, which runs one tile later.
// The two consumers ping-pong: each issues its matmuls (tile j's S = Q K^T with tile j-1's
// O += P V, as in version 7) only in its turn (named barriers 1 and 2), then passes the turn, so
// one warpgroup's softmax runs while the other's matmuls hold the tensor cores.
//
// Loads use the bulk tensor copy engine (TMA) with one tensor map per q, k, v over the packed
// (B, T, H, hd) layout: dims (hd, H, T, B), byte strides (hd * 2, stride * 2, T * stride * 2), box
// (64 columns, 1 head, rows, 1 batch). Its 128-byte swizzle writes exactly the tile layout of
// versions 5-7 (64-column blocks, chunk c of row r at c ^ r % 8, 1024-byte aligned), and rows past T
// come back as zeros. c (fp32 (B, H, T)) cannot have a tensor map for odd T (its row stride must be
// a multiple of 16 bytes): the producer warp loads it with 4-byte cp.async that arrive on K's full
// barrier when they land.

#define PRUNE_BLOCK 128  // key_start's tiles: 128 queries by 128 keys (train_fox.cu's pruning)

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_u32(bar)), "r"(count) : "memory");
}
// one arrival that also announces `bytes` of copy-engine transactions for the current phase
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_u32(bar)) : "memory");
}
// one arrival when this thread's earlier cp.async have landed (counted in the barrier's init count)
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(smem_u32(bar)) : "memory");
}
// wait for the phase of the given parity to complete (a fresh barrier counts parity 1 as complete)
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
    asm volatile("{\n.reg .pred p;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n}\n" :: "r"(smem_u32(bar)), "r"(parity) : "memory");
}
// ROWS rows of one head from a tensor map into a swizzled (ROWS, HD) tile: one box per 64 columns
template<int ROWS, int HD>
__device__ __forceinline__ void tma_load_tile(bf16* sm, const CUtensorMap* map, int row0, int h, int b, uint64_t* bar) {
    #pragma unroll
    for (int cb = 0; cb < HD / 64; cb++)
        asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
                     "[%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                     :: "r"(smem_u32(sm + cb * ROWS * 64)), "l"((uint64_t)map), "r"(cb * 64), "r"(h), "r"(row0), "r"(b),
                        "r"(smem_u32(bar)) : "memory");
}
// named barriers of 256 threads (both consumer warpgroups): sync waits, arrive passes on
__device__ __forceinline__ void bar_sync256(int id) { asm volatile("bar.sync %0, 256;\n" :: "r"(id) : "memory"); }
__device__ __forceinline__ void bar_arrive256(int id) { asm volatile("bar.arrive %0, 256;\n" :: "r"(id) : "memory"); }
template<int R> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(R));
}
template<int R> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(R));
}

template<int HD, int BC, int ST, bool GATE>
__global__ void __launch_bounds__(384, 1) fox_fwd_ws_kernel(bf16* o, float* lse,
                                                            const __grid_constant__ CUtensorMap tmQ,
                                                            const __grid_constant__ CUtensorMap tmK,
                                                            const __grid_constant__ CUtensorMap tmV, const float* c,
                                                            int T, int H, int stride_o, int window, float scale_log2,
                                                            const int* key_start) {
    constexpr int BR = 128, SW = 1;
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
    int jt_begin = j_begin / BC, jt_end = ceil_div(min(T, i0 + BR), BC);
    // pruned key tiles are never loaded (never the diagonal one, so jt_begin < jt_end)
    if (key_start) jt_begin = max(jt_begin, key_start[(size_t)bh * gridDim.x + qt] * (PRUNE_BLOCK / BC));
    int ntiles = jt_end - jt_begin;

    if (threadIdx.x == 0) {
        mbar_init(barQ, 1);
        for (int st = 0; st < ST; st++) {
            mbar_init(&fullK[st], 1 + (GATE ? 32 : 0));  // the copy engine's arrival + the 32 c lanes
            mbar_init(&emptyK[st], 8);                   // a warp of the consumers each
            mbar_init(&fullV[st], 1);
            mbar_init(&emptyV[st], 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
    }
    __syncthreads();

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
            wgmma_ss<BC, 0>(s, desc_k<HD, BR, SW>(sQ, cw * 8, kk), desc_k<HD, BC, SW>(sKb, 0, kk), kk);
        wgmma_commit();
        if (n > 0) {
            const bf16* sVp = sV + pst * BC * HD;
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD, 1>(acc, pa[kk], desc_mn<HD, BC, SW>(sVp, kk), 1);
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
        for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD, 1>(acc, pa[kk], desc_mn<HD, BC, SW>(sVp, kk), 1);
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

// Tensor map of q, k or v for version 8: (B, T, H, hd) bf16 with token stride `stride` (elements),
// boxes of 64 columns x `rows` tokens of one head, 128-byte swizzle, zeros past T.
static CUtensorMap fox_tensor_map(const bf16* x, int B, int T, int H, int hd, int stride, int rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;  // driver entry point, looked up once
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode,
                                                   12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess) {
            fprintf(stderr, "cuTensorMapEncodeTiled not found\nHINT: forward version 8 needs a CUDA 12+ driver.\n");
            exit(EXIT_FAILURE);
        }
    }
    CUtensorMap map;
    cuuint64_t dims[4] = {(cuuint64_t)hd, (cuuint64_t)H, (cuuint64_t)T, (cuuint64_t)B};
    cuuint64_t strides[3] = {(cuuint64_t)hd * sizeof(bf16), (cuuint64_t)stride * sizeof(bf16),
                             (cuuint64_t)T * stride * sizeof(bf16)};
    cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, unit[4] = {1, 1, 1, 1};
    CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void*)x, dims, strides, box, unit,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled failed (%d) for B=%d T=%d H=%d hd=%d stride=%d\n"
                "HINT: q/k/v need 16-byte alignment and stride %% 8 == 0.\n", (int)r, B, T, H, hd, stride);
        exit(EXIT_FAILURE);
    }
    return map;
}

template<int HD, int BC, int ST, bool GATE>
static void fox_fwd_ws_launch(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                              int B, int T, int H, int stride_qkv, int stride_o, int window, const int* key_start,
                              cudaStream_t s) {
    constexpr int BR = 128;
    // Q, ST stages of K, V and c, the barriers, + 1 KB to align the tiles to the swizzle pattern
    constexpr size_t smem = 1024 + (size_t)(BR + 2 * ST * BC) * HD * sizeof(bf16) + ST * BC * sizeof(float) +
                            (1 + 4 * ST) * sizeof(uint64_t);
    static bool configured = false;  // raise the dynamic shared memory limit once per instantiation
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(fox_fwd_ws_kernel<HD, BC, ST, GATE>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    CUtensorMap tq = fox_tensor_map(q, B, T, H, HD, stride_qkv, BR),
                tk = fox_tensor_map(k, B, T, H, HD, stride_qkv, BC),
                tv = fox_tensor_map(v, B, T, H, HD, stride_qkv, BC);
    float scale_log2 = LOG2E / sqrtf((float)HD);
    fox_fwd_ws_kernel<HD, BC, ST, GATE><<<dim3(ceil_div(T, BR), B * H), 384, smem, s>>>(
        o, lse, tq, tk, tv, c, T, H, stride_o, window, scale_log2, key_start);
    cudaCheckLaunch();
}
// version 8: key tile BC, ST stages, at both head sizes; key_start as train_fox.cu's pruning (NULL: dense; needs c)
template<int BC, int ST>
static void fox_fwd_ws(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                       int B, int T, int H, int hd, int stride_qkv, int stride_o, int window, const int* key_start,
                       cudaStream_t s) {
    if (hd == 64) {
        if (c) fox_fwd_ws_launch<64, BC, ST, true>(o, lse, q, k, v, c, B, T, H,
                                                   stride_qkv, stride_o, window, key_start, s);
        else fox_fwd_ws_launch<64, BC, ST, false>(o, lse, q, k, v, c, B, T, H,
                                                  stride_qkv, stride_o, window, nullptr, s);
    } else {
        if (c) fox_fwd_ws_launch<128, BC, ST, true>(o, lse, q, k, v, c, B, T, H,
                                                    stride_qkv, stride_o, window, key_start, s);
        else fox_fwd_ws_launch<128, BC, ST, false>(o, lse, q, k, v, c, B, T, H,
                                                   stride_qkv, stride_o, window, nullptr, s);
    }
}
// ---- end: warp-specialised forward (version 8) ----

// ----------------------------------------------------------------------------
// ---- begin: lean-softmax forward for train_fox.cu (version 9) ----
// Version 6's block (two warpgroups of 64 query rows share cp.async K/V tiles; two blocks per SM)
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
//   than FOX_RESCALE_LOG2, so most tiles skip rescaling O (HD/2 multiplies per thread). P then is at
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

#define FOX_RESCALE_LOG2 8.0f  // O is rescaled only when a row maximum grows by more than this (log2 units)

// 2^x in one MUFU.EX2; denormal results flush to zero
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// 2^x without MUFU, on the FMA and integer pipes (versions 12 and 13: FlashAttention-4's idea of
// computing a share of the exponentials in software while MUFU.EX2 does the rest). For x < 128:
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
// is outside [lo_r, hi_r]; mx: each row's maximum over the thread's entries. PRE (version 19): sCb
// holds the d_j themselves, formed by the producer (cref_l2 unused).
template<int BC, bool GATE, bool MASK, bool PRE = false>
__device__ __forceinline__ void fox_lean_logits(float* s, float mx[2], const float* sCb, float cref_l2, int tq,
                                                float scale_log2, const int hi[2], const int lo[2]) {
    mx[0] = mx[1] = -INFINITY;
    #pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
        float d[2] = {0.f, 0.f};
        if (GATE && PRE) {
            float2 dj = *(const float2*)(sCb + nt * 8 + 2 * tq);
            d[0] = dj.x;
            d[1] = dj.y;
        } else if (GATE) {
            float2 cj = *(const float2*)(sCb + nt * 8 + 2 * tq);
            d[0] = fmaf(-cj.x, LOG2E, cref_l2);
            d[1] = fmaf(-cj.y, LOG2E, cref_l2);
        }
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            float x = fmaf(s[nt * 4 + e], scale_log2, d[e & 1]);
            if (MASK) {
                int kc = nt * 8 + (e & 1);  // compile-time: the bounds carry the thread's 2 tq
                if (kc > hi[e / 2] || kc < lo[e / 2]) x = -INFINITY;
            }
            s[nt * 4 + e] = x;
            mx[e / 2] = fmaxf(mx[e / 2], x);
        }
    }
}

// load_tile_wg (128-byte swizzle) with a compile-time trip count: a thread copies chunk
// tid % (HD/8) of rows tid / (HD/8) + i * NTHREADS / (HD/8), steps of whole 8-row groups, so its
// swizzled offset is computed once and the loop unrolls. load_tile_wg's loop (its trip count
// depends on threadIdx.x) stays a runtime loop with remainder handling: ~450 SASS instructions
// around the 8 cp.async of a 128-key K/V tile per thread (H200 build of version 9).
template<int ROWS, int HD, int NTHREADS>
__device__ __forceinline__ void load_tile_unrolled(bf16* sm, const bf16* g, int row0, int T, int stride) {
    constexpr int CH = HD / 8, RSTEP = NTHREADS / CH;
    static_assert(NTHREADS % CH == 0 && RSTEP % 8 == 0 && ROWS % RSTEP == 0, "whole 8-row groups per step");
    int r0 = threadIdx.x / CH, ch = threadIdx.x % CH;
    bf16* st = sm + tile_off<HD, ROWS, 1>(r0, ch);
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
// ex2_poly, the others ex2.approx.ftz: EMU = 2, 4 compute 1/4, 1/2 of them on the FMA pipe, the
// same count in both rows; EMU = 0 is version 9's and 10's code. l sums the very p that is rounded
// to bf16 for P V, whichever function made it, as before.
template<int BC, int EMU = 0>
__device__ __forceinline__ void fox_lean_exp(float* s, float l[2], const float m[2]) {
    static_assert(EMU >= 0 && EMU <= 8 && EMU % 2 == 0, "EMU: an even count out of 8");
    #pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            // the thread's 4 columns of the two blocks are slots 0..3; the first EMU / 2 slots take
            // the polynomial in both rows (compile-time after unrolling)
            bool emu = (nt % 2) * 2 + (e & 1) < EMU / 2;
            float x = s[nt * 4 + e] - m[e / 2];
            s[nt * 4 + e] = emu ? ex2_poly(x) : ex2_ftz(x);
            l[e / 2] += s[nt * 4 + e];
        }
    }
}

// o = acc / l (bf16) and lse = ln(sum) of the thread's rows below T (m: the row maximum in
// absolute log2 units); ob, lse_bh: this (b, h)'s o at token 0 and lse row
template<int HD>
__device__ __forceinline__ void fox_store_rows(bf16* ob, float* lse_bh, const float* acc, float l[2], const float m[2],
                                               const int rows[2], int tq, int T, int stride_o) {
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
        if (tq == 0) lse_bh[row] = (m[r] + log2f(l[r])) * LN2;  // natural log
    }
}

template<int HD, int BC, int ST, bool GATE>
__global__ void __launch_bounds__(256, HD == 64 ? 2 : 1) fox_fwd_lean_kernel(bf16* o, float* lse, const bf16* q,
                                                                             const bf16* k, const bf16* v,
                                                                             const float* c, int T, int H,
                                                                             int stride_qkv, int stride_o, int window,
                                                                             float scale_log2, const int* key_start) {
    constexpr int BR = 128, SW = 1;
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
    int jt_begin = j_begin / BC, jt_end = ceil_div(min(T, i0 + BR), BC);
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
        fence_proxy_async();
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
            wgmma_ss<BC, 0>(s, desc_k<HD, BR, SW>(sQ, wg * 8, kk), desc_k<HD, BC, SW>(sKb, 0, kk), kk);
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
            fox_lean_logits<BC, GATE, true>(s, mx, sCb, cref_l2, tq, scale_log2, hi, lo);
        } else {
            fox_lean_logits<BC, GATE, false>(s, mx, sCb, cref_l2, tq, scale_log2, nullptr, nullptr);
        }
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
        }
        if (__any_sync(0xffffffff, mx[0] > m[0] + FOX_RESCALE_LOG2 || mx[1] > m[1] + FOX_RESCALE_LOG2)) {
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
        fox_lean_exp<BC>(s, l, m);
        // O += P V
        uint32_t pa[BC / 16][4];
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) acc_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD, 1>(acc, pa[kk], desc_mn<HD, BC, SW>(sVb, kk), 1);
        wgmma_commit();
        wgmma_wait0();
        wgmma_pin<HD / 2>(acc); wgmma_pin_a<BC / 16>(pa);
    }
    float m_abs[2];  // m + r_i: the maximum in absolute log2 units
    #pragma unroll
    for (int r = 0; r < 2; r++) m_abs[r] = m[r] + ((GATE && rows[r] < T) ? fmaf(cb[rows[r]], LOG2E, -cref_l2) : 0.f);
    fox_store_rows<HD>(o + (size_t)b * T * stride_o + (size_t)h * HD, lse + (size_t)bh * T, acc, l, m_abs, rows, tq, T,
                       stride_o);
}

template<int HD, int BC, int ST, bool GATE>
static void fox_fwd_lean_launch(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                                int B, int T, int H, int stride_qkv, int stride_o, int window, const int* key_start,
                                cudaStream_t s) {
    constexpr int BR = 128;
    // Q, ST K/V stages and c stages, + 1 KB to align the tiles to the swizzle pattern
    constexpr size_t smem = 1024 + (size_t)(BR + 2 * ST * BC) * HD * sizeof(bf16) + ST * BC * sizeof(float);
    static bool configured = false;  // raise the dynamic shared memory limit once per instantiation
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(fox_fwd_lean_kernel<HD, BC, ST, GATE>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    float scale_log2 = LOG2E / sqrtf((float)HD);
    fox_fwd_lean_kernel<HD, BC, ST, GATE><<<dim3(ceil_div(T, BR), B * H), 256, smem, s>>>(
        o, lse, q, k, v, c, T, H, stride_qkv, stride_o, window, scale_log2, key_start);
    cudaCheckLaunch();
}
// version 9: key tile BC and ST stages at both head sizes; key_start as train_fox.cu's pruning (NULL:
// dense; needs c)
template<int BC, int ST>
static void fox_fwd_lean(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                         int B, int T, int H, int hd, int stride_qkv, int stride_o, int window, const int* key_start,
                         cudaStream_t s) {
    if (hd == 64) {
        if (c) fox_fwd_lean_launch<64, BC, ST, true>(o, lse, q, k, v, c, B, T, H,
                                                     stride_qkv, stride_o, window, key_start, s);
        else fox_fwd_lean_launch<64, BC, ST, false>(o, lse, q, k, v, c, B, T, H,
                                                    stride_qkv, stride_o, window, nullptr, s);
    } else {
        if (c) fox_fwd_lean_launch<128, BC, ST, true>(o, lse, q, k, v, c, B, T, H,
                                                      stride_qkv, stride_o, window, key_start, s);
        else fox_fwd_lean_launch<128, BC, ST, false>(o, lse, q, k, v, c, B, T, H,
                                                     stride_qkv, stride_o, window, nullptr, s);
    }
}
// ---- end: lean-softmax forward (version 9) ----

// ----------------------------------------------------------------------------
// ---- begin: warp-specialised lean forward (versions 10-14) ----
// Version 9's softmax in version 8's structure, shaped as FlashAttention-3 shapes hd 64. What
// changed against version 9 (hd 64; hd 128: version 14 below, versions 10-13 dispatch to version 9):
// - Why: version 9 is latency-bound (ncu: 47% issue slots, 1.2 eligible warps per scheduler,
//   tensor pipe 35%). Each warpgroup waits for its S, then for its P V, and the two warpgroups of a
//   block meet at __syncthreads per tile, so a block's warpgroups run their softmax at the same
//   time and their matmuls at the same time. At hd 64 the exponentials alone (MUFU, 16 per clock
//   per SM) take as long as the two matmuls (2 * 64 * 128 * 64 MACs per warpgroup and tile at
//   2048 MACs per clock per SM): the two pipes must overlap, not take turns.
// - Intra-warpgroup overlap (version 7/8's pipeline): a consumer issues tile n's S = Q K^T and
//   tile n-1's O += P V back to back, waits only for S (wgmma groups retire in order), runs tile
//   n's softmax while P V still holds the tensor cores, then waits for P V, rescales O (lazily)
//   and refills P. So each warpgroup keeps the tensor pipe busy under its own exponentials.
// - The register cost: S of tile n (64 fp32 per thread at 128-key tiles), P of tile n-1 (32 bf16x2
//   A fragments, read by the in-flight P V) and O (32) are live together: 128 registers before
//   any address, maximum or sum, which version 9's 128-register budget (two blocks of 256 threads
//   per SM) cannot hold. Hence one block per SM of NWG consumer warpgroups and a producer
//   warpgroup, with setmaxnreg moving registers to the consumers: NWG = 3 (version 10, BR = 192
//   rows: FlashAttention-3's hd-64 shape): 24 for the producer, 160 for the consumers (24 * 128 +
//   160 * 384 = 64512 <= 65536); NWG = 2 (version 11, BR = 128, version 8's split): 24 / 240.
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
// argument is per thread and unchanged), the lazy maximum with threshold 2^8 (FOX_RESCALE_LOG2,
// decided per warp; the rescale of O moves after the P V wait, with alpha kept from before it),
// ex2.approx.ftz, masks as two integer compares only on tiles touching the diagonal, the window
// edge or T, fox_store_rows.
// EMU (versions 12 and 13, 0 otherwise): EMU of every 8 scores of a thread take ex2_poly (FMA pipe)
// instead of ex2.approx.ftz (MUFU), in fox_lean_exp; nothing else changes. At hd 64 MUFU.EX2 (16
// per clock per SM) is as busy as the tensor pipe; the polynomial moves a share of that work onto
// the FMA pipe (128 per clock), about 9 issue slots each instead of 2.
// Version 14 is this kernel at hd 128 with NWG = 2, BC = 128, ST = 2 (FlashAttention-3's hd-128
// shape; the budget: at fox_fwd_wsl_all). Nothing but the K-major descriptors' k steps depends on
// HD beyond the template arithmetic: a k16 step moves 32 bytes inside a 64-column block, and at
// hd 128 steps 4-7 are in the tile's second block, ROWS * 128 bytes on (desc_k_step).

// start of k16 step kk (16-byte units) from a K-major swizzled descriptor of a (ROWS, HD) tile:
// desc_k<HD, ROWS, 1>(tile, rb, kk) - desc_k<HD, ROWS, 1>(tile, rb, 0); kk * 2 for kk < 4 (hd 64)
template<int ROWS> __device__ __forceinline__ constexpr uint64_t desc_k_step(int kk) {
    return (uint64_t)(kk / 4) * (ROWS * 128 / 16) + (kk % 4) * 2;
}

template<int HD, int BC, int ST, int NWG, bool GATE, int EMU = 0>
__global__ void __launch_bounds__(128 * (NWG + 1), 1) fox_fwd_wsl_kernel(bf16* o, float* lse,
                                                                         const __grid_constant__ CUtensorMap tmQ,
                                                                         const __grid_constant__ CUtensorMap tmK,
                                                                         const __grid_constant__ CUtensorMap tmV,
                                                                         const float* c, int T, int H, int stride_o,
                                                                         int window, float scale_log2,
                                                                         const int* key_start) {
    constexpr int BR = 64 * NWG, SW = 1;
    constexpr int CREG = NWG == 3 ? 160 : 240;  // consumer registers: (65536 - 24 * 128) / (128 NWG), multiple of 8
    // the register budgets argued: hd 64 (versions 10-13) and hd 128 with two consumers (version 14)
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
    int jt_end = ceil_div(min(T, i0 + BR), BC);
    // first key tile the rows i0w .. i0w + 63 see: their window, the key_start of their pruning tile
    auto first_tile = [&](int i0w) {
        int jt = window > 0 ? max(0, i0w - window + 1) / BC : 0;
        if (key_start) jt = max(jt, key_start[(size_t)bh * ceil_div(T, PRUNE_BLOCK) + i0w / PRUNE_BLOCK] *
                                    (PRUNE_BLOCK / BC));
        return jt;
    };
    int jt_begin = first_tile(i0);  // the block's: the smallest over its warpgroups with rows below T
    #pragma unroll
    for (int w = 1; w < NWG; w++)
        if (i0 + 64 * w < T) jt_begin = min(jt_begin, first_tile(i0 + 64 * w));
    int ntiles = jt_end - jt_begin;  // tile n is key tile jt_end - 1 - n: from the diagonal backwards

    if (threadIdx.x == 0) {
        mbar_init(barQ, 1);
        for (int st = 0; st < ST; st++) {
            mbar_init(&fullK[st], 1 + (GATE ? 32 : 0));  // the copy engine's arrival + the 32 c lanes
            mbar_init(&emptyK[st], 4 * NWG);             // a warp of the consumers each
            mbar_init(&fullV[st], 1);
            mbar_init(&emptyV[st], 4 * NWG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
    }
    __syncthreads();

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
    // descriptors: the swizzled K-major start moves 32 bytes (2 in units of 16) per k16 step inside
    // a 64-column block (desc_k_step), the N-major one 16 rows (2048 bytes, 128 units); a stage is
    // BC * HD * 2 bytes
    constexpr uint64_t VSTEP = 16 * 64 * 2 / 16, STAGE = BC * HD * 2 / 16;
    const uint64_t dQ = desc_k<HD, BR, SW>(sQ, cw * 8, 0), dK0 = desc_k<HD, BC, SW>(sK, 0, 0),
                   dV0 = desc_mn<HD, BC, SW>(sV, 0);
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
        const uint64_t dK = dK0 + st * STAGE;

        // S = Q K^T of this tile, then O += P V of the previous one: the softmax below runs under it
        float s[BC / 2];
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<BC, 0>(s, dQ + desc_k_step<BR>(kk), dK + desc_k_step<BC>(kk), kk);
        wgmma_commit();
        if (n > na) {
            const uint64_t dV = dV0 + pst * STAGE;
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD, 1>(acc, pa[kk], dV + kk * VSTEP, 1);
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
            fox_lean_logits<BC, GATE, true>(s, mx, sCb, cref_l2, tq, scale_log2, hi, lo);
        } else {
            fox_lean_logits<BC, GATE, false>(s, mx, sCb, cref_l2, tq, scale_log2, nullptr, nullptr);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&emptyK[st]);  // K(n) read by S, c_j read above: the stage is free
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
        }
        // lazy maximum: O is scaled by alpha after the P V wait (P V adds P of the old maximum)
        bool resc = __any_sync(0xffffffff, mx[0] > m[0] + FOX_RESCALE_LOG2 || mx[1] > m[1] + FOX_RESCALE_LOG2);
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
        fox_lean_exp<BC, EMU>(s, l, m);
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
        const uint64_t dV = dV0 + pst * STAGE;
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD, 1>(acc, pa[kk], dV + kk * VSTEP, 1);
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
    fox_store_rows<HD>(o + (size_t)b * T * stride_o + (size_t)h * HD, lse + (size_t)bh * T, acc, l, m_abs, rows, tq, T,
                       stride_o);
}

template<int HD, int BC, int ST, int NWG, bool GATE, int EMU>
static void fox_fwd_wsl_launch(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                               int B, int T, int H, int stride_qkv, int stride_o, int window, const int* key_start,
                               cudaStream_t s) {
    constexpr int BR = 64 * NWG;
    // Q, ST stages of K, V and c, the barriers, + 1 KB to align the tiles to the swizzle pattern
    constexpr size_t smem = 1024 + (size_t)(BR + 2 * ST * BC) * HD * sizeof(bf16) + ST * BC * sizeof(float) +
                            (1 + 4 * ST) * sizeof(uint64_t);
    static bool configured = false;  // raise the dynamic shared memory limit once per instantiation
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(fox_fwd_wsl_kernel<HD, BC, ST, NWG, GATE, EMU>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    CUtensorMap tq = fox_tensor_map(q, B, T, H, HD, stride_qkv, BR),
                tk = fox_tensor_map(k, B, T, H, HD, stride_qkv, BC),
                tv = fox_tensor_map(v, B, T, H, HD, stride_qkv, BC);
    float scale_log2 = LOG2E / sqrtf((float)HD);
    fox_fwd_wsl_kernel<HD, BC, ST, NWG, GATE, EMU><<<dim3(ceil_div(T, BR), B * H), 128 * (NWG + 1), smem, s>>>(
        o, lse, tq, tk, tv, c, T, H, stride_o, window, scale_log2, key_start);
    cudaCheckLaunch();
}
// versions 10 (NWG = 3) and 11 (NWG = 2) at hd 64, 128-key tiles, ST stages; hd 128 runs version 9.
// EMU > 0: versions 12 and 13, EMU of every 8 exponentials in software (fox_lean_exp).
// key_start as train_fox.cu's pruning (NULL: dense; needs c)
template<int ST, int NWG, int EMU = 0>
static void fox_fwd_wsl(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                        int B, int T, int H, int hd, int stride_qkv, int stride_o, int window, const int* key_start,
                        cudaStream_t s) {
    if (hd == 64) {
        if (c) fox_fwd_wsl_launch<64, 128, ST, NWG, true, EMU>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o,
                                                                window, key_start, s);
        else fox_fwd_wsl_launch<64, 128, ST, NWG, false, EMU>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o,
                                                               window, nullptr, s);
    } else {
        fox_fwd_lean<128, 2>(o, lse, q, k, v, c, B, T, H, hd, stride_qkv, stride_o, window, key_start, s);
    }
}

// Version 14: fox_fwd_wsl_kernel at hd 128 with NWG = 2 consumer warpgroups (BR = 128 query rows),
// 128-key tiles, ST = 2 stages (FlashAttention-3's hd-128 causal shape); at hd 64 it is version 10
// (the same call, the same kernel). Why this shape, per consumer thread (a 64-row warpgroup):
// - Registers: O (64 x 128 fp32) 64, S of a 64 x BC tile BC / 2, P of the previous tile (bf16 A
//   fragments, read by the in-flight P V) BC / 4, live together in the overlap; + ~30 for maxima,
//   sums, bounds, c_ref, addresses. NWG = 3 leaves 160 per consumer (producer 24): BC = 128 needs
//   ~190 (no), BC = 64 ~145 (fits). NWG = 2 leaves 240 (24 x 128 + 240 x 256 = 64512): BC = 128
//   fits with ~50 to spare (ptxas with the cap lowered: no spills down to 192, spills at 184).
//   Chosen NWG = 2, BC = 128: per key half the mbarrier waits, row-maximum shuffles and wgmma
//   issues of 64-key tiles, and S as m64n128k16 (6 KB of shared memory per 64 tensor clocks, 96 B a
//   clock; m64n64k16 reads 4 KB per 32, 128 B a clock: all of the SM's shared-memory bandwidth).
//   At hd 128 a tile's two matmuls (2 x 64 x 128 x 128 MACs per warpgroup,
//   1024 clocks at 2048 per clock per SM) take twice its exponentials (64 x 128 MUFU.EX2 at 16 per
//   clock: 512), so the tensor pipe bounds it and two overlapping warpgroups can keep it busy; at
//   hd 64 the two took equally long and three warpgroups won (version 10 against 11).
// - Shared memory: Q 128 x 128 bf16 = 32 KB, a K or V stage 32 KB, c 512 bytes a stage: ST = 2 is
//   1 KB (alignment) + 32 + 4 x 32 KB + 1 KB + 72 bytes of barriers = 165960 bytes (162.1 KB);
//   ST = 3 would be 232040, 408 bytes under the 227 KB (232448) limit: FOX_V14_ST=3 builds it.
// - Precision, masks, windows, key_start, lse: version 10's code unchanged (per thread c_ref, so its
//   argument does not depend on the head size; BR = 128 is one pruning tile).
#ifndef FOX_V14_ST
#define FOX_V14_ST 2  // K/V stages of version 14 at hd 128 (3 fits too; nvcc -DFOX_V14_ST=3 to try it)
#endif
template<int ST128>  // a template: instantiated only where a ladder calls it (not in the backward's builds)
static void fox_fwd_wsl_all(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                            int B, int T, int H, int hd, int stride_qkv, int stride_o, int window,
                            const int* key_start, cudaStream_t s) {
    if (hd == 64) {
        fox_fwd_wsl<3, 3>(o, lse, q, k, v, c, B, T, H, hd, stride_qkv, stride_o, window, key_start, s);
    } else {
        if (c) fox_fwd_wsl_launch<128, 128, ST128, 2, true, 0>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o,
                                                                window, key_start, s);
        else fox_fwd_wsl_launch<128, 128, ST128, 2, false, 0>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o,
                                                               window, nullptr, s);
    }
}
// ---- end: warp-specialised lean forward (versions 10-14) ----

// ---- begin: persistent warp-specialised forward (version 15) ----
// Version 15: version 10's kernel made persistent. A grid of one block per SM walks the (query
// tile, head) pairs, the longest query tiles of every head first (pair t: query tile NT - 1 - t / BH,
// head t % BH; block x takes t = x, x + gridDim.x, ...). The K and V rings run on across a block's
// pairs (their stage counter `it` is the block's), and Q is reloaded per pair, after the pair's first
// K and V, once every consumer warp has arrived at emptyQ after its pair's last S, so the next
// pair's Q, K and V load while the consumers finish the last P V and store O: the per-block start
// (barriers, Q's latency, the ring's fill) of version 10, which at T = 2048 is a tenth of a block's
// work, is paid once per SM. The softmax, masks, precision and register budgets are version 10's at
// hd 64 (three consumers) and version 14's at hd 128 (two).
// the block's k-th pair: round k covers pairs k G .. k G + G - 1 of a grid of G blocks; block x takes
// the x-th of them (version 15), or in odd rounds the (G - 1 - x)-th (version 16's snake order, so
// that no block takes the longest pair of every round)
__device__ __forceinline__ int wsp_pair(int k, int snake) {
    int x = (snake && (k & 1)) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    return k * gridDim.x + x;
}
template<int HD, int BC, int ST, int NWG, bool GATE, bool PRE>
__global__ void __launch_bounds__(128 * (NWG + 1), 1) fox_fwd_wsp_kernel(bf16* o, float* lse,
                                                                         const __grid_constant__ CUtensorMap tmQ,
                                                                         const __grid_constant__ CUtensorMap tmK,
                                                                         const __grid_constant__ CUtensorMap tmV,
                                                                         const float* c, int T, int H, int BH,
                                                                         int stride_o, int window, float scale_log2,
                                                                         const int* key_start, int snake, int group) {
    constexpr int BR = 64 * NWG, SW = 1, CREG = NWG == 3 ? 160 : 240;  // as versions 10 and 14
    static_assert(BC == 128 && ((HD == 64 && NWG == 3) || (HD == 128 && NWG == 2)), "versions 10 and 14's shapes");
    static_assert(ST >= 2, "the producer loads K(n+1) before V(n)'s stage is free");
    static_assert(PRUNE_BLOCK % BC == 0 && PRUNE_BLOCK % 64 == 0, "a warpgroup's rows lie in one pruning tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = (bf16*)smem_1k(smem_raw);     // (BR, HD) swizzled tiles
    bf16* sK = sQ + BR * HD;                 // (ST, BC, HD)
    bf16* sV = sK + ST * BC * HD;            // (ST, BC, HD)
    float* sC = (float*)(sV + ST * BC * HD); // (ST, BC) c_j, or with PRE the d_j = (c_ref - c_j) log2(e)
    uint64_t* bar = (uint64_t*)(sC + ST * BC);
    uint64_t *barQ = bar, *emptyQ = bar + 1, *fullK = bar + 2, *emptyK = fullK + ST, *fullV = emptyK + ST,
             *emptyV = fullV + ST;

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    int NT = ceil_div(T, BR), npairs = NT * BH;
    // the first key tile that rows i0w .. i0w + 63 of head bh see: their window, their pruning tile's key_start
    auto first_tile = [&](int bh, int i0w) {
        int jt = window > 0 ? max(0, i0w - window + 1) / BC : 0;
        if (key_start) jt = max(jt, key_start[(size_t)bh * ceil_div(T, PRUNE_BLOCK) + i0w / PRUNE_BLOCK] *
                                    (PRUNE_BLOCK / BC));
        return jt;
    };
    // pair t's head, first row and key tiles [jt_begin, jt_end): the same arithmetic in every warp.
    // The pairs come in sections of `group` heads (version 18; one section when group >= BH): pair r
    // of a section of gh heads is query tile NT - 1 - r / gh (longest first) in even sections and r / gh
    // in odd ones, so that the static deal's rounds stay even across a section's end
    struct Pair { int bh, i0, jt_begin, jt_end; };
    auto pair_at = [&](int t) {
        Pair pr;
        int sec = t / (group * NT), r = t - sec * group * NT, gh = min(group, BH - sec * group);
        pr.bh = sec * group + r % gh;
        pr.i0 = ((sec & 1) ? r / gh : NT - 1 - r / gh) * BR;  // odd sections shortest first: the deal stays even
        pr.jt_end = ceil_div(min(T, pr.i0 + BR), BC);
        pr.jt_begin = first_tile(pr.bh, pr.i0);  // the block's: the smallest over its warpgroups with rows below T
        #pragma unroll
        for (int w = 1; w < NWG; w++)
            if (pr.i0 + 64 * w < T) pr.jt_begin = min(pr.jt_begin, first_tile(pr.bh, pr.i0 + 64 * w));
        return pr;
    };

    if (threadIdx.x == 0) {
        mbar_init(barQ, 1);
        mbar_init(emptyQ, 4 * NWG);  // a warp of the consumers each, after its tile's last S
        for (int st = 0; st < ST; st++) {
            mbar_init(&fullK[st], 1 + (GATE ? 32 : 0));  // the copy engine's arrival + the 32 c lanes
            mbar_init(&emptyK[st], 4 * NWG);
            mbar_init(&fullV[st], 1);
            mbar_init(&emptyV[st], 4 * NWG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
    }
    __syncthreads();

    if (wg == 0) {  // producer: one warp issues every load, in pair and tile order; K(n) before V(n)
        setmaxnreg_dec<24>();
        if (warp != 0) return;
        int it = 0;  // K/V tiles this block has loaded: the rings' counter
        for (int k = 0, t = blockIdx.x; t < npairs; t = wsp_pair(++k, snake)) {
            Pair pr = pair_at(t);
            int b = pr.bh / H, h = pr.bh % H;
            const float* cb = GATE ? c + (size_t)pr.bh * T : nullptr;
            auto load_q = [&] {  // once every consumer warp is past the previous pair's last S
                mbar_wait(emptyQ, (k & 1) ^ 1);
                if (lane == 0) {
                    mbar_expect_tx(barQ, BR * HD * sizeof(bf16));
                    tma_load_tile<BR, HD>(sQ, &tmQ, pr.i0, h, b, barQ);
                }
            };
            // Q after the first K and V, whose stages are free before the consumers finish the previous
            // pair; ntiles >= 1 (the diagonal tile is never pruned), 0 would still load Q
            int ntiles = pr.jt_end - pr.jt_begin;
            // PRE: the pair's reference c_ref log2(e), the consumers' same expression (the same bits)
            float cref_l2 = GATE && PRE ? __fmul_rn(cb[pr.i0], LOG2E) : 0.f;
            if (ntiles == 0) load_q();
            for (int n = 0; n < ntiles; n++, it++) {
                int st = it % ST, parity = ((it / ST) & 1) ^ 1, j0 = (pr.jt_end - 1 - n) * BC;
                float cj[BC / 32];  // PRE: this lane's c_j, loaded before the wait so that their latency runs under it
                if (GATE && PRE) {
                    #pragma unroll
                    for (int e = 0; e < BC / 32; e++) cj[e] = cb[min(j0 + lane + 32 * e, T - 1)];  // past T: masked
                }
                mbar_wait(&emptyK[st], parity);
                if (lane == 0) {
                    mbar_expect_tx(&fullK[st], BC * HD * sizeof(bf16));
                    tma_load_tile<BC, HD>(sK + st * BC * HD, &tmK, j0, h, b, &fullK[st]);
                }
                if (GATE && PRE) {  // d_j to shared memory, then an arrival (release: the stores are seen)
                    #pragma unroll
                    for (int e = 0; e < BC / 32; e++) sC[st * BC + lane + 32 * e] = fmaf(-cj[e], LOG2E, cref_l2);
                    mbar_arrive(&fullK[st]);
                } else if (GATE) {
                    #pragma unroll
                    for (int e = lane; e < BC; e += 32)
                        cp_async4(sC + st * BC + e, cb + min(j0 + e, T - 1), j0 + e < T);
                    mbar_arrive_cp_async(&fullK[st]);
                }
                mbar_wait(&emptyV[st], parity);
                if (lane == 0) {
                    mbar_expect_tx(&fullV[st], BC * HD * sizeof(bf16));
                    tma_load_tile<BC, HD>(sV + st * BC * HD, &tmV, j0, h, b, &fullV[st]);
                }
                if (n == 0) load_q();
            }
        }
        return;
    }

    // consumers: warpgroup cw owns rows i0 + 64 cw .. of each pair; a warp 16 of them (rows g, g + 8 per thread)
    setmaxnreg_inc<CREG>();
    int cw = __shfl_sync(0xffffffff, wg - 1, 0);  // warp-uniform for the compiler: descriptors in uniform registers
    int cwarp = warp - 4, g = lane / 4, tq = lane % 4;
    constexpr uint64_t VSTEP = 16 * 64 * 2 / 16, STAGE = BC * HD * 2 / 16;  // as version 10
    const uint64_t dQ = desc_k<HD, BR, SW>(sQ, cw * 8, 0), dK0 = desc_k<HD, BC, SW>(sK, 0, 0),
                   dV0 = desc_mn<HD, BC, SW>(sV, 0);
    // tile it + n of the rings, none of this warpgroup's rows sees: released once loaded
    auto skip = [&](int x) {
        int st = x % ST, par = (x / ST) & 1;
        mbar_wait(&fullK[st], par);
        mbar_wait(&fullV[st], par);
        __syncwarp();
        if (lane == 0) { mbar_arrive(&emptyK[st]); mbar_arrive(&emptyV[st]); }
    };
    int it = 0;  // the rings' counter at the pair's first tile, as the producer's
    for (int k = 0, t = blockIdx.x; t < npairs; t = wsp_pair(++k, snake)) {
        Pair pr = pair_at(t);
        int b = pr.bh / H, h = pr.bh % H, ntiles = pr.jt_end - pr.jt_begin, jt_end = pr.jt_end;
        const float* cb = GATE ? c + (size_t)pr.bh * T : nullptr;
        int i0w = pr.i0 + 64 * cw;
        int rows[2] = {pr.i0 + cwarp * 16 + g, pr.i0 + cwarp * 16 + g + 8};
        // visible tiles [na, nb): from the one holding the last row's diagonal to the first tile seen
        int na = ntiles, nb = ntiles;  // none when every row is past T
        if (i0w < T) {
            na = jt_end - 1 - min(i0w + 63, T - 1) / BC;
            nb = jt_end - first_tile(pr.bh, i0w);
        }
        // c_ref log2(e), rounded once: the thread's first row, or with PRE the pair's (the producer's d_j)
        float cref_l2 = !GATE ? 0.f : PRE ? __fmul_rn(cb[pr.i0], LOG2E) : cb[min(rows[0], T - 1)] * LOG2E;
        float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.f, 0.f}, acc[HD / 2];
        #pragma unroll
        for (int e = 0; e < HD / 2; e++) acc[e] = 0.f;
        uint32_t pa[BC / 16][4];  // P of the previous tile, read by its P V matmul under this tile's softmax
        for (int n = 0; n < na; n++) skip(it + n);
        mbar_wait(barQ, k & 1);
        for (int n = na; n < nb; n++) {
            int x = it + n, st = x % ST, pst = (x + ST - 1) % ST;  // this tile's stage, the previous tile's
            mbar_wait(&fullK[st], (x / ST) & 1);
            if (n > na) mbar_wait(&fullV[pst], ((x - 1) / ST) & 1);
            const float* sCb = sC + st * BC;
            const uint64_t dK = dK0 + st * STAGE;

            // S = Q K^T of this tile, then O += P V of the previous one: the softmax below runs under it
            float s[BC / 2];
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                wgmma_ss<BC, 0>(s, dQ + desc_k_step<BR>(kk), dK + desc_k_step<BC>(kk), kk);
            wgmma_commit();
            if (n > na) {
                const uint64_t dV = dV0 + pst * STAGE;
                #pragma unroll
                for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD, 1>(acc, pa[kk], dV + kk * VSTEP, 1);
                wgmma_commit();
                // in each branch: a join between the issue and the wait serializes the wgmma's (C7514)
                wgmma_wait<1>();
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
                fox_lean_logits<BC, GATE, true, PRE>(s, mx, sCb, cref_l2, tq, scale_log2, hi, lo);
            } else {
                fox_lean_logits<BC, GATE, false, PRE>(s, mx, sCb, cref_l2, tq, scale_log2, nullptr, nullptr);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&emptyK[st]);  // K(n) read by S, c_j read above: the stage is free
            #pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
            }
            bool resc = __any_sync(0xffffffff, mx[0] > m[0] + FOX_RESCALE_LOG2 || mx[1] > m[1] + FOX_RESCALE_LOG2);
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
            fox_lean_exp<BC, 0>(s, l, m);
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
        __syncwarp();
        if (lane == 0) mbar_arrive(emptyQ);  // this warp's last S of the pair is done: Q may be reloaded
        if (na < nb) {  // the last tile's P V
            int x = it + nb - 1, pst = x % ST;
            mbar_wait(&fullV[pst], (x / ST) & 1);
            const uint64_t dV = dV0 + pst * STAGE;
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD, 1>(acc, pa[kk], dV + kk * VSTEP, 1);
            wgmma_commit();
            wgmma_wait0();
            wgmma_pin<HD / 2>(acc); wgmma_use_a<BC / 16>(pa);
            __syncwarp();
            if (lane == 0) mbar_arrive(&emptyV[pst]);
        }
        for (int n = nb; n < ntiles; n++) skip(it + n);
        it += ntiles;
        if (i0w < T) {
            float m_abs[2];  // m + r_i: the maximum in absolute log2 units
            #pragma unroll
            for (int r = 0; r < 2; r++)
                m_abs[r] = m[r] + ((GATE && rows[r] < T) ? fmaf(cb[rows[r]], LOG2E, -cref_l2) : 0.f);
            fox_store_rows<HD>(o + (size_t)b * T * stride_o + (size_t)h * HD, lse + (size_t)pr.bh * T, acc, l, m_abs,
                               rows, tq, T, stride_o);
        }
    }
}

// version 15's grid: a block per SM (at most one per pair), or at most g_wsp_blocks when > 0 (the
// checks run 1 and 5 blocks too, so that one block's rings cross pairs at every shape)
static int g_wsp_blocks = 0;
// version 18's heads per section: K and V of GROUP_MB megabytes (or g_wsp_group heads when > 0: checks)
static int g_wsp_group = 0;
#define FOX_V18_MB 24  // version 18's section: K and V of this many megabytes (half the H100's / H200's L2)
// the checks' variants of versions 15-19: grid caps (g_wsp_blocks) and section sizes (g_wsp_group)
static const int WSP_CAPS[5] = {0, 1, 5, 0, 5}, WSP_GROUPS[5] = {0, 0, 0, 1, 3};

// version 15: at hd 64 version 10's tiles (three consumers, 3 stages), at hd 128 version 14's (two, ST128)
template<int HD, int ST128, bool GATE, int SNAKE, int GROUP_MB, bool PRE>
static void fox_fwd_wsp_launch(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                               int B, int T, int H, int stride_qkv, int stride_o, int window, const int* key_start,
                               cudaStream_t s) {
    constexpr int BC = 128, NWG = HD == 64 ? 3 : 2, ST = HD == 64 ? 3 : ST128, BR = 64 * NWG;
    // Q, ST stages of K, V and c, the barriers (barQ, emptyQ, 4 per stage), + 1 KB for the swizzle's alignment
    constexpr size_t smem = 1024 + (size_t)(BR + 2 * ST * BC) * HD * sizeof(bf16) + ST * BC * sizeof(float) +
                            (2 + 4 * ST) * sizeof(uint64_t);
    static int sms = 0;
    if (!sms) {
        int dev;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        cudaCheck(cudaFuncSetAttribute(fox_fwd_wsp_kernel<HD, BC, ST, NWG, GATE, PRE>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    CUtensorMap tq = fox_tensor_map(q, B, T, H, HD, stride_qkv, BR),
                tk = fox_tensor_map(k, B, T, H, HD, stride_qkv, BC),
                tv = fox_tensor_map(v, B, T, H, HD, stride_qkv, BC);
    float scale_log2 = LOG2E / sqrtf((float)HD);
    int npairs = ceil_div(T, BR) * B * H;
    int grid = min(npairs, g_wsp_blocks > 0 ? g_wsp_blocks : sms);
    int group = B * H;  // one section
    if (GROUP_MB)
        group = g_wsp_group > 0 ? g_wsp_group : max(1, (int)(((size_t)GROUP_MB << 20) / ((size_t)T * HD * 4)));
    fox_fwd_wsp_kernel<HD, BC, ST, NWG, GATE, PRE><<<grid, 128 * (NWG + 1), smem, s>>>(
        o, lse, tq, tk, tv, c, T, H, B * H, stride_o, window, scale_log2, key_start, SNAKE, min(group, B * H));
    cudaCheckLaunch();
}
template<int ST128 = FOX_V14_ST, int SNAKE = 0, int GROUP_MB = 0, bool PRE = false>
static void fox_fwd_wsp(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                        int B, int T, int H, int hd, int stride_qkv, int stride_o, int window, const int* key_start,
                        cudaStream_t s) {
    if (hd == 64 && c)
        fox_fwd_wsp_launch<64, ST128, true, SNAKE, GROUP_MB, PRE>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o,
                                                                  window, key_start, s);
    else if (hd == 64)
        fox_fwd_wsp_launch<64, ST128, false, SNAKE, GROUP_MB, PRE>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o,
                                                                   window, nullptr, s);
    else if (c)
        fox_fwd_wsp_launch<128, ST128, true, SNAKE, GROUP_MB, PRE>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o,
                                                                   window, key_start, s);
    else
        fox_fwd_wsp_launch<128, ST128, false, SNAKE, GROUP_MB, PRE>(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o,
                                                                    window, nullptr, s);
}
// ---- end: persistent warp-specialised forward (version 15) ----

// ---- begin: fused forward API for train_fox.cu ----
// o: bf16 (B, T, H, hd), token stride stride_o; lse: fp32 (B, H, T), saved for the backward.
// q, k, v: bf16 (B, T, H, hd), token stride stride_qkv (H*hd separate, 3*H*hd packed qkv).
// c: fp32 (B, H, T) cumulative log forget gate, or NULL for plain causal attention.
// window: query i sees keys i - window < j <= i; 0 means no window.
void fox_attention_forward(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                           int B, int T, int H, int hd, int stride_qkv, int stride_o, int window, cudaStream_t s) {
    fox_check_args("fox_attention_forward", q, k, v, B, T, H, hd, stride_qkv, stride_o, window);
    // sm_90a only. Version 16: versions 10 (hd 64) and 14 (hd 128) persistent, pairs in snake order
    // (+9-13% over version 10 at hd 64, no gain shown over version 14 at hd 128; dev/cuda/LOG.md)
    fox_fwd_wsp<FOX_V14_ST, 1>(o, lse, q, k, v, c, B, T, H, hd, stride_qkv, stride_o, window, nullptr, s);
}
// ---- end: fused forward API ----

// ----------------------------------------------------------------------------
// test problems, shared with the backward file

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
                    acc += (float)(-rate * (0.5 + rng_uniform()));
                    p.c[((size_t)b * H + h) * T + t] = acc;
                }
            }
    }
    return p;
}

// bf16 outputs: the output rounding alone is ~2e-3 rms relative and P is rounded to bf16 before
// P V, so 1e-2 leaves room without hiding an indexing error (those give O(1)). lse is fp32 from
// exact bf16 products, so an absolute 1e-3 on values O(1..10) is loose but catches any mask error.
#define TOL_BF16 1e-2
#define TOL_LSE_ABS 1e-3

static double attn_fwd_flops(int B, int T, int H, int hd) { return 4.0 * B * H * (double)T * T * hd / 2; }

// ----------------------------------------------------------------------------
#ifndef FOX_SKIP_FORWARD_MAIN

#define FWD_VERSIONS 19  // the ladder's versions are 1..FWD_VERSIONS

static void run_forward(int version, bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                        int B, int T, int H, int hd, int sq, int so, int w) {
    switch (version) {
        case 1: fox_forward1<float, bf16>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w); break;
        case 2: fox_forward2(o, lse, q, k, v, c, B, T, H, hd, sq, so, w); break;
        case 3: fox_fwd_mma_dispatch<64, 64, 1>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, 0); break;
        case 4: fox_fwd_mma_dispatch<64, 32, 2>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, 0); break;
        case 5: fox_fwd_wgmma<128, 64, 1>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, 0); break;
        case 6: fox_fwd_wgmma<64, 64, 2>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, 0); break;
        case 7: fox_fwd_wgmma<64, 64, 2, true>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, 0); break;
        case 8: fox_fwd_ws<128, 2>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        case 9: fox_fwd_lean<128, 2>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        case 10: fox_fwd_wsl<3, 3>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        case 11: fox_fwd_wsl<3, 2>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        // version 10 with 2 (version 12: 1/4) or 4 (version 13: 1/2) of every 8 exponentials by ex2_poly
        case 12: fox_fwd_wsl<3, 3, 2>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        case 13: fox_fwd_wsl<3, 3, 4>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        // version 10's kernel at hd 128 (two consumer warpgroups, 2 stages); hd 64: version 10
        case 14: fox_fwd_wsl_all<FOX_V14_ST>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        // versions 10 and 14 persistent (a block per SM walking the pairs, longest first)
        case 15: fox_fwd_wsp<>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        case 16: fox_fwd_wsp<FOX_V14_ST, 1>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        case 18: fox_fwd_wsp<FOX_V14_ST, 1, FOX_V18_MB>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        case 19: fox_fwd_wsp<FOX_V14_ST, 1, 0, true>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0); break;
        case 17: {  // the checks' caps (g_wsp_blocks) still apply
            int cap = g_wsp_blocks;
            if (!cap) g_wsp_blocks = 1 << 30;
            fox_fwd_wsp<>(o, lse, q, k, v, c, B, T, H, hd, sq, so, w, nullptr, 0);
            g_wsp_blocks = cap;
            break;
        }
        default:
            fprintf(stderr, "invalid version %d\nHINT: versions are 1..%d\n", version, FWD_VERSIONS);
            exit(EXIT_FAILURE);
    }
}

struct FwdDev { bf16 *qkv, *o; float *c, *lse; };
static FwdDev upload(const FoxProblem& p) {
    FwdDev d;
    d.qkv = dmalloc<bf16>(p.n_qkv); h2d(d.qkv, p.qkv);
    d.o = dmalloc<bf16>(p.n_o);
    d.lse = dmalloc<float>(p.n_bht);
    d.c = nullptr;
    if (p.gate) { d.c = dmalloc<float>(p.n_bht); h2d(d.c, p.c); }
    return d;
}
static void release(FwdDev& d) {
    cudaCheck(cudaFree(d.qkv)); cudaCheck(cudaFree(d.o)); cudaCheck(cudaFree(d.lse));
    if (d.c) cudaCheck(cudaFree(d.c));
}

// o_ref: (B, T, H, hd) compact, lse_ref (B, H, T); both double
static bool check_forward(const FoxProblem& p, const FwdDev& d, const double* o_ref, const double* lse_ref) {
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

// ex2_poly (versions 12 and 13) against exp2 in fp64 on the device, over every fp32 x in [-126, 0]
// (n_neg values from -0 down) and [0, FOX_RESCALE_LOG2] (n_pos from +0 up): the range of x - m in
// fox_lean_exp with normal results (the lazy maximum keeps x <= 2^8). err_bits: the largest
// relative error as float bits (unsigned order = float order for values >= 0); bad: a wrong value
// at the flush end (x <= -127, -inf: 0) or at an integer x (exact powers of two)
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

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // line by line into a log too: a hung version shows where
    int only = argc > 1 ? atoi(argv[1]) : 0;
    int first = only ? only : 1, last = only ? only : FWD_VERSIONS;
    if (argc > 2) last = atoi(argv[2]);  // a range: ./prog first last
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    bool all_ok = true;

    // 0. the software 2^x of versions 12 and 13, every fp32 input of its range
    if (first <= 13 && last >= 12) {
        float lo = -126.f, hi = FOX_RESCALE_LOG2;
        uint32_t lo_bits, hi_bits;
        memcpy(&lo_bits, &lo, 4); memcpy(&hi_bits, &hi, 4);
        unsigned* err_d = dmalloc<unsigned>(1);
        int* bad_d = dmalloc<int>(1);
        cudaCheck(cudaMemset(err_d, 0, sizeof(unsigned)));
        ex2_poly_check_kernel<<<prop.multiProcessorCount * 8, 256>>>(err_d, bad_d, lo_bits - 0x80000000u + 1,
                                                                      hi_bits + 1);
        cudaCheckLaunch();
        unsigned err_bits = d2h(err_d, 1)[0];
        int bad = d2h(bad_d, 1)[0];
        float err;
        memcpy(&err, &err_bits, 4);
        bool ok = !bad && err <= TOL_EX2_POLY;
        printf("ex2_poly (versions 12, 13), every fp32 x in [-126, %g] against fp64: max rel error %.3e "
               "(tol %.0e), flush and powers of two %s: %s\n", hi, err, TOL_EX2_POLY, bad ? "wrong" : "exact",
               ok ? "ok" : "FAIL");
        all_ok &= ok;
        cudaCheck(cudaFree(err_d)); cudaCheck(cudaFree(bad_d));
    }

    // 1. small shapes against the fp64 CPU reference
    struct Cfg { int B, T, H, hd, window; bool packed; double gate; int o_pad; };
    Cfg cfgs[] = {
        {2, 197, 3, 64, 0, true, -1, 0},     // T not a multiple of any tile, packed qkv, both gate regimes
        {1, 256, 2, 128, 0, false, -1, 8},   // hd 128, padded o stride
        {2, 130, 2, 64, 0, false, 0, 0},     // no gate (c == NULL)
        {1, 300, 2, 128, 37, true, -1, 0},   // sliding window smaller than a tile
        {1, 333, 2, 64, 100, false, 0.5, 0}, // window spanning tiles, T ragged
        {1, 70, 1, 64, 1, false, 0.1, 0},    // window 1: only the diagonal
        {3, 1, 2, 128, 0, false, 1, 0},      // T = 1
    };
    for (const Cfg& cf : cfgs) {
        FoxProblem p = make_problem(cf.B, cf.T, cf.H, cf.hd, cf.window, cf.packed, cf.gate, cf.o_pad);
        std::vector<double> o_ref((size_t)p.B * p.T * p.H * p.hd), lse_ref(p.n_bht);
        fox_forward_cpu(o_ref.data(), lse_ref.data(), p.qkvf.data() + p.q_off, p.qkvf.data() + p.k_off,
                        p.qkvf.data() + p.v_off, p.gate ? p.c.data() : nullptr,
                        p.B, p.T, p.H, p.hd, p.stride_qkv, p.window);
        FwdDev d = upload(p);
        printf("B=%d T=%d H=%d hd=%d window=%d packed=%d gate=%s\n", p.B, p.T, p.H, p.hd, p.window, (int)p.packed,
               p.gate ? "yes" : "none");
        for (int ver = first; ver <= last; ver++) {
            for (int vi = 0; vi < 5; vi++) {  // versions 15-19 also on 1 and 5 blocks, 18 in sections of 1 and 3 heads
                if ((vi && ver < 15) || (vi >= 3 && ver != 18)) continue;
                int cap = WSP_CAPS[vi];
                g_wsp_blocks = cap; g_wsp_group = WSP_GROUPS[vi];
                poison(d.o, p.n_o); poison(d.lse, p.n_bht);
                run_forward(ver, d.o, d.lse, d.qkv + p.q_off, d.qkv + p.k_off, d.qkv + p.v_off, d.c,
                            p.B, p.T, p.H, p.hd, p.stride_qkv, p.stride_o, p.window);
                cudaCheck(cudaDeviceSynchronize());
                printf("  version %d", ver);
                if (cap) printf(" on %d block(s)", cap);
                if (g_wsp_group) printf(", sections of %d head(s)", g_wsp_group);
                printf("\n");
                all_ok &= check_forward(p, d, o_ref.data(), lse_ref.data());
            }
            g_wsp_blocks = 0; g_wsp_group = 0;
        }
        // the fp64 GPU kernel used as the long-T reference must itself match the CPU
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

    // 1b. the key_start pruning of versions 8-16, 18 and 19: random first key tiles (up to the diagonal one)
    // against the CPU reference that skips the same keys. Versions 10-16, 18, 19 also at hd 64 with a
    // window (version 10's 192-row blocks span two pruning tiles; hd 128 runs version 9 there in
    // 10-13), versions 14-16, 18, 19 also at hd 128 without a window (their own kernels there)
    for (int ver : {8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19}) {
        if (ver < first || ver > last) continue;
        for (int pc = 0; pc < (ver >= 14 ? 4 : ver >= 10 ? 3 : 2); pc++)
        // versions 15, 16, 18, 19 also on 1 and 5 blocks, 18 in sections of 1 and 3 heads
        for (int vi = 0; vi < 5; vi++) {
            if ((vi && ver < 15) || (vi >= 3 && ver != 18)) continue;
            int cap = WSP_CAPS[vi];
            g_wsp_blocks = cap; g_wsp_group = WSP_GROUPS[vi];
            int hd = pc == 1 || pc == 3 ? 128 : 64;
            FoxProblem p = make_problem(2, 600, 2, hd, pc == 0 || pc == 3 ? 0 : 300, true, -1);
            int nt = ceil_div(p.T, 128);
            std::vector<int> ks((size_t)p.B * p.H * nt);
            for (size_t e = 0; e < ks.size(); e++) ks[e] = (int)(rng_u32() % (e % nt + 1));
            std::vector<double> o_ref((size_t)p.B * p.T * p.H * p.hd), lse_ref(p.n_bht);
            fox_forward_cpu(o_ref.data(), lse_ref.data(), p.qkvf.data() + p.q_off, p.qkvf.data() + p.k_off,
                            p.qkvf.data() + p.v_off, p.c.data(),
                            p.B, p.T, p.H, p.hd, p.stride_qkv, p.window, ks.data());
            FwdDev d = upload(p);
            int* ks_d = dmalloc<int>(ks.size()); h2d(ks_d, ks);
            poison(d.o, p.n_o); poison(d.lse, p.n_bht);
            const bf16 *q = d.qkv + p.q_off, *k = d.qkv + p.k_off, *v = d.qkv + p.v_off;
            int B = p.B, T = p.T, H = p.H, sq = p.stride_qkv, so = p.stride_o, w = p.window;
            switch (ver) {  // run_forward's versions, with the pruning table
                case 8: fox_fwd_ws<128, 2>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d, 0); break;
                case 9: fox_fwd_lean<128, 2>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d, 0); break;
                case 10: fox_fwd_wsl<3, 3>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d, 0); break;
                case 11: fox_fwd_wsl<3, 2>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d, 0); break;
                case 12: fox_fwd_wsl<3, 3, 2>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d, 0); break;
                case 13: fox_fwd_wsl<3, 3, 4>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d, 0); break;
                case 15: fox_fwd_wsp<>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d, 0); break;
                case 16: fox_fwd_wsp<FOX_V14_ST, 1>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d, 0); break;
                case 18: fox_fwd_wsp<FOX_V14_ST, 1, FOX_V18_MB>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d,
                                                                0); break;
                case 19: fox_fwd_wsp<FOX_V14_ST, 1, 0, true>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d, 0);
                    break;
                default: fox_fwd_wsl_all<FOX_V14_ST>(d.o, d.lse, q, k, v, d.c, B, T, H, hd, sq, so, w, ks_d, 0); break;
            }
            cudaCheck(cudaDeviceSynchronize());
            printf("B=%d T=%d H=%d hd=%d window=%d packed, pruned (random key_start)\n  version %d", p.B, p.T, p.H,
                   p.hd, p.window, ver);
            if (cap) printf(" on %d block(s)", cap);
            if (g_wsp_group) printf(", sections of %d head(s)", g_wsp_group);
            printf("\n");
            all_ok &= check_forward(p, d, o_ref.data(), lse_ref.data());
            cudaCheck(cudaFree(ks_d));
            release(d);
            g_wsp_blocks = 0; g_wsp_group = 0;
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
        FwdDev d = upload(p);
        size_t n_ref = (size_t)p.T * p.H * p.hd;
        double *o64 = dmalloc<double>(n_ref), *lse64 = dmalloc<double>(p.n_bht);
        fox_forward1<double, double>(o64, lse64, d.qkv + p.q_off, d.qkv + p.k_off, d.qkv + p.v_off, d.c,
                                     p.B, p.T, p.H, p.hd, p.stride_qkv, p.H * p.hd, p.window);
        std::vector<double> o_ref = d2h(o64, n_ref), lse_ref = d2h(lse64, p.n_bht);
        printf("T=%d H=%d hd=%d window=%d %s\n", p.T, p.H, p.hd, p.window, L.what);
        for (int ver = std::max(first, 2); ver <= last; ver++) {  // v1 in fp32 is the reference's twin, and slow
            poison(d.o, p.n_o); poison(d.lse, p.n_bht);
            run_forward(ver, d.o, d.lse, d.qkv + p.q_off, d.qkv + p.k_off, d.qkv + p.v_off, d.c,
                        p.B, p.T, p.H, p.hd, p.stride_qkv, p.stride_o, p.window);
            cudaCheck(cudaDeviceSynchronize());
            printf("  version %d\n", ver);
            all_ok &= check_forward(p, d, o_ref.data(), lse_ref.data());
        }
        cudaCheck(cudaFree(o64)); cudaCheck(cudaFree(lse64));
        release(d);
    }
    if (!all_ok) { printf("VALIDATION FAILED: no timing\n"); return EXIT_FAILURE; }

    // 3. timing on the benchmark shapes (dev/bench_attention.py), gate on, random data
    int shapes[][4] = {{8, 12, 2048, 64}, {2, 12, 8192, 64}, {1, 12, 16384, 64},
                       {1, 16, 16384, 128}, {4, 16, 4096, 128}};
    printf("\nforward, causal, gate on: TFLOP/s (ms)\n%-22s", "B x H x T x hd");
    for (int ver = first; ver <= last; ver++) printf("   version %d        ", ver);
    printf("\n");
    for (auto& sh : shapes) {
        int B = sh[0], H = sh[1], T = sh[2], hd = sh[3];
        FoxProblem p = make_problem(B, T, H, hd, 0, false, 0.05);
        FwdDev d = upload(p);
        char name[64]; snprintf(name, sizeof(name), "%d x %d x %d x %d", B, H, T, hd);
        printf("%-22s", name);
        auto launch = [&](int ver) {
            run_forward(ver, d.o, d.lse, d.qkv + p.q_off, d.qkv + p.k_off, d.qkv + p.v_off, d.c,
                        B, T, H, hd, p.stride_qkv, p.stride_o, 0);
        };
        // every version but 1 (seconds: 3 runs at the first shape only) timed in turns, 30 rounds
        std::vector<std::function<void()>> fs;
        for (int ver = std::max(first, 2); ver <= last; ver++) fs.push_back([&, ver]() { launch(ver); });
        std::vector<float> med = time_medians_interleaved(fs, 1, 30);
        for (int ver = first; ver <= last; ver++) {
            if (ver == 1 && &sh != &shapes[0]) { printf("   %19s", "-"); continue; }
            float ms = ver == 1 ? time_median_ms([&]() { launch(1); }, 1, 3) : med[ver - std::max(first, 2)];
            printf("   %7.1f (%8.3f)", attn_fwd_flops(B, T, H, hd) / (ms * 1e-3) / 1e12, ms);
        }
        printf("\n");
        release(d);
    }
    return 0;
}
#endif
