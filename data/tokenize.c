/*
Tokenizes text files and JSONL files with GPT-2's tokenizer into llm.c token shards.

    build/tokenize -o data/mine/mine -v held_out.txt a.txt b.jsonl ...

Every document is preceded by <|endoftext|> (50256). A text file is one document; a JSONL file
has one document per line, {"text": "..."} (other fields are ignored). Shards are
PREFIX_train_000000.bin, ... and PREFIX_val_000000.bin, ...: a header of 256 int32 (20240520,
1, token count), then the tokens as uint16. Each shard is written under a temporary name and
renamed when complete. Documents are encoded in parallel with OpenMP (OMP_NUM_THREADS).

Other modes:
    build/tokenize --decode-table data/gpt2_tokenizer.bin   llm.c's decode table
    build/tokenize --check SHARD...                          validate shards, count tokens
*/
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "gpt2_bpe.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shards are little-endian and are written as they are in memory"
#endif

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256
#define DEFAULT_SHARD_TOKENS 100000000 // llm.c's FineWeb shards hold 10^8 tokens
#define MAX_SHARD_TOKENS 2147483647    // the header keeps the count in an int32
#define BATCH_BYTES (64u << 20)        // text encoded in parallel at a time
#define MAX_JSON_DEPTH 512

// ----------------------------------------------------------------------------
// errors

static void die(const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "Error: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nHINT: %s\n", hint);
    exit(EXIT_FAILURE);
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die("free memory, or split the input into smaller files", "out of memory allocating %zu bytes", n);
    return q;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// ----------------------------------------------------------------------------
// shard writer: PREFIX_SPLIT_%06d.bin, written as .tmp and renamed when complete

typedef struct {
    const char *prefix, *split;
    size_t shard_tokens;  // tokens per shard (the last one may hold fewer)
    FILE *f;              // the shard being written, or NULL
    char path[4096], tmp[4100];
    uint16_t buf[1 << 16];
    size_t buf_len, in_shard, tokens, docs;
    int shards;           // completed shards
} ShardWriter;

static ShardWriter *open_writers[2]; // removed at exit if still half-written

static void remove_half_written(void) {
    for (int i = 0; i < 2; i++) {
        if (open_writers[i] && open_writers[i]->f) {
            fclose(open_writers[i]->f);
            remove(open_writers[i]->tmp);
        }
    }
}

static void shard_name(const ShardWriter *w, int index, char *out, size_t cap) {
    if (snprintf(out, cap, "%s_%s_%06d.bin", w->prefix, w->split, index) >= (int)cap) {
        die("use a shorter -o prefix", "output path too long: %s", w->prefix);
    }
}

static void writer_fail(const ShardWriter *w) {
    die("check that the output folder is writable and that the disk has space",
        "cannot write shard %s: %s", w->tmp, strerror(errno));
}

static void writer_flush(ShardWriter *w) {
    if (w->buf_len && fwrite(w->buf, sizeof(uint16_t), w->buf_len, w->f) != w->buf_len) writer_fail(w);
    w->buf_len = 0;
}

static void writer_open(ShardWriter *w) {
    shard_name(w, w->shards, w->path, sizeof(w->path));
    snprintf(w->tmp, sizeof(w->tmp), "%s.tmp", w->path);
    w->f = fopen(w->tmp, "wb");
    if (!w->f) writer_fail(w);
    int32_t header[SHARD_HEADER_INTS] = {0}; // the count is filled in on close
    if (fwrite(header, sizeof(header), 1, w->f) != 1) writer_fail(w);
    w->in_shard = 0;
}

static void writer_close(ShardWriter *w) {
    writer_flush(w);
    int32_t header[SHARD_HEADER_INTS] = {SHARD_MAGIC, SHARD_VERSION, (int32_t)w->in_shard};
    if (fseek(w->f, 0, SEEK_SET) != 0 || fwrite(header, sizeof(header), 1, w->f) != 1) writer_fail(w);
    FILE *f = w->f;
    w->f = NULL;
    if (fclose(f) != 0 || rename(w->tmp, w->path) != 0) {
        int e = errno;
        remove(w->tmp);
        errno = e;
        writer_fail(w);
    }
    w->shards++;
}

