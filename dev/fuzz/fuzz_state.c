// libFuzzer harness: the optimizer state reader (step, data position, run settings, AdamW
// moments), then the data position it holds checked and set on a data loader, as a resume does.
#include "fuzz_common.h"
#define FOX_NO_MAIN 1
#define FOX_TEST_HOOKS 1
#include "../../train_fox.c"

// the model the seeds were written for (dev/fuzz/make_seeds.c)
static void fuzz_state_model(FoxModel* m) {
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    c.n_layer = 1; c.n_embd = 8; c.n_head = 2; c.mlp_hidden = 16;
    c.vocab_size = 16; c.padded_vocab_size = padded_vocab(16);
    fox_build(m, &c);
}

#include "state_shards.h"

static char shard_pattern[256];

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    (void)argc; (void)argv;
    char dir[128];
    snprintf(dir, sizeof(dir), "/tmp/fuzz_%d_state", (int)getpid());
    write_state_shards(dir);
    snprintf(shard_pattern, sizeof(shard_pattern), "%s/state_shard_*.bin", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_input("state.bin", data, size);
    FoxModel m;
    DataLoader d;
    test_hooks.fail_jump = &fuzz_fail_jump;
    test_hooks.ignore_checksums = 1; // the checks behind the checksum are what is fuzzed
    if (setjmp(fuzz_fail_jump) == 0) {
        fuzz_state_model(&m);
        dataloader_init(&d, shard_pattern, 2, 4, 0, 1, 1, 0, 7, 16);
        TrainState s;
        load_state(&m, &s, path);
        int batch_pos = resume_data_position(&s, &d, path);
        dataloader_set_position(&d, s.epoch, s.shard_pos, batch_pos);
        dataloader_next_batch(&d);
        dataloader_free(&d);
        fox_free(&m);
        fuzz_expect_nothing_live("load_state");
    }
    fuzz_release();
    return 0;
}
