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


class P2PRequest(Request):
    """An isend or irecv: started on the progress thread in its turn (a start never waits),
    then completed by whoever waits: wait() lets the queued calls run first, then waits on the
    transport, which moves every message in flight meanwhile; test() takes one look."""

    def __init__(self, what: str, progress: Progress, p2p: Any,
                 finish: Callable[[], Any], name_error: Callable[[Exception], Exception]) -> None:
        super().__init__(what)
        self._progress, self._p2p, self._finish_with = progress, p2p, finish
        self._name_error = name_error
        self._started = threading.Event()
        self._transfer: Any = None
        self._start_error: BaseException | None = None

    def _start(self, start: Callable[[Any], Any]) -> None:
        try:
            self._transfer = start(self._p2p)
        except BaseException as e:  # noqa: BLE001 (raised by wait)
            self._start_error = e
        self._started.set()

    def test(self) -> bool:
        if self._done.is_set():
            return True
        if not self._started.is_set():
            return False
        if self._start_error is None and not self._progress.try_run(
                lambda: self._p2p.test([self._transfer])):
            return False
        self.wait()  # done: take its result (or error) now
        return True

    def wait(self) -> Any:
        if not self._done.is_set():
            self._started.wait()
            error, result = self._start_error, None
            if error is None:
                try:
                    self._progress.run(lambda: self._p2p.waitall([self._transfer]))
                    result = self._finish_with()
                except Exception as e:  # noqa: BLE001 (named, then raised below)
                    error = self._name_error(e)
            self._finish(result, error)
        return super().wait()


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
        self._enqueue(request, call)
        return request

    def start(self, request: P2PRequest, start: Callable[[Any], Any]) -> P2PRequest:
        """Start a send or receive in its turn on the progress thread (it never waits there)."""
        self._enqueue(None, functools.partial(request._start, start))
        return request

    def _enqueue(self, request: Request | None, call: Callable[[], Any]) -> None:
        """call() in its turn; its result or error goes to request (None: nobody waits)."""
        with self._idle:
            self._pending += 1
        self._queue.put((request, call))

    def try_run(self, call: Callable[[], Any]) -> Any:
        """call() if nothing is queued and the transport is free now, else False."""
        if self._pending or not self._lock.acquire(blocking=False):
            return False
        try:
            return call()
        finally:
            self._lock.release()

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
        self.stop_soon()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def stop_soon(self) -> None:
        """End the thread once what is queued is done, without waiting for it (the
        communicator's finalizer: it may run on any thread, this one's too)."""
        self._queue.put(None)

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            self._serve_one(*item)
            # (the item held the call, which holds its communicator: kept here while the
            # thread waits for the next, it would keep a dropped communicator alive forever)
            del item

    def _serve_one(self, request: Request | None, call: Callable[[], Any]) -> None:
        result, error = None, None
        try:
            with self._lock:
                result = call()
        except BaseException as e:  # noqa: BLE001 (handed to whoever waits)
            error = e
        if request is not None:
            request._finish(result, error)
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

