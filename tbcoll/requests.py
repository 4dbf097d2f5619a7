"""Non-blocking collectives: tbcoll.Request, wait_all, and the thread that makes progress.

A communicator's first non-blocking call (iall_reduce, ...) starts its progress thread. The
calls go to that thread in the order they were made and run there one after another, so they
progress while the caller computes: nothing depends on the caller calling tbcoll again. Each
rank issues its collectives in the same order, so the threads of all ranks meet in the same
order. A blocking call made while non-blocking ones are still queued first waits for them
(the collectives keep their order across ranks); one lock keeps the transport to one thread
at a time. Overlap is real where the computation releases the GIL (numpy's matmul, MLX) and
the transport waits outside it (sockets, MPI's polling, shm's waits).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any


class Request:
    """A non-blocking collective in flight: wait() gives its result, test() says whether it
    is done. The input (and out=) must not change until it is."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def test(self) -> bool:
        return self._done.is_set()

    def wait(self) -> Any:
        """The collective's result (None for those without one); its error, raised here."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result

    def _finish(self, result: Any, error: BaseException | None) -> None:
        self._result, self._error = result, error
        self._done.set()

    def __repr__(self) -> str:
        return f"<tbcoll.Request {self.what}, {'done' if self.test() else 'in flight'}>"


def wait_all(requests: Iterable[Request]) -> list[Any]:
    """Wait for every request; their results, in order (the first error is raised)."""
    return [request.wait() for request in list(requests)]


class Progress:
    """One communicator's queue of non-blocking calls and the thread that runs them."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # held while a call runs on the transport; re-entered by calls made inside one (split
        # all_gathers)
        self._lock = threading.RLock()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, what: str, call: Callable[[], Any]) -> Request:
        request = Request(what)
        with self._idle:
            self._pending += 1
        self._queue.put((request, call))
        return request

    def run(self, call: Callable[[], Any]) -> Any:
        """A blocking call: after every queued one, on the caller's thread."""
        if threading.current_thread() is self._thread:
            return call()
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0)
        with self._lock:
            return call()

    def stop(self) -> None:
        """Finish what is queued, then end the thread."""
        self._queue.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            request, call = item
            result, error = None, None
            try:
                with self._lock:
                    result = call()
            except BaseException as e:  # noqa: BLE001 (handed to whoever waits)
                error = e
            request._finish(result, error)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()


def in_order(method: Callable) -> Callable:
    """A Communicator method that waits for the communicator's queued non-blocking calls
    first (none queued, none ever made: straight through)."""

    @functools.wraps(method)
    def ordered(self, *args: Any, **kwargs: Any) -> Any:
        progress = self._progress
        if progress is None:
            return method(self, *args, **kwargs)
        return progress.run(functools.partial(method, self, *args, **kwargs))

    return ordered
