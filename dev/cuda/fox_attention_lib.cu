// Shared library of train_fox.cu's fused FoX attention (fox_attention_forward, fox_attention_backward:
// the kernels that train) for dev/bench_attention.py and dev/attention_work.py, which call it through
// ctypes on torch tensors' data pointers. Built by the Makefile (or bench_attention.py) with the flags
// train_fox.cu is built with, plus -Xcompiler -fPIC -shared.
#define FOX_NO_MAIN
#include "../../train_fox.cu"

// The callers pass torch's stream, whose default is the handle 0: the legacy default stream (this
// build's 0 would mean the thread's default stream, train_fox.cu being built per-thread)
static cudaStream_t caller_stream(void* s) { return s ? (cudaStream_t)s : cudaStreamLegacy; }

extern "C" {
// dense (no pruning tables)
void fox_fwd(void* o, void* lse, const void* q, const void* k, const void* v, const void* c,
             int B, int T, int H, int hd, int stride_qkv, int stride_o, int window, void* stream) {
    fox_attention_forward((bf16*)o, (float*)lse, (const bf16*)q, (const bf16*)k, (const bf16*)v, (const float*)c,
                          B, T, H, hd, stride_qkv, stride_o, window, nullptr, nullptr, caller_stream(stream));
}
// scratch_dc: 3 * B*H*T floats; Delta is formed here (delta_ready = 0)
void fox_bwd(void* dq, void* dk, void* dv, void* dlogf, void* scratch_dc, const void* dout, const void* q,
             const void* k, const void* v, const void* o, const void* lse, const void* c,
             int B, int T, int H, int hd, int stride_qkv, int stride_o, int window, void* stream) {
    fox_attention_backward((bf16*)dq, (bf16*)dk, (bf16*)dv, (float*)dlogf, (float*)scratch_dc, (const bf16*)dout,
                           (const bf16*)q, (const bf16*)k, (const bf16*)v, (const bf16*)o, (const float*)lse,
                           (const float*)c, B, T, H, hd, stride_qkv, stride_o, window, nullptr, 0, nullptr,
                           caller_stream(stream));
}
}
