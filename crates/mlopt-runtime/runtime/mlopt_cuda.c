/* mlopt CUDA launcher: what a library compiled with `--target sm_XX` runs its kernels with.
 *
 * It needs no CUDA toolkit to build or link: libcuda.so.1 (the driver, present wherever a GPU is) is
 * opened with dlopen when the first model is created. A model is described by its generated object
 * (mlopt_gpu_model): the PTX text, a table of 64-bit words (sizes, weights, launches) and the weights.
 *
 * create: loads the PTX module, uploads the weights once, allocates the activation arena (one
 * allocation) and staging buffers for the inputs and outputs, and makes a stream.
 * run_device: launches the kernels in order on a stream, on the caller's device buffers; asynchronous,
 *   except that after a data check (an index in range, a nonzero integer divisor) it reads the check's
 *   flag back, waiting for the stream, and fails with the check's message when the data is invalid; and
 *   before a guarded launch (what one branch of an If decided at run time needs) it reads the guard's
 *   condition bytes back, waiting for the stream, and skips the launch unless they say so.
 * run: copies host inputs in, launches, copies outputs back, and waits.
 *
 * The table (little-endian u64 words):
 *   version (3; 2 has no guards), inputs, outputs, arena bytes, weight bytes, kernels, steps,
 *   bytes of each input, bytes of each output,
 *   then per step: kernel, grid, block, shared bytes, args, and per arg: kind, value
 *   (kind 0 input i, 1 output i, 2 weight byte offset, 3 arena byte offset), then the check: 0, or 1 +
 *   its message's number, and the arena byte offset of its 4-byte flag; then (version 3) the guard:
 *   its conditions' count and per condition kind, value (a place, as an arg's) and 1 when the launch
 *   needs the byte there nonzero, 0 when it needs it zero.
 * The strings are the kernel names in kernel order, then the checks' messages, each ending in '\0'. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Weak: every GPU library mlopt writes carries this launcher, and a program may link several. */
#define MLOPT_SHARED __attribute__((weak))

typedef struct {
    const char *ptx;
    const uint64_t *table;
    const uint8_t *weights;
    const char *names;
} mlopt_gpu_model;

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

static struct {
    int loaded;
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUresult (*cuGetErrorString)(CUresult, const char **);
} cu;

static _Thread_local char last_error[512];

MLOPT_SHARED const char *mlopt_gpu_last_error(void) { return last_error; }

static int fail(const char *what, CUresult r) {
    const char *s = NULL;
    if (cu.cuGetErrorString) cu.cuGetErrorString(r, &s);
    snprintf(last_error, sizeof last_error, "%s failed: %s (CUresult %d)", what, s ? s : "unknown error", r);
    return -1;
}

