/*
 * Atomic flags in shared memory for tbcoll's shm transport: waiting for them (flags.h).
 *
 * A rank publishes "my data for step N is in place" by a store-release of N to its own
 * 64-bit flag; a reader waits with load-acquire until every flag it needs is >= N. The
 * release orders every earlier store of the writer (the data) before the flag; the acquire
 * orders every later load of the reader after it. That is what makes the data visible
 * before the flag on ARM64 (Apple Silicon), whose weak memory model gives no such order to
 * plain stores; on x86-64 the same builtins compile to plain moves.
 *
 * Waiting spins briefly, then yields the CPU, then sleeps, so that more ranks than cores
 * (tbrun -np 4 on 2 cores) still make progress. The GIL is released while waiting.
 *
 * Pure C: includes flags.h, gil.h, tbcoll/include/cpu_relax.h and the C library.
 */
#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "../../include/cpu_relax.h"
#include "flags.h"
#include "gil.h"

static int all_reached(const char *base, ptrdiff_t stride, ptrdiff_t count, uint64_t target)
{
    for (ptrdiff_t i = 0; i < count; i++)
        if (__atomic_load_n((const uint64_t *)(base + i * stride), __ATOMIC_ACQUIRE) < target)
            return 0;
    return 1;
}

/*
 * Wait until the count flags at base, base+stride, ... are all >= target, for at most
 * budget seconds; 1 when they are, 0 when the budget ran out. Spins briefly, then yields
 * the CPU (returns at once if nobody else wants it), then naps: a rank that shares its core
 * with a peer (tbrun -np 4 on 2 cores) must let that peer run. The GIL is released once the
 * first spin has not sufficed.
 */
/* Seconds a wait spins before it yields (set_spin): about a small message's turnaround where
 * every rank has a core, next to none where ranks share cores. Counted in time, not pauses: a
 * pause takes ~10 ns on recent x86 and next to nothing on Apple's cores (ARM64's yield hint).
 * Measured (benchmarks/RESULTS.md, contention): a longer spin costs a job whose cores another
 * job wants (two 8 B ping-pong jobs on 2 cores: 11.6-13.1 us a message after 5 us of spin,
 * 8.4-11.0 after 1 us) and gains nothing alone (8 B all_reduce 1.41-1.42 us either way). */
static double spin_seconds = 1e-6;

void set_spin_seconds(double seconds)
{
    spin_seconds = seconds > 0 ? seconds : 0;
}

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) + 1e-9 * (now.tv_nsec - start->tv_nsec);
}

int wait_flags(const char *base, ptrdiff_t stride, ptrdiff_t count, uint64_t target,
               double budget)
{
    if (all_reached(base, stride, count, target))
        return 1;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned i = 1;; i++) {  /* the clock is read every 16 looks */
        CPU_RELAX();
        if (all_reached(base, stride, count, target))
            return 1;
        if (!(i & 15) && seconds_since(&start) >= spin_seconds)
            break;
    }
    int done = 0;
    struct _ts *saved = PyEval_SaveThread();
    long nap_ns = 0;
    for (;;) {
        if ((done = all_reached(base, stride, count, target)))
            break;
        double waited = seconds_since(&start);
        if (waited >= budget)
            break;
        if (waited < 2e-3) {
            sched_yield();
        } else {  /* a long wait: stop burning the core */
            nap_ns = nap_ns ? (nap_ns * 2 > 1000000 ? 1000000 : nap_ns * 2) : 50000;
            struct timespec nap = {0, nap_ns};
            nanosleep(&nap, NULL);
        }
    }
    PyEval_RestoreThread(saved);
    return done;
}
