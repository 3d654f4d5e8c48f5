// Shared library of the fused FoX attention (the API: forward version 16;
// backward version 20 at hd 64, 22 at hd 128) for dev/bench_attention.py, which calls it through ctypes on torch tensors' data pointers.
// nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC,-fopenmp -shared fox_attention_lib.cu -o libfox_attention.so
#define FOX_SKIP_BACKWARD_MAIN
#include "fox_attention_backward.cu"

extern "C" {
void fox_fwd(void* o, void* lse, const void* q, const void* k, const void* v, const void* c,
             int B, int T, int H, int hd, int stride_qkv, int stride_o, int window, void* stream) {
    fox_attention_forward((bf16*)o, (float*)lse, (const bf16*)q, (const bf16*)k, (const bf16*)v, (const float*)c,
                          B, T, H, hd, stride_qkv, stride_o, window, (cudaStream_t)stream);
}
void fox_bwd(void* dq, void* dk, void* dv, void* dlogf, void* scratch_dc, const void* dout, const void* q,
             const void* k, const void* v, const void* o, const void* lse, const void* c,
             int B, int T, int H, int hd, int stride_qkv, int stride_o, int window, void* stream) {
    fox_attention_backward((bf16*)dq, (bf16*)dk, (bf16*)dv, (float*)dlogf, (float*)scratch_dc, (const bf16*)dout,
                           (const bf16*)q, (const bf16*)k, (const bf16*)v, (const bf16*)o, (const float*)lse,
                           (const float*)c, B, T, H, hd, stride_qkv, stride_o, window, (cudaStream_t)stream);
}
}
