"""The group of ranks one run spans: start-up agreement, small shared values, and failing clearly.

A peer that dies closes its sockets: MLX's ring backend then raises ("connection to a peer was
lost"), which `guard` turns into one error line. A peer that stalls (a frozen process, a network
that drops packets without closing) would block the ring forever: the watchdog ends this process
with a clear message when a round makes no progress for `timeout` seconds.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx

from ..errors import MlxSpecError

EXIT_STALLED = 3


class DistributedError(MlxSpecError):
    pass


def from_root(x: mx.array | None, shape, dtype, group) -> mx.array:
    """Rank 0's array `x` on every rank (the others pass None), handed along 0 -> 1 -> ... -> N-1.

    Point-to-point sends, not an all_sum to which the others add zeros: on the ring backend an
    all_sum of a round's logits cost several times a send of the same bytes (two pinned local ranks:
    0.26-1.7 ms against 0.04-0.2 ms for 16-128 KB; unpinned on a loaded machine up to 30 ms against
    0.2 ms), and the values arrive bitwise as rank 0 computed them either way."""
    rank, size = group.rank(), group.size()
    got = x if rank == 0 else mx.distributed.recv(shape, dtype, rank - 1, group=group)
    # Started now, on every rank: messages then go out and come in in program order on every rank,
    # whether or not (and whenever) the caller reads the value (a prefill chunk's logits, say).
    if rank + 1 == size:
        mx.async_eval(got)
        return got
    sent = mx.distributed.send(got, rank + 1, group=group)
    mx.async_eval(sent)
    # A reader waits for the send too: a send to a dead rank then fails right there, where `guard`
    # names it, instead of the ring giving up on its pending work and a later receive never returning.
    return mx.depends(got, sent)


@dataclass
class DistributedConfig:
    backend: str = "ring"
    timeout: float = 30.0  # seconds a round may wait on the other ranks before this rank gives up
    split: tuple[int, ...] = ()  # decoder layers per rank (rank 0 runs the last ones); () = even


class Session:
    def __init__(self, config: DistributedConfig | None = None):
        self.config = config or DistributedConfig()
        try:
            self.group = mx.distributed.init(strict=True, backend=self.config.backend)
        except (RuntimeError, ValueError) as e:
            raise DistributedError(f"--distributed needs ranks started by mlx.launch (e.g. `mlx.launch --backend "
                                   f"{self.config.backend} -n 2 -- mlx-spec generate --distributed ...`): {e}") from None
        self.rank, self.size = self.group.rank(), self.group.size()
        self.comm_seconds = 0.0  # measured by `timed` (bench)
        self._deadline: float | None = None
        self._what = ""
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True, name="mlx-spec-watchdog").start()

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ shared values

    def share_ints(self, values: list[int] | None, n: int) -> list[int]:
        """Rank 0's n ints, on every rank (the others pass None)."""
        buf = mx.array(values, mx.int32) if self.is_root else None
        if buf is not None and buf.shape != (n,):
            raise DistributedError(f"expected {n} values to share, got {buf.shape[0]}")
        return from_root(buf, (n,), mx.int32, self.group).tolist()

    def seed(self) -> int:
        """A random seed drawn on rank 0, the same on every rank (for requests that give none)."""
        return self.share_ints([int.from_bytes(os.urandom(3), "little")] if self.is_root else None, 1)[0]

    def check_same(self, what: str, text: str) -> None:
        """Every rank must hold the same `text` (a description of weights or versions) as rank 0."""
        digest = mx.array(list(hashlib.sha256(text.encode()).digest()), mx.uint8)
        every = mx.distributed.all_gather(digest[None], group=self.group).tolist()
        odd = [r for r, d in enumerate(every) if d != every[0]]
        if odd:
            raise DistributedError(f"rank{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} "
                                   f"{'hold' if len(odd) > 1 else 'holds'} different {what} than rank 0"
                                   f" (this is rank {self.rank}: {text[:200]})")

    def barrier(self) -> None:
        mx.eval(mx.distributed.all_sum(mx.array(1, mx.int32), group=self.group))

    # ------------------------------------------------------------------ failing clearly

    @contextmanager
    def guard(self, what: str, watch: bool = True):
        """Run collective work: a lost peer becomes a DistributedError; a stall ends the process
        (unless `watch` is False: waiting for work, which may rightly take any time)."""
        if watch:
            self.progress(what)
        try:
            yield self
        except RuntimeError as e:
            if "[ring]" in str(e) or "peer" in str(e):
                raise DistributedError(f"rank {self.rank}: lost the connection to another rank during {what} "
                                       f"(did a rank die?): {e}") from None
            raise
        finally:
            with self._lock:
                self._deadline = None

    def progress(self, what: str | None = None) -> None:
        """A round finished (or work starts): the watchdog waits `timeout` seconds more."""
        with self._lock:
            self._deadline = time.monotonic() + self.config.timeout
            self._what = what or self._what

    def _watch(self) -> None:
        while True:
            time.sleep(0.25)
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
            if late:
                print(f"error: rank {self.rank}: no progress from the other ranks for {self.config.timeout:g} s "
                      f"during {self._what} (a rank stopped or the network stalls); exiting", file=sys.stderr,
                      flush=True)
                os._exit(EXIT_STALLED)
