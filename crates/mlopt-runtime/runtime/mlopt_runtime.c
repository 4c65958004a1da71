/* mlopt runtime: the thread pool that parallel loops of generated kernels run on.
 *
 * mlopt_parallel_for(fn, ctx, n) splits 0..n into one contiguous range per thread; the calling thread
 * takes the first range, workers the others, and the call returns when all are done. Workers spin for a
 * short while between loops (kernels come back to back) and then sleep on a condition variable; the caller
 * waits for them the same way. A child process after fork() starts with an empty pool (pthread_atfork).
 *
 * The thread count is, in order of precedence: mlopt_set_num_threads(n), the MLOPT_NUM_THREADS
 * environment variable, and the count the model was compiled with (mlopt_init_threads). The pool is
 * shared by every model in the process; parallel loops from concurrent runs take turns. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef void (*mlopt_task)(void *ctx, int64_t begin, int64_t end);

/* Every library mlopt writes carries this runtime, so a program that links several (even with
 * --whole-archive) has several copies: its functions are weak definitions, and the linker keeps one
 * (one pool for every model in the process, as documented). */
#define MLOPT_SHARED __attribute__((weak))

#define MLOPT_MAX_THREADS 256
/* How long a waiting thread spins before it blocks: long enough to catch the next kernel of a run, short
 * enough that a process which runs a model now and then does not keep a core busy. */
#define SPIN_NS 50000

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER; /* workers: a new generation */
static pthread_cond_t done = PTHREAD_COND_INITIALIZER; /* the caller: pending reached 0 */
static atomic_int threads;  /* the chosen count; 0 until decided */
static atomic_int user_set;
static int started = 1; /* threads running, the caller included (under job_mu) */
static mlopt_task job_fn;
static void *job_ctx;
static int64_t job_n;
static int job_threads;
static atomic_uint_fast64_t generation;
static atomic_int pending;
static uint64_t start_gen; /* the generation new workers start from (set before they are created) */
static pthread_mutex_t job_mu = PTHREAD_MUTEX_INITIALIZER; /* one parallel loop at a time */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void run_range(int t, int nt) {
    int64_t begin = job_n * t / nt, end = job_n * (t + 1) / nt;
    if (begin < end) job_fn(job_ctx, begin, end);
}

/* Nanoseconds of a monotonic clock: profiled builds (`mlopt bench --profile`) read it between kernels. */
MLOPT_SHARED uint64_t mlopt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void pause_cpu(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spins (with pause) until ready(arg), for at most SPIN_NS; returns 1 if it is still not ready. */
static int spin(int (*ready)(const void *), const void *arg) {
    uint64_t until = 0;
    for (unsigned i = 1; !ready(arg); i++) {
        pause_cpu();
        if ((i & 63) == 0) {
            uint64_t now = mlopt_now_ns();
            if (!until) until = now + SPIN_NS;
            else if (now > until) return 1;
        }
    }
    return 0;
}

/* A worker's wait: a generation other than the one it has seen (*arg). */
static int new_generation(const void *seen) {
    return atomic_load_explicit(&generation, memory_order_acquire) != *(const uint64_t *)seen;
}

/* The caller's wait: every worker is done. */
static int all_done(const void *unused) {
    (void)unused;
    return atomic_load_explicit(&pending, memory_order_acquire) <= 0;
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t seen = start_gen;
    for (;;) {
        if (spin(new_generation, &seen)) {
            pthread_mutex_lock(&mu);
            while (atomic_load(&generation) == seen) pthread_cond_wait(&wake, &mu);
            pthread_mutex_unlock(&mu);
        }
        seen = atomic_load(&generation);
        if (id < job_threads) run_range(id, job_threads);
        if (atomic_fetch_sub_explicit(&pending, 1, memory_order_acq_rel) == 1) {
            /* The last one wakes the caller if it stopped spinning (it checks pending under mu). */
            pthread_mutex_lock(&mu);
            pthread_cond_signal(&done);
            pthread_mutex_unlock(&mu);
        }
    }
    return 0;
}

/* fork(): the child has only the forking thread, so its pool starts empty; the locks are held across
 * the fork so that no other thread is inside the pool's state when it is copied. */
static void fork_prepare(void) {
    pthread_mutex_lock(&job_mu);
    pthread_mutex_lock(&mu);
}

static void fork_parent(void) {
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&job_mu);
}

