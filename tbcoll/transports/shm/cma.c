/* Cross-memory attach (cma.h): process_vm_readv and process_vm_writev, without the GIL.
 * Pure C: includes cma.h, gil.h and the C library. */
#ifdef __linux__
#define _GNU_SOURCE /* process_vm_readv, process_vm_writev */
#include <sys/uio.h>
#endif
#include <errno.h>
#include <stdint.h>
#include <sys/types.h>

#include "cma.h"
#include "gil.h"

int cma_move(long pid, uint64_t address, char *buffer, ptrdiff_t len, int write)
{
    int error = ENOSYS;
#if HAVE_CMA
    error = 0;
    ptrdiff_t done = 0;
    struct _ts *saved = PyEval_SaveThread();
    while (done < len) {
        struct iovec local = {buffer + done, (size_t)(len - done)};
        struct iovec remote = {(void *)(uintptr_t)(address + (uint64_t)done),
                               (size_t)(len - done)};
        ssize_t moved = write ? process_vm_writev((pid_t)pid, &local, 1, &remote, 1, 0)
                              : process_vm_readv((pid_t)pid, &local, 1, &remote, 1, 0);
        if (moved < 0 && errno == EINTR)
            continue;
        if (moved <= 0) {
            error = moved < 0 ? errno : EFAULT;
            break;
        }
        done += moved;
    }
    PyEval_RestoreThread(saved);
#else
    (void)pid;
    (void)address;
    (void)buffer;
    (void)len;
    (void)write;
#endif
    return error;
}
