/* mlopt runtime: the thread pool that parallel loops of generated kernels run on.
 *
 * mlopt_parallel_for(fn, ctx, n) splits 0..n into one contiguous range per thread; the calling thread
 * takes the first range, workers the others, and the call returns when all are done. Workers spin for a
 * short while between loops (kernels come back to back) and then sleep on a condition variable.
 *
 * The thread count is, in order of precedence: mlopt_set_num_threads(n), the MLOPT_NUM_THREADS
 * environment variable, and the count the model was compiled with (mlopt_init_threads). The pool is
 * shared by every model in the process; parallel loops from concurrent runs take turns. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef void (*mlopt_task)(void *ctx, int64_t begin, int64_t end);

#define MLOPT_MAX_THREADS 256
#define SPIN 200000

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int threads = 0;  /* the chosen count; 0 until decided */
static int started = 1;  /* threads running, the caller included */
static int user_set = 0;
static mlopt_task job_fn;
static void *job_ctx;
static int64_t job_n;
static int job_threads;
static atomic_uint_fast64_t generation;
static atomic_int pending;
static uint64_t start_gen; /* the generation new workers start from (set before they are created) */
static pthread_mutex_t job_mu = PTHREAD_MUTEX_INITIALIZER; /* one parallel loop at a time */

static void run_range(int t, int nt) {
    int64_t begin = job_n * t / nt, end = job_n * (t + 1) / nt;
    if (begin < end) job_fn(job_ctx, begin, end);
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t seen = start_gen;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&generation, memory_order_acquire) == seen) {
            if (++spins > SPIN) {
                pthread_mutex_lock(&mu);
                while (atomic_load(&generation) == seen) pthread_cond_wait(&wake, &mu);
                pthread_mutex_unlock(&mu);
            }
        }
        seen = atomic_load(&generation);
        if (id < job_threads) run_range(id, job_threads);
        atomic_fetch_sub_explicit(&pending, 1, memory_order_release);
    }
    return 0;
}

static void start_workers(int n) {
    start_gen = atomic_load(&generation);
    for (; started < n && started < MLOPT_MAX_THREADS; started++) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, worker, (void *)(intptr_t)started) != 0) break;
        pthread_attr_destroy(&a);
    }
}

/* Nanoseconds of a monotonic clock: profiled builds (`mlopt bench --profile`) read it between kernels. */
uint64_t mlopt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void mlopt_set_num_threads(int n) {
    threads = n < 1 ? 1 : n > MLOPT_MAX_THREADS ? MLOPT_MAX_THREADS : n;
    user_set = 1;
}

int mlopt_get_num_threads(void) { return threads < 1 ? 1 : threads; }

void mlopt_init_threads(int compiled) {
    if (user_set || threads) return;
    const char *env = getenv("MLOPT_NUM_THREADS");
    int n = env ? atoi(env) : compiled;
    threads = n < 1 ? 1 : n > MLOPT_MAX_THREADS ? MLOPT_MAX_THREADS : n;
}

/* Models whose contractions run on AMX tiles call this first: Linux gives a process the tile state only
 * after arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); without it the first tile instruction
 * faults. The permission is process-wide, so threads of the pool inherit it. */
void mlopt_init_amx(void) {
    static atomic_int done;
    if (atomic_load(&done)) return;
#ifdef __linux__
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) {
        fprintf(stderr, "mlopt: this model was compiled for AMX, but the kernel refuses the tile state "
                        "(arch_prctl ARCH_REQ_XCOMP_PERM failed); recompile for another target\n");
        abort();
    }
#endif
    atomic_store(&done, 1);
}

void mlopt_parallel_for(mlopt_task fn, void *ctx, int64_t n) {
    int nt = mlopt_get_num_threads();
    if (nt > n) nt = (int)n;
    if (nt <= 1) {
        if (n > 0) fn(ctx, 0, n);
        return;
    }
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
    while (atomic_load_explicit(&pending, memory_order_acquire) > 0) {
    }
    pthread_mutex_unlock(&job_mu);
}
