"""Builds the C extensions; everything else is in pyproject.toml.

- tbcoll.shm._atomics: the shm transport's flags and rounds.
- tbcoll.transports._sockets: the tcp transport's small-message path (a whole message per
  sendmsg; the next message read straight into its receive's buffer).
- tbcoll.rdma._verbs: the rdma transport's queue pairs. It opens the verbs library with
  dlopen when a job uses it (libibverbs.so.1 on Linux, librdma.dylib on macOS 26.2+), so it
  needs only the header (infiniband/verbs.h: libibverbs-dev / rdma-core-devel, or the macOS
  26.2 SDK) to build, and nothing to install or import.

optional=True: without a compiler (or without the verbs header) the install still succeeds;
tbcoll.shm then uses its pure-Python flags, tcp its stream engine's Python path, and the rdma
backend says how to get it built.
"""

import sys

from setuptools import Extension, setup

_DL = ["dl"] if sys.platform.startswith("linux") else []

setup(ext_modules=[
    Extension("tbcoll.shm._atomics", ["tbcoll/shm/_atomics.c"], depends=["tbcoll/shm/reduce.h"],
              optional=True),
    Extension("tbcoll.transports._sockets", ["tbcoll/transports/_sockets.c"],
              depends=["tbcoll/shm/reduce.h"], optional=True),
    Extension("tbcoll.rdma._verbs", ["tbcoll/rdma/_verbs.c"],
              depends=["tbcoll/shm/reduce.h"], libraries=_DL, optional=True),
])
