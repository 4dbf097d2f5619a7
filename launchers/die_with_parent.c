/* die-with-parent PARENT SIGNAL PROGRAM [ARG...]: run PROGRAM (found on PATH) so that the
 * kernel sends it SIGNAL (a number: SIGKILL for a rank, SIGTERM for mpiexec, which passes it
 * on) when PARENT, the pid of the process that started this one, dies.
 *
 * tbrun (Linux) starts every rank through this program: PR_SET_PDEATHSIG is set here and kept
 * across the exec, and tbrun starts this with subprocess's vfork instead of a fork that runs a
 * Python preexec_fn in the child (~1-1.5 ms a rank). Built at install (setup.py); tbrun uses
 * that preexec_fn where it is missing.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: die-with-parent PARENT SIGNAL PROGRAM [ARG...]\n");
        return 2;
    }
    if (prctl(PR_SET_PDEATHSIG, strtol(argv[2], NULL, 10)) != 0) {
        fprintf(stderr, "die-with-parent: prctl(PR_SET_PDEATHSIG): %s\n", strerror(errno));
        return 126;
    }
    /* the parent died before the flag was set: nobody would kill this process */
    if (getppid() != (pid_t)strtol(argv[1], NULL, 10))
        return 1;
    execvp(argv[3], argv + 3);
    fprintf(stderr, "die-with-parent: cannot run %s: %s\n", argv[3], strerror(errno));
    return 127;
}
