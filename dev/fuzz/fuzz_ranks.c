// libFuzzer harness: the GPT-2 merge ranks reader of data/gpt2_bpe.c, past its sha256 check
// (any other bytes stop there), then an encode and decode with what it read.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "fuzz_common.h"
#define FOX_TEST_HOOKS 1
#include "../../data/gpt2_bpe.c"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    GPT2BPE t;
    memset(&t, 0, sizeof(t));
    if (setjmp(fuzz_die_jump) == 0) {
        load_ranks(&t, data, size, "ranks");
        GPT2Worker w;
        GPT2Ids ids = {0};
        static const uint8_t text[] = "Hello, world! caf\xc3\xa9 \xff 123";
        gpt2_worker_init(&w, &t);
        gpt2_encode(&w, text, sizeof(text) - 1, &ids);
        size_t n;
        fuzz_free(gpt2_decode(&t, ids.ids, ids.len, &n));
        gpt2_ids_free(&ids);
        gpt2_worker_free(&w);
        gpt2_bpe_free(&t);
        fuzz_expect_nothing_live("the ranks reader");
    }
    if (t.re != NULL) { pcre2_code_free(t.re); }
    fuzz_release();
    return 0;
}