static void writer_put(ShardWriter *w, const uint32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!w->f) writer_open(w);
        if (ids[i] > UINT16_MAX) {
            die("shards store uint16 tokens; this vocabulary does not fit", "token id %u does not fit uint16 in shard %s", ids[i], w->path);
        }
        w->buf[w->buf_len++] = (uint16_t)ids[i];
        w->in_shard++;
        if (w->buf_len == sizeof(w->buf) / sizeof(w->buf[0])) writer_flush(w);
        if (w->in_shard == w->shard_tokens) writer_close(w);
    }
    w->tokens += n;
}

// shards of an earlier run beyond this run's last one would silently join the data set
static void writer_finish(ShardWriter *w) {
    if (w->f) writer_close(w);
    char path[4096];
    for (int i = w->shards;; i++) {
        shard_name(w, i, path, sizeof(path));
        if (remove(path) != 0) break;
        printf("removed stale %s (from an earlier run)\n", path);
    }
}

// ----------------------------------------------------------------------------
// JSONL: one object per line; we take the string field "text"

typedef struct {
    uint8_t *p;
    size_t len, cap;
} Bytes;

static void bytes_put(Bytes *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = 2 * (b->len + n) + 1024;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

typedef struct {
    const uint8_t *p, *end;
    const char *err; // what went wrong, for the message
} Json;

static void json_ws(Json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int json_fail(Json *j, const char *err) {
    j->err = err;
    return 0;
}

static void put_utf8(Bytes *out, uint32_t c) {
    uint8_t b[4];
    size_t n;
    if (c < 0x80) b[0] = (uint8_t)c, n = 1;
    else if (c < 0x800) b[0] = 0xC0 | c >> 6, b[1] = 0x80 | (c & 63), n = 2;
    else if (c < 0x10000) b[0] = 0xE0 | c >> 12, b[1] = 0x80 | (c >> 6 & 63), b[2] = 0x80 | (c & 63), n = 3;
    else b[0] = 0xF0 | c >> 18, b[1] = 0x80 | (c >> 12 & 63), b[2] = 0x80 | (c >> 6 & 63), b[3] = 0x80 | (c & 63), n = 4;
    bytes_put(out, b, n);
}

static int json_hex4(Json *j, uint32_t *v) {
    if (j->end - j->p < 4) return json_fail(j, "truncated \\u escape");
    *v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = j->p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
        if (d < 0) return json_fail(j, "bad hex digit in \\u escape");
        *v = *v << 4 | (uint32_t)d;
    }
    j->p += 4;
    return 1;
}

// \uXXXX, with surrogate pairs; a lone surrogate becomes U+FFFD, as tiktoken does in Python
static int json_unicode_escape(Json *j, Bytes *out) {
    uint32_t c;
    if (!json_hex4(j, &c)) return 0;
    if (c >= 0xD800 && c <= 0xDBFF && j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u') {
        Json look = *j;
        look.p += 2;
        uint32_t low;
        if (json_hex4(&look, &low) && low >= 0xDC00 && low <= 0xDFFF) {
            c = 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00);
            j->p = look.p;
        }
    }
    if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD;
    if (out) put_utf8(out, c);
    return 1;
}

// the string at j->p (which is at its opening quote), decoded into out unless that is NULL
static int json_string(Json *j, Bytes *out) {
    j->p++;
    for (;;) {
        const uint8_t *run = j->p;
        while (j->p < j->end && *j->p != '"' && *j->p != '\\' && *j->p >= 0x20) j->p++;
        if (out) bytes_put(out, run, (size_t)(j->p - run));
        if (j->p == j->end) return json_fail(j, "unterminated string");
        uint8_t c = *j->p++;
        if (c == '"') return 1;
        if (c < 0x20) return json_fail(j, "control character in a string (must be escaped)");
        if (j->p == j->end) return json_fail(j, "unterminated escape");
        uint8_t e = *j->p++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            uint8_t v = (uint8_t)"\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            if (out) bytes_put(out, &v, 1);
        } else if (e == 'u') {
            if (!json_unicode_escape(j, out)) return 0;
        } else {
            return json_fail(j, "unknown escape");
        }
    }
}

