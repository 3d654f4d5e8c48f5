/*
test_fox.cu: the tests of train_fox, one program.

CPU part (any machine): the CPU twin (train_fox.c) against the debug states of the
independent PyTorch reference (dev/fox_reference.py, float64) for every preset and toggle:
logits, loss, every gradient tensor and 10 AdamW steps; finite differences of d(log f) and
of the KV-shift gradients; schedule, data loader, checkpoint and decode-table tests; bad
input. GPU part: the GPU trainer against the CPU twin, skipped with a reason when there is
no GPU. One line per check, then "N passed, M failed"; the exit status is non-zero on any
failure.

Builds with nvcc (as CUDA) or with any C++ compiler (CPU part only).
*/
#define TESTING
#ifdef __CUDACC__
#include "train_fox.cu" // the GPU trainer, which includes the CPU twin
#else
#include "train_fox.c"
#endif
#include <fcntl.h>
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
// debug-state files of the reference (format in dev/fox_reference.py and README.md)

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
        if (r->ndim < 1 || r->ndim > 8 || r->dtype < 0 || r->dtype > 3) { fail("'%s': bad record '%s'", path, r->name); }
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

static void test_against_reference(const char* path) {
    DebugState ds;
    debug_state_read(&ds, path);
    const char* base = strrchr(path, '/');
    base = base != NULL ? base + 1 : path;
    char name[128];
    snprintf(name, sizeof(name), "%.*s", (int)(strlen(base) > 5 ? strlen(base) - 5 : strlen(base)), base);
    FoxConfig c;
    DebugTraining tr;
    debug_config(&ds, &c, &tr);
    FoxModel m;
    fox_build(&m, &c);
    int used = load_debug_params(&m, &ds);
    check(used == count_param_records(&ds), "%s: the twin's parameter table maps all %d reference tensors (used %d)", name,
          count_param_records(&ds), used);
    if (c.gate == GATE_BIAS_ONLY || c.gate == GATE_FIXED) {
        float want[4096];
        gate_bias_init(want, c.n_head, c.decay_time_min, c.decay_time_max);
        double err = 0.0;
        for (int h = 0; h < c.n_head; h++) { err = fmax(err, fabs(want[h] - m.params.bf[h]) / fabs(want[h])); }
        check(err <= 1e-6, "%s: gate bias init from decay times matches the reference (rel err %.1e <= 1e-6)", name, err);
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
    check(worst <= TOL_GRADS, "%s: all %d gradient tensors (worst rel err %.1e in %s <= %.0e)", name, grads, worst, worst_name, TOL_GRADS);
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
        double lr = lr_at_step(&tr.sched, step);
        fox_update(&m, &tr.opt, (float)lr, step + 1);
        e_lr = fmax(e_lr, fabs(lr - ref_lr[step]) / fmax(ref_lr[step], 1e-30));
        double el = fabs(m.mean_loss - ref_sl[step]) / fabs(ref_sl[step]);
        double en = fabs(norm - ref_gn[step]) / fabs(ref_gn[step]);
        e_loss = isnan(el) ? INFINITY : fmax(e_loss, el);
        e_norm = isnan(en) ? INFINITY : fmax(e_norm, en);
    }
    check(e_lr <= 1e-9 && e_loss <= TOL_STEPS && e_norm <= TOL_STEP_NORMS,
          "%s: %d AdamW steps: lr (rel err %.1e <= 1e-9), losses (%.1e <= %.0e), grad norms (%.1e <= %.0e); last loss %.4f",
          name, tr.n_steps, e_lr, e_loss, TOL_STEPS, e_norm, TOL_STEP_NORMS, ref_sl[tr.n_steps - 1]);
    fox_free(&m);
    debug_state_free(&ds);
}