static void fork_child(void) {
    pthread_mutex_init(&mu, NULL);
    pthread_mutex_init(&job_mu, NULL);
    pthread_cond_init(&wake, NULL);
    pthread_cond_init(&done, NULL);
    started = 1;
    atomic_store(&pending, 0);
}

static void register_fork(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

static void start_workers(int n) {
    start_gen = atomic_load(&generation);
    for (; started < n && started < MLOPT_MAX_THREADS; started++) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &a, worker, (void *)(intptr_t)started) != 0;
        pthread_attr_destroy(&a);
        if (failed) break;
    }
}

static int clamp_threads(int n) { return n < 1 ? 1 : n > MLOPT_MAX_THREADS ? MLOPT_MAX_THREADS : n; }

MLOPT_SHARED void mlopt_set_num_threads(int n) {
    atomic_store(&threads, clamp_threads(n));
    atomic_store(&user_set, 1);
}

MLOPT_SHARED int mlopt_get_num_threads(void) {
    int n = atomic_load(&threads);
    return n < 1 ? 1 : n;
}

MLOPT_SHARED void mlopt_init_threads(int compiled) {
    if (atomic_load(&user_set) || atomic_load(&threads)) return;
    const char *env = getenv("MLOPT_NUM_THREADS");
    int expected = 0;
    /* The first run decides, unless mlopt_set_num_threads came first (then threads is nonzero). */
    atomic_compare_exchange_strong(&threads, &expected, clamp_threads(env ? atoi(env) : compiled));
}

/* Models whose contractions run on AMX tiles call this first: Linux gives a process the tile state only
 * after arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); without it the first tile instruction
 * faults. The permission is process-wide, so threads of the pool inherit it. Returns 0, or -1 when the
 * kernel refuses (the run then fails with a status; a library never aborts its host). */
MLOPT_SHARED int mlopt_init_amx(void) {
    static atomic_int done_amx;
    if (atomic_load(&done_amx)) return 0;
#ifdef __linux__
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) return -1;
#endif
    atomic_store(&done_amx, 1);
    return 0;
}

/* Scratch memory: the local buffers of a kernel that are too large for the stack (a convolution's padded
 * input, packed panels, Winograd's transforms). Each thread keeps one buffer per level (0: a kernel's own,
 * k: those of the body of a parallel loop nested k deep, which runs on this thread while the kernel's
 * level-0 buffer is live), grown to the largest request and kept for the next run, so a run allocates
 * nothing once it has run; freed when the thread exits. 64-byte aligned; NULL when out of memory (the
 * kernel then fails with MLOPT_ERR_MEMORY) or for a level beyond MLOPT_SCRATCH_LEVELS. */
#define MLOPT_SCRATCH_LEVELS 8
struct scratch {
    void *p[MLOPT_SCRATCH_LEVELS];
    uint64_t n[MLOPT_SCRATCH_LEVELS];
};
static _Thread_local struct scratch *own_scratch;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void free_scratch(void *arg) {
    struct scratch *s = arg;
    for (int i = 0; i < MLOPT_SCRATCH_LEVELS; i++) free(s->p[i]);
    free(s);
}

static void make_scratch_key(void) { pthread_key_create(&scratch_key, free_scratch); }

