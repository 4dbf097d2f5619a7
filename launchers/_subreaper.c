/* tbcoll.launch._subreaper (Linux): PR_SET_CHILD_SUBREAPER for tbrun and tbcoll.launch.remote
 * (tbcoll.launch.reaper.set_subreaper). ctypes does the same call, but importing ctypes cost
 * tbrun's start-up ~1.5 ms; reaper falls back on it where this was not built (no compiler at
 * install, as for the other extensions). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sys/prctl.h>

/* swap(on): make this process a child subreaper or stop being one; returns whether it was
 * one before, or None if prctl failed (then nothing changed). */
static PyObject *swap(PyObject *module, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int before = 0;
    if (prctl(PR_GET_CHILD_SUBREAPER, &before, 0, 0, 0) != 0
            || prctl(PR_SET_CHILD_SUBREAPER, (unsigned long)on, 0, 0, 0) != 0)
        Py_RETURN_NONE;
    return PyBool_FromLong(before);
}

static PyMethodDef methods[] = {
    {"swap", swap, METH_O, "swap(on): be a child subreaper or not; whether it was before "
                           "(None if prctl failed)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_subreaper", NULL, -1, methods};

PyMODINIT_FUNC PyInit__subreaper(void) { return PyModule_Create(&module); }