static int json_literal(Json *j, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0) return json_fail(j, "unexpected character");
    j->p += n;
    return 1;
}

static int json_skip_value(Json *j, int depth);

// an object's members; when text is not NULL, the last string member "text" goes there
static int json_object(Json *j, int depth, Bytes *text, int *found) {
    Bytes key = {0};
    j->p++;
    json_ws(j);
    int ok = 1;
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return 1;
    }
    while (ok) {
        key.len = 0;
        json_ws(j);
        if (j->p == j->end || *j->p != '"') { ok = json_fail(j, "expected a \"key\""); break; }
        if (!(ok = json_string(j, &key))) break;
        json_ws(j);
        if (j->p == j->end || *j->p != ':') { ok = json_fail(j, "expected ':'"); break; }
        j->p++;
        json_ws(j);
        if (text && key.len == 4 && memcmp(key.p, "text", 4) == 0) {
            if (j->p == j->end || *j->p != '"') { ok = json_fail(j, "\"text\" is not a string"); break; }
            text->len = 0;
            ok = json_string(j, text);
            *found = 1;
        } else {
            ok = json_skip_value(j, depth + 1);
        }
        json_ws(j);
        if (!ok || j->p == j->end) { ok = ok && json_fail(j, "unterminated object"); break; }
        if (*j->p == '}') { j->p++; break; }
        if (*j->p != ',') { ok = json_fail(j, "expected ',' or '}'"); break; }
        j->p++;
    }
    free(key.p);
    return ok;
}

static int json_array(Json *j, int depth) {
    j->p++;
    json_ws(j);
    if (j->p < j->end && *j->p == ']') {
        j->p++;
        return 1;
    }
    for (;;) {
        if (!json_skip_value(j, depth + 1)) return 0;
        json_ws(j);
        if (j->p == j->end) return json_fail(j, "unterminated array");
        if (*j->p == ']') { j->p++; return 1; }
        if (*j->p != ',') return json_fail(j, "expected ',' or ']'");
        j->p++;
    }
}

static int json_skip_value(Json *j, int depth) {
    if (depth > MAX_JSON_DEPTH) return json_fail(j, "nested too deeply");
    json_ws(j);
    if (j->p == j->end) return json_fail(j, "missing value");
    uint8_t c = *j->p;
    if (c == '{') return json_object(j, depth, NULL, NULL);
    if (c == '[') return json_array(j, depth);
    if (c == '"') return json_string(j, NULL);
    if (c == 't') return json_literal(j, "true");
    if (c == 'f') return json_literal(j, "false");
    if (c == 'n') return json_literal(j, "null");
    if (c == '-' || (c >= '0' && c <= '9')) {
        while (j->p < j->end && *j->p && strchr("0123456789+-.eE", *j->p)) j->p++;
        return 1;
    }
    return json_fail(j, "unexpected character");
}

// the "text" of one JSONL line into text; returns 1, or 0 with j->err set
static int json_text_field(const uint8_t *line, size_t n, Bytes *text, Json *j) {
    j->p = line;
    j->end = line + n;
    j->err = NULL;
    json_ws(j);
    if (j->p == j->end || *j->p != '{') return json_fail(j, "a line must be a JSON object");
    int found = 0;
    if (!json_object(j, 0, text, &found)) return 0;
    json_ws(j);
    if (j->p != j->end) return json_fail(j, "text after the object");
    if (!found) return json_fail(j, "no \"text\" field");
    return 1;
}

// ----------------------------------------------------------------------------
// a batch of documents, encoded in parallel

typedef struct {
    size_t off, len;       // in the batch's text
    int val;               // goes to the validation split
    int thread;            // its tokens are out[thread].ids[ids_off .. ids_off + n_ids)
    size_t ids_off, n_ids;
} Doc;

