"""Idle conversation caches, reused by the next request that shares their prefix.

A cache is either idle here or owned by exactly one active request, never both:
`acquire` takes it out, `release` puts it back. Worker thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCachePool:
    def __init__(self, make: Callable[[], object], capacity: int):
        self.make, self.capacity = make, capacity
        self.idle: OrderedDict[int, object] = OrderedDict()  # least recently used first

    def acquire(self, ids: list[int]):
        """The idle cache sharing the longest prefix with `ids`; else a fresh one (recycling the oldest)."""
        best, best_n = None, 0
        for key, pc in self.idle.items():
            n = common_prefix(pc.tokens, ids)
            if n >= best_n and n > 0:  # ties go to the most recently used
                best, best_n = key, n
        if best is None and self.idle and len(self.idle) >= self.capacity:
            best = next(iter(self.idle))  # the library trims it to the (empty) common prefix
        return self.idle.pop(best) if best is not None else self.make()

    def release(self, pc) -> None:
        if self.capacity == 0:
            return
        self.idle[id(pc)] = pc
        while len(self.idle) > self.capacity:
            self.idle.popitem(last=False)

    def clear(self) -> None:
        self.idle.clear()
