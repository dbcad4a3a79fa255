"""One background thread runs every MLX call; the main thread waits, prints and takes Ctrl-C.

Ctrl-C therefore never lands inside the model or half-way through a cache update: a stream
is stopped between verify rounds, where the prompt cache is consistent, and the conversation
can go on from the partial reply.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from typing import Callable, Iterator

STOPPING = object()  # yielded by Stream once when a stop takes a while (a long prefill)
TICK = object()  # yielded by a producer between chunks of work; never reaches the consumer
_POLL_S = 0.1


class Worker:
    def __init__(self):
        self._jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="mlx-spec-chat-worker", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._jobs.get()()

    def call(self, fn: Callable, *args, **kwargs):
        """Run fn on the worker and return its result or raise its exception."""
        done: queue.Queue = queue.Queue(maxsize=1)

        def job():
            try:
                done.put((True, fn(*args, **kwargs)))
            except BaseException as e:  # re-raised in the caller's thread
                done.put((False, e))

        self._jobs.put(job)
        ok, value = _wait(done)
        if ok:
            return value
        raise value

    def stream(self, make_iter: Callable[[], Iterator]) -> "Stream":
        """Iterate make_iter() on the worker: `with worker.stream(f) as s: for item in s: ...`."""
        return Stream(self._jobs, make_iter)


class Stream:
    """Items from the worker. Inside the `with`, Ctrl-C asks the worker to stop after the current
    round; a second Ctrl-C raises KeyboardInterrupt (the caller then quits). Leaving the `with`
    early stops the worker too."""

    def __init__(self, jobs: queue.Queue, make_iter: Callable[[], Iterator]):
        self._jobs, self._make_iter = jobs, make_iter
        self.events: queue.Queue = queue.Queue()
        self.cancel = threading.Event()
        self.finished = False  # the iterator ran to its end without being stopped
        self._old_handler = None

    def __enter__(self) -> "Stream":
        # The handler goes in before the job starts, so no Ctrl-C can fall between the two.
        try:
            self._old_handler = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread (the chat driven in-process): no Ctrl-C to catch
            pass
        self._jobs.put(self._produce)
        return self

    def __exit__(self, *exc) -> None:
        self.cancel.set()  # a no-op once the iterator is done
        if self._old_handler is not None:
            signal.signal(signal.SIGINT, self._old_handler)

    def _on_sigint(self, signum, frame) -> None:
        if self.cancel.is_set():
            raise KeyboardInterrupt
        self.cancel.set()

    @property
    def stopped(self) -> bool:
        return self.cancel.is_set() and not self.finished

    def _produce(self) -> None:
        try:
            it = self._make_iter()
            for item in it:
                if item is not TICK:  # TICK: progress inside a long step, only a chance to stop
                    self.events.put(("item", item))
                if self.cancel.is_set():
                    break
            else:
                self.finished = True
            getattr(it, "close", lambda: None)()
            self.events.put(("done", None))
        except BaseException as e:
            self.events.put(("error", e))

    def __iter__(self):
        asked, told = None, False
        while True:
            try:
                kind, value = self.events.get(timeout=_POLL_S)
            except queue.Empty:
                if self.cancel.is_set():
                    asked = asked or time.monotonic()
                    if not told and time.monotonic() - asked > 0.5:
                        told = True
                        yield STOPPING
                continue
            if kind == "item":
                yield value
            elif kind == "done":
                return
            else:
                raise value


def _wait(q: queue.Queue):
    # A timed get, so Ctrl-C reaches the main thread promptly on every platform.
    while True:
        try:
            return q.get(timeout=_POLL_S)
        except queue.Empty:
            pass