typedef struct {
    Bytes text;
    Doc *docs;
    size_t *order;         // documents by decreasing length, for load balance
    size_t n_docs, docs_cap;
} Batch;

typedef struct {
    const GPT2BPE *t;
    GPT2Worker *workers;   // (n_workers,) one per OpenMP thread
    GPT2Ids *out;          // (n_workers,) the tokens each thread encoded in this batch
    int n_workers;
    Batch batch;
    ShardWriter train, val;
    size_t val_docs_left;  // -n: documents still to send to validation
    size_t bytes_read, empty_docs;
    double t_start, t_encode, t_last_print;
    int quiet;
} Run;

static const Doc *sort_docs; // qsort has no context argument
static int longer_first(const void *a, const void *b) {
    size_t la = sort_docs[*(const size_t *)a].len, lb = sort_docs[*(const size_t *)b].len;
    return la < lb ? 1 : la > lb ? -1 : 0;
}

static void encode_batch(Run *r) {
    Batch *b = &r->batch;
    b->order = xrealloc(b->order, b->n_docs * sizeof(size_t));
    for (size_t i = 0; i < b->n_docs; i++) b->order[i] = i;
    sort_docs = b->docs;
    qsort(b->order, b->n_docs, sizeof(size_t), longer_first);
    for (int i = 0; i < r->n_workers; i++) r->out[i].len = 0;
    double t0 = now_s();
    long n = (long)b->n_docs;
    #pragma omp parallel for schedule(dynamic, 1)
    for (long k = 0; k < n; k++) {
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        Doc *d = &b->docs[b->order[k]];
        GPT2Ids out = r->out[thread]; // a local copy: neighbouring threads' entries share a cache line
        d->thread = thread;
        d->ids_off = out.len;
        gpt2_encode(&r->workers[thread], b->text.p + d->off, d->len, &out);
        d->n_ids = out.len - d->ids_off;
        r->out[thread] = out;
    }
    r->t_encode += now_s() - t0;
}

static void print_progress(Run *r, int last) {
    double t = now_s();
    if (r->quiet || (!last && t - r->t_last_print < 1.0)) return;
    r->t_last_print = t;
    size_t tokens = r->train.tokens + r->val.tokens;
    printf("%s%.1f MB read, %zu tokens (train %zu, val %zu), %.2f M tokens/s\n", last ? "done: " : "",
           r->bytes_read / 1e6, tokens, r->train.tokens, r->val.tokens, tokens / (t - r->t_start) / 1e6);
    fflush(stdout);
}

static void flush_batch(Run *r) {
    Batch *b = &r->batch;
    if (b->n_docs == 0) return;
    encode_batch(r);
    const uint32_t eot = GPT2_EOT;
    for (size_t i = 0; i < b->n_docs; i++) {
        const Doc *d = &b->docs[i];
        ShardWriter *w = d->val ? &r->val : &r->train;
        writer_put(w, &eot, 1);
        writer_put(w, r->out[d->thread].ids + d->ids_off, d->n_ids);
        w->docs++;
    }
    r->bytes_read += b->text.len;
    b->text.len = 0;
    b->n_docs = 0;
    print_progress(r, 0);
}

// the batch's text from off to its end becomes one document
static void end_doc(Run *r, size_t off, int val) {
    Batch *b = &r->batch;
    if (b->text.len == off) {
        r->empty_docs++;
        return;
    }
    if (!val && r->val_docs_left) {
        val = 1;
        r->val_docs_left--;
    }
    if (b->n_docs == b->docs_cap) {
        b->docs_cap = b->docs_cap ? 2 * b->docs_cap : 1024;
        b->docs = xrealloc(b->docs, b->docs_cap * sizeof(Doc));
    }
    b->docs[b->n_docs++] = (Doc){.off = off, .len = b->text.len - off, .val = val};
    if (b->text.len >= BATCH_BYTES) flush_batch(r);
}

// ----------------------------------------------------------------------------
// inputs

typedef struct {
    const char *path;
    int val, jsonl;
} Input;

