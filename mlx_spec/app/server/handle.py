"""The HTTP side of one request: submit it to the scheduler, receive its outputs, cancel it when the client goes."""

from __future__ import annotations

import asyncio

from .scheduler import Scheduler
from .sequence import Job, Output, Sequence


class ClientGone(Exception):
    pass


class Handle:
    def __init__(self, scheduler: Scheduler, job: Job, timeout: float, receive):
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Output] = asyncio.Queue()
        self.seq = Sequence(job, lambda out: _put(loop, self.queue, out), timeout)
        scheduler.submit(self.seq)  # raises 429/503 before any response starts
        # Watch the connection itself, so a vanished client frees its slot even if nobody reads the stream.
        self.watcher = asyncio.ensure_future(_disconnected(receive))
        self.watcher.add_done_callback(lambda _: self.seq.cancel())
        self._get: asyncio.Future | None = None

    async def next(self, timeout: float | None = None) -> Output | None:
        """The next output, or None when none came within `timeout`; raises ClientGone."""
        if self._get is None:
            self._get = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({self._get, self.watcher}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if self._get in done:
            out, self._get = self._get.result(), None
            return out
        if self.watcher in done:
            raise ClientGone
        return None

    def close(self) -> None:
        self.seq.cancel()  # no effect once the request has finished
        for task in (self._get, self.watcher):
            if task is not None:
                task.cancel()


def _put(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, out: Output) -> None:
    try:
        loop.call_soon_threadsafe(queue.put_nowait, out)
    except RuntimeError:  # the event loop is gone (shutdown): nobody is waiting
        pass


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