MLOPT_SHARED void *mlopt_scratch(int64_t level, uint64_t bytes) {
    if (level < 0 || level >= MLOPT_SCRATCH_LEVELS || bytes > UINT64_MAX - 64) return NULL;
    struct scratch *s = own_scratch;
    if (!s) {
        pthread_once(&scratch_once, make_scratch_key);
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        if (pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
        own_scratch = s;
    }
    if (s->n[level] < bytes) {
        uint64_t n = (bytes + 63) / 64 * 64;
        void *p = aligned_alloc(64, n);
        if (!p) return NULL;
        free(s->p[level]);
        s->p[level] = p;
        s->n[level] = n;
    }
    return s->p[level];
}

MLOPT_SHARED void mlopt_parallel_for(mlopt_task fn, void *ctx, int64_t n) {
    int nt = mlopt_get_num_threads();
    if (nt > n) nt = (int)n;
    if (nt <= 1) {
        if (n > 0) fn(ctx, 0, n);
        return;
    }
    pthread_once(&fork_once, register_fork);
    pthread_mutex_lock(&job_mu);
    pthread_mutex_lock(&mu);
    start_workers(nt);
    if (started < nt) nt = started;
    job_fn = fn;
    job_ctx = ctx;
    job_n = n;
    job_threads = nt;
    atomic_store(&pending, started - 1);
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&mu);
    run_range(0, nt);
    if (spin(all_done, NULL)) {
        pthread_mutex_lock(&mu);
        while (atomic_load(&pending) > 0) pthread_cond_wait(&done, &mu);
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_unlock(&job_mu);
}

/* Whether this CPU (and its OS, which must save the wider registers) has every ISA feature in `features`,
 * a comma-separated list in LLVM's spelling: the features a library was compiled for, which its entry
 * point checks before any of its code runs, so that a library moved to an older CPU returns
 * MLOPT_ERR_PLATFORM instead of dying on an illegal instruction. Names it does not know are not checked
 * (the list covers what mlopt targets: AVX, AVX2, FMA, AVX-512 and its extensions, AMX). Features named in
 * the MLOPT_CPU_DISABLE environment variable (same spelling) count as absent: a way to see what a library
 * does on a CPU without them. On success, returns 1; else 0, with the first missing name copied into
 * `missing` (of `n` bytes). This file is compiled for the baseline x86-64, so it runs on any of them. */
/* Lists that passed, so a run pays for CPUID (a VM exit under a hypervisor) and the scan only once per
 * library: each entry point passes its own constant list. */
static const char *_Atomic cpu_passed[8];

MLOPT_SHARED int mlopt_cpu_supports(const char *features, char *missing, size_t n) {
    for (int i = 0; i < 8; i++)
        if (atomic_load_explicit(&cpu_passed[i], memory_order_acquire) == features) return 1;
#if defined(__x86_64__)
    unsigned a, b, c, d;
    unsigned l1c = 0, l7b = 0, l7c = 0, l7d = 0, l71a = 0, e1c = 0;
    unsigned long long xcr0 = 0;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    unsigned max = a;
    if (max >= 1) {
        __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
        l1c = c;
    }
    if (max >= 7) {
        __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
        l7b = b, l7c = c, l7d = d;
        unsigned sub = a;
        if (sub >= 1) {
            __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
            l71a = a;
        }
    }
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000000u), "c"(0));
    if (a >= 0x80000001u) {
        __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000001u), "c"(0));
        e1c = c;
    }
    if (l1c & (1u << 27)) { /* OSXSAVE: XCR0 says which register states the OS saves */
        unsigned lo, hi;
        __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    int avx_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6, amx_os = (xcr0 & 0x60000) == 0x60000;
    static const struct {
        const char *name;
        int leaf; /* 1: leaf 1 ECX, 2: 7.0 EBX, 3: 7.0 ECX, 4: 7.0 EDX, 5: 7.1 EAX, 6: 0x80000001 ECX */
        int bit;
        int os; /* 1: AVX state, 2: AVX-512 state, 3: AMX state */
    } known[] = {
        {"avx", 1, 28, 1}, {"fma", 1, 12, 1}, {"f16c", 1, 29, 1}, {"movbe", 1, 22, 0},
        {"bmi1", 2, 3, 0}, {"avx2", 2, 5, 1}, {"bmi2", 2, 8, 0}, {"avx512f", 2, 16, 2},
        {"avx512dq", 2, 17, 2}, {"avx512cd", 2, 28, 2}, {"avx512bw", 2, 30, 2}, {"avx512vl", 2, 31, 2},
        {"avx512vbmi", 3, 1, 2}, {"avx512vbmi2", 3, 6, 2}, {"avx512vnni", 3, 11, 2},
        {"avx512bitalg", 3, 12, 2}, {"avx512vpopcntdq", 3, 14, 2}, {"amx-bf16", 4, 22, 3},
        {"avx512fp16", 4, 23, 2}, {"amx-tile", 4, 24, 3}, {"amx-int8", 4, 25, 3},
        {"avx512bf16", 5, 5, 2}, {"lzcnt", 6, 5, 0},
    };
    const unsigned regs[7] = {0, l1c, l7b, l7c, l7d, l71a, e1c};
    const int os_ok[4] = {1, avx_os, zmm_os, amx_os};
    const char *off = getenv("MLOPT_CPU_DISABLE");
    for (const char *f = features; f && *f;) {
        const char *end = strchr(f, ',');
        size_t len = end ? (size_t)(end - f) : strlen(f);
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
            if (strlen(known[k].name) != len || strncmp(known[k].name, f, len) != 0) continue;
            int have = (regs[known[k].leaf] >> known[k].bit & 1u) && os_ok[known[k].os];
            for (const char *o = off; have && o && *o;) {
                const char *oe = strchr(o, ',');
                size_t ol = oe ? (size_t)(oe - o) : strlen(o);
                if (ol == len && strncmp(o, f, len) == 0) have = 0;
                o = oe ? oe + 1 : NULL;
            }
            if (!have) {
                if (n > 0) {
                    size_t m = len < n - 1 ? len : n - 1;
                    memcpy(missing, f, m);
                    missing[m] = 0;
                }
                return 0;
            }
        }
        f = end ? end + 1 : NULL;
    }
    for (int i = 0; i < 8; i++) {
        const char *empty = NULL;
        if (atomic_compare_exchange_strong(&cpu_passed[i], &empty, features)) break;
    }
    return 1;
