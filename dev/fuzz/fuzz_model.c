// libFuzzer harness: the model checkpoint reader (header, configuration, parameters).
#include "fuzz_common.h"
#define TESTING 1
#define FUZZING 1
#include "../../train_fox.c"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_input("model.bin", data, size);
    FoxModel m;
    if (setjmp(fuzz_fail_jump) == 0) {
        load_model(&m, path);
        fox_free(&m);
        fuzz_expect_nothing_live("load_model");
    }
    fuzz_release();
    return 0;
}
