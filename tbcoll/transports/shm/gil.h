/* What the pure-C layer (flags.c, rings.c, cma.c, rounds.c) takes of Python: letting the GIL
 * go around a wait or a large copy, and taking it back; nothing else. Its functions are
 * called with the GIL held (by the module's and the Lane's Python-facing files) and return
 * with it held. Declared here as CPython declares them (Include/ceval.h; PyThreadState is
 * struct _ts, in the stable ABI), so that those files need no Python.h: what
 * Py_BEGIN_ALLOW_THREADS expands to, spelt out. tests/harness/tsan/shm_race.c, which runs them
 * with no interpreter, stubs these two.
 * Pure C: may include nothing. */
#ifndef TBCOLL_SHM_GIL_H
#define TBCOLL_SHM_GIL_H

struct _ts;
struct _ts *PyEval_SaveThread(void);
void PyEval_RestoreThread(struct _ts *state);

#endif
