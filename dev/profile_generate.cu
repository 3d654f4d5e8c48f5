/*
dev/profile_generate.cu: where the time of one generated token goes on the GPU decoder of
train_fox.cu (dev/generate.cuh): a preset model (random init) prefilled with B prompts of the held-out shard, then
the step as one CUDA graph (with and without the host's wait for each token) and each of its
launches alone (CUDA events around 20 repetitions, the mean; the attention kernels rewrite the
same cache slot each time). Not a test: numbers for dev/RESULTS.md.

  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --default-stream per-thread -Xcompiler -fopenmp \
       -DNO_GPT2_ENCODER dev/profile_generate.cu -lcublasLt -lcublas -lnccl -o profile_generate
  ./profile_generate fox-pro-125m 8192 1          # preset, prompt tokens, prompts
*/
#define FOX_NO_MAIN
#include "../train_fox.cu"

#define REPS 20

// mean milliseconds of one launch of fn, over REPS launches timed with events
static double time_stage(GpuDecoder* d, void (*fn)(GpuDecoder*, int), int l) {
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a)); cudaCheck(cudaEventCreate(&b));
    fn(d, l); // warm
    cudaCheck(cudaEventRecord(a, d->stream));
    for (int i = 0; i < REPS; i++) { fn(d, l); }
    cudaCheck(cudaEventRecord(b, d->stream));
    cudaCheck(cudaEventSynchronize(b));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, a, b));
    cudaCheck(cudaEventDestroy(a)); cudaCheck(cudaEventDestroy(b));
    return ms / REPS;
}

static void st_embed(GpuDecoder* d, int l) { (void)l; decode_embed_gpu(d); }
static void st_logits(GpuDecoder* d, int l) { (void)l; decode_logits_gpu(d); }
static void st_sample(GpuDecoder* d, int l) { (void)l; decode_sample_gpu(d); }

int main(int argc, char** argv) {
    const char* preset = argc > 1 ? argv[1] : "fox-pro-125m";
    int T = argc > 2 ? atoi(argv[2]) : 8192, B = argc > 3 ? atoi(argv[3]) : 1, steps = 48;
    gpu_init();
    FoxConfig c;
    if (!config_from_preset(&c, preset)) { fail("unknown preset %s\nHINT: e.g. fox-pro-125m", preset); }
    c.mlp_hidden = derived_mlp_hidden(c.n_embd, c.block);
    FoxModel m;
    fox_build(&m, &c);
    fox_init(&m, 1337);
    int cap = T + steps + 2;
    int* tokens = (int*)malloc_check((size_t)B * cap * sizeof(int), "tokens");
    int* lens = (int*)malloc_check((size_t)B * sizeof(int), "lens");
    int* src = (int*)malloc_check((size_t)B * T * sizeof(int), "tokens");
    read_token_stream("data/gutenberg/gutenberg_val_*.bin", (size_t)B * T, 0, GPT2_EOT, src);
    for (int b = 0; b < B; b++) { lens[b] = T; memcpy(tokens + (size_t)b * cap, src + (size_t)b * T, T * sizeof(int)); }
    GPUModel g;
    gpu_build(&g, &m, B, T);
    GpuDecoder d;
    gpu_decoder_init(&d, &g, B, cap, 0, -10.0f, cap);
    uint64_t seeds[1024];
    for (int b = 0; b < B && b < 1024; b++) { seeds[b] = generate_seed(1, b); }
    gpu_decoder_begin(&d, B, 0.0, 0, seeds);
    gpu_decoder_prefill(&d, tokens, cap, lens);
    printf("%s, %d prompt(s) of %d tokens, %s, %d SMs; splits %d\n", preset, B, T, g_prop.name,
           g_prop.multiProcessorCount, d.splits);
    // the step three ways, 8 tokens each after 2 to warm up: the graph with programmatic dependent
    // launch (what generation runs), the graph without it, the kernels launched one by one
    const char* how[3] = {"graph, programmatic dependent launch", "graph, plain stream order", "no graph"};
    for (int v = 0; v < 3; v++) {
        gpu_decoder_drop_graph(&d);
        d.pdl = v == 0;
        d.use_graph = v < 2;
        gpu_decoder_capture(&d);
        for (int i = 0; i < 2; i++) { gpu_decoder_step(&d); }
        double t0 = now_seconds();
        for (int i = 0; i < 8; i++) { gpu_decoder_step(&d); }
        printf("step (%s): %.3f ms with the host's wait for each token\n", how[v], (now_seconds() - t0) / 8 * 1e3);
    }
    gpu_decoder_drop_graph(&d);
    d.pdl = 1; d.use_graph = 1;
    gpu_decoder_capture(&d);
    double t0 = now_seconds();
    for (int i = 0; i < 8; i++) { cudaCheck(cudaGraphLaunch(d.graph, d.stream)); }
    cudaCheck(cudaStreamSynchronize(d.stream));
    for (int b = 0; b < B; b++) { d.host_pos[b] += 8; }
    printf("step (graph, programmatic dependent launch): %.3f ms launched back to back\n",
           (now_seconds() - t0) / 8 * 1e3);
    d.pdl = 0; // the stages alone, each in plain stream order
    struct { const char* name; void (*fn)(GpuDecoder*, int); int per_layer; } st[] = {
        {"embedding", st_embed, 0}, {"q k v (+og, shifts, gate) matvec", decode_qkv_gpu, 1},
        {"attention (splits)", decode_attention_gpu, 1}, {"combine + output norm, gate", decode_combine_gpu, 1},
        {"W_o matvec + residual", decode_out_gpu, 1}, {"W_gu matvec (RMSNorm)", decode_mlp_up_gpu, 1},
        {"W_down matvec (SwiGLU) + residual", decode_mlp_down_gpu, 1}, {"lm_head matvec (RMSNorm)", st_logits, 0},
        {"sampling", st_sample, 0}};
    double total = 0.0;
    printf("%-36s %10s %10s\n", "stage", "ms each", "ms a token");
    for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++) {
        double ms = 0.0;
        int n = st[i].per_layer ? c.n_layer : 1;
        for (int l = 0; l < n; l++) { ms += time_stage(&d, st[i].fn, l); }
        printf("%-36s %10.4f %10.4f\n", st[i].name, ms / n, ms);
        total += ms;
    }
    printf("%-36s %10s %10.4f (plus the cache upkeep and two 8-byte copies)\n", "sum of the stages alone", "", total);
    gpu_decoder_free(&d);
    gpu_free(&g);
    fox_free(&m);
    return 0;
}
