"""@record: typing.NamedTuple's class syntax on collections.namedtuple, without typing.

tbrun's ~25 records were NamedTuples: importing typing, and checking each annotation of each
record, cost its start-up ~5 ms (0.18 ms a record, against 0.07 for namedtuple's:
benchmarks/RESULTS.md, design choices). Annotations are kept as written, never evaluated.
"""

from __future__ import annotations

from collections import namedtuple


def record(cls: type) -> type:
    """A tuple class like `class Name(NamedTuple)` with the same body makes: the annotated
    names, in order, are its fields, their values its defaults; methods, properties and the
    docstring are kept (the class is made anew: no zero-argument super() in its methods)."""
    namespace = dict(cls.__dict__)
    fields = namespace.get("__annotations__", {})
    defaults = [namespace.pop(name) for name in fields if name in namespace]
    required = list(fields)[:len(fields) - len(defaults)]
    if any(name in cls.__dict__ for name in required):  # namedtuple would shift the defaults
        raise TypeError(f"{cls.__name__}: a field without a default follows one with a default")
    for made_by_class in ("__dict__", "__weakref__"):
        namespace.pop(made_by_class, None)
    fields_tuple = namedtuple(cls.__name__, fields, defaults=defaults, module=cls.__module__)
    return type(cls.__name__, (fields_tuple,), {**namespace, "__slots__": ()})
