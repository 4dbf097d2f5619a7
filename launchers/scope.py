"""What every job holds while it runs, whoever starts its ranks (tbrun's own starters or
mpiexec), and gives back on every exit path: its secret, its cookie, its private folder, the
rendezvous store and the janitor that cleans up should tbrun be killed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from tbcoll.launch.failovers import FailoverLines
from tbcoll.launch.folders import check_trace_path, new_folder, safe_folder
from tbcoll.launch.hosts import JobPlan
from tbcoll.launch.janitor import Janitor, janitor_for
from tbcoll.launch.output import log
from tbcoll.launch.postmortem import Postmortem
from tbcoll.launch.reaper import new_job_id
from tbcoll.launch.shmclean import remove_job_segments
from tbcoll.launch.store import StoreServer, serve_store

from tbcoll.core.errors import LaunchError
from tbcoll.job.auth import new_token
from tbcoll.job.env import segment_prefix

UNMADE = "<made at launch>"  # the token a dry run shows


class JobScope:
    """What a job holds while it runs (job_scope makes it, and gives it all back)."""

    def __init__(self, token: str, job: str, janitor: Janitor, segment_names: str) -> None:
        self.token = token  # TBCOLL_TOKEN, the job's secret
        self.job = job  # TBCOLL_JOB, the cookie every process of the job carries
        # TBCOLL_SHM_NAMES for the ranks on this host ("": none, as for mpiexec's ranks)
        self.segment_names = segment_names
        self.janitor = janitor
        self.store: StoreServer | None = None  # not started yet; None for a dry run
        # the ranks' dumps, when the job fails; None for a dry run
        self.postmortem: Postmortem | None = None
        self._folder: str | None = None

    @property
    def folder(self) -> str:
        """The job's private files (0700), removed at the end; made when first asked for:
        a job whose ranks all run here needs none (MLX's hostfiles and mpiexec's pipes go
        there), and tempfile with shutil took ~4 ms of tbrun's start-up."""
        if self._folder is None:
            import tempfile

            self._folder = tempfile.mkdtemp(prefix="tbrun-")  # 0700
            self.janitor.watch_folder(self._folder)
        return self._folder

    def remove_folder(self) -> None:
        if self._folder is not None:
            import shutil

            shutil.rmtree(self._folder, ignore_errors=True)


@contextmanager
def job_scope(plan: JobPlan, store_port: int, clients: int, *, dry_run: bool = False,
              mpich: bool = False, dump_dir: str | None = None,
              trace: str | None = None) -> Iterator[JobScope]:
    """A job's scope: on leaving it, the timeline is written (trace: the file), the store is
    closed, the folder removed, and the job's shared-memory segments unlinked (tbcoll's, those
    its ranks wrote down in the folder of names, TBCOLL_SHM_NAMES, and on Linux those /dev/shm
    lists under the job's prefix; with mpich, MPICH's are watched by the janitor instead, and
    the caller removes them). A dry run serves no store. clients: the number of ranks.

    Before anything starts, --trace's file is checked and --dump-dir's folder, in which the
    job makes a new folder of its own (tbcoll.launch.folders): LaunchError if they cannot be
    written."""
    dumps = None if dry_run else _dumps_folder(dump_dir, trace)
    job = new_job_id()
    segments = None if mpich or dry_run else segment_prefix(job)
    names = None if segments is None else _names_folder()
    with janitor_for(segments=segments, names=names, mpich=mpich and not dry_run,
                     job=job) as janitor:
        scope = JobScope(UNMADE if dry_run else new_token(), job, janitor,
                         UNMADE if dry_run else names or "")
        spool = lines = None
        try:
            if not dry_run:
                scope.store = serve_store(scope.token, plan, store_port, clients)
                scope.postmortem = Postmortem(scope.store, clients, log, dumps)
                lines = FailoverLines(scope.store, ((h.name, h.ranks) for h in plan.hosts), log)
                if trace is not None:
                    # imported here: a job without --trace starts without the timeline's
                    # modules (statistics among them: ~2 ms of tbrun's start-up)
                    from tbcoll.launch.timeline import TraceSpool

                    spool = TraceSpool(scope.store, scope.folder, log)
            yield scope
        finally:
            if lines is not None:
                lines.close()
            if scope.store is not None:
                scope.store.close()
            if spool is not None:
                from tbcoll.launch.timeline import save_trace

                save_trace(spool, clients, trace, log)
            scope.remove_folder()
            if dumps is not None:
                _remove_if_empty(dumps)
            if segments is not None:
                remove_job_segments(segments, names, log)


def _dumps_folder(dump_dir: str | None, trace: str | None) -> str | None:
    """Check --trace, and make the job's own folder under --dump-dir (None without it)."""
    if trace is not None:
        check_trace_path(trace)
    if dump_dir is None:
        return None
    safe_folder(dump_dir, "--dump-dir")
    try:
        return new_folder(dump_dir, f"tbrun-{os.getpid()}-")
    except OSError as e:
        raise LaunchError(f"--dump-dir {dump_dir}: cannot make a folder in it "
                          f"({e.strerror}); give a folder you can write to") from None


def _names_folder() -> str:
    """A new private folder where the job's ranks on this host write down the shared-memory
    names they make (TBCOLL_SHM_NAMES), in the temporary directory (as tempfile finds it,
    without tempfile: ~4 ms of tbrun's start-up)."""
    parent = os.environ.get("TMPDIR") or "/tmp"
    try:
        return new_folder(parent, "tbrun-shm-")
    except OSError as e:
        raise LaunchError(f"cannot make the job's folder in {parent} ({e.strerror}): set "
                          "TMPDIR to a folder you can write to") from None


def _remove_if_empty(folder: str) -> None:
    """The job's folder under --dump-dir, where no dump was written."""
    try:
        os.rmdir(folder)
    except OSError:
        pass
