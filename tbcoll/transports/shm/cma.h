/* Cross-memory attach: one copy between this process and another rank's memory, by the
 * kernel (Linux); what the lane's pulls (moves.c) and one-copy collectives (one_copy.c) and
 * the module's cma_copy use.
 * Pure C: may include shm.h only. */
#ifndef TBCOLL_SHM_CMA_H
#define TBCOLL_SHM_CMA_H

#include <stddef.h>
#include <stdint.h>

#include "shm.h" /* INTERNAL */

#ifdef __linux__
#define HAVE_CMA 1 /* cma_move below */
#else
#define HAVE_CMA 0 /* macOS: no call reads another process's memory without privileges */
#endif

/* Copy len bytes between `address` in process pid (a rank of the same user on this host) and
 * buffer: from there into buffer, or with write true from buffer to there. Linux's
 * cross-memory attach: one copy, by the kernel, without the GIL. The caller orders it with the
 * other rank's flags or ring counters: bytes read were stored by their owner before the
 * release store that this rank acquired, and bytes written are published by this rank's own
 * release store after the call returns. Returns 0, or the errno that stopped it: EPERM where
 * a policy (Yama's ptrace_scope, a seccomp filter) forbids it, ESRCH where pid is gone,
 * ENOSYS where the platform has no such call (macOS). Called with the GIL (released for the
 * copy). */
INTERNAL int cma_move(long pid, uint64_t address, char *buffer, ptrdiff_t len, int write);

#endif