#else
    (void)features, (void)missing, (void)n;
    return 1;
#endif
}

/* Dynamic batch: one library holds the model compiled at several batch sizes (variants, largest first),
 * and a run of n items is a run of the largest variant that fits what is left, repeated: n = 13 with
 * variants 8, 4, 2, 1 runs 8, 4 and 1. Inputs and outputs with a batch dimension are consecutive items
 * (item_bytes each), so a chunk is the same arrays offset by the items done; an input without one
 * (item_bytes 0) is passed whole to every chunk. The context holds one context per variant. */
typedef struct {
    void *(*create)(void);
    int (*run)(void *ctx, const void *const *inputs, void *const *outputs);
    const char *(*error)(const void *ctx);
    void (*destroy)(void *ctx);
    int64_t batch;
} mlopt_variant;

typedef struct {
    const mlopt_variant *variants;
    int64_t num_variants;
    int64_t max_batch;
    int64_t num_inputs, num_outputs;
    const uint64_t *input_item_bytes;
    const uint64_t *output_item_bytes;
    uint64_t mark;        /* this model's: a context without it is refused */
    const char *name;
} mlopt_batched;

typedef struct {
    uint64_t mark;
    int status;
    int64_t failed;       /* the variant whose run failed, or -1 */
    char message[160];
    void *ctx[];          /* one per variant */
} batched_ctx;

/* The statuses the generated entry points return (mlopt-llvm entry.rs, STATUS_*). */
#define STATUS_ARGUMENT 1
#define STATUS_MEMORY 2

static int batched_live(const mlopt_batched *m, const batched_ctx *c) {
    return c && c->mark == m->mark;
}

