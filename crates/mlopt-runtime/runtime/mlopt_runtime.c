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
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef void (*mlopt_task)(void *ctx, int64_t begin, int64_t end);

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
uint64_t mlopt_now_ns(void) {
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

void mlopt_set_num_threads(int n) {
    atomic_store(&threads, clamp_threads(n));
    atomic_store(&user_set, 1);
}

int mlopt_get_num_threads(void) {
    int n = atomic_load(&threads);
    return n < 1 ? 1 : n;
}

void mlopt_init_threads(int compiled) {
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
int mlopt_init_amx(void) {
    static atomic_int done_amx;
    if (atomic_load(&done_amx)) return 0;
#ifdef __linux__
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) return -1;
#endif
    atomic_store(&done_amx, 1);
    return 0;
}

void mlopt_parallel_for(mlopt_task fn, void *ctx, int64_t n) {
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
