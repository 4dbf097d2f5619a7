"""The tbrun command (console script and `python -m tbcoll.launch`): its command line,
tbcoll.launch.cli, imported with the garbage collector off, and an exit without the
interpreter's teardown.

tbrun's modules make objects that live until it exits: collecting while they are imported
took ~10% of the import's CPU (~5 ms), and the collection at exit went through them all
(~10 ms of wall time). Frozen once imported, no collection looks at them again; the job's own
objects are collected as usual. The teardown at exit then still freed every object of every
module one by one (~2.5 ms of CPU at each tbrun's exit): tbrun leaves with os._exit instead,
once standard output and error are flushed (every file it wrote is closed by then, and its only
threads, the store's, are daemons).
"""

import gc
import os
import sys


def main() -> None:
    gc.disable()
    from tbcoll.launch.cli import main as command_line

    gc.freeze()
    gc.enable()
    try:
        command_line()
    except SystemExit as leaving:
        if leaving.code is None or isinstance(leaving.code, int):
            _exit_now(leaving.code or 0)
        raise  # a message for the interpreter to print
    except BrokenPipeError:  # stdout's reader went away (`tbrun --dry-run ... | head -1`)
        _exit_now(_quiet_stdout())


def _quiet_stdout() -> int:
    """Python's recipe for a reader that left (the signal module's note on SIGPIPE): standard
    output pointed at devnull, so that what is left in its buffer has somewhere to go and
    the exit prints no traceback; status 1, as the recipe's."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


def _exit_now(status: int) -> None:
    """os._exit(status) once stdout and stderr are flushed; where a flush fails (stdout lost
    its reader) it returns, and the interpreter's own exit reports that as usual."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, AttributeError, ValueError):  # lost reader; no stream; a closed one
        return
    os._exit(status)
