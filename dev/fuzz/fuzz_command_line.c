// libFuzzer harness: the command line (parse_args, then build_model) with argv made of the
// input's NUL-separated strings.
#include "fuzz_common.h"
#define FOX_NO_MAIN 1
#define FOX_TEST_HOOKS 1
#include "../../train_fox.c"

#define FUZZ_MAX_ARGS 32

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char* copy = (char*)fuzz_malloc(size + 1);
    memcpy(copy, data, size);
    copy[size] = '\0';
    char* argv[FUZZ_MAX_ARGS + 1] = {(char*)"train_fox"};
    int argc = 1;
    for (size_t i = 0; i < size && argc < FUZZ_MAX_ARGS; i += strlen(copy + i) + 1) {
        argv[argc++] = copy + i;
        // -h prints the help and exits by design
        if (strcmp(copy + i, "-h") == 0 || strcmp(copy + i, "--help") == 0) { fuzz_release(); return 0; }
    }
    argv[argc] = NULL;
    Args a;
    FoxModel m;
    test_hooks.fail_jump = &fuzz_fail_jump;
    if (setjmp(fuzz_fail_jump) == 0) {
        parse_args(&a, argc, argv);
        build_model(&m, &a);
        fox_free(&m);
        fuzz_free(copy);
        fuzz_expect_nothing_live("the command line");
    }
    fuzz_release();
    return 0;
}
