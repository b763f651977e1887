/* Per-thread scratch memory kept from one kernel call to the next (plain C, included once by csimd.c).

   A decode step calls FLASH_ATTN_EXT once per layer, each call's threads needing the same 100-400 KB of
   work rows: allocating and zeroing them per call cost about a quarter of the call at short contexts. A
   thread's block of each slot is kept (grown when a call needs more, zeroed when allocated) and freed
   when the thread ends. A slot belongs to one kernel, which never calls itself, so a block is never in
   use twice on one thread. */
#ifndef CSIMD_SCRATCH_H
#define CSIMD_SCRATCH_H

#include <pthread.h>

typedef struct {
    void *p[SCRATCH_SLOTS];
    size_t cap[SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static int g_scratch_ok;

static void scratch_free(void *v) {
    scratch_set *s = (scratch_set *)v;
    for (int i = 0; i < SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}

static void scratch_init(void) { g_scratch_ok = pthread_key_create(&g_scratch_key, scratch_free) == 0; }

/* the calling thread's block of `slot`: at least `bytes`, 64-byte aligned; zero where it was never written
   since it was allocated; NULL when out of memory */
CSIMD_HIDDEN void *csimd_scratch(int slot, size_t bytes) {
    pthread_once(&g_scratch_once, scratch_init);
    if (!g_scratch_ok) return NULL;
    scratch_set *s = (scratch_set *)pthread_getspecific(g_scratch_key);
    if (!s) {
        s = (scratch_set *)calloc(1, sizeof *s);
        if (!s) return NULL;
        if (pthread_setspecific(g_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap[slot] < bytes) {
        free(s->p[slot]);
        s->cap[slot] = 0;
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes) != 0) return s->p[slot] = NULL;
        memset(p, 0, bytes);
        s->p[slot] = p;
        s->cap[slot] = bytes;
    }
    return s->p[slot];
}

#endif