#define CHECK(call)                                  \
    do {                                             \
        CUresult r_ = (call);                        \
        if (r_ != 0) return fail(#call, r_);         \
    } while (0)

static int load_driver(void) {
    if (cu.loaded) return 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(last_error, sizeof last_error, "no CUDA driver: cannot open libcuda.so.1 (%s)", dlerror());
        return -1;
    }
#define SYM(field, name)                                                                        \
    do {                                                                                        \
        *(void **)&cu.field = dlsym(h, name);                                                   \
        if (!cu.field) {                                                                        \
            snprintf(last_error, sizeof last_error, "libcuda.so.1 has no %s", name);            \
            return -1;                                                                          \
        }                                                                                       \
    } while (0)
    SYM(cuInit, "cuInit");
    SYM(cuDeviceGet, "cuDeviceGet");
    SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
    SYM(cuModuleLoadData, "cuModuleLoadData");
    SYM(cuModuleUnload, "cuModuleUnload");
    SYM(cuModuleGetFunction, "cuModuleGetFunction");
    SYM(cuMemAlloc, "cuMemAlloc_v2");
    SYM(cuMemFree, "cuMemFree_v2");
    SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    SYM(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    SYM(cuStreamCreate, "cuStreamCreate");
    SYM(cuStreamDestroy, "cuStreamDestroy_v2");
    SYM(cuStreamSynchronize, "cuStreamSynchronize");
    SYM(cuLaunchKernel, "cuLaunchKernel");
    SYM(cuGetErrorString, "cuGetErrorString");
#undef SYM
    CHECK(cu.cuInit(0));
    cu.loaded = 1;
    return 0;
}

typedef struct {
    const mlopt_gpu_model *m;
    CUdevice device;
    CUcontext ctx;
    CUmodule module;
    CUfunction *fns;
    CUstream stream;
    CUdeviceptr weights, arena, io;
    CUdeviceptr *in, *out; /* staging buffers of run() */
    const char *messages;  /* the checks' messages, after the kernel names */
} model;

enum { VERSION, INPUTS, OUTPUTS, ARENA, WEIGHT_BYTES, KERNELS, STEPS, HEADER };

static uint64_t in_bytes(const uint64_t *t, uint64_t i) { return t[HEADER + i]; }
static uint64_t out_bytes(const uint64_t *t, uint64_t i) { return t[HEADER + t[INPUTS] + i]; }

static int setup(model *c, int device) {
    const uint64_t *t = c->m->table;
    if (t[VERSION] != 2 && t[VERSION] != 3) {
        snprintf(last_error, sizeof last_error, "model table version %llu, launcher knows 2 and 3", (unsigned long long)t[VERSION]);
        return -1;
    }
    if (load_driver()) return -1;
    CHECK(cu.cuDeviceGet(&c->device, device));
    CHECK(cu.cuDevicePrimaryCtxRetain(&c->ctx, c->device));
    CHECK(cu.cuCtxSetCurrent(c->ctx));
    CHECK(cu.cuModuleLoadData(&c->module, c->m->ptx));
    c->fns = calloc(t[KERNELS] ? t[KERNELS] : 1, sizeof(CUfunction));
    c->in = calloc(t[INPUTS] + 1, sizeof(CUdeviceptr));
    c->out = calloc(t[OUTPUTS] + 1, sizeof(CUdeviceptr));
    if (!c->fns || !c->in || !c->out) {
        snprintf(last_error, sizeof last_error, "out of host memory");
        return -1;
    }
    const char *name = c->m->names;
    for (uint64_t k = 0; k < t[KERNELS]; k++) {
        CHECK(cu.cuModuleGetFunction(&c->fns[k], c->module, name));
        name += strlen(name) + 1;
    }
    c->messages = name;
    CHECK(cu.cuStreamCreate(&c->stream, 0));
    /* Weights: uploaded once, here. */
    if (t[WEIGHT_BYTES]) {
        CHECK(cu.cuMemAlloc(&c->weights, t[WEIGHT_BYTES]));
        CHECK(cu.cuMemcpyHtoDAsync(c->weights, c->m->weights, t[WEIGHT_BYTES], c->stream));
    }
    if (t[ARENA]) CHECK(cu.cuMemAlloc(&c->arena, t[ARENA]));
    /* Staging for run(): every input and output in one allocation, 256-byte aligned. */
    uint64_t total = 0;
    for (uint64_t i = 0; i < t[INPUTS]; i++) total += (in_bytes(t, i) + 255) / 256 * 256;
    for (uint64_t i = 0; i < t[OUTPUTS]; i++) total += (out_bytes(t, i) + 255) / 256 * 256;
    if (total) CHECK(cu.cuMemAlloc(&c->io, total));
    uint64_t at = 0;
    for (uint64_t i = 0; i < t[INPUTS]; i++) c->in[i] = c->io + at, at += (in_bytes(t, i) + 255) / 256 * 256;
    for (uint64_t i = 0; i < t[OUTPUTS]; i++) c->out[i] = c->io + at, at += (out_bytes(t, i) + 255) / 256 * 256;
    CHECK(cu.cuStreamSynchronize(c->stream));
    return 0;
}

MLOPT_SHARED void mlopt_gpu_destroy(void *ctx) {
    model *c = ctx;
    if (!c) return;
    if (cu.loaded && c->ctx) {
        cu.cuCtxSetCurrent(c->ctx);
        if (c->stream) cu.cuStreamSynchronize(c->stream), cu.cuStreamDestroy(c->stream);
        if (c->io) cu.cuMemFree(c->io);
        if (c->arena) cu.cuMemFree(c->arena);
        if (c->weights) cu.cuMemFree(c->weights);
        if (c->module) cu.cuModuleUnload(c->module);
        cu.cuDevicePrimaryCtxRelease(c->device);
    }
    free(c->fns);
    free(c->in);
    free(c->out);
    free(c);
}

MLOPT_SHARED void *mlopt_gpu_create(const mlopt_gpu_model *m, int device) {
    model *c = calloc(1, sizeof(model));
    if (!c) {
        snprintf(last_error, sizeof last_error, "out of host memory");
        return NULL;
    }
    c->m = m;
    if (setup(c, device)) {
        mlopt_gpu_destroy(c);
        return NULL;
    }
    return c;
}

/* Launches every kernel in order on `stream` (NULL: the model's own stream). */
/* The device address of a place in the table: kind 0 input i, 1 output i, 2 weight byte offset, 3 arena
   byte offset. */
static CUdeviceptr place(const model *c, const CUdeviceptr *inputs, const CUdeviceptr *outputs, uint64_t kind, uint64_t value) {
    switch (kind) {
    case 0: return inputs[value];
    case 1: return outputs[value];
    case 2: return c->weights + value;
    default: return c->arena + value;
    }
}

MLOPT_SHARED int mlopt_gpu_run_device(void *ctx, const CUdeviceptr *inputs, const CUdeviceptr *outputs, void *stream) {
    model *c = ctx;
    if (!c || !inputs || !outputs) {
        snprintf(last_error, sizeof last_error, "a NULL context, inputs or outputs array");
        return -1;
    }
    const uint64_t *t = c->m->table;
    CUstream s = stream ? stream : c->stream;
    CHECK(cu.cuCtxSetCurrent(c->ctx));
    /* The kernels load and store 16 bytes at a time (ld/st.global.v4, cp.async): every buffer must start
       16-byte aligned, as cuMemAlloc's (256-byte aligned) do. */
    for (uint64_t i = 0; i < t[INPUTS] + t[OUTPUTS]; i++) {
        CUdeviceptr p = i < t[INPUTS] ? inputs[i] : outputs[i - t[INPUTS]];
        if (p % 16) {
            snprintf(last_error, sizeof last_error, "%s %llu: device pointer 0x%llx is not 16-byte aligned", i < t[INPUTS] ? "input" : "output", (unsigned long long)(i < t[INPUTS] ? i : i - t[INPUTS]), (unsigned long long)p);
            return -1;
        }
    }
    const uint64_t *w = t + HEADER + t[INPUTS] + t[OUTPUTS];
    CUdeviceptr args[64];
    void *params[64];
    for (uint64_t st = 0; st < t[STEPS]; st++) {
        uint64_t kernel = w[0], grid = w[1], block = w[2], shared = w[3], n = w[4];
        w += 5;
        if (n > 64 || kernel >= t[KERNELS]) {
            snprintf(last_error, sizeof last_error, "step %llu: malformed launch table", (unsigned long long)st);
            return -1;
        }
        for (uint64_t a = 0; a < n; a++, w += 2) {
            args[a] = place(c, inputs, outputs, w[0], w[1]);
            params[a] = &args[a];
        }
        uint64_t check = w[0], flag_at = w[1];
        w += 2;
        int taken = 1;
        if (t[VERSION] >= 3) {
            uint64_t conds = w[0];
            w += 1;
            for (uint64_t g = 0; g < conds; g++, w += 3) {
                uint8_t byte = 0;
                CHECK(cu.cuMemcpyDtoHAsync(&byte, place(c, inputs, outputs, w[0], w[1]), 1, s));
                CHECK(cu.cuStreamSynchronize(s));
                if ((byte != 0) != (w[2] != 0)) taken = 0;
            }
        }
        if (!taken) continue;
        /* Shared memory is static (declared in the PTX), so no dynamic bytes are passed. */
        (void)shared;
        CHECK(cu.cuLaunchKernel(c->fns[kernel], (unsigned)grid, 1, 1, (unsigned)block, 1, 1, 0, s, params, NULL));
        if (check) {
            uint32_t flag = 0;
            CHECK(cu.cuMemcpyDtoHAsync(&flag, c->arena + flag_at, sizeof flag, s));
            CHECK(cu.cuStreamSynchronize(s));
            if (flag) {
                const char *msg = c->messages;
                for (uint64_t i = 1; i < check; i++) msg += strlen(msg) + 1;
                snprintf(last_error, sizeof last_error, "%s", msg);
                return -1;
            }
        }
    }
    return 0;
}

/* Host buffers in and out: copies, launches and waits. */
MLOPT_SHARED int mlopt_gpu_run(void *ctx, const void *const *inputs, void *const *outputs) {
    model *c = ctx;
    if (!c || !inputs || !outputs) {
        snprintf(last_error, sizeof last_error, "a NULL context, inputs or outputs array");
        return -1;
    }
    const uint64_t *t = c->m->table;
    for (uint64_t i = 0; i < t[INPUTS] + t[OUTPUTS]; i++) {
        if (i < t[INPUTS] ? !inputs[i] : !outputs[i - t[INPUTS]]) {
            snprintf(last_error, sizeof last_error, "%s %llu is NULL", i < t[INPUTS] ? "input" : "output", (unsigned long long)(i < t[INPUTS] ? i : i - t[INPUTS]));
            return -1;
        }
    }
    CHECK(cu.cuCtxSetCurrent(c->ctx));
    for (uint64_t i = 0; i < t[INPUTS]; i++) CHECK(cu.cuMemcpyHtoDAsync(c->in[i], inputs[i], in_bytes(t, i), c->stream));
    if (mlopt_gpu_run_device(c, c->in, c->out, NULL)) return -1;
    for (uint64_t i = 0; i < t[OUTPUTS]; i++) CHECK(cu.cuMemcpyDtoHAsync(outputs[i], c->out[i], out_bytes(t, i), c->stream));
    CHECK(cu.cuStreamSynchronize(c->stream));
    return 0;
}
