"""What each Python rank of `tbrun --backend mpi` runs under: `python -m launchers.mpirank
STDIN PROGRAM...`, where STDIN is the rank that reads the job's input ("none": no rank).

It gives the rank torchrun's names (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) from
MPI's own variables, gives every other rank /dev/null as stdin (Hydra leaves their stdin
open with nothing ever arriving, so a read would hang), then runs PROGRAM with mpi4py's
runner, so that an uncaught exception or a non-zero exit in one rank aborts the job at once
(MPI_Abort) instead of leaving the others waiting.
"""

from __future__ import annotations

import os
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

    run_with_mpi4py()  # reads sys.argv[1:]: the program and its arguments


if __name__ == "__main__":
    main()
