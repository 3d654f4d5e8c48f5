/*
test_fox.cu: the tests of train_fox, one program.

CPU part (any machine): the CPU twin (train_fox.c) against the debug states of the independent
PyTorch reference (dev/fox_reference.py, float64) for every preset and toggle: logits, loss, every
gradient tensor and 10 AdamW steps; finite differences of d(log f) and of the KV-shift gradients;
schedule, data loader, checkpoint and decode-table tests; bad input; FP8 numerics (the conversions
against the formats' definitions, the -q training path against fp64). GPU part: the GPU trainer
against the CPU twin, skipped with a reason when there is no GPU. One line per check, then "N
passed, M failed"; the exit status is non-zero on any failure.

Builds with nvcc (as CUDA) or with any C++ compiler (CPU part only).
*/
#define FOX_NO_MAIN
#define FOX_TEST_HOOKS
#ifdef __CUDACC__
#include "train_fox.cu" // the GPU trainer, which includes the CPU twin
#else
#include "train_fox.c"
#endif
#include "dev/fox_hf.c" // HF export and import
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>

static int tests_passed = 0, tests_failed = 0;

static void check(int ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok) { tests_passed++; } else { tests_failed++; }
}

// ----------------------------------------------------------------------------
// debug-state files of the reference (.fxds; the format: dev/compare_debug_states.py)

enum { DS_F32 = 0, DS_I32 = 1, DS_TEXT = 2, DS_F64 = 3 };

typedef struct {
    char name[256];
    int dtype;
    int ndim;
    int64_t dims[8];
    size_t numel;
    void* data;
} DebugRecord;

typedef struct {
    int n;
    DebugRecord* records;
} DebugState;

static void debug_state_read(DebugState* ds, const char* path) {
    FILE* f = fopen_check(path, "rb");
    int header[3];
    fread_check(header, sizeof(int), 3, f, path);
    if (header[0] != 20261121 || header[1] != 1 || header[2] <= 0) {
        fail("'%s' is not a version-1 debug state\nHINT: regenerate with dev/fox_reference.py", path);
    }
    ds->n = header[2];
    ds->records = (DebugRecord*)calloc_check((size_t)ds->n, sizeof(DebugRecord), "debug records");
    for (int i = 0; i < ds->n; i++) {
        DebugRecord* r = &ds->records[i];
        int len;
        fread_check(&len, sizeof(int), 1, f, path);
        if (len <= 0 || len >= (int)sizeof(r->name)) { fail("'%s': bad record name length %d", path, len); }
        fread_check(r->name, 1, (size_t)len, f, path);
        fread_check(&r->dtype, sizeof(int), 1, f, path);
        fread_check(&r->ndim, sizeof(int), 1, f, path);
        if (r->ndim < 1 || r->ndim > 8 || r->dtype < 0 || r->dtype > 3) {
            fail("'%s': bad record '%s'", path, r->name);
        }
        fread_check(r->dims, sizeof(int64_t), (size_t)r->ndim, f, path);
        r->numel = 1;
        for (int d = 0; d < r->ndim; d++) { r->numel *= (size_t)r->dims[d]; }
        size_t elem = r->dtype == DS_F64 ? 8 : r->dtype == DS_TEXT ? 1 : 4;
        r->data = malloc_check(r->numel * elem + 1, "debug record");
        fread_check(r->data, elem, r->numel, f, path);
        if (r->dtype == DS_TEXT) { ((char*)r->data)[r->numel] = '\0'; }
    }
    fclose(f);
}

static void debug_state_free(DebugState* ds) {
    for (int i = 0; i < ds->n; i++) { free(ds->records[i].data); }
    free(ds->records);
}

static const DebugRecord* debug_find(const DebugState* ds, const char* name) {
    for (int i = 0; i < ds->n; i++) {
        if (strcmp(ds->records[i].name, name) == 0) { return &ds->records[i]; }
    }
    return NULL;
}

// the training settings of a debug state, next to the model configuration
typedef struct {
    int B, T, n_steps;
    int documents, eot; // documents kept apart at the token eot (train_fox -f 1; the model's doc_eot)
    AdamWConfig opt;
    LRSchedule sched;
} DebugTraining;

static void debug_config(const DebugState* ds, FoxConfig* c, DebugTraining* tr) {
    const DebugRecord* r = debug_find(ds, "config");
    if (r == NULL) { fail("debug state has no config"); }
    memset(c, 0, sizeof(*c));
    memset(tr, 0, sizeof(*tr));
    char* text = strdup((const char*)r->data);
    for (char* line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char* eq = strchr(line, '=');
        if (eq == NULL) { continue; }
        *eq = '\0';
        const char* key = line;
        const char* value = eq + 1;
        if (config_set(c, key, value) != 0) { continue; }
        double v = atof(value);
        if (strcmp(key, "batch") == 0) { tr->B = (int)v; }
        else if (strcmp(key, "seq_len") == 0) { tr->T = (int)v; }
        else if (strcmp(key, "n_steps") == 0) { tr->n_steps = (int)v; }
        else if (strcmp(key, "documents") == 0) { tr->documents = (int)v; }
        else if (strcmp(key, "eot") == 0) { tr->eot = (int)v; }
        else if (strcmp(key, "lr") == 0) { tr->opt.lr = (float)v; tr->sched.peak_lr = v; }
        else if (strcmp(key, "weight_decay") == 0) { tr->opt.weight_decay = (float)v; }
        else if (strcmp(key, "beta1") == 0) { tr->opt.beta1 = (float)v; }
        else if (strcmp(key, "beta2") == 0) { tr->opt.beta2 = (float)v; }
        else if (strcmp(key, "adam_eps") == 0) { tr->opt.eps = (float)v; }
        else if (strcmp(key, "grad_clip") == 0) { tr->opt.grad_clip = (float)v; }
        else if (strcmp(key, "warmup_tokens") == 0) { tr->sched.warmup_tokens = v; }
        else if (strcmp(key, "total_tokens") == 0) { tr->sched.total_tokens = v; }
        else if (strcmp(key, "schedule") == 0) { tr->sched.type = parse_choice(value, SCHEDULE_NAMES, 3); }
    }
    free(text);
    tr->sched.tokens_per_step = (double)tr->B * tr->T;
}

// copies the reference's parameters (HF names) into the flat buffer; returns how many
// parameter records were used, so that a record the twin does not know is caught
static int load_debug_params(FoxModel* m, const DebugState* ds) {
    int used = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        const ParamSpec* s = &m->spec[t];
        if (s->rows == 0) { continue; }
        float* dst = param_tensor(&m->params, t);
        int layers = s->per_layer ? m->config.n_layer : 1;
        for (int l = 0; l < layers; l++) {
            char name[256];
            param_hf_name(&m->config, t, l, name, sizeof(name));
            const DebugRecord* r = debug_find(ds, name);
            size_t numel = (size_t)s->hf_rows * s->cols;
            if (r == NULL || r->dtype != DS_F32 || r->numel != numel) {
                fail("debug state lacks %s of %zu floats (the twin's tensor %s)", name, numel, s->name);
            }
            memcpy(dst + (size_t)l * param_slice_numel(s), r->data, numel * sizeof(float));
            used++;
        }
    }
    return used;
}

static int count_param_records(const DebugState* ds) {
    int n = 0;
    for (int i = 0; i < ds->n; i++) {
        const char* name = ds->records[i].name;
        if (strncmp(name, "model.", 6) == 0 || strncmp(name, "lm_head", 7) == 0) { n++; }
    }
    return n;
}

// max |a - b| / max |b|: the error relative to the tensor's scale
static double rel_error_f64(const float* a, const double* b, size_t n, size_t a_stride, size_t b_stride, size_t row) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        size_t ia = (i / row) * a_stride + i % row, ib = (i / row) * b_stride + i % row;
        double d = fabs((double)a[ia] - b[ib]);
        if (!(d <= num)) { num = d; } // NaN propagates into num
        den = fmax(den, fabs(b[ib]));
    }
    return num / den;
}

// Tolerances of the fp32 twin against the float64 reference. fp32 has eps = 6e-8; the longest
// sums here run over at most a few hundred terms (C = 32 channels, T = 24 keys, B*T = 48 rows
// for weight gradients), so the error relative to the tensor's scale stays well below 1e-5.
// Gradients pass through the whole backward and suffer cancellation: 1e-4. The 10-step losses
// compound rounding through the optimiser: 1e-4 relative. The grad norms of the last steps are
// small (the batch is nearly memorised) and carry the parameters' drift relative to that small
// value: 1e-3 (seen up to 7e-5).
#define TOL_LOGITS 1e-5
#define TOL_GRADS 1e-4
#define TOL_STEPS 1e-4
#define TOL_STEP_NORMS 1e-3

// Reads a reference fixture: its records, a short name for messages (the file name without
// ".fxds"), the model's config and training setup, and the model built with the fixture's
// weights. Returns how many parameter tensors it mapped.
static int fixture_load(const char* path, DebugState* ds, char* name, size_t name_len, FoxConfig* c, DebugTraining* tr,
                        FoxModel* m) {
    debug_state_read(ds, path);
    const char* base = strrchr(path, '/');
    base = base != NULL ? base + 1 : path;
    snprintf(name, name_len, "%.*s", (int)(strlen(base) > 5 ? strlen(base) - 5 : strlen(base)), base);
    debug_config(ds, c, tr);
    fox_build(m, c);
    m->doc_eot = tr->documents ? tr->eot : -1;
    return load_debug_params(m, ds);
}

static void test_against_reference(const char* path) {
    DebugState ds;
    char name[128];
    FoxConfig c;
    DebugTraining tr;
    FoxModel m;
    int used = fixture_load(path, &ds, name, sizeof(name), &c, &tr, &m);
    check(used == count_param_records(&ds), "%s: the twin's parameter table maps all %d reference tensors (used %d)",
          name, count_param_records(&ds), used);
    if (c.gate == GATE_BIAS_ONLY || c.gate == GATE_FIXED) {
        float want[4096];
        gate_bias_init(want, c.n_head, c.decay_time_min, c.decay_time_max);
        double err = 0.0;
        for (int h = 0; h < c.n_head; h++) { err = fmax(err, fabs(want[h] - m.params.bf[h]) / fabs(want[h])); }
        check(err <= 1e-6, "%s: gate bias init from decay times matches the reference (rel err %.1e <= 1e-6)", name,
              err);
    }
    const DebugRecord* inputs = debug_find(&ds, "inputs");
    const DebugRecord* targets = debug_find(&ds, "targets");
    int B = tr.B, T = tr.T, V = c.vocab_size, Vp = c.padded_vocab_size;
    fox_forward(&m, (const int*)inputs->data, (const int*)targets->data, B, T);
    const DebugRecord* logits = debug_find(&ds, "logits");
    double e = rel_error_f64(m.logits, (const double*)logits->data, (size_t)B * T * V, Vp, V, V);
    check(e <= TOL_LOGITS, "%s: logits (rel err %.1e <= %.0e)", name, e, TOL_LOGITS);
    double ref_loss = *(const double*)debug_find(&ds, "loss")->data;
    e = fabs(m.mean_loss - ref_loss) / fabs(ref_loss);
    check(e <= TOL_LOGITS, "%s: loss %.6f vs %.6f (rel err %.1e <= %.0e)", name, m.mean_loss, ref_loss, e, TOL_LOGITS);
    fox_zero_grad(&m);
    fox_backward(&m, 1.0f);
    double worst = 0.0;
    char worst_name[256] = "";
    int grads = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        const ParamSpec* s = &m.spec[t];
        if (s->rows == 0 || !s->trainable) { continue; }
        int layers = s->per_layer ? c.n_layer : 1;
        for (int l = 0; l < layers; l++) {
            char pname[256], gname[300];
            param_hf_name(&c, t, l, pname, sizeof(pname));
            snprintf(gname, sizeof(gname), "grad.%s", pname);
            const DebugRecord* r = debug_find(&ds, gname);
            if (r == NULL) { check(0, "%s: reference has no %s", name, gname); continue; }
            const float* g = param_tensor(&m.grads, t) + (size_t)l * param_slice_numel(s);
            double err = rel_error_f64(g, (const double*)r->data, r->numel, r->numel, r->numel, r->numel);
            grads++;
            if (!(err <= worst)) { worst = err; snprintf(worst_name, sizeof(worst_name), "%s", pname); }
        }
    }
    check(worst <= TOL_GRADS, "%s: all %d gradient tensors (worst rel err %.1e in %s <= %.0e)", name, grads, worst,
          worst_name, TOL_GRADS);
    // N optimiser steps on the same batch
    const double* ref_lr = (const double*)debug_find(&ds, "step_lr")->data;
    const double* ref_sl = (const double*)debug_find(&ds, "step_loss")->data;
    const double* ref_gn = (const double*)debug_find(&ds, "step_grad_norm")->data;
    double e_lr = 0, e_loss = 0, e_norm = 0;
    for (int step = 0; step < tr.n_steps; step++) {
        fox_forward(&m, (const int*)inputs->data, (const int*)targets->data, B, T);
        fox_zero_grad(&m);
        fox_backward(&m, 1.0f);
        double norm = fox_grad_norm(&m);
        if (tr.opt.grad_clip > 0) { fox_clip_grads(&m, norm, tr.opt.grad_clip); }
        double lr = lr_at_tokens(&tr.sched, step * tr.sched.tokens_per_step);
        fox_update(&m, &tr.opt, (float)lr, step + 1);
        e_lr = fmax(e_lr, fabs(lr - ref_lr[step]) / fmax(ref_lr[step], 1e-30));
        double el = fabs(m.mean_loss - ref_sl[step]) / fabs(ref_sl[step]);
        double en = fabs(norm - ref_gn[step]) / fabs(ref_gn[step]);
        e_loss = isnan(el) ? INFINITY : fmax(e_loss, el);
        e_norm = isnan(en) ? INFINITY : fmax(e_norm, en);
    }
    check(e_lr <= 1e-9 && e_loss <= TOL_STEPS && e_norm <= TOL_STEP_NORMS,
          "%s: %d AdamW steps: lr (rel err %.1e <= 1e-9), losses (%.1e <= %.0e), "
          "grad norms (%.1e <= %.0e); last loss %.4f",
          name, tr.n_steps, e_lr, e_loss, TOL_STEPS, e_norm, TOL_STEP_NORMS, ref_sl[tr.n_steps - 1]);
    fox_free(&m);
    debug_state_free(&ds);
}

static void test_reference_fixtures(void) {
    glob_t g;
    if (glob("dev/fixtures/*.fxds", 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        check(0, "reference fixtures: none found in dev/fixtures "
                 "(run /usr/bin/python3 dev/fox_reference.py --all --out dev/fixtures)");
        return;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) { test_against_reference(g.gl_pathv[i]); }
    globfree(&g);
}

// A wrong model must fail the reference check: the fox-pro fixture run with the k shift
// switched off in the twin (weights otherwise identical) gives logits far outside tolerance.
static void test_reference_check_discriminates(void) {
    DebugState ds;
    debug_state_read(&ds, "dev/fixtures/fox-pro.fxds");
    FoxConfig c;
    DebugTraining tr;
    debug_config(&ds, &c, &tr);
    FoxModel m;
    fox_build(&m, &c);
    load_debug_params(&m, &ds);
    m.config.k_shift = 0;
    fox_forward(&m, (const int*)debug_find(&ds, "inputs")->data, NULL, tr.B, tr.T);
    const DebugRecord* logits = debug_find(&ds, "logits");
    double e = rel_error_f64(m.logits, (const double*)logits->data, (size_t)tr.B * tr.T * c.vocab_size,
                             c.padded_vocab_size, c.vocab_size, c.vocab_size);
    check(e > 100 * TOL_LOGITS,
          "negative control: fox-pro with the k shift dropped misses the reference (rel err %.1e > %.0e)", e,
          100 * TOL_LOGITS);
    fox_free(&m);
    debug_state_free(&ds);
}

// ----------------------------------------------------------------------------
// finite differences on the twin itself

// the loss of the model's current parameters on a fixed batch
static double loss_at(FoxModel* m, const int* inputs, const int* targets, int B, int T) {
    fox_forward(m, inputs, targets, B, T);
    return m->mean_loss;
}

// Central differences in fp32 with step h = 1e-2 on the entries with the largest gradients,
// the error measured relative to the tensor's largest gradient (as the reference checks do):
// the fp32 forward's rounding noise on the loss, about 1e-6 * loss, becomes 1e-6 * 5 / (2h) =
// 2.5e-4 in the difference quotient, and the truncation error is O(h^2), so 2e-2 of the scale
// is expected of a correct gradient and missed by a wrong one (a dropped term or a sign flips
// it by far more).
static void fd_check_tensor(FoxModel* m, int tensor, const int* inputs, const int* targets, int B, int T,
                            const char* what) {
    float* p = param_tensor(&m->params, tensor);
    const float* g = param_tensor(&m->grads, tensor);
    size_t n = param_numel(&m->spec[tensor], m->config.n_layer);
    // the 4 entries with the largest gradients
    size_t idx[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4; k++) {
        float best = -1.0f;
        for (size_t i = 0; i < n; i++) {
            int taken = 0;
            for (int j = 0; j < k; j++) { taken |= idx[j] == i; }
            if (!taken && fabsf(g[i]) > best) { best = fabsf(g[i]); idx[k] = i; }
        }
    }
    double worst = 0.0, scale = fmax(fabs(g[idx[0]]), 1e-8);
    for (int k = 0; k < 4 && (size_t)k < n; k++) {
        float old = p[idx[k]];
        const float h = 1e-2f;
        p[idx[k]] = old + h;
        double lp = loss_at(m, inputs, targets, B, T);
        p[idx[k]] = old - h;
        double lm = loss_at(m, inputs, targets, B, T);
        p[idx[k]] = old;
        double fd = (lp - lm) / (2.0 * h);
        worst = fmax(worst, fabs(fd - g[idx[k]]) / scale);
    }
    check(worst <= 2e-2, "finite differences: %s (4 largest entries, worst err %.1e of the largest <= 2e-2)", what,
          worst);
}

static void test_finite_differences(void) {
    const char* fixtures[] = {"dev/fixtures/fox-pro.fxds", "dev/fixtures/fox-pro-gate-bias_only.fxds",
                              "dev/fixtures/fox-pro-documents.fxds"};
    for (int f = 0; f < 3; f++) {
        DebugState ds;
        char name[128];
        FoxConfig c;
        DebugTraining tr;
        FoxModel m;
        fixture_load(fixtures[f], &ds, name, sizeof(name), &c, &tr, &m);
        const int* inputs = (const int*)debug_find(&ds, "inputs")->data;
        const int* targets = (const int*)debug_find(&ds, "targets")->data;
        fox_forward(&m, inputs, targets, tr.B, tr.T);
        fox_zero_grad(&m);
        fox_backward(&m, 1.0f);
        char what[160];
        const char* docs = tr.documents ? ", documents apart" : "";
        snprintf(what, sizeof(what), "%s d(gate bias), through d(log f) and the reverse cumsum%s", GATE_NAMES[c.gate],
                 docs);
        fd_check_tensor(&m, P_BF, inputs, targets, tr.B, tr.T, what);
        snprintf(what, sizeof(what), "full gate d(w_f)%s", docs);
        if (c.gate == GATE_FULL) { fd_check_tensor(&m, P_WF, inputs, targets, tr.B, tr.T, what); }
        if (f != 1) {
            const char* names[] = {"k shift d(w_s)", "v shift d(w_s)", "k projection through the shift"};
            int tensors[] = {P_WK_SHIFT, P_WV_SHIFT, P_WK};
            for (int i = 0; i < 3; i++) {
                snprintf(what, sizeof(what), "%s%s", names[i], docs);
                fd_check_tensor(&m, tensors[i], inputs, targets, tr.B, tr.T, what);
            }
        }
        fox_free(&m);
        debug_state_free(&ds);
    }
}

// Gradient accumulation as the trainers do it: fox_zero_grad once, then per micro-batch of B
// sequences fox_forward and fox_backward(1 / accum), against one forward and backward of the
// accum * B sequences with scale 1. Each gradient element is the same sum of per-token terms,
// only grouped otherwise (bias and norm-scale gradients: one partial sum per micro-batch; the
// per-token scale (1/accum)/(B*T) is 1/(accum*B*T) in fp32 here, B*T = 32 being a power of two).
// fp32 sums of a few hundred terms regrouped differ by a few ulps of their largest partial sums,
// which here are within a small factor of the tensor's largest gradient: 1e-6 of max |g| per
// tensor is several times the few 1e-7 that a regrouping costs, and far below the error of a
// wrong scale (scale 1 instead of 1/accum makes every gradient accum times too large: an error
// of accum - 1 times max |g|). Returns the worst tensor's max |g_accum - g_full| / max |g_full|.
static double accumulation_error(FoxModel* m, const int* inputs, const int* targets, int B, int T, int accum,
                                 float scale, int* worst_tensor) {
    size_t n = m->num_parameters, bt = (size_t)B * T;
    float* full = (float*)malloc_check(n * sizeof(float), "test");
    fox_zero_grad(m);
    fox_forward(m, inputs, targets, accum * B, T);
    fox_backward(m, 1.0f);
    memcpy(full, m->grads_memory, n * sizeof(float));
    fox_zero_grad(m);
    for (int micro = 0; micro < accum; micro++) {
        fox_forward(m, inputs + micro * bt, targets + micro * bt, B, T);
        fox_backward(m, scale);
    }
    double worst = 0.0;
    size_t offset = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        size_t numel = param_numel(&m->spec[t], m->config.n_layer);
        double mx = 0.0, diff = 0.0;
        for (size_t i = offset; i < offset + numel; i++) {
            mx = fmax(mx, fabs(full[i]));
            diff = fmax(diff, fabs((double)m->grads_memory[i] - full[i]));
        }
        if (numel > 0 && mx > 0.0 && diff / mx > worst) { worst = diff / mx; *worst_tensor = t; }
        offset += numel;
    }
    free(full);
    return worst;
}

// one AdamW step of a twin on one batch; returns the gradient norm
static double twin_step(FoxModel* m, const int* inputs, const int* targets, int B, int T, const AdamWConfig* opt,
                        float lr, int step) {
    fox_forward(m, inputs, targets, B, T);
    fox_zero_grad(m);
    fox_backward(m, 1.0f);
    double norm = fox_grad_norm(m);
    if (opt->grad_clip > 0) { fox_clip_grads(m, norm, opt->grad_clip); }
    fox_update(m, opt, lr, step);
    return norm;
}

// fox-pro-tiny with a vocabulary of V tokens, initialised from seed
static void tiny_model(FoxModel* m, int V, uint64_t seed) {
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    c.vocab_size = V; c.padded_vocab_size = padded_vocab(V);
    fox_build(m, &c);
    fox_init(m, seed);
}

static void quiet_stdout(int on);

#ifdef _OPENMP
// One clipped AdamW step of fox-pro-tiny (FoX Pro: every component on; docs_fp8: documents kept apart and FP8
// matmuls too) with every parallel loop split over `threads` threads (test hook parallel_always), however small: its
// loss, gradient norm and the logits, gradients and weights after it, one buffer.
static float* step_on_threads(int threads, int docs_fp8, float* loss, double* norm, size_t* count) {
    enum { B = 2, T = 24, V = 300, EOT = 5 };
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads); // before the activations: attention_forward's scratch has a row per thread
    test_hooks.parallel_always = 1;
    FoxModel m;
    tiny_model(&m, V, 23);
    int inputs[B * T], targets[B * T];
    uint64_t rng = 29;
    for (int i = 0; i < B * T; i++) { inputs[i] = (int)(rng_next(&rng) % V); targets[i] = (int)(rng_next(&rng) % V); }
    AdamWConfig opt = {1e-3f, 0.1f, 0.9f, 0.95f, 1e-8f, 0.5f}; // clipped: the norm is ~4 here
    if (docs_fp8) { // documents (starts at 0, 7, 8 and 30 of the 48 tokens) and FP8 matmuls, calibrated first
        m.doc_eot = EOT;
        inputs[0] = inputs[7] = inputs[8] = inputs[30] = EOT;
        fp8_setup(&m, FP8_MODE_HYBRID);
        fp8_step_begin(&m);
        quiet_stdout(1);
        fp8_calibrate(&m, inputs, targets, B, T, 1.0f, 1);
        quiet_stdout(0);
    }
    *norm = twin_step(&m, inputs, targets, B, T, &opt, 1e-3f, 1);
    *loss = m.mean_loss;
    if (docs_fp8) { fp8_step_end(&m, 1, 1); }
    size_t nl = (size_t)B * T * m.config.padded_vocab_size, np = m.num_parameters;
    *count = nl + 2 * np;
    float* out = (float*)malloc_check(*count * sizeof(float), "test");
    memcpy(out, m.logits, nl * sizeof(float)); // dlogits: the backward turns the logits into their gradient
    memcpy(out + nl, m.grads_memory, np * sizeof(float));
    memcpy(out + nl + np, m.params_memory, np * sizeof(float));
    fox_free(&m);
    test_hooks.parallel_always = 0;
    omp_set_num_threads(saved);
    return out;
}

// Every sum of the twin runs in an order of its own (sum_squares in fixed blocks), never in the order threads
// finish: a training step gives the same bits on 1, 2, 3 and 7 threads, every loop split among them.
static void test_thread_count_bits(void) {
    for (int docs_fp8 = 0; docs_fp8 <= 1; docs_fp8++) {
        float loss1; double norm1; size_t n1;
        float* one = step_on_threads(1, docs_fp8, &loss1, &norm1, &n1);
        int threads[] = {2, 3, 7};
        for (int i = 0; i < 3; i++) {
            float loss; double norm; size_t n;
            float* many = step_on_threads(threads[i], docs_fp8, &loss, &norm, &n);
            int same = n == n1 && memcmp(many, one, n * sizeof(float)) == 0
                       && memcmp(&loss, &loss1, sizeof(float)) == 0 && memcmp(&norm, &norm1, sizeof(double)) == 0;
            check(same, "threads: a clipped AdamW step%s on %d threads equals 1 thread's bit for bit (loss %.6f, norm "
                  "%.6f; dlogits, gradients, weights)", docs_fp8 ? " with documents and -q hybrid" : "", threads[i],
                  loss, norm);
            free(many);
        }
        free(one);
    }
}

// the default thread count: the processors, at most THREADS_DEFAULT_MAX, unless OMP_NUM_THREADS is set; a loop
// goes parallel from PARALLEL_MIN_WORK iterations a thread
static void test_threads(void) {
    int saved = omp_get_max_threads();
    const char* env = getenv("OMP_NUM_THREADS");
    char* kept = env != NULL ? strdup(env) : NULL;
    const int most = THREADS_DEFAULT_MAX;
    int rule = threads_default(1) == 1 && threads_default(2) == 2 && threads_default(most) == most &&
               threads_default(most + 1) == most && threads_default(8 * most) == most;
    unsetenv("OMP_NUM_THREADS");
    omp_set_num_threads(37);
    threads_init();
    int unset = omp_get_max_threads();
    setenv("OMP_NUM_THREADS", "37", 1);
    omp_set_num_threads(37);
    threads_init();
    int set = omp_get_max_threads();
    if (kept != NULL) { setenv("OMP_NUM_THREADS", kept, 1); } else { unsetenv("OMP_NUM_THREADS"); }
    free(kept);
    check(rule && unset == threads_default(omp_get_num_procs()) && set == 37, "threads: the default is the %d "
          "processors, at most %d (%d), OMP_NUM_THREADS=37 keeps 37 (%d)", omp_get_num_procs(), THREADS_DEFAULT_MAX,
          unset, set);
    omp_set_num_threads(5);
    size_t w = (size_t)PARALLEL_MIN_WORK * 5;
    check(!parallel_pays(0) && !parallel_pays(w - 1) && parallel_pays(w), "threads: a loop of 5 threads goes "
          "parallel from %zu iterations (%d a thread)", w, PARALLEL_MIN_WORK);
    omp_set_num_threads(saved);
}
#else
static void test_thread_count_bits(void) { printf("skipped: thread counts (built without OpenMP)\n"); }
static void test_threads(void) { printf("skipped: the default thread count (built without OpenMP)\n"); }
#endif

static void test_grad_accumulation(void) {
    enum { B = 2, T = 16, MAX_ACCUM = 3, V = 300 };
    FoxModel m;
    tiny_model(&m, V, 11);
    for (size_t i = 0; i < m.num_parameters; i++) { m.params_memory[i] *= 3.0f; } // gates, attention far from uniform
    fox_ensure_activations(&m, MAX_ACCUM * B, T); // sized once, for the largest batch
    int inputs[MAX_ACCUM * B * T], targets[MAX_ACCUM * B * T];
    uint64_t rng = 17;
    for (int i = 0; i < MAX_ACCUM * B * T; i++) {
        inputs[i] = (int)(rng_next(&rng) % V);
        targets[i] = (int)(rng_next(&rng) % V);
    }
    for (int accum = 2; accum <= MAX_ACCUM; accum++) {
        int worst_t = 0, wrong_t = 0;
        double err = accumulation_error(&m, inputs, targets, B, T, accum, 1.0f / accum, &worst_t);
        double wrong = accumulation_error(&m, inputs, targets, B, T, accum, 1.0f, &wrong_t);
        check(err <= 1e-6, "grad accumulation: %d micro-batches of %d x %d with scale 1/%d against one batch of %d: "
              "every gradient tensor within %.1e of its max |g| <= 1e-6 (worst %s)", accum, B, T, accum, accum * B,
              err, m.spec[worst_t].name);
        check(wrong >= accum - 1.5, "grad accumulation: negative control, scale 1 instead of 1/%d is off by %.2f "
              "of max |g| (want about %d)", accum, wrong, accum - 1);
    }
    fox_free(&m);
}

// The attention backward alone: d(log f) by the reverse cumsum of dc, against central
// differences of L = sum(o * w) in each log f_t; and dlogf_0 = 0 (c_0 cancels in every row).
static void test_attention_dlogf(void) {
    const int B = 1, T = 12, H = 1, hd = 8;
    size_t N = (size_t)B * T * H * hd;
    float q[96], k[96], v[96], w[96], o[96], dq[96], dk[96], dv[96];
    float logf_[12], c[12], lse[12], dc[12], dlogf[12];
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    float* scratch = (float*)calloc_check((size_t)threads * 2 * T, sizeof(float), "attention rows");
    uint64_t rng = 42;
    for (size_t i = 0; i < N; i++) {
        q[i] = (float)rng_normal(&rng); k[i] = (float)rng_normal(&rng);
        v[i] = (float)rng_normal(&rng); w[i] = (float)rng_normal(&rng);
    }
    for (int t = 0; t < T; t++) { logf_[t] = -0.05f - 0.5f * (float)rng_uniform(&rng); }
    // the loss is L = sum(o * w), so dout = w
    c[0] = logf_[0];
    for (int t = 1; t < T; t++) { c[t] = c[t - 1] + logf_[t]; }
    attention_forward(o, lse, q, k, v, c, NULL, B, T, H, hd, 0, NULL, scratch);
    memset(dq, 0, sizeof(dq)); memset(dk, 0, sizeof(dk)); memset(dv, 0, sizeof(dv)); memset(dc, 0, sizeof(dc));
    attention_backward(dq, dk, dv, dc, w, q, k, v, o, lse, c, NULL, B, T, H, hd, 0, NULL);
    float acc = 0.0f;
    for (int t = T - 1; t >= 0; t--) { acc += dc[t]; dlogf[t] = acc; }
    double worst = 0.0, scale = 0.0;
    for (int t = 0; t < T; t++) { scale = fmax(scale, fabs(dlogf[t])); }
    for (int t = 1; t < T; t++) {
        double lpm[2];
        for (int s = 0; s < 2; s++) {
            float lf[12], cc[12];
            memcpy(lf, logf_, sizeof(lf));
            lf[t] += s == 0 ? 1e-2f : -1e-2f;
            cc[0] = lf[0];
            for (int u = 1; u < T; u++) { cc[u] = cc[u - 1] + lf[u]; }
            attention_forward(o, lse, q, k, v, cc, NULL, B, T, H, hd, 0, NULL, scratch);
            double sum = 0.0;
            for (size_t i = 0; i < N; i++) { sum += (double)o[i] * w[i]; }
            lpm[s] = sum;
        }
        double fd = (lpm[0] - lpm[1]) / 2e-2;
        worst = fmax(worst, fabs(fd - dlogf[t]) / scale);
    }
    check(worst <= 2e-2,
          "attention backward: d(log f) against finite differences (worst err %.1e of its scale <= 2e-2)", worst);
    check(fabs(dlogf[0]) <= 1e-5 * scale,
          "attention backward: d(log f_0) = %.1e, zero as c_0 cancels (<= 1e-5 of scale %.2f)", dlogf[0], scale);
    free(scratch);
}

// ----------------------------------------------------------------------------
// adaptive computation pruning (train_fox.c: prune_bound, prune_tiles, the pruned attention)

typedef struct {
    double w_max;      // largest share of a row's dense weight on pruned keys (must be <= eps)
    double excess;     // largest |pruned - dense| beyond its bound, over o, lse, dq, dk, dv, dc
    double skipped;    // share of the visible tiles skipped
    int tables_agree;  // key_start and query_end describe the same tiles
    double doc_skipped; // with documents: share of the tiles the document-only tables (no decay bound) skip
    int doc_exact;      // with documents: attention with those tables bit-identical to dense
} PruneResult;

// Pruned against dense attention on one random case. The bounds, per row i with dense weights p,
// pruned share w_i and kept weights p' = p / (1 - w_i) (0 on pruned keys), |p' - p| summing to 2 w_i:
//   |o'_i - o_i| <= w_i range_j(v_j)            |lse'_i - lse_i| = -ln(1 - w_i)
//   |ds'_ij - ds_ij| <= E_ij = |p'_ij - p_ij| |dp_ij - Delta_i| + p'_ij |dO_i|_1 w_i range(v)
//   |dq'_i| <= scale sum_j E_ij |k_j|, |dk'_j| <= scale sum_i E_ij |q_i|,
//   |dv'_j| <= sum_i |p'_ij - p_ij| |dO_i|, |dc'_t| <= sum_j E_tj + sum_i E_it (differences)
// each plus fp32 rounding: FTOL of the tensor's largest magnitude (sums of up to T terms in fp32).
// doc_len > 0: documents kept apart, each token starting one with probability 1 / doc_len, c restarted at
// each; the tables then also skip the tiles before a document (exact), which a second set of tables
// without the decay bound must do alone, bit-identical to dense.
#define PRUNE_FTOL 1e-5
static float* prune_buf(size_t n) { return (float*)calloc_check(n, sizeof(float), "pruning test"); }
static int prune_doc_visible(const int* doc, int b, int T, int block, int qt, int kt) {
    return doc == NULL || kt == qt || kt * block + block - 1 >= doc[(size_t)b * T + qt * block];
}

// prune_case's documents (doc): the tables of the document tiles alone (no decay bound) skip exactly the tiles no
// pair of which is visible, fewer than with the bound, and the pruned run on them has the dense run's bits (o[0] ..)
static void prune_doc_exact(PruneResult* res, const AttnPrune* pr, int* tables, const float* q, const float* k,
                            const float* v, const float* dout, const float* c, const int* doc, float* const* o,
                            float* const* lse, float* const* dq, float* const* dk, float* const* dv, float* const* dc,
                            int B, int T, int H, int hd, int window, float ln_eps, float* scratch) {
    int block = pr->block, nt = (T + block - 1) / block; // tables: pr's key_start, then its query_end
    size_t n = (size_t)B * T * H * hd, nh = (size_t)B * H * T;
    int* both = (int*)malloc_check((nh / T) * nt * sizeof(int), "tiles");
    memcpy(both, tables, (nh / T) * nt * sizeof(int));
    prune_tiles(tables, tables + (nh / T) * nt, c, NULL, doc, B, H, T, block, ln_eps);
    float *o2 = prune_buf(n), *lse2 = prune_buf(nh);
    float *dq2 = prune_buf(n), *dk2 = prune_buf(n), *dv2 = prune_buf(n), *dc2 = prune_buf(nh);
    attention_forward(o2, lse2, q, k, v, c, doc, B, T, H, hd, window, pr, scratch);
    attention_backward(dq2, dk2, dv2, dc2, dout, q, k, v, o2, lse2, c, doc, B, T, H, hd, window, pr);
    res->doc_exact = memcmp(o2, o[0], n * sizeof(float)) == 0 && memcmp(lse2, lse[0], nh * sizeof(float)) == 0
                     && memcmp(dq2, dq[0], n * sizeof(float)) == 0 && memcmp(dk2, dk[0], n * sizeof(float)) == 0
                     && memcmp(dv2, dv[0], n * sizeof(float)) == 0 && memcmp(dc2, dc[0], nh * sizeof(float)) == 0;
    double all = 0.0, doc_skipped = 0.0;
    for (size_t bh = 0; bh < nh / T; bh++) {
        for (int qt = 0; qt < nt; qt++) {
            all += qt + 1;
            doc_skipped += tables[bh * nt + qt];
            res->doc_exact &= tables[bh * nt + qt] <= both[bh * nt + qt]; // the decay bound skips them too
            for (int kt = 0; kt < qt; kt++) { // exactly the tiles no pair of which is visible
                int skip = kt < tables[bh * nt + qt];
                res->doc_exact &= skip == !prune_doc_visible(doc, (int)(bh / H), T, block, qt, kt);
                res->tables_agree &= skip == (qt >= tables[(nh / T) * nt + bh * nt + kt]);
            }
        }
    }
    res->doc_skipped = doc_skipped / all;
    free(o2); free(lse2); free(dq2); free(dk2); free(dv2); free(dc2); free(both);
}

static PruneResult prune_case(int T, int H, int hd, int window, int block, double rate, float sigma, float ln_eps,
                              int doc_len, uint64_t seed) {
    const int B = 2;
    size_t n = (size_t)B * T * H * hd, nh = (size_t)B * H * T, C = (size_t)H * hd;
    int nt = (T + block - 1) / block, threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    float *q = prune_buf(n), *k = prune_buf(n), *v = prune_buf(n), *dout = prune_buf(n), *c = prune_buf(nh);
    float *o[2], *lse[2], *dq[2], *dk[2], *dv[2], *dc[2];
    for (int r = 0; r < 2; r++) {
        o[r] = prune_buf(n); dq[r] = prune_buf(n); dk[r] = prune_buf(n); dv[r] = prune_buf(n);
        lse[r] = prune_buf(nh); dc[r] = prune_buf(nh);
    }
    float* scratch = prune_buf((size_t)threads * 2 * T);
    uint64_t s = seed;
    float* in[] = {q, k, v, dout};
    for (int a = 0; a < 4; a++) {
        for (size_t i = 0; i < n; i++) { in[a][i] = (a < 2 ? sigma : 1.0f) * (float)rng_normal(&s); }
    }
    int* doc = doc_len > 0 ? (int*)calloc_check((size_t)B * T, sizeof(int), "documents") : NULL;
    for (int b = 0; b < B && doc != NULL; b++) {
        int start = 0;
        for (int t = 1; t < T; t++) {
            if (rng_uniform(&s) * doc_len < 1.0) { start = t; }
            doc[(size_t)b * T + t] = start;
        }
    }
    for (size_t bh = 0; bh < nh / T; bh++) {
        float acc = 0.0f;
        for (int t = 0; t < T; t++) {
            if (starts_context(doc, bh / H * T + t, t)) { acc = 0.0f; }
            acc += (float)(-rate * (0.5 + rng_uniform(&s)));
            c[bh * T + t] = acc;
        }
    }
    float* U = prune_buf(nh / T);
    int* tables = (int*)calloc_check(2 * (nh / T) * nt, sizeof(int), "tiles");
    prune_bound(U, q, k, B, T, H, hd);
    prune_tiles(tables, tables + (nh / T) * nt, c, U, doc, B, H, T, block, ln_eps);
    AttnPrune pr = {block, tables};
    for (int r = 0; r < 2; r++) { // r = 0 dense, 1 pruned
        attention_forward(o[r], lse[r], q, k, v, c, doc, B, T, H, hd, window, r ? &pr : NULL, scratch);
        attention_backward(dq[r], dk[r], dv[r], dc[r], dout, q, k, v, o[r], lse[r], c, doc, B, T, H, hd, window,
                           r ? &pr : NULL);
    }
    PruneResult res = {0.0, -INFINITY, 0.0, 1, 0.0, 0};
    double visible = 0.0, skipped = 0.0;
    for (size_t bh = 0; bh < nh / T; bh++) {
        const int *ks = tables + bh * nt, *qe = tables + (nh / T) * nt + bh * nt;
        for (int qt = 0; qt < nt; qt++) {
            for (int kt = 0; kt <= qt; kt++) {
                int win_ok = window == 0 || kt * block + block - 1 > qt * block - window; // some pair visible
                win_ok &= prune_doc_visible(doc, (int)(bh / H), T, block, qt, kt);
                visible += win_ok; skipped += win_ok && kt < ks[qt];
                res.tables_agree &= (kt < ks[qt]) == (qt >= qe[kt]);
            }
        }
    }
    res.skipped = skipped / fmax(visible, 1.0);
    // bounds, in double, from the dense run
    double *bo = (double*)calloc_check(n, sizeof(double), "bound"),
           *bq = (double*)calloc_check(n, sizeof(double), "bound");
    double *bk = (double*)calloc_check(n, sizeof(double), "bound"),
           *bv = (double*)calloc_check(n, sizeof(double), "bound");
    double *bc = (double*)calloc_check(nh, sizeof(double), "bound"),
           *bl = (double*)calloc_check(nh, sizeof(double), "bound");
    double* p = (double*)calloc_check((size_t)T, sizeof(double), "row");
    float scale = 1.0f / sqrtf((float)hd);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t bh = (size_t)b * H + h;
            const float* ch = c + bh * T;
            for (int i = 0; i < T; i++) {
                int doc_i = doc != NULL ? doc[(size_t)b * T + i] : 0;
                int j0 = attention_first_key_pruned(i, window, doc_i, NULL, bh, T);
                int jp = attention_first_key_pruned(i, window, doc_i, &pr, bh, T);
                size_t oi = ((size_t)b * T + i) * C + (size_t)h * hd;
                double w = 0.0, delta = 0.0, g1 = 0.0, vmin[256], vmax[256];
                for (int d = 0; d < hd; d++) {
                    vmin[d] = INFINITY;
                    vmax[d] = -INFINITY;
                    delta += (double)dout[oi + d] * o[0][oi + d];
                    g1 += fabs(dout[oi + d]);
                }
                for (int j = j0; j <= i; j++) {
                    size_t oj = ((size_t)b * T + j) * C + (size_t)h * hd;
                    double dot = 0.0;
                    for (int d = 0; d < hd; d++) {
                        dot += (double)q[oi + d] * k[oj + d];
                        vmin[d] = fmin(vmin[d], v[oj + d]);
                        vmax[d] = fmax(vmax[d], v[oj + d]);
                    }
                    p[j] = exp(dot * scale + ch[i] - ch[j] - lse[0][bh * T + i]);
                    if (j < jp) { w += p[j]; }
                }
                res.w_max = fmax(res.w_max, w);
                for (int d = 0; d < hd; d++) { bo[oi + d] = w * (vmax[d] - vmin[d]); }
                bl[bh * T + i] = -log1p(-fmin(w, 0.5));
                double range = 0.0;
                for (int d = 0; d < hd; d++) { range = fmax(range, vmax[d] - vmin[d]); }
                for (int j = j0; j <= i; j++) {
                    size_t oj = ((size_t)b * T + j) * C + (size_t)h * hd;
                    double pp = j < jp ? 0.0 : p[j] / (1.0 - w), dp = 0.0;
                    for (int d = 0; d < hd; d++) { dp += (double)dout[oi + d] * v[oj + d]; }
                    double dpij = fabs(pp - p[j]), E = dpij * fabs(dp - delta) + pp * g1 * w * range;
                    for (int d = 0; d < hd; d++) {
                        bq[oi + d] += scale * E * fabs(k[oj + d]);
                        bk[oj + d] += scale * E * fabs(q[oi + d]);
                        bv[oj + d] += dpij * fabs(dout[oi + d]);
                    }
                    bc[bh * T + i] += E; bc[bh * T + j] += E;
                }
            }
        }
    }
    const float* got[] = {o[1], lse[1], dq[1], dk[1], dv[1], dc[1]};
    const float* ref[] = {o[0], lse[0], dq[0], dk[0], dv[0], dc[0]};
    const double* bound[] = {bo, bl, bq, bk, bv, bc};
    for (int a = 0; a < 6; a++) {
        size_t len = a == 1 || a == 5 ? nh : n;
        double mag = 0.0;
        for (size_t i = 0; i < len; i++) { mag = fmax(mag, fabs(ref[a][i])); }
        for (size_t i = 0; i < len; i++) {
            double d = fabs((double)got[a][i] - ref[a][i]);
            res.excess = fmax(res.excess, isnan(d) ? INFINITY : d - bound[a][i] - PRUNE_FTOL * mag);
        }
    }
    // determinism: a second pruned run is bit-identical
    float* o2 = prune_buf(n);
    float* lse2 = prune_buf(nh);
    attention_forward(o2, lse2, q, k, v, c, doc, B, T, H, hd, window, &pr, scratch);
    if (memcmp(o2, o[1], n * sizeof(float)) != 0 || memcmp(lse2, lse[1], nh * sizeof(float)) != 0) {
        res.excess = INFINITY;
    }
    if (doc != NULL) {
        prune_doc_exact(&res, &pr, tables, q, k, v, dout, c, doc, o, lse, dq, dk, dv, dc, B, T, H, hd, window, ln_eps,
                        scratch);
    }
    free(o2); free(lse2); free(doc);
    free(bo); free(bq); free(bk); free(bv); free(bc); free(bl); free(p); free(U); free(tables); free(scratch);
    free(q); free(k); free(v); free(dout); free(c);
    for (int r = 0; r < 2; r++) { free(o[r]); free(lse[r]); free(dq[r]); free(dk[r]); free(dv[r]); free(dc[r]); }
    return res;
}

static void test_attention_pruning(void) {
    const float ln_eps = -10.0f;
    double eps = exp(ln_eps);
    struct { int T, H, hd, window, block; double rate; float sigma; } cases[] = {
        {256, 2, 16, 0, 16, 1e-3, 0.5f},   // nearly flat gates: nothing to prune
        {256, 2, 16, 0, 16, 0.1, 0.5f},    // moderate decay
        {256, 2, 16, 0, 16, 1.0, 0.5f},    // strong decay
        {256, 2, 16, 0, 16, 3.0, 1.0f},    // very strong decay, larger U
        {300, 2, 16, 50, 16, 0.5, 0.5f},   // sliding window, T not a tile multiple
        {400, 1, 16, 0, 128, 0.5, 0.5f},   // the model's tile size
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        PruneResult r = prune_case(cases[i].T, cases[i].H, cases[i].hd, cases[i].window, cases[i].block, cases[i].rate,
                                   cases[i].sigma, ln_eps, 0, 500 + i);
        int expect_skips = cases[i].rate >= 0.1; // a case that should prune must prune something
        check(r.w_max <= eps && r.excess <= 0.0 && r.tables_agree && (!expect_skips || r.skipped > 0.0),
              "pruned attention T=%d window=%d tile %d rate %g: pruned weight %.1e <= eps %.1e per row, outputs and "
              "gradients within the bound (excess %.1e <= 0), tables %sagree, bit-identical rerun; "
              "%.0f%% of tiles skipped",
              cases[i].T, cases[i].window, cases[i].block, cases[i].rate, r.w_max, eps, r.excess,
              r.tables_agree ? "" : "NOT ", 100.0 * r.skipped);
    }
    // negative control: ln eps = +10 makes delta too large; the weight check must catch it
    PruneResult bad = prune_case(256, 2, 16, 0, 16, 0.1, 0.5f, 10.0f, 0, 502);
    check(bad.w_max > eps,
          "pruned attention negative control: ln eps = +10 prunes %.1e of a row's weight, caught by the "
          "<= eps check (%.1e)",
          bad.w_max, eps);
    // documents kept apart (-f 1): the tiles before a query tile's document are skipped too, exactly
    struct { int T, window, block, doc_len; double rate; } docs[] = {
        {256, 0, 16, 40, 1e-3}, // flat gates: only the documents prune
        {300, 50, 16, 60, 0.5}, // decay, a window, T not a tile multiple
        {400, 0, 128, 120, 0.1}, // the model's tile size
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        PruneResult r = prune_case(docs[i].T, 2, 16, docs[i].window, docs[i].block, docs[i].rate, 0.5f, ln_eps,
                                   docs[i].doc_len, 520 + i);
        check(r.w_max <= eps && r.excess <= 0.0 && r.tables_agree && r.doc_exact && r.doc_skipped > 0.0,
              "pruned attention with documents (mean length %d) T=%d window=%d tile %d rate %g: pruned weight %.1e <= "
              "eps, within the bound (excess %.1e <= 0), tables %sagree, %.0f%% of the visible tiles skipped by the "
              "decay; the document tiles alone (%.0f%% of all, skipped with the decay too) are exactly those no pair "
              "of which is visible, and attention with them is %sbit-identical to dense", docs[i].doc_len, docs[i].T,
              docs[i].window, docs[i].block, docs[i].rate, r.w_max, r.excess, r.tables_agree ? "" : "NOT ",
              100.0 * r.skipped, 100.0 * r.doc_skipped, r.doc_exact ? "" : "NOT ");
    }
}

// ----------------------------------------------------------------------------
// numerical guards and extreme forget gates

static int all_finite(const float* x, size_t n) {
    for (size_t i = 0; i < n; i++) { if (!isfinite(x[i])) { return 0; } }
    return 1;
}

static void test_step_guard(void) {
    char why[512];
    StepGuard g;
    step_guard_init(&g, NONFINITE_STOP, 0.0);
    check(step_guard_check(&g, 3.0, 1.0, why, sizeof(why)) == STEP_UPDATE, "guard: a finite step updates");
    check(step_guard_check(&g, NAN, 1.0, why, sizeof(why)) == STEP_STOP && strstr(why, "loss") != NULL,
          "guard -G stop: a NaN loss stops (\"%s\")", why);
    check(step_guard_check(&g, 3.0, INFINITY, why, sizeof(why)) == STEP_STOP && strstr(why, "gradient") != NULL,
          "guard -G stop: an infinite grad norm stops (\"%s\")", why);
    step_guard_init(&g, NONFINITE_SKIP, 0.0);
    int v1 = step_guard_check(&g, NAN, NAN, why, sizeof(why));
    int v2 = step_guard_check(&g, 3.0, 1.0, why, sizeof(why));
    int v3 = step_guard_check(&g, 3.0, -NAN, why, sizeof(why));
    check(v1 == STEP_SKIP && v2 == STEP_UPDATE && v3 == STEP_SKIP && g.skipped == 2,
          "guard -G skip: non-finite steps are skipped and counted (%ld)", g.skipped);
    // spikes: a full window of losses 3 +- 0.01 and norms 1 +- 0.01, then a loss of 3.5 (z ~ 50)
    StepGuard off, on;
    step_guard_init(&off, NONFINITE_STOP, 0.0);
    step_guard_init(&on, NONFINITE_STOP, 6.0);
    int quiet = 1;
    for (int i = 0; i < SPIKE_WINDOW + 10; i++) {
        double wobble = 0.01 * ((i * 7919) % 13 - 6) / 6.0;
        quiet &= step_guard_check(&on, 3.0 + wobble, 1.0 - wobble, why, sizeof(why)) == STEP_UPDATE;
        step_guard_check(&off, 3.0 + wobble, 1.0 - wobble, why, sizeof(why));
    }
    check(quiet && on.skipped == 0, "guard -Z 6: steady losses and norms are never skipped");
    int loss_spike = step_guard_check(&on, 3.5, 1.0, why, sizeof(why));
    check(loss_spike == STEP_SKIP && on.skipped == 1 && strstr(why, "loss spike") != NULL,
          "guard -Z 6: a loss spike is skipped (\"%s\")", why);
    int norm_spike = step_guard_check(&on, 3.0, 2.0, why, sizeof(why));
    check(norm_spike == STEP_SKIP && strstr(why, "grad norm spike") != NULL,
          "guard -Z 6: a grad-norm spike is skipped (\"%s\")", why);
    check(step_guard_check(&off, 3.5, 2.0, why, sizeof(why)) == STEP_UPDATE, "guard -Z 0: spikes are not checked");
    check(step_guard_check(&on, 3.0, 1.0, why, sizeof(why)) == STEP_UPDATE,
          "guard -Z 6: an ordinary step after the spikes updates");
    StepGuard fresh;
    step_guard_init(&fresh, NONFINITE_STOP, 6.0);
    check(step_guard_check(&fresh, 3.0, 1.0, why, sizeof(why)) == STEP_UPDATE &&
              step_guard_check(&fresh, 30.0, 1.0, why, sizeof(why)) == STEP_UPDATE,
          "guard -Z 6: no spike test before the window of %d steps is full", SPIKE_WINDOW);
}

static void test_nonfinite_grad_name(void) {
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    c.vocab_size = 300; c.padded_vocab_size = padded_vocab(300); c.n_layer = 3;
    FoxModel m;
    fox_build(&m, &c);
    char why[512] = "";
    int clean = nonfinite_grad_name(&c, m.grads_memory, why, sizeof(why));
    m.grads.wq[(size_t)c.n_embd * c.n_embd + 5] = NAN; // layer 1
    int named = nonfinite_grad_name(&c, m.grads_memory, why, sizeof(why));
    check(!clean && named && strstr(why, "model.layers.1.attn.q_proj.weight") != NULL &&
              strstr(why, "element 5") != NULL,
          "guard: a NaN in layer 1's wq gradient is named (\"%s\")", why);
    m.grads.lm_head[7] = INFINITY;
    m.grads.wq[(size_t)c.n_embd * c.n_embd + 5] = 0.0f;
    named = nonfinite_grad_name(&c, m.grads_memory, why, sizeof(why));
    check(named && strstr(why, "lm_head.weight") != NULL, "guard: an inf in the lm_head gradient is named (\"%s\")",
          why);
    fox_free(&m);
}

// Forget-gate logits far out on both sides (f = 1 and f = 0 in fp32) and cumulative sums c
// far beyond 1e5 must leave the forward and backward finite.
static void test_extreme_forget_gates(void) {
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    c.vocab_size = 300; c.padded_vocab_size = padded_vocab(300); c.n_layer = 2;
    FoxModel m;
    fox_build(&m, &c);
    fox_init(&m, 11);
    enum { B = 2, T = 16 };
    int inputs[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) { inputs[i] = (i * 37) % 300; targets[i] = (i * 53 + 1) % 300; }
    const float logits[] = {100.0f, -100.0f, 1e4f, -1e4f, 1e6f, -1e6f, 1e30f, -1e30f};
    size_t per_layer = (size_t)c.n_head * c.n_embd;
    for (size_t k = 0; k < sizeof(logits) / sizeof(logits[0]); k++) {
        memset(m.params.wf, 0, (size_t)c.n_layer * per_layer * sizeof(float));
        for (int i = 0; i < c.n_layer * c.n_head; i++) { m.params.bf[i] = logits[k]; }
        fox_forward(&m, inputs, targets, B, T);
        fox_zero_grad(&m);
        fox_backward(&m, 1.0f);
        size_t bht = (size_t)c.n_layer * B * c.n_head * T;
        float c_min = 0.0f;
        for (size_t i = 0; i < bht; i++) { c_min = fminf(c_min, m.acts.c[i]); }
        int ok = isfinite(m.mean_loss) && all_finite(m.acts.c, bht) && all_finite(m.grads_memory, m.num_parameters) &&
                 isfinite(fox_grad_norm(&m));
        check(ok, "extreme forget gate: logit %g (min c %g): loss %g, every gradient finite", logits[k], c_min,
              m.mean_loss);
    }
    fox_free(&m);
}

// ----------------------------------------------------------------------------
// configuration and schedule

static void test_config(void) {
    check(derived_mlp_hidden(768, BLOCK_LLAMA) == 2048 && derived_mlp_hidden(768, BLOCK_PRO) == 1792,
          "MLP hidden size at C=768: %d (llama, want 2048), %d (pro, want 1792)", derived_mlp_hidden(768, BLOCK_LLAMA),
          derived_mlp_hidden(768, BLOCK_PRO));
    float b[4];
    gate_bias_init(b, 4, 2.0, 128.0);
    double want[4] = {2, 8, 32, 128}, err = 0.0;
    for (int h = 0; h < 4; h++) { err = fmax(err, fabs(-1.0 / logsigmoidf(b[h]) - want[h]) / want[h]); }
    check(err <= 1e-5, "gate bias init: 4 heads over (2, 128) give decay times 2, 8, 32, 128 (rel err %.1e)", err);
    FoxConfig c;
    int ok = config_from_preset(&c, "fox-pro-125m") && c.n_layer == 12 && c.n_embd == 768 && c.n_head == 12 &&
             c.padded_vocab_size == 50304 && c.gate == GATE_FULL && c.k_shift && c.qk_norm && !c.rope;
    ok = ok && config_from_preset(&c, "transformer-llama-760m") && c.n_layer == 24 && c.n_embd == 1536 &&
         c.gate == GATE_NONE && c.rope && !c.k_shift && c.rope_theta == 500000.0f;
    ok = ok && !config_from_preset(&c, "fox-pro-1b") && !config_from_preset(&c, "fox-125m");
    check(ok, "presets: fox-pro-125m, transformer-llama-760m parse; fox-pro-1b and fox-125m are rejected");
    config_from_preset(&c, "fox-pro-tiny");
    ok = config_set(&c, "gate", "bias_only") == 1 && c.gate == GATE_BIAS_ONLY &&
         config_set(&c, "gate", "sometimes") == -1 && config_set(&c, "n_head", "0") == -1 &&
         config_set(&c, "window", "1.5") == -1 && config_set(&c, "colour", "1") == 0;
    check(ok, "overrides: valid values set, impossible values and unknown keys are refused");
    c.n_head = 3;
    check(config_problem(&c) != NULL, "config check: n_embd 128 with 3 heads is refused (%s)", config_problem(&c));
    LRSchedule s = {SCHEDULE_COSINE, 1.0, 200.0, 1000.0, 100.0};
    double l0 = lr_at_tokens(&s, 0 * s.tokens_per_step), l1 = lr_at_tokens(&s, 1 * s.tokens_per_step);
    double l2 = lr_at_tokens(&s, 2 * s.tokens_per_step), l6 = lr_at_tokens(&s, 6 * s.tokens_per_step);
    check(fabs(l0 - 0.5) < 1e-12 && fabs(l1 - 1.0) < 1e-12 && fabs(l2 - 1.0) < 1e-12 && fabs(l6 - 0.5) < 1e-12,
          "cosine schedule: warmup 0.5, 1, then 1 at the end of warmup and 0.5 half way (%g %g %g %g)", l0, l1, l2, l6);
    s.type = SCHEDULE_LINEAR;
    double lin = lr_at_tokens(&s, 6 * s.tokens_per_step);
    s.type = SCHEDULE_CONSTANT;
    double cst = lr_at_tokens(&s, 9 * s.tokens_per_step);
    check(fabs(lin - 0.5) < 1e-12 && fabs(cst - 1.0) < 1e-12, "linear schedule half way %g (0.5), constant %g (1)", lin,
          cst);
}

// The schedule of a resumed run: run_schedule from (start k, k * d tokens seen, the run's warmup) gives
// the straight run's rates bit for bit (both compute total_tokens = 100 d exactly: integers far below
// 2^53), and after a resume with another -d the rate follows the tokens seen, with the run's warmup.
static void test_schedule_resume(void) {
    const char* argv[] = {"train_fox", NULL};
    Args a;
    parse_args(&a, 1, (char**)argv);
    a.lr = 1e-3; a.steps = 100; a.total_batch_tokens = 4096;
    int same = 1, compared = 0;
    for (int type = 0; type < 3; type++) {
        for (int w = 0; w < 2; w++) {
            a.schedule = type;
            a.warmup_tokens = w == 0 ? -1 : 5 * 4096 + 100; // default (10% of the tokens) and explicit
            LRSchedule straight = run_schedule(&a, NULL);
            const int starts[] = {1, 7, 10, 37, 99};
            for (int i = 0; i < 5; i++) {
                int k = starts[i];
                TrainState at_k = {};
                at_k.step = k;
                at_k.tokens_seen = (int64_t)k * a.total_batch_tokens;
                at_k.warmup_tokens = straight.warmup_tokens;
                LRSchedule resumed = run_schedule(&a, &at_k);
                for (int step = k; step < a.steps; step++) {
                    double before = (double)step * a.total_batch_tokens;
                    same &= lr_at_tokens(&straight, before) == lr_at_tokens(&resumed, before);
                    compared++;
                }
            }
        }
    }
    check(same, "schedule: a run resumed at step 1, 7, 10, 37 or 99 of 100 gets the straight run's rates bit for bit "
          "(%d rates: 3 schedules, default and explicit warmup)", compared);
    // 30 steps of -d 4096 of a run of 100 (default warmup: 10% of 409600 tokens), then a resume with
    // -d 16384 to -x 100: the schedule's clock is the tokens seen, the warmup the run's (a new default
    // would be 10% of the new total and restart the warmup: the run was past it); the formula
    // written out here, in fp64
    a.schedule = SCHEDULE_COSINE; a.warmup_tokens = -1; a.total_batch_tokens = 16384;
    const double d1 = 4096, d2 = 16384, k = 30, S = 100;
    TrainState at_30 = {};
    at_30.step = 30;
    at_30.tokens_seen = (int64_t)(k * d1);
    at_30.warmup_tokens = 0.1 * S * d1;
    LRSchedule resumed = run_schedule(&a, &at_30);
    double total = k * d1 + (S - k) * d2, warm = 0.1 * S * d1;
    double err = 0.0, by_steps = 0.0;
    for (int step = (int)k; step < (int)S; step++) {
        double before = k * d1 + (step - k) * d2, want;
        if (before < warm) { want = 1e-3 * fmin(1.0, (before + d2) / warm); }
        else { want = 1e-3 * 0.5 * (1.0 + cos(M_PI * (before - warm) / (total - warm))); }
        err = fmax(err, fabs(lr_at_tokens(&resumed, before) - want));
        // negative control: the rate of the step's fraction of -x (a schedule that counts steps)
        double frac = (step - 0.1 * S) / (0.9 * S);
        double steps_lr = step < 0.1 * S ? 1e-3 * (step + 1) / (0.1 * S) : 1e-3 * 0.5 * (1.0 + cos(M_PI * frac));
        by_steps = fmax(by_steps, fabs(steps_lr - want));
    }
    // the same few fp64 operations, some in another order: a few ulps of the peak rate (~1e-16 of it)
    check(err <= 1e-12 * 1e-3 && resumed.total_tokens == total && resumed.warmup_tokens == warm,
          "schedule: after 30 steps of -d 4096 a resume with -d 16384 follows the tokens seen: %.0f tokens in all, "
          "warmup %.0f, rates within %.1e <= 1e-12 of the peak 1e-3 of the formula", resumed.total_tokens,
          resumed.warmup_tokens, err);
    check(by_steps > 1e-4, "schedule: negative control, a schedule by step count differs by up to %.2e (> 1e-4)",
          by_steps);
}

// The step line's progress: a RunClock whose step ends are set by hand
static void test_progress(void) {
    RunClock c;
    memset(&c, 0, sizeof(c));
    c.start = 100.0;
    // 5 steps ended 2 s apart: 10 s elapsed, ETA = 2 s x 50 steps left
    for (int k = 0; k < 5; k++) { c.ends[k] = 102.0 + 2.0 * k; }
    c.count = 5;
    char buf[128];
    format_progress(buf, sizeof(buf), &c, 50, 1640000);
    int ok1 = strcmp(buf, " | 1.64M tok | 10s, ETA 1m40s") == 0;
    // 40 steps: 24 of 1 s, then 16 of 3 s; the ring holds the last 17 ends, so the ETA is the
    // mean of the last 16 periods (3 s) x 1250 = 3750 s, not the mean of all 40 (72 / 40 s)
    double t = 100.0;
    for (int k = 0; k < 40; k++) {
        t += k < 24 ? 1.0 : 3.0;
        c.ends[k % (CLOCK_STEPS + 1)] = t;
    }
    c.count = 40;
    char buf2[128];
    format_progress(buf2, sizeof(buf2), &c, 1250, 2700000000LL);
    int ok2 = strcmp(buf2, " | 2.70B tok | 1m12s, ETA 1h02m") == 0;
    // one step end: no period yet, no ETA; and none with no step left
    c.count = 1;
    c.ends[0] = 100.4;
    char buf3[128], buf4[128];
    format_progress(buf3, sizeof(buf3), &c, 10, 12300);
    c.count = 5;
    for (int k = 0; k < 5; k++) { c.ends[k] = 102.0 + 2.0 * k; }
    format_progress(buf4, sizeof(buf4), &c, 0, 999);
    int ok3 = strcmp(buf3, " | 12.3k tok | 0s") == 0 && strcmp(buf4, " | 999 tok | 10s") == 0; // whole below 10k
    check(ok1 && ok2 && ok3, "progress: \"%s\" (want 1.64M, 10s, ETA 1m40s), \"%s\" (want 2.70B, 1m12s, ETA 1h02m "
          "from the last 16 periods), \"%s\" and \"%s\" (no ETA without a period or a step left)", buf, buf2, buf3,
          buf4);
    char fields[160];
    step_log_fields(fields, sizeof(fields), 1e-3f, 0.5, 12345.4, 3000000000LL);
    check(strcmp(fields, " lr:1.0000e-03 norm:0.5000 tokps:12345 tokens:3000000000") == 0,
          "main.log fields: \"%s\" (tokens seen past 2^31)", fields);
}

// ----------------------------------------------------------------------------
// bad input must end the process with a message and a HINT: run it in a child

typedef void (*ChildFn)(const void* arg);

// runs fn in a child process; returns 1 if it exited non-zero with "HINT" in its stderr
static int fails_with_hint(ChildFn fn, const void* arg, char* message, size_t n) {
    int fds[2];
    if (pipe(fds) != 0) { return 0; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) { dup2(devnull, 1); }
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fds[0], message + got, n - 1 - got)) > 0) { got += (size_t)r; }
    message[got] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    char* nl = strchr(message, '\n');
    int has_hint = strstr(message, "HINT") != NULL;
    if (nl != NULL) { *nl = '\0'; } // first line for the report
    return WIFEXITED(status) && WEXITSTATUS(status) != 0 && has_hint;
}

static void expect_failure(ChildFn fn, const void* arg, const char* what) {
    char msg[2048];
    int ok = fails_with_hint(fn, arg, msg, sizeof(msg));
    check(ok, "bad input: %s -> \"%s\"", what, msg);
}

// ----------------------------------------------------------------------------
// data loader

static void write_shard(const char* path, const uint16_t* tokens, int n, int magic, int claimed) {
    FILE* f = fopen_check(path, "wb");
    int header[256] = {0};
    header[0] = magic; header[1] = 1; header[2] = claimed;
    fwrite_check(header, sizeof(int), 256, f, path);
    fwrite_check(tokens, sizeof(uint16_t), (size_t)n, f, path);
    fclose(f);
}

static char test_dir[256];

static void make_test_dir(void) {
    snprintf(test_dir, sizeof(test_dir), "/tmp/test_fox_XXXXXX");
    if (mkdtemp(test_dir) == NULL) { fail("could not make a temporary directory"); }
}

static void load_shards_child(const void* arg) {
    DataLoader d;
    dataloader_init(&d, (const char*)arg, 2, 8, 0, 1, 1, 0, 1, 1000);
    dataloader_next_batch(&d);
}

static void test_dataloader(void) {
    // two shards whose token at position i is a function of (shard, i), so every window is recognisable
    enum { NA = 8 * 20 + 1, NB = 8 * 12 + 1 };
    uint16_t a[NA], b[NB];
    for (int i = 0; i < NA; i++) { a[i] = (uint16_t)(i % 997); }
    for (int i = 0; i < NB; i++) { b[i] = (uint16_t)(997 + i % 3); }
    char pa[512], pb[512], pattern[512];
    snprintf(pa, sizeof(pa), "%s/d_train_000.bin", test_dir);
    snprintf(pb, sizeof(pb), "%s/d_train_001.bin", test_dir);
    snprintf(pattern, sizeof(pattern), "%s/d_train_*.bin", test_dir);
    write_shard(pa, a, NA, SHARD_MAGIC, NA);
    write_shard(pb, b, NB, SHARD_MAGIC, NB);
    int B = 2, T = 8;
    DataLoader d;
    dataloader_init(&d, pattern, B, T, 0, 1, 1, 0, 7, 1000);
    size_t batches = dataloader_total_batches(&d);
    check(batches == 10 + 6, "data loader: 20 + 12 samples of T=8 in batches of 2 give %zu batches (16)", batches);
    // one epoch: every sample exactly once, targets = inputs shifted by one
    int seen_a[20] = {0}, seen_b[12] = {0}, shifted = 1;
    for (size_t k = 0; k < batches; k++) {
        dataloader_next_batch(&d);
        for (int s = 0; s < B; s++) {
            const int* in = d.inputs + s * T;
            const int* tg = d.targets + s * T;
            for (int t = 0; t + 1 < T; t++) { shifted &= tg[t] == in[t + 1]; }
            if (in[0] < 997) { seen_a[in[0] / 8]++; } else { seen_b[0]++; }
        }
    }
    int once = 1;
    for (int i = 0; i < 20; i++) { once &= seen_a[i] == 1; }
    once &= seen_b[0] == 12;
    check(once && shifted && d.epoch == 0,
          "data loader: one epoch visits every sample once, targets are inputs shifted by one");
    dataloader_next_batch(&d);
    check(d.epoch == 1, "data loader: the next batch starts epoch 1");
    // resume: a loader set to a saved position yields the same batches
    DataLoader r;
    dataloader_init(&r, pattern, B, T, 0, 1, 1, 0, 7, 1000);
    dataloader_set_position(&r, d.epoch, d.shard_pos, d.batch_pos);
    int same = 1;
    for (int k = 0; k < 5; k++) {
        dataloader_next_batch(&d);
        dataloader_next_batch(&r);
        same &= memcmp(d.inputs, r.inputs, (size_t)B * T * sizeof(int)) == 0 &&
                memcmp(d.targets, r.targets, (size_t)B * T * sizeof(int)) == 0;
    }
    check(same, "data loader: a loader set to a saved position continues with the same batches");
    // two ranks see disjoint samples of the same batches
    DataLoader r0, r1;
    dataloader_init(&r0, pattern, B, T, 0, 2, 1, 0, 7, 1000);
    dataloader_init(&r1, pattern, B, T, 1, 2, 1, 0, 7, 1000);
    int disjoint = 1;
    for (int k = 0; k < 4; k++) {
        dataloader_next_batch(&r0);
        dataloader_next_batch(&r1);
        for (int s = 0; s < B; s++) {
            for (int u = 0; u < B; u++) { disjoint &= r0.inputs[s * T] != r1.inputs[u * T] || r0.inputs[s * T] >= 997; }
        }
    }
    check(disjoint, "data loader: ranks 0 and 1 of 2 read disjoint samples");
    // roll: each window is a rotation of the original T+1 tokens
    DataLoader rl;
    dataloader_init(&rl, pattern, B, T, 0, 1, 0, 1, 7, 1000);
    int rotated = 1, moved = 0;
    for (int k = 0; k < 8; k++) {
        dataloader_next_batch(&rl);
        for (int s = 0; s < B; s++) {
            const int* in = rl.inputs + s * T;
            if (in[0] >= 997) { continue; }
            for (int t = 0; t + 1 < T; t++) { rotated &= (in[t + 1] == in[t] + 1) || (in[t + 1] + 8 == in[t]); }
            moved |= in[0] % 8 != 0;
        }
    }
    check(rotated && moved, "data loader: -R 1 gives rotations of each window, not all at offset 0");
    dataloader_free(&d); dataloader_free(&r); dataloader_free(&r0); dataloader_free(&r1); dataloader_free(&rl);
    // bad shards
    static char bad_magic[512], bad_size[512], bad_token[512], missing[512];
    snprintf(bad_magic, sizeof(bad_magic), "%s/bad_magic.bin", test_dir);
    write_shard(bad_magic, a, NA, 12345, NA);
    expect_failure(load_shards_child, bad_magic, "shard with a wrong magic");
    snprintf(bad_size, sizeof(bad_size), "%s/bad_size.bin", test_dir);
    write_shard(bad_size, a, NA - 5, SHARD_MAGIC, NA);
    expect_failure(load_shards_child, bad_size, "shard shorter than its header says");
    uint16_t big[NA];
    for (int i = 0; i < NA; i++) { big[i] = 1500; }
    snprintf(bad_token, sizeof(bad_token), "%s/bad_token.bin", test_dir);
    write_shard(bad_token, big, NA, SHARD_MAGIC, NA);
    expect_failure(load_shards_child, bad_token, "token id 1500 >= vocabulary 1000");
    snprintf(missing, sizeof(missing), "%s/none_*.bin", test_dir);
    expect_failure(load_shards_child, missing, "no shard matches the pattern");
}

// ----------------------------------------------------------------------------
// checkpoints

static void load_model_child(const void* arg) {
    FoxModel m;
    load_model(&m, (const char*)arg);
}

static void copy_truncated(const char* src, const char* dst, long drop) {
    FILE* f = fopen_check(src, "rb");
    long n = file_size_check(f, src);
    char* buf = (char*)malloc_check((size_t)n, "copy");
    fread_check(buf, 1, (size_t)n, f, src);
    fclose(f);
    FILE* g = fopen_check(dst, "wb");
    fwrite_check(buf, 1, (size_t)(n - drop), g, dst);
    fclose(g);
    free(buf);
}

// rewrites a checkpoint's checksum (its last 8 bytes) to match its bytes: a test of the checks behind the
// checksum then reaches them
static void reseal(const char* path) {
    FILE* f = fopen_check(path, "r+b");
    long n = file_size_check(f, path);
    unsigned char* buf = (unsigned char*)malloc_check((size_t)n, "reseal");
    fread_check(buf, 1, (size_t)n, f, path);
    Checksum c;
    checksum_init(&c);
    checksum_update(&c, buf, (size_t)n - 8);
    uint64_t digest = checksum_digest(&c);
    if (fseek(f, n - 8, SEEK_SET) != 0) { fail("seek"); }
    fwrite_check(&digest, sizeof(digest), 1, f, path);
    fclose(f);
    free(buf);
}

// copies a checkpoint with two int32 header slots replaced (and its checksum made to match)
static void patch_header(const char* src, const char* dst, int slot_a, int value_a, int slot_b, int value_b) {
    copy_truncated(src, dst, 0);
    FILE* f = fopen_check(dst, "r+b");
    int header[256];
    fread_check(header, sizeof(int), 256, f, dst);
    header[slot_a] = value_a; header[slot_b] = value_b;
    if (fseek(f, 0, SEEK_SET) != 0) { fail("seek"); }
    fwrite_check(header, sizeof(int), 256, f, dst);
    fclose(f);
    reseal(dst);
}

// the state file of test_checkpoints' model
static void load_state_child(const void* arg) {
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    c.vocab_size = 300; c.padded_vocab_size = padded_vocab(300); c.gate = GATE_BIAS_ONLY; c.window = 16;
    FoxModel m;
    fox_build(&m, &c);
    TrainState s;
    load_state(&m, &s, (const char*)arg);
}

// the two shards of test_dataloader (10 and 6 batches of 2 x 8), at a given position
static int set_position_args[3];
static void set_position_child(const void* arg) {
    (void)arg;
    char pattern[512];
    snprintf(pattern, sizeof(pattern), "%s/d_train_*.bin", test_dir);
    DataLoader d;
    dataloader_init(&d, pattern, 2, 8, 0, 1, 0, 0, 7, 1000);
    dataloader_set_position(&d, set_position_args[0], set_position_args[1], set_position_args[2]);
}

static void test_checkpoints(void) {
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    c.vocab_size = 300; c.padded_vocab_size = padded_vocab(300); c.gate = GATE_BIAS_ONLY; c.window = 16;
    FoxModel m;
    fox_build(&m, &c);
    fox_init(&m, 5);
    AdamWConfig opt = {1e-3f, 0.1f, 0.9f, 0.95f, 1e-8f, 1.0f};
    int inputs[16], targets[16];
    for (int i = 0; i < 16; i++) { inputs[i] = (i * 37) % 300; targets[i] = (i * 53 + 1) % 300; }
    fox_forward(&m, inputs, targets, 2, 8);
    fox_zero_grad(&m);
    fox_backward(&m, 1.0f);
    fox_update(&m, &opt, 1e-3f, 1);
    char model_path[512], state_path[512];
    checkpoint_paths(test_dir, 1, model_path, state_path, sizeof(model_path));
    TrainState s = {1, 0, 1, 2, 1, 8, 8, 1, 0x1234567890abcdefull, 0xfedcba0987654321ull, 48, 3000000000ll, 4800.5,
                    1, 3e-4, 0.05, 0.5, SCHEDULE_LINEAR, 1e9, 1, -7.5, 1, 3.5, 1, 0, 0, 0, 0};
    save_model(&m, model_path);
    save_state(&m, &s, state_path);
    FoxModel l;
    load_model(&l, model_path);
    TrainState ls;
    load_state(&l, &ls, state_path);
    int same = memcmp(&l.config, &m.config, sizeof(FoxConfig)) == 0 && l.num_parameters == m.num_parameters &&
               memcmp(l.params_memory, m.params_memory, m.num_parameters * sizeof(float)) == 0 &&
               memcmp(l.m_memory, m.m_memory, m.num_parameters * sizeof(float)) == 0 &&
               memcmp(l.v_memory, m.v_memory, m.num_parameters * sizeof(float)) == 0 && ls.step == 1 &&
               ls.batch_pos == 2 && ls.batch_samples == 8 && ls.T == 8 && ls.roll == 1 && ls.seed == s.seed &&
               ls.shards == s.shards && ls.total_batch_tokens == 48 && ls.tokens_seen == 3000000000ll &&
               ls.warmup_tokens == 4800.5 && ls.has_settings == 1 && ls.lr == 3e-4 && ls.weight_decay == 0.05 &&
               ls.grad_clip == 0.5 && ls.schedule == SCHEDULE_LINEAR && ls.end_tokens == 1e9 && ls.prune == 1 &&
               ls.prune_ln_eps == -7.5 && ls.on_nonfinite == 1 && ls.spike_z == 3.5 && ls.documents == 1;
    check(same, "checkpoint round trip: configuration, %zu parameters, AdamW moments, data position and run "
          "settings (-t, -R, -S, shards, -d, tokens seen past 2^31, warmup, -l -c -a -k, the schedule's end, "
          "-A -L -G -Z -f) bit for bit", m.num_parameters);
    check(latest_checkpoint(test_dir) == 1, "checkpoint: the newest complete checkpoint is found");
    // names that only look like checkpoints are not taken: a lone state, a step past int,
    // a sign, a letter, a model without its state, a model not named as train_fox names it
    const char* decoys[] = {"state_00000009.bin", "model_99999999999.bin", "state_99999999999.bin",
                            "model_-0000007.bin", "state_-0000007.bin", "model_0000000x.bin", "model_00000005.bin",
                            "model_12.bin", "state_00000012.bin"};
    for (size_t i = 0; i < sizeof(decoys) / sizeof(decoys[0]); i++) {
        char decoy[600];
        snprintf(decoy, sizeof(decoy), "%s/%s", test_dir, decoys[i]);
        copy_truncated(model_path, decoy, 0);
    }
    check(latest_checkpoint(test_dir) == 1,
          "checkpoint: decoy names (lone files, steps past int, signs, letters, other spellings) are not taken");
    char tmp_path[600];
    snprintf(tmp_path, sizeof(tmp_path), "%s.tmp", model_path);
    check(access(tmp_path, F_OK) != 0, "checkpoint: no temporary file is left behind");
    static char truncated[512], garbage[512];
    snprintf(truncated, sizeof(truncated), "%s/truncated.bin", test_dir);
    copy_truncated(model_path, truncated, 4);
    expect_failure(load_model_child, truncated, "checkpoint truncated by 4 bytes");
    snprintf(garbage, sizeof(garbage), "%s/garbage.bin", test_dir);
    copy_truncated(state_path, garbage, 0);
    expect_failure(load_model_child, garbage, "an optimiser-state file passed as a model");
    expect_failure(load_model_child, "/nonexistent/model.bin", "missing checkpoint file");
    // a header whose configuration needs 10^12 parameters, with a count to match: refused
    // before anything is allocated
    static char huge[512], nan_theta[512];
    snprintf(huge, sizeof(huge), "%s/huge.bin", test_dir);
    patch_header(model_path, huge, 2, 1000, 3, 65536); // n_layer, n_embd
    expect_failure(load_model_child, huge, "checkpoint header asking for 1000 layers of C = 65536");
    snprintf(nan_theta, sizeof(nan_theta), "%s/nan_theta.bin", test_dir);
    patch_header(model_path, nan_theta, 18, 0x7fc00000, 18, 0x7fc00000); // rope_theta = NaN
    expect_failure(load_model_child, nan_theta, "checkpoint with rope_theta NaN");
    static char bad_position[512], bad_moments[512];
    snprintf(bad_position, sizeof(bad_position), "%s/bad_position.bin", test_dir);
    patch_header(state_path, bad_position, 6, -1, 6, -1); // shard position
    expect_failure(load_state_child, bad_position, "state file with shard position -1");
    snprintf(bad_moments, sizeof(bad_moments), "%s/bad_moments.bin", test_dir);
    patch_header(state_path, bad_moments, 9, 2, 9, 2); // has_moments
    expect_failure(load_state_child, bad_moments, "state file with a moments flag of 2");
    static char old_version[512], bad_T[512];
    snprintf(old_version, sizeof(old_version), "%s/old_version.bin", test_dir);
    patch_header(state_path, old_version, 1, 1, 1, 1); // a version-1 file: no run settings to check
    expect_failure(load_state_child, old_version, "version-1 state file (refused with what to do instead)");
    snprintf(bad_T, sizeof(bad_T), "%s/bad_T.bin", test_dir);
    patch_header(state_path, bad_T, 11, 0, 11, 0); // T
    expect_failure(load_state_child, bad_T, "state file with -t 0");
    static char bad_docs[512], no_docs[512];
    snprintf(bad_docs, sizeof(bad_docs), "%s/bad_docs.bin", test_dir);
    patch_header(state_path, bad_docs, 38, 2, 38, 2); // -f
    expect_failure(load_state_child, bad_docs, "state file with -f 2");
    snprintf(no_docs, sizeof(no_docs), "%s/no_docs.bin", test_dir);
    patch_header(state_path, no_docs, 38, 0, 38, 0); // a version-3 file written before -f: its slot is 0
    TrainState nd;
    load_state(&l, &nd, no_docs);
    check(nd.documents == 0 && nd.has_settings && nd.prune == 1,
          "a version-3 state file without -f (its slot 0) reads as -f 0 with its other settings");
    set_position_args[0] = 0; set_position_args[1] = 2; set_position_args[2] = 0;
    expect_failure(set_position_child, NULL, "data position at shard 2 of 2");
    set_position_args[0] = 0; set_position_args[1] = 0; set_position_args[2] = 11;
    expect_failure(set_position_child, NULL, "data position at batch 11 of a shard of 10");
    fox_free(&m);
    fox_free(&l);
}

// ----------------------------------------------------------------------------
// resume: the saved data position and the checks before a run

// runs fn in a child (stdout and stderr to /dev/null); returns 1 if it exited with status 0
static int child_succeeds(ChildFn fn, const void* arg) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) { dup2(devnull, 1); dup2(devnull, 2); }
        fn(arg);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// a data loader of the resume tests: shards, -b, -t, processes, -R, -S
typedef struct {
    const char* pattern;
    int B, T, world, roll;
    uint64_t seed;
} ResumeRun;

static void resume_loader(DataLoader* d, const ResumeRun* r) {
    dataloader_init(d, r->pattern, r->B, r->T, 0, r->world, 1, r->roll, r->seed, 1000);
}

static TrainState resume_saved; // the state the children resume from
static void resume_position_child(const void* arg) {
    DataLoader d;
    resume_loader(&d, (const ResumeRun*)arg);
    resume_data_position(&resume_saved, &d, "state_00000004.bin");
}

static void fresh_dir_child(const void* arg) { check_fresh_run_dir((const char*)arg); }

static long resume_steps_args[2]; // start, -x
static void resume_steps_child(const void* arg) {
    (void)arg;
    check_resume_steps((int)resume_steps_args[0], resume_steps_args[1], "run");
}

// check_run_start with -s <sample_every> and a decode table whose EOT is <eot>, model vocabulary 300
static int run_start_args[2];
static void run_start_child(const void* arg) {
    (void)arg;
    const char* argv[] = {"train_fox", NULL};
    Args a;
    parse_args(&a, 1, (char**)argv);
    a.sample_every = run_start_args[0];
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    c.vocab_size = 300;
    Tokenizer tk = {50257, run_start_args[1], NULL};
    check_run_start(&a, &c, &tk, 1);
}

// ----------------------------------------------------------------------------
// checksums, resume fallback, and the edges the runs once missed

// Args as parse_args gives them for a command line of train_fox and the flags in argv (NULL-terminated)
static Args args_of(const char* const* flags) {
    const char* argv[32] = {"train_fox"};
    int argc = 1;
    for (; flags != NULL && flags[argc - 1] != NULL; argc++) { argv[argc] = flags[argc - 1]; }
    Args a;
    parse_args(&a, argc, (char**)argv);
    return a;
}

static Args default_args(void) { return args_of(NULL); }

// XXH64 of bytes (k * 131 + 7) & 255, k < n, against xxhsum -H64 (xxHash 0.8.1, an independent implementation),
// whole and streamed in pieces of every size from 1 to 37 bytes (the stripe boundaries at every offset)
static void test_checksum_vectors(void) {
    const int lengths[] = {0, 1, 3, 4, 5, 8, 31, 32, 33, 64, 100, 1000, 4099};
    const uint64_t want[] = {0xef46db3751d8e999ull, 0xa96c7f0ce858bbb7ull, 0xbed43740ee6332bbull, 0xfa212ae44b3bb23dull,
                             0xd339dcc9ac8e6776ull, 0x994b676b71ce94ddull, 0x6711d55e306b5d8full, 0x07f7b8e3bc5d6e25ull,
                             0x09f85eeb4e1cbe9full, 0x50d4159a0411632eull, 0x9ddada11d3dc2d8full, 0x0bf0bdbcc82eb373ull,
                             0xc2c15a86d6a1985bull};
    unsigned char bytes[4099];
    for (int k = 0; k < 4099; k++) { bytes[k] = (unsigned char)((k * 131 + 7) & 255); }
    int whole = 1, streamed = 1;
    for (int i = 0; i < 13; i++) {
        Checksum c;
        checksum_init(&c);
        checksum_update(&c, bytes, (size_t)lengths[i]);
        whole &= checksum_digest(&c) == want[i];
        for (int piece = 1; piece <= 37; piece++) {
            checksum_init(&c);
            for (int at = 0; at < lengths[i]; at += piece) {
                checksum_update(&c, bytes + at, (size_t)(lengths[i] - at < piece ? lengths[i] - at : piece));
            }
            streamed &= checksum_digest(&c) == want[i];
        }
    }
    check(whole, "checksum: XXH64 of 13 inputs of 0 to 4099 bytes equals xxhsum -H64's");
    check(streamed, "checksum: the same, streamed in pieces of 1 to 37 bytes");
}

// copies src to dst with `n` bytes at offset `at` inverted (the checksum is left as it was)
static void flip_bytes(const char* src, const char* dst, long at, int n) {
    copy_truncated(src, dst, 0);
    FILE* f = fopen_check(dst, "r+b");
    unsigned char buf[64];
    if (fseek(f, at, SEEK_SET) != 0) { fail("seek"); }
    fread_check(buf, 1, (size_t)n, f, dst);
    for (int i = 0; i < n; i++) { buf[i] ^= 0xff; }
    if (fseek(f, at, SEEK_SET) != 0) { fail("seek"); }
    fwrite_check(buf, 1, (size_t)n, f, dst);
    fclose(f);
}

// an older file: the checksum dropped, the version set to `version`
static void older_version(const char* src, const char* dst, int version) {
    copy_truncated(src, dst, 8);
    FILE* f = fopen_check(dst, "r+b");
    if (fseek(f, 4, SEEK_SET) != 0) { fail("seek"); }
    fwrite_check(&version, sizeof(int), 1, f, dst);
    fclose(f);
}

// the model and state files of test_checkpoints: every changed byte is refused, older versions read
static void test_checkpoint_checksums(void) {
    test_checksum_vectors();
    char model_path[512], state_path[512];
    checkpoint_paths(test_dir, 1, model_path, state_path, sizeof(model_path));
    static char flipped_params[512], flipped_moments[512], edited_seen[512], edited_pos[512], v1[512], v2[512];
    snprintf(flipped_params, sizeof(flipped_params), "%s/flipped_params.bin", test_dir);
    flip_bytes(model_path, flipped_params, 1024 + 4000, 64);
    expect_failure(load_model_child, flipped_params, "model file with 64 flipped parameter bytes (checksum)");
    snprintf(flipped_moments, sizeof(flipped_moments), "%s/flipped_moments.bin", test_dir);
    flip_bytes(state_path, flipped_moments, 1024 + 12345, 1);
    expect_failure(load_state_child, flipped_moments, "state file with one flipped moment byte (checksum)");
    // in-range edits of the header: tokens seen and the batch position (patch_header would reseal: not here)
    snprintf(edited_seen, sizeof(edited_seen), "%s/edited_seen.bin", test_dir);
    flip_bytes(state_path, edited_seen, 19 * 4 + 3, 1);
    expect_failure(load_state_child, edited_seen, "state file whose tokens seen were edited (checksum)");
    snprintf(edited_pos, sizeof(edited_pos), "%s/edited_pos.bin", test_dir);
    flip_bytes(state_path, edited_pos, 7 * 4, 1);
    expect_failure(load_state_child, edited_pos, "state file whose batch position was edited (checksum)");
    // older versions: read, without a checksum to check
    snprintf(v1, sizeof(v1), "%s/model_v1.bin", test_dir);
    older_version(model_path, v1, 1);
    FoxModel m, old;
    load_model(&m, model_path);
    FileError e;
    int read_v1 = read_model(&old, v1, &e) == 0;
    check(read_v1 && memcmp(old.params_memory, m.params_memory, m.num_parameters * sizeof(float)) == 0,
          "checkpoint: a version-1 model file (no checksum) is read, with a warning");
    if (read_v1) { fox_free(&old); }
    snprintf(v2, sizeof(v2), "%s/state_v2.bin", test_dir);
    older_version(state_path, v2, 2);
    TrainState s;
    check(read_state(&m, &s, v2, &e) == 0 && s.has_settings == 0 && s.step == 1,
          "checkpoint: a version-2 state file (no checksum, no settings) is read, with a warning");
    fox_free(&m);
}

// A run's directory for the resume tests: shards of 300-token vocabulary, the test_checkpoints model
typedef struct {
    char dir[512], pattern[600];
    Args a;
    FoxConfig c;
} ResumeDir;

static void resume_dir_init(ResumeDir* r, const char* name, int window) {
    snprintf(r->dir, sizeof(r->dir), "%s/%s", test_dir, name);
    mkdir(r->dir, 0755);
    snprintf(r->pattern, sizeof(r->pattern), "%s/fb_train_*.bin", test_dir);
    char shard[600];
    snprintf(shard, sizeof(shard), "%s/fb_train_000.bin", test_dir);
    uint16_t tokens[801];
    for (int i = 0; i < 801; i++) { tokens[i] = (uint16_t)((i * 7 + 3) % 300); }
    write_shard(shard, tokens, 801, SHARD_MAGIC, 801);
    const char* flags[] = {"-o", r->dir, "-y", "1", "-i", r->pattern, "-b", "2", "-t", "8", "-x", "10", "-S", "7",
                           NULL};
    r->a = args_of(flags);
    r->a.total_batch_tokens = 16;
    config_from_preset(&r->c, "fox-pro-tiny");
    r->c.vocab_size = 300; r->c.padded_vocab_size = padded_vocab(300); r->c.n_layer = 1; r->c.window = window;
}

// the checkpoints of steps 1 and 2 of a run in r (moments and weights perturbed a step apart); *p1 and *m1 get
// step 1's weights and first moments, the loader stands where step 1 left it in *pos1
static void resume_dir_write(ResumeDir* r, float** p1, float** m1, int pos1[3]) {
    FoxModel m;
    fox_build(&m, &r->c);
    fox_init(&m, 3);
    m.m_memory = (float*)calloc_check(m.num_parameters, sizeof(float), "m");
    m.v_memory = (float*)calloc_check(m.num_parameters, sizeof(float), "v");
    DataLoader d;
    dataloader_init(&d, r->pattern, 2, 8, 0, 1, 1, 0, 7, 300);
    LRSchedule sched = run_schedule(&r->a, NULL);
    size_t bytes = m.num_parameters * sizeof(float);
    for (int step = 1; step <= 2; step++) {
        dataloader_next_batch(&d);
        for (size_t i = 0; i < m.num_parameters; i++) {
            m.params_memory[i] += 1e-3f * step; m.m_memory[i] = 1e-4f * step; m.v_memory[i] = 1e-8f * step;
        }
        TrainState s = train_state(step, &d, &sched, 16LL * step, &r->a);
        save_checkpoint(&m, r->dir, &s);
        if (step == 1) {
            *p1 = (float*)malloc_check(bytes, "p1"); memcpy(*p1, m.params_memory, bytes);
            *m1 = (float*)malloc_check(bytes, "m1"); memcpy(*m1, m.m_memory, bytes);
            pos1[0] = d.epoch; pos1[1] = d.shard_pos; pos1[2] = d.batch_pos;
        }
    }
    dataloader_free(&d);
    fox_free(&m);
}

static ResumeDir resume_child_dir; // the run the children resume
static int resume_child_window;    // the window of the model they resume into
static void resume_run_child(const void* arg) {
    (void)arg;
    FoxConfig c = resume_child_dir.c;
    c.window = resume_child_window;
    FoxModel m;
    fox_build(&m, &c);
    DataLoader d;
    dataloader_init(&d, resume_child_dir.pattern, 2, 8, 0, 1, 1, 0, 7, 300);
    resume_run(&m, &resume_child_dir.a, &d);
}

// -y 1: the newest intact checkpoint, its weights, moments and data position; a damaged newer one skipped; none
// intact, another configuration of the same parameter count: refused
static void test_resume_fallback(void) {
    ResumeDir r;
    resume_dir_init(&r, "fallback", 0);
    float *p1, *m1;
    int pos1[3];
    resume_dir_write(&r, &p1, &m1, pos1);
    char model_path[600], state_path[600];
    checkpoint_paths(r.dir, 2, model_path, state_path, sizeof(model_path));
    flip_bytes(state_path, state_path, 1024 + 100, 1); // the newest state damaged in place
    FoxModel m;
    fox_build(&m, &r.c);
    fox_init(&m, 99);
    DataLoader d, ref;
    dataloader_init(&d, r.pattern, 2, 8, 0, 1, 1, 0, 7, 300);
    TrainState s = resume_run(&m, &r.a, &d);
    size_t bytes = m.num_parameters * sizeof(float);
    check(s.step == 1 && memcmp(m.params_memory, p1, bytes) == 0 && memcmp(m.m_memory, m1, bytes) == 0,
          "resume: a damaged newest checkpoint (step 2) is skipped for step 1's, its weights and moments");
    dataloader_init(&ref, r.pattern, 2, 8, 0, 1, 1, 0, 7, 300);
    dataloader_next_batch(&ref); // the uninterrupted run's first batch; its second comes next
    dataloader_next_batch(&ref);
    dataloader_next_batch(&d);
    check(d.epoch == ref.epoch && d.shard_pos == ref.shard_pos && d.batch_pos == ref.batch_pos &&
              memcmp(d.inputs, ref.inputs, 16 * sizeof(int)) == 0
              && memcmp(d.targets, ref.targets, 16 * sizeof(int)) == 0,
          "resume: the data loader goes on with the batch after step 1 (position %d %d %d)", pos1[0], pos1[1], pos1[2]);
    dataloader_free(&d); dataloader_free(&ref); fox_free(&m); free(p1); free(m1);
    // every checkpoint damaged: refused
    resume_child_dir = r;
    resume_child_window = 0;
    checkpoint_paths(r.dir, 1, model_path, state_path, sizeof(model_path));
    flip_bytes(model_path, model_path, 1024 + 8, 4);
    expect_failure(resume_run_child, NULL, "-y 1 with every checkpoint damaged");
    // a --window 16 run resumed into a window-0 model: the same parameter count, another model
    ResumeDir w;
    resume_dir_init(&w, "window16", 16);
    resume_dir_write(&w, &p1, &m1, pos1);
    free(p1); free(m1);
    resume_child_dir = w;
    resume_child_window = 16;
    check(child_succeeds(resume_run_child, NULL), "resume: the window-16 run resumes into its own model");
    resume_child_window = 0;
    expect_failure(resume_run_child, NULL, "-y 1 of a --window 16 checkpoint into a window-0 model");
}

// -y 1 and a newest state file whose version or parameter count a damaged byte changed: skipped for step 1's (the
// checksum fails, so the field is no other build's); the same field in an intact file (resealed) stops the run
static void test_resume_header_damage(void) {
    const struct { long at; const char* what; } cases[] = {{4, "version"}, {13, "parameter count"}};
    for (int i = 0; i < 2; i++) {
        char name[64];
        snprintf(name, sizeof(name), "header_damage_%d", i);
        ResumeDir r;
        resume_dir_init(&r, name, 0);
        float *p1, *m1;
        int pos1[3];
        resume_dir_write(&r, &p1, &m1, pos1);
        free(p1); free(m1);
        char model_path[600], state_path[600];
        checkpoint_paths(r.dir, 2, model_path, state_path, sizeof(model_path));
        flip_bytes(state_path, state_path, cases[i].at, 1);
        FoxModel m;
        fox_build(&m, &r.c);
        DataLoader d;
        dataloader_init(&d, r.pattern, 2, 8, 0, 1, 1, 0, 7, 300);
        TrainState s = resume_run(&m, &r.a, &d);
        check(s.step == 1, "resume: a newest state file whose %s byte is damaged is skipped for step 1's (step %d)",
              cases[i].what, s.step);
        dataloader_free(&d);
        fox_free(&m);
        reseal(state_path);
        resume_child_dir = r;
        resume_child_window = 0;
        char what[128];
        snprintf(what, sizeof(what), "-y 1 with an intact state file of another %s", cases[i].what);
        expect_failure(resume_run_child, NULL, what);
    }
}

// resume_notes: nothing for the same flags; one note for each flag that changes the steps, two for -d (the
// schedule's end moves with it), none from a version-2 file's missing settings but -d's
static void test_resume_notes(void) {
    ResumeDir r;
    resume_dir_init(&r, "notes", 0);
    DataLoader d;
    dataloader_init(&d, r.pattern, 2, 8, 0, 1, 1, 0, 7, 300);
    dataloader_next_batch(&d);
    LRSchedule sched = run_schedule(&r.a, NULL);
    TrainState s = train_state(1, &d, &sched, 16, &r.a);
    dataloader_free(&d);
    const char* base[] = {"-o", r.dir, "-y", "1", "-i", r.pattern, "-b", "2", "-t", "8", "-x", "10", "-S", "7"};
    const char* changes[][4] = {{"-l", "1e-3"}, {"-k", "linear"}, {"-u", "100"}, {"-x", "20"}, {"-c", "0.05"},
                                {"-a", "0.5"}, {"-A", "1"}, {"-G", "skip"}, {"-Z", "3"}, {"-A", "1", "-L", "-8"},
                                {"-d", "32"}};
    const int want[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2};
    int all = resume_notes(&s, &r.a) == 0, got[11];
    for (int i = 0; i < 11; i++) {
        const char* flags[20];
        int n = 0;
        for (; n < 14; n++) { flags[n] = base[n]; }
        for (int j = 0; j < 4 && changes[i][j] != NULL; j++) { flags[n++] = changes[i][j]; }
        flags[n] = NULL;
        Args a = args_of(flags);
        if (a.total_batch_tokens < 0) { a.total_batch_tokens = 16; }
        got[i] = resume_notes(&s, &a);
        all &= got[i] == want[i];
    }
    check(all, "resume: a note for each of -l -k -u -x -c -a -A -G -Z, -L with -A 1 (and -A), -d (and the end); "
          "none for the same flags (got %d %d %d %d %d %d %d %d %d %d %d)", got[0], got[1], got[2], got[3], got[4],
          got[5], got[6], got[7], got[8], got[9], got[10]);
    TrainState old = s;
    old.has_settings = 0;
    Args a = r.a;
    a.lr = 1e-3;
    check(resume_notes(&old, &a) == 0, "resume: a version-2 state (no settings) notes no setting it cannot compare");
}

// a shard of exactly 100 x -t tokens holds 99 windows of -t + 1; the default warmup; the niah depths
static void test_run_edges(void) {
    char shard[600], pattern[600];
    snprintf(shard, sizeof(shard), "%s/edge_train_000.bin", test_dir);
    snprintf(pattern, sizeof(pattern), "%s/edge_train_*.bin", test_dir);
    static uint16_t tokens[3200];
    for (int i = 0; i < 3200; i++) { tokens[i] = (uint16_t)(i % 300); }
    write_shard(shard, tokens, 3200, SHARD_MAGIC, 3200);
    DataLoader d;
    dataloader_init(&d, pattern, 1, 32, 0, 1, 0, 0, 7, 300);
    int in_shard = 1;
    for (size_t k = 0; k < dataloader_total_batches(&d); k++) {
        dataloader_next_batch(&d);
        in_shard &= d.targets[31] == (d.inputs[31] + 1) % 300;
    }
    check(shard_samples(&d, 0) == 99 && dataloader_total_batches(&d) == 99 && in_shard,
          "data: a shard of 3200 tokens at -t 32 gives 99 windows of 33 tokens, all inside it (got %zu)",
          shard_samples(&d, 0));
    dataloader_free(&d);
    Args a = default_args();
    a.total_batch_tokens = 1000; a.steps = 500;
    LRSchedule small = run_schedule(&a, NULL);
    a.total_batch_tokens = 1 << 20; a.steps = 10000;
    LRSchedule big = run_schedule(&a, NULL);
    check(small.warmup_tokens == 50000.0 && big.warmup_tokens == 268435456.0,
          "schedule: the default warmup is 10%% of the run (50000 of 500k tokens), at most 256 x 2^20 (%.0f, %.0f)",
          small.warmup_tokens, big.warmup_tokens);
    check(niah_depth(0, 3) == 0.0 && niah_depth(1, 3) == 0.5 && niah_depth(2, 3) == 1.0 && niah_depth(0, 1) == 0.5 &&
              niah_depth(10, 11) == 1.0,
          "niah: -E 3 puts the needle at depths 0, 0.5 and 1; -E 1 in the middle");
}

static uint64_t pattern_identity(const char* pattern, int B, int T) {
    DataLoader d;
    dataloader_init(&d, pattern, B, T, 0, 1, 1, 0, 7, 1000);
    uint64_t id = shards_identity(&d);
    dataloader_free(&d);
    return id;
}

// the checks at a run's start: check_fresh_run_dir (a model checkpoint refuses the directory; a lone state, nothing,
// or no directory yet do not), check_resume_steps, check_run_start
static void test_run_start_checks(void) {
    static const uint16_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    char path[700];
    static char with_model[600], lone_state[600], empty[600], absent[600];
    snprintf(with_model, sizeof(with_model), "%s/fresh_model", test_dir);
    snprintf(lone_state, sizeof(lone_state), "%s/fresh_state", test_dir);
    snprintf(empty, sizeof(empty), "%s/fresh_empty", test_dir);
    snprintf(absent, sizeof(absent), "%s/fresh_absent", test_dir);
    const char* fresh[] = {with_model, lone_state, empty};
    for (int k = 0; k < 3; k++) {
        if (mkdir(fresh[k], 0755) != 0) { fail("test: mkdir %s", fresh[k]); }
    }
    snprintf(path, sizeof(path), "%s/model_00000003.bin", with_model);
    write_shard(path, a, 8, SHARD_MAGIC, 8); // any file: the name is what counts
    snprintf(path, sizeof(path), "%s/state_00000003.bin", lone_state);
    write_shard(path, a, 8, SHARD_MAGIC, 8);
    expect_failure(fresh_dir_child, with_model, "a fresh run into an -o holding model_00000003.bin");
    int ok_state = child_succeeds(fresh_dir_child, lone_state), ok_empty = child_succeeds(fresh_dir_child, empty);
    int ok_absent = child_succeeds(fresh_dir_child, absent);
    check(ok_state && ok_empty && ok_absent,
          "fresh run directory: accepted with a lone state_*.bin (%d), empty (%d), not yet made (%d)", ok_state,
          ok_empty, ok_absent);

    // check_resume_steps: -x must lie past the checkpoint's step
    resume_steps_args[0] = 10; resume_steps_args[1] = 10;
    expect_failure(resume_steps_child, NULL, "-y 1 from step 10 with -x 10");
    resume_steps_args[1] = 5;
    expect_failure(resume_steps_child, NULL, "-y 1 from step 10 with -x 5");
    resume_steps_args[1] = 11;
    check(child_succeeds(resume_steps_child, NULL), "resume steps: from step 10 with -x 11 is accepted");

    // check_run_start: a decode table whose EOT the model cannot embed refuses a run with samples
    run_start_args[0] = 100; run_start_args[1] = 50256;
    expect_failure(run_start_child, NULL, "samples on (-s 100), decode table EOT 50256 >= vocabulary 300");
    run_start_args[1] = 300;
    expect_failure(run_start_child, NULL, "samples on (-s 100), decode table EOT 300 = vocabulary 300");
    run_start_args[1] = 299;
    int ok_last = child_succeeds(run_start_child, NULL);
    run_start_args[0] = 0; run_start_args[1] = 50256;
    int ok_off = child_succeeds(run_start_child, NULL);
    check(ok_last && ok_off, "run start: EOT 299 of vocabulary 300 with samples on (%d) and EOT 50256 with "
          "samples off, -s 0 (%d), are accepted", ok_last, ok_off);
}

static void test_resume(void) {
    // two shards of 64 and 48 windows of T = 8 (multiples of 16, so that batches of 4, 8 and 16
    // all end at the shards' ends); token i of shard s is a function of (s, i)
    enum { T = 8, NA = 64 * T + 1, NB = 48 * T + 1 };
    static uint16_t a[NA], b[NB + T];
    for (int i = 0; i < NA; i++) { a[i] = (uint16_t)(i % 600); }
    for (int i = 0; i < NB + T; i++) { b[i] = (uint16_t)(600 + i % 397); }
    char path[700], dir[600];
    static char pattern[600], fewer[600], moved[600], other_size[600], renamed[600];
    snprintf(path, sizeof(path), "%s/r_train_000.bin", test_dir);
    write_shard(path, a, NA, SHARD_MAGIC, NA);
    snprintf(path, sizeof(path), "%s/r_train_001.bin", test_dir);
    write_shard(path, b, NB, SHARD_MAGIC, NB);
    snprintf(pattern, sizeof(pattern), "%s/r_train_*.bin", test_dir);
    snprintf(fewer, sizeof(fewer), "%s/r_train_000.bin", test_dir);
    // the same files through another path, copies in another directory, a copy whose second
    // shard holds one window more, and one whose second shard has another name
    const char* base = strrchr(test_dir, '/') + 1;
    snprintf(moved, sizeof(moved), "%s/../%s/r_train_*.bin", test_dir, base);
    const char* dirs[] = {"r_copy", "r_size", "r_name"};
    for (int k = 0; k < 3; k++) {
        snprintf(dir, sizeof(dir), "%s/%s", test_dir, dirs[k]);
        if (mkdir(dir, 0755) != 0) { fail("test: mkdir %s", dir); }
        snprintf(path, sizeof(path), "%s/r_train_000.bin", dir);
        write_shard(path, a, NA, SHARD_MAGIC, NA);
        snprintf(path, sizeof(path), "%s/r_train_%03d.bin", dir, k == 2 ? 2 : 1);
        write_shard(path, b, k == 1 ? NB + T : NB, SHARD_MAGIC, k == 1 ? NB + T : NB);
    }
    char copied[600];
    snprintf(copied, sizeof(copied), "%s/r_copy/r_train_*.bin", test_dir);
    snprintf(other_size, sizeof(other_size), "%s/r_size/r_train_*.bin", test_dir);
    snprintf(renamed, sizeof(renamed), "%s/r_name/r_train_*.bin", test_dir);
    uint64_t id = pattern_identity(pattern, 8, T), id_moved = pattern_identity(moved, 8, T);
    uint64_t id_copied = pattern_identity(copied, 8, T), id_b4 = pattern_identity(pattern, 4, T);
    uint64_t id_size = pattern_identity(other_size, 8, T), id_name = pattern_identity(renamed, 8, T);
    uint64_t id_fewer = pattern_identity(fewer, 8, T);
    check(id == id_moved && id == id_copied && id == id_b4,
          "shards identity: equal through another directory path (%016llx), for copies elsewhere (%016llx) "
          "and for another -b (%016llx)", (unsigned long long)id_moved, (unsigned long long)id_copied,
          (unsigned long long)id_b4);
    check(id != id_size && id != id_name && id != id_fewer,
          "shards identity: differs for a shard of 8 tokens more (%016llx), a shard of another name (%016llx) "
          "and one shard fewer (%016llx) than %016llx", (unsigned long long)id_size, (unsigned long long)id_name,
          (unsigned long long)id_fewer, (unsigned long long)id);

    // a run of -b 4 on 2 processes, -R 1, -S 99 after 3 batches: train_state takes every field
    DataLoader d;
    dataloader_init(&d, pattern, 4, T, 1, 2, 1, 1, 99, 1000);
    for (int k = 0; k < 3; k++) { dataloader_next_batch(&d); }
    LRSchedule sched = {SCHEDULE_COSINE, 1e-3, 1234.5, 1e6, 3 * 64};
    Args da = default_args();
    TrainState s = train_state(6, &d, &sched, 6LL * 3 * 64, &da);
    check(s.step == 6 && s.epoch == d.epoch && s.shard_pos == d.shard_pos && s.batch_pos == 3 && s.world == 2 &&
              s.batch_samples == 8 && s.T == T && s.roll == 1 && s.seed == 99 && s.shards == id &&
              s.total_batch_tokens == 192 && s.tokens_seen == 1152 && s.warmup_tokens == 1234.5,
          "train_state: step 6, position (epoch %d, shard %d, batch %d), world %d, %d samples a batch, -t %d, "
          "-R %d, -S %llu, shards %016llx, -d %lld, %lld tokens seen", s.epoch, s.shard_pos, s.batch_pos, s.world,
          s.batch_samples, s.T, s.roll, (unsigned long long)s.seed, (unsigned long long)s.shards,
          (long long)s.total_batch_tokens, (long long)s.tokens_seen);
    dataloader_free(&d);

    // the saved run: -b 8, one process, -R 0, -S 7, stopped after 4 batches (32 windows)
    ResumeRun saved = {pattern, 8, T, 1, 0, 7};
    resume_loader(&d, &saved);
    for (int k = 0; k < 4; k++) { dataloader_next_batch(&d); }
    LRSchedule saved_sched = {SCHEDULE_COSINE, 1e-3, 0, 1e6, 8.0 * T};
    resume_saved = train_state(4, &d, &saved_sched, 4LL * 8 * T, &da);
    dataloader_next_batch(&d); // the batch the resumed runs must see next
    int same_pos = resume_data_position(&resume_saved, &d, "state") == 4;
    // another -b or process count: the position in batches of the new size, and the same windows next
    struct { int B, world, want; } tr[] = {{4, 1, 8}, {16, 1, 2}, {4, 2, 4}, {2, 2, 8}};
    int pos[4], same_data = 1;
    for (int k = 0; k < 4; k++) {
        DataLoader r[2];
        for (int rank = 0; rank < tr[k].world; rank++) {
            dataloader_init(&r[rank], pattern, tr[k].B, T, rank, tr[k].world, 1, 0, 7, 1000);
        }
        pos[k] = resume_data_position(&resume_saved, &r[0], "state");
        // the next 8 windows over all processes, in batch order, equal the saved run's next batch
        // (read at the wanted position: a wrong one is reported by its number)
        for (int rank = 0; rank < tr[k].world; rank++) {
            dataloader_set_position(&r[rank], resume_saved.epoch, resume_saved.shard_pos, tr[k].want);
        }
        int got = 0;
        while (got < 8) {
            for (int rank = 0; rank < tr[k].world; rank++) { dataloader_next_batch(&r[rank]); }
            for (int rank = 0; rank < tr[k].world; rank++) {
                for (int w = 0; w < tr[k].B && got < 8; w++, got++) {
                    same_data &= memcmp(r[rank].inputs + w * T, d.inputs + got * T, T * sizeof(int)) == 0;
                }
            }
        }
        for (int rank = 0; rank < tr[k].world; rank++) { dataloader_free(&r[rank]); }
    }
    check(same_pos && pos[0] == tr[0].want && pos[1] == tr[1].want && pos[2] == tr[2].want &&
              pos[3] == tr[3].want && same_data,
          "resume position: 4 batches of 8 windows stay 4 for the same settings and become %d of -b 4, %d of "
          "-b 16, %d of -b 4 x 2 processes, %d of -b 2 x 2 (want 8, 2, 4, 8); each continues with the saved "
          "run's next 8 windows", pos[0], pos[1], pos[2], pos[3]);
    dataloader_free(&d);
    static ResumeRun other_T = {pattern, 8, 4, 1, 0, 7}, other_roll = {pattern, 8, T, 1, 1, 7};
    static ResumeRun other_seed = {pattern, 8, T, 1, 0, 8}, one_fewer = {fewer, 8, T, 1, 0, 7};
    static ResumeRun bigger = {other_size, 8, T, 1, 0, 7}, name = {renamed, 8, T, 1, 0, 7};
    static ResumeRun b12 = {pattern, 12, T, 1, 0, 7}, b3x2 = {pattern, 3, T, 2, 0, 7};
    static ResumeRun copy_ok = {copied, 8, T, 1, 0, 7};
    expect_failure(resume_position_child, &other_T, "resume with -t 4 after -t 8");
    expect_failure(resume_position_child, &other_roll, "resume with -R 1 after -R 0");
    expect_failure(resume_position_child, &other_seed, "resume with -S 8 after -S 7");
    expect_failure(resume_position_child, &one_fewer, "resume on a pattern matching one shard fewer");
    expect_failure(resume_position_child, &bigger, "resume with a shard of 8 tokens more");
    expect_failure(resume_position_child, &name, "resume with a shard of another name");
    expect_failure(resume_position_child, &b12, "resume after 32 windows with -b 12 (no whole batch)");
    expect_failure(resume_position_child, &b3x2, "resume after 32 windows with -b 3 x 2 processes");
    check(child_succeeds(resume_position_child, &copy_ok),
          "resume position: the same shards copied to another directory are accepted (positive control)");

    test_run_start_checks();
}

// ----------------------------------------------------------------------------
// decode table

static void test_decode_table(void) {
    Tokenizer tk;
    if (!tokenizer_init(&tk, "data/gpt2_tokenizer.bin")) {
        check(0, "decode table: data/gpt2_tokenizer.bin is missing (make test runs make data first)");
        return;
    }
    int ok = tk.vocab_size == 50257 && tk.eot == 50256 && strcmp(tk.tokens[50256], "<|endoftext|>") == 0 &&
             strcmp(tk.tokens[464], "The") == 0 && strcmp(tk.tokens[15496], "Hello") == 0 &&
             strcmp(tk.tokens[11], ",") == 0;
    check(ok, "decode table: 50257 tokens, EOT 50256, tokens 464 'The', 15496 'Hello', 11 ','");
    tokenizer_free(&tk);
}

static void load_tokenizer_child(const void* arg) {
    Tokenizer tk;
    tokenizer_init(&tk, (const char*)arg);
}

static void test_bad_decode_table(void) {
    static char path[512];
    snprintf(path, sizeof(path), "%s/d_train_000.bin", test_dir); // a token shard, not a decode table
    expect_failure(load_tokenizer_child, path, "a token shard passed as the decode table");
}

// ----------------------------------------------------------------------------
// command line

static void parse_args_child(const void* arg) {
    const char* const* argv = (const char* const*)arg;
    int argc = 0;
    while (argv[argc] != NULL) { argc++; }
    Args a;
    parse_args(&a, argc, (char**)argv);
    FoxModel m;
    build_model(&m, &a);
}

static void test_command_line(void) {
    static const char* negative_batch[] = {"train_fox", "-b", "-4", NULL};
    static const char* bad_lr[] = {"train_fox", "-l", "fast", NULL};
    static const char* no_value[] = {"train_fox", "-t", NULL};
    static const char* bad_schedule[] = {"train_fox", "-k", "exponential", NULL};
    static const char* resume_no_dir[] = {"train_fox", "-y", "1", NULL};
    static const char* bad_preset[] = {"train_fox", "-e", "fox-pro-7b", NULL};
    static const char* bad_override[] = {"train_fox", "--gate", "sometimes", NULL};
    static const char* bad_heads[] = {"train_fox", "--n_head", "3", NULL};
    static const char* bad_guard[] = {"train_fox", "-G", "ignore", NULL};
    static const char* bad_spike[] = {"train_fox", "-Z", "-1", NULL};
    static const char* bad_prune[] = {"train_fox", "-A", "2", NULL};
    static const char* bad_ln_eps[] = {"train_fox", "-L", "0", NULL};
    expect_failure(parse_args_child, negative_batch, "-b -4");
    expect_failure(parse_args_child, bad_lr, "-l fast");
    expect_failure(parse_args_child, no_value, "-t without a value");
    expect_failure(parse_args_child, bad_schedule, "-k exponential");
    expect_failure(parse_args_child, resume_no_dir, "-y 1 without -o");
    expect_failure(parse_args_child, bad_preset, "-e fox-pro-7b");
    expect_failure(parse_args_child, bad_override, "--gate sometimes");
    expect_failure(parse_args_child, bad_heads, "--n_head 3 with n_embd 128");
    expect_failure(parse_args_child, bad_guard, "-G ignore");
    expect_failure(parse_args_child, bad_spike, "-Z -1");
    expect_failure(parse_args_child, bad_prune, "-A 2");
    expect_failure(parse_args_child, bad_ln_eps, "-L 0 (ln eps must be < 0)");
}

// ----------------------------------------------------------------------------
// what a run trusts at its start: every token id of its shards, and its output directory -o (made,
// locked, write-tested, room for a checkpoint; main.log's writes checked)

static void init_loader_child(const void* arg) {
    DataLoader d;
    dataloader_init(&d, (const char*)arg, 2, 8, 0, 1, 1, 0, 1, 1000);
}

// every shard's ids are checked by dataloader_init, past the first chunk, in a shard the loader has not
// opened yet, up to the last token
static void test_shard_tokens(void) {
    size_t n = SHARD_CHECK_CHUNK + 1000;
    uint16_t* tokens = (uint16_t*)malloc_check(n * sizeof(uint16_t), "test tokens");
    for (size_t i = 0; i < n; i++) { tokens[i] = (uint16_t)(i % 1000); }
    char good[512], bad[512], pattern[512], msg[2048], want[128];
    static char one[512];
    snprintf(good, sizeof(good), "%s/ids_000.bin", test_dir);
    snprintf(bad, sizeof(bad), "%s/ids_001.bin", test_dir);
    snprintf(pattern, sizeof(pattern), "%s/ids_*.bin", test_dir);
    write_shard(good, tokens, (int)n, SHARD_MAGIC, (int)n);
    check(child_succeeds(init_loader_child, pattern), "shard ids: %zu ids < 1000 in one shard pass the check", n);
    size_t at = SHARD_CHECK_CHUNK + 17;
    tokens[at] = 1500;
    write_shard(bad, tokens, (int)n, SHARD_MAGIC, (int)n);
    snprintf(want, sizeof(want), "token id 1500 at token %zu (byte offset %zu)", at, SHARD_HEADER_BYTES + 2 * at);
    int refused = fails_with_hint(init_loader_child, pattern, msg, sizeof(msg));
    check(refused && strstr(msg, want) != NULL && strstr(msg, bad) != NULL,
          "shard ids: one id 1500 >= vocabulary 1000 past the first chunk of the second shard stops the start, "
          "naming file, index and value -> \"%s\"", msg);
    tokens[at] = 7;
    tokens[n - 1] = 1000;
    snprintf(one, sizeof(one), "%s/ids_001.bin", test_dir);
    write_shard(one, tokens, (int)n, SHARD_MAGIC, (int)n);
    snprintf(want, sizeof(want), "token id 1000 at token %zu", n - 1);
    refused = fails_with_hint(init_loader_child, one, msg, sizeof(msg));
    check(refused && strstr(msg, want) != NULL, "shard ids: the last token, id 1000 = vocabulary, is checked too "
          "-> \"%s\"", msg);
    free(tokens);
}

// run_dir_claim's outcome on dir for a model of configuration c, its message in why
static int claim(RunDir* rd, const char* dir, const FoxConfig* c, char* why, size_t n) {
    why[0] = '\0';
    return run_dir_claim(rd, dir, c, why, n);
}

// a child that claims the directory arg with file sizes limited to 16 KiB: the write test must fail
static void claim_small_files_child(const void* arg) {
    struct rlimit lim = {16 << 10, 16 << 10};
    signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) { fail("test: setrlimit"); }
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    RunDir rd;
    char why[RUN_DIR_WHY_BYTES];
    if (claim(&rd, (const char*)arg, &c, why, sizeof(why)) != 0) { fail("%s", why); }
}

// a main.log on a device that is always full: the first record must stop the run
static void log_full_child(const void* arg) {
    (void)arg;
    RunDir rd = run_dir_unclaimed();
    snprintf(rd.log_path, sizeof(rd.log_path), "/dev/full");
    rd.log = fopen_check(rd.log_path, "w");
    log_line(&rd, "s:1 trl:%.6f\n", 1.0);
}

// -o and -n on the command line: an empty -o, and an explicit -n without -o, are refused
static void test_out_flags(void) {
    static const char* empty_o[] = {"train_fox", "-o", "", NULL};
    static const char* n_no_dir[] = {"train_fox", "-n", "1", NULL};
    static const char* n0_no_dir[] = {"train_fox", "-n", "0", NULL};
    static const char* n_dir[] = {"train_fox", "-n", "1", "-o", "run", NULL};
    static const char* neither[] = {"train_fox", NULL};
    expect_failure(parse_args_child, empty_o, "-o '' (an unset variable)");
    expect_failure(parse_args_child, n_no_dir, "-n 1 without -o");
    expect_failure(parse_args_child, n0_no_dir, "-n 0 (given) without -o");
    check(child_succeeds(parse_args_child, n_dir) && child_succeeds(parse_args_child, neither),
          "-n: -n 1 -o run, and neither -n nor -o (-n's default 0), are accepted");
    static const char* q_eval[] = {"train_fox", "-M", "eval", "-q", "hybrid", NULL};
    static const char* q_train[] = {"train_fox", "-q", "hybrid", NULL};
    expect_failure(parse_args_child, q_eval, "-q hybrid in -M eval (a training setting)");
    check(child_succeeds(parse_args_child, q_train), "-q hybrid in training is accepted");
}

// run_dir_claim: parents made, a file as -o or as a parent refused, the lock (a second claim refused
// naming the holder's pid, free again after run_dir_close, a dead run's lock file no obstacle), the
// write test and the free space; checkpoint_sizes against the files save_model and save_state write
static void test_run_dir(void) {
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    char dir[600], why[RUN_DIR_WHY_BYTES], why2[RUN_DIR_WHY_BYTES], path[700], want[64];
    RunDir rd, rd2;
    struct stat st;
    // files and parents that are no directories
    snprintf(path, sizeof(path), "%s/a_file", test_dir);
    FILE* f = fopen_check(path, "w");
    fclose(f);
    int not_dir = claim(&rd, path, &c, why, sizeof(why)) != 0 && strstr(why, "is not a directory");
    check(not_dir, "run dir: -o naming a file is refused -> \"%.*s\"", (int)strcspn(why, "\n"), why);
    snprintf(dir, sizeof(dir), "%s/below/run", path);
    int parent = claim(&rd, dir, &c, why, sizeof(why)) != 0 && strstr(why, "a parent of -o");
    check(parent, "run dir: -o below a file is refused naming it -> \"%.*s\"", (int)strcspn(why, "\n"), why);
    snprintf(dir, sizeof(dir), "%s/out/new/parents", test_dir);
    int made = claim(&rd, dir, &c, why, sizeof(why)) == 0 && stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
    check(made, "run dir: -o with two missing parents is made (mkdir -p) %s", why);
    if (!made) { return; } // the rest writes there
    snprintf(want, sizeof(want), "pid %ld on ", (long)getpid());
    int refused = claim(&rd2, dir, &c, why, sizeof(why)) != 0;
    check(refused && strstr(why, "in use by another run") && strstr(why, want) && strstr(why, "HINT"),
          "run dir: a second claim of a locked -o is refused naming the holder -> \"%.*s\"",
          (int)strcspn(why, "\n"), why);
    run_dir_close(&rd);
    int again = claim(&rd, dir, &c, why, sizeof(why)) == 0;
    run_dir_close(&rd);
    snprintf(path, sizeof(path), "%s/%s", dir, RUN_LOCK_NAME);
    f = fopen_check(path, "w");
    fprintf(f, "pid 999999 on a host long gone\n");
    fclose(f);
    int stale = claim(&rd, dir, &c, why, sizeof(why)) == 0;
    f = fopen_check(path, "r");
    char holder[256] = "";
    if (fgets(holder, sizeof(holder), f) == NULL) { holder[0] = '\0'; }
    fclose(f);
    holder[strcspn(holder, "\n")] = '\0';
    check(again && stale && strncmp(holder, want, strlen(want)) == 0, "run dir: the lock is free after "
          "run_dir_close (%d) and a dead run's lock file does not block (%d; it now says \"%s\")", again, stale,
          holder);
    // checkpoint_sizes: the files of a checkpoint with AdamW moments, as a training run writes them
    FoxModel m;
    fox_build(&m, &c);
    fox_init(&m, 1);
    m.m_memory = (float*)calloc_check(m.num_parameters, sizeof(float), "test m");
    m.v_memory = (float*)calloc_check(m.num_parameters, sizeof(float), "test v");
    TrainState s;
    memset(&s, 0, sizeof(s));
    char model_path[4096], state_path[4096];
    checkpoint_paths(dir, 1, model_path, state_path, sizeof(model_path));
    save_state(&m, &s, state_path);
    save_model(&m, model_path);
    size_t model_bytes, state_bytes;
    checkpoint_sizes(&c, &model_bytes, &state_bytes);
    struct stat sm, ss;
    int sizes = stat(model_path, &sm) == 0 && stat(state_path, &ss) == 0 && (size_t)sm.st_size == model_bytes &&
                (size_t)ss.st_size == state_bytes;
    check(sizes, "run dir: checkpoint_sizes (%zu + %zu bytes) are the sizes of the files save_model and save_state "
          "write", model_bytes, state_bytes);
    fox_free(&m);
    run_dir_close(&rd);
    // no room for one checkpoint: a model of 256 layers of C = 8192 (terabytes a file); the lock is let go
    FoxConfig huge = c;
    huge.n_layer = 256; huge.n_embd = 8192; huge.n_head = 64; huge.mlp_hidden = 65536;
    refused = claim(&rd, dir, &huge, why, sizeof(why)) != 0 && strstr(why, "one checkpoint of this model needs") &&
              strstr(why, "HINT");
    int freed = claim(&rd2, dir, &c, why2, sizeof(why2)) == 0;
    run_dir_close(&rd2);
    check(refused && freed, "run dir: no room for one checkpoint is refused at the start (%.*s), and the lock let go",
          (int)strcspn(why, "\n"), why);
    if (geteuid() != 0) {
        snprintf(dir, sizeof(dir), "%s/out/read_only", test_dir);
        mkdir(dir, 0555);
        int ro = claim(&rd, dir, &c, why, sizeof(why)) != 0 && strstr(why, "not writable");
        check(ro, "run dir: a read-only -o is refused -> \"%.*s\"", (int)strcspn(why, "\n"), why);
    } else {
        printf("skipped: run dir: a read-only -o (root writes anywhere; dev/test_reliability.sh mounts one)\n");
    }
    static char small[600];
    snprintf(small, sizeof(small), "%s/out/small_files", test_dir);
    expect_failure(claim_small_files_child, small, "-o where no file may pass 16 KiB (the write test at the start)");
    expect_failure(log_full_child, NULL, "a main.log write on a full disk (/dev/full)");
}

// ----------------------------------------------------------------------------
// HuggingFace export and import (dev/fox_hf.c); dev/hf_check.py checks the numbers against
// the reference, these the round trip, the file contents and bad input

static void hf_cli_child(const void* arg) {
    const char* const* argv = (const char* const*)arg;
    int argc = 0;
    while (argv[argc] != NULL) { argc++; }
    fox_hf_cli(argc, (char**)argv);
}

// fox_hf with these arguments in a child process (it exits on errors); 1 if it succeeded
static int hf_cli_ok(const char* const* argv) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) { dup2(devnull, 1); dup2(devnull, 2); }
        hf_cli_child(argv);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

typedef struct {
    const char* name;
    const char* preset;
    const char* keys[2];
    const char* values[2];
    int vocab;
} HfVariant;

// every parameter random (norm scales and biases too); the vocabulary's pad rows stay 0 from fox_build
static void hf_random_model(FoxModel* m, const HfVariant* v, uint64_t seed) {
    FoxConfig c;
    config_from_preset(&c, v->preset);
    for (int i = 0; i < 2 && v->keys[i] != NULL; i++) { config_set(&c, v->keys[i], v->values[i]); }
    if (v->vocab > 0) { c.vocab_size = v->vocab; c.padded_vocab_size = padded_vocab(v->vocab); }
    c.mlp_hidden = derived_mlp_hidden(c.n_embd, c.block);
    fox_build(m, &c);
    uint64_t rng = seed;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        float* p = param_tensor(&m->params, t);
        size_t n = param_numel(&m->spec[t], c.n_layer);
        if (t == P_WTE || t == P_LM_HEAD) { n = (size_t)c.vocab_size * c.n_embd; }
        for (size_t i = 0; i < n; i++) { p[i] = (float)rng_normal(&rng); }
    }
}

static int hf_same_model(const FoxModel* a, const FoxModel* b) {
    return memcmp(&a->config, &b->config, sizeof(FoxConfig)) == 0 && a->num_parameters == b->num_parameters &&
           memcmp(a->params_memory, b->params_memory, a->num_parameters * sizeof(float)) == 0;
}

// the named tensor of an exported file has this shape and holds exactly these floats
static int hf_tensor_is(const SafeTensors* st, const char* name, size_t rows, size_t cols, const float* want) {
    const StTensor* t = safetensors_find(st, name);
    if (t == NULL || t->dtype != ST_F32 || t->shape[0] != rows || t->ndim != (cols > 0 ? 2 : 1) ||
        (cols > 0 && t->shape[1] != cols)) {
        return 0;
    }
    return memcmp(st->data + t->begin, want, rows * (cols > 0 ? cols : 1) * sizeof(float)) == 0;
}

// the authors' names and shapes (dev/fox.md, "HuggingFace layout"), written out here rather than derived
// from param_hf_name
static void hf_check_contents(const FoxModel* m, const char* dir, const char* what) {
    char path[600];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    size_t size;
    uint8_t* buf = read_file(path, SIZE_MAX, &size);
    SafeTensors st;
    char error[256];
    if (safetensors_parse(&st, buf, size, error, sizeof(error)) != 0) {
        check(0, "hf %s: the export does not parse: %s", what, error);
        free(buf);
        return;
    }
    const FoxConfig* c = &m->config;
    const ParameterTensors* p = &m->params;
    size_t C = (size_t)c->n_embd, H = (size_t)c->n_head, V = (size_t)c->vocab_size, I = (size_t)c->mlp_hidden;
    size_t qk = c->qk_norm_shared ? C / H : C;
    int ok = hf_tensor_is(&st, "model.embeddings.weight", V, C, p->wte) &&
             hf_tensor_is(&st, "lm_head.weight", V, C, p->lm_head) &&
             hf_tensor_is(&st, "model.norm.weight", C, 0, p->norm_f) &&
             hf_tensor_is(&st, "model.layers.1.attn.q_proj.weight", C, C, p->wq + C * C) &&
             hf_tensor_is(&st, "model.layers.1.attn.o_proj.weight", C, C, p->wo + C * C) &&
             hf_tensor_is(&st, "model.layers.1.mlp.gate_proj.weight", 2 * I, C, p->wgu + 2 * I * C) &&
             hf_tensor_is(&st, "model.layers.0.mlp.down_proj.weight", C, I, p->wdown) &&
             hf_tensor_is(&st, "model.layers.1.mlp_norm.weight", C, 0, p->mlp_norm + C);
    ok = ok && (c->k_shift ? hf_tensor_is(&st, "model.layers.1.attn.k_proj.linear.weight", C, C, p->wk + C * C) &&
                             hf_tensor_is(&st, "model.layers.1.attn.k_proj.shift_proj.weight", H, C,
                                          p->wk_shift + H * C)
                           : hf_tensor_is(&st, "model.layers.1.attn.k_proj.weight", C, C, p->wk + C * C));
    ok = ok && (c->v_shift ? hf_tensor_is(&st, "model.layers.1.attn.v_proj.shift_proj.weight", H, C,
                                          p->wv_shift + H * C)
                           : hf_tensor_is(&st, "model.layers.1.attn.v_proj.weight", C, C, p->wv + C * C));
    if (c->gate == GATE_FULL) {
        ok = ok && hf_tensor_is(&st, "model.layers.1.attn.fgate_proj.weight", H, C, p->wf + H * C) &&
             hf_tensor_is(&st, "model.layers.1.attn.fgate_proj.bias", H, 0, p->bf + H);
    } else if (c->gate != GATE_NONE) {
        ok = ok && hf_tensor_is(&st, "model.layers.1.attn.fgate_bias", H, 0, p->bf + H);
    }
    if (c->qk_norm) { ok = ok && hf_tensor_is(&st, "model.layers.1.attn.k_norm.weight", qk, 0, p->k_norm + qk); }
    if (c->output_gate) { ok = ok && hf_tensor_is(&st, "model.layers.1.attn.ogate_proj.weight", C, C, p->wg + C * C); }
    if (c->output_norm) { ok = ok && hf_tensor_is(&st, "model.layers.1.attn.output_norm.weight", C, 0, p->o_norm + C); }
    size_t count = st.count;
    size_t want_count;
    HfTensor* list = hf_tensors_alloc(m, &want_count);
    free(list);
    check(ok && count == want_count,
          "hf %s: %zu tensors by the authors' names and shapes, pad rows dropped, values exact", what, count);
    safetensors_free(&st);
    free(buf);
}

static void test_hf_roundtrip(void) {
    static const HfVariant variants[] = {
        {"fox-pro-tiny", "fox-pro-tiny", {NULL, NULL}, {NULL, NULL}, 0},
        {"transformer-llama-tiny", "transformer-llama-tiny", {NULL, NULL}, {NULL, NULL}, 1000},
        {"fox-pro qk_norm_shared", "fox-pro-tiny", {"qk_norm_shared", NULL}, {"1", NULL}, 1000},
        {"fox-pro gate bias_only", "fox-pro-tiny", {"gate", NULL}, {"bias_only", NULL}, 1000},
        {"fox-llama gate fixed", "fox-llama-tiny", {"gate", NULL}, {"fixed", NULL}, 1000},
        {"fox-pro shifts off", "fox-pro-tiny", {"k_shift", "v_shift"}, {"0", "0"}, 1000},
    };
    static char model_path[512], dir[512], back_path[512];
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
        FoxModel m, back;
        hf_random_model(&m, &variants[i], 11 + i);
        snprintf(model_path, sizeof(model_path), "%s/hf_%zu.bin", test_dir, i);
        snprintf(dir, sizeof(dir), "%s/hf_%zu", test_dir, i);
        snprintf(back_path, sizeof(back_path), "%s/hf_%zu_back.bin", test_dir, i);
        save_model(&m, model_path);
        const char* export_argv[] = {"export", model_path, dir, NULL};
        const char* import_argv[] = {"import", dir, back_path, NULL};
        int ran = hf_cli_ok(export_argv) && hf_cli_ok(import_argv);
        int same = 0;
        if (ran) {
            load_model(&back, back_path);
            same = hf_same_model(&m, &back);
            fox_free(&back);
        }
        check(ran && same, "hf %s: export then import gives the configuration and %zu parameters bit for bit",
              variants[i].name, m.num_parameters);
        if (ran) { hf_check_contents(&m, dir, variants[i].name); }
        fox_free(&m);
    }
    // bf16 export: the import holds the round-to-nearest-even of every parameter
    FoxModel m, back;
    hf_random_model(&m, &variants[2], 3);
    snprintf(model_path, sizeof(model_path), "%s/hf_bf16.bin", test_dir);
    snprintf(dir, sizeof(dir), "%s/hf_bf16", test_dir);
    snprintf(back_path, sizeof(back_path), "%s/hf_bf16_back.bin", test_dir);
    save_model(&m, model_path);
    const char* export_bf16[] = {"export", "--bf16", model_path, dir, NULL};
    const char* import_bf16[] = {"import", dir, back_path, NULL};
    int ok = hf_cli_ok(export_bf16) && hf_cli_ok(import_bf16);
    if (ok) {
        load_model(&back, back_path);
        for (size_t k = 0; k < m.num_parameters; k++) {
            m.params_memory[k] = bf16_to_f32(f32_to_bf16(m.params_memory[k]));
        }
        ok = hf_same_model(&m, &back);
        fox_free(&back);
    }
    check(ok, "hf --bf16 export then import: every parameter is its bf16 rounding");
    // --unshare-qk-norm: the shared scale copied to every head
    const char* import_unshared[] = {"import", "--unshare-qk-norm", dir, back_path, NULL};
    ok = hf_cli_ok(import_unshared);
    if (ok) {
        load_model(&back, back_path);
        int hd = m.config.n_embd / m.config.n_head;
        ok = !back.config.qk_norm_shared && back.spec[P_Q_NORM].rows == (size_t)m.config.n_embd;
        for (int l = 0; l < m.config.n_layer && ok; l++) {
            for (int h = 0; h < m.config.n_head; h++) {
                ok = ok && memcmp(back.params.q_norm + ((size_t)l * m.config.n_head + h) * hd,
                                  m.params.q_norm + (size_t)l * hd, (size_t)hd * sizeof(float)) == 0;
            }
        }
        fox_free(&back);
    }
    check(ok, "hf import --unshare-qk-norm: every head's q_norm starts from the shared scale");
    fox_free(&m);
}

// a copy of the export src as folder dst, its model.safetensors changed: the first `find` in the
// header replaced by `replace` (the length field follows), then `drop` bytes cut off the end
// (at least 4 bytes stay); a non-zero header_len overrides the length field
static void hf_corrupt_copy(const char* src, const char* dst, const char* find, const char* replace, size_t drop,
                            uint64_t header_len) {
    char path[600], out[600];
    make_dir(dst);
    snprintf(path, sizeof(path), "%s/config.json", src);
    snprintf(out, sizeof(out), "%s/config.json", dst);
    copy_truncated(path, out, 0);
    snprintf(path, sizeof(path), "%s/model.safetensors", src);
    size_t size;
    uint8_t* buf = read_file(path, SIZE_MAX, &size);
    size_t n = (size_t)read_le64(buf), data = size - 8 - n;
    Text header = {NULL, 0, 0}, file = {NULL, 0, 0};
    text_add(&header, "%.*s", (int)n, (const char*)buf + 8);
    const char* at = find != NULL ? strstr(header.s, find) : NULL;
    uint64_t new_len = header.len + (at != NULL ? strlen(replace) - strlen(find) : 0);
    uint64_t len = header_len != 0 ? header_len : new_len;
    for (int i = 0; i < 8; i++) { text_add(&file, "%c", (char)(len >> (8 * i))); } // %c writes NUL bytes too
    if (at != NULL) { text_add(&file, "%.*s%s%s", (int)(at - header.s), header.s, replace, at + strlen(find)); }
    else { text_add(&file, "%s", header.s); }
    size_t total = file.len + data, keep = drop < total - 4 ? total - drop : 4;
    snprintf(out, sizeof(out), "%s/model.safetensors", dst);
    FILE* f = fopen_check(out, "wb");
    fwrite_check(file.s, 1, keep < file.len ? keep : file.len, f, out);
    if (keep > file.len) { fwrite_check(buf + 8 + n, 1, keep - file.len, f, out); }
    fclose(f);
    free(header.s); free(file.s); free(buf);
}

static int hf_parse_text(const char* header, size_t data_size) {
    size_t n = strlen(header), size = 8 + n + data_size;
    uint8_t* buf = (uint8_t*)calloc_check(size, 1, "safetensors test");
    for (int i = 0; i < 8; i++) { buf[i] = (uint8_t)((uint64_t)n >> (8 * i)); }
    memcpy(buf + 8, header, n);
    SafeTensors st;
    char error[256];
    int r = safetensors_parse(&st, buf, size, error, sizeof(error));
    if (r == 0) { safetensors_free(&st); }
    free(buf);
    return r;
}

static void test_hf_bad_input(void) {
    // the reader alone, on hand-made headers
    int accepted = hf_parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                 "\"__metadata__\":{\"k\":\"v\"}}", 8) == 0 &&
                   hf_parse_text("{\"b\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[2,4]},"
                                 "\"a\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]}}  ", 4) == 0;
    const char* bad[] = {
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}",                         // duplicate
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,8]}}", // size overflow
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[6,10]}}",                        // gap
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",                         // overlap
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}",                // unknown key
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",                       // negative size
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}",                       // trailing comma
        "{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",                 // lone surrogate
        "[1, 2]",                                                                                  // not an object
        "{\"__metadata__\":{\"k\":1}}",                                                            // numeric metadata
    };
    int refused = 0;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) { refused += hf_parse_text(bad[i], 8) != 0; }
    check(accepted && refused == (int)(sizeof(bad) / sizeof(bad[0])),
          "safetensors reader: 2 valid files accepted, %d of %zu malformed refused "
          "(duplicate, overflow, gap, overlap, unknown key, negative, trailing comma, surrogate, array, metadata)",
          refused, sizeof(bad) / sizeof(bad[0]));
    // the tool on damaged exports: a message with a HINT and a non-zero exit
    FoxModel m;
    const HfVariant small = {"small", "fox-pro-tiny", {NULL, NULL}, {NULL, NULL}, 1000};
    hf_random_model(&m, &small, 5);
    static char model_path[512], good[512], out_path[512];
    snprintf(model_path, sizeof(model_path), "%s/hf_bad.bin", test_dir);
    snprintf(good, sizeof(good), "%s/hf_good", test_dir);
    snprintf(out_path, sizeof(out_path), "%s/hf_out.bin", test_dir);
    save_model(&m, model_path);
    const char* export_argv[] = {"export", model_path, good, NULL};
    if (!hf_cli_ok(export_argv)) { check(0, "hf: export of a valid model failed"); fox_free(&m); return; }
    size_t C = 128, V = 1000, data = 0, lm_bytes = V * C * 4;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        const ParamSpec* s = &m.spec[t];
        data += (size_t)s->hf_rows * s->cols * 4 * (s->rows == 0 ? 0 : s->per_layer ? (size_t)m.config.n_layer : 1);
    }
    char shape_from[128], offsets_from[128], offsets_past[128], offsets_overlap[128];
    snprintf(shape_from, sizeof(shape_from), "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[%zu,%zu]", V, C);
    char shape_to[128];
    snprintf(shape_to, sizeof(shape_to), "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[%zu,%zu]", C, V);
    snprintf(offsets_from, sizeof(offsets_from), "[%zu,%zu]", data - lm_bytes, data);
    snprintf(offsets_past, sizeof(offsets_past), "[%zu,%zu]", data - lm_bytes + 4, data + 4);
    snprintf(offsets_overlap, sizeof(offsets_overlap), "[%zu,%zu]", data - lm_bytes - 4, data - 4);
    struct { const char* what; const char* find; const char* replace; size_t drop; uint64_t header_len; } cases[] = {
        {"safetensors header length past the end of the file", NULL, NULL, 0, (uint64_t)1 << 40},
        {"safetensors header that is not JSON", "\"shape\":[", "\"shape\":[,", 0, 0},
        {"safetensors lm_head of shape (C, V) instead of (V, C)", shape_from, shape_to, 0, 0},
        {"safetensors without lm_head.weight", "\"lm_head.weight\"", "\"lm_head.weighs\"", 0, 0},
        {"safetensors with an unknown dtype", "\"F32\"", "\"F31\"", 0, 0},
        {"safetensors offsets past the data", offsets_from, offsets_past, 0, 0},
        {"safetensors tensors overlapping", offsets_from, offsets_overlap, 0, 0},
        {"safetensors truncated by 4 bytes", NULL, NULL, 4, 0},
        {"safetensors of 4 bytes", NULL, NULL, SIZE_MAX, 0},
    };
    static char dirs[16][512];
    static const char* argvs[16][4];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(dirs[i], sizeof(dirs[i]), "%s/hf_bad_%zu", test_dir, i);
        hf_corrupt_copy(good, dirs[i], cases[i].find, cases[i].replace, cases[i].drop, cases[i].header_len);
        argvs[i][0] = "import"; argvs[i][1] = dirs[i]; argvs[i][2] = out_path; argvs[i][3] = NULL;
        expect_failure(hf_cli_child, argvs[i], cases[i].what);
    }
    // config.json problems, a model the layout cannot express, bad command lines
    static char bad_config[512], path[600], window_path[512], window_dir[512];
    snprintf(bad_config, sizeof(bad_config), "%s/hf_bad_config", test_dir);
    hf_corrupt_copy(good, bad_config, NULL, NULL, 0, 0);
    snprintf(path, sizeof(path), "%s/config.json", bad_config);
    FILE* f = fopen_check(path, "wb");
    fprintf(f, "{\"model_type\": \"forgetting_transformer-project_fox\", \"vocab_size\": 1000, \"hidden_size\": 128, "
               "\"num_hidden_layers\": 2, \"num_heads\": 2, \"fgate_type\": \"sometimes\"}");
    fclose(f);
    static const char* bad_gate[] = {"import", bad_config, out_path, NULL};
    expect_failure(hf_cli_child, bad_gate, "config.json with fgate_type \"sometimes\"");
    f = fopen_check(path, "wb");
    fprintf(f, "{\"model_type\": \"forgetting_transformer-project_fox\", \"vocab_size\": 1000, \"hidden_size\": 128,}");
    fclose(f);
    expect_failure(hf_cli_child, bad_gate, "config.json with a trailing comma");
    static const char* missing[] = {"import", "/nonexistent/hf", out_path, NULL};
    expect_failure(hf_cli_child, missing, "import of a missing folder");
    fox_free(&m);
    const HfVariant windowed = {"window", "fox-pro-tiny", {"window", NULL}, {"64", NULL}, 1000};
    hf_random_model(&m, &windowed, 6);
    snprintf(window_path, sizeof(window_path), "%s/hf_window.bin", test_dir);
    snprintf(window_dir, sizeof(window_dir), "%s/hf_window", test_dir);
    save_model(&m, window_path);
    static const char* export_window[] = {"export", window_path, window_dir, NULL};
    expect_failure(hf_cli_child, export_window, "export of a sliding-window model (no key for it in the layout)");
    static const char* bad_flag[] = {"export", "--fp8", window_path, window_dir, NULL};
    expect_failure(hf_cli_child, bad_flag, "fox_hf export --fp8");
    static const char* no_args[] = {"import", NULL};
    expect_failure(hf_cli_child, no_args, "fox_hf import without paths");
    fox_free(&m);
}

static void test_hf(void) {
    test_hf_roundtrip();
    test_hf_bad_input();
}

// ----------------------------------------------------------------------------

// ----------------------------------------------------------------------------
// data parallel, the plain-C part (train_fox.c): ranks from flags and the environment, ZeRO-1
// shards, data positions across process counts, the NCCL id rendezvous

static void clear_launcher_env(void) {
    for (int i = 0; i < 3; i++) { unsetenv(WORLD_ENV[i]); unsetenv(RANK_ENV[i]); unsetenv(LOCAL_RANK_ENV[i]); }
}

static void topology_child(const void* arg) {
    const int* world_rank = (const int*)arg;
    Topology t;
    resolve_topology(&t, world_rank[0], world_rank[1]);
}

static void test_topology(void) {
    clear_launcher_env();
    Topology t;
    resolve_topology(&t, -1, -1);
    check(t.world == 1 && t.rank == 0 && t.local_rank == 0, "topology: no flags and no launcher make one process");
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1); setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1); setenv("SLURM_PROCID", "3", 1); setenv("SLURM_NTASKS", "8", 1);
    resolve_topology(&t, -1, -1);
    check(t.world == 4 && t.rank == 2 && t.local_rank == 1, "topology: Open MPI's environment comes before Slurm's");
    resolve_topology(&t, 8, 5);
    check(t.world == 8 && t.rank == 5 && t.local_rank == 5,
          "topology: -W and -I win over the environment (local rank = -I)");
    clear_launcher_env();
    setenv("WORLD_SIZE", "2", 1); setenv("RANK", "1", 1);
    resolve_topology(&t, -1, -1);
    check(t.world == 2 && t.rank == 1 && t.local_rank == 1,
          "topology: WORLD_SIZE/RANK; without a local rank it is the rank");
    clear_launcher_env();
    static const int no_rank[] = {2, -1}, rank_too_big[] = {2, 2};
    expect_failure(topology_child, no_rank, "-W 2 without a rank");
    expect_failure(topology_child, rank_too_big, "-W 2 -I 2");
    static const int from_env[] = {-1, -1};
    setenv("WORLD_SIZE", "two", 1);
    expect_failure(topology_child, from_env, "WORLD_SIZE=two");
    setenv("WORLD_SIZE", "0", 1);
    expect_failure(topology_child, from_env, "WORLD_SIZE=0");
    clear_launcher_env();
    static const char* zero_world[] = {"train_fox", "-W", "0", NULL};
    static const char* bad_stage[] = {"train_fox", "-Q", "2", NULL};
    expect_failure(parse_args_child, zero_world, "-W 0");
    expect_failure(parse_args_child, bad_stage, "-Q 2");
}

#ifdef __CUDACC__
// The GPU's parameter layout (layout_params) and AdamW's segments, on the host: for models whose
// layers hold different tensors (frozen gate bias, grouped projections with and without v) and
// worlds of 1 to 9 ranks, every slice aligned and inside its bucket (BUCKET_FP32 for what the
// forward reads in fp32, else BUCKET_MATMUL), no two overlapping, the grouped and the head
// projections side by side, buckets padded to the world and tiled by the ranks' shares,
// and every trainable parameter of a rank's share in exactly one AdamW segment of its decay group
// (frozen ones in none), its moment at the share's place.
static void test_param_layout(void) {
    // (C, H) = (160, 5) and (96, 3): H C not a multiple of LAYOUT_ALIGN, so the head projections
    // lie side by side only if their group is packed
    const char* models[][5] = {{"fox-pro-tiny", "", ""}, {"fox-pro-tiny", "gate", "fixed"},
                               {"fox-pro-tiny", "v_shift", "0"}, {"fox-llama-tiny", "", ""},
                               {"transformer-llama-tiny", "", ""}, {"fox-pro-tiny", "", "", "160", "5"},
                               {"fox-pro-tiny", "gate", "bias_only", "96", "3"}};
    int aligned = 1, inside = 1, disjoint = 1, grouped = 1, padded = 1, tiled = 1, segments = 1, cases = 0;
    for (size_t k = 0; k < sizeof(models) / sizeof(models[0]); k++) {
        FoxConfig c;
        config_from_preset(&c, models[k][0]);
        config_set(&c, "vocab_size", "500");
        if (models[k][1][0] != '\0') { config_set(&c, models[k][1], models[k][2]); }
        if (models[k][3] != NULL) {
            c.n_embd = atoi(models[k][3]);
            c.n_head = atoi(models[k][4]);
            c.mlp_hidden = derived_mlp_hidden(c.n_embd, c.block);
        }
        ParamSpec spec[NUM_PARAM_TENSORS];
        param_table(&c, spec);
        int L = c.n_layer, slot[4], hp_slot[HP_MAX];
        qkvg_slots(&c, slot);
        head_proj_slots(&c, hp_slot);
        size_t CC = (size_t)c.n_embd * c.n_embd, HC = (size_t)c.n_head * c.n_embd;
        for (int world = 1; world <= 9; world++) {
            cases++;
            ParamLayout lay;
            layout_params(&lay, &c, world);
            size_t end = 0, unit = (size_t)LAYOUT_ALIGN * world;
            for (int b = 0; b < NUM_BUCKETS; b++) {
                padded &= lay.bucket[b].lo == end && lay.bucket[b].n % unit == 0;
                end = lay.bucket[b].lo + lay.bucket[b].n;
            }
            padded &= end == lay.size;
            unsigned char* owner = (unsigned char*)calloc_check(lay.size, 1, "layout map");
            for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
                for (int l = 0; l < (spec[t].per_layer ? L : 1); l++) {
                    size_t lo = lay.slice[(size_t)t * L + l], n = param_slice_numel(&spec[t]);
                    int b = t == P_WTE || spec[t].cols == 1 ? BUCKET_FP32 : BUCKET_MATMUL;
                    int member = 0; // a group's member after its first (grouped checks where it lies)
                    for (int j = 0; j < 4; j++) { member |= t == QKVG_TENSORS[j] && slot[j] > 0; }
                    for (int j = 0; j < HP_MAX; j++) { member |= t == HP_TENSORS[j] && hp_slot[j] > 0; }
                    aligned &= lo % LAYOUT_ALIGN == 0 || member;
                    inside &= lo >= lay.bucket[b].lo && lo + n <= lay.bucket[b].lo + lay.bucket[b].n;
                    for (size_t i = lo; i < lo + n && inside; i++) { disjoint &= owner[i] == 0; owner[i] = 1 + t; }
                }
            }
            for (int l = 0; l < L; l++) {
                int first = -1, hp_first = -1;
                for (int q = 0; q < 4; q++) { first = slot[q] == 0 ? QKVG_TENSORS[q] : first; }
                for (int q = 0; q < HP_MAX; q++) { hp_first = hp_slot[q] == 0 ? HP_TENSORS[q] : hp_first; }
                for (int j = 0; j < 4; j++) {
                    grouped &= slot[j] <= 0 || lay.slice[(size_t)QKVG_TENSORS[j] * L + l] ==
                                               lay.slice[(size_t)first * L + l] + (size_t)slot[j] * CC;
                }
                for (int j = 0; j < HP_MAX; j++) {
                    grouped &= hp_slot[j] <= 0 || lay.slice[(size_t)HP_TENSORS[j] * L + l] ==
                                                  lay.slice[(size_t)hp_first * L + l] + (size_t)hp_slot[j] * HC;
                }
            }
            int* hits = (int*)calloc_check(lay.size, sizeof(int), "layout map");
            for (int r = 0; r < world; r++) {
                Dist d = g_single_process;
                d.world = world;
                d.rank = r;
                d.zero_stage = 1;
                RangeList share;
                range_list_host(&share, &lay, &d, world > 1);
                for (int b = 0; b < share.count && world > 1; b++) {
                    tiled &= share.host[b].lo == lay.bucket[b].lo + (size_t)r * (lay.bucket[b].n / world) &&
                              share.host[b].n == lay.bucket[b].n / world;
                }
                int count;
                unsigned blocks;
                AdamWSegment* sg = adamw_segment_table(&lay, spec, L, &share, &count, &blocks);
                for (int i = 0; i < count; i++) {
                    int in_range = 0;
                    for (int q = 0; q < share.count; q++) {
                        Range rg = share.host[q];
                        in_range |= sg[i].lo >= rg.lo && sg[i].lo + sg[i].n <= rg.lo + rg.n &&
                                    sg[i].m_lo == rg.v + (sg[i].lo - rg.lo);
                    }
                    segments &= in_range && sg[i].first_block ==
                                 (i == 0 ? 0u : sg[i - 1].first_block + (unsigned)ceil_div(sg[i - 1].n, 1024));
                    for (size_t e = sg[i].lo; e < sg[i].lo + sg[i].n; e++) {
                        hits[e]++;
                        segments &= owner[e] == 0 || spec[owner[e] - 1].decay == sg[i].decay;
                    }
                }
                free(sg);
                free(share.host);
            }
            for (size_t e = 0; e < lay.size; e++) {
                segments &= owner[e] == 0 ? hits[e] <= 1 : hits[e] == (spec[owner[e] - 1].trainable ? 1 : 0);
            }
            free(hits);
            free(owner);
            layout_free(&lay);
        }
    }
    check(aligned && inside && disjoint && grouped, "parameter layout: %d models x worlds 1-9: slices aligned to %d "
          "(a group's later members right after the one before), inside their buckets, disjoint; grouped and head "
          "projections side by side", cases / 9, LAYOUT_ALIGN);
    check(padded && tiled && segments, "parameter layout: buckets contiguous and padded to the world, tiled by the "
          "ranks' shares; each trainable parameter in one AdamW segment of its decay group, frozen ones in none");
}
#else
static void test_param_layout(void) { printf("skipped: parameter layout (train_fox.cu's; built without nvcc)\n"); }
#endif

static void test_batch_translation(void) {
    check(translate_batch_pos(3, 16, 16) == 3 && translate_batch_pos(3, 16, 8) == 6 &&
              translate_batch_pos(4, 16, 32) == 2 && translate_batch_pos(3, 16, 32) == -1 &&
              translate_batch_pos(5, 0, 8) == -1,
          "data position: batches translate to another process count when they fill whole batches");
}

static const unsigned char* test_id(void) {
    static unsigned char id[128];
    for (int i = 0; i < 128; i++) { id[i] = (unsigned char)(i * 7 + 3); }
    return id;
}

static char rendezvous_path[600];

static void publish_child(const void* arg) { rendezvous_file_publish((const char*)arg, test_id(), 128, 2); }
static void await_acks_child(const void* arg) { rendezvous_file_await_acks((const char*)arg, 3, 0.2); }
static void fetch_child(const void* arg) {
    unsigned char got[128];
    rendezvous_file_fetch((const char*)arg, got, 128, 1, 0.2);
}
static void serve_child(const void* arg) { rendezvous_tcp_serve(*(const int*)arg, test_id(), 128, 2, 0.3); }
static void bad_tcp_child(const void* arg) {
    char host[64];
    int port;
    rendezvous_is_tcp((const char*)arg, host, sizeof(host), &port);
}

// ranks 1..world-1 as child processes that fetch the id (file or TCP) and exit 0 when it is
// rank 0's; rank 0 is this process. Returns 1 when every child got the id.
static int rendezvous_round(int world, int tcp, int port) {
    pid_t kids[8];
    fflush(stdout);
    for (int r = 1; r < world; r++) {
        kids[r] = fork();
        if (kids[r] == 0) {
            unsigned char got[128];
            if (tcp) { rendezvous_tcp_fetch("localhost", port, got, 128, r, 10.0); }
            else { rendezvous_file_fetch(rendezvous_path, got, 128, r, 10.0); }
            _exit(memcmp(got, test_id(), 128) != 0);
        }
    }
    usleep(100000); // the others wait first, as when rank 0 starts last
    if (tcp) {
        rendezvous_tcp_serve(port, test_id(), 128, world, 10.0);
    } else {
        rendezvous_file_publish(rendezvous_path, test_id(), 128, world);
        rendezvous_file_await_acks(rendezvous_path, world, 10.0);
        rendezvous_file_cleanup(rendezvous_path, world);
    }
    int all = 1;
    for (int r = 1; r < world; r++) {
        int status = 0;
        waitpid(kids[r], &status, 0);
        all &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    return all;
}

static void test_rendezvous(void) {
    snprintf(rendezvous_path, sizeof(rendezvous_path), "%s/nccl_id", test_dir);
    check(rendezvous_round(4, 0, 0), "file rendezvous: ranks 1-3 get rank 0's id");
    char ack[700];
    rendezvous_ack_path(rendezvous_path, 2, ack, sizeof(ack));
    check(access(rendezvous_path, F_OK) != 0 && access(ack, F_OK) != 0,
          "file rendezvous: the id and acknowledgements are removed after");
    FILE* f = fopen_check(rendezvous_path, "wb");
    fclose(f);
    expect_failure(publish_child, rendezvous_path, "a rendezvous file left by a crashed run");
    unlink(rendezvous_path);
    expect_failure(await_acks_child, rendezvous_path, "rank 0 waits for ranks that never start");
    unlink(rendezvous_path);
    expect_failure(fetch_child, rendezvous_path, "rank 1 waits for a rank 0 that never starts");
    int port = 20000 + (int)(getpid() % 20000);
    check(rendezvous_round(4, 1, port), "TCP rendezvous: ranks 1-3 get rank 0's id (port %d)", port);
    static int lonely_port;
    lonely_port = port + 1;
    expect_failure(serve_child, &lonely_port, "rank 0 waits on TCP for a rank that never starts");
    static int busy_port;
    busy_port = port + 2;
    int holder = listen_any(busy_port, 1);
    expect_failure(serve_child, &busy_port, "rank 0's port is taken");
    close(holder);
    char host[64];
    int p = 0;
    check(rendezvous_is_tcp("tcp://node001:29500", host, sizeof(host), &p) && strcmp(host, "node001") == 0 &&
              p == 29500 && !rendezvous_is_tcp("/shared/run/nccl_id", host, sizeof(host), &p),
          "rendezvous: tcp://host:port and file paths told apart");
    expect_failure(bad_tcp_child, "tcp://node001", "-F tcp://node001 (no port)");
    expect_failure(bad_tcp_child, "tcp://node001:70000", "-F tcp://node001:70000");
}

// ----------------------------------------------------------------------------
// evaluation modes: per-token loss, KV-cache generation, sampling, needle in a haystack, maps

// a tiny model of the family `preset` with a small vocabulary and overrides (key, value pairs),
// its weights scaled up from the paper's init so that attention and gates are far from uniform
static void eval_test_model(FoxModel* m, const char* preset, const char* const* overrides, int vocab, float scale) {
    FoxConfig c;
    if (!config_from_preset(&c, preset)) { fail("test: bad preset %s", preset); }
    char v[32];
    snprintf(v, sizeof(v), "%d", vocab);
    if (config_set(&c, "vocab_size", v) != 1) { fail("test: bad vocab"); }
    for (int i = 0; overrides != NULL && overrides[i] != NULL; i += 2) {
        if (config_set(&c, overrides[i], overrides[i + 1]) != 1) { fail("test: bad override %s", overrides[i]); }
    }
    c.mlp_hidden = derived_mlp_hidden(c.n_embd, c.block);
    fox_build(m, &c);
    fox_init(m, 42);
    for (size_t i = 0; i < m->num_parameters; i++) { m->params_memory[i] *= scale; }
}

// stdout to /dev/null (on = 1) and back (on = 0), for functions that report as they go
static void quiet_stdout(int on) {
    static int saved = -1;
    fflush(stdout);
    if (on) {
        int devnull = open("/dev/null", O_WRONLY);
        saved = dup(1);
        if (devnull >= 0) { dup2(devnull, 1); close(devnull); }
    } else if (saved >= 0) {
        dup2(saved, 1);
        close(saved);
        saved = -1;
    }
}

// next line of f without its newline into line; 0 at the end
static int read_line(FILE* f, char* line, size_t n) {
    if (fgets(line, (int)n, f) == NULL) { return 0; }
    line[strcspn(line, "\n")] = '\0';
    return 1;
}

// <prefix>.loss.csv and .ppl.csv of run_eval against L(i) (L[i - 1]) from fox_forward's per-token
// losses. Both files print with %.9g: a printed value v of x has |v - x| <= 5e-9 |x| (half a unit
// of the 9th significant digit), and L(i) of run_eval and of the test are fp64 means of the same
// fp32 losses in the same order (the check above holds them within 1e-9, about 1e-10 relative);
// so 1e-8 relative is twice the printing's bound. P(l) against the printed L(i): each carries
// 5e-9 relative, so their mean is off by at most 5e-9 max L, and log P(l) as printed by 5e-9:
// 1e-8 (1 + max L) in the log, again twice the bound.
static void eval_csv_check(const char* prefix, const double* L, int T, size_t seqs) {
    char path[700], line[256];
    snprintf(path, sizeof(path), "%s.loss.csv", prefix);
    FILE* f = fopen(path, "r");
    double csv[64], err = 0.0, shifted = INFINITY, max_L = 0.0;
    int rows = 0, in_order = 1, header = 0;
    if (f != NULL) {
        header = read_line(f, line, sizeof(line)) && strcmp(line, "position,loss") == 0;
        while (read_line(f, line, sizeof(line))) {
            int pos;
            double v;
            if (rows >= T || sscanf(line, "%d,%lf", &pos, &v) != 2 || pos != rows + 1) { in_order = 0; break; }
            csv[rows++] = v;
        }
        fclose(f);
    }
    for (int i = 0; i < rows && in_order; i++) {
        err = fmax(err, fabs(csv[i] - L[i]) / fabs(L[i]));
        max_L = fmax(max_L, L[i]);
        // negative control: the value at position i against L(i + 1), as an off-by-one column would
        if (i + 1 < T) { shifted = fmin(shifted, fabs(csv[i] - L[i + 1]) / fabs(L[i + 1])); }
    }
    check(f != NULL && header && in_order && rows == T && err <= 1e-8,
          "eval -O: %s has the header position,loss and positions 1..%d in order (%d rows); each loss equals "
          "L(i) within %.1e <= 1e-8 relative (%%.9g)", path, T, rows, err);
    check(shifted > 1e-3, "eval -O: negative control, the loss at position i differs from L(i+1) (min %.2e "
          "relative > 1e-3): an off-by-one position would fail", shifted);
    snprintf(path, sizeof(path), "%s.ppl.csv", prefix);
    f = fopen(path, "r");
    int want_l[] = {1, 2, 4, 8, 16, 32, 64}, n_rows = 0, ok = f != NULL && rows == T;
    double err_p = 0.0, err_m = 0.0, err_files = 0.0, off_by_one = INFINITY;
    if (f != NULL) {
        ok &= read_line(f, line, sizeof(line)) && strcmp(line, "context,perplexity,mean_loss,sequences") == 0;
        while (ok && read_line(f, line, sizeof(line))) {
            int l;
            double p, mean;
            size_t n;
            ok &= sscanf(line, "%d,%lf,%lf,%zu", &l, &p, &mean, &n) == 4 && n_rows < 7 && n == seqs;
            int want = n_rows < 7 && want_l[n_rows] < T ? want_l[n_rows] : T;
            ok &= l == want && l <= T;
            if (!ok) { break; }
            n_rows++;
            double s = 0.0, s_csv = 0.0, s_next = 0.0;
            for (int i = 0; i < l; i++) { s += L[i]; s_csv += csv[i]; s_next += i + 1 < T ? L[i + 1] : 0.0; }
            err_p = fmax(err_p, fabs(p - exp(s / l)) / exp(s / l));
            err_m = fmax(err_m, fabs(mean - s / l) / (s / l));
            err_files = fmax(err_files, fabs(log(p) - s_csv / l));
            if (l < T) { off_by_one = fmin(off_by_one, fabs(log(p) - s_next / l)); }
        }
        fclose(f);
    }
    double tol_files = 1e-8 * (1.0 + max_L);
    check(ok && n_rows == 5 && err_p <= 1e-8 && err_m <= 1e-8 && err_files <= tol_files,
          "eval -O: %s has contexts 1, 2, 4, 8, 16 of %zu sequences; P(l) = exp(mean of L(1..l)) within %.1e and "
          "its mean_loss within %.1e (<= 1e-8 relative); log P(l) against the loss.csv values within %.1e <= %.1e",
          path, seqs, err_p, err_m, err_files, tol_files);
    check(off_by_one > 1e-3, "eval -O: negative control, log P(l) differs from the mean of L(2..l+1) by >= %.2e "
          "(> 1e-3)", off_by_one);
}

// L(i) of per_token_loss against the losses of fox_forward on the same batches, and P(l)
static void test_eval_per_token(void) {
    enum { B = 2, T = 16, BATCHES = 3, V = 1000 };
    static char pattern[512];
    snprintf(pattern, sizeof(pattern), "%s/ev_val_*.bin", test_dir);
    char path[512];
    snprintf(path, sizeof(path), "%s/ev_val_000.bin", test_dir);
    enum { NTOK = B * BATCHES * T + 1 };
    uint16_t toks[NTOK];
    uint64_t rng = 7;
    for (int i = 0; i < NTOK; i++) { toks[i] = (uint16_t)(rng_next(&rng) % V); }
    write_shard(path, toks, NTOK, SHARD_MAGIC, NTOK);
    FoxModel m;
    eval_test_model(&m, "fox-pro-tiny", NULL, V, 3.0f);
    CpuBackend cb;
    ForwardBackend be = cpu_backend_init(&cb, &m, B, T);
    DataLoader val;
    dataloader_init(&val, pattern, B, T, 0, 1, 0, 0, 1, V);
    double sum[T] = {0};
    float losses[B * T];
    size_t seqs = per_token_loss(&be, &val, 0, sum, losses, 0);
    double L[T];
    for (int t = 0; t < T; t++) { L[t] = sum[t] / (double)seqs; }
    // directly: every batch through fox_forward, its losses kept, averaged per position
    static float all[BATCHES][B * T];
    double mean_of_means = 0.0;
    dataloader_set_position(&val, 0, 0, 0);
    for (int i = 0; i < BATCHES; i++) {
        dataloader_next_batch(&val);
        fox_forward(&m, val.inputs, val.targets, B, T);
        memcpy(all[i], m.losses, sizeof(all[i]));
        mean_of_means += m.mean_loss / (double)BATCHES;
    }
    double err = 0.0, other = INFINITY, Ld[T];
    for (int t = 0; t < T; t++) {
        double direct = 0.0;
        for (int i = 0; i < BATCHES; i++) {
            for (int b = 0; b < B; b++) { direct += all[i][b * T + t]; }
        }
        direct /= (double)(BATCHES * B);
        Ld[t] = direct;
        err = fmax(err, fabs(direct - L[t]));
        if (t + 1 < T) { // negative control: the neighbouring position
            double next = 0.0;
            for (int i = 0; i < BATCHES; i++) { for (int b = 0; b < B; b++) { next += all[i][b * T + t + 1]; } }
            other = fmin(other, fabs(next / (BATCHES * B) - L[t]));
        }
    }
    check(seqs == (size_t)(B * BATCHES) && err <= 1e-9,
          "eval: L(i) of %zu sequences equals fox_forward's per-token losses "
          "(max err %.1e <= 1e-9, fp64 sums of the same fp32 losses)",
          seqs, err);
    check(other > 1e-3, "eval: negative control, L(i) differs from L(i+1) (min %.2e > 1e-3)", other);
    // P(l) = exp(mean_{i<=l} L(i)): P(T) from the batches' mean losses, P(1) = exp(L(1))
    double pT = perplexity_upto(L, T), p1 = perplexity_upto(L, 1), p4 = perplexity_upto(L, 4);
    double l4 = (L[0] + L[1] + L[2] + L[3]) / 4;
    check(fabs(log(pT) - mean_of_means) <= 1e-6 && fabs(log(p1) - L[0]) <= 1e-12 && fabs(log(p4) - l4) <= 1e-12,
          "eval: P(l) consistent: log P(%d) = mean loss %.6f (err %.1e <= 1e-6), log P(1) = L(1), "
          "log P(4) = mean L(1..4)",
          T, mean_of_means, fabs(log(pT) - mean_of_means));
    // -M eval -O: the same batches through run_eval, its CSV files read back
    char prefix[600], steps[16];
    snprintf(prefix, sizeof(prefix), "%s/ev_out", test_dir);
    snprintf(steps, sizeof(steps), "%d", BATCHES);
    const char* argv[] = {"train_fox", "-M", "eval", "-j", pattern, "-b", "2", "-t", "16", "-m", steps, "-O", prefix,
                          NULL};
    Args a;
    parse_args(&a, 13, (char**)argv);
    quiet_stdout(1);
    run_eval(&a, &be);
    quiet_stdout(0);
    eval_csv_check(prefix, Ld, T, (size_t)(B * BATCHES));
    dataloader_free(&val);
    fox_free(&m);
}

// Generation with the KV cache against recomputing the full forward at every step: same greedy
// tokens and, without RoPE, bit-identical logits: fox_decode_step computes each row with the
// forward's own functions (rmsnorm_forward, add_forward, swiglu_forward ...) or with one-row
// copies of them whose sums run in the same order (matvec_forward is matmul_forward's loop for
// one row; kv_shift_step, decode_attention_head and the running c of the gate repeat the
// forward's expressions term by term), so with the Makefile's flags the same fp32 operations
// round the same way. With RoPE the logits stay within 1e-5 of their scale but are not exact:
// rope_apply adds the rotation into a zeroed buffer (out += x1 cs - x2 sn, the form its
// backward shares) where rope_row assigns it, and under -fassociative-math with FMA contraction
// the compiler fuses the two expressions differently, which moves about one rotated q or k
// element in seven by 1 ulp (with -ffp-contract=off both are exact).
static double kv_cache_run(const char* preset, const char* const* overrides, int steps, int* tokens_same, int corrupt,
                           double* scale) {
    enum { V = 1000, PROMPT = 5 };
    FoxModel m;
    eval_test_model(&m, preset, overrides, V, 4.0f);
    int total = PROMPT + steps;
    CpuBackend cb;
    ForwardBackend be = cpu_backend_init(&cb, &m, 1, total);
    int* tokens = (int*)malloc_check((size_t)total * sizeof(int), "test");
    float row[V];
    uint64_t rng = 3;
    for (int i = 0; i < PROMPT; i++) { tokens[i] = (int)(rng_next(&rng) % V); }
    be.reset(be.ctx);
    double worst = 0.0;
    *tokens_same = 1;
    *scale = 0.0;
    for (int t = PROMPT; t < total; t++) {
        be.next_logits(be.ctx, tokens, t, row);
        if (corrupt && t == PROMPT) {
            memset(cb.dec.c_last, 0, (size_t)m.config.n_layer * m.config.n_head * sizeof(float));
        }
        fox_forward(&m, tokens, NULL, 1, t);
        const float* full = m.logits + (size_t)(t - 1) * m.config.padded_vocab_size;
        double mx = 1.0, diff = 0.0;
        for (int j = 0; j < V; j++) { mx = fmax(mx, fabs(full[j])); diff = fmax(diff, fabs(full[j] - row[j])); }
        worst = fmax(worst, diff / mx);
        *scale = fmax(*scale, mx);
        tokens[t] = argmax_token(row, V);
        if (tokens[t] != argmax_token(full, V)) { *tokens_same = 0; }
    }
    free(tokens);
    fox_decoder_free(&cb.dec);
    fox_free(&m);
    return worst;
}

static void test_kv_cache(void) {
    static const char* none[] = {NULL};
    static const char* no_shift[] = {"k_shift", "0", "v_shift", "0", NULL};
    static const char* window[] = {"window", "8", NULL};
    static const char* bias_only[] = {"gate", "bias_only", NULL};
    static const char* fixed[] = {"gate", "fixed", NULL};
    static const char* gate_none[] = {"gate", "none", NULL};
    static const char* shared[] = {"qk_norm_shared", "1", "window", "5", NULL};
    struct { const char* preset; const char* const* ov; const char* what; } cases[] = {
        {"fox-pro-tiny", none, "fox-pro"}, {"transformer-llama-tiny", none, "transformer-llama (RoPE)"},
        {"transformer-pro-tiny", none, "transformer-pro (RoPE, shifts, QK-norm)"},
        {"fox-pro-tiny", no_shift, "fox-pro, shifts off"}, {"fox-pro-tiny", window, "fox-pro, window 8"},
        {"fox-llama-tiny", none, "fox-llama"}, {"fox-pro-tiny", bias_only, "fox-pro, gate bias_only"},
        {"fox-pro-tiny", fixed, "fox-pro, gate fixed"}, {"fox-pro-tiny", gate_none, "fox-pro, gate none"},
        {"fox-pro-tiny", shared, "fox-pro, shared QK-norm, window 5"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int same;
        double scale;
        double err = kv_cache_run(cases[i].preset, cases[i].ov, 24, &same, 0, &scale);
        FoxConfig c;
        config_from_preset(&c, cases[i].preset);
        if (c.rope) {
            check(same && err <= 1e-5,
                  "kv cache: %s, 24 greedy tokens: same tokens as the full forward, logits max err %.1e <= 1e-5 "
                  "of max(1, max|logit|) = %.2f",
                  cases[i].what, err, scale);
        } else {
            check(same && err == 0.0,
                  "kv cache: %s, 24 greedy tokens: same tokens as the full forward, logits bit-identical (max err "
                  "%.1e of max(1, max|logit|) = %.2f)",
                  cases[i].what, err, scale);
        }
    }
    int same;
    double scale;
    double err = kv_cache_run("fox-pro-tiny", none, 6, &same, 1, &scale);
    check(err > 1e-3, "kv cache: negative control, a cache whose running c restarts misses (err %.1e > 1e-3)", err);
}

// The twin's model with -A 1 (fox_prune in fox_forward and fox_backward): fox-pro-tiny with
// strongly decaying gates (bias -6) at T = 384 (3 tiles of 128) against -A 0: loss and every
// gradient within 1e-5 of their scale (the skipped keys carry far less than eps = e^-10 here; fp32
// rounding of the shorter sums is what remains); and with ln eps = -1e4 nothing is skipped and
// the pruned path is bit-identical to the dense one.
static void test_model_pruning(void) {
    enum { B = 1, T = 384, V = 1000 };
    FoxModel m;
    eval_test_model(&m, "fox-pro-tiny", NULL, V, 1.0f);
    for (size_t i = 0; i < (size_t)m.config.n_layer * m.config.n_head; i++) { m.params.bf[i] = -6.0f; }
    int inputs[B * T], targets[B * T];
    uint64_t rng = 5;
    for (int i = 0; i < B * T; i++) { inputs[i] = (int)(rng_next(&rng) % V); targets[i] = (int)(rng_next(&rng) % V); }
    float loss[3];
    float* grads[3];
    float ln_eps[3] = {0.0f, -10.0f, -1e4f}; // 0: dense (-A 0)
    for (int r = 0; r < 3; r++) {
        m.prune = r > 0; m.prune_ln_eps = ln_eps[r];
        fox_forward(&m, inputs, targets, B, T);
        fox_zero_grad(&m);
        fox_backward(&m, 1.0f);
        loss[r] = m.mean_loss;
        grads[r] = (float*)malloc_check(m.num_parameters * sizeof(float), "grads");
        memcpy(grads[r], m.grads_memory, m.num_parameters * sizeof(float));
    }
    int skipped = 0; // tiles the last layer's -10 tables skip: recompute them
    m.prune = 1; m.prune_ln_eps = -10.0f;
    fox_forward(&m, inputs, targets, B, T);
    for (int t = 0; t < 3; t++) { skipped += m.prune_tables[t] + m.prune_tables[3 + t]; }
    double gmax = 0.0, gerr = 0.0;
    for (size_t i = 0; i < m.num_parameters; i++) {
        gmax = fmax(gmax, fabs(grads[0][i]));
        gerr = fmax(gerr, fabs((double)grads[1][i] - grads[0][i]));
    }
    int same = loss[2] == loss[0] && memcmp(grads[2], grads[0], m.num_parameters * sizeof(float)) == 0;
    check(skipped > 0 && fabs(loss[1] - loss[0]) <= 1e-5 * fabs(loss[0]) && gerr <= 1e-5 * gmax && same,
          "twin with -A 1 (gate bias -6, T=%d): %d tiles skipped, loss %.7f vs %.7f dense, "
          "gradients max err %.1e <= 1e-5 of %.2e; ln eps -1e4 skips nothing and is bit-identical to dense (%s)",
          T, skipped, loss[1], loss[0], gerr, gmax, same ? "yes" : "NO");
    for (int r = 0; r < 3; r++) { free(grads[r]); }
    fox_free(&m);
}

// Eviction in the twin's KV cache (-A 1): fox-pro-tiny with strongly decaying gates (bias -6,
// log f ~ -6 a token) and QK-norm weights 1 (U = sqrt(hd)), a 300-token prompt and 40 greedy
// tokens, against the same decoder without eviction. Returns the worst logit difference
// relative to max(1, max|logit|); same: greedy tokens equal; live, full: cache entries at the end;
// bytes: the buffers of the cache with and without eviction at the end, and the compaction's bound
// for the first: at most 4x the live entries (a slide halves a buffer more than 4x too large) plus
// the 16 slots each head starts with.
static double kv_evict_run(float ln_eps, int* same, size_t* live, size_t* full, size_t bytes[3]) {
    enum { V = 1000, PROMPT = 300, STEPS = 40 };
    FoxModel m;
    eval_test_model(&m, "fox-pro-tiny", NULL, V, 4.0f);
    const FoxConfig* cf = &m.config;
    size_t qk_per = m.spec[P_Q_NORM].rows;
    for (size_t i = 0; i < (size_t)cf->n_layer * qk_per; i++) { m.params.q_norm[i] = 1.0f; m.params.k_norm[i] = 1.0f; }
    for (size_t i = 0; i < (size_t)cf->n_layer * cf->n_head; i++) { m.params.bf[i] = -6.0f; }
    FoxDecoder dense, evict;
    fox_decoder_init(&dense, &m, PROMPT + STEPS);
    m.prune = 1; m.prune_ln_eps = ln_eps;
    fox_decoder_init(&evict, &m, PROMPT + STEPS);
    uint64_t rng = 11;
    int tok_d = 0, tok_e = 0;
    double worst = 0.0;
    *same = evict.evict_delta != NULL;
    for (int t = 0; t < PROMPT + STEPS; t++) {
        int in_d = t < PROMPT ? (int)(rng_next(&rng) % V) : tok_d, in_e = t < PROMPT ? in_d : tok_e;
        fox_decode_step(&dense, in_d);
        fox_decode_step(&evict, in_e);
        double mx = 1.0, diff = 0.0;
        for (int j = 0; j < V; j++) {
            mx = fmax(mx, fabs(dense.row.logits[j]));
            diff = fmax(diff, fabs(dense.row.logits[j] - evict.row.logits[j]));
        }
        worst = fmax(worst, diff / mx);
        tok_d = argmax_token(dense.row.logits, V);
        tok_e = argmax_token(evict.row.logits, V);
        if (t >= PROMPT - 1 && tok_d != tok_e) { *same = 0; }
    }
    *live = fox_decoder_live(&evict);
    *full = fox_decoder_live(&dense);
    bytes[0] = fox_decoder_bytes(&evict);
    bytes[1] = fox_decoder_bytes(&dense);
    size_t entry = (2 * (size_t)(cf->n_embd / cf->n_head) + 1) * sizeof(float);
    bytes[2] = (4 * *live + 16 * (size_t)cf->n_layer * cf->n_head) * entry;
    fox_decoder_free(&dense); fox_decoder_free(&evict);
    fox_free(&m);
    return worst;
}

static void test_kv_eviction(void) {
    int same;
    size_t live, full, bytes[3];
    double err = kv_evict_run(-10.0f, &same, &live, &full, bytes);
    // the evicted keys carry less than eps = e^-10 of any row (far less here); the logits may move
    // by that share of the values' range through the layers: 1e-4 of the logit scale
    check(same && err <= 1e-4 && live * 4 < full,
          "kv cache eviction (-A 1, ln eps -10): 40 greedy tokens after a 300-token "
          "prompt equal to no eviction, logits max err %.1e <= 1e-4 of the scale, cache %zu of %zu entries (< 1/4)",
          err, live, full);
    check(bytes[0] * 4 < bytes[1] && bytes[0] <= bytes[2],
          "kv cache eviction: the buffers shrink with the live entries, "
          "%zu bytes (bound %zu) against %zu without eviction",
          bytes[0], bytes[2], bytes[1]);
    double bad = kv_evict_run(40.0f, &same, &live, &full, bytes);
    check(bad > 1e-3, "kv cache eviction: negative control, ln eps = +40 evicts keys that matter (err %.1e > 1e-3)",
          bad);
}

static void test_sampling(void) {
    float logits[5] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
    uint64_t rng = 11;
    int greedy = sample_token(logits, 5, 0.0, 0, &rng);
    int top1 = 1, in_top2 = 1;
    for (int i = 0; i < 200; i++) {
        if (sample_token(logits, 5, 1.0, 1, &rng) != 1) { top1 = 0; }
        int s = sample_token(logits, 5, 5.0, 2, &rng);
        if (s != 1 && s != 3) { in_top2 = 0; }
    }
    // frequencies of 100000 draws at temperature 2 against softmax(logits / 2): 3 sigma < 0.005
    enum { DRAWS = 100000 };
    int count[5] = {0};
    for (int i = 0; i < DRAWS; i++) { count[sample_token(logits, 5, 2.0, 0, &rng)]++; }
    double z = 0.0, worst = 0.0;
    for (int j = 0; j < 5; j++) { z += exp(logits[j] / 2.0); }
    for (int j = 0; j < 5; j++) { worst = fmax(worst, fabs(count[j] / (double)DRAWS - exp(logits[j] / 2.0) / z)); }
    check(greedy == 1 && top1 && in_top2 && worst < 0.005,
          "sampling: greedy takes the lowest id of tied maxima, top-k 1 = greedy, "
          "top-k 2 stays in the top 2, frequencies match softmax(logits / T) (max err %.4f < 0.005)",
          worst);
}

#ifndef NO_GPT2_ENCODER
// the NIAH pieces' token ids written in train_fox.c are the encoder's tokens of the texts
static void test_niah_token_ids(void) {
    if (access(GPT2_DEFAULT_RANKS, R_OK) != 0) {
        check(0, "niah: %s is missing (make test runs make data first)", GPT2_DEFAULT_RANKS);
        return;
    }
    GPT2BPE bpe;
    GPT2Worker w;
    gpt2_bpe_load(&bpe, GPT2_DEFAULT_RANKS);
    gpt2_worker_init(&w, &bpe);
    const char* texts[] = {NIAH_NEEDLE, NIAH_NEEDLE_EASY, NIAH_QUESTION, NIAH_ANSWER};
    const int* ids[] = {NIAH_NEEDLE_IDS, NIAH_NEEDLE_EASY_IDS, NIAH_QUESTION_IDS, NIAH_ANSWER_IDS};
    int counts[] = {COUNT_OF(NIAH_NEEDLE_IDS), COUNT_OF(NIAH_NEEDLE_EASY_IDS), COUNT_OF(NIAH_QUESTION_IDS),
                    COUNT_OF(NIAH_ANSWER_IDS)};
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        int out[NIAH_MAX_PIECE];
        int n = encode_append(&w, texts[i], out, 0, NIAH_MAX_PIECE);
        ok &= n == counts[i] && memcmp(out, ids[i], (size_t)n * sizeof(int)) == 0;
    }
    check(ok,
          "niah: the written token ids of needle (%d), easy needle (%d), question (%d), answer (%d) are the encoder's",
          counts[0], counts[1], counts[2], counts[3]);
    gpt2_worker_free(&w);
    gpt2_bpe_free(&bpe);
}
#else
static void test_niah_token_ids(void) { printf("skipped: niah token ids against the encoder (built without PCRE2)\n"); }
#endif

static void niah_short_child(const void* arg) {
    const NiahTexts* tx = (const NiahTexts*)arg;
    int out[64], hay[64] = {0};
    niah_build_prompt(tx, hay, 40, 0.5, GPT2_EOT, out);
}

static void test_niah(void) {
    test_niah_token_ids();
    static NiahTexts tx, easy;
    niah_texts_init(&tx, 0);
    niah_texts_init(&easy, 1);
    check(easy.needle_n > tx.needle_n && easy.question_n == tx.question_n && tx.answer_n == 14,
          "niah: needle %d tokens (easy %d), question %d, answer %d", tx.needle_n, easy.needle_n, tx.question_n,
          tx.answer_n);
    // prompt layout: a haystack of recognisable tokens
    enum { CTX = 200 };
    int hay[CTX], a[CTX + 1], b[CTX + 1];
    for (int i = 0; i < CTX; i++) { hay[i] = 1000 + i; }
    a[CTX] = b[CTX] = -7; // sentinel: nothing written past the context
    int pos = niah_build_prompt(&tx, hay, CTX, 0.3, GPT2_EOT, a);
    int pos2 = niah_build_prompt(&tx, hay, CTX, 0.3, GPT2_EOT, b);
    int H = CTX - 1 - tx.needle_n - tx.question_n, split = (int)floor(0.3 * H + 0.5);
    int ok = pos == pos2 && memcmp(a, b, sizeof(a)) == 0 && a[CTX] == -7 && a[0] == GPT2_EOT && pos == 1 + split;
    for (int i = 0; i < split; i++) { ok &= a[1 + i] == hay[i]; }
    for (int i = 0; i < tx.needle_n; i++) { ok &= a[pos + i] == tx.needle[i]; }
    for (int i = split; i < H; i++) { ok &= a[pos + tx.needle_n + i - split] == hay[i]; }
    for (int i = 0; i < tx.question_n; i++) { ok &= a[CTX - tx.question_n + i] == tx.question[i]; }
    int p0 = niah_build_prompt(&tx, hay, CTX, 0.0, GPT2_EOT, b);
    int p1 = niah_build_prompt(&tx, hay, CTX, 1.0, GPT2_EOT, b);
    check(ok && p0 == 1 && p1 == CTX - tx.question_n - tx.needle_n,
          "niah: prompt deterministic, exactly %d tokens, EOT + haystack[:%d] + needle at %d + haystack[%d:] + "
          "question; depth 0 at 1, depth 1 right before the question", CTX, split, pos, split);
    expect_failure(niah_short_child, &tx, "niah context shorter than needle and question");
    // scoring against fox_forward and a log-softmax in fp64; greedy against KV-cache decoding
    FoxModel m;
    eval_test_model(&m, "fox-pro-tiny", NULL, 50257, 3.0f);
    CpuBackend cb;
    ForwardBackend be = cpu_backend_init(&cb, &m, 1, CTX + NIAH_MAX_PIECE);
    static int seq[CTX + NIAH_MAX_PIECE];
    static float losses[CTX + NIAH_MAX_PIECE], row[50257];
    // the answer is made the model's own greedy continuation (positive control), then spoiled
    static NiahTexts own;
    own = tx;
    own.answer_n = 5;
    be.reset(be.ctx);
    memcpy(seq, a, sizeof(int) * CTX);
    for (int k = 0; k < own.answer_n; k++) {
        be.next_logits(be.ctx, seq, CTX + k, row);
        seq[CTX + k] = own.answer[k] = argmax_token(row, 50257);
    }
    NiahScore s_own = niah_score(&be, &own, a, CTX, seq, losses, row);
    own.answer[3] = (own.answer[3] + 1) % 50257;
    NiahScore s_spoiled = niah_score(&be, &own, a, CTX, seq, losses, row);
    NiahScore s = niah_score(&be, &tx, a, CTX, seq, losses, row);
    fox_forward(&m, seq, NULL, 1, CTX + tx.answer_n - 1);
    double direct = 0.0;
    int greedy = 0, miss = 0;
    for (int k = 0; k < tx.answer_n; k++) {
        const float* r = m.logits + (size_t)(CTX - 1 + k) * m.config.padded_vocab_size;
        double mx = -INFINITY, z = 0.0;
        for (int j = 0; j < 50257; j++) { mx = fmax(mx, r[j]); }
        for (int j = 0; j < 50257; j++) { z += exp(r[j] - mx); }
        direct += r[tx.answer[k]] - mx - log(z);
        if (!miss && argmax_token(r, 50257) == tx.answer[k]) { greedy++; } else { miss = 1; }
    }
    double err = fabs(s.logprob - direct);
    check(err <= 1e-4 * fabs(direct) && s.greedy_tokens == greedy,
          "niah: score = fp64 log-softmax of fox_forward's logits: log p(answer) %.5f vs %.5f (err %.1e <= 1e-4 rel: "
          "fp32 losses), greedy tokens %d = %d", s.logprob, direct, err, s.greedy_tokens, greedy);
    check(s_own.greedy_tokens == 5 && s_spoiled.greedy_tokens == 3,
          "niah: greedy scoring = KV-cache greedy decoding: its own continuation scores 5/5, "
          "with token 4 changed 3/5 (%d, %d)", s_own.greedy_tokens, s_spoiled.greedy_tokens);
    fox_decoder_free(&cb.dec);
    fox_free(&m);
}

// A rows sum to 1, A @ V = the attention output of fox_forward, F = exp(c_i - c_j) below the
// diagonal, the window respected
// docs: documents kept apart at the token V - 1, placed at 0, 6, 7 and 15 (an empty document at 6)
static void maps_check(const char* preset, const char* const* ov, int docs, const char* what) {
    enum { T = 20, V = 1000 };
    FoxModel m;
    eval_test_model(&m, preset, ov, V, 4.0f);
    int tokens[T], doc[T];
    uint64_t rng = 5;
    for (int i = 0; i < T; i++) { tokens[i] = (int)(rng_next(&rng) % (V - 1)); }
    if (docs) {
        m.doc_eot = V - 1;
        tokens[0] = tokens[6] = tokens[7] = tokens[15] = V - 1;
    }
    document_starts(doc, tokens, 1, T, m.doc_eot);
    fox_forward(&m, tokens, NULL, 1, T);
    const FoxConfig* cf = &m.config;
    int H = cf->n_head, hd = cf->n_embd / H, C = cf->n_embd;
    static float F[T * T], A[T * T];
    double row_err = 0.0, av_err = 0.0, f_err = 0.0, cross = 0.0;
    int mask_ok = 1;
    for (int l = 0; l < cf->n_layer; l++) {
        const float* v = LAYER(m.acts.v, l, (size_t)T * C);
        const float* o = LAYER(m.acts.o, l, (size_t)T * C);
        for (int h = 0; h < H; h++) {
            attention_maps(&m, l, h, F, A);
            const float* c = cf->gate != GATE_NONE ? LAYER(m.acts.c, l, (size_t)H * T) + (size_t)h * T : NULL;
            double omax = 0.0;
            for (int i = 0; i < T * C; i++) { omax = fmax(omax, fabs(o[i])); }
            for (int i = 0; i < T; i++) {
                double rs = 0.0;
                for (int j = 0; j < T; j++) {
                    rs += A[i * T + j];
                    int inside = j <= i && j >= attention_first_key(i, cf->window) && j >= doc[i];
                    if (!inside && A[i * T + j] != 0.0f) { mask_ok = 0; }
                    double f = j <= i && j >= doc[i] ? (c != NULL ? exp((double)c[i] - c[j]) : 1.0) : 0.0;
                    f_err = fmax(f_err, fabs(F[i * T + j] - f) / fmax(f, 1e-30) * (f > 0)
                                        + (f == 0) * fabs(F[i * T + j]));
                }
                row_err = fmax(row_err, fabs(rs - 1.0));
                int other = (h + 1) % H; // negative control
                for (int d = 0; d < hd; d++) {
                    double av = 0.0, av_other = 0.0;
                    for (int j = 0; j <= i; j++) {
                        av += (double)A[i * T + j] * v[(size_t)j * C + h * hd + d];
                        av_other += (double)A[i * T + j] * v[(size_t)j * C + other * hd + d];
                    }
                    av_err = fmax(av_err, fabs(av - o[(size_t)i * C + h * hd + d]) / omax);
                    cross = fmax(cross, fabs(av_other - o[(size_t)i * C + other * hd + d]) / omax);
                }
            }
        }
    }
    check(row_err <= 1e-6 && av_err <= 1e-5 && f_err <= 1e-6 && mask_ok && cross > 1e-3,
          "maps: %s: rows of A sum to 1 (err %.1e <= 1e-6), "
          "A @ V = fox_forward's attention output (err %.1e <= 1e-5 of max|o|), "
          "F = exp(c_i - c_j) (rel err %.1e <= 1e-6), zero outside the causal window%s; "
          "negative control: the other head's A misses (err %.1e > 1e-3)", what, row_err, av_err, f_err,
          docs ? " and the query's document" : "", cross);
    fox_free(&m);
}

static void test_maps(void) {
    static const char* window[] = {"window", "6", NULL};
    maps_check("fox-pro-tiny", NULL, 0, "fox-pro");
    maps_check("fox-pro-tiny", window, 0, "fox-pro, window 6");
    maps_check("transformer-llama-tiny", NULL, 0, "transformer-llama (F = 1)");
    maps_check("fox-pro-tiny", window, 1, "fox-pro, window 6, documents apart (-f 1)");
    maps_check("transformer-llama-tiny", NULL, 1, "transformer-llama, documents apart (-f 1)");
}

static void eval_main_child(const void* arg) {
    const char* const* argv = (const char* const*)arg;
    int argc = 0;
    while (argv[argc] != NULL) { argc++; }
    Args a;
    parse_args(&a, argc, (char**)argv);
    cpu_eval_main(&a);
}

#ifndef NO_GPT2_ENCODER
// the merge ranks are looked up relative to the working directory: from elsewhere they are missing
static void missing_ranks_child(const void* arg) {
    if (chdir((const char*)arg) != 0) { return; }
    int tokens[16];
    encode_prompt("a prompt", GPT2_EOT, tokens, 16);
}
#endif

// -P @file of a token shard: its first cap - reserve tokens, as stored (no encoder); a shard that
// leaves no room, and a truncated one, fail with a HINT
static void prompt_no_room_child(const void* arg) {
    int tokens[8];
    prompt_tokens((const char*)arg, tokens, 8, 8);
}

static void prompt_child(const void* arg) {
    int tokens[20];
    prompt_tokens((const char*)arg, tokens, 20, 5);
}

static void test_prompt_from_shard(void) {
    enum { N = 50 };
    uint16_t shard[N];
    for (int i = 0; i < N; i++) { shard[i] = (uint16_t)(7 * i + 3); }
    char path[512], arg[520], bad[520];
    snprintf(path, sizeof(path), "%s/prompt_000000.bin", test_dir);
    write_shard(path, shard, N, SHARD_MAGIC, N);
    snprintf(arg, sizeof(arg), "@%s", path);
    int out[100], ok = 1;
    int n_short = prompt_tokens(arg, out, 20, 5);
    for (int i = 0; i < n_short; i++) { ok &= out[i] == shard[i]; }
    int n_all = prompt_tokens(arg, out, 100, 5);
    for (int i = 0; i < n_all; i++) { ok &= out[i] == shard[i]; }
    check(ok && n_short == 15 && n_all == N,
          "-P @shard: the first -t minus -g tokens as stored (%d of %d; all %d when they fit)", n_short, N, n_all);
    expect_failure(prompt_no_room_child, arg, "-P @shard with -g leaving no room in -t");
    snprintf(path, sizeof(path), "%s/prompt_truncated.bin", test_dir);
    write_shard(path, shard, N, SHARD_MAGIC, N + 10);
    snprintf(bad, sizeof(bad), "@%s", path);
    expect_failure(prompt_child, bad, "-P @shard that is truncated");
}

static void test_eval_bad_input(void) {
    static const char* bad_mode[] = {"train_fox", "-M", "evaluate", NULL};
    static const char* bad_temp[] = {"train_fox", "-T", "-1", NULL};
    static const char* no_prompt[] = {"train_fox", "-M", "generate", NULL};
    static const char* long_prompt[] = {"train_fox", "-M", "generate", "-t", "8", "-g", "4", "-P",
                                        "a prompt of more than four tokens", NULL};
    static const char* missing_file[] = {"train_fox", "-M", "generate", "-P", "@/nonexistent/prompt.txt", NULL};
    static const char* short_niah[] = {"train_fox", "-M", "niah", "-D", "32", NULL};
    static const char* bad_head[] = {"train_fox", "-M", "maps", "-O", "/tmp/x", "-D", "0:7", NULL};
    static const char* maps_no_out[] = {"train_fox", "-M", "maps", NULL};
    expect_failure(eval_main_child, bad_mode, "-M evaluate");
    expect_failure(eval_main_child, bad_temp, "-T -1");
    expect_failure(eval_main_child, no_prompt, "-M generate without -P");
    expect_failure(eval_main_child, long_prompt, "a prompt plus -g longer than -t");
    expect_failure(eval_main_child, missing_file, "-P @ a missing file");
    expect_failure(eval_main_child, short_niah, "-M niah -D 32 (shorter than needle and question)");
    expect_failure(eval_main_child, bad_head, "-M maps -D 0:7 with 2 heads");
    expect_failure(eval_main_child, maps_no_out, "-M maps without -O");
#ifndef NO_GPT2_ENCODER
    expect_failure(missing_ranks_child, test_dir, "a prompt without the merge ranks (make data)");
#endif
}

// ----------------------------------------------------------------------------
// documents kept apart (-f 1; the layers against the reference are in the fixtures *-documents): each document of a
// packed batch as if alone, the key-range invariant, one document bit-equal to -f 0, pruning, the KV cache, the flag

enum { DOC_B = 2, DOC_T = 40, DOC_V = 1000, DOC_EOT = DOC_V - 1 };

// (DOC_B, DOC_T) ids below DOC_EOT with EOTs at fixed positions: sequence 0 starts with a document, holds an empty one
// (EOT EOT at 9, 10), one of a single token (10-11) and ends on a lone EOT; sequence 1 starts inside a document
static void doc_test_batch(int* inputs, int* targets, uint64_t seed) {
    static const int eots[DOC_B][6] = {{0, 9, 10, 12, 25, 39}, {17, 30, 31, -1, -1, -1}};
    uint64_t rng = seed;
    for (int i = 0; i < DOC_B * DOC_T; i++) {
        inputs[i] = (int)(rng_next(&rng) % DOC_EOT);
        targets[i] = (int)(rng_next(&rng) % DOC_V);
    }
    for (int b = 0; b < DOC_B; b++) {
        for (int k = 0; k < 6 && eots[b][k] >= 0; k++) { inputs[b * DOC_T + eots[b][k]] = DOC_EOT; }
    }
}

// max |a - b| over n rows of V logits (row stride Vp), relative to max(1, max |b|)
static double logits_error(const float* a, const float* b, size_t n, int V, int Vp) {
    double mx = 1.0, diff = 0.0;
    for (size_t r = 0; r < n; r++) {
        for (int j = 0; j < V; j++) {
            mx = fmax(mx, fabs(b[r * Vp + j]));
            double d = fabs((double)a[r * Vp + j] - b[r * Vp + j]);
            diff = isnan(d) ? INFINITY : fmax(diff, d);
        }
    }
    return diff / mx;
}

// Each document of the batch against the same tokens run alone: one that starts the sequence as a sequence of its
// own, one that starts at t0 > 0 after one token of another document (so that its start is a document start too,
// whose gate c does not hold: at t = 0 of a sequence log f_0 counts). c restarts, the KV-shift starts from 0: the
// same fp32 operations in the same order without RoPE, so bit-identical; with RoPE (relative) the rotations differ by
// ulps: 1e-5 of the logit scale, as the KV cache test. Then the key-range invariant: the last
// non-EOT token of each document changed, no logit outside that document moves, to the bit, and neither does the
// gradient of any input row outside it (the loss's gradient reaches a row only from its own document: a reverse sum
// of the gate or a KV-shift that crossed a boundary would carry the other document's rounding). -A 0: with -A 1 the
// bound U of a sequence, hence its pruned tiles, would see every document's q and k.
static void test_documents_apart(void) {
    const char* presets[] = {"fox-pro-tiny", "transformer-llama-tiny", "fox-llama-tiny"};
    int inputs[DOC_B * DOC_T], targets[DOC_B * DOC_T], changed[DOC_B * DOC_T];
    doc_test_batch(inputs, targets, 9);
    for (int p = 0; p < 3; p++) {
        FoxModel m;
        eval_test_model(&m, presets[p], NULL, DOC_V, 3.0f);
        m.doc_eot = DOC_EOT;
        int Vp = m.config.padded_vocab_size, docs = 0;
        size_t rows = (size_t)DOC_B * DOC_T;
        size_t C = (size_t)m.config.n_embd;
        float* dres = (float*)malloc_check(rows * C * sizeof(float), "input gradients");
        fox_forward(&m, inputs, targets, DOC_B, DOC_T);
        fox_zero_grad(&m);
        fox_backward(&m, 1.0f);
        memcpy(dres, m.grad_acts.resid, rows * C * sizeof(float)); // layer 0's: the gradient of each input row
        fox_forward(&m, inputs, NULL, DOC_B, DOC_T);
        float* packed = (float*)malloc_check(rows * Vp * sizeof(float), "logits");
        memcpy(packed, m.logits, rows * Vp * sizeof(float));
        double err = 0.0, moved = 0.0, moved_grad = 0.0;
        for (int b = 0; b < DOC_B; b++) {
            for (int s = 0, e = 1; e <= DOC_T; e++) {
                if (e < DOC_T && inputs[b * DOC_T + e] != DOC_EOT) { continue; }
                int alone[DOC_T + 1], lead = s > 0; // document [s, e) alone, after a token of another when s > 0
                alone[0] = 1;
                memcpy(alone + lead, inputs + b * DOC_T + s, (size_t)(e - s) * sizeof(int));
                fox_forward(&m, alone, NULL, 1, e - s + lead);
                err = fmax(err, logits_error(m.logits + (size_t)lead * Vp, packed + (size_t)(b * DOC_T + s) * Vp,
                                             (size_t)(e - s), DOC_V, Vp));
                int t = e - 1;
                while (t >= s && inputs[b * DOC_T + t] == DOC_EOT) { t--; }
                if (t >= s) {
                    memcpy(changed, inputs, sizeof(changed));
                    changed[b * DOC_T + t] = (changed[b * DOC_T + t] + 1) % DOC_EOT;
                    fox_forward(&m, changed, targets, DOC_B, DOC_T);
                    for (size_t r = 0; r < rows; r++) {
                        if (r >= (size_t)(b * DOC_T + s) && r < (size_t)(b * DOC_T + e)) { continue; }
                        moved = fmax(moved, logits_error(m.logits + r * Vp, packed + r * Vp, 1, DOC_V, Vp));
                    }
                    fox_zero_grad(&m);
                    fox_backward(&m, 1.0f);
                    for (size_t r = 0; r < rows; r++) {
                        if (r >= (size_t)(b * DOC_T + s) && r < (size_t)(b * DOC_T + e)) { continue; }
                        for (size_t i = 0; i < C; i++) {
                            moved_grad = fmax(moved_grad, fabs(m.grad_acts.resid[r * C + i] - dres[r * C + i]));
                        }
                    }
                }
                docs++;
                s = e;
            }
        }
        int rope = m.config.rope;
        check(rope ? err <= 1e-5 : err == 0.0,
              "documents (-f 1): %s, each of the %d documents of a packed batch (one empty, one of a token, one "
              "begun before its sequence) gives the logits it gives alone %s (max err %.1e of the scale)", presets[p],
              docs, rope ? "within 1e-5 (RoPE is relative)" : "bit for bit", err);
        check(moved == 0.0 && moved_grad == 0.0, "documents (-f 1): %s, a changed token moves no logit (max %.1e) and "
              "no input row's gradient (max %.1e) outside its document", presets[p], moved, moved_grad);
        free(packed); free(dres);
        fox_free(&m);
    }
}

// A document start t0 > 0 is a forget gate of -inf (dev/fox.md, "Documents kept apart"): c_t0 = 0 and the gate logit
// of t0 gets no gradient at all, exactly 0 in every layer and head (a restart c_t0 = log f_t0 would give it the
// rounded sum of the document's dc), while every other position's after 0 is nonzero. The batch's 8 starts include
// an empty document and one of a single token; the full, bias-only and fixed gates.
static void test_documents_gate_gradient(void) {
    const char* gates[] = {"full", "bias_only", "fixed"};
    int inputs[DOC_B * DOC_T], targets[DOC_B * DOC_T];
    doc_test_batch(inputs, targets, 5);
    for (int gi = 0; gi < 3; gi++) {
        FoxModel m;
        const char* gate[] = {"gate", gates[gi], NULL};
        eval_test_model(&m, "fox-pro-tiny", gate, DOC_V, 2.0f);
        m.doc_eot = DOC_EOT;
        fox_forward(&m, inputs, targets, DOC_B, DOC_T);
        fox_zero_grad(&m);
        fox_backward(&m, 1.0f);
        int L = m.config.n_layer, H = m.config.n_head, starts = 0, c_zero = 1, others_nonzero = 1;
        double at_starts = 0.0;
        for (int l = 0; l < L; l++) {
            for (int b = 0; b < DOC_B; b++) {
                for (int t = 0; t < DOC_T; t++) {
                    int start = t > 0 && inputs[b * DOC_T + t] == DOC_EOT;
                    starts += start && l == 0;
                    for (int h = 0; h < H; h++) {
                        size_t n = ((size_t)l * DOC_B * DOC_T + (size_t)b * DOC_T + t) * H + h;
                        float g = m.grad_acts.gate_logit[n];
                        float c = m.acts.c[(((size_t)l * DOC_B + b) * H + h) * DOC_T + t];
                        if (start) { at_starts = fmax(at_starts, fabs(g)); c_zero &= c == 0.0f; }
                        else if (t > 0) { others_nonzero &= g != 0.0f; }
                    }
                }
            }
        }
        check(starts == 8 && at_starts == 0.0 && c_zero && others_nonzero,
              "documents (-f 1): gate %s, at the %d document starts t0 > 0 c_t0 = 0 (%s) and the gate logit's gradient "
              "is exactly 0 in every layer and head (max %.1e), nonzero at every other position (%s)", gates[gi],
              starts, c_zero ? "yes" : "NO", at_starts, others_nonzero ? "yes" : "NO");
        fox_free(&m);
    }
}

// the loss of one forward and backward of m with documents (doc_eot) and pruning set; its gradients into grads
static float doc_run(FoxModel* m, int doc_eot, int prune, const int* inputs, const int* targets, int B, int T,
                     float* grads) {
    m->doc_eot = doc_eot;
    m->prune = prune;
    m->prune_ln_eps = -1e4f; // the decay bound drops nothing
    fox_forward(m, inputs, targets, B, T);
    fox_zero_grad(m);
    fox_backward(m, 1.0f);
    memcpy(grads, m->grads_memory, m->num_parameters * sizeof(float));
    return m->mean_loss;
}

// One context per sequence (no EOT; an EOT at position 0 only): -f 1 gives the bits of -f 0, the loss and every
// gradient, with -A 1 too. With EOTs at 0 and 200 of T = 300 the model's tables skip key tile 0 for query tile 2
// (wholly before the second document) and the results stay those of -A 0, bit for bit.
static void test_documents_one_context(void) {
    enum { B = 2, T = 300 };
    const char* presets[] = {"fox-pro-tiny", "transformer-llama-tiny"};
    int inputs[B * T], targets[B * T];
    uint64_t rng = 21;
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int)(rng_next(&rng) % DOC_EOT);
        targets[i] = (int)(rng_next(&rng) % DOC_V);
    }
    for (int p = 0; p < 2; p++) {
        FoxModel m;
        eval_test_model(&m, presets[p], NULL, DOC_V, 2.0f);
        size_t bytes = m.num_parameters * sizeof(float);
        float* g0 = (float*)malloc_check(bytes, "grads");
        float* g1 = (float*)malloc_check(bytes, "grads");
        int same = 1;
        for (int eot0 = 0; eot0 < 2; eot0++) {
            for (int b = 0; b < B; b++) { inputs[b * T] = eot0 ? DOC_EOT : 1; }
            for (int prune = 0; prune < 2; prune++) {
                float l0 = doc_run(&m, -1, prune, inputs, targets, B, T, g0);
                float l1 = doc_run(&m, DOC_EOT, prune, inputs, targets, B, T, g1);
                same &= l0 == l1 && memcmp(g0, g1, bytes) == 0;
            }
        }
        for (int b = 0; b < B; b++) { inputs[b * T + 200] = DOC_EOT; }
        float l0 = doc_run(&m, DOC_EOT, 0, inputs, targets, B, T, g0);
        float l1 = doc_run(&m, DOC_EOT, 1, inputs, targets, B, T, g1);
        int tables_ok = m.prune_tables[2] == 1 && m.prune_tables[1] == 0; // sequence 0, head 0 of the last layer
        check(same && tables_ok && l0 == l1 && memcmp(g0, g1, bytes) == 0,
              "documents (-f 1): %s, one context per sequence (no EOT; an EOT at 0): the loss and every gradient of "
              "-f 0 bit for bit, -A 1 too; a second document at 200 of 300: the tables skip key tile 0 for query "
              "tile 2 (%s) and the results equal -A 0's bit for bit", presets[p], tables_ok ? "yes" : "NO");
        for (int b = 0; b < B; b++) { inputs[b * T + 200] = 2; }
        free(g0); free(g1);
        fox_free(&m);
    }
}

// Generation after an EOT: the KV cache restarts (c, the KV-shift) and frees what no later query sees. Its logits
// against the full forward on the same tokens (EOTs at 0, 9, 10, 12 and 30 of 48): bit for bit without RoPE, 1e-5 with
// it (kv_cache_run says why); after 40 tokens every head keeps 10 positions, in the 16 slots a fresh buffer has.
// Returns the worst error; restart 0 decodes with -f 0 (the negative control).
static double kv_doc_run(const char* preset, int restart, int* cache_ok) {
    enum { N = 48 };
    FoxModel m;
    eval_test_model(&m, preset, NULL, DOC_V, 4.0f);
    int tokens[N];
    uint64_t rng = 13;
    for (int i = 0; i < N; i++) { tokens[i] = (int)(rng_next(&rng) % DOC_EOT); }
    tokens[0] = tokens[9] = tokens[10] = tokens[12] = tokens[30] = DOC_EOT;
    CpuBackend cb;
    ForwardBackend be = cpu_backend_init(&cb, &m, 1, N);
    float row[DOC_V];
    double worst = 0.0;
    const FoxConfig* cf = &m.config;
    size_t heads = (size_t)cf->n_layer * cf->n_head, entry = (2 * (size_t)(cf->n_embd / cf->n_head) + 1) * 4;
    be.reset(be.ctx);
    *cache_ok = 0;
    for (int t = 1; t <= N; t++) {
        m.doc_eot = restart ? DOC_EOT : -1;
        be.next_logits(be.ctx, tokens, t, row);
        if (t == 40) {
            *cache_ok = fox_decoder_live(&cb.dec) == heads * 10 && fox_decoder_bytes(&cb.dec) == heads * 16 * entry;
        }
        m.doc_eot = DOC_EOT;
        fox_forward(&m, tokens, NULL, 1, t);
        float full[DOC_V];
        memcpy(full, m.logits + (size_t)(t - 1) * cf->padded_vocab_size, sizeof(full));
        worst = fmax(worst, logits_error(row, full, 1, DOC_V, DOC_V));
    }
    fox_decoder_free(&cb.dec);
    fox_free(&m);
    return worst;
}

static void test_documents_kv_cache(void) {
    const char* presets[] = {"fox-pro-tiny", "transformer-pro-tiny"};
    for (int p = 0; p < 2; p++) {
        int cache_ok;
        double err = kv_doc_run(presets[p], 1, &cache_ok);
        int rope = p == 1;
        check((rope ? err <= 1e-5 : err == 0.0) && cache_ok,
              "documents (-f 1): kv cache, %s, 48 tokens with 5 EOTs: logits as the full forward's %s (max err %.1e); "
              "after the EOT at 30 each head keeps only its 10 positions since, in a fresh 16-slot buffer", presets[p],
              rope ? "within 1e-5" : "bit for bit", err);
    }
    int cache_ok;
    double bad = kv_doc_run("fox-pro-tiny", 0, &cache_ok);
    check(bad > 1e-3 && !cache_ok, "documents (-f 1): kv cache, negative control: a cache that does not restart at "
          "an EOT misses (err %.1e > 1e-3) and keeps what it no longer needs", bad);
}

// -M eval -f 1 end to end (cpu_eval_main: the flag to the model, the model to the per-token loss): L(i) of the CSV
// equals the per-token losses of fox_forward with documents on the same batches, and differs from -f 0's
static void test_documents_eval(void) {
    enum { B = 2, T = 16, NTOK = B * T + 1 };
    static char pattern[512], prefix[2][600];
    snprintf(pattern, sizeof(pattern), "%s/doc_val_*.bin", test_dir);
    char path[512];
    snprintf(path, sizeof(path), "%s/doc_val_000.bin", test_dir);
    uint16_t toks[NTOK];
    uint64_t rng = 31;
    for (int i = 0; i < NTOK; i++) { toks[i] = (uint16_t)(i % 5 == 0 ? GPT2_EOT : rng_next(&rng) % GPT2_EOT); }
    write_shard(path, toks, NTOK, SHARD_MAGIC, NTOK);
    double L[2][T];
    for (int f = 0; f < 2; f++) {
        snprintf(prefix[f], sizeof(prefix[f]), "%s/doc_eval%d", test_dir, f);
        const char* argv[] = {"train_fox", "-M", "eval", "-e", "fox-pro-tiny", "-j", pattern, "-b", "2", "-t", "16",
                              "-m", "1", "-O", prefix[f], "-f", f ? "1" : "0", NULL};
        Args a;
        parse_args(&a, 17, (char**)argv);
        quiet_stdout(1);
        cpu_eval_main(&a);
        quiet_stdout(0);
        char csv[700], line[256];
        snprintf(csv, sizeof(csv), "%s.loss.csv", prefix[f]);
        FILE* fp = fopen(csv, "r");
        int rows = 0;
        while (fp != NULL && read_line(fp, line, sizeof(line))) {
            int pos;
            double v;
            if (sscanf(line, "%d,%lf", &pos, &v) == 2 && pos >= 1 && pos <= T) { L[f][pos - 1] = v; rows++; }
        }
        if (fp != NULL) { fclose(fp); }
        if (rows != T) { check(0, "documents (-f 1): eval wrote %d of %d rows to %s", rows, T, csv); return; }
    }
    const char* argv[] = {"train_fox", "-e", "fox-pro-tiny", "-f", "1", NULL};
    Args a;
    parse_args(&a, 5, (char**)argv);
    FoxModel m;
    build_model(&m, &a);
    DataLoader val;
    dataloader_init(&val, pattern, B, T, 0, 1, 0, 0, 1, m.config.vocab_size);
    dataloader_next_batch(&val);
    fox_forward(&m, val.inputs, val.targets, B, T);
    double err = 0.0, off = 0.0;
    for (int t = 0; t < T; t++) {
        double direct = ((double)m.losses[t] + m.losses[T + t]) / B;
        err = fmax(err, fabs(direct - L[1][t]) / direct);
        off = fmax(off, fabs(L[0][t] - L[1][t]) / direct);
    }
    check(m.doc_eot == GPT2_EOT && err <= 1e-8 && off > 1e-3,
          "documents (-f 1): -M eval -f 1 on a shard with an EOT every 5 tokens: L(i) equals fox_forward's with "
          "documents apart (rel err %.1e <= 1e-8, the CSV's %%.9g) and differs from -f 0 (by up to %.1e > 1e-3)",
          err, off);
    dataloader_free(&val);
    fox_free(&m);
}

static void test_documents_flag(void) {
    static const char* bad_value[] = {"train_fox", "-f", "2", NULL};
    static const char* small_vocab[] = {"train_fox", "-f", "1", "--vocab_size", "1000", NULL};
    expect_failure(parse_args_child, bad_value, "-f 2");
    expect_failure(parse_args_child, small_vocab, "-f 1 with a vocabulary of 1000, which has no EOT 50256");
    static const char* flag[] = {"-f", "1", NULL};
    Args on = args_of(flag), off = default_args();
    check(on.documents == 1 && off.documents == 0, "documents: -f 1 parsed, -f 0 the default");
    // resume_notes names a changed -f, and only then: its output of a run saved with -f 0, resumed with -f 1 and 0
    TrainState s;
    memset(&s, 0, sizeof(s));
    s.has_settings = 1;
    int noted[2];
    for (int f = 0; f < 2; f++) {
        char path[600], text[4096] = "";
        snprintf(path, sizeof(path), "%s/notes%d.txt", test_dir, f);
        fflush(stdout);
        int saved = dup(1), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        resume_notes(&s, f ? &on : &off);
        fflush(stdout);
        dup2(saved, 1);
        close(fd); close(saved);
        FILE* fp = fopen(path, "r");
        size_t n = fp != NULL ? fread(text, 1, sizeof(text) - 1, fp) : 0;
        text[n] = '\0';
        if (fp != NULL) { fclose(fp); }
        noted[f] = strstr(text, "the run had -f 0, this one -f 1") != NULL;
    }
    check(noted[1] && !noted[0], "documents: a resume with another -f is noted (and one with the same is not)");
}

// ----------------------------------------------------------------------------
// FP8 numerics (-q): the twin's conversions against the formats' definitions (OCP FP8; Micikevicius et al. 2022),
// computed here from sign, exponent and mantissa, and against CUDA's host conversion where nvcc builds the tests

#include <float.h>
#ifdef __CUDACC__
#include <cuda_fp8.h>
#endif

typedef struct {
    const char* name;
    const Fp8Format* f; // the twin's format under test
    int ebits, mbits, bias, ieee; // the definition: E4M3 (fn) has no inf and one NaN; E5M2 is IEEE-like
} Fp8Def;

static const Fp8Def FP8_DEFS[2] = {{"E4M3", &FP8_E4M3, 4, 3, 7, 0}, {"E5M2", &FP8_E5M2, 5, 2, 15, 1}};

// the value of code c by the definition: NaN, +-inf or a finite value (ldexp, exact in double)
static double fp8_def_value(int c, const Fp8Def* d) {
    int E = (c >> d->mbits) & ((1 << d->ebits) - 1), M = c & ((1 << d->mbits) - 1), top = (1 << d->ebits) - 1;
    double v;
    if (d->ieee && E == top) { v = M == 0 ? INFINITY : NAN; }
    else if (!d->ieee && E == top && M == (1 << d->mbits) - 1) { v = NAN; }
    else if (E == 0) { v = ldexp(M, 1 - d->bias - d->mbits); }
    else { v = ldexp((1 << d->mbits) + M, E - d->bias - d->mbits); }
    return (c & 0x80) ? -v : v;
}

// the fp32 bits of a code's value, the sign of zero included
static uint32_t fp8_def_bits(int c, const Fp8Def* d) {
    return f32_bits((float)fabs(fp8_def_value(c, d))) | ((uint32_t)(c & 0x80) << 24);
}

// the largest finite magnitude code of a format (by the definition)
static int fp8_def_max_code(const Fp8Def* d) {
    int c = 0x7F;
    while (!isfinite(fp8_def_value(c, d))) { c--; }
    return c;
}

// The plain reference encoder: the nearest of the finite values of x's sign by exhaustive search (ties to the even
// code). Past the largest value, the largest is the nearest (saturation; said outright, since the distances to two
// values far below |x| may round to the same double). NaN gives -1.
static int fp8_ref_encode(float x, const Fp8Def* d) {
    if (isnan(x)) { return -1; }
    int s = (f32_bits(x) >> 24) & 0x80, best = 0, top = fp8_def_max_code(d);
    double ax = fabs((double)x), bd = INFINITY;
    if (ax >= fp8_def_value(top, d)) { return s | top; }
    for (int c = 0; c <= top; c++) {
        double dist = fabs(ax - fp8_def_value(c, d));
        if (dist < bd || (dist == bd && (c & 1) == 0)) { bd = dist; best = c; }
    }
    return s | best;
}

// the encoder's code for x matches the expected code (NaN: any NaN code, by the definition)
static int fp8_code_is(float x, const Fp8Def* d, int want) {
    int got = fp8_encode(x, d->f);
    return want < 0 ? isnan(fp8_def_value(got, d)) : got == want;
}

// all 256 codes decode to the definition's values (bits, -0 included; NaN by class); enc(dec(c)) == c for each
// finite c
static void test_fp8_decode(const Fp8Def* d) {
    int bad = 0, round_trip = 1;
    for (int c = 0; c < 256; c++) {
        double v = fp8_def_value(c, d);
        float got = fp8_decode((uint8_t)c, d->f);
        int ok = isnan(v) ? isnan(got) : f32_bits(got) == fp8_def_bits(c, d);
        if (!ok && bad++ == 0) { printf("  code 0x%02x: decoded %g, the definition %g\n", c, got, v); }
        if (isfinite(v)) { round_trip &= fp8_encode(got, d->f) == c; }
    }
    check(bad == 0 && round_trip, "fp8 %s: all 256 codes decode to the format's values (bits, -0; NaN by class), %d "
          "wrong; every finite code encodes back to itself (%s)", d->name, bad, round_trip ? "yes" : "no");
}

// Every pair of adjacent finite values (both signs, subnormals and max included): each value and its fp32
// neighbours give its code, the midpoint the even code, the midpoint's neighbours the two codes; the saturation
// threshold max + ulp/2 (a tie) and beyond, FLT_MAX and inf give max; half the smallest subnormal (a tie) gives 0 and
// its upper neighbour the smallest subnormal; fp32 denormals give 0; NaN stays NaN.
static void test_fp8_edges(const Fp8Def* d) {
    int top = fp8_def_max_code(d), bad = 0, checks = 0;
    float first_bad = 0.0f;
#define FP8_EXPECT(x, code) do { float x_ = (x); checks++; \
        if (!fp8_code_is(x_, d, code) && bad++ == 0) { first_bad = x_; } } while (0)
    for (int s = 0; s <= 0x80; s += 0x80) {
        float sg = s ? -1.0f : 1.0f;
        for (int c = 0; c < top; c++) {
            float lo = (float)fp8_def_value(c, d), hi = (float)fp8_def_value(c + 1, d);
            float mid = (float)(0.5 * ((double)lo + (double)hi)); // at most 5 significant bits: exact
            int even = (c & 1) ? c + 1 : c;
            FP8_EXPECT(sg * lo, s | c);
            FP8_EXPECT(sg * nextafterf(lo, INFINITY), s | c);
            if (c > 0) { FP8_EXPECT(sg * nextafterf(lo, 0.0f), s | c); }
            FP8_EXPECT(sg * mid, s | even);
            FP8_EXPECT(sg * nextafterf(mid, 0.0f), s | c);
            FP8_EXPECT(sg * nextafterf(mid, INFINITY), s | (c + 1));
        }
        float mx = (float)fp8_def_value(top, d), below = (float)fp8_def_value(top - 1, d);
        float sat = mx + 0.5f * (mx - below); // the top binade's half ulp past max
        FP8_EXPECT(sg * mx, s | top);
        FP8_EXPECT(sg * nextafterf(sat, 0.0f), s | top);
        FP8_EXPECT(sg * sat, s | top);
        FP8_EXPECT(sg * nextafterf(sat, INFINITY), s | top);
        FP8_EXPECT(sg * FLT_MAX, s | top);
        FP8_EXPECT(sg * INFINITY, s | top);
        float half = (float)(0.5 * fp8_def_value(1, d));
        FP8_EXPECT(sg * half, s);
        FP8_EXPECT(sg * nextafterf(half, 0.0f), s);
        FP8_EXPECT(sg * nextafterf(half, INFINITY), s | 1);
        FP8_EXPECT(sg * FLT_MIN * 0.5f, s);
        FP8_EXPECT(sg * f32_from_bits(1), s);
        FP8_EXPECT(sg * NAN, -1);
    }
#undef FP8_EXPECT
    double mx = fp8_def_value(top, d), sat = mx + 0.5 * (mx - fp8_def_value(top - 1, d));
    check(bad == 0, "fp8 %s: every adjacent pair of values, both signs (%d checks: the values, the midpoints to the "
          "even code, their fp32 neighbours; saturation from %g on, FLT_MAX, inf; zero up to %g; denormals; NaN): %d "
          "wrong (the first at %a)", d->name, checks, sat, 0.5 * fp8_def_value(1, d), bad, first_bad);
}

// random fp32 values: half near the format's range (random exponent, mantissa and sign), half any bit pattern
static float fp8_random_input(uint64_t* rng, const Fp8Def* d) {
    uint64_t r = rng_next(rng);
    if (r & 1) { return f32_from_bits((uint32_t)(r >> 32)); }
    int lo = 1 - d->bias - d->mbits - 3, hi = (1 << d->ebits) - d->bias + 2;
    int e = lo + (int)((r >> 8) % (uint64_t)(hi - lo + 1));
    uint32_t bits = (uint32_t)(e + 127) << 23 | ((uint32_t)(r >> 40) & 0x7FFFFFu);
    return f32_from_bits(bits | (uint32_t)(r & 2) << 30);
}

#define FP8_SWEEP (1 << 20)
static void test_fp8_sweep(const Fp8Def* d) {
    uint64_t rng = 0xF8F8F8F8ull + (uint64_t)d->mbits;
    int bad = 0;
    float first = 0.0f;
    for (int i = 0; i < FP8_SWEEP; i++) {
        float x = fp8_random_input(&rng, d);
        if (!fp8_code_is(x, d, fp8_ref_encode(x, d)) && bad++ == 0) { first = x; }
    }
    check(bad == 0, "fp8 %s: %d random fp32 values encode as the nearest of the format's values (exhaustive search, "
          "ties to the even code): %d differ (the first %a)", d->name, FP8_SWEEP, bad, first);
}

#ifdef __CUDACC__
// CUDA's host conversion (cuda_fp8.h), saturating: the same codes on the sweep's values and every edge value
// (midpoints and their neighbours); NaN by class
static int cuda_fp8_code(float x, const Fp8Def* d) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, d->ieee ? __NV_E5M2 : __NV_E4M3);
}

static void test_fp8_cuda_host(const Fp8Def* d) {
    uint64_t rng = 0xC0DAull + (uint64_t)d->mbits;
    int bad = 0, n = 0, top = fp8_def_max_code(d);
    float first = 0.0f;
    for (int i = 0; i < FP8_SWEEP + 8 * top; i++, n++) {
        float x;
        if (i < FP8_SWEEP) {
            x = fp8_random_input(&rng, d);
        } else { // a value, or the midpoint above it, or the midpoint's neighbours; both signs
            int j = i - FP8_SWEEP, c = j % top, kind = j / top;
            float v = (float)fp8_def_value(c, d), mid = (float)(0.5 * (v + fp8_def_value(c + 1, d)));
            float at[4] = {v, mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
            x = (kind < 4 ? 1.0f : -1.0f) * at[kind % 4];
        }
        int want = cuda_fp8_code(x, d), got = fp8_encode(x, d->f);
        int same = isnan(fp8_def_value(want, d)) ? isnan(fp8_def_value(got, d)) : got == want;
        if (!same && bad++ == 0) { first = x; }
    }
    check(bad == 0, "fp8 %s: CUDA's host __nv_cvt_float_to_fp8(x, __NV_SATFINITE) gives the twin's codes on %d values "
          "(the sweep's, every value, midpoint and their neighbours): %d differ (the first %a)", d->name, n, bad,
          first);
}
#else
static void test_fp8_cuda_host(const Fp8Def* d) {
    printf("skipped: fp8 %s against CUDA's host conversion (built without nvcc)\n", d->name);
}
#endif

// fp8_scale_exp: the largest k with amax 2^k <= max 2^-margin (in double), on amaxes across fp32's range, the edges
// 1.75 x 2^e and their neighbours; 0 for 0, inf and NaN; clamped at +-100
static void test_fp8_scale_exp(void) {
    uint64_t rng = 99;
    int bad = 0, n = 0;
    for (int i = 0; i < 200000; i++) {
        const Fp8Def* d = &FP8_DEFS[i & 1];
        int margin = (i >> 1) % 3;
        float amax;
        if (i < 3000) {
            float edge = ldexpf(1.75f, (i / 6) % 250 - 125);
            amax = (i / 2) % 3 == 0 ? edge : nextafterf(edge, (i / 2) % 3 == 1 ? 0.0f : INFINITY);
        } else {
            amax = f32_from_bits((uint32_t)(rng_next(&rng) >> 33) | 1u); // positive, finite or not
        }
        if (!isfinite(amax) || amax == 0.0f) { continue; }
        int k = fp8_scale_exp(amax, d->f, margin);
        double mx = fp8_def_value(fp8_def_max_code(d), d) * ldexp(1.0, -margin);
        int ok = (k == 100 || (double)amax * ldexp(1.0, k + 1) > mx)
                 && (k == -100 || (double)amax * ldexp(1.0, k) <= mx) && k >= -100 && k <= 100;
        n++;
        if (!ok && bad++ == 0) { printf("  amax %a margin %d: k %d\n", amax, margin, k); }
    }
    int specials = fp8_scale_exp(0.0f, &FP8_E4M3, 0) == 0 && fp8_scale_exp(INFINITY, &FP8_E5M2, 1) == 0
                   && fp8_scale_exp(NAN, &FP8_E4M3, 0) == 0 && fp8_scale_exp(1e-40f, &FP8_E4M3, 0) == 100
                   && fp8_scale_exp(FLT_MAX, &FP8_E5M2, 0) == -100;
    check(bad == 0 && specials, "fp8 scale exponent: amax 2^k <= max 2^-margin < amax 2^(k+1) on %d amaxes (edges "
          "1.75 x 2^e and neighbours, random), margins 0-2, %d wrong; 0 for 0, inf, NaN; clamped to 100",
          n, bad);
}

// the nearer to a finite x of the two bf16 values around it (ties to the even one; past the largest, inf)
static float bf16_ref(float x) {
    uint32_t lo = f32_bits(x) & 0xFFFF0000u, hi = lo + 0x10000u; // toward zero, one bf16 step away from it
    double a = f32_from_bits(lo), b = (hi & 0x7FFFFFFFu) == 0x7F800000u ? copysign(ldexp(1.0, 128), x)
                                                                         : (double)f32_from_bits(hi);
    double da = fabs((double)x - a), db = fabs(b - (double)x);
    return (da < db || (da == db && (lo & 0x10000u) == 0)) ? (float)a : f32_from_bits(hi);
}

// bf16_round against the nearer of the two bf16 values around x (ties to the even one; past the largest, inf);
// fp8_amax against a serial max, with a NaN or an inf planted (under OpenMP); fp8_round_tensor against the reference
// encoder at the scales 2^5 and 2^-3
static void test_fp8_helpers(void) {
    uint64_t rng = 5;
    int bf_bad = 0;
    for (int i = 0; i < (1 << 20); i++) {
        float x = f32_from_bits((uint32_t)(rng_next(&rng) >> 32));
        if (isfinite(x)) { bf_bad += f32_bits(bf16_round(x)) != f32_bits(bf16_ref(x)); }
    }
    check(bf_bad == 0, "bf16_round: 2^20 random fp32 values round to the nearer bf16 (ties to even, overflow to "
          "inf): %d wrong", bf_bad);
    size_t n = 100003;
    float* x = (float*)malloc_check(n * sizeof(float), "fp8 test");
    float* out = (float*)malloc_check(n * sizeof(float), "fp8 test");
    float serial = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(rng_normal(&rng) * ldexp(1.0, (int)(rng_next(&rng) % 40) - 20));
        serial = fabsf(x[i]) > serial ? fabsf(x[i]) : serial;
    }
    test_hooks.parallel_always = 1; // the reduction on the whole team, however few the values
    float plain = fp8_amax(x, n);
    x[77777] = -INFINITY;
    float inf = fp8_amax(x, n);
    x[66666] = NAN;
    float nan = fp8_amax(x, n);
    test_hooks.parallel_always = 0;
    check(plain == serial && serial > 0.0f && isinf(inf) && inf > 0.0f && isnan(nan),
          "fp8_amax: %zu values on every thread, the serial max %g (got %g); -inf planted: inf (%g); NaN planted: "
          "NaN (%g)", n, serial, plain, inf, nan);
    int rt_bad = 0;
    for (int t = 0; t < 2; t++) {
        const Fp8Def* d = &FP8_DEFS[t];
        int k = t ? -3 : 5;
        fp8_round_tensor(out, x, 50000, k, d->f); // before the planted values
        for (size_t i = 0; i < 50000; i++) {
            int c = fp8_ref_encode((float)((double)x[i] * ldexp(1.0, k)), d);
            rt_bad += f32_bits(out[i]) != f32_bits((float)(fp8_def_value(c, d) * ldexp(1.0, -k)));
        }
    }
    check(rt_bad == 0, "fp8_round_tensor: 50000 values of 40 binades as E4M3 at 2^5 and E5M2 at 2^-3 equal the "
          "reference encoder's values, scaled back (%d wrong)", rt_bad);
    free(x); free(out);
}

static void test_fp8_conversion(void) {
    for (int t = 0; t < 2; t++) {
        test_fp8_decode(&FP8_DEFS[t]);
        test_fp8_edges(&FP8_DEFS[t]);
        test_fp8_sweep(&FP8_DEFS[t]);
        test_fp8_cuda_host(&FP8_DEFS[t]);
    }
    test_fp8_scale_exp();
    test_fp8_helpers();
}

// ----------------------------------------------------------------------------
// FP8 training (-q): every FP8 matmul of the twin's forward and backward against fp64 sums of products of operands
// the test rounds itself (the reference encoder, scales from the design's rules worked out here in double), on a
// batch after a calibration whose histories the test edits; the layers between the matmuls are the twin's, checked
// against the PyTorch reference above. The products of two FP8 values are exact in fp32, so a matmul differs from
// the fp64 sum only by its fp32 additions: |err| <= K 2^-24 sum |a b| (the head projections' fp32 products add one
// rounding each); the bound used is twice that. Rounded operands must equal the test's bit for bit.

// the largest k with a 2^k <= limit, clamped to [-100, 100]; 0 for a = 0
static int ref_scale_exp(double a, double limit) {
    if (!(a > 0.0)) { return 0; }
    int k = (int)floor(log2(limit / a));
    while (a * ldexp(1.0, k + 1) <= limit) { k++; }
    while (a * ldexp(1.0, k) > limit) { k--; }
    return k < -100 ? -100 : k > 100 ? 100 : k;
}

static double fp8_def_max(const Fp8Def* d) { return fp8_def_value(fp8_def_max_code(d), d); }

// x rounded as an FP8 operand of scale 2^k: the reference encoder's value, scaled back
static float ref_round(float x, int k, const Fp8Def* d) {
    int c = fp8_ref_encode((float)((double)x * ldexp(1.0, k)), d);
    return (float)(fp8_def_value(c, d) * ldexp(1.0, -k));
}

// the bounded scale of an RMSNorm output over D values with weights w: max|w| sqrt(D) rounded up to 2^c, in E4M3
static int ref_norm_exp(const float* w, size_t nw, int D) {
    double mx = 0.0;
    for (size_t i = 0; i < nw; i++) { mx = fmax(mx, fabs((double)w[i])); }
    return ref_scale_exp(mx * ldexp(1.0, (int)ceil(0.5 * log2((double)D))), fp8_def_max(&FP8_DEFS[0]));
}

typedef struct { const float* a; size_t sai, sak; const float* b; size_t sbk, sbj, K; } GemmTerm;

// the worst |got - sum over the terms of A B| against 2 (K + terms) 2^-24 sum |a b| over got (M, N), in fp64
static double gemm_ratio(const float* got, size_t M, size_t N, const GemmTerm* t, int nt) {
    double worst = 0.0;
    for (size_t i = 0; i < M; i++) {
        for (size_t j = 0; j < N; j++) {
            double sum = 0.0, mag = 0.0, K = nt;
            for (int q = 0; q < nt; q++) {
                for (size_t k = 0; k < t[q].K; k++) {
                    double p = (double)t[q].a[i * t[q].sai + k * t[q].sak] * t[q].b[k * t[q].sbk + j * t[q].sbj];
                    sum += p; mag += fabs(p);
                }
                K += (double)t[q].K;
            }
            worst = fmax(worst, fabs((double)got[i * N + j] - sum) / (2.0 * K * ldexp(1.0, -24) * mag + 1e-300));
        }
    }
    return worst;
}

// the products of out (N, OC) = inp (N, IC) w (OC, IC)^T: the output, the input gradient dinp = dout w, the weight
// gradient dw = dout^T inp
static GemmTerm gemm_out(const float* inp, const float* w, size_t IC) {
    GemmTerm t = {inp, IC, 1, w, 1, IC, IC};
    return t;
}
static GemmTerm gemm_dinp(const float* dout, const float* w, size_t IC, size_t OC) {
    GemmTerm t = {dout, OC, 1, w, IC, 1, OC};
    return t;
}
static GemmTerm gemm_dw(const float* dout, const float* inp, size_t N, size_t IC, size_t OC) {
    GemmTerm t = {dout, 1, OC, inp, IC, 1, N};
    return t;
}

// What an FP8 check found: operands not rounded as the test rounds them, scales or amaxes that differ, and the
// worst matmul against its bound
typedef struct {
    size_t rounded_bad, rounded_n;
    int scale_bad, amax_bad;
    double gemm_worst;
    const char* worst_at;
} Fp8Check;

// x8 (n values) against the test's rounding of x at 2^k
static void fp8_check_rounded(Fp8Check* r, const float* x8, const float* x, size_t n, int k, const Fp8Def* d) {
    for (size_t i = 0; i < n; i++) { r->rounded_bad += f32_bits(x8[i]) != f32_bits(ref_round(x[i], k, d)); }
    r->rounded_n += n;
}

static void fp8_check_gemm(Fp8Check* r, const char* what, const float* got, size_t M, size_t N, const GemmTerm* t,
                           int nt) {
    double ratio = gemm_ratio(got, M, N, t, nt);
    if (ratio > r->gemm_worst) { r->gemm_worst = ratio; r->worst_at = what; }
}

// the step's amax of a delayed operand against max |x| (n values, before rounding)
static void fp8_check_amax(Fp8Check* r, float amax, const float* x, size_t n) {
    float mx = 0.0f;
    for (size_t i = 0; i < n; i++) { mx = fabsf(x[i]) > mx ? fabsf(x[i]) : mx; }
    r->amax_bad += amax != mx;
}

static float* fp8_scratch(size_t n) { return (float*)calloc_check(n, sizeof(float), "fp8 test"); }

static const Fp8Def* fp8_def_of(const Fp8Format* f) { return f == &FP8_E4M3 ? &FP8_DEFS[0] : &FP8_DEFS[1]; }

// one weight group (`parts` slices of n values): its bf16 copy (the test's bf16 rounding) rounded at the scale of the
// group's amax
static void fp8_check_weight_group(Fp8Check* r, const float* const* w8, const float* const* w, int parts, size_t n) {
    float* bf = fp8_scratch(n * parts);
    double amax = 0.0;
    for (size_t i = 0; i < n * parts; i++) {
        bf[i] = bf16_ref(w[i / n][i % n]);
        amax = fmax(amax, fabs((double)bf[i]));
    }
    int k = ref_scale_exp(amax, fp8_def_max(&FP8_DEFS[0]));
    for (int q = 0; q < parts; q++) { fp8_check_rounded(r, w8[q], bf + q * n, n, k, &FP8_DEFS[0]); }
    free(bf);
}

// the FP8 weights: q, k, v, g one group per layer, W_o, W_gu, W_down, the lm head each its own; with -q body the lm
// head is the fp32 parameter itself
static void fp8_check_weights(Fp8Check* r, const FoxModel* m) {
    const FoxConfig* c = &m->config;
    size_t C = (size_t)c->n_embd, I = (size_t)c->mlp_hidden, CC = C * C;
    ParameterTensors p = m->params, w = m->fp8.weights;
    for (int l = 0; l < c->n_layer; l++) {
        const float* in[4] = {LAYER(p.wq, l, CC), LAYER(p.wk, l, CC), LAYER(p.wv, l, CC), LAYER(p.wg, l, CC)};
        const float* out[4] = {LAYER(w.wq, l, CC), LAYER(w.wk, l, CC), LAYER(w.wv, l, CC), LAYER(w.wg, l, CC)};
        fp8_check_weight_group(r, out, in, c->output_gate ? 4 : 3, CC);
        const float* one_in[3] = {LAYER(p.wo, l, CC), LAYER(p.wgu, l, 2 * I * C), LAYER(p.wdown, l, C * I)};
        const float* one_out[3] = {LAYER(w.wo, l, CC), LAYER(w.wgu, l, 2 * I * C), LAYER(w.wdown, l, C * I)};
        size_t n[3] = {CC, 2 * I * C, C * I};
        for (int g = 0; g < 3; g++) { fp8_check_weight_group(r, &one_out[g], &one_in[g], 1, n[g]); }
    }
    if (m->fp8.mode == FP8_MODE_BODY) { r->rounded_bad += w.lm_head != p.lm_head; }
    else { fp8_check_weight_group(r, &w.lm_head, &p.lm_head, 1, (size_t)c->padded_vocab_size * C); }
}

// layer l's forward: q, k, v, g from the test's rounding of xa (into xa8, kept for the backward), y, xm, act rounded
// at their scales, the matmuls they feed, act's (and y's, without an output norm) amax
static void fp8_check_forward(Fp8Check* r, const FoxModel* m, int l, float* xa8) {
    const FoxConfig* cf = &m->config;
    size_t N = (size_t)m->B * m->T, C = (size_t)cf->n_embd, I = (size_t)cf->mlp_hidden, NC = N * C, CC = C * C;
    int hd = cf->n_embd / cf->n_head;
    ActivationTensors a = m->acts;
    ParameterTensors p = m->params, w = m->fp8.weights;
    const float* amax = m->fp8.amax + (size_t)l * FP8_SLOTS;
    const int* k = m->fp8.k + (size_t)l * FP8_SLOTS;
    const Fp8Def* e4m3 = &FP8_DEFS[0];
    int kxa = ref_norm_exp(LAYER(p.attn_norm, l, C), C, (int)C);
    for (size_t i = 0; i < NC; i++) { xa8[i] = ref_round(LAYER(a.xa, l, NC)[i], kxa, e4m3); }
    const float* ws[4] = {LAYER(w.wq, l, CC), LAYER(w.wk, l, CC), LAYER(w.wv, l, CC), LAYER(w.wg, l, CC)};
    const float* outs[4] = {LAYER(a.q_raw, l, NC), LAYER(a.k_raw, l, NC), LAYER(a.v_raw, l, NC),
                            LAYER(a.og_logit, l, NC)};
    for (int q = 0; q < (cf->output_gate ? 4 : 3); q++) {
        GemmTerm t = gemm_out(xa8, ws[q], C);
        fp8_check_gemm(r, "q, k, v, g = xa W^T", outs[q], N, C, &t, 1);
    }
    float* y = fp8_scratch(NC);
    if (cf->output_gate) { output_gate_forward(y, LAYER(a.o_normed, l, NC), LAYER(a.og_logit, l, NC), NC); }
    else { memcpy(y, LAYER(a.o_normed, l, NC), NC * sizeof(float)); }
    int ky = cf->output_norm ? ref_norm_exp(LAYER(p.o_norm, l, C), C, hd) : k[FP8_Y];
    fp8_check_rounded(r, LAYER(a.y, l, NC), y, NC, ky, e4m3);
    if (cf->output_norm) { r->amax_bad += amax[FP8_Y] != 0.0f; } // bounded: no history
    else { fp8_check_amax(r, amax[FP8_Y], y, NC); }
    GemmTerm to = gemm_out(LAYER(a.y, l, NC), LAYER(w.wo, l, CC), C);
    fp8_check_gemm(r, "attproj = y W_o^T", LAYER(a.attproj, l, NC), N, C, &to, 1);
    float* xm = fp8_scratch(NC);
    float* rstd = fp8_scratch(N);
    rmsnorm_forward(xm, rstd, LAYER(a.resid_mid, l, NC), LAYER(p.mlp_norm, l, C), N, (int)C, 1, 1e-6f);
    fp8_check_rounded(r, LAYER(a.xm, l, NC), xm, NC, ref_norm_exp(LAYER(p.mlp_norm, l, C), C, (int)C), e4m3);
    GemmTerm tg = gemm_out(LAYER(a.xm, l, NC), LAYER(w.wgu, l, 2 * I * C), C);
    fp8_check_gemm(r, "gu = xm W_gu^T", LAYER(a.gu, l, N * 2 * I), N, 2 * I, &tg, 1);
    float* act = fp8_scratch(N * I);
    swiglu_forward(act, LAYER(a.gu, l, N * 2 * I), N, (int)I);
    fp8_check_amax(r, amax[FP8_ACT], act, N * I);
    fp8_check_rounded(r, LAYER(a.act, l, N * I), act, N * I, k[FP8_ACT], e4m3);
    GemmTerm td = gemm_out(LAYER(a.act, l, N * I), LAYER(w.wdown, l, C * I), I);
    fp8_check_gemm(r, "mlpproj = act W_down^T", LAYER(a.mlpproj, l, NC), N, C, &td, 1);
    free(y); free(xm); free(rstd); free(act);
}

// the head: xf rounded at its bound (fp32 with -q body), the logits (the forward's, in `logits`), dlogits rounded
// to E5M2 at the bound dloss = 1 / N, and the two matmuls of the backward
static void fp8_check_head(Fp8Check* r, const FoxModel* m, const float* logits) {
    const FoxConfig* cf = &m->config;
    size_t N = (size_t)m->B * m->T, C = (size_t)cf->n_embd, NC = N * C, Vp = (size_t)cf->padded_vocab_size;
    int body = m->fp8.mode == FP8_MODE_BODY;
    ActivationTensors a = m->acts;
    const float* lm = body ? m->params.lm_head : m->fp8.weights.lm_head;
    float* xf = fp8_scratch(NC);
    float* rstd = fp8_scratch(N);
    float* dl = fp8_scratch(N * Vp);
    rmsnorm_forward(xf, rstd, LAYER(a.resid, cf->n_layer, NC), m->params.norm_f, N, (int)C, 1, 1e-6f);
    memcpy(dl, logits, N * Vp * sizeof(float));
    crossentropy_backward_inplace(dl, m->targets, N, cf->vocab_size, (int)Vp, 1.0f / (float)N);
    if (body) {
        r->rounded_bad += memcmp(a.xf, xf, NC * sizeof(float)) != 0 || memcmp(m->logits, dl, N * Vp * 4) != 0;
    } else {
        fp8_check_rounded(r, a.xf, xf, NC, ref_norm_exp(m->params.norm_f, C, (int)C), &FP8_DEFS[0]);
        int kd = ref_scale_exp((double)(1.0f / (float)N), fp8_def_max(&FP8_DEFS[1]));
        fp8_check_rounded(r, m->logits, dl, N * Vp, kd, &FP8_DEFS[1]);
    }
    GemmTerm t[3] = {gemm_out(a.xf, lm, C), gemm_dinp(m->logits, lm, C, Vp), gemm_dw(m->logits, a.xf, N, C, Vp)};
    fp8_check_gemm(r, "logits = xf W_lm^T", logits, N, Vp, &t[0], 1);
    fp8_check_gemm(r, "dxf = dlogits W_lm", m->grad_acts.xf, N, C, &t[1], 1);
    fp8_check_gemm(r, "dW_lm = dlogits^T xf", m->grads.lm_head, Vp, C, &t[2], 1);
    free(xf); free(rstd); free(dl);
}

// the gradients of q_raw, k_raw, v_raw and og_logit before rounding (pre: 4 x (N, C)), recomputed with the twin's
// layers from the fp32 gradients after them
static void fp8_dqkvg_before(const FoxModel* m, int l, float* pre) {
    const FoxConfig* cf = &m->config;
    int B = m->B, T = m->T, H = cf->n_head, C = cf->n_embd, hd = C / H;
    size_t N = (size_t)B * T, NC = N * C, NH = N * H, qk_per = m->spec[P_Q_NORM].rows;
    ActivationTensors a = m->acts, d = m->grad_acts;
    ParameterTensors p = m->params;
    float* dw = fp8_scratch((size_t)C);
    float* dx = fp8_scratch(NC);
    memset(pre, 0, 4 * NC * sizeof(float));
    if (cf->qk_norm) {
        rmsnorm_backward(pre, dw, LAYER(d.q_normed, l, NC), LAYER(a.q_raw, l, NC), LAYER(p.q_norm, l, qk_per),
                         LAYER(a.rstd_q, l, NH), NH, hd, cf->qk_norm_shared ? 1 : H);
    } else {
        memcpy(pre, LAYER(d.q_normed, l, NC), NC * sizeof(float));
    }
    const float* dshift[2] = {LAYER(d.k_shifted, l, NC), LAYER(d.v, l, NC)};
    const float* raw[2] = {LAYER(a.k_raw, l, NC), LAYER(a.v_raw, l, NC)};
    const float* alpha[2] = {LAYER(a.k_alpha, l, NH), LAYER(a.v_alpha, l, NH)};
    int shift[2] = {cf->k_shift, cf->v_shift};
    for (int s = 0; s < 2; s++) {
        float* out = pre + (1 + s) * NC;
        if (shift[s]) { kv_shift_backward(out, dx, dshift[s], raw[s], alpha[s], NULL, B, T, H, hd); }
        else { memcpy(out, dshift[s], NC * sizeof(float)); }
    }
    if (cf->output_gate) {
        output_gate_backward(dx, pre + 3 * NC, LAYER(d.y, l, NC), LAYER(a.o_normed, l, NC), LAYER(a.og_logit, l, NC),
                             NC);
    }
    free(dw); free(dx);
}

// layer l's backward: each FP8 matmul's output gradient rounded at its delayed scale (q, k, v, g one), its amax,
// the input and weight gradients of the matmuls (xa8: the test's rounding of xa), dxa with the fp32 head projections
static void fp8_check_backward(Fp8Check* r, const FoxModel* m, int l, const float* xa8) {
    const FoxConfig* cf = &m->config;
    size_t N = (size_t)m->B * m->T, C = (size_t)cf->n_embd, I = (size_t)cf->mlp_hidden, H = (size_t)cf->n_head;
    size_t NC = N * C, CC = C * C;
    ActivationTensors a = m->acts, d = m->grad_acts;
    ParameterTensors g = m->grads, w = m->fp8.weights, p = m->params;
    const float* amax = m->fp8.amax + (size_t)l * FP8_SLOTS;
    const int* k = m->fp8.k + (size_t)l * FP8_SLOTS;
    const Fp8Def* gf = fp8_def_of(fp8_slot_format(m->fp8.mode, FP8_DGU));
    // W_down: the gradient from the next layer, dresid
    fp8_check_amax(r, amax[FP8_DRES_DOWN], LAYER(d.resid, l + 1, NC), NC);
    fp8_check_rounded(r, LAYER(d.mlpproj, l, NC), LAYER(d.resid, l + 1, NC), NC, k[FP8_DRES_DOWN], gf);
    GemmTerm t[2] = {gemm_dinp(LAYER(d.mlpproj, l, NC), LAYER(w.wdown, l, C * I), I, C),
                     gemm_dw(LAYER(d.mlpproj, l, NC), LAYER(a.act, l, N * I), N, I, C)};
    fp8_check_gemm(r, "dact = dres W_down", LAYER(d.act, l, N * I), N, I, &t[0], 1);
    fp8_check_gemm(r, "dW_down = dres^T act", LAYER(g.wdown, l, C * I), C, I, &t[1], 1);
    // W_gu
    float* dgu = fp8_scratch(N * 2 * I);
    swiglu_backward(dgu, LAYER(d.act, l, N * I), LAYER(a.gu, l, N * 2 * I), N, (int)I);
    fp8_check_amax(r, amax[FP8_DGU], dgu, N * 2 * I);
    fp8_check_rounded(r, LAYER(d.gu, l, N * 2 * I), dgu, N * 2 * I, k[FP8_DGU], gf);
    t[0] = gemm_dinp(LAYER(d.gu, l, N * 2 * I), LAYER(w.wgu, l, 2 * I * C), C, 2 * I);
    t[1] = gemm_dw(LAYER(d.gu, l, N * 2 * I), LAYER(a.xm, l, NC), N, C, 2 * I);
    fp8_check_gemm(r, "dxm = dgu W_gu", LAYER(d.xm, l, NC), N, C, &t[0], 1);
    fp8_check_gemm(r, "dW_gu = dgu^T xm", LAYER(g.wgu, l, 2 * I * C), 2 * I, C, &t[1], 1);
    // W_o: the gradient of the residual after attention
    fp8_check_amax(r, amax[FP8_DRES_O], LAYER(d.resid_mid, l, NC), NC);
    fp8_check_rounded(r, LAYER(d.attproj, l, NC), LAYER(d.resid_mid, l, NC), NC, k[FP8_DRES_O], gf);
    t[0] = gemm_dinp(LAYER(d.attproj, l, NC), LAYER(w.wo, l, CC), C, C);
    t[1] = gemm_dw(LAYER(d.attproj, l, NC), LAYER(a.y, l, NC), N, C, C);
    fp8_check_gemm(r, "dy = dres W_o", LAYER(d.y, l, NC), N, C, &t[0], 1);
    fp8_check_gemm(r, "dW_o = dres^T y", LAYER(g.wo, l, CC), C, C, &t[1], 1);
    // q, k, v, g: one scale, one amax
    int nq = cf->output_gate ? 4 : 3;
    float* pre = fp8_scratch(4 * NC);
    fp8_dqkvg_before(m, l, pre);
    fp8_check_amax(r, amax[FP8_DQKVG], pre, nq * NC); // the four blocks are adjacent
    const float* d8[4] = {LAYER(d.q_raw, l, NC), LAYER(d.k_raw, l, NC), LAYER(d.v_raw, l, NC),
                          LAYER(d.og_logit, l, NC)};
    const float* w8[4] = {LAYER(w.wq, l, CC), LAYER(w.wk, l, CC), LAYER(w.wv, l, CC), LAYER(w.wg, l, CC)};
    const float* gw[4] = {LAYER(g.wq, l, CC), LAYER(g.wk, l, CC), LAYER(g.wv, l, CC), LAYER(g.wg, l, CC)};
    GemmTerm dxa[7];
    int nt = 0;
    for (int q = 0; q < nq; q++) {
        fp8_check_rounded(r, d8[q], pre + q * NC, NC, k[FP8_DQKVG], gf);
        GemmTerm tw = gemm_dw(d8[q], xa8, N, C, C);
        fp8_check_gemm(r, "dW_qkvg = dqkvg^T xa", gw[q], C, C, &tw, 1);
        dxa[nt++] = gemm_dinp(d8[q], w8[q], C, C);
    }
    if (cf->k_shift) { dxa[nt++] = gemm_dinp(LAYER(d.k_alpha, l, N * H), LAYER(p.wk_shift, l, H * C), C, H); }
    if (cf->v_shift) { dxa[nt++] = gemm_dinp(LAYER(d.v_alpha, l, N * H), LAYER(p.wv_shift, l, H * C), C, H); }
    if (cf->gate == GATE_FULL) { dxa[nt++] = gemm_dinp(LAYER(d.gate_logit, l, N * H), LAYER(p.wf, l, H * C), C, H); }
    fp8_check_gemm(r, "dxa = dqkvg W_qkvg + the fp32 head projections", LAYER(d.xa, l, NC), N, C, dxa, nt);
    free(dgu); free(pre);
}

// tokens below the test models' vocabulary of 64
static void random_fp8_tokens(int* out, size_t n, uint64_t* rng) {
    for (size_t i = 0; i < n; i++) { out[i] = (int)(rng_next(rng) % 64); }
}

// A small model of `preset` for the FP8 tests: 2 layers, C 32, V 64; norm weights spread over [0.5, 1.5] (the bounds
// depend on them), W_k, W_v, W_g scaled by 3, 1/4, 6 (their group's scale is not each one's: it moves the subnormal
// edge), with -q mode
static void fp8_test_model(FoxModel* m, const char* preset, int mode) {
    FoxConfig c;
    config_from_preset(&c, preset);
    c.n_layer = 2; c.n_embd = 32; c.n_head = 2; c.vocab_size = 64; c.padded_vocab_size = padded_vocab(64);
    c.mlp_hidden = 64;
    fox_build(m, &c);
    fox_init(m, 11);
    uint64_t rng = 3;
    int tensors[] = {P_ATTN_NORM, P_Q_NORM, P_K_NORM, P_O_NORM, P_MLP_NORM, P_NORM_F, P_WK, P_WV, P_WG};
    for (int t = 0; t < 9; t++) {
        float* w = param_tensor(&m->params, tensors[t]);
        for (size_t i = 0; i < param_numel(&m->spec[tensors[t]], c.n_layer); i++) {
            w[i] = t < 6 ? 0.5f + (float)rng_uniform(&rng) : w[i] * (t == 6 ? 3.0f : t == 7 ? 0.25f : 6.0f);
        }
    }
    fp8_setup(m, mode);
}

// The model of fp8_test_model calibrated by the twin on a batch, some histories given a larger amax three steps
// back (the scale must follow the history's max), then one FP8 micro-step on that batch, checked whole
static void fp8_model_case(const char* preset, int mode) {
    FoxModel m;
    fp8_test_model(&m, preset, mode);
    const FoxConfig c = m.config;
    uint64_t rng = 4;
    enum { B = 2, T = 24 };
    int inputs[B * T], targets[B * T];
    random_fp8_tokens(inputs, B * T, &rng);
    random_fp8_tokens(targets, B * T, &rng);
    quiet_stdout(1);
    fp8_step_begin(&m);
    fp8_calibrate(&m, inputs, targets, B, T, 1.0f, 1);
    quiet_stdout(0);
    size_t slots = (size_t)c.n_layer * FP8_SLOTS, U = (size_t)m.fp8.history_len;
    for (size_t i = 0; i < slots; i += 2) { m.fp8.history[i * U + U - 3] = 3.0f * m.fp8.history[i * U]; }
    fp8_update_scales(&m);
    Fp8Check r;
    memset(&r, 0, sizeof(r));
    r.worst_at = "";
    for (size_t i = 0; i < slots; i++) { // the delayed scales: the history's max, less the margin
        int slot = (int)(i % FP8_SLOTS), act = slot == FP8_ACT || slot == FP8_Y;
        const Fp8Def* d = act || mode == FP8_MODE_E4M3 ? &FP8_DEFS[0] : &FP8_DEFS[1];
        double mx = 0.0;
        for (size_t j = 0; j < U; j++) { mx = fmax(mx, (double)m.fp8.history[i * U + j]); }
        r.scale_bad += m.fp8.k[i] != ref_scale_exp(mx, fp8_def_max(d) * (act ? 1.0 : 0.5));
    }
    fp8_step_begin(&m);
    fox_forward(&m, inputs, targets, B, T);
    float loss8 = m.mean_loss;
    size_t N = B * T, NC = N * c.n_embd, Vp = (size_t)c.padded_vocab_size;
    float* logits = fp8_scratch(N * Vp);
    memcpy(logits, m.logits, N * Vp * sizeof(float));
    fox_backward(&m, 1.0f);
    fp8_check_weights(&r, &m);
    float* xa8 = fp8_scratch(c.n_layer * NC);
    for (int l = 0; l < c.n_layer; l++) { fp8_check_forward(&r, &m, l, xa8 + l * NC); }
    fp8_check_head(&r, &m, logits);
    for (int l = 0; l < c.n_layer; l++) { fp8_check_backward(&r, &m, l, xa8 + l * NC); }
    // the same batch in fp32: the FP8 step differs, by what FP8 rounding gives (a loose sanity bound)
    float* g8 = fp8_scratch(m.num_parameters);
    memcpy(g8, m.grads_memory, m.num_parameters * sizeof(float));
    fp8_step_end(&m, 1, 0);
    fox_zero_grad(&m);
    fox_forward(&m, inputs, targets, B, T);
    fox_backward(&m, 1.0f);
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < m.num_parameters; i++) {
        num += ((double)g8[i] - m.grads_memory[i]) * ((double)g8[i] - m.grads_memory[i]);
        den += (double)m.grads_memory[i] * m.grads_memory[i];
    }
    double grad_rel = sqrt(num / den), loss_rel = fabs(loss8 - m.mean_loss) / m.mean_loss;
    check(m.fp8.calibrated && r.rounded_bad == 0 && r.scale_bad == 0 && r.amax_bad == 0 && r.gemm_worst <= 1.0
              && grad_rel > 1e-4 && grad_rel < 0.25 && loss_rel < 0.02,
          "fp8 -q %s, %s: %zu rounded operand values as the test rounds them (%zu differ), delayed scales from the "
          "histories' max (%d differ), amaxes (%d differ); every FP8 matmul within its fp32 sum bound (worst %.2f "
          "of it, at %s); against fp32: gradients %.3f (in (1e-4, 0.25)), loss %.1e (< 0.02)", FP8_MODE_NAMES[mode],
          preset, r.rounded_n, r.rounded_bad, r.scale_bad, r.amax_bad, r.gemm_worst, r.worst_at, grad_rel, loss_rel);
    free(logits); free(xa8); free(g8);
    fox_free(&m);
}

// the twin's optimizer steps from..to (exclusive) as main runs them: micro-steps (calibration on the first), the
// update, the FP8 step's end
static void fp8_train(FoxModel* m, DataLoader* d, int from, int to) {
    AdamWConfig opt = {3e-3f, 0.1f, 0.9f, 0.95f, 1e-8f, 1.0f};
    quiet_stdout(1);
    for (int step = from; step < to; step++) {
        fox_train_micro_steps(m, d, 2, step + 1);
        double norm = fp8_amax_finite(m) ? fox_grad_norm(m) : NAN;
        fox_clip_grads(m, norm, opt.grad_clip);
        fox_update(m, &opt, opt.lr, step + 1);
        fp8_step_end(m, step + 1, 1);
    }
    quiet_stdout(0);
}

// whether two models hold the same weights, moments and FP8 state (histories, position, scales), bit for bit
static int fp8_same_run(const FoxModel* a, const FoxModel* b) {
    size_t bytes = a->num_parameters * sizeof(float), slots = (size_t)a->config.n_layer * FP8_SLOTS;
    return memcmp(a->params_memory, b->params_memory, bytes) == 0 && memcmp(a->m_memory, b->m_memory, bytes) == 0
           && memcmp(a->v_memory, b->v_memory, bytes) == 0 && a->fp8.pos == b->fp8.pos
           && a->fp8.calibrated == b->fp8.calibrated
           && memcmp(a->fp8.history, b->fp8.history, slots * a->fp8.history_len * sizeof(float)) == 0
           && memcmp(a->fp8.k, b->fp8.k, slots * sizeof(int)) == 0;
}

static ResumeDir fp8_dir; // the run of test_fp8_resume
static void fp8_load_state_child(const void* arg) {
    FoxModel m;
    fox_build(&m, &fp8_dir.c);
    fp8_setup(&m, FP8_MODE_HYBRID);
    TrainState s;
    load_state(&m, &s, (const char*)arg);
}

// The FP8 state through a checkpoint: 20 steps with -q hybrid straight against 10, a checkpoint, a resume into a
// fresh model and 10 more (weights, moments, histories, ring position, scales bit for bit; the ring of 16 wraps);
// the resumed FP8 state equals the saved one bit for bit; a resume that drops the histories (negative control)
// trains other bits; a flipped history byte is refused; the file read without -q, with histories of another length
// (calibrates), and a version-3 file (calibrates)
static void test_fp8_resume(void) {
    resume_dir_init(&fp8_dir, "fp8", 0);
    Args* a = &fp8_dir.a;
    a->fp8 = FP8_MODE_HYBRID; a->steps = 20; a->total_batch_tokens = 32;
    FoxModel run, resumed, dropped;
    fox_build(&run, &fp8_dir.c);
    fox_init(&run, 3);
    fp8_setup(&run, FP8_MODE_HYBRID);
    DataLoader d;
    dataloader_init(&d, fp8_dir.pattern, 2, 8, 0, 1, 1, 0, 7, 300);
    LRSchedule sched = run_schedule(a, NULL);
    fp8_train(&run, &d, 0, 10);
    // an amax 8 times the largest, eight steps before it leaves the ring: the next steps' scales 3 binades lower
    // than a calibration would give, so that only the saved histories resume exactly
    size_t slots = (size_t)fp8_dir.c.n_layer * FP8_SLOTS, hist_bytes = slots * FP8_HISTORY * sizeof(float);
    for (size_t i = 0; i < slots; i++) {
        float* h = run.fp8.history + i * FP8_HISTORY;
        h[(run.fp8.pos + 8) % FP8_HISTORY] = 8.0f * fp8_amax(h, FP8_HISTORY);
    }
    fp8_update_scales(&run);
    TrainState s = train_state(10, &d, &sched, 320, a);
    quiet_stdout(1);
    save_checkpoint(&run, fp8_dir.dir, &s);
    quiet_stdout(0);
    float saved_hist[2 * FP8_SLOTS * FP8_HISTORY];
    int saved_k[2 * FP8_SLOTS], saved_pos = run.fp8.pos;
    memcpy(saved_hist, run.fp8.history, hist_bytes);
    memcpy(saved_k, run.fp8.k, slots * sizeof(int));
    fp8_train(&run, &d, 10, 20);
    FoxModel* others[2] = {&resumed, &dropped};
    DataLoader od[2];
    int same_state = 0;
    for (int i = 0; i < 2; i++) {
        fox_build(others[i], &fp8_dir.c);
        fox_init(others[i], 99);
        fp8_setup(others[i], FP8_MODE_HYBRID);
        dataloader_init(&od[i], fp8_dir.pattern, 2, 8, 0, 1, 1, 0, 7, 300);
        quiet_stdout(1);
        resume_run(others[i], a, &od[i]);
        quiet_stdout(0);
        if (i == 0) {
            same_state = others[i]->fp8.calibrated && others[i]->fp8.pos == saved_pos
                         && memcmp(others[i]->fp8.history, saved_hist, hist_bytes) == 0
                         && memcmp(others[i]->fp8.k, saved_k, slots * sizeof(int)) == 0;
        }
        if (i == 1) { others[i]->fp8.calibrated = 0; } // the histories dropped: it calibrates again
        fp8_train(others[i], &od[i], 10, 20);
    }
    check(same_state, "fp8 state file: the histories (%zu floats), ring position %d, calibrated flag and scales of "
          "step 10 read back bit for bit", slots * FP8_HISTORY, saved_pos);
    int dropped_differs = memcmp(run.params_memory, dropped.params_memory, run.num_parameters * sizeof(float)) != 0;
    check(fp8_same_run(&run, &resumed) && dropped_differs,
          "fp8 resume: 20 steps of -q hybrid straight == 10 + checkpoint + resume + 10 (weights, moments, histories, "
          "position, scales bit for bit; the ring of %d wraps); without the saved histories the weights differ (%s)",
          FP8_HISTORY, dropped_differs ? "yes" : "no");
    // the state file: a flipped history byte; read without -q; another history length; a version-3 file
    char model_path[600], state_path[600], flipped[700], v3[700];
    checkpoint_paths(fp8_dir.dir, 10, model_path, state_path, sizeof(model_path));
    snprintf(flipped, sizeof(flipped), "%s/flipped_history.bin", fp8_dir.dir);
    struct stat st;
    stat(state_path, &st);
    flip_bytes(state_path, flipped, (long)(st.st_size - 8 - hist_bytes / 2), 1);
    expect_failure(fp8_load_state_child, flipped, "fp8: a state file with a flipped history byte (checksum)");
    FoxModel plain, other_len;
    fox_build(&plain, &fp8_dir.c);
    fox_build(&other_len, &fp8_dir.c);
    fp8_setup(&other_len, FP8_MODE_HYBRID);
    other_len.fp8.history_len = FP8_HISTORY / 2;
    TrainState ps, os, v3s;
    load_state(&plain, &ps, state_path);
    load_state(&other_len, &os, state_path);
    snprintf(v3, sizeof(v3), "%s/state_v3.bin", fp8_dir.dir);
    save_state(&plain, &ps, flipped); // written without -q: no histories
    patch_header(flipped, v3, 1, 3, 1, 3);
    load_state(&resumed, &v3s, v3);
    check(ps.fp8 == FP8_MODE_HYBRID && ps.fp8_history == FP8_HISTORY && plain.fp8.mode == FP8_MODE_OFF
              && !other_len.fp8.calibrated && v3s.fp8 == FP8_MODE_OFF && !resumed.fp8.calibrated,
          "fp8 state file: read without -q (it says -q hybrid, %d steps); with histories of %d steps the model "
          "calibrates again; a version-3 file (no FP8 state) too", ps.fp8_history, FP8_HISTORY / 2);
    // -q parsed; a resume with another -q noted
    static const char* bad_mode[] = {"train_fox", "-q", "fp16", NULL};
    expect_failure(parse_args_child, bad_mode, "-q fp16");
    Args off = *a;
    off.fp8 = FP8_MODE_OFF;
    TrainState was_off = train_state(10, &d, &sched, 320, &off);
    quiet_stdout(1);
    int notes_on = resume_notes(&was_off, a), notes_same = resume_notes(&s, a);
    quiet_stdout(0);
    check(notes_on == 1 && notes_same == 0, "fp8: a resume with -q hybrid after -q off is noted (%d note), one with "
          "the same -q is not (%d)", notes_on, notes_same);
    for (int i = 0; i < 2; i++) { dataloader_free(&od[i]); fox_free(others[i]); }
    dataloader_free(&d);
    fox_free(&run); fox_free(&plain); fox_free(&other_len);
}


// The step's amax of each operand is the max over its micro-steps: batches a and b each alone, then both in a step
static void test_fp8_step_amax(void) {
    FoxModel m;
    fp8_test_model(&m, "fox-pro-tiny", FP8_MODE_HYBRID);
    enum { B = 2, T = 24 };
    int in[2][B * T], tg[2][B * T];
    uint64_t rng = 8;
    for (int k = 0; k < 2; k++) { random_fp8_tokens(in[k], B * T, &rng); random_fp8_tokens(tg[k], B * T, &rng); }
    size_t slots = (size_t)m.config.n_layer * FP8_SLOTS;
    float amax[3][2 * FP8_SLOTS];
    quiet_stdout(1);
    for (int run = 0; run < 3; run++) { // a alone, b alone, a then b
        fp8_step_begin(&m);
        if (run == 0) { fp8_calibrate(&m, in[0], tg[0], B, T, 0.5f, 1); }
        for (int k = run == 1; k <= (run > 0); k++) {
            fox_forward(&m, in[k], tg[k], B, T);
            fox_backward(&m, 0.5f);
        }
        memcpy(amax[run], m.fp8.amax, slots * sizeof(float));
        fp8_step_end(&m, 1, 0);
    }
    quiet_stdout(0);
    int same = 1, a_larger = 0, b_larger = 0;
    for (size_t i = 0; i < slots; i++) {
        same &= amax[2][i] == fmaxf(amax[0][i], amax[1][i]);
        a_larger += amax[0][i] > amax[1][i];
        b_larger += amax[1][i] > amax[0][i];
    }
    check(same && a_larger > 0 && b_larger > 0, "fp8: a step's amaxes are the max over its micro-steps (%zu operands; "
          "the first micro-batch's larger in %d, the second's in %d)", slots, a_larger, b_larger);
    fox_free(&m);
}

static void test_fp8_training(void) {
    fp8_model_case("fox-pro-tiny", FP8_MODE_HYBRID);
    fp8_model_case("fox-pro-tiny", FP8_MODE_E4M3);
    fp8_model_case("fox-pro-tiny", FP8_MODE_BODY);
    fp8_model_case("transformer-llama-tiny", FP8_MODE_HYBRID);
    test_fp8_step_amax();
    test_fp8_resume();
}

// ----------------------------------------------------------------------------

#ifndef __CUDACC__
static void run_gpu_tests(void) { printf("skipped: GPU tests (built without nvcc)\n"); }
#else
// ----------------------------------------------------------------------------
// GPU part: train_fox.cu against the CPU twin on the same weights and batches. Needs this
// file compiled as CUDA with train_fox.cu included in place of train_fox.c (it includes the
// twin). Without a GPU every group prints a "skipped: no GPU" line and counts nothing.
//
// Errors are max |gpu - twin| / max |twin| over a tensor.
// - fp32 build (-DENABLE_FP32): both sides are fp32 and differ only in summation order
//   (warp trees, cuBLASLt tiles, a chunked scan for c): logits and loss 1e-5, gradients 1e-4
//   (the backward adds cancellation), 10-step losses 1e-4, grad norms 5e-4.
// - bf16 build: every activation is rounded to bf16 (eps 2^-8 = 3.9e-3, half an ulp of
//   relative error per rounding) and the matmuls read bf16 weights. A 2-layer forward rounds
//   a value about 10 times on its way to the logits, as independent errors: sqrt(10) * 2e-3
//   ~ 6e-3, so the floors are logits 2e-2 (5 eps), mean loss 5e-3 (it averages many rows),
//   matrix gradients 5e-2 (the backward doubles the chain), norm-scale and gate-bias
//   gradients 1e-1 (sums over all rows of terms that cancel), 10-step losses 2e-2.
//   How much a model amplifies rounding depends on its weights: the reference fixtures use
//   weights 15x the paper's init (std 0.3 at C = 32: sharp softmaxes). So each tolerance is
//   the larger of its floor and GTOL_SENS times the tensor's measured sensitivity: the error
//   of the twin itself when only its weights are rounded to bf16. The GPU rounds those
//   weights plus about as many activations on every path (x2 as independent errors), with a
//   safety factor of 4: GTOL_SENS = 8. The gate-bias gradient, a sum of terms that cancel,
//   is measured against the sum of its terms' magnitudes (see compare_gradients).

#ifdef ENABLE_FP32
#define GTOL_LOGITS 1e-5
#define GTOL_LOSS 1e-5
#define GTOL_GRAD_MATRIX 1e-4
#define GTOL_GRAD_VECTOR 1e-4
#define GTOL_STEPS 1e-4
#define GTOL_SENS 0.0
#else
#define GTOL_LOGITS 2e-2
#define GTOL_LOSS 5e-3
#define GTOL_GRAD_MATRIX 5e-2
#define GTOL_GRAD_VECTOR 1e-1
#define GTOL_STEPS 2e-2
#define GTOL_SENS 8.0
#endif

// 0xFF bytes are NaN in fp32 and in bf16: a value a kernel forgot to write shows up
static void gpu_poison(GPUModel* g) {
    cudaCheck(cudaMemset(g->acts_memory, 0xFF, g->acts_bytes));
    cudaCheck(cudaMemset(g->grad_memory, 0xFF, g->grad_bytes));
#ifndef ENABLE_FP32
    if (g->fp8.on) { // -q's operands: 0xFF is a NaN code in both formats and a NaN in bf16
        size_t N = (size_t)g->max_B * g->max_T, C = (size_t)g->config.n_embd, I = (size_t)g->config.mlp_hidden;
        size_t wide = C > I ? C : I, Vp = (size_t)g->config.padded_vocab_size, grad = Vp > 4 * C ? Vp : 4 * C;
        cudaCheck(cudaMemset(g->fp8.x8, 0xFF, N * wide));
        cudaCheck(cudaMemset(g->fp8.d8, 0xFF, N * (grad > 2 * I ? grad : 2 * I)));
        cudaCheck(cudaMemset(g->fp8.xr, 0xFF, N * wide * sizeof(floatX)));
    }
#endif
}

// max |a - b| / max |b|; NaN in a gives infinity
static double rel_error_f32(const float* a, const float* b, size_t n, size_t a_stride, size_t b_stride, size_t row) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        size_t ia = (i / row) * a_stride + i % row, ib = (i / row) * b_stride + i % row;
        double d = fabs((double)a[ia] - (double)b[ib]);
        if (!(d <= num)) { num = isnan(d) ? INFINITY : d; }
        den = fmax(den, fabs((double)b[ib]));
    }
    return num / den;
}

static void random_tokens(int* out, size_t n, int V, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) { out[i] = (int)(rng_next(&s) % (uint64_t)V); }
}

// Documents kept apart for (B, T) sequences: (2, B, T) ints, the twin's document_starts of a token stream with an EOT
// at each start, then their ends (document_ends: the GPU's FoxDocs). Each position t > 0 starts a document with
// probability 1 / mean_len, except in [T / 3, T / 3 + span) (one document across several tiles); besides, every
// sequence has a one-position document at 5 (an EOT followed by an EOT), a two-position one at 6, and ends on a lone
// EOT at T - 1 (T >= 12). Sequence 1 (B > 1) begins inside a document.
static int* doc_layout(int B, int T, int mean_len, int span, uint64_t seed) {
    int* inputs = (int*)malloc_check((size_t)B * T * sizeof(int), "documents");
    int* doc = (int*)malloc_check(2 * (size_t)B * T * sizeof(int), "documents");
    uint64_t s = seed;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            int in_span = t >= T / 3 && t < T / 3 + span;
            int start = t > 0 && !in_span && rng_uniform(&s) * mean_len < 1.0;
            if (T >= 12 && (t == 5 || t == 6 || t == 8 || t == T - 1)) { start = 1; }
            if (T >= 12 && t == 7) { start = 0; }
            inputs[(size_t)b * T + t] = start ? 1 : 0;
        }
        inputs[(size_t)b * T] = b == 0; // sequence 0 starts with an EOT (a start at 0 changes nothing)
    }
    document_starts(doc, inputs, B, T, 1);
    document_ends(doc + (size_t)B * T, doc, B, T);
    free(inputs);
    return doc;
}

// the position count of the starts t > 0 in a doc_layout
static int doc_starts_count(const int* doc, int B, int T) {
    int n = 0;
    for (int i = 0; i < B * T; i++) { n += i % T > 0 && doc[i] == i % T; }
    return n;
}

// (B, T) tokens below V - 1 (the EOT) with an EOT at each start of doc_layout(B, T, mean_len, 0, seed), and targets
static void doc_tokens(int* inputs, int* targets, int B, int T, int V, int mean_len, uint64_t seed) {
    int* doc = doc_layout(B, T, mean_len, 0, seed);
    random_tokens(inputs, (size_t)B * T, V - 1, seed + 1);
    random_tokens(targets, (size_t)B * T, V, seed + 2);
    for (int i = 0; i < B * T; i++) {
        if (doc[i] == i % T && (i % T > 0 || i / T == 0)) { inputs[i] = V - 1; }
    }
    free(doc);
}

// preset at width n_embd with n_head heads, V = 500, its MLP size derived, and key = value set (key NULL: none)
static void test_config(FoxConfig* c, const char* preset, int n_embd, int n_head, const char* key, const char* value) {
    config_from_preset(c, preset);
    c->n_embd = n_embd;
    c->n_head = n_head;
    config_set(c, "vocab_size", "500");
    if (key != NULL) { config_set(c, key, value); }
    c->mlp_hidden = derived_mlp_hidden(c->n_embd, c->block);
}

// a twin model of the configuration with the paper's initialisation
static void twin_from_config(FoxModel* m, const FoxConfig* c, uint64_t seed) {
    fox_build(m, c);
    fox_init(m, seed);
}

// a copy of the twin with every weight rounded to bf16 (the sensitivity probe)
static void twin_rounded_copy(FoxModel* out, const FoxModel* twin) {
    fox_build(out, &twin->config);
    for (size_t i = 0; i < twin->num_parameters; i++) {
        out->params_memory[i] = __bfloat162float(__float2bfloat16(twin->params_memory[i]));
    }
}

static double tolerance(double floor_tol, double sensitivity) { return fmax(floor_tol, GTOL_SENS * sensitivity); }

// max |a - b| over n values, divided by `scale`
static double abs_error_f32(const float* a, const float* b, size_t n, double scale) {
    double num = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= num)) { num = isnan(d) ? INFINITY : d; }
    }
    return num / fmax(scale, 1e-30);
}

// Compares the GPU's parameter gradients with the twin's, tensor by tensor (probe: the
// rounded twin after the same backward); one check line with the tensor nearest its
// tolerance, then every tensor's error on an indented line. The gate bias's gradient is the
// sum over all rows of dz, terms that largely cancel, so its error is measured against
// bf_scale = max over (layer, head) of sum_n |dz_n| (the forward-error scale of a sum), not
// against its own small value.
static void compare_gradients(GPUModel* g, FoxModel* twin, FoxModel* probe, double bf_scale, const char* name) {
    float* grads = (float*)malloc_check(g->num_parameters * sizeof(float), "GPU gradients");
    gpu_download(g, g->grads, grads);
    char detail[4096] = "";
    size_t used = 0;
    double worst_ratio = 0.0, worst_err = 0.0, worst_tol = 0.0;
    const char* worst_name = "";
    int tensors = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        const ParamSpec* s = &twin->spec[t];
        size_t n = param_numel(s, twin->config.n_layer);
        if (n == 0 || !s->trainable) { continue; }
        const float* ref = param_tensor(&twin->grads, t);
        double sens = rel_error_f32(param_tensor(&probe->grads, t), ref, n, n, n, n);
        double err = rel_error_f32(grads + (ref - twin->grads_memory), ref, n, n, n, n);
        if (t == P_BF) {
            sens = abs_error_f32(param_tensor(&probe->grads, t), ref, n, bf_scale);
            err = abs_error_f32(grads + (ref - twin->grads_memory), ref, n, bf_scale);
        }
        double tol = tolerance(s->cols == 1 ? GTOL_GRAD_VECTOR : GTOL_GRAD_MATRIX, sens);
        tensors++;
        if (!(err / tol <= worst_ratio)) {
            worst_ratio = err / tol;
            worst_err = err;
            worst_tol = tol;
            worst_name = s->name;
        }
        if (used < sizeof(detail)) {
            used += (size_t)snprintf(detail + used, sizeof(detail) - used, " %s %.1e (sens %.1e)", s->name, err, sens);
        }
    }
    check(worst_ratio <= 1.0, "gpu %s: %d gradient tensors within tolerance (nearest: %s rel err %.1e <= %.1e)", name,
          tensors, worst_name, worst_err, worst_tol);
    printf("      grad rel errs:%s\n", detail);
    free(grads);
}

// rows of n logits as floats (the first V columns are compared)
static float* gpu_logits_host(GPUModel* g, size_t N) {
    size_t n = N * g->config.padded_vocab_size;
    floatX* lx = (floatX*)malloc_check(n * sizeof(floatX), "GPU logits");
    float* lg = (float*)malloc_check(n * sizeof(float), "GPU logits");
    cudaCheck(cudaMemcpy(lx, g->acts.logits, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) { lg[i] = to_float(lx[i]); }
    free(lx);
    return lg;
}

// One batch: forward and backward from the same weights on the GPU, the twin and the probe
// (the twin with bf16 weights), optionally as `micro` accumulated micro-batches of B rows
// each (inputs holds micro * B * T tokens).
static void gpu_vs_twin_batch(FoxModel* twin, const int* inputs, const int* targets, int B, int T, int micro,
                              const char* name) {
    int V = twin->config.vocab_size, Vp = twin->config.padded_vocab_size;
    size_t N = (size_t)B * T;
    FoxModel probe;
    twin_rounded_copy(&probe, twin);
    GPUModel g;
    gpu_build(&g, twin, B, T);
    fox_zero_grad(twin);
    fox_zero_grad(&probe);
    gpu_zero_grad(&g);
    const FoxConfig* c = &twin->config;
    int H = c->n_head, L = c->n_layer;
    double* bf_sums = (double*)calloc_check((size_t)L * H, sizeof(double), "gate-bias scales");
    double e_logits = 0, e_loss = 0, s_logits = 0, s_loss = 0;
    float gpu_loss = 0, twin_loss = 0;
    int same_loss = 1; // the training forward's loss (fused with its gradient) is the plain forward's, bit for bit
    for (int k = 0; k < micro; k++) {
        gpu_poison(&g);
        fox_forward(twin, inputs + k * N, targets + k * N, B, T);
        fox_forward(&probe, inputs + k * N, targets + k * N, B, T);
        gpu_forward(&g, inputs + k * N, targets + k * N, B, T);
        float* lg = gpu_logits_host(&g, N);
        e_logits = fmax(e_logits, rel_error_f32(lg, twin->logits, N * V, Vp, Vp, V));
        s_logits = fmax(s_logits, rel_error_f32(probe.logits, twin->logits, N * V, Vp, Vp, V));
        e_loss = fmax(e_loss, fabs((double)g.mean_loss - twin->mean_loss) / fabs((double)twin->mean_loss));
        s_loss = fmax(s_loss, fabs((double)probe.mean_loss - twin->mean_loss) / fabs((double)twin->mean_loss));
        gpu_loss = g.mean_loss;
        twin_loss = twin->mean_loss;
        free(lg);
        fox_backward(twin, 1.0f / micro);
        fox_backward(&probe, 1.0f / micro);
        gpu_poison(&g);
        gpu_forward_train(&g, inputs + k * N, targets + k * N, B, T, 1.0f / micro);
        same_loss = same_loss && g.mean_loss == gpu_loss;
        gpu_backward(&g);
        for (size_t i = 0; c->gate != GATE_NONE && i < (size_t)L * N * H; i++) {
            bf_sums[(i / (N * H)) * H + i % H] += fabs(twin->grad_acts.gate_logit[i]);
        }
    }
    double bf_scale = 0.0;
    for (int i = 0; i < L * H; i++) { bf_scale = fmax(bf_scale, bf_sums[i]); }
    free(bf_sums);
    double tol_logits = tolerance(GTOL_LOGITS, s_logits), tol_loss = tolerance(GTOL_LOSS, s_loss);
    check(e_logits <= tol_logits, "gpu %s: logits (rel err %.1e <= %.1e; sens %.1e)", name, e_logits, tol_logits,
          s_logits);
    check(e_loss <= tol_loss, "gpu %s: loss %.6f vs twin %.6f (rel err %.1e <= %.1e; sens %.1e)", name, gpu_loss,
          twin_loss, e_loss, tol_loss, s_loss);
    check(same_loss, "gpu %s: the training forward's loss equals the plain forward's bit for bit", name);
    compare_gradients(&g, twin, &probe, bf_scale, name);
    gpu_free(&g);
    fox_free(&probe);
}

// n_steps AdamW steps on the same batch on the GPU, the twin and the probe: the losses and
// grad norms of the GPU must follow the twin's
static void gpu_vs_twin_steps(FoxModel* twin, const int* inputs, const int* targets, int B, int T,
                              const AdamWConfig* opt, const LRSchedule* sched, int n_steps, const char* name) {
    FoxModel probe;
    twin_rounded_copy(&probe, twin);
    GPUModel g;
    gpu_build(&g, twin, B, T);
    double e_loss = 0.0, e_norm = 0.0, s_loss = 0.0, s_norm = 0.0;
    for (int step = 0; step < n_steps; step++) {
        float lr = (float)lr_at_tokens(sched, step * sched->tokens_per_step);
        double norm = twin_step(twin, inputs, targets, B, T, opt, lr, step + 1);
        double pnorm = twin_step(&probe, inputs, targets, B, T, opt, lr, step + 1);
        gpu_poison(&g);
        gpu_zero_grad(&g);
        gpu_forward_train(&g, inputs, targets, B, T, 1.0f);
        gpu_backward(&g);
        double gnorm = gpu_grad_norm(&g);
        gpu_update(&g, opt, lr, step + 1, gnorm);
        double ref = fabs((double)twin->mean_loss);
        double el = fabs((double)g.mean_loss - twin->mean_loss) / ref, en = fabs(gnorm - norm) / fmax(norm, 1e-30);
        e_loss = isnan(el) ? INFINITY : fmax(e_loss, el);
        e_norm = isnan(en) ? INFINITY : fmax(e_norm, en);
        s_loss = fmax(s_loss, fabs((double)probe.mean_loss - twin->mean_loss) / ref);
        s_norm = fmax(s_norm, fabs(pnorm - norm) / fmax(norm, 1e-30));
    }
    double tol_loss = tolerance(GTOL_STEPS, s_loss), tol_norm = tolerance(5 * GTOL_STEPS, s_norm);
    check(e_loss <= tol_loss && e_norm <= tol_norm,
          "gpu %s: %d AdamW steps: losses (rel err %.1e <= %.1e; sens %.1e), grad norms (%.1e <= %.1e; sens %.1e); "
          "last loss %.4f vs twin %.4f", name, n_steps, e_loss, tol_loss, s_loss, e_norm, tol_norm, s_norm, g.mean_loss,
          twin->mean_loss);
    gpu_free(&g);
    fox_free(&probe);
}

// every reference fixture (every preset and single toggle, head size 16, T = 24: one tile)
static void gpu_test_fixture(const char* path) {
    DebugState ds;
    char name[128];
    FoxConfig c;
    DebugTraining tr;
    FoxModel twin;
    fixture_load(path, &ds, name, sizeof(name), &c, &tr, &twin);
    float* initial = (float*)malloc_check(twin.num_parameters * sizeof(float), "initial weights");
    memcpy(initial, twin.params_memory, twin.num_parameters * sizeof(float));
    const int* inputs = (const int*)debug_find(&ds, "inputs")->data;
    const int* targets = (const int*)debug_find(&ds, "targets")->data;
    gpu_vs_twin_batch(&twin, inputs, targets, tr.B, tr.T, 1, name);
    memcpy(twin.params_memory, initial, twin.num_parameters * sizeof(float));
    gpu_vs_twin_steps(&twin, inputs, targets, tr.B, tr.T, &tr.opt, &tr.sched, tr.n_steps, name);
    free(initial);
    fox_free(&twin);
    debug_state_free(&ds);
}

// Configurations the fixtures do not reach: head sizes 64 and 128, several key tiles
// (T = 100, not a multiple of the tile), sliding windows, RoPE with QK-norm, three layers, and
// gradient accumulation over two micro-batches. Random initialisation, random tokens, V = 500
// (padded to 512, so pad logits are masked). The cases with mean_len > 0 keep documents apart (-f 1)
// with EOT = V - 1 at doc_layout's starts (documents of 2 to a few hundred tokens) on the fused
// kernels: FoX at head sizes 64 and 128, a window, a Transformer (the key mask, RoPE), three layers.
static void gpu_test_larger_heads(void) {
    struct { const char* preset; int n_embd, n_head, T; const char* key; const char* value; int mean_len; } cases[] = {
        {"fox-pro-tiny", 128, 2, 100, "window", "0", 0},
        {"fox-pro-tiny", 128, 2, 100, "window", "37", 0},
        {"fox-llama-tiny", 128, 1, 100, "rope", "1", 0},
        {"transformer-pro-tiny", 128, 2, 100, "window", "40", 0},
        {"fox-pro-tiny", 256, 2, 70, "qk_norm_shared", "1", 0},
        {"fox-pro-tiny", 128, 2, 100, "n_layer", "3", 0},
        {"fox-pro-tiny", 128, 2, 300, "window", "0", 40},
        {"fox-pro-tiny", 128, 1, 300, "window", "37", 60},
        {"transformer-llama-tiny", 128, 2, 200, "window", "0", 30},
        {"fox-llama-tiny", 128, 2, 260, "n_layer", "3", 90},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        FoxConfig c;
        test_config(&c, cases[i].preset, cases[i].n_embd, cases[i].n_head, cases[i].key, cases[i].value);
        FoxModel twin;
        twin_from_config(&twin, &c, 7 + i);
        int B = 2, T = cases[i].T, micro = 2, starts = 0;
        size_t n = (size_t)micro * B * T;
        int* inputs = (int*)malloc_check(n * sizeof(int), "tokens");
        int* targets = (int*)malloc_check(n * sizeof(int), "tokens");
        random_tokens(inputs, n, c.vocab_size, 100 + i);
        random_tokens(targets, n, c.vocab_size, 200 + i);
        for (int k = 0; cases[i].mean_len > 0 && k < micro; k++) {
            twin.doc_eot = c.vocab_size - 1;
            doc_tokens(inputs + (size_t)k * B * T, targets + (size_t)k * B * T, B, T, c.vocab_size, cases[i].mean_len,
                       1700 + 10 * i + k);
            for (int j = 0; j < B * T; j++) { starts += j % T > 0 && inputs[(size_t)k * B * T + j] == twin.doc_eot; }
        }
        char name[160], docs[48] = "";
        if (starts > 0) { snprintf(docs, sizeof(docs), ", documents (-f 1): %d starts", starts); }
        snprintf(name, sizeof(name), "%s C=%d hd=%d T=%d %s=%s%s", cases[i].preset, c.n_embd, c.n_embd / c.n_head,
                 cases[i].T, cases[i].key, cases[i].value, docs);
        gpu_vs_twin_batch(&twin, inputs, targets, B, T, micro, name);
        free(inputs); free(targets);
        fox_free(&twin);
    }
}

// a few GPU AdamW steps on one fixed batch; returns the losses in `losses`
static void gpu_train_steps(GPUModel* g, const int* inputs, const int* targets, int B, int T, int first, int n,
                            float* losses) {
    AdamWConfig opt = {1e-2f, 0.1f, 0.9f, 0.95f, 1e-8f, 1.0f};
    for (int s = first; s < first + n; s++) {
        gpu_zero_grad(g);
        gpu_forward_train(g, inputs, targets, B, T, 1.0f);
        gpu_backward(g);
        double norm = gpu_grad_norm(g);
        gpu_update(g, &opt, 1e-2f, s + 1, norm);
        losses[s - first] = g->mean_loss;
    }
}

// whether a flat buffer of g (the GPU's layout) holds the twin-layout host buffer h, bit for bit
static int gpu_same_as_twin(GPUModel* g, const float* d, const float* h) {
    size_t n = g->num_parameters;
    float* tmp = (float*)malloc_check(n * sizeof(float), "device copy");
    gpu_download(g, d, tmp);
    int same = memcmp(tmp, h, n * sizeof(float)) == 0;
    free(tmp);
    return same;
}

// -r 1 recomputes the element-wise and normalisation outputs in the backward with the
// forward's kernels on the inputs the forward kept, so the loss and every gradient must be
// bit-identical to -r 0. The presets switch each recomputed stage (k/v shift, QK-norm, RoPE,
// output norm and gate) on or off; with 2 layers, a layer whose recompute were missing would
// read the other layer's values from the shared slot. The activations must also shrink.
static void gpu_test_recompute(void) {
    const char* presets[] = {"fox-pro-tiny", "fox-llama-tiny", "transformer-pro-tiny", "transformer-llama-tiny"};
    for (int i = 0; i < 4; i++) {
        FoxConfig c;
        config_from_preset(&c, presets[i]);
        config_set(&c, "vocab_size", "500");
        c.mlp_hidden = derived_mlp_hidden(c.n_embd, c.block);
        int B = 2, T = 100;
        size_t N = (size_t)B * T;
        int* inputs = (int*)malloc_check(N * sizeof(int), "tokens");
        int* targets = (int*)malloc_check(N * sizeof(int), "tokens");
        random_tokens(inputs, N, c.vocab_size, 21);
        random_tokens(targets, N, c.vocab_size, 22);
        FoxModel h;
        twin_from_config(&h, &c, 9);
        size_t n = h.num_parameters, bytes[2];
        float* grads[2];
        float loss[2];
        for (int r = 0; r < 2; r++) {
            g_recompute = r;
            GPUModel g;
            gpu_build(&g, &h, B, T);
            gpu_poison(&g);
            gpu_zero_grad(&g);
            gpu_forward_train(&g, inputs, targets, B, T, 1.0f);
            gpu_backward(&g);
            grads[r] = (float*)malloc_check(n * sizeof(float), "gradients");
            gpu_download(&g, g.grads, grads[r]);
            loss[r] = g.mean_loss;
            bytes[r] = g.acts_bytes;
            gpu_free(&g);
        }
        g_recompute = 0;
        size_t bad = 0, nonzero = 0;
        for (size_t j = 0; j < n; j++) { bad += !isfinite(grads[0][j]); nonzero += grads[0][j] != 0.0f; }
        check(bad == 0 && nonzero > n / 2 && memcmp(grads[0], grads[1], n * sizeof(float)) == 0 && loss[0] == loss[1] &&
              bytes[1] < bytes[0],
              "gpu -r 1 %s: loss %.6f and all %zu gradients bit-identical to -r 0 (%zu non-finite, %zu non-zero); "
              "activations %.2f -> %.2f MiB", presets[i], loss[1], n, bad, nonzero, bytes[0] / 1048576.0,
              bytes[1] / 1048576.0);
        free(grads[0]); free(grads[1]); free(inputs); free(targets);
        fox_free(&h);
    }
}

// The bit-for-bit training tests' model and batches: fox-pro-125m with 2 layers (C = 768) and a
// vocabulary of 1000, 2 micro-batches of 4 x 256 (so the weight-gradient matmuls add onto non-zero
// gradients). bit_run_micro runs micro-batch k as gpu_forward_train + gpu_backward, or with graph as
// gpu_train_micro_step; bit_run_train 3 AdamW steps of them (the losses to loss[3]), with eval a
// forward at another shape after each step, as training's evaluation does.
typedef struct { FoxConfig c; int B, T, micro; int *inputs, *targets; } BitRun;

static void bit_run_init(BitRun* t) {
    config_from_preset(&t->c, "fox-pro-125m");
    config_set(&t->c, "n_layer", "2");
    config_set(&t->c, "vocab_size", "1000");
    t->B = 4; t->T = 256; t->micro = 2;
    size_t n = (size_t)t->micro * t->B * t->T;
    t->inputs = (int*)malloc_check(n * sizeof(int), "tokens");
    t->targets = (int*)malloc_check(n * sizeof(int), "tokens");
    random_tokens(t->inputs, n, t->c.vocab_size, 21);
    random_tokens(t->targets, n, t->c.vocab_size, 22);
}

static void bit_run_micro(const BitRun* t, GPUModel* g, int graph, int k, float loss_scale) {
    size_t N = (size_t)t->B * t->T;
    const int *in = t->inputs + k * N, *tg = t->targets + k * N;
    if (graph) {
        gpu_train_micro_step(g, in, tg, t->B, t->T, loss_scale);
    } else {
        gpu_forward_train(g, in, tg, t->B, t->T, loss_scale);
        gpu_backward(g);
    }
}

static void bit_run_train(const BitRun* t, GPUModel* g, int graph, int eval, float loss[3]) {
    AdamWConfig opt = {1e-2f, 0.1f, 0.9f, 0.95f, 1e-8f, 1.0f};
    for (int s = 0; s < 3; s++) {
        gpu_zero_grad(g);
        loss[s] = 0.0f;
        for (int k = 0; k < t->micro; k++) {
            bit_run_micro(t, g, graph, k, 1.0f / t->micro);
            loss[s] += g->mean_loss / t->micro;
        }
        gpu_update(g, &opt, 1e-2f, s + 1, gpu_grad_norm(g));
        if (eval) { gpu_forward(g, t->inputs, t->targets, 2, 100); }
    }
}

// gpu_train_micro_step with its CUDA graph gives the bits of gpu_forward_train + gpu_backward:
// bit_run_train's 3 steps with an evaluation forward between them (the first micro-step eager, the
// second captured, the other 4 replayed: 5 launches), with and without pruning tables (-A 1: the
// graph reads them by pointer) and activation recompute (-r 1), the same losses and weights. Then
// a new loss scale must re-key the graph (an eager micro-step, then a new capture), each with the
// eager path's gradients, and a pruning setting changed must drop it. With documents kept apart (-f 1,
// EOTs every 37 tokens: the graph reads the document starts uploaded with each batch) too.
static void gpu_test_step_graphs(void) {
    BitRun t;
    bit_run_init(&t);
    struct { int prune, recompute, docs; } runs[] = {{0, 0, 0}, {0, 1, 0}, {0, 1, 1}, {1, 0, 0}, {1, 1, 0}, {1, 1, 1}};
#ifndef ENABLE_FP32
    int nruns = 6; // the pruning tables are a bf16 feature
#else
    int nruns = 3;
#endif
    for (int ri = 0; ri < nruns; ri++) {
        int prune = runs[ri].prune, recompute = runs[ri].recompute, docs = runs[ri].docs;
        for (size_t j = 0; docs && j < (size_t)t.micro * t.B * t.T; j += 37) { t.inputs[j] = t.c.vocab_size - 1; }
        g_prune = prune;
        g_recompute = recompute;
        float loss[2][3];
        FoxModel h[2];
        GPUModel g[2];
        for (int r = 0; r < 2; r++) {
            twin_from_config(&h[r], &t.c, 7);
            h[r].doc_eot = docs ? t.c.vocab_size - 1 : -1;
            gpu_build(&g[r], &h[r], t.B, t.T);
            bit_run_train(&t, &g[r], r, 1, loss[r]);
        }
        StepGraph* sg = &g[1].step_graph;
        long launches = sg->launches;
        gpu_params_to_host(&g[1]);
        int same = memcmp(loss[0], loss[1], sizeof(loss[0])) == 0 &&
                   gpu_same_as_twin(&g[0], g[0].params, h[1].params_memory);
        check(same && sg->state == 2 && launches == 5 && isfinite(loss[1][2]),
              "gpu CUDA graph of the micro-step (pruning %d, recompute %d, documents %d): %ld launches (5), the "
              "same losses and weights bit for bit as without it over 3 steps of 2 micro-batches: %s (last loss "
              "%.6f)", prune, recompute, docs, launches, same ? "yes" : "no", loss[1][2]);
        size_t n = h[0].num_parameters;
        float* grads[2] = {(float*)malloc_check(n * sizeof(float), "gradients"),
                           (float*)malloc_check(n * sizeof(float), "gradients")};
        int rekeyed = 1;
        for (int rep = 0; rep < 2; rep++) { // the loss scale 0.25: eager, then captured
            for (int r = 0; r < 2; r++) {
                gpu_zero_grad(&g[r]);
                bit_run_micro(&t, &g[r], r, 0, 0.25f);
                gpu_download(&g[r], g[r].grads, grads[r]);
            }
            rekeyed &= memcmp(grads[0], grads[1], n * sizeof(float)) == 0 && sg->state == 1 + rep;
        }
        attention_set_pruning(prune, -10.0);
        bit_run_micro(&t, &g[1], 1, 0, 0.25f);
        check(rekeyed && sg->state == 1, "gpu CUDA graph (pruning %d, recompute %d, documents %d): a new loss "
              "scale runs eagerly, then captures, with the gradients of the eager path; a pruning setting drops "
              "it", prune, recompute, docs);
        free(grads[0]); free(grads[1]);
        for (int r = 0; r < 2; r++) { gpu_free(&g[r]); fox_free(&h[r]); }
    }
    g_prune = 0;
    g_recompute = 0;
    free(t.inputs); free(t.targets);
}

// -X 1 changes the speed, never the bits: bit_run_train's 3 steps with the heuristic's first
// algorithms and with tuned plans (each keeping the LAST candidate that qualifies, so as many plans
// as possible run another algorithm) give the same losses and weights bit for bit; at least one plan
// must have changed, or the test would prove nothing. The digest that decides "the same bits" must
// tell a one-bit change apart.
static void gpu_test_matmul_tuning(void) {
    BitRun t;
    bit_run_init(&t);
    float loss[2][3];
    FoxModel h[2];
    GPUModel g[2];
    int changed = 0;
    for (int r = 0; r < 2; r++) {
        matmul_plans_drop(0);
        twin_from_config(&h[r], &t.c, 7);
        gpu_build(&g[r], &h[r], t.B, t.T);
        if (r == 1) {
            test_hooks.tune_last = 1;
            gpu_tune_matmuls(&g[r], t.B, t.T);
            test_hooks.tune_last = 0;
            for (int i = 0; i < g_num_plans; i++) {
                changed += memcmp(&g_plans[i].algo, &g_plans[i].cand[0], sizeof(g_plans[i].algo)) != 0;
            }
        }
        bit_run_train(&t, &g[r], 0, 0, loss[r]);
    }
    gpu_params_to_host(&g[1]);
    int same = memcmp(loss[0], loss[1], sizeof(loss[0])) == 0 &&
               gpu_same_as_twin(&g[0], g[0].params, h[1].params_memory);
    check(same && changed > 0, "gpu matmul tuning: %d plans on another cuBLASLt algorithm, the same losses and weights "
          "bit for bit as untuned over 3 steps of 2 micro-batches: %s (last loss %.6f)", changed, same ? "yes" : "no",
          loss[1][2]);
    size_t bytes = h[0].num_parameters * 2; // half the fp32 weights' bytes
    unsigned long long d0 = digest_gpu(g[0].params, bytes), d1 = digest_gpu(g[0].params, bytes);
    uint32_t word;
    cudaCheck(cudaMemcpy(&word, g[0].params, 4, cudaMemcpyDeviceToHost));
    word ^= 1u << 7;
    cudaCheck(cudaMemcpy(g[0].params, &word, 4, cudaMemcpyHostToDevice));
    unsigned long long d2 = digest_gpu(g[0].params, bytes);
    check(d0 == d1 && d0 != d2, "gpu matmul tuning: the digest is the same twice (%016llx) and changes with one bit "
          "(%016llx)", d0, d2);
    matmul_plans_drop(0);
    for (int r = 0; r < 2; r++) { gpu_free(&g[r]); fox_free(&h[r]); }
    free(t.inputs); free(t.targets);
}

// Determinism, checkpoints in both directions, and an exact resume.
static void gpu_test_checkpoints_and_determinism(void) {
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    config_set(&c, "vocab_size", "500");
    c.mlp_hidden = derived_mlp_hidden(c.n_embd, c.block);
    int B = 2, T = 100;
    size_t N = (size_t)B * T;
    int* inputs = (int*)malloc_check(N * sizeof(int), "tokens");
    int* targets = (int*)malloc_check(N * sizeof(int), "tokens");
    random_tokens(inputs, N, c.vocab_size, 11);
    random_tokens(targets, N, c.vocab_size, 12);
    char dir[] = "/tmp/test_fox_gpu_XXXXXX";
    if (mkdtemp(dir) == NULL) { check(0, "gpu checkpoints: could not make a temporary directory"); return; }

    // same seed, same bits: two runs of 6 steps
    float run1[6], run2[6];
    FoxModel h1, h2;
    twin_from_config(&h1, &c, 5);
    twin_from_config(&h2, &c, 5);
    GPUModel g1, g2;
    gpu_build(&g1, &h1, B, T);
    gpu_build(&g2, &h2, B, T);
    gpu_train_steps(&g1, inputs, targets, B, T, 0, 6, run1);
    gpu_train_steps(&g2, inputs, targets, B, T, 0, 6, run2);
    gpu_params_to_host(&g2);
    check(memcmp(run1, run2, sizeof(run1)) == 0 &&
              gpu_same_as_twin(&g1, g1.params, h2.params_memory),
          "gpu: two runs with the same seed give bit-identical losses and weights (last loss %.6f, first %.6f)",
          run1[5], run1[0]);
    gpu_free(&g2);
    fox_free(&h2);

    // GPU writes after 3 steps, the twin reads: the same weights and moments, bit for bit
    FoxModel h3;
    twin_from_config(&h3, &c, 5);
    GPUModel g3;
    gpu_build(&g3, &h3, B, T);
    float first3[3], rest3[3];
    gpu_train_steps(&g3, inputs, targets, B, T, 0, 3, first3);
    TrainState saved = {3, 0, 0, 0, 1, B, T, 0, 1, 0, (int64_t)B * T, 3ll * B * T};
    gpu_save_checkpoint(&g3, dir, &saved);
    char model_path[4096], state_path[4096];
    checkpoint_paths(dir, 3, model_path, state_path, sizeof(model_path));
    FoxModel cpu;
    load_model(&cpu, model_path);
    TrainState st;
    load_state(&cpu, &st, state_path);
    check(st.step == 3 && cpu.num_parameters == g3.num_parameters &&
          gpu_same_as_twin(&g3, g3.params, cpu.params_memory) &&
          gpu_same_as_twin(&g3, g3.adam_m, cpu.m_memory) &&
          gpu_same_as_twin(&g3, g3.adam_v, cpu.v_memory),
          "gpu checkpoint -> twin: %zu weights and both AdamW moments load bit-identical", cpu.num_parameters);

    // resume on the GPU from that checkpoint: steps 4..6 equal the uninterrupted run's
    GPUModel g4;
    gpu_build(&g4, &cpu, B, T);
    gpu_state_from_host(&g4);
    gpu_train_steps(&g4, inputs, targets, B, T, 3, 3, rest3);
    check(memcmp(rest3, run1 + 3, sizeof(rest3)) == 0 && memcmp(first3, run1, sizeof(first3)) == 0,
          "gpu: resuming from the checkpoint continues bit-exactly (step 6 loss %.6f vs %.6f)", rest3[2], run1[5]);
    gpu_free(&g4);
    gpu_free(&g3);
    fox_free(&h3);

    // the twin writes after 2 CPU steps, the GPU reads: same weights, and the same loss
    AdamWConfig opt = {1e-2f, 0.1f, 0.9f, 0.95f, 1e-8f, 1.0f};
    for (int s = 0; s < 2; s++) {
        fox_forward(&cpu, inputs, targets, B, T);
        fox_zero_grad(&cpu);
        fox_backward(&cpu, 1.0f);
        fox_clip_grads(&cpu, fox_grad_norm(&cpu), 1.0f);
        fox_update(&cpu, &opt, 1e-2f, 4 + s);
    }
    TrainState st2 = {5, 0, 0, 0, 1, B, T, 0, 1, 0, (int64_t)B * T, 5ll * B * T};
    checkpoint_paths(dir, 5, model_path, state_path, sizeof(model_path));
    save_model(&cpu, model_path);
    save_state(&cpu, &st2, state_path);
    FoxModel loaded;
    load_model(&loaded, model_path);
    load_state(&loaded, &st2, state_path);
    GPUModel g5;
    gpu_build(&g5, &loaded, B, T);
    gpu_state_from_host(&g5);
    int same = gpu_same_as_twin(&g5, g5.params, cpu.params_memory) &&
               gpu_same_as_twin(&g5, g5.adam_m, cpu.m_memory) &&
               gpu_same_as_twin(&g5, g5.adam_v, cpu.v_memory);
    fox_forward(&cpu, inputs, targets, B, T);
    gpu_forward(&g5, inputs, targets, B, T);
    double el = fabs((double)g5.mean_loss - cpu.mean_loss) / cpu.mean_loss;
    check(same && el <= GTOL_LOSS, "twin checkpoint -> gpu: weights and moments bit-identical, loss %.6f vs twin %.6f "
          "(rel err %.1e <= %.0e)", g5.mean_loss, cpu.mean_loss, el, GTOL_LOSS);
    gpu_free(&g5);
    fox_free(&loaded);
    fox_free(&cpu);
    gpu_free(&g1);
    fox_free(&h1);
    free(inputs); free(targets);
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) { printf("      (could not remove %s)\n", dir); }
}

// whether the device buffer `by_range` (opt's ranges one after another, as the moments; or, with
// in_layout, a flat buffer) equals the flat buffer `ref` on g's optimizer ranges
static int gpu_opt_ranges_match(GPUModel* g, const float* by_range, int in_layout, const float* ref) {
    int same = 1;
    for (int r = 0; r < g->opt.count; r++) {
        Range rg = g->opt.host[r];
        float* a = (float*)malloc_check(rg.n * sizeof(float), "range");
        float* b = (float*)malloc_check(rg.n * sizeof(float), "range");
        cudaCheck(cudaMemcpy(a, by_range + (in_layout ? rg.lo : rg.v), rg.n * sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(b, ref + rg.lo, rg.n * sizeof(float), cudaMemcpyDeviceToHost));
        same &= memcmp(a, b, rg.n * sizeof(float)) == 0;
        free(a); free(b);
    }
    return same;
}

// whether a flat buffer of g (its layout) holds zeros outside the tensors' slices, bit for bit
static int gpu_padding_zero(GPUModel* g, const float* dev) {
    size_t n = g->layout.size;
    uint32_t* bits = (uint32_t*)malloc_check(n * sizeof(uint32_t), "device copy");
    unsigned char* used = (unsigned char*)calloc_check(n, 1, "layout map");
    cudaCheck(cudaMemcpy(bits, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        const ParamSpec* s = &g->host->spec[t];
        for (int l = 0; l < (s->per_layer ? g->config.n_layer : 1); l++) {
            memset(used + slice_offset(g, t, l), 1, param_slice_numel(s));
        }
    }
    int zero = 1;
    for (size_t i = 0; i < n; i++) { zero &= used[i] || bits[i] == 0; }
    free(bits); free(used);
    return zero;
}

// ZeRO-1 slices without a communicator: "ranks" of fake worlds of 2 and 3 run AdamW on their
// shares of one process's gradients (copied into their own layouts, whose buckets are padded
// for their world); over 3 steps their shares of the weights and moments must equal the one
// process's bit for bit (the all-gather is a copy), and a checkpoint's moments must load into
// each share
static void gpu_test_zero_slices(void) {
    FoxConfig c;
    config_from_preset(&c, "fox-pro-tiny");
    config_set(&c, "vocab_size", "500");
    c.n_layer = 3; c.n_embd = 160; c.n_head = 5;
    c.mlp_hidden = derived_mlp_hidden(c.n_embd, c.block);
    int B = 2, T = 64;
    size_t N = (size_t)B * T;
    int* inputs = (int*)malloc_check(N * sizeof(int), "tokens");
    int* targets = (int*)malloc_check(N * sizeof(int), "tokens");
    random_tokens(inputs, N, c.vocab_size, 21);
    random_tokens(targets, N, c.vocab_size, 22);
    FoxModel host;
    twin_from_config(&host, &c, 9);
    GPUModel full;
    gpu_build(&full, &host, B, T);
    size_t np = full.num_parameters;
    enum { RANKS = 5 }; // world 2: ranks 0-1, world 3: ranks 0-2
    Dist fake[RANKS];
    FoxModel hosts[RANKS];
    GPUModel part[RANKS];
    for (int i = 0; i < RANKS; i++) {
        fake[i] = g_single_process;
        fake[i].world = i < 2 ? 2 : 3;
        fake[i].rank = i < 2 ? i : i - 2;
        fake[i].zero_stage = 1;
        twin_from_config(&hosts[i], &c, 9);
        gpu_build_dist(&part[i], &hosts[i], B, T, &fake[i]);
    }
    float* grads = (float*)malloc_check(np * sizeof(float), "gradients");
    float* weights = (float*)malloc_check(np * sizeof(float), "weights");
    float* m = (float*)malloc_check(np * sizeof(float), "moments");
    float* v = (float*)malloc_check(np * sizeof(float), "moments");
    AdamWConfig opt = {1e-2f, 0.1f, 0.9f, 0.95f, 1e-8f, 1.0f};
    int same = 1;
    for (int s = 0; s < 3; s++) {
        gpu_zero_grad(&full);
        gpu_forward_train(&full, inputs, targets, B, T, 1.0f);
        gpu_backward(&full);
        double norm = gpu_grad_norm(&full);
        gpu_download(&full, full.grads, grads);
        for (int i = 0; i < RANKS; i++) {
            gpu_upload(&part[i], grads, part[i].grads);
            gpu_adamw(&part[i], &opt, 1e-2f, s + 1, norm);
        }
        gpu_update(&full, &opt, 1e-2f, s + 1, norm);
        gpu_download(&full, full.params, weights);
        gpu_download(&full, full.adam_m, m);
        gpu_download(&full, full.adam_v, v);
        for (int i = 0; i < RANKS; i++) { // the one process's values into the share's layout (its gradient buffer)
            gpu_upload(&part[i], weights, part[i].grads);
            same &= gpu_opt_ranges_match(&part[i], part[i].params, 1, part[i].grads);
            gpu_upload(&part[i], m, part[i].grads);
            same &= gpu_opt_ranges_match(&part[i], part[i].adam_m, 0, part[i].grads);
            gpu_upload(&part[i], v, part[i].grads);
            same &= gpu_opt_ranges_match(&part[i], part[i].adam_v, 0, part[i].grads);
            gpu_upload(&part[i], weights, part[i].params);
        }
    }
    same &= gpu_padding_zero(&full, full.params) && gpu_padding_zero(&full, full.grads) &&
            gpu_padding_zero(&part[2], part[2].params);
    check(same && part[0].opt.count == NUM_BUCKETS, "gpu ZeRO-1 slices: worlds of 2 and 3 (%zu parameters, padded "
          "to %zu and %zu) update their shares of %d buckets bit-identical to one process over 3 steps, the padding "
          "zeros", np,
          part[0].layout.size, part[2].layout.size, part[0].opt.count);
    gpu_state_to_host(&full); // host now holds the weights and moments after 3 steps
    int loads = 1;
    for (int i = 2; i < RANKS; i++) {
        GPUModel resumed;
        gpu_build_dist(&resumed, &host, B, T, &fake[i]);
        gpu_state_from_host(&resumed);
        loads &= gpu_same_as_twin(&resumed, resumed.params, host.params_memory);
        gpu_upload(&resumed, host.m_memory, resumed.grads);
        loads &= gpu_opt_ranges_match(&resumed, resumed.adam_m, 0, resumed.grads);
        gpu_upload(&resumed, host.v_memory, resumed.grads);
        loads &= gpu_opt_ranges_match(&resumed, resumed.adam_v, 0, resumed.grads);
        gpu_free(&resumed);
    }
    check(loads, "gpu ZeRO-1 slices: a checkpoint's moments load into each rank's share of a world of 3");
    for (int i = 0; i < RANKS; i++) { gpu_free(&part[i]); fox_free(&hosts[i]); }
    gpu_free(&full);
    fox_free(&host);
    free(grads); free(weights); free(m); free(v); free(inputs); free(targets);
}

// ----------------------------------------------------------------------------
// The attention kernels alone (attention_forward_gpu / attention_backward_gpu: the fused
// kernels at head sizes 64 and 128 in the bf16 build, the simple kernel otherwise) against the
// twin's attention_forward / attention_backward on the same (bf16-rounded) inputs.
//
// Two measures per tensor: relative L2, ||gpu - ref|| / ||ref||, and max |gpu - ref| / max |ref|
// (a wrong row at a tile edge hides in the L2 norm, not in the max). The inputs are N(0, 1), so
// outputs are O(0.1-1) unless they cancel: with one visible key per row (T = 1, window 1) dq, dk
// and dlogf are exactly 0 (dS = dP - Delta with o = v) and both sides return rounding noise of
// terms of size |dO| |v| ~ 8. So the L2 measure's denominator is at least 1e-2 rms and the max
// measure's at least 1e-1 (the largest of many values is a few rms): absolute there.
// - bf16: the outputs are rounded to bf16 (2^-9 relative at most, ~1e-3 rms) and P, dS are
//   rounded to bf16 before the second matmuls (as much again); Delta comes from the bf16 o.
//   dev/cuda measured at most 3.4e-3 relative L2 against fp64, here up to 5.8e-3 (dq, dk with
//   the strongest gate) against the fp32 twin, so L2 1e-2;
//   the max measure sees the largest of many roundings of a sum: 5e-2. An indexing or mask
//   error gives O(1) on the rows it touches. lse is fp32 from exact bf16 products: 1e-3 abs.
//   d(log f) is summed from the fp32 dS, never rounded to bf16, and the twin's backward reads the
//   GPU's stored o (attn_reference), so only fp32 summation orders and ex2.approx differ:
//   measured <= 1.1e-5 (L2 and max), so 1e-3 for it, where an O(1e-2) tolerance would hide a
//   wrong column sum.
// - fp32: both sides fp32, different summation orders: 1e-4 (L2 and max; measured <= 2e-6,
//   and up to 4e-6 absolute in the one-key cases, the noise of dP - Delta), lse 1e-5 abs.
// ATOL_L2, ATOL_MAX and ATOL_DLOGF bound relative errors (relative L2, max |err| / max |ref|: attn_error);
// ATOL_LSE is absolute.
#ifdef ENABLE_FP32
#define ATOL_L2 1e-4
#define ATOL_MAX 1e-4
#define ATOL_DLOGF 1e-4
#define ATOL_LSE 1e-5
#else
#define ATOL_L2 1e-2
#define ATOL_MAX 5e-2
#define ATOL_DLOGF 1e-3
#define ATOL_LSE 1e-3
#endif

typedef struct { double l2, max; } AttnErr;

static AttnErr attn_error(const float* a, const float* ref, size_t n) {
    double num = 0.0, den = 0.0, mx = 0.0, ref_max = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)ref[i]);
        if (isnan(d)) { d = INFINITY; }
        num += d * d;
        den += (double)ref[i] * ref[i];
        mx = fmax(mx, d);
        ref_max = fmax(ref_max, fabs((double)ref[i]));
    }
    AttnErr e = {sqrt(num) / fmax(sqrt(den), 1e-2 * sqrt((double)n)), mx / fmax(ref_max, 1e-1)};
    return e;
}

static const char* attention_kernel_name(int hd) {
#ifdef ENABLE_FP32
    (void)hd;
    return "simple kernel";
#else
    return attention_fused(hd) ? "fused kernel" : "simple kernel";
#endif
}

static int attn_ok(AttnErr e) { return e.l2 <= ATOL_L2 && e.max <= ATOL_MAX; }

// n floatX values from the device as floats
static void attn_download(float* out, const floatX* d, size_t n) {
    floatX* tmp = (floatX*)malloc_check(n * sizeof(floatX), "attention download");
    cudaCheck(cudaMemcpy(tmp, d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) { out[i] = to_float(tmp[i]); }
    free(tmp);
}

static floatX* attn_upload(const float* h, size_t n) {
    floatX* tmp = (floatX*)malloc_check(n * sizeof(floatX), "attention upload");
    for (size_t i = 0; i < n; i++) { tmp[i] = to_floatX(h[i]); }
    floatX* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    cudaCheck(cudaMemcpy(d, tmp, n * sizeof(floatX), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

typedef struct {
    int B, T, H, hd, window, gate;
    float *q, *k, *v, *dout, *c;                        // inputs, floatX-rounded, c fp32 (B, H, T)
    float *o, *lse, *dq, *dk, *dv, *dlogf;              // GPU results
    float *o_ref, *lse_ref, *dq_ref, *dk_ref, *dv_ref, *dlogf_ref;  // twin
    int* doc;                                           // documents kept apart (attn_case_documents), or NULL
} AttnCase;

static float* attn_buf(size_t n) { return (float*)calloc_check(n, sizeof(float), "attention test"); }

// random inputs (N(0, 1), rounded to floatX); log f_t = -rate_h U(0.5, 1.5) with the rate
// log-spaced over the heads from 1e-2 (c nearly flat) to 3 (a few keys visible)
static void attn_case_init(AttnCase* t, int B, int T, int H, int hd, int window, int gate, uint64_t seed) {
    memset(t, 0, sizeof(*t));
    t->B = B; t->T = T; t->H = H; t->hd = hd; t->window = window; t->gate = gate;
    size_t n = (size_t)B * T * H * hd, nh = (size_t)B * H * T;
    float** x[] = {&t->q, &t->k, &t->v, &t->dout, &t->o, &t->dq, &t->dk, &t->dv,
                   &t->o_ref, &t->dq_ref, &t->dk_ref, &t->dv_ref};
    for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++) { *x[i] = attn_buf(n); }
    float** y[] = {&t->c, &t->lse, &t->dlogf, &t->lse_ref, &t->dlogf_ref};
    for (size_t i = 0; i < sizeof(y) / sizeof(y[0]); i++) { *y[i] = attn_buf(nh); }
    uint64_t s = seed;
    float* in[] = {t->q, t->k, t->v, t->dout};
    for (int a = 0; a < 4; a++) {
        for (size_t i = 0; i < n; i++) { in[a][i] = to_float(to_floatX((float)rng_normal(&s))); }
    }
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            double rate = H > 1 ? 1e-2 * pow(300.0, (double)h / (H - 1)) : 0.3;
            float acc = 0.0f;
            for (int tt = 0; tt < T; tt++) {
                acc += (float)(-rate * (0.5 + rng_uniform(&s)));
                t->c[((size_t)b * H + h) * T + tt] = acc;
            }
        }
    }
}

static void attn_case_free(AttnCase* t) {
    float* all[] = {t->q, t->k, t->v, t->dout, t->c, t->o, t->lse, t->dq, t->dk, t->dv, t->dlogf,
                    t->o_ref, t->lse_ref, t->dq_ref, t->dk_ref, t->dv_ref, t->dlogf_ref};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) { free(all[i]); }
    free(t->doc);
}

static void attn_case_documents(AttnCase* t, int mean_len, int span, uint64_t seed) {
    t->doc = doc_layout(t->B, t->T, mean_len, span, seed);
}

// the twin's forward and backward at `window`, pruned by pr (NULL: dense); dlogf by the reverse
// cumulative sum of dc (fp64). Runs after attn_gpu: the twin's backward reads the O the GPU's forward
// stored (t->o; its own O is checked as o_ref), as the GPU's backward does. D_i = dO_i . O_i enters
// every dS of row i, and where attention is concentrated dlogf is a small sum of large dS of both
// signs: in gpu attention rescale's gated case one bf16 rounding of O moves the twin's dlogf by
// 2.9% (relative L2) while the twin itself is within 1.1e-3 of an fp64 evaluation.
static void attn_reference(AttnCase* t, int window, const AttnPrune* pr) {
    int B = t->B, T = t->T, H = t->H, hd = t->hd;
    size_t n = (size_t)B * T * H * hd, nh = (size_t)B * H * T;
    const float* c = t->gate ? t->c : NULL;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    float* scratch = attn_buf((size_t)threads * 2 * T);
    float* dc = attn_buf(nh);
    attention_forward(t->o_ref, t->lse_ref, t->q, t->k, t->v, c, t->doc, B, T, H, hd, window, pr, scratch);
    memset(t->dq_ref, 0, n * sizeof(float));
    memset(t->dk_ref, 0, n * sizeof(float));
    memset(t->dv_ref, 0, n * sizeof(float));
    attention_backward(t->dq_ref, t->dk_ref, t->dv_ref, dc, t->dout, t->q, t->k, t->v, t->o, t->lse_ref, c, t->doc, B,
                       T, H, hd, window, pr);
    for (size_t bh = 0; bh < (size_t)B * H; bh++) { // with documents: per document, 0 at a start t0 > 0 (the twin's)
        const int* db = t->doc != NULL ? t->doc + bh / H * T : NULL;
        double acc = 0.0;
        for (int tt = T - 1; tt >= 0; tt--) {
            if (db != NULL && tt + 1 < T && db[tt + 1] == tt + 1) { acc = 0.0; }
            acc += dc[bh * T + tt];
            int start = db != NULL && tt > 0 && db[tt] == tt;
            t->dlogf_ref[bh * T + tt] = t->gate && !start ? (float)acc : 0.0f;
        }
    }
    free(dc); free(scratch);
}

// the GPU forward and backward, every output poisoned with NaN first
static void attn_gpu(AttnCase* t) {
    int B = t->B, T = t->T, H = t->H, hd = t->hd;
    size_t n = (size_t)B * T * H * hd, nh = (size_t)B * H * T;
    floatX *q = attn_upload(t->q, n), *k = attn_upload(t->k, n), *v = attn_upload(t->v, n),
           *dout = attn_upload(t->dout, n);
    floatX *o, *dq, *dk, *dv;
    float *c = NULL, *lse, *dlogf, *scratch;
    int* doc = NULL;
    FoxDocs fd;
    if (t->doc != NULL) {
        cudaCheck(cudaMalloc(&doc, 2 * (size_t)B * T * sizeof(int)));
        cudaCheck(cudaMemcpy(doc, t->doc, 2 * (size_t)B * T * sizeof(int), cudaMemcpyHostToDevice));
        fd.start = doc;
        fd.end = doc + (size_t)B * T;
    }
    const FoxDocs* docs = t->doc != NULL ? &fd : NULL;
    cudaCheck(cudaMalloc(&o, n * sizeof(floatX))); cudaCheck(cudaMalloc(&dq, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dk, n * sizeof(floatX))); cudaCheck(cudaMalloc(&dv, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&lse, nh * sizeof(float))); cudaCheck(cudaMalloc(&dlogf, nh * sizeof(float)));
    cudaCheck(cudaMalloc(&scratch, 3 * nh * sizeof(float)));
    if (t->gate) {
        cudaCheck(cudaMalloc(&c, nh * sizeof(float)));
        cudaCheck(cudaMemcpy(c, t->c, nh * sizeof(float), cudaMemcpyHostToDevice));
    }
    cudaCheck(cudaMemset(o, 0xFF, n * sizeof(floatX))); cudaCheck(cudaMemset(lse, 0xFF, nh * sizeof(float)));
    cudaCheck(cudaMemset(dq, 0xFF, n * sizeof(floatX))); cudaCheck(cudaMemset(dk, 0xFF, n * sizeof(floatX)));
    cudaCheck(cudaMemset(dv, 0xFF, n * sizeof(floatX))); cudaCheck(cudaMemset(dlogf, 0xFF, nh * sizeof(float)));
    cudaCheck(cudaMemset(scratch, 0xFF, 3 * nh * sizeof(float)));
    attention_forward_gpu(o, lse, q, k, v, c, B, T, H, hd, t->window, docs);
    attention_backward_gpu(dq, dk, dv, dlogf, scratch, dout, q, k, v, o, lse, c, B, T, H, hd, t->window, 0, docs);
    cudaCheck(cudaDeviceSynchronize());
    attn_download(t->o, o, n); attn_download(t->dq, dq, n); attn_download(t->dk, dk, n); attn_download(t->dv, dv, n);
    cudaCheck(cudaMemcpy(t->lse, lse, nh * sizeof(float), cudaMemcpyDeviceToHost));
    if (t->gate) { cudaCheck(cudaMemcpy(t->dlogf, dlogf, nh * sizeof(float), cudaMemcpyDeviceToHost)); }
    void* bufs[] = {q, k, v, dout, o, dq, dk, dv, c, lse, dlogf, scratch, doc};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { cudaCheck(cudaFree(bufs[i])); }
}

// compares every output; returns 1 when all are within tolerance, and the report in `line`
static int attn_compare(const AttnCase* t, char* line, size_t len) {
    size_t n = (size_t)t->B * t->T * t->H * t->hd, nh = (size_t)t->B * t->H * t->T;
    const float* got[] = {t->o, t->dq, t->dk, t->dv, t->dlogf};
    const float* ref[] = {t->o_ref, t->dq_ref, t->dk_ref, t->dv_ref, t->dlogf_ref};
    const char* names[] = {"o", "dq", "dk", "dv", "dlogf"};
    int ok = 1, outputs = t->gate ? 5 : 4;
    size_t used = 0;
    for (int i = 0; i < outputs; i++) {
        AttnErr e = attn_error(got[i], ref[i], i == 4 ? nh : n);
        ok = ok && (i == 4 ? e.l2 <= ATOL_DLOGF && e.max <= ATOL_DLOGF : attn_ok(e));
        used += (size_t)snprintf(line + used, len - used, "%s %.1e/%.1e ", names[i], e.l2, e.max);
    }
    double lse_err = 0.0, dlogf_max = 0.0;
    for (size_t i = 0; i < nh; i++) {
        double d = fabs((double)t->lse[i] - t->lse_ref[i]);
        lse_err = isnan(d) ? INFINITY : fmax(lse_err, d);
        dlogf_max = fmax(dlogf_max, fabs((double)t->dlogf_ref[i]));
    }
    ok = ok && lse_err <= ATOL_LSE;
    used += (size_t)snprintf(line + used, len - used, "lse %.1e abs", lse_err);
    if (t->gate && t->T > 1) { // c_0 cancels in every row: dlogf_0 = 0 for every (b, h)
        double d0 = 0.0;
        for (int bh = 0; bh < t->B * t->H; bh++) { d0 = fmax(d0, fabs((double)t->dlogf[(size_t)bh * t->T])); }
        d0 = isnan(d0) ? INFINITY : d0 / fmax(dlogf_max, 1e-30);
        ok = ok && d0 <= 1e-4;
        used += (size_t)snprintf(line + used, len - used, ", dlogf_0 %.1e of max", d0);
    }
    if (t->gate && t->doc != NULL) { // a document start t0 > 0: its gate c does not hold, dlogf_t0 = 0 exactly
        int nonzero = 0;
        for (size_t i = 0; i < nh; i++) {
            int tt = (int)(i % t->T);
            const int* db = t->doc + i / ((size_t)t->H * t->T) * t->T;
            nonzero += tt > 0 && db[tt] == tt && t->dlogf[i] != 0.0f;
        }
        ok = ok && nonzero == 0;
        snprintf(line + used, len - used, ", dlogf at the starts: %d not 0", nonzero);
    }
    return ok;
}

// The fused forward moves a row's running maximum after the first key tile it reads (the diagonal
// one) only when an older tile holds a logit more than 8 higher (log2 units): random inputs never
// get there. Here keys 0..7 get a large component along the queries' first coordinate, so the rows
// of the last query tiles find their maximum in key tile 0, two tiles back, and the forward must
// rescale O there. The setup checks that row T - 1's gap over tiles 1 and 2 is above 8.
static void gpu_test_attention_rescale(void) {
    struct { int H, hd, gate; } cases[] = {{2, 64, 0}, {2, 64, 1}, {1, 128, 0}};
    char line[512];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        AttnCase t;
        int T = 300, H = cases[i].H, hd = cases[i].hd;
        attn_case_init(&t, 1, T, H, hd, 0, cases[i].gate, 91 + i);
        for (int tt = 0; tt < T; tt++) {
            for (int h = 0; h < H; h++) {
                t.q[((size_t)tt * H + h) * hd] = 7.0f;
                if (tt < 8) { t.k[((size_t)tt * H + h) * hd] = 16.0f; }
            }
        }
        // gap of row T - 1: max over keys 0..7 less max over the key tiles read before key tile 0
        // (keys 128..T-1 of 128-key tiles, from the diagonal back), log2 units
        double gap = -INFINITY;
        for (int h = 0; h < H; h++) {
            const float* qi = t.q + ((size_t)(T - 1) * H + h) * hd;
            const float* c = t.c + (size_t)h * T;
            double far = -INFINITY, near = -INFINITY;
            for (int j = 0; j < T; j++) {
                const float* kj = t.k + ((size_t)j * H + h) * hd;
                double x = 0.0;
                for (int d = 0; d < hd; d++) { x += (double)qi[d] * kj[d]; }
                x = x / sqrt((double)hd) + (t.gate ? (double)c[T - 1] - c[j] : 0.0);
                if (j < 8) { far = fmax(far, x); }
                if (j >= 128) { near = fmax(near, x); }
            }
            gap = fmax(gap, (far - near) / log(2.0));
        }
        attn_gpu(&t);
        attn_reference(&t, t.window, NULL);
        int ok = attn_compare(&t, line, sizeof(line));
        check(ok && gap > 8.0, "gpu attention rescale B=1 T=%d H=%d hd=%d gate %s (row %d's maximum %.1f above key "
              "tiles 1-2's, must be > 8): %s", T, H, hd, t.gate ? "on" : "none", T - 1, gap, line);
        attn_case_free(&t);
    }
}

// The attention kernels against the twin's attention on the same inputs. The cases with mean_len > 0 keep documents
// apart (doc_layout: random starts, a one-position and a two-position document, a lone EOT at the end; span: one
// document across tiles), the twin with the same document starts, at the same tolerances (the documents change which
// keys a row sees, not the arithmetic of a logit); c is the plain running sum the GPU's gate gives (within a document
// its differences are the twin's). The fused kernels get the documents' tables (-A 0: no decay bound) and mask inside
// tiles; dlogf is 0 at every start t0 > 0 exactly (attn_compare). Each of them has its negative control: the same GPU
// outputs against the twin without documents must fail.
static void gpu_test_attention(void) {
    struct { int B, T, H, hd, window, gate, mean_len, span; } cases[] = {
        {1, 1, 1, 64, 0, 1, 0, 0},     // one token
        {2, 70, 3, 64, 0, 1, 0, 0},    // B, H > 1; T not a tile multiple
        {1, 197, 2, 128, 0, 1, 0, 0},
        {2, 197, 2, 64, 37, 1, 0, 0},  // sliding window
        {1, 130, 2, 128, 1, 1, 0, 0},  // window 1: the diagonal only
        {1, 300, 2, 64, 0, 1, 0, 0},   // several tiles of every kernel
        {1, 256, 2, 128, 100, 1, 0, 0},
        {2, 70, 2, 64, 0, 0, 0, 0},    // gate none (c == NULL)
        {1, 197, 2, 128, 37, 0, 0, 0},
        {1, 70, 2, 16, 0, 1, 0, 0},    // head size 16: the simple kernel in both builds
        {2, 300, 2, 64, 0, 1, 40, 0},     // documents: several a tile
        {1, 1100, 4, 128, 0, 1, 300, 400}, // across tiles
        {2, 197, 2, 64, 37, 1, 30, 0},    // with a sliding window
        {1, 130, 2, 128, 3, 1, 5, 0},
        {2, 300, 2, 64, 0, 0, 40, 0},     // gate none: a key mask
        {1, 197, 2, 128, 37, 0, 50, 100},
        {2, 300, 3, 64, 0, 1, 2, 0},      // mostly one- and two-position documents
        {1, 70, 2, 16, 0, 1, 10, 0},      // the simple kernel
        {2, 100, 2, 16, 9, 1, 12, 0},
    };
    char line[512];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
#ifndef ENABLE_FP32
        // the persistent forward also on 1 and 5 blocks: a block's rings and Q then cross pairs
        int caps[] = {0, 1, 5}, ncaps = attention_fused(cases[i].hd) ? 3 : 1;
#else
        int caps[] = {0}, ncaps = 1;
#endif
        for (int ci = 0; ci < ncaps; ci++) {
#ifndef ENABLE_FP32
            test_hooks.fwd_max_blocks = caps[ci];
#endif
            AttnCase t;
            attn_case_init(&t, cases[i].B, cases[i].T, cases[i].H, cases[i].hd, cases[i].window, cases[i].gate, 31 + i);
            if (cases[i].mean_len > 0) { attn_case_documents(&t, cases[i].mean_len, cases[i].span, 401 + i); }
            attn_gpu(&t);
            attn_reference(&t, t.window, NULL);
            int ok = attn_compare(&t, line, sizeof(line));
            char grid[32] = "", docs[96] = "";
            if (caps[ci]) snprintf(grid, sizeof(grid), ", forward on %d block(s)", caps[ci]);
            if (t.doc != NULL) { // the negative control: the twin without documents
                int* doc = t.doc;
                t.doc = NULL;
                attn_reference(&t, t.window, NULL);
                char line_apart[512];
                int caught = !attn_compare(&t, line_apart, sizeof(line_apart));
                t.doc = doc;
                ok = ok && caught;
                snprintf(docs, sizeof(docs), ", documents: %d starts, the twin without them %s",
                         doc_starts_count(t.doc, t.B, t.T), caught ? "differs" : "MATCHES");
            }
            check(ok, "gpu attention B=%d T=%d H=%d hd=%d window=%d gate %s (%s%s%s): %s", t.B, t.T, t.H, t.hd,
                  t.window, t.gate ? "on" : "none", attention_kernel_name(t.hd), grid, docs, line);
            attn_case_free(&t);
        }
#ifndef ENABLE_FP32
        test_hooks.fwd_max_blocks = 0;
#endif
    }
    // negative controls: the comparison must catch a wrong output
    AttnCase t;
    attn_case_init(&t, 2, 197, 2, 64, 37, 1, 77);
    attn_gpu(&t);
    attn_reference(&t, t.window, NULL);
    int base_ok = attn_compare(&t, line, sizeof(line));
    size_t n = (size_t)t.B * t.T * t.H * t.hd, at = n - 1 - 5 * t.hd; // one value of a late row
    float kept = t.dq[at], dq_max = 0.0f;
    for (size_t i = 0; i < n; i++) { dq_max = fmaxf(dq_max, fabsf(t.dq_ref[i])); }
    t.dq[at] += 0.1f * dq_max;
    int caught_value = !attn_compare(&t, line, sizeof(line));
    t.dq[at] = kept;
    attn_reference(&t, t.window - 1, NULL); // the GPU at window 37 against a reference at 36: an off-by-one
    int caught_window = !attn_compare(&t, line, sizeof(line));
    check(base_ok && caught_value && caught_window,
          "gpu attention negative controls: a case that passes fails with one "
          "dq value off by 10%% of max |dq| (%s) and against an off-by-one window reference (%s; %s)",
          caught_value ? "caught" : "MISSED", caught_window ? "caught" : "MISSED", line);
    attn_case_free(&t);
#ifndef ENABLE_FP32
    FoxConfig bad;
    config_from_preset(&bad, "fox-pro-tiny");
    bad.n_head = 4; // head size 32
    const char* why = gpu_config_problem(&bad);
    check(why != NULL && strstr(why, "HINT") != NULL, "gpu: the bf16 build refuses head size 32 with a HINT (%s)",
          why != NULL ? why : "accepted");
#endif
}

#ifndef ENABLE_FP32
// Pruning in the fused kernels: the GPU's tile tables equal the twin's (prune_tiles from the GPU's
// U and the same c; U itself against prune_bound), the pruned GPU forward and backward match the
// twin's pruned reference at the dense tolerances, and (control) at ln eps = +60, where pruning
// drops real weight, the GPU matches the pruned reference and not the dense one: the kernels do
// skip the tiles. Pruned vs dense within the bound is the CPU test's (test_attention_pruning).
// tables_only: compare U and the tables alone (long T, where the twin's attention would be slow).
static void gpu_prune_case(int B, int T, int H, int hd, int window, float ln_eps, uint64_t seed, int want_dense_miss,
                           int tables_only) {
    AttnCase t;
    attn_case_init(&t, B, T, H, hd, window, 1, seed);
    size_t n = (size_t)B * T * H * hd, nh = (size_t)B * H * T, BH = (size_t)B * H;
    int nt = ceil_div(T, PRUNE_BLOCK);
    floatX *q = attn_upload(t.q, n), *k = attn_upload(t.k, n);
    float *c, *U;
    float2* partial;
    int* tables;
    cudaCheck(cudaMalloc(&c, nh * sizeof(float))); cudaCheck(cudaMalloc(&U, BH * sizeof(float)));
    cudaCheck(cudaMalloc(&partial, BH * ceil_div(T, PRUNE_NORM_ROWS) * sizeof(float2)));
    cudaCheck(cudaMalloc(&tables, 2 * BH * nt * sizeof(int)));
    cudaCheck(cudaMemcpy(c, t.c, nh * sizeof(float), cudaMemcpyHostToDevice));
    fox_prune_tables(tables, U, partial, q, k, c, B, T, H, hd, H * hd, ln_eps, NULL, 0);
    cudaCheck(cudaDeviceSynchronize());
    float* U_gpu = (float*)malloc_check(BH * sizeof(float), "U");
    float* U_cpu = (float*)malloc_check(BH * sizeof(float), "U");
    int* tab_gpu = (int*)malloc_check(2 * BH * nt * sizeof(int), "tiles");
    int* tab_cpu = (int*)malloc_check(2 * BH * nt * sizeof(int), "tiles");
    cudaCheck(cudaMemcpy(U_gpu, U, BH * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(tab_gpu, tables, 2 * BH * nt * sizeof(int), cudaMemcpyDeviceToHost));
    prune_bound(U_cpu, t.q, t.k, B, T, H, hd);
    double u_err = 0.0;
    for (size_t i = 0; i < BH; i++) { u_err = fmax(u_err, fabs((double)U_gpu[i] - U_cpu[i]) / U_cpu[i]); }
    prune_tiles(tab_cpu, tab_cpu + BH * nt, t.c, U_gpu, NULL, B, H, T, PRUNE_BLOCK, ln_eps);
    int same_tiles = memcmp(tab_gpu, tab_cpu, 2 * BH * nt * sizeof(int)) == 0;
    // tiles; with the window as the step line counts
    long skipped = 0, causal = 0, window_skipped = 0, window_dense = 0;
    for (size_t bh = 0; bh < BH; bh++) {
        for (int qt = 0; qt < nt; qt++) {
            int j0 = qt * PRUNE_BLOCK - window + 1, first = window > 0 && j0 > 0 ? j0 / PRUNE_BLOCK : 0;
            skipped += tab_cpu[bh * nt + qt]; causal += qt + 1;
            window_skipped += tab_cpu[bh * nt + qt] > first ? tab_cpu[bh * nt + qt] - first : 0;
            window_dense += qt + 1 - first;
        }
    }
    if (tables_only) {
        int far = 0; // a key_start or query_end more than 32 tiles from the diagonal: several ballot steps
        for (size_t i = 0; i < BH * nt; i++) {
            int t_i = (int)(i % nt);
            if (t_i - tab_cpu[i] > 32 || tab_cpu[BH * nt + i] - t_i > 32) { far = 1; }
        }
        check(u_err <= 1e-5 && same_tiles && far && skipped > 0,
              "gpu pruning tables B=%d T=%d H=%d hd=%d (%d tiles a row): "
              "U within %.1e of the twin's (<= 1e-5), tables %s the twin's, %.0f%% of causal tiles skipped, "
              "bounds more than 32 tiles from the diagonal %s", B, T, H, hd, nt, u_err,
              same_tiles ? "equal" : "DIFFER from", 100.0 * skipped / causal, far ? "present" : "MISSING");
    }
    if (!tables_only) {
    // the twin's dense reference, then the pruned one; the GPU through the trainer's boundary
    AttnPrune pr = {PRUNE_BLOCK, tab_cpu};
    char line[512], line_dense[512];
    attention_set_pruning(1, ln_eps);
    unsigned long long tiles;
    attention_pruned_share(&tiles); // starts the count
    attn_gpu(&t);
    double share = attention_pruned_share(&tiles);
    attention_set_pruning(0, -10.0);
    attn_reference(&t, t.window, NULL);
    int share_ok =
        tiles == (unsigned long long)window_dense && fabs(share - (double)window_skipped / window_dense) < 1e-12;
    int dense_ok = attn_compare(&t, line_dense, sizeof(line_dense));
    attn_reference(&t, t.window, &pr);
    int ok = attn_compare(&t, line, sizeof(line));
    int pass = u_err <= 1e-5 && same_tiles && share_ok && ok && skipped > 0 && (want_dense_miss ? !dense_ok : 1);
    check(pass,
          "gpu pruned attention B=%d T=%d H=%d hd=%d window=%d ln eps %g: U within %.1e of the twin's (<= 1e-5), "
          "tile tables %s the twin's, %.0f%% of causal tiles skipped, the step line's count %s (%.1f%% of %llu); "
          "against the twin's pruned reference: %s%s",
          B, T, H, hd, window, ln_eps, u_err, same_tiles ? "equal" : "DIFFER from", 100.0 * skipped / causal,
          share_ok ? "agrees" : "DISAGREES", 100.0 * share, tiles, line,
          want_dense_miss
              ? (dense_ok ? "; MATCHES the dense reference (tiles not skipped?)" : "; differs from dense, as it must")
              : "");
    }
    void* bufs[] = {q, k, c, U, partial, tables};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { cudaCheck(cudaFree(bufs[i])); }
    free(U_gpu); free(U_cpu); free(tab_gpu); free(tab_cpu);
    attn_case_free(&t);
}

static void gpu_test_attention_pruning(void) {
    gpu_prune_case(2, 1000, 4, 64, 0, -10.0f, 91, 0, 0);   // several tiles, T not a multiple of 128
    gpu_prune_case(1, 1100, 4, 128, 0, -10.0f, 92, 0, 0);
    gpu_prune_case(2, 900, 4, 64, 300, -10.0f, 93, 0, 0);  // sliding window
    test_hooks.fwd_max_blocks = 5;  // the same on 5 blocks: a block's forward crosses pairs with pruning and a window
    gpu_prune_case(2, 900, 4, 64, 300, -10.0f, 98, 0, 0);
    test_hooks.fwd_max_blocks = 0;
    // control: delta > 0 skips every off-diagonal tile, dropping real weight in the slow heads
    gpu_prune_case(1, 1024, 4, 64, 0, 60.0f, 94, 1, 0);
    gpu_prune_case(1, 1024, 4, 128, 0, 60.0f, 95, 1, 0);
    // long rows: 71 tiles, the slowest head keeps ~37 tiles, so the scans take several 32-tile steps
    gpu_prune_case(1, 9000, 4, 64, 0, -10.0f, 96, 0, 1);
    gpu_prune_case(2, 9000, 2, 128, 0, -10.0f, 97, 0, 1);
}

#endif

// The evaluation modes through the GPU backend against the twin's backend, at the paper's
// initialisation (where the bf16 tolerances above were set): per-position losses of a batch
// (what -M eval sums), next-token logits of generation (GPU: full recompute; twin: KV cache)
// and a NIAH score. Errors relative to the tensor's scale, tolerance GTOL_LOGITS. docs: documents
// kept apart (-f 1) with EOTs at 7, 20, 47 and 100 of every sequence (the generation steps cross the
// one at 7: the twin's cache restarts there, the GPU's forward masks).
static void gpu_test_eval_backend(int docs) {
    enum { B = 2, T = 150, V = 50257, PROMPT = 5, STEPS = 8 };
    FoxModel m;
    eval_test_model(&m, "fox-pro-tiny", NULL, V, 1.0f);
    m.doc_eot = docs ? GPT2_EOT : -1;
    const char* how = docs ? " (-f 1)" : "";
    CpuBackend cb;
    ForwardBackend cpu = cpu_backend_init(&cb, &m, B, T);
    GPUModel g;
    gpu_build(&g, &m, B, T);
    GpuBackend gb = {&g, (floatX*)malloc_check((size_t)V * sizeof(floatX), "row")};
    ForwardBackend gpu = {&gb, V, gpu_backend_forward, gpu_backend_logits_row, gpu_backend_reset,
                          gpu_backend_next_logits};
    int* inputs = (int*)malloc_check((size_t)B * T * sizeof(int), "tokens");
    int* targets = (int*)malloc_check((size_t)B * T * sizeof(int), "tokens");
    random_tokens(inputs, (size_t)B * T, V, 11);
    random_tokens(targets, (size_t)B * T, V, 12);
    for (int b = 0; docs && b < B; b++) {
        int at[] = {7, 20, 47, 100};
        for (int e = 0; e < 4; e++) { inputs[b * T + at[e]] = GPT2_EOT; }
    }
    static float lc[B * T], lg[B * T];
    cpu.forward(cpu.ctx, inputs, targets, B, T, lc);
    gpu.forward(gpu.ctx, inputs, targets, B, T, lg);
    double loss_err = 0.0, loss_scale = 0.0;
    for (int i = 0; i < B * T; i++) {
        loss_err = fmax(loss_err, fabs(lc[i] - lg[i]));
        loss_scale = fmax(loss_scale, fabs(lc[i]));
    }
    check(loss_err / loss_scale <= GTOL_LOGITS, "gpu eval%s: per-token losses of a %dx%d batch, rel err %.1e <= %.0e",
          how, B, T, loss_err / loss_scale, GTOL_LOGITS);
    static float rc[V], rg[V];
    cpu.reset(cpu.ctx);
    gpu.reset(gpu.ctx);
    double logit_err = 0.0;
    for (int t = PROMPT; t < PROMPT + STEPS; t++) {
        cpu.next_logits(cpu.ctx, inputs, t, rc);
        gpu.next_logits(gpu.ctx, inputs, t, rg);
        double err = 0.0, scale = 0.0;
        for (int j = 0; j < V; j++) { err = fmax(err, fabs(rc[j] - rg[j])); scale = fmax(scale, fabs(rc[j])); }
        logit_err = fmax(logit_err, err / scale);
    }
    check(logit_err <= GTOL_LOGITS,
          "gpu generate%s: next-token logits (full recompute) against the twin's KV cache over %d steps, "
          "rel err %.1e <= %.0e", how, STEPS, logit_err, GTOL_LOGITS);
    NiahTexts tx;
    niah_texts_init(&tx, 0);
    static int prompt[T], seq[T + NIAH_MAX_PIECE];
    static float losses[T + NIAH_MAX_PIECE];
    enum { CTX = T - NIAH_MAX_PIECE / 4 };
    niah_build_prompt(&tx, inputs, CTX, 0.5, GPT2_EOT, prompt);
    NiahScore sc = niah_score(&cpu, &tx, prompt, CTX, seq, losses, rc);
    NiahScore sg = niah_score(&gpu, &tx, prompt, CTX, seq, losses, rg);
    double e = fabs(sc.logprob - sg.logprob) / fabs(sc.logprob);
    check(e <= GTOL_LOGITS, "gpu niah%s: log p(answer) %.4f vs twin %.4f, rel err %.1e <= %.0e", how, sg.logprob,
          sc.logprob, e, GTOL_LOGITS);
    free(inputs); free(targets); free(gb.row_x);
    gpu_free(&g);
    if (cb.dec.m != NULL) { fox_decoder_free(&cb.dec); }
    fox_free(&m);
}

// max |got - ref| / max |ref| (NaN counts as infinite)
static double rel_max_error(const float* got, const float* ref, size_t n) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        err = isnan(d) ? INFINITY : fmax(err, d);
        scale = fmax(scale, fabs((double)ref[i]));
    }
    return err / fmax(scale, 1e-30);
}

// The cross-entropy kernel against fp64, with pad packs and rows of up to 70,016 logits: the loss
// of the evaluation and the training variants (the same bits: the training forward's loss is the
// evaluation's), the gradient (softmax - onehot) dloss of both training paths (the row staged in
// shared memory as crossentropy_gpu chooses, and read again from global memory; the same bits)
// within its rounding to floatX (2^-8 relative in bf16) plus 1e-6 dloss (fp32 exp and lse), and
// the pads (poisoned with NaN) 0.
static void gpu_test_crossentropy(void) {
    struct { int N, V, Vp; } cases[] = {{3, 70001, 70016}, {4, 300, 320}, {2, 50257, 50304}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int N = cases[c].N, V = cases[c].V, Vp = cases[c].Vp;
        size_t n = (size_t)N * Vp;
        uint64_t s = 5000 + c;
        floatX* h = (floatX*)malloc_check(n * sizeof(floatX), "logits");
        int* targets = (int*)malloc_check((size_t)N * sizeof(int), "targets");
        for (size_t i = 0; i < n; i++) { h[i] = to_floatX((int)(i % Vp) < V ? 3.0f * (float)rng_normal(&s) : NAN); }
        for (int r = 0; r < N; r++) { targets[r] = (int)(rng_uniform(&s) * V) % V; }
        h[V - 1] = to_floatX(25.0f); // row 0: one sharp logit, the last real one
        float dloss = 0.37f / N;
        floatX* logits_d[3]; // evaluation, training (crossentropy_gpu's choice), training read twice
        float* loss_d[3];
        int* targets_d;
        cudaCheck(cudaMalloc(&targets_d, (size_t)N * sizeof(int)));
        cudaCheck(cudaMemcpy(targets_d, targets, (size_t)N * sizeof(int), cudaMemcpyHostToDevice));
        for (int v = 0; v < 3; v++) {
            cudaCheck(cudaMalloc(&logits_d[v], n * sizeof(floatX)));
            cudaCheck(cudaMalloc(&loss_d[v], (size_t)N * sizeof(float)));
            cudaCheck(cudaMemcpy(logits_d[v], h, n * sizeof(floatX), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemset(loss_d[v], 0xFF, (size_t)N * sizeof(float)));
        }
        crossentropy_gpu(loss_d[0], logits_d[0], targets_d, N, V, Vp, 0, 0.0f);
        crossentropy_gpu(loss_d[1], logits_d[1], targets_d, N, V, Vp, 1, dloss);
        crossentropy_kernel<true><<<N, CE_THREADS>>>(loss_d[2], logits_d[2], targets_d, V, Vp, dloss, 0, Fp8Out{});
        launchCheck();
        cudaCheck(cudaDeviceSynchronize());
        float loss[3][4]; // N <= 4 in every case
        floatX* grad[2];
        for (int v = 0; v < 3; v++) {
            cudaCheck(cudaMemcpy(loss[v], loss_d[v], (size_t)N * sizeof(float), cudaMemcpyDeviceToHost));
        }
        for (int v = 0; v < 2; v++) {
            grad[v] = (floatX*)malloc_check(n * sizeof(floatX), "gradient");
            cudaCheck(cudaMemcpy(grad[v], logits_d[v + 1], n * sizeof(floatX), cudaMemcpyDeviceToHost));
        }
        double e_loss = 0.0, e_grad = 0.0;
        int same = memcmp(loss[0], loss[1], (size_t)N * sizeof(float)) == 0 &&
                   memcmp(loss[0], loss[2], (size_t)N * sizeof(float)) == 0 &&
                   memcmp(grad[0], grad[1], n * sizeof(floatX)) == 0, pads = 1;
        for (int r = 0; r < N; r++) {
            const floatX* x = h + (size_t)r * Vp;
            double m = -INFINITY, sum = 0.0;
            for (int j = 0; j < V; j++) { m = fmax(m, (double)to_float(x[j])); }
            for (int j = 0; j < V; j++) { sum += exp((double)to_float(x[j]) - m); }
            double lse = m + log(sum), ref = lse - to_float(x[targets[r]]);
            e_loss = fmax(e_loss, fabs(loss[0][r] - ref) / fmax(fabs(ref), 1.0));
            for (int j = 0; j < Vp; j++) {
                float d = to_float(grad[0][(size_t)r * Vp + j]);
                if (j >= V) { pads = pads && d == 0.0f; continue; }
                double dref = (exp((double)to_float(x[j]) - lse) - (j == targets[r])) * dloss;
                e_grad = fmax(e_grad, fabs(d - dref) / (fabs(dref) / 256.0 + 1e-6 * dloss));
            }
        }
        check(e_loss <= 1e-5 && same && e_grad <= 1.0 && pads, "gpu cross-entropy %d rows of V = %d (Vp %d): loss rel "
              "err %.1e <= 1e-5; losses and gradients of the three paths the same bits: %s; gradient err %.2f of "
              "its bound; pads 0: %s", N, V, Vp, e_loss, same ? "yes" : "no", e_grad, pads ? "yes" : "no");
        for (int v = 0; v < 3; v++) { cudaCheck(cudaFree(logits_d[v])); cudaCheck(cudaFree(loss_d[v])); }
        cudaCheck(cudaFree(targets_d));
        free(h); free(targets); free(grad[0]); free(grad[1]);
    }
}

// The RMSNorm kernels (rmsnorm_forward_nv, rmsnorm_backward_nv) against fp64 on random rows: the
// trainer's register tile (rms_nv) at widths that take NV 1 and 2 (C = 96, 160: a part-filled tile),
// 6 (768), 12 (1536) and rows wider than the tile, read in two and three tiles (2176, 3200), and
// every other tile at C = 768 and 160 (rows of one to six tiles, at 160 the last part-filled); N =
// 200 rows (a last chunk of 8 rows). out, rstd, dresid_x and the kernels' partial sums are poisoned
// (NaN; a NaN anywhere fails); dresid and dw start from random values and accumulate. Errors: out is
// bf16-rounded (one rounding, at most 2^-8 relative in the bf16 build, which leaves ~1e-5 of margin
// for the fp32 error in front of it); fp32 sums of at most 3200 terms of size ~1 stay within 1e-5 of
// rstd, of 1 + |ref| (dresid) and of the sum of |terms| (dw over 200 rows).
// the larger of a and b, infinity if b is NaN (fmax would drop it)
static double nan_max(double a, double b) { return isnan(b) ? INFINITY : fmax(a, b); }

static void gpu_test_rmsnorm(void) {
    const int cases[][2] = {{96, 0}, {160, 0}, {768, 0}, {1536, 0}, {2176, 0}, {3200, 0}, {768, 1}, {768, 2},
                            {768, 4}, {768, 8}, {768, 12}, {160, 1}, {160, 4}}; // (C, NV; 0: rms_nv(C))
    const size_t N = 200;
    for (int c = 0; c < (int)(sizeof(cases) / sizeof(cases[0])); c++) {
        int C = cases[c][0], nv = cases[c][1] > 0 ? cases[c][1] : rms_nv(C);
        size_t NC = N * C, chunks = ceil_div(N, RMS_BWD_ROWS);
        uint64_t s = 7000 + C;
        float* x = (float*)malloc_check(NC * sizeof(float), "x");
        float* dout = (float*)malloc_check(NC * sizeof(float), "dout");
        float* g0 = (float*)malloc_check(NC * sizeof(float), "dresid");
        float* g = (float*)malloc_check(NC * sizeof(float), "dresid");
        float* w = (float*)malloc_check(C * sizeof(float), "w");
        float* dw0 = (float*)malloc_check(C * sizeof(float), "dw");
        float* dw = (float*)malloc_check(C * sizeof(float), "dw");
        float* rstd = (float*)malloc_check(N * sizeof(float), "rstd");
        floatX* out = (floatX*)malloc_check(NC * sizeof(floatX), "out");
        floatX* gx = (floatX*)malloc_check(NC * sizeof(floatX), "dresid_x");
        for (size_t i = 0; i < NC; i++) {
            x[i] = (float)rng_normal(&s); dout[i] = (float)rng_normal(&s); g0[i] = (float)rng_normal(&s);
        }
        for (int i = 0; i < C; i++) { w[i] = 0.5f + (float)rng_uniform(&s); dw0[i] = (float)rng_normal(&s); }
        GPUModel m;
        memset(&m, 0, sizeof(m));
        float *x_d, *w_d, *rstd_d, *dw_d;
        floatX* out_d;
        cudaCheck(cudaMalloc(&x_d, NC * sizeof(float))); cudaCheck(cudaMalloc(&m.gb.dxn, NC * sizeof(float)));
        cudaCheck(cudaMalloc(&m.gb.dresid, NC * sizeof(float))); cudaCheck(cudaMalloc(&w_d, C * sizeof(float)));
        cudaCheck(cudaMalloc(&m.gb.dresid_x, NC * sizeof(floatX))); cudaCheck(cudaMalloc(&out_d, NC * sizeof(floatX)));
        cudaCheck(cudaMalloc(&m.gb.partial, chunks * C * sizeof(float)));
        cudaCheck(cudaMalloc(&rstd_d, N * sizeof(float)));
        cudaCheck(cudaMalloc(&dw_d, C * sizeof(float)));
        cudaCheck(cudaMemcpy(x_d, x, NC * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(m.gb.dxn, dout, NC * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(m.gb.dresid, g0, NC * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(w_d, w, C * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dw_d, dw0, C * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemset(out_d, 0xFF, NC * sizeof(floatX))); cudaCheck(cudaMemset(rstd_d, 0xFF, N * sizeof(float)));
        cudaCheck(cudaMemset(m.gb.dresid_x, 0xFF, NC * sizeof(floatX)));
        cudaCheck(cudaMemset(m.gb.partial, 0xFF, chunks * C * sizeof(float)));
        rmsnorm_forward_nv(nv, out_d, rstd_d, x_d, w_d, N, C);
        rmsnorm_backward_nv(nv, m.gb.dresid, m.gb.dresid_x, m.gb.partial, dw_d, m.gb.dxn, x_d, w_d, rstd_d, N, C);
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy(out, out_d, NC * sizeof(floatX), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(rstd, rstd_d, N * sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(g, m.gb.dresid, NC * sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(gx, m.gb.dresid_x, NC * sizeof(floatX), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(dw, dw_d, C * sizeof(float), cudaMemcpyDeviceToHost));
        double e_out = 0.0, e_rstd = 0.0, e_g = 0.0, e_dw = 0.0;
        int copy_ok = 1;
        for (size_t r = 0; r < N; r++) {
            const float *xr = x + r * C, *dr = dout + r * C;
            double ss = 0.0, dot = 0.0;
            for (int i = 0; i < C; i++) { ss += (double)xr[i] * xr[i]; }
            double sr = 1.0 / sqrt(ss / C + 1e-6);
            e_rstd = nan_max(e_rstd, fabs(rstd[r] - sr) / sr);
            for (int i = 0; i < C; i++) {
                double ref = xr[i] * sr * w[i];
                e_out = nan_max(e_out, fabs(to_float(out[r * C + i]) - ref) / (fabs(ref) * 0x1p-8 + 1e-30));
                dot += (double)w[i] * dr[i] * xr[i];
            }
            double k = dot * sr * sr * sr / C;
            for (int i = 0; i < C; i++) {
                double ref = g0[r * C + i] + sr * w[i] * dr[i] - xr[i] * k;
                e_g = nan_max(e_g, fabs(g[r * C + i] - ref) / (1.0 + fabs(ref)));
                floatX gr = to_floatX(g[r * C + i]);
                copy_ok = copy_ok && memcmp(&gx[r * C + i], &gr, sizeof(floatX)) == 0;
            }
        }
        for (int i = 0; i < C; i++) {
            double ref = dw0[i], mag = fabs(dw0[i]);
            for (size_t r = 0; r < N; r++) {
                double t = (double)dout[r * C + i] * x[r * C + i] * rstd[r];
                ref += t;
                mag += fabs(t);
            }
            e_dw = nan_max(e_dw, fabs(dw[i] - ref) / mag);
        }
        check(e_out <= 1.0 && e_rstd <= 1e-5 && e_g <= 1e-5 && e_dw <= 1e-5 && copy_ok,
              "gpu rmsnorm C = %d (NV %d%s, %d tile(s)), %zu rows: out %.2f of 2^-8 relative, rstd %.1e, dresid %.1e, "
              "dw %.1e (<= 1e-5); dresid_x = bf16(dresid): %s", C, nv, nv == rms_nv(C) ? ", the trainer's" : "",
              (int)ceil_div(C, RMS_TILE(nv)), N, e_out, e_rstd, e_g, e_dw, copy_ok ? "yes" : "no");
        cudaCheck(cudaFree(x_d)); cudaCheck(cudaFree(m.gb.dxn)); cudaCheck(cudaFree(m.gb.dresid));
        cudaCheck(cudaFree(w_d)); cudaCheck(cudaFree(m.gb.dresid_x)); cudaCheck(cudaFree(out_d));
        cudaCheck(cudaFree(m.gb.partial)); cudaCheck(cudaFree(rstd_d)); cudaCheck(cudaFree(dw_d));
        free(x); free(dout); free(g0); free(w); free(dw0); free(g); free(rstd); free(dw); free(out); free(gx);
    }
}

#ifndef ENABLE_FP32
// The FP8 casts (fp8_cast_gpu from fp32 and floatX; the weights' fp8_weights_cast_gpu, floatX to E4M3, as one block of
// rows x cols: its row-major and transposed codes) against the twin's fp8_encode, bit for bit (NaN by class: the NaN
// code is not the twin's business): random normals times 2^-40 .. 2^40 (both formats' subnormal and saturation edges at
// every k), the twin's thresholds (448, its tie with the NaN code 464 and above; 57344, 61440; half the smallest
// subnormals 2^-10, 2^-17), +-0 and +-inf; k = -7, 0, 9; a part-filled 64 x 64 tile in both directions. Outputs
// poisoned first (0xFF: a NaN code in both formats, so a code left unwritten fails unless the twin's is NaN too, which
// the finite inputs never give). The row-major cast's rounded values (floatX) must be the twin's dec(enc(x 2^k)) 2^-k
// bit for bit, and its amax (onto a poisoned start of 0: atomicMax) the twin's fp8_amax of the inputs: inf, NaN (above
// inf), or without either the largest finite magnitude.
static void gpu_test_fp8_casts(void) {
    const int rows = 200, cols = 136;
    const size_t n = (size_t)rows * cols;
    const float edges[] = {0.0f, -0.0f, INFINITY, -INFINITY, 448.0f, 464.0f, 465.0f, -464.0f, 57344.0f, 61440.0f,
                           61441.0f, 0x1p-10f, 0x1.000002p-10f, 0x1p-17f, 0x1.000002p-17f, 0x1p-9f, 0x1p-16f};
    float* x = (float*)malloc_check(n * sizeof(float), "fp8 inputs");
    floatX* xh = (floatX*)malloc_check(n * sizeof(floatX), "fp8 inputs");
    float* xv = (float*)malloc_check(n * sizeof(float), "fp8 input values");
    uint8_t* got = (uint8_t*)malloc_check(n, "fp8 codes");
    uint8_t* got_t = (uint8_t*)malloc_check(n, "fp8 codes");
    floatX* rounded = (floatX*)malloc_check(n * sizeof(floatX), "fp8 rounded values");
    uint64_t s = 8100;
    for (size_t i = 0; i < n; i++) {
        double mag = ldexp(1.0, (int)(rng_uniform(&s) * 81.0) - 40);
        x[i] = i < sizeof(edges) / sizeof(edges[0]) ? edges[i] : (float)(rng_normal(&s) * mag);
    }
    uint8_t *out_d, *out_t_d;
    void* x_d;
    floatX* r_d;
    unsigned* amax_d;
    int* k_d;
    cudaCheck(cudaMalloc(&out_d, n)); cudaCheck(cudaMalloc(&x_d, n * sizeof(float)));
    cudaCheck(cudaMalloc(&r_d, n * sizeof(floatX))); cudaCheck(cudaMalloc(&amax_d, sizeof(unsigned)));
    cudaCheck(cudaMalloc(&k_d, sizeof(int))); cudaCheck(cudaMalloc(&out_t_d, n));
    Fp8Block one = {0, rows, cols, 0, 0}, *one_d; // the weights' cast of one block, its scale in slot 0
    unsigned tiles = fp8_block_tiles(&one, 1);
    cudaCheck(cudaMalloc(&one_d, sizeof(one)));
    cudaCheck(cudaMemcpy(one_d, &one, sizeof(one), cudaMemcpyHostToDevice));
    int bad = 0, runs = 0, amax_bad = 0, rounded_bad = 0;
    const int ks[3] = {-7, 0, 9};
    for (int special = 0; special < 3; special++) { // +-inf; +-inf and a NaN; neither (a finite amax)
        x[2] = special == 2 ? 1.5f : INFINITY;
        x[3] = special == 2 ? -2.5f : -INFINITY;
        x[777] = special == 1 ? NAN : 1.5f;
        for (size_t i = 0; i < n; i++) { xh[i] = to_floatX(x[i]); }
        for (int v = 0; v < 24; v++) { // format, k, input type, transpose (the weights' cast: floatX to E4M3 only)
            int e5m2 = v % 2, k = ks[(v / 2) % 3], bf = (v / 6) % 2, tr = v / 12;
            if (tr && (e5m2 || !bf)) { continue; }
            const Fp8Format* f = e5m2 ? &FP8_E5M2 : &FP8_E4M3;
            for (size_t i = 0; i < n; i++) { xv[i] = bf ? to_float(xh[i]) : x[i]; }
            cudaCheck(cudaMemcpy(x_d, bf ? (const void*)xh : (const void*)x, n * (bf ? sizeof(floatX) : sizeof(float)),
                                 cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(k_d, &k, sizeof(int), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemset(out_d, 0xFF, n));
            cudaCheck(cudaMemset(out_t_d, 0xFF, n));
            cudaCheck(cudaMemset(r_d, 0xFF, n * sizeof(floatX)));
            cudaCheck(cudaMemset(amax_d, 0, sizeof(unsigned)));
            if (tr) {
                fp8_weights_amax_gpu(amax_d, (const floatX*)x_d, one_d, 1, tiles);
                fp8_weights_cast_gpu(out_d, out_t_d, (const floatX*)x_d, one_d, 1, tiles, k_d);
            }
            // row-major casts of values lo .. hi - 1 (the rest keeps the poison): k = 0 leaves 3 values past the last
            // multiple of 8 (one a thread), k = 9 starts one value in (unaligned: every value one a thread)
            size_t lo = !tr && k == 9 ? 1 : 0, hi = !tr && k == 0 ? n - 5 : n, es = bf ? sizeof(floatX) : sizeof(float);
            const void* xs = (const char*)x_d + lo * es;
            if (!tr && bf) { fp8_cast_gpu(out_d + lo, r_d + lo, (const floatX*)xs, hi - lo, k_d, e5m2, amax_d); }
            if (!tr && !bf) { fp8_cast_gpu(out_d + lo, r_d + lo, (const float*)xs, hi - lo, k_d, e5m2, amax_d); }
            unsigned amax;
            cudaCheck(cudaMemcpy(got, out_d, n, cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(got_t, out_t_d, n, cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(rounded, r_d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(&amax, amax_d, sizeof(amax), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < n; i++) {
                if (i < lo || i >= hi) { // untouched: still the poison
                    bad += got[i] != 0xFF;
                    rounded_bad += !tr && *(const uint16_t*)&rounded[i] != 0xFFFF;
                    continue;
                }
                size_t r = i / cols, c = i % cols;
                uint8_t want = fp8_encode(xv[i] * fp8_pow2(k), f);
                float want_value = fp8_decode(want, f) * fp8_pow2(-k);
                int nan = isnan(want_value);
                bad += !(nan ? isnan(fp8_decode(got[i], f)) : got[i] == want);
                if (tr) { bad += !(nan ? isnan(fp8_decode(got_t[c * rows + r], f)) : got_t[c * rows + r] == want); }
                if (!tr) {
                    float rv = to_float(rounded[i]);
                    rounded_bad += !(nan ? isnan(rv) : f32_bits(rv) == f32_bits(want_value));
                }
            }
            amax_bad += amax != f32_bits(fp8_amax(xv + lo, hi - lo)); // the weights' amax too
            runs++;
        }
    }
    check(bad == 0 && amax_bad == 0 && rounded_bad == 0, "gpu fp8 casts: %d runs of %zu values (E4M3 / E5M2, k = -7, "
          "0 (5 fewer: a tail), 9 (one value in: unaligned), fp32 / floatX in; the weights' cast, floatX to E4M3, "
          "row-major and transposed; with inf, inf and NaN, neither): %d codes differ from the twin's fp8_encode, %d "
          "rounded values from its decoded codes, %d amaxes from its fp8_amax", runs, n, bad, rounded_bad, amax_bad);
    cudaCheck(cudaFree(out_d)); cudaCheck(cudaFree(x_d)); cudaCheck(cudaFree(r_d)); cudaCheck(cudaFree(amax_d));
    cudaCheck(cudaFree(k_d)); cudaCheck(cudaFree(out_t_d)); cudaCheck(cudaFree(one_d));
    free(x); free(xh); free(xv); free(got); free(got_t); free(rounded);
}

// The weights' amax and cast over a table of blocks, one launch each (fp8_weights_amax_gpu, fp8_weights_cast_gpu), as
// gpu_fp8_step_begin runs them: three blocks in one buffer with gaps between them, two sharing a scale slot, part-
// filled tiles in both directions (70 x 80, 64 x 144, 130 x 48), each at its own magnitude with its largest value its
// last (the corner of its last tile; block 0's above block 1's, which share a slot) and the gaps 2^12 (any read past a
// block shows in an amax). Slot amaxes against the twin's fp8_amax of the blocks that share them, the others left as
// they were (7); every code, row-major and transposed, against the twin's fp8_encode at the slot's scale; the gaps
// still the poison (0xFF) in both outputs.
static void gpu_test_fp8_weight_blocks(void) {
    Fp8Block b[3] = {{16, 70, 80, 1, 0}, {16 + 70 * 80 + 40, 64, 144, 1, 0}, {0, 130, 48, 3, 0}};
    b[2].off = b[1].off + 64 * 144 + 24;
    const size_t n = b[2].off + 130 * 48 + 8;
    const int k[4] = {0, 2, 0, -3};
    unsigned tiles = fp8_block_tiles(b, 3);
    floatX* w = (floatX*)malloc_check(n * sizeof(floatX), "weights");
    float* wv = (float*)malloc_check(n * sizeof(float), "weight values");
    uint8_t* w8 = (uint8_t*)malloc_check(n, "codes");
    uint8_t* w8t = (uint8_t*)malloc_check(n, "codes");
    uint64_t s = 8200;
    const float last[3] = {6.0f, 5.0f, 70.0f}; // each block's largest |value| (the others stay below 4.5 2^(4 blk - 5))
    for (size_t i = 0; i < n; i++) {
        int blk = -1;
        for (int j = 0; j < 3; j++) { blk = i >= b[j].off && i < b[j].off + (size_t)b[j].rows * b[j].cols ? j : blk; }
        double v = blk < 0 ? 4096.0 : rng_normal(&s) * ldexp(1.0, 4 * blk - 5);
        v = blk >= 0 && fabs(v) > 4.5 * ldexp(1.0, 4 * blk - 5) ? 0.0 : v;
        if (blk >= 0 && i == b[blk].off + (size_t)b[blk].rows * b[blk].cols - 1) { v = -last[blk]; }
        w[i] = to_floatX((float)v);
        wv[i] = to_float(w[i]);
    }
    floatX* w_d;
    uint8_t *w8_d, *w8t_d;
    unsigned* amax_d;
    int* k_d;
    Fp8Block* b_d;
    cudaCheck(cudaMalloc(&w_d, n * sizeof(floatX))); cudaCheck(cudaMalloc(&w8_d, n)); cudaCheck(cudaMalloc(&w8t_d, n));
    cudaCheck(cudaMalloc(&amax_d, 4 * sizeof(unsigned))); cudaCheck(cudaMalloc(&k_d, 4 * sizeof(int)));
    cudaCheck(cudaMalloc(&b_d, sizeof(b)));
    const unsigned amax0[4] = {7, 0, 7, 0};
    cudaCheck(cudaMemcpy(w_d, w, n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(amax_d, amax0, sizeof(amax0), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(k_d, k, sizeof(k), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(b_d, b, sizeof(b), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(w8_d, 0xFF, n));
    cudaCheck(cudaMemset(w8t_d, 0xFF, n));
    fp8_weights_amax_gpu(amax_d, w_d, b_d, 3, tiles);
    fp8_weights_cast_gpu(w8_d, w8t_d, w_d, b_d, 3, tiles, k_d);
    unsigned amax[4];
    cudaCheck(cudaMemcpy(amax, amax_d, sizeof(amax), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(w8, w8_d, n, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(w8t, w8t_d, n, cudaMemcpyDeviceToHost));
    float a01 = fp8_max(fp8_amax(wv + b[0].off, 70 * 80), fp8_amax(wv + b[1].off, 64 * 144));
    int amax_bad = (amax[0] != 7) + (amax[2] != 7) + (amax[1] != f32_bits(a01)) +
                   (amax[3] != f32_bits(fp8_amax(wv + b[2].off, 130 * 48)));
    size_t bad = 0, gap_bad = 0, inside = 0;
    for (size_t i = 0; i < n; i++) {
        int blk = -1;
        for (int j = 0; j < 3; j++) { blk = i >= b[j].off && i < b[j].off + (size_t)b[j].rows * b[j].cols ? j : blk; }
        if (blk < 0) { gap_bad += (w8[i] != 0xFF) + (w8t[i] != 0xFF); continue; }
        size_t e = i - b[blk].off, r = e / b[blk].cols, c = e % b[blk].cols;
        uint8_t want = fp8_encode(wv[i] * fp8_pow2(k[b[blk].slot]), &FP8_E4M3);
        bad += (w8[i] != want) + (w8t[b[blk].off + c * b[blk].rows + r] != want);
        inside++;
    }
    check(amax_bad == 0 && bad == 0 && gap_bad == 0, "gpu fp8 weight blocks: 3 blocks (70 x 80, 64 x 144 on one slot; "
          "130 x 48), %u tiles in one launch each: %d slot amaxes wrong, %zu of %zu values' codes (row-major and "
          "transposed) differ from the twin's fp8_encode, %zu bytes written outside the blocks", tiles, amax_bad, bad,
          2 * inside, gap_bad);
    cudaCheck(cudaFree(w_d)); cudaCheck(cudaFree(w8_d)); cudaCheck(cudaFree(w8t_d)); cudaCheck(cudaFree(amax_d));
    cudaCheck(cudaFree(k_d)); cudaCheck(cudaFree(b_d));
    free(w); free(wv); free(w8); free(w8t);
}

// FP8 matmuls (matmul_fp8_gpu) against fp64 on the same codes: random E4M3 w (M, K) and E4M3 or E5M2 x (N, K), decoded
// exactly by the twin's fp8_decode, scales 2^-kx and 2^-kw; ref = sum_k x w in fp64. The products are exact; cuBLASLt
// sums them in the tensor cores and promotes partial sums to fp32 (FAST_ACCUM off), so the error is bounded by the
// accumulator's precision times sum |x w|: we hold it to 2^-12 sum |x w| (the FP8 accumulator keeps at least 13
// bits between promotions; the bound the test prints is what dev/bench_matmul_algos.cu FP8=1 measures), plus the
// output's rounding (2^-8 |ref| for floatX). Shapes as a forward (floatX out), an input gradient (E5M2 x, fp32 out)
// and a weight gradient (K = the tokens, fp32 out, beta 1 onto a fixed C). Outputs poisoned (NaN) or the pattern C.
static void gpu_test_fp8_matmul(void) {
    struct { int N, M, K, e5m2, f32, beta; } cases[] = {{256, 192, 128, 0, 0, 0}, {256, 128, 320, 1, 1, 0},
                                                        {96, 160, 512, 1, 1, 1}};
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        int N = cases[t].N, M = cases[t].M, K = cases[t].K, e5m2 = cases[t].e5m2, f32 = cases[t].f32;
        float beta = (float)cases[t].beta;
        const Fp8Format* fx = e5m2 ? &FP8_E5M2 : &FP8_E4M3;
        size_t nx = (size_t)N * K, nw = (size_t)M * K, nd = (size_t)N * M, de = f32 ? sizeof(float) : sizeof(floatX);
        uint8_t* x8 = (uint8_t*)malloc_check(nx, "fp8 x");
        uint8_t* w8 = (uint8_t*)malloc_check(nw, "fp8 w");
        float* cpat = (float*)malloc_check(nd * sizeof(float), "C");
        void* out = malloc_check(nd * de, "out");
        uint64_t s = 8200 + t;
        int kx = e5m2 ? 12 : 4, kw = 5;
        for (size_t i = 0; i < nx; i++) { x8[i] = fp8_encode((float)rng_normal(&s) * fp8_pow2(kx - 2), fx); }
        for (size_t i = 0; i < nw; i++) { w8[i] = fp8_encode((float)rng_normal(&s) * fp8_pow2(kw - 2), &FP8_E4M3); }
        for (size_t i = 0; i < nd; i++) { cpat[i] = (float)rng_normal(&s); }
        float sc[8] = {fp8_pow2(-kx), 0, 0, 0, fp8_pow2(-kw), 0, 0, 0}; // 16 bytes apart, as the trainer's slots
        uint8_t *x_d, *w_d;
        float* sc_d;
        void* out_d;
        cudaCheck(cudaMalloc(&x_d, nx)); cudaCheck(cudaMalloc(&w_d, nw)); cudaCheck(cudaMalloc(&sc_d, sizeof(sc)));
        cudaCheck(cudaMalloc(&out_d, nd * de));
        cudaCheck(cudaMemcpy(x_d, x8, nx, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(w_d, w8, nw, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(sc_d, sc, sizeof(sc), cudaMemcpyHostToDevice));
        if (beta != 0.0f) { cudaCheck(cudaMemcpy(out_d, cpat, nd * sizeof(float), cudaMemcpyHostToDevice)); }
        else { cudaCheck(cudaMemset(out_d, 0xFF, nd * de)); } // NaN in fp32 and bf16
        matmul_fp8_gpu(out_d, f32 ? CUDA_R_32F : CUDA_R_X, NULL, x_d, e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, sc_d,
                       w_d, sc_d + 4, (size_t)N, M, K, beta);
        cudaCheck(cudaMemcpy(out, out_d, nd * de, cudaMemcpyDeviceToHost));
        double worst = 0.0; // err / bound over all outputs; NaN -> infinity
        for (int r = 0; r < N; r++) {
            for (int c = 0; c < M; c++) {
                double ref = 0.0, mag = 0.0;
                for (int k = 0; k < K; k++) {
                    double p = (double)fp8_decode(x8[(size_t)r * K + k], fx) *
                               fp8_decode(w8[(size_t)c * K + k], &FP8_E4M3);
                    ref += p; mag += fabs(p);
                }
                ref = ref * sc[0] * sc[4] + beta * cpat[(size_t)r * M + c];
                mag *= (double)sc[0] * sc[4];
                double g = f32 ? ((float*)out)[(size_t)r * M + c] : to_float(((floatX*)out)[(size_t)r * M + c]);
                double bound = mag / 4096.0 + (f32 ? 1e-6 * fabs(ref) : fabs(ref) / 256.0) + 1e-30;
                worst = nan_max(worst, fabs(g - ref) / bound);
            }
        }
        check(worst <= 1.0, "gpu fp8 matmul (%d, %d) = x (%d, %d) %s @ w^T E4M3, %s out%s: err %.3f of its bound "
              "(2^-12 sum |x w| + the output's rounding)", N, M, N, K, e5m2 ? "E5M2" : "E4M3", f32 ? "fp32" : "floatX",
              beta != 0.0f ? ", beta 1" : "", worst);
        cudaCheck(cudaFree(x_d)); cudaCheck(cudaFree(w_d)); cudaCheck(cudaFree(sc_d)); cudaCheck(cudaFree(out_d));
        free(x8); free(w8); free(cpat); free(out);
    }
}
#endif

#ifndef ENABLE_FP32
// One FP8 training step as both trainers' main runs it (-q), on a twin model: the step begins, its first micro-step's
// batch calibrates the scales when there are none, the micro-steps, the norm (NaN on a non-finite amax), the clipped
// update, the step's end (without -q a plain step). Returns the norm; *loss the step's mean loss.
static double twin_fp8_step(FoxModel* m, const int* inputs, const int* targets, int B, int T, int micro,
                            const AdamWConfig* opt, float lr, int step, double* loss) {
    size_t N = (size_t)B * T;
    fox_zero_grad(m);
    fp8_step_begin(m);
    *loss = 0.0;
    for (int k = 0; k < micro; k++) {
        if (k == 0) { fp8_calibrate(m, inputs, targets, B, T, 1.0f / micro, step); }
        fox_forward(m, inputs + k * N, targets + k * N, B, T);
        fox_backward(m, 1.0f / micro);
        *loss += m->mean_loss / micro;
    }
    double norm = fp8_amax_finite(m) ? fox_grad_norm(m) : NAN;
    if (opt->grad_clip > 0) { fox_clip_grads(m, norm, opt->grad_clip); }
    fox_update(m, opt, lr, step);
    fp8_step_end(m, step, 1);
    return norm;
}

// the same step on the GPU, as train_fox's train_micro_steps and train_step run it; the FP8 weights poisoned first
static double gpu_fp8_step(GPUModel* g, const int* inputs, const int* targets, int B, int T, int micro,
                           const AdamWConfig* opt, float lr, int step, double* loss) {
    size_t N = (size_t)B * T;
    cudaCheck(cudaMemset(g->fp8.w8, 0xFF, g->layout.size));
    cudaCheck(cudaMemset(g->fp8.w8t, 0xFF, g->layout.size));
    gpu_zero_grad(g);
    fp8_step_begin(g->host);
    *loss = 0.0;
    for (int k = 0; k < micro; k++) {
        if (k == 0) {
            gpu_fp8_calibrate(g, inputs, targets, B, T, 1.0f / micro, step);
            gpu_fp8_step_begin(g, 1.0f / micro, N);
        }
        gpu_poison(g);
        gpu_train_micro_step(g, inputs + k * N, targets + k * N, B, T, 1.0f / micro);
        *loss += g->mean_loss / micro;
    }
    gpu_fp8_amax_to_host(g);
    double norm = gpu_grad_norm(g);
    if (!fp8_amax_finite(g->host)) { norm = NAN; }
    gpu_update(g, opt, lr, step, norm);
    fp8_step_end(g->host, step, 1);
    return norm;
}

// The GPU's parameter gradients (of its last step) against the twin's FP8 step and an unrounded step from the same
// weights: ||gpu - fp8|| / ||gpu - plain||, L2 over all trainable tensors together (below 1: nearer the FP8 emulation
// than the unrounded gradient); *worst the largest ratio of a single tensor, *name its name, for the message.
static double fp8_gradient_ratio(GPUModel* g, FoxModel* twin8, FoxModel* plain, double* worst, const char** name) {
    float* grads = (float*)malloc_check(g->num_parameters * sizeof(float), "GPU gradients");
    gpu_download(g, g->grads, grads);
    double e8_all = 0.0, ep_all = 0.0;
    *worst = 0.0;
    *name = "";
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        const ParamSpec* sp = &twin8->spec[t];
        size_t n = param_numel(sp, twin8->config.n_layer);
        if (n == 0 || !sp->trainable) { continue; }
        const float* ref = param_tensor(&twin8->grads, t);
        const float* gg = grads + (ref - twin8->grads_memory);
        const float* pl = param_tensor(&plain->grads, t);
        double e8 = 0.0, ep = 0.0;
        for (size_t i = 0; i < n; i++) {
            e8 += ((double)gg[i] - ref[i]) * ((double)gg[i] - ref[i]);
            ep += ((double)gg[i] - pl[i]) * ((double)gg[i] - pl[i]);
        }
        e8_all += e8; ep_all += ep;
        double r = sqrt(e8) / fmax(sqrt(ep), 1e-30);
        if (!(r <= *worst)) { *worst = isnan(r) ? INFINITY : r; *name = sp->name; }
    }
    free(grads);
    double r = sqrt(e8_all) / fmax(sqrt(ep_all), 1e-30);
    return isnan(r) ? INFINITY : r;
}

// max over the delayed operands of |a - b| / |b| between two models' step amaxes (NaN gives infinity)
static double fp8_amax_error(const FoxModel* a, const FoxModel* b) {
    double e = 0.0;
    for (size_t i = 0; i < (size_t)b->config.n_layer * FP8_SLOTS; i++) {
        double d = fabs((double)a->fp8.amax[i] - b->fp8.amax[i]) / fmax(fabs((double)b->fp8.amax[i]), 1e-30);
        e = isnan(d) ? INFINITY : fmax(e, d);
    }
    return e;
}

// The GPU's FP8 training steps (-q) against the twin's emulation: 4 AdamW steps of 2 micro-batches each on fixed
// random batches from the same weights, the first step calibrating. The GPU's host side is an exact copy of the twin
// (its own FP8 state); the probe, the twin with bf16 weights, gives the sensitivity as for bf16 (the GPU's bf16
// activations move values across FP8 rounding boundaries as the probe's bf16 weights do): losses, grad norms and the
// step amaxes of every delayed operand within tolerance(GTOL_STEPS, 8 x the probe's distance). Cases: hybrid, e4m3
// and body modes of FoX Pro (output norm: y's scale bounded), a Transformer (no output norm: y delayed, and y is the
// attention output itself), FoX (LLaMA) (no stage writes dqkvg: every projection's gradient its own operand), -r 1
// (the rounded inputs from recomputed activations). That FP8 is really on and every operand rounded as specified:
// step 1's gradients (the first step's, before updates make the runs drift apart) nearer the FP8 emulation than the
// unrounded gradient, over all tensors (L2), and, as the negative control, those of the same GPU step without -q
// nearer the unrounded one. Only together: where the GPU's bf16 values sit within a bf16 ulp of an FP8 rounding
// midpoint, its code is one FP8 ulp from the twin's (~3% of values, per-tensor ratios 0.7 to 1.3 measured on an
// H100), so single tensors and the 4 steps' losses (within the bf16 noise of the unrounded run in two cases) do not
// decide it. No clipping: the gradients compared are the steps' own.
static void gpu_test_fp8_steps(void) {
    // T = 112: N = 224, a multiple of FP8_TM_ROWS, so the MLP's weight gradients are FP8 matmuls (fp8_wgrad8_on);
    // T = 100 (N = 200) in one case: bf16 weight gradients
    struct { const char* preset; int mode, recompute, T; } cases[] = {
        {"fox-pro-tiny", FP8_MODE_HYBRID, 0, 112}, {"fox-pro-tiny", FP8_MODE_E4M3, 0, 112},
        {"fox-pro-tiny", FP8_MODE_BODY, 0, 112}, {"transformer-llama-tiny", FP8_MODE_HYBRID, 0, 100},
        {"fox-llama-tiny", FP8_MODE_HYBRID, 0, 112}, {"fox-pro-tiny", FP8_MODE_HYBRID, 1, 112},
    };
    const int B = 2, micro = 2, steps = 4;
    AdamWConfig opt = {3e-3f, 0.1f, 0.9f, 0.95f, 1e-8f, 0.0f};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        FoxConfig c;
        int T = cases[i].T;
        test_config(&c, cases[i].preset, 128, 2, NULL, NULL);
        FoxModel twin, probe, plain, host;
        twin_from_config(&twin, &c, 31 + i);
        twin_rounded_copy(&probe, &twin);
        fox_build(&plain, &c);
        fox_build(&host, &c);
        memcpy(plain.params_memory, twin.params_memory, twin.num_parameters * sizeof(float));
        memcpy(host.params_memory, twin.params_memory, twin.num_parameters * sizeof(float));
        fp8_setup(&twin, cases[i].mode); fp8_setup(&probe, cases[i].mode); fp8_setup(&host, cases[i].mode);
        size_t n = (size_t)micro * B * T;
        int* inputs = (int*)malloc_check(n * sizeof(int), "tokens");
        int* targets = (int*)malloc_check(n * sizeof(int), "tokens");
        random_tokens(inputs, n, c.vocab_size, 300 + i);
        random_tokens(targets, n, c.vocab_size, 400 + i);
        g_recompute = cases[i].recompute;
        GPUModel g, g0; // g0: the same model without -q, the negative control
        gpu_build(&g, &host, B, T);
        FoxModel host0;
        fox_build(&host0, &c);
        memcpy(host0.params_memory, twin.params_memory, twin.num_parameters * sizeof(float));
        gpu_build(&g0, &host0, B, T);
        double e = 0.0, sens = 0.0, e_amax = 0.0, s_amax = 0.0, e_plain = 0.0, ratio = 0.0, ratio0 = 0.0;
        double worst = 0.0, worst0 = 0.0, gl = 0, tl = 0;
        const char *worst_name = "", *worst0_name = "";
        for (int step = 1; step <= steps; step++) {
            float lr = opt.lr;
            double ploss, qloss, norm = twin_fp8_step(&twin, inputs, targets, B, T, micro, &opt, lr, step, &tl);
            double pnorm = twin_fp8_step(&probe, inputs, targets, B, T, micro, &opt, lr, step, &ploss);
            double gnorm = gpu_fp8_step(&g, inputs, targets, B, T, micro, &opt, lr, step, &gl);
            double qnorm = twin_fp8_step(&plain, inputs, targets, B, T, micro, &opt, lr, step, &qloss); // -q off
            double el = fabs(gl - tl) / fabs(tl), en = fabs(gnorm - norm) / fmax(norm, 1e-30);
            e = fmax(e, isnan(el) || isnan(en) ? INFINITY : fmax(el, en));
            sens = fmax(sens, fmax(fabs(ploss - tl) / fabs(tl), fabs(pnorm - norm) / fmax(norm, 1e-30)));
            e_plain = fmax(e_plain, fmax(fabs(gl - qloss) / fabs(qloss), fabs(gnorm - qnorm) / fmax(qnorm, 1e-30)));
            e_amax = fmax(e_amax, fp8_amax_error(&host, &twin));
            s_amax = fmax(s_amax, fp8_amax_error(&probe, &twin));
            if (step == 1) {
                ratio = fp8_gradient_ratio(&g, &twin, &plain, &worst, &worst_name);
                gpu_zero_grad(&g0);
                for (int k = 0; k < micro; k++) {
                    gpu_train_micro_step(&g0, inputs + k * B * T, targets + k * B * T, B, T, 1.0f / micro);
                }
                ratio0 = fp8_gradient_ratio(&g0, &twin, &plain, &worst0, &worst0_name);
            }
        }
        double tol = tolerance(GTOL_STEPS, sens), tol_amax = tolerance(GTOL_STEPS, s_amax);
        check(e <= tol && e_amax <= tol_amax && ratio < 1.0 && ratio0 > 1.0, "gpu fp8 steps, %s -q %s%s, %s weight "
              "gradients: %d steps of %d micro-batches: losses and grad norms (rel err %.1e <= %.1e; sens %.1e; %.1e "
              "from an unrounded run), the delayed operands' amaxes (%.1e <= %.1e; sens %.1e); step 1's gradients: "
              "distance to the FP8 emulation / to the unrounded ones %.2f < 1 (single tensors up to %.2f, %s), without "
              "-q %.2f > 1; last loss %.4f vs twin %.4f", cases[i].preset, FP8_MODE_NAMES[cases[i].mode],
              cases[i].recompute ? ", -r 1" : "", !g.fp8.wgrad8 ? "bf16" : "FP8", steps, micro, e, tol, sens, e_plain,
              e_amax, tol_amax, s_amax, ratio, worst, worst_name, ratio0, gl, tl);
        gpu_free(&g0);
        fox_free(&host0);
        gpu_free(&g);
        g_recompute = 0;
        free(inputs); free(targets);
        fox_free(&twin); fox_free(&probe); fox_free(&plain); fox_free(&host);
    }
}

// Token-major FP8 codes (Fp8Out.codes_t: the FP8 weight gradients) from their five producers: the RMSNorm forward (xm)
// and backward (dresid_x), the SwiGLU forward (act) and backward (dgu), the output norm and gate (y; H 3, hd 48: a lane
// of each row idle), each launched with row-major codes alone and again with token-major codes too and the floatX
// output dropped (Fp8Out.drop), on the same random inputs. N = 160 rows (5 tiles of 32; the RMSNorm backward's chunks
// of 64 end part-filled), C = 136 and I = 264: column tiles part-filled too (the SwiGLU's 256 units). The second launch
// must give the first's row-major codes, amax and other outputs (rstd, dresid, dw, o_normed) bit for bit, leave the
// floatX output untouched, and codes_t[c N + n] = codes[n W + c] for every value; all outputs poisoned first, codes
// with 0xFF (NaN in both formats, which finite inputs never give). Then the transpose of stored codes
// (fp8_transpose_codes_gpu: dqkvg's, dlogits'): random codes, 272 columns (a part-filled column tile), every code in
// its place and nothing else written.
static void gpu_test_fp8_token_major(void) {
    const size_t N = 160;
    const int C = 136, I = 264, k = 3, H = 3, hd = 48; // H hd: the output norm and gate's
    size_t nx = N * 2 * I, nh = 5 * N * C + nx; // the largest tensor, (N, 2I); the random values
    float* h = (float*)malloc_check(nh * sizeof(float), "inputs");
    floatX* hx = (floatX*)malloc_check(nx * sizeof(floatX), "inputs");
    uint8_t *codes[2], *tm = (uint8_t*)malloc_check(nx, "codes");
    char* outs[2];
    size_t out_bytes = nx * sizeof(float) * 2 + 4 * N * sizeof(float) + C * sizeof(float) + sizeof(unsigned);
    for (int r = 0; r < 2; r++) {
        codes[r] = (uint8_t*)malloc_check(nx, "codes");
        outs[r] = (char*)calloc_check(out_bytes, 1, "outputs");
    }
    float *x_d, *w_d, *rstd_d, *dresid_d, *dw_d, *partial_d, *dout_d;
    floatX *out_d, *gu_d, *dact_d, *fwd_d, *on_d; // on_d: the output norm's o_normed
    uint8_t *codes_d, *tm_d;
    unsigned* amax_d;
    int* k_d;
    cudaCheck(cudaMalloc(&x_d, N * C * sizeof(float))); cudaCheck(cudaMalloc(&w_d, H * hd * sizeof(float)));
    cudaCheck(cudaMalloc(&rstd_d, 4 * N * sizeof(float))); cudaCheck(cudaMalloc(&dresid_d, N * C * sizeof(float)));
    cudaCheck(cudaMalloc(&on_d, N * H * hd * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dw_d, C * sizeof(float))); cudaCheck(cudaMalloc(&dout_d, N * C * sizeof(float)));
    cudaCheck(cudaMalloc(&partial_d, ceil_div(N, RMS_BWD_ROWS) * C * sizeof(float)));
    cudaCheck(cudaMalloc(&out_d, nx * sizeof(floatX))); cudaCheck(cudaMalloc(&gu_d, nx * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dact_d, N * I * sizeof(floatX))); cudaCheck(cudaMalloc(&fwd_d, N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&codes_d, nx)); cudaCheck(cudaMalloc(&tm_d, nx));
    cudaCheck(cudaMalloc(&amax_d, sizeof(unsigned))); cudaCheck(cudaMalloc(&k_d, sizeof(int)));
    cudaCheck(cudaMemcpy(k_d, &k, sizeof(int), cudaMemcpyHostToDevice));
    uint64_t rng = 4300;
    for (size_t i = 0; i < nh; i++) { h[i] = (float)rng_normal(&rng); }
    for (size_t i = 0; i < nx; i++) { hx[i] = to_floatX(h[i] * 0.5f); }
    cudaCheck(cudaMemcpy(x_d, h, N * C * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(w_d, h + N * C, H * hd * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dout_d, h + 2 * N * C, N * C * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(gu_d, hx, nx * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dact_d, hx + N, N * I * sizeof(floatX), cudaMemcpyHostToDevice));
    const char* names[5] = {"RMSNorm forward", "RMSNorm backward", "SwiGLU forward", "SwiGLU backward",
                            "output norm and gate"};
    int bad_same = 0, bad_tm = 0, bad_drop = 0, cases = 0;
    for (int kind = 0; kind < 5; kind++) {
        size_t W = kind < 2 ? (size_t)C : kind == 2 ? (size_t)I : kind == 3 ? 2 * (size_t)I : (size_t)H * hd;
        size_t n = N * W;
        for (int r = 0; r < 2; r++) { memset(outs[r], 0, out_bytes); } // nothing left from the last producer
        for (int r = 0; r < 2; r++) { // r = 1: with token-major codes, the floatX output dropped
            cudaCheck(cudaMemset(out_d, 0xFF, nx * sizeof(floatX))); cudaCheck(cudaMemset(codes_d, 0xFF, nx));
            cudaCheck(cudaMemset(tm_d, 0xFF, nx)); cudaCheck(cudaMemset(amax_d, 0, sizeof(unsigned)));
            cudaCheck(cudaMemset(rstd_d, 0xFF, 4 * N * sizeof(float)));
            cudaCheck(cudaMemset(on_d, 0xFF, N * H * hd * sizeof(floatX)));
            cudaCheck(cudaMemcpy(dresid_d, h + 3 * N * C, N * C * sizeof(float), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(dw_d, h + 4 * N * C, C * sizeof(float), cudaMemcpyHostToDevice));
            Fp8Out q = {codes_d, r ? tm_d : NULL, k_d, kind % 2, 1, r, amax_d};
            if (kind == 1) { rmsnorm_forward_gpu(fwd_d, rstd_d, x_d, w_d, N, C); } // rstd for the backward
            if (kind == 0) { rmsnorm_forward_gpu(out_d, rstd_d, x_d, w_d, N, C, q); }
            if (kind == 1) {
                rmsnorm_backward_gpu(dresid_d, out_d, partial_d, dw_d, dout_d, x_d, w_d, rstd_d, N, C, q);
            }
            if (kind == 2) { swiglu_forward_gpu(out_d, gu_d, N, I, q); }
            if (kind == 3) { swiglu_backward_gpu(out_d, dact_d, gu_d, N, I, q); }
            if (kind == 4) { // o and the gate's logits from gu_d
                output_norm_gate_forward_gpu(on_d, out_d, rstd_d, gu_d, gu_d + n, w_d, N, H, hd, 1e-6f, q);
            }
            cudaCheck(cudaDeviceSynchronize());
            char* o = outs[r]; // the outputs: out, dresid (o_normed for kind 4), rstd, dw, amax
            cudaCheck(cudaMemcpy(o, out_d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
            o += nx * sizeof(float);
            if (kind == 4) { cudaCheck(cudaMemcpy(o, on_d, n * sizeof(floatX), cudaMemcpyDeviceToHost)); }
            else { cudaCheck(cudaMemcpy(o, dresid_d, N * C * sizeof(float), cudaMemcpyDeviceToHost)); }
            o += nx * sizeof(float);
            cudaCheck(cudaMemcpy(o, rstd_d, 4 * N * sizeof(float), cudaMemcpyDeviceToHost));
            o += 4 * N * sizeof(float);
            cudaCheck(cudaMemcpy(o, dw_d, C * sizeof(float), cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(o + C * sizeof(float), amax_d, sizeof(unsigned), cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(codes[r], codes_d, nx, cudaMemcpyDeviceToHost));
            if (r == 1) { cudaCheck(cudaMemcpy(tm, tm_d, nx, cudaMemcpyDeviceToHost)); }
        }
        size_t fx = n * sizeof(floatX), kept = 0; // the floatX output: written, then dropped (still the poison)
        for (size_t i = 0; i < fx; i++) { kept += (uint8_t)outs[1][i] != 0xFF; }
        bad_drop += kept > 0;
        int same = memcmp(outs[0] + fx, outs[1] + fx, out_bytes - fx) == 0 && memcmp(codes[0], codes[1], nx) == 0;
        size_t poisoned = 0, wrong = 0;
        for (size_t i = 0; i < n; i++) {
            poisoned += codes[1][i] == 0xFF;
            wrong += tm[(i % W) * N + i / W] != codes[1][i];
        }
        for (size_t i = n; i < nx; i++) { wrong += tm[i] != 0xFF; } // past the tensor: untouched
        bad_same += !same;
        bad_tm += wrong > 0 || poisoned > 0;
        if (!same || wrong > 0 || poisoned > 0 || kept > 0) {
            printf("     %s: same outputs %s, %zu codes left poisoned, %zu token-major codes wrong, %zu floatX bytes "
                   "written though dropped\n", names[kind], same ? "yes" : "no", poisoned, wrong, kept);
        }
        cases++;
    }
    // the transpose of stored codes (dqkvg's, dlogits'): W = 272, a second column tile of 16; random codes but 0xFF
    const int WT = 272;
    uint8_t* src = (uint8_t*)malloc_check(N * WT, "codes");
    for (size_t i = 0; i < N * WT; i++) { src[i] = (uint8_t)(rng_next(&rng) % 255); }
    cudaCheck(cudaMemcpy(codes_d, src, N * WT, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(tm_d, 0xFF, nx));
    fp8_transpose_codes_gpu(tm_d, codes_d, N, WT);
    cudaCheck(cudaMemcpy(tm, tm_d, nx, cudaMemcpyDeviceToHost));
    size_t t_wrong = 0;
    for (size_t i = 0; i < N * WT; i++) { t_wrong += tm[(i % WT) * N + i / WT] != src[i]; }
    for (size_t i = N * WT; i < nx; i++) { t_wrong += tm[i] != 0xFF; }
    free(src);
    check(bad_same == 0 && bad_tm == 0 && bad_drop == 0 && t_wrong == 0, "gpu fp8 token-major codes: %d producers "
          "(RMSNorm forward and backward, SwiGLU forward and backward, output norm and gate; %zu rows, C %d, I %d, "
          "H hd %d x %d): codes, amax and other outputs the same with and without them in %d, codes_t[c N + n] = "
          "codes[n W + c] everywhere in %d, the dropped floatX output untouched in %d; the transpose of %zu x %d "
          "stored codes: %zu wrong", cases, N, C, I, H, hd, cases - bad_same, cases - bad_tm, cases - bad_drop, N, WT,
          t_wrong);
    cudaCheck(cudaFree(x_d)); cudaCheck(cudaFree(w_d)); cudaCheck(cudaFree(rstd_d)); cudaCheck(cudaFree(dresid_d));
    cudaCheck(cudaFree(dw_d)); cudaCheck(cudaFree(dout_d)); cudaCheck(cudaFree(partial_d)); cudaCheck(cudaFree(out_d));
    cudaCheck(cudaFree(gu_d)); cudaCheck(cudaFree(dact_d)); cudaCheck(cudaFree(fwd_d));
    cudaCheck(cudaFree(codes_d)); cudaCheck(cudaFree(tm_d)); cudaCheck(cudaFree(on_d));
    cudaCheck(cudaFree(amax_d)); cudaCheck(cudaFree(k_d));
    for (int r = 0; r < 2; r++) { free(codes[r]); free(outs[r]); }
    free(h); free(hx); free(tm);
}

// -X 1 with -q: tuning picks FP8 plans' candidates too (a second, rounding pass) and changes no bit of training: 3 FP8
// steps of 2 micro-batches, tuned (every plan on its last same-bits candidate) against untuned, losses and weights
static void gpu_test_fp8_tuning(void) {
    BitRun t;
    bit_run_init(&t);
    AdamWConfig opt = {1e-2f, 0.1f, 0.9f, 0.95f, 1e-8f, 1.0f};
    double loss[2][3];
    FoxModel h[2];
    GPUModel g[2];
    int changed = 0, fp8_plans = 0;
    for (int r = 0; r < 2; r++) {
        matmul_plans_drop(0);
        twin_from_config(&h[r], &t.c, 7);
        fp8_setup(&h[r], FP8_MODE_HYBRID);
        gpu_build(&g[r], &h[r], t.B, t.T);
        if (r == 1) {
            test_hooks.tune_last = 1;
            gpu_tune_matmuls(&g[r], t.B, t.T);
            test_hooks.tune_last = 0;
            for (int i = 0; i < g_num_plans; i++) {
                int fp8 = g_plans[i].a_type == CUDA_R_8F_E4M3;
                fp8_plans += fp8 && g_plans[i].tuned;
                changed += fp8 && memcmp(&g_plans[i].algo, &g_plans[i].cand[0], sizeof(g_plans[i].algo)) != 0;
            }
        }
        for (int s = 0; s < 3; s++) {
            gpu_fp8_step(&g[r], t.inputs, t.targets, t.B, t.T, t.micro, &opt, opt.lr, s + 1, &loss[r][s]);
        }
    }
    gpu_params_to_host(&g[1]);
    int same = memcmp(loss[0], loss[1], sizeof(loss[0])) == 0 &&
               gpu_same_as_twin(&g[0], g[0].params, h[1].params_memory) &&
               memcmp(h[0].fp8.history, h[1].fp8.history,
                      (size_t)t.c.n_layer * FP8_SLOTS * h[0].fp8.history_len * sizeof(float)) == 0;
    check(same && fp8_plans > 0 && changed > 0, "gpu fp8 matmul tuning (-q hybrid): %d FP8 plans tuned, %d on another "
          "cuBLASLt algorithm; the same losses, weights and amax histories bit for bit as untuned over 3 steps of 2 "
          "micro-batches: %s (last loss %.6f)", fp8_plans, changed, same ? "yes" : "no", loss[1][2]);
    matmul_plans_drop(0);
    for (int r = 0; r < 2; r++) { gpu_free(&g[r]); fox_free(&h[r]); }
    free(t.inputs); free(t.targets);
}
#endif

// The forget gate's forward (forget_gate_forward_kernel) against fp64: z = xw + b must be the fp32
// sum bit for bit (for the bias-only gate, b whatever gate_logit held: NaN here); c, poisoned with NaN,
// against the fp64 cumulative sum of logsigmoid(z). Every log f is <= 0, so the terms never cancel and
// fp32's logsigmoid (a few ulp per term) keeps |c - ref| within ~5e-7 |ref|; the bound is 2e-6 |ref|,
// while a carry or chunk off by one step is off by a whole |log f_t|, most of |c_t| early on. Shapes:
// T below the block's 1024 threads (one step a thread, most idle), T = 2048, and chunks of 17 and 69
// steps (not multiples of the 8-load batch), the bias-only gate at both kinds of T.
static void gpu_test_forget_gate(void) {
    struct { int B, T, H, has_proj; } cases[] = {{2, 100, 3, 1}, {1, 1000, 2, 0}, {2, 2048, 12, 1}, {2, 16421, 5, 1},
                                                 {1, 16421, 3, 0}, {1, 70000, 2, 1}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int B = cases[k].B, T = cases[k].T, H = cases[k].H, has_proj = cases[k].has_proj;
        size_t n = (size_t)B * T * H;
        uint64_t s = 7000 + k;
        float* xw = (float*)malloc_check(n * sizeof(float), "gate logits");
        float* out = (float*)malloc_check(2 * n * sizeof(float), "gate outputs"); // z, then c
        float* bias = (float*)malloc_check((size_t)H * sizeof(float), "gate biases");
        for (size_t i = 0; i < n; i++) { xw[i] = has_proj ? 3.0f * (float)rng_normal(&s) : NAN; }
        for (int h = 0; h < H; h++) { bias[h] = 2.0f + (float)rng_normal(&s); }
        float *z_d, *c_d, *bias_d;
        cudaCheck(cudaMalloc(&z_d, n * sizeof(float)));
        cudaCheck(cudaMalloc(&c_d, n * sizeof(float)));
        cudaCheck(cudaMalloc(&bias_d, (size_t)H * sizeof(float)));
        cudaCheck(cudaMemcpy(z_d, xw, n * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(bias_d, bias, (size_t)H * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemset(c_d, 0xFF, n * sizeof(float)));
        forget_gate_forward_kernel<<<B * H, GATE_THREADS>>>(c_d, z_d, bias_d, has_proj, B, T, H);
        launchCheck();
        cudaCheck(cudaMemcpy(out, z_d, n * sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(out + n, c_d, n * sizeof(float), cudaMemcpyDeviceToHost));
        int z_same = 1;
        double e_c = 0.0;
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < H; h++) {
                double ref = 0.0;
                for (int t = 0; t < T; t++) {
                    size_t i = ((size_t)b * T + t) * H + h;
                    float z = has_proj ? xw[i] + bias[h] : bias[h];
                    z_same = z_same && memcmp(&z, &out[i], sizeof(float)) == 0;
                    ref += fmin((double)z, 0.0) - log1p(exp(-fabs((double)z)));
                    e_c = nan_max(e_c, fabs(out[n + ((size_t)b * H + h) * T + t] - ref) / fabs(ref));
                }
            }
        }
        check(z_same && e_c <= 2e-6, "gpu forget gate B %d T %d H %d (%s): z = xw + b bit for bit: %s; c rel err %.1e "
              "<= 2e-6", B, T, H, has_proj ? "projected" : "bias only", z_same ? "yes" : "no", e_c);
        cudaCheck(cudaFree(z_d)); cudaCheck(cudaFree(c_d)); cudaCheck(cudaFree(bias_d));
        free(xw); free(out); free(bias);
    }
}

// The head projections (k/v-shift and forget-gate logits: head_proj_forward_gpu and
// head_proj_backward_gpu) against the twin's matmul_forward / matmul_backward on the same
// floatX-rounded inputs: rows not a multiple of 16 or of a block's (HPF_ROWS, HPB_ROWS), C not a
// multiple of a 64-column stage or of HPB_COLS (a last n8 tile alone), odd H (an mma pair j, j + 1
// that spans two projections), every NP = ceil(P * H / 16) from 1 to 6 (P * H = 96 at the limit
// HP_MAX_J), and the 125m and 760m shapes (C = 768, P * H = 36; C = 1536, P * H = 72). Outputs and
// dx are NaN-poisoned first (dx is written, not accumulated); dw starts from random values and
// accumulates. The whole-model diffs cover them too (every fixture with a shift or the full gate).
static void gpu_test_head_proj(void) {
    struct { int N, C, H, P; } cases[] = {{70, 200, 5, 3},   {300, 520, 32, 3},  {33, 136, 12, 2}, {17, 64, 12, 1},
                                          {257, 768, 12, 3}, {150, 1536, 24, 3}, {131, 328, 21, 3}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t N = (size_t)cases[i].N, C = (size_t)cases[i].C, H = (size_t)cases[i].H;
        int P = cases[i].P;
        uint64_t s = 4000 + i;
        float* x = attn_buf(N * C);
        for (size_t k = 0; k < N * C; k++) { x[k] = to_float(to_floatX((float)rng_normal(&s))); }
        float* dx_ref = attn_buf(N * C);
        float* dx = attn_buf(N * C);
        floatX* x_d = attn_upload(x, N * C);
        float* dx_d;
        cudaCheck(cudaMalloc(&dx_d, N * C * sizeof(float)));
        cudaCheck(cudaMemset(dx_d, 0xFF, N * C * sizeof(float)));
        float *w[HP_MAX], *dout[HP_MAX], *out_ref[HP_MAX], *dw_ref[HP_MAX], *out[HP_MAX], *dw[HP_MAX];
        HeadProj hp;
        memset(&hp, 0, sizeof(hp));
        hp.count = P;
        size_t J = (size_t)P * H;
        float* dout_all = attn_buf(N * J); // the P douts side by side, as gpu_backward lays them out
        cudaCheck(cudaMalloc(&hp.dw, J * C * sizeof(float))); // the P weight gradients side by side
        for (int p = 0; p < P; p++) {
            w[p] = attn_buf(H * C); dout[p] = attn_buf(N * H); dw_ref[p] = attn_buf(H * C);
            out_ref[p] = attn_buf(N * H); out[p] = attn_buf(N * H); dw[p] = attn_buf(H * C);
            for (size_t k = 0; k < H * C; k++) { w[p][k] = to_float(to_floatX(0.05f * (float)rng_normal(&s))); }
            for (size_t k = 0; k < N * H; k++) { dout[p][k] = to_float(to_floatX((float)rng_normal(&s))); }
            for (size_t k = 0; k < H * C; k++) { dw_ref[p][k] = (float)rng_normal(&s); }
            matmul_forward(out_ref[p], x, w[p], NULL, N, (int)C, (int)H);
            hp.w[p] = attn_upload(w[p], H * C);
            for (size_t n = 0; n < N; n++) { memcpy(dout_all + n * J + p * H, dout[p] + n * H, H * sizeof(float)); }
            cudaCheck(cudaMalloc(&hp.out[p], N * H * sizeof(float)));
            cudaCheck(cudaMemset(hp.out[p], 0xFF, N * H * sizeof(float)));
            cudaCheck(cudaMemcpy(hp.dw + p * H * C, dw_ref[p], H * C * sizeof(float), cudaMemcpyHostToDevice));
            matmul_backward(dx_ref, dw_ref[p], NULL, dout[p], x, w[p], N, (int)C, (int)H);
        }
        hp.dout = attn_upload(dout_all, N * J);
        head_proj_forward_gpu(&hp, x_d, N, (int)C, (int)H);
        head_proj_backward_gpu(dx_d, &hp, x_d, N, (int)C, (int)H);
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy(dx, dx_d, N * C * sizeof(float), cudaMemcpyDeviceToHost));
        double e_out = 0.0, e_dw = 0.0, e_dx = rel_max_error(dx, dx_ref, N * C);
        for (int p = 0; p < P; p++) {
            cudaCheck(cudaMemcpy(out[p], hp.out[p], N * H * sizeof(float), cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(dw[p], hp.dw + p * H * C, H * C * sizeof(float), cudaMemcpyDeviceToHost));
            e_out = fmax(e_out, rel_max_error(out[p], out_ref[p], N * H));
            e_dw = fmax(e_dw, rel_max_error(dw[p], dw_ref[p], H * C));
            cudaCheck(cudaFree((void*)hp.w[p])); cudaCheck(cudaFree(hp.out[p]));
            free(w[p]); free(dout[p]); free(out_ref[p]); free(dw_ref[p]); free(out[p]); free(dw[p]);
        }
        check(e_out <= 1e-4 && e_dx <= 1e-4 && e_dw <= 1e-4,
              "gpu head projections N=%d C=%d H=%d P=%d against the twin's matmuls: out %.1e, dx %.1e, dw %.1e "
              "(max |err| / max |twin|, tolerance 1e-4)", cases[i].N, cases[i].C, cases[i].H, P, e_out, e_dx, e_dw);
        cudaCheck(cudaFree(x_d)); cudaCheck(cudaFree(dx_d));
        cudaCheck(cudaFree((void*)hp.dout)); cudaCheck(cudaFree(hp.dw));
        free(x); free(dx_ref); free(dx); free(dout_all);
    }
}

// ----------------------------------------------------------------------------
// GPU: documents kept apart (-f 1): the attention kernels, the tables, the gate's scan and the KV-shift with
// documents against the twin's functions on the same inputs, then the whole model (gpu_test_documents_model)

#ifndef ENABLE_FP32
// The tables with documents: fox_prune_tables against the twin's prune_tiles from the same U, c and document starts,
// without the decay bound (c NULL: -f 1 -A 0) and with it (-A 1), at lengths where the scans take several 32-tile
// steps; some tiles must be skipped by the documents alone. Then the pruned attention with documents (-A 1 -f 1)
// through the trainer's boundary against the twin's attention pruned by its own tables, at the dense tolerances.
static void gpu_test_documents_tables(void) {
    struct { int B, T, H, hd, mean_len; float ln_eps; } cases[] = {
        {2, 1000, 4, 64, 200, -10.0f}, {1, 9000, 2, 128, 600, -10.0f}, {2, 9000, 4, 64, 3000, -10.0f},
        {1, 1100, 4, 128, 150, 60.0f},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int B = cases[i].B, T = cases[i].T, H = cases[i].H, hd = cases[i].hd;
        AttnCase t;
        attn_case_init(&t, B, T, H, hd, 0, 1, 501 + i);
        attn_case_documents(&t, cases[i].mean_len, 0, 601 + i);
        size_t n = (size_t)B * T * H * hd, nh = (size_t)B * H * T, BH = (size_t)B * H;
        int nt = ceil_div(T, PRUNE_BLOCK);
        floatX *q = attn_upload(t.q, n), *k = attn_upload(t.k, n);
        float *c, *U;
        float2* partial;
        int *tables, *doc;
        cudaCheck(cudaMalloc(&c, nh * sizeof(float))); cudaCheck(cudaMalloc(&U, BH * sizeof(float)));
        cudaCheck(cudaMalloc(&partial, BH * ceil_div(T, PRUNE_NORM_ROWS) * sizeof(float2)));
        cudaCheck(cudaMalloc(&tables, 2 * BH * nt * sizeof(int)));
        cudaCheck(cudaMalloc(&doc, 2 * (size_t)B * T * sizeof(int)));
        cudaCheck(cudaMemcpy(c, t.c, nh * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(doc, t.doc, 2 * (size_t)B * T * sizeof(int), cudaMemcpyHostToDevice));
        FoxDocs fd = {doc, doc + (size_t)B * T};
        int* tab_gpu = (int*)malloc_check(2 * BH * nt * sizeof(int), "tiles");
        int* tab_cpu = (int*)malloc_check(2 * BH * nt * sizeof(int), "tiles");
        float* U_gpu = (float*)malloc_check(BH * sizeof(float), "U");
        int same[2], skipped[2];
        for (int decay = 0; decay < 2; decay++) {
            cudaCheck(cudaMemset(tables, 0xFF, 2 * BH * nt * sizeof(int)));
            fox_prune_tables(tables, U, partial, q, k, decay ? c : NULL, B, T, H, hd, H * hd, cases[i].ln_eps, &fd, 0);
            cudaCheck(cudaMemcpy(tab_gpu, tables, 2 * BH * nt * sizeof(int), cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(U_gpu, U, BH * sizeof(float), cudaMemcpyDeviceToHost));
            prune_tiles(tab_cpu, tab_cpu + BH * nt, t.c, decay ? U_gpu : NULL, t.doc, B, H, T, PRUNE_BLOCK,
                        cases[i].ln_eps);
            same[decay] = memcmp(tab_gpu, tab_cpu, 2 * BH * nt * sizeof(int)) == 0;
            skipped[decay] = 0;
            for (size_t j = 0; j < BH * nt; j++) { skipped[decay] += tab_cpu[j]; }
        }
        // the pruned attention with documents, at short lengths (the twin's attention is O(T^2))
        char line[512] = "not run (long rows)";
        int ok = 1;
        if (T <= 1100) {
            AttnPrune pr = {PRUNE_BLOCK, tab_cpu}; // the last tables: with the decay bound
            attention_set_pruning(1, cases[i].ln_eps);
            attn_gpu(&t);
            attention_set_pruning(0, -10.0);
            attn_reference(&t, t.window, &pr);
            ok = attn_compare(&t, line, sizeof(line));
        }
        check(same[0] && same[1] && skipped[0] > 0 && skipped[1] >= skipped[0] && ok,
              "gpu tables with documents B=%d T=%d H=%d hd=%d (%d starts, ln eps %g): the documents' tables (-A 0) %s "
              "the twin's (%d key tiles skipped), with the decay bound (-A 1) %s (%d); pruned attention against the "
              "twin's pruned reference: %s", B, T, H, hd, doc_starts_count(t.doc, B, T), cases[i].ln_eps,
              same[0] ? "equal" : "DIFFER from", skipped[0], same[1] ? "equal" : "DIFFER", skipped[1], line);
        void* bufs[] = {q, k, c, U, partial, tables, doc};
        for (size_t j = 0; j < sizeof(bufs) / sizeof(bufs[0]); j++) { cudaCheck(cudaFree(bufs[j])); }
        free(tab_gpu); free(tab_cpu); free(U_gpu);
        attn_case_free(&t);
    }
}
#endif

// The gate's backward scan with documents (fox_bwd_dlogf_gpu, then forget_gate_backward_gpu) against the twin's rule
// in fp64: dlogf_t = sum of dc over s >= t in t's document, 0 at a start t0 > 0, and the gate logit's gradient there
// exactly 0. Lengths from one position a scan thread (T <= 1024) to chunks of 69; documents from two positions to
// longer than a chunk, and starts on chunk boundaries (every chunk-th position in a stretch). fp64 inside and one
// rounding to fp32: 1e-6 of max |dlogf| (a start missed or misplaced moves a value by O(1) of it; the control below
// runs the scan without documents).
static void gpu_test_documents_gate_scan(void) {
    struct { int B, T, H, mean_len; } cases[] = {{2, 100, 3, 7}, {1, 3000, 2, 50}, {2, 16421, 5, 300},
                                                 {1, 70000, 2, 2000}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int B = cases[k].B, T = cases[k].T, H = cases[k].H, chunk = ceil_div(T, FOX_SCAN_THREADS);
        size_t n = (size_t)B * H * T;
        int* doc = doc_layout(B, T, cases[k].mean_len, 0, 900 + k);
        for (int b = 0; b < B; b++) { // starts on chunk boundaries in the middle third
            for (int t = T / 3; t < 2 * T / 3; t += 7 * chunk) { doc[(size_t)b * T + t] = t; }
        }
        for (int b = 0; b < B; b++) { // the starts and ends of the edited layout
            int* inputs = (int*)calloc_check((size_t)T, sizeof(int), "test");
            for (int t = 0; t < T; t++) { inputs[t] = doc[(size_t)b * T + t] == t; }
            document_starts(doc + (size_t)b * T, inputs, 1, T, 1);
            free(inputs);
        }
        document_ends(doc + (size_t)B * T, doc, B, T);
        uint64_t s = 9100 + k;
        float* host = (float*)malloc_check(4 * n * sizeof(float), "test"); // dc_col, dc_row, dlogf, gate logits
        for (size_t i = 0; i < 2 * n; i++) { host[i] = (float)rng_normal(&s); }
        for (size_t i = 3 * n; i < 4 * n; i++) { host[i] = 2.0f * (float)rng_normal(&s); }
        float* dev;
        int* doc_d;
        cudaCheck(cudaMalloc(&dev, 5 * n * sizeof(float))); // + dz
        cudaCheck(cudaMalloc(&doc_d, 2 * (size_t)B * T * sizeof(int)));
        cudaCheck(cudaMemcpy(dev, host, 4 * n * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(doc_d, doc, 2 * (size_t)B * T * sizeof(int), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemset(dev + 2 * n, 0xFF, n * sizeof(float)));
        cudaCheck(cudaMemset(dev + 4 * n, 0xFF, n * sizeof(float)));
        FoxDocs fd = {doc_d, doc_d + (size_t)B * T};
        double err[2] = {0.0, 0.0}, scale = 1e-30;
        int zero_dlogf = 1, zero_dz = 1, starts = 0;
        float* got = (float*)malloc_check(2 * n * sizeof(float), "test"); // dlogf (B, H, T), dz (B, T, H)
        for (int apart = 1; apart >= 0; apart--) { // apart 0: the scan without documents, the negative control
            fox_bwd_dlogf_gpu(dev + 2 * n, dev, dev + n, B, T, H, apart ? &fd : NULL, 0);
            forget_gate_backward_gpu(dev + 4 * n, NULL, 0, dev + 2 * n, dev + 3 * n, B, T, H);
            cudaCheck(cudaMemcpy(got, dev + 2 * n, n * sizeof(float), cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(got + n, dev + 4 * n, n * sizeof(float), cudaMemcpyDeviceToHost));
            for (size_t bh = 0; bh < (size_t)B * H; bh++) {
                const int* db = doc + bh / H * T;
                double acc = 0.0;
                for (int t = T - 1; t >= 0; t--) {
                    if (t + 1 < T && db[t + 1] == t + 1) { acc = 0.0; }
                    acc += (double)host[bh * T + t] + host[n + bh * T + t];
                    int start = t > 0 && db[t] == t;
                    double ref = start ? 0.0 : acc, d = fabs(got[bh * T + t] - ref);
                    err[apart] = isnan(d) ? INFINITY : fmax(err[apart], d);
                    scale = fmax(scale, fabs(ref));
                    if (apart && start) {
                        starts++;
                        zero_dlogf &= got[bh * T + t] == 0.0f;
                        zero_dz &= got[n + ((bh / H) * T + t) * H + bh % H] == 0.0f;
                    }
                }
            }
        }
        check(err[1] / scale <= 1e-6 && zero_dlogf && zero_dz && err[0] / scale > 1e-2,
              "gpu gate scan with documents B=%d T=%d H=%d (chunks of %d, %d starts): dlogf rel err %.1e <= 1e-6, "
              "exactly 0 at every start t0 > 0 (%s), the gate logit's gradient too (%s); without documents the scan "
              "misses by %.1e > 1e-2", B, T, H, chunk, starts, err[1] / scale, zero_dlogf ? "yes" : "NO",
              zero_dz ? "yes" : "NO", err[0] / scale);
        cudaCheck(cudaFree(dev)); cudaCheck(cudaFree(doc_d));
        free(host); free(got); free(doc);
    }
}

// The KV-shift kernels with documents (both sets, k and v, in one launch) against the twin's kv_shift_forward /
// _backward on the same floatX-rounded inputs: raw_{t-1} = 0 at a start, and t - 1 gets nothing from t. Per element
// |gpu - twin| <= tol |twin| + 1e-6 for out and draw (one rounding to floatX of a two-term sum: tol 4e-3 = 2^-9 plus
// the sigmoid's ulps in bf16, 1e-5 in fp32), dalpha within tol of max |dalpha| (a sum over hd, in another order, then
// rounded); control: the twin without documents misses at the starts by more than 10 tol.
static void gpu_test_documents_kv_shift(void) {
    struct { int B, T, H, hd, mean_len; } cases[] = {{2, 300, 3, 64, 20}, {1, 257, 2, 128, 3}, {2, 70, 4, 16, 6}};
#ifdef ENABLE_FP32
    const double tol = 1e-5;
#else
    const double tol = 4e-3;
#endif
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int B = cases[k].B, T = cases[k].T, H = cases[k].H, hd = cases[k].hd;
        size_t N = (size_t)B * T, C = (size_t)H * hd, NC = N * C, NH = N * H;
        int* doc = doc_layout(B, T, cases[k].mean_len, 0, 1300 + k);
        uint64_t s = 1400 + k;
        float* h = (float*)malloc_check((2 * NC + NH) * sizeof(float), "test"); // raw, dout, alpha logits
        for (size_t i = 0; i < 2 * NC; i++) { h[i] = to_float(to_floatX((float)rng_normal(&s))); }
        for (size_t i = 0; i < NH; i++) { h[2 * NC + i] = 2.0f * (float)rng_normal(&s); }
        float* alpha = (float*)malloc_check(NH * sizeof(float), "test");
        for (size_t i = 0; i < NH; i++) { alpha[i] = sigmoidf(h[2 * NC + i]); }
        floatX *raw = attn_upload(h, NC), *dout = attn_upload(h + NC, NC), *out, *draw, *dal;
        float* al;
        int* doc_d;
        cudaCheck(cudaMalloc(&out, 2 * NC * sizeof(floatX))); cudaCheck(cudaMalloc(&draw, 2 * NC * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dal, 2 * NH * sizeof(floatX))); cudaCheck(cudaMalloc(&al, NH * sizeof(float)));
        cudaCheck(cudaMalloc(&doc_d, 2 * N * sizeof(int)));
        cudaCheck(cudaMemcpy(al, h + 2 * NC, NH * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(doc_d, doc, 2 * N * sizeof(int), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemset(out, 0xFF, 2 * NC * sizeof(floatX)));
        cudaCheck(cudaMemset(draw, 0xFF, 2 * NC * sizeof(floatX)));
        cudaCheck(cudaMemset(dal, 0xFF, 2 * NH * sizeof(floatX)));
        FoxDocs fd = {doc_d, doc_d + N};
        KVShiftSet set[2] = {{out, raw, al}, {out + NC, raw, al}};
        kv_shift_forward_gpu(set, 2, N, T, H, hd, &fd);
        KVShiftGradSet gset[2] = {{draw, dal, dout, raw, al}, {draw + NC, dal + NH, dout, raw, al}};
        kv_shift_backward_gpu(gset, 2, (int)C, H, N, T, H, hd, &fd);
        float* g = (float*)malloc_check((4 * NC + 2 * NH) * sizeof(float), "test"); // out x2, draw x2, dalpha x2
        attn_download(g, out, 2 * NC); attn_download(g + 2 * NC, draw, 2 * NC); attn_download(g + 4 * NC, dal, 2 * NH);
        float* r = (float*)calloc_check(2 * NC + NH, sizeof(float), "test"); // the twin's out, draw, dalpha
        double e_out = 0.0, e_draw = 0.0, e_dal = 0.0, miss = 0.0, dal_max = 1e-30;
        for (int apart = 1; apart >= 0; apart--) {
            memset(r, 0, (2 * NC + NH) * sizeof(float));
            kv_shift_forward(r, h, alpha, apart ? doc : NULL, B, T, H, hd);
            kv_shift_backward(r + NC, r + 2 * NC, h + NC, h, alpha, apart ? doc : NULL, B, T, H, hd);
            for (int set_i = 0; set_i < 2; set_i++) {
                for (size_t i = 0; i < NC; i++) {
                    double eo = fabs(g[set_i * NC + i] - r[i]) - tol * fabs(r[i]) - 1e-6;
                    double ed = fabs(g[2 * NC + set_i * NC + i] - r[NC + i]) - tol * fabs(r[NC + i]) - 1e-6;
                    if (apart) { e_out = nan_max(e_out, eo); e_draw = nan_max(e_draw, ed); }
                    else { miss = fmax(miss, fmax(eo, ed) / tol); }
                }
                for (size_t i = 0; i < NH && apart; i++) {
                    dal_max = fmax(dal_max, fabs(r[2 * NC + i]));
                    e_dal = nan_max(e_dal, fabs(g[4 * NC + set_i * NH + i] - r[2 * NC + i]));
                }
            }
        }
        check(e_out <= 0.0 && e_draw <= 0.0 && e_dal / dal_max <= tol && miss > 10.0,
              "gpu KV-shift with documents B=%d T=%d H=%d hd=%d (%d starts), k and v: out and draw within %.0e of the "
              "twin's (worst excess %.1e, %.1e), dalpha %.1e of max <= %.0e; the twin without documents misses by %.0f "
              "tol", B, T, H, hd, doc_starts_count(doc, B, T), tol, e_out, e_draw, e_dal / dal_max, tol, miss);
        void* bufs[] = {raw, dout, out, draw, dal, al, doc_d};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { cudaCheck(cudaFree(bufs[i])); }
        free(h); free(alpha); free(g); free(r); free(doc);
    }
}

// -f 1 on batches with one context a sequence (no EOT, or one at position 0 only) runs the DOCS kernels on documents
// that change nothing: the loss and every gradient bit for bit those of -f 0, with and without -A 1, on the fused
// kernels (hd 64, FoX; hd 128, a Transformer) and the simple ones (hd 16): the documents' paths add no arithmetic.
static void gpu_test_documents_one_context(void) {
    struct { const char* preset; int n_embd, n_head; } cases[] = {
        {"fox-pro-tiny", 128, 2}, {"transformer-pro-tiny", 128, 1}, {"fox-pro-tiny", 32, 2}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        FoxConfig c;
        test_config(&c, cases[i].preset, cases[i].n_embd, cases[i].n_head, NULL, NULL);
#ifndef ENABLE_FP32
        test_hooks.attention_any_head = c.n_embd / c.n_head == 16;
#endif
        FoxModel twin;
        twin_from_config(&twin, &c, 27 + i);
        enum { B = 2, T = 300 };
        int inputs[B * T], targets[B * T];
        random_tokens(inputs, B * T, c.vocab_size - 1, 2100 + i);
        random_tokens(targets, B * T, c.vocab_size, 2200 + i);
        GPUModel g;
        gpu_build(&g, &twin, B, T);
        size_t np = g.num_parameters;
        float* grads = (float*)malloc_check(2 * np * sizeof(float), "gradients");
        int same = 1, runs = 0;
#ifndef ENABLE_FP32
        int prune_max = attention_fused(c.n_embd / c.n_head) && c.gate != GATE_NONE; // -A 1 runs in the fused kernels
#else
        int prune_max = 0;
#endif
        for (int eot0 = 0; eot0 < 2; eot0++) {
            inputs[0] = eot0 ? c.vocab_size - 1 : 1;
            for (int prune = 0; prune <= prune_max; prune++) {
                attention_set_pruning(prune, -10.0);
                float loss[2];
                for (int apart = 0; apart < 2; apart++) {
                    twin.doc_eot = apart ? c.vocab_size - 1 : -1;
                    gpu_poison(&g);
                    gpu_zero_grad(&g);
                    gpu_forward_train(&g, inputs, targets, B, T, 1.0f);
                    gpu_backward(&g);
                    loss[apart] = g.mean_loss;
                    gpu_download(&g, g.grads, grads + apart * np);
                }
                same &= loss[0] == loss[1] && memcmp(grads, grads + np, np * sizeof(float)) == 0;
                runs++;
            }
        }
        attention_set_pruning(0, -10.0);
        twin.doc_eot = -1;
        check(same, "gpu documents (-f 1): %s C=%d hd=%d, one context a sequence (no EOT; an EOT at 0)%s: the loss and "
              "every gradient of -f 0 bit for bit (%d runs)", cases[i].preset, c.n_embd, c.n_embd / c.n_head,
              prune_max ? ", -A 0 and 1" : "", runs);
#ifndef ENABLE_FP32
        test_hooks.attention_any_head = 0;
#endif
        free(grads);
        gpu_free(&g);
        fox_free(&twin);
    }
}

void run_gpu_tests(void) {
    char why[256];
    if (!gpu_available(why, sizeof(why))) {
        printf("skipped: no GPU (%s): GPU against twin on every fixture\n", why);
        printf("skipped: no GPU (%s): head sizes 64/128, windows, accumulation\n", why);
        printf("skipped: no GPU (%s): attention kernels against the twin's attention\n", why);
        printf("skipped: no GPU (%s): head projections against the twin's matmuls\n", why);
        printf("skipped: no GPU (%s): the cross-entropy kernel against fp64\n", why);
        printf("skipped: no GPU (%s): the forget gate's cumulative sum against fp64\n", why);
        printf("skipped: no GPU (%s): determinism, checkpoints both ways, resume\n", why);
        printf("skipped: no GPU (%s): matmul tuning: the same bits as untuned\n", why);
        printf("skipped: no GPU (%s): the micro-step's CUDA graph: the same bits as without\n", why);
        printf("skipped: no GPU (%s): -r 1 against -r 0, bit for bit\n", why);
        printf("skipped: no GPU (%s): ZeRO-1 slices against one process\n", why);
        printf("skipped: no GPU (%s): evaluation modes through the GPU backend\n", why);
        printf("skipped: no GPU (%s): documents kept apart (-f 1): kernels, tables, gate scan, KV-shift, model\n", why);
        return;
    }
    gpu_init();
    printf("GPU tests on %s, %s build\n", g_prop.name, PRECISION_NAME);
    glob_t gl;
    if (glob("dev/fixtures/*.fxds", 0, NULL, &gl) != 0 || gl.gl_pathc == 0) {
        check(0, "gpu: no reference fixtures in dev/fixtures");
    } else {
#ifndef ENABLE_FP32
        test_hooks.attention_any_head = 1; // the fixtures' head size 16 runs on the simple attention kernel
#endif
        for (size_t i = 0; i < gl.gl_pathc; i++) { gpu_test_fixture(gl.gl_pathv[i]); }
#ifndef ENABLE_FP32
        test_hooks.attention_any_head = 0;
#endif
        globfree(&gl);
    }
    gpu_test_head_proj();
    gpu_test_rmsnorm();
    gpu_test_forget_gate();
    gpu_test_crossentropy();
    gpu_test_attention();
    gpu_test_attention_rescale();
#ifndef ENABLE_FP32
    gpu_test_attention_pruning();
#endif
    gpu_test_larger_heads();
    gpu_test_checkpoints_and_determinism();
    gpu_test_matmul_tuning();
    gpu_test_step_graphs();
    gpu_test_recompute();
#ifndef ENABLE_FP32
    test_hooks.attention_any_head = 1; // head size 32: the padded parameter count matters here, not the kernel
#endif
    gpu_test_zero_slices();
#ifndef ENABLE_FP32
    test_hooks.attention_any_head = 0;
#endif
    gpu_test_eval_backend(0);
    gpu_test_eval_backend(1);
#ifndef ENABLE_FP32
    gpu_test_documents_tables();
#endif
    gpu_test_documents_gate_scan();
    gpu_test_documents_kv_shift();
    gpu_test_documents_one_context();
}
#endif // __CUDACC__

// ----------------------------------------------------------------------------
// generation with several prompts (-M generate -D): the prompts' lengths and sources, and bad input
// (plain C, shared by both trainers; on the GPU build also the memory check of the GPU decoder)

static void generate_prompts_child(const void* arg) {
    const char* const* argv = (const char* const*)arg;
    int argc = 0;
    while (argv[argc] != NULL) { argc++; }
    Args a;
    parse_args(&a, argc, (char**)argv);
    int *tokens, *lens, cap;
    generate_prompts(&a, &tokens, &lens, &cap);
}

#ifdef __CUDACC__
static void gpu_memory_child(const void* arg) {
    (void)arg; // 32 prompts of 32768 tokens of fox-pro-760m against 80 GB
    FoxConfig c;
    if (!config_from_preset(&c, "fox-pro-760m")) { return; }
    c.mlp_hidden = derived_mlp_hidden(c.n_embd, c.block);
    size_t pages = decoder_worst_pages(&c, 32, 32832);
    size_t need = gpu_generate_bytes(&c, 32, 32768, 32, 32832, pages);
    gpu_generate_check_memory(need, (size_t)80 << 30, 32, 32832, pages * decoder_page_bytes(&c));
}
#endif

static void test_generate_prompts(void) {
    enum { N = 40 };
    uint16_t shard[N];
    for (int i = 0; i < N; i++) { shard[i] = (uint16_t)(11 * i + 5); }
    char path[512], arg[520];
    snprintf(path, sizeof(path), "%s/gen_prompts_000000.bin", test_dir);
    write_shard(path, shard, N, SHARD_MAGIC, N);
    snprintf(arg, sizeof(arg), "@%s", path);
    static const char* base[] = {"train_fox", "-M", "generate", "-t", "32", "-g", "4", "-D", "5,7*2,1", "-P", NULL};
    const char* argv[16];
    memcpy(argv, base, sizeof(base));
    argv[10] = arg; argv[11] = NULL;
    Args a;
    parse_args(&a, 11, (char**)argv);
    int *tokens, *lens, cap;
    int B = generate_prompts(&a, &tokens, &lens, &cap);
    int ok = B == 4 && cap == 7 + 4 && lens[0] == 5 && lens[1] == 7 && lens[2] == 7 && lens[3] == 1;
    int off = 0;
    for (int b = 0; ok && b < B; b++) {
        for (int t = 0; t < lens[b]; t++) { ok &= tokens[(size_t)b * cap + t] == shard[off + t]; }
        off += lens[b];
    }
    check(ok, "generate -D 5,7*2,1 from a shard: %d prompts of 5, 7, 7, 1 tokens, consecutive pieces of it", B);
    free(tokens); free(lens);
    static const char* d_long[] = {"train_fox", "-M", "generate", "-t", "32", "-g", "4", "-D", "30", "-P", NULL, NULL};
    static const char* d_short[] = {"train_fox", "-M", "generate", "-t", "64", "-g", "4", "-D", "30*2", "-P", NULL,
                                    NULL};
    static const char* d_zero[] = {"train_fox", "-M", "generate", "-t", "64", "-g", "4", "-D", "8*0", "-P", NULL, NULL};
    static const char* g_long[] = {"train_fox", "-M", "generate", "-t", "32", "-g", "40", "-D", "3", "-P", NULL, NULL};
    d_long[10] = d_short[10] = d_zero[10] = g_long[10] = arg;
    expect_failure(generate_prompts_child, d_long, "generate -D 30 with -g 4 and -t 32 (a prompt longer than -t - -g)");
    expect_failure(generate_prompts_child, g_long, "generate -g 40 with -t 32 (-g that does not fit)");
    expect_failure(generate_prompts_child, d_short, "generate -D 30*2 from a shard of 40 tokens");
    expect_failure(generate_prompts_child, d_zero, "generate -D 8*0");
#ifdef __CUDACC__
    expect_failure(gpu_memory_child, NULL, "GPU generate: 32 prompts of 32768 tokens of fox-pro-760m in 80 GB");
#endif
}

#ifdef __CUDACC__
// ----------------------------------------------------------------------------
// generation on the GPU (GpuDecoder) against the twin's KV cache (FoxDecoder): the sampler on
// given logits, then whole models: greedy tokens and next-token logits step by step.
// Tolerance of the logits: the bf16 forward's (GTOL_LOGITS, or GTOL_SENS times the twin's own
// error with bf16-rounded weights, as for the whole-model diffs above): a decode step rounds the
// same values as the forward (the weights, the normed inputs, q, k, v, o, y, act; the cache holds
// the forward's bf16 k and v), so its error has the forward's size. Greedy tokens must equal the
// twin's argmax; where they differ the twin's own top two must lie within 2 tol of each other (a
// tie at the resolution of the logits, counted and printed). The twin is fed the GPU's tokens, so
// the sequences never part.

// 0xFF (NaN) in the cache pages and every activation the decoder writes: a slot read before it is
// written, or a masked key that leaks into a sum, shows up
static void gen_poison(GpuDecoder* d) {
    size_t kv = (size_t)d->pool_pages * KV_PAGE * d->hd, B = (size_t)d->max_B;
    cudaCheck(cudaMemset(d->pool_k, 0xFF, kv * sizeof(floatX)));
    cudaCheck(cudaMemset(d->pool_v, 0xFF, kv * sizeof(floatX)));
    cudaCheck(cudaMemset(d->pool_c, 0xFF, (size_t)d->pool_pages * KV_PAGE * sizeof(float)));
    cudaCheck(cudaMemset(d->resid, 0xFF, B * d->C * sizeof(float)));
    cudaCheck(cudaMemset(d->proj, 0xFF, B * d->proj_cols * sizeof(float)));
    cudaCheck(cudaMemset(d->part_m, 0xFF, (size_t)d->part_rows * sizeof(float)));
    cudaCheck(cudaMemset(d->part_l, 0xFF, (size_t)d->part_rows * sizeof(float)));
    cudaCheck(cudaMemset(d->part_o, 0xFF, (size_t)d->part_rows * d->hd * sizeof(float)));
    cudaCheck(cudaMemset(d->y, 0xFF, B * d->C * sizeof(floatX)));
    cudaCheck(cudaMemset(d->gu, 0xFF, B * 2 * d->I * sizeof(float)));
    cudaCheck(cudaMemset(d->logits, 0xFF, B * d->Vp * sizeof(float)));
    cudaCheck(cudaDeviceSynchronize()); // the decoder's stream does not wait for the legacy one
}

// The GPU sampler (sample_kernel) against the twin's sample_token on the same fp32 logits and the
// same splitmix64 streams: 4 rows (one with many tied maxima, the others bf16-rounded normals with
// ties), 64 draws each, every (temperature, top-k) rule; the tokens must be the same (the fp64
// sums differ in order only: a draw may differ only within ~1e-16 of a boundary). Top-k beyond
// SAMPLE_SORT walks in id order: its tokens must lie in the top k.
static void gpu_gen_test_sampler(void) {
    int vocabs[2] = {50257, 1000};
    struct { double T; int k; } rules[] = {{0.0, 0}, {0.7, 0}, {1.3, 40}, {1.0, 1}, {2.0, 2}, {1.5, 1000}, {1.0, 3000}};
    enum { B = 4, DRAWS = 64 };
    for (int vi = 0; vi < 2; vi++) {
        int V = vocabs[vi], Vp = (int)ceil_div((size_t)V, 128) * 128;
        float* logits = (float*)malloc_check((size_t)B * Vp * sizeof(float), "test");
        uint64_t s = 99 + vi;
        for (int b = 0; b < B; b++) {
            for (int j = 0; j < Vp; j++) {
                float x = b == 3 ? (float)(rng_next(&s) % 3) : (float)(3.0 * rng_normal(&s));
                logits[(size_t)b * Vp + j] = j < V ? __bfloat162float(__float2bfloat16(x)) : NAN;
            }
        }
        float* logits_d;
        int* tokens_d;
        uint64_t* rng_d;
        cudaCheck(cudaMalloc(&logits_d, (size_t)B * Vp * sizeof(float)));
        cudaCheck(cudaMalloc(&tokens_d, B * sizeof(int)));
        cudaCheck(cudaMalloc(&rng_d, B * sizeof(uint64_t)));
        cudaCheck(cudaMemcpy(logits_d, logits, (size_t)B * Vp * sizeof(float), cudaMemcpyHostToDevice));
        for (size_t r = 0; r < sizeof(rules) / sizeof(rules[0]); r++) {
            uint64_t host[B], dev[B];
            for (int b = 0; b < B; b++) { host[b] = dev[b] = generate_seed(1234 + r, b); }
            cudaCheck(cudaMemcpy(rng_d, dev, sizeof(dev), cudaMemcpyHostToDevice));
            int same = 0, total = 0, in_top = 1, k = rules[r].k;
            for (int i = 0; i < DRAWS; i++) {
                cudaCheck(cudaMemset(tokens_d, 0xFF, B * sizeof(int)));
                sample_kernel<<<B, SAMPLE_THREADS>>>(tokens_d, logits_d, Vp, V, rng_d, rules[r].T, k);
                launchCheck();
                int got[B];
                cudaCheck(cudaMemcpy(got, tokens_d, sizeof(got), cudaMemcpyDeviceToHost));
                for (int b = 0; b < B; b++) {
                    const float* row = logits + (size_t)b * Vp;
                    int want = sample_token(row, V, rules[r].T, k, &host[b]);
                    same += got[b] == want;
                    total++;
                    if (k > SAMPLE_SORT && k < V) { // rank of got under (logit down, id up) must be below k
                        int rank = 0;
                        for (int j = 0; j < V; j++) {
                            rank += row[j] > row[got[b]] || (row[j] == row[got[b]] && j < got[b]);
                        }
                        in_top &= got[b] >= 0 && got[b] < V && rank < k;
                    }
                }
            }
            cudaCheck(cudaMemcpy(dev, rng_d, sizeof(dev), cudaMemcpyDeviceToHost));
            int streams = memcmp(dev, host, sizeof(dev)) == 0;
            if (k > SAMPLE_SORT && k < V) {
                check(in_top && streams, "gpu sampler V=%d T=%g top-k %d (beyond %d: id order): %d draws all in the "
                      "top k, rng streams advanced alike", V, rules[r].T, k, SAMPLE_SORT, total);
            } else {
                check(same == total && streams, "gpu sampler V=%d T=%g top-k %d: %d of %d draws equal to the twin's "
                      "sample_token, rng streams advanced alike", V, rules[r].T, k, same, total);
            }
        }
        cudaCheck(cudaFree(logits_d)); cudaCheck(cudaFree(tokens_d)); cudaCheck(cudaFree(rng_d));
        free(logits);
    }
}

typedef struct {
    const char* preset;
    const char* const* ov;
    const char* what;
    int B, lens[48], gen;
    int empty;       // 1: the prompt fed token by token from an empty cache (gpu_sample's path), else the prefill
    int prune;       // -A 1: eviction
    float ln_eps;
    int evict_model; // gates that forget fast (b_f = -6) and QK-norm scales 1, as the twin's eviction test
    int docs;        // documents kept apart (-f 1): EOT = GEN_V - 1 at gen_doc_eots in every prompt; 2: the twin only
} GenCase;

typedef struct {
    double err, sens;    // max over steps and sequences of max |x - twin| / max |twin| of the next-token logits
    int tokens, same;    // greedy tokens compared, equal to the twin's argmax
    double worst_gap;    // the largest twin top-two gap (of max |twin|) among the tokens that differ
    size_t live, full;   // cache entries at the end
    size_t twin_live;    // the twin's (fox_decoder_live)
    int peak_pages;
    int pages_end, pages_live; // pages in use at the end, and those the heads' live positions (and the next) span
    int* out;            // (B, gen) the GPU's tokens
    float* last;         // (B, V) the last logits
    float* all;          // (gen, B, V) the logits of every step
} GenResult;

enum { GEN_V = 512 };
// GenCase.docs: EOTs at these positions of each prompt (those below its length), sequence b's shifted by 3 b past 12
static const int gen_doc_eots[] = {9, 10, 12, 30, 55, 70};
static int gen_use_mma = 1; // the decoder's matvecs on tensor cores (bf16 build) or CUDA cores

static double gen_row_error(const float* got, const float* ref, int V) {
    double err = 0.0, scale = 1e-30;
    for (int j = 0; j < V; j++) {
        double e = fabs((double)got[j] - ref[j]);
        err = isnan(e) ? INFINITY : fmax(err, e);
        scale = fmax(scale, fabs((double)ref[j]));
    }
    return err / scale;
}

// replaces the decoder's next tokens (teacher forcing: a prompt fed token by token)
static void gpu_decoder_feed(GpuDecoder* d, const int* tokens) {
    decoder_copy(d, d->tokens, tokens, (size_t)d->B * sizeof(int), cudaMemcpyHostToDevice);
}

// One case on the GPU (use_graph 0: kernels launched one by one; corrupt: c_last zeroed after the
// prompt, the negative control) and on the twin (fed the GPU's tokens), and the twin with
// bf16-rounded weights for the sensitivity.
static void gen_run(const GenCase* c, int use_graph, int corrupt, GenResult* r) {
    enum { V = GEN_V };
    memset(r, 0, sizeof(*r));
    FoxModel m, mr;
    eval_test_model(&m, c->preset, c->ov, V, c->evict_model ? 4.0f : 2.0f);
    const FoxConfig* cf = &m.config;
    if (c->evict_model) {
        size_t qk_per = m.spec[P_Q_NORM].rows;
        for (size_t i = 0; i < (size_t)cf->n_layer * qk_per; i++) { m.params.q_norm[i] = m.params.k_norm[i] = 1.0f; }
        for (size_t i = 0; i < (size_t)cf->n_layer * cf->n_head; i++) { m.params.bf[i] = -6.0f; }
    }
    m.prune = c->prune; m.prune_ln_eps = c->ln_eps;
    m.doc_eot = c->docs ? V - 1 : -1;
    twin_rounded_copy(&mr, &m);
    mr.prune = m.prune; mr.prune_ln_eps = m.prune_ln_eps; mr.doc_eot = m.doc_eot;
    int B = c->B, Tp = 0;
    for (int b = 0; b < B; b++) { Tp = c->lens[b] > Tp ? c->lens[b] : Tp; }
    int cap = Tp + c->gen;
    int* tokens = (int*)malloc_check((size_t)B * cap * sizeof(int), "test");
    random_tokens(tokens, (size_t)B * cap, c->docs ? V - 1 : V, 77);
    for (int b = 0; c->docs && b < B; b++) {
        for (size_t e = 0; e < sizeof(gen_doc_eots) / sizeof(gen_doc_eots[0]); e++) {
            int at = gen_doc_eots[e] + (gen_doc_eots[e] > 12 ? 3 * b : 0);
            if (at < c->lens[b]) { tokens[(size_t)b * cap + at] = V - 1; }
        }
    }
    FoxDecoder* tw = (FoxDecoder*)calloc_check((size_t)B, sizeof(FoxDecoder), "test");
    FoxDecoder* tr = (FoxDecoder*)calloc_check((size_t)B, sizeof(FoxDecoder), "test");
    for (int b = 0; b < B; b++) { fox_decoder_init(&tw[b], &m, cap); fox_decoder_init(&tr[b], &mr, cap); }
    GPUModel gm;
    gpu_build(&gm, &m, c->empty ? 1 : B, c->empty ? 1 : Tp);
    gpu_poison(&gm);
    GpuDecoder d;
    gpu_decoder_init(&d, &gm, B, cap, c->prune, c->ln_eps, cap);
    if (c->docs == 2) { d.eot = -1; } // the negative control: the GPU's cache never restarts
    d.use_graph = use_graph;
    d.use_mma = gen_use_mma;
    uint64_t seeds[48];
    for (int b = 0; b < B; b++) { seeds[b] = generate_seed(5, b); }
    gpu_decoder_begin(&d, B, 0.0, 0, seeds);
    gen_poison(&d);
    int Vp = cf->padded_vocab_size;
    float* lg = (float*)malloc_check((size_t)B * Vp * sizeof(float), "test");
    r->out = (int*)malloc_check((size_t)B * c->gen * sizeof(int), "test");
    r->last = (float*)malloc_check((size_t)B * V * sizeof(float), "test");
    r->all = (float*)malloc_check((size_t)c->gen * B * V * sizeof(float), "test");
    if (c->empty) { // B prompts of the same length, fed token by token, compared at every position
        int first[48];
        for (int b = 0; b < B; b++) { first[b] = tokens[(size_t)b * cap]; }
        gpu_decoder_start_empty(&d, first);
        for (int t = 0; t < c->lens[0]; t++) {
            if (t > 0) {
                int next[48];
                for (int b = 0; b < B; b++) { next[b] = tokens[(size_t)b * cap + t]; }
                gpu_decoder_feed(&d, next);
            }
            gpu_decoder_step(&d);
            cudaCheck(cudaMemcpy(lg, d.logits, (size_t)B * Vp * sizeof(float), cudaMemcpyDeviceToHost));
            for (int b = 0; b < B; b++) {
                fox_decode_step(&tw[b], tokens[(size_t)b * cap + t]);
                fox_decode_step(&tr[b], tokens[(size_t)b * cap + t]);
                r->err = fmax(r->err, gen_row_error(lg + (size_t)b * Vp, tw[b].row.logits, V));
                r->sens = fmax(r->sens, gen_row_error(tr[b].row.logits, tw[b].row.logits, V));
            }
        }
    } else {
        gpu_decoder_prefill(&d, tokens, cap, c->lens);
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < c->lens[b]; t++) {
                fox_decode_step(&tw[b], tokens[(size_t)b * cap + t]);
                fox_decode_step(&tr[b], tokens[(size_t)b * cap + t]);
            }
        }
    }
    if (corrupt) {
        cudaCheck(cudaMemset(d.c_last, 0, 2 * (size_t)d.L * B * d.H * sizeof(float)));
        cudaCheck(cudaDeviceSynchronize());
    }
    for (int k = 0; k < c->gen; k++) {
        cudaCheck(cudaMemcpy(lg, d.logits, (size_t)B * Vp * sizeof(float), cudaMemcpyDeviceToHost));
        for (int b = 0; b < B; b++) {
            const float* ref = tw[b].row.logits;
            r->err = fmax(r->err, gen_row_error(lg + (size_t)b * Vp, ref, V));
            r->sens = fmax(r->sens, gen_row_error(tr[b].row.logits, ref, V));
            int g = d.host_tokens[b], want = argmax_token(ref, V);
            r->tokens++;
            if (g == want) { r->same++; }
            else {
                double scale = 1e-30;
                for (int j = 0; j < V; j++) { scale = fmax(scale, fabs(ref[j])); }
                double gap = g >= 0 && g < V ? (ref[want] - ref[g]) / scale : INFINITY;
                r->worst_gap = fmax(r->worst_gap, gap);
            }
            r->out[(size_t)b * c->gen + k] = g;
            memcpy(r->last + (size_t)b * V, lg + (size_t)b * Vp, V * sizeof(float));
            memcpy(r->all + ((size_t)k * B + b) * V, lg + (size_t)b * Vp, V * sizeof(float));
            if (k + 1 < c->gen && g >= 0 && g < V) {
                fox_decode_step(&tw[b], g);
                fox_decode_step(&tr[b], g);
            }
        }
        if (k + 1 < c->gen) { gpu_decoder_step(&d); }
    }
    size_t heads = (size_t)d.L * B * d.H;
    int* first = (int*)malloc_check(heads * sizeof(int), "test");
    cudaCheck(cudaMemcpy(first, d.first, heads * sizeof(int), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < heads; i++) {
        int len = d.host_pos[(i / d.H) % B];
        r->live += (size_t)(len - first[i]);
        r->full += (size_t)(len - attention_first_key(len, cf->window));
        r->pages_live += len / KV_PAGE - first[i] / KV_PAGE + 1;
    }
    for (int b = 0; b < B; b++) { r->twin_live += fox_decoder_live(&tw[b]); }
    r->peak_pages = d.peak_pages;
    r->pages_end = decoder_pages_in_use(&d);
    free(first); free(lg); free(tokens);
    gpu_decoder_free(&d);
    gpu_free(&gm);
    for (int b = 0; b < B; b++) { fox_decoder_free(&tw[b]); fox_decoder_free(&tr[b]); }
    free(tw); free(tr);
    fox_free(&m); fox_free(&mr);
}

static void gen_result_free(GenResult* r) { free(r->out); free(r->last); free(r->all); }

// max over the steps of max |a - b| / max |b| of the logits of two runs of the same case
static double gen_runs_error(const GenResult* a, const GenResult* b, const GenCase* c) {
    double err = 0.0;
    for (int k = 0; k < c->gen * c->B; k++) {
        err = fmax(err, gen_row_error(a->all + (size_t)k * GEN_V, b->all + (size_t)k * GEN_V, GEN_V));
    }
    return err;
}

// The floor of the decoder's logits tolerance. bf16: the whole model's. fp32: the whole model's 1e-5 is
// too tight for the gate-bias -6 cases: 300 tokens of log f = -6 take c to about -2e3, where an fp32 ulp
// is 2.4e-4, and the two sides sum c in different orders (the GPU's prefill scan, the twin's running
// sum), so c_i - c_j of every logit differs by a few ulps: measured just above 1e-5 of the logits'
// scale (H200, 2026-11-26); 5e-5. A wrong cache misses by 1e-1 or more (the negative controls).
#ifdef ENABLE_FP32
#define GEN_TOL_LOGITS 5e-5
#else
#define GEN_TOL_LOGITS GTOL_LOGITS
#endif

// the check of one case against the twin; returns the tolerance used
static double gen_check(const GenCase* c, const GenResult* r) {
    double tol = tolerance(GEN_TOL_LOGITS, r->sens);
    int ties = r->tokens - r->same;
    check(r->tokens >= 24 && r->err <= tol && (ties == 0 || r->worst_gap <= 2 * tol),
          "gpu generate vs twin cache: %s, %d seq, prompts %d..%d (%s): %d greedy tokens, %d equal, %d near ties "
          "(top-two gap %.1e <= 2 tol); logits err %.1e <= %.1e (max of %.0e and %g x bf16-weight sensitivity %.1e)",
          c->what, c->B, c->lens[0], c->lens[c->B - 1], c->empty ? "fed token by token" : "prefill", r->tokens,
          r->same, ties, r->worst_gap, r->err, tol, GEN_TOL_LOGITS, GTOL_SENS, r->sens);
    return tol;
}

static void gpu_gen_test_models(void) {
    static const char* none[] = {NULL};
    static const char* window8[] = {"window", "8", NULL};
    static const char* window70[] = {"window", "70", NULL};
    static const char* shared[] = {"qk_norm_shared", "1", "window", "5", NULL};
    static const char* bias_only[] = {"gate", "bias_only", NULL};
    static const char* fixed[] = {"gate", "fixed", NULL};
    static const char* gate_none[] = {"gate", "none", NULL};
    static const char* hd128[] = {"n_head", "1", NULL};
    GenCase cases[] = {
        {"fox-pro-tiny", none, "fox-pro", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"fox-llama-tiny", none, "fox-llama", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"transformer-llama-tiny", none, "transformer-llama (RoPE)", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"transformer-pro-tiny", none, "transformer-pro (RoPE, shifts, QK-norm)", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"fox-pro-tiny", window8, "fox-pro, window 8", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"fox-pro-tiny", window70, "fox-pro, window 70 (pages freed as it slides)", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"fox-pro-tiny", shared, "fox-pro, shared QK-norm, window 5", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"fox-pro-tiny", bias_only, "fox-pro, gate bias_only", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"fox-pro-tiny", fixed, "fox-pro, gate fixed", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"fox-pro-tiny", gate_none, "fox-pro, gate none", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"fox-pro-tiny", hd128, "fox-pro, head size 128", 1, {100}, 30, 0, 0, -10.0f, 0},
        {"fox-pro-tiny", none, "fox-pro", 1, {40}, 30, 1, 0, -10.0f, 0},
        {"fox-pro-tiny", none, "fox-pro, prompts of 37, 100, 64 at once", 3, {37, 100, 64}, 28, 0, 0, -10.0f, 0},
        {"transformer-llama-tiny", window70, "transformer-llama, window 70, 2 prompts", 2, {90, 3}, 30, 0, 0, -10.0f,
         0},
        {"fox-pro-tiny", none, "fox-pro, 40 prompts of 5 to 122 (matvec passes of 32 rows)", 40, {0}, 24, 0, 0,
         -10.0f, 0},
    };
    GenCase* many = &cases[sizeof(cases) / sizeof(cases[0]) - 1];
    for (int b = 0; b < many->B; b++) { many->lens[b] = 5 + 3 * b; }
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        GenResult r;
        gen_run(&cases[i], 1, 0, &r);
        gen_check(&cases[i], &r);
        gen_result_free(&r);
    }
    // negative control: a cache whose running c restarts after the prompt must miss
    GenResult bad;
    gen_run(&cases[0], 1, 1, &bad);
    double tol = tolerance(GEN_TOL_LOGITS, bad.sens);
    check(bad.err > tol, "gpu generate: negative control, c_last zeroed after the prompt: logits err %.1e > %.1e",
          bad.err, tol);
    gen_result_free(&bad);
    // the graph replays what the kernels compute when launched one by one, bit for bit
    GenResult direct, graph;
    gen_run(&cases[12], 0, 0, &direct);
    gen_run(&cases[12], 1, 0, &graph);
    int same = memcmp(direct.out, graph.out, 3 * 28 * sizeof(int)) == 0 &&
               memcmp(direct.last, graph.last, 3 * GEN_V * sizeof(float)) == 0;
    check(same, "gpu generate: the CUDA graph gives the same tokens and logits bits as direct launches (3 prompts)");
    gen_result_free(&direct); gen_result_free(&graph);
#ifndef ENABLE_FP32
    // the tensor-core matvecs against the CUDA-core ones: the same bf16 inputs, fp32 sums in another
    // order (1e-6 relative a sum), but a sum near a rounding boundary of the bf16 values that follow
    // (q, k, v, act, ...) then rounds the other way (2^-8 relative): the two paths differ by up to the
    // forward's bf16 error, GTOL_LOGITS of the logits' scale, compared until the greedy tokens part
    // (a near tie may flip them; at least 2 steps)
    GenResult cores, tensor;
    GenCase* c = many;
    gen_use_mma = 0;
    gen_run(c, 1, 0, &cores);
    gen_use_mma = 1;
    gen_run(c, 1, 0, &tensor);
    int steps = 0;
    double err = 0.0;
    for (int k = 0; k < c->gen; k++) {
        for (int b = 0; b < c->B; b++) {
            err = fmax(err, gen_row_error(tensor.all + ((size_t)k * c->B + b) * GEN_V,
                                          cores.all + ((size_t)k * c->B + b) * GEN_V, GEN_V));
        }
        steps++;
        int parted = 0;
        for (int b = 0; b < c->B; b++) {
            parted |= cores.out[(size_t)b * c->gen + k] != tensor.out[(size_t)b * c->gen + k];
        }
        if (parted) { break; }
    }
    check(err <= GTOL_LOGITS && steps >= 2, "gpu generate: tensor-core matvecs against CUDA-core ones, 40 prompts: "
          "logits differ by %.1e <= %.0e of their scale over %d steps", err, GTOL_LOGITS, steps);
    gen_result_free(&cores); gen_result_free(&tensor);
#endif
}

// Eviction (-A 1) on the twin's eviction model: a 300-token prompt, 40 greedy tokens; the GPU with
// eviction against the GPU without it (the same tokens; the live cache and the pages in use
// smaller) and against the twin with eviction. Negative control, GPU against GPU (the same bf16
// arithmetic, so the twin's 1e-3 applies): ln eps +40 evicts every key but the newest and must
// move the logits by more than 1e-3 of their scale, while ln eps -10 moves them by less than that.
static void gpu_gen_test_eviction(void) {
    static const char* none[] = {NULL};
    GenCase on = {"fox-pro-tiny", none, "fox-pro, gate bias -6, -A 1 (eviction)", 1, {300}, 40, 0, 1, -10.0f, 1};
    GenCase off = on;
    off.prune = 0; off.what = "fox-pro, gate bias -6, no eviction";
    GenCase bad = on;
    bad.ln_eps = 40.0f;
    GenResult r_on, r_off, r_bad;
    gen_run(&on, 1, 0, &r_on);
    gen_run(&off, 1, 0, &r_off);
    gen_run(&bad, 1, 0, &r_bad);
    gen_check(&on, &r_on);
    gen_check(&off, &r_off);
    int same = memcmp(r_on.out, r_off.out, (size_t)on.gen * sizeof(int)) == 0;
    double diff = gen_runs_error(&r_on, &r_off, &on), bad_diff = gen_runs_error(&r_bad, &r_off, &on);
    check(same && diff <= 1e-3 && r_on.live * 4 < r_on.full && r_on.peak_pages < r_off.peak_pages,
          "gpu generate eviction: %d greedy tokens equal to no eviction (logits differ by %.1e <= 1e-3 of their "
          "scale), live cache %zu of %zu entries (< 1/4), pages in use at most %d against %d", on.gen, diff, r_on.live,
          r_on.full, r_on.peak_pages, r_off.peak_pages);
    check(bad_diff > 1e-3,
          "gpu generate eviction: negative control, ln eps +40 evicts keys that matter (logits move by %.1e > 1e-3)",
          bad_diff);
    gen_result_free(&r_on); gen_result_free(&r_off); gen_result_free(&r_bad);
}

// Generation with documents kept apart (-f 1): EOTs in the prompts and among the fed tokens (gen_doc_eots: an empty
// document, one of a single token, one across a page at 70), the twin's caches restarting there (fox_decoder_restart)
// and the GPU's (decode_attention_kernel, decode_manage_kernel; prefill_first_kernel after a prefill). Against the
// twin at gen_check's tolerance; the GPU's live cache equals the twin's (every head keeps what follows the last EOT)
// and the pages in use are exactly those its live positions and the next one span (the pages before an EOT went
// back to the pool). Negative control: a GPU cache that never restarts misses the twin's logits.
static void gpu_gen_test_documents(void) {
    static const char* none[] = {NULL};
    static const char* window8[] = {"window", "8", NULL};
    GenCase cases[] = {
        {"fox-pro-tiny", none, "fox-pro, -f 1, EOTs fed token by token", 1, {100}, 24, 1, 0, -10.0f, 0, 1},
        {"transformer-pro-tiny", none, "transformer-pro, -f 1, 2 sequences fed", 2, {100, 100}, 24, 1, 0, -10.0f, 0,
         1},
        {"fox-pro-tiny", window8, "fox-pro, window 8, -f 1, fed", 1, {80}, 24, 1, 0, -10.0f, 0, 1},
        {"fox-pro-tiny", none, "fox-pro, -f 1, prompts with EOTs (prefill)", 3, {37, 100, 64}, 28, 0, 0, -10.0f, 0, 1},
        {"fox-llama-tiny", none, "fox-llama, -f 1, a prompt ending on an EOT", 1, {71}, 24, 0, 0, -10.0f, 0, 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        GenResult r;
        gen_run(&cases[i], 1, 0, &r);
        gen_check(&cases[i], &r);
        check(r.live == r.twin_live && r.pages_end == r.pages_live,
              "gpu generate, %s: the live cache as the twin's (%zu = %zu entries, %zu without documents); pages in "
              "use %d = %d, those of the live positions", cases[i].what, r.live, r.twin_live, r.full, r.pages_end,
              r.pages_live);
        gen_result_free(&r);
    }
    GenCase bad = cases[0];
    bad.docs = 2;
    GenResult r;
    gen_run(&bad, 1, 0, &r);
    double tol = tolerance(GEN_TOL_LOGITS, r.sens);
    check(r.err > tol, "gpu generate, -f 1: negative control, a GPU cache that does not restart at an EOT misses the "
          "twin's logits (err %.1e > %.1e)", r.err, tol);
    gen_result_free(&r);
}

static void run_gpu_gen_tests(void) {
    char why[256];
    if (!gpu_available(why, sizeof(why))) {
        printf("skipped: no GPU (%s): GPU generation (sampler, KV cache, eviction) against the twin\n", why);
        return;
    }
    if (g_lt == NULL) { gpu_init(); } // run_gpu_tests may have done it
    printf("GPU generation tests on %s, %s build\n", g_prop.name, PRECISION_NAME);
    gpu_gen_test_sampler();
    gpu_gen_test_models();
    gpu_gen_test_eviction();
    gpu_gen_test_documents();
}
#else
static void run_gpu_gen_tests(void) { printf("skipped: GPU generation tests (built without nvcc)\n"); }
#endif

// the GPU's FP8 path (-q): casts, matmuls and whole steps against the twin's emulation
#if defined(__CUDACC__) && !defined(ENABLE_FP32)
static void run_gpu_fp8_tests(void) {
    char why[256];
    if (!gpu_available(why, sizeof(why))) {
        printf("skipped: no GPU (%s): FP8 (-q): casts, matmuls and training steps against the twin's FP8 "
               "numerics\n", why);
        return;
    }
    if (g_lt == NULL) { gpu_init(); } // run_gpu_tests may have done it
    printf("GPU FP8 tests on %s\n", g_prop.name);
    gpu_test_fp8_casts();
    gpu_test_fp8_weight_blocks();
    gpu_test_fp8_matmul();
    gpu_test_fp8_token_major();
    gpu_test_fp8_steps();
    gpu_test_fp8_tuning();
}
#elif defined(__CUDACC__)
static void run_gpu_fp8_tests(void) { printf("skipped: GPU FP8 tests (-q is a bf16-build option; this is fp32)\n"); }
#else
static void run_gpu_fp8_tests(void) { printf("skipped: GPU FP8 tests (built without nvcc)\n"); }
#endif

// Starts a group of tests: closes the one before with its wall time (NULL closes the last). The times say where a
// slow run spends itself (the twin's OpenMP loops on a many-core host, the GPU's start-up).
static void test_group(const char* title) {
    static double start = 0.0;
    double now = now_seconds();
    if (start > 0.0) { printf("  (%.1f s)\n", now - start); }
    start = now;
    if (title != NULL) { printf("# %s\n", title); }
}

// ./test_fox runs every group; ./test_fox gpu only the GPU part (a short run on a lent GPU); ./test_fox gpu-gen
// only the GPU generation tests
int main(int argc, char** argv) {
    threads_init();
    if (argc > 1 && strcmp(argv[1], "gpu-gen") == 0) { // the GPU generation tests alone
        run_gpu_gen_tests();
        printf("%d passed, %d failed\n", tests_passed, tests_failed);
        return tests_failed != 0;
    }
    if (argc > 1 && strcmp(argv[1], "gpu-fp8") == 0) { // the GPU's FP8 tests alone
        run_gpu_fp8_tests();
        printf("%d passed, %d failed\n", tests_passed, tests_failed);
        return tests_failed != 0;
    }
    if (argc > 1 && strcmp(argv[1], "gpu") == 0) {
        test_group("GPU trainer against the twin");
        run_gpu_tests();
        test_group("GPU FP8 (-q) against the twin's FP8 emulation");
        run_gpu_fp8_tests();
        test_group("GPU generation");
        run_gpu_gen_tests();
        test_group(NULL);
        printf("%d passed, %d failed\n", tests_passed, tests_failed);
        return tests_failed != 0;
    }
    make_test_dir();
    test_group("CPU twin against the float64 PyTorch reference (dev/fixtures)");
    test_reference_fixtures();
    test_reference_check_discriminates();
    test_group("finite differences, gradient accumulation");
    test_finite_differences();
    test_grad_accumulation();
    test_thread_count_bits();
    test_attention_dlogf();
    test_attention_pruning();
    test_group("numerical guards, extreme forget gates");
    test_step_guard();
    test_nonfinite_grad_name();
    test_extreme_forget_gates();
    test_group("configuration, schedule, command line");
    test_config();
    test_threads();
    test_schedule_resume();
    test_progress();
    test_command_line();
    test_group("data, checkpoints, decode table");
    test_dataloader();
    test_checkpoints();
    test_resume();
    test_checkpoint_checksums();
    test_resume_fallback();
    test_resume_header_damage();
    test_resume_notes();
    test_run_edges();
    test_shard_tokens();
    test_out_flags();
    test_run_dir();
    test_decode_table();
    test_bad_decode_table();
    test_group("data parallel (plain C part)");
    test_topology();
    test_param_layout();
    test_batch_translation();
    test_rendezvous();
    test_group("HuggingFace export and import");
    test_hf();
    test_group("evaluation: per-token loss, KV cache, sampling, needle in a haystack, maps");
    test_eval_per_token();
    test_kv_cache();
    test_kv_eviction();
    test_model_pruning();
    test_sampling();
    test_niah();
    test_maps();
    test_eval_bad_input();
    test_prompt_from_shard();
    test_generate_prompts();
    test_group("documents kept apart (-f 1)");
    test_documents_apart();
    test_documents_gate_gradient();
    test_documents_one_context();
    test_documents_kv_cache();
    test_documents_eval();
    test_documents_flag();
    test_group("FP8 numerics (-q)");
    test_fp8_conversion();
    test_fp8_training();
    test_group("GPU trainer against the twin");
    run_gpu_tests();
    test_group("GPU FP8 (-q) against the twin's FP8 emulation");
    run_gpu_fp8_tests();
    test_group("GPU generation");
    run_gpu_gen_tests();
    test_group(NULL);
    char cleanup[600];
    snprintf(cleanup, sizeof(cleanup), "rm -rf '%s'", test_dir);
    if (system(cleanup) != 0) { printf("note: could not remove %s\n", test_dir); }
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed != 0;
}
