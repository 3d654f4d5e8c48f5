// libFuzzer harness: the model checkpoint reader (header, configuration, parameters).
#include "fuzz_common.h"
#define FOX_NO_MAIN 1
#define FOX_TEST_HOOKS 1
#include "../../train_fox.c"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_input("model.bin", data, size);
    FoxModel m;
    test_hooks.fail_jump = &fuzz_fail_jump;
    test_hooks.ignore_checksums = 1; // the checks behind the checksum are what is fuzzed
    if (setjmp(fuzz_fail_jump) == 0) {
        load_model(&m, path);
        fox_free(&m);
        fuzz_expect_nothing_live("load_model");
    }
    fuzz_release();
    return 0;
}
