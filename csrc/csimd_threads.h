/* How many threads a parallel kernel takes (included by csimd.c once, before the entry points).

   prism_core/contention.py gives the rule and the measurements behind it; this is the same rule in C,
   since it looks at every kernel entry: every `look` seconds, at the entry of a kernel asking for
   several threads, the share of the time since the last look that the calling thread spent ready to
   run but waiting for a CPU (Linux's /proc/thread-self/schedstat) is compared to `share`, and the CPUs'
   time this process left to others (the CPUs it may run on, less its own CPU time over all its threads:
   its own threads, OpenBLAS's spinning workers among them, are no outside load) to `outside`. Above
   both, kernels take half the threads (at least one) for a hold, halving again while still above; after the
   hold every thread is tried for one look: a failed try doubles the hold (up to `hold_max`), a passed
   one resets it to `hold_min`. Each calling thread has its own watch: each has its own OpenMP team and
   its own scheduler statistics. The constants come from Python (csimd_set_adaptive_threads). */
#include <fcntl.h>
#include <sched.h>
#include <time.h>

typedef struct {
    double t0, delay0, cpu0;        /* the last look: time, the thread's total delay, the process's CPU time */
    double hold, until;             /* the current hold; its end */
    int limit;                      /* 0: none, else the most threads a kernel takes */
    int started;
    unsigned generation;            /* the settings this watch started under */
} thread_watch;

static struct {
    double look, share, outside, hold_min, hold_max;
    int on, ncpu; /* ncpu: the CPUs this process may run on, counted when the rule is set */
    unsigned generation;
} g_watch_cfg = {0.1, 0.1, 0.5, 1.0, 8.0, 0, 1, 1};

static __thread thread_watch tl_watch;

static void watch_start(thread_watch *w, double t, double delay, double cpu) {
    *w = (thread_watch){t, delay, cpu, g_watch_cfg.hold_min, 0, 0, 1, g_watch_cfg.generation};
}

/* the rule: one look at time t, the thread having waited `delay` s in all and the process having run
   `cpu` s on all its threads, on `ncpu` CPUs, nth threads asked for */
static int watch_look(thread_watch *w, double t, double delay, double cpu, int ncpu, int nth) {
    if (!w->started) {
        watch_start(w, t, delay, cpu);
        return w->limit;
    }
    const double dt = t - w->t0;
    if (dt < g_watch_cfg.look) return w->limit;
    const int busy = (delay - w->delay0) / dt > g_watch_cfg.share
                     && (double)ncpu - (cpu - w->cpu0) / dt >= g_watch_cfg.outside;
    if (w->limit == 0) {
        if (busy) {
            w->limit = nth / 2 > 1 ? nth / 2 : 1;
            w->until = t + w->hold;
        } else {
            w->hold = g_watch_cfg.hold_min;
        }
    } else if (busy && w->limit > 1) {
        w->limit = w->limit / 2 > 1 ? w->limit / 2 : 1;
        w->until = t + w->hold;
    } else if (t >= w->until) {
        w->limit = 0; /* every thread again; a failed try holds longer */
        w->hold = 2 * w->hold < g_watch_cfg.hold_max ? 2 * w->hold : g_watch_cfg.hold_max;
    }
    w->t0 = t;
    w->delay0 = delay;
    w->cpu0 = cpu;
    return w->limit;
}

/* the calling thread's run-queue delay so far in seconds, or -1 where the statistics are missing */
static double run_delay_s(void) {
#ifdef __linux__
    char buf[128];
    const int fd = open("/proc/thread-self/schedstat", O_RDONLY);
    if (fd < 0) return -1;
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = buf;
    strtoull(p, &p, 10); /* time on a CPU */
    return (double)strtoull(p, NULL, 10) * 1e-9;
#else
    return -1;
#endif
}

/* the process's CPU time so far, all its threads together, in seconds */
static double process_cpu_s(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0; /* never on Linux: then every wait counts */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the CPUs this process may run on (its affinity mask), at least 1 */
static int usable_cpus(void) {
#if defined(__linux__) && defined(CPU_COUNT) /* CPU_COUNT needs _GNU_SOURCE, which Python.h defines */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int clamp_threads(int nth) {
#ifdef _OPENMP
    if (nth <= 1) return 1;
    if (!g_watch_cfg.on) return nth;
    thread_watch *w = &tl_watch;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (w->generation != g_watch_cfg.generation) { /* the settings changed: start afresh */
        w->started = 0;
        w->limit = 0;
    }
    if (!w->started || t - w->t0 >= g_watch_cfg.look) {
        const double delay = run_delay_s();
        if (delay >= 0) watch_look(w, t, delay, process_cpu_s(), g_watch_cfg.ncpu, nth);
    }
    return w->limit > 0 && w->limit < nth ? w->limit : nth;
#else
    (void)nth;
    return 1;
#endif
}

int csimd_set_adaptive_threads(int on, double look, double share, double outside, double hold_min,
                               double hold_max) {
    if (!(look > 0) || !(share > 0 && share < 1) || !(outside > 0) || !(hold_min > 0) || !(hold_max >= hold_min))
        return -1;
    g_watch_cfg.look = look;
    g_watch_cfg.share = share;
    g_watch_cfg.outside = outside;
    g_watch_cfg.ncpu = usable_cpus();
    g_watch_cfg.hold_min = hold_min;
    g_watch_cfg.hold_max = hold_max;
    g_watch_cfg.on = on != 0 && run_delay_s() >= 0;
    g_watch_cfg.generation++; /* every thread's watch starts afresh */
    return g_watch_cfg.on;
}

int csimd_thread_watch_look(double t, double delay, double cpu, int ncpu, int nth, int reset) {
    static __thread thread_watch w;
    if (reset) w.started = 0;
    return watch_look(&w, t, delay, cpu, ncpu, nth);
}

int csimd_thread_readings(double *out) {
    const double delay = run_delay_s();
    if (delay < 0) return -1;
    out[0] = delay;
    out[1] = process_cpu_s();
    out[2] = (double)usable_cpus();
    return 0;
}
