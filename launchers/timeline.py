"""tbrun --trace FILE: the ranks send their calls to the store in chunks as they run
(tbcoll.observability.dumps), which hands each chunk here at once (StoreServer.divert); each rank's
chunks go to a file of its own in the job's private folder, and when the job ends they are merged
into one timeline (tbcoll.observability.trace.write_trace), a chunk in memory at a time. Neither
tbrun nor a rank holds a long job's calls in memory."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator

from tbcoll.launch.folders import beside

from tbcoll.job.rendezvous import StoreServer
from tbcoll.observability.dump_keys import TRACE_PREFIX
from tbcoll.observability.trace import write_trace


class TraceSpool:
    """Each rank's chunks, a line each, in folder/trace-RANK.jsonl, in the order they came."""

    def __init__(self, store: StoreServer, folder: str, log: Callable[[str], None]) -> None:
        self._folder = folder
        self._log = log
        self._lock = threading.Lock()
        self._files: dict[int, int] = {}
        self._failed = False
        store.divert(TRACE_PREFIX, self._take)

    def _take(self, key: bytes, chunk: bytes) -> None:
        rank_text = key[len(TRACE_PREFIX):].split(b"/")[0]
        if not rank_text.isdigit() or b"\n" in chunk:
            return  # not what tbcoll.observability.dumps sends
        rank = int(rank_text)
        with self._lock:
            if self._failed:
                return
            try:
                if (fd := self._files.get(rank)) is None:
                    fd = self._files[rank] = os.open(
                        self._path(rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.write(fd, chunk + b"\n")  # one write: a short one is a full disk
            except OSError as e:
                self._failed = True
                self._log(f"--trace: cannot keep the ranks' calls in {self._folder} "
                          f"({e.strerror}); the trace will lack what comes from now on")

    def _path(self, rank: int) -> str:
        return os.path.join(self._folder, f"trace-{rank}.jsonl")

    def chunks(self, rank: int) -> Callable[[], Iterator[dict]]:
        """A function that reads rank's chunks, one at a time, each time it is called."""
        def read() -> Iterator[dict]:
            with open(self._path(rank), "rb") as f:
                for line in f:
                    try:
                        yield json.loads(line)
                    except ValueError:
                        continue  # cut short by a full disk
        return read

    def close(self) -> list[int]:
        """Stop taking chunks; the ranks that sent some."""
        with self._lock:
            self._failed = True
            for fd in self._files.values():
                os.close(fd)
            return sorted(self._files)


def save_trace(spool: TraceSpool, size: int, path: str, log: Callable[[str], None]) -> None:
    """Write the timeline of the calls the ranks sent (a rank killed loses those it had not
    sent yet: at most a chunk, or a second's worth). A write that fails is one line."""
    ranks = spool.close()
    if not ranks:
        log(f"--trace: no rank sent its calls (did the ranks call tbcoll.init?); {path} not "
            "written")
        return
    temporary = beside(path, "trace")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(fd, "w") as out:
            written = write_trace({rank: spool.chunks(rank) for rank in ranks}, out)
        os.replace(temporary, path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = e.strerror if isinstance(e, OSError) else f"a rank sent what is no trace: {e!r}"
        log(f"--trace: cannot write {path} ({why}); no timeline")
        try:
            os.unlink(temporary)
        except OSError:
            pass
        return
    missing = [r for r in range(size) if r not in ranks]
    early = [r for r in ranks if not written.ended[r]]
    log(f"--trace: {written.calls} calls of {len(ranks)} ranks in {path}"
        + (f" (none from {', '.join(map(str, missing))})" if missing else "")
        + "".join(f"; rank {r}'s calls may end early (it did not exit normally)" for r in early)
        + f"; python -m tbcoll.observability.trace summary {path}")
