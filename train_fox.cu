/*
train_fox.cu: the GPU trainer of the Forgetting Transformer (FoX), for H100 / H200 (sm_90).

The same models, checkpoints and command line as the CPU twin train_fox.c, which this file includes: the
configuration, the flat parameter table, the data loader, the tokenizer, the schedule, the checkpoint files and the
arguments are the twin's; everything here is the GPU side. Precision: fp32 master weights, gradients and AdamW state;
a bf16 copy of the weights for the matmuls; bf16 activations; fp32 residual stream, norm statistics, log f, c,
softmax statistics and the loss. -DENABLE_FP32 makes activations and matmuls fp32 (tight diffs against the twin).

Every matmul is cuBLASLt (fp32 accumulation); every other layer is a hand-written kernel, mirroring the twin's
functions in the same order. Reductions that feed training (weight, bias and norm-scale gradients, the gradient norm,
dc) never use atomics: same seed, same bits. The model, its numerics and the attention's gradient: dev/fox.md; the
attention kernels' versions and measurements: dev/cuda/README.md, dev/cuda/LOG.md, dev/RESULTS.md.

Build: make train_fox (nvcc with the Makefile's NVCC_FLAGS: sm_90a, --default-stream per-thread; NCCL when found, else
-DNO_NCCL: one GPU; PRECISION=FP32 adds -DENABLE_FP32). A file that includes this one for its code (test_fox.cu,
dev/profile_generate.cu, dev/bench_rmsnorm.cu, dev/cuda) defines FOX_NO_MAIN, which drops
main() (and the twin's); test hooks: train_fox.c, TEST_HOOK.

Reading order: the training code from the top through main. Generation and the evaluation modes on the GPU are
dev/generate.cuh, included after main, which needs only gpu_sample and gpu_eval_main of them (declared before it).
Each layer's section holds its kernels, then their launchers: a launcher is named <what>_gpu (the twin's function name
plus _gpu), sets the grid and calls the kernel and launchCheck(); the model code (gpu_forward, gpu_backward, the
optimiser, generation) calls launchers only. The fused attention kernels keep their own launchers
(fox_attention_forward, fox_attention_backward) behind attention_forward_gpu / _backward_gpu.
*/
// Map: the sections in file order (each opens with a // ---- line and this title) and what they define.
// checked CUDA and cuBLASLt calls
// defines: cudaCheck, launchCheck, cublasCheck, ncclCheck, mpiCheck, gpu_malloc, gpu_memory_used, smem_limit
// device and cuBLASLt setup
// defines: gpu_init_device, gpu_init, gpu_available, gpu_peak_flops
// device helpers shared by the kernels
// defines: warp_sum, warp_max, block_sum, block_max, sigmoid_gpu, logsigmoid_gpu, ex2_ftz, warp_blocks,
// defines: elem_blocks, PackX, Pack4X, load_floats, head_lanes, head_blocks, group_sum, FoxDocs, docs_or_none,
// defines: doc_starts_at
// encoder
// defines: encoder_forward_kernel, encoder_backward_kernel, encoder_forward_gpu, encoder_backward_gpu
// matmuls
// defines: MatmulPlan, matmul_scales, matmul_plan, matmul_drop_first, matmul_run_first, matmul_tune, digest_gpu,
// defines: pattern_gpu, matmul_typed, matmul_lt, matmul_forward_gpu, matmul_backward_input_gpu,
// defines: matmul_backward_weight_gpu
// FP8 operands
// defines: fp8_code, fp8_value, fp8_code2, fp8_value2, fp8_pow2_gpu, fp8_warp_amax, fp8_block_amax, Fp8Out,
// defines: fp8_pick, fp8_pack, FP8_TM_ROWS, fp8_stage_put, fp8_transpose4, fp8_stage_write,
// defines: fp8_transpose_codes_kernel, fp8_transpose_codes_gpu;
// defines: bf16 build: fp8_in, fp8_scale_exp_gpu, fp8_amax_kernel, fp8_load8, fp8_cast_one, fp8_cast_kernel,
// defines: fp8_blocks, fp8_amax_gpu, fp8_cast_gpu, matmul_fp8_gpu;
// defines: fp8_tm_check
// RMSNorm and column sums
// defines: rmsnorm_forward_row, rmsnorm_forward_kernel, rmsnorm_backward_kernel, colsum_partial_kernel,
// defines: colsum_scale_partial_kernel,
// defines: colsum_finish_kernel, rms_nv, rmsnorm_forward_nv, rmsnorm_forward_gpu, rmsnorm_backward_nv,
// defines: rmsnorm_backward_gpu, colsum_gpu, colsum_scale_gpu
// Hopper primitives
// defines: cp_async16, mma_bf16_16816, ldmatrix_x4, wgmma_ss, wgmma_rs, wg_desc, desc_k, desc_mn, mbar_init,
// defines: mbar_wait, tma_load_tile, setmaxnreg_inc, setmaxnreg_dec, fox_tensor_map (bf16 build)
// head projections
// defines: HeadProj, head_proj_slots, head_proj_forward_kernel, head_proj_backward_input_kernel,
// defines: head_proj_forward_gpu, head_proj_backward_gpu
// KV-shift
// defines: KVShiftSet, kv_shift_forward_kernel, kv_shift_backward_kernel, kv_shift_forward_gpu,
// defines: kv_shift_backward_gpu
// QK-norm and RoPE
// defines: QKNormSet, qk_norm_rope_forward_kernel, qk_grad_store, qk_norm_rope_backward_kernel,
// defines: qk_norm_rope_forward_gpu, qk_norm_rope_backward_gpu
// the forget gate
// defines: forget_gate_forward_kernel, forget_gate_backward_kernel, forget_gate_forward_gpu,
// defines: forget_gate_backward_gpu
// Forgetting attention
// defines: attention_forward_kernel, attention_backward_dq_kernel, attention_backward_dkdv_kernel,
// defines: fox_prune_count_kernel, attention_delta_kernel, fox_bwd_delta_kernel, fox_bwd_dlogf_kernel,
// defines: fox_bwd_dlogf_gpu, fox_prune_tables, fox_forward_kernel16, FOX_PICK, fox_attention_forward,
// defines: fox_backward_dkdv_kernel20, fox_backward_dq_kernel20, fox_attention_backward, attention_set_pruning,
// defines: attention_pruned_share, tiles_counted, attention_forward_gpu, attention_backward_gpu
// output norm and gate
// defines: output_norm_gate_row, output_norm_gate_forward_kernel, output_norm_gate_backward_kernel,
// defines: fp8_ong_tm_ok, output_norm_gate_forward_gpu, output_norm_gate_backward_gpu
// SwiGLU
// defines: swiglu_grid, swiglu_forward_pack, swiglu_forward_kernel, swiglu_backward_pack, swiglu_backward_kernel,
// defines: swiglu_forward_gpu, swiglu_backward_gpu
// cross-entropy
// defines: crossentropy_kernel, crossentropy_gpu
// optimiser kernels
// defines: Range, AdamWSegment, sumsq_partial_kernel, adamw_kernel, to_floatX_kernel, sumsq_partial_gpu,
// defines: adamw_gpu, to_floatX_gpu
// data parallel
// defines: Dist, dist_init, dist_free, dist_wait, dist_sum, dist_sum_scalar, dist_sum_loss, dist_check_same
// the GPU model
// defines: GPUActivations, GPUGradBuffers, RangeList, ParamLayout, StepGraph, Fp8Block, Fp8Gpu, fp8_delayed_at,
// defines: fp8_norm_at, fp8_weight_at, fp8_dlogits_at, fp8_index_count, GPUModel, qkvg_slots
// the GPU's parameter layout
// defines: layout_params, slice_offset, pm, px, pg, gpu_upload, gpu_download, adamw_segments, layout_activations,
// defines: layout_grad_buffers, fp8_wgrad8_on, fp8_memory_needed, gpu_memory_needed, gpu_config_problem,
// defines: gpu_build_dist, gpu_build, gpu_free
// FP8 matmuls of a training step (-q)
// defines: bf16 build: fp8_scales_kernel, fp8_weight_blocks, fp8_block_of, fp8_weights_amax_kernel,
// defines: fp8_weights_cast_kernel, fp8_block_tiles, fp8_weights_amax_gpu, fp8_weights_cast_gpu, gpu_fp8_build,
// defines: gpu_fp8_free, gpu_fp8_step_begin, gpu_fp8_amax_to_host, fp8_inv; fp8_rounds, fp8_calibrating,
// defines: fp8_amax_slot, fp8_slot_e5m2, fp8_out, matmul_forward_q, fp8_wgrad8, fp8_wgrad8_o, fp8_wgrad8_qkvg,
// defines: fp8_wgrad8_head, FP8_T_XM, fp8_x8t, fp8_out_t, fp8_dres_down, fp8_rounded_input, matmul_backward_q
// forward and backward of the whole model
// defines: LayerActs, layer_acts, head_proj_layer, gpu_docs, kv_shift_forward_layer, qk_norm_rope_forward_layer,
// defines: output_norm_gate_forward_layer, LayerFp8, layer_fp8, gpu_recompute_layer, document_ends,
// defines: gpu_forward_kernels, gpu_forward,
// defines: gpu_forward_train, gpu_backward_kernels, gpu_encoder_backward, gpu_backward, gpu_train_micro_step,
// defines: gpu_fp8_calibrate, gpu_tune_fp8_begin, gpu_tune_fp8_scales, gpu_tune_fp8_end, gpu_tune_pass,
// defines: gpu_tune_matmuls
// optimiser
// defines: gpu_reduce_grads, gpu_grad_norm, gpu_adamw, gpu_update, gpu_gather_master
// checkpoints
// defines: gpu_state_to_host, gpu_state_from_host, gpu_save_checkpoint
// main: training
// defines: gpu_evaluate; without FOX_NO_MAIN: gpu_resume, TrainRun, train_setup, train_plan, train_build,
// defines: train_between_steps, train_step, train_log_step, train_finish, main
// generation, sampling and the evaluation modes on the GPU: dev/generate.cuh (its own map), included at the end

#ifdef FOX_NO_MAIN
#include "train_fox.c"
#else
#define FOX_NO_MAIN // the twin's main() is not this program's (main is at the end of this file)
#include "train_fox.c"
#undef FOX_NO_MAIN
#endif
// gpu_train_micro_step's CUDA graph captures the default stream of this thread, which the legacy default stream cannot
// be: every launch on stream 0 must go there (the Makefile's NVCC_FLAGS)
#ifndef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "build train_fox.cu with nvcc --default-stream per-thread (HINT: make train_fox passes it)"
#endif
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled (the warp-specialised attention)
#include <cublasLt.h>
#include <sched.h>
#include <float.h>  // FLT_MAX (the forward's start for the running maximum)
#ifndef NO_NCCL
#include <nccl.h>
#else
// Built without NCCL (the Makefile found none): one GPU only; dist_init refuses more processes before any of these
// stand-ins could be called.
typedef struct ncclComm* ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef enum { ncclSuccess, ncclInProgress, ncclUnavailable } ncclResult_t;
typedef enum { ncclFloat, ncclDouble, ncclBfloat16 } ncclDataType_t;
enum { ncclSum };
static const char* ncclGetErrorString(ncclResult_t) { return "this train_fox was built without NCCL"; }
static const char* ncclGetLastError(ncclComm_t) { return ""; }
#define NCCL_ABSENT(f) template <typename... Args> static ncclResult_t f(Args...) { return ncclUnavailable; }
NCCL_ABSENT(ncclGetUniqueId) NCCL_ABSENT(ncclCommInitRank) NCCL_ABSENT(ncclCommGetAsyncError) NCCL_ABSENT(ncclCommAbort)
NCCL_ABSENT(ncclCommDestroy) NCCL_ABSENT(ncclAllReduce) NCCL_ABSENT(ncclReduceScatter) NCCL_ABSENT(ncclAllGather)
NCCL_ABSENT(ncclGroupStart) NCCL_ABSENT(ncclGroupEnd)
#endif
#ifdef USE_MPI
#include <mpi.h>
#endif

#ifdef ENABLE_FP32
typedef float floatX;
#define CUDA_R_X CUDA_R_32F
#define PRECISION_NAME "fp32"
__host__ __device__ static inline float to_float(float x) { return x; }
__host__ __device__ static inline floatX to_floatX(float x) { return x; }
#else
typedef __nv_bfloat16 floatX;
#define CUDA_R_X CUDA_R_16BF
#define PRECISION_NAME "bf16"
__host__ __device__ static inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__host__ __device__ static inline floatX to_floatX(float x) { return __float2bfloat16(x); }
#endif

// the one ceil_div, for host code and the kernels (attention tile counts)
__host__ __device__ static inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// ----------------------------------------------------------------------------
// checked CUDA and cuBLASLt calls

static void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
    if (err == cudaSuccess) { return; }
    fail("CUDA error '%s' in %s at %s:%d\nHINT: run under compute-sanitizer to locate a bad access; "
         "the build targets sm_90 (H100 / H200)", cudaGetErrorString(err), call, file, line);
}
#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)
#define launchCheck() cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

static void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) { return; }
    fail("cuBLASLt error %d in %s at %s:%d\nHINT: check the CUDA toolkit and driver versions match the "
         "GPU", (int)status, call, file, line);
}
#define cublasCheck(call) cublas_check((call), #call, __FILE__, __LINE__)

static void nccl_check(ncclResult_t r, const char* call, const char* file, int line) {
    if (r == ncclSuccess) { return; }
    fail("NCCL error '%s' in %s at %s:%d: %s\nHINT: rerun with NCCL_DEBUG=INFO; every process must run the same "
         "command with its own rank, and all must see the same rendezvous (-F) or mpirun", ncclGetErrorString(r), call,
         file, line, ncclGetLastError(NULL));
}
#define ncclCheck(call) nccl_check((call), #call, __FILE__, __LINE__)

#ifdef USE_MPI
static void mpi_check(int rc, const char* call, const char* file, int line) {
    if (rc == MPI_SUCCESS) { return; }
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fail("MPI error '%s' in %s at %s:%d\nHINT: launch with mpirun from the same MPI the binary was built with", msg,
         call, file, line);
}
#define mpiCheck(call) mpi_check((call), #call, __FILE__, __LINE__)
#endif

// The memory the run needs in all, printed at start and repeated if an allocation fails.
static size_t g_memory_estimate = 0;
// what to change when memory runs out (generation replaces the training advice)
static const char* g_memory_hint = "use a smaller micro-batch -b (raise -d to keep the total batch through gradient "
                                   "accumulation) or a shorter sequence -t";
// Device memory in use once the CUDA context exists, before the trainer's first allocation: used memory minus this is
// what the run took, library state (cuBLASLt, NCCL) and lazily loaded kernel code included.
static size_t g_memory_baseline = 0;
// Activation recompute level of the models built next (-r): 0 keeps every activation of the forward; 1 keeps the
// residual stream and the matmul and attention outputs, and the backward recomputes the element-wise and normalisation
// outputs of each layer from them.
static int g_recompute = 0;

// used device memory as the driver reports it (total - free), the context included
static size_t gpu_memory_used(void) {
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    return total_b - free_b;
}

static void* gpu_malloc(size_t bytes, const char* what) {
    void* p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes > 0 ? bytes : 1);
    if (err == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        fail("out of GPU memory allocating %s (%.1f MiB); the run needs about %.1f MiB, the GPU has "
             "%.1f MiB free of %.1f MiB\nHINT: %s", what, bytes / 1048576.0, g_memory_estimate / 1048576.0,
             free_b / 1048576.0, total_b / 1048576.0, g_memory_hint);
    }
    cudaCheck(err);
    return p;
}

// lets the kernel (the variadic argument: its template arguments' commas pass through) take `bytes` of dynamic shared
// memory; a per-device attribute, so launchers set it on every call (microseconds)
#define smem_limit(bytes, ...) \
    cuda_check(cudaFuncSetAttribute(__VA_ARGS__, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(bytes)), \
               "smem_limit(" #__VA_ARGS__ ")", __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// device and cuBLASLt setup

static cublasLtHandle_t g_lt;
static void* g_workspace;
static const size_t WORKSPACE_BYTES = 32u << 20;
static cudaDeviceProp g_prop;

// returns 0 (with the reason in `why`) when there is no usable GPU
static int gpu_available(char* why, size_t n) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, n, "%s", cudaGetErrorString(err));
        return 0;
    }
    if (count == 0) { snprintf(why, n, "no CUDA device"); return 0; }
    return 1;
}

// local_rank picks the GPU among the visible ones (modulo their count, so that one visible GPU per process also works)
static void gpu_init_device(int local_rank) {
    char why[256];
    if (!gpu_available(why, sizeof(why))) {
        fail("no CUDA GPU found (%s)\nHINT: on a machine without a GPU use the CPU twin: make train_fox "
             "and run ./train_fox with the same flags", why);
    }
    int count = 0;
    cudaCheck(cudaGetDeviceCount(&count));
    int device = local_rank % count;
    cudaCheck(cudaSetDevice(device));
    cudaCheck(cudaGetDeviceProperties(&g_prop, device));
    if (g_prop.major != 9) {
        fail("GPU '%s' has compute capability %d.%d; this build targets sm_90 (H100 / H200)\nHINT: "
             "rebuild with -gencode for your GPU, or use the CPU twin", g_prop.name, g_prop.major, g_prop.minor);
    }
    cudaCheck(cudaFree(0)); // creates the context, which is not the run's memory
    g_memory_baseline = gpu_memory_used();
    cublasCheck(cublasLtCreate(&g_lt));
    g_workspace = gpu_malloc(WORKSPACE_BYTES, "cuBLASLt workspace");
}

static void gpu_init(void) { gpu_init_device(0); } // single process: the tests and the evaluation modes

// dense bf16 peak of the GPU in FLOP/s, recognised by name; 0 when unknown
static double gpu_peak_flops(void) {
    if (strstr(g_prop.name, "H200") != NULL) { return 989e12; }
    if (strstr(g_prop.name, "H100") != NULL && strstr(g_prop.name, "PCIe") == NULL &&
        strstr(g_prop.name, "NVL") == NULL) { return 989e12; }
    return 0.0;
}

// ----------------------------------------------------------------------------
// device helpers shared by the kernels: reductions (warp shuffles in a fixed pattern, so every lane gets the same bits
// every run), grid sizes, the 16-byte packs, the per-head lanes. The kernels' convention: a backward kernel writes (=)
// its input gradient unless it says it accumulates.

__device__ static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) { v += __shfl_xor_sync(0xffffffffu, v, o); }
    return v;
}

__device__ static inline float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) { v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o)); }
    return v;
}

// v reduced by op over a block of up to 1024 threads (blockDim a multiple of 32): each warp by shuffles, then the
// warps' results (identity past the last warp); every thread gets the result. red: 32 entries of shared scratch.
template <typename TV, typename Op>
__device__ static TV block_reduce(TV v, TV* red, TV identity, Op op) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int o = 16; o > 0; o /= 2) { v = op(v, __shfl_xor_sync(0xffffffffu, v, o)); }
    __syncthreads();
    if (lane == 0) { red[warp] = v; }
    __syncthreads();
    v = lane < warps ? red[lane] : identity;
    for (int o = 16; o > 0; o /= 2) { v = op(v, __shfl_xor_sync(0xffffffffu, v, o)); }
    return v;
}
__device__ static float block_sum(float v, float* red) {
    return block_reduce(v, red, 0.0f, [](float a, float b) { return a + b; });
}
__device__ static float block_max(float v, float* red) {
    return block_reduce(v, red, -INFINITY, [](float a, float b) { return fmaxf(a, b); });
}

__device__ static inline float sigmoid_gpu(float x) { return 1.0f / (1.0f + expf(-x)); }

// log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): finite for every finite x
__device__ static inline float logsigmoid_gpu(float x) { return fminf(x, 0.0f) - log1pf(expf(-fabsf(x))); }

#define WARPS_PER_BLOCK 8
#define MAX_HD 256                  // head size limit of the per-head kernels
#define MAX_HD_LANE (MAX_HD / 32)   // per-lane registers for one head row

// blocks of WARPS_PER_BLOCK warps for one warp a row; blocks of 256 threads for one thread an element
static unsigned warp_blocks(size_t rows) { return (unsigned)ceil_div(rows, WARPS_PER_BLOCK); }
static unsigned elem_blocks(size_t n) { return (unsigned)ceil_div(n, 256); }

#define LOG2E 1.4426950408889634f
// 2^x in one MUFU.EX2 (ex2.approx: relative error < 2^-22); denormal results flush to zero
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// 16 bytes of floatX, the unit of the vectorised loads and stores: logits rows (Vp is a multiple of 128) and (N, C)
// activations (gpu_config_problem requires C to be a multiple of XPACK) start 16-byte aligned and hold whole packs
#define XPACK (16 / (int)sizeof(floatX))
typedef struct __align__(16) { floatX v[XPACK]; } PackX;

// four floatX, the store unit of the RMSNorm kernels' float4 columns
typedef struct __align__(4 * sizeof(floatX)) { floatX v[4]; } Pack4X;

// n consecutive floats from p (n a multiple of 4): 16-byte loads when p is 16-byte aligned, else one at a time (a
// weight tensor's offset in the flat buffer need not be a multiple of 4). The per-channel scales of the norms are read
// this way, so that their loads are not the kernels' bound.
template <int n>
__device__ static inline void load_floats(float* out, const float* p) {
    if (((uintptr_t)p & 15) == 0) {
        #pragma unroll
        for (int k = 0; k < n; k += 4) {
            float4 v = *(const float4*)(p + k);
            out[k] = v.x; out[k + 1] = v.y; out[k + 2] = v.z; out[k + 3] = v.w;
        }
    } else {
        #pragma unroll
        for (int k = 0; k < n; k++) { out[k] = p[k]; }
    }
}

// The per-head kernels give each (token, head) row of hd values G consecutive lanes (G a power of two, at most 32, so a
// row never straddles warps); lane j holds the packs at j * XPACK and hd/2 + j * XPACK, so RoPE's pairs (i, i + hd/2)
// meet in one lane and every load is 16 bytes (gpu_config_problem: hd % (2 * XPACK) == 0, hd <= MAX_HD).
#define HEAD_THREADS 256
static int head_lanes(int hd) {
    int G = 1;
    while (G * 2 * XPACK < hd) { G *= 2; }
    return G;
}
static unsigned head_blocks(size_t rows, int G) { return (unsigned)ceil_div(rows * G, HEAD_THREADS); }

// sum over the G lanes of a row; every lane of the warp must call it
__device__ static inline float group_sum(float v, int G) {
    for (int o = G / 2; o > 0; o /= 2) { v += __shfl_xor_sync(0xffffffffu, v, o); }
    return v;
}

// a per-head RMSNorm's 1 / sqrt(mean(x^2) + eps) from the lanes' sums of squares ss, written to rstd[row] by the row's
// first lane (store); 1 when the norm is off (every lane of the warp calls it, norm or not)
__device__ static inline float head_rstd(float ss, int norm, float* rstd, size_t row, int store, int hd, float eps,
                                         int G) {
    if (!norm) { return 1.0f; }
    float s = 1.0f / sqrtf(group_sum(ss, G) / (float)hd + eps);
    if (store) { rstd[row] = s; }
    return s;
}

// Documents kept apart (-f 1; dev/fox.md, "Documents kept apart") as the kernels read them: for token n = (b, t) of a
// (B, T) batch, start[n] the position in sequence b of its document's first token (the twin's document_starts) and
// end[n] one past its last: the next document start after t, or T. A kernel that takes them has a template flag DOCS
// whose false instance is its code without documents; its launcher takes a FoxDocs pointer, NULL without documents.
typedef struct { const int* start; const int* end; } FoxDocs;
static FoxDocs docs_or_none(const FoxDocs* docs) {
    FoxDocs none = {NULL, NULL};
    return docs != NULL ? *docs : none;
}
// whether token n, at position t of its sequence, starts a document after the sequence's start
__device__ static inline bool doc_starts_at(const FoxDocs& docs, size_t n, int t) {
    return t > 0 && docs.start[n] == t;
}

// ----------------------------------------------------------------------------
// encoder: the token embedding and its gradient

__global__ void encoder_forward_kernel(float* out, const int* tokens, const float* wte, size_t N, int C) {
    // out (N, C) = wte[tokens], from the fp32 master embedding: the residual stream is fp32
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C) { return; }
    size_t n = idx / C, c = idx % C;
    out[idx] = wte[(size_t)tokens[n] * C + c];
}

// encoder backward, deterministic: each thread sums one column over a token's positions in increasing order (a CSR list
// built on the host), as the twin does. Block (distinct token, ENC_BWD_COLS columns): a frequent token (thousands of
// positions) is spread over C / ENC_BWD_COLS blocks instead of one.
#define ENC_BWD_COLS 64
__global__ void encoder_backward_kernel(float* dwte, const float* dout, const int* token_ids, const int* offsets,
                                        const int* positions, int C) {
    // forward: out_n = wte[tokens_n]  =>  dwte[v] += sum over n with tokens_n = v of dout_n
    int u = blockIdx.x, tok = token_ids[u], c = blockIdx.y * ENC_BWD_COLS + threadIdx.x;
    if (c >= C) { return; }
    int e0 = offsets[u], e1 = offsets[u + 1];
    float acc = 0.0f;
    #pragma unroll 4
    for (int e = e0; e < e1; e++) { acc += dout[(size_t)positions[e] * C + c]; }
    dwte[(size_t)tok * C + c] += acc;
}

// out (N, C) = wte[tokens], on `stream` (generation's; the trainer's default stream otherwise)
static void encoder_forward_gpu(float* out, const int* tokens, const float* wte, size_t N, int C,
                                cudaStream_t stream = 0) {
    encoder_forward_kernel<<<elem_blocks(N * C), 256, 0, stream>>>(out, tokens, wte, N, C);
    launchCheck();
}

// dwte += the gradient of the `distinct` tokens of the CSR lists token_ids, offsets, positions
static void encoder_backward_gpu(float* dwte, const float* dout, const int* token_ids, const int* offsets,
                                 const int* positions, int distinct, int C) {
    dim3 grid((unsigned)distinct, (unsigned)ceil_div(C, ENC_BWD_COLS));
    encoder_backward_kernel<<<grid, ENC_BWD_COLS>>>(dwte, dout, token_ids, offsets, positions, C);
    launchCheck();
}

// ----------------------------------------------------------------------------
// matmuls: cuBLASLt, fp32 accumulation. Everything is row-major on our side; cuBLASLt is column-major, so a row-major
// (R, C) matrix is a column-major (C, R) one.
// D (m, n) = op(A) op(B) + beta C in column-major terms; C and D are floatX or fp32.
// Tuning (-X 1): the heuristic ranks its candidates by a model, and at these shapes a later one is often faster.
// gpu_tune_matmuls runs one forward and backward whose results are thrown away; each plan's first use in it times the
// candidates on the call's own operands and keeps the fastest that sums as the first choice does (its split-K count and
// reduction scheme, and its bits: digests of D at beta 0 and at beta 1 onto a fixed C), so tuning changes the speed,
// never the results: same seed, same bits, tuned or not, on every rank.
#define MATMUL_CANDIDATES 8

typedef struct {
    int m, n, k, trans_a, trans_b, ldb; // ldb: B's leading dimension (a column block of a wider matrix)
    cudaDataType_t a_type, b_type, d_type; // operands floatX, or FP8 (E4M3 / E5M2, both K-major: -q)
    unsigned align[4];
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
    cublasLtMatmulAlgo_t algo;                         // the one used: the first candidate until tuned
    cublasLtMatmulAlgo_t cand[MATMUL_CANDIDATES];
    int num_cand, tuned, calls;                        // calls: in the tuning step
    int ran;                                           // cuBLASLt ran algo once (matmul_run_first)
    float first_ms, tuned_ms;
} MatmulPlan;

static int g_tuning = 0;    // inside gpu_tune_matmuls: a plan's first call tunes it

#define MAX_MATMUL_PLANS 512
static MatmulPlan g_plans[MAX_MATMUL_PLANS];
static int g_num_plans = 0;

// largest power of two (up to 256) dividing the address: cuBLASLt assumes 256 unless told
static unsigned ptr_alignment(const void* p) {
    unsigned a = 256;
    while (a > 1 && (uintptr_t)p % a != 0) { a /= 2; }
    return a;
}

// drops the plans (all, or the untuned ones only: the training step's tuned plans outlive the shapes that sampling
// meets once per length)
static void matmul_plans_drop(int keep_tuned) {
    int kept = 0;
    for (int i = 0; i < g_num_plans; i++) {
        MatmulPlan* p = &g_plans[i];
        if (keep_tuned && p->tuned) {
            g_plans[kept++] = *p;
            continue;
        }
        cublasCheck(cublasLtMatmulDescDestroy(p->desc));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->a));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->b));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->c));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->d));
    }
    g_num_plans = kept;
}

// FP8 operands' dequantisation scales (device pointers): D = a_scale b_scale (A B) + beta C. Set before the heuristic
// (an algorithm chosen without them refuses to run with them) and again at every call (another layer's scales).
static void matmul_scales(cublasLtMatmulDesc_t desc, const float* a_scale, const float* b_scale) {
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
}

// Descriptors and algorithm for one shape, made once and reused (the heuristic query costs more than many small
// matmuls).

static MatmulPlan* matmul_plan(int m, int n, int k, int trans_a, int trans_b, int ldb, cudaDataType_t a_type,
                               cudaDataType_t b_type, cudaDataType_t d_type, const unsigned align[4],
                               const float* a_scale, const float* b_scale) {
    for (int i = 0; i < g_num_plans; i++) {
        MatmulPlan* p = &g_plans[i];
        if (p->m == m && p->n == n && p->k == k && p->trans_a == trans_a && p->trans_b == trans_b && p->ldb == ldb &&
            p->a_type == a_type && p->b_type == b_type && p->d_type == d_type &&
            memcmp(p->align, align, sizeof(p->align)) == 0) { return p; }
    }
    if (g_num_plans == MAX_MATMUL_PLANS) { matmul_plans_drop(1); } // sampling meets a new shape per length
    if (g_num_plans == MAX_MATMUL_PLANS) { matmul_plans_drop(0); }
    MatmulPlan* p = &g_plans[g_num_plans];
    p->m = m; p->n = n; p->k = k; p->trans_a = trans_a; p->trans_b = trans_b; p->ldb = ldb;
    p->a_type = a_type; p->b_type = b_type; p->d_type = d_type;
    memcpy(p->align, align, sizeof(p->align));
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (a_scale != NULL) { // FP8: scales, and fast accumulation off (it loses up to 1.5e-2 over long sums)
        int8_t fast = 0;
        matmul_scales(p->desc, a_scale, b_scale);
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    }
    // stored shapes: op(A) is (m, k), op(B) is (k, n)
    cublasCheck(cublasLtMatrixLayoutCreate(&p->a, a_type, trans_a ? k : m, trans_a ? m : k, trans_a ? k : m));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->b, b_type, trans_b ? n : k, trans_b ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->c, d_type, m, n, m));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->d, d_type, m, n, m));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        uint32_t a = align[i];
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &a, sizeof(a)));
    }
    cublasLtMatmulHeuristicResult_t result[MATMUL_CANDIDATES];
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->a, p->b, p->c, p->d, pref, MATMUL_CANDIDATES, result,
                                               &found));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0) {
        fail("cuBLASLt has no algorithm for a %dx%dx%d matmul (transa %d, transb %d, ldb %d)\nHINT: unusual "
             "model sizes can trip cuBLASLt; try n_embd and mlp_hidden multiples of 8", m, n, k, trans_a, trans_b, ldb);
    }
    p->num_cand = 0; // a result is valid only with state SUCCESS
    for (int i = 0; i < found; i++) {
        if (result[i].state == CUBLAS_STATUS_SUCCESS && result[i].workspaceSize <= WORKSPACE_BYTES) {
            p->cand[p->num_cand++] = result[i].algo;
        }
    }
    if (p->num_cand == 0) {
        fail("cuBLASLt has no usable algorithm for a %dx%dx%d matmul (transa %d, transb %d, types %d x %d -> %d)"
             BUG_HINT, m, n, k, trans_a, trans_b, (int)a_type, (int)b_type, (int)d_type);
    }
    p->algo = p->cand[0];
    p->tuned = 0; p->calls = 0; p->ran = 0;
    g_num_plans++;
    return p;
}

// a 64-bit digest of n 16-bit words of device memory: an integer sum of position-mixed words (integer addition is
// associative: the same bits give the same digest in any order)
__device__ unsigned long long g_digest;
__global__ void digest_kernel(const uint16_t* w, size_t n) {
    unsigned long long acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long x = ((unsigned long long)w[i] << 40 | (i & 0xffffffffffull)) * 0x9E3779B97F4A7C15ull;
        acc += x ^ (x >> 29);
    }
    atomicAdd(&g_digest, acc);
}

static unsigned long long digest_gpu(const void* p, size_t bytes) {
    unsigned long long zero = 0, h = 0;
    cudaCheck(cudaMemcpyToSymbol(g_digest, &zero, sizeof(zero)));
    digest_kernel<<<264, 256>>>((const uint16_t*)p, bytes / 2);
    launchCheck();
    cudaCheck(cudaMemcpyFromSymbol(&h, g_digest, sizeof(h)));
    return h;
}

// a fixed, finite pattern in [-0.5, 0.5) (the C that a beta-1 check adds onto)
template<typename T>
__global__ void pattern_kernel(T* d, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { d[i] = (T)((float)((uint32_t)(i * 2654435761u) >> 20) * (1.0f / 4096.0f) - 0.5f); }
}

// d (n values of d_type: fp32 or floatX) = the pattern
static void pattern_gpu(void* d, cudaDataType_t d_type, size_t n) {
    unsigned blocks = (unsigned)ceil_div(n, 256);
    if (d_type == CUDA_R_32F) { pattern_kernel<float><<<blocks, 256>>>((float*)d, n); }
    else { pattern_kernel<floatX><<<blocks, 256>>>((floatX*)d, n); }
    launchCheck();
}

// D = A B + beta C with plan p and algorithm algo, on the thread's default stream
static cublasStatus_t matmul_run(const MatmulPlan* p, const cublasLtMatmulAlgo_t* algo, void* d, const void* c,
                                 const void* a, const void* b, float beta) {
    float alpha = 1.0f;
    return cublasLtMatmul(g_lt, p->desc, &alpha, a, p->a, b, p->b, &beta, c, p->c, d, p->d, algo, g_workspace,
                          WORKSPACE_BYTES, cudaStreamPerThread);
}

// drops the plan's first candidate (cuBLASLt refused it); the next becomes the one used
static void matmul_drop_first(MatmulPlan* p) {
    for (int i = 1; i < p->num_cand; i++) { p->cand[i - 1] = p->cand[i]; }
    p->num_cand--;
    p->algo = p->cand[0];
}

// The plan's call with its algorithm. Until one has run, a candidate that cuBLASLt refuses at run time (NOT_SUPPORTED:
// some FP8 candidates of the heuristic are) is dropped and the next tried on the same operands: a refusal launches
// nothing, so D is untouched. cand[0] stays the first that runs (matmul_tune's reference).
static cublasStatus_t matmul_run_first(MatmulPlan* p, void* d, const void* c, const void* a, const void* b,
                                       float beta) {
    cublasStatus_t st = matmul_run(p, &p->algo, d, c, a, b, beta);
    while (!p->ran && st == CUBLAS_STATUS_NOT_SUPPORTED && p->num_cand > 1) {
        matmul_drop_first(p);
        st = matmul_run(p, &p->algo, d, c, a, b, beta);
    }
    p->ran = p->ran || st == CUBLAS_STATUS_SUCCESS;
    return st;
}

// candidate i's bits on the call's operands: the digest of D after D = A B (beta 0) and after D = A B + pattern
// (beta 1, C = D: where an algorithm adds C in its reduction shows); false when cuBLASLt refuses the candidate
static int matmul_candidate_bits(const MatmulPlan* p, int i, void* d, const void* a, const void* b,
                                 unsigned long long digest[2]) {
    size_t n = (size_t)p->m * p->n, bytes = n * (p->d_type == CUDA_R_32F ? sizeof(float) : sizeof(floatX));
    for (int k = 0; k < 2; k++) {
        if (k == 1) { pattern_gpu(d, p->d_type, n); }
        if (matmul_run(p, &p->cand[i], d, d, a, b, (float)k) != CUBLAS_STATUS_SUCCESS) {
            cudaGetLastError();
            return 0;
        }
        digest[k] = digest_gpu(d, bytes);
    }
    return 1;
}

// ms per call of candidate i on the operands (beta 0, D written), over 5 calls
static float matmul_time_candidate(const MatmulPlan* p, int i, void* d, const void* a, const void* b) {
    float ms = 0.0f;
    cudaEvent_t t0, t1;
    cudaCheck(cudaEventCreate(&t0)); cudaCheck(cudaEventCreate(&t1));
    cudaCheck(cudaEventRecord(t0));
    for (int r = 0; r < 5; r++) { cublasCheck(matmul_run(p, &p->cand[i], d, d, a, b, 0.0f)); }
    cudaCheck(cudaEventRecord(t1));
    cudaCheck(cudaEventSynchronize(t1));
    cudaCheck(cudaEventElapsedTime(&ms, t0, t1));
    cudaCheck(cudaEventDestroy(t0)); cudaCheck(cudaEventDestroy(t1));
    return ms / 5.0f;
}

// the split-K count and reduction scheme of an algorithm (where the partial sums meet)
static void algo_reduction(const cublasLtMatmulAlgo_t* algo, int32_t* splitk, uint32_t* scheme) {
    size_t written = 0;
    *splitk = 1; *scheme = 0;
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, splitk, sizeof(*splitk),
                                                     &written));
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme,
                                                     sizeof(*scheme), &written));
}

// p's fastest candidate that sums as the first does (same split-K count, reduction scheme and bits); overwrites D
static void matmul_tune(MatmulPlan* p, void* d, const void* a, const void* b) {
    unsigned long long first[2], bits[2];
    int32_t splitk0, splitk;
    uint32_t scheme0, scheme;
    while (!matmul_candidate_bits(p, 0, d, a, b, first)) { // a refused first candidate: the next (matmul_run_first)
        if (p->num_cand == 1) {
            fail("cuBLASLt refused every algorithm for a %dx%dx%d matmul" BUG_HINT, p->m, p->n, p->k);
        }
        matmul_drop_first(p);
    }
    algo_reduction(&p->cand[0], &splitk0, &scheme0);
    p->first_ms = p->tuned_ms = matmul_time_candidate(p, 0, d, a, b);
    for (int i = 1; i < p->num_cand; i++) {
        algo_reduction(&p->cand[i], &splitk, &scheme);
        if (splitk != splitk0 || scheme != scheme0 || !matmul_candidate_bits(p, i, d, a, b, bits) ||
            bits[0] != first[0] || bits[1] != first[1]) {
            continue;
        }
        float ms = matmul_time_candidate(p, i, d, a, b);
        if (TEST_HOOK(tune_last, 0) || ms < p->tuned_ms) {
            p->tuned_ms = ms;
            p->algo = p->cand[i];
        }
    }
    p->tuned = 1;
}

// The plan of a matmul with operands of types a_type, b_type (their scales by device pointer when FP8), tuned in the
// tuning step; ldb 0: B is dense (its leading dimension the stored rows)
static void matmul_typed(void* d, cudaDataType_t d_type, const void* c, const void* a, cudaDataType_t a_type,
                         const float* a_scale, const void* b, cudaDataType_t b_type, const float* b_scale, int m,
                         int n, int k, int trans_a, int trans_b, int ldb, float beta) {
    const void* c_ptr = c != NULL ? c : d;
    unsigned align[4] = {ptr_alignment(a), ptr_alignment(b), ptr_alignment(c_ptr), ptr_alignment(d)};
    if (ldb == 0) { ldb = trans_b ? n : k; }
    MatmulPlan* p = matmul_plan(m, n, k, trans_a, trans_b, ldb, a_type, b_type, d_type, align, a_scale, b_scale);
    if (a_scale != NULL) { matmul_scales(p->desc, a_scale, b_scale); }
    if (g_tuning) {
        if (!p->tuned) { matmul_tune(p, d, a, b); }
        p->calls++;
    }
    cublasCheck(matmul_run_first(p, d, c_ptr, a, b, beta));
}

static void matmul_lt(void* d, cudaDataType_t d_type, const void* c, const floatX* a, const floatX* b,
                      int m, int n, int k, int trans_a, int trans_b, int ldb, float beta) {
    matmul_typed(d, d_type, c, a, CUDA_R_X, NULL, b, CUDA_R_X, NULL, m, n, k, trans_a, trans_b, ldb, beta);
}

// out (N, OC) = inp (N, IC) @ w (OC, IC)^T, plus `add` (N, OC) when given (the residual)
static void matmul_forward_gpu(void* out, cudaDataType_t out_type, const void* add, const floatX* inp,
                               const floatX* w, size_t N, int IC, int OC) {
    matmul_lt(out, out_type, add, w, inp, OC, (int)N, IC, 1, 0, 0, add != NULL ? 1.0f : 0.0f);
}

// backward of out = inp @ w^T: dinp (N, IC) (+)= dout @ w;  dw (OC, IC) += dout^T @ inp (fp32)
static void matmul_backward_input_gpu(void* dinp, cudaDataType_t dinp_type, const floatX* dout, const floatX* w,
                                      size_t N, int IC, int OC, float beta) {
    matmul_lt(dinp, dinp_type, NULL, w, dout, IC, (int)N, OC, 0, 0, 0, beta);
}

static void matmul_backward_weight_gpu(float* dw, const floatX* dout, const floatX* inp, size_t N, int IC, int OC) {
    matmul_lt(dw, CUDA_R_32F, NULL, inp, dout, IC, OC, (int)N, 0, 1, 0, 1.0f);
}

// ----------------------------------------------------------------------------
// FP8 operands (-q; the twin's "FP8 numerics" is their specification): an operand x of scale 2^k is stored as the
// codes enc(x 2^k), E4M3 or E5M2, rounded to nearest even and saturating (__NV_SATFINITE: a finite value past the
// largest code and +-inf give the largest code, NaN stays NaN), the twin's fp8_encode; 2^k is exact, so the codes are
// the twin's bit for bit. An amax is the max |x| as fp32 bits, which order as unsigned integers with NaN above inf:
// each block (or warp) reduces its own, then one atomicMax. A max of integers is exact and order-free, so the result
// is the same bits whatever the blocks' order (no sum is formed). Hopper's FP8 matmuls take both operands K-major:
// out (N, M) = x (N, K) w (M, K)^T (matmul_fp8_gpu); an input gradient reads the weights' transposed copy.
#include <cuda_fp8.h>
#define FP8_TILE 64 // the weights' cast's tile: 64 x 64 values through shared memory (fp8_weights_cast_kernel)

__device__ static inline uint8_t fp8_code(float x, int e5m2) {
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

// a code's value, exact (every FP8 value is a half)
__device__ static inline float fp8_value(uint8_t c, int e5m2) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, e5m2 ? __NV_E5M2 : __NV_E4M3);
    return __half2float(__half(h));
}

// the codes of a and b as two bytes, a's low: one conversion for the pair (fp8_code of each, the same bits)
__device__ static inline uint32_t fp8_code2(float a, float b, int e5m2) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

// the values of the two codes in c's low 16 bits (fp8_value of each), the low byte's in .x
__device__ static inline float2 fp8_value2(uint32_t c, int e5m2) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)c, e5m2 ? __NV_E5M2 : __NV_E4M3);
    return __half22float2(__half2(h));
}

// 2^k as a float, |k| <= 126 (the twin's fp8_pow2)
__host__ __device__ static inline float fp8_pow2_gpu(int k) {
    uint32_t u = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

// the warp's max of the magnitude bits mx into *amax (every active lane calls it); for kernels that end early. The
// atomic only where the max read is smaller: *amax only grows, so a stale read costs an atomic, never a wrong max,
// and most of a launch's warps (millions of rows) skip the one address's queue.
__device__ static void fp8_warp_amax(unsigned mx, unsigned* amax) {
    unsigned active = __activemask();
    mx = __reduce_max_sync(active, mx);
    if ((threadIdx.x % 32) == (unsigned)(__ffs(active) - 1) && mx > __ldcg(amax)) { atomicMax(amax, mx); }
}

// the block's max of the magnitude bits mx into *amax: one atomic a block (a warp's each, for elementwise kernels of
// millions of warps, would queue on the one address); every thread of the block calls it; nothing when amax is NULL
__device__ static void fp8_block_amax(unsigned mx, unsigned* amax) {
    __shared__ unsigned red[32];
    if (amax == NULL) { return; }
    mx = block_reduce(mx, red, 0u, [](unsigned a, unsigned b) { return a > b ? a : b; });
    if (threadIdx.x == 0) { atomicMax(amax, mx); }
}

// An FP8 epilogue (-q) of a kernel that writes floatX values, its producer: with codes, each value's code at scale
// 2^(*k) into codes at the value's index, and with round the value replaced by the one its code stands for (the
// operand then feeds only matmuls that read it rounded); with amax, the max |value| into *amax (at the kernel's
// end: fp8_block_amax, or fp8_warp_amax where warps end early). The codes come from the floatX value, as
// fp8_cast_kernel's from a stored tensor: the same bits. With codes_t (and codes) the same codes token-major too, for
// a weight gradient's FP8 matmul (K = the tokens): value (n, c) of a (rows, W) output at codes_t[c rows + n]
// (fp8_stage_write); then with drop the floatX values are not stored at all (they feed only FP8 matmuls).
typedef struct { uint8_t *codes, *codes_t; const int* k; int e5m2, round, drop; unsigned* amax; } Fp8Out;

// b when second, else a, field by field (a select of the whole struct would copy both to local memory)
__device__ static inline Fp8Out fp8_pick(const Fp8Out& a, const Fp8Out& b, bool second) {
    Fp8Out q;
    q.codes = second ? b.codes : a.codes; q.codes_t = second ? b.codes_t : a.codes_t;
    q.k = second ? b.k : a.k; q.e5m2 = second ? b.e5m2 : a.e5m2;
    q.round = second ? b.round : a.round; q.drop = second ? b.drop : a.drop; q.amax = second ? b.amax : a.amax;
    return q;
}

// the epilogue on M values v that sit at index i (a multiple of M) of the output, their max folded into *mx; returns
// the M codes as M bytes, little-endian (zeros without codes)
template <int M>
__device__ static inline uint2 fp8_pack(const Fp8Out& q, floatX* v, size_t i, unsigned* mx) {
    if (q.amax != NULL) {
        #pragma unroll
        for (int j = 0; j < M; j++) {
            unsigned a = __float_as_uint(to_float(v[j])) & 0x7FFFFFFFu;
            *mx = a > *mx ? a : *mx;
        }
    }
    if (q.codes == NULL) { return make_uint2(0u, 0u); }
    float up = fp8_pow2_gpu(*q.k), down = fp8_pow2_gpu(-*q.k);
    uint32_t w[(M + 3) / 4] = {}; // the codes, little-endian, stored as M-byte words (i is M-aligned; M = 4 or 8)
    #pragma unroll
    for (int j = 0; j < M; j += 2) {
        uint32_t c = fp8_code2(to_float(v[j]) * up, to_float(v[j + 1]) * up, q.e5m2);
        w[j / 4] |= c << (8 * (j % 4));
        if (q.round) {
            float2 r = fp8_value2(c, q.e5m2);
            v[j] = to_floatX(r.x * down); v[j + 1] = to_floatX(r.y * down);
        }
    }
    static_assert(M == 4 || M == 8, "fp8_pack stores 4 or 8 codes");
    if (M == 4) { *(uint32_t*)(q.codes + i) = w[0]; }
    else { *(uint2*)(q.codes + i) = make_uint2(w[0], w[(M + 3) / 4 - 1]); }
    return make_uint2(w[0], M == 4 ? 0u : w[(M + 3) / 4 - 1]);
}

// Token-major codes (Fp8Out.codes_t) from a block that produces rows r0 .. r0 + FP8_TM_ROWS - 1 of an output (r0 a
// multiple of FP8_TM_ROWS, as rows is): each row's codes of columns c0 .. c0 + W - 1 go into stage (FP8_TM_ROWS, S)
// bytes (S >= W) as they are stored row-major (fp8_stage_put); after a __syncthreads the block writes column c's
// codes as one 32-byte sector at codes_t[c rows + r0] (fp8_stage_write: two threads a sector, each 4 columns of 16
// rows: 16 words read, four 4 x 4 byte transposes, four 16-byte stores). W and S multiples of 4. Whole sectors, as a
// store of part of one is an L2 transaction of its own (the tile's height: dev/RESULTS.md, "FP8 matmuls").
#define FP8_TM_ROWS 32
template <int M>
__device__ static inline void fp8_stage_put(uint8_t* stage, int S, int r, int c, uint2 codes) {
    if (M == 4) { *(uint32_t*)(stage + r * S + c) = codes.x; }
    else { *(uint2*)(stage + r * S + c) = codes; }
}

// the 4 x 4 byte transpose: word j of out holds byte j of a, b, c, d (in that order, little-endian)
__device__ static inline void fp8_transpose4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t* out) {
    uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362); // a0 b0 a1 b1, a2 b2 a3 b3
    uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
    out[0] = __byte_perm(ab_lo, cd_lo, 0x5410); out[1] = __byte_perm(ab_lo, cd_lo, 0x7632);
    out[2] = __byte_perm(ab_hi, cd_hi, 0x5410); out[3] = __byte_perm(ab_hi, cd_hi, 0x7632);
}

// the block's columns c0 + c (c < W) of rows r0 .. r0 + FP8_TM_ROWS - 1 from stage (FP8_TM_ROWS, S) into codes_t
// (see fp8_stage_put): task t takes columns 4 (t / 2) .. + 3, rows 16 (t % 2) .. + 15
__device__ static void fp8_stage_write(uint8_t* codes_t, size_t rows, size_t r0, const uint8_t* stage, int S, int W,
                                       int c0) {
    static_assert(FP8_TM_ROWS == 32, "two 16-row halves a column");
    for (int t = threadIdx.x; t < W / 2; t += blockDim.x) {
        int c = 4 * (t / 2), h = 16 * (t % 2);
        uint32_t col[4][4]; // col[g][j]: rows h + 4g .. + 3 of column c + j
        #pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint8_t* p = stage + (size_t)(h + 4 * g) * S + c;
            fp8_transpose4(*(const uint32_t*)p, *(const uint32_t*)(p + S), *(const uint32_t*)(p + 2 * S),
                           *(const uint32_t*)(p + 3 * S), col[g]);
        }
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            *(uint4*)(codes_t + (size_t)(c0 + c + j) * rows + r0 + h) = make_uint4(col[0][j], col[1][j], col[2][j],
                                                                                  col[3][j]);
        }
    }
}

// codes_t (W, rows) = codes (rows, W) transposed, for an operand whose producers cannot write token-major codes
// themselves (dqkvg, dlogits): a block takes FP8_TM_ROWS rows of FP8_TRANSPOSE_W columns, in as 16-byte loads, out
// through fp8_stage_write. rows a multiple of FP8_TM_ROWS, W of 16 (the loads' alignment).
#define FP8_TRANSPOSE_W 256
__global__ void fp8_transpose_codes_kernel(uint8_t* codes_t, const uint8_t* codes, size_t rows, int W) {
    __shared__ __align__(16) uint8_t stage[FP8_TM_ROWS * FP8_TRANSPOSE_W];
    size_t r0 = (size_t)blockIdx.x * FP8_TM_ROWS;
    int c0 = blockIdx.y * FP8_TRANSPOSE_W, w = min(FP8_TRANSPOSE_W, W - c0);
    for (int i = threadIdx.x; i < FP8_TM_ROWS * FP8_TRANSPOSE_W / 16; i += blockDim.x) {
        int r = i / (FP8_TRANSPOSE_W / 16), c = 16 * (i % (FP8_TRANSPOSE_W / 16));
        if (c < w) { *(uint4*)(stage + r * FP8_TRANSPOSE_W + c) = *(const uint4*)(codes + (r0 + r) * W + c0 + c); }
    }
    __syncthreads();
    fp8_stage_write(codes_t, rows, r0, stage, FP8_TRANSPOSE_W, w, c0);
}

static void fp8_transpose_codes_gpu(uint8_t* codes_t, const uint8_t* codes, size_t rows, int W) {
    if (rows % FP8_TM_ROWS != 0 || W % 16 != 0) {
        fail("internal: a transpose of %zu x %d codes (rows %% %d, W %% 16)" BUG_HINT, rows, W, FP8_TM_ROWS);
    }
    dim3 grid((unsigned)(rows / FP8_TM_ROWS), (unsigned)ceil_div(W, FP8_TRANSPOSE_W));
    fp8_transpose_codes_kernel<<<grid, 256>>>(codes_t, codes, rows, W);
    launchCheck();
}

#ifndef ENABLE_FP32
// an input value as fp32 (exact); overloads, as floatX converts from float implicitly
__device__ static inline float fp8_in(float x) { return x; }
__device__ static inline float fp8_in(__nv_bfloat16 x) { return __bfloat162float(x); }

// the twin's fp8_scale_exp for an amax given as magnitude bits a, a format of largest exponent emax
__device__ static inline int fp8_scale_exp_gpu(unsigned a, int emax, int margin) {
    if (a == 0 || a >= 0x7F800000u) { return 0; }
    int k = emax - ((int)(a >> 23) - 127) - ((a & 0x7FFFFFu) > 0x600000u ? 1 : 0) - margin;
    return k < -FP8_K_MAX ? -FP8_K_MAX : k > FP8_K_MAX ? FP8_K_MAX : k;
}

// *amax = max(*amax, max |x|) over n values of T (float or floatX)
template <typename T>
__global__ void fp8_amax_kernel(unsigned* amax, const T* x, size_t n) {
    unsigned mx = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned a = __float_as_uint(fp8_in(x[i])) & 0x7FFFFFFFu;
        mx = a > mx ? a : mx;
    }
    fp8_block_amax(mx, amax);
}

// 8 values of x (fp32 or bf16) from x[0] as fp32 (x 16-byte aligned)
template <typename T>
__device__ static inline void fp8_load8(const T* x, float* v) {
    if constexpr (sizeof(T) == 4) {
        float4 a = *(const float4*)x, b = *(const float4*)(x + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
        uint4 u = *(const uint4*)x;
        const __nv_bfloat16* h = (const __nv_bfloat16*)&u;
        #pragma unroll
        for (int j = 0; j < 8; j++) { v[j] = __bfloat162float(h[j]); }
    }
}

// value i of the cast: its code (into codes) and rounded value (into rounded), each where not NULL; its magnitude
// folded into *mx
__device__ static inline void fp8_cast_one(uint8_t* codes, floatX* rounded, float v, size_t i, float up, float down,
                                           int e5m2, unsigned* mx) {
    unsigned a = __float_as_uint(v) & 0x7FFFFFFFu;
    *mx = a > *mx ? a : *mx;
    uint8_t c = fp8_code(v * up, e5m2);
    if (codes != NULL) { codes[i] = c; }
    if (rounded != NULL) { rounded[i] = (floatX)(fp8_value(c, e5m2) * down); }
}

// codes (n) = enc(x 2^k) and rounded (n) = dec(codes) 2^-k, the values the codes stand for (exact in floatX: at most
// 4 significant bits, within bf16's range); either may be NULL, rounded may be x. The amax of x (before rounding) into
// *amax unless NULL. k is read from the device (a scale slot), so a captured graph follows the scale. With vec (x and
// rounded 16-byte, codes 8-byte aligned) 8 values a thread, as one 16-byte load and 8- and 16-byte stores; the values
// past the last multiple of 8 (none in training: n is rows x a multiple of 16), and all without vec, one a thread.
template <typename T>
__global__ void fp8_cast_kernel(uint8_t* codes, floatX* rounded, const T* x, size_t n, const int* k, int e5m2,
                                unsigned* amax, int vec) {
    float up = fp8_pow2_gpu(*k), down = fp8_pow2_gpu(-*k);
    unsigned mx = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x, first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t n8 = vec ? n / 8 : 0;
    for (size_t g = first; g < n8; g += stride) {
        float v[8];
        fp8_load8(x + 8 * g, v);
        uint32_t w[2] = {0, 0};
        union { uint4 u; floatX h[8]; } r; // floatX is bf16 here
        #pragma unroll
        for (int j = 0; j < 8; j += 2) {
            unsigned a = __float_as_uint(v[j]) & 0x7FFFFFFFu, b = __float_as_uint(v[j + 1]) & 0x7FFFFFFFu;
            mx = a > mx ? a : mx; mx = b > mx ? b : mx;
            uint32_t c = fp8_code2(v[j] * up, v[j + 1] * up, e5m2);
            w[j / 4] |= c << (8 * (j % 4));
            float2 f = fp8_value2(c, e5m2);
            r.h[j] = (floatX)(f.x * down); r.h[j + 1] = (floatX)(f.y * down);
        }
        if (codes != NULL) { *(uint2*)(codes + 8 * g) = make_uint2(w[0], w[1]); }
        if (rounded != NULL) { *(uint4*)(rounded + 8 * g) = r.u; }
    }
    for (size_t i = 8 * n8 + first; i < n; i += stride) {
        fp8_cast_one(codes, rounded, fp8_in(x[i]), i, up, down, e5m2, &mx);
    }
    fp8_block_amax(mx, amax);
}

static unsigned fp8_blocks(size_t n) {
    size_t b = ceil_div(n, (size_t)256);
    return (unsigned)(b < 1024 ? (b > 0 ? b : 1) : 1024);
}

template <typename T>
static void fp8_amax_gpu(unsigned* amax, const T* x, size_t n) {
    fp8_amax_kernel<T><<<fp8_blocks(n), 256>>>(amax, x, n);
    launchCheck();
}

template <typename T>
static void fp8_cast_gpu(uint8_t* codes, floatX* rounded, const T* x, size_t n, const int* k, int e5m2,
                         unsigned* amax) {
    int vec = (uintptr_t)x % 16 == 0 && (uintptr_t)rounded % 16 == 0 && (uintptr_t)codes % 8 == 0;
    fp8_cast_kernel<T><<<fp8_blocks(n / (vec ? 8 : 1)), 256>>>(codes, rounded, x, n, k, e5m2, amax, vec);
    launchCheck();
}

// out (N, M) = x (N, K) @ w (M, K)^T + `add` (N, M) (or + out with beta 1) with FP8 operands, both K-major: w E4M3,
// x E4M3 or E5M2 (cuBLASLt has no E5M2 x E5M2), each dequantised by its device scale 2^-k; fp32 accumulation, out
// fp32 or floatX. K a multiple of 16 and 16-byte aligned operands (Hopper's FP8 matmuls).
static void matmul_fp8_gpu(void* out, cudaDataType_t out_type, const void* add, const uint8_t* x,
                           cudaDataType_t x_type, const float* x_scale, const uint8_t* w, const float* w_scale,
                           size_t N, int M, int K, float beta) {
    matmul_typed(out, out_type, add, w, CUDA_R_8F_E4M3, w_scale, x, x_type, x_scale, M, (int)N, K, 1, 0, 0,
                 add != NULL ? 1.0f : beta);
}
#endif

// a producer's token-major codes (Fp8Out.codes_t) need whole tiles of FP8_TM_ROWS rows (fp8_wgrad8_on checks both)
static void fp8_tm_check(size_t rows, int C, int max_c) {
    if (rows % FP8_TM_ROWS != 0 || C > max_c) {
        fail("internal: token-major FP8 codes of %zu rows x %d columns (rows %% %d == 0, C <= %d)" BUG_HINT, rows, C,
             FP8_TM_ROWS, max_c);
    }
}

// ----------------------------------------------------------------------------
// RMSNorm and column sums

// The RMSNorm kernels take one warp per row, lane the float4 columns c0 + 4 lane + 128 v of tile c0 (C % 4 == 0), and
// read the row in tiles of RMS_TILE(NV) columns (NV float4 per lane): both passes over a row (its sum of squares or dot
// product, then the outputs) use the tile kept in registers, so a row of up to RMS_TILE(NV) columns is read from memory
// once, with all its loads in flight together. Wider rows keep their last tile and read the others twice. The sums
// run in column order either way.
#define RMS_TILE(NV) (128 * (NV))

// NV float4 of row r (columns c0 + 4 lane + 128 v, those below C) into v4
template <int NV>
__device__ static inline void load_row_tile(float4* v4, const float* r, int c0, int lane, int C) {
    #pragma unroll
    for (int v = 0; v < NV; v++) {
        int i = c0 + lane * 4 + 128 * v;
        if (i < C) { v4[v] = *(const float4*)(r + i); }
    }
}

// one row of the RMSNorm forward (a warp's): out = x / sqrt(mean(x^2) + eps) * w, its FP8 epilogue's max into *mx;
// TM: its codes into row srow of stage (fp8_stage_put)
template <int NV, bool TM>
__device__ static inline void rmsnorm_forward_row(floatX* out, float* rstd, const float* x, const float* w, size_t row,
                                                  int C, float eps, const Fp8Out& q, unsigned* mx, uint8_t* stage,
                                                  int srow) {
    int lane = threadIdx.x % 32;
    const float* xr = x + row * C;
    float4 xv[NV];
    float ss = 0.0f;
    int last = 0; // the tile left in registers
    for (int c0 = 0; c0 < C; c0 += RMS_TILE(NV)) {
        load_row_tile<NV>(xv, xr, c0, lane, C);
        #pragma unroll
        for (int v = 0; v < NV; v++) {
            if (c0 + lane * 4 + 128 * v < C) {
                ss += xv[v].x * xv[v].x + xv[v].y * xv[v].y + xv[v].z * xv[v].z + xv[v].w * xv[v].w;
            }
        }
        last = c0;
    }
    ss = warp_sum(ss);
    float s = 1.0f / sqrtf(ss / (float)C + eps);
    for (int c0 = last; c0 >= 0; c0 -= RMS_TILE(NV)) {
        if (c0 != last) { load_row_tile<NV>(xv, xr, c0, lane, C); }
        #pragma unroll
        for (int v = 0; v < NV; v++) {
            int i = c0 + lane * 4 + 128 * v;
            if (i >= C) { continue; }
            float wi[4];
            load_floats<4>(wi, w + i);
            Pack4X o = {{to_floatX(xv[v].x * s * wi[0]), to_floatX(xv[v].y * s * wi[1]),
                         to_floatX(xv[v].z * s * wi[2]), to_floatX(xv[v].w * s * wi[3])}};
            uint2 codes = fp8_pack<4>(q, o.v, row * C + i, mx);
            if constexpr (TM) { fp8_stage_put<4>(stage, C, srow, i, codes); }
            if (!TM || !q.drop) { *(Pack4X*)(out + row * C + i) = o; }
        }
    }
    if (lane == 0) { rstd[row] = s; }
}

// out = x / sqrt(mean(x^2) + eps) * w for each row of the fp32 residual stream, a warp a row (q: out's FP8 epilogue,
// Fp8Out). TM: with its token-major codes; a block takes FP8_TM_ROWS rows (rows a multiple), staged through
// FP8_TM_ROWS C bytes of dynamic shared memory.
template <int NV, bool TM>
__global__ void rmsnorm_forward_kernel(floatX* out, float* rstd, const float* x, const float* w, size_t rows, int C,
                                       float eps, Fp8Out q) {
    extern __shared__ __align__(16) uint8_t stage[]; // TM: (FP8_TM_ROWS, C) codes, fp8_stage_put
    int warp = threadIdx.x / 32;
    unsigned mx = 0;
    if constexpr (TM) {
        size_t r0 = (size_t)blockIdx.x * FP8_TM_ROWS;
        for (int k = warp; k < FP8_TM_ROWS; k += WARPS_PER_BLOCK) {
            rmsnorm_forward_row<NV, TM>(out, rstd, x, w, r0 + k, C, eps, q, &mx, stage, k);
        }
        if (q.amax != NULL) { fp8_warp_amax(mx, q.amax); }
        __syncthreads();
        fp8_stage_write(q.codes_t, rows, r0, stage, C, C, 0);
    } else {
        size_t row = (size_t)blockIdx.x * WARPS_PER_BLOCK + warp;
        if (row >= rows) { return; }
        rmsnorm_forward_row<NV, TM>(out, rstd, x, w, row, C, eps, q, &mx, stage, 0);
        if (q.amax != NULL) { fp8_warp_amax(mx, q.amax); }
    }
}

// RMSNorm backward fused with the first stage of its scale gradient (a column sum, finished by
// colsum_finish_kernel), so dout and x are read once: one block per chunk of RMS_BWD_ROWS rows, warp w takes
// rows w, w + 8, ... of the chunk. Accumulates into the fp32 residual gradient and refreshes its matmul copy.
// TM: dresid_x's token-major codes too (q.codes_t), staged after the sums in FP8_TM_ROWS C more bytes of shared
// memory, a tile of FP8_TM_ROWS rows at a time (rows a multiple: every warp takes as many rows).
#define RMS_BWD_ROWS 64
#define RMS_BWD_MAX_C 7168 // shared memory: WARPS_PER_BLOCK * C floats of column sums
#define RMS_BWD_MAX_C_TM 3584 // and, with TM, FP8_TM_ROWS * C bytes of codes (Hopper: 227 KB a block)
template <int NV, bool TM>
__global__ void rmsnorm_backward_kernel(float* dresid, floatX* dresid_x, float* partial, const float* dout,
                                        const float* x, const float* w, const float* rstd, size_t rows, int C,
                                        Fp8Out q) {
    // forward: out_i = x_i s w_i, s = (mean(x^2) + eps)^(-1/2), ds/dx_i = -s^3 x_i / C
    // dx_i = s w_i dout_i - x_i s^3 / C * sum_j w_j dout_j x_j   (added to dresid)
    // dw_i = sum over rows of dout_i x_i s   (this chunk's part into partial (chunks, C))
    extern __shared__ float colsum[]; // (WARPS_PER_BLOCK, C): each warp's own column sums
    uint8_t* stage = (uint8_t*)(colsum + (size_t)WARPS_PER_BLOCK * C); // TM: (FP8_TM_ROWS, C) codes
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* acc = colsum + (size_t)warp * C;
    for (int i = lane * 4; i < C; i += 128) { *(float4*)(acc + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    size_t r0 = (size_t)blockIdx.x * RMS_BWD_ROWS, r1 = r0 + RMS_BWD_ROWS < rows ? r0 + RMS_BWD_ROWS : rows;
    unsigned mx = 0; // dresid_x's FP8 epilogue (q, Fp8Out)
    for (size_t row = r0 + warp; row < r1; row += WARPS_PER_BLOCK) {
        const float* xr = x + row * C;
        const float* dr = dout + row * C;
        float* gr = dresid + row * C;
        float s = rstd[row], dot = 0.0f;
        float4 xv[NV], dv[NV], g[NV];
        int last = 0; // the tile left in registers
        for (int c0 = 0; c0 < C; c0 += RMS_TILE(NV)) {
            load_row_tile<NV>(xv, xr, c0, lane, C);
            load_row_tile<NV>(dv, dr, c0, lane, C);
            #pragma unroll
            for (int v = 0; v < NV; v++) {
                int i = c0 + lane * 4 + 128 * v;
                if (i >= C) { continue; }
                float wi[4];
                load_floats<4>(wi, w + i);
                dot += wi[0] * dv[v].x * xv[v].x + wi[1] * dv[v].y * xv[v].y + wi[2] * dv[v].z * xv[v].z +
                       wi[3] * dv[v].w * xv[v].w;
            }
            last = c0;
        }
        load_row_tile<NV>(g, gr, last, lane, C); // in flight during the warp's sum
        dot = warp_sum(dot);
        float k = dot * s * s * s / (float)C;
        for (int c0 = last; c0 >= 0; c0 -= RMS_TILE(NV)) {
            if (c0 != last) {
                load_row_tile<NV>(xv, xr, c0, lane, C);
                load_row_tile<NV>(dv, dr, c0, lane, C);
                load_row_tile<NV>(g, gr, c0, lane, C);
            }
            #pragma unroll
            for (int v = 0; v < NV; v++) {
                int i = c0 + lane * 4 + 128 * v;
                if (i >= C) { continue; }
                float wi[4];
                load_floats<4>(wi, w + i);
                g[v].x += s * wi[0] * dv[v].x - xv[v].x * k;
                g[v].y += s * wi[1] * dv[v].y - xv[v].y * k;
                g[v].z += s * wi[2] * dv[v].z - xv[v].z * k;
                g[v].w += s * wi[3] * dv[v].w - xv[v].w * k;
                *(float4*)(gr + i) = g[v];
                Pack4X gx = {{to_floatX(g[v].x), to_floatX(g[v].y), to_floatX(g[v].z), to_floatX(g[v].w)}};
                uint2 codes = fp8_pack<4>(q, gx.v, row * C + i, &mx);
                if constexpr (TM) { fp8_stage_put<4>(stage, C, (int)((row - r0) % FP8_TM_ROWS), i, codes); }
                if (!TM || !q.drop) { *(Pack4X*)(dresid_x + row * C + i) = gx; }
                float4 a = *(float4*)(acc + i);
                a.x += dv[v].x * xv[v].x * s; a.y += dv[v].y * xv[v].y * s;
                a.z += dv[v].z * xv[v].z * s; a.w += dv[v].w * xv[v].w * s;
                *(float4*)(acc + i) = a;
            }
        }
        if constexpr (TM) {
            size_t t0 = row - (row - r0) % FP8_TM_ROWS; // the tile's first row
            if (row - t0 + WARPS_PER_BLOCK >= FP8_TM_ROWS) { // the tile's last round of rows (all warps at once)
                __syncthreads();
                fp8_stage_write(q.codes_t, rows, t0, stage, C, C, 0);
                __syncthreads();
            }
        }
    }
    if (q.amax != NULL) { fp8_warp_amax(mx, q.amax); }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float total = 0.0f;
        for (int v = 0; v < WARPS_PER_BLOCK; v++) { total += colsum[(size_t)v * C + i]; }
        partial[(size_t)blockIdx.x * C + i] = total;
    }
}

// Column sums without atomics, in two fixed-order stages, for the norm-scale and bias gradients. Stage 1 sums a
// chunk of COLSUM_ROWS rows per column: block (32, 8), thread y takes rows y, y + 8, ... of the chunk, then the 8 sums
// are added in order. This one: the bias gradients, plain column sums of d (rows, W) fp32 (W = H: no packs).
#define COLSUM_ROWS 256
__global__ void colsum_partial_kernel(float* partial, const float* d, size_t rows, int W) {
    __shared__ float sums[8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    size_t r0 = (size_t)blockIdx.y * COLSUM_ROWS, r1 = r0 + COLSUM_ROWS < rows ? r0 + COLSUM_ROWS : rows;
    float acc = 0.0f;
    if (col < W) {
        for (size_t r = r0 + threadIdx.y; r < r1; r += 8) { acc += d[r * W + col]; }
    }
    sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < W) {
        float total = 0.0f;
        for (int y = 0; y < 8; y++) { total += sums[y][threadIdx.x]; }
        partial[(size_t)blockIdx.y * W + col] = total;
    }
}

// stage 1 of the per-head norm scales: column sums of d * x * rstd, d and x (rows, W) floatX, XPACK columns per thread
// (16-byte loads; W % XPACK == 0); rstd has one value per segment of `seg` columns of a row (seg = hd, a multiple of
// XPACK: a pack lies in one segment)
__global__ void colsum_scale_partial_kernel(float* partial, const floatX* d, const floatX* x, const float* rstd,
                                            size_t rows, int W, int seg) {
    __shared__ float sums[8][32 * XPACK];
    int col = (blockIdx.x * 32 + threadIdx.x) * XPACK;
    size_t r0 = (size_t)blockIdx.y * COLSUM_ROWS, r1 = r0 + COLSUM_ROWS < rows ? r0 + COLSUM_ROWS : rows;
    float acc[XPACK];
    #pragma unroll
    for (int k = 0; k < XPACK; k++) { acc[k] = 0.0f; }
    if (col < W) {
        for (size_t r = r0 + threadIdx.y; r < r1; r += 8) {
            PackX dp = *(const PackX*)(d + r * W + col), xp = *(const PackX*)(x + r * W + col);
            float s = rstd[r * (W / seg) + col / seg];
            #pragma unroll
            for (int k = 0; k < XPACK; k++) { acc[k] += to_float(dp.v[k]) * to_float(xp.v[k]) * s; }
        }
    }
    #pragma unroll
    for (int k = 0; k < XPACK; k++) { sums[threadIdx.y][threadIdx.x * XPACK + k] = acc[k]; }
    __syncthreads();
    if (threadIdx.y == 0 && col < W) {
        #pragma unroll
        for (int k = 0; k < XPACK; k++) {
            float total = 0.0f;
            for (int y = 0; y < 8; y++) { total += sums[y][threadIdx.x * XPACK + k]; }
            partial[(size_t)blockIdx.y * W + col + k] = total;
        }
    }
}

// stage 2: out[i] += sum over chunks and over `fold` groups of W / fold columns (fold = H folds the heads onto one
// shared scale vector). Block (32, 16): x picks the column (coalesced reads), y strides over the (chunk, group) terms;
// the 16 partial sums are added in order.
__global__ void colsum_finish_kernel(float* out, const float* partial, int chunks, int W, int fold) {
    __shared__ float sums[16][33];
    int i = blockIdx.x * 32 + threadIdx.x, len = W / fold;
    float acc = 0.0f;
    if (i < len) {
        for (int t = threadIdx.y; t < chunks * fold; t += 16) {
            int ch = t / fold, g = t % fold;
            acc += partial[(size_t)ch * W + g * len + i];
        }
    }
    sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && i < len) {
        float total = 0.0f;
        for (int y = 0; y < 16; y++) { total += sums[y][threadIdx.x]; }
        out[i] += total;
    }
}

// the RMSNorm kernels' register tile for rows of C: NV = the smallest of 1, 2, 4, 6, 8, 12 with RMS_TILE(NV) >= C, 12
// for wider rows
static int rms_nv(int C) {
    static const int nvs[] = {1, 2, 4, 6, 8, 12};
    for (int i = 0; i < 6; i++) {
        if (RMS_TILE(nvs[i]) >= C) { return nvs[i]; }
    }
    return 12;
}

// the instance of RMSNorm kernel template K at register tile nv, which must be one of rms_nv's
#define RMS_NV_PICK(K, nv, TM) ((nv) == 1 ? K<1, TM> : (nv) == 2 ? K<2, TM> : (nv) == 4 ? K<4, TM> : \
                                (nv) == 6 ? K<6, TM> : (nv) == 8 ? K<8, TM> : K<12, TM>)
static void rms_nv_check(int nv) {
    if (nv != 1 && nv != 2 && nv != 4 && nv != 6 && nv != 8 && nv != 12) {
        fail("internal: RMSNorm register tile %d" BUG_HINT, nv);
    }
}

// out = RMSNorm(x) w (eps 1e-6) with register tile nv (the trainer passes rms_nv(C), the tests every one)
// (q: an FP8 epilogue of the output, Fp8Out; none by default)
static void rmsnorm_forward_nv(int nv, floatX* out, float* rstd, const float* x, const float* w, size_t rows, int C,
                               Fp8Out q = Fp8Out{}) {
    rms_nv_check(nv);
    if (q.codes_t == NULL) {
        RMS_NV_PICK(rmsnorm_forward_kernel, nv, false)<<<warp_blocks(rows), 32 * WARPS_PER_BLOCK>>>(out, rstd, x, w,
                                                                                                   rows, C, 1e-6f, q);
    } else {
        fp8_tm_check(rows, C, RMS_BWD_MAX_C_TM);
        size_t smem = (size_t)FP8_TM_ROWS * C;
        auto kernel = RMS_NV_PICK(rmsnorm_forward_kernel, nv, true);
        if (smem > 48 * 1024) { smem_limit(smem, kernel); }
        kernel<<<(unsigned)(rows / FP8_TM_ROWS), 32 * WARPS_PER_BLOCK, smem>>>(out, rstd, x, w, rows, C, 1e-6f, q);
    }
    launchCheck();
}

static void rmsnorm_forward_gpu(floatX* out, float* rstd, const float* x, const float* w, size_t rows, int C,
                                Fp8Out q = Fp8Out{}) {
    rmsnorm_forward_nv(rms_nv(C), out, rstd, x, w, rows, C, q);
}

// dw[W / fold] += column sums over rows of d (the bias gradients) or, with x, of d * x * rstd (the per-head norm
// scales; see the colsum kernels)
static void colsum_gpu(float* dw, float* partial, const float* d, size_t rows, int W) {
    dim3 grid((unsigned)ceil_div(W, 32), (unsigned)ceil_div(rows, COLSUM_ROWS));
    colsum_partial_kernel<<<grid, dim3(32, 8)>>>(partial, d, rows, W);
    launchCheck();
    colsum_finish_kernel<<<(unsigned)ceil_div(W, 32), dim3(32, 16)>>>(dw, partial, (int)grid.y, W, 1);
    launchCheck();
}

static void colsum_scale_gpu(float* dw, float* partial, const floatX* d, const floatX* x, const float* rstd,
                             size_t rows, int W, int seg, int fold) {
    dim3 grid((unsigned)ceil_div(W, 32 * XPACK), (unsigned)ceil_div(rows, COLSUM_ROWS));
    colsum_scale_partial_kernel<<<grid, dim3(32, 8)>>>(partial, d, x, rstd, rows, W, seg);
    launchCheck();
    colsum_finish_kernel<<<(unsigned)ceil_div(W / fold, 32), dim3(32, 16)>>>(dw, partial, (int)grid.y, W, fold);
    launchCheck();
}

// dx (added to dresid (N, C), which is refreshed in dresid_x, its matmul copy) and dw (added) from dout, the
// gradient at the norm's output, with register tile nv (as rmsnorm_forward_nv); partial: ceil(N / RMS_BWD_ROWS) x C
// floats of scratch
// (q: an FP8 epilogue of dresid_x, Fp8Out; none by default)
static void rmsnorm_backward_nv(int nv, float* dresid, floatX* dresid_x, float* partial, float* dw, const float* dout,
                                const float* x, const float* w, const float* rstd, size_t N, int C,
                                Fp8Out q = Fp8Out{}) {
    rms_nv_check(nv);
    unsigned chunks = (unsigned)ceil_div(N, RMS_BWD_ROWS);
    int tm = q.codes_t != NULL;
    if (tm) { fp8_tm_check(N, C, RMS_BWD_MAX_C_TM); }
    size_t smem = sizeof(float) * WARPS_PER_BLOCK * C + (tm ? (size_t)FP8_TM_ROWS * C : 0);
    auto kernel = tm ? RMS_NV_PICK(rmsnorm_backward_kernel, nv, true) : RMS_NV_PICK(rmsnorm_backward_kernel, nv, false);
    if (smem > 48 * 1024) { smem_limit(smem, kernel); } // above the default (gpu_config_problem: C <= RMS_BWD_MAX_C)
    kernel<<<chunks, 32 * WARPS_PER_BLOCK, smem>>>(dresid, dresid_x, partial, dout, x, w, rstd, N, C, q);
    launchCheck();
    colsum_finish_kernel<<<(unsigned)ceil_div(C, 32), dim3(32, 16)>>>(dw, partial, (int)chunks, C, 1);
    launchCheck();
}

static void rmsnorm_backward_gpu(float* dresid, floatX* dresid_x, float* partial, float* dw, const float* dout,
                                 const float* x, const float* w, const float* rstd, size_t N, int C,
                                 Fp8Out q = Fp8Out{}) {
    rmsnorm_backward_nv(rms_nv(C), dresid, dresid_x, partial, dw, dout, x, w, rstd, N, C, q);
}

// ----------------------------------------------------------------------------
// Hopper primitives: the hand-written PTX of the tensor-core kernels below (the head projections and the fused
// attention), bf16 build only. wgmma, setmaxnreg and the tensor copies need the arch-specific target sm_90a (the
// Makefile's -gencode=arch=compute_90a,code=sm_90a).

#ifndef ENABLE_FP32
typedef __nv_bfloat16 bf16;

// ---- shared-memory copies (cp.async) ----
// the shared-space byte address of a generic pointer into shared memory
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// 16-byte global->shared copy; pred false writes zeros (rows or columns past the end)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
// 4-byte global->shared copy; pred false writes zeros
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool pred) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(pred ? 4 : 0) : "memory");
}
// closes this thread's copies issued since the last commit into one group
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// waits until at most N of this thread's groups are still in flight (groups land in order)
template<int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// ---- warp-level mma (mma.sync) and ldmatrix ----
// d (16x8, fp32) += a (16x16, row) b (16x8, col) on bf16 registers, the PTX fragment layout: lane = 4 g + t holds a
// rows g, g+8 at k = 2t, 2t+1 (a[0], a[1]) and 2t+8, 2t+9 (a[2], a[3]), b column g at k = 2t, 2t+1 (b0) and 2t+8, 2t+9
// (b1), d rows g (d[0], d[1]) and g+8 (d[2], d[3]) at columns 2t, 2t+1
__device__ static inline void mma_bf16_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 bf16 matrices from shared memory (addr: this lane's shared-space byte address): lane l gives the address of
// row l % 8 of matrix l / 8 (16 contiguous bytes) and receives in r[i], of matrix i, row l / 4 at
// columns 2 (l % 4), +1; with .trans, column l / 4 at rows 2 (l % 4), +1. So a row-major (m, k) tile gives mma A
// fragments and B fragments of its transpose (rows = n), and .trans on a row-major (k, n) tile gives B fragments
// (two k at one n).
__device__ static inline void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ static inline void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// ---- warpgroup mma (wgmma) ----
// d (64 x N fp32 accumulator fragment, N/2 registers per thread) += A (64 x 16) B (16 x N), issued by a warpgroup (4
// warps) and asynchronous until waited for; acc = 0 overwrites d. SS: A and B by descriptor, both K-major; RS: A from
// registers (mma.sync A-fragment layout per warp), B N-major (transposed). Only the shapes the kernels use.
// The accumulator in the PTX string ({%0, .., %31} or {%0, .., %63}) and in the operand list:
#define WG_REGS32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_REGS64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                 "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_D32 WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
#define WG_D64 WG_D32, WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
// the SS and RS wgmma of width N (64 or 128)
template<int N> __device__ __forceinline__ void wgmma_ss(float* d, uint64_t da, uint64_t db, int acc) {
    if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32
                     ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                     : WG_D32 : "l"(da), "l"(db), "r"(acc) : "memory");
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS64
                     ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : WG_D64 : "l"(da), "l"(db), "r"(acc) : "memory");
}
template<int N> __device__ __forceinline__ void wgmma_rs(float* d, const uint32_t a[4], uint64_t db, int acc) {
    if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32
                     ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                     : WG_D32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc) : "memory");
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS64
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                     : WG_D64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc) : "memory");
}
// before the first wgmma that reads registers or accumulators written by other code
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// closes the wgmma's issued since the last commit into one group
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// waits until at most N groups are in flight (groups retire in order)
template<int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
__device__ __forceinline__ void wgmma_wait0() { wgmma_wait<0>(); }
// The compiler sees a wgmma as finished when issued; pinning its accumulators after the wait keeps every read of them
// below the wait.
template<int R> __device__ __forceinline__ void wgmma_pin(float* d) {
    #pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}
// the same for A fragments in registers: keeps them alive (unreused) until the wait
template<int R> __device__ __forceinline__ void wgmma_pin_a(uint32_t (*a)[4]) {
    #pragma unroll
    for (int i = 0; i < R; i++) {
        asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3]) :: "memory");
    }
}
// A fragments read by an in-flight wgmma: a use after the wait keeps their registers from reuse (a use, not a
// definition as wgmma_pin_a: ptxas would serialize a wgmma still in flight)
template<int R> __device__ __forceinline__ void wgmma_use_a(uint32_t (*a)[4]) {
    #pragma unroll
    for (int i = 0; i < R; i++) {
        asm volatile("" :: "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]) : "memory");
    }
}

// ---- swizzled shared-memory tiles and their wgmma descriptors ----
// Shared-memory matrix descriptor: start address, LBO, SBO (each >> 4), layout in bits 62-63 (1: 128-byte swizzle).
__device__ __forceinline__ uint64_t wg_desc(const void* p, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           ((uint64_t)1 << 62);
}
// Tiles of (ROWS, HD) bf16 in shared memory use the 128-byte swizzle: blocks of 64 columns, ROWS * 128 bytes each; in a
// block, row r takes 128 contiguous bytes and its 16-byte chunk c sits at chunk c ^ (r % 8), so the loads and the wgmma
// reads are free of bank conflicts. Tiles start at 1024-byte boundaries (the swizzle pattern repeats every 8 rows).
// The same bytes serve as a K-major operand (K = HD: S = Q K^T, dP = dO V^T) and as an N-major one (N = HD, K = rows:
// dV += P^T dO, dK += dS^T Q, dQ += dS K), with the transpose bit. The 16-byte chunk ch of row r starts (ch / 8)
// ROWS 64 + 64 r + 8 ((ch % 8) ^ (r % 8)) elements into the tile. K-major operand (K = HD): 64 rows from row 8*rb, k16
// step kk. The k step moves the start inside the 128-byte row (the hardware applies the XOR on the address), SBO = 8
// rows = 1024 bytes, LBO unused.
template<int ROWS> __device__ __forceinline__ uint64_t desc_k(const bf16* tile, int rb, int kk) {
    return wg_desc(tile + (kk / 4) * ROWS * 64 + rb * 8 * 64 + (kk % 4) * 16, 16, 1024);
}
// N-major operand (N = HD, K = rows 16kk..16kk+15): LBO = stride between 64-column blocks, SBO = 8 rows along K.
template<int ROWS> __device__ __forceinline__ uint64_t desc_mn(const bf16* tile, int kk) {
    return wg_desc(tile + kk * 16 * 64, ROWS * 128, 1024);
}
// descriptor + bytes: only the address field (addr >> 4, 14 bits) moves; no carry leaves it while shared memory ends
// below 256 KB
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }
// bytes from k step 0 to k step kk of a K-major swizzled (ROWS, HD) tile (desc_k)
template<int ROWS> __device__ __forceinline__ constexpr uint32_t kstep_bytes(int kk) {
    return (kk / 4) * ROWS * 128 + (kk % 4) * 32;
}
// and of an N-major one (desc_mn): 16 rows of 128 bytes a step
__device__ __forceinline__ constexpr uint32_t mnstep_bytes(int kk) { return kk * 2048; }

// the dynamic shared memory, rounded up to 1024 bytes (the swizzle's repeat); callers allocate 1 KB more
__device__ __forceinline__ unsigned char* smem_1k(unsigned char* raw) {
    return raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
}

// ---- mbarriers, the tensor copy engine (TMA), setmaxnreg ----
// a barrier whose phase completes after `count` arrivals (and the bytes announced to it)
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_u32(bar)), "r"(count) : "memory");
}
// after thread 0's mbar_init's: makes them visible to the other threads and the copy engine
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// one arrival that also announces `bytes` of copy-engine transactions for the current phase
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// one arrival
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_u32(bar)) : "memory");
}
// an arrival after which this thread's earlier shared-memory stores are visible to a thread whose try_wait sees the
// phase complete (PTX's default for mbarrier.arrive, spelled out)
__device__ __forceinline__ void mbar_arrive_release(uint64_t* bar) {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" :: "r"(smem_u32(bar)) : "memory");
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
// ROWS rows of one head from a tensor map (fox_tensor_map) into a swizzled (ROWS, HD) tile: one box per 64 columns,
// completing on `bar` (which must expect ROWS * HD * 2 bytes)
template<int ROWS, int HD>
__device__ __forceinline__ void tma_load_tile(bf16* sm, const CUtensorMap* map, int row0, int h, int b,
                                              uint64_t* bar) {
    #pragma unroll
    for (int cb = 0; cb < HD / 64; cb++)
        asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                     :: "r"(smem_u32(sm + cb * ROWS * 64)), "l"((uint64_t)map), "r"(cb * 64), "r"(h), "r"(row0),
                        "r"(b), "r"(smem_u32(bar)) : "memory");
}
// gives registers away: the calling warpgroup's per-thread limit drops to R
template<int R> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(R));
}
// claims registers (those another warpgroup gave away): the calling warpgroup's limit rises to R
template<int R> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(R));
}

// Tensor map of q, k, v or dO: (B, T, H, hd) bf16 with token stride `stride` (elements) as dims (hd, H, T, B), byte
// strides (hd * 2, stride * 2, T * stride * 2); boxes of 64 columns x `rows` tokens of one head. Its 128-byte swizzle
// writes exactly the tile layout above, and rows past T come back as zeros. (fp32 (B, H, T) rows cannot have one for
// odd T: a tensor map's strides are multiples of 16 bytes.)
static CUtensorMap fox_tensor_map(const bf16* x, int B, int T, int H, int hd, int stride, int rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;  // driver entry point, looked up once
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000,
                                                   cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess) {
            fail("cuTensorMapEncodeTiled not found\nHINT: the fused attention needs a CUDA 12+ driver");
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
        fail("cuTensorMapEncodeTiled failed (%d) for B=%d T=%d H=%d hd=%d stride=%d\n"
             "HINT: q/k/v need 16-byte alignment and stride %% 8 == 0", (int)r, B, T, H, hd, stride);
    }
    return map;
}
#endif // ENABLE_FP32

// ----------------------------------------------------------------------------
// head projections: the normed attention input x projected onto one value per head, the k-shift and v-shift logits and
// the forget-gate logit, P <= 3 of them (those that are on), each a (H, C) weight without bias. The bf16 build computes
// all P in one pass on tensor cores (mma.sync m16n8k16, fp32 accumulation) instead of P thin cuBLASLt matmuls; the fp32
// build keeps the cuBLASLt matmuls. The weight gradients stay on cuBLASLt (a long reduction over N, which it splits
// well), all P in one matmul that reads x once (layout_params keeps the P weights side by side).
// Output j = p * H + h of the concatenation is head h of projection p (the backward's dout holds them side by side in
// that order); the kernels are compiled for NP = ceil(J / 16) pairs of n8 tiles (J = P * H outputs padded to 16 NP with
// zero weights).

#define HP_MAX 3
#define HP_MAX_J 96   // P * H (gpu_config_problem): NP <= 6
typedef struct {
    int count;                    // P
    const floatX* w[HP_MAX];      // (H, C) each
    float* out[HP_MAX];           // (N, H) fp32 logits (forward)
    const floatX* dout;           // (N, P H) their gradients side by side (backward)
    float* dw;                    // (P H, C) fp32 weight gradients, the P side by side (accumulated)
} HeadProj;

// element p < 3 of a by-value HeadProj array by selects (an indexed load copies the struct to local memory)
template <typename Ptr> __device__ static inline Ptr head_proj_pick(const Ptr (&a)[HP_MAX], int p) {
    return p == 0 ? a[0] : p == 1 ? a[1] : a[2];
}

// The head projections that are on, in the order k shift, v shift, forget gate: slot[i] is projection i's place among
// them (-1: off); returns P.
static const int HP_TENSORS[HP_MAX] = {P_WK_SHIFT, P_WV_SHIFT, P_WF};
static int head_proj_slots(const FoxConfig* cf, int slot[HP_MAX]) {
    int on[HP_MAX] = {cf->k_shift, cf->v_shift, cf->gate == GATE_FULL}, P = 0;
    for (int i = 0; i < HP_MAX; i++) { slot[i] = on[i] ? P++ : -1; }
    return P;
}

#ifndef ENABLE_FP32
// out_p (N, H) = x (N, C) @ w_p (H, C)^T for every p < P. A block takes HPF_ROWS rows of x and all J outputs and
// walks C in stages of 64 columns: cp.async copies the stage's x (HPF_ROWS, 64) and w (16 NP, 64) into shared memory
// HPF_STAGES - 1 stages ahead of the one the warps read. Each warp owns 32 rows (two m16 tiles) by all J outputs in
// fp32 accumulators and reads its x fragments and every weight fragment of the stage with ldmatrix (a weight fragment
// serves both m-tiles). The sum over C is one pass of mma in column order, as in a plain matmul. Edges are zero-filled
// copies: rows past N, weight rows past J, 16-byte chunks past C (C % 8 == 0: a chunk is wholly in or out). Stage rows
// are 128 bytes with chunk ch stored at ch ^ (r % 8): the 8 rows of an ldmatrix matrix (one logical chunk) and the 8
// chunks of a row that a quarter-warp copies hit 8 distinct bank groups.
#define HPF_WARPS 4                // warps per block in the forward
#define HPF_ROWS (32 * HPF_WARPS)  // rows of x per block
#define HPF_STAGES 4               // stages of 64 columns: 3 in flight while one is read
// the forward's shared memory: HPF_STAGES stages of x (HPF_ROWS, 64) then w (16 NP, 64), bf16
#define HPF_SMEM(NP) ((size_t)HPF_STAGES * (HPF_ROWS + 16 * (NP)) * 64 * sizeof(floatX))
__device__ static inline int hp_swizzle(int r, int ch) { return r * 64 + ((ch ^ (r & 7)) << 3); } // in elements

template <int NP>
__global__ void __launch_bounds__(32 * HPF_WARPS) head_proj_forward_kernel(HeadProj hp, const floatX* __restrict__ x,
                                                                          size_t N, int C, int H) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int STAGE = (HPF_ROWS + 16 * NP) * 64; // elements of a stage
    floatX* sm = (floatX*)smem_raw;
    int J = hp.count * H, nk = (C + 63) / 64;
    size_t m0 = (size_t)blockIdx.x * HPF_ROWS;
    // copies: thread (r0, ch) takes chunk ch of stage rows r0, r0 + 16, .. of x and of w
    int ch = threadIdx.x % 8, r0 = threadIdx.x / 8;
    const floatX* wrow[NP]; // the weight row behind stage row r0 + 16 i of w (NULL past J)
    #pragma unroll
    for (int i = 0; i < NP; i++) {
        int j = r0 + 16 * i;
        wrow[i] = j < J ? head_proj_pick(hp.w, j / H) + (size_t)(j % H) * C : NULL;
    }
    auto load_stage = [&](int kt) {
        floatX* st = sm + (kt % HPF_STAGES) * STAGE;
        int c = kt * 64 + 8 * ch;
        #pragma unroll
        for (int i = 0; i < HPF_ROWS / 16; i++) {
            size_t row = m0 + r0 + 16 * i;
            bool ok = c < C && row < N;
            cp_async16(st + hp_swizzle(r0 + 16 * i, ch), ok ? x + row * C + c : x, ok);
        }
        #pragma unroll
        for (int i = 0; i < NP; i++) {
            bool ok = c < C && wrow[i] != NULL;
            cp_async16(st + hp_swizzle(HPF_ROWS + r0 + 16 * i, ch), ok ? wrow[i] + c : x, ok);
        }
    };

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // ldmatrix: lane l gives row l % 8 of matrix m = l / 8, in bytes from the stage. x: matrices (rows 0-7, k 0-7),
    // (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) of an m-tile = a[0..3], so row + 8 (m % 2), chunk 2 kk + m / 2; w:
    // (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15) of rows 16 q.. = b0, b1 of n-tile 2q, then of
    // n-tile 2q + 1, so row + 8 (m / 2), chunk 2 kk + m % 2. Every row is lane % 8 modulo 8: that is the swizzle's key.
    // m-tile 1 and pair q are 16 rows (2048 bytes) on.
    int key = lane % 8, m1 = lane / 8 % 2, m2 = lane / 16;
    uint32_t xrow = (uint32_t)(32 * warp + key + 8 * m1) * 128;
    uint32_t wrow_b = (uint32_t)(HPF_ROWS + key + 8 * m2) * 128;
    uint32_t sbase = smem_u32(sm);
    float acc[2][2 * NP][4];
    #pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        #pragma unroll
        for (int nt = 0; nt < 2 * NP; nt++) {
            acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
        }
    }

    #pragma unroll
    for (int s = 0; s < HPF_STAGES - 1; s++) {
        if (s < nk) { load_stage(s); }
        cp_async_commit(); // possibly empty: one group per stage keeps the wait count fixed
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<HPF_STAGES - 2>(); // this thread's copies of stage kt have landed
        __syncthreads();                 // everyone's have; everyone is done with stage kt - 1
        if (kt + HPF_STAGES - 1 < nk) { load_stage(kt + HPF_STAGES - 1); } // into stage kt - 1's buffer
        cp_async_commit();
        uint32_t st = sbase + (uint32_t)((kt % HPF_STAGES) * STAGE * sizeof(floatX));
        #pragma unroll
        for (int kk = 0; kk < 4; kk++) { // k16 steps: chunks 2 kk, 2 kk + 1
            uint32_t a[2][4], b[NP][4];
            #pragma unroll
            for (int mt = 0; mt < 2; mt++) { ldmatrix_x4(a[mt], st + xrow + 2048 * mt + (((2 * kk + m2) ^ key) << 4)); }
            #pragma unroll
            for (int q = 0; q < NP; q++) { ldmatrix_x4(b[q], st + wrow_b + 2048 * q + (((2 * kk + m1) ^ key) << 4)); }
            #pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                #pragma unroll
                for (int nt = 0; nt < 2 * NP; nt++) {
                    mma_bf16_16816(acc[mt][nt], a[mt], b[nt / 2][2 * (nt % 2)], b[nt / 2][2 * (nt % 2) + 1]);
                }
            }
        }
    }

    // acc[mt][nt][2 hf + e] is row 16 mt + 8 hf + g of the warp's 32, output j = 8 nt + 2 t + e
    int g = lane / 4, t = lane % 4;
    size_t rw = m0 + 32 * warp + g;
    #pragma unroll
    for (int nt = 0; nt < 2 * NP; nt++) {
        #pragma unroll
        for (int e = 0; e < 2; e++) {
            int j = 8 * nt + 2 * t + e;
            if (j >= J) { continue; }
            float* out = head_proj_pick(hp.out, j / H) + j % H;
            #pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                #pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    size_t r = rw + 16 * mt + 8 * hf;
                    if (r < N) { out[r * H] = acc[mt][nt][2 * hf + e]; }
                }
            }
        }
    }
}

// dx (N, C) = sum_p dout_p (N, H) @ w_p (H, C), written (=); the mma's k is j. A block takes HPB_ROWS rows and HPB_COLS
// columns of dx and fills shared memory once: the weights' (16 NP, HPB_COLS) slice as it lies (cp.async, 16 bytes) and
// the rows' dout (HPB_ROWS, 16 NP), read from dout's rows of J (a lane per j, a warp per row: coalesced). Each warp
// loads its 16 rows' A fragments of every k16 step once with ldmatrix, then walks the columns 16 at a time: the
// weights' B fragments by ldmatrix.trans (two j at one column), 2 NP mma, fp32 pairs stored. Both tiles' rows are
// padded by 16 bytes to an odd number of 16-byte chunks, so the 8 rows of an ldmatrix matrix hit 8 distinct bank
// groups. Padding is zero: j in [J, 16 NP), rows past N, columns past C (C % 8 == 0: whole n8 tiles, whose stores are
// skipped).
#define HPB_WARPS 8                // warps per block in the backward, 16 rows of dx each
#define HPB_ROWS (16 * HPB_WARPS)  // rows of dx per block
#define HPB_COLS 256               // columns of dx per block: a 16-byte chunk per lane of a weight row
#define HPB_LDW (HPB_COLS + 8)     // row stride of the weight slice in shared memory, elements
#define HPB_LDD(NP) (16 * (NP) + 8) // row stride of the dout tile, elements
// the backward's shared memory: w (16 NP, HPB_LDW) then dout (HPB_ROWS, HPB_LDD), bf16
#define HPB_SMEM(NP) ((size_t)(16 * (NP) * HPB_LDW + HPB_ROWS * HPB_LDD(NP)) * sizeof(floatX))
template <int NP>
__global__ void __launch_bounds__(32 * HPB_WARPS) head_proj_backward_input_kernel(float* dx, HeadProj hp, size_t N,
                                                                                 int C, int H) {
    // forward: out_p[r, h] = sum_c x[r, c] w_p[h, c]  =>  dx[r, c] = sum_p sum_h dout_p[r, h] w_p[h, c]
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int LDD = HPB_LDD(NP);
    floatX* ws = (floatX*)smem_raw;    // (16 NP, HPB_LDW)
    floatX* ds = ws + 16 * NP * HPB_LDW; // (HPB_ROWS, LDD)
    int J = hp.count * H, c_base = blockIdx.y * HPB_COLS;
    size_t m0 = (size_t)blockIdx.x * HPB_ROWS;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // the weights: warp w copies rows w, w + 8, .., lane l their 16-byte chunk l
    int c = c_base + 8 * lane;
    #pragma unroll
    for (int i = 0; i < 2 * NP; i++) {
        int j = warp + HPB_WARPS * i;
        bool ok = j < J && c < C;
        cp_async16(ws + j * HPB_LDW + 8 * lane, ok ? head_proj_pick(hp.w, j / H) + (size_t)(j % H) * C + c : hp.w[0],
                   ok);
    }
    cp_async_commit();
    // dout: lane l takes j = l, l + 32, .. (< 16 NP), warp w rows w, w + 8, ..
    #pragma unroll
    for (int q = 0; q < (16 * NP + 31) / 32; q++) {
        int j = 32 * q + lane;
        if (j >= 16 * NP) { break; }
        const floatX* src = j < J ? hp.dout + j : NULL;
        #pragma unroll
        for (int i = 0; i < HPB_ROWS / HPB_WARPS; i++) {
            int r = warp + HPB_WARPS * i;
            ds[r * LDD + j] = src != NULL && m0 + r < N ? src[(m0 + r) * J] : to_floatX(0.0f);
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    if (m0 + 16 * warp >= N) { return; } // no barrier below
    // A fragments as the forward's x: matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
    uint32_t a[NP][4];
    uint32_t arow = smem_u32(ds) + (uint32_t)((16 * warp + lane % 8 + 8 * (lane / 8 % 2)) * LDD + 8 * (lane / 16)) * 2;
    #pragma unroll
    for (int s = 0; s < NP; s++) { ldmatrix_x4(a[s], arow + 32 * s); }
    // B fragments, .trans of weight rows k: matrices (k 0-7, n 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) = b0, b1 of
    // n-tile 0, then of n-tile 1
    uint32_t brow = smem_u32(ws) + (uint32_t)((lane % 8 + 8 * (lane / 8 % 2)) * HPB_LDW + 8 * (lane / 16)) * 2;
    int t = lane % 4, cols = min(HPB_COLS, C - c_base);
    size_t ra = m0 + 16 * warp + lane / 4, rb = ra + 8;
    #pragma unroll 2
    for (int n0 = 0; n0 < cols; n0 += 16) {
        float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        #pragma unroll
        for (int s = 0; s < NP; s++) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, brow + (uint32_t)(16 * s * HPB_LDW + n0) * 2);
            mma_bf16_16816(acc[0], a[s], b[0], b[1]);
            mma_bf16_16816(acc[1], a[s], b[2], b[3]);
        }
        #pragma unroll
        for (int q = 0; q < 2; q++) {
            if (n0 + 8 * q >= cols) { break; }
            size_t cq = (size_t)c_base + n0 + 8 * q + 2 * t;
            if (ra < N) { *(float2*)(dx + ra * C + cq) = make_float2(acc[q][0], acc[q][1]); }
            if (rb < N) { *(float2*)(dx + rb * C + cq) = make_float2(acc[q][2], acc[q][3]); }
        }
    }
}

// NP = ceil(P H / 16), the n8-tile pairs of the kernels' instance (1 .. 6: gpu_config_problem)
static int head_proj_np(const HeadProj* hp, int H) {
    int np = (hp->count * H + 15) / 16;
    if (np < 1 || np > 6) {
        fail("head projections: P * H = %d outside 1..%d\nHINT: gpu_config_problem refuses such configs", hp->count * H,
             HP_MAX_J);
    }
    return np;
}
// the instance of head-projection kernel template K at NP = np (1 .. 6)
#define HP_NP_PICK(K, np) \
    ((np) == 1 ? K<1> : (np) == 2 ? K<2> : (np) == 3 ? K<3> : (np) == 4 ? K<4> : (np) == 5 ? K<5> : K<6>)
// the shared memory limit (smem_limit) with the carveout that lets two forward blocks (up to 112 KB each) or two or
// three backward blocks share an SM
template <typename Kernel> static void head_proj_smem(Kernel kernel, size_t smem) {
    smem_limit(smem, kernel);
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   cudaSharedmemCarveoutMaxShared));
}
#endif

// out_p (N, H) = x (N, C) @ w_p^T for each projection
static void head_proj_forward_gpu(const HeadProj* hp, const floatX* x, size_t N, int C, int H) {
#ifdef ENABLE_FP32
    for (int i = 0; i < hp->count; i++) { matmul_forward_gpu(hp->out[i], CUDA_R_32F, NULL, x, hp->w[i], N, C, H); }
#else
    if (hp->count == 0) { return; }
    int np = head_proj_np(hp, H);
    auto kernel = HP_NP_PICK(head_proj_forward_kernel, np);
    head_proj_smem(kernel, HPF_SMEM(np));
    kernel<<<(unsigned)ceil_div(N, HPF_ROWS), 32 * HPF_WARPS, HPF_SMEM(np)>>>(*hp, x, N, C, H);
    launchCheck();
#endif
}

// dx (N, C) = sum_p dout_p @ w_p, overwriting dx (count > 0); dw_p += dout_p^T @ x, the P of them as one matmul
// (dw (P H, C) += dout^T x)
static void head_proj_backward_gpu(float* dx, const HeadProj* hp, const floatX* x, size_t N, int C, int H) {
    int J = hp->count * H;
#ifdef ENABLE_FP32
    for (int i = 0; i < hp->count; i++) { // dx (+)= dout's columns i H .. (rows J long) @ w_i
        matmul_lt(dx, CUDA_R_32F, NULL, hp->w[i], hp->dout + i * H, C, (int)N, H, 0, 0, J, i == 0 ? 0.0f : 1.0f);
    }
#else
    int np = head_proj_np(hp, H);
    auto kernel = HP_NP_PICK(head_proj_backward_input_kernel, np);
    head_proj_smem(kernel, HPB_SMEM(np));
    dim3 grid((unsigned)ceil_div(N, HPB_ROWS), (unsigned)ceil_div(C, HPB_COLS));
    kernel<<<grid, 32 * HPB_WARPS, HPB_SMEM(np)>>>(dx, *hp, N, C, H);
    launchCheck();
#endif
    matmul_backward_weight_gpu(hp->dw, hp->dout, x, N, C, J);
}

// ----------------------------------------------------------------------------
// KV-shift

// The per-head kernels below take the tensors of k and v (KV-shift) or of q and k (QK-norm and RoPE) in one launch:
// blockIdx.y picks the set (a struct each; grid.y = the number of sets that are on), so the pair shares one launch and
// its tail, and each thread runs the one-tensor code.
typedef struct { floatX* out; const floatX* raw; const float* alpha_logit; } KVShiftSet;

// KV-shift, per head: out_t = a_t * raw_{t-1} + (1 - a_t) * raw_t, raw_{-1} = 0, a = sigmoid(z); XPACK consecutive
// channels of one token per thread (one head's: hd % XPACK == 0, see head_lanes). DOCS: raw_{t-1} = 0 also where t
// starts a document.
template <bool DOCS>
__global__ void kv_shift_forward_kernel(KVShiftSet s0, KVShiftSet s1, size_t N, int T, int H, int hd, FoxDocs docs) {
    floatX* out = blockIdx.y ? s1.out : s0.out;
    const floatX* raw = blockIdx.y ? s1.raw : s0.raw;
    const float* alpha_logit = blockIdx.y ? s1.alpha_logit : s0.alpha_logit;
    size_t C = (size_t)H * hd, idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * XPACK;
    if (idx >= N * C) { return; }
    size_t n = idx / C;
    int has_prev = n % T > 0 && !(DOCS && doc_starts_at(docs, n, (int)(n % T)));
    float a = sigmoid_gpu(alpha_logit[n * H + (idx % C) / hd]);
    PackX cur = *(const PackX*)(raw + idx), res;
    PackX prev = has_prev ? *(const PackX*)(raw + idx - C) : cur;
    #pragma unroll
    for (int k = 0; k < XPACK; k++) {
        float p = has_prev ? to_float(prev.v[k]) : 0.0f;
        res.v[k] = to_floatX(a * p + (1.0f - a) * to_float(cur.v[k]));
    }
    *(PackX*)(out + idx) = res;
}

// G lanes per (token, head) row (see head_lanes); draw's rows are ld long (a block of dqkvg), dalpha_logit's ld_a (a
// block of the head projections' dhp). At most 48 registers (no spills), so five blocks share an SM. Q8: draw's FP8
// epilogue (q, its codes indexed as draw; the instance without it is the plain kernel), at most 64 registers and four
// blocks an SM: at 48 it spilled.
typedef struct {
    floatX *draw, *dalpha_logit;
    const floatX *dout, *raw;
    const float* alpha_logit;
    Fp8Out q;
} KVShiftGradSet;
template <bool DOCS, bool Q8>
__global__ void __launch_bounds__(HEAD_THREADS, Q8 ? 4 : 5)
kv_shift_backward_kernel(KVShiftGradSet s0, KVShiftGradSet s1, int ld, int ld_a, size_t N, int T, int H, int hd,
                         int G, FoxDocs docs) {
    // forward: out_t = a_t raw_{t-1} + (1 - a_t) raw_t, a_t = sigmoid(z_t)
    // draw_t = (1 - a_t) dout_t + a_{t+1} dout_{t+1}   (gathered, so rows never race)
    // dz_t = a_t (1 - a_t) * sum_i dout_t,i (raw_{t-1},i - raw_t,i)
    // DOCS: where t starts a document raw_{t-1} = 0, and t - 1 gets nothing from t
    floatX* draw = blockIdx.y ? s1.draw : s0.draw;
    floatX* dalpha_logit = blockIdx.y ? s1.dalpha_logit : s0.dalpha_logit;
    const floatX* dout = blockIdx.y ? s1.dout : s0.dout;
    const floatX* raw = blockIdx.y ? s1.raw : s0.raw;
    const float* alpha_logit = blockIdx.y ? s1.alpha_logit : s0.alpha_logit;
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
    int j = (int)(threadIdx.x % G), half = hd / 2;
    int active = row < N * H && j * XPACK < half; // the others still join group_sum
    size_t n = row / H, C = (size_t)H * hd;
    float a = 0.0f, da = 0.0f;
    unsigned mx = 0;
    if (active) {
        int has_prev = n % T > 0 && !(DOCS && doc_starts_at(docs, n, (int)(n % T)));
        int has_next = n % T + 1 < (size_t)T && !(DOCS && doc_starts_at(docs, n + 1, (int)(n % T) + 1));
        a = sigmoid_gpu(alpha_logit[row]);
        float a_next = has_next ? sigmoid_gpu(alpha_logit[row + H]) : 0.0f;
        for (int e = j * XPACK; e < hd; e += half) { // the lane's two packs
            size_t off = n * C + (size_t)(row % H) * hd + e;
            PackX d = *(const PackX*)(dout + off), cur = *(const PackX*)(raw + off), res;
            PackX d_next = has_next ? *(const PackX*)(dout + off + C) : d;
            PackX prev = has_prev ? *(const PackX*)(raw + off - C) : cur;
            #pragma unroll
            for (int k = 0; k < XPACK; k++) {
                float dk = to_float(d.v[k]), dn = has_next ? to_float(d_next.v[k]) : 0.0f;
                float p = has_prev ? to_float(prev.v[k]) : 0.0f;
                res.v[k] = to_floatX((1.0f - a) * dk + a_next * dn);
                da += dk * (p - to_float(cur.v[k]));
            }
            size_t at = n * ld + (size_t)(row % H) * hd + e;
            bool store = true;
            if constexpr (Q8) {
                Fp8Out q = fp8_pick(s0.q, s1.q, blockIdx.y);
                fp8_pack<XPACK>(q, res.v, at, &mx);
                store = !q.drop;
            }
            if (store) { *(PackX*)(draw + at) = res; }
        }
    }
    da = group_sum(da, G);
    if (active && j == 0) { dalpha_logit[n * ld_a + row % H] = to_floatX(da * a * (1.0f - a)); }
    if constexpr (Q8) {
        unsigned* amax = blockIdx.y ? s1.q.amax : s0.q.amax;
        if (amax != NULL) { fp8_warp_amax(mx, amax); }
    }
}

// out_t = a_t * raw_{t-1} + (1 - a_t) * raw_t per head for the n <= 2 sets set[0 .. n - 1] (k, v: those whose shift is
// on); out, raw (B, T, H, hd), alpha_logit (B, T, H); N = B T; docs: cut at the document starts, or NULL
static void kv_shift_forward_gpu(const KVShiftSet set[2], int n, size_t N, int T, int H, int hd,
                                 const FoxDocs* docs) {
    if (n == 0) { return; }
    size_t NC = N * H * hd;
    auto kernel = docs != NULL ? kv_shift_forward_kernel<true> : kv_shift_forward_kernel<false>;
    kernel<<<dim3(elem_blocks(NC / XPACK), n), 256>>>(set[0], set[n - 1], N, T, H, hd, docs_or_none(docs));
    launchCheck();
}

// the sets' draw (rows ld long) and dalpha_logit (rows ld_a long) from dout (n >= 1); each set's FP8 epilogue of draw
// (Fp8Out q; none when zero)
static void kv_shift_backward_gpu(const KVShiftGradSet set[2], int n, int ld, int ld_a, size_t N, int T, int H,
                                  int hd, const FoxDocs* docs) {
    int G = head_lanes(hd), q8 = set[0].q.amax != NULL || set[0].q.codes != NULL;
    auto kernel = docs != NULL ? (q8 ? kv_shift_backward_kernel<true, true> : kv_shift_backward_kernel<true, false>)
                               : (q8 ? kv_shift_backward_kernel<false, true> : kv_shift_backward_kernel<false, false>);
    kernel<<<dim3(head_blocks(N * H, G), n), HEAD_THREADS>>>(set[0], set[n - 1], ld, ld_a, N, T, H, hd, G,
                                                             docs_or_none(docs));
    launchCheck();
}

// ----------------------------------------------------------------------------
// QK-norm and RoPE

// QK-norm then RoPE on one (token, head) row of hd values, G lanes per row (see head_lanes); either stage may be
// off (w == NULL: no norm; rope == NULL: no rotation). The norm's scale for head h is w + (h % groups) * hd (groups = 1
// when the heads share one scale vector). RoPE rotates the non-interleaved pairs (i, i + hd/2) by the angle of table
// rope[t][i] = (cos, sin).
typedef struct {
    floatX* out;
    float* rstd;
    const floatX* inp;
    const float* w;
} QKNormSet;
__global__ void qk_norm_rope_forward_kernel(QKNormSet s0, QKNormSet s1, int groups, const float* rope, size_t N,
                                            int T, int H, int hd, float eps, int G) {
    floatX* out = blockIdx.y ? s1.out : s0.out;
    float* rstd = blockIdx.y ? s1.rstd : s0.rstd;
    const floatX* inp = blockIdx.y ? s1.inp : s0.inp;
    const float* w = blockIdx.y ? s1.w : s0.w;
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
    int j = (int)(threadIdx.x % G), half = hd / 2, i0 = j * XPACK;
    int active = row < N * H && i0 < half; // the others still join group_sum
    float lo[XPACK], hi[XPACK], ss = 0.0f; // the lane's channels i0.. and half + i0..
    if (active) {
        PackX plo = *(const PackX*)(inp + row * hd + i0), phi = *(const PackX*)(inp + row * hd + half + i0);
        #pragma unroll
        for (int k = 0; k < XPACK; k++) {
            lo[k] = to_float(plo.v[k]);
            hi[k] = to_float(phi.v[k]);
            ss += lo[k] * lo[k] + hi[k] * hi[k];
        }
    }
    float s = head_rstd(ss, w != NULL, rstd, row, active && j == 0, hd, eps, G);
    if (!active) { return; }
    int h = (int)(row % H), t = (int)((row / H) % T);
    if (w != NULL) {
        const float* wr = w + (size_t)(h % groups) * hd;
        float wlo[XPACK], whi[XPACK];
        load_floats<XPACK>(wlo, wr + i0);
        load_floats<XPACK>(whi, wr + half + i0);
        #pragma unroll
        for (int k = 0; k < XPACK; k++) { lo[k] = lo[k] * s * wlo[k]; hi[k] = hi[k] * s * whi[k]; }
    }
    PackX olo, ohi;
    #pragma unroll
    for (int k = 0; k < XPACK; k++) {
        float vlo = lo[k], vhi = hi[k];
        if (rope != NULL) {
            float2 cs = *(const float2*)(rope + ((size_t)t * half + i0 + k) * 2); // (cos, sin)
            vlo = lo[k] * cs.x - hi[k] * cs.y;
            vhi = hi[k] * cs.x + lo[k] * cs.y;
        }
        olo.v[k] = to_floatX(vlo);
        ohi.v[k] = to_floatX(vhi);
    }
    *(PackX*)(out + row * hd + i0) = olo;
    *(PackX*)(out + row * hd + half + i0) = ohi;
}

// Writes dinp (rows ld long: C, or a block of dqkvg) and, with the norm on, dnormed (the gradient at the norm's output,
// for the scale gradient). At most 64 registers, so four blocks share an SM. The norm is on for both sets or for
// neither (w), as the forward's. Q8: dinp's FP8 epilogue (q, codes indexed as dinp) in the sets that have one.
typedef struct {
    floatX *dinp, *dnormed;
    int ld;
    const floatX *dout, *inp;
    const float *w, *rstd;
    Fp8Out q;
} QKNormGradSet;

// a row's two dinp packs (lo at i0, hi at half + i0 of the row at dr, index at of dr[0] in dinp), stored; when Q8 first
// through the FP8 epilogue of the block's set (q0 or q1), and then the warp's amax
template <bool Q8>
__device__ static inline void qk_grad_store(const Fp8Out& q0, const Fp8Out& q1, floatX* dr, size_t at, int i0, int half,
                                            PackX& lo, PackX& hi, unsigned* mx) {
    bool store = true;
    if constexpr (Q8) {
        Fp8Out q = fp8_pick(q0, q1, blockIdx.y);
        fp8_pack<XPACK>(q, lo.v, at + i0, mx);
        fp8_pack<XPACK>(q, hi.v, at + half + i0, mx);
        store = !q.drop;
    }
    if (store) {
        *(PackX*)(dr + i0) = lo;
        *(PackX*)(dr + half + i0) = hi;
    }
    if constexpr (Q8) {
        unsigned* amax = blockIdx.y ? q1.amax : q0.amax;
        if (amax != NULL) { fp8_warp_amax(*mx, amax); }
    }
}

template <bool Q8>
__global__ void __launch_bounds__(HEAD_THREADS, 4)
qk_norm_rope_backward_kernel(QKNormGradSet s0, QKNormGradSet s1, int groups, const float* rope, size_t N, int T,
                             int H, int hd, int G) {
    // forward: n = x s w (per head), out = R_t n (rotation of the pairs (i, i + hd/2))
    // dn = R_t^T dout: dn_i = d_i cos + d_{i+half} sin, dn_{i+half} = d_{i+half} cos - d_i sin
    // dx_i = s w_i dn_i - x_i s^3 / hd * sum_j w_j dn_j x_j
    floatX* dinp = blockIdx.y ? s1.dinp : s0.dinp;
    floatX* dnormed = blockIdx.y ? s1.dnormed : s0.dnormed;
    int ld = blockIdx.y ? s1.ld : s0.ld;
    const floatX* dout = blockIdx.y ? s1.dout : s0.dout;
    const floatX* inp = blockIdx.y ? s1.inp : s0.inp;
    const float* w = blockIdx.y ? s1.w : s0.w;
    const float* rstd = blockIdx.y ? s1.rstd : s0.rstd;
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
    int j = (int)(threadIdx.x % G), half = hd / 2, i0 = j * XPACK;
    int active = row < N * H && i0 < half; // the others still join group_sum
    int h = (int)(row % H), t = (int)((row / H) % T);
    const float* wr = w != NULL ? w + (size_t)(h % groups) * hd : NULL;
    size_t at = (row / H) * ld + (size_t)h * hd;
    floatX* dr = dinp + at; // this row of dinp
    float dlo[XPACK], dhi[XPACK], xlo[XPACK], xhi[XPACK], wlo[XPACK], whi[XPACK], dot = 0.0f;
    unsigned mx = 0;
    if (active) {
        PackX plo = *(const PackX*)(dout + row * hd + i0), phi = *(const PackX*)(dout + row * hd + half + i0);
        #pragma unroll
        for (int k = 0; k < XPACK; k++) {
            float d_lo = to_float(plo.v[k]), d_hi = to_float(phi.v[k]);
            dlo[k] = d_lo;
            dhi[k] = d_hi;
            if (rope != NULL) {
                float2 cs = *(const float2*)(rope + ((size_t)t * half + i0 + k) * 2); // (cos, sin)
                dlo[k] = d_lo * cs.x + d_hi * cs.y;
                dhi[k] = d_hi * cs.x - d_lo * cs.y;
            }
        }
        if (wr != NULL) {
            PackX qlo = *(const PackX*)(inp + row * hd + i0), qhi = *(const PackX*)(inp + row * hd + half + i0);
            load_floats<XPACK>(wlo, wr + i0);
            load_floats<XPACK>(whi, wr + half + i0);
            #pragma unroll
            for (int k = 0; k < XPACK; k++) {
                xlo[k] = to_float(qlo.v[k]);
                xhi[k] = to_float(qhi.v[k]);
                dot += wlo[k] * dlo[k] * xlo[k] + whi[k] * dhi[k] * xhi[k];
            }
        }
    }
    PackX olo, ohi;
    if (wr == NULL) { // w is NULL for both sets or neither (a block has one): no lane is left in group_sum
        if (!active) { return; }
        #pragma unroll
        for (int k = 0; k < XPACK; k++) { olo.v[k] = to_floatX(dlo[k]); ohi.v[k] = to_floatX(dhi[k]); }
        qk_grad_store<Q8>(s0.q, s1.q, dr, at, i0, half, olo, ohi, &mx);
        return;
    }
    dot = group_sum(dot, G);
    if (!active) { return; }
    float s = rstd[row], c = dot * s * s * s / (float)hd;
    PackX nlo, nhi;
    #pragma unroll
    for (int k = 0; k < XPACK; k++) {
        nlo.v[k] = to_floatX(dlo[k]);
        nhi.v[k] = to_floatX(dhi[k]);
        olo.v[k] = to_floatX(s * wlo[k] * dlo[k] - xlo[k] * c);
        ohi.v[k] = to_floatX(s * whi[k] * dhi[k] - xhi[k] * c);
    }
    *(PackX*)(dnormed + row * hd + i0) = nlo;
    *(PackX*)(dnormed + row * hd + half + i0) = nhi;
    qk_grad_store<Q8>(s0.q, s1.q, dr, at, i0, half, olo, ohi, &mx);
}

// q and k through QK-norm (w != NULL, eps) then RoPE (rope != NULL), both sets in one launch
static void qk_norm_rope_forward_gpu(QKNormSet q, QKNormSet k, int groups, const float* rope, size_t N, int T, int H,
                                     int hd, float eps) {
    int G = head_lanes(hd);
    qk_norm_rope_forward_kernel<<<dim3(head_blocks(N * H, G), 2), HEAD_THREADS>>>(q, k, groups, rope, N, T, H, hd, eps,
                                                                                  G);
    launchCheck();
}

// (each set's FP8 epilogue of dinp: its q, none when zero)
static void qk_norm_rope_backward_gpu(QKNormGradSet q, QKNormGradSet k, int groups, const float* rope, size_t N, int T,
                                      int H, int hd) {
    int G = head_lanes(hd), q8 = q.q.amax != NULL || q.q.codes != NULL || k.q.amax != NULL || k.q.codes != NULL;
    auto kernel = q8 ? qk_norm_rope_backward_kernel<true> : qk_norm_rope_backward_kernel<false>;
    kernel<<<dim3(head_blocks(N * H, G), 2), HEAD_THREADS>>>(q, k, groups, rope, N, T, H, hd, G);
    launchCheck();
}

// ----------------------------------------------------------------------------
// the forget gate

// The forget gate, one block per (b, h): z_t = xw_t + b (xw = W_f x, NULL for the bias-only and fixed gates), written
// back into gate_logit; c_t = sum_{s<=t} logsigmoid(z_s), summed in fp64 and rounded to fp32. The scan: each thread
// sums a contiguous chunk, a scan over the chunk totals gives each chunk its carry, then each thread re-walks its chunk
// from it; the order is fixed, so the result is deterministic. gate_logit's column is H floats a step apart and the
// work is latency bound: each thread issues GATE_BATCH loads before it uses the first.
// Documents (-f 1): c stays this plain running sum over the sequence. The attention kernels mask the keys before each
// query's document (FoxDocs), and within a document c_i - c_j is the twin's c_i - c_j, the sum over (j, i], in exact
// arithmetic: the twin restarts c at every document start t0 > 0 (c_t0 = 0), which only moves a document's c by the
// constant c_t0, cancelling in every logit. The attention's tile arithmetic takes c relative to one reference per tile
// and needs c never to increase (fox_lean_logits, fox_lean_qterm), which a restart would break at every document start.
// Precision: c_i - c_j is formed from values of the sequence's magnitude, as with -f 0 at the same T (the twin's from a
// document's). The backward segments (fox_bwd_dlogf_kernel): dlogf sums dc over t's document only and is 0 at a
// document start t0 > 0, whose gate c does not hold, so its logit's gradient is exactly 0, as the twin's.
#define GATE_THREADS 1024
#define GATE_BATCH 8
__global__ void __launch_bounds__(GATE_THREADS)
    forget_gate_forward_kernel(float* __restrict__ c, float* __restrict__ gate_logit, const float* __restrict__ bias,
                               int has_proj, int B, int T, int H) {
    // gate_logit (B, T, H) -> c (B, H, T)
    __shared__ double part[GATE_THREADS];
    int bh = blockIdx.x, b = bh / H, h = bh % H, tid = threadIdx.x;
    int chunk = (int)ceil_div(T, GATE_THREADS);
    int t0 = min(T, tid * chunk), t1 = min(T, t0 + chunk);
    float* z = gate_logit + (size_t)b * T * H + h; // z_t at z[t * H]
    float bias_h = bias[h];
    double sum = 0.0;
    for (int t = t0; t < t1; t += GATE_BATCH) {
        float v[GATE_BATCH];
#pragma unroll
        for (int k = 0; k < GATE_BATCH; k++) {
            v[k] = t + k < t1 && has_proj ? z[(size_t)(t + k) * H] + bias_h : bias_h;
        }
#pragma unroll
        for (int k = 0; k < GATE_BATCH; k++) {
            if (t + k < t1) {
                z[(size_t)(t + k) * H] = v[k];
                sum += logsigmoid_gpu(v[k]);
            }
        }
    }
    part[tid] = sum;
    __syncthreads();
    for (int off = 1; off < GATE_THREADS; off <<= 1) { // inclusive prefix scan of the chunk totals
        double add = tid >= off ? part[tid - off] : 0.0;
        __syncthreads();
        part[tid] += add;
        __syncthreads();
    }
    double run = tid > 0 ? part[tid - 1] : 0.0;
    float* c_bh = c + (size_t)bh * T;
    for (int t = t0; t < t1; t += GATE_BATCH) {
        float v[GATE_BATCH];
#pragma unroll
        for (int k = 0; k < GATE_BATCH; k++) { v[k] = t + k < t1 ? z[(size_t)(t + k) * H] : 0.0f; }
#pragma unroll
        for (int k = 0; k < GATE_BATCH; k++) {
            if (t + k < t1) {
                run += logsigmoid_gpu(v[k]);
                c_bh[t + k] = (float)run;
            }
        }
    }
}

// dlogf (B, H, T) comes from the attention backward, which does the reverse cumulative sum
__global__ void forget_gate_backward_kernel(float* dgate_logit, floatX* dgate_logit_x, int ld_x, const float* dlogf,
                                            const float* gate_logit, int B, int T, int H) {
    // forward: log f_t = logsigmoid(z_t)  =>  dz_t = dlogf_t * sigmoid(-z_t), (B, H, T) -> (B, T, H)
    // dgate_logit_x: the matmul copy for the full gate's projection (rows ld_x long), or NULL
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * T * H) { return; }
    size_t n = i / H;
    int h = (int)(i % H);
    float g = dlogf[((n / T) * H + h) * T + n % T] * sigmoid_gpu(-gate_logit[i]);
    dgate_logit[i] = g;
    if (dgate_logit_x != NULL) { dgate_logit_x[n * ld_x + h] = to_floatX(g); }
}

// gate_logit (B, T, H) += bias (has_proj; else = bias), c (B, H, T) its running sum of log f
static void forget_gate_forward_gpu(float* c, float* gate_logit, const float* bias, int has_proj, int B, int T, int H) {
    forget_gate_forward_kernel<<<B * H, GATE_THREADS>>>(c, gate_logit, bias, has_proj, B, T, H);
    launchCheck();
}

static void forget_gate_backward_gpu(float* dgate_logit, floatX* dgate_logit_x, int ld_x, const float* dlogf,
                                     const float* gate_logit, int B, int T, int H) {
    forget_gate_backward_kernel<<<elem_blocks((size_t)B * T * H), 256>>>(dgate_logit, dgate_logit_x, ld_x, dlogf,
                                                                         gate_logit, B, T, H);
    launchCheck();
}

// ----------------------------------------------------------------------------
// Forgetting attention (dev/fox.md, "Forgetting attention"). Query i sees keys first_key(i) <= j <= i (causal, or a
// sliding window of `window` keys), with the forget gate's bias:
//   s_ij = q_i . k_j / sqrt(hd) + c_i - c_j,   P_ij = exp(s_ij - lse_i),   o_i = sum_j P_ij v_j,
// lse_i saved for the backward. The backward writes dq, dk, dv and dlogf (B, H, T), the gradient of log f: dc_t = sum_j
// dS_tj - sum_i dS_it and dlogf_t = sum_{s>=t} dc_s (dev/fox.md, "Attention backward with the forget gate"). Two
// implementations behind attention_forward_gpu and attention_backward_gpu, read in this order below:
// - the simple kernel, fp32 on CUDA cores, any head size up to MAX_HD: the fp32 build runs it (the fused kernels read
//   bf16 only); in the bf16 build it serves the tests' head size 16 fixtures (gpu_config_problem refuses other head
//   sizes to the trainer);
// - the fused flash kernels (bf16 build, head sizes 64 and 128) on Hopper tensor cores (wgmma), with adaptive
//   computation pruning (dev/fox.md, "Adaptive computation pruning"): the "train_fox.cu" sections of
//   dev/cuda/fox_attention_forward.cu and _backward.cu, specialised to the versions that run here (a change there is
//   carried over; see dev/cuda/README.md). Which kernel runs at which head size, with which tiles:
//   fox_attention_forward, fox_attention_backward.
// Both backwards write dlogf through the same scratch: dc's column part (as key), dc's row part (as query), Delta, then
// one fp64 reverse scan (fox_bwd_dlogf_kernel).

#define ATT_TILE 32

// the first key query i sees: 0, or i - window + 1 under a sliding window
__device__ static inline int first_key_gpu(int i, int window) {
    return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
}

// ---- the simple kernel (fp32 CUDA cores) ----
// One warp per query (forward, dq) or key (dk, dv) row, the other side staged in ATT_TILE-row fp32 tiles in shared
// memory; the softmax runs online over the key tiles.
// copies rows [r0, r0 + rows) of one head (zeros past T) into a (rows, ld) fp32 tile
__device__ static void load_head_rows(float* tile, int ld, const floatX* src, int b, int h, int r0, int rows, int T,
                                      int H, int hd) {
    size_t C = (size_t)H * hd;
    for (int idx = threadIdx.x; idx < rows * hd; idx += blockDim.x) {
        int r = idx / hd, d = idx % hd, t = r0 + r;
        tile[r * ld + d] = t < T ? to_float(src[((size_t)b * T + t) * C + (size_t)h * hd + d]) : 0.0f;
    }
}

static size_t attention_forward_smem(int hd) {
    return sizeof(float) * ((size_t)ATT_TILE * (hd + 1) * 2 + (size_t)WARPS_PER_BLOCK * hd);
}

// o (B, T, H, hd) and lse (B, H, T) of WARPS_PER_BLOCK query rows per block, a warp each; lane = key of the
// ATT_TILE-key tile, the softmax online over the tiles (fp32 throughout). DOCS: query i sees no key before its
// document's start, and the tiles before the first row's document are not read (every logit there masked).
template <bool DOCS>
__global__ void attention_forward_kernel(floatX* o, float* lse, const floatX* q, const floatX* k, const floatX* v,
                                         const float* c, int T, int H, int hd, int window, float scale,
                                         FoxDocs docs) {
    extern __shared__ float smem[];
    int ld = hd + 1; // odd stride: the lanes of a warp read distinct banks
    float* ks = smem;                      // (ATT_TILE, ld)
    float* vs = ks + ATT_TILE * ld;        // (ATT_TILE, ld)
    float* qs = vs + ATT_TILE * ld;        // (WARPS_PER_BLOCK, hd)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int i0 = blockIdx.x * WARPS_PER_BLOCK, i = i0 + warp;
    int live = i < T, i_last = min(i0 + WARPS_PER_BLOCK - 1, T - 1);
    const float* ch = c != NULL ? c + (size_t)bh * T : NULL;
    load_head_rows(qs, hd, q, b, h, i0, WARPS_PER_BLOCK, T, H, hd);
    float ci = live && ch != NULL ? ch[i] : 0.0f;
    int j_first = first_key_gpu(i0, window), doc_i = DOCS && live ? docs.start[(size_t)b * T + i] : 0;
    if (DOCS) { j_first = max(j_first, docs.start[(size_t)b * T + i0]); }
    float m = -INFINITY, l = 0.0f, acc[MAX_HD_LANE];
    #pragma unroll
    for (int r = 0; r < MAX_HD_LANE; r++) { acc[r] = 0.0f; }
    for (int j0 = j_first / ATT_TILE * ATT_TILE; j0 <= i_last; j0 += ATT_TILE) {
        __syncthreads(); // the previous tile is consumed
        load_head_rows(ks, ld, k, b, h, j0, ATT_TILE, T, H, hd);
        load_head_rows(vs, ld, v, b, h, j0, ATT_TILE, T, H, hd);
        __syncthreads();
        int j = j0 + lane;
        int valid = live && j <= i && j >= first_key_gpu(i, window) && !(DOCS && j < doc_i);
        float s = -INFINITY; // masked before exponentiating: never exp of c_i - c_j above the diagonal
        if (valid) {
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) { dot += qs[warp * hd + d] * ks[lane * ld + d]; }
            s = dot * scale + (ch != NULL ? ci - ch[j] : 0.0f);
        }
        float mt = warp_max(s);
        if (mt == -INFINITY) { continue; } // uniform over the warp
        float m_new = fmaxf(m, mt), corr = expf(m - m_new);
        float p = valid ? expf(s - m_new) : 0.0f;
        l = l * corr + warp_sum(p);
        #pragma unroll
        for (int r = 0; r < MAX_HD_LANE; r++) { acc[r] *= corr; }
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            #pragma unroll
            for (int r = 0; r < MAX_HD_LANE; r++) {
                int d = lane + 32 * r;
                if (d < hd) { acc[r] += pj * vs[jj * ld + d]; }
            }
        }
        m = m_new;
    }
    if (!live) { return; }
    size_t off = ((size_t)b * T + i) * H * hd + (size_t)h * hd;
    #pragma unroll
    for (int r = 0; r < MAX_HD_LANE; r++) {
        int d = lane + 32 * r;
        if (d < hd) { o[off + d] = to_floatX(acc[r] / l); }
    }
    if (lane == 0) { lse[(size_t)bh * T + i] = m + logf(l); }
}

static size_t attention_backward_smem(int hd) {
    return sizeof(float) * ((size_t)ATT_TILE * (hd + 1) * 2 + (size_t)WARPS_PER_BLOCK * hd * 2 + 3 * ATT_TILE);
}

// dq and the row part of dc, one warp per query row (it owns dq_i and dc_row_i); key tiles staged in shared memory.
// DOCS: as the forward's
template <bool DOCS>
__global__ void attention_backward_dq_kernel(floatX* dq, float* dc_row, const floatX* dout, const floatX* q,
                                             const floatX* k, const floatX* v, const float* lse, const float* delta,
                                             const float* c, int T, int H, int hd, int window, float scale,
                                             FoxDocs docs) {
    // forward: s_ij = scale q_i.k_j + c_i - c_j, p_ij = exp(s_ij - lse_i), o_i = sum_j p_ij v_j
    // dp_ij = dout_i . v_j, ds_ij = p_ij (dp_ij - Delta_i), dq_i = scale sum_j ds_ij k_j
    // dc_row_i = sum_j ds_ij (as query); the key kernel writes the column part
    extern __shared__ float smem[];
    int ld = hd + 1;
    float* ks = smem;                          // (ATT_TILE, ld)
    float* vs = ks + ATT_TILE * ld;            // (ATT_TILE, ld)
    float* qs = vs + ATT_TILE * ld;            // (WARPS_PER_BLOCK, hd)
    float* dos = qs + WARPS_PER_BLOCK * hd;    // (WARPS_PER_BLOCK, hd)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int i0 = blockIdx.x * WARPS_PER_BLOCK, i = i0 + warp;
    int live = i < T, i_last = min(i0 + WARPS_PER_BLOCK - 1, T - 1);
    const float* ch = c != NULL ? c + (size_t)bh * T : NULL;
    load_head_rows(qs, hd, q, b, h, i0, WARPS_PER_BLOCK, T, H, hd);
    load_head_rows(dos, hd, dout, b, h, i0, WARPS_PER_BLOCK, T, H, hd);
    float ci = live && ch != NULL ? ch[i] : 0.0f;
    float row_lse = live ? lse[(size_t)bh * T + i] : 0.0f, row_delta = live ? delta[(size_t)bh * T + i] : 0.0f;
    int j_first = first_key_gpu(i0, window), doc_i = DOCS && live ? docs.start[(size_t)b * T + i] : 0;
    if (DOCS) { j_first = max(j_first, docs.start[(size_t)b * T + i0]); }
    float acc[MAX_HD_LANE], ds_sum = 0.0f;
    #pragma unroll
    for (int r = 0; r < MAX_HD_LANE; r++) { acc[r] = 0.0f; }
    for (int j0 = j_first / ATT_TILE * ATT_TILE; j0 <= i_last; j0 += ATT_TILE) {
        __syncthreads();
        load_head_rows(ks, ld, k, b, h, j0, ATT_TILE, T, H, hd);
        load_head_rows(vs, ld, v, b, h, j0, ATT_TILE, T, H, hd);
        __syncthreads();
        int j = j0 + lane;
        float ds = 0.0f;
        if (live && j <= i && j >= first_key_gpu(i, window) && !(DOCS && j < doc_i)) {
            float dot = 0.0f, dp = 0.0f;
            for (int d = 0; d < hd; d++) {
                dot += qs[warp * hd + d] * ks[lane * ld + d];
                dp += dos[warp * hd + d] * vs[lane * ld + d];
            }
            float p = expf(dot * scale + (ch != NULL ? ci - ch[j] : 0.0f) - row_lse);
            ds = p * (dp - row_delta);
        }
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float dsj = __shfl_sync(0xffffffffu, ds, jj);
            #pragma unroll
            for (int r = 0; r < MAX_HD_LANE; r++) {
                int d = lane + 32 * r;
                if (d < hd) { acc[r] += dsj * ks[jj * ld + d]; }
            }
        }
        ds_sum += warp_sum(ds);
    }
    if (!live) { return; }
    size_t off = ((size_t)b * T + i) * H * hd + (size_t)h * hd;
    #pragma unroll
    for (int r = 0; r < MAX_HD_LANE; r++) {
        int d = lane + 32 * r;
        if (d < hd) { dq[off + d] = to_floatX(scale * acc[r]); }
    }
    if (dc_row != NULL && lane == 0) { dc_row[(size_t)bh * T + i] = ds_sum; }
}

// dk, dv and the column part of dc, one warp per key row (it owns dk_j, dv_j, dc_col_j: no atomics); query tiles
// staged in shared memory. DOCS: key j is seen by no query past its document's end, and the query tiles past the
// last key's document are not read.
template <bool DOCS>
__global__ void attention_backward_dkdv_kernel(floatX* dk, floatX* dv, float* dc_col, const floatX* dout,
                                               const floatX* q, const floatX* k, const floatX* v, const float* lse,
                                               const float* delta, const float* c, int T, int H, int hd, int window,
                                               float scale, FoxDocs docs) {
    // dk_j = scale sum_i ds_ij q_i, dv_j = sum_i p_ij dout_i
    // dc_j = sum_i ds_ji - sum_i ds_ij (row sum as query, minus column sum as key); this
    // kernel writes dc_col_j = -sum_i ds_ij, the dq kernel the row sum (see fox_bwd_dlogf_kernel)
    extern __shared__ float smem[];
    int ld = hd + 1;
    float* qs = smem;                          // (ATT_TILE, ld)
    float* dos = qs + ATT_TILE * ld;           // (ATT_TILE, ld)
    float* ks = dos + ATT_TILE * ld;           // (WARPS_PER_BLOCK, hd)
    float* vs = ks + WARPS_PER_BLOCK * hd;     // (WARPS_PER_BLOCK, hd)
    float* lse_s = vs + WARPS_PER_BLOCK * hd;  // (ATT_TILE) each
    float* delta_s = lse_s + ATT_TILE;
    float* c_s = delta_s + ATT_TILE;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int j_first = blockIdx.x * WARPS_PER_BLOCK, j = j_first + warp;
    int live = j < T, j_last = min(j_first + WARPS_PER_BLOCK - 1, T - 1);
    int i_end = window > 0 ? min(T - 1, j_last + window - 1) : T - 1;
    int end_j = DOCS && live ? docs.end[(size_t)b * T + j] : T;
    if (DOCS) { i_end = min(i_end, docs.end[(size_t)b * T + j_last] - 1); }
    const float* ch = c != NULL ? c + (size_t)bh * T : NULL;
    load_head_rows(ks, hd, k, b, h, j_first, WARPS_PER_BLOCK, T, H, hd);
    load_head_rows(vs, hd, v, b, h, j_first, WARPS_PER_BLOCK, T, H, hd);
    float cj = live && ch != NULL ? ch[j] : 0.0f;
    float acc_k[MAX_HD_LANE], acc_v[MAX_HD_LANE], dc_acc = 0.0f;
    #pragma unroll
    for (int r = 0; r < MAX_HD_LANE; r++) { acc_k[r] = 0.0f; acc_v[r] = 0.0f; }
    for (int i0 = j_first / ATT_TILE * ATT_TILE; i0 <= i_end; i0 += ATT_TILE) {
        __syncthreads();
        load_head_rows(qs, ld, q, b, h, i0, ATT_TILE, T, H, hd);
        load_head_rows(dos, ld, dout, b, h, i0, ATT_TILE, T, H, hd);
        if (threadIdx.x < ATT_TILE) {
            int t = i0 + threadIdx.x;
            lse_s[threadIdx.x] = t < T ? lse[(size_t)bh * T + t] : 0.0f;
            delta_s[threadIdx.x] = t < T ? delta[(size_t)bh * T + t] : 0.0f;
            c_s[threadIdx.x] = t < T && ch != NULL ? ch[t] : 0.0f;
        }
        __syncthreads();
        int i = i0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (live && i < T && i >= j && (window == 0 || i - j < window) && !(DOCS && i >= end_j)) {
            float dot = 0.0f, dp = 0.0f;
            for (int d = 0; d < hd; d++) {
                dot += qs[lane * ld + d] * ks[warp * hd + d];
                dp += dos[lane * ld + d] * vs[warp * hd + d];
            }
            p = expf(dot * scale + (ch != NULL ? c_s[lane] - cj : 0.0f) - lse_s[lane]);
            ds = p * (dp - delta_s[lane]);
        }
        for (int ii = 0; ii < ATT_TILE; ii++) {
            float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
            #pragma unroll
            for (int r = 0; r < MAX_HD_LANE; r++) {
                int d = lane + 32 * r;
                if (d < hd) {
                    acc_k[r] += dsi * qs[ii * ld + d];
                    acc_v[r] += pi * dos[ii * ld + d];
                }
            }
        }
        dc_acc += warp_sum(ds);
    }
    if (!live) { return; }
    size_t off = ((size_t)b * T + j) * H * hd + (size_t)h * hd;
    #pragma unroll
    for (int r = 0; r < MAX_HD_LANE; r++) {
        int d = lane + 32 * r;
        if (d < hd) {
            dk[off + d] = to_floatX(scale * acc_k[r]);
            dv[off + d] = to_floatX(acc_v[r]);
        }
    }
    if (dc_col != NULL && lane == 0) { dc_col[(size_t)bh * T + j] = -dc_acc; }
}

// ---- the pruning's tile count (bf16 build) ----
#ifndef ENABLE_FP32
// Tiles of the forwards since the last attention_pruned_share (-A 1): [0] skipped, [1] those the dense kernels read
// (causal, within the window), in 128 x 128 pruning tiles. One block per call; integer sums, exact in any order.
__global__ void fox_prune_count_kernel(unsigned long long* counts, const int* key_start, int BH, int nt, int window) {
    __shared__ unsigned long long s_skip[256], s_dense[256];
    unsigned long long skipped = 0, dense = 0;
    for (size_t idx = threadIdx.x; idx < (size_t)BH * nt; idx += blockDim.x) {
        int t = (int)(idx % nt), j0 = window > 0 ? t * PRUNE_BLOCK - window + 1 : 0;
        int first = j0 > 0 ? j0 / PRUNE_BLOCK : 0; // the tile of the window's first key
        dense += (unsigned long long)(t + 1 - first);
        if (key_start[idx] > first) { skipped += (unsigned long long)(key_start[idx] - first); }
    }
    s_skip[threadIdx.x] = skipped; s_dense[threadIdx.x] = dense;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            s_skip[threadIdx.x] += s_skip[threadIdx.x + stride];
            s_dense[threadIdx.x] += s_dense[threadIdx.x + stride];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) { counts[0] += s_skip[0]; counts[1] += s_dense[0]; }
}
#endif

// ---- Delta and the d(log f) scan (both implementations) ----

// Delta_i = dout_i . o_i, one warp per (token, head), written (B, H, T)
__global__ void attention_delta_kernel(float* delta, const floatX* dout, const floatX* o, size_t N, int T, int H,
                                       int hd) {
    size_t row = (size_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N * H) { return; }
    float acc = 0.0f;
    for (int d = lane; d < hd; d += 32) { acc += to_float(dout[row * hd + d]) * to_float(o[row * hd + d]); }
    acc = warp_sum(acc);
    size_t n = row / H;
    int h = (int)(row % H);
    if (lane == 0) { delta[((n / T) * H + h) * T + n % T] = acc; }
}

#ifndef ENABLE_FP32
// Delta_i = dO_i . O_i for the fused backward, in fp32, a warp per (b, h, i) row: dout, o (B, T, H, HD) bf16 with token
// stride stride_o; delta (B, H, T)
template<int HD>
__global__ void fox_bwd_delta_kernel(float* delta, const bf16* dout, const bf16* o, int BHT, int T, int H,
                                     int stride_o) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= BHT) return;
    int i = row % T, bh = row / T, h = bh % H, b = bh / H;
    size_t off = ((size_t)b * T + i) * stride_o + (size_t)h * HD;
    float s = 0.f;
    #pragma unroll
    for (int d = 2 * lane; d < HD; d += 64) {
        float2 g = __bfloat1622float2(*(const __nv_bfloat162*)(dout + off + d));
        float2 x = __bfloat1622float2(*(const __nv_bfloat162*)(o + off + d));
        s += g.x * x.x + g.y * x.y;
    }
    for (int sh = 16; sh > 0; sh >>= 1) s += __shfl_xor_sync(0xffffffff, s, sh);
    if (lane == 0) delta[row] = s;
}
#endif

// dlogf_t = sum_{s>=t} dc_s, dc = dc_col + dc_row, one (b, h) per block: each thread sums a contiguous chunk, a suffix
// scan over the chunk sums gives each chunk its carry; fp64 inside, fixed order. The row part is 0 in exact arithmetic
// but not with Delta from the rounded o: keeping it makes dlogf_0 = sum_t dc_t cancel to ~0, as it must (c_0 cancels in
// every row). DOCS (docs: the batch's, H heads) segments the scan at the document starts, as the twin's
// forget_gate_backward: dlogf_t sums s from t to the end of t's document only (a chunk's sum stops at the first start
// after its first position, and the scan adds no chunk past a start: end[t0] is the first start after t0), and
// dlogf_t0 = 0 exactly at a document start t0 > 0.
#define FOX_SCAN_THREADS 1024
template <bool DOCS>
__global__ void __launch_bounds__(FOX_SCAN_THREADS) fox_bwd_dlogf_kernel(float* dlogf, const float* dc_col,
                                                                         const float* dc_row, int T, FoxDocs docs,
                                                                         int H) {
    __shared__ double part[FOX_SCAN_THREADS];
    const float* xc = dc_col + (size_t)blockIdx.x * T;
    const float* xr = dc_row + (size_t)blockIdx.x * T;
    float* y = dlogf + (size_t)blockIdx.x * T;
    size_t b0 = (size_t)(blockIdx.x / H) * T; // DOCS: the sequence's first token
    int tid = threadIdx.x, chunk = (int)ceil_div(T, FOX_SCAN_THREADS);
    int t0 = min(T, tid * chunk), t1 = min(T, t0 + chunk);
    double sum = 0;
    int stop = DOCS && t0 < T ? min(t1, docs.end[b0 + t0]) : t1;
    for (int t = t0; t < stop; t++) sum += (double)xc[t] + xr[t];
    part[tid] = sum;
    __syncthreads();
    for (int off = 1; off < FOX_SCAN_THREADS; off <<= 1) {  // inclusive suffix scan
        double add = tid + off < FOX_SCAN_THREADS ? part[tid + off] : 0.0;
        if (DOCS && t0 < T && docs.end[b0 + t0] <= min(T, (tid + off) * chunk)) add = 0.0; // a start in between
        __syncthreads();
        part[tid] += add;
        __syncthreads();
    }
    double run = tid + 1 < FOX_SCAN_THREADS ? part[tid + 1] : 0.0;
    for (int t = t1 - 1; t >= t0; t--) {
        if (DOCS && t + 1 < T && doc_starts_at(docs, b0 + t + 1, t + 1)) run = 0.0;
        run += (double)xc[t] + xr[t];
        y[t] = DOCS && doc_starts_at(docs, b0 + t, t) ? 0.f : (float)run;
    }
}

// dlogf (B, H, T) from dc's two parts, segmented at the document starts of docs (or NULL: not)
static void fox_bwd_dlogf_gpu(float* dlogf, const float* dc_col, const float* dc_row, int B, int T, int H,
                              const FoxDocs* docs, cudaStream_t s) {
    auto kernel = docs != NULL ? fox_bwd_dlogf_kernel<true> : fox_bwd_dlogf_kernel<false>;
    kernel<<<B * H, FOX_SCAN_THREADS, 0, s>>>(dlogf, dc_col, dc_row, T, docs_or_none(docs), H);
    launchCheck();
}

// ---- the fused kernels (bf16 build): shared pieces ----
// Tiles in shared memory are the swizzled (ROWS, HD) bf16 tiles of the Hopper primitives above; a warpgroup's
// accumulator fragment holds, per thread, rows g and g + 8 (g = lane / 4) of its warp's 16 and columns 2 tq, 2 tq + 1
// (tq = lane % 4) of every 8-column block.
#ifndef ENABLE_FP32
#define LN2 0.6931471805599453f

// two floats as a bf16 pair in one register (lo in the low half)
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
// The accumulator of two adjacent n8 tiles (keys 16kk..16kk+15) is, repacked to bf16, exactly the A fragment of the k16
// step kk: a0 = (row g, k 2t..), a1 = (row g+8, k 2t..), a2/a3 = same at k+8.
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = pack_bf16(lo[0], lo[1]); a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]); a[3] = pack_bf16(hi[2], hi[3]);
}

// The warp-specialised kernels (FlashAttention-3's structure: fox_forward_kernel16 and both backward kernels): a
// producer warp fills rings of shared-memory stages, signalled by mbarriers (a full barrier per stage completes when
// the copy engine's bytes and any cp.async lanes have landed, an empty one when the consumer warps are done with it);
// setmaxnreg moves registers from the producer warpgroup to the consumers. The bf16 tiles come by TMA (fox_tensor_map,
// tma_load_tile); the fp32 rows (lse, Delta, c: (B, H, T), no tensor map for odd T) by 4-byte cp.async from the
// producer's 32 lanes, arriving on the stage's full barrier when they land, or (the backward's PRE) by plain loads,
// turned into per-column logit terms and stored, then an arrival with release semantics.

// Per stage of a ring a full barrier (full_count arrivals) and an empty one (empty_count: a warp of the consumers
// each); thread 0 only.
template<int ST>
__device__ __forceinline__ void fox_ring_barriers(uint64_t* full, uint64_t* empty, int full_count, int empty_count) {
    for (int st = 0; st < ST; st++) {
        mbar_init(&full[st], full_count);
        mbar_init(&empty[st], empty_count);
    }
}
// Thread 0 initialises the block's barriers: the fixed tile's (one arrival) and a ring's; the fence makes them (and any
// thread 0 initialised before) visible to the copy engine before any thread goes on.
template<int ST>
__device__ __forceinline__ void fox_ring_init(uint64_t* fixed_bar, uint64_t* full, uint64_t* empty, int full_count,
                                              int empty_count) {
    if (threadIdx.x == 0) {
        mbar_init(fixed_bar, 1);
        fox_ring_barriers<ST>(full, empty, full_count, empty_count);
        mbar_init_fence();
    }
    __syncthreads();
}

// the arguments of fox_attention_forward / _backward: fails with a hint on what the kernels cannot take
static void fox_check_args(const char* who, const void* q, const void* k, const void* v, int B, int T, int H,
                           int hd, int stride_qkv, int stride_o, int window) {
    if (hd != 64 && hd != 128) {
        fail("%s: head size %d is not supported\nHINT: use hd = 64 or 128 (C / H)", who, hd);
    }
    if (B < 1 || T < 1 || H < 1 || window < 0 || stride_qkv < H * hd || stride_o < H * hd) {
        fail("%s: bad shape B=%d T=%d H=%d stride_qkv=%d stride_o=%d window=%d\n"
             "HINT: strides count elements between consecutive tokens (>= H*hd); window >= 0", who, B, T, H,
             stride_qkv, stride_o, window);
    }
    if (stride_qkv % 8 || stride_o % 2 || ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) % 16) {
        fail("%s: q/k/v must be 16-byte aligned with stride_qkv %% 8 == 0, stride_o even\n"
             "HINT: q, k, v are read in 16-byte chunks; allocate with cudaMalloc and keep strides multiples of 8",
             who);
    }
}

// ---- adaptive computation pruning: the tile tables (train_fox.c: prune_bound, prune_tiles) ----
// One cheap pass before each attention call (dev/fox.md, "Adaptive computation pruning"): U per (b, h), then the
// tables. Pruning tiles are PRUNE_BLOCK = 128 queries by 128 keys; every fused kernel's query and key tiles nest in
// them (static_asserts; a forward warpgroup's 64 rows lie in one and take its key_start), so every kernel skips the
// same (query, key) pairs as the others and as the twin. key_start (B*H, nt): the first key tile a query tile keeps;
// query_end (B*H, nt): the first query tile that skips a key tile (nt = ceil(T / PRUNE_BLOCK)).

// U (B*H) = max_i |q_i| max_j |k_j| / sqrt(hd), in two passes so that a long sequence spreads over the GPU.
// fox_prune_norms_kernel: grid (chunks of PRUNE_NORM_ROWS rows, B*H), a thread per row sums its squares in fp32 in
// order (16-byte loads), then the block's maxima; fox_prune_bound_kernel: a thread per (b, h) takes the maxima of its
// chunks. Maxima are exact in any order: deterministic, no atomics.
#define PRUNE_NORM_ROWS 256
template<int HD>
__global__ void __launch_bounds__(PRUNE_NORM_ROWS) fox_prune_norms_kernel(float2* partial, const bf16* q,
                                                                          const bf16* k, int T, int H,
                                                                          int stride_qkv) {
    __shared__ float2 warp_max[PRUNE_NORM_ROWS / 32];
    int chunk = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H, t = chunk * PRUNE_NORM_ROWS + threadIdx.x;
    float sq = 0.f, sk = 0.f;
    if (t < T) {
        size_t row = ((size_t)b * T + t) * stride_qkv + (size_t)h * HD;
        const uint4* qr = (const uint4*)(q + row);
        const uint4* kr = (const uint4*)(k + row);
        #pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            uint4 qa = qr[i], ka = kr[i];
            const bf16* qv = (const bf16*)&qa;
            const bf16* kv = (const bf16*)&ka;
            #pragma unroll
            for (int j = 0; j < 8; j++) {
                float x = __bfloat162float(qv[j]), y = __bfloat162float(kv[j]);
                sq += x * x; sk += y * y;
            }
        }
    }
    #pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        sq = fmaxf(sq, __shfl_xor_sync(0xffffffff, sq, o));
        sk = fmaxf(sk, __shfl_xor_sync(0xffffffff, sk, o));
    }
    if (threadIdx.x % 32 == 0) { warp_max[threadIdx.x / 32] = make_float2(sq, sk); }
    __syncthreads();
    if (threadIdx.x == 0) {
        float2 m = warp_max[0];
        for (int w = 1; w < PRUNE_NORM_ROWS / 32; w++) {
            m.x = fmaxf(m.x, warp_max[w].x);
            m.y = fmaxf(m.y, warp_max[w].y);
        }
        partial[(size_t)bh * gridDim.x + chunk] = m;
    }
}

__global__ void fox_prune_bound_kernel(float* U, const float2* partial, int BH, int chunks, int hd) {
    int bh = blockIdx.x * blockDim.x + threadIdx.x;
    if (bh >= BH) return;
    float mq = 0.f, mk = 0.f;
    for (int i = 0; i < chunks; i++) {
        float2 m = partial[(size_t)bh * chunks + i];
        mq = fmaxf(mq, m.x); mk = fmaxf(mk, m.y);
    }
    U[bh] = sqrtf(mq) * sqrtf(mk) / sqrtf((float)hd);
}

// prune_skip of train_fox.c. DOCS: start, the sequence's document starts, skips the tiles before the document of the
// query tile's first query; ch NULL: no decay bound (then only the documents prune)
template <bool DOCS>
__device__ __forceinline__ bool fox_prune_skip(const float* ch, const int* start, int qt, int kt, float delta) {
    if (DOCS) {
        if (kt >= qt) return false;
        if (start[qt * PRUNE_BLOCK] > kt * PRUNE_BLOCK + PRUNE_BLOCK - 1) return true;
        return ch != nullptr && ch[qt * PRUNE_BLOCK] - ch[kt * PRUNE_BLOCK + PRUNE_BLOCK - 1] < delta;
    }
    return kt < qt && ch[qt * PRUNE_BLOCK] - ch[kt * PRUNE_BLOCK + PRUNE_BLOCK - 1] < delta;
}

// key_start, query_end (B*H, nt) as prune_tiles, base: prune_delta_base. A warp per (b, h, tile) runs the twin's two
// linear scans 32 tiles a step (a ballot, then the lowest lane that stops): the same first kept key tile and the same
// end as the twin, in nt / 32 steps instead of nt. DOCS: with the documents' rule (docs: the batch's, H heads); c, U
// NULL: without the decay bound.
template <bool DOCS>
__global__ void fox_prune_tiles_kernel(int* key_start, int* query_end, const float* c, const float* U, int BH, int T,
                                       int nt, float base, FoxDocs docs, int H) {
    size_t idx = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (idx >= (size_t)BH * nt) return; // the whole warp
    size_t bh = idx / nt;
    int t = (int)(idx % nt);
    const float* ch = !DOCS || c != nullptr ? c + bh * T : nullptr;
    const int* start = DOCS ? docs.start + bh / H * T : nullptr;
    float delta = !DOCS || U != nullptr ? base - 2.0f * U[bh] : 0.f;
    int s = 0; // the first key tile that is not skipped: at most t (the diagonal tile is kept)
    for (;; s += 32) {
        unsigned kept = __ballot_sync(0xffffffffu, !fox_prune_skip<DOCS>(ch, start, t, s + lane, delta));
        if (kept != 0) { s += __ffs(kept) - 1; break; }
    }
    int e = t + 1; // the first query tile that skips key tile t, or nt
    for (; e < nt; e += 32) {
        bool skip = e + lane < nt && fox_prune_skip<DOCS>(ch, start, e + lane, t, delta);
        unsigned skips = __ballot_sync(0xffffffffu, skip);
        if (skips != 0) { e += __ffs(skips) - 1; break; }
    }
    if (lane == 0) {
        key_start[idx] = s;
        query_end[idx] = e < nt ? e : nt;
    }
}

// Fills `tables` (2 * B*H*nt ints: key_start, then query_end) and U (B*H) for q, k, c; partial: scratch of B*H*ceil(T /
// PRUNE_NORM_ROWS) float2. docs: with the documents' rule, or NULL; c NULL (with docs only): no decay bound, and no U.
// The twin computes the same tables from the same U, c and document starts (test_fox.cu checks they match).
static void fox_prune_tables(int* tables, float* U, float2* partial, const bf16* q, const bf16* k, const float* c,
                             int B, int T, int H, int hd, int stride_qkv, float ln_eps, const FoxDocs* docs,
                             cudaStream_t s) {
    if (c == NULL && docs == NULL) { fail("fox_prune_tables: no decay bound and no documents" BUG_HINT); }
    int BH = B * H, nt = ceil_div(T, PRUNE_BLOCK), chunks = ceil_div(T, PRUNE_NORM_ROWS);
    dim3 grid((unsigned)chunks, (unsigned)BH);
    if (c != NULL) {
        if (hd == 64) fox_prune_norms_kernel<64><<<grid, PRUNE_NORM_ROWS, 0, s>>>(partial, q, k, T, H, stride_qkv);
        else fox_prune_norms_kernel<128><<<grid, PRUNE_NORM_ROWS, 0, s>>>(partial, q, k, T, H, stride_qkv);
        launchCheck();
        fox_prune_bound_kernel<<<(unsigned)ceil_div(BH, 128), 128, 0, s>>>(U, partial, BH, chunks, hd);
        launchCheck();
    }
    // a warp per (b, h, tile), 8 warps a block
    auto kernel = docs != NULL ? fox_prune_tiles_kernel<true> : fox_prune_tiles_kernel<false>;
    kernel<<<(unsigned)ceil_div(BH * nt, 8), 256, 0, s>>>(tables, tables + (size_t)BH * nt, c, c != NULL ? U : NULL,
                                                          BH, T, nt, prune_delta_base(ln_eps, T), docs_or_none(docs),
                                                          H);
    launchCheck();
}

// ---- the fused forward ----
// The softmax of both forward kernels, in log2 units (dev/fox.md, "Numerics"):
// - Gate terms per column, not per score. With c_ref = c of the thread's first row (a thread holds rows g and g + 8 of
//   its warp's 16), d_j = (c_ref - c_j) log2(e) once per key tile for each of the thread's columns, and x_ij = s_ij
//   scale log2(e) + d_j, one FFMA per score. The row term r_i = (c_i - c_ref) log2(e) drops out of the softmax:
//   P_ij = 2^(x_ij - m_i), m_i the row maximum of x; only lse needs it: lse_i = (m_i + r_i + log2 l_i) ln 2.
//   Precision: c reaches ~ -3e5 at T = 65536 with log f ~ -5, so c_i - c_j is never formed from two large absolutes.
//   c_ref log2(e) is rounded once, but the same fp32 value enters every d_j and r_i of the thread with opposite signs
//   and cancels exactly in x_ij + r_i; d_j and r_i are each one FFMA rounded at their own magnitude (|r_i| <= 8 |log f|
//   log2(e); |d_j| <= |r_i| + ~30 where P matters), so a logit is off by a few 1e-6, far below bf16's rounding of P
//   (2^-8 relative).
// - Lazy maximum (FlashAttention-4): m_i moves only when a tile's row maximum exceeds it by more than
//   FOX_RESCALE_LOG2, so most tiles skip rescaling O. P is then at most 2^8 (exact in fp32, fine in bf16); o = acc / l
//   and lse stay exact. The test is per warp (__any_sync): the warp rescales all its rows, also exact. Key tiles run
//   from the diagonal backwards, so that under a decaying gate the first tile already holds each row's maximum.
// - 2^x by ex2_ftz (denormal P become 0); the mask (diagonal, window edge, past T: only in the tiles touching them) as
//   two integer compares against per-row bounds.

// O is rescaled only when a row maximum grows by more than this (log2 units)
#define FOX_RESCALE_LOG2 8.0f

// Logits of one warp's 16 rows of a BC-key tile in the accumulator layout: x = s * scale_log2 + d_j (d_j as above, from
// the tile's c_j in sCb; 0 without gate), -inf where MASK and the column offset k (0..BC-1, less 2 tq) is outside
// [lo_r, hi_r]; mx: each row's maximum over the thread's entries.
template<int BC, bool GATE, bool MASK>
__device__ __forceinline__ void fox_lean_logits(float* s, float mx[2], const float* sCb, float cref_l2, int tq,
                                                float scale_log2, const int hi[2], const int lo[2]) {
    mx[0] = mx[1] = -INFINITY;
    #pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
        float d[2] = {0.f, 0.f};
        if (GATE) {
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

// p = 2^(x - m) and l += its row sums (per-thread partials; the quad sums once at the end)
template<int BC>
__device__ __forceinline__ void fox_lean_exp(float* s, float l[2], const float m[2]) {
    #pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            s[nt * 4 + e] = ex2_ftz(s[nt * 4 + e] - m[e / 2]);
            l[e / 2] += s[nt * 4 + e];
        }
    }
}

// o = acc / l (bf16) and lse = ln(sum) of the thread's rows below T; ob, lse_bh: this (b, h)'s o at token 0 and lse row
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

// The forward's tile scheduler, used alike by the producer and the consumers of fox_forward_kernel16 (persistent: a
// block per SM). Pair t is (query tile NT - 1 - t / BH, head t % BH): the longest query tiles of every head first,
// since causal tiles are uneven. A block's k-th pair is dealt by next(k): round k deals pairs k G .. k G + G - 1 to a
// grid of G blocks, block x taking the x-th in even rounds and the (G - 1 - x)-th in odd ones (snake order), so that no
// block takes the longest pair of every round. A pair's key tiles are [jt_begin, jt_end); its tile n is key tile
// jt_end - 1 - n, from the diagonal backwards.
template<int BC, int NWG>
struct FoxForwardScheduler {
    static constexpr int BR = 64 * NWG;  // query rows per pair
    int T, BH, NT, npairs, window;
    const int* key_start;                // the pruning tables' (B*H, ceil(T / PRUNE_BLOCK)), or NULL
    struct Pair { int bh, i0, jt_begin, jt_end; };

    __device__ FoxForwardScheduler(int T_, int BH_, int window_, const int* key_start_)
        : T(T_), BH(BH_), NT(ceil_div(T_, BR)), npairs(NT * BH_), window(window_), key_start(key_start_) {}
    __device__ int first() const { return blockIdx.x; }
    __device__ int next(int k) const {
        int x = (k & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
        return k * gridDim.x + x;
    }
    // first key tile the rows i0w .. i0w + 63 of head bh see: their window, the key_start of their pruning tile
    __device__ int first_tile(int bh, int i0w) const {
        int jt = window > 0 ? max(0, i0w - window + 1) / BC : 0;
        if (key_start) {
            jt = max(jt, key_start[(size_t)bh * ceil_div(T, PRUNE_BLOCK) + i0w / PRUNE_BLOCK] * (PRUNE_BLOCK / BC));
        }
        return jt;
    }
    // pair t's head, first row and key tiles (the same arithmetic in every warp); the pair loads from the smallest
    // first tile over its warpgroups with rows below T
    __device__ Pair pair(int t) const {
        Pair pr;
        pr.bh = t % BH;
        pr.i0 = (NT - 1 - t / BH) * BR;
        pr.jt_end = ceil_div(min(T, pr.i0 + BR), BC);
        pr.jt_begin = first_tile(pr.bh, pr.i0);
        #pragma unroll
        for (int w = 1; w < NWG; w++)
            if (pr.i0 + 64 * w < T) pr.jt_begin = min(pr.jt_begin, first_tile(pr.bh, pr.i0 + 64 * w));
        return pr;
    }
};

// fox_forward_kernel16's shared memory: Q, ST stages of K, V and c, and the barriers (barQ: Q landed, emptyQ: every
// consumer warp past its last S of the pair; full and empty per stage of K and of V)
template<int HD, int BC, int ST, int NWG>
struct FoxForwardSmem {
    static constexpr int BR = 64 * NWG;
    // + 1 KB to align the tiles to the swizzle pattern
    static constexpr size_t bytes = 1024 + (size_t)(BR + 2 * ST * BC) * HD * sizeof(bf16) + ST * BC * sizeof(float) +
                                    (2 + 4 * ST) * sizeof(uint64_t);
    bf16 *sQ, *sK, *sV;  // (BR, HD), (ST, BC, HD), (ST, BC, HD) swizzled tiles
    float* sC;           // (ST, BC) c of the keys
    uint64_t *barQ, *emptyQ, *fullK, *emptyK, *fullV, *emptyV;

    __device__ explicit FoxForwardSmem(unsigned char* raw) {
        sQ = (bf16*)smem_1k(raw);
        sK = sQ + BR * HD;
        sV = sK + ST * BC * HD;
        sC = (float*)(sV + ST * BC * HD);
        uint64_t* bar = (uint64_t*)(sC + ST * BC);
        barQ = bar; emptyQ = bar + 1; fullK = bar + 2; emptyK = fullK + ST; fullV = emptyK + ST; emptyV = fullV + ST;
    }
};

// The forward's producer: one warp issues every load, in pair and tile order, K(n) before V(n); the K and V rings
// run on across the block's pairs. c_j comes by cp.async from the 32 lanes, arriving on K's full barrier; each pair's Q
// after its first K and V (whose stages free up earlier), once every consumer warp has arrived at emptyQ.
template<int HD, int BC, int ST, int NWG, bool GATE>
__device__ __forceinline__ void fox_forward_producer(const FoxForwardSmem<HD, BC, ST, NWG>& sm,
                                                     const FoxForwardScheduler<BC, NWG>& sched, const CUtensorMap* tmQ,
                                                     const CUtensorMap* tmK, const CUtensorMap* tmV, const float* c,
                                                     int H) {
    constexpr int BR = 64 * NWG;
    int lane = threadIdx.x % 32, T = sched.T;
    int it = 0;  // K/V tiles this block has loaded: the rings' counter
    for (int k = 0, t = sched.first(); t < sched.npairs; t = sched.next(++k)) {
        auto pr = sched.pair(t);
        int b = pr.bh / H, h = pr.bh % H, ntiles = pr.jt_end - pr.jt_begin;
        const float* cb = GATE ? c + (size_t)pr.bh * T : nullptr;
        auto load_q = [&] {
            mbar_wait(sm.emptyQ, (k & 1) ^ 1);
            if (lane == 0) {
                mbar_expect_tx(sm.barQ, BR * HD * sizeof(bf16));
                tma_load_tile<BR, HD>(sm.sQ, tmQ, pr.i0, h, b, sm.barQ);
            }
        };
        if (ntiles == 0) load_q();  // never (the diagonal tile is kept), but Q must come
        for (int n = 0; n < ntiles; n++, it++) {
            int st = it % ST, parity = ((it / ST) & 1) ^ 1, j0 = (pr.jt_end - 1 - n) * BC;
            mbar_wait(&sm.emptyK[st], parity);
            if (lane == 0) {
                mbar_expect_tx(&sm.fullK[st], BC * HD * sizeof(bf16));
                tma_load_tile<BC, HD>(sm.sK + st * BC * HD, tmK, j0, h, b, &sm.fullK[st]);
            }
            if (GATE) {
                #pragma unroll
                for (int e = lane; e < BC; e += 32)
                    cp_async4(sm.sC + st * BC + e, cb + min(j0 + e, T - 1), j0 + e < T);
                mbar_arrive_cp_async(&sm.fullK[st]);
            }
            mbar_wait(&sm.emptyV[st], parity);
            if (lane == 0) {
                mbar_expect_tx(&sm.fullV[st], BC * HD * sizeof(bf16));
                tma_load_tile<BC, HD>(sm.sV + st * BC * HD, tmV, j0, h, b, &sm.fullV[st]);
            }
            if (n == 0) load_q();
        }
    }
}

// The forward's online softmax of one tile, in the consumer after S = Q K^T landed (s: the tile's scores, turned into
// P): the logits (masked only in the tiles that touch the diagonal, the window edge or T, and DOCS: a document start
// of the warpgroup's rows, the last of which is doc_last; row_doc: the thread's rows' document starts), K's stage
// released, the lazy maximum (alpha: O's rescale, applied by the caller after the previous P V; returns whether it is
// needed), p = 2^(x - m) and l.
template<int BC, bool GATE, bool DOCS>
__device__ __forceinline__ bool fox_forward_softmax(float* s, float m[2], float l[2], float alpha[2],
                                                    uint64_t* emptyK, const float* sCb, float cref_l2,
                                                    const int rows[2], int j0, int i0w, int T, int window,
                                                    float scale_log2, const int row_doc[2], int doc_last) {
    int lane = threadIdx.x % 32, tq = lane % 4;
    float mx[2];
    if ((j0 + BC - 1 > i0w) || (j0 + BC > T) || (window > 0 && j0 <= i0w + 63 - window) ||
        (DOCS && j0 < doc_last)) {
        int hi[2], lo[2];  // visible column offsets of each row, less this thread's 2 tq
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            hi[r] = min(rows[r], T - 1) - j0 - 2 * tq;
            lo[r] = (window > 0 ? rows[r] - window + 1 - j0 : -BC) - 2 * tq;
            if (DOCS) lo[r] = max(lo[r], row_doc[r] - j0 - 2 * tq);
        }
        fox_lean_logits<BC, GATE, true>(s, mx, sCb, cref_l2, tq, scale_log2, hi, lo);
    } else {
        fox_lean_logits<BC, GATE, false>(s, mx, sCb, cref_l2, tq, scale_log2, nullptr, nullptr);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(emptyK);  // K(n) read by S, c_j read above: the stage is free
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
    }
    // lazy maximum: O is scaled by alpha after the P V wait (P V adds P of the old maximum)
    bool resc = __any_sync(0xffffffff, mx[0] > m[0] + FOX_RESCALE_LOG2 || mx[1] > m[1] + FOX_RESCALE_LOG2);
    alpha[0] = alpha[1] = 1.f;
    if (resc) {
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            float m_new = fmaxf(m[r], mx[r]);
            alpha[r] = ex2_ftz(m[r] - m_new);  // 0 from the -FLT_MAX start
            l[r] *= alpha[r];
            m[r] = m_new;
        }
    }
    fox_lean_exp<BC>(s, l, m);
    return resc;
}

// O += P V of the ring tile x (stage x % ST) with P in registers; V's stage released after it
template<int HD, int BC, int ST>
__device__ __forceinline__ void fox_forward_pv_last(float* acc, uint32_t (&pa)[BC / 16][4], uint64_t* fullV,
                                                    uint64_t* emptyV, uint64_t dV0, int x) {
    constexpr uint32_t STAGE = BC * HD * sizeof(bf16);
    int pst = x % ST, lane = threadIdx.x % 32;
    mbar_wait(&fullV[pst], (x / ST) & 1);
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
        wgmma_rs<HD>(acc, pa[kk], desc_add(dV0, pst * STAGE + mnstep_bytes(kk)), 1);
    }
    wgmma_commit();
    wgmma_wait0();
    wgmma_pin<HD / 2>(acc); wgmma_use_a<BC / 16>(pa);
    __syncwarp();
    if (lane == 0) mbar_arrive(&emptyV[pst]);
}

// The forward consumer's mainloop over one pair's visible tiles [na, nb) (ring tiles it + n): tile n's S = Q K^T and
// tile n-1's O += P V issued back to back, a wait for S only, tile n's softmax under P V, then the wait for it, O
// rescaled (alpha from before the wait) and P refilled; then the last tile's P V. K(n) is released after tile n's
// logits, V(n-1) after its P V; no block-wide barrier. row_doc, doc_last: DOCS, see fox_forward_softmax.
template<int HD, int BC, int ST, int NWG, bool GATE, bool DOCS>
__device__ __forceinline__ void fox_forward_mainloop(float* acc, float m[2], float l[2],
                                                     const FoxForwardSmem<HD, BC, ST, NWG>& sm, uint64_t dQ,
                                                     uint64_t dK0, uint64_t dV0, float cref_l2, const int rows[2],
                                                     int i0w, int jt_end, int it, int na, int nb, int T, int window,
                                                     float scale_log2, const int row_doc[2], int doc_last) {
    constexpr int BR = 64 * NWG;
    constexpr uint32_t STAGE = BC * HD * sizeof(bf16);
    int lane = threadIdx.x % 32;
    uint32_t pa[BC / 16][4];  // P of the previous tile, read by its P V matmul under this tile's softmax
    for (int n = na; n < nb; n++) {
        int x = it + n, st = x % ST, pst = (x + ST - 1) % ST;  // this tile's stage, the previous tile's
        mbar_wait(&sm.fullK[st], (x / ST) & 1);
        if (n > na) mbar_wait(&sm.fullV[pst], ((x - 1) / ST) & 1);

        float s[BC / 2];
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<BC>(s, desc_add(dQ, kstep_bytes<BR>(kk)), desc_add(dK0, st * STAGE + kstep_bytes<BC>(kk)), kk);
        wgmma_commit();
        if (n > na) {
            #pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                wgmma_rs<HD>(acc, pa[kk], desc_add(dV0, pst * STAGE + mnstep_bytes(kk)), 1);
            }
            wgmma_commit();
            // in each branch: a join between the issue and the wait serializes the wgmma's (C7514)
            wgmma_wait<1>();
        } else {
            wgmma_wait0();
        }
        wgmma_pin<BC / 2>(s);

        float alpha[2];
        bool resc = fox_forward_softmax<BC, GATE, DOCS>(s, m, l, alpha, &sm.emptyK[st], sm.sC + st * BC, cref_l2,
                                                        rows, (jt_end - 1 - n) * BC, i0w, T, window, scale_log2,
                                                        row_doc, doc_last);
        wgmma_wait0();  // the previous tile's P V: its V stage is free, O can be rescaled, pa refilled
        wgmma_pin<HD / 2>(acc); wgmma_use_a<BC / 16>(pa);
        if (n > na && lane == 0) mbar_arrive(&sm.emptyV[pst]);
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
    if (lane == 0) mbar_arrive(sm.emptyQ);  // this warp's last S of the pair is done: Q may be reloaded
    if (na < nb) fox_forward_pv_last<HD, BC, ST>(acc, pa, sm.fullV, sm.emptyV, dV0, it + nb - 1);
}

// The forward's consumers: warpgroup cw owns rows i0 + 64 cw .. of each pair, a warp 16 of them (rows g, g + 8 per
// thread). A warpgroup computes only the tiles [na, nb) its rows see (its diagonal, window and pruning tile's
// key_start) and releases the others once landed (skip). The epilogue stores o and lse (fox_store_rows, with m back in
// absolute log2 units); the next pair's loads run under it. DOCS: the rows' document starts from docs.
template<int HD, int BC, int ST, int NWG, bool GATE, bool DOCS>
__device__ __forceinline__ void fox_forward_consumer(const FoxForwardSmem<HD, BC, ST, NWG>& sm,
                                                     const FoxForwardScheduler<BC, NWG>& sched, bf16* o, float* lse,
                                                     const float* c, int H, int stride_o, float scale_log2,
                                                     FoxDocs docs) {
    constexpr int BR = 64 * NWG;
    int T = sched.T, window = sched.window;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    int cw = __shfl_sync(0xffffffff, wg - 1, 0);  // warp-uniform, so are the descriptors below
    int cwarp = warp - 4, g = lane / 4, tq = lane % 4;
    // descriptors of k step 0: Q (this warpgroup's 64 rows); K, V of stage 0 as K-major (S) and N-major (P V) operands;
    // a stage is BC * HD * 2 bytes further
    const uint64_t dQ = desc_k<BR>(sm.sQ, cw * 8, 0), dK0 = desc_k<BC>(sm.sK, 0, 0), dV0 = desc_mn<BC>(sm.sV, 0);
    auto skip = [&](int x) {  // ring tile x, which none of this warpgroup's rows sees: released once landed
        int st = x % ST, par = (x / ST) & 1;
        mbar_wait(&sm.fullK[st], par);
        mbar_wait(&sm.fullV[st], par);
        __syncwarp();
        if (lane == 0) { mbar_arrive(&sm.emptyK[st]); mbar_arrive(&sm.emptyV[st]); }
    };
    int it = 0;  // the rings' counter at the pair's first tile, as the producer's
    for (int k = 0, t = sched.first(); t < sched.npairs; t = sched.next(++k)) {
        auto pr = sched.pair(t);
        int b = pr.bh / H, h = pr.bh % H, ntiles = pr.jt_end - pr.jt_begin, jt_end = pr.jt_end;
        const float* cb = GATE ? c + (size_t)pr.bh * T : nullptr;
        int i0w = pr.i0 + 64 * cw;
        int rows[2] = {pr.i0 + cwarp * 16 + g, pr.i0 + cwarp * 16 + g + 8};
        // visible tiles [na, nb): from the one holding the last row's diagonal to the first tile seen
        int na = ntiles, nb = ntiles;  // none when every row is past T
        if (i0w < T) {
            na = jt_end - 1 - min(i0w + 63, T - 1) / BC;
            nb = jt_end - sched.first_tile(pr.bh, i0w);
        }
        float cref_l2 = GATE ? cb[min(rows[0], T - 1)] * LOG2E : 0.f;  // c_ref log2(e), rounded once
        int row_doc[2] = {0, 0}, doc_last = 0;  // DOCS: the thread's rows' document starts, the warpgroup's last row's
        if (DOCS && i0w < T) {
            const int* sb = docs.start + (size_t)b * T;
            row_doc[0] = sb[min(rows[0], T - 1)];
            row_doc[1] = sb[min(rows[1], T - 1)];
            doc_last = sb[min(i0w + 63, T - 1)];
        }
        // m: row maxima of x so far (lazy); below any logit until the first visible key
        float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.f, 0.f}, acc[HD / 2];
        #pragma unroll
        for (int e = 0; e < HD / 2; e++) acc[e] = 0.f;
        for (int n = 0; n < na; n++) skip(it + n);
        mbar_wait(sm.barQ, k & 1);
        fox_forward_mainloop<HD, BC, ST, NWG, GATE, DOCS>(acc, m, l, sm, dQ, dK0, dV0, cref_l2, rows, i0w, jt_end, it,
                                                          na, nb, T, window, scale_log2, row_doc, doc_last);
        for (int n = nb; n < ntiles; n++) skip(it + n);
        it += ntiles;
        if (i0w >= T) continue;
        float m_abs[2];  // m + r_i: the maximum in absolute log2 units
        #pragma unroll
        for (int r = 0; r < 2; r++)
            m_abs[r] = m[r] + ((GATE && rows[r] < T) ? fmaf(cb[rows[r]], LOG2E, -cref_l2) : 0.f);
        fox_store_rows<HD>(o + (size_t)b * T * stride_o + (size_t)h * HD, lse + (size_t)pr.bh * T, acc, l, m_abs, rows,
                           tq, T, stride_o);
    }
}

// Forward version 16: the softmax above in FlashAttention-3's structure, persistent; the kernel only assigns the roles.
// Block of 128 (NWG + 1) threads, one per SM: a producer warpgroup (setmaxnreg 24; one warp loads,
// fox_forward_producer) and NWG consumer warpgroups of 64 query rows (fox_forward_consumer): at hd 64 three
// (setmaxnreg 160: 24 * 128 + 160 * 384 <= 65536 registers), at hd 128 two (240 each: O of 64 x 128 fp32, S of 64 x 128
// and the previous P live together, ~190 registers). Both walk the pairs of FoxForwardScheduler. Where it runs: see
// fox_attention_forward. DOCS: no row sees a key before its document (docs), whose earlier tiles key_start skips.
template<int HD, int BC, int ST, int NWG, bool GATE, bool DOCS>
__global__ void __launch_bounds__(128 * (NWG + 1), 1) fox_forward_kernel16(bf16* o, float* lse,
                                                                         const __grid_constant__ CUtensorMap tmQ,
                                                                         const __grid_constant__ CUtensorMap tmK,
                                                                         const __grid_constant__ CUtensorMap tmV,
                                                                         const float* c, int T, int H, int BH,
                                                                         int stride_o, int window, float scale_log2,
                                                                         const int* key_start, FoxDocs docs) {
    constexpr int CREG = NWG == 3 ? 160 : 240;  // consumer registers: (65536 - 24 * 128) / (128 NWG), rounded to 8
    static_assert(BC == 128 && ((HD == 64 && NWG == 3) || (HD == 128 && NWG == 2)),
                  "the register budgets argued: hd 64 with three consumers, hd 128 with two; 128-key tiles");
    static_assert(ST >= 2, "the producer loads K(n+1) before V(n)'s stage is free");
    static_assert(PRUNE_BLOCK % BC == 0 && PRUNE_BLOCK % 64 == 0, "a warpgroup's rows lie in one pruning tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    FoxForwardSmem<HD, BC, ST, NWG> sm(smem_raw);
    FoxForwardScheduler<BC, NWG> sched(T, BH, window, key_start);
    // K's full barrier: the copy engine's arrival + the 32 c lanes; empty and emptyQ: a warp of the consumers each
    if (threadIdx.x == 0) {
        mbar_init(sm.emptyQ, 4 * NWG);
        fox_ring_barriers<ST>(sm.fullV, sm.emptyV, 1, 4 * NWG);  // fenced by fox_ring_init
    }
    fox_ring_init<ST>(sm.barQ, sm.fullK, sm.emptyK, 1 + (GATE ? 32 : 0), 4 * NWG);
    if (threadIdx.x / 128 == 0) {
        setmaxnreg_dec<24>();
        if (threadIdx.x / 32 == 0) fox_forward_producer<HD, BC, ST, NWG, GATE>(sm, sched, &tmQ, &tmK, &tmV, c, H);
        return;
    }
    setmaxnreg_inc<CREG>();
    fox_forward_consumer<HD, BC, ST, NWG, GATE, DOCS>(sm, sched, o, lse, c, H, stride_o, scale_log2, docs);
}

// fox_forward_kernel16 with its tiles and stages (see fox_attention_forward); a block per SM, at most one per pair
template<int HD, bool GATE, bool DOCS>
static void fox_forward16_gpu(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                              int B, int T, int H, int stride_qkv, int stride_o, int window, const int* key_start,
                              FoxDocs docs, cudaStream_t s) {
    constexpr int BC = 128, NWG = HD == 64 ? 3 : 2, ST = HD == 64 ? 3 : 2, BR = 64 * NWG;
    constexpr size_t smem = FoxForwardSmem<HD, BC, ST, NWG>::bytes;
    smem_limit(smem, fox_forward_kernel16<HD, BC, ST, NWG, GATE, DOCS>);
    int dev, sms;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUtensorMap tq = fox_tensor_map(q, B, T, H, HD, stride_qkv, BR);
    CUtensorMap tk = fox_tensor_map(k, B, T, H, HD, stride_qkv, BC);
    CUtensorMap tv = fox_tensor_map(v, B, T, H, HD, stride_qkv, BC);
    int npairs = ceil_div(T, BR) * B * H;
    float scale_log2 = LOG2E / sqrtf((float)HD);
    int grid = min(npairs, TEST_HOOK(fwd_max_blocks, 0) > 0 ? TEST_HOOK(fwd_max_blocks, 0) : sms);
    fox_forward_kernel16<HD, BC, ST, NWG, GATE, DOCS><<<grid, 128 * (NWG + 1), smem, s>>>(
        o, lse, tq, tk, tv, c, T, H, B * H, stride_o, window, scale_log2, key_start, docs);
    launchCheck();
}

// the instance F<hd, gate, docs> of a launcher template over the head size (64 or 128) and two flags
#define FOX_PICK(F, hd, gate, docs)                                                                              \
    ((hd) == 64 ? ((gate) ? ((docs) ? F<64, true, true> : F<64, true, false>)                                   \
                          : ((docs) ? F<64, false, true> : F<64, false, false>))                                \
                : ((gate) ? ((docs) ? F<128, true, true> : F<128, true, false>)                                 \
                          : ((docs) ? F<128, false, true> : F<128, false, false>)))

// o: bf16 (B, T, H, hd), token stride stride_o; lse: fp32 (B, H, T), saved for the backward. q, k, v: bf16 (B, T, H,
// hd), token stride stride_qkv (H*hd separate, 3*H*hd packed qkv). c: fp32 (B, H, T) cumulative log forget gate, or
// NULL for plain causal attention.
// window: query i sees keys i - window < j <= i; 0 means no window.
// key_start: (B*H, ceil(T / PRUNE_BLOCK)) from fox_prune_tables, or NULL (dense); needs c or docs.
// docs: documents kept apart (query i sees no key before its document's start), or NULL.
void fox_attention_forward(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const float* c,
                           int B, int T, int H, int hd, int stride_qkv, int stride_o, int window,
                           const int* key_start, const FoxDocs* docs, cudaStream_t s) {
    fox_check_args("fox_attention_forward", q, k, v, B, T, H, hd, stride_qkv, stride_o, window);
    if (key_start && !c && !docs) {
        fail("fox_attention_forward: pruning tiles without a forget gate or documents\n"
             "HINT: pass key_start = NULL when c and docs are NULL");
    }
    // What runs (the one place that says it): hd 64: fox_forward_kernel16<64, 128, 3, 3, GATE, DOCS> (512 threads:
    // three consumer warpgroups, 192 query rows a pair, K and V rings of 3 stages, 122.6 KB of shared memory); hd 128:
    // fox_forward_kernel16<128, 128, 2, 2, GATE, DOCS> (384 threads: two consumers, 128 rows a pair, 2 stages, 162.1
    // KB). Without c, GATE = false and no decay pruning; without docs, DOCS = false.
    auto run = FOX_PICK(fox_forward16_gpu, hd, c != NULL, docs != NULL);
    run(o, lse, q, k, v, c, B, T, H, stride_qkv, stride_o, window, key_start, docs_or_none(docs), s);
}

// ---- the fused backward ----
// The forward differentiated: o_i = sum_j P_ij v_j, P_ij = exp(S_ij - lse_i), S_ij = q_i.k_j * scale + c_i - c_j.
// dv_j = sum_i P_ij dO_i; dS_ij = P_ij (dO_i.v_j - Delta_i); dk_j = scale sum_i dS_ij q_i; dq_i = scale sum_j dS_ij
// k_j; dc_t = sum_j dS_tj - sum_i dS_it. Two warp-specialised kernels of 384 threads, each block owning one 128-row
// tile (one pruning tile): dK/dV (a key tile; query tiles streamed) and dQ (a query tile; key tiles streamed).
// Warpgroup 0 is the producer (fox_bwd_producer, setmaxnreg 24); warpgroups 1 and 2 consume 64 rows each
// (setmaxnreg 240). The fixed pair of tiles comes once, the streamed pairs and their per-row floats through a
// ring of ST stages. The consumers are not kept in lockstep: each waits only for its stage and releases it after its
// last matmul on it, so one's element-wise work runs under the other's matmuls. No accumulator of an in-flight wgmma is
// defined by other code (ptxas would say C7515 and serialise the wgmmas); the dQ kernel's cross-tile overlap
// (OVL, hd 64) makes ptxas inject one wait after its loop (its info C7517, expected). Masks are selects against two
// integer bounds per row; descriptors are computed once (warp-uniform) and advanced by constants (desc_add). PRE: the
// producer's lanes form the per-column logit terms once per stage (plain loads before the wait for the stage,
// st.shared, an arrival with release semantics), the same operations on the same values as the consumers' (P and dS
// keep their bits).

// The producer warp of both backward kernels (lane 0 issues the copies; the whole warp runs the per-row loads): the
// block's own pair of tiles (K, V of the key tile, or Q, dO of the query tile) on fixed_bar, then for each of ntiles
// streamed pairs of ROWS-row tiles from first_row on (Q, dO or K, V), stage n % ST once the consumers have freed it
// (empty), arriving on full[st] with the copy engine's bytes; row_loads(st, row0) adds the per-row vectors (arriving
// there too), and row_fetch(row0) runs before the wait for the stage (PRE: the plain loads of those vectors, read-only
// inputs, so that their latency runs under the wait).
template<int FIXED_ROWS, int ROWS, int HD, int ST, typename RowFetch, typename RowLoads>
__device__ __forceinline__ void fox_bwd_producer(bf16* sFa, bf16* sFb, const CUtensorMap* tFa, const CUtensorMap* tFb,
                                                 int fixed_row, uint64_t* fixed_bar, bf16* sA, bf16* sB,
                                                 const CUtensorMap* tA, const CUtensorMap* tB, int first_row,
                                                 int ntiles, uint64_t* full, uint64_t* empty, int h, int b, int lane,
                                                 RowFetch row_fetch, RowLoads row_loads) {
    if (lane == 0) {
        mbar_expect_tx(fixed_bar, 2 * FIXED_ROWS * HD * sizeof(bf16));
        tma_load_tile<FIXED_ROWS, HD>(sFa, tFa, fixed_row, h, b, fixed_bar);
        tma_load_tile<FIXED_ROWS, HD>(sFb, tFb, fixed_row, h, b, fixed_bar);
    }
    for (int n = 0; n < ntiles; n++) {
        int st = n % ST, r1 = first_row + n * ROWS;
        row_fetch(r1);
        mbar_wait(&empty[st], ((n / ST) & 1) ^ 1);
        if (lane == 0) {
            mbar_expect_tx(&full[st], 2 * ROWS * HD * sizeof(bf16));
            tma_load_tile<ROWS, HD>(sA + st * ROWS * HD, tA, r1, h, b, &full[st]);
            tma_load_tile<ROWS, HD>(sB + st * ROWS * HD, tB, r1, h, b, &full[st]);
        }
        row_loads(st, r1);
    }
}

// The logit of (query i, key j) in log2 units from a term per row and one per column, computed with the same
// operations in both kernels so that they see the same P and dS bits: dc's row sums (dQ kernel) and column sums (dK/dV
// kernel) add the same values, and d(log f_0) = sum_t dc_t is 0 up to summation order (exactly 0 at window 1). With
// cb_l2 = c_b log2 e (c_b = c of the first key of j's 128-key block, the dK/dV block's), a query term A_i = (c_i
// log2 e - cb_l2) - lse_i log2 e (an FFMA of the exact product, then the rounded lse_i log2 e subtracted: two
// roundings at |A_i|) and a key term B_j = cb_l2 - c_j log2 e (one FFMA), x = s scale_log2 + (A_i + B_j); cb_l2's own
// rounding cancels in A_i + B_j. Every entry whose P matters has |c_i - c_b| within ~30 + 128 |log f|, so the logit is
// off by at most ~6e-5 (log2 units) at log f = -5, below bf16's rounding of P. Without gate A_i = -lse_i log2 e,
// B_j = 0. Intrinsics: no FMA contraction may differ between the kernels.
__device__ __forceinline__ float fox_lean_qterm(float c_i, float lse_i, float cb_l2, bool gate) {
    float l2 = __fmul_rn(lse_i, LOG2E);
    return gate ? __fsub_rn(fmaf(c_i, LOG2E, -cb_l2), l2) : -l2;
}
__device__ __forceinline__ float fox_lean_kterm(float c_j, float cb_l2) { return fmaf(-c_j, LOG2E, cb_l2); }

// dK/dV: P^T in place for one warp's 16 keys x BQ queries (accumulator layout: rows g, g + 8 are the thread's keys,
// columns 2 tq, 2 tq + 1 of each 8-column block its queries).
// p = 2^(s scale_log2 + (A_i + B_row)) (above; B: the rows' key terms). MASK: p = 0 where the column offset (less 2
// tq) is outside [lo, hi] of the row (selected, never multiplied).
// PRE: the stage holds the columns' A's (sLb, the producer's); else they are formed here from the stage's lse and c
// (sLb, sCb).
template<int BQ, bool GATE, bool MASK, bool PRE>
__device__ __forceinline__ void fox_bwd_lean_pt(float* s, const float* sLb, const float* sCb, float cb_l2,
                                                const float B[2], float scale_log2, int tq, const int* lo,
                                                const int* hi) {
    #pragma unroll
    for (int nt = 0; nt < BQ / 8; nt++) {
        float a[2];  // [column]
        if (PRE) {
            float2 ap = *(const float2*)(sLb + nt * 8 + 2 * tq);
            a[0] = ap.x;
            a[1] = ap.y;
        } else {
            float2 l = *(const float2*)(sLb + nt * 8 + 2 * tq), ci = make_float2(0.f, 0.f);
            if (GATE) ci = *(const float2*)(sCb + nt * 8 + 2 * tq);
            a[0] = fox_lean_qterm(ci.x, l.x, cb_l2, GATE);
            a[1] = fox_lean_qterm(ci.y, l.y, cb_l2, GATE);
        }
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            float t = GATE ? __fadd_rn(a[e & 1], B[e / 2]) : a[e & 1];
            float p = ex2_ftz(fmaf(s[nt * 4 + e], scale_log2, t));  // one MUFU.EX2; denormals 0
            if (MASK) {
                int kc = nt * 8 + (e & 1);  // compile-time: the bounds carry the thread's 2 tq
                if (kc < lo[e / 2] || kc > hi[e / 2]) p = 0.f;
            }
            s[nt * 4 + e] = p;
        }
    }
}
// dK/dV: dS^T = P^T (dP^T - Delta) in place of dP^T, the columns' Delta's read from the stage (sDb); dcs: the rows'
// (keys') sums of dS
template<int BQ>
__device__ __forceinline__ void fox_bwd_lean_dst(float* dp, const float* s, const float* sDb, float dcs[2], int tq) {
    #pragma unroll
    for (int nt = 0; nt < BQ / 8; nt++) {
        float2 d = *(const float2*)(sDb + nt * 8 + 2 * tq);
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            float ds = s[nt * 4 + e] * (dp[nt * 4 + e] - ((e & 1) ? d.y : d.x));
            dcs[e / 2] += ds;
            dp[nt * 4 + e] = ds;
        }
    }
}
// dQ: P in place for one warp's 16 queries x BC keys (rows g, g + 8 the thread's queries, columns its keys): p = 2^(s
// scale_log2 + (A_row + B_j)) (above; A: the rows' query terms for the tile's key block), as in the dK/dV kernel. sCb:
// the stage's c of the keys, or PRE: their terms B_j.
template<int BC, bool GATE, bool MASK, bool PRE>
__device__ __forceinline__ void fox_bwd_lean_p(float* s, const float* sCb, float cb_l2, const float A[2],
                                               float scale_log2, int tq, const int* lo, const int* hi) {
    #pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
        float b[2] = {0.f, 0.f};  // [column]
        if (GATE) {
            float2 cj = *(const float2*)(sCb + nt * 8 + 2 * tq);
            b[0] = PRE ? cj.x : fox_lean_kterm(cj.x, cb_l2);
            b[1] = PRE ? cj.y : fox_lean_kterm(cj.y, cb_l2);
        }
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            float t = GATE ? __fadd_rn(A[e / 2], b[e & 1]) : A[e / 2];
            float p = ex2_ftz(fmaf(s[nt * 4 + e], scale_log2, t));
            if (MASK) {
                int kc = nt * 8 + (e & 1);
                if (kc < lo[e / 2] || kc > hi[e / 2]) p = 0.f;
            }
            s[nt * 4 + e] = p;
        }
    }
}
// dQ: dS = P (dP - Delta) in place of P; rs: the rows' sums of dS
template<int BC>
__device__ __forceinline__ void fox_bwd_lean_ds(float* s, const float* dp, const float rd[2], float rs[2]) {
    #pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            float ds = s[nt * 4 + e] * (dp[nt * 4 + e] - rd[e / 2]);
            s[nt * 4 + e] = ds;
            rs[e / 2] += ds;
        }
    }
}

// dK/dV: a consumer's (64 keys, BQ queries) fp32 accumulator as the bf16 A fragments of its next matmul, and that
// matmul, D (64 x HD) += A B over the tile's BQ queries (B: N-major, from b0 at stage offset so); the caller fences
// before and commits after
template<int BQ>
__device__ __forceinline__ void fox_bwd_to_a(uint32_t a[][4], const float* acc) {
    #pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++) acc_to_a(a[kk], acc + 8 * kk, acc + 8 * kk + 4);
}
template<int HD, int BQ>
__device__ __forceinline__ void fox_bwd_rs(float* d, uint32_t a[][4], uint64_t b0, uint32_t so) {
    #pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(d, a[kk], desc_add(b0, so + mnstep_bytes(kk)), 1);
}

// the dK/dV kernel's shared memory: K, V of the key tile; ST stages of Q, dO and their floats (lse, Delta, c; PRE: A_i,
// Delta); the barriers (barKV, full and empty per stage)
template<int HD, int BQ, int ST, bool PRE>
struct FoxDkdvSmem {
    static constexpr int BK = 128;
    // + 1 KB to align the tiles to the swizzle pattern
    static constexpr size_t bytes = 1024 + (size_t)(2 * BK + 2 * ST * BQ) * HD * sizeof(bf16) +
                                    (PRE ? 2 : 3) * ST * BQ * sizeof(float) + (1 + 2 * ST) * sizeof(uint64_t);
    bf16 *sK, *sV, *sQ, *sG;  // (BK, HD), (BK, HD), (ST, BQ, HD), (ST, BQ, HD) dO: swizzled tiles
    float *sL, *sD, *sC;      // (ST, BQ): lse (PRE: the queries' terms A_i, fox_lean_qterm), Delta, c (not with PRE)
    uint64_t *barKV, *full, *empty;

    __device__ explicit FoxDkdvSmem(unsigned char* raw) {
        sK = (bf16*)smem_1k(raw);
        sV = sK + BK * HD;
        sQ = sV + BK * HD;
        sG = sQ + ST * BQ * HD;
        sL = (float*)(sG + ST * BQ * HD);
        sD = sL + ST * BQ;
        sC = sD + ST * BQ;
        uint64_t* bar = (uint64_t*)(PRE ? sC : sC + ST * BQ);
        barKV = bar; full = bar + 1; empty = full + ST;
    }
};

// The dK/dV kernel's producer warp: K, V once, then the query tiles [it_begin, it_begin + ntiles) with their lse,
// Delta, c by cp.async, or (PRE) by plain loads turned into the terms A_i here
template<int HD, int BQ, int ST, bool GATE, bool PRE>
__device__ __forceinline__ void fox_backward_dkdv_producer(const FoxDkdvSmem<HD, BQ, ST, PRE>& sm,
                                                           const CUtensorMap* tmQ, const CUtensorMap* tmG,
                                                           const CUtensorMap* tmK, const CUtensorMap* tmV,
                                                           const float* lb, const float* db, const float* cb, int j0,
                                                           int it_begin, int ntiles, int T, int h, int b) {
    constexpr int BK = 128;
    int lane = threadIdx.x % 32;
    float fl[BQ / 32], fd[BQ / 32], fc[BQ / 32];  // PRE: the stage's lse, Delta, c (lane + 32 r)
    const float cb_l2 = (PRE && GATE) ? __fmul_rn(cb[j0], LOG2E) : 0.f;  // the consumers' cb_l2, the same operation
    fox_bwd_producer<BK, BQ, HD, ST>(sm.sK, sm.sV, tmK, tmV, j0, sm.barKV, sm.sQ, sm.sG, tmQ, tmG, it_begin * BQ,
                                     ntiles, sm.full, sm.empty, h, b, lane, [&](int i1) {
        if (PRE) {
            #pragma unroll
            for (int r = 0; r < BQ / 32; r++) {  // past T: zeros, as the cp.async's (those columns are masked)
                int e = lane + 32 * r, i = min(i1 + e, T - 1);
                bool ok = i1 + e < T;
                float l = lb[i], d = db[i], ci = GATE ? cb[i] : 0.f;
                fl[r] = ok ? l : 0.f;
                fd[r] = ok ? d : 0.f;
                fc[r] = ok ? ci : 0.f;
            }
        }
    }, [&](int st, int i1) {
        if (PRE) {
            #pragma unroll
            for (int r = 0; r < BQ / 32; r++) {
                int e = lane + 32 * r;
                sm.sL[st * BQ + e] = fox_lean_qterm(fc[r], fl[r], cb_l2, GATE);
                sm.sD[st * BQ + e] = fd[r];
            }
            mbar_arrive_release(&sm.full[st]);  // after this lane's stores
        } else {
            #pragma unroll
            for (int e = lane; e < BQ; e += 32) {  // past T: zeros
                int i = min(i1 + e, T - 1);
                bool ok = i1 + e < T;
                cp_async4(sm.sL + st * BQ + e, lb + i, ok);
                cp_async4(sm.sD + st * BQ + e, db + i, ok);
                if (GATE) cp_async4(sm.sC + st * BQ + e, cb + i, ok);
            }
            mbar_arrive_cp_async(&sm.full[st]);
        }
    });
}

// The dK/dV consumer's mainloop step on one seen query tile (stage st, first query i0): S^T = K Q^T and dP^T = V
// dO^T in two commit groups (P^T's exponentials run under dP^T), then
// - BQ = 64 (hd 128; the consumers form the A_i): dV += P^T dO, dS^T = P^T (dP^T - Delta) under dV, dK += dS^T Q;
// - BQ = 128 (hd 64, PRE): dS^T first, then dV and dK in one commit group: S^T, dP^T (64 + 64 floats), the accumulators
//   (32 + 32) and P^T's A fragments (32, read by an in-flight dV) would not fit the consumers' 240 registers together.
// The A_i and Delta_i are read from the stage where they are used. The descriptors d*0 are of k step 0 and stage 0:
// K, V (this consumer's 64 rows), Q, dO as K-major (S^T, dP^T) and N-major (dK, dV). DOCS: end_first, the end of the
// consumer's first key's document (the earliest of its keys'), also masks the tiles that reach past it.
template<int HD, int BQ, int ST, bool GATE, bool PRE, bool DOCS>
__device__ __forceinline__ void fox_backward_dkdv_tile(float* dka, float* dva, float dcs[2],
                                                       const FoxDkdvSmem<HD, BQ, ST, PRE>& sm, int st, int i0,
                                                       int j0w, uint64_t dK0, uint64_t dV0, uint64_t dQ0,
                                                       uint64_t dG0, uint64_t dQn0, uint64_t dGn0, float cb_l2,
                                                       const float B[2], const int lo0[2], const int hi0[2], int T,
                                                       int window, float scale_log2, int end_first) {
    constexpr int BK = 128;
    constexpr uint32_t STAGE = BQ * HD * sizeof(bf16);
    int tq = threadIdx.x % 4;
    const float *sLb = sm.sL + st * BQ, *sDb = sm.sD + st * BQ, *sCb = sm.sC + st * BQ;
    uint32_t so = st * STAGE;
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];  // A fragments of P^T, dS^T
    float s[BQ / 2], dp[BQ / 2];
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_ss<BQ>(s, desc_add(dK0, kstep_bytes<BK>(kk)), desc_add(dQ0, so + kstep_bytes<BQ>(kk)), kk);
    wgmma_commit();
    #pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_ss<BQ>(dp, desc_add(dV0, kstep_bytes<BK>(kk)), desc_add(dG0, so + kstep_bytes<BQ>(kk)), kk);
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_pin<BQ / 2>(s);
    // P^T in place; the tiles that touch the diagonal, the window's edge, T or (DOCS) a key's document end are masked
    if ((i0 < j0w + 63) || (i0 + BQ > T) || (window > 0 && i0 + BQ - 1 - j0w >= window) ||
        (DOCS && i0 + BQ > end_first)) {
        int lo[2] = {lo0[0] - i0, lo0[1] - i0}, hi[2] = {hi0[0] - i0, hi0[1] - i0};
        fox_bwd_lean_pt<BQ, GATE, true, PRE>(s, sLb, sCb, cb_l2, B, scale_log2, tq, lo, hi);
    } else {
        fox_bwd_lean_pt<BQ, GATE, false, PRE>(s, sLb, sCb, cb_l2, B, scale_log2, tq, nullptr, nullptr);
    }
    if constexpr (BQ == 128) {  // dS^T, then dV += P^T dO and dK += dS^T Q in one commit group
        wgmma_wait<0>();
        wgmma_pin<BQ / 2>(dp);
        fox_bwd_lean_dst<BQ>(dp, s, sDb, dcs, tq);
        fox_bwd_to_a<BQ>(pa, s);
        fox_bwd_to_a<BQ>(sa, dp);
        wgmma_fence();
        fox_bwd_rs<HD, BQ>(dva, pa, dGn0, so);
        fox_bwd_rs<HD, BQ>(dka, sa, dQn0, so);
    } else {
        // dV += P^T dO
        fox_bwd_to_a<BQ>(pa, s);
        wgmma_fence();
        fox_bwd_rs<HD, BQ>(dva, pa, dGn0, so);
        wgmma_commit();
        wgmma_wait<1>();  // dP^T done (dV may still run)
        wgmma_pin<BQ / 2>(dp);
        fox_bwd_lean_dst<BQ>(dp, s, sDb, dcs, tq);
        // dK += dS^T Q
        fox_bwd_to_a<BQ>(sa, dp);
        wgmma_fence();
        fox_bwd_rs<HD, BQ>(dka, sa, dQn0, so);
    }
    wgmma_commit();
    wgmma_wait0();
    wgmma_pin<HD / 2>(dva); wgmma_pin<HD / 2>(dka);
    wgmma_pin_a<BQ / 16>(pa); wgmma_pin_a<BQ / 16>(sa);
}

// The dK/dV epilogue: dk (times scale), dv and dc_j = -sum_i dS_ij of the thread's two keys
template<int HD, bool GATE>
__device__ __forceinline__ void fox_backward_dkdv_store(bf16* dkb, bf16* dvb, float* dc_bh, const float* dka,
                                                        const float* dva, float dcs[2], const int keys[2], int T,
                                                        int stride_qkv, float scale) {
    int tq = threadIdx.x % 4;
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = keys[r];
        if (GATE) {  // fixed shuffle order: deterministic
            dcs[r] += __shfl_xor_sync(0xffffffff, dcs[r], 1);
            dcs[r] += __shfl_xor_sync(0xffffffff, dcs[r], 2);
            if (tq == 0 && key < T) dc_bh[key] = -dcs[r];
        }
        if (key >= T) continue;
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            int col = dt * 8 + 2 * tq;
            *(__nv_bfloat162*)(dkb + (size_t)key * stride_qkv + col) =
                __floats2bfloat162_rn(dka[dt * 4 + 2 * r] * scale, dka[dt * 4 + 2 * r + 1] * scale);
            *(__nv_bfloat162*)(dvb + (size_t)key * stride_qkv + col) =
                __floats2bfloat162_rn(dva[dt * 4 + 2 * r], dva[dt * 4 + 2 * r + 1]);
        }
    }
}

// The dK/dV consumers: cw owns keys j0 + 64 cw .. + 63 (a warp 16 of them, rows g, g + 8 per thread); a query tile
// none of whose queries sees those keys is released unread. DOCS: endb, the sequence's document ends: key j is seen by
// the queries before its document's end only.
template<int HD, int BQ, int ST, bool GATE, bool PRE, bool DOCS>
__device__ __forceinline__ void fox_backward_dkdv_consumer(const FoxDkdvSmem<HD, BQ, ST, PRE>& sm, bf16* dkb,
                                                           bf16* dvb, float* dc_bh, const float* cb, int j0,
                                                           int it_begin, int ntiles, int T, int stride_qkv,
                                                           int window, float scale_log2, float scale,
                                                           const int* endb) {
    constexpr int BK = 128;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    int cw = __shfl_sync(0xffffffff, wg - 1, 0);  // warp-uniform, so are the descriptors below
    int cwarp = warp - 4, g = lane / 4, tq = lane % 4;
    int j0w = j0 + 64 * cw;  // this consumer's first key
    int keys[2], lo0[2], hi0[2];  // mask bounds: visible query offsets (less 2 tq) from query 0
    float cj[2], dcs[2] = {0.f, 0.f};
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        keys[r] = j0 + cwarp * 16 + g + 8 * r;
        cj[r] = (GATE && keys[r] < T) ? cb[keys[r]] : 0.f;
        lo0[r] = keys[r] - 2 * tq;
        hi0[r] = (window > 0 ? min(T - 1, keys[r] + window - 1) : T - 1) - 2 * tq;
        if (DOCS) hi0[r] = min(hi0[r], endb[min(keys[r], T - 1)] - 1 - 2 * tq);
    }
    int end_first = DOCS ? endb[min(j0w, T - 1)] : T;
    float cb_l2 = GATE ? __fmul_rn(cb[j0], LOG2E) : 0.f;  // c of the block's first key, log2 units
    float B[2] = {fox_lean_kterm(cj[0], cb_l2), fox_lean_kterm(cj[1], cb_l2)};  // the rows' key terms
    float dka[HD / 2], dva[HD / 2];
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) dka[e] = dva[e] = 0.f;
    const uint64_t dK0 = desc_k<BK>(sm.sK, cw * 8, 0), dV0 = desc_k<BK>(sm.sV, cw * 8, 0);
    const uint64_t dQ0 = desc_k<BQ>(sm.sQ, 0, 0), dG0 = desc_k<BQ>(sm.sG, 0, 0);
    const uint64_t dQn0 = desc_mn<BQ>(sm.sQ, 0), dGn0 = desc_mn<BQ>(sm.sG, 0);
    mbar_wait(sm.barKV, 0);
    for (int n = 0; n < ntiles; n++) {
        int st = n % ST, i0 = (it_begin + n) * BQ;
        mbar_wait(&sm.full[st], (n / ST) & 1);
        // every query of the tile before this consumer's first key, or past the window of its last one: P = 0
        bool seen = i0 + BQ > j0w && !(window > 0 && i0 - (j0w + 63) >= window);
        if (seen) {
            fox_backward_dkdv_tile<HD, BQ, ST, GATE, PRE, DOCS>(dka, dva, dcs, sm, st, i0, j0w, dK0, dV0, dQ0, dG0,
                                                                dQn0, dGn0, cb_l2, B, lo0, hi0, T, window, scale_log2,
                                                                end_first);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&sm.empty[st]);  // this warp is done with the stage's Q, dO and floats
    }
    fox_backward_dkdv_store<HD, GATE>(dkb, dvb, dc_bh, dka, dva, dcs, keys, T, stride_qkv, scale);
}

// Backward version 20 (hd 64: BQ 128, PRE) and 22 (hd 128: BQ 64), the dK/dV kernel: dv_j = sum_i P_ij dO_i, dk_j =
// scale sum_i dS_ij q_i, dc_j -= sum_i dS_ij (above) for the 128-key tile blockIdx.x (K, V fixed; the first key tiles
// see the most queries and are scheduled first). The kernel only assigns the roles: the producer
// (fox_backward_dkdv_producer) and two consumers (fox_backward_dkdv_consumer) over the query tiles that see the key
// tile: from its diagonal to the window's end, less the pruned ones (query_end (B*H, ceil(T / 128)): the query
// tiles of 128 from query_end on; NULL: none). Grid (ceil(T / 128), B*H); shared memory FoxDkdvSmem. Where it runs: see
// fox_attention_backward. DOCS: no query sees a key of an earlier document (docs).
template<int HD, int BQ, int ST, bool GATE, bool PRE, bool DOCS>
__global__ void __launch_bounds__(384, 1) fox_backward_dkdv_kernel20(bf16* dk, bf16* dv, float* dc,
                                                                   const __grid_constant__ CUtensorMap tmQ,
                                                                   const __grid_constant__ CUtensorMap tmG,
                                                                   const __grid_constant__ CUtensorMap tmK,
                                                                   const __grid_constant__ CUtensorMap tmV,
                                                                   const float* lse, const float* delta,
                                                                   const float* c, int T, int H, int stride_qkv,
                                                                   int window, float scale_log2, float scale,
                                                                   const int* query_end, FoxDocs docs) {
    constexpr int BK = 128;
    static_assert(BK == PRUNE_BLOCK && PRUNE_BLOCK % BQ == 0 && BQ % 32 == 0, "a key tile is one pruning tile");
    static_assert(PRE == (BQ == 128), "the two configurations that run: BQ 128 with PRE (hd 64), 64 without");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    FoxDkdvSmem<HD, BQ, ST, PRE> sm(smem_raw);
    int kt = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
    const float *lb = lse + (size_t)bh * T, *db = delta + (size_t)bh * T;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int j0 = kt * BK;
    int i_end = window > 0 ? min(T, j0 + BK - 1 + window) : T;  // last query that sees the tile, +1
    int it_begin = j0 / BQ, it_end = ceil_div(i_end, BQ);
    // pruned query tiles are never loaded (the diagonal one is kept, so it_begin < it_end)
    if (query_end) it_end = min(it_end, query_end[(size_t)bh * gridDim.x + kt] * (PRUNE_BLOCK / BQ));
    int ntiles = it_end - it_begin;
    // full: the copy engine's arrival + the 32 lanes' lse, Delta, c (PRE: A, Delta)
    fox_ring_init<ST>(sm.barKV, sm.full, sm.empty, 1 + 32, 8);
    if (threadIdx.x / 128 == 0) {
        setmaxnreg_dec<24>();
        if (threadIdx.x / 32 == 0) {
            fox_backward_dkdv_producer<HD, BQ, ST, GATE, PRE>(sm, &tmQ, &tmG, &tmK, &tmV, lb, db, cb, j0, it_begin,
                                                              ntiles, T, h, b);
        }
        return;
    }
    setmaxnreg_inc<240>();
    fox_backward_dkdv_consumer<HD, BQ, ST, GATE, PRE, DOCS>(sm, dk + (size_t)b * T * stride_qkv + (size_t)h * HD,
                                                            dv + (size_t)b * T * stride_qkv + (size_t)h * HD,
                                                            dc + (size_t)bh * T, cb, j0, it_begin, ntiles, T,
                                                            stride_qkv, window, scale_log2, scale,
                                                            DOCS ? docs.end + (size_t)b * T : nullptr);
}

// the dQ kernel's shared memory: Q, dO of the query tile; ST stages of K, V and the keys' c (PRE: their terms B_j,
// fox_lean_kterm, and the stage's c_b log2 e in 2 ST floats for alignment); the barriers (barQ, full and empty per
// stage)
template<int HD, int BC, int ST, bool PRE>
struct FoxDqSmem {
    static constexpr int BR = 128;
    // + 1 KB to align the tiles to the swizzle pattern
    static constexpr size_t bytes = 1024 + (size_t)(2 * BR + 2 * ST * BC) * HD * sizeof(bf16) +
                                    (ST * BC + (PRE ? 2 * ST : 0)) * sizeof(float) + (1 + 2 * ST) * sizeof(uint64_t);
    bf16 *sQ, *sG, *sK, *sV;  // (BR, HD), (BR, HD) dO, (ST, BC, HD), (ST, BC, HD): swizzled tiles
    float *sC, *sCL;          // (ST, BC) c of the keys (PRE: B_j); PRE: (ST) c_b log2 e
    uint64_t *barQ, *full, *empty;

    __device__ explicit FoxDqSmem(unsigned char* raw) {
        sQ = (bf16*)smem_1k(raw);
        sG = sQ + BR * HD;
        sK = sG + BR * HD;
        sV = sK + ST * BC * HD;
        sC = (float*)(sV + ST * BC * HD);
        sCL = sC + ST * BC;
        uint64_t* bar = (uint64_t*)(PRE ? sCL + 2 * ST : sCL);
        barQ = bar; full = bar + 1; empty = full + ST;
    }
};

// The dQ kernel's producer warp: Q, dO once, then the key tiles [jt_begin, jt_begin + ntiles) with the keys' c by
// cp.async, or (PRE) by plain loads turned into the terms B_j and c_b here
template<int HD, int BC, int ST, bool GATE, bool PRE>
__device__ __forceinline__ void fox_backward_dq_producer(const FoxDqSmem<HD, BC, ST, PRE>& sm, const CUtensorMap* tmQ,
                                                         const CUtensorMap* tmG, const CUtensorMap* tmK,
                                                         const CUtensorMap* tmV, const float* cb, int i0,
                                                         int jt_begin, int ntiles, int T, int h, int b) {
    constexpr int BR = 128;
    int lane = threadIdx.x % 32;
    float fc[BC / 32], fcb = 0.f;  // PRE: c of the stage's keys (lane + 32 r) and of its block's first key
    fox_bwd_producer<BR, BC, HD, ST>(sm.sQ, sm.sG, tmQ, tmG, i0, sm.barQ, sm.sK, sm.sV, tmK, tmV, jt_begin * BC,
                                     ntiles, sm.full, sm.empty, h, b, lane, [&](int j1) {
        if (PRE && GATE) {
            fcb = cb[j1 - j1 % PRUNE_BLOCK];
            #pragma unroll
            for (int r = 0; r < BC / 32; r++) {  // past T: zeros, as the cp.async's
                int e = lane + 32 * r;
                float cj = cb[min(j1 + e, T - 1)];
                fc[r] = j1 + e < T ? cj : 0.f;
            }
        }
    }, [&](int st, int j1) {
        if (PRE && GATE) {
            float cb_l2 = __fmul_rn(fcb, LOG2E);  // as the consumers' and the dK/dV kernel's
            #pragma unroll
            for (int r = 0; r < BC / 32; r++) sm.sC[st * BC + lane + 32 * r] = fox_lean_kterm(fc[r], cb_l2);
            if (lane == 0) sm.sCL[st] = cb_l2;
            mbar_arrive_release(&sm.full[st]);  // after this lane's stores
        } else if (GATE) {
            #pragma unroll
            for (int e = lane; e < BC; e += 32) cp_async4(sm.sC + st * BC + e, cb + min(j1 + e, T - 1), j1 + e < T);
            mbar_arrive_cp_async(&sm.full[st]);
        }
    });
}

// The per-row values of the dQ consumer's two rows: lse, Delta, c and the mask bounds (visible key offsets, less 2 tq,
// from key 0); with documents doc_last, the document start of the consumer's last row (the latest of its rows')
struct FoxDqRows { float rl[2], rd[2], rc[2]; int lo0[2], hi0[2], doc_last; };

// The dQ consumer's mainloop step on one seen key tile (stage st, first key j0), up to the issue of dQ += dS K: S = Q
// K^T and dP = dO V^T, then (pending: the previous tile's dQ, issued before this tile's wait, OVL) its wait and
// release, P, dS = P (dP - Delta). The rows' query terms are for the tile's key block, with cb_l2 = c_b log2 e (c_b:
// c of the block's first key, the tile's own first key at BC = 128); PRE: cb_l2 from the stage, the terms formed after
// the matmuls' issue (under them). DOCS: a tile before a row's document start is masked too.
template<int HD, int BC, int ST, bool GATE, bool PRE, bool DOCS, typename Release>
__device__ __forceinline__ void fox_backward_dq_tile(float* dqa, float rs[2], uint32_t (&sa)[BC / 16][4],
                                                     const FoxDqSmem<HD, BC, ST, PRE>& sm, const FoxDqRows& rw,
                                                     const float* cb, int st, int j0, int i0w, bool pending, int pst,
                                                     uint64_t dQ0, uint64_t dG0, uint64_t dK0, uint64_t dV0,
                                                     uint64_t dKn0, int T, int window, float scale_log2,
                                                     Release release) {
    constexpr int BR = 128;
    constexpr uint32_t STAGE = BC * HD * sizeof(bf16);
    int tq = threadIdx.x % 4;
    const float* sCb = sm.sC + st * BC;
    uint32_t so = st * STAGE;
    float cb_l2 = 0.f, A[2];
    auto row_terms = [&] {
        A[0] = fox_lean_qterm(rw.rc[0], rw.rl[0], cb_l2, GATE);
        A[1] = fox_lean_qterm(rw.rc[1], rw.rl[1], cb_l2, GATE);
    };
    if (!PRE) {
        if (GATE) cb_l2 = __fmul_rn((j0 % PRUNE_BLOCK) ? cb[j0 - j0 % PRUNE_BLOCK] : sCb[0], LOG2E);
        row_terms();
    }
    float s[BC / 2], dp[BC / 2];
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_ss<BC>(s, desc_add(dQ0, kstep_bytes<BR>(kk)), desc_add(dK0, so + kstep_bytes<BC>(kk)), kk);
    wgmma_commit();
    #pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_ss<BC>(dp, desc_add(dG0, kstep_bytes<BR>(kk)), desc_add(dV0, so + kstep_bytes<BC>(kk)), kk);
    wgmma_commit();
    if (PRE) {
        if (GATE) cb_l2 = sm.sCL[st];
        row_terms();
    }
    if (pending) {  // the previous tile's dQ (cross-tile overlap: issued before this wait)
        wgmma_wait<2>();
        wgmma_pin<HD / 2>(dqa); wgmma_pin_a<BC / 16>(sa);
        release(pst);
    }
    wgmma_wait<1>();  // S done; P's exponentials overlap the dP matmul
    wgmma_pin<BC / 2>(s);
    if ((j0 + BC - 1 > i0w) || (j0 + BC > T) || (window > 0 && j0 <= i0w + 63 - window) ||
        (DOCS && j0 < rw.doc_last)) {
        int lo[2] = {rw.lo0[0] - j0, rw.lo0[1] - j0}, hi[2] = {rw.hi0[0] - j0, rw.hi0[1] - j0};
        fox_bwd_lean_p<BC, GATE, true, PRE>(s, sCb, cb_l2, A, scale_log2, tq, lo, hi);
    } else {
        fox_bwd_lean_p<BC, GATE, false, PRE>(s, sCb, cb_l2, A, scale_log2, tq, nullptr, nullptr);
    }
    wgmma_wait0();
    wgmma_pin<BC / 2>(dp);
    fox_bwd_lean_ds<BC>(s, dp, rw.rd, rs);
    // dQ += dS K
    #pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) acc_to_a(sa[kk], s + 8 * kk, s + 8 * kk + 4);
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(dqa, sa[kk], desc_add(dKn0, so + mnstep_bytes(kk)), 1);
    wgmma_commit();
}

// The dQ epilogue: dq (times scale) and the row part of dc, dc_i = sum_j dS_ij, of the thread's rows
template<int HD, bool GATE>
__device__ __forceinline__ void fox_backward_dq_store(bf16* dqb, float* dc_bh, const float* dqa, float rs[2],
                                                      const int rows[2], int T, int stride_qkv, float scale) {
    int tq = threadIdx.x % 4;
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rows[r] >= T) continue;
        #pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *(__nv_bfloat162*)(dqb + (size_t)rows[r] * stride_qkv + dt * 8 + 2 * tq) =
                __floats2bfloat162_rn(dqa[dt * 4 + 2 * r] * scale, dqa[dt * 4 + 2 * r + 1] * scale);
    }
    if (GATE) {
        #pragma unroll
        for (int r = 0; r < 2; r++) {  // fixed shuffle order: deterministic
            rs[r] += __shfl_xor_sync(0xffffffff, rs[r], 1);
            rs[r] += __shfl_xor_sync(0xffffffff, rs[r], 2);
        }
        if (tq == 0) {
            if (rows[0] < T) dc_bh[rows[0]] = rs[0];
            if (rows[1] < T) dc_bh[rows[1]] = rs[1];
        }
    }
}

// The dQ consumers: cw owns queries i0 + 64 cw .. + 63 (a warp 16 of them). OVL: a tile's dQ is waited for at the next
// seen tile, under its S and dP, and its stage released then. DOCS: startb, the sequence's document starts: query i
// sees no key before its document's start.
template<int HD, int BC, int ST, bool GATE, bool PRE, bool OVL, bool DOCS>
__device__ __forceinline__ void fox_backward_dq_consumer(const FoxDqSmem<HD, BC, ST, PRE>& sm, bf16* dqb,
                                                         float* dc_bh, const float* lse_bh, const float* delta_bh,
                                                         const float* cb, int i0, int jt_begin, int ntiles, int T,
                                                         int stride_qkv, int window, float scale_log2, float scale,
                                                         const int* startb) {
    constexpr int BR = 128;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    int cw = __shfl_sync(0xffffffff, wg - 1, 0);  // warp-uniform, so are the descriptors below
    int cwarp = warp - 4, g = lane / 4, tq = lane % 4;
    int i0w = i0 + 64 * cw;  // this consumer's first query
    int rows[2] = {i0 + cwarp * 16 + g, i0 + cwarp * 16 + g + 8};
    FoxDqRows rw;
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = rows[r];
        bool ok = row < T;
        rw.rl[r] = ok ? lse_bh[row] : 0.f;
        rw.rd[r] = ok ? delta_bh[row] : 0.f;
        rw.rc[r] = GATE ? cb[min(row, T - 1)] : 0.f;  // past T: a finite logit (its Q, dO rows are 0)
        rw.hi0[r] = min(row, T - 1) - 2 * tq;
        rw.lo0[r] = (window > 0 ? row - window + 1 : -BC) - 2 * tq;  // -BC: below every tile offset
        if (DOCS) rw.lo0[r] = max(rw.lo0[r], startb[min(row, T - 1)] - 2 * tq);
    }
    rw.doc_last = DOCS ? startb[min(i0w + 63, T - 1)] : 0;
    float dqa[HD / 2], rs[2] = {0.f, 0.f};  // rs: row sums of dS
    #pragma unroll
    for (int e = 0; e < HD / 2; e++) dqa[e] = 0.f;
    uint32_t sa[BC / 16][4];  // A fragments of dS
    // descriptors of k step 0: Q, dO (this consumer's 64 rows); K, V of stage 0 as K-major (S, dP) and K as N-major
    // (dQ) operands; a stage is BC * HD * 2 bytes further
    const uint64_t dQ0 = desc_k<BR>(sm.sQ, cw * 8, 0), dG0 = desc_k<BR>(sm.sG, cw * 8, 0);
    const uint64_t dK0 = desc_k<BC>(sm.sK, 0, 0), dV0 = desc_k<BC>(sm.sV, 0, 0);
    const uint64_t dKn0 = desc_mn<BC>(sm.sK, 0);
    auto release = [&](int st) {  // this warp is done with the stage's K, V and floats
        __syncwarp();
        if (lane == 0) mbar_arrive(&sm.empty[st]);
    };
    auto finish = [&](int st) {  // the pending dQ done: its stage released
        wgmma_wait0();
        wgmma_pin<HD / 2>(dqa); wgmma_pin_a<BC / 16>(sa);
        release(st);
    };
    bool pending = false;  // OVL: the last seen tile's dQ still runs on stage pst
    int pst = 0;
    mbar_wait(sm.barQ, 0);
    for (int n = 0; n < ntiles; n++) {
        int st = n % ST, j0 = (jt_begin + n) * BC;
        mbar_wait(&sm.full[st], (n / ST) & 1);
        // all of this consumer's queries past T, every key of the tile after its last query, or before the window of
        // its first one: P = 0
        bool seen = i0w < T && j0 <= i0w + 63 && !(window > 0 && i0w - (j0 + BC - 1) >= window);
        if (seen) {
            fox_backward_dq_tile<HD, BC, ST, GATE, PRE, DOCS>(dqa, rs, sa, sm, rw, cb, st, j0, i0w, pending, pst, dQ0,
                                                              dG0, dK0, dV0, dKn0, T, window, scale_log2, release);
            if (OVL) {  // waited for at the next tile, under its S and dP
                pending = true;
                pst = st;
            } else {
                finish(st);
            }
        } else {  // nothing seen: release the stage (after the previous tile's)
            if (pending) {
                finish(pst);
                pending = false;
            }
            release(st);
        }
    }
    if (pending) finish(pst);
    fox_backward_dq_store<HD, GATE>(dqb, dc_bh, dqa, rs, rows, T, stride_qkv, scale);
}

// Backward version 20 (hd 64: PRE, OVL) and 22 (hd 128: 128-key tiles, each waiting for its dQ), the dQ kernel: dq_i =
// scale sum_j dS_ij k_j, dc_i += sum_j dS_ij (above) for the 128-query tile gridDim.x - 1 - blockIdx.x (Q, dO fixed;
// longest rows first). The kernel only assigns the roles: the producer (fox_backward_dq_producer) and two consumers
// (fox_backward_dq_consumer) over the key tiles the query tile sees, from the window's start to its diagonal, less the
// pruned ones (key_start (B*H, ceil(T / 128)): the key tiles of 128 before key_start; NULL: none). Without
// OVL, at hd 128 with BC = 128, dQ's 64 floats, the next S and dP (128) and dS's fragments (32) would take 224 of the
// consumers' 240 registers, and ptxas would serialise the wgmmas. Grid (ceil(T / 128), B*H); shared memory FoxDqSmem.
// Where it runs: see fox_attention_backward. DOCS: no query sees a key of an earlier document (docs).
template<int HD, int BC, int ST, bool GATE, bool PRE, bool OVL, bool DOCS>
__global__ void __launch_bounds__(384, 1) fox_backward_dq_kernel20(bf16* dq, float* dc_row,
                                                                 const __grid_constant__ CUtensorMap tmQ,
                                                                 const __grid_constant__ CUtensorMap tmG,
                                                                 const __grid_constant__ CUtensorMap tmK,
                                                                 const __grid_constant__ CUtensorMap tmV,
                                                                 const float* lse, const float* delta,
                                                                 const float* c, int T, int H, int stride_qkv,
                                                                 int window, float scale_log2, float scale,
                                                                 const int* key_start, FoxDocs docs) {
    constexpr int BR = 128;
    static_assert(BR == PRUNE_BLOCK && PRUNE_BLOCK % BC == 0, "a query tile is one pruning tile");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    FoxDqSmem<HD, BC, ST, PRE> sm(smem_raw);
    int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    const float* cb = GATE ? c + (size_t)bh * T : nullptr;
    int i0 = qt * BR;
    int j_begin = window > 0 ? max(0, i0 - window + 1) : 0;
    int jt_begin = j_begin / BC, jt_end = ceil_div(min(T, i0 + BR), BC);
    // pruned key tiles are never loaded (never the diagonal one, so jt_begin < jt_end)
    if (key_start) jt_begin = max(jt_begin, key_start[(size_t)bh * gridDim.x + qt] * (PRUNE_BLOCK / BC));
    int ntiles = jt_end - jt_begin;
    // full: the copy engine's arrival + the 32 lanes' c (PRE: B, c_b)
    fox_ring_init<ST>(sm.barQ, sm.full, sm.empty, 1 + (GATE ? 32 : 0), 8);
    if (threadIdx.x / 128 == 0) {
        setmaxnreg_dec<24>();
        if (threadIdx.x / 32 == 0) {
            fox_backward_dq_producer<HD, BC, ST, GATE, PRE>(sm, &tmQ, &tmG, &tmK, &tmV, cb, i0, jt_begin, ntiles, T, h,
                                                            b);
        }
        return;
    }
    setmaxnreg_inc<240>();
    fox_backward_dq_consumer<HD, BC, ST, GATE, PRE, OVL, DOCS>(sm, dq + (size_t)b * T * stride_qkv + (size_t)h * HD,
                                                               dc_row + (size_t)bh * T, lse + (size_t)bh * T,
                                                               delta + (size_t)bh * T, cb, i0, jt_begin, ntiles, T,
                                                               stride_qkv, window, scale_log2, scale,
                                                               DOCS ? docs.start + (size_t)b * T : nullptr);
}

// the dK/dV kernel (query tiles of BQ: 128 at hd 64, 64 at hd 128) and the dQ kernel (key tiles of BC = 128) with
// their stages, PRE and OVL
template<int HD, bool GATE, bool DOCS>
static void fox_backward20_gpu(bf16* dq, bf16* dk, bf16* dv, float* dc, float* dc_row, const bf16* dout,
                               const bf16* q, const bf16* k, const bf16* v, const float* lse, const float* delta,
                               const float* c, int B, int T, int H, int stride_qkv, int stride_o, int window,
                               const int* key_start, const int* query_end, FoxDocs docs, cudaStream_t s) {
    constexpr int ST = 2, BQ = HD == 64 ? 128 : 64, BC = 128;
    constexpr bool PRE = HD == 64;  // the producer's per-column terms: at hd 64 only
    constexpr bool OVL = HD == 64;  // the dQ kernel's cross-tile overlap: at hd 64 only (its registers)
    constexpr size_t smem_kv = FoxDkdvSmem<HD, BQ, ST, PRE>::bytes;
    constexpr size_t smem_q = FoxDqSmem<HD, BC, ST, PRE>::bytes;
    smem_limit(smem_kv, fox_backward_dkdv_kernel20<HD, BQ, ST, GATE, PRE, DOCS>);
    smem_limit(smem_q, fox_backward_dq_kernel20<HD, BC, ST, GATE, PRE, OVL, DOCS>);
    float scale = 1.0f / sqrtf((float)HD), scale_log2 = scale * LOG2E;
    dim3 grid((unsigned)ceil_div(T, 128), (unsigned)(B * H));
    // the dK/dV kernel streams Q, dO in tiles of BQ rows; the dQ kernel holds 128 of them
    CUtensorMap tq = fox_tensor_map(q, B, T, H, HD, stride_qkv, BQ);
    CUtensorMap tg = fox_tensor_map(dout, B, T, H, HD, stride_o, BQ);
    CUtensorMap tk = fox_tensor_map(k, B, T, H, HD, stride_qkv, 128);
    CUtensorMap tv = fox_tensor_map(v, B, T, H, HD, stride_qkv, 128);
    fox_backward_dkdv_kernel20<HD, BQ, ST, GATE, PRE, DOCS><<<grid, 384, smem_kv, s>>>(
        dk, dv, dc, tq, tg, tk, tv, lse, delta, c, T, H, stride_qkv, window, scale_log2, scale, query_end, docs);
    launchCheck();
    tq = fox_tensor_map(q, B, T, H, HD, stride_qkv, 128); tg = fox_tensor_map(dout, B, T, H, HD, stride_o, 128);
    tk = fox_tensor_map(k, B, T, H, HD, stride_qkv, BC); tv = fox_tensor_map(v, B, T, H, HD, stride_qkv, BC);
    fox_backward_dq_kernel20<HD, BC, ST, GATE, PRE, OVL, DOCS><<<grid, 384, smem_q, s>>>(
        dq, dc_row, tq, tg, tk, tv, lse, delta, c, T, H, stride_qkv, window, scale_log2, scale, key_start, docs);
    launchCheck();
}

// dq, dk, dv: bf16 (B, T, H, hd), token stride stride_qkv (like q, k, v; may be a packed dqkv). dout, o: bf16 (B, T, H,
// hd), token stride stride_o. lse: from fox_attention_forward. c: fp32 (B, H, T) or NULL (plain causal attention).
// dlogf: fp32 (B, H, T) gradient of log f, written when c != NULL (may be NULL when c is NULL). scratch_dc: fp32
// scratch of 3*B*H*T floats: [0, BHT) column part of dc (gradient of c), [BHT, 2BHT) row part of dc, [2BHT, 3BHT)
// Delta = rowsum(dO * O) (computed here unless delta_ready). tables: fox_prune_tables' output for this q, k, c (the
// forward's tiles), or NULL (dense); needs c or docs. docs: documents kept apart, as the forward's, or NULL; dlogf then
// sums over each document only and is 0 at a document start.
void fox_attention_backward(bf16* dq, bf16* dk, bf16* dv, float* dlogf, float* scratch_dc, const bf16* dout,
                            const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse,
                            const float* c, int B, int T, int H, int hd, int stride_qkv, int stride_o, int window,
                            const int* tables, int delta_ready, const FoxDocs* docs, cudaStream_t s) {
    fox_check_args("fox_attention_backward", q, k, v, B, T, H, hd, stride_qkv, stride_o, window);
    if (((uintptr_t)dq | (uintptr_t)dk | (uintptr_t)dv | (uintptr_t)dout | (uintptr_t)o) % 16 || stride_o % 8) {
        fail("fox_attention_backward: dq/dk/dv/dout/o must be 16-byte aligned, stride_o %% 8 == 0\n"
             "HINT: dout is read in 16-byte chunks; allocate with cudaMalloc and keep strides multiples of 8");
    }
    if (c && !dlogf) {
        fail("fox_attention_backward: c is given but dlogf is NULL\nHINT: pass a (B, H, T) fp32 buffer for dlogf");
    }
    if (tables && !c && !docs) {
        fail("fox_attention_backward: pruning tiles without a forget gate or documents\n"
             "HINT: pass tables = NULL when c and docs are NULL");
    }
    // What runs (the one place that says it; the versions are rungs of dev/cuda/fox_attention_backward.cu):
    // fox_bwd_delta_kernel (unless delta_ready), fox_backward_dkdv_kernel20 and fox_backward_dq_kernel20, then
    // fox_bwd_dlogf_kernel<DOCS>; at hd 64 (version 20) the dK/dV kernel <64, 128, 2, GATE, true, DOCS> (128-query
    // tiles, PRE) and the dQ kernel <64, 128, 2, GATE, true, true, DOCS> (OVL); at hd 128 (version 22) <128, 64, 2,
    // GATE, false, DOCS> and <128, 128, 2, GATE, false, false, DOCS>.
    int BHT = B * H * T;
    const int* key_start = tables;
    const int* query_end = tables ? tables + (size_t)B * H * ceil_div(T, PRUNE_BLOCK) : nullptr;
    float *dc = scratch_dc, *dc_row = scratch_dc + (size_t)BHT, *delta = scratch_dc + 2 * (size_t)BHT;
    unsigned delta_blocks = (unsigned)ceil_div(BHT, 8); // a warp per row, 8 warps a block
    if (!delta_ready) {
        if (hd == 64) fox_bwd_delta_kernel<64><<<delta_blocks, 256, 0, s>>>(delta, dout, o, BHT, T, H, stride_o);
        else fox_bwd_delta_kernel<128><<<delta_blocks, 256, 0, s>>>(delta, dout, o, BHT, T, H, stride_o);
        launchCheck();
    }
    auto run = FOX_PICK(fox_backward20_gpu, hd, c != NULL, docs != NULL);
    run(dq, dk, dv, dc, dc_row, dout, q, k, v, lse, delta, c, B, T, H, stride_qkv, stride_o, window, key_start,
        query_end, docs_or_none(docs), s); // key_start, query_end: NULL without c and docs (checked above)
    if (c) { fox_bwd_dlogf_gpu(dlogf, dc, dc_row, B, T, H, docs, s); }
}
#endif // ENABLE_FP32

// ---- the boundary used by gpu_forward / gpu_backward ----
// attention_forward_gpu and attention_backward_gpu pick the fused kernels (bf16 build, hd 64 or 128) or the simple
// kernel, and run the pruning tables' pass before the fused ones when -A 1 or documents (-f 1) are on.

#ifndef ENABLE_FP32
// whether this head size runs on the fused kernels
static int attention_fused(int hd) { return hd == 64 || hd == 128; }
#endif

// Counts the moves of buffers that kernels read by a pointer they keep (the pruning tables) and the changes of settings
// they take as arguments (pruning): a CUDA graph captured before one must not run after it (gpu_train_micro_step).
static int g_buffer_epoch = 0;

// adaptive computation pruning in the fused kernels (-A, -L), for the models run next
static int g_prune = 0;
#ifndef ENABLE_FP32
static float g_prune_ln_eps = -10.0f;
#endif
static void attention_set_pruning(int on, double ln_eps) {
    g_buffer_epoch++; // a captured graph holds the old setting
    g_prune = on;
#ifndef ENABLE_FP32
    g_prune_ln_eps = (float)ln_eps;
#else
    (void)ln_eps; // the fp32 build has no fused kernels: -A 1 fails at the first attention
#endif
}

#ifndef ENABLE_FP32
// The pruning tiles of one layer's q, k, c (B, T, H, hd; c (B, H, T)) and documents (docs, or NULL), or NULL when
// neither pruning with a forget gate (the decay bound) nor documents (the tiles before a document) are on. One buffer
// for every layer: the backward recomputes a layer's tables from the same saved q, k, c, which gives the forward's
// tables (deterministic pass).
static const int* attention_prune_tables(const floatX* q, const floatX* k, const float* c, int B, int T, int H,
                                         int hd, const FoxDocs* docs) {
    static int* tables = NULL;
    static float* U = NULL;
    static float2* partial = NULL;
    static size_t cap = 0, cap_partial = 0;
    const float* decay = g_prune ? c : NULL; // the decay bound's c
    if (decay == NULL && docs == NULL) { return NULL; }
    size_t BH = (size_t)B * H, need = 2 * BH * (size_t)ceil_div(T, PRUNE_BLOCK);
    size_t need_partial = BH * (size_t)ceil_div(T, PRUNE_NORM_ROWS);
    if (need > cap) { // first use, or a larger shape (evaluation): grow; cudaFree waits for the GPU
        cudaCheck(cudaFree(tables)); cudaCheck(cudaFree(U));
        cudaCheck(cudaMalloc(&tables, need * sizeof(int)));
        cudaCheck(cudaMalloc(&U, need / 2 * sizeof(float))); // need / 2 >= B*H
        cap = need;
        g_buffer_epoch++;
    }
    if (need_partial > cap_partial) {
        cudaCheck(cudaFree(partial));
        cudaCheck(cudaMalloc(&partial, need_partial * sizeof(float2)));
        cap_partial = need_partial;
        g_buffer_epoch++;
    }
    fox_prune_tables(tables, U, partial, q, k, decay, B, T, H, hd, H * hd, g_prune_ln_eps, docs, 0);
    return tables;
}

static unsigned long long* g_prune_counts = NULL; // (2) on the device

static void attention_prune_count_gpu(const int* tables, int BH, int T, int window) {
    if (g_prune_counts == NULL) {
        cudaCheck(cudaMalloc(&g_prune_counts, 2 * sizeof(unsigned long long)));
        cudaCheck(cudaMemset(g_prune_counts, 0, 2 * sizeof(unsigned long long)));
    }
    fox_prune_count_kernel<<<1, 256>>>(g_prune_counts, tables, BH, ceil_div(T, PRUNE_BLOCK), window);
    launchCheck();
}
#endif

// share of attention tiles the forwards skipped since the last call (-A 1), and the count of tiles they would have read
// densely; starts the next count
static double attention_pruned_share(unsigned long long* dense_tiles) {
    unsigned long long counts[2] = {0, 0};
#ifndef ENABLE_FP32
    if (g_prune_counts != NULL) {
        cudaCheck(cudaMemcpy(counts, g_prune_counts, sizeof(counts), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemset(g_prune_counts, 0, sizeof(counts)));
    }
#endif
    *dense_tiles = counts[1];
    return counts[1] > 0 ? (double)counts[0] / (double)counts[1] : 0.0;
}

// whether the fused attention skips tiles by its tables, and counts them (attention_pruned_share): -A 1 or -f 1
static int tiles_counted(const Args* a) { return g_prune || a->documents; }

// pruning runs in the fused kernels only
static void attention_prune_unsupported(const float* c, int hd) {
    if (g_prune && c != NULL) {
        fail("-A 1: attention pruning runs in the fused kernels only, not at head size %d in this build\n"
             "HINT: build train_fox in bf16 (no PRECISION=FP32) with head size 64 or 128, or drop -A", hd);
    }
}

// q, k, v, o (B, T, H, hd) floatX; c, lse (B, H, T) fp32; c == NULL for no forget gate; docs: documents kept apart,
// or NULL
static void attention_forward_gpu(floatX* o, float* lse, const floatX* q, const floatX* k, const floatX* v,
                                  const float* c, int B, int T, int H, int hd, int window, const FoxDocs* docs) {
#ifndef ENABLE_FP32
    if (attention_fused(hd)) {
        const int* tables = attention_prune_tables(q, k, c, B, T, H, hd, docs);
        fox_attention_forward(o, lse, q, k, v, c, B, T, H, hd, H * hd, H * hd, window, tables, docs, 0);
        if (tables != NULL) { attention_prune_count_gpu(tables, B * H, T, window); }
        return;
    }
#endif
    attention_prune_unsupported(c, hd);
    size_t smem = attention_forward_smem(hd);
    auto fwd_kernel = docs != NULL ? attention_forward_kernel<true> : attention_forward_kernel<false>;
    smem_limit(smem, fwd_kernel);
    dim3 grid((unsigned)ceil_div(T, WARPS_PER_BLOCK), (unsigned)(B * H));
    fwd_kernel<<<grid, 32 * WARPS_PER_BLOCK, smem>>>(o, lse, q, k, v, c, T, H, hd, window, 1.0f / sqrtf((float)hd),
                                                     docs_or_none(docs));
    launchCheck();
}

// dq, dk, dv (B, T, H, hd) written; dlogf (B, H, T), the gradient of log f, written when c != NULL. scratch:
// 3 * B * H * T floats (dc column part, dc row part, Delta; with delta_ready the caller wrote Delta = rowsum(dout * o)
// already: output_norm_gate_backward_kernel).
static void attention_backward_gpu(floatX* dq, floatX* dk, floatX* dv, float* dlogf, float* scratch,
                                   const floatX* dout, const floatX* q, const floatX* k, const floatX* v,
                                   const floatX* o, const float* lse, const float* c, int B, int T, int H, int hd,
                                   int window, int delta_ready, const FoxDocs* docs) {
#ifndef ENABLE_FP32
    if (attention_fused(hd)) {
        fox_attention_backward(dq, dk, dv, dlogf, scratch, dout, q, k, v, o, lse, c, B, T, H, hd, H * hd, H * hd,
                               window, attention_prune_tables(q, k, c, B, T, H, hd, docs), delta_ready, docs, 0);
        return;
    }
#endif
    attention_prune_unsupported(c, hd);
    size_t N = (size_t)B * T, BHT = N * H, smem = attention_backward_smem(hd);
    float *dc_col = scratch, *dc_row = scratch + BHT, *delta = scratch + 2 * BHT;
    float scale = 1.0f / sqrtf((float)hd);
    if (!delta_ready) {
        attention_delta_kernel<<<warp_blocks(N * H), 32 * WARPS_PER_BLOCK>>>(delta, dout, o, N, T, H, hd);
        launchCheck();
    }
    dim3 grid((unsigned)ceil_div(T, WARPS_PER_BLOCK), (unsigned)(B * H));
    auto dq_kernel = docs != NULL ? attention_backward_dq_kernel<true> : attention_backward_dq_kernel<false>;
    smem_limit(smem, dq_kernel);
    dq_kernel<<<grid, 32 * WARPS_PER_BLOCK, smem>>>(dq, c != NULL ? dc_row : NULL, dout, q, k, v, lse, delta, c, T, H,
                                                    hd, window, scale, docs_or_none(docs));
    launchCheck();
    auto dkdv_kernel = docs != NULL ? attention_backward_dkdv_kernel<true> : attention_backward_dkdv_kernel<false>;
    smem_limit(smem, dkdv_kernel);
    dkdv_kernel<<<grid, 32 * WARPS_PER_BLOCK, smem>>>(dk, dv, c != NULL ? dc_col : NULL, dout, q, k, v, lse, delta, c,
                                                      T, H, hd, window, scale, docs_or_none(docs));
    launchCheck();
    if (c != NULL) { fox_bwd_dlogf_gpu(dlogf, dc_col, dc_row, B, T, H, docs, 0); }
}

// ----------------------------------------------------------------------------
// output norm and gate

// Output norm and output gate on one (token, head) row, G lanes per row (see head_lanes); either may be off (w == NULL:
// no norm, og == NULL: no gate). o_normed is written when both are on (the gate's backward needs it); y is the input of
// W_o. Every lane of the warp calls it (group_sum), active or not; TM: y's codes into row srow of stage
// (fp8_stage_put), y itself not stored with q.drop.
template <bool TM>
__device__ static inline void output_norm_gate_row(floatX* o_normed, floatX* y, float* rstd, const floatX* o,
                                                   const floatX* og, const float* w, size_t row, int active, int H,
                                                   int hd, float eps, int G, const Fp8Out& q, unsigned* mx,
                                                   uint8_t* stage, int srow) {
    int j = (int)(threadIdx.x % G), half = hd / 2, i0 = j * XPACK;
    active = active && i0 < half; // the others still join group_sum
    float x[2][XPACK], ss = 0.0f;  // the lane's channels i0.. and half + i0..
    if (active) {
        for (int p = 0; p < 2; p++) {
            PackX xp = *(const PackX*)(o + row * hd + p * half + i0);
            #pragma unroll
            for (int k = 0; k < XPACK; k++) { x[p][k] = to_float(xp.v[k]); ss += x[p][k] * x[p][k]; }
        }
    }
    float s = head_rstd(ss, w != NULL, rstd, row, active && j == 0, hd, eps, G);
    if (!active) { return; }
    const float* wr = w != NULL ? w + (row % H) * hd : NULL;
    for (int p = 0; p < 2; p++) {
        size_t off = row * hd + p * half + i0;
        PackX gp, np, yp;
        float wp[XPACK];
        if (og != NULL) { gp = *(const PackX*)(og + off); }
        if (wr != NULL) { load_floats<XPACK>(wp, wr + p * half + i0); }
        #pragma unroll
        for (int k = 0; k < XPACK; k++) {
            float v = x[p][k];
            if (wr != NULL) {
                v = v * s * wp[k];
                np.v[k] = to_floatX(v);
            }
            if (og != NULL) { v = v * sigmoid_gpu(to_float(gp.v[k])); }
            yp.v[k] = to_floatX(v);
        }
        if (wr != NULL && og != NULL) { *(PackX*)(o_normed + off) = np; }
        uint2 codes = fp8_pack<XPACK>(q, yp.v, off, mx);
        if constexpr (TM) { fp8_stage_put<XPACK>(stage, H * hd, srow, (int)(off % ((size_t)H * hd)), codes); }
        if (!TM || !q.drop) { *(PackX*)(y + off) = yp; }
    }
}

// The output norm and gate over N H rows (output_norm_gate_row). TM: y's token-major codes too (q.codes_t): a block of
// 8 H G threads takes FP8_TM_ROWS tokens (N a multiple) in passes of 8 (fp8_ong_tm_ok), staged through FP8_TM_ROWS C
// bytes of dynamic shared memory.
template <bool TM>
__global__ void output_norm_gate_forward_kernel(floatX* o_normed, floatX* y, float* rstd, const floatX* o,
                                                const floatX* og, const float* w, size_t N, int H, int hd, float eps,
                                                int G, Fp8Out q) {
    extern __shared__ __align__(16) uint8_t stage[]; // TM: (FP8_TM_ROWS, C) codes
    unsigned mx = 0; // y's FP8 epilogue (q, Fp8Out)
    if constexpr (TM) {
        size_t t0 = (size_t)blockIdx.x * FP8_TM_ROWS; // the block's first token
        int lr = (int)(threadIdx.x / G);               // the thread's (token, head) row within a pass of 8 tokens
        for (int t = 0; t < FP8_TM_ROWS; t += 8) {
            size_t row = (t0 + t) * H + lr;
            output_norm_gate_row<TM>(o_normed, y, rstd, o, og, w, row, 1, H, hd, eps, G, q, &mx, stage, t + lr / H);
        }
        if (q.amax != NULL && (int)(threadIdx.x % G) * XPACK < hd / 2) { fp8_warp_amax(mx, q.amax); }
        __syncthreads();
        fp8_stage_write(q.codes_t, N, t0, stage, H * hd, H * hd, 0);
    } else {
        size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
        output_norm_gate_row<TM>(o_normed, y, rstd, o, og, w, row, row < N * H, H, hd, eps, G, q, &mx, stage, 0);
        if (q.amax != NULL && row < N * H && (int)(threadIdx.x % G) * XPACK < hd / 2) { fp8_warp_amax(mx, q.amax); }
    }
}

// writes do_ (the attention output gradient), dog when the gate is on (rows ld long: a block of dqkvg), don (the norm's
// output gradient, for the scale gradient) when the norm is on, and, when delta is given, the attention backward's
// Delta = rowsum(do_ * o) (B, H, T) from the rounded do_. Q8: dog's FP8 epilogue (q, codes indexed as dog).
template <bool Q8>
__global__ void output_norm_gate_backward_kernel(floatX* do_, floatX* dog, int ld, floatX* don, float* delta,
                                                 const floatX* dy, const floatX* o, const floatX* o_normed,
                                                 const floatX* og, const float* w, const float* rstd, size_t N, int T,
                                                 int H, int hd, int G, Fp8Out q) {
    // forward: on = o s w (per head), y = on sigmoid(g)
    // don = dy sigmoid(g), dg = dy on sigmoid(g) (1 - sigmoid(g))
    // do_i = s w_i don_i - o_i s^3 / hd * sum_j w_j don_j o_j
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
    int j = (int)(threadIdx.x % G), half = hd / 2, i0 = j * XPACK;
    int active = row < N * H && i0 < half; // the others still join group_sum
    const float* wr = w != NULL ? w + (row % H) * hd : NULL;
    float dn[2][XPACK], x[2][XPACK], wp[2][XPACK], dot = 0.0f, dd = 0.0f; // x: o
    unsigned mx = 0;
    if (active) {
        #pragma unroll
        for (int p = 0; p < 2; p++) {
            size_t off = row * hd + p * half + i0;
            PackX dp = *(const PackX*)(dy + off), op = *(const PackX*)(o + off);
            #pragma unroll
            for (int k = 0; k < XPACK; k++) { dn[p][k] = to_float(dp.v[k]); x[p][k] = to_float(op.v[k]); }
            if (og != NULL) {
                PackX gp = *(const PackX*)(og + off), dgp;
                PackX xp = wr != NULL ? *(const PackX*)(o_normed + off) : op; // the gate's input
                #pragma unroll
                for (int k = 0; k < XPACK; k++) {
                    float sg = sigmoid_gpu(to_float(gp.v[k]));
                    dgp.v[k] = to_floatX(dn[p][k] * to_float(xp.v[k]) * sg * (1.0f - sg));
                    dn[p][k] = dn[p][k] * sg;
                }
                size_t at = (row / H) * ld + (row % H) * hd + p * half + i0;
                if constexpr (Q8) { fp8_pack<XPACK>(q, dgp.v, at, &mx); }
                if (!Q8 || !q.drop) { *(PackX*)(dog + at) = dgp; }
            }
            if (wr != NULL) {
                load_floats<XPACK>(wp[p], wr + p * half + i0);
                #pragma unroll
                for (int k = 0; k < XPACK; k++) { dot += wp[p][k] * dn[p][k] * x[p][k]; }
            }
        }
    }
    // w is the same for the whole grid: with it off no lane is left in group_sum
    float s = 1.0f, c = 0.0f;
    if (wr != NULL) {
        dot = group_sum(dot, G);
        if (active) { s = rstd[row]; c = dot * s * s * s / (float)hd; }
    }
    if (active) {
        #pragma unroll
        for (int p = 0; p < 2; p++) {
            size_t off = row * hd + p * half + i0;
            PackX np, rp;
            #pragma unroll
            for (int k = 0; k < XPACK; k++) {
                np.v[k] = to_floatX(dn[p][k]);
                rp.v[k] = wr != NULL ? to_floatX(s * wp[p][k] * dn[p][k] - x[p][k] * c) : np.v[k];
                dd += to_float(rp.v[k]) * x[p][k];
            }
            if (wr != NULL) { *(PackX*)(don + off) = np; }
            *(PackX*)(do_ + off) = rp;
        }
    }
    if (delta != NULL) {
        dd = group_sum(dd, G);
        size_t n = row / H;
        if (active && j == 0) { delta[((n / T) * H + row % H) * T + n % T] = dd; }
    }
    if (Q8 && q.amax != NULL) { fp8_warp_amax(mx, q.amax); }
}

// whether output_norm_gate_forward_gpu can write y's token-major codes: a pass of 8 tokens' H G lanes a block, whole
// warps, within the block size its registers allow (cudaFuncGetAttributes), their FP8_TM_ROWS C codes in shared memory
static int fp8_ong_tm_ok(int H, int hd) {
    static int max_threads = 0;
    if (max_threads == 0) {
        cudaFuncAttributes attr;
        cudaCheck(cudaFuncGetAttributes(&attr, output_norm_gate_forward_kernel<true>));
        max_threads = attr.maxThreadsPerBlock;
    }
    int threads = 8 * H * head_lanes(hd);
    return threads <= max_threads && threads % 32 == 0 && (size_t)FP8_TM_ROWS * H * hd <= 200 * 1024;
}

// y (and o_normed, rstd) from o through the output norm (w != NULL, eps) and gate (og != NULL)
// (q: an FP8 epilogue of y, Fp8Out; none by default)
static void output_norm_gate_forward_gpu(floatX* o_normed, floatX* y, float* rstd, const floatX* o, const floatX* og,
                                         const float* w, size_t N, int H, int hd, float eps, Fp8Out q = Fp8Out{}) {
    int G = head_lanes(hd);
    if (q.codes_t == NULL) {
        output_norm_gate_forward_kernel<false><<<head_blocks(N * H, G), HEAD_THREADS>>>(o_normed, y, rstd, o, og, w, N,
                                                                                        H, hd, eps, G, q);
    } else { // blocks of FP8_TM_ROWS tokens
        fp8_tm_check(N, H * hd, INT_MAX);
        if (!fp8_ong_tm_ok(H, hd)) { fail("internal: y's token-major codes with H %d, hd %d" BUG_HINT, H, hd); }
        size_t smem = (size_t)FP8_TM_ROWS * H * hd;
        if (smem > 48 * 1024) { smem_limit(smem, output_norm_gate_forward_kernel<true>); }
        output_norm_gate_forward_kernel<true><<<(unsigned)(N / FP8_TM_ROWS), 8 * H * G, smem>>>(o_normed, y, rstd, o,
                                                                                                og, w, N, H, hd, eps,
                                                                                                G, q);
    }
    launchCheck();
}

// (q: dog's FP8 epilogue, Fp8Out; none by default)
static void output_norm_gate_backward_gpu(floatX* do_, floatX* dog, int ld, floatX* don, float* delta, const floatX* dy,
                                          const floatX* o, const floatX* o_normed, const floatX* og, const float* w,
                                          const float* rstd, size_t N, int T, int H, int hd, Fp8Out q = Fp8Out{}) {
    int G = head_lanes(hd);
    auto kernel = q.amax != NULL || q.codes != NULL ? output_norm_gate_backward_kernel<true>
                                                    : output_norm_gate_backward_kernel<false>;
    kernel<<<head_blocks(N * H, G), HEAD_THREADS>>>(do_, dog, ld, don, delta, dy, o, o_normed, og, w, rstd, N, T, H, hd,
                                                    G, q);
    launchCheck();
}

// ----------------------------------------------------------------------------
// SwiGLU

// SwiGLU: act = silu(g) * u, gu (N, 2I) holds the gate then the up projection of a row; XPACK consecutive hidden
// units of one row per thread (gpu_config_problem: I % XPACK == 0): consecutive threads take consecutive packs of the
// whole. TM (token-major codes, q.codes_t; N a multiple of FP8_TM_ROWS): block (x, y) takes rows FP8_TM_ROWS x ..,
// warp w those w, w + 8, .., and units SWIGLU_TM_W y .. + SWIGLU_TM_W - 1 of each, so that fp8_stage_write can turn
// the block's codes.
#define SWIGLU_TM_W (32 * XPACK)

// the launch grid of the SwiGLU kernels
static dim3 swiglu_grid(size_t N, int I, int tm) {
    if (!tm) { return dim3(elem_blocks(N * I / XPACK)); }
    fp8_tm_check(N, I, INT_MAX);
    return dim3((unsigned)(N / FP8_TM_ROWS), (unsigned)ceil_div(I, SWIGLU_TM_W));
}

// units i .. i + XPACK - 1 of row n: act = g sigmoid(g) u, stored unless drop; the FP8 epilogue's codes (fp8_pack)
__device__ static inline uint2 swiglu_forward_pack(floatX* act, const floatX* gu, size_t n, int i, int I,
                                                   const Fp8Out& q, bool drop, unsigned* mx) {
    PackX g = *(const PackX*)(gu + n * 2 * I + i), u = *(const PackX*)(gu + n * 2 * I + I + i), out;
    #pragma unroll
    for (int k = 0; k < XPACK; k++) {
        float gk = to_float(g.v[k]);
        out.v[k] = to_floatX(gk * sigmoid_gpu(gk) * to_float(u.v[k]));
    }
    uint2 codes = fp8_pack<XPACK>(q, out.v, n * I + i, mx);
    if (!drop) { *(PackX*)(act + n * I + i) = out; }
    return codes;
}

// (q: act's FP8 epilogue, Fp8Out)
template <bool TM>
__global__ void swiglu_forward_kernel(floatX* act, const floatX* gu, size_t N, int I, Fp8Out q) {
    __shared__ __align__(16) uint8_t stage[TM ? FP8_TM_ROWS * SWIGLU_TM_W : 1];
    unsigned mx = 0;
    if constexpr (TM) {
        size_t r0 = (size_t)blockIdx.x * FP8_TM_ROWS;
        int i = blockIdx.y * SWIGLU_TM_W + (threadIdx.x % 32) * XPACK;
        for (int k = threadIdx.x / 32; k < FP8_TM_ROWS && i < I; k += WARPS_PER_BLOCK) {
            uint2 codes = swiglu_forward_pack(act, gu, r0 + k, i, I, q, q.drop, &mx);
            fp8_stage_put<XPACK>(stage, SWIGLU_TM_W, k, i % SWIGLU_TM_W, codes);
        }
    } else {
        size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * XPACK;
        if (idx < N * I) { swiglu_forward_pack(act, gu, idx / I, (int)(idx % I), I, q, false, &mx); }
    }
    fp8_block_amax(mx, q.amax);
    if constexpr (TM) {
        __syncthreads();
        int w = min(SWIGLU_TM_W, I - (int)blockIdx.y * SWIGLU_TM_W);
        fp8_stage_write(q.codes_t, N, (size_t)blockIdx.x * FP8_TM_ROWS, stage, SWIGLU_TM_W, w,
                        blockIdx.y * SWIGLU_TM_W);
    }
}

// units i .. i + XPACK - 1 of row n: dg and du into dgu's row (columns i, I + i), stored unless drop; their codes
__device__ static inline void swiglu_backward_pack(floatX* dgu, const floatX* dact, const floatX* gu, size_t n, int i,
                                                   int I, const Fp8Out& q, bool drop, unsigned* mx, uint2* cg,
                                                   uint2* cu) {
    // forward: act = g sigmoid(g) u
    // dg = dact u sigmoid(g) (1 + g (1 - sigmoid(g))),  du = dact g sigmoid(g)
    PackX g = *(const PackX*)(gu + n * 2 * I + i), u = *(const PackX*)(gu + n * 2 * I + I + i);
    PackX d = *(const PackX*)(dact + n * I + i), dg, du;
    #pragma unroll
    for (int k = 0; k < XPACK; k++) {
        float gk = to_float(g.v[k]), uk = to_float(u.v[k]), dk = to_float(d.v[k]), sk = sigmoid_gpu(gk);
        dg.v[k] = to_floatX(dk * uk * sk * (1.0f + gk * (1.0f - sk)));
        du.v[k] = to_floatX(dk * gk * sk);
    }
    *cg = fp8_pack<XPACK>(q, dg.v, n * 2 * I + i, mx);
    *cu = fp8_pack<XPACK>(q, du.v, n * 2 * I + I + i, mx);
    if (!drop) {
        *(PackX*)(dgu + n * 2 * I + i) = dg;
        *(PackX*)(dgu + n * 2 * I + I + i) = du;
    }
}

// (q: dgu's FP8 epilogue, Fp8Out)
template <bool TM>
__global__ void swiglu_backward_kernel(floatX* dgu, const floatX* dact, const floatX* gu, size_t N, int I, Fp8Out q) {
    __shared__ __align__(16) uint8_t stage[TM ? 2 * FP8_TM_ROWS * SWIGLU_TM_W : 1]; // dg's codes, then du's
    unsigned mx = 0;
    uint2 cg, cu;
    if constexpr (TM) {
        size_t r0 = (size_t)blockIdx.x * FP8_TM_ROWS;
        int i = blockIdx.y * SWIGLU_TM_W + (threadIdx.x % 32) * XPACK;
        for (int k = threadIdx.x / 32; k < FP8_TM_ROWS && i < I; k += WARPS_PER_BLOCK) {
            swiglu_backward_pack(dgu, dact, gu, r0 + k, i, I, q, q.drop, &mx, &cg, &cu);
            fp8_stage_put<XPACK>(stage, SWIGLU_TM_W, k, i % SWIGLU_TM_W, cg);
            fp8_stage_put<XPACK>(stage + FP8_TM_ROWS * SWIGLU_TM_W, SWIGLU_TM_W, k, i % SWIGLU_TM_W, cu);
        }
    } else {
        size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * XPACK;
        if (idx < N * I) { swiglu_backward_pack(dgu, dact, gu, idx / I, (int)(idx % I), I, q, false, &mx, &cg, &cu); }
    }
    fp8_block_amax(mx, q.amax);
    if constexpr (TM) { // dg's columns i, du's I + i
        __syncthreads();
        int w = min(SWIGLU_TM_W, I - (int)blockIdx.y * SWIGLU_TM_W), c0 = blockIdx.y * SWIGLU_TM_W;
        size_t r0 = (size_t)blockIdx.x * FP8_TM_ROWS;
        fp8_stage_write(q.codes_t, N, r0, stage, SWIGLU_TM_W, w, c0);
        fp8_stage_write(q.codes_t, N, r0, stage + FP8_TM_ROWS * SWIGLU_TM_W, SWIGLU_TM_W, w, I + c0);
    }
}

// (q: an FP8 epilogue of the output, Fp8Out; none by default)
static void swiglu_forward_gpu(floatX* act, const floatX* gu, size_t N, int I, Fp8Out q = Fp8Out{}) {
    int tm = q.codes_t != NULL;
    (tm ? swiglu_forward_kernel<true> : swiglu_forward_kernel<false>)<<<swiglu_grid(N, I, tm), 256>>>(act, gu, N, I, q);
    launchCheck();
}

static void swiglu_backward_gpu(floatX* dgu, const floatX* dact, const floatX* gu, size_t N, int I,
                                Fp8Out q = Fp8Out{}) {
    int tm = q.codes_t != NULL;
    (tm ? swiglu_backward_kernel<true> : swiglu_backward_kernel<false>)<<<swiglu_grid(N, I, tm), 256>>>(dgu, dact, gu,
                                                                                                      N, I, q);
    launchCheck();
}

// ----------------------------------------------------------------------------
// cross-entropy

// Cross-entropy over the first V logits of a row (pads V..Vp-1 masked), one block per row; its loss is lse -
// logit_target. One pass for the lse: each thread keeps a running max m and sum s of exp(x - m), rescaling s when m
// grows (s exp(m_old - m_new)); the block then combines the threads' (m, s) in a fixed order. With GRAD (a training
// forward) the row then becomes, in place, the gradient of dloss * loss, the probabilities never stored; the pass keeps
// the row in shared memory for it when `staged` (the launch gives Vp logits of room), else reads it again. Both
// variants form the same lse. Precision: m, s, lse in fp32; each exponential as 2^((x - m) log2 e) by ex2.approx
// (relative error < 2^-22; x - m is exact, the product rounded at 2^-24 relative: ~2e-6 for the terms that
// matter, |x - m| < 30), so lse is off by ~1e-7 relative for any row length (s carries at most Vp / CE_THREADS terms a
// thread); the gradient, 2^(x log2 e - lse log2 e) by one FFMA and ex2.approx, is then rounded to floatX (2^-8
// relative in bf16), as every bf16 activation gradient is. Denormal results become 0 (ex2.approx.ftz).
#define CE_THREADS 1024

// folds one pack (logits j0 .. j0 + XPACK - 1) into the running (m, s)
__device__ static inline void ce_accumulate(const PackX& p, int j0, int V, float* m, float* s) {
    float x[XPACK], pm = -INFINITY;
    #pragma unroll
    for (int k = 0; k < XPACK; k++) {
        x[k] = j0 + k < V ? to_float(p.v[k]) : -INFINITY;
        pm = fmaxf(pm, x[k]);
    }
    if (pm > *m) { *s *= expf(*m - pm); *m = pm; } // m = -inf at first: s is 0 then
    #pragma unroll
    for (int k = 0; k < XPACK; k++) { *s += ex2_ftz((x[k] - *m) * LOG2E); } // x - m exact: both bf16 values
}

// forward: loss = lse - logit_target  =>  dlogit_j = (exp(logit_j - lse) - [j = target]) dloss, pads 0
__device__ static inline PackX ce_gradient(const PackX& p, int j0, int V, int target, float lse, float dloss) {
    PackX d;
    float lse_l2 = lse * LOG2E;
    #pragma unroll
    for (int k = 0; k < XPACK; k++) {
        int j = j0 + k;
        float g = 0.0f;
        if (j < V) { g = ex2_ftz(fmaf(to_float(p.v[k]), LOG2E, -lse_l2)) * dloss - (j == target ? dloss : 0.0f); }
        d.v[k] = to_floatX(g);
    }
    return d;
}

template <bool GRAD>
__global__ void __launch_bounds__(CE_THREADS) crossentropy_kernel(float* losses, floatX* logits, const int* targets,
                                                                  int V, int Vp, float dloss, int staged, Fp8Out q) {
    extern __shared__ PackX row_s[]; // (Vp / XPACK) when staged
    __shared__ float red[32];
    size_t n = blockIdx.x;
    floatX* row = logits + n * Vp;
    int target = targets[n], stride = blockDim.x * XPACK;
    float x_target = threadIdx.x == 0 ? to_float(row[target]) : 0.0f; // read before any thread writes
    float m = -INFINITY, s = 0.0f;
    for (int j0 = threadIdx.x * XPACK; j0 < V; j0 += stride) {
        PackX p = *(const PackX*)(row + j0);
        if (GRAD && staged) { row_s[j0 / XPACK] = p; }
        ce_accumulate(p, j0, V, &m, &s);
    }
    float mx = block_max(m, red);
    float sum = block_sum(m == -INFINITY ? 0.0f : s * expf(m - mx), red); // every read and store is done past here
    float lse = mx + logf(sum);
    if (threadIdx.x == 0) { losses[n] = lse - x_target; }
    if (GRAD) {
        for (int j0 = threadIdx.x * XPACK; j0 < Vp; j0 += stride) {
            PackX p = {};
            if (j0 < V) { p = staged ? row_s[j0 / XPACK] : *(const PackX*)(row + j0); } // pads: never read
            PackX d = ce_gradient(p, j0, V, target, lse, dloss);
            unsigned no_amax = 0; // dlogits' scale is bounded: no amax
            fp8_pack<XPACK>(q, d.v, n * Vp + j0, &no_amax);
            if (!q.drop) { *(PackX*)(row + j0) = d; } // dropped: the codes alone feed the lm head's matmuls
        }
    }
}

// the cross-entropy of N rows into losses; with grad the logits become dloss times its gradient, the row staged in
// shared memory where Vp logits fit (every GPT-2-sized vocabulary in bf16)
// (q: the gradient's FP8 epilogue, Fp8Out; none by default)
static void crossentropy_gpu(float* losses, floatX* logits, const int* targets, size_t N, int V, int Vp, int grad,
                             float dloss, Fp8Out q = Fp8Out{}) {
    if (!grad) {
        crossentropy_kernel<false><<<(unsigned)N, CE_THREADS>>>(losses, logits, targets, V, Vp, 0.0f, 0, q);
        launchCheck();
        return;
    }
    size_t smem = (size_t)Vp * sizeof(floatX);
    int staged = smem + 1024 <= g_prop.sharedMemPerBlockOptin; // 1 KB: room for the static red[32] and margin
    if (staged) { smem_limit(smem, crossentropy_kernel<true>); }
    crossentropy_kernel<true><<<(unsigned)N, CE_THREADS, staged ? smem : 0>>>(losses, logits, targets, V, Vp, dloss,
                                                                              staged, q);
    launchCheck();
}

// ----------------------------------------------------------------------------
// optimiser kernels: the gradient norm's fp64 partial sums, AdamW, the matmul copy of the weights

// [lo, lo + n) of a flat buffer; v: where it starts in the concatenation of its list's ranges
typedef struct { size_t lo, n, v; } Range;

// stage 1 of the gradient norm: fixed grid, fixed order, fp64 partial sums of squares over a list of ranges (their
// concatenation, `total` long, cut into one equal chunk per block)
#define NORM_BLOCKS 512
// (a thread loads four of its strided elements at once, so four loads are in flight, and adds them in the same order as
// one at a time)
__global__ void sumsq_partial_kernel(double* partial, const float* g, const Range* ranges, int count, size_t total) {
    __shared__ double red[256];
    double acc = 0.0;
    size_t chunk = (total + gridDim.x - 1) / gridDim.x, v0 = (size_t)blockIdx.x * chunk, v1 = v0 + chunk;
    for (int r = 0; r < count; r++) {
        Range rg = ranges[r];
        size_t a = v0 > rg.v ? v0 : rg.v, b = v1 < rg.v + rg.n ? v1 : rg.v + rg.n;
        if (a >= b) { continue; }
        const float* x = g + rg.lo + (a - rg.v);
        size_t n = b - a, stride = blockDim.x, i = threadIdx.x;
        for (; i + 3 * stride < n; i += 4 * stride) {
            float p = x[i], q = x[i + stride], u = x[i + 2 * stride], w = x[i + 3 * stride];
            acc += (double)p * p;
            acc += (double)q * q;
            acc += (double)u * u;
            acc += (double)w * w;
        }
        for (; i < n; i += stride) { acc += (double)x[i] * x[i]; }
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) { red[threadIdx.x] += red[threadIdx.x + s]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { partial[blockIdx.x] = red[0]; }
}

// AdamW on every trainable parameter of this rank's optimizer ranges in one launch, the twin's arithmetic; grad_scale
// applies the clipping; the matmul copy of the weight is refreshed. A table of segments (adamw_segments) lists the
// ranges' trainable parts; each block updates ADAMW_THREADS * ADAMW_PER_THREAD elements of one segment, a thread
// ADAMW_PER_THREAD of them ADAMW_THREADS apart, all loaded before any is updated (loads in flight, coalesced).
#define ADAMW_THREADS 256
#define ADAMW_PER_THREAD 4

// One AdamW segment: n parameters from lo, their moments from m_lo; decayed or not
typedef struct {
    size_t lo, n, m_lo;
    unsigned first_block; // its thread blocks: [first_block, the next segment's)
    int decay;
} AdamWSegment;

__global__ void adamw_kernel(float* __restrict__ p, floatX* __restrict__ p_x, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, const AdamWSegment* segs, int count,
                             float lr, float weight_decay, float beta1, float beta2, float c1, float c2, float eps,
                             float grad_scale) {
    int a = 0, b = count - 1; // the last segment whose first block is <= this one
    while (a < b) {
        int mid = (a + b + 1) / 2;
        if (segs[mid].first_block <= blockIdx.x) { a = mid; } else { b = mid - 1; }
    }
    AdamWSegment sg = segs[a];
    size_t j0 = (size_t)(blockIdx.x - sg.first_block) * ADAMW_THREADS * ADAMW_PER_THREAD + threadIdx.x;
    size_t lo = sg.lo, n = sg.n, m_lo = sg.m_lo;
    float wd = sg.decay ? weight_decay : 0.0f;
    float pp[ADAMW_PER_THREAD], gg[ADAMW_PER_THREAD], mm[ADAMW_PER_THREAD], vv[ADAMW_PER_THREAD];
    #pragma unroll
    for (int u = 0; u < ADAMW_PER_THREAD; u++) {
        size_t j = j0 + (size_t)u * ADAMW_THREADS, i = lo + j;
        if (j < n) { pp[u] = p[i]; gg[u] = g[i]; mm[u] = m[m_lo + j]; vv[u] = v[m_lo + j]; }
    }
    #pragma unroll
    for (int u = 0; u < ADAMW_PER_THREAD; u++) {
        size_t j = j0 + (size_t)u * ADAMW_THREADS, i = lo + j;
        if (j >= n) { continue; }
        float gr = gg[u] * grad_scale; // exact when not clipping (grad_scale = 1)
        float mi = beta1 * mm[u] + (1.0f - beta1) * gr;
        float vi = beta2 * vv[u] + (1.0f - beta2) * gr * gr;
        float mhat = mi / c1, vhat = vi / c2;
        float pi = pp[u] - lr * (mhat / (sqrtf(vhat) + eps) + wd * pp[u]);
        m[m_lo + j] = mi;
        v[m_lo + j] = vi;
        p[i] = pi;
        p_x[i] = to_floatX(pi);
    }
}

__global__ void to_floatX_kernel(floatX* out, const float* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = to_floatX(in[i]); }
}

// partial (NORM_BLOCKS) = the fp64 sums of squares of g over the `count` ranges (`total` elements)
static void sumsq_partial_gpu(double* partial, const float* g, const Range* ranges, int count, size_t total) {
    sumsq_partial_kernel<<<NORM_BLOCKS, 256>>>(partial, g, ranges, count, total);
    launchCheck();
}

// AdamW on the `count` segments, `blocks` thread blocks in all (adamw_segment_table)
static void adamw_gpu(float* p, floatX* p_x, const float* g, float* m, float* v, const AdamWSegment* segs, int count,
                      unsigned blocks, float lr, float weight_decay, float beta1, float beta2, float c1, float c2,
                      float eps, float grad_scale) {
    adamw_kernel<<<blocks, ADAMW_THREADS>>>(p, p_x, g, m, v, segs, count, lr, weight_decay, beta1, beta2, c1, c2, eps,
                                            grad_scale);
    launchCheck();
}

static void to_floatX_gpu(floatX* out, const float* in, size_t n) {
    to_floatX_kernel<<<elem_blocks(n), 256>>>(out, in, n);
    launchCheck();
}

// ----------------------------------------------------------------------------
// data parallel: one process per GPU, NCCL between them. Every rank holds buffers for all weights (fp32 master and
// matmul copy) and gradients. ZeRO stage 0 all-reduces the gradients and every rank runs AdamW on everything; stage 1
// reduce-scatters them, each rank runs AdamW on its shard (and holds only that shard's moments), then the weights are
// all-gathered (the matmul weights as their bf16 copy: layout_params). Results that the host needs (losses, the
// gradient norm) are gathered from every rank and summed on the host in rank order: the same bits on every rank, every
// run.

#define DIST_TIMEOUT_S 900 // longest wait for a collective; a rank that died never arrives
#define GATHER_MAX NORM_BLOCKS

typedef struct {
    int rank, world, local_rank;
    int zero_stage;        // 0: all-reduce gradients; 1: reduce-scatter, sharded AdamW, all-gather
    const char* how;       // how the processes found each other (for the log)
    ncclComm_t comm;       // NULL in a single process
    cudaStream_t stream;   // the collectives' stream, joined to the default stream by events
    cudaEvent_t ready, done;
    double* gather_dev;    // (world, GATHER_MAX) values from every rank
    double* gather_host;
    double* scalar_dev;
    int mpi;               // MPI_Init was called
} Dist;

static Dist g_single_process = {0, 1, 0, 0, "single process", NULL, 0, NULL, NULL, NULL, NULL, NULL, 0};

// the collectives wait for the work queued so far on the default stream, and work queued after them waits for them
static void dist_stream_begin(const Dist* d) {
    cudaCheck(cudaEventRecord(d->ready, 0));
    cudaCheck(cudaStreamWaitEvent(d->stream, d->ready, 0));
}

static void dist_stream_end(const Dist* d) {
    cudaCheck(cudaEventRecord(d->done, d->stream));
    cudaCheck(cudaStreamWaitEvent(0, d->done, 0));
}

// Waits for the collectives queued so far. A rank that failed never joins them and the others would hang in NCCL
// forever: report that instead, after DIST_TIMEOUT_S.
static void dist_wait(const Dist* d) {
    if (d->comm == NULL) { cudaCheck(cudaDeviceSynchronize()); return; }
    double start = now_seconds();
    for (;;) {
        cudaError_t e = cudaStreamQuery(d->stream);
        if (e == cudaSuccess) { return; }
        if (e != cudaErrorNotReady) { cudaCheck(e); }
        ncclResult_t async_err = ncclSuccess;
        ncclCheck(ncclCommGetAsyncError(d->comm, &async_err));
        if (async_err != ncclSuccess && async_err != ncclInProgress) {
            ncclCommAbort(d->comm);
            fail("rank %d: a collective failed: %s\nHINT: rerun with NCCL_DEBUG=INFO", d->rank,
                 ncclGetErrorString(async_err));
        }
        if (now_seconds() - start > DIST_TIMEOUT_S) {
            ncclCommAbort(d->comm);
            fail("rank %d: a collective did not finish in %d s: another process probably failed or stopped\n"
                 "HINT: read the other processes' errors; all must run the same command and reach the same steps",
                 d->rank, DIST_TIMEOUT_S);
        }
        sched_yield();
    }
}

// the n <= GATHER_MAX device doubles of every rank on the host, (world, n) in rank order (several processes only)
static const double* dist_gather(const Dist* d, const double* values_dev, int n) {
    dist_stream_begin(d);
    ncclCheck(ncclAllGather(values_dev, d->gather_dev, (size_t)n, ncclDouble, d->comm, d->stream));
    dist_stream_end(d);
    dist_wait(d);
    cudaCheck(cudaMemcpy(d->gather_host, d->gather_dev, (size_t)n * d->world * sizeof(double),
                         cudaMemcpyDeviceToHost));
    return d->gather_host;
}

// sum over ranks and values of n device doubles per rank, in rank order then value order
static double dist_sum(const Dist* d, const double* values_dev, int n) {
    double local[GATHER_MAX];
    const double* all = local;
    if (n > GATHER_MAX) { fail("internal: dist_sum of %d values exceeds GATHER_MAX %d" BUG_HINT, n, GATHER_MAX); }
    if (d->world == 1) {
        cudaCheck(cudaMemcpy(local, values_dev, (size_t)n * sizeof(double), cudaMemcpyDeviceToHost));
    } else {
        all = dist_gather(d, values_dev, n);
    }
    double sum = 0.0;
    for (int i = 0; i < n * d->world; i++) { sum += all[i]; }
    return sum;
}

// (the upload is a blocking copy: call it with no collective in flight, or a rank that died would hang this one before
// dist_wait can notice)
static double dist_sum_scalar(const Dist* d, double v) {
    if (d->world == 1) { return v; }
    cudaCheck(cudaMemcpy(d->scalar_dev, &v, sizeof(double), cudaMemcpyHostToDevice));
    return dist_sum(d, d->scalar_dev, 1);
}

// A training step's loss, summed over the ranks as dist_sum_scalar does, and in the same all-gather the rank whose
// forwards and backwards took longest (seconds from each rank's own step start): the collectives after them wait for
// it. When the ranks start a step together (no sample or checkpoint on rank 0 alone before it), how much longer it
// took is how long this rank waited. (The upload blocks: call it with no collective in flight.)
static double dist_sum_loss(const Dist* d, double loss, double t_local, int* slowest, double* t_slowest) {
    *slowest = d->rank;
    *t_slowest = t_local;
    if (d->world == 1) { return loss; }
    double mine[2] = {loss, t_local};
    cudaCheck(cudaMemcpy(d->scalar_dev, mine, sizeof(mine), cudaMemcpyHostToDevice));
    const double* all = dist_gather(d, d->scalar_dev, 2);
    double sum = 0.0;
    for (int r = 0; r < d->world; r++) {
        sum += all[2 * r];
        if (all[2 * r + 1] > *t_slowest) {
            *slowest = r;
            *t_slowest = all[2 * r + 1];
        }
    }
    return sum;
}

// stops every rank when the ranks disagree on v (they were started with different commands)
static void dist_check_same(const Dist* d, double v, const char* what) {
    if (d->world == 1) { return; }
    cudaCheck(cudaMemcpy(d->scalar_dev, &v, sizeof(double), cudaMemcpyHostToDevice));
    const double* all = dist_gather(d, d->scalar_dev, 1);
    for (int r = 1; r < d->world; r++) {
        if (all[r] != all[0]) {
            fail("the processes disagree on %s: rank 0 has %.17g, rank %d has %.17g\n"
                 "HINT: start every process with the same flags (only -I differs)", what, all[0], r, all[r]);
        }
    }
}

// stops every rank when one could not go on (ok 0; why: its message): that rank with its message, the others naming it
static void dist_all_ok(const Dist* d, int ok, const char* why) {
    int bad = ok ? -1 : d->rank;
    if (d->world > 1) {
        double v = ok;
        cudaCheck(cudaMemcpy(d->scalar_dev, &v, sizeof(double), cudaMemcpyHostToDevice));
        const double* all = dist_gather(d, d->scalar_dev, 1);
        for (int r = d->world - 1; r >= 0; r--) { bad = all[r] == 0.0 ? r : bad; }
    }
    if (!ok) { fail("%s", why); }
    if (bad >= 0) {
        fail("rank %d could not start the run\nHINT: read rank %d's error (its stderr)", bad, bad);
    }
}

#ifdef USE_MPI
static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL || getenv("PMI_RANK") != NULL;
}
#endif

// rank 0 makes the NCCL id and hands it to the others: MPI, a TCP rendezvous or a shared file
static void dist_exchange_id(Dist* d, ncclUniqueId* id, const char* rendezvous) {
    if (d->rank == 0) { ncclCheck(ncclGetUniqueId(id)); }
#ifdef USE_MPI
    if (d->mpi) {
        mpiCheck(MPI_Bcast(id, (int)sizeof(*id), MPI_BYTE, 0, MPI_COMM_WORLD));
        return;
    }
#endif
    if (rendezvous == NULL) {
        fail("%d processes need a rendezvous to find each other\nHINT: pass -F <file on a shared filesystem> or -F "
             "tcp://<rank 0 host>:<port> to every process, or build with 'make train_fox USE_MPI=1' and launch with "
             "mpirun; for one GPU inside a Slurm or MPI allocation pass -W 1", d->world);
    }
    char host[256];
    int port;
    if (rendezvous_is_tcp(rendezvous, host, sizeof(host), &port)) {
        d->how = "TCP rendezvous";
        if (d->rank == 0) { rendezvous_tcp_serve(port, id, sizeof(*id), d->world, RENDEZVOUS_TIMEOUT_S); }
        else { rendezvous_tcp_fetch(host, port, id, sizeof(*id), d->rank, RENDEZVOUS_TIMEOUT_S); }
    } else {
        d->how = "file rendezvous";
        if (d->rank == 0) {
            rendezvous_file_publish(rendezvous, id, sizeof(*id), d->world);
            rendezvous_file_await_acks(rendezvous, d->world, RENDEZVOUS_TIMEOUT_S);
        } else {
            rendezvous_file_fetch(rendezvous, id, sizeof(*id), d->rank, RENDEZVOUS_TIMEOUT_S);
        }
    }
}

// Finds this process's rank and GPU, initialises the GPU and, with more than one process, the NCCL communicator.
static void dist_init(Dist* d, const Args* a, int argc, char** argv) {
    *d = g_single_process;
    Topology t;
#ifdef USE_MPI
    if (a->rendezvous == NULL && launched_by_mpi()) {
        mpiCheck(MPI_Init(&argc, &argv));
        d->mpi = 1;
        mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &t.rank));
        mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &t.world));
        MPI_Comm node;
        mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
        mpiCheck(MPI_Comm_rank(node, &t.local_rank));
        mpiCheck(MPI_Comm_free(&node));
        if ((a->world > 0 && a->world != t.world) || (a->rank >= 0 && a->rank != t.rank)) {
            fail("-W %d / -I %d disagree with mpirun's %d processes (this one rank %d)\n"
                 "HINT: drop -W and -I under mpirun", a->world, a->rank, t.world, t.rank);
        }
        d->how = "MPI";
    } else
#endif
    { (void)argc; (void)argv; resolve_topology(&t, a->world, a->rank); }
    d->rank = t.rank; d->world = t.world; d->local_rank = t.local_rank;
    d->zero_stage = a->zero_stage >= 0 ? a->zero_stage : (t.world > 1 ? 1 : 0);
    setenv("NCCL_NVLS_ENABLE", "0", 0); // never NVLink multicast, unless the user asks for it
#ifdef NO_NCCL
    if (t.world > 1) {
        fail("%d processes, but this train_fox was built without NCCL, so it trains on one GPU\nHINT: install NCCL "
             "(or pass NCCL_HOME=<its directory> to make) and rebuild with 'make train_fox'", t.world);
    }
#endif
    gpu_init_device(t.local_rank);
    if (t.world == 1) { return; }
    ncclUniqueId id;
    dist_exchange_id(d, &id, a->rendezvous);
    ncclCheck(ncclCommInitRank(&d->comm, d->world, id, d->rank));
    if (d->rank == 0 && !d->mpi && a->rendezvous != NULL && strncmp(a->rendezvous, "tcp://", 6) != 0) {
        rendezvous_file_cleanup(a->rendezvous, d->world); // every rank has joined: the file is spent
    }
    cudaCheck(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&d->ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&d->done, cudaEventDisableTiming));
    d->gather_dev = (double*)gpu_malloc((size_t)d->world * GATHER_MAX * sizeof(double), "gather buffer");
    d->scalar_dev = (double*)gpu_malloc(2 * sizeof(double), "gather scalars");
    d->gather_host = (double*)malloc_check((size_t)d->world * GATHER_MAX * sizeof(double), "gather buffer");
}

static void dist_free(Dist* d) {
    if (d->comm != NULL) {
        dist_wait(d);
        ncclCheck(ncclCommDestroy(d->comm));
        cudaCheck(cudaStreamDestroy(d->stream));
        cudaCheck(cudaEventDestroy(d->ready)); cudaCheck(cudaEventDestroy(d->done));
        cudaCheck(cudaFree(d->gather_dev)); cudaCheck(cudaFree(d->scalar_dev));
        free(d->gather_host);
    }
#ifdef USE_MPI
    if (d->mpi) { mpiCheck(MPI_Finalize()); }
#endif
    *d = g_single_process;
}

// ----------------------------------------------------------------------------
// the GPU model: the twin's FoxModel holds the configuration, the parameter table and a host copy of the weights
// (checkpoints, tests); the device holds everything else

typedef struct {
    float* resid;       // (L+1, N, C) fp32 residual stream entering each layer; [L] the final one
    float* resid_mid;   // (L, N, C)   fp32 residual after attention
    floatX* xa;         // (L, N, C)   RMSNorm_1 output (R)
    float* rstd_a;      // (L, N)
    floatX* q_raw;      // (L, N, C)   W_q x
    floatX* k_raw;      // (L, N, C)
    floatX* v_raw;      // (L, N, C)
    float* k_alpha;     // (L, N, H)   shift logits w_s . x (fp32)
    float* v_alpha;     // (L, N, H)
    floatX* k_shifted;  // (L, N, C)   = k_raw without the k shift (R)
    floatX* v;          // (L, N, C)   = v_raw without the v shift (R)
    float* rstd_q;      // (L, N, H)
    float* rstd_k;      // (L, N, H)
    floatX* q;          // (L, N, C)   after QK-norm and RoPE (= q_raw with both off) (R)
    floatX* k;          // (L, N, C)   (= k_shifted with both off) (R)
    float* gate_logit;  // (L, N, H)   z = w_f . x + b_f (fp32)
    float* c;           // (L, B, H, T) fp32
    float* lse;         // (L, B, H, T)
    floatX* o;          // (L, N, C)
    float* rstd_o;      // (L, N, H)
    floatX* o_normed;   // (L, N, C)   only with output norm and gate both on (R)
    floatX* og_logit;   // (L, N, C)
    floatX* y;          // (L, N, C)   input of W_o (= o with norm and gate off) (R)
    floatX* xm;         // (L, N, C) (R)
    float* rstd_m;      // (L, N)
    floatX* gu;         // (L, N, 2I)
    floatX* act;        // (L, N, I) (R)
    floatX* xf;         // (N, C)
    float* rstd_f;      // (N)
    floatX* logits;     // (N, Vp), turned into dlogits by the backward
    float* losses;      // (N)
    int recompute;      // -r 1: the tensors marked (R) hold one layer, recomputed in the backward
} GPUActivations;

// backward buffers, one layer's worth, reused by every layer
typedef struct {
    float* dresid;      // (N, C) fp32 gradient of the residual stream
    floatX* dresid_x;   // (N, C) its matmul copy
    float* dxn;         // (N, C) fp32 gradient at an RMSNorm's output (matmuls accumulate into it)
    floatX* dact;       // (N, I)
    floatX* dgu;        // (N, 2I)
    floatX* dy;         // (N, C)
    floatX* don;        // (N, C)  gradient at the output norm's output
    floatX* d_o;        // (N, C)
    floatX* dq;         // (N, C)
    floatX* dk;         // (N, C)
    floatX* dv;         // (N, C)
    float* dlogf;       // (B, H, T) gradient of log f
    float* attn_scratch; // (3, B, H, T) attention backward: dc column part, dc row part, Delta
    float* dgl;         // (N, H)
    floatX* dq_normed;  // (N, C)
    floatX* dk_normed;  // (N, C)
    floatX* dk_shifted; // (N, C)
    floatX* dqkvg;      // (N, F C) the gradients of W_q x, W_k x, W_v x, W_g x that stage kernels write (qkvg_slots)
    floatX* dhp;        // (N, P H) gradients of the head projections' outputs side by side (head_proj_slots)
    float* partial;     // column-sum partials, (N / min(COLSUM_ROWS, RMS_BWD_ROWS), C)
    int* enc_tokens;    // encoder backward: distinct tokens (N), CSR offsets (N+1), positions (N)
    int* enc_offsets;
    int* enc_positions;
} GPUGradBuffers;

// A list of ranges, in increasing lo, on the host and the device; total: the sum of their n
typedef struct {
    Range* host;
    Range* dev;   // NULL when only the host's is needed
    int count;
    size_t total;
} RangeList;

enum { BUCKET_FP32, BUCKET_MATMUL, NUM_BUCKETS };

// Where the GPU's flat buffers keep each tensor (layout_params), unlike the twin
typedef struct {
    size_t* slice;       // (NUM_PARAM_TENSORS, L) offset of tensor t's layer-l slice (layer 0 if not per layer)
    Range bucket[NUM_BUCKETS]; // see layout_params; v unused
    size_t size;         // elements of a flat buffer, padding included
} ParamLayout;

// gpu_train_micro_step's CUDA graph of a micro-step's kernels, for one shape
typedef struct {
    cudaGraphExec_t exec;
    int state;          // 0: none; 1: ran eagerly at this shape (the lazy set-up is done); 2: exec captured
    int B, T, epoch;    // the shape and g_buffer_epoch it was captured for
    float loss_scale;
    long launches;      // of exec, since its capture
} StepGraph;

static void step_graph_drop(StepGraph* sg) {
    if (sg->state == 2) { cudaCheck(cudaGraphExecDestroy(sg->exec)); }
    sg->state = 0;
}

// The device side of the twin's Fp8State (-q, bf16 build), whose histories, delayed scales and step amaxes stay on the
// host. The scale slots (fp8_delayed_at ... fp8_dlogits_at): the delayed operands (L, FP8_SLOTS) in the twin's order,
// the RMSNorm outputs' bounded scales (L, FP8_NORMS) and the final norm's, the weight groups' current scales
// (L, FP8_WEIGHTS) and the lm head's, dlogits'.
enum { FP8_N_XA, FP8_N_Y, FP8_N_XM, FP8_NORMS };                  // a layer's RMSNorm outputs (y: the output norm's)
enum { FP8_W_QKVG, FP8_W_O, FP8_W_GU, FP8_W_DOWN, FP8_WEIGHTS };   // a layer's weight groups (q, k, v, g share one)
// One FP8 weight block: rows x cols at a matmul-copy offset, its group's scale slot, and its first FP8_TILE x FP8_TILE
// tile in the one grid over every block's tiles (fp8_weights_amax_kernel, fp8_weights_cast_kernel)
typedef struct { size_t off; int rows, cols, slot; unsigned tile0; } Fp8Block;
typedef struct {
    int on;             // allocated: the host model's mode is not off
    uint8_t* w8;        // (layout.size) E4M3 codes of the FP8 matmuls' weights, at the matmul copy's offsets
    uint8_t* w8t;       // (layout.size) each weight block (OC, IC) as (IC, OC) at its offset: input gradients
    uint8_t* x8;        // (N, max(C, I)) the codes of a forward matmul's input
    uint8_t* d8;        // (N, max(Vp, 4C, 2I)) the codes of a backward matmul's output gradient
    floatX* xr;         // (N, max(C, I)) a forward input's rounded values again, for its weight gradient
    int wgrad8;         // weight gradients in FP8 (fp8_wgrad8_on), on the token-major codes below
    uint8_t* x8t;       // (R, 3C + I, N) token-major codes of xm (C, N), act (I, N), y (C, N), xa (C, N): each layer's
                        // (-r 1: one layer's)
    uint8_t* xf8t;      // (C, N) xf's token-major codes (the lm head's input)
    uint8_t* d8t;       // (max(Vp, 4C, 2I), N) token-major codes of a backward matmul's output gradient
    int* k;             // (fp8_index_count) scale exponents
    float* inv;         // (fp8_index_count, FP8_INV_STRIDE) 2^-k: the matmuls' dequantisation scales, 16 bytes apart
    unsigned* amax;     // (fp8_index_count) amaxes as magnitude bits: the step's delayed operands', norms', weights'
    int* k_host;        // (fp8_index_count) staging for the host's scales
    unsigned* amax_host; // (L, FP8_SLOTS) staging for the step's amaxes
    Fp8Block* blocks;   // (nblocks) the weight blocks (fp8_weight_blocks), in tile order
    int nblocks;
    unsigned tiles;     // the weight blocks' tiles in all
} Fp8Gpu;

#define FP8_INV_STRIDE 4 // floats between two slots' dequantisation scales (cuBLASLt reads each by pointer)
#define FP8_AT __host__ __device__ static int
FP8_AT fp8_delayed_at(int l, int slot) { return l * FP8_SLOTS + slot; }
FP8_AT fp8_norm_at(int L, int l, int j) { return L * FP8_SLOTS + l * FP8_NORMS + j; } // l = L: the final norm
FP8_AT fp8_weight_at(int L, int l, int j) { return fp8_norm_at(L, L, 1) + l * FP8_WEIGHTS + j; } // l = L: lm head
FP8_AT fp8_dlogits_at(int L) { return fp8_weight_at(L, L, 1); }
#ifndef ENABLE_FP32
FP8_AT fp8_index_count(int L) { return fp8_dlogits_at(L) + 1; }
#endif

typedef struct {
    FoxModel* host;
    FoxConfig config;
    size_t num_parameters;
    ParamLayout layout;
    const Dist* dist;
    RangeList shard;    // this rank's share of every bucket (everything in one process)
    RangeList opt;      // the ranges whose AdamW state this rank holds and updates (the shard under ZeRO-1)
    AdamWSegment* adamw_segs; // (adamw_count) on the device: opt's trainable parts (adamw_segments)
    int adamw_count;
    unsigned adamw_blocks;
    float* params;      // (layout.size) fp32 master weights
    floatX* params_x;   // (layout.size) their matmul copy
    float* grads;       // (layout.size) fp32
    float* adam_m;      // (opt.total) fp32 AdamW moments of opt's ranges, one after another
    float* adam_v;
    int max_B, max_T;
    char* acts_memory;
    size_t acts_bytes;
    GPUActivations acts;
    char* grad_memory;
    size_t grad_bytes;
    GPUGradBuffers gb;
    float* rope;        // (max_T, hd/2, 2) cos, sin; NULL without RoPE
    int* inputs;        // (B, T) device copies
    int* targets;
    int* docs_dev;      // (2, B, T) with documents kept apart (-f 1): the batch's document starts, then ends (FoxDocs)
    int* docs_host;     // (2, B, T) their host copy
    int docs_on;        // the batch keeps documents apart (the host model's doc_eot >= 0)
    double* norm_partial; // (NORM_BLOCKS)
    // host side
    int B, T;
    const int* inputs_host;
    int has_targets;    // the last forward had targets (losses)
    int has_dlogits;    // the logits hold the loss's gradient (gpu_forward_train)
    float mean_loss;    // of the last forward with targets, -1 otherwise
    StepGraph step_graph; // gpu_train_micro_step's
    float* losses_host; // (N)
    int* enc_host;      // (3N + 1 + V) counting-sort workspace
    Fp8Gpu fp8;         // -q
} GPUModel;

// The (C, C) projections of the attention input: q, k, v and the output gate
static const int QKVG_TENSORS[4] = {P_WQ, P_WK, P_WV, P_WG};

// The gradients of their outputs that a stage kernel writes (QK-norm/RoPE for q; the k shift, else QK-norm/RoPE for k;
// the v shift for v; the output gate's backward) land side by side in dqkvg, so the input's gradient takes one matmul
// for all of them; one whose stage is off is the attention's own output and gets its own matmul. slot[j]: tensor j's
// block in dqkvg, -1 if none; returns F, the number of blocks.
static int qkvg_slots(const FoxConfig* cf, int slot[4]) {
    int staged[4] = {cf->qk_norm || cf->rope, cf->k_shift || cf->qk_norm || cf->rope, cf->v_shift, cf->output_gate};
    int F = 0;
    for (int j = 0; j < 4; j++) { slot[j] = staged[j] ? F++ : -1; }
    return F;
}
// ----------------------------------------------------------------------------
// the GPU's parameter layout: the twin and the files keep each tensor for all layers together; the GPU's flat buffers
// (weights, matmul copy, gradients) hold two buckets. BUCKET_FP32: the tensors the forward reads in fp32 (the
// embedding, every layer's norm weights and gate bias, the final norm). BUCKET_MATMUL: the matmul weights, layer by
// layer (layer_matrix_order: the projections of qkvg_slots and those of head_proj_slots side by side in their slots'
// order, one matmul each for their input's and their weights' gradients), then lm_head. ZeRO-1 all-gathers
// BUCKET_MATMUL in bf16 (params_x, half the bytes, no conversion after it); the fp32 master of its other ranks'
// shares is gathered only for checkpoints (gpu_gather_master), and the matmul copy of BUCKET_FP32 is never read. Every
// slice starts at a multiple of LAYOUT_ALIGN elements, except that the members of a group one matmul reads follow each
// other with no gap (C x C and H x C slices: at least 16 bytes aligned); every bucket is padded to a multiple of
// world * LAYOUT_ALIGN, and rank r's share (ZeRO-1 shard) of a bucket is its r-th of world equal parts. The padding is
// zeros and stays zeros (no kernel writes it; AdamW keeps zeros zero).
#define LAYOUT_ALIGN 64

static size_t round_up(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

// whether the forward reads tensor t in fp32 (BUCKET_FP32) rather than as a matmul weight
static int param_read_fp32(const ParamSpec* spec, int t) { return t == P_WTE || spec[t].cols == 1; }

// a layer's matmul weights in bucket order: the grouped projections (qkvg_slots's order), the head projections
// (head_proj_slots's), the others; returns their count. packed[i]: order[i + 1] is the next member of order[i]'s
// group, so it follows with no padding between (one matmul reads both).
static int layer_matrix_order(const FoxConfig* cf, const ParamSpec* spec, int order[NUM_PARAM_TENSORS],
                              int packed[NUM_PARAM_TENSORS]) {
    int slot[4], F = qkvg_slots(cf, slot), hp_slot[HP_MAX], P = head_proj_slots(cf, hp_slot), n = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { packed[i] = i + 1 < F || (i >= F && i + 1 < F + P); }
    int placed[NUM_PARAM_TENSORS] = {0};
    for (int s = 0; s < F; s++) {
        for (int j = 0; j < 4; j++) {
            if (slot[j] == s) { order[n++] = QKVG_TENSORS[j]; placed[QKVG_TENSORS[j]] = 1; }
        }
    }
    for (int s = 0; s < P; s++) {
        for (int i = 0; i < HP_MAX; i++) {
            if (hp_slot[i] == s) { order[n++] = HP_TENSORS[i]; placed[HP_TENSORS[i]] = 1; }
        }
    }
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        if (spec[t].per_layer && !placed[t] && !param_read_fp32(spec, t)) { order[n++] = t; }
    }
    return n;
}

// tensor t's layer-l slice at *off, which moves past it (and the padding after it unless packed)
static void layout_place(ParamLayout* lay, const ParamSpec* spec, size_t L, int t, size_t l, size_t* off,
                         int packed) {
    lay->slice[(size_t)t * L + l] = *off;
    *off += param_slice_numel(&spec[t]);
    if (!packed) { *off = round_up(*off, LAYOUT_ALIGN); }
}

static void layout_params(ParamLayout* lay, const FoxConfig* cf, int world) {
    ParamSpec spec[NUM_PARAM_TENSORS];
    param_table(cf, spec);
    size_t L = (size_t)cf->n_layer, unit = (size_t)LAYOUT_ALIGN * (size_t)world, off = 0;
    lay->slice = (size_t*)calloc_check(NUM_PARAM_TENSORS * L, sizeof(size_t), "parameter layout");
    int order[NUM_PARAM_TENSORS], packed[NUM_PARAM_TENSORS], n_order = layer_matrix_order(cf, spec, order, packed);
    layout_place(lay, spec, L, P_WTE, 0, &off, 0); // BUCKET_FP32
    for (size_t l = 0; l < L; l++) {
        for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
            if (spec[t].per_layer && param_read_fp32(spec, t)) { layout_place(lay, spec, L, t, l, &off, 0); }
        }
    }
    layout_place(lay, spec, L, P_NORM_F, 0, &off, 0);
    lay->bucket[BUCKET_FP32] = (Range){0, round_up(off, unit), 0};
    off = lay->bucket[BUCKET_FP32].n; // BUCKET_MATMUL
    for (size_t l = 0; l < L; l++) {
        for (int i = 0; i < n_order; i++) { layout_place(lay, spec, L, order[i], l, &off, packed[i]); }
    }
    layout_place(lay, spec, L, P_LM_HEAD, 0, &off, 0);
    lay->size = lay->bucket[BUCKET_FP32].n + round_up(off - lay->bucket[BUCKET_FP32].n, unit);
    lay->bucket[BUCKET_MATMUL] = (Range){lay->bucket[BUCKET_FP32].n, lay->size - lay->bucket[BUCKET_FP32].n, 0};
}

static void layout_free(ParamLayout* lay) { free(lay->slice); }

// layer l's slice of a tensor in a flat buffer
static size_t slice_offset(const GPUModel* g, int tensor, int l) {
    return g->layout.slice[(size_t)tensor * g->config.n_layer + l];
}
static float* pm(GPUModel* g, int tensor, int l) { return g->params + slice_offset(g, tensor, l); }
static floatX* px(GPUModel* g, int tensor, int l) { return g->params_x + slice_offset(g, tensor, l); }
static float* pg(GPUModel* g, int tensor, int l) { return g->grads + slice_offset(g, tensor, l); }

// Copies one flat buffer between the device, in the GPU's layout, and the host, in the twin's, one memcpy per tensor
// slice.
static void gpu_layout_copy(const GPUModel* g, float* dev, float* host, cudaMemcpyKind kind) {
    const ParamSpec* spec = g->host->spec;
    size_t twin = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        size_t n = param_slice_numel(&spec[t]);
        for (int l = 0; l < (spec[t].per_layer ? g->config.n_layer : 1); l++, twin += n) {
            float* d = dev + slice_offset(g, t, l);
            if (n == 0) { continue; }
            if (kind == cudaMemcpyHostToDevice) {
                cudaCheck(cudaMemcpy(d, host + twin, n * sizeof(float), kind));
            } else {
                cudaCheck(cudaMemcpy(host + twin, d, n * sizeof(float), kind));
            }
        }
    }
}
static void gpu_download(const GPUModel* g, const float* dev, float* host) {
    gpu_layout_copy(g, (float*)dev, host, cudaMemcpyDeviceToHost);
}
static void gpu_upload(const GPUModel* g, const float* host, float* dev) {
    gpu_layout_copy(g, dev, (float*)host, cudaMemcpyHostToDevice);
}

// this rank's share of every bucket (rank_share) or the whole buffer as one range, on the host
static void range_list_host(RangeList* list, const ParamLayout* lay, const Dist* d, int rank_share) {
    memset(list, 0, sizeof(*list));
    list->count = rank_share ? NUM_BUCKETS : 1;
    list->host = (Range*)calloc_check((size_t)list->count, sizeof(Range), "ranges");
    list->total = 0;
    for (int i = 0; i < list->count; i++) {
        Range r = rank_share ? lay->bucket[i] : (Range){0, lay->size, 0};
        if (rank_share) { r.n /= (size_t)d->world; r.lo += (size_t)d->rank * r.n; }
        r.v = list->total;
        list->total += r.n;
        list->host[i] = r;
    }
}

// the same on both sides
static void range_list_build(RangeList* list, const ParamLayout* lay, const Dist* d, int rank_share) {
    range_list_host(list, lay, d, rank_share);
    list->dev = (Range*)gpu_malloc((size_t)list->count * sizeof(Range), "ranges");
    cudaCheck(cudaMemcpy(list->dev, list->host, (size_t)list->count * sizeof(Range), cudaMemcpyHostToDevice));
}

static void range_list_free(RangeList* list) {
    free(list->host);
    cudaCheck(cudaFree(list->dev));
    memset(list, 0, sizeof(*list));
}

// the part of [lo, lo + n) that falls in [s_lo, s_lo + s_n); returns its length (0: none)
static size_t range_overlap(size_t lo, size_t n, size_t s_lo, size_t s_n, size_t* out_lo) {
    size_t a = lo > s_lo ? lo : s_lo;
    size_t b = lo + n < s_lo + s_n ? lo + n : s_lo + s_n;
    *out_lo = a;
    return b > a ? b - a : 0;
}

typedef struct { size_t lo, n; int tensor; } SliceAt;
static int slice_at_cmp(const void* a, const void* b) {
    size_t x = ((const SliceAt*)a)->lo, y = ((const SliceAt*)b)->lo;
    return x < y ? -1 : x > y;
}

// AdamW's segment table for the ranges `opt`: each range's trainable parts, with neighbouring slices of the same decay
// group (and the padding between them) in one segment; *count segments, *blocks thread blocks in all
static AdamWSegment* adamw_segment_table(const ParamLayout* lay, const ParamSpec* spec, int L, const RangeList* opt,
                                         int* count_out, unsigned* blocks_out) {
    int n_slices = 0;
    SliceAt* slices = (SliceAt*)malloc_check((size_t)NUM_PARAM_TENSORS * L * sizeof(SliceAt), "slices");
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        for (int l = 0; l < (spec[t].per_layer ? L : 1); l++) {
            slices[n_slices++] = (SliceAt){lay->slice[(size_t)t * L + l], param_slice_numel(&spec[t]), t};
        }
    }
    qsort(slices, (size_t)n_slices, sizeof(SliceAt), slice_at_cmp);
    AdamWSegment* segs = (AdamWSegment*)malloc_check((size_t)n_slices * opt->count * sizeof(AdamWSegment), "segs");
    int count = 0;
    unsigned blocks = 0;
    for (int r = 0; r < opt->count; r++) {
        Range rg = opt->host[r];
        int open = 0; // the last segment may grow
        for (int i = 0; i < n_slices; i++) {
            size_t lo, n = range_overlap(slices[i].lo, slices[i].n, rg.lo, rg.n, &lo);
            const ParamSpec* s = &spec[slices[i].tensor];
            if (n == 0) { continue; }
            if (!s->trainable) { open = 0; continue; }
            if (open && segs[count - 1].decay == s->decay) {
                segs[count - 1].n = lo + n - segs[count - 1].lo;
            } else {
                segs[count++] = (AdamWSegment){lo, n, rg.v + (lo - rg.lo), 0, s->decay};
                open = 1;
            }
        }
    }
    for (int i = 0; i < count; i++) {
        segs[i].first_block = blocks;
        blocks += (unsigned)ceil_div(segs[i].n, (size_t)ADAMW_THREADS * ADAMW_PER_THREAD);
    }
    free(slices);
    *count_out = count;
    *blocks_out = blocks;
    return segs;
}

static void adamw_segments(GPUModel* g) {
    AdamWSegment* segs = adamw_segment_table(&g->layout, g->host->spec, g->config.n_layer, &g->opt, &g->adamw_count,
                                             &g->adamw_blocks);
    size_t bytes = (size_t)(g->adamw_count > 0 ? g->adamw_count : 1) * sizeof(AdamWSegment);
    g->adamw_segs = (AdamWSegment*)gpu_malloc(bytes, "AdamW segments");
    cudaCheck(cudaMemcpy(g->adamw_segs, segs, (size_t)g->adamw_count * sizeof(AdamWSegment), cudaMemcpyHostToDevice));
    free(segs);
}

// Places buffers in one allocation at 256-byte boundaries; with base == NULL it only counts.
static void* arena_take(char* base, size_t* offset, size_t bytes) {
    void* p = base != NULL ? base + *offset : NULL;
    *offset += (bytes + 255) / 256 * 256;
    return p;
}

// Lays out the activations of a (B, T) batch; stages that are off alias their input. With recompute the tensors marked
// (R) get one layer's slot, shared by all layers (see layer_acts).
static size_t layout_activations(GPUActivations* a, const FoxConfig* cf, int B, int T, int recompute, char* base) {
    size_t L = (size_t)cf->n_layer, C = (size_t)cf->n_embd, H = (size_t)cf->n_head, I = (size_t)cf->mlp_hidden;
    size_t N = (size_t)B * T, Vp = (size_t)cf->padded_vocab_size, off = 0;
    size_t fx = sizeof(floatX), f = sizeof(float);
    size_t R = recompute ? 1 : L; // layers held by an (R) tensor
    int qk_stage = cf->qk_norm || cf->rope;
    memset(a, 0, sizeof(*a));
    a->recompute = recompute;
    a->resid = (float*)arena_take(base, &off, (L + 1) * N * C * f);
    a->resid_mid = (float*)arena_take(base, &off, L * N * C * f);
    a->xa = (floatX*)arena_take(base, &off, R * N * C * fx);
    a->rstd_a = (float*)arena_take(base, &off, L * N * f);
    a->q_raw = (floatX*)arena_take(base, &off, L * N * C * fx);
    a->k_raw = (floatX*)arena_take(base, &off, L * N * C * fx);
    a->v_raw = (floatX*)arena_take(base, &off, L * N * C * fx);
    if (cf->k_shift) {
        a->k_alpha = (float*)arena_take(base, &off, L * N * H * f);
        a->k_shifted = (floatX*)arena_take(base, &off, R * N * C * fx);
    } else { a->k_shifted = a->k_raw; }
    if (cf->v_shift) {
        a->v_alpha = (float*)arena_take(base, &off, L * N * H * f);
        a->v = (floatX*)arena_take(base, &off, R * N * C * fx);
    } else { a->v = a->v_raw; }
    if (cf->qk_norm) {
        a->rstd_q = (float*)arena_take(base, &off, L * N * H * f);
        a->rstd_k = (float*)arena_take(base, &off, L * N * H * f);
    }
    if (qk_stage) {
        a->q = (floatX*)arena_take(base, &off, R * N * C * fx);
        a->k = (floatX*)arena_take(base, &off, R * N * C * fx);
    } else { a->q = a->q_raw; a->k = a->k_shifted; }
    if (cf->gate != GATE_NONE) {
        a->gate_logit = (float*)arena_take(base, &off, L * N * H * f);
        a->c = (float*)arena_take(base, &off, L * N * H * f);
    }
    a->lse = (float*)arena_take(base, &off, L * N * H * f);
    a->o = (floatX*)arena_take(base, &off, L * N * C * fx);
    if (cf->output_norm) { a->rstd_o = (float*)arena_take(base, &off, L * N * H * f); }
    if (cf->output_norm && cf->output_gate) { a->o_normed = (floatX*)arena_take(base, &off, R * N * C * fx); }
    if (cf->output_gate) { a->og_logit = (floatX*)arena_take(base, &off, L * N * C * fx); }
    if (cf->output_norm || cf->output_gate) { a->y = (floatX*)arena_take(base, &off, R * N * C * fx); }
    else { a->y = a->o; }
    a->xm = (floatX*)arena_take(base, &off, R * N * C * fx);
    a->rstd_m = (float*)arena_take(base, &off, L * N * f);
    a->gu = (floatX*)arena_take(base, &off, L * N * 2 * I * fx);
    a->act = (floatX*)arena_take(base, &off, R * N * I * fx);
    a->xf = (floatX*)arena_take(base, &off, N * C * fx);
    a->rstd_f = (float*)arena_take(base, &off, N * f);
    a->logits = (floatX*)arena_take(base, &off, N * Vp * fx);
    a->losses = (float*)arena_take(base, &off, N * f);
    return off;
}

static size_t layout_grad_buffers(GPUGradBuffers* d, const FoxConfig* cf, int B, int T, char* base) {
    size_t C = (size_t)cf->n_embd, H = (size_t)cf->n_head, I = (size_t)cf->mlp_hidden;
    size_t N = (size_t)B * T, off = 0, fx = sizeof(floatX), f = sizeof(float);
    memset(d, 0, sizeof(*d));
    d->dresid = (float*)arena_take(base, &off, N * C * f);
    d->dresid_x = (floatX*)arena_take(base, &off, N * C * fx);
    d->dxn = (float*)arena_take(base, &off, N * C * f);
    d->dact = (floatX*)arena_take(base, &off, N * I * fx);
    d->dgu = (floatX*)arena_take(base, &off, N * 2 * I * fx);
    d->dy = (floatX*)arena_take(base, &off, N * C * fx);
    d->don = (floatX*)arena_take(base, &off, N * C * fx);
    d->d_o = (floatX*)arena_take(base, &off, N * C * fx);
    d->dq = (floatX*)arena_take(base, &off, N * C * fx);
    d->dk = (floatX*)arena_take(base, &off, N * C * fx);
    d->dv = (floatX*)arena_take(base, &off, N * C * fx);
    d->dlogf = (float*)arena_take(base, &off, N * H * f);
    d->attn_scratch = (float*)arena_take(base, &off, 3 * N * H * f);
    d->dgl = (float*)arena_take(base, &off, N * H * f);
    d->dq_normed = (floatX*)arena_take(base, &off, N * C * fx);
    d->dk_normed = (floatX*)arena_take(base, &off, N * C * fx);
    d->dk_shifted = (floatX*)arena_take(base, &off, N * C * fx);
    int slot[4];
    d->dqkvg = (floatX*)arena_take(base, &off, N * qkvg_slots(cf, slot) * C * fx);
    int hp_slot[HP_MAX], P = head_proj_slots(cf, hp_slot);
    d->dhp = (floatX*)arena_take(base, &off, N * P * H * fx);
    d->partial = (float*)arena_take(base, &off,
                                    ceil_div(N, COLSUM_ROWS < RMS_BWD_ROWS ? COLSUM_ROWS : RMS_BWD_ROWS) * C * f);
    d->enc_tokens = (int*)arena_take(base, &off, N * sizeof(int));
    d->enc_offsets = (int*)arena_take(base, &off, (N + 1) * sizeof(int));
    d->enc_positions = (int*)arena_take(base, &off, N * sizeof(int));
    return off;
}

// whether the weight gradients run in FP8 (-q): their K, the tokens N, a multiple of FP8_TM_ROWS (the
// producers' tiles of token-major codes; Hopper's FP8 matmuls need 16), and n_embd within the RMSNorm backward's shared
// memory with token-major codes; else bf16
static int fp8_wgrad8_on(const FoxConfig* cf, size_t N) {
    return N % FP8_TM_ROWS == 0 && cf->n_embd <= RMS_BWD_MAX_C_TM;
}

// the device bytes of -q's buffers (gpu_fp8_build): the weights' codes twice, x8, d8, xr, the token-major codes, the
// scale slots
static size_t fp8_memory_needed(const FoxConfig* cf, size_t layout_size, int B, int T) {
    size_t N = (size_t)B * T, C = (size_t)cf->n_embd, I = (size_t)cf->mlp_hidden, Vp = (size_t)cf->padded_vocab_size;
    size_t wide = C > I ? C : I, grad = Vp > 4 * C ? Vp : 4 * C, layers = g_recompute ? 1 : (size_t)cf->n_layer;
    grad = grad > 2 * I ? grad : 2 * I;
    size_t wgrad8 = fp8_wgrad8_on(cf, N) ? N * (layers * (3 * C + I) + C + grad) : 0;
    return 2 * layout_size + N * wide * (1 + sizeof(floatX)) + N * grad + wgrad8 + (size_t)(cf->n_layer + 1) * 64 * 16;
}

// bytes of device memory for a model trained on (B, T) batches (fp8: -q's mode, its buffers counted unless off)
static size_t gpu_memory_needed(const FoxConfig* cf, int B, int T, const Dist* dist, int fp8) {
    GPUActivations a;
    GPUGradBuffers d;
    ParamLayout lay;
    layout_params(&lay, cf, dist->world);
    size_t opt = dist->world > 1 && dist->zero_stage == 1 ? lay.size / (size_t)dist->world : lay.size;
    size_t params = lay.size * (2 * sizeof(float) + sizeof(floatX)) + opt * 2 * sizeof(float); // + m, v
    if (fp8 != FP8_MODE_OFF) { params += fp8_memory_needed(cf, lay.size, B, T); }
    layout_free(&lay);
    size_t rope = cf->rope ? (size_t)T * (cf->n_embd / cf->n_head) * sizeof(float) : 0;
    return params + layout_activations(&a, cf, B, T, g_recompute, NULL) + layout_grad_buffers(&d, cf, B, T, NULL) +
           rope + 4 * (size_t)B * T * sizeof(int) + WORKSPACE_BYTES; // + inputs, targets, document starts and ends
}

// uploads the host copy of the weights (master and matmul copy)
static void gpu_params_from_host(GPUModel* g) {
    gpu_upload(g, g->host->params_memory, g->params);
    to_floatX_gpu(g->params_x, g->params, g->layout.size);
}

static void gpu_params_to_host(GPUModel* g) { gpu_download(g, g->params, g->host->params_memory); }

// what the GPU kernels cannot run in this configuration (a message ending in a HINT), or NULL
static const char* gpu_config_problem(const FoxConfig* cf) {
    int hd = cf->n_embd / cf->n_head;
    static char too_big[256];
    if (cf->n_embd % XPACK != 0 || cf->mlp_hidden % XPACK != 0) {
        snprintf(too_big, sizeof(too_big), "n_embd and mlp_hidden must be multiples of %d (the kernels' 16-byte "
                 "loads)\nHINT: round them to multiples of %d", XPACK, XPACK);
        return too_big;
    }
    if (hd > MAX_HD) {
        snprintf(too_big, sizeof(too_big), "head size (n_embd / n_head) exceeds the GPU kernels' limit of %d\n"
                 "HINT: use more heads (--n_head)", MAX_HD);
        return too_big;
    }
    if (cf->n_embd > RMS_BWD_MAX_C) {
        snprintf(too_big, sizeof(too_big), "n_embd exceeds the GPU kernels' limit of %d (the RMSNorm backward's column "
                 "sums in shared memory)\nHINT: use an n_embd of at most %d on the GPU", RMS_BWD_MAX_C, RMS_BWD_MAX_C);
        return too_big;
    }
    if (hd % (2 * XPACK) != 0) {
        snprintf(too_big, sizeof(too_big), "head size (n_embd / n_head) must be a multiple of %d (the per-head "
                 "kernels' 16-byte loads of both halves)\nHINT: change --n_head", 2 * XPACK);
        return too_big;
    }
#ifndef ENABLE_FP32
    if ((cf->k_shift + cf->v_shift + (cf->gate == GATE_FULL)) * cf->n_head > HP_MAX_J) {
        snprintf(too_big, sizeof(too_big), "n_head times the per-head projections that are on (k shift, v shift, "
                 "forget gate) exceeds the GPU kernels' limit of %d\nHINT: use fewer heads", HP_MAX_J);
        return too_big;
    }
    if (!attention_fused(hd) && !TEST_HOOK(attention_any_head, 0)) {
        return "head size (n_embd / n_head) must be 64 or 128: the fused attention kernels of the bf16 build "
               "support only these\nHINT: set --n_head to n_embd / 64 or n_embd / 128, or build with "
               "PRECISION=FP32 (slow)";
    }
#endif
    return NULL;
}

// the RoPE table (len, hd/2, 2) of (cos, sin) on the device (`what`): the twin's angles, the same fp32 values,
// copied on `stream` before it returns
static float* rope_table_gpu(const FoxConfig* cf, int len, cudaStream_t stream, const char* what) {
    int hd = cf->n_embd / cf->n_head, half = hd / 2;
    size_t bytes = (size_t)len * half * 2 * sizeof(float);
    float* table = (float*)malloc_check(bytes, "RoPE table");
    for (int t = 0; t < len; t++) {
        for (int i = 0; i < half; i++) {
            float* cs = &table[((size_t)t * half + i) * 2];
            rope_angle(t, i, hd, cf->rope_theta, cs, cs + 1);
        }
    }
    float* dev = (float*)gpu_malloc(bytes, what);
    cudaCheck(cudaMemcpyAsync(dev, table, bytes, cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    free(table);
    return dev;
}

#ifndef ENABLE_FP32
static void gpu_fp8_build(GPUModel* g, int B, int T); // the FP8 section below
static void gpu_fp8_free(GPUModel* g);
#endif

// Builds the device side of `host` (whose weights are uploaded) for batches up to (B, T), as one rank of `dist`.
static void gpu_build_dist(GPUModel* g, FoxModel* host, int B, int T, const Dist* dist) {
    const FoxConfig* cf = &host->config;
    const char* problem = gpu_config_problem(cf);
    if (problem != NULL) { fail("n_embd %d, n_head %d: %s", cf->n_embd, cf->n_head, problem); }
    memset(g, 0, sizeof(*g));
    g->host = host;
    g->config = *cf;
    g->num_parameters = host->num_parameters;
    g->dist = dist;
    layout_params(&g->layout, cf, dist->world);
    range_list_build(&g->shard, &g->layout, dist, dist->world > 1);
    range_list_host(&g->opt, &g->layout, dist, dist->world > 1 && dist->zero_stage == 1);
    adamw_segments(g);
    g->max_B = B;
    g->max_T = T;
    g_memory_estimate = gpu_memory_needed(cf, B, T, dist, host->fp8.mode);
    size_t np = g->layout.size, no = g->opt.total;
    g->params = (float*)gpu_malloc(np * sizeof(float), "master weights");
    g->params_x = (floatX*)gpu_malloc(np * sizeof(floatX), "matmul weights");
    g->grads = (float*)gpu_malloc(np * sizeof(float), "gradients");
    g->adam_m = (float*)gpu_malloc(no * sizeof(float), "AdamW m");
    g->adam_v = (float*)gpu_malloc(no * sizeof(float), "AdamW v");
    cudaCheck(cudaMemset(g->params, 0, np * sizeof(float))); // the padding stays zero
    cudaCheck(cudaMemset(g->params_x, 0, np * sizeof(floatX)));
    cudaCheck(cudaMemset(g->grads, 0, np * sizeof(float)));
    cudaCheck(cudaMemset(g->adam_m, 0, no * sizeof(float)));
    cudaCheck(cudaMemset(g->adam_v, 0, no * sizeof(float)));
    g->acts_bytes = layout_activations(&g->acts, cf, B, T, g_recompute, NULL);
    g->acts_memory = (char*)gpu_malloc(g->acts_bytes, "activations");
    layout_activations(&g->acts, cf, B, T, g_recompute, g->acts_memory);
    g->grad_bytes = layout_grad_buffers(&g->gb, cf, B, T, NULL);
    g->grad_memory = (char*)gpu_malloc(g->grad_bytes, "activation gradients");
    layout_grad_buffers(&g->gb, cf, B, T, g->grad_memory);
    size_t N = (size_t)B * T;
    g->inputs = (int*)gpu_malloc(N * sizeof(int), "inputs");
    g->targets = (int*)gpu_malloc(N * sizeof(int), "targets");
    g->docs_dev = (int*)gpu_malloc(2 * N * sizeof(int), "document starts");
    g->docs_host = (int*)malloc_check(2 * N * sizeof(int), "document starts");
    g->norm_partial = (double*)gpu_malloc(NORM_BLOCKS * sizeof(double), "norm partials");
    if (cf->rope) { g->rope = rope_table_gpu(cf, T, 0, "RoPE table"); }
    g->losses_host = (float*)malloc_check(N * sizeof(float), "losses");
    g->enc_host = (int*)malloc_check((3 * N + 1 + (size_t)cf->vocab_size) * sizeof(int), "encoder lists");
    g->mean_loss = -1.0f;
    gpu_params_from_host(g);
#ifndef ENABLE_FP32
    gpu_fp8_build(g, B, T);
#endif
}

static void gpu_build(GPUModel* g, FoxModel* host, int B, int T) { gpu_build_dist(g, host, B, T, &g_single_process); }

static void gpu_free(GPUModel* g) {
    cudaCheck(cudaFree(g->params)); cudaCheck(cudaFree(g->params_x)); cudaCheck(cudaFree(g->grads));
    cudaCheck(cudaFree(g->adamw_segs));
    range_list_free(&g->shard); range_list_free(&g->opt); layout_free(&g->layout);
    cudaCheck(cudaFree(g->adam_m)); cudaCheck(cudaFree(g->adam_v)); cudaCheck(cudaFree(g->acts_memory));
    cudaCheck(cudaFree(g->grad_memory)); cudaCheck(cudaFree(g->inputs)); cudaCheck(cudaFree(g->targets));
    cudaCheck(cudaFree(g->norm_partial)); cudaCheck(cudaFree(g->rope)); cudaCheck(cudaFree(g->docs_dev));
    free(g->losses_host); free(g->enc_host); free(g->docs_host);
    step_graph_drop(&g->step_graph);
#ifndef ENABLE_FP32
    gpu_fp8_free(g);
#endif
    memset(g, 0, sizeof(*g));
}

// ----------------------------------------------------------------------------
// FP8 matmuls of a training step (-q, bf16 build; the twin's "FP8 numerics" is the specification). Per step, before
// its first micro-step (gpu_fp8_step_begin): the host's delayed scales uploaded, the norms' and weights' scales from
// their amaxes, the weights cast once (row-major for the forward, transposed for the input gradients). Per matmul
// (matmul_forward_q, matmul_backward_q): the input or output gradient cast by the kernel after its producer, its
// amax taken in the same pass. The weight gradients take the rounded values of both operands (the twin's product of
// the rounded operands up to the order of the sums), as FP8 matmuls on token-major codes where B T allows
// (fp8_wgrad8): the producers write them beside the row-major ones for xm, act, y, xa, xf, dgu and the residual
// gradients (Fp8Out.codes_t), and a transpose of the codes gives dqkvg's and dlogits' (fp8_transpose_codes_gpu: their
// producers' head or vocabulary rows have no 32-token tiles); the operands that feed only matmuls then drop their
// floatX copies (Fp8Out.drop). The blocks of q, k, v not in dqkvg and W_o without an output norm or gate stay bf16.
#ifndef ENABLE_FP32
// k and inv from the amaxes: the RMSNorm outputs' bounded scales (the twin's fp8_norm_exp: margin c, 4^c >= D, with
// D = hd for y and C otherwise) and the weight groups' current scales (margin 0), E4M3 (largest exponent 8); then
// every slot's 2^-k (the host set the k of the delayed and dlogits slots)
__global__ void fp8_scales_kernel(int* k, float* inv, const unsigned* amax, int L, int C, int hd) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, norms = fp8_norm_at(L, 0, 0), weights = fp8_weight_at(L, 0, 0);
    if (i >= fp8_index_count(L)) { return; }
    if (i >= norms && i < weights) {
        int D = (i - norms) % FP8_NORMS == FP8_N_Y && i != fp8_norm_at(L, L, 0) ? hd : C, c = 0;
        while ((1 << (2 * c)) < D) { c++; }
        k[i] = fp8_scale_exp_gpu(amax[i], 8, c);
    } else if (i >= weights && i < fp8_dlogits_at(L)) {
        k[i] = fp8_scale_exp_gpu(amax[i], 8, 0);
    }
    inv[FP8_INV_STRIDE * i] = fp8_pow2_gpu(-k[i]);
}

// the FP8 matmuls' weight blocks (at most FP8_WEIGHTS + 3 per layer, and the lm head): q, k, v, g as one block where
// the layout groups them (qkvg_slots), alone otherwise, sharing the group's scale either way
static int fp8_weight_blocks(const GPUModel* g, Fp8Block* b) {
    const FoxConfig* cf = &g->config;
    int L = cf->n_layer, C = cf->n_embd, I = cf->mlp_hidden, n = 0;
    for (int l = 0; l < L; l++) {
        int slot[4], F = qkvg_slots(cf, slot), first = -1;
        for (int j = 0; j < 4; j++) { first = slot[j] == 0 ? QKVG_TENSORS[j] : first; }
        int group = fp8_weight_at(L, l, FP8_W_QKVG);
        if (F > 0) { b[n++] = (Fp8Block){slice_offset(g, first, l), F * C, C, group, 0}; }
        for (int j = 0; j < 4; j++) {
            if (slot[j] < 0 && (j < 3 || cf->output_gate)) {
                b[n++] = (Fp8Block){slice_offset(g, QKVG_TENSORS[j], l), C, C, group, 0};
            }
        }
        b[n++] = (Fp8Block){slice_offset(g, P_WO, l), C, C, fp8_weight_at(L, l, FP8_W_O), 0};
        b[n++] = (Fp8Block){slice_offset(g, P_WGU, l), 2 * I, C, fp8_weight_at(L, l, FP8_W_GU), 0};
        b[n++] = (Fp8Block){slice_offset(g, P_WDOWN, l), C, I, fp8_weight_at(L, l, FP8_W_DOWN), 0};
    }
    if (g->host->fp8.mode != FP8_MODE_BODY) {
        b[n++] = (Fp8Block){slice_offset(g, P_LM_HEAD, 0), cf->padded_vocab_size, C, fp8_weight_at(L, L, 0),
                             0};
    }
    return n;
}

// the block that holds tile t of the grid over blocks (nb >= 1, in tile order): the last with tile0 <= t
__device__ static inline Fp8Block fp8_block_of(const Fp8Block* blocks, int nb, unsigned t) {
    int lo = 0, hi = nb - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (blocks[mid].tile0 <= t) { lo = mid; } else { hi = mid - 1; }
    }
    return blocks[lo];
}

// the amax of every weight block's floatX copy into its group's slot, one launch: a CTA a tile (fp8_block_of), its
// max by fp8_block_amax (atomicMax of magnitude bits: the same in any order)
__global__ void fp8_weights_amax_kernel(unsigned* amax, const floatX* w, const Fp8Block* blocks, int nb) {
    Fp8Block b = fp8_block_of(blocks, nb, blockIdx.x);
    int tc = ceil_div(b.cols, FP8_TILE), t = (int)(blockIdx.x - b.tile0);
    int r0 = (t / tc) * FP8_TILE, c0 = (t % tc) * FP8_TILE;
    unsigned mx = 0;
    for (int i = threadIdx.x; i < FP8_TILE * FP8_TILE; i += blockDim.x) {
        int r = r0 + i / FP8_TILE, c = c0 + i % FP8_TILE;
        if (r < b.rows && c < b.cols) {
            unsigned a = __float_as_uint(to_float(w[b.off + (size_t)r * b.cols + c])) & 0x7FFFFFFFu;
            mx = a > mx ? a : mx;
        }
    }
    fp8_block_amax(mx, amax + b.slot);
}

// every weight block's E4M3 codes at its group's scale 2^k[slot], row-major into w8 and transposed ((cols, rows))
// into w8t at the block's offset, one launch and one read of the weights: a CTA a tile through shared memory. The
// codes of fp8_cast_kernel, bit for bit (the same fp8_code of the same product).
__global__ void fp8_weights_cast_kernel(uint8_t* w8, uint8_t* w8t, const floatX* w, const Fp8Block* blocks, int nb,
                                        const int* k) {
    __shared__ uint8_t tile[FP8_TILE][FP8_TILE + 4];
    Fp8Block b = fp8_block_of(blocks, nb, blockIdx.x);
    int tc = ceil_div(b.cols, FP8_TILE), t = (int)(blockIdx.x - b.tile0);
    int r0 = (t / tc) * FP8_TILE, c0 = (t % tc) * FP8_TILE;
    float up = fp8_pow2_gpu(k[b.slot]);
    for (int i = threadIdx.x; i < FP8_TILE * FP8_TILE; i += blockDim.x) {
        int r = i / FP8_TILE, c = i % FP8_TILE;
        if (r0 + r < b.rows && c0 + c < b.cols) {
            size_t at = b.off + (size_t)(r0 + r) * b.cols + c0 + c;
            uint8_t code = fp8_code(to_float(w[at]) * up, 0);
            w8[at] = code;
            tile[c][r] = code;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < FP8_TILE * FP8_TILE; i += blockDim.x) {
        int c = i / FP8_TILE, r = i % FP8_TILE;
        if (r0 + r < b.rows && c0 + c < b.cols) { w8t[b.off + (size_t)(c0 + c) * b.rows + r0 + r] = tile[c][r]; }
    }
}

// the weight blocks' tiles: each block's tile0 set in order; returns the total
static unsigned fp8_block_tiles(Fp8Block* b, int nb) {
    unsigned tiles = 0;
    for (int i = 0; i < nb; i++) {
        b[i].tile0 = tiles;
        size_t across = ceil_div((size_t)b[i].cols, (size_t)FP8_TILE);
        tiles += (unsigned)(ceil_div((size_t)b[i].rows, (size_t)FP8_TILE) * across);
    }
    return tiles;
}

// blocks: a device copy of nb blocks whose tile0 fp8_block_tiles set (tiles in all)
static void fp8_weights_amax_gpu(unsigned* amax, const floatX* w, const Fp8Block* blocks, int nb, unsigned tiles) {
    fp8_weights_amax_kernel<<<tiles, 256>>>(amax, w, blocks, nb);
    launchCheck();
}

static void fp8_weights_cast_gpu(uint8_t* w8, uint8_t* w8t, const floatX* w, const Fp8Block* blocks, int nb,
                                 unsigned tiles, const int* k) {
    fp8_weights_cast_kernel<<<tiles, 256>>>(w8, w8t, w, blocks, nb, k);
    launchCheck();
}

// Allocates the FP8 buffers when the host model has a mode (-q); every FP8 matmul's K must be a multiple of 16.
static void gpu_fp8_build(GPUModel* g, int B, int T) {
    const FoxConfig* cf = &g->config;
    if (g->host->fp8.mode == FP8_MODE_OFF) { return; }
    if (cf->n_embd % 16 != 0 || cf->mlp_hidden % 16 != 0) {
        fail("-q %s: n_embd %d and mlp_hidden %d must be multiples of 16 (Hopper's FP8 matmuls)\nHINT: round them "
             "to multiples of 16, or drop -q", FP8_MODE_NAMES[g->host->fp8.mode], cf->n_embd, cf->mlp_hidden);
    }
    if (g->dist->world > 1) {
        fail("-q %s is not yet on more than one GPU (the amaxes are not yet reduced across processes)\nHINT: train "
             "with -q on one GPU, or drop -q", FP8_MODE_NAMES[g->host->fp8.mode]);
    }
    Fp8Gpu* q = &g->fp8;
    size_t N = (size_t)B * T, C = (size_t)cf->n_embd, I = (size_t)cf->mlp_hidden, Vp = (size_t)cf->padded_vocab_size;
    size_t wide = C > I ? C : I, grad = Vp > 4 * C ? Vp : 4 * C, n = (size_t)fp8_index_count(cf->n_layer);
    grad = grad > 2 * I ? grad : 2 * I;
    q->on = 1;
    q->w8 = (uint8_t*)gpu_malloc(g->layout.size, "FP8 weights");
    q->w8t = (uint8_t*)gpu_malloc(g->layout.size, "FP8 weights, transposed");
    q->x8 = (uint8_t*)gpu_malloc(N * wide, "FP8 matmul inputs");
    q->d8 = (uint8_t*)gpu_malloc(N * grad, "FP8 output gradients");
    q->xr = (floatX*)gpu_malloc(N * wide * sizeof(floatX), "FP8 rounded inputs");
    q->wgrad8 = fp8_wgrad8_on(cf, N);
    if (q->wgrad8) {
        size_t layers = g->acts.recompute ? 1 : (size_t)cf->n_layer;
        q->x8t = (uint8_t*)gpu_malloc(layers * N * (3 * C + I), "FP8 token-major inputs");
        q->xf8t = (uint8_t*)gpu_malloc(N * C, "FP8 token-major inputs");
        q->d8t = (uint8_t*)gpu_malloc(N * grad, "FP8 token-major gradients");
    }
    q->k = (int*)gpu_malloc(n * sizeof(int), "FP8 scales");
    q->inv = (float*)gpu_malloc(n * FP8_INV_STRIDE * sizeof(float), "FP8 scales");
    q->amax = (unsigned*)gpu_malloc(n * sizeof(unsigned), "FP8 amaxes");
    cudaCheck(cudaMemset(q->k, 0, n * sizeof(int)));
    q->k_host = (int*)calloc_check(n, sizeof(int), "FP8 scales");
    q->amax_host = (unsigned*)calloc_check(n, sizeof(unsigned), "FP8 amaxes");
    size_t most = (size_t)cf->n_layer * (FP8_WEIGHTS + 3) + 1; // fp8_weight_blocks' bound
    Fp8Block* b = (Fp8Block*)malloc_check(most * sizeof(Fp8Block), "FP8 blocks");
    q->nblocks = fp8_weight_blocks(g, b);
    q->tiles = fp8_block_tiles(b, q->nblocks);
    q->blocks = (Fp8Block*)gpu_malloc((size_t)q->nblocks * sizeof(Fp8Block), "FP8 weight blocks");
    cudaCheck(cudaMemcpy(q->blocks, b, (size_t)q->nblocks * sizeof(Fp8Block), cudaMemcpyHostToDevice));
    free(b);
}

static void gpu_fp8_free(GPUModel* g) {
    Fp8Gpu* q = &g->fp8;
    if (!q->on) { return; }
    cudaCheck(cudaFree(q->w8)); cudaCheck(cudaFree(q->w8t)); cudaCheck(cudaFree(q->x8)); cudaCheck(cudaFree(q->d8));
    cudaCheck(cudaFree(q->xr)); cudaCheck(cudaFree(q->k)); cudaCheck(cudaFree(q->inv)); cudaCheck(cudaFree(q->amax));
    cudaCheck(cudaFree(q->x8t)); cudaCheck(cudaFree(q->xf8t)); cudaCheck(cudaFree(q->d8t));
    cudaCheck(cudaFree(q->blocks));
    free(q->k_host); free(q->amax_host);
    memset(q, 0, sizeof(*q));
}

// The start of an FP8 step's micro-steps on the GPU, after the host's fp8_step_begin (and calibration): the delayed
// scales (the host's, from the histories) and dlogits' (|dlogits| <= loss_scale / N, E5M2) uploaded; the amaxes
// cleared; the RMSNorm weights' and matmul weights' amaxes, then every scale; the weights' codes, both layouts.
static void gpu_fp8_step_begin(GPUModel* g, float loss_scale, size_t N) {
    Fp8Gpu* q = &g->fp8;
    if (!q->on) { return; }
    const FoxConfig* cf = &g->config;
    int L = cf->n_layer, C = cf->n_embd, n = fp8_index_count(L);
    memcpy(q->k_host, g->host->fp8.k, (size_t)L * FP8_SLOTS * sizeof(int));
    q->k_host[fp8_dlogits_at(L)] = fp8_scale_exp(loss_scale / (float)N, &FP8_E5M2, 0);
    cudaCheck(cudaMemcpy(q->k, q->k_host, (size_t)n * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(q->amax, 0, (size_t)n * sizeof(unsigned)));
    for (int l = 0; l < L; l++) {
        fp8_amax_gpu(q->amax + fp8_norm_at(L, l, FP8_N_XA), pm(g, P_ATTN_NORM, l), (size_t)C);
        if (cf->output_norm) { fp8_amax_gpu(q->amax + fp8_norm_at(L, l, FP8_N_Y), pm(g, P_O_NORM, l), (size_t)C); }
        fp8_amax_gpu(q->amax + fp8_norm_at(L, l, FP8_N_XM), pm(g, P_MLP_NORM, l), (size_t)C);
    }
    fp8_amax_gpu(q->amax + fp8_norm_at(L, L, 0), pm(g, P_NORM_F, 0), (size_t)C);
    fp8_weights_amax_gpu(q->amax, g->params_x, q->blocks, q->nblocks, q->tiles);
    fp8_scales_kernel<<<ceil_div(n, 256), 256>>>(q->k, q->inv, q->amax, L, C, C / cf->n_head);
    launchCheck();
    fp8_weights_cast_gpu(q->w8, q->w8t, g->params_x, q->blocks, q->nblocks, q->tiles, q->k);
    cudaCheck(cudaMemset(q->amax, 0, (size_t)L * FP8_SLOTS * sizeof(unsigned))); // the delayed ones, for the step
}

// the step's delayed amaxes (the max over its micro-steps) into the host's Fp8State (maxed into it), for fp8_step_end
static void gpu_fp8_amax_to_host(GPUModel* g) {
    Fp8Gpu* q = &g->fp8;
    if (!q->on) { return; }
    size_t n = (size_t)g->config.n_layer * FP8_SLOTS;
    cudaCheck(cudaMemcpy(q->amax_host, q->amax, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) { // a max: a calibration's non-finite amax stays (the twin's fp8_delayed)
        g->host->fp8.amax[i] = fp8_max(g->host->fp8.amax[i], f32_from_bits(q->amax_host[i]));
    }
}

// slot i's dequantisation scale 2^-k, for a matmul
static const float* fp8_inv(const Fp8Gpu* q, int i) { return q->inv + FP8_INV_STRIDE * i; }
#endif

// whether this pass's FP8 matmuls round (a training micro-step with -q), or only take the delayed operands' amaxes
// (the calibration's pass); neither outside a training step (validation, evaluation, tests' plain passes)
static int fp8_rounds(const GPUModel* g) { return g->fp8.on && g->host->fp8.on && !g->host->fp8.calibrating; }
static int fp8_calibrating(const GPUModel* g) { return g->fp8.on && g->host->fp8.on && g->host->fp8.calibrating; }

// a delayed slot's amax while the pass rounds or calibrates, else NULL
static unsigned* fp8_amax_slot(GPUModel* g, int l, int slot) {
    return fp8_rounds(g) || fp8_calibrating(g) ? g->fp8.amax + fp8_delayed_at(l, slot) : NULL;
}

// whether a delayed slot's values are E5M2
static int fp8_slot_e5m2(const GPUModel* g, int slot) { return fp8_slot_format(g->host->fp8.mode, slot) == &FP8_E5M2; }

// A producer's FP8 epilogue (Fp8Out) for an operand at scale slot i: its codes into `codes` (x8 or d8), rounded in
// place with `round`, the amax into a delayed slot's (amax, else NULL) while the pass rounds; the amax alone while it
// calibrates; nothing otherwise (use8 0: this matmul stays bf16)
static Fp8Out fp8_out(GPUModel* g, int use8, uint8_t* codes, int i, int e5m2, int round, unsigned* amax) {
    Fp8Out q = {};
    if (use8) { q.codes = codes; q.k = g->fp8.k + i; q.e5m2 = e5m2; q.round = round; }
    if (use8 || fp8_calibrating(g)) { q.amax = amax; }
    return q;
}

// A forward matmul out (N, OC) = x (N, IC) @ W^T (+ add) of layer l's weight block `tensor`, its weights' scale slot
// wi: with use8 in FP8, x cast into x8 at scale slot xi first with cast (else x8 holds its codes: its producer's
// epilogue, fp8_out), else bf16. With cast, a delayed x's amax (amax, else NULL) is taken either way.
static void matmul_forward_q(GPUModel* g, int use8, int cast, void* out, cudaDataType_t out_type, const void* add,
                             const floatX* x, int xi, unsigned* amax, int tensor, int l, int wi, size_t N, int IC,
                             int OC) {
#ifndef ENABLE_FP32
    Fp8Gpu* q = &g->fp8;
    if (use8) {
        if (cast) { fp8_cast_gpu(q->x8, (floatX*)NULL, x, N * IC, q->k + xi, 0, amax); }
        matmul_fp8_gpu(out, out_type, add, q->x8, CUDA_R_8F_E4M3, fp8_inv(q, xi), q->w8 + slice_offset(g, tensor, l),
                       fp8_inv(q, wi), N, OC, IC, 0.0f);
        return;
    }
    if (cast && amax != NULL) { fp8_amax_gpu(amax, x, N * IC); }
#endif
    matmul_forward_gpu(out, out_type, add, x, px(g, tensor, l), N, IC, OC);
}

// whether this pass's weight gradients are FP8 matmuls (its batch's N a multiple too: fp8_wgrad8_on)
static int fp8_wgrad8(const GPUModel* g) {
    return g->fp8.wgrad8 && fp8_rounds(g) && (size_t)g->B * g->T % FP8_TM_ROWS == 0;
}

// whether W_o's weight gradient is FP8 too: y from the output norm or gate, which can write its token-major codes
static int fp8_wgrad8_o(const GPUModel* g) {
    const FoxConfig* cf = &g->config;
    return fp8_wgrad8(g) && (cf->output_norm || cf->output_gate) && fp8_ong_tm_ok(cf->n_head, cf->n_embd / cf->n_head);
}

// whether the grouped weights' (dqkvg's) weight gradient is FP8: dqkvg's codes transposed after its producers
// (fp8_transpose_codes_gpu), xa's token-major codes from the RMSNorm forward
static int fp8_wgrad8_qkvg(const GPUModel* g) {
    int slot[4];
    return fp8_wgrad8(g) && qkvg_slots(&g->config, slot) > 0;
}

// whether the lm head's weight gradient is FP8: dlogits' codes transposed after the cross-entropy
static int fp8_wgrad8_head(const GPUModel* g) { return fp8_wgrad8(g) && g->host->fp8.mode != FP8_MODE_BODY; }

// the forward inputs whose token-major codes x8t holds, in its order: xm (C, N), act (I, N), y (C, N), xa (C, N)
enum { FP8_T_XM, FP8_T_ACT, FP8_T_Y, FP8_T_XA };

// layer l's token-major codes of forward input `which` (FP8_T_*), for the FP8 weight gradient of W_gu, W_down, W_o or
// W_qkvg; NULL where that weight gradient is not FP8 (the producer then writes none)
static uint8_t* fp8_x8t(const GPUModel* g, int l, int which) {
    if (!fp8_wgrad8(g) || (which == FP8_T_Y && !fp8_wgrad8_o(g)) || (which == FP8_T_XA && !fp8_wgrad8_qkvg(g))) {
        return NULL;
    }
    size_t N = (size_t)g->B * g->T, C = (size_t)g->config.n_embd, I = (size_t)g->config.mlp_hidden;
    size_t at[4] = {0, C, C + I, 2 * C + I}; // FP8_T_* within a layer's (3C + I, N)
    return g->fp8.x8t + ((g->acts.recompute ? 0 : (size_t)l) * (3 * C + I) + at[which]) * N;
}

// an output gradient's epilogue (-q) with its token-major codes too (d8t) where the weight gradient is FP8 (and then
// its floatX values dropped: the gradient feeds only FP8 matmuls)
static Fp8Out fp8_out_t(GPUModel* g, uint8_t* codes, int i, int e5m2, unsigned* amax) {
    Fp8Out q = fp8_out(g, fp8_rounds(g), codes, i, e5m2, 1, amax);
    if (q.codes != NULL && fp8_wgrad8(g)) { q.codes_t = g->fp8.d8t; q.drop = 1; }
    return q;
}

// the epilogue (-q) of dresid_x where it is layer l's output gradient, into W_down (none for l < 0: the embedding's)
static Fp8Out fp8_dres_down(GPUModel* g, int l) {
    if (l < 0) { return Fp8Out{}; }
    return fp8_out_t(g, g->fp8.d8, fp8_delayed_at(l, FP8_DRES_DOWN), fp8_slot_e5m2(g, FP8_DRES_DOWN),
                     fp8_amax_slot(g, l, FP8_DRES_DOWN));
}

// a forward input x (n values) that its producer did not round in place (xa, which the head projections read too; y
// when it is the attention output itself), rounded again at its scale slot xi for a weight gradient (into xr); else x
static const floatX* fp8_rounded_input(GPUModel* g, int use8, const floatX* x, size_t n, int xi) {
    if (!use8) { return x; }
#ifndef ENABLE_FP32
    fp8_cast_gpu((uint8_t*)NULL, g->fp8.xr, x, n, g->fp8.k + xi, 0, NULL);
#endif
    return g->fp8.xr;
}

// The backward of out = x @ W^T (layer l's weight block `tensor`, scale slot wi) from dout (N, OC): dinp (N, IC) (+)=
// dout @ W, dW += dout^T @ x_w, x_w the forward input's rounded values. With use8 the input gradient is an FP8 matmul
// on dout's codes (d8) and the weights' transposed codes; dout cast at its slot di (E5M2 or E4M3) first and rounded in
// place (it feeds only these two matmuls) with cast, else its producer's epilogue did that (fp8_out). With cast, a
// delayed dout's amax (amax, else NULL) is taken either way. With use8 and xt8 (x's token-major codes, scale slot xi)
// the weight gradient is an FP8 matmul too, on dout's token-major codes (d8t: from its producer, fp8_out_t, or for
// dqkvg and dlogits fp8_transpose_codes_gpu).
static void matmul_backward_q(GPUModel* g, int use8, int cast, void* dinp, cudaDataType_t dinp_type, float beta,
                              floatX* dout, int di, int e5m2, unsigned* amax, const floatX* x_w, const uint8_t* xt8,
                              int xi, int tensor, int l, int wi, size_t N, int IC, int OC) {
#ifndef ENABLE_FP32
    Fp8Gpu* q = &g->fp8;
    if (use8) {
        cudaDataType_t d_type = e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
        if (cast) { fp8_cast_gpu(q->d8, dout, dout, N * OC, q->k + di, e5m2, amax); }
        matmul_fp8_gpu(dinp, dinp_type, NULL, q->d8, d_type, fp8_inv(q, di), q->w8t + slice_offset(g, tensor, l),
                       fp8_inv(q, wi), N, IC, OC, beta);
        if (xt8 != NULL) { // dW (OC, IC) += dout^T (OC, N) x (N, IC): both token-major, K = N
            matmul_fp8_gpu(pg(g, tensor, l), CUDA_R_32F, NULL, q->d8t, d_type, fp8_inv(q, di), xt8, fp8_inv(q, xi),
                           (size_t)OC, IC, (int)N, 1.0f);
        } else {
            matmul_backward_weight_gpu(pg(g, tensor, l), dout, x_w, N, IC, OC);
        }
        return;
    }
    if (cast && amax != NULL) { fp8_amax_gpu(amax, dout, N * OC); }
#endif
    matmul_backward_input_gpu(dinp, dinp_type, dout, px(g, tensor, l), N, IC, OC, beta);
    matmul_backward_weight_gpu(pg(g, tensor, l), dout, x_w, N, IC, OC);
}

// ----------------------------------------------------------------------------
// forward and backward of the whole model

// Layer l's activations (of the current batch's N rows). A tensor with its own buffer lives in layer l's slice, or in
// the one shared slot when recompute holds it for one layer only (R); a stage that is off aliases its input, wherever
// that lives. Absent tensors are NULL.
typedef struct {
    float *resid, *resid_mid, *resid_next;                       // (N, C) fp32
    float *rstd_a, *rstd_m;                                      // (N)
    float *k_alpha, *v_alpha, *rstd_q, *rstd_k, *gate_logit, *c, *lse, *rstd_o; // (N, H)
    floatX *xa, *q_raw, *k_raw, *v_raw, *k_shifted, *v, *q, *k;  // (N, C)
    floatX *o, *o_normed, *og_logit, *y, *xm;                    // (N, C)
    floatX *gu, *act;                                            // (N, 2I), (N, I)
} LayerActs;

static float* slice_f(float* base, int l, size_t per) { return base != NULL ? LAYER(base, l, per) : NULL; }
static floatX* slice_x(floatX* base, int l, size_t per) { return base != NULL ? LAYER(base, l, per) : NULL; }

static LayerActs layer_acts(const GPUModel* g, int l) {
    const GPUActivations* a = &g->acts;
    size_t N = (size_t)g->B * g->T, C = (size_t)g->config.n_embd, H = (size_t)g->config.n_head;
    size_t I = (size_t)g->config.mlp_hidden, NC = N * C, NH = N * H;
    int r = a->recompute ? 0 : l; // the slot of an (R) tensor
    LayerActs p;
    p.resid = LAYER(a->resid, l, NC); p.resid_mid = LAYER(a->resid_mid, l, NC);
    p.resid_next = LAYER(a->resid, l + 1, NC);
    p.rstd_a = LAYER(a->rstd_a, l, N); p.rstd_m = LAYER(a->rstd_m, l, N);
    p.k_alpha = slice_f(a->k_alpha, l, NH); p.v_alpha = slice_f(a->v_alpha, l, NH);
    p.rstd_q = slice_f(a->rstd_q, l, NH); p.rstd_k = slice_f(a->rstd_k, l, NH);
    p.gate_logit = slice_f(a->gate_logit, l, NH); p.c = slice_f(a->c, l, NH);
    p.lse = LAYER(a->lse, l, NH); p.rstd_o = slice_f(a->rstd_o, l, NH);
    p.xa = LAYER(a->xa, r, NC);
    p.q_raw = LAYER(a->q_raw, l, NC); p.k_raw = LAYER(a->k_raw, l, NC); p.v_raw = LAYER(a->v_raw, l, NC);
    p.k_shifted = a->k_shifted != a->k_raw ? LAYER(a->k_shifted, r, NC) : p.k_raw;
    p.v = a->v != a->v_raw ? LAYER(a->v, r, NC) : p.v_raw;
    p.q = a->q != a->q_raw ? LAYER(a->q, r, NC) : p.q_raw;
    p.k = a->k != a->k_shifted ? LAYER(a->k, r, NC) : p.k_shifted;
    p.o = LAYER(a->o, l, NC);
    p.o_normed = slice_x(a->o_normed, r, NC);
    p.og_logit = slice_x(a->og_logit, l, NC);
    p.y = a->y != a->o ? LAYER(a->y, r, NC) : p.o;
    p.xm = LAYER(a->xm, r, NC);
    p.gu = LAYER(a->gu, l, N * 2 * I);
    p.act = LAYER(a->act, r, N * I);
    return p;
}

// layer l's head projections that are on (see HeadProj), in the order k shift, v shift, forget gate; with the forward's
// outputs and the backward's buffers
static HeadProj head_proj_layer(GPUModel* g, const LayerActs* p, int l) {
    const FoxConfig* cf = &g->config;
    HeadProj hp;
    memset(&hp, 0, sizeof(hp));
    int slot[HP_MAX];
    hp.count = head_proj_slots(cf, slot);
    float* out[HP_MAX] = {p->k_alpha, p->v_alpha, p->gate_logit};
    for (int i = 0; i < HP_MAX; i++) {
        if (slot[i] < 0) { continue; }
        hp.w[slot[i]] = px(g, HP_TENSORS[i], l);
        hp.out[slot[i]] = out[i];
        if (slot[i] == 0) { hp.dw = pg(g, HP_TENSORS[i], l); }
    }
    hp.dout = g->gb.dhp;
    return hp;
}

// the batch's documents for the kernels (into *out), or NULL when they are not kept apart
static const FoxDocs* gpu_docs(const GPUModel* g, FoxDocs* out) {
    if (!g->docs_on) { return NULL; }
    out->start = g->docs_dev;
    out->end = g->docs_dev + (size_t)g->B * g->T;
    return out;
}

// layer l's k and v through the shifts that are on
static void kv_shift_forward_layer(GPUModel* g, const LayerActs* p, int B, int T) {
    const FoxConfig* cf = &g->config;
    int H = cf->n_head, hd = cf->n_embd / H, n = 0;
    KVShiftSet set[2];
    if (cf->k_shift) { set[n++] = (KVShiftSet){p->k_shifted, p->k_raw, p->k_alpha}; }
    if (cf->v_shift) { set[n++] = (KVShiftSet){p->v, p->v_raw, p->v_alpha}; }
    FoxDocs fd;
    kv_shift_forward_gpu(set, n, (size_t)B * T, T, H, hd, gpu_docs(g, &fd));
}

// q and k of layer l through QK-norm and RoPE (nothing when both are off)
static void qk_norm_rope_forward_layer(GPUModel* g, const LayerActs* p, int l, int B, int T) {
    const FoxConfig* cf = &g->config;
    if (!cf->qk_norm && !cf->rope) { return; }
    int H = cf->n_head, hd = cf->n_embd / H, groups_qk = cf->qk_norm_shared ? 1 : H;
    const float* wq_n = cf->qk_norm ? pm(g, P_Q_NORM, l) : NULL;
    const float* wk_n = cf->qk_norm ? pm(g, P_K_NORM, l) : NULL;
    QKNormSet q = {p->q, p->rstd_q, p->q_raw, wq_n}, k = {p->k, p->rstd_k, p->k_shifted, wk_n};
    qk_norm_rope_forward_gpu(q, k, groups_qk, cf->rope ? g->rope : NULL, (size_t)B * T, T, H, hd, 1e-5f);
}

// y of layer l from o through the output norm and gate (nothing when both are off)
static void output_norm_gate_forward_layer(GPUModel* g, const LayerActs* p, int l, size_t N, Fp8Out q) {
    const FoxConfig* cf = &g->config;
    if (!cf->output_norm && !cf->output_gate) { return; }
    output_norm_gate_forward_gpu(p->o_normed, p->y, p->rstd_o, p->o, cf->output_gate ? p->og_logit : NULL,
                                 cf->output_norm ? pm(g, P_O_NORM, l) : NULL, N, cf->n_head, cf->n_embd / cf->n_head,
                                 1e-6f, q);
}

// Layer l's FP8 epilogues (-q) of the forward's matmul inputs, their codes into x8: xa (not rounded: the head
// projections read it too), y (its scale bounded under the output norm, else delayed; rounded in place unless y is
// the attention output itself, which the attention's backward reads: then cast before its matmul), xm, act (rounded
// in place: they feed only their matmuls)
typedef struct { Fp8Out xa, y, xm, act; int y_i, y_cast; } LayerFp8;

static LayerFp8 layer_fp8(GPUModel* g, const LayerActs* p, int l) {
    const FoxConfig* cf = &g->config;
    int L = cf->n_layer, r8 = fp8_rounds(g);
    LayerFp8 f;
    f.y_i = cf->output_norm ? fp8_norm_at(L, l, FP8_N_Y) : fp8_delayed_at(l, FP8_Y);
    f.y_cast = p->y == p->o;
    f.xa = fp8_out(g, r8, g->fp8.x8, fp8_norm_at(L, l, FP8_N_XA), 0, 0, NULL);
    f.y = fp8_out(g, r8, g->fp8.x8, f.y_i, 0, 1, cf->output_norm ? NULL : fp8_amax_slot(g, l, FP8_Y));
    f.xm = fp8_out(g, r8, g->fp8.x8, fp8_norm_at(L, l, FP8_N_XM), 0, 1, NULL);
    f.act = fp8_out(g, r8, g->fp8.x8, fp8_delayed_at(l, FP8_ACT), 0, 1, fp8_amax_slot(g, l, FP8_ACT));
    // FP8 weight gradients: the token-major codes too, and the floatX values not stored where only FP8 matmuls read
    // them (xa stays: the head projections read it)
    f.xm.codes_t = fp8_x8t(g, l, FP8_T_XM); f.act.codes_t = fp8_x8t(g, l, FP8_T_ACT);
    f.y.codes_t = fp8_x8t(g, l, FP8_T_Y); f.xa.codes_t = fp8_x8t(g, l, FP8_T_XA);
    f.xm.drop = f.act.drop = f.xm.codes_t != NULL;
    f.y.drop = f.y.codes_t != NULL;
    return f;
}

// -r 1: layer l's (R) tensors again, by the forward's kernels on the inputs the forward kept (and rewriting the same
// rstd values): the same bits as in the forward, so the gradients do not change
static void gpu_recompute_layer(GPUModel* g, const LayerActs* p, int l) {
    const FoxConfig* cf = &g->config;
    int B = g->B, T = g->T, C = cf->n_embd;
    size_t N = (size_t)B * T;
    LayerFp8 f = layer_fp8(g, p, l); // with -q the same rounding in place (and codes, amaxes: the same values)
    rmsnorm_forward_gpu(p->xa, p->rstd_a, p->resid, pm(g, P_ATTN_NORM, l), N, C, f.xa);
    kv_shift_forward_layer(g, p, B, T);
    qk_norm_rope_forward_layer(g, p, l, B, T);
    output_norm_gate_forward_layer(g, p, l, N, f.y);
    rmsnorm_forward_gpu(p->xm, p->rstd_m, p->resid_mid, pm(g, P_MLP_NORM, l), N, C, f.xm);
    swiglu_forward_gpu(p->act, p->gu, N, cf->mlp_hidden, f.act);
}

// end (B, T) from doc (B, T) of document_starts: one past the last position of each token's document (the next
// document start after it, or T)
static void document_ends(int* end, const int* doc, int B, int T) {
    for (int b = 0; b < B; b++) {
        int e = T;
        for (int t = T - 1; t >= 0; t--) {
            end[(size_t)b * T + t] = e;
            if (t > 0 && doc[(size_t)b * T + t] == t) { e = t; }
        }
    }
}

// The forward in three parts (gpu_forward_pass runs them in turn): the batch checked and uploaded, the kernels, the
// mean loss read back. inputs, targets (B, T) on the host; targets may be NULL (no loss). Fills the logits and, with
// targets, the losses and mean_loss. With grad (targets needed) the logits are then turned in place into the
// gradient of loss_scale * mean_loss, the start of gpu_backward: gpu_forward_train.
static void gpu_forward_begin(GPUModel* g, const int* inputs, const int* targets, int B, int T, int grad) {
    size_t N = (size_t)B * T;
    if (T > g->max_T || N > (size_t)g->max_B * g->max_T) {
        fail("internal: batch %dx%d exceeds the allocated %dx%d" BUG_HINT, B, T, g->max_B, g->max_T);
    }
    check_tokens(inputs, N, g->config.vocab_size, "input");
    if (targets != NULL) { check_tokens(targets, N, g->config.vocab_size, "target"); }
    g->B = B; g->T = T; g->inputs_host = inputs;
    g->has_targets = targets != NULL; g->has_dlogits = grad && targets != NULL;
    cudaCheck(cudaMemcpy(g->inputs, inputs, N * sizeof(int), cudaMemcpyHostToDevice));
    if (targets != NULL) { cudaCheck(cudaMemcpy(g->targets, targets, N * sizeof(int), cudaMemcpyHostToDevice)); }
    int docs = g->host->doc_eot >= 0;
    if (docs != g->docs_on) { g->docs_on = docs; g_buffer_epoch++; } // a captured graph holds the other kernels
    if (docs) { // -f 1: the inputs' documents (the twin's document_starts, then their ends), uploaded with them
        document_starts(g->docs_host, inputs, B, T, g->host->doc_eot);
        document_ends(g->docs_host + N, g->docs_host, B, T);
        cudaCheck(cudaMemcpy(g->docs_dev, g->docs_host, 2 * N * sizeof(int), cudaMemcpyHostToDevice));
    }
}

// the forward's kernels on the uploaded batch (gpu_forward_begin), the embedding to the loss: no host work or
// synchronisation, so a CUDA graph can hold them (gpu_train_micro_step)
static void gpu_forward_kernels(GPUModel* g, float loss_scale) {
    const FoxConfig* cf = &g->config;
    int B = g->B, T = g->T;
    int L = cf->n_layer, C = cf->n_embd, H = cf->n_head, hd = C / H, I = cf->mlp_hidden;
    int V = cf->vocab_size, Vp = cf->padded_vocab_size;
    size_t N = (size_t)B * T, NC = N * C;
    GPUActivations a = g->acts;
    FoxDocs fd;
    const FoxDocs* docs = gpu_docs(g, &fd);
    int r8 = fp8_rounds(g), head8 = r8 && g->host->fp8.mode != FP8_MODE_BODY; // FP8 matmuls (-q): the body's, lm head
    encoder_forward_gpu(a.resid, g->inputs, pm(g, P_WTE, 0), N, C);
    for (int l = 0; l < L; l++) {
        LayerActs p = layer_acts(g, l);
        LayerFp8 f = layer_fp8(g, &p, l); // -q: the producers write the matmul inputs' codes (x8)
        int wqkvg = fp8_weight_at(L, l, FP8_W_QKVG), xa_i = fp8_norm_at(L, l, FP8_N_XA);
        // attention
        rmsnorm_forward_gpu(p.xa, p.rstd_a, p.resid, pm(g, P_ATTN_NORM, l), N, C, f.xa);
        matmul_forward_q(g, r8, 0, p.q_raw, CUDA_R_X, NULL, p.xa, xa_i, NULL, P_WQ, l, wqkvg, N, C, C);
        matmul_forward_q(g, r8, 0, p.k_raw, CUDA_R_X, NULL, p.xa, xa_i, NULL, P_WK, l, wqkvg, N, C, C);
        matmul_forward_q(g, r8, 0, p.v_raw, CUDA_R_X, NULL, p.xa, xa_i, NULL, P_WV, l, wqkvg, N, C, C);
        HeadProj hp = head_proj_layer(g, &p, l); // k/v shift and forget-gate logits
        head_proj_forward_gpu(&hp, p.xa, N, C, H);
        kv_shift_forward_layer(g, &p, B, T);
        qk_norm_rope_forward_layer(g, &p, l, B, T);
        if (cf->gate != GATE_NONE) {
            forget_gate_forward_gpu(p.c, p.gate_logit, pm(g, P_BF, l), cf->gate == GATE_FULL, B, T, H);
        }
        attention_forward_gpu(p.o, p.lse, p.q, p.k, p.v, cf->gate != GATE_NONE ? p.c : NULL, B, T, H, hd, cf->window,
                              docs);
        if (cf->output_gate) { // xa's codes are still in x8
            matmul_forward_q(g, r8, 0, p.og_logit, CUDA_R_X, NULL, p.xa, xa_i, NULL, P_WG, l, wqkvg, N, C, C);
        }
        output_norm_gate_forward_layer(g, &p, l, N, f.y);
        matmul_forward_q(g, r8, f.y_cast, p.resid_mid, CUDA_R_32F, p.resid, p.y, f.y_i, f.y.amax, P_WO, l,
                         fp8_weight_at(L, l, FP8_W_O), N, C, C); // resid + W_o y
        // MLP
        rmsnorm_forward_gpu(p.xm, p.rstd_m, p.resid_mid, pm(g, P_MLP_NORM, l), N, C, f.xm);
        matmul_forward_q(g, r8, 0, p.gu, CUDA_R_X, NULL, p.xm, fp8_norm_at(L, l, FP8_N_XM), NULL, P_WGU, l,
                         fp8_weight_at(L, l, FP8_W_GU), N, C, 2 * I);
        swiglu_forward_gpu(p.act, p.gu, N, I, f.act);
        matmul_forward_q(g, r8, 0, p.resid_next, CUDA_R_32F, p.resid_mid, p.act, fp8_delayed_at(l, FP8_ACT), NULL,
                         P_WDOWN, l, fp8_weight_at(L, l, FP8_W_DOWN), N, I, C);
    }
    int xf_i = fp8_norm_at(L, L, 0);
    Fp8Out xf8 = fp8_out(g, head8, g->fp8.x8, xf_i, 0, 1, NULL);
    if (fp8_wgrad8_head(g) && g->has_dlogits) { xf8.codes_t = g->fp8.xf8t; xf8.drop = 1; } // only matmuls read xf
    rmsnorm_forward_gpu(a.xf, a.rstd_f, LAYER(a.resid, L, NC), pm(g, P_NORM_F, 0), N, C, xf8);
    matmul_forward_q(g, head8, 0, a.logits, CUDA_R_X, NULL, a.xf, xf_i, NULL, P_LM_HEAD, 0, fp8_weight_at(L, L, 0), N,
                     C, Vp);
    if (g->has_targets) { // with the gradient, -q rounds it (its codes into d8; its scale bounded by dloss)
        Fp8Out dl8 = fp8_out(g, head8 && g->has_dlogits, g->fp8.d8, fp8_dlogits_at(L), 1, 1, NULL);
        dl8.drop = fp8_wgrad8_head(g) && g->has_dlogits; // the codes alone feed the lm head's matmuls
        crossentropy_gpu(a.losses, a.logits, g->targets, N, V, Vp, g->has_dlogits, loss_scale / (float)N, dl8);
    }
}

// mean_loss from the forward's losses (waits for the GPU), -1 without targets
static void gpu_forward_loss(GPUModel* g) {
    size_t N = (size_t)g->B * g->T;
    g->mean_loss = -1.0f;
    if (!g->has_targets) { return; }
    cudaCheck(cudaMemcpy(g->losses_host, g->acts.losses, N * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0.0;
    for (size_t n = 0; n < N; n++) { sum += g->losses_host[n]; }
    g->mean_loss = (float)(sum / (double)N);
}

static void gpu_forward_pass(GPUModel* g, const int* inputs, const int* targets, int B, int T, int grad,
                             float loss_scale) {
    gpu_forward_begin(g, inputs, targets, B, T, grad);
    gpu_forward_kernels(g, loss_scale);
    gpu_forward_loss(g);
}

static void gpu_forward(GPUModel* g, const int* inputs, const int* targets, int B, int T) {
    gpu_forward_pass(g, inputs, targets, B, T, 0, 0.0f);
}

// the forward of a training micro-step: the logits end as the gradient of loss_scale * mean_loss
static void gpu_forward_train(GPUModel* g, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    if (targets == NULL) { fail("internal: a training forward needs targets" BUG_HINT); }
    gpu_forward_pass(g, inputs, targets, B, T, 1, loss_scale);
}

static void gpu_zero_grad(GPUModel* g) { cudaCheck(cudaMemset(g->grads, 0, g->layout.size * sizeof(float))); }

// the encoder backward's lists: distinct tokens, and for each its positions in increasing order (a counting sort on the
// host, uploaded)
static int encoder_lists(GPUModel* g, size_t N) {
    int V = g->config.vocab_size;
    int* tokens = g->enc_host;           // (N)
    int* offsets = tokens + N;           // (N + 1)
    int* positions = offsets + N + 1;    // (N)
    int* count = positions + N;          // (V)
    memset(count, 0, (size_t)V * sizeof(int));
    for (size_t n = 0; n < N; n++) { count[g->inputs_host[n]]++; }
    int u = 0, start = 0;
    for (int v = 0; v < V; v++) { // count[v] becomes the start of token v's positions
        int n_v = count[v];
        if (n_v > 0) { tokens[u] = v; offsets[u] = start; u++; }
        count[v] = start;
        start += n_v;
    }
    offsets[u] = start;
    for (size_t n = 0; n < N; n++) { positions[count[g->inputs_host[n]]++] = (int)n; }
    cudaCheck(cudaMemcpy(g->gb.enc_tokens, tokens, (size_t)u * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(g->gb.enc_offsets, offsets, ((size_t)u + 1) * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(g->gb.enc_positions, positions, N * sizeof(int), cudaMemcpyHostToDevice));
    return u;
}

// Accumulates into the gradients the gradient of loss_scale * mean_loss of the last forward (gpu_forward_train's: its
// logits are that loss's gradient already): gpu_backward_kernels, every kernel down to layer 0 (no host work or
// synchronisation, so a CUDA graph can hold them), then gpu_encoder_backward, whose lists the host builds from the
// batch.
static void gpu_backward_kernels(GPUModel* g) {
    const FoxConfig* cf = &g->config;
    int B = g->B, T = g->T;
    int L = cf->n_layer, C = cf->n_embd, H = cf->n_head, hd = C / H, I = cf->mlp_hidden, Vp = cf->padded_vocab_size;
    size_t N = (size_t)B * T, NC = N * C, NH = N * H;
    int groups_qk = cf->qk_norm_shared ? 1 : H, fold_qk = cf->qk_norm_shared ? H : 1;
    GPUActivations a = g->acts;
    GPUGradBuffers d = g->gb;
    FoxDocs fd;
    const FoxDocs* docs = gpu_docs(g, &fd);
    // the gradient buffers of stages that are off alias the gradient of their output; those of W_q x, W_k x, W_v x,
    // W_g x that stage kernels write are blocks of dqkvg (rows W long)
    floatX* d_o = cf->output_norm || cf->output_gate ? d.d_o : d.dy;
    int slot[4], F = qkvg_slots(cf, slot), W = F * C, first = -1;
    for (int j = 0; j < 4; j++) { first = slot[j] == 0 ? QKVG_TENSORS[j] : first; } // the grouped weights' first
    floatX* own[4] = {d.dq, d.dk, d.dv, NULL}; // the attention's outputs, for blocks not in dqkvg
    floatX* draw[4]; // the gradients of W_q x, W_k x, W_v x, W_g x
    for (int j = 0; j < 4; j++) { draw[j] = slot[j] >= 0 ? d.dqkvg + (size_t)slot[j] * C : own[j]; }
    floatX* dk_shifted = !cf->qk_norm && !cf->rope ? d.dk : cf->k_shift ? d.dk_shifted : draw[1];
    int ld_dk_shifted = (cf->qk_norm || cf->rope) && !cf->k_shift ? W : C;
    // the gradients of the k-shift, v-shift and forget-gate logits: blocks of dhp (rows PH long)
    int hp_slot[HP_MAX], PH = head_proj_slots(cf, hp_slot) * H;
    floatX* dhp[HP_MAX];
    for (int i = 0; i < HP_MAX; i++) { dhp[i] = hp_slot[i] >= 0 ? d.dhp + (size_t)hp_slot[i] * H : NULL; }
    // FP8 (-q): each output gradient's codes (d8) written by its producer's epilogue (fp8_out: dlogits by the
    // cross-entropy, dresid_x by the RMSNorm backward, dgu by SwiGLU's, each block of dqkvg by the stage kernel that
    // writes it, into d8 as (N, W) too) or cast before its matmul (q, k, v straight from the attention, not in dqkvg);
    // the weight gradients FP8 on token-major codes (d8t, x8t, xf8t; fp8_wgrad8), or bf16 on the forward inputs'
    // values rounded in place, or again (xr: xa, y = o)
    int r8 = fp8_rounds(g), head8 = r8 && g->host->fp8.mode != FP8_MODE_BODY, lm8 = fp8_wgrad8_head(g);
    if (lm8) { fp8_transpose_codes_gpu(g->fp8.d8t, g->fp8.d8, N, Vp); } // dlogits' codes, token-major
    matmul_backward_q(g, head8, 0, d.dxn, CUDA_R_32F, 0.0f, a.logits, fp8_dlogits_at(L), 1, NULL, a.xf,
                      lm8 ? g->fp8.xf8t : NULL, fp8_norm_at(L, L, 0), P_LM_HEAD, 0, fp8_weight_at(L, L, 0), N, C, Vp);
    cudaCheck(cudaMemsetAsync(d.dresid, 0, NC * sizeof(float), cudaStreamPerThread));
    rmsnorm_backward_gpu(d.dresid, d.dresid_x, d.partial, pg(g, P_NORM_F, 0), d.dxn, LAYER(a.resid, L, NC),
                         pm(g, P_NORM_F, 0), a.rstd_f, N, C, fp8_dres_down(g, L - 1));
    for (int l = L - 1; l >= 0; l--) {
        LayerActs p = layer_acts(g, l);
        if (a.recompute) { gpu_recompute_layer(g, &p, l); }
        floatX* xa = p.xa;
        // MLP: dresid passes through the residual add unchanged
        matmul_backward_q(g, r8, 0, d.dact, CUDA_R_X, 0.0f, d.dresid_x, fp8_delayed_at(l, FP8_DRES_DOWN),
                          fp8_slot_e5m2(g, FP8_DRES_DOWN), NULL, p.act, fp8_x8t(g, l, FP8_T_ACT),
                          fp8_delayed_at(l, FP8_ACT), P_WDOWN, l, fp8_weight_at(L, l, FP8_W_DOWN), N, I, C);
        int dgu_i = fp8_delayed_at(l, FP8_DGU), dgu_e5m2 = fp8_slot_e5m2(g, FP8_DGU);
        swiglu_backward_gpu(d.dgu, d.dact, p.gu, N, I,
                            fp8_out_t(g, g->fp8.d8, dgu_i, dgu_e5m2, fp8_amax_slot(g, l, FP8_DGU)));
        matmul_backward_q(g, r8, 0, d.dxn, CUDA_R_32F, 0.0f, d.dgu, dgu_i, dgu_e5m2, NULL, p.xm,
                          fp8_x8t(g, l, FP8_T_XM), fp8_norm_at(L, l, FP8_N_XM), P_WGU, l, fp8_weight_at(L, l, FP8_W_GU),
                          N, C, 2 * I);
        int dres_o = fp8_delayed_at(l, FP8_DRES_O), dres_o_e5m2 = fp8_slot_e5m2(g, FP8_DRES_O);
        int o8t = fp8_wgrad8_o(g); // W_o's weight gradient FP8 too: dresid_x's token-major codes
        rmsnorm_backward_gpu(d.dresid, d.dresid_x, d.partial, pg(g, P_MLP_NORM, l), d.dxn, p.resid_mid,
                             pm(g, P_MLP_NORM, l), p.rstd_m, N, C,
                             o8t ? fp8_out_t(g, g->fp8.d8, dres_o, dres_o_e5m2, fp8_amax_slot(g, l, FP8_DRES_O))
                                 : fp8_out(g, r8, g->fp8.d8, dres_o, dres_o_e5m2, 1, fp8_amax_slot(g, l, FP8_DRES_O)));
        // attention
        LayerFp8 f = layer_fp8(g, &p, l);
        int dq_i = fp8_delayed_at(l, FP8_DQKVG), dq_e5m2 = fp8_slot_e5m2(g, FP8_DQKVG);
        unsigned* dq_amax = fp8_amax_slot(g, l, FP8_DQKVG);
        Fp8Out dq8[4]; // the epilogue of each block of dqkvg (its codes at the block's columns of d8)
        int qkvg8 = fp8_wgrad8_qkvg(g); // its weight gradient FP8: dqkvg's codes alone feed its matmuls
        for (int j = 0; j < 4; j++) {
            uint8_t* codes = g->fp8.d8 != NULL && slot[j] >= 0 ? g->fp8.d8 + (size_t)slot[j] * C : NULL;
            dq8[j] = slot[j] >= 0 ? fp8_out(g, r8, codes, dq_i, dq_e5m2, 1, dq_amax) : Fp8Out{};
            dq8[j].drop = qkvg8 && slot[j] >= 0;
        }
        const floatX* y_w = f.y_cast ? fp8_rounded_input(g, r8, p.y, NC, f.y_i) : p.y;
        matmul_backward_q(g, r8, 0, d.dy, CUDA_R_X, 0.0f, d.dresid_x, dres_o, dres_o_e5m2, NULL, y_w,
                          fp8_x8t(g, l, FP8_T_Y), f.y_i, P_WO, l,
                          fp8_weight_at(L, l, FP8_W_O), N, C, C);
        if (cf->output_norm || cf->output_gate) {
            output_norm_gate_backward_gpu(d.d_o, draw[3], W, d.don, d.attn_scratch + 2 * NH, d.dy, p.o, p.o_normed,
                                          cf->output_gate ? p.og_logit : NULL,
                                          cf->output_norm ? pm(g, P_O_NORM, l) : NULL, p.rstd_o, N, T, H, hd, dq8[3]);
        }
        if (cf->output_norm) {
            colsum_scale_gpu(pg(g, P_O_NORM, l), d.partial, d.don, p.o, p.rstd_o, N, C, hd, 1);
        }
        attention_backward_gpu(d.dq, d.dk, d.dv, d.dlogf, d.attn_scratch, d_o, p.q, p.k, p.v, p.o, p.lse,
                               cf->gate != GATE_NONE ? p.c : NULL, B, T, H, hd, cf->window,
                               cf->output_norm || cf->output_gate, docs);
        if (cf->gate != GATE_NONE) {
            forget_gate_backward_gpu(d.dgl, dhp[2], PH, d.dlogf, p.gate_logit, B, T, H);
            if (cf->gate != GATE_FIXED) { // the fixed gate's bias is frozen
                colsum_gpu(pg(g, P_BF, l), d.partial, d.dgl, N, H);
            }
        }
        if (cf->qk_norm || cf->rope) {
            const float* rope = cf->rope ? g->rope : NULL;
            QKNormGradSet q = {draw[0], d.dq_normed, W, d.dq, p.q_raw, cf->qk_norm ? pm(g, P_Q_NORM, l) : NULL,
                               p.rstd_q, dq8[0]};
            QKNormGradSet k = {dk_shifted, d.dk_normed, ld_dk_shifted, d.dk, p.k_shifted,
                               cf->qk_norm ? pm(g, P_K_NORM, l) : NULL, p.rstd_k, cf->k_shift ? Fp8Out{} : dq8[1]};
            qk_norm_rope_backward_gpu(q, k, groups_qk, rope, N, T, H, hd);
        }
        if (cf->qk_norm) {
            colsum_scale_gpu(pg(g, P_Q_NORM, l), d.partial, d.dq_normed, p.q_raw, p.rstd_q, N, C, hd, fold_qk);
            colsum_scale_gpu(pg(g, P_K_NORM, l), d.partial, d.dk_normed, p.k_shifted, p.rstd_k, N, C, hd, fold_qk);
        }
        if (cf->k_shift || cf->v_shift) { // k's after the QK-norm backward above (dk_shifted)
            KVShiftGradSet set[2];
            int n = 0;
            if (cf->k_shift) { set[n++] = (KVShiftGradSet){draw[1], dhp[0], dk_shifted, p.k_raw, p.k_alpha, dq8[1]}; }
            if (cf->v_shift) { set[n++] = (KVShiftGradSet){draw[2], dhp[1], d.dv, p.v_raw, p.v_alpha, dq8[2]}; }
            kv_shift_backward_gpu(set, n, W, PH, N, T, H, hd, docs);
        }
        // the attention input's gradient: the head projections' terms written, then dqkvg's in one matmul with the
        // layer's grouped weights (side by side in the layout), then those of the blocks not in dqkvg; the grouped
        // weights' gradients in one matmul too
        HeadProj hp = head_proj_layer(g, &p, l);
        float beta = hp.count > 0 ? 1.0f : 0.0f;
        if (hp.count > 0) { head_proj_backward_gpu(d.dxn, &hp, xa, N, C, H); }
        int own8 = 0; // blocks not in dqkvg: their weight gradients bf16, on xa rounded again
        for (int j = 0; j < 4; j++) { own8 |= slot[j] < 0 && own[j] != NULL; }
        const floatX* xa_w = !qkvg8 || own8 ? fp8_rounded_input(g, r8, xa, NC, fp8_norm_at(L, l, FP8_N_XA)) : xa;
        if (F > 0) { // its blocks' producers wrote the codes and the amax
            if (qkvg8) { fp8_transpose_codes_gpu(g->fp8.d8t, g->fp8.d8, N, W); }
            matmul_backward_q(g, r8, 0, d.dxn, CUDA_R_32F, beta, d.dqkvg, dq_i, dq_e5m2, NULL, xa_w,
                              fp8_x8t(g, l, FP8_T_XA), fp8_norm_at(L, l, FP8_N_XA), first, l,
                              fp8_weight_at(L, l, FP8_W_QKVG), N, C, W);
            beta = 1.0f;
        }
        for (int j = 0; j < 4; j++) {
            if (slot[j] < 0 && own[j] != NULL) {
                matmul_backward_q(g, r8, 1, d.dxn, CUDA_R_32F, beta, draw[j], dq_i, dq_e5m2, dq_amax, xa_w, NULL, 0,
                                  QKVG_TENSORS[j], l, fp8_weight_at(L, l, FP8_W_QKVG), N, C, C);
                beta = 1.0f;
            }
        }
        rmsnorm_backward_gpu(d.dresid, d.dresid_x, d.partial, pg(g, P_ATTN_NORM, l), d.dxn, p.resid,
                             pm(g, P_ATTN_NORM, l), p.rstd_a, N, C, fp8_dres_down(g, l - 1));
    }
}

static void gpu_encoder_backward(GPUModel* g) {
    size_t N = (size_t)g->B * g->T;
    int C = g->config.n_embd, distinct = encoder_lists(g, N);
    GPUGradBuffers d = g->gb;
    encoder_backward_gpu(pg(g, P_WTE, 0), d.dresid, d.enc_tokens, d.enc_offsets, d.enc_positions, distinct, C);
}

static void gpu_backward(GPUModel* g) {
    if (!g->has_dlogits) { fail("internal: backward needs the logits' gradient of gpu_forward_train" BUG_HINT); }
    gpu_backward_kernels(g);
    gpu_encoder_backward(g);
}

// A training micro-step: gpu_forward_train then gpu_backward, the same work in the same order, the kernels of both
// launched as one CUDA graph when g_step_graphs is on (launched one by one, the step's many small kernels leave the GPU
// idle between them). A graph keeps the arguments it was captured with, so it is captured for one (B, T, loss_scale)
// after an eager micro-step at that shape (which does the lazy set-up: matmul plans, kernel attributes, buffers) and
// dropped when a buffer it reads moves or a setting it holds changes (g_buffer_epoch). Same kernels, arguments and
// order: the same bits as without it. The mean loss is read back at the end, not between the passes.
static int g_step_graphs = 1;

static void gpu_train_micro_step(GPUModel* g, const int* inputs, const int* targets, int B, int T,
                                 float loss_scale) {
    StepGraph* sg = &g->step_graph;
    if (targets == NULL) { fail("internal: a training micro-step needs targets" BUG_HINT); }
    gpu_forward_begin(g, inputs, targets, B, T, 1);
    if (!g_step_graphs || sg->B != B || sg->T != T || sg->loss_scale != loss_scale || sg->epoch != g_buffer_epoch) {
        step_graph_drop(sg);
    }
    if (!g_step_graphs || sg->state == 0) {
        gpu_forward_kernels(g, loss_scale);
        gpu_backward_kernels(g);
        sg->state = 1; sg->B = B; sg->T = T; sg->loss_scale = loss_scale; sg->epoch = g_buffer_epoch;
    } else {
        if (sg->state == 1) { // relaxed: the launchers' kernel-attribute calls run at capture, as eagerly
            cudaGraph_t graph;
            cudaCheck(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed));
            gpu_forward_kernels(g, loss_scale);
            gpu_backward_kernels(g);
            cudaCheck(cudaStreamEndCapture(cudaStreamPerThread, &graph));
            cudaCheck(cudaGraphInstantiate(&sg->exec, graph, 0));
            cudaCheck(cudaGraphDestroy(graph));
            sg->state = 2; sg->launches = 0;
        }
        cudaCheck(cudaGraphLaunch(sg->exec, cudaStreamPerThread));
        sg->launches++;
    }
    gpu_encoder_backward(g);
    gpu_forward_loss(g);
}

#ifndef ENABLE_FP32
// The twin's fp8_calibrate on the GPU: an unrounded forward and backward of the first micro-batch, thrown away (the
// gradients zeroed), whose amaxes fill the histories (fp8_calibration_done)
static void gpu_fp8_calibrate(GPUModel* g, const int* inputs, const int* targets, int B, int T, float loss_scale,
                              long step) {
    Fp8State* s = &g->host->fp8;
    if (!g->fp8.on || s->calibrated) { return; }
    cudaCheck(cudaMemset(g->fp8.amax, 0, (size_t)g->config.n_layer * FP8_SLOTS * sizeof(unsigned)));
    s->calibrating = 1;
    gpu_forward_train(g, inputs, targets, B, T, loss_scale);
    gpu_backward(g);
    s->calibrating = 0;
    gpu_zero_grad(g);
    gpu_fp8_amax_to_host(g);
    fp8_calibration_done(g->host, step);
}

#endif

// -X 1 with -q: the FP8 plans are tuned on a second pass that rounds as a training micro-step does, its delayed scales
// from the amaxes that the first (bf16) pass takes as a calibration would. The host's FP8 state (scales, histories,
// amaxes) is left as it was, and the device's amaxes cleared: tuning changes no bit of training (matmul_tune).
static void gpu_tune_fp8_begin(GPUModel* g) {
#ifndef ENABLE_FP32
    if (!g->fp8.on) { return; }
    cudaCheck(cudaMemset(g->fp8.amax, 0, (size_t)g->config.n_layer * FP8_SLOTS * sizeof(unsigned)));
    g->host->fp8.on = 1;
    g->host->fp8.calibrating = 1;
#endif
}

// after the first pass: the delayed scales from its amaxes, the weights cast (gpu_fp8_step_begin); the pass that
// follows rounds. False without -q.
static int gpu_tune_fp8_scales(GPUModel* g, size_t N) {
#ifndef ENABLE_FP32
    if (!g->fp8.on) { return 0; }
    Fp8State* s = &g->host->fp8;
    size_t n = (size_t)g->config.n_layer * FP8_SLOTS;
    int* k_run = (int*)malloc_check(n * sizeof(int), "FP8 scales");
    memcpy(k_run, s->k, n * sizeof(int));
    cudaCheck(cudaMemcpy(g->fp8.amax_host, g->fp8.amax, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
        int slot = (int)(i % FP8_SLOTS);
        s->k[i] = fp8_scale_exp(f32_from_bits(g->fp8.amax_host[i]), fp8_slot_format(s->mode, slot),
                                fp8_slot_margin(slot));
    }
    s->calibrating = 0;
    gpu_fp8_step_begin(g, 1.0f, N);
    memcpy(s->k, k_run, n * sizeof(int));
    free(k_run);
    return 1;
#else
    (void)g; (void)N;
    return 0;
#endif
}

static void gpu_tune_fp8_end(GPUModel* g) {
#ifndef ENABLE_FP32
    g->host->fp8.on = 0;
    cudaCheck(cudaMemset(g->fp8.amax, 0, (size_t)g->config.n_layer * FP8_SLOTS * sizeof(unsigned)));
#else
    (void)g;
#endif
}

// a training forward and backward on the tokens (2 N: inputs, then targets) with g_tuning set, thrown away
static void gpu_tune_pass(GPUModel* g, const int* tokens, int B, int T) {
    g_tuning = 1;
    gpu_forward_train(g, tokens, tokens + (size_t)B * T, B, T, 1.0f);
    gpu_backward(g);
    cudaCheck(cudaDeviceSynchronize());
    g_tuning = 0;
    gpu_zero_grad(g);
}

// -X 1: one training forward and backward on random tokens with g_tuning set, so each matmul plan's first call tunes it
// (matmul_tune); the step's results are thrown away (the gradients zeroed). Prints how many plans changed and their
// time a step, each matmul timed alone.
static void gpu_tune_matmuls(GPUModel* g, int B, int T) {
    size_t N = (size_t)B * T;
    int* tokens = (int*)malloc_check(2 * N * sizeof(int), "tuning tokens");
    uint64_t rng = 0x7475E5ull;
    for (size_t i = 0; i < 2 * N; i++) { tokens[i] = (int)(rng_next(&rng) % (uint64_t)g->config.vocab_size); }
    double t0 = now_seconds();
    gpu_tune_fp8_begin(g);
    gpu_tune_pass(g, tokens, B, T);
    if (gpu_tune_fp8_scales(g, N)) { // -q: the FP8 plans on a second pass, one that rounds
        gpu_tune_pass(g, tokens, B, T);
        gpu_tune_fp8_end(g);
    }
    free(tokens);
    int changed = 0, tuned = 0;
    double first = 0.0, best = 0.0;
    for (int i = 0; i < g_num_plans; i++) {
        const MatmulPlan* p = &g_plans[i];
        if (!p->tuned || p->calls == 0) { continue; }
        tuned++;
        changed += memcmp(&p->algo, &p->cand[0], sizeof(p->algo)) != 0;
        first += p->calls * (double)p->first_ms;
        best += p->calls * (double)p->tuned_ms;
    }
    printf("matmul tuning (-X 1): %d of %d matmul shapes use a faster cuBLASLt candidate with the same bits: "
           "%.1f -> %.1f ms a step, each timed alone (%.1f s)\n", changed, tuned, first, best, now_seconds() - t0);
}

// ----------------------------------------------------------------------------
// optimiser: the gradients' reduction (by bucket), the norm, AdamW with clipping, the ZeRO-1 gathers

// Sums the gradients of all ranks (the backward scaled each rank's share by 1/(accum*world), so the sum is the mean
// over the global batch): stage 0 everywhere (all-reduce), stage 1 only this rank's share of each bucket
// (reduce-scatter, in place), after the backward.
static void gpu_reduce_grads(GPUModel* g) {
    const Dist* d = g->dist;
    if (d->world == 1) { return; }
    dist_stream_begin(d);
    ncclCheck(ncclGroupStart());
    for (int b = 0; b < NUM_BUCKETS; b++) {
        Range r = g->layout.bucket[b], mine = g->shard.host[b];
        if (d->zero_stage == 0) {
            ncclCheck(ncclAllReduce(g->grads + r.lo, g->grads + r.lo, r.n, ncclFloat, ncclSum, d->comm, d->stream));
        } else {
            ncclCheck(ncclReduceScatter(g->grads + r.lo, g->grads + mine.lo, mine.n, ncclFloat, ncclSum, d->comm,
                                        d->stream));
        }
    }
    ncclCheck(ncclGroupEnd());
    dist_stream_end(d);
}

// global gradient norm (after gpu_reduce_grads): fixed-grid fp64 partials over this rank's shard (everything in one
// process), gathered and summed on the host in order (frozen tensors have zero gradients and add nothing)
static double gpu_grad_norm(GPUModel* g) {
    sumsq_partial_gpu(g->norm_partial, g->grads, g->shard.dev, g->shard.count, g->shard.total);
    return sqrt(dist_sum(g->dist, g->norm_partial, NORM_BLOCKS));
}

// one AdamW step (step is 1-based) on this rank's optimizer ranges, the gradients clipped first to global norm
// o->grad_clip when it is > 0 (the twin's rule: scale by grad_clip / (norm + 1e-6) when that is below 1)
static void gpu_adamw(GPUModel* g, const AdamWConfig* o, float lr, int step, double norm) {
    float grad_scale = 1.0f;
    if (o->grad_clip > 0) {
        double coef = o->grad_clip / (norm + 1e-6);
        if (coef < 1.0) { grad_scale = (float)coef; }
    }
    float c1 = 1.0f - powf(o->beta1, (float)step), c2 = 1.0f - powf(o->beta2, (float)step);
    if (g->adamw_count == 0) { return; }
    adamw_gpu(g->params, g->params_x, g->grads, g->adam_m, g->adam_v, g->adamw_segs, g->adamw_count, g->adamw_blocks,
              lr, o->weight_decay, o->beta1, o->beta2, c1, c2, o->eps, grad_scale);
}

// all-gathers buckets [b0, b1) of `buf` from each rank's share, which is in `shares` (one after another, as the
// moments) or, when that is NULL, in buf (in place); a collective
template <typename T>
static void gpu_gather_buckets(GPUModel* g, T* buf, const T* shares, int b0, int b1) {
    const Dist* d = g->dist;
    ncclDataType_t type = sizeof(T) == sizeof(float) ? ncclFloat : ncclBfloat16;
    dist_stream_begin(d);
    ncclCheck(ncclGroupStart());
    for (int b = b0; b < b1; b++) {
        Range mine = g->shard.host[b];
        const T* send = shares != NULL ? shares + mine.v : buf + mine.lo;
        ncclCheck(ncclAllGather(send, buf + g->layout.bucket[b].lo, mine.n, type, d->comm, d->stream));
    }
    ncclCheck(ncclGroupEnd());
    dist_stream_end(d);
}

// the optimizer step; under ZeRO-1 each rank's updated share is then all-gathered: BUCKET_FP32's master weights,
// BUCKET_MATMUL's matmul copy (AdamW wrote it; the fp32 master there is this rank's share only, until
// gpu_gather_master)
static void gpu_update(GPUModel* g, const AdamWConfig* o, float lr, int step, double norm) {
    gpu_adamw(g, o, lr, step, norm);
    const Dist* d = g->dist;
    if (d->world > 1 && d->zero_stage == 1) {
        gpu_gather_buckets(g, g->params, (const float*)NULL, BUCKET_FP32, BUCKET_FP32 + 1);
        gpu_gather_buckets(g, g->params_x, (const floatX*)NULL, BUCKET_MATMUL, BUCKET_MATMUL + 1);
    }
}

// every rank's fp32 master weights of BUCKET_MATMUL (ZeRO-1, for a checkpoint); a collective
static void gpu_gather_master(GPUModel* g) {
    if (g->dist->world > 1 && g->dist->zero_stage == 1) {
        gpu_gather_buckets(g, g->params, (const float*)NULL, BUCKET_MATMUL, BUCKET_MATMUL + 1);
        dist_wait(g->dist);
    }
}

// ----------------------------------------------------------------------------
// checkpoints (the twin's files: fp32 master weights; AdamW moments in the state file). With several processes rank 0
// writes both files: the weights are the same on every rank and ZeRO-1 shards of the moments are gathered first, so a
// run resumes on any number of GPUs.

// all-gathers one ZeRO-1 moment buffer into the gradient buffer (free between steps) and copies it to `host` on rank 0;
// a collective
static void gpu_gather_moments(GPUModel* g, const float* shard, float* host) {
    gpu_gather_buckets(g, g->grads, shard, 0, NUM_BUCKETS);
    dist_wait(g->dist);
    if (host != NULL) { gpu_download(g, g->grads, host); }
}

// the weights and moments into the host model, on rank 0 (the others only join the collectives)
static void gpu_state_to_host(GPUModel* g) {
    FoxModel* m = g->host;
    int writer = g->dist->rank == 0;
    gpu_gather_master(g);
    if (writer) {
        gpu_params_to_host(g);
        if (m->m_memory == NULL) {
            m->m_memory = (float*)calloc_check(m->num_parameters, sizeof(float), "AdamW m");
            m->v_memory = (float*)calloc_check(m->num_parameters, sizeof(float), "AdamW v");
        }
    }
    if (g->opt.total == g->layout.size) {
        if (writer) {
            gpu_download(g, g->adam_m, m->m_memory);
            gpu_download(g, g->adam_v, m->v_memory);
        }
    } else {
        gpu_gather_moments(g, g->adam_m, writer ? m->m_memory : NULL);
        gpu_gather_moments(g, g->adam_v, writer ? m->v_memory : NULL);
    }
}

// uploads the host weights and, when the host has them, this rank's ranges of the AdamW moments (else zeros)
static void gpu_state_from_host(GPUModel* g) {
    FoxModel* m = g->host;
    gpu_params_from_host(g);
    cudaCheck(cudaMemset(g->adam_m, 0, g->opt.total * sizeof(float)));
    cudaCheck(cudaMemset(g->adam_v, 0, g->opt.total * sizeof(float)));
    if (m->m_memory == NULL) { return; }
    float* moments[2] = {g->adam_m, g->adam_v};
    const float* host[2] = {m->m_memory, m->v_memory};
    for (int k = 0; k < 2; k++) {
        if (g->opt.total == g->layout.size) { gpu_upload(g, host[k], moments[k]); continue; }
        cudaCheck(cudaMemset(g->grads, 0, g->layout.size * sizeof(float))); // the whole buffer, then the ranges
        gpu_upload(g, host[k], g->grads);
        for (int r = 0; r < g->opt.count; r++) {
            Range rg = g->opt.host[r];
            cudaCheck(cudaMemcpy(moments[k] + rg.v, g->grads + rg.lo, rg.n * sizeof(float), cudaMemcpyDeviceToDevice));
        }
    }
    cudaCheck(cudaMemset(g->grads, 0, g->layout.size * sizeof(float)));
}

// a collective with several processes: every rank calls it, rank 0 writes
static void gpu_save_checkpoint(GPUModel* g, const char* dir, const TrainState* s) {
    gpu_state_to_host(g); // a collective with ZeRO-1: every rank takes part
    if (g->dist->rank == 0) { save_checkpoint(g->host, dir, s); }
}

// ----------------------------------------------------------------------------
// main: training: the validation loss, then (not with FOX_NO_MAIN) resume, the run's steps over a TrainRun, main

// Mean loss over max_batches batches of B sequences (0: the whole validation set). With several processes each
// evaluates its slice of every batch and the sums are gathered: for max_batches a multiple of the world size they cover
// the same sequences as one process.
static float gpu_evaluate(GPUModel* g, DataLoader* val, int max_batches) {
    dataloader_set_position(val, 0, 0, 0);
    if (val->current_batches == 0) { dataloader_advance_shard(val); }
    size_t total = dataloader_total_batches(val); // batches of B * world sequences
    int world = g->dist->world;
    size_t want = max_batches > 0 ? ceil_div((size_t)max_batches, (size_t)world) : total;
    int n = (int)(want < total ? want : total);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        dataloader_next_batch(val);
        gpu_forward(g, val->inputs, val->targets, val->B, val->T);
        sum += g->mean_loss;
    }
    return (float)(dist_sum_scalar(g->dist, sum) / ((double)n * world));
}

#ifndef FOX_NO_MAIN
// defined with generation and the evaluation modes, after main
static void gpu_sample(GPUModel* g, const Tokenizer* tk, int gen_tokens, uint64_t* rng);
static int gpu_eval_main(const Args* a);

// -y 1 on the GPU: resume_run on every rank (the checkpoint files on a filesystem all share: the newest complete one
// into the host model, the training data moved to its position, translated when the number of processes or the
// micro-batch changed), then each rank's slice of the moments to the device; returns the run's state
static TrainState gpu_resume(GPUModel* g, FoxModel* model, const Args* a, DataLoader* train) {
    const Dist* d = g->dist;
    dist_check_same(d, latest_checkpoint(a->out_dir),
                    "the newest checkpoint in -o (the directory must be on a filesystem all processes share)");
    TrainState s = resume_run(model, a, train);
    dist_check_same(d, s.step, "the step resumed from (one process skipped a checkpoint that another could read)");
    gpu_state_from_host(g);
    if (d->rank != 0) { // only rank 0 writes checkpoints: the host copy of the moments is spent
        free(model->m_memory); free(model->v_memory);
        model->m_memory = model->v_memory = NULL;
    }
    return s;
}

// A training run: its settings, data and model, and the state its steps carry
typedef struct {
    Args a;
    Dist dist;
    FoxModel model;
    GPUModel gm;
    DataLoader train, val;
    int have_val;
    int accum;                // micro-steps a step
    float loss_scale;         // the summed gradients are the global batch's mean
    AdamWConfig opt;
    Tokenizer tk;
    int have_tokenizer;       // rank 0 prints the samples
    double flops_per_token;   // 6 N + 6 L C T (MFU)
    double peak;              // the GPU's FLOP/s, 0 when unknown
    size_t need;              // the memory estimate
    LRSchedule sched;
    int start;                // the first step (after a resume)
    int64_t tokens_seen;
    RunDir out;               // -o on rank 0: locked, main.log (run_dir_claim); nothing on the other ranks
    uint64_t sample_rng;
    StepGuard guard;          // every rank sees the same summed loss and norm, so all decide alike
    RunClock clock;
} TrainRun;

// one step's results, for its log line
typedef struct {
    double loss, norm, dt;    // the global batch's mean loss, the gradient norm, the step's seconds
    double t_local;           // with several processes: when this one's forwards and backwards were done
    double t_slowest;         // and the slowest rank's, which the collectives wait for
    int slowest, verdict;
    float lr;
    char why[256], grad[320];
} StepReport;

// the processes, the model, the batch (micro-steps a step, the loss scale), the data, the step count
static void train_setup(TrainRun* r, int argc, char** argv) {
    Args* a = &r->a;
    dist_init(&r->dist, a, argc, argv);
    int rank = r->dist.rank, world = r->dist.world;
    if (rank > 0 && freopen("/dev/null", "w", stdout) == NULL) { // rank 0 alone logs; errors go to stderr
        fail("rank %d could not silence its output: %s\nHINT: /dev/null must be writable", rank, strerror(errno));
    }
    build_model(&r->model, a);
    int V = r->model.config.vocab_size;
    if (a->total_batch_tokens < 0) { a->total_batch_tokens = (long)a->B * a->T * world; }
    long micro_tokens = (long)a->B * a->T * world; // one micro-step of every process
    if (a->total_batch_tokens % micro_tokens != 0) {
        fail("total batch -d %ld is not a multiple of b*t*processes = %d*%d*%d = %ld\n"
             "HINT: choose -d as a multiple of -b times -t times the process count",
             a->total_batch_tokens, a->B, a->T, world, micro_tokens);
    }
    r->accum = (int)(a->total_batch_tokens / micro_tokens);
    r->loss_scale = 1.0f / ((float)r->accum * world);
    dataloader_init(&r->train, a->train_pattern, a->B, a->T, rank, world, 1, a->roll, a->seed, V);
    r->have_val = a->val_every > 0;
    if (r->have_val) { dataloader_init(&r->val, a->val_pattern, a->B, a->T, rank, world, 0, 0, a->seed, V); }
    dataloader_report(&r->train, "train");
    if (r->have_val) { dataloader_report(&r->val, "validation"); }
    if (a->steps < 0) {
        a->steps = (long)(dataloader_total_batches(&r->train) / (size_t)r->accum);
        if (a->steps < 1) { a->steps = 1; }
    }
    r->opt = (AdamWConfig){(float)a->lr, (float)a->weight_decay, 0.9f, 0.95f, 1e-8f, (float)a->grad_clip};
}

// the decode table (no samples without one) and the checks before the run, on every rank: all stop alike
static void train_tokenizer(TrainRun* r) {
    const Args* a = &r->a;
    int have_table = tokenizer_init(&r->tk, a->tokenizer_path);
    if (!have_table && a->sample_every > 0) {
        printf("no decode table at %s: samples off (run 'make data')\n", a->tokenizer_path);
    }
    check_run_start(a, &r->model.config, &r->tk, have_table);
    r->have_tokenizer = have_table && r->dist.rank == 0;
    if (have_table && !r->have_tokenizer) { tokenizer_free(&r->tk); }
}

// stops every rank when the processes were started with different runs
static void train_check_same(const TrainRun* r) {
    const Dist* d = &r->dist;
    const Args* a = &r->a;
    dist_check_same(d, (double)r->model.num_parameters, "the parameter count (-e and model overrides)");
    dist_check_same(d, a->B, "the micro-batch -b");
    dist_check_same(d, a->T, "the sequence length -t");
    dist_check_same(d, (double)a->total_batch_tokens, "the total batch -d");
    dist_check_same(d, (double)a->steps, "the steps -x");
    dist_check_same(d, (double)a->seed, "the seed -S");
    dist_check_same(d, d->zero_stage, "the ZeRO stage -Q");
    // these decide when the collectives of validation and checkpoints happen
    dist_check_same(d, a->val_every * 2.0 + (a->out_dir != NULL), "-v and whether -o is given");
    dist_check_same(d, a->val_batches, "the validation batches -m");
    dist_check_same(d, a->checkpoint_every * 2.0 + a->resume, "-n and -y");
}

// -o claimed by rank 0 (run_dir_claim: made, locked, write-tested) before anything is written there; every rank learns
// whether that went well, so that all stop alike
static void train_claim_dir(TrainRun* r) {
    r->out = run_dir_unclaimed();
    if (r->a.out_dir == NULL) { return; }
    char why[RUN_DIR_WHY_BYTES] = "";
    int ok = r->dist.rank != 0 || run_dir_claim(&r->out, r->a.out_dir, &r->model.config, why, sizeof(why)) == 0;
    dist_all_ok(&r->dist, ok, why);
}

// the run's settings for the GPU (-r, -A) and its header: device, processes, model, the memory estimate, the FLOPs a
// token that MFU counts
static void train_plan(TrainRun* r) {
    const Args* a = &r->a;
    const FoxConfig* cf = &r->model.config;
    g_recompute = a->recompute;
    attention_set_pruning(a->prune, a->prune_ln_eps);
    printf("device: %s (%d SMs, %.1f GiB), precision %s\n", g_prop.name, g_prop.multiProcessorCount,
           g_prop.totalGlobalMem / 1073741824.0, PRECISION_NAME);
    if (r->dist.world > 1) {
        printf("data parallel: %d processes (%s), ZeRO stage %d, NCCL_NVLS_ENABLE=%s\n", r->dist.world, r->dist.how,
               r->dist.zero_stage, getenv("NCCL_NVLS_ENABLE"));
    }
    config_print(stdout, cf);
    size_t matmul_params = fox_matmul_params(&r->model);
    r->flops_per_token = 6.0 * (double)matmul_params + 6.0 * cf->n_layer * cf->n_embd * (double)a->T;
    r->peak = gpu_peak_flops();
    r->need = gpu_memory_needed(cf, a->B, a->T, &r->dist, a->fp8);
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    printf("parameters: %zu (%zu in matmuls) | GPU memory estimate %.1f MiB of %.1f MiB free (per GPU), "
           "recompute -r %d\n", r->model.num_parameters, matmul_params, r->need / 1048576.0, free_b / 1048576.0,
           a->recompute);
    printf("MFU: flops per token 6*N + 6*L*C*T = 6*%zu + 6*%d*%d*%d = %.4g%s, peak %s\n", matmul_params,
           cf->n_layer, cf->n_embd, a->T, r->flops_per_token,
           a->prune ? " (-A 1: the attention term times the share of tiles computed)" : "",
           r->peak > 0 ? "989 TFLOP/s (bf16 dense) per GPU" : "unknown for this GPU (MFU n/a)");
}

// the GPU model, resumed (-y 1) and its matmuls tuned (-X 1); the schedule; prints the batch
static void train_build(TrainRun* r) {
    const Args* a = &r->a;
    gpu_build_dist(&r->gm, &r->model, a->B, a->T, &r->dist);
    TrainState resumed;
    if (a->resume) { resumed = gpu_resume(&r->gm, &r->model, a, &r->train); }
    r->start = a->resume ? resumed.step : 0;
    r->tokens_seen = a->resume ? resumed.tokens_seen : 0;
    r->sched = run_schedule(a, a->resume ? &resumed : NULL);
    if (a->tune) { gpu_tune_matmuls(&r->gm, a->B, a->T); }
    g_step_graphs = a->graphs;
    printf("batch: %d x %d tokens x %d process(es), %d accumulation step(s), %ld tokens per step | %ld steps | "
           "warmup %.0f tokens | %s schedule, peak lr %g\n", a->B, a->T, r->dist.world, r->accum,
           a->total_batch_tokens, a->steps, r->sched.warmup_tokens, SCHEDULE_NAMES[a->schedule], a->lr);
}

// the log file (-o, rank 0), the samples' random state, the step guard, the clock
static void train_open_log(TrainRun* r) {
    const Args* a = &r->a;
    if (a->out_dir != NULL && r->dist.rank == 0) { run_dir_open_log(&r->out, a->out_dir, a->resume); }
    r->sample_rng = a->seed ^ 0x5DEECE66Dull;
    step_guard_init(&r->guard, a->on_nonfinite, a->spike_z);
    run_clock_start(&r->clock);
}

// before step `step` and after the last: the validation loss (-v), the checkpoint (-n, -o), the sample (-s)
static void train_between_steps(TrainRun* r, long step, int last) {
    const Args* a = &r->a;
    if (r->have_val && (step % a->val_every == 0 || last)) {
        float vl = gpu_evaluate(&r->gm, &r->val, a->val_batches);
        printf("step %ld: val loss %.6f\n", step, vl);
        log_line(&r->out, "s:%ld tel:%.6f tokens:%lld\n", step, vl, (long long)r->tokens_seen);
    }
    // the checkpoint before the sample: a sample must never cost one
    int checkpoint_due = (a->checkpoint_every > 0 && step % a->checkpoint_every == 0) || last;
    if (a->out_dir != NULL && step > r->start && checkpoint_due) {
        TrainState s = train_state((int)step, &r->train, &r->sched, r->tokens_seen, a);
        gpu_save_checkpoint(&r->gm, a->out_dir, &s);
    }
    if (r->have_tokenizer && a->sample_every > 0 && (step % a->sample_every == 0 || last) && step > 0) {
        int gen = a->gen_tokens < a->T ? a->gen_tokens : a->T;
        gpu_sample(&r->gm, &r->tk, gen, &r->sample_rng);
    }
}

// the step's micro-steps (forward and backward of each micro-batch, from t0); returns the global batch's mean loss,
// summed over the processes with their timings (before the gradients' collective)
static double train_micro_steps(TrainRun* r, long step, double t0, StepReport* rep) {
    const Args* a = &r->a;
    gpu_zero_grad(&r->gm);
    fp8_step_begin(&r->model);
    double loss = 0.0; // this process's share of the global batch's mean loss
    for (int micro = 0; micro < r->accum; micro++) {
        dataloader_next_batch(&r->train);
#ifndef ENABLE_FP32
        if (micro == 0) { // -q: scales calibrated first when there are none, then the step's scales and weights
            gpu_fp8_calibrate(&r->gm, r->train.inputs, r->train.targets, a->B, a->T, r->loss_scale, step);
            gpu_fp8_step_begin(&r->gm, r->loss_scale, (size_t)a->B * a->T);
        }
#endif
        gpu_train_micro_step(&r->gm, r->train.inputs, r->train.targets, a->B, a->T, r->loss_scale);
        loss += r->gm.mean_loss / (r->accum * r->dist.world);
    }
#ifndef ENABLE_FP32
    gpu_fp8_amax_to_host(&r->gm);
#endif
    rep->t_local = 0.0;
    if (r->dist.world > 1) {
        cudaCheck(cudaDeviceSynchronize()); // no loss of overlap: the loss's sum below waits for it anyway
        rep->t_local = now_seconds() - t0;
    }
    return dist_sum_loss(&r->dist, loss, rep->t_local, &rep->slowest, &rep->t_slowest);
}

// one step: the micro-steps, the gradients' reduction and norm, the guard's verdict, the update
static void train_step(TrainRun* r, long step, StepReport* rep) {
    if (tiles_counted(&r->a)) { unsigned long long tiles; attention_pruned_share(&tiles); } // this step's forwards
    double t0 = now_seconds();
    rep->loss = train_micro_steps(r, step + 1, t0, rep);
    gpu_reduce_grads(&r->gm);
    rep->norm = gpu_grad_norm(&r->gm);
    if (!fp8_amax_finite(&r->model)) { rep->norm = NAN; } // a non-finite FP8 amax: the saturating casts would hide it
    rep->why[0] = rep->grad[0] = '\0';
    rep->verdict = step_guard_check(&r->guard, rep->loss, rep->norm, rep->why, sizeof(rep->why));
    if (rep->verdict != STEP_UPDATE && !isfinite(rep->norm)) { // name the tensor from this process's gradients
        gpu_download(&r->gm, r->gm.grads, r->model.grads_memory);
        if (!nonfinite_grad_name(&r->model.config, r->model.grads_memory, rep->grad, sizeof(rep->grad))) {
            fp8_nonfinite_name(&r->model, rep->grad, sizeof(rep->grad));
        }
    }
    if (rep->verdict == STEP_STOP) { step_guard_stop(step + 1, rep->why, rep->grad); }
    rep->lr = (float)lr_at_tokens(&r->sched, (double)r->tokens_seen);
    if (rep->verdict == STEP_UPDATE) { gpu_update(&r->gm, &r->opt, rep->lr, (int)step + 1, rep->norm); }
    fp8_step_end(&r->model, step + 1, rep->verdict == STEP_UPDATE);
    r->tokens_seen += r->a.total_batch_tokens;
    dist_wait(&r->dist);
    cudaCheck(cudaDeviceSynchronize());
    rep->dt = now_seconds() - t0;
}

// the step's line: loss, norm, lr, time, throughput, MFU, the processes' waits; the guard's log record; after the first
// step the peak memory
static void train_log_step(TrainRun* r, long step, const StepReport* rep) {
    const Args* a = &r->a;
    const FoxConfig* cf = &r->model.config;
    int world = r->dist.world;
    double tok_s = a->total_batch_tokens / rep->dt;
    // with pruning (-A 1) or documents (-f 1) the attention term counts the tiles computed, not the skipped ones
    unsigned long long tiles = 0;
    double pruned = tiles_counted(a) ? attention_pruned_share(&tiles) : 0.0;
    double flops = r->flops_per_token - 6.0 * cf->n_layer * cf->n_embd * (double)a->T * pruned;
    char mfu[32] = "n/a", per_gpu[48] = "";
    if (r->peak > 0) { snprintf(mfu, sizeof(mfu), "%.1f%%", 100.0 * flops * tok_s / (r->peak * world)); }
    if (world > 1) { snprintf(per_gpu, sizeof(per_gpu), " (%.0f per GPU)", tok_s / world); }
    run_clock_tick(&r->clock);
    char progress[96], fields[160];
    format_progress(progress, sizeof(progress), &r->clock, a->steps - step - 1, r->tokens_seen);
    step_log_fields(fields, sizeof(fields), rep->lr, rep->norm, tok_s, r->tokens_seen);
    printf("step %5ld/%ld | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s%s | MFU %s", step + 1, a->steps,
           rep->loss, rep->norm, rep->lr, rep->dt * 1e3, tok_s, per_gpu, mfu);
    if (tiles_counted(a)) { printf(" | pruned %.1f%% of tiles", 100.0 * pruned); }
    if (world > 1) { // waits, collectives, update
        printf(" | sync+comm %.1f ms (slowest rank %d, +%.1f ms)", (rep->dt - rep->t_local) * 1e3, rep->slowest,
               (rep->t_slowest - rep->t_local) * 1e3);
    }
    printf("%s", progress);
    step_guard_log(&r->out, &r->guard, rep->verdict, step + 1, rep->loss, rep->why, rep->grad, fields);
    // every buffer is allocated up front and kept: the peak is reached by now, but for the step's CUDA graph, captured
    // later (the second micro-step: with one a step, the next step); it adds ~2 MiB
    if (step == r->start) {
        size_t used = gpu_memory_used() - g_memory_baseline;
        printf("peak GPU memory %.1f MiB (estimate %.1f MiB, %+.1f%%), measured after the first step\n",
               used / 1048576.0, r->need / 1048576.0, 100.0 * ((double)r->need - (double)used) / (double)used);
    }
}

static void train_finish(TrainRun* r) {
    if (r->guard.skipped > 0) {
        printf("skipped %ld of %ld steps (-G skip, -Z)\n", r->guard.skipped, r->a.steps - r->start);
    }
    run_dir_close(&r->out);
    if (r->have_tokenizer) { tokenizer_free(&r->tk); }
    dataloader_free(&r->train);
    if (r->have_val) { dataloader_free(&r->val); }
    gpu_free(&r->gm);
    fox_free(&r->model);
    dist_free(&r->dist);
}

int main(int argc, char** argv) {
    static TrainRun r; // static: zeroed, and off the stack
    threads_init();
    parse_args(&r.a, argc, argv);
#ifdef ENABLE_FP32
    if (r.a.fp8 != FP8_MODE_OFF) { // refused, never ignored
        fail("-q %s: FP8 matmuls need the bf16 build\nHINT: build without PRECISION=FP32, or drop -q",
             FP8_MODE_NAMES[r.a.fp8]);
    }
#endif
    if (r.a.mode != MODE_TRAIN) { return gpu_eval_main(&r.a); }
    train_setup(&r, argc, argv);
    train_check_same(&r);
    train_claim_dir(&r);
    train_tokenizer(&r);
    train_plan(&r);
    train_build(&r);
    train_open_log(&r);
    for (long step = r.start; step <= r.a.steps; step++) {
        int last = step == r.a.steps;
        train_between_steps(&r, step, last);
        if (last) { break; }
        StepReport rep;
        train_step(&r, step, &rep);
        train_log_step(&r, step, &rep);
    }
    train_finish(&r);
    return 0;
}
#endif

// generation, sampling and the evaluation modes on the GPU
#include "dev/generate.cuh"