static void check_input(const Input *in) {
    struct stat st;
    if (stat(in->path, &st) != 0) die("check the path", "cannot read input %s: %s", in->path, strerror(errno));
    if (!S_ISREG(st.st_mode)) die("pass regular files", "input %s is not a regular file", in->path);
    if (st.st_size == 0) die("remove it from the inputs", "input %s is empty", in->path);
    FILE *f = fopen(in->path, "rb");
    if (!f) die("check the file's permissions", "cannot open input %s: %s", in->path, strerror(errno));
    uint8_t magic[2] = {0};
    size_t got = fread(magic, 1, 2, f);
    fclose(f);
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        die("decompress it first, e.g. zcat FILE.gz > FILE", "input %s is gzip-compressed", in->path);
    }
}

static FILE *open_input(const Input *in) {
    FILE *f = fopen(in->path, "rb");
    if (!f) die("check the file's permissions", "cannot open input %s: %s", in->path, strerror(errno));
    return f;
}

static void read_error(const Input *in) {
    die("check the file and the disk", "cannot read input %s: %s", in->path, strerror(errno));
}

static void read_text_file(Run *r, const Input *in) {
    FILE *f = open_input(in);
    Bytes *text = &r->batch.text;
    size_t off = text->len, got;
    uint8_t chunk[1 << 16];
    while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0) bytes_put(text, chunk, got);
    if (ferror(f)) read_error(in);
    fclose(f);
    end_doc(r, off, in->val);
}

static void read_jsonl_file(Run *r, const Input *in) {
    FILE *f = open_input(in);
    char *line = NULL;
    size_t cap = 0, line_no = 0, docs = 0;
    ssize_t n;
    Bytes text = {0};
    Json j;
    while ((n = getline(&line, &cap, f)) >= 0) {
        line_no++;
        j.p = (const uint8_t *)line;
        j.end = j.p + n;
        json_ws(&j);
        if (j.p == j.end) continue; // blank line
        if (!json_text_field((const uint8_t *)line, (size_t)n, &text, &j)) {
            die("each line must be a JSON object with a string field \"text\"",
                "%s:%zu: invalid JSONL at column %zu: %s", in->path, line_no, (size_t)(j.p - (const uint8_t *)line) + 1, j.err);
        }
        size_t off = r->batch.text.len;
        bytes_put(&r->batch.text, text.p, text.len);
        end_doc(r, off, in->val);
        docs++;
    }
    if (ferror(f)) read_error(in);
    fclose(f);
    free(line);
    free(text.p);
    if (docs == 0) die("remove it from the inputs", "input %s has no JSON lines", in->path);
}

// ----------------------------------------------------------------------------
// --check: validate shards

static int check_shard(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "Error: cannot open shard %s: %s\n", path, strerror(errno));
        return 0;
    }
    int32_t header[SHARD_HEADER_INTS];
    struct stat st;
    int ok = fread(header, sizeof(header), 1, f) == 1 && fstat(fileno(f), &st) == 0;
    if (!ok || header[0] != SHARD_MAGIC || header[1] != SHARD_VERSION || header[2] < 0) {
        fprintf(stderr, "Error: %s is not an llm.c token shard (magic %d, version %d expected)\n", path, SHARD_MAGIC, SHARD_VERSION);
        fclose(f);
        return 0;
    }
    size_t count = (size_t)header[2], expect = sizeof(header) + 2 * count;
    if ((size_t)st.st_size != expect) {
        fprintf(stderr, "Error: %s has %zu bytes, its header says %zu tokens = %zu bytes\n", path, (size_t)st.st_size, count, expect);
        fclose(f);
        return 0;
    }
    uint16_t buf[1 << 16];
    size_t got, docs = 0, seen = 0, too_big = 0;
    while ((got = fread(buf, sizeof(uint16_t), sizeof(buf) / sizeof(buf[0]), f)) > 0) {
        for (size_t i = 0; i < got; i++) {
            docs += buf[i] == GPT2_EOT;
            too_big += buf[i] >= GPT2_VOCAB_SIZE;
        }
        seen += got;
    }
    fclose(f);
    if (seen != count || too_big) {
        fprintf(stderr, "Error: %s: read %zu of %zu tokens, %zu of them >= %d\n", path, seen, count, too_big, GPT2_VOCAB_SIZE);
        return 0;
    }
    printf("%s: %zu tokens, %zu documents (EOT)\n", path, count, docs);
    return 1;
}

