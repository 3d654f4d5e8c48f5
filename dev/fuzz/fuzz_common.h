/*
Shared by the fuzz harnesses (dev/fuzz/fuzz_<reader>.c, built by `make fuzz`).

Under FOX_TEST_HOOKS a reader's error longjmps back to the harness (fail() in train_fox.c jumps to
fuzz_fail_jump once test_hooks.fail_jump points there; die() in data/gpt2_bpe.c to fuzz_die_jump), skipping the frees and fcloses a normal run leaves to exit(). So the
harness includes this file before the code under test: it routes that code's allocations and
fopens through lists, and after each input releases whatever an error left behind. On inputs
that read fine it checks that the reader's own free function released everything (a leak).
Include it before the code under test: it includes that code's system headers first, so that
its macros (at the end) rename only the calls, never a declaration.
*/
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// where fail() returns to (the harness sets test_hooks.fail_jump to it)
static jmp_buf fuzz_fail_jump;

// every live allocation of the code under test sits behind one of these links
typedef struct FuzzBlock {
    struct FuzzBlock* prev;
    struct FuzzBlock* next;
} __attribute__((aligned(16))) FuzzBlock;
static FuzzBlock fuzz_blocks = {&fuzz_blocks, &fuzz_blocks};

static void* fuzz_link(FuzzBlock* b) {
    if (b == NULL) { return NULL; }
    b->next = fuzz_blocks.next; b->prev = &fuzz_blocks;
    fuzz_blocks.next->prev = b; fuzz_blocks.next = b;
    return b + 1;
}

static FuzzBlock* fuzz_unlink(void* p) {
    FuzzBlock* b = (FuzzBlock*)p - 1;
    b->prev->next = b->next; b->next->prev = b->prev;
    return b;
}

static void* fuzz_malloc(size_t n) {
    if (n > SIZE_MAX - sizeof(FuzzBlock)) { return NULL; }
    return fuzz_link((FuzzBlock*)malloc(sizeof(FuzzBlock) + n));
}

static void* fuzz_calloc(size_t count, size_t size) {
    if (size != 0 && count > (SIZE_MAX - sizeof(FuzzBlock)) / size) { return NULL; }
    return fuzz_link((FuzzBlock*)calloc(1, sizeof(FuzzBlock) + count * size));
}

static void* fuzz_realloc(void* p, size_t n) {
    if (p == NULL) { return fuzz_malloc(n); }
    if (n > SIZE_MAX - sizeof(FuzzBlock)) { return NULL; }
    FuzzBlock* old = fuzz_unlink(p);
    FuzzBlock* b = (FuzzBlock*)realloc(old, sizeof(FuzzBlock) + n);
    if (b == NULL) { fuzz_link(old); return NULL; } // realloc failing leaves p as it was
    return fuzz_link(b);
}

static void fuzz_free(void* p) {
    if (p != NULL) { free(fuzz_unlink(p)); }
}

static char* fuzz_strdup(const char* s) {
    size_t n = strlen(s) + 1;
    char* p = (char*)fuzz_malloc(n);
    if (p != NULL) { memcpy(p, s, n); }
    return p;
}

#define FUZZ_MAX_FILES 64
static FILE* fuzz_files[FUZZ_MAX_FILES];

static FILE* fuzz_fopen(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    for (int i = 0; f != NULL && i < FUZZ_MAX_FILES; i++) {
        if (fuzz_files[i] == NULL) { fuzz_files[i] = f; return f; }
    }
    if (f != NULL) { abort(); } // more open files than any reader needs: a leak
    return f;
}

static int fuzz_fclose(FILE* f) {
    for (int i = 0; i < FUZZ_MAX_FILES; i++) {
        if (fuzz_files[i] == f) { fuzz_files[i] = NULL; }
    }
    return fclose(f);
}

// what is still allocated or open
static int fuzz_live(void) {
    int n = fuzz_blocks.next != &fuzz_blocks;
    for (int i = 0; i < FUZZ_MAX_FILES; i++) { n += fuzz_files[i] != NULL; }
    return n;
}

// after an input that failed: free and close what the error left behind
static void fuzz_release(void) {
    while (fuzz_blocks.next != &fuzz_blocks) { fuzz_free(fuzz_blocks.next + 1); }
    for (int i = 0; i < FUZZ_MAX_FILES; i++) {
        if (fuzz_files[i] != NULL) { fclose(fuzz_files[i]); fuzz_files[i] = NULL; }
    }
}

// after an input that read fine and was freed by the reader's own functions
static void fuzz_expect_nothing_live(const char* what) {
    if (fuzz_live()) {
        fprintf(stderr, "fuzz: %s left memory allocated or a file open after freeing\n", what);
        abort();
    }
}

// writes the input to a file of this process, for the readers that take a path
static const char* fuzz_write_input(const char* name, const uint8_t* data, size_t size) {
    static char path[256];
    snprintf(path, sizeof(path), "/tmp/fuzz_%d_%s", (int)getpid(), name);
    FILE* f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) { abort(); }
    return path;
}

#define malloc(n) fuzz_malloc(n)
#define calloc(n, s) fuzz_calloc(n, s)
#define realloc(p, n) fuzz_realloc(p, n)
#define free(p) fuzz_free(p)
#define strdup(s) fuzz_strdup(s)
#define fopen(p, m) fuzz_fopen(p, m)
#define fclose(f) fuzz_fclose(f)
