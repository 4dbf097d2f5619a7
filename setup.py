"""Builds the C extensions and tbrun's die-with-parent; everything else is in pyproject.toml.

- tbcoll.core._gate: a communicator's call gate (its lock, calls in progress, count and flight
  recorder; tbcoll/include/gate.h), and LaneCall (tbcoll/core/one_call.c): the whole call
  around a transport's C lane (its admission: tbcoll/core/admits.h), which each lane's
  extension offers as a versioned struct (tbcoll/include/lane.h) in a capsule; compiled here
  once.
- tbcoll.transports.shm._atomics: the shm transport's flags, rings and rounds, and its lane
  (its files by layer: tbcoll/transports/shm/shm.h).
- tbcoll.transports.tcp._sockets: the tcp transport's small-message path (a whole message per
  sendmsg; the next message read straight into its receive's buffer).
- tbcoll.transports.mpi._gathered: the mpi transport's small all_reduce (each rank's call and
  data gathered, checked and reduced in rank order).
- tbcoll.transports.rdma._verbs: the rdma transport's queue pairs (its files by job:
tbcoll/transports/rdma/fabric.h).
  It opens the verbs library with dlopen when a job uses it (libibverbs.so.1 on Linux,
  librdma.dylib on macOS 26.2+), so it needs only the header (infiniband/verbs.h:
  libibverbs-dev / rdma-core-devel, or the macOS 26.2 SDK) to build, and nothing to install
  or import.
- tbcoll.launch._subreaper (Linux): makes tbrun a child subreaper without ctypes (~1.5 ms of
  its start-up).
- tbcoll/launch/die-with-parent (Linux): a program, not an extension: what tbrun starts each
  rank through, so that the rank dies with tbrun (launchers/die_with_parent.c).

optional=True: without a compiler (or without the verbs header) the install still succeeds;
tbcoll.core.gate then uses its Python twin (PyGate), tbcoll.transports.shm its pure-Python flags,
tcp its stream engine's Python path, the rdma backend says how to get it built, and tbrun sets
PR_SET_PDEATHSIG from Python in each forked rank instead, and PR_SET_CHILD_SUBREAPER through
ctypes. TBCOLL_REQUIRE_C=1 makes every one of them required, so that a build with
CFLAGS="-Wall -Werror" fails on a warning instead of leaving the extension out
(tests/labs/test_arm64.py builds so under gcc and clang).
"""

import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, LinkError

_LINUX = sys.platform.startswith("linux")
_DL = ["dl"] if _LINUX else []
_DIE_WITH_PARENT = "die-with-parent"
_OPTIONAL = os.environ.get("TBCOLL_REQUIRE_C") != "1"


class BuildExtAndDieWithParent(build_ext):
    """The extensions, then on Linux die-with-parent beside tbrun's modules (in the source
    tree too for an in-place or editable build, as the extensions)."""

    def run(self) -> None:
        super().run()
        if not _LINUX:
            return
        try:
            objects = self.compiler.compile(["launchers/die_with_parent.c"],
                                            output_dir=self.build_temp)
            built = Path(self.build_lib, "tbcoll", "launch")
            self.compiler.link_executable(objects, _DIE_WITH_PARENT, output_dir=str(built))
        except (CompileError, LinkError) as e:  # optional, as the extensions
            if not _OPTIONAL:
                raise
            print(f"warning: {_DIE_WITH_PARENT} not built ({e}); tbrun sets PR_SET_PDEATHSIG "
                  "from a preexec_fn instead", file=sys.stderr)
            return
        if self.inplace:
            source = self.get_finalized_command("build_py").get_package_dir("tbcoll.launch")
            shutil.copy2(built / _DIE_WITH_PARENT, Path(source, _DIE_WITH_PARENT))


# the headers every extension shares (tbcoll/include: the wire and its export, reductions,
# buffers, the pause of a spin, the stream engine's words, the lane interface, the calls
# into Python)
_SHARED = ["tbcoll/include/wire.h", "tbcoll/include/wire_export.h", "tbcoll/include/reduce.h",
           "tbcoll/include/buffers.h", "tbcoll/include/cpu_relax.h",
           "tbcoll/include/engine_words.h", "tbcoll/include/lane.h",
           "tbcoll/include/callbacks.h"]
# shm's files by layer (tbcoll/transports/shm/shm.h): the pure C ones first (no Python.h:
# tests/transports/test_tsan.py builds them without Python), then the Lane's and the module's
SHM = "tbcoll/transports/shm/"
SHM_PURE_C = [SHM + name for name in ("flags.c", "rings.c", "cma.c", "rounds.c")]
SHM_SOURCES = [*SHM_PURE_C, *(SHM + name for name in ("lane_base.c", "one_copy.c", "moves.c",
                                                      "lane.c", "_atomics.c"))]
SHM_HEADERS = [SHM + name for name in ("shm.h", "gil.h", "flags.h", "rings.h", "cma.h",
                                       "rounds.h", "lane_base.h", "one_copy.h", "moves.h",
                                       "lane.h")]

# tcp's files by layer (tbcoll/transports/tcp/exchange.h): pure C, the Lane, the module
TCP = "tbcoll/transports/tcp/"
TCP_SOURCES = [TCP + name for name in ("exchange.c", "tcp_lane.c", "watch.c", "_sockets.c")]
TCP_HEADERS = [TCP + "exchange.h", TCP + "tcp_lane.h", TCP + "watch.h"]

# rdma's files by job (tbcoll/transports/rdma/fabric.h, which they share): the library, posting and
# completions, the Fabric's set-up, its stream, the mesh call, the mesh lane, a pair moved off
# RDMA, the module
RDMA = "tbcoll/transports/rdma/"
VERBS_SOURCES = [RDMA + name for name in (
    "library.c", "completions.c", "fabric.c", "stream.c", "mesh.c", "mesh_lane.c", "moves.c",
    "_verbs.c")]
VERBS_HEADERS = [RDMA + "fabric.h"]

setup(cmdclass={"build_ext": BuildExtAndDieWithParent}, ext_modules=[
    Extension("tbcoll.core._gate", ["tbcoll/core/_gate.c", "tbcoll/core/one_call.c",
                                    "tbcoll/core/admits.c"],
              depends=[*_SHARED, "tbcoll/include/gate.h", "tbcoll/core/one_call.h",
                       "tbcoll/core/admits.h"], optional=_OPTIONAL),
    Extension("tbcoll.comm._route", ["tbcoll/comm/_route.c"], optional=_OPTIONAL),
    Extension("tbcoll.transports.shm._atomics", SHM_SOURCES,
              depends=[*_SHARED, *SHM_HEADERS, "tbcoll/include/gate.h"], optional=_OPTIONAL),
    Extension("tbcoll.transports.tcp._sockets", TCP_SOURCES,
              depends=[*_SHARED, *TCP_HEADERS, "tbcoll/include/gate.h"], optional=_OPTIONAL),
    Extension("tbcoll.transports.mpi._gathered", ["tbcoll/transports/mpi/_gathered.c"],
              depends=_SHARED, optional=_OPTIONAL),
    Extension("tbcoll.transports.rdma._verbs", VERBS_SOURCES,
              depends=[*_SHARED, *VERBS_HEADERS, "tbcoll/include/gate.h"], libraries=_DL,
              optional=_OPTIONAL),
    *([Extension("tbcoll.launch._subreaper", ["launchers/_subreaper.c"], optional=_OPTIONAL)]
      if _LINUX else []),
])
