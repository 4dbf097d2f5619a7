/*
 * tbcoll.comm._route.Call: a bound route's call (tbcoll.comm.routes.Route), the one callable a
 * Communicator's public method calls, as mpi4py's one-line methods call their worker:
 *
 *     def all_reduce(self, x, op="sum", algorithm=None, out=None):
 *         return self._all_reduce(x, op, algorithm, out)
 *
 * It takes the call's first step, chosen when the route was bound (a C lane's call, or the
 * transport's direct path in the gate), where that step may take it: the arguments at
 * `nones` are None (algorithm=, all_gather's counts=), and x (the first argument) is at most
 * `largest` bytes, the size past which the lane takes nothing (known at bind: its limits).
 * The first step's result is the call's; where it returns None (it did not take the call and
 * touched nothing: an mlx array, a strided x, another thread's call) and wherever the first
 * step may not take the call, the general path runs, given the public method's arguments as
 * they came. One C entry from Python for a call the first step takes; a call past `largest`
 * never enters the lane to be refused.
 *
 * Nothing here is kept between calls but the route's own fields (set once, at bind; a
 * rebinding makes a new Call), and it never reads a Python object's attributes but x's
 * `nbytes`, and that only where the route has a size limit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h> /* offsetof */

#define MOST_ARGS 4 /* the public methods' arguments: all_reduce's x, op, algorithm, out */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *first;        /* the first step, or NULL: none (the general path only) */
    _PyCFunctionFast fast;  /* first's C function where first is a builtin of METH_FASTCALL
                               (a lane's method), called straight: NULL otherwise */
    PyObject *fast_self;    /* its self (first holds it) */
    PyObject *general;      /* the general path, called with the public method's arguments */
    Py_ssize_t nargs;       /* the public method's argument count */
    Py_ssize_t largest;     /* the largest x (bytes) the first step takes; -1: every size */
    int picks[MOST_ARGS];   /* the arguments the first step takes, in its order */
    int npicks;
    unsigned nones;         /* bit i: argument i must be None for the first step */
} Call;

static PyObject *nbytes_name; /* "nbytes", interned at import */

/* Whether the first step may take a call of these arguments: every argument at nones is None
 * and x is within the size it takes (an x without nbytes is none of the lane's: no). */
static int may_take(const Call *self, PyObject *const *args)
{
    for (int i = 0; i < self->nargs; i++)
        if ((self->nones >> i & 1) && args[i] != Py_None)
            return 0;
    if (self->largest < 0)
        return 1;
    PyObject *nbytes = PyObject_GetAttr(args[0], nbytes_name);
    if (nbytes == NULL) {
        PyErr_Clear(); /* (the general path says what x should be) */
        return 0;
    }
    Py_ssize_t n = PyLong_AsSsize_t(nbytes);
    Py_DECREF(nbytes);
    if (n == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return n <= self->largest;
}

static PyObject *call_vectorcall(Call *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->first != NULL && kwnames == NULL && nargs == self->nargs && may_take(self, args)) {
        PyObject *picked[MOST_ARGS];
        for (int i = 0; i < self->npicks; i++)
            picked[i] = args[self->picks[i]];
        PyObject *result = self->fast != NULL
                               ? self->fast(self->fast_self, picked, self->npicks)
                               : PyObject_Vectorcall(self->first, picked, (size_t)self->npicks,
                                                     NULL);
        if (result != Py_None)
            return result; /* the call's result, or NULL with its error */
        Py_DECREF(result);
    }
    return PyObject_Vectorcall(self->general, args, nargsf, kwnames);
}

/* indices (a tuple of ints below nargs) into out[] (NULL: only checked): their count, or -1
 * with an exception */
static int indices(PyObject *tuple, Py_ssize_t nargs, int *out, unsigned *mask)
{
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    if (n > MOST_ARGS) {
        PyErr_SetString(PyExc_ValueError, "Call: more indices than arguments");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long k = PyLong_AsLong(PyTuple_GET_ITEM(tuple, i));
        if (k == -1 && PyErr_Occurred())
            return -1;
        if (k < 0 || k >= nargs) {
            PyErr_Format(PyExc_ValueError, "Call: index %ld is not an argument (0..%zd)", k,
                         nargs - 1);
            return -1;
        }
        if (out != NULL)
            out[i] = (int)k;
        if (mask != NULL)
            *mask |= 1u << k;
    }
    return (int)n;
}

