/*
The C side of the tokenizer oracle test (data/oracle_test.mjs): encodes each input file as one
document and writes FILE.ids (the token ids, uint32 little-endian) and FILE.dec (the ids decoded
back to bytes). With -t it prints the encoder's speed on the inputs instead.

usage: build/tokenizer_oracle_ids [-t] RANKS FILE...
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gpt2_bpe.h"

static void fail(const char *what, const char *path) {
    fprintf(stderr, "Error: cannot %s %s: %s\nHINT: check the path and the disk\n", what, path, strerror(errno));
    exit(EXIT_FAILURE);
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail("open", path);
    size_t cap = 1 << 16, n = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    if (!buf || ferror(f)) fail("read", path);
    fclose(f);
    *len = n;
    return buf;
}

static void write_file(const char *path, const char *suffix, const void *data, size_t len) {
    char name[4096];
    snprintf(name, sizeof(name), "%s%s", path, suffix);
    FILE *f = fopen(name, "wb");
    if (!f) fail("create", name);
    if ((len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) fail("write", name);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv) {
    int timing = argc > 1 && strcmp(argv[1], "-t") == 0;
    if (argc < 3 + timing) {
        fprintf(stderr, "usage: %s [-t] RANKS FILE...\n", argv[0]);
        return EXIT_FAILURE;
    }
    GPT2BPE t;
    gpt2_bpe_load(&t, argv[1 + timing]);
    GPT2Worker w;
    gpt2_worker_init(&w, &t);
    GPT2Ids ids = {0};
    size_t total_bytes = 0, total_tokens = 0;
    double seconds = 0;
    for (int i = 2 + timing; i < argc; i++) {
        size_t len;
        uint8_t *text = read_file(argv[i], &len);
        ids.len = 0;
        double t0 = now_s();
        gpt2_encode(&w, text, len, &ids);
        seconds += now_s() - t0;
        total_bytes += len;
        total_tokens += ids.len;
        if (!timing) {
            size_t dec_len;
            uint8_t *dec = gpt2_decode(&t, ids.ids, ids.len, &dec_len);
            write_file(argv[i], ".ids", ids.ids, ids.len * sizeof(uint32_t)); // native order, read back on this machine
            write_file(argv[i], ".dec", dec, dec_len);
            free(dec);
        }
        free(text);
    }
    if (timing) {
        printf("encoded %zu bytes into %zu tokens in %.3f s: %.2f M tokens/s, %.1f MB/s (1 thread)\n",
               total_bytes, total_tokens, seconds, total_tokens / seconds / 1e6, total_bytes / seconds / 1e6);
    }
    gpt2_ids_free(&ids);
    gpt2_worker_free(&w);
    gpt2_bpe_free(&t);
    return 0;
}
