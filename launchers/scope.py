"""What every job holds while it runs, whoever starts its ranks (tbrun's own starters or
mpiexec), and gives back on every exit path: its secret, its cookie, its private folder, the
rendezvous store and the janitor that cleans up should tbrun be killed."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from tbcoll.launch.hosts import JobPlan
from tbcoll.launch.janitor import Janitor, janitor_for
from tbcoll.launch.output import log
from tbcoll.launch.postmortem import Postmortem
from tbcoll.launch.reaper import new_job_id
from tbcoll.launch.shmclean import remove_job_segments
from tbcoll.launch.store import StoreServer, serve_store

from tbcoll.auth import new_token
from tbcoll.env import segment_prefix

UNMADE = "<made at launch>"  # the token a dry run shows


class JobScope(NamedTuple):
    token: str  # TBCOLL_TOKEN, the job's secret
    job: str  # TBCOLL_JOB, the cookie every process of the job carries
    folder: str  # the job's private files (0700), removed at the end
    store: StoreServer | None  # not started yet; None for a dry run
    janitor: Janitor
    postmortem: Postmortem | None  # the ranks' dumps, when the job fails; None for a dry run


@contextmanager
def job_scope(plan: JobPlan, store_port: int, clients: int, *, dry_run: bool = False,
              mpich: bool = False, dump_dir: str | None = None,
              trace: str | None = None) -> Iterator[JobScope]:
    """A job's scope: on leaving it, the timeline is written (trace: the file), the store is
    closed, the folder removed, and the job's shared-memory segments unlinked (tbcoll's, by
    the token's prefix; with mpich, MPICH's are watched by the janitor instead, and the
    caller removes them). A dry run serves no store. clients: the number of ranks."""
    token = UNMADE if dry_run else new_token()
    folder = tempfile.mkdtemp(prefix="tbrun-")  # 0700
    job = new_job_id()
    segments = None if mpich or dry_run else segment_prefix(job)
    with janitor_for(folder, segments=segments, mpich=mpich and not dry_run,
                     job=job) as janitor:
        store = postmortem = None
        try:
            if not dry_run:
                store = serve_store(token, plan, store_port, clients)
                postmortem = Postmortem(store, clients, log, dump_dir)
            yield JobScope(token, job, folder, store, janitor, postmortem)
        finally:
            if store is not None:
                if trace is not None:
                    # imported here: a job without --trace starts without the timeline's
                    # modules (statistics among them: ~2 ms of tbrun's start-up)
                    from tbcoll.launch.timeline import save_trace

                    save_trace(store, clients, trace, log)
                store.close()
            shutil.rmtree(folder, ignore_errors=True)
            if segments is not None:
                remove_job_segments(segments, log)