/* Call(*, first, general, nargs, picks, nones, largest) */
static PyObject *call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"first", "general", "nargs", "picks", "nones", "largest", NULL};
    PyObject *first, *general, *picks, *nones;
    Py_ssize_t nargs, largest;
    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "Call takes keywords only");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOnO!O!n:Call", keywords, &first,
                                     &general, &nargs, &PyTuple_Type, &picks, &PyTuple_Type,
                                     &nones, &largest))
        return NULL;
    if (kwargs == NULL || PyDict_GET_SIZE(kwargs) != 6) {
        PyErr_SetString(PyExc_TypeError, "Call needs first, general, nargs, picks, nones and "
                                         "largest");
        return NULL;
    }
    if (!PyCallable_Check(general) || (first != Py_None && !PyCallable_Check(first)) ||
        nargs < 1 || nargs > MOST_ARGS) {
        PyErr_SetString(PyExc_ValueError, "Call: general (and first, unless None) must be "
                                          "callable, of 1 to 4 arguments");
        return NULL;
    }
    Call *self = (Call *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)call_vectorcall;
    self->nargs = nargs;
    self->largest = largest < 0 ? -1 : largest;
    if ((self->npicks = indices(picks, nargs, self->picks, NULL)) < 0 ||
        indices(nones, nargs, NULL, &self->nones) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->first = first == Py_None ? NULL : Py_NewRef(first);
    /* a lane's method (a builtin of METH_FASTCALL alone, bound): its C function, called
     * without the vectorcall in between (~20 ns of a 0.3 us shm all_reduce) */
    if (self->first != NULL && PyCFunction_Check(first) &&
        (PyCFunction_GET_FLAGS(first) & ~METH_COEXIST) == METH_FASTCALL &&
        PyCFunction_GET_SELF(first) != NULL) {
        self->fast = (_PyCFunctionFast)(void (*)(void))PyCFunction_GET_FUNCTION(first);
        self->fast_self = PyCFunction_GET_SELF(first);
    }
    self->general = Py_NewRef(general);
    return (PyObject *)self;
}

static int call_traverse(Call *self, visitproc visit, void *arg)
{
    Py_VISIT(self->first);
    Py_VISIT(self->general);
    return 0;
}

static int call_clear(Call *self)
{
    Py_CLEAR(self->first);
    Py_CLEAR(self->general);
    return 0;
}

static void call_dealloc(Call *self)
{
    PyObject_GC_UnTrack(self);
    call_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *call_get_largest(Call *self, void *unused)
{
    (void)unused;
    if (self->largest < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(self->largest);
}

static PyObject *call_get_first(Call *self, void *unused)
{
    (void)unused;
    return Py_NewRef(self->first ? self->first : Py_None);
}

/* run(*args): the call, as a method: the one callable a public method calls (a builtin
 * method, so that a profiler sees the call enter C, as it sees a lane's) */
static PyObject *call_run(Call *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return call_vectorcall(self, args, (size_t)nargs, kwnames);
}

static PyMethodDef call_methods[] = {
    {"run", (PyCFunction)(void (*)(void))call_run, METH_FASTCALL | METH_KEYWORDS,
     "The call: its first step where it may take it, else the general path."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef call_getset[] = {
    {"first", (getter)call_get_first, NULL, "The first step, or None.", NULL},
    {"largest", (getter)call_get_largest, NULL, "The largest x it takes, or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tbcoll.comm._route.Call",
    .tp_basicsize = sizeof(Call),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A bound route's call: its first step where it may take the call, else the "
              "general path.",
    .tp_new = call_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Call, vectorcall),
    .tp_dealloc = (destructor)call_dealloc,
    .tp_traverse = (traverseproc)call_traverse,
    .tp_clear = (inquiry)call_clear,
    .tp_methods = call_methods,
    .tp_getset = call_getset,
};

static struct PyModuleDef route_module = {
    PyModuleDef_HEAD_INIT, "tbcoll.comm._route", "A bound route's call (tbcoll.comm.routes).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__route(void)
{
    if (PyType_Ready(&CallType) < 0 ||
        (nbytes_name == NULL && (nbytes_name = PyUnicode_InternFromString("nbytes")) == NULL))
        return NULL;
    PyObject *module = PyModule_Create(&route_module);
    if (module != NULL && PyModule_AddObjectRef(module, "Call", (PyObject *)&CallType) < 0)
        Py_CLEAR(module);
    return module;
}
