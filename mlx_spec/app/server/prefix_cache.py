"""Idle conversation caches, reused by the next request that shares their prefix, within its partition.

A cache is either idle here or owned by exactly one active request, never both:
`acquire` takes it out, `release` puts it back. Worker thread only.

Partitions keep clients apart: a request only ever reuses caches of its own partition (its API
key, and within it the client's `prompt_cache_key` or `user`). Across partitions, reuse would
report the shared prefix in `usage.prompt_tokens_details.cached_tokens` (and answer faster), so
one client could confirm another's system prompt token by token. Without API keys every client
shares the empty key: on a keyless loopback server all clients are the same local user.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable


class PrefixCachePool:
    def __init__(self, make: Callable[[], object], capacity: int):
        self.make, self.capacity = make, capacity
        self.idle: OrderedDict[int, tuple[tuple, object]] = OrderedDict()  # least recently used first

    def acquire(self, ids: list[int], partition: tuple = ()):
        """This partition's idle cache sharing the longest prefix with `ids`; else a fresh one."""
        best, best_n, oldest = None, 0, None
        for key, (part, pc) in self.idle.items():
            if part != partition:
                continue
            oldest = key if oldest is None else oldest
            n = pc.common_prefix(ids)
            if n >= best_n and n > 0:  # ties go to the most recently used
                best, best_n = key, n
        if best is None and len(self.idle) >= self.capacity:
            if oldest is not None:
                best = oldest  # the library trims it to the (empty) common prefix
            elif self.idle:
                self.idle.popitem(last=False)  # another partition's: dropped, never handed over
        return self.idle.pop(best)[1] if best is not None else self.make()

    def release(self, pc, partition: tuple = ()) -> None:
        if self.capacity == 0:
            return
        self.idle[id(pc)] = (partition, pc)
        while len(self.idle) > self.capacity:
            self.idle.popitem(last=False)

    def clear(self) -> None:
        self.idle.clear()
