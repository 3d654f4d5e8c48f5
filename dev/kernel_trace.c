// CUPTI injection library for dev/trace_step.py: every kernel, copy and memset of a process with
// the GPU's start and end timestamps, as the process runs them (no replay, no serialisation).
//
//   CUDA_INJECTION64_PATH=build/libkernel_trace.so KERNEL_TRACE_OUT=trace.csv ./train_fox ...
//
// Writes one CSV line per record, flushed at exit: start_ns,end_ns,kind,name (kind K kernel,
// C copy, S memset; kernel names demangled).
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

char* __cxa_demangle(const char* mangled, char* out, size_t* length, int* status); // libstdc++

static FILE* trace_out;

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = (size_t)16 << 20;
    *buffer = (uint8_t*)aligned_alloc(64, *size);
    *max_records = 0;
}

static void write_kernel(const CUpti_ActivityKernel10* k) {
    int status = -1;
    char* name = __cxa_demangle(k->name, NULL, NULL, &status);
    fprintf(trace_out, "%llu,%llu,K,\"%s\"\n", (unsigned long long)k->start, (unsigned long long)k->end,
            status == 0 ? name : k->name);
    free(name);
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
    (void)ctx; (void)stream; (void)size;
    CUpti_Activity* r = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            write_kernel((const CUpti_ActivityKernel10*)r);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6* m = (const CUpti_ActivityMemcpy6*)r;
            fprintf(trace_out, "%llu,%llu,C,\"copy %llu bytes\"\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, (unsigned long long)m->bytes);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4* m = (const CUpti_ActivityMemset4*)r;
            fprintf(trace_out, "%llu,%llu,S,\"memset %llu bytes\"\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, (unsigned long long)m->bytes);
        }
    }
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(1);
    fclose(trace_out);
}

// called by the CUDA driver at initialisation when CUDA_INJECTION64_PATH names this library
int InitializeInjection(void) {
    const char* path = getenv("KERNEL_TRACE_OUT");
    trace_out = fopen(path != NULL ? path : "kernel_trace.csv", "w");
    if (trace_out == NULL) {
        fprintf(stderr, "kernel_trace: cannot write '%s'\nHINT: set KERNEL_TRACE_OUT to a writable path\n", path);
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI refused the activity trace\n"
                        "HINT: another profiler (ncu, nsys) may hold CUPTI; run without it\n");
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