// ----------------------------------------------------------------------------

static void usage(void) {
    fprintf(stderr,
        "usage: build/tokenize [options] FILE...      tokenize into llm.c shards\n"
        "       build/tokenize --decode-table OUT      write llm.c's GPT-2 decode table\n"
        "       build/tokenize --check SHARD...        validate shards, print token counts\n"
        "options:\n"
        "  -o PREFIX  output prefix (required): PREFIX_train_000000.bin, PREFIX_val_000000.bin, ...\n"
        "  -v FILE    an input whose documents go to the validation split (repeatable)\n"
        "  -n N       the first N documents of the other inputs go to validation too (default 0)\n"
        "  -s N       tokens per shard (default %d, at most %d)\n"
        "  -f FORMAT  text (a file is one document) or jsonl (one {\"text\": ...} per line);\n"
        "             default: jsonl for *.jsonl, else text\n"
        "  -r FILE    GPT-2 merge ranks (default %s)\n"
        "  -q         no progress lines\n"
        "threads: OMP_NUM_THREADS\n", DEFAULT_SHARD_TOKENS, MAX_SHARD_TOKENS, GPT2_DEFAULT_RANKS);
    exit(EXIT_FAILURE);
}

static size_t parse_count(const char *flag, const char *s, size_t max) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || s[0] == '-' || v > max) {
        die("pass a whole number in range", "%s %s: expected a whole number from 0 to %zu", flag, s, max);
    }
    return (size_t)v;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void check_output_folder(const char *prefix) {
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", prefix);
    char *slash = strrchr(dir, '/');
    if (!slash) return;
    *slash = 0;
    struct stat st;
    if (dir[0] && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        die("create it first: mkdir -p FOLDER", "output folder %s does not exist", dir);
    }
}

static void run_tokenize(const char *ranks, const char *prefix, Input *inputs, int n_inputs,
                         size_t shard_tokens, size_t val_docs, int quiet) {
    check_output_folder(prefix);
    for (int i = 0; i < n_inputs; i++) check_input(&inputs[i]);
    static Run r; // large: the writers' buffers
    GPT2BPE t;
    gpt2_bpe_load(&t, ranks);
    r.t = &t;
    r.n_workers = 1;
#ifdef _OPENMP
    r.n_workers = omp_get_max_threads();
#endif
    r.workers = xrealloc(NULL, (size_t)r.n_workers * sizeof(GPT2Worker));
    r.out = calloc((size_t)r.n_workers, sizeof(GPT2Ids));
    if (!r.out) die("free memory", "out of memory");
    for (int i = 0; i < r.n_workers; i++) gpt2_worker_init(&r.workers[i], &t);
    r.train = (ShardWriter){.prefix = prefix, .split = "train", .shard_tokens = shard_tokens};
    r.val = (ShardWriter){.prefix = prefix, .split = "val", .shard_tokens = shard_tokens};
    open_writers[0] = &r.train;
    open_writers[1] = &r.val;
    atexit(remove_half_written);
    r.val_docs_left = val_docs;
    r.quiet = quiet;
    r.t_start = r.t_last_print = now_s();
    printf("tokenizing %d input%s with %d thread%s into %s_{train,val}_*.bin\n",
           n_inputs, n_inputs == 1 ? "" : "s", r.n_workers, r.n_workers == 1 ? "" : "s", prefix);
    for (int i = 0; i < n_inputs; i++) {
        if (inputs[i].jsonl) read_jsonl_file(&r, &inputs[i]);
        else read_text_file(&r, &inputs[i]);
    }
    flush_batch(&r);
    writer_finish(&r.train);
    writer_finish(&r.val);
    print_progress(&r, 1);
    double total = now_s() - r.t_start;
    size_t tokens = r.train.tokens + r.val.tokens;
    printf("train: %zu documents, %zu tokens in %d shard%s\n", r.train.docs, r.train.tokens, r.train.shards, r.train.shards == 1 ? "" : "s");
    printf("val:   %zu documents, %zu tokens in %d shard%s\n", r.val.docs, r.val.tokens, r.val.shards, r.val.shards == 1 ? "" : "s");
    printf("encoder: %.2f M tokens/s on %d thread%s (%.2f s encoding, %.2f s in all)\n",
           tokens / r.t_encode / 1e6, r.n_workers, r.n_workers == 1 ? "" : "s", r.t_encode, total);
    if (r.empty_docs) printf("skipped %zu empty documents\n", r.empty_docs);
    if (r.val.docs == 0) printf("warning: no validation documents (use -v FILE or -n N)\n");
    if (r.train.docs == 0) printf("warning: no training documents\n");
    for (int i = 0; i < r.n_workers; i++) {
        gpt2_worker_free(&r.workers[i]);
        gpt2_ids_free(&r.out[i]);
    }
    free(r.workers);
    free(r.out);
    free(r.batch.text.p);
    free(r.batch.docs);
    free(r.batch.order);
    gpt2_bpe_free(&t);
}

