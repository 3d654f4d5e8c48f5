// libFuzzer harness: the optimizer state reader (step, data position, AdamW moments), then the
// data position it holds set on a data loader, as a resume does.
#include "fuzz_common.h"
#define TESTING 1
#define FUZZING 1
#include "../../train_fox.c"

// the model the seeds were written for (dev/fuzz/make_seeds.c)
static void fuzz_state_model(FoxModel* m) {
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    c.n_layer = 1; c.n_embd = 8; c.n_head = 2; c.mlp_hidden = 16;
    c.vocab_size = 16; c.padded_vocab_size = padded_vocab(16);
    fox_build(m, &c);
}

static char shard_pattern[256];

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    (void)argc; (void)argv;
    // two shards of 40 and 24 tokens below the vocabulary of 16
    uint16_t tokens[40];
    for (int i = 0; i < 40; i++) { tokens[i] = (uint16_t)(i % 16); }
    for (int s = 0; s < 2; s++) {
        char path[256];
        snprintf(path, sizeof(path), "/tmp/fuzz_%d_state_shard_%d.bin", (int)getpid(), s);
        int header[256] = {SHARD_MAGIC, SHARD_VERSION, s == 0 ? 40 : 24};
        FILE* f = fopen(path, "wb");
        if (f == NULL || fwrite(header, sizeof(int), 256, f) != 256 || fwrite(tokens, 2, (size_t)header[2], f) != (size_t)header[2]) { abort(); }
        fclose(f);
    }
    snprintf(shard_pattern, sizeof(shard_pattern), "/tmp/fuzz_%d_state_shard_*.bin", (int)getpid());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_input("state.bin", data, size);
    FoxModel m;
    DataLoader d;
    if (setjmp(fuzz_fail_jump) == 0) {
        fuzz_state_model(&m);
        dataloader_init(&d, shard_pattern, 2, 4, 0, 1, 1, 0, 7, 16);
        TrainState s;
        load_state(&m, &s, path);
        dataloader_set_position(&d, s.epoch, s.shard_pos, s.batch_pos);
        dataloader_next_batch(&d);
        dataloader_free(&d);
        fox_free(&m);
        fuzz_expect_nothing_live("load_state");
    }
    fuzz_release();
    return 0;
}
