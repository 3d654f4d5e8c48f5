// The two token shards the state fuzzer's data loader reads (40 and 24 tokens below the vocabulary
// of 16), written by the fuzzer and by make_seeds alike: a state's shard identity covers the shards'
// file names and sizes, so seeds written for these shards resume on them.
static void write_state_shards(const char* dir) {
    uint16_t tokens[40];
    for (int i = 0; i < 40; i++) { tokens[i] = (uint16_t)(i % 16); }
    mkdir(dir, 0755);
    for (int s = 0; s < 2; s++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/state_shard_%d.bin", dir, s);
        int header[256] = {SHARD_MAGIC, SHARD_VERSION, s == 0 ? 40 : 24};
        FILE* f = fopen(path, "wb");
        if (f == NULL || fwrite(header, sizeof(int), 256, f) != 256
            || fwrite(tokens, 2, (size_t)header[2], f) != (size_t)header[2]) {
            abort();
        }
        fclose(f);
    }
}
