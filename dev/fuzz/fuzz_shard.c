// libFuzzer harness: the token shard reader (header, size, tokens) through the data loader.
#include "fuzz_common.h"
#define FOX_NO_MAIN 1
#define FOX_TEST_HOOKS 1
#include "../../train_fox.c"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_input("shard.bin", data, size);
    DataLoader d;
    test_hooks.fail_jump = &fuzz_fail_jump;
    if (setjmp(fuzz_fail_jump) == 0) {
        dataloader_init(&d, path, 2, 4, 0, 1, 1, 1, 7, 50257);
        for (int i = 0; i < 5; i++) { dataloader_next_batch(&d); } // past the end: a new epoch
        dataloader_free(&d);
        fuzz_expect_nothing_live("the data loader");
    }
    fuzz_release();
    return 0;
}
