// Writes the fuzzers' seed inputs, valid files of each format, into <dir>/<reader>/
// (`make fuzz` runs it; the formats stay those of the code of the day).
// usage: make_seeds <dir> <ranks file>
#define FOX_NO_MAIN 1
#include "../../train_fox.c"
#include "state_shards.h"

static void seed_dir(char* out, size_t n, const char* dir, const char* reader) {
    snprintf(out, n, "%s/%s", dir, reader);
    mkdir(dir, 0755);
    mkdir(out, 0755);
}

static void write_bytes(const char* dir, const char* name, const void* data, size_t size) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE* f = fopen_check(path, "wb");
    if (fwrite(data, 1, size, f) != size || fclose(f) != 0) { fail("could not write '%s'", path); }
}

static void shard_seeds(const char* dir) {
    uint16_t tokens[64];
    for (int i = 0; i < 64; i++) { tokens[i] = (uint16_t)((i * 7919) % 50257); }
    int counts[] = {64, 9, 0};
    for (int k = 0; k < 3; k++) {
        unsigned char buf[SHARD_HEADER_BYTES + sizeof(tokens)] = {0};
        int header[3] = {SHARD_MAGIC, SHARD_VERSION, counts[k]};
        memcpy(buf, header, sizeof(header));
        memcpy(buf + SHARD_HEADER_BYTES, tokens, (size_t)counts[k] * 2);
        char name[64];
        snprintf(name, sizeof(name), "shard_%d_tokens.bin", counts[k]);
        write_bytes(dir, name, buf, SHARD_HEADER_BYTES + (size_t)counts[k] * 2);
    }
}

// the model of fuzz_state.c: one layer, C = 8, two heads, vocabulary 16
static void tiny_model(FoxModel* m, const char* preset) {
    FoxConfig c;
    config_from_preset(&c, preset);
    c.n_layer = 1; c.n_embd = 8; c.n_head = 2; c.mlp_hidden = 16;
    c.vocab_size = 16; c.padded_vocab_size = padded_vocab(16);
    fox_build(m, &c);
    fox_init(m, 1);
}

static void checkpoint_seeds(const char* model_dir, const char* state_dir) {
    const char* presets[] = {"fox-pro-tiny", "fox-llama-tiny", "transformer-llama-tiny"};
    char path[4096];
    for (int k = 0; k < 3; k++) {
        FoxModel m;
        tiny_model(&m, presets[k]);
        snprintf(path, sizeof(path), "%s/%s.bin", model_dir, presets[k]);
        save_model(&m, path);
        if (k == 0) {
            // a position in fuzz_state.c's shards: its data loader, one batch into the second shard
            char shards[4096], pattern[4200];
            snprintf(shards, sizeof(shards), "%s/../../state_shards", state_dir);
            write_state_shards(shards);
            snprintf(pattern, sizeof(pattern), "%s/state_shard_*.bin", shards);
            DataLoader d;
            dataloader_init(&d, pattern, 2, 4, 0, 1, 1, 0, 7, 16);
            dataloader_set_position(&d, 0, 1, 1);
            LRSchedule sched = {SCHEDULE_COSINE, 1e-3, 16, 80, 8};
            Args a;
            const char* argv[] = {"train_fox", NULL};
            parse_args(&a, 1, (char**)argv);
            TrainState s = train_state(3, &d, &sched, 24, &a);
            dataloader_free(&d);
            snprintf(path, sizeof(path), "%s/no_moments.bin", state_dir);
            save_state(&m, &s, path);
            AdamWConfig opt = {1e-3f, 0.1f, 0.9f, 0.95f, 1e-8f, 1.0f};
            fox_update(&m, &opt, 1e-3f, 1);
            snprintf(path, sizeof(path), "%s/moments.bin", state_dir);
            save_state(&m, &s, path);
            fp8_setup(&m, FP8_MODE_HYBRID); // -q: the FP8 amax histories after the moments
            for (size_t i = 0; i < (size_t)FP8_SLOTS * FP8_HISTORY; i++) { m.fp8.history[i] = 0.25f * (float)i; }
            m.fp8.calibrated = 1;
            m.fp8.pos = 3;
            snprintf(path, sizeof(path), "%s/fp8_histories.bin", state_dir);
            save_state(&m, &s, path);
        }
        fox_free(&m);
    }
}

static void decode_table_seeds(const char* dir) {
    const char* tokens[] = {"a", "bc", "\n", "\xe2\x82", "<|endoftext|>"};
    unsigned char buf[1024 + 64] = {0};
    uint32_t header[4] = {20240328, 2, 5, 4};
    memcpy(buf, header, sizeof(header));
    size_t n = 1024;
    for (int i = 0; i < 5; i++) {
        buf[n++] = (unsigned char)strlen(tokens[i]);
        memcpy(buf + n, tokens[i], strlen(tokens[i]));
        n += strlen(tokens[i]);
    }
    write_bytes(dir, "five_tokens.bin", buf, n);
}

static void command_line_seeds(const char* dir) {
    // NUL-separated arguments after the program name
    static const char a[] = "-e\0fox-pro-tiny\0--n_layer\0001\0--n_embd\08\0--n_head\0002\0--vocab_size\00016";
    static const char b[] = "-e\0transformer-llama-tiny\0--n_layer\0001\0--n_embd\00016\0--n_head\0002\0--mlp_hidden\0008\0--vocab_size\0002\0--rope\0001\0--window\0004";
    static const char c[] = "-b\0002\0-t\00016\0-l\0001e-3\0-G\0skip\0-Z\0003.5\0-k\0linear\0-y\0001\0-o\0dir\0--n_layer\0001\0--n_embd\0008\0--vocab_size\00016\0--gate\0bias_only";
    write_bytes(dir, "fox.args", a, sizeof(a) - 1);
    write_bytes(dir, "transformer.args", b, sizeof(b) - 1);
    write_bytes(dir, "flags.args", c, sizeof(c) - 1);
}

static void ranks_seeds(const char* dir, const char* ranks_path) {
    FILE* f = fopen_check(ranks_path, "rb");
    long n = file_size_check(f, ranks_path);
    char* buf = (char*)malloc_check((size_t)n, "ranks");
    fread_check(buf, 1, (size_t)n, f, ranks_path);
    fclose(f);
    write_bytes(dir, "r50k_base.tiktoken", buf, (size_t)n);
    free(buf);
}

int main(int argc, char** argv) {
    if (argc != 3) { fail("usage: make_seeds <dir> <ranks file>\nHINT: make fuzz runs it"); }
    char shard[4096], model[4096], state[4096], table[4096], cli[4096], ranks[4096];
    seed_dir(shard, sizeof(shard), argv[1], "shard");
    seed_dir(model, sizeof(model), argv[1], "model");
    seed_dir(state, sizeof(state), argv[1], "state");
    seed_dir(table, sizeof(table), argv[1], "decode_table");
    seed_dir(cli, sizeof(cli), argv[1], "command_line");
    seed_dir(ranks, sizeof(ranks), argv[1], "ranks");
    shard_seeds(shard);
    checkpoint_seeds(model, state);
    decode_table_seeds(table);
    command_line_seeds(cli);
    ranks_seeds(ranks, argv[2]);
    return 0;
}
