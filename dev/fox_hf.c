/*
fox_hf: converts between train_fox checkpoints and the HuggingFace layout of the FoX authors'
PyTorch model (a folder with config.json and model.safetensors; names and shapes in dev/fox.md,
section "HuggingFace layout").

  fox_hf export [--bf16] <model.bin> <dir>       train_fox checkpoint -> <dir>/config.json + model.safetensors
  fox_hf import [--unshare-qk-norm] <dir> <model.bin>   and back (F32, BF16, F16 or F64 tensors)
  fox_hf logits <model.bin> <T> <tokens.i32> <logits.f32>   the CPU twin's logits, to check an export

Our matmul weights already have PyTorch Linear's (out, in) row-major layout, and the SwiGLU
weight already holds the gate rows first: every HF tensor is one contiguous slice of the flat
parameter buffer. Only the vocabulary's pad rows are dropped (export) or zeroed (import).

The JSON and safetensors readers work on memory buffers and return an error message instead of
exiting, so that dev/fuzz/fuzz_safetensors.c can fuzz them.
*/
#ifndef MODEL_MAGIC // test_fox.cu includes train_fox.c itself before this file
#ifdef FOX_NO_MAIN
#include "../train_fox.c"
#else
#define FOX_NO_MAIN // train_fox.c's main() is not this program's
#include "../train_fox.c"
#undef FOX_NO_MAIN
#endif
#endif
#include <float.h>

// ----------------------------------------------------------------------------
// a strict JSON reader (RFC 8259): the whole document becomes an array of nodes, children
// linked by index; strings are decoded (escapes, surrogate pairs) into one buffer

enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };
#define JSON_MAX_DEPTH 64
#define JSON_MAX_NUMBER 255 // characters

typedef struct {
    int type;
    size_t text, text_len; // JSON_NUMBER: its characters in the source
    const char* str;       // JSON_STRING: decoded, NUL-terminated
    const char* key;       // a member of an object: its decoded key
    size_t first, next;    // first child (arrays, objects), next sibling; 0 = none (node 0 is the root)
    size_t count;          // children
} JsonNode;

typedef struct {
    const char* src;
    size_t len, pos;
    JsonNode* nodes;
    size_t n_nodes, cap_nodes;
    char* strings; // decoded strings; never more bytes than the source, so allocated once
    size_t n_strings;
    int depth;
    char* error;
    size_t error_size;
} Json;

static int json_error(Json* j, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(j->error, j->error_size, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < j->error_size) {
        snprintf(j->error + n, j->error_size - (size_t)n, " (at byte %zu of the JSON text)", j->pos);
    }
    return -1;
}

static void json_skip_space(Json* j) {
    while (j->pos < j->len && (j->src[j->pos] == ' ' || j->src[j->pos] == '\t' || j->src[j->pos] == '\n' || j->src[j->pos] == '\r')) {
        j->pos++;
    }
}

static int json_new_node(Json* j, int type, size_t* index) {
    if (j->n_nodes == j->cap_nodes) {
        size_t cap = j->cap_nodes ? 2 * j->cap_nodes : 64;
        if (cap > SIZE_MAX / sizeof(JsonNode)) { return json_error(j, "too many JSON values"); }
        JsonNode* grown = (JsonNode*)realloc(j->nodes, cap * sizeof(JsonNode));
        if (grown == NULL) { return json_error(j, "out of memory for JSON values"); }
        j->nodes = grown;
        j->cap_nodes = cap;
    }
    memset(&j->nodes[j->n_nodes], 0, sizeof(JsonNode));
    j->nodes[j->n_nodes].type = type;
    *index = j->n_nodes++;
    return 0;
}

// length of the valid UTF-8 sequence at s (at most n bytes), 0 if invalid (overlong, surrogate, > U+10FFFF)
static size_t utf8_sequence(const unsigned char* s, size_t n) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || len > n) { return 0; }
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) { return 0; }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { return 0; }
    return len;
}

static int json_hex4(Json* j, uint32_t* out) {
    if (j->len - j->pos < 4) { return json_error(j, "truncated \\u escape"); }
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = j->src[j->pos++];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) { return json_error(j, "bad hex digit in a \\u escape"); }
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