int main(int argc, char **argv) {
    const char *ranks = GPT2_DEFAULT_RANKS, *prefix = NULL, *format = NULL;
    size_t shard_tokens = DEFAULT_SHARD_TOKENS, val_docs = 0;
    int quiet = 0, n_inputs = 0;
    if (argc >= 2 && strcmp(argv[1], "--check") == 0) {
        if (argc < 3) usage();
        int ok = 1;
        for (int i = 2; i < argc; i++) ok &= check_shard(argv[i]);
        if (!ok) fprintf(stderr, "HINT: regenerate the shards (make data, or build/tokenize)\n");
        return ok ? EXIT_SUCCESS : EXIT_FAILURE;
    }
    const char *decode_table = NULL;
    Input *inputs = xrealloc(NULL, (size_t)argc * sizeof(Input));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(a, "--decode-table") == 0 && has_value) decode_table = argv[++i];
        else if (strcmp(a, "-o") == 0 && has_value) prefix = argv[++i];
        else if (strcmp(a, "-r") == 0 && has_value) ranks = argv[++i];
        else if (strcmp(a, "-s") == 0 && has_value) shard_tokens = parse_count("-s", argv[++i], MAX_SHARD_TOKENS);
        else if (strcmp(a, "-n") == 0 && has_value) val_docs = parse_count("-n", argv[++i], SIZE_MAX);
        else if (strcmp(a, "-f") == 0 && has_value) format = argv[++i];
        else if (strcmp(a, "-v") == 0 && has_value) inputs[n_inputs++] = (Input){argv[++i], 1, 0};
        else if (strcmp(a, "-q") == 0) quiet = 1;
        else if (a[0] == '-') usage();
        else inputs[n_inputs++] = (Input){a, 0, 0};
    }
    if (decode_table) {
        GPT2BPE t;
        gpt2_bpe_load(&t, ranks);
        gpt2_write_decode_table(&t, decode_table);
        gpt2_bpe_free(&t);
        printf("wrote %s (%d tokens, EOT %d)\n", decode_table, GPT2_VOCAB_SIZE, GPT2_EOT);
        free(inputs);
        return EXIT_SUCCESS;
    }
    if (!prefix || n_inputs == 0) usage();
    if (shard_tokens == 0) die("pass -s 1 or more", "-s 0: a shard must hold at least one token");
    if (format && strcmp(format, "text") != 0 && strcmp(format, "jsonl") != 0) {
        die("use -f text or -f jsonl", "unknown format -f %s", format);
    }
    for (int i = 0; i < n_inputs; i++) {
        inputs[i].jsonl = format ? strcmp(format, "jsonl") == 0 : ends_with(inputs[i].path, ".jsonl");
    }
    run_tokenize(ranks, prefix, inputs, n_inputs, shard_tokens, val_docs, quiet);
    free(inputs);
    return EXIT_SUCCESS;
}