MLOPT_SHARED void mlopt_batched_destroy(const mlopt_batched *m, void *ctx) {
    batched_ctx *c = ctx;
    if (!batched_live(m, c)) return;
    for (int64_t v = 0; v < m->num_variants; v++)
        if (c->ctx[v]) m->variants[v].destroy(c->ctx[v]);
    c->mark = 0;
    free(c);
}

MLOPT_SHARED void *mlopt_batched_create(const mlopt_batched *m) {
    batched_ctx *c = calloc(1, sizeof(batched_ctx) + (size_t)m->num_variants * sizeof(void *));
    if (!c) return NULL;
    c->mark = m->mark;
    c->failed = -1;
    for (int64_t v = 0; v < m->num_variants; v++) {
        c->ctx[v] = m->variants[v].create();
        if (!c->ctx[v]) {
            mlopt_batched_destroy(m, c);
            return NULL;
        }
    }
    return c;
}

static int batched_fail(batched_ctx *c, int status, const char *message) {
    c->status = status;
    c->failed = -1;
    strncpy(c->message, message, sizeof c->message - 1);
    c->message[sizeof c->message - 1] = 0;
    return status;
}

MLOPT_SHARED int mlopt_batched_run(const mlopt_batched *m, void *ctx, int64_t n,
                                   const void *const *inputs, void *const *outputs) {
    batched_ctx *c = ctx;
    if (!batched_live(m, c)) return STATUS_ARGUMENT;
    if (n < 1 || n > m->max_batch) {
        batched_fail(c, STATUS_ARGUMENT, "");
        snprintf(c->message, sizeof c->message, "the batch size %lld is out of range: %s runs 1 to %lld items",
                 (long long)n, m->name, (long long)m->max_batch);
        return STATUS_ARGUMENT;
    }
    if (!inputs || !outputs) return batched_fail(c, STATUS_ARGUMENT, "the inputs or outputs array is NULL");
    for (int64_t i = 0; i < m->num_inputs; i++)
        if (!inputs[i]) return batched_fail(c, STATUS_ARGUMENT, "an input buffer is NULL");
    for (int64_t i = 0; i < m->num_outputs; i++)
        if (!outputs[i]) return batched_fail(c, STATUS_ARGUMENT, "an output buffer is NULL");
    /* The chunk's pointers: inputs then outputs, on the stack unless the model has many. */
    void *small[32];
    size_t slots = (size_t)(m->num_inputs + m->num_outputs);
    void **ptrs = slots <= 32 ? small : malloc(sizeof(void *) * slots);
    if (!ptrs) return batched_fail(c, STATUS_MEMORY, "out of memory for the batch's pointer arrays");
    const void **in = (const void **)ptrs;
    void **out = ptrs + m->num_inputs;
    int64_t done = 0;
    int status = 0;
    for (int64_t v = 0; v < m->num_variants && status == 0; v++) {
        const mlopt_variant *var = &m->variants[v];
        while (status == 0 && n - done >= var->batch) {
            for (int64_t i = 0; i < m->num_inputs; i++)
                in[i] = (const char *)inputs[i] + (uint64_t)done * m->input_item_bytes[i];
            for (int64_t i = 0; i < m->num_outputs; i++)
                out[i] = (char *)outputs[i] + (uint64_t)done * m->output_item_bytes[i];
            status = var->run(c->ctx[v], in, out);
            if (status) {
                c->status = status;
                c->failed = v;
            }
            done += var->batch;
        }
    }
    if (ptrs != small) free(ptrs);
    if (status == 0) {
        c->status = 0;
        c->failed = -1;
    }
    return status;
}

MLOPT_SHARED const char *mlopt_batched_error(const mlopt_batched *m, const void *ctx) {
    const batched_ctx *c = ctx;
    if (!c) return "the context is NULL";
    if (!batched_live(m, c)) return "not a live context of this model";
    if (c->status == 0) return "";
    if (c->failed >= 0) return m->variants[c->failed].error(c->ctx[c->failed]);
    return c->message;
}
