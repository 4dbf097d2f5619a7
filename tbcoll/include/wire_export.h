/* add_wire: a C extension's export of the wire (wire.h) as its module's WIRE, which
 * tbcoll.core.wire_check compares with Python's at import. Python-facing: included by the
 * extensions' module files (tbcoll/transports/shm/_atomics.c, tbcoll/transports/tcp/_sockets.c,
 * tbcoll/transports/rdma/_verbs.c). May include: Python.h, wire.h. */
#ifndef TBCOLL_WIRE_EXPORT_H
#define TBCOLL_WIRE_EXPORT_H

#include <Python.h>

#include "wire.h"

/* --- the export: WIRE = {"dtypes": ((name, bytes), ...), "ops": (name, ...), "header":
 * ((name, offset, bytes), ...), "descriptor": (likewise), "contexts": {name: value},
 * "pull_ids": mask, "call": ((name, lowest bit, bits), ...), "byte_order": "big"}, as
 * tbcoll.core.wire_check builds Python's (the call: tbcoll.core.calls.FIELDS). One
 * Py_BuildValue: each list gives its part of the format and its arguments. */
#define WIRE_DTYPE_FORMAT(code, name, bytes) "(si)"
#define WIRE_DTYPE_ARGS(code, name, bytes) name, bytes,
#define WIRE_OP_FORMAT(code, name) "s"
#define WIRE_OP_ARGS(code, name) name,
#define WIRE_FIELD_FORMAT(field, name, at, bytes) "(sii)"
#define WIRE_FIELD_ARGS(field, name, at, bytes) name, at, bytes,
#define WIRE_CALL_FORMAT(field, name, low, bits) "(sii)"
#define WIRE_CALL_ARGS(field, name, low, bits) name, low, bits,
#define WIRE_CONTEXT_FORMAT(name, value) "sk"
#define WIRE_CONTEXT_ARGS(name, value) name, (unsigned long)(value),

/* Adds WIRE, the description above, to the module: 0, or -1 with an exception. */
static inline int add_wire(PyObject *module)
{
    PyObject *wire = Py_BuildValue(
        "{s(" WIRE_DTYPES(WIRE_DTYPE_FORMAT) ")s(" WIRE_OPS(WIRE_OP_FORMAT) ")"
        "s(" WIRE_HEADER(WIRE_FIELD_FORMAT) ")s(" WIRE_DESCRIPTOR(WIRE_FIELD_FORMAT) ")"
        "s{" WIRE_CONTEXTS(WIRE_CONTEXT_FORMAT) "}sks(" WIRE_CALL(WIRE_CALL_FORMAT) ")sz}",
        "dtypes", WIRE_DTYPES(WIRE_DTYPE_ARGS) "ops", WIRE_OPS(WIRE_OP_ARGS)
        "header", WIRE_HEADER(WIRE_FIELD_ARGS) "descriptor", WIRE_DESCRIPTOR(WIRE_FIELD_ARGS)
        "contexts", WIRE_CONTEXTS(WIRE_CONTEXT_ARGS) "pull_ids", (unsigned long)PULL_IDS,
        "call", WIRE_CALL(WIRE_CALL_ARGS) "byte_order", "big");
    if (wire == NULL)
        return -1;
    if (PyModule_AddObject(module, "WIRE", wire) < 0) {
        Py_DECREF(wire);
        return -1;
    }
    return 0;
}

#endif /* TBCOLL_WIRE_EXPORT_H */
