"""What each Python rank of `tbrun --backend mpi` runs under: `python -m launchers.mpirank
STDIN PROGRAM...`, where STDIN is the rank that reads the job's input ("none": no rank).

It gives the rank torchrun's names (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) from
MPI's own variables, gives every other rank /dev/null as stdin (Hydra leaves their stdin
open with nothing ever arriving, so a read would hang), then runs PROGRAM with mpi4py's
runner, so that an uncaught exception or a non-zero exit in one rank aborts the job at once
(MPI_Abort) instead of leaving the others waiting. Before it aborts, a rank on tbrun's host
writes its status into tbrun's job directory (TBCOLL_MPI_REPORTS): Hydra's teardown can cut
the rank's last lines and Hydra's own exit codes, and tbrun must still name the rank.
"""

from __future__ import annotations

import os
import stat
import sys

from tbcoll.env import torchrun_names_from_mpi


def main() -> None:
    stdin_rank = sys.argv.pop(1)
    names = torchrun_names_from_mpi(os.environ)
    os.environ.update(names)
    if names.get("RANK") != stdin_rank:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    from mpi4py.run import main as run_with_mpi4py

    try:
        run_with_mpi4py()  # reads sys.argv[1:]: the program and its arguments
    except SystemExit as exc:
        if exc.code not in (None, 0):
            report_failure(names.get("RANK"), exc.code if isinstance(exc.code, int) else 1)
        raise
    except KeyboardInterrupt:
        report_failure(names.get("RANK"), 130)
        raise
    except BaseException:
        report_failure(names.get("RANK"), 1)
        raise


def report_failure(rank: str | None, status: int) -> None:
    """Write `status` to tbrun's job directory as failed-RANK, if this host has that directory
    and it is this user's alone (on another host the same path could be anybody's)."""
    directory = os.environ.get(REPORTS)
    if not directory or rank is None:
        return
    try:
        info = os.lstat(directory)
        if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
                or info.st_mode & 0o077):
            return
        fd = os.open(os.path.join(directory, f"failed-{rank}"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{status & 0xFF}\n")
    except OSError:
        pass  # tbrun falls back on MPICH's words


REPORTS = "TBCOLL_MPI_REPORTS"


if __name__ == "__main__":
    main()
