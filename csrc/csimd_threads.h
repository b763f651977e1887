/* How many threads a parallel kernel runs on (included by csimd.c once, before the entry points).

   A parallel region ends at a barrier, so it lasts as long as its slowest thread: when another process
   keeps one of the cores busy, every region waits for the thread the scheduler has parked. Measured on
   the 2-core machine beside one `while True: pass` process, Gemma 3 270M decode ran at 32 tok/s on 2
   threads against 68 on 1 (78 on 2 when idle), and prefill gained nothing from the second thread.
   The process's involuntary context switches (getrusage) tell the two apart: 20-160 a second at 2
   threads on the idle machine, 770-930 beside the busy process, decode and prefill alike.

   So every LOOK seconds, at the entry of a kernel asking for several threads, the rate of involuntary
   switches since the last look, per thread asked for, is compared to SWITCH_RATE. Above it, parallel
   kernels take one thread for `hold` seconds, then all of them again for one look: a try that fails
   doubles the hold (up to HOLD_MAX), one that passes resets it. No kernel's values depend on its thread
   count (the whole-tensor sums add fixed blocks of rows in order), so this changes speed, never bits.
   csimd_set_adaptive_threads(0) (PRISM_CSIMD_ADAPTIVE=0) keeps the count asked for. */
#include <pthread.h>
#include <time.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/resource.h>
#define CSIMD_HAVE_RUSAGE 1
#else
#define CSIMD_HAVE_RUSAGE 0
#endif

#define LOOK 0.1
#define SWITCH_RATE 200.0
#define HOLD_MIN 1.0
#define HOLD_MAX 8.0

typedef struct {
    double t0, hold, until; /* the last look; the current hold; when the limit ends */
    int64_t n0;             /* involuntary switches at the last look */
    int limit;              /* 0: none, else the most threads a kernel takes */
    int started;
} thread_policy;

static thread_policy g_policy = {0, HOLD_MIN, 0, 0, 0, 0}; /* guarded by g_policy_lock */
static pthread_mutex_t g_policy_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_adaptive = 1;

/* back to no limit, the last look at t (kernels read `limit` without the lock: stored atomically) */
static void policy_reset(thread_policy *p, double t, int64_t switches, int started) {
    p->t0 = t;
    p->hold = HOLD_MIN;
    p->until = 0;
    p->n0 = switches;
    p->started = started;
    __atomic_store_n(&p->limit, 0, __ATOMIC_RELAXED);
}

/* one look at time t with `switches` involuntary switches so far, nth threads asked for */
static void policy_look(thread_policy *p, double t, int64_t switches, int nth) {
    if (!p->started) {
        policy_reset(p, t, switches, 1);
        return;
    }
    const double dt = t - p->t0;
    if (dt < LOOK) return;
    const double rate = (double)(switches - p->n0) / dt / (nth > 1 ? nth : 1);
    if (p->limit == 0) {
        if (rate > SWITCH_RATE) {
            __atomic_store_n(&p->limit, 1, __ATOMIC_RELAXED);
            p->until = t + p->hold;
        } else {
            p->hold = HOLD_MIN;
        }
    } else if (t >= p->until) {
        __atomic_store_n(&p->limit, 0, __ATOMIC_RELAXED); /* every thread again; a failed try holds longer */
        p->hold = p->hold * 2 < HOLD_MAX ? p->hold * 2 : HOLD_MAX;
    }
    p->t0 = t;
    p->n0 = switches;
}

static int clamp_threads(int nth) {
#ifdef _OPENMP
    if (nth <= 1) return 1;
    if (!__atomic_load_n(&g_adaptive, __ATOMIC_RELAXED) || !CSIMD_HAVE_RUSAGE) return nth;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    /* a kernel entered by several Python threads at once skips the look rather than wait for it */
    if (pthread_mutex_trylock(&g_policy_lock) == 0) {
        if (!g_policy.started || t - g_policy.t0 >= LOOK) {
#if CSIMD_HAVE_RUSAGE
            struct rusage ru;
            if (getrusage(RUSAGE_SELF, &ru) == 0) policy_look(&g_policy, t, (int64_t)ru.ru_nivcsw, nth);
#endif
        }
        pthread_mutex_unlock(&g_policy_lock);
    }
    const int limit = __atomic_load_n(&g_policy.limit, __ATOMIC_RELAXED);
    return limit > 0 && limit < nth ? limit : nth;
#else
    (void)nth;
    return 1;
#endif
}

void csimd_set_adaptive_threads(int on) {
    pthread_mutex_lock(&g_policy_lock);
    __atomic_store_n(&g_adaptive, on != 0, __ATOMIC_RELAXED);
    policy_reset(&g_policy, 0, 0, 0);
    pthread_mutex_unlock(&g_policy_lock);
}

int csimd_thread_limit(void) { return __atomic_load_n(&g_policy.limit, __ATOMIC_RELAXED); }

int csimd_thread_policy_look(double t, int64_t switches, int nth, int reset) {
    static thread_policy p = {0, HOLD_MIN, 0, 0, 0, 0};
    if (reset) policy_reset(&p, 0, 0, 0);
    policy_look(&p, t, switches, nth);
    return p.limit;
}
