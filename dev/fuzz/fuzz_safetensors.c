/*
fuzz_safetensors.c: libFuzzer harness of fox_hf's safetensors reader and of its JSON reader
(the one that also reads config.json). Any input must either parse or be refused with a
message, never crash or read outside the buffer; a parsed file's tensors are read in full so
that AddressSanitizer sees any offset that escaped the checks.

  clang -g -O1 -fsanitize=fuzzer,address,undefined -DFOX_NO_MAIN -DFOX_TEST_HOOKS -I. \
      dev/fuzz/fuzz_safetensors.c -o build/fuzz_safetensors -lm
  build/fuzz_safetensors -max_total_time=60 dev/fuzz/seeds/safetensors
*/
#include "dev/fox_hf.c"

static void refused_without_reason(void) {
    fprintf(stderr, "an input was refused with an empty message\n");
    abort();
}

static void read_all_tensors(const SafeTensors* st) {
    volatile float sink = 0.0f;
    for (size_t i = 0; i < st->count; i++) {
        const StTensor* t = &st->tensors[i];
        const uint8_t* p = st->data + t->begin;
        size_t bytes = t->end - t->begin;
        for (size_t k = 0; k < bytes; k++) { sink += p[k]; }
        int is_float = t->dtype == ST_F32 || t->dtype == ST_BF16 || t->dtype == ST_F16 || t->dtype == ST_F64;
        for (size_t k = 0; is_float && k < bytes / ST_DTYPE_BYTES[t->dtype]; k++) { sink += st_element(p, t->dtype, k); }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char error[256];
    error[0] = '\0';
    SafeTensors st;
    if (safetensors_parse(&st, data, size, error, sizeof(error)) == 0) {
        read_all_tensors(&st);
        safetensors_free(&st);
    } else if (error[0] == '\0') {
        refused_without_reason();
    }
    error[0] = '\0';
    Json j;
    if (json_parse(&j, (const char*)data, size, error, sizeof(error)) == 0) {
        json_free(&j);
    } else if (error[0] == '\0') {
        refused_without_reason();
    }
    return 0;
}
