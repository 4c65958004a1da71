/* The C API of a compiled model under misuse, errors, threads and fork(); built by tests/c_api.rs against
 * the library of a small model `api`:
 *   y0 = gather(table, ids)   table f32[4,3] = 0..11, ids i64[5]
 *   y1 = relu(x @ w)          x f32[64,256], w f32[256,128] = ((i * 7 + j) % 13 - 6) / 16
 *   y2 = conv(x2, w2)         x2 f32[1,16,64,64], w2 f32[16,16,3,3] = ((o*5 + i*3 + ky*2 + kx) % 9) / 16 - 1/4
 * compiled for 2 threads, so its matrix product runs parallel loops. Prints what failed; exit 0 if none. */
#include <math.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api.h"

#define M 64
#define K 256
#define N 128

static int failures;
#define CHECK(cond, ...)                                             \
    do {                                                             \
        if (!(cond)) {                                               \
            fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                            \
            fputc('\n', stderr);                                     \
            failures++;                                              \
        }                                                            \
    } while (0)

#define C 16
#define H 64
#define HO (H - 2)

static float x[M * K], want1[M * N], x2[C * H * H], want2[C * HO * HO];

static float weight(int i, int j) { return (float)((i * 7 + j) % 13 - 6) / 16.0f; }

static void reference(void) {
    for (int i = 0; i < M * K; i++) x[i] = (float)((i * 5) % 11 - 5) / 8.0f;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)x[m * K + k] * weight(k, n);
            want1[m * N + n] = s > 0 ? (float)s : 0.0f;
        }
    for (int i = 0; i < C * H * H; i++) x2[i] = (float)((i * 3) % 13 - 6) / 8.0f;
    for (int o = 0; o < C; o++)
        for (int r = 0; r < HO; r++)
            for (int c = 0; c < HO; c++) {
                double s = 0;
                for (int i = 0; i < C; i++)
                    for (int ky = 0; ky < 3; ky++)
                        for (int kx = 0; kx < 3; kx++)
                            s += (double)x2[(i * H + r + ky) * H + c + kx] * ((float)((o * 5 + i * 3 + ky * 2 + kx) % 9) / 16.0f - 0.25f);
                want2[(o * HO + r) * HO + c] = (float)s;
            }
}

/* One run on valid inputs; 0 if it succeeds with the right outputs. */
static int good_run(void *ctx) {
    int64_t ids[5] = {0, 3, -1, 2, 1};
    float y0[15], y1[M * N];
    float *y2 = malloc(sizeof want2);
    if (!y2) return 1;
    const void *in[] = {ids, x, x2};
    void *out[] = {y0, y1, y2};
    int s = mlopt_api_run(ctx, in, out);
    if (s != MLOPT_OK) {
        fprintf(stderr, "run: status %d: %s\n", s, mlopt_api_error(ctx));
        return free(y2), 1;
    }
    int bad = 0;
    for (int i = 0; i < C * HO * HO && !bad; i++)
        if (fabsf(y2[i] - want2[i]) > 1e-3f * (1.0f + fabsf(want2[i]))) bad = fprintf(stderr, "y2[%d] = %g, want %g\n", i, y2[i], want2[i]);
    free(y2);
    if (bad) return 1;
    int rows[5] = {0, 3, 3, 2, 1};
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 3; c++)
            if (y0[r * 3 + c] != (float)(rows[r] * 3 + c)) return fprintf(stderr, "y0[%d][%d] = %g\n", r, c, y0[r * 3 + c]), 1;
    for (int i = 0; i < M * N; i++)
        if (fabsf(y1[i] - want1[i]) > 1e-3f * (1.0f + fabsf(want1[i]))) return fprintf(stderr, "y1[%d] = %g, want %g\n", i, y1[i], want1[i]), 1;
    return 0;
}

static void *runner(void *arg) {
    (void)arg;
    void *ctx = mlopt_api_create();
    int bad = ctx == NULL;
    for (int i = 0; i < 20 && !bad; i++) bad = good_run(ctx);
    mlopt_api_destroy(ctx);
    return (void *)(intptr_t)bad;
}

static void *set_threads(void *arg) {
    (void)arg;
    for (int i = 0; i < 200; i++) mlopt_set_num_threads(1 + i % 2);
    return NULL;
}

