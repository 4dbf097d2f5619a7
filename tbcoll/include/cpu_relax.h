/* CPU_RELAX(): the pause of a busy-wait loop, shared by the C extensions that spin
 * (tbcoll.transports.shm._atomics, tbcoll.transports.rdma._verbs): x86's pause, ARM64's yield (a
 * hint to the core, not a barrier: the loops' orderings are argued where they load). */
#ifndef TBCOLL_CPU_RELAX_H
#define TBCOLL_CPU_RELAX_H

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#endif