static size_t utf8_encode(uint32_t cp, char* out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// \uXXXX, with a surrogate pair for code points above U+FFFF; U+0000 is refused (C strings)
static int json_unicode_escape(Json* j, char* out, size_t* n) {
    uint32_t cp;
    if (json_hex4(j, &cp) != 0) { return -1; }
    if (cp >= 0xDC00 && cp <= 0xDFFF) { return json_error(j, "lone low surrogate in a \\u escape"); }
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        uint32_t low;
        if (j->len - j->pos < 2 || j->src[j->pos] != '\\' || j->src[j->pos + 1] != 'u') {
            return json_error(j, "high surrogate without its low half");
        }
        j->pos += 2;
        if (json_hex4(j, &low) != 0) { return -1; }
        if (low < 0xDC00 || low > 0xDFFF) { return json_error(j, "high surrogate without its low half"); }
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    if (cp == 0) { return json_error(j, "\\u0000 in a string is not supported"); }
    *n = utf8_encode(cp, out);
    return 0;
}

// a string starting at the opening quote; its decoded text goes into j->strings
static int json_parse_string(Json* j, const char** out) {
    j->pos++; // opening quote
    char* dst = j->strings + j->n_strings;
    size_t n = 0;
    for (;;) {
        if (j->pos >= j->len) { return json_error(j, "unterminated string"); }
        unsigned char c = (unsigned char)j->src[j->pos];
        if (c == '"') { j->pos++; break; }
        if (c < 0x20) { return json_error(j, "control character 0x%02x in a string", c); }
        if (c != '\\') {
            size_t len = utf8_sequence((const unsigned char*)j->src + j->pos, j->len - j->pos);
            if (len == 0) { return json_error(j, "invalid UTF-8 in a string"); }
            memcpy(dst + n, j->src + j->pos, len);
            n += len;
            j->pos += len;
            continue;
        }
        if (++j->pos >= j->len) { return json_error(j, "unterminated escape"); }
        char e = j->src[j->pos++];
        const char* simple = strchr("\"\\/bfnrt", e);
        if (e != '\0' && simple != NULL) {
            dst[n++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
        } else if (e == 'u') {
            size_t len = 0;
            if (json_unicode_escape(j, dst + n, &len) != 0) { return -1; }
            n += len;
        } else {
            return json_error(j, "unknown escape \\%c", e);
        }
    }
    dst[n] = '\0';
    j->n_strings += n + 1;
    *out = dst;
    return 0;
}

static int json_digits(Json* j) { // one or more
    size_t start = j->pos;
    while (j->pos < j->len && j->src[j->pos] >= '0' && j->src[j->pos] <= '9') { j->pos++; }
    return j->pos > start ? 0 : json_error(j, "expected a digit");
}

// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
static int json_parse_number(Json* j, size_t node) {
    size_t start = j->pos;
    if (j->src[j->pos] == '-') { j->pos++; }
    if (j->pos < j->len && j->src[j->pos] == '0') {
        j->pos++;
    } else if (json_digits(j) != 0) {
        return -1;
    }
    if (j->pos < j->len && j->src[j->pos] == '.') {
        j->pos++;
        if (json_digits(j) != 0) { return -1; }
    }
    if (j->pos < j->len && (j->src[j->pos] == 'e' || j->src[j->pos] == 'E')) {
        j->pos++;
        if (j->pos < j->len && (j->src[j->pos] == '+' || j->src[j->pos] == '-')) { j->pos++; }
        if (json_digits(j) != 0) { return -1; }
    }
    if (j->pos - start > JSON_MAX_NUMBER) { return json_error(j, "number longer than %d characters", JSON_MAX_NUMBER); }
    j->nodes[node].text = start;
    j->nodes[node].text_len = j->pos - start;
    return 0;
}

static int json_parse_value(Json* j, size_t* out);

static int compare_key_pointers(const void* a, const void* b) {
    return strcmp(*(const char* const*)a, *(const char* const*)b);
}

static int json_check_unique_keys(Json* j, size_t object) {
    size_t n = j->nodes[object].count;
    if (n < 2) { return 0; }
    const char** keys = (const char**)malloc(n * sizeof(char*));
    if (keys == NULL) { return json_error(j, "out of memory for object keys"); }
    size_t i = 0;
    for (size_t c = j->nodes[object].first; c != 0; c = j->nodes[c].next) { keys[i++] = j->nodes[c].key; }
    qsort(keys, n, sizeof(char*), compare_key_pointers);
    int result = 0;
    for (i = 1; i < n && result == 0; i++) {
        if (strcmp(keys[i - 1], keys[i]) == 0) { result = json_error(j, "duplicate key \"%.100s\"", keys[i]); }
    }
    free(keys);
    return result;
}

// arrays and objects: values separated by commas, no trailing comma
static int json_parse_container(Json* j, size_t node, int is_object) {
    char close = is_object ? '}' : ']';
    j->pos++; // [ or {
    if (++j->depth > JSON_MAX_DEPTH) { return json_error(j, "nested deeper than %d levels", JSON_MAX_DEPTH); }
    json_skip_space(j);
    size_t last = 0;
    if (j->pos < j->len && j->src[j->pos] == close) {
        j->pos++;
        j->depth--;
        return 0;
    }
    for (;;) {
        const char* key = NULL;
        if (is_object) {
            json_skip_space(j);
            if (j->pos >= j->len || j->src[j->pos] != '"') { return json_error(j, "expected a string key"); }
            if (json_parse_string(j, &key) != 0) { return -1; }
            json_skip_space(j);
            if (j->pos >= j->len || j->src[j->pos] != ':') { return json_error(j, "expected ':' after a key"); }
            j->pos++;
        }
        size_t child;
        if (json_parse_value(j, &child) != 0) { return -1; }
        j->nodes[child].key = key;
        if (last == 0) { j->nodes[node].first = child; } else { j->nodes[last].next = child; }
        last = child;
        j->nodes[node].count++;
        json_skip_space(j);
        if (j->pos >= j->len) { return json_error(j, "unterminated %s", is_object ? "object" : "array"); }
        char c = j->src[j->pos++];
        if (c == close) { break; }
        if (c != ',') { j->pos--; return json_error(j, "expected ',' or '%c'", close); }
    }
    j->depth--;
    return is_object ? json_check_unique_keys(j, node) : 0;
}

static int json_parse_literal(Json* j, const char* word) {
    size_t n = strlen(word);
    if (j->len - j->pos < n || memcmp(j->src + j->pos, word, n) != 0) { return json_error(j, "unexpected character"); }
    j->pos += n;
    return 0;
}

static int json_parse_value(Json* j, size_t* out) {
    json_skip_space(j);
    if (j->pos >= j->len) { return json_error(j, "unexpected end of the JSON text"); }
    char c = j->src[j->pos];
    int type = c == '{' ? JSON_OBJECT : c == '[' ? JSON_ARRAY : c == '"' ? JSON_STRING : c == 't' ? JSON_TRUE
             : c == 'f' ? JSON_FALSE : c == 'n' ? JSON_NULL : (c == '-' || (c >= '0' && c <= '9')) ? JSON_NUMBER : -1;
    if (type < 0) { return json_error(j, "unexpected character '%c'", isprint((unsigned char)c) ? c : '?'); }
    size_t node = 0;
    if (json_new_node(j, type, &node) != 0) { return -1; }
    *out = node;
    switch (type) {
        case JSON_OBJECT: return json_parse_container(j, node, 1);
        case JSON_ARRAY: return json_parse_container(j, node, 0);
        case JSON_STRING: {
            const char* s;
            if (json_parse_string(j, &s) != 0) { return -1; }
            j->nodes[node].str = s;
            return 0;
        }
        case JSON_TRUE: return json_parse_literal(j, "true");
        case JSON_FALSE: return json_parse_literal(j, "false");
        case JSON_NULL: return json_parse_literal(j, "null");
        default: return json_parse_number(j, node);
    }
}

static void json_free(Json* j) {
    free(j->nodes);
    free(j->strings);
    j->nodes = NULL;
    j->strings = NULL;
}

// Parses src[0, len) as one JSON value (node 0). Returns 0, or -1 with a message in error.
static int json_parse(Json* j, const char* src, size_t len, char* error, size_t error_size) {
    memset(j, 0, sizeof(*j));
    j->src = src;
    j->len = len;
    j->error = error;
    j->error_size = error_size;
    j->strings = (char*)malloc(len + 1);
    if (j->strings == NULL) { return json_error(j, "out of memory for %zu bytes of JSON", len); }
    size_t root;
    int result = json_parse_value(j, &root);
    if (result == 0) {
        json_skip_space(j);
        if (j->pos != j->len) { result = json_error(j, "text after the JSON value"); }
    }
    if (result != 0) { json_free(j); }
    return result;
}

// the member of an object with this key, 0 when absent (or when not an object)
static size_t json_member(const Json* j, size_t object, const char* key) {
    if (j->nodes[object].type != JSON_OBJECT) { return 0; }
    for (size_t c = j->nodes[object].first; c != 0; c = j->nodes[c].next) {
        if (strcmp(j->nodes[c].key, key) == 0) { return c; }
    }
    return 0;
}

// a non-negative integer written with digits only, exactly (no double rounding)
static int json_to_size(const Json* j, size_t node, size_t* out) {
    const JsonNode* n = &j->nodes[node];
    if (n->type != JSON_NUMBER) { return 0; }
    size_t v = 0;
    for (size_t i = 0; i < n->text_len; i++) {
        char c = j->src[n->text + i];
        if (c < '0' || c > '9') { return 0; }
        size_t d = (size_t)(c - '0');
        if (v > (SIZE_MAX - d) / 10) { return 0; }
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

static int json_to_double(const Json* j, size_t node, double* out) {
    const JsonNode* n = &j->nodes[node];
    if (n->type != JSON_NUMBER) { return 0; }
    char buf[JSON_MAX_NUMBER + 1];
    memcpy(buf, j->src + n->text, n->text_len);
    buf[n->text_len] = '\0';
    *out = strtod(buf, NULL);
    return isfinite(*out);
}

// ----------------------------------------------------------------------------
// safetensors: 8-byte little-endian header length N, N bytes of JSON (tensor name -> dtype,
// shape, data_offsets; optional "__metadata__" of strings), then the tensors' bytes. Offsets
// are relative to the byte after the header; the tensors must cover that area exactly, in
// any order, without gaps or overlaps.

enum { ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32,
       ST_F32, ST_F64, ST_I64, ST_U64, NUM_ST_DTYPES };
static const char* ST_DTYPE_NAMES[NUM_ST_DTYPES] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16",
    "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64"};
static const size_t ST_DTYPE_BYTES[NUM_ST_DTYPES] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
#define ST_MAX_DIMS 8
#define ST_MAX_HEADER ((size_t)100 << 20) // the limit of the safetensors reference implementation

typedef struct {
    const char* name;
    int dtype;
    int ndim;
    size_t shape[ST_MAX_DIMS];
    size_t begin, end; // byte range in the data area
} StTensor;

typedef struct {
    Json header;
    StTensor* tensors;
    size_t count;
    const uint8_t* data; // the data area: the bytes after the header
    size_t data_size;
} SafeTensors;

static int st_error(char* error, size_t n, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, n, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t read_le64(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) { v = (v << 8) | p[i]; }
    return v;
}

static int st_parse_dtype(const char* name) {
    for (int d = 0; d < NUM_ST_DTYPES; d++) {
        if (strcmp(name, ST_DTYPE_NAMES[d]) == 0) { return d; }
    }
    return -1;
}

// one tensor entry: exactly the keys dtype, shape and data_offsets, sizes consistent
static int st_parse_entry(const Json* j, size_t node, StTensor* t, size_t data_size, char* error, size_t n) {
    const JsonNode* e = &j->nodes[node];
    t->name = e->key;
    if (e->type != JSON_OBJECT) { return st_error(error, n, "the entry of tensor '%.200s' is not an object", t->name); }
    size_t dtype = json_member(j, node, "dtype"), shape = json_member(j, node, "shape"), offsets = json_member(j, node, "data_offsets");
    if (dtype == 0 || shape == 0 || offsets == 0 || e->count != 3) {
        return st_error(error, n, "tensor '%.200s' must have exactly the keys dtype, shape and data_offsets", t->name);
    }
    t->dtype = j->nodes[dtype].type == JSON_STRING ? st_parse_dtype(j->nodes[dtype].str) : -1;
    if (t->dtype < 0) {
        return st_error(error, n, "tensor '%.200s' has an unknown dtype %.40s", t->name,
                        j->nodes[dtype].type == JSON_STRING ? j->nodes[dtype].str : "(not a string)");
    }
    if (j->nodes[shape].type != JSON_ARRAY || j->nodes[shape].count > ST_MAX_DIMS) {
        return st_error(error, n, "tensor '%.200s': shape must be an array of at most %d sizes", t->name, ST_MAX_DIMS);
    }
    size_t bytes = ST_DTYPE_BYTES[t->dtype];
    t->ndim = 0;
    for (size_t c = j->nodes[shape].first; c != 0; c = j->nodes[c].next) {
        size_t dim;
        if (!json_to_size(j, c, &dim)) { return st_error(error, n, "tensor '%.200s': a shape entry is not a non-negative integer", t->name); }
        if (dim != 0 && bytes > SIZE_MAX / dim) { return st_error(error, n, "tensor '%.200s': the shape's size overflows", t->name); }
        bytes *= dim;
        t->shape[t->ndim++] = dim;
    }
    size_t first = j->nodes[offsets].first;
    if (j->nodes[offsets].type != JSON_ARRAY || j->nodes[offsets].count != 2 || !json_to_size(j, first, &t->begin) ||
        !json_to_size(j, j->nodes[first].next, &t->end)) {
        return st_error(error, n, "tensor '%.200s': data_offsets must be two non-negative integers", t->name);
    }
    if (t->begin > t->end || t->end > data_size) {
        return st_error(error, n, "tensor '%.200s': data_offsets [%zu, %zu] lie outside the %zu data bytes", t->name,
                        t->begin, t->end, data_size);
    }
    if (t->end - t->begin != bytes) {
        return st_error(error, n, "tensor '%.200s': its shape and dtype need %zu bytes, data_offsets give %zu", t->name,
                        bytes, t->end - t->begin);
    }
    return 0;
}

static int st_parse_metadata(const Json* j, size_t node, char* error, size_t n) {
    if (j->nodes[node].type != JSON_OBJECT) { return st_error(error, n, "__metadata__ is not an object"); }
    for (size_t c = j->nodes[node].first; c != 0; c = j->nodes[c].next) {
        if (j->nodes[c].type != JSON_STRING) { return st_error(error, n, "__metadata__ value '%.200s' is not a string", j->nodes[c].key); }
    }
    return 0;
}

static int compare_by_offsets(const void* a, const void* b) {
    const StTensor* x = *(const StTensor* const*)a;
    const StTensor* y = *(const StTensor* const*)b;
    if (x->begin != y->begin) { return x->begin < y->begin ? -1 : 1; }
    return x->end < y->end ? -1 : x->end > y->end;
}

// the tensors, sorted by offset, must tile [0, data_size)
static int st_check_tiling(const SafeTensors* st, char* error, size_t n) {
    const StTensor** order = (const StTensor**)malloc((st->count ? st->count : 1) * sizeof(StTensor*));
    if (order == NULL) { return st_error(error, n, "out of memory"); }
    for (size_t i = 0; i < st->count; i++) { order[i] = &st->tensors[i]; }
    qsort(order, st->count, sizeof(StTensor*), compare_by_offsets);
    size_t covered = 0;
    int result = 0;
    for (size_t i = 0; i < st->count && result == 0; i++) {
        if (order[i]->begin != covered) {
            result = st_error(error, n, "tensor '%.200s' starts at byte %zu of the data, expected %zu (%s)", order[i]->name,
                              order[i]->begin, covered, order[i]->begin < covered ? "overlap" : "gap");
        }
        covered = order[i]->end;
    }
    if (result == 0 && covered != st->data_size) {
        result = st_error(error, n, "the tensors cover %zu of the %zu data bytes", covered, st->data_size);
    }
    free(order);
    return result;
}

static void safetensors_free(SafeTensors* st) {
    json_free(&st->header);
    free(st->tensors);
    st->tensors = NULL;
}

// Parses and validates a whole safetensors file held in buf. Returns 0, or -1 with a message.
static int safetensors_parse(SafeTensors* st, const uint8_t* buf, size_t size, char* error, size_t n) {
    memset(st, 0, sizeof(*st));
    if (size < 8) { return st_error(error, n, "the file has %zu bytes, fewer than the 8-byte header length", size); }
    uint64_t header_len = read_le64(buf);
    if (header_len > size - 8) {
        return st_error(error, n, "the header length %llu exceeds the %zu bytes after it", (unsigned long long)header_len, size - 8);
    }
    if (header_len > ST_MAX_HEADER) { return st_error(error, n, "the header length %llu is over the 100 MiB limit", (unsigned long long)header_len); }
    char json_error_msg[256];
    if (json_parse(&st->header, (const char*)buf + 8, (size_t)header_len, json_error_msg, sizeof(json_error_msg)) != 0) {
        return st_error(error, n, "the header is not valid JSON: %s", json_error_msg);
    }
    st->data = buf + 8 + header_len;
    st->data_size = size - 8 - (size_t)header_len;
    const Json* j = &st->header;
    if (j->nodes[0].type != JSON_OBJECT) {
        safetensors_free(st);
        return st_error(error, n, "the header is not a JSON object");
    }
    st->tensors = (StTensor*)calloc(j->nodes[0].count ? j->nodes[0].count : 1, sizeof(StTensor));
    if (st->tensors == NULL) {
        safetensors_free(st);
        return st_error(error, n, "out of memory");
    }
    int result = 0;
    for (size_t c = j->nodes[0].first; c != 0 && result == 0; c = j->nodes[c].next) {
        if (strcmp(j->nodes[c].key, "__metadata__") == 0) {
            result = st_parse_metadata(j, c, error, n);
        } else {
            result = st_parse_entry(j, c, &st->tensors[st->count++], st->data_size, error, n);
        }
    }
    if (result == 0) { result = st_check_tiling(st, error, n); }
    if (result != 0) { safetensors_free(st); }
    return result;
}

static const StTensor* safetensors_find(const SafeTensors* st, const char* name) {
    for (size_t i = 0; i < st->count; i++) {
        if (strcmp(st->tensors[i].name, name) == 0) { return &st->tensors[i]; }
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// number formats

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint16_t f32_to_bf16(float f) { // round to nearest even; NaN stays a (quiet) NaN
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) { return (uint16_t)((u >> 16) | 0x40); }
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    if (exponent == 0x1F) { // inf, NaN
        uint32_t u = sign | 0x7F800000u | (mantissa << 13);
        float f;
        memcpy(&f, &u, sizeof(f));
        return f;
    }
    float magnitude = exponent == 0 ? ldexpf((float)mantissa, -24) : ldexpf((float)(mantissa | 0x400), (int)exponent - 25);
    return sign ? -magnitude : magnitude;
}

// little-endian element i of a tensor's bytes, as fp32 (exact for F16 and BF16)
static float st_element(const uint8_t* p, int dtype, size_t i) {
    if (dtype == ST_F32) { float f; memcpy(&f, p + 4 * i, 4); return f; }
    if (dtype == ST_F64) { // beyond float's range the conversion is undefined: make it infinite
        double d;
        memcpy(&d, p + 8 * i, 8);
        return fabs(d) > FLT_MAX ? (d > 0 ? INFINITY : -INFINITY) : (float)d;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// ----------------------------------------------------------------------------
// the HF tensors of a model: names and shapes, each a slice of the parameter buffer

typedef struct {
    char name[128];
    int tensor, layer;
    int ndim;           // 1 for norm scales and biases, else 2
    size_t rows, cols;  // HF shape (rows) or (rows, cols): V rows for the vocabulary, not Vp
    float* data;        // the first rows * cols floats of our slice
} HfTensor;

static void hf_add(const FoxModel* m, int t, int layer, HfTensor* out, size_t* n) {
    const ParamSpec* s = &m->spec[t];
    if (s->rows == 0) { return; } // absent in this configuration
    HfTensor* h = &out[(*n)++];
    param_hf_name(&m->config, t, layer, h->name, sizeof(h->name));
    h->tensor = t;
    h->layer = layer;
    h->ndim = s->cols == 1 ? 1 : 2;
    h->rows = (size_t)s->hf_rows;
    h->cols = s->cols;
    h->data = param_tensor((ParameterTensors*)&m->params, t) + (size_t)layer * param_slice_numel(s);
}

// out holds at most NUM_PARAM_TENSORS * n_layer entries; the order is the HF model's
static size_t hf_tensor_list(const FoxModel* m, HfTensor* out) {
    size_t n = 0;
    hf_add(m, P_WTE, 0, out, &n);
    for (int l = 0; l < m->config.n_layer; l++) {
        for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
            if (m->spec[t].per_layer) { hf_add(m, t, l, out, &n); }
        }
    }
    hf_add(m, P_NORM_F, 0, out, &n);
    hf_add(m, P_LM_HEAD, 0, out, &n);
    return n;
}

static HfTensor* hf_tensors_alloc(const FoxModel* m, size_t* n) {
    HfTensor* list = (HfTensor*)malloc_check((size_t)NUM_PARAM_TENSORS * (size_t)m->config.n_layer * sizeof(HfTensor), "tensor list");
    *n = hf_tensor_list(m, list);
    return list;
}

// ----------------------------------------------------------------------------
// config.json: our configuration in the authors' keys

#define HF_MODEL_TYPE "forgetting_transformer-project_fox"

// a growing text buffer for the JSON we write
typedef struct { char* s; size_t len, cap; } Text;

static void text_add(Text* t, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) { fail("internal: could not format text" BUG_HINT); }
    if (t->len + (size_t)n + 1 > t->cap) {
        t->cap = 2 * (t->len + (size_t)n + 1);
        t->s = (char*)realloc(t->s, t->cap);
        if (t->s == NULL) { fail("out of memory for %zu bytes of text\nHINT: free some memory", t->cap); }
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

static const char* json_bool(int v) { return v ? "true" : "false"; }

// The window has no key in this layout: the caller refuses such models first.
static void hf_config_text(const FoxConfig* c, int bf16, Text* t) {
    int gate_init = c->gate == GATE_BIAS_ONLY || c->gate == GATE_FIXED; // their code wants T_min, T_max only then
    text_add(t, "{\n  \"model_type\": \"%s\",\n  \"architectures\": [\"ForgettingTransformerForCausalLM\"],\n", HF_MODEL_TYPE);
    text_add(t, "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_heads\": %d,\n",
             c->vocab_size, c->n_embd, c->n_layer, c->n_head);
    text_add(t, "  \"hidden_ratio\": %s,\n  \"intermediate_size\": %d,\n", c->block == BLOCK_PRO ? "3.5" : "4", c->mlp_hidden);
    text_add(t, "  \"hidden_act\": \"swish\",\n  \"norm_eps\": 1e-06,\n  \"initializer_range\": 0.02,\n  \"tie_word_embeddings\": false,\n");
    text_add(t, "  \"use_rope\": %s,\n  \"rope_base\": %.9g,\n", json_bool(c->rope), c->rope_theta);
    text_add(t, "  \"fgate_type\": \"%s\",\n  \"fgate_bias_init\": %s,\n", GATE_NAMES[c->gate], json_bool(gate_init));
    if (gate_init) {
        text_add(t, "  \"decay_time_min\": %.9g,\n  \"decay_time_max\": %.9g,\n", c->decay_time_min, c->decay_time_max);
    } else {
        text_add(t, "  \"decay_time_min\": null,\n  \"decay_time_max\": null,\n");
    }
    text_add(t, "  \"use_output_gate\": %s,\n  \"ogate_act\": \"sigmoid\",\n  \"use_output_norm\": %s,\n",
             json_bool(c->output_gate), json_bool(c->output_norm));
    text_add(t, "  \"qk_norm\": %s,\n  \"qk_norm_share_param_across_head\": %s,\n", json_bool(c->qk_norm), json_bool(c->qk_norm_shared));
    text_add(t, "  \"use_k_shift\": %s,\n  \"use_v_shift\": %s,\n", json_bool(c->k_shift), json_bool(c->v_shift));
    text_add(t, "  \"log_pruning_tolerance\": null,\n  \"window_size\": null,\n  \"num_kv_heads\": null,\n");
    if (c->vocab_size == 50257) { text_add(t, "  \"bos_token_id\": 50256,\n  \"eos_token_id\": 50256,\n"); } // GPT-2's <|endoftext|>
    text_add(t, "  \"torch_dtype\": \"%s\"\n}\n", bf16 ? "bfloat16" : "float32");
}

// Reading config.json: a value of the wrong type is an error; an absent key (or null where the
// authors' code allows it) takes the default of their configuration class.
typedef struct {
    const Json* j;
    const char* path;
} HfConfigReader;

static size_t hf_key(const HfConfigReader* r, const char* key, int type, int required) {
    size_t node = json_member(r->j, 0, key);
    if (node == 0 || r->j->nodes[node].type == JSON_NULL) {
        if (required) { fail("'%s' has no \"%s\"\nHINT: pass the folder of a FoX model saved by the authors' code or by fox_hf export", r->path, key); }
        return 0;
    }
    int t = r->j->nodes[node].type;
    int ok = type == JSON_TRUE ? (t == JSON_TRUE || t == JSON_FALSE) : t == type;
    if (!ok) {
        static const char* what[] = {"null", "a boolean", "a boolean", "a number", "a string", "an array", "an object"};
        fail("'%s': \"%s\" must be %s\nHINT: the file is damaged or not a FoX config.json", r->path, key, what[type]);
    }
    return node;
}

static int hf_bool(const HfConfigReader* r, const char* key, int fallback) {
    size_t node = hf_key(r, key, JSON_TRUE, 0);
    return node == 0 ? fallback : r->j->nodes[node].type == JSON_TRUE;
}

static double hf_number(const HfConfigReader* r, const char* key, double fallback, int* present) {
    size_t node = hf_key(r, key, JSON_NUMBER, 0);
    double v = fallback;
    if (node != 0 && !json_to_double(r->j, node, &v)) { fail("'%s': \"%s\" is out of range\nHINT: the file is damaged", r->path, key); }
    if (present != NULL) { *present = node != 0; }
    return v;
}

static int hf_int(const HfConfigReader* r, const char* key, int required, int fallback, int lo, int hi) {
    size_t node = hf_key(r, key, JSON_NUMBER, required);
    if (node == 0) { return fallback; }
    size_t v;
    if (!json_to_size(r->j, node, &v) || v < (size_t)lo || v > (size_t)hi) {
        fail("'%s': \"%s\" must be an integer in [%d, %d]\nHINT: train_fox supports models in these limits", r->path, key, lo, hi);
    }
    return (int)v;
}

static const char* hf_string(const HfConfigReader* r, const char* key, const char* fallback) {
    size_t node = hf_key(r, key, JSON_STRING, 0);
    return node == 0 ? fallback : r->j->nodes[node].str;
}

static void hf_require(const HfConfigReader* r, int ok, const char* what) {
    if (!ok) { fail("'%s': %s, which train_fox does not implement\nHINT: only the FoX / Transformer variants of dev/fox.md convert", r->path, what); }
}

static void config_from_hf(const Json* j, const char* path, FoxConfig* c) {
    HfConfigReader r = {j, path};
    if (j->nodes[0].type != JSON_OBJECT) { fail("'%s' is not a JSON object\nHINT: pass the folder of a FoX model", path); }
    size_t type = hf_key(&r, "model_type", JSON_STRING, 1);
    if (strcmp(j->nodes[type].str, HF_MODEL_TYPE) != 0) {
        fail("'%s' describes a \"%.80s\" model, not \"%s\"\nHINT: only FoX models convert", path, j->nodes[type].str, HF_MODEL_TYPE);
    }
    memset(c, 0, sizeof(*c));
    c->vocab_size = hf_int(&r, "vocab_size", 1, 0, 2, 65536);
    c->n_embd = hf_int(&r, "hidden_size", 1, 0, 1, 1 << 16);
    c->n_layer = hf_int(&r, "num_hidden_layers", 1, 0, 1, 1000);
    c->n_head = hf_int(&r, "num_heads", 1, 0, 1, 4096);
    c->padded_vocab_size = padded_vocab(c->vocab_size);
    double ratio = hf_number(&r, "hidden_ratio", 4.0, NULL);
    hf_require(&r, ratio == 4.0 || ratio == 3.5, "hidden_ratio is neither 4 (LLaMA block) nor 3.5 (Pro block)");
    c->block = ratio == 3.5 ? BLOCK_PRO : BLOCK_LLAMA;
    c->mlp_hidden = hf_int(&r, "intermediate_size", 0, derived_mlp_hidden(c->n_embd, c->block), 1, 1 << 20);
    hf_require(&r, strcmp(hf_string(&r, "hidden_act", "swish"), "swish") == 0, "hidden_act is not \"swish\"");
    hf_require(&r, hf_number(&r, "norm_eps", 1e-6, NULL) == 1e-6, "norm_eps is not 1e-6");
    hf_require(&r, !hf_bool(&r, "tie_word_embeddings", 0), "the embedding and lm_head are tied");
    hf_require(&r, hf_key(&r, "num_kv_heads", JSON_NUMBER, 0) == 0, "num_kv_heads is set (grouped-query attention)");
    hf_require(&r, hf_key(&r, "window_size", JSON_NUMBER, 0) == 0, "window_size is set");
    c->rope = hf_bool(&r, "use_rope", 0);
    double theta = hf_number(&r, "rope_base", 500000.0, NULL);
    if (!(theta > 0 && theta < 3.4e38)) { fail("'%s': rope_base %g is not a positive float\nHINT: the file is damaged", path, theta); }
    c->rope_theta = (float)theta;
    c->gate = parse_choice(hf_string(&r, "fgate_type", "full"), GATE_NAMES, 4);
    hf_require(&r, c->gate >= 0, "fgate_type is not full, bias_only, fixed or none");
    // T_min, T_max only set the initial bias of bias_only / fixed gates; absent, the presets' values
    int has_min, has_max;
    c->decay_time_min = (float)hf_number(&r, "decay_time_min", 2.0, &has_min);
    c->decay_time_max = (float)hf_number(&r, "decay_time_max", 128.0, &has_max);
    if (has_min != has_max) { fail("'%s': decay_time_min and decay_time_max come together\nHINT: set both or neither", path); }
    c->output_gate = hf_bool(&r, "use_output_gate", 0);
    hf_require(&r, !c->output_gate || strcmp(hf_string(&r, "ogate_act", "sigmoid"), "sigmoid") == 0, "ogate_act is not \"sigmoid\"");
    c->output_norm = hf_bool(&r, "use_output_norm", 0);
    c->qk_norm = hf_bool(&r, "qk_norm", 0);
    c->qk_norm_shared = c->qk_norm && hf_bool(&r, "qk_norm_share_param_across_head", 0);
    c->k_shift = hf_bool(&r, "use_k_shift", 0);
    c->v_shift = hf_bool(&r, "use_v_shift", 0);
    hf_number(&r, "log_pruning_tolerance", 0.0, NULL); // pruning only skips weights below epsilon: not a model change
    const char* problem = config_problem(c);
    if (problem != NULL) { fail("'%s' describes a model train_fox cannot build: %s\nHINT: the file is damaged", path, problem); }
}

// ----------------------------------------------------------------------------
// files

// a whole file in memory; limit guards against passing a huge file by mistake
static uint8_t* read_file(const char* path, size_t limit, size_t* size) {
    FILE* f = fopen_check(path, "rb");
    long n = file_size_check(f, path);
    if ((unsigned long)n > limit) { fail("'%s' is %ld bytes, over the %zu expected at most\nHINT: check the path", path, n, limit); }
    uint8_t* buf = (uint8_t*)malloc_check((size_t)n, path);
    fread_check(buf, 1, (size_t)n, f, path);
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static void make_dir(const char* dir) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) { fail("'%s' exists and is not a directory\nHINT: choose a folder for config.json and model.safetensors", dir); }
        return;
    }
    if (mkdir(dir, 0755) != 0) { fail("could not create the directory '%s': %s\nHINT: does its parent exist?", dir, strerror(errno)); }
}

static void join_path(char* out, size_t n, const char* dir, const char* file) {
    if ((size_t)snprintf(out, n, "%s/%s", dir, file) >= n) { fail("path too long: '%s/%s'\nHINT: use a shorter path", dir, file); }
}

// ----------------------------------------------------------------------------
// export

static void write_safetensors(const char* path, const HfTensor* list, size_t n, int bf16) {
    size_t elem = bf16 ? 2 : 4, offset = 0;
    Text h = {NULL, 0, 0};
    text_add(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; i++) {
        size_t bytes = list[i].rows * list[i].cols * elem;
        text_add(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%zu", list[i].name, bf16 ? "BF16" : "F32", list[i].rows);
        if (list[i].ndim == 2) { text_add(&h, ",%zu", list[i].cols); }
        text_add(&h, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
        offset += bytes;
    }
    text_add(&h, "}");
    while (h.len % 8 != 0) { text_add(&h, " "); } // the data starts 8-byte aligned, as the reference writer does
    uint8_t len_bytes[8];
    for (int i = 0; i < 8; i++) { len_bytes[i] = (uint8_t)((uint64_t)h.len >> (8 * i)); }
    char tmp[4200];
    FILE* f = atomic_open(path, tmp, sizeof(tmp));
    atomic_write(len_bytes, 1, 8, f, tmp, path);
    atomic_write(h.s, 1, h.len, f, tmp, path);
    for (size_t i = 0; i < n; i++) {
        size_t count = list[i].rows * list[i].cols;
        if (!bf16) {
            atomic_write(list[i].data, sizeof(float), count, f, tmp, path);
            continue;
        }
        uint16_t* half = (uint16_t*)malloc_check(count * sizeof(uint16_t), "bf16 tensor");
        for (size_t k = 0; k < count; k++) { half[k] = f32_to_bf16(list[i].data[k]); }
        atomic_write(half, sizeof(uint16_t), count, f, tmp, path);
        free(half);
    }
    atomic_commit(f, tmp, path);
    free(h.s);
}

static void hf_export(const char* model_path, const char* dir, int bf16) {
    FoxModel m;
    load_model(&m, model_path);
    if (m.config.window > 0) {
        fail("'%s' uses a sliding window of %d tokens, which the authors' HF layout cannot express (it has no window key)\n"
             "HINT: only full causal attention models export", model_path, m.config.window);
    }
    make_dir(dir);
    char path[4096];
    Text config = {NULL, 0, 0};
    hf_config_text(&m.config, bf16, &config);
    join_path(path, sizeof(path), dir, "config.json");
    char tmp[4200];
    FILE* f = atomic_open(path, tmp, sizeof(tmp));
    atomic_write(config.s, 1, config.len, f, tmp, path);
    atomic_commit(f, tmp, path);
    free(config.s);
    size_t n;
    HfTensor* list = hf_tensors_alloc(&m, &n);
    join_path(path, sizeof(path), dir, "model.safetensors");
    write_safetensors(path, list, n, bf16);
    printf("exported %s -> %s: config.json and %zu %s tensors in model.safetensors\n", model_path, dir, n, bf16 ? "BF16" : "F32");
    free(list);
    fox_free(&m);
}

// ----------------------------------------------------------------------------
// import

static void shape_text(char* out, size_t n, const size_t* shape, int ndim) {
    size_t used = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < ndim && used < n; d++) { used += (size_t)snprintf(out + used, n - used, d ? ", %zu" : "%zu", shape[d]); }
    if (used < n) { snprintf(out + used, n - used, "]"); }
}

// copies one HF tensor into our slice, converted to fp32
static void import_tensor(const SafeTensors* st, const HfTensor* h, const char* path) {
    const StTensor* t = safetensors_find(st, h->name);
    if (t == NULL) {
        fail("'%s' has no tensor '%s', which config.json implies\nHINT: the weights and config.json do not belong together", path, h->name);
    }
    size_t want[2] = {h->rows, h->cols};
    if (t->ndim != h->ndim || t->shape[0] != want[0] || (h->ndim == 2 && t->shape[1] != want[1])) {
        char got_s[160], want_s[64];
        shape_text(got_s, sizeof(got_s), t->shape, t->ndim);
        shape_text(want_s, sizeof(want_s), want, h->ndim);
        fail("'%s': tensor '%s' has shape %s, config.json implies %s\nHINT: the weights and config.json do not belong together",
             path, h->name, got_s, want_s);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F64) {
        fail("'%s': tensor '%s' is %s\nHINT: fox_hf imports F32, BF16, F16 and F64 tensors", path, h->name, ST_DTYPE_NAMES[t->dtype]);
    }
    const uint8_t* p = st->data + t->begin;
    for (size_t i = 0; i < h->rows * h->cols; i++) {
        h->data[i] = st_element(p, t->dtype, i);
        if (!isfinite(h->data[i])) {
            fail("'%s': tensor '%s' holds a NaN or infinity (element %zu)\nHINT: the checkpoint is broken (a diverged run?)", path, h->name, i);
        }
    }
}

static void hf_import(const char* dir, const char* model_path, int unshare_qk_norm) {
    char path[4096];
    join_path(path, sizeof(path), dir, "config.json");
    size_t size;
    uint8_t* text = read_file(path, (size_t)1 << 20, &size);
    Json j;
    char error[512];
    if (json_parse(&j, (const char*)text, size, error, sizeof(error)) != 0) {
        fail("'%s' is not valid JSON: %s\nHINT: the file is damaged", path, error);
    }
    FoxConfig c;
    config_from_hf(&j, path, &c);
    json_free(&j);
    free(text);
    FoxModel m;
    fox_build(&m, &c);
    join_path(path, sizeof(path), dir, "model.safetensors");
    uint8_t* buf = read_file(path, SIZE_MAX, &size);
    SafeTensors st;
    if (safetensors_parse(&st, buf, size, error, sizeof(error)) != 0) {
        fail("'%s' is not a valid safetensors file: %s\nHINT: the file is damaged or truncated; download or export it again", path, error);
    }
    size_t n;
    HfTensor* list = hf_tensors_alloc(&m, &n);
    for (size_t i = 0; i < n; i++) { import_tensor(&st, &list[i], path); }
    if (st.count != n) { // every expected name was found, so some other name is extra
        for (size_t i = 0; i < st.count; i++) {
            int expected = 0;
            for (size_t k = 0; k < n && !expected; k++) { expected = strcmp(st.tensors[i].name, list[k].name) == 0; }
            if (!expected) { fail("'%s' holds tensor '%s', which config.json does not imply\nHINT: the weights and config.json do not belong together", path, st.tensors[i].name); }
        }
    }
    if (unshare_qk_norm && !c.qk_norm_shared) { printf("note: --unshare-qk-norm: the QK-norm scales are not shared, nothing to do\n"); }
    if (c.qk_norm_shared && unshare_qk_norm) {
        // each head starts from the shared scale: the same function, trained per head from here on
        FoxModel per_head;
        c.qk_norm_shared = 0;
        fox_build(&per_head, &c);
        int L = c.n_layer, H = c.n_head, hd = c.n_embd / c.n_head;
        for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
            const float* src = param_tensor(&m.params, t);
            float* dst = param_tensor(&per_head.params, t);
            if (t != P_Q_NORM && t != P_K_NORM) { memcpy(dst, src, param_numel(&m.spec[t], L) * sizeof(float)); continue; }
            for (int l = 0; l < L; l++) {
                for (int h = 0; h < H; h++) { memcpy(dst + ((size_t)l * H + h) * hd, src + (size_t)l * hd, (size_t)hd * sizeof(float)); }
            }
        }
        fox_free(&m);
        m = per_head;
    }
    save_model(&m, model_path);
    printf("imported %s -> %s: %zu tensors, %zu parameters\n", dir, model_path, n, m.num_parameters);
    config_print(stdout, &m.config);
    free(list);
    safetensors_free(&st);
    free(buf);
    fox_free(&m);
}

// ----------------------------------------------------------------------------
// logits of the CPU twin on given tokens, for comparing an export with other code

static void hf_logits(const char* model_path, const char* T_text, const char* tokens_path, const char* out_path) {
    long T;
    if (!parse_int_strict(T_text, &T) || T < 1 || T > (1 << 20)) { fail("bad sequence length '%s'\nHINT: T is a positive integer", T_text); }
    size_t size;
    uint8_t* raw = read_file(tokens_path, (size_t)1 << 30, &size);
    size_t n = size / sizeof(int);
    if (size % sizeof(int) != 0 || n == 0 || n % (size_t)T != 0) {
        fail("'%s' holds %zu bytes, not a whole number of int32 sequences of %ld tokens\nHINT: write B*T int32 tokens", tokens_path, size, T);
    }
    int* tokens = (int*)malloc_check(size, "tokens");
    memcpy(tokens, raw, size);
    FoxModel m;
    load_model(&m, model_path);
    int B = (int)(n / (size_t)T), V = m.config.vocab_size, Vp = m.config.padded_vocab_size;
    fox_forward(&m, tokens, NULL, B, (int)T);
    char tmp[4200];
    FILE* f = atomic_open(out_path, tmp, sizeof(tmp));
    for (size_t r = 0; r < n; r++) { atomic_write(m.logits + r * (size_t)Vp, sizeof(float), (size_t)V, f, tmp, out_path); }
    atomic_commit(f, tmp, out_path);
    printf("wrote the logits of %d x %ld tokens, (%d, %ld, %d) fp32, to %s\n", B, T, B, T, V, out_path);
    fox_free(&m);
    free(tokens);
    free(raw);
}

// ----------------------------------------------------------------------------

static void hf_usage_fail(const char* why) {
    fail("%s\nusage: fox_hf export [--bf16] <model.bin> <dir>\n"
         "       fox_hf import [--unshare-qk-norm] <dir> <model.bin>\n"
         "       fox_hf logits <model.bin> <T> <tokens.i32> <logits.f32>\n"
         "HINT: README.md, section \"HuggingFace export and import\"", why);
}

// the command line without the program name; exits on any error
static void fox_hf_cli(int argc, char** argv) {
    if (argc < 1) { hf_usage_fail("no command"); }
    const char* cmd = argv[0];
    int flag = argc > 1 && argv[1][0] == '-';
    const char* want_flag = strcmp(cmd, "export") == 0 ? "--bf16" : strcmp(cmd, "import") == 0 ? "--unshare-qk-norm" : NULL;
    if (flag && (want_flag == NULL || strcmp(argv[1], want_flag) != 0)) { hf_usage_fail("unknown option"); }
    char** args = argv + 1 + flag;
    int nargs = argc - 1 - flag;
    if (strcmp(cmd, "export") == 0 && nargs == 2) { hf_export(args[0], args[1], flag); return; }
    if (strcmp(cmd, "import") == 0 && nargs == 2) { hf_import(args[0], args[1], flag); return; }
    if (strcmp(cmd, "logits") == 0 && nargs == 4) { hf_logits(args[0], args[1], args[2], args[3]); return; }
    hf_usage_fail("unknown command or wrong number of arguments");
}

#ifndef FOX_NO_MAIN
int main(int argc, char** argv) {
    threads_init();
    fox_hf_cli(argc - 1, argv + 1);
    return 0;
}
#endif