static void test_reference_fixtures(void) {
    glob_t g;
    if (glob("dev/fixtures/*.fxds", 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        check(0, "reference fixtures: none found in dev/fixtures (run /usr/bin/python3 dev/fox_reference.py --all --out dev/fixtures)");
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
    check(e > 100 * TOL_LOGITS, "negative control: fox-pro with the k shift dropped misses the reference (rel err %.1e > %.0e)", e, 100 * TOL_LOGITS);
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
static void fd_check_tensor(FoxModel* m, int tensor, const int* inputs, const int* targets, int B, int T, const char* what) {
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
    check(worst <= 2e-2, "finite differences: %s (4 largest entries, worst err %.1e of the largest <= 2e-2)", what, worst);
}

static void test_finite_differences(void) {
    const char* fixtures[] = {"dev/fixtures/fox-pro.fxds", "dev/fixtures/fox-pro-gate-bias_only.fxds"};
    for (int f = 0; f < 2; f++) {
        DebugState ds;
        debug_state_read(&ds, fixtures[f]);
        FoxConfig c;
        DebugTraining tr;
        debug_config(&ds, &c, &tr);
        FoxModel m;
        fox_build(&m, &c);
        load_debug_params(&m, &ds);
        const int* inputs = (const int*)debug_find(&ds, "inputs")->data;
        const int* targets = (const int*)debug_find(&ds, "targets")->data;
        fox_forward(&m, inputs, targets, tr.B, tr.T);
        fox_zero_grad(&m);
        fox_backward(&m, 1.0f);
        char what[128];
        snprintf(what, sizeof(what), "%s d(gate bias), through d(log f) and the reverse cumsum", GATE_NAMES[c.gate]);
        fd_check_tensor(&m, P_BF, inputs, targets, tr.B, tr.T, what);
        if (c.gate == GATE_FULL) { fd_check_tensor(&m, P_WF, inputs, targets, tr.B, tr.T, "full gate d(w_f)"); }
        if (f == 0) {
            fd_check_tensor(&m, P_WK_SHIFT, inputs, targets, tr.B, tr.T, "k shift d(w_s)");
            fd_check_tensor(&m, P_WV_SHIFT, inputs, targets, tr.B, tr.T, "v shift d(w_s)");
            fd_check_tensor(&m, P_WK, inputs, targets, tr.B, tr.T, "k projection through the shift");
        }
        fox_free(&m);
        debug_state_free(&ds);
    }
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
    attention_forward(o, lse, q, k, v, c, B, T, H, hd, 0, scratch);
    memset(dq, 0, sizeof(dq)); memset(dk, 0, sizeof(dk)); memset(dv, 0, sizeof(dv)); memset(dc, 0, sizeof(dc));
    attention_backward(dq, dk, dv, dc, w, q, k, v, o, lse, c, B, T, H, hd, 0);
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
            attention_forward(o, lse, q, k, v, cc, B, T, H, hd, 0, scratch);
            double sum = 0.0;
            for (size_t i = 0; i < N; i++) { sum += (double)o[i] * w[i]; }
            lpm[s] = sum;
        }
        double fd = (lpm[0] - lpm[1]) / 2e-2;
        worst = fmax(worst, fabs(fd - dlogf[t]) / scale);
    }
    check(worst <= 2e-2, "attention backward: d(log f) against finite differences (worst err %.1e of its scale <= 2e-2)", worst);
    check(fabs(dlogf[0]) <= 1e-5 * scale, "attention backward: d(log f_0) = %.1e, zero as c_0 cancels (<= 1e-5 of scale %.2f)", dlogf[0], scale);
    free(scratch);
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
    check(v1 == STEP_SKIP && v2 == STEP_UPDATE && v3 == STEP_SKIP && g.skipped == 2, "guard -G skip: non-finite steps are skipped and counted (%ld)", g.skipped);
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
    check(loss_spike == STEP_SKIP && on.skipped == 1 && strstr(why, "loss spike") != NULL, "guard -Z 6: a loss spike is skipped (\"%s\")", why);
    int norm_spike = step_guard_check(&on, 3.0, 2.0, why, sizeof(why));
    check(norm_spike == STEP_SKIP && strstr(why, "grad norm spike") != NULL, "guard -Z 6: a grad-norm spike is skipped (\"%s\")", why);
    check(step_guard_check(&off, 3.5, 2.0, why, sizeof(why)) == STEP_UPDATE, "guard -Z 0: spikes are not checked");
    check(step_guard_check(&on, 3.0, 1.0, why, sizeof(why)) == STEP_UPDATE, "guard -Z 6: an ordinary step after the spikes updates");
    StepGuard fresh;
    step_guard_init(&fresh, NONFINITE_STOP, 6.0);
    check(step_guard_check(&fresh, 3.0, 1.0, why, sizeof(why)) == STEP_UPDATE && step_guard_check(&fresh, 30.0, 1.0, why, sizeof(why)) == STEP_UPDATE,
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
    check(!clean && named && strstr(why, "model.layers.1.attn.q_proj.weight") != NULL && strstr(why, "element 5") != NULL,
          "guard: a NaN in layer 1's wq gradient is named (\"%s\")", why);
    m.grads.lm_head[7] = INFINITY;
    m.grads.wq[(size_t)c.n_embd * c.n_embd + 5] = 0.0f;
    named = nonfinite_grad_name(&c, m.grads_memory, why, sizeof(why));
    check(named && strstr(why, "lm_head.weight") != NULL, "guard: an inf in the lm_head gradient is named (\"%s\")", why);
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
        check(ok, "extreme forget gate: logit %g (min c %g): loss %g, every gradient finite", logits[k], c_min, m.mean_loss);
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
    ok = config_set(&c, "gate", "bias_only") == 1 && c.gate == GATE_BIAS_ONLY && config_set(&c, "gate", "sometimes") == -1 &&
         config_set(&c, "n_head", "0") == -1 && config_set(&c, "window", "1.5") == -1 && config_set(&c, "colour", "1") == 0;
    check(ok, "overrides: valid values set, impossible values and unknown keys are refused");
    c.n_head = 3;
    check(config_problem(&c) != NULL, "config check: n_embd 128 with 3 heads is refused (%s)", config_problem(&c));
    LRSchedule s = {SCHEDULE_COSINE, 1.0, 200.0, 1000.0, 100.0};
    double l0 = lr_at_step(&s, 0), l1 = lr_at_step(&s, 1), l2 = lr_at_step(&s, 2), l6 = lr_at_step(&s, 6);
    check(fabs(l0 - 0.5) < 1e-12 && fabs(l1 - 1.0) < 1e-12 && fabs(l2 - 1.0) < 1e-12 && fabs(l6 - 0.5) < 1e-12,
          "cosine schedule: warmup 0.5, 1, then 1 at the end of warmup and 0.5 half way (%g %g %g %g)", l0, l1, l2, l6);
    s.type = SCHEDULE_LINEAR;
    double lin = lr_at_step(&s, 6);
    s.type = SCHEDULE_CONSTANT;
    double cst = lr_at_step(&s, 9);
    check(fabs(lin - 0.5) < 1e-12 && fabs(cst - 1.0) < 1e-12, "linear schedule half way %g (0.5), constant %g (1)", lin, cst);
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

static void fwrite_check(const void* src, size_t size, size_t count, FILE* f, const char* path) {
    if (fwrite(src, size, count, f) != count) {
        fail("could not write '%s': %s\nHINT: is the disk full?", path, strerror(errno));
    }
}

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
    check(once && shifted && d.epoch == 0, "data loader: one epoch visits every sample once, targets are inputs shifted by one");
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
        same &= memcmp(d.inputs, r.inputs, (size_t)B * T * sizeof(int)) == 0 && memcmp(d.targets, r.targets, (size_t)B * T * sizeof(int)) == 0;
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

// copies a checkpoint with two int32 header slots replaced
static void patch_header(const char* src, const char* dst, int slot_a, int value_a, int slot_b, int value_b) {
    copy_truncated(src, dst, 0);
    FILE* f = fopen_check(dst, "r+b");
    int header[256];
    fread_check(header, sizeof(int), 256, f, dst);
    header[slot_a] = value_a; header[slot_b] = value_b;
    if (fseek(f, 0, SEEK_SET) != 0) { fail("seek"); }
    fwrite_check(header, sizeof(int), 256, f, dst);
    fclose(f);
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
    TrainState s = {1, 0, 1, 2, 1};
    save_model(&m, model_path);
    save_state(&m, &s, state_path);
    FoxModel l;
    load_model(&l, model_path);
    TrainState ls;
    load_state(&l, &ls, state_path);
    int same = memcmp(&l.config, &m.config, sizeof(FoxConfig)) == 0 && l.num_parameters == m.num_parameters &&
               memcmp(l.params_memory, m.params_memory, m.num_parameters * sizeof(float)) == 0 &&
               memcmp(l.m_memory, m.m_memory, m.num_parameters * sizeof(float)) == 0 &&
               memcmp(l.v_memory, m.v_memory, m.num_parameters * sizeof(float)) == 0 && ls.step == 1 && ls.batch_pos == 2;
    check(same, "checkpoint round trip: configuration, %zu parameters, AdamW moments and data position bit for bit", m.num_parameters);
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
    check(latest_checkpoint(test_dir) == 1, "checkpoint: decoy names (lone files, steps past int, signs, letters, other spellings) are not taken");
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
    set_position_args[0] = 0; set_position_args[1] = 2; set_position_args[2] = 0;
    expect_failure(set_position_child, NULL, "data position at shard 2 of 2");
    set_position_args[0] = 0; set_position_args[1] = 0; set_position_args[2] = 11;
    expect_failure(set_position_child, NULL, "data position at batch 11 of a shard of 10");
    fox_free(&m);
    fox_free(&l);
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
             strcmp(tk.tokens[464], "The") == 0 && strcmp(tk.tokens[15496], "Hello") == 0 && strcmp(tk.tokens[11], ",") == 0;
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
    cudaCheck(cudaMemcpy(grads, g->grads, g->num_parameters * sizeof(float), cudaMemcpyDeviceToHost));
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
        double err = rel_error_f32(grads + g->offsets[t], ref, n, n, n, n);
        if (t == P_BF) {
            sens = abs_error_f32(param_tensor(&probe->grads, t), ref, n, bf_scale);
            err = abs_error_f32(grads + g->offsets[t], ref, n, bf_scale);
        }
        double tol = tolerance(s->cols == 1 ? GTOL_GRAD_VECTOR : GTOL_GRAD_MATRIX, sens);
        tensors++;
        if (!(err / tol <= worst_ratio)) { worst_ratio = err / tol; worst_err = err; worst_tol = tol; worst_name = s->name; }
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
        gpu_backward(&g, 1.0f / micro);
        for (size_t i = 0; c->gate != GATE_NONE && i < (size_t)L * N * H; i++) {
            bf_sums[(i / (N * H)) * H + i % H] += fabs(twin->grad_acts.gate_logit[i]);
        }
    }
    double bf_scale = 0.0;
    for (int i = 0; i < L * H; i++) { bf_scale = fmax(bf_scale, bf_sums[i]); }
    free(bf_sums);
    double tol_logits = tolerance(GTOL_LOGITS, s_logits), tol_loss = tolerance(GTOL_LOSS, s_loss);
    check(e_logits <= tol_logits, "gpu %s: logits (rel err %.1e <= %.1e; sens %.1e)", name, e_logits, tol_logits, s_logits);
    check(e_loss <= tol_loss, "gpu %s: loss %.6f vs twin %.6f (rel err %.1e <= %.1e; sens %.1e)", name, gpu_loss,
          twin_loss, e_loss, tol_loss, s_loss);
    compare_gradients(&g, twin, &probe, bf_scale, name);
    gpu_free(&g);
    fox_free(&probe);
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
        float lr = (float)lr_at_step(sched, step);
        double norm = twin_step(twin, inputs, targets, B, T, opt, lr, step + 1);
        double pnorm = twin_step(&probe, inputs, targets, B, T, opt, lr, step + 1);
        gpu_poison(&g);
        gpu_forward(&g, inputs, targets, B, T);
        gpu_zero_grad(&g);
        gpu_backward(&g, 1.0f);
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
    debug_state_read(&ds, path);
    const char* base = strrchr(path, '/');
    base = base != NULL ? base + 1 : path;
    char name[128];
    snprintf(name, sizeof(name), "%.*s", (int)(strlen(base) > 5 ? strlen(base) - 5 : strlen(base)), base);
    FoxConfig c;
    DebugTraining tr;
    debug_config(&ds, &c, &tr);
    FoxModel twin;
    fox_build(&twin, &c);
    load_debug_params(&twin, &ds);
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
// (T = 100, not a multiple of the tile), sliding windows, RoPE with QK-norm, and gradient
// accumulation over two micro-batches. Random initialisation, random tokens, V = 500
// (padded to 512, so pad logits are masked).
static void gpu_test_larger_heads(void) {
    struct { const char* preset; int n_embd, n_head, T; const char* key; const char* value; } cases[] = {
        {"fox-pro-tiny", 128, 2, 100, "window", "0"},
        {"fox-pro-tiny", 128, 2, 100, "window", "37"},
        {"fox-llama-tiny", 128, 1, 100, "rope", "1"},
        {"transformer-pro-tiny", 128, 2, 100, "window", "40"},
        {"fox-pro-tiny", 256, 2, 70, "qk_norm_shared", "1"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        FoxConfig c;
        config_from_preset(&c, cases[i].preset);
        c.n_embd = cases[i].n_embd;
        c.n_head = cases[i].n_head;
        config_set(&c, "vocab_size", "500");
        config_set(&c, cases[i].key, cases[i].value);
        c.mlp_hidden = derived_mlp_hidden(c.n_embd, c.block);
        char name[160];
        snprintf(name, sizeof(name), "%s C=%d hd=%d T=%d %s=%s", cases[i].preset, c.n_embd, c.n_embd / c.n_head,
                 cases[i].T, cases[i].key, cases[i].value);
        FoxModel twin;
        twin_from_config(&twin, &c, 7 + i);
        int B = 2, T = cases[i].T, micro = 2;
        size_t n = (size_t)micro * B * T;
        int* inputs = (int*)malloc_check(n * sizeof(int), "tokens");
        int* targets = (int*)malloc_check(n * sizeof(int), "tokens");
        random_tokens(inputs, n, c.vocab_size, 100 + i);
        random_tokens(targets, n, c.vocab_size, 200 + i);
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
        gpu_forward(g, inputs, targets, B, T);
        gpu_zero_grad(g);
        gpu_backward(g, 1.0f);
        double norm = gpu_grad_norm(g);
        gpu_update(g, &opt, 1e-2f, s + 1, norm);
        losses[s - first] = g->mean_loss;
    }
}

static int gpu_same_device_buffer(const float* d, const float* h, size_t n) {
    float* tmp = (float*)malloc_check(n * sizeof(float), "device copy");
    cudaCheck(cudaMemcpy(tmp, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    int same = memcmp(tmp, h, n * sizeof(float)) == 0;
    free(tmp);
    return same;
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
    check(memcmp(run1, run2, sizeof(run1)) == 0 && gpu_same_device_buffer(g1.params, h2.params_memory, h1.num_parameters),
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
    DataLoader fake;
    memset(&fake, 0, sizeof(fake));
    gpu_save_checkpoint(&g3, dir, &fake, 3);
    char model_path[4096], state_path[4096];
    checkpoint_paths(dir, 3, model_path, state_path, sizeof(model_path));
    FoxModel cpu;
    load_model(&cpu, model_path);
    TrainState st;
    load_state(&cpu, &st, state_path);
    check(st.step == 3 && cpu.num_parameters == g3.num_parameters &&
          gpu_same_device_buffer(g3.params, cpu.params_memory, cpu.num_parameters) &&
          gpu_same_device_buffer(g3.adam_m, cpu.m_memory, cpu.num_parameters) &&
          gpu_same_device_buffer(g3.adam_v, cpu.v_memory, cpu.num_parameters),
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
    TrainState st2 = {5, 0, 0, 0, 1};
    checkpoint_paths(dir, 5, model_path, state_path, sizeof(model_path));
    save_model(&cpu, model_path);
    save_state(&cpu, &st2, state_path);
    FoxModel loaded;
    load_model(&loaded, model_path);
    load_state(&loaded, &st2, state_path);
    GPUModel g5;
    gpu_build(&g5, &loaded, B, T);
    gpu_state_from_host(&g5);
    int same = gpu_same_device_buffer(g5.params, cpu.params_memory, cpu.num_parameters) &&
               gpu_same_device_buffer(g5.adam_m, cpu.m_memory, cpu.num_parameters) &&
               gpu_same_device_buffer(g5.adam_v, cpu.v_memory, cpu.num_parameters);
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

void run_gpu_tests(void) {
    char why[256];
    if (!gpu_available(why, sizeof(why))) {
        printf("skipped: no GPU (%s): GPU against twin on every fixture\n", why);
        printf("skipped: no GPU (%s): head sizes 64/128, windows, accumulation\n", why);
        printf("skipped: no GPU (%s): determinism, checkpoints both ways, resume\n", why);
        return;
    }
    gpu_init();
    printf("GPU tests on %s, %s build\n", g_prop.name, PRECISION_NAME);
    glob_t gl;
    if (glob("dev/fixtures/*.fxds", 0, NULL, &gl) != 0 || gl.gl_pathc == 0) {
        check(0, "gpu: no reference fixtures in dev/fixtures");
    } else {
        for (size_t i = 0; i < gl.gl_pathc; i++) { gpu_test_fixture(gl.gl_pathv[i]); }
        globfree(&gl);
    }
    gpu_test_larger_heads();
    gpu_test_checkpoints_and_determinism();
}
#endif // __CUDACC__

int main(void) {
    make_test_dir();
    printf("# CPU twin against the float64 PyTorch reference (dev/fixtures)\n");
    test_reference_fixtures();
    test_reference_check_discriminates();
    printf("# finite differences\n");
    test_finite_differences();
    test_attention_dlogf();
    printf("# numerical guards, extreme forget gates\n");
    test_step_guard();
    test_nonfinite_grad_name();
    test_extreme_forget_gates();
    printf("# configuration, schedule, command line\n");
    test_config();
    test_command_line();
    printf("# data, checkpoints, decode table\n");
    test_dataloader();
    test_checkpoints();
    test_decode_table();
    test_bad_decode_table();
    printf("# GPU\n");
    run_gpu_tests();
    char cleanup[600];
    snprintf(cleanup, sizeof(cleanup), "rm -rf '%s'", test_dir);
    if (system(cleanup) != 0) { printf("note: could not remove %s\n", test_dir); }
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed != 0;
}
