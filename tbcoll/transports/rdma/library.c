/* The verbs library, opened with dlopen at first use, and its symbol table (fabric.h). */
#include "fabric.h"

#include <dlfcn.h>
#include <string.h>

/* --- the library, opened at first use -------------------------------------------------- */
INTERNAL VerbsLibrary V;

#ifdef __APPLE__
#define DEFAULT_LIBRARY "librdma.dylib"
#else
#define DEFAULT_LIBRARY "libibverbs.so.1"
#endif

/* Open the verbs library (path: NULL for the platform's); 0, or -1 with LibraryError. */
INTERNAL int verbs_load_library(const char *path)
{
    if (V.lib)
        return 0;
    const char *name = path && *path ? path : DEFAULT_LIBRARY;
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        PyErr_Format(LibraryError, "cannot open the RDMA library %s (%s)", name,
                     why ? why : "not found");
        return -1;
    }
#define SYM(field, symbol)                                                                 \
    do {                                                                                   \
        *(void **)&V.field = dlsym(lib, symbol);                                           \
        if (!V.field) {                                                                    \
            PyErr_Format(LibraryError, "the RDMA library %s has no %s", name, symbol);     \
            dlclose(lib);                                                                  \
            memset(&V, 0, sizeof V);                                                       \
            return -1;                                                                     \
        }                                                                                  \
    } while (0)
    SYM(get_device_list, "ibv_get_device_list");
    SYM(free_device_list, "ibv_free_device_list");
    SYM(get_device_name, "ibv_get_device_name");
    SYM(open_device, "ibv_open_device");
    SYM(close_device, "ibv_close_device");
    SYM(alloc_pd, "ibv_alloc_pd");
    SYM(dealloc_pd, "ibv_dealloc_pd");
    SYM(reg_mr, "ibv_reg_mr");
    SYM(dereg_mr, "ibv_dereg_mr");
    SYM(create_cq, "ibv_create_cq");
    SYM(destroy_cq, "ibv_destroy_cq");
    SYM(create_qp, "ibv_create_qp");
    SYM(destroy_qp, "ibv_destroy_qp");
    SYM(modify_qp, "ibv_modify_qp");
    SYM(query_port, "ibv_query_port");
    SYM(query_gid, "ibv_query_gid");
#undef SYM
    /* Beyond the 16 above (what MLX's jaccl resolves from librdma.dylib), every symbol is
     * optional: a library without it still loads, and its use degrades (verbs_wc_status_text). */
    *(void **)&V.wc_status_str = dlsym(lib, "ibv_wc_status_str");
    V.lib = lib;
    return 0;
}

/* A completion's status as text: the library's words where it has ibv_wc_status_str (Apple's
 * may not), else the number, which verbs.h's enum ibv_wc_status names. */
INTERNAL const char *verbs_wc_status_text(enum ibv_wc_status status, char *buf,
                                         size_t size)
{
    if (V.wc_status_str)
        return V.wc_status_str(status);
    snprintf(buf, size, "completion status %d", (int)status);
    return buf;
}

/* devices(library=None) -> the names of the RDMA devices this host has */
INTERNAL PyObject *verbs_devices(PyObject *self, PyObject *args)
{
    const char *path = NULL;
    if (!PyArg_ParseTuple(args, "|z", &path) || verbs_load_library(path) < 0)
        return NULL;
    int n = 0;
    struct ibv_device **list = V.get_device_list(&n);
    PyObject *names = PyList_New(0);
    for (int i = 0; list && names && i < n; i++) {
        PyObject *name = PyUnicode_FromString(V.get_device_name(list[i]));
        if (!name || PyList_Append(names, name) < 0)
            Py_CLEAR(names);
        Py_XDECREF(name);
    }
    if (list)
        V.free_device_list(list);
    return names;
}