int main(void) {
    reference();
    CHECK(strcmp(mlopt_api_error(NULL), "the context is NULL") == 0, "%s", mlopt_api_error(NULL));
    mlopt_api_destroy(NULL);

    void *ctx = mlopt_api_create();
    CHECK(ctx != NULL, "create");
    if (!ctx) return 1;
    CHECK(strcmp(mlopt_api_error(ctx), "") == 0, "a fresh context has no error: %s", mlopt_api_error(ctx));

    /* NULLs: a status, never a crash. */
    int64_t ids[5] = {0, 1, 2, 3, 0};
    static float y0[15], y1[M * N], y2[C * HO * HO];
    const void *in[] = {ids, x, x2};
    void *out[] = {y0, y1, y2};
    CHECK(mlopt_api_run(NULL, in, out) == MLOPT_ERR_ARGUMENT, "NULL context");
    CHECK(mlopt_api_run(ctx, NULL, out) == MLOPT_ERR_ARGUMENT, "NULL inputs");
    CHECK(strstr(mlopt_api_error(ctx), "NULL") != NULL, "%s", mlopt_api_error(ctx));
    CHECK(mlopt_api_run(ctx, in, NULL) == MLOPT_ERR_ARGUMENT, "NULL outputs");
    const void *in_null[] = {NULL, x, x2};
    CHECK(mlopt_api_run(ctx, in_null, out) == MLOPT_ERR_ARGUMENT, "NULL input buffer");
    CHECK(strstr(mlopt_api_error(ctx), "input 0 ('ids')") != NULL, "%s", mlopt_api_error(ctx));
    void *out_null[] = {y0, NULL, y2};
    CHECK(mlopt_api_run(ctx, in, out_null) == MLOPT_ERR_ARGUMENT, "NULL output buffer");
    CHECK(strstr(mlopt_api_error(ctx), "output 1 ('y1')") != NULL, "%s", mlopt_api_error(ctx));

    /* Memory that is not a live context of this model (a destroyed one, another model's): a status and
       a message, never a write into it, and destroy leaves it alone. */
    static _Alignas(64) unsigned char fake[MLOPT_API_CONTEXT_BYTES];
    CHECK(mlopt_api_run(fake, in, out) == MLOPT_ERR_ARGUMENT, "a context create did not make");
    CHECK(strstr(mlopt_api_error(fake), "not a live context") != NULL, "%s", mlopt_api_error(fake));
    mlopt_api_destroy(fake);

    /* Data the model rejects: the interpreter's error, as a status and a message. */
    int64_t past[5] = {0, 1, 4, 3, 0}, before[5] = {0, -5, 1, 2, 3};
    const void *in_past[] = {past, x, x2}, *in_before[] = {before, x, x2};
    CHECK(mlopt_api_run(ctx, in_past, out) == MLOPT_ERR_DATA, "index 4 of an axis of 4");
    CHECK(strstr(mlopt_api_error(ctx), "out of range") != NULL && strstr(mlopt_api_error(ctx), "'gather0'") != NULL, "%s", mlopt_api_error(ctx));
    CHECK(mlopt_api_run(ctx, in_before, out) == MLOPT_ERR_DATA, "index -5 of an axis of 4");

    /* After errors the context still works, and a success clears the message. */
    CHECK(good_run(ctx) == 0, "a valid run after errors");
    CHECK(strcmp(mlopt_api_error(ctx), "") == 0, "%s", mlopt_api_error(ctx));

    /* Runs on four threads with their own contexts while another thread changes the thread count; each
       runner's stack is what the header says a run needs, beyond the harness's own frames (good_run's
       buffers) and the minimum a thread takes. */
    pthread_t t[5];
    pthread_attr_t small;
    pthread_attr_init(&small);
    pthread_attr_setstacksize(&small, MLOPT_API_STACK_BYTES + sizeof(float) * (M * N + 15) + 16384 + PTHREAD_STACK_MIN);
    CHECK(MLOPT_API_STACK_BYTES <= 64 * 1024, "a run needs %u bytes of stack", MLOPT_API_STACK_BYTES);
    for (int i = 0; i < 4; i++) pthread_create(&t[i], &small, runner, NULL);
    pthread_attr_destroy(&small);
    pthread_create(&t[4], NULL, set_threads, NULL);
    for (int i = 0; i < 5; i++) {
        void *bad = NULL;
        pthread_join(t[i], &bad);
        CHECK(bad == NULL, "runner %d", i);
    }

    /* fork() after the pool has started: the child's runs must work (a hang is killed by alarm). */
    mlopt_set_num_threads(2);
    CHECK(good_run(ctx) == 0, "before fork");
    for (int round = 0; round < 3; round++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(20);
            int bad = good_run(ctx) || good_run(ctx);
            _exit(bad);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: %s %d", round, WIFSIGNALED(status) ? "signal" : "exit",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        CHECK(good_run(ctx) == 0, "parent after fork %d", round);
    }

    /* Between runs the pool sleeps: an idle process spends (almost) no CPU time. */
    struct timespec pause = {0, 100 * 1000 * 1000}, t0, t1;
    nanosleep(&pause, NULL);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    pause.tv_nsec = 400 * 1000 * 1000;
    nanosleep(&pause, NULL);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    double busy = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    CHECK(busy < 0.04, "%.3f s of CPU time in 0.4 s idle", busy);

    mlopt_api_destroy(ctx);
    if (failures) fprintf(stderr, "%d failures\n", failures);
    else printf("ok\n");
    return failures != 0;
}
