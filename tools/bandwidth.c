/*
 * bandwidth.c — the read-bandwidth probe of `isobatch bench` (see bandwidth.h).
 *
 * The probe lives in a child process: its 512 MiB buffer then never counts in the benchmark's own
 * peak RSS, and it stays resident between measurements (no page faults inside a measurement). The
 * parent asks for a measurement by writing one byte to a pipe and reads back the seconds one pass
 * took; the child reads the whole buffer with `threads` threads, each summing its own contiguous
 * share in four independent chains (so the loop is bound by memory, not by adds).
 * A device probe (the GPU backend's floor) measures the GPU's own memory instead, in this process
 * (ib_cuda_read_bandwidth).
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bandwidth.h"
#ifdef IB_HAVE_CUDA
#include "backends/cuda/cuda.h"
#endif

#define PROBE_BYTES ((size_t)512 << 20)
#define PROBE_MAX_THREADS 64

struct bw_probe {
    pid_t child;              /* -1: a device probe */
    int to_child, from_child; /* pipe ends: requests, replies */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct { const uint64_t *p; size_t n; uint64_t sum; } read_share;

static void *read_words(void *arg) {
    read_share *j = arg;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) a += j->p[i], b += j->p[i + 1], c += j->p[i + 2], d += j->p[i + 3];
    j->sum = a + b + c + d;
    return NULL;
}

/* One pass over buf[0..words) with n threads; seconds, or -1 if a thread could not start. */
static double one_pass(const uint64_t *buf, size_t words, int n) {
    pthread_t th[PROBE_MAX_THREADS];
    read_share sh[PROBE_MAX_THREADS];
    int started = 0;
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        sh[i] = (read_share){buf + words / (size_t)n * (size_t)i, words / (size_t)n, 0};
        if (pthread_create(&th[i], NULL, read_words, &sh[i]) != 0) break;
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    double t = now_s() - t0;
    return started == n ? t : -1;
}

/* Child: serve requests until the request pipe closes. */
static void serve(int in, int out, int threads) {
    size_t words = PROBE_BYTES / sizeof(uint64_t);
    uint64_t *buf = malloc(PROBE_BYTES);
    double reply = -1;
    if (buf)
        for (size_t i = 0; i < words; i++) buf[i] = i;
    char req;
    while (read(in, &req, 1) == 1) {
        reply = buf ? one_pass(buf, words, threads) : -1;
        if (write(out, &reply, sizeof reply) != (ssize_t)sizeof reply) break;
    }
    free(buf);
}

bw_probe *bw_probe_start(int threads, int device) {
    if (device) {
#ifdef IB_HAVE_CUDA
        bw_probe *d = malloc(sizeof *d);
        if (d) *d = (bw_probe){-1, -1, -1};
        return d;
#else
        return NULL;
#endif
    }
    if (threads < 1) threads = 1;
    if (threads > PROBE_MAX_THREADS) threads = PROBE_MAX_THREADS;
    int req[2], rep[2];
    /* a probe that died must make bw_probe_measure fail, not kill the caller with SIGPIPE */
    signal(SIGPIPE, SIG_IGN);
    if (pipe(req)) return NULL;
    if (pipe(rep)) {
        close(req[0]);
        close(req[1]);
        return NULL;
    }
    bw_probe *p = malloc(sizeof *p);
    pid_t pid = p ? fork() : -1;
    if (pid == 0) {
        close(req[1]);
        close(rep[0]);
        serve(req[0], rep[1], threads);
        _exit(0);
    }
    close(req[0]);
    close(rep[1]);
    if (pid < 0) {
        close(req[1]);
        close(rep[0]);
        free(p);
        return NULL;
    }
    *p = (bw_probe){pid, req[1], rep[0]};
    return p;
}

double bw_probe_measure(bw_probe *p) {
    char req = 'r';
    double secs = -1;
#ifdef IB_HAVE_CUDA
    if (p && p->child < 0) return ib_cuda_read_bandwidth();
#endif
    if (!p || write(p->to_child, &req, 1) != 1) return 0;
    if (read(p->from_child, &secs, sizeof secs) != (ssize_t)sizeof secs || secs <= 0) return 0;
    return (double)PROBE_BYTES / secs;
}

void bw_probe_stop(bw_probe *p) {
    if (!p) return;
    if (p->child >= 0) {
        close(p->to_child); /* the child's read sees end of file and it exits */
        close(p->from_child);
        waitpid(p->child, NULL, 0);
    }
    free(p);
}
