// libFuzzer harness: the decode table reader (llm.c's tokenizer format, version 2).
#include "fuzz_common.h"
#define FOX_NO_MAIN 1
#define FOX_TEST_HOOKS 1
#include "../../train_fox.c"

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    (void)argc; (void)argv;
    if (freopen("/dev/null", "w", stdout) == NULL) { abort(); } // tokenizer_print writes there
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_input("decode_table.bin", data, size);
    Tokenizer tk;
    test_hooks.fail_jump = &fuzz_fail_jump;
    if (setjmp(fuzz_fail_jump) == 0) {
        if (!tokenizer_init(&tk, path)) { abort(); } // the file exists
        for (int t = 0; t < 8; t++) { tokenizer_print(&tk, t); }
        tokenizer_print(&tk, tk.eot);
        tokenizer_free(&tk);
        fuzz_expect_nothing_live("the decode table");
    }
    fuzz_release();
    return 0;
}
