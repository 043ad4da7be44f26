/* Driven by tests/preload.rs under LD_PRELOAD=libvramlab_preload.so. Each check prints
 * "ok NAME" or "FAIL NAME: detail" and the program exits 1 on any failure. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t (*live)(void);
static uint64_t (*peak)(void);
static void (*reset_peak)(void);
static int failed;
/* Built with -O0 -fno-builtin so that no malloc/free pair is elided; stores through this keep
 * it so under any flags. */
static void *volatile sink;

static void check(const char *name, long long got, long long want) {
    if (got == want) {
        printf("ok %s\n", name);
    } else {
        printf("FAIL %s: got %lld, want %lld\n", name, got, want);
        failed = 1;
    }
}

#define THREADS 8
#define ROUNDS 200000
static void *hammer(void *arg) {
    unsigned s = (unsigned)(uintptr_t)arg;
    void *keep[16] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        s = s * 1103515245u + 12345u;
        int k = (s >> 8) % 16;
        size_t n = (s >> 12) % 70000; /* small chunks and mmapped ones */
        switch ((s >> 4) % 4) {
        case 0: free(keep[k]); keep[k] = malloc(n); break;
        case 1: keep[k] = realloc(keep[k], n); break;
        case 2: free(keep[k]); keep[k] = calloc(1, n); break;
        default: free(keep[k]); keep[k] = NULL;
                 if (posix_memalign(&keep[k], 64 << (s % 4), n)) keep[k] = NULL; break;
        }
    }
    for (int k = 0; k < 16; k++) free(keep[k]);
    return NULL;
}

int main(int argc, char **argv) {
    live = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "vramlab_live");
    peak = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "vramlab_peak");
    reset_peak = (void (*)(void))dlsym(RTLD_DEFAULT, "vramlab_reset_peak");
    if (!live || !peak || !reset_peak) {
        printf("FAIL preload: vramlab_* not found (LD_PRELOAD unset?)\n");
        return 1;
    }
    /* Sizes from the command line, so the compiler cannot fold the allocations away. */
    long long big = argc > 1 ? atoll(argv[1]) : 3000017;
    long long small = argc > 2 ? atoll(argv[2]) : 24;

    /* stdout's buffer is allocated by the first printf: allocate it before measuring. */
    printf("probe: big %lld, small %lld\n", big, small);
    uint64_t l0 = live();
    char *p = malloc(big);
    check("malloc_big", live() - l0, big);
    memset(p, 1, big);
    char *q = malloc(small);
    check("malloc_small", live() - l0, big + small);
    free(q);
    check("free_small", live() - l0, big);
    p = realloc(p, 2 * big);
    check("realloc_grow", live() - l0, 2 * big);
    p = realloc(p, big / 3);
    check("realloc_shrink", live() - l0, big / 3);
    check("realloc_keeps_bytes", p[big / 3 - 1], 1);
    free(p);
    check("free_big", live() - l0, 0);

    char *c = calloc(big, 3);
    check("calloc", live() - l0, 3 * big);
    long long nonzero = 0;
    for (long long i = 0; i < 3 * big; i++) nonzero += c[i] != 0;
    check("calloc_zeroed", nonzero, 0);
    free(c);

    void *a = NULL;
    check("posix_memalign_rc", posix_memalign(&a, 2 << 20, big), 0);
    check("posix_memalign", live() - l0, big);
    check("posix_memalign_aligned", (uintptr_t)a % (2 << 20), 0);
    check("usable_size", malloc_usable_size(a), big);
    a = realloc(a, big + 5); /* over-aligned block: moves */
    check("realloc_aligned", live() - l0, big + 5);
    free(a);
    void *b = aligned_alloc(4096, 8192 * 3);
    check("aligned_alloc", live() - l0, 8192 * 3);
    check("aligned_alloc_aligned", (uintptr_t)b % 4096, 0);
    void *m = memalign(64, big);
    check("memalign", live() - l0, 8192 * 3 + big);
    check("memalign_aligned", (uintptr_t)m % 64, 0);
    void *v = valloc(100);
    check("valloc", live() - l0, 8192 * 3 + big + 100);
    void *r = reallocarray(NULL, 7, small);
    check("reallocarray", live() - l0, 8192 * 3 + big + 100 + 7 * small);
    char *d = strdup("libc's own malloc calls are counted too");
    check("strdup", live() - l0, 8192 * 3 + big + 100 + 7 * small + 40);
    free(b); free(m); free(v); free(r); free(d);
    check("all_freed", live() - l0, 0);

    /* The high-water mark: a transient shows in the peak after it is freed; reset forgets it. */
    reset_peak();
    check("reset_peak_is_live", peak(), live());
    sink = malloc(big);
    free(sink);
    check("peak_holds_transient", peak() - live(), big);
    reset_peak();
    check("peak_after_reset", peak() - live(), 0);

    /* Threads hammering malloc/realloc/calloc/posix_memalign/free: live returns to start.
     * A first round warms glibc's per-thread caches (thread stacks, TLS blocks), which stay
     * allocated after a join; the measured second round reuses them. */
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, hammer, (void *)(uintptr_t)(i + 101));
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    uint64_t before = live();
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, hammer, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    check("threads_live_back", live() - before, 0);
    check("threads_peak_saw_them", peak() > before, 1);

    /* fork: the child inherits the counts and keeps counting on its own. */
    char *kept = malloc(big);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t c0 = live();
        sink = malloc(small * 1000);
        int ok = live() - c0 == (uint64_t)(small * 1000);
        free(sink);
        free(kept);
        _exit(ok && live() == c0 - big ? 0 : 3);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    check("fork_child", WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0);
    check("fork_parent_unchanged", live() - before, big);
    free(kept);
    return failed;
}
