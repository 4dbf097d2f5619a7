/* The module tbcoll.transports.rdma._verbs: its exceptions, its types and its constants (fabric.h
 * says what each file of the extension does). */
#include "fabric.h"

#include "../../include/callbacks.h" /* ADD_CALLBACKS */
#include "../../include/wire_export.h" /* add_wire */

PyObject *LibraryError, *DeviceError, *GidError, *RegistrationError;

static PyMethodDef module_methods[] = {
    {"devices", verbs_devices, METH_VARARGS, "The RDMA devices of this host."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tbcoll.transports.rdma._verbs", NULL,
                                    -1, module_methods};

/* the calls into Python that the mesh lane makes */
#define RDMA_CALLBACKS(X) CALLBACKS_RDMA(X)

PyMODINIT_FUNC PyInit__verbs(void)
{
    PyObject *m = PyModule_Create(&module);
    if (!m || PyType_Ready(&FabricType) < 0 || PyType_Ready(&MeshLaneType) < 0)
        return NULL;
    LibraryError =
        PyErr_NewException("tbcoll.transports.rdma._verbs.LibraryError", PyExc_OSError, NULL);
    DeviceError =
        PyErr_NewException("tbcoll.transports.rdma._verbs.DeviceError", PyExc_OSError, NULL);
    GidError = PyErr_NewException("tbcoll.transports.rdma._verbs.GidError", PyExc_OSError, NULL);
    RegistrationError = PyErr_NewException("tbcoll.transports.rdma._verbs.RegistrationError",
                                           PyExc_OSError, NULL);
    Py_INCREF(&FabricType);
    if (PyModule_AddObject(m, "Fabric", (PyObject *)&FabricType) < 0 ||
        PyModule_AddObjectRef(m, "MeshLane", (PyObject *)&MeshLaneType) < 0 ||
        PyModule_AddObject(m, "LibraryError", LibraryError) < 0 ||
        PyModule_AddObject(m, "DeviceError", DeviceError) < 0 ||
        PyModule_AddObject(m, "GidError", GidError) < 0 ||
        PyModule_AddObject(m, "RegistrationError", RegistrationError) < 0 ||
        PyModule_AddIntConstant(m, "COLL_BYTES", COLL_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "STREAM_CHUNK", STREAM_CHUNK) < 0 ||
        PyModule_AddIntConstant(m, "STREAM_RECVS", STREAM_RECVS) < 0 ||
        PyModule_AddIntConstant(m, "MESH_ALL_REDUCE", MESH_ALL_REDUCE) < 0 ||
        PyModule_AddIntConstant(m, "MESH_ALL_GATHER", MESH_ALL_GATHER) < 0 ||
        add_wire(m) < 0 || /* its dtype and op codes, checked at import by tbcoll.core.wire_check */
        ADD_CALLBACKS(m, RDMA_CALLBACKS) < 0) /* checked at import by tbcoll.core.callbacks */
        return NULL;
    return m;
}
