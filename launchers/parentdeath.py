"""How tbrun's children die with it on Linux, should tbrun be killed before it can stop them:
PR_SET_PDEATHSIG, which a process sets for itself and keeps across exec. Nothing else has it
(macOS: tbcoll.launch.remote does that work there).

A child is started through die-with-parent (launchers/die_with_parent.c, built at install),
which sets the flag and execs the child's program, so that subprocess starts it with vfork.
Where that program was not built, a preexec_fn sets the flag in the child instead, which
makes subprocess fork tbrun whole and run Python in the child (~1-1.5 ms more a child).
Either way the child ends at once if tbrun died before the flag was set.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

PDEATHSIG = sys.platform.startswith("linux")
DIE_WITH_PARENT = os.path.join(os.path.dirname(__file__), "die-with-parent")
_PR_SET_PDEATHSIG = 1


def tied(argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
         sig: int = signal.SIGKILL) -> tuple[list[str], Callable[[], None] | None]:
    """The argv and preexec_fn that start argv (with env, in cwd) as a child that gets sig
    when this process dies; an OSError, as Popen's, where argv[0] cannot be found
    (die-with-parent would only exit with status 127)."""
    parent = os.getpid()
    if not PDEATHSIG:
        return list(argv), None
    if not os.access(DIE_WITH_PARENT, os.X_OK):
        return list(argv), _pdeathsig_hook(parent, sig)
    program = argv[0]
    if os.sep in program and cwd is not None:  # a relative path is the child's cwd's
        program = os.path.join(cwd, program)
    if not _runnable(program, env.get("PATH", os.defpath)):
        raise FileNotFoundError(errno.ENOENT, "not found or not executable", argv[0])
    return [str(DIE_WITH_PARENT), str(parent), str(int(sig)), *argv], None


def _runnable(program: str, path: str) -> bool:
    """shutil.which(program, path=path) is not None; shutil is imported only to search PATH
    (~2 ms of tbrun's start-up: a rank's interpreter is a path)."""
    if os.sep in program:  # which looks at that path alone
        return os.access(program, os.X_OK) and not os.path.isdir(program)
    import shutil

    return shutil.which(program, path=path) is not None


def _pdeathsig_hook(parent: int, sig: int) -> Callable[[], None]:
    import ctypes  # here: only where die-with-parent was not built (~1.5 ms of start-up)

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # tbrun died before the flag was set
            os._exit(1)

    return hook
