/* The watcher of a job's connections (watch.c), for the module (_sockets.c). */
#ifndef TBCOLL_TCP_WATCH_H
#define TBCOLL_TCP_WATCH_H

#include <Python.h>

#include "exchange.h" /* INTERNAL */

/* At import: watch, unwatch and watched into the module (0, or -1). */
INTERNAL int add_watch(PyObject *module);

#endif
