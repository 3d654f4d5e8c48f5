/*
dev/check_fp8_exhaustive.cu: the twin's FP8 and bf16 conversions (train_fox.c, FP8 numerics) on every fp32 bit
pattern, on the host, against CUDA's own host conversions (cuda_fp8.h, cuda_bf16.h): fp8_encode against
__nv_cvt_float_to_fp8(x, __NV_SATFINITE, E4M3 / E5M2) and bf16_round against __float2bfloat16 on all 2^32 inputs
(NaN by class), and fp8_scale_exp on every positive finite amax against its definition in double (the largest k
with amax 2^k <= max 2^-margin, clamped to [-100, 100]), margins 0 and 1. test_fox checks the same on samples and
every edge; this leaves no input out. No GPU needed: about 4 minutes on one core.

  nvcc -O3 -std=c++17 -Xcompiler "-O3 -march=native -fopenmp" -DNO_GPT2_ENCODER dev/check_fp8_exhaustive.cu \
      -o build/check_fp8_exhaustive && ./build/check_fp8_exhaustive

Prints one line per check and exits non-zero when any input differs.
*/
#define FOX_NO_MAIN
#include "../train_fox.c"
#include <cuda_bf16.h>
#include <cuda_fp8.h>

// the code CUDA's host conversion gives, or -1 for a NaN code (compared by class)
static int cuda_code(float x, int e5m2) {
    const Fp8Format* f = e5m2 ? &FP8_E5M2 : &FP8_E4M3;
    int c = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
    return isnan(fp8_decode((uint8_t)c, f)) ? -1 : c;
}

static int twin_code(float x, int e5m2) {
    const Fp8Format* f = e5m2 ? &FP8_E5M2 : &FP8_E4M3;
    int c = fp8_encode(x, f);
    return isnan(fp8_decode((uint8_t)c, f)) ? -1 : c;
}

// the largest k with amax 2^k <= max 2^-margin, in double (log2 gives it to within one, the products decide),
// clamped to [-100, 100]
static int scale_exp_definition(float amax, const Fp8Format* f, int margin) {
    double limit = (double)fp8_decode((uint8_t)f->max_code, f) * ldexp(1.0, -margin);
    int k = (int)floor(log2(limit / (double)amax));
    while ((double)amax * ldexp(1.0, k + 1) <= limit) { k++; }
    while ((double)amax * ldexp(1.0, k) > limit) { k--; }
    return k < -100 ? -100 : k > 100 ? 100 : k;
}

int main(void) {
    long long differ[3] = {0, 0, 0};
    #pragma omp parallel for reduction(+ : differ[:3]) schedule(static, 1 << 20)
    for (long long u = 0; u < (1LL << 32); u++) {
        float x = f32_from_bits((uint32_t)u);
        differ[0] += twin_code(x, 0) != cuda_code(x, 0);
        differ[1] += twin_code(x, 1) != cuda_code(x, 1);
        float want = __bfloat162float(__float2bfloat16(x)), got = bf16_round(x);
        differ[2] += isnan(want) ? !isnan(got) : f32_bits(want) != f32_bits(got);
    }
    printf("%s fp8_encode E4M3 against __nv_cvt_float_to_fp8 (satfinite) on all 2^32 fp32 patterns: %lld differ\n",
           differ[0] ? "FAIL" : "ok  ", differ[0]);
    printf("%s fp8_encode E5M2 against __nv_cvt_float_to_fp8 (satfinite) on all 2^32 fp32 patterns: %lld differ\n",
           differ[1] ? "FAIL" : "ok  ", differ[1]);
    printf("%s bf16_round against __float2bfloat16 on all 2^32 fp32 patterns: %lld differ\n",
           differ[2] ? "FAIL" : "ok  ", differ[2]);
    long long scale_differ = 0;
    #pragma omp parallel for reduction(+ : scale_differ) schedule(static, 1 << 20)
    for (long long u = 1; u < 0x7F800000LL; u++) {
        float amax = f32_from_bits((uint32_t)u);
        for (int fm = 0; fm < 4; fm++) {
            const Fp8Format* f = fm & 1 ? &FP8_E5M2 : &FP8_E4M3;
            scale_differ += fp8_scale_exp(amax, f, fm >> 1) != scale_exp_definition(amax, f, fm >> 1);
        }
    }
    printf("%s fp8_scale_exp on every positive finite fp32 amax, E4M3 and E5M2, margins 0 and 1: %lld differ\n",
           scale_differ ? "FAIL" : "ok  ", scale_differ);
    return differ[0] + differ[1] + differ[2] + scale_differ != 0;
}
