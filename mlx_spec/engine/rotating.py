"""A sliding-window KV cache that knows how far back it can be trimmed exactly.

mlx-lm's RotatingKVCache overwrites the oldest row in place once the window is full, so after
it wraps a trim cannot bring back what was overwritten (mlx-lm then reports it as not
trimmable). This cache never overwrites: every update drops the rows that no query can see any
more and appends the new ones, so the buffer is always in time order and holds

    window - 1 + slack + S rows  after an update of S rows (fewer before the window fills).

Dropping the newest n rows is exact while the window - 1 rows before the new last token stay:
`max_trim` says how many that is. `slack` keeps extra rows for callers that rewind several
one-token updates (a draft model rewinding its drafts); the target's verify pass writes the
whole block in one update, so it needs none.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import RotatingKVCache


class SpecRotatingKVCache(RotatingKVCache):
    def __init__(self, max_size: int, keep: int = 0, slack: int = 0):
        if keep:
            raise ValueError("SpecRotatingKVCache keeps no leading rows (keep=0)")
        super().__init__(max_size=max_size, keep=0)
        self.slack = slack

    @classmethod
    def like(cls, cache: RotatingKVCache, slack: int = 0) -> "SpecRotatingKVCache":
        return cls(max_size=cache.max_size, slack=slack)

    @property
    def rows(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def _kept(self) -> int:
        """Rows the next update keeps before appending: enough for every query's window, plus slack."""
        return min(self.rows, self.max_size - 1 + self.slack)

    def update_and_fetch(self, keys, values):
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            drop = self.rows - self._kept()
            self.keys = mx.concatenate([self.keys[..., drop:, :], keys], axis=2)
            self.values = mx.concatenate([self.values[..., drop:, :], values], axis=2)
        self.offset += keys.shape[2]
        self._idx = self.rows  # kept equal to the buffer length: mlx-lm's helpers see a time-ordered ring
        return self.keys, self.values

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False, **_):
        """Query i (at buffer row kept + i) sees the rows of the last `window` positions up to itself."""
        window = window_size or self.max_size
        kept = self._kept()
        if kept + N <= window and not return_array:
            return None if N == 1 else "causal"
        return create_causal_mask(N, kept, window_size=window)

    def max_trim(self) -> int:
        """The most newest rows `trim` can drop and leave the cache exactly as it was back then."""
        if self.rows >= self.offset:  # nothing dropped yet
            return self.offset
        return max(0, self.rows - (self.max_size - 1))

    def is_trimmable(self) -> bool:
        return True  # within max_trim

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        if n == 0 or self.keys is None:
            return 0
        if n > self.max_trim():
            raise ValueError(f"trimming {n} rows of a sliding window that keeps only {self.max_trim()} spare rows")
        self.keys, self.values = self.keys[..., : self.rows - n, :], self.values[..., : self.rows - n, :]
        self.offset -= n
        self._idx = self.rows
        return n

    def snapshot(self):
        """The state now, by reference: updates and trims build new arrays, so it stays valid."""
        return self.keys, self.values, self.offset

    def restore(self, snap) -> None:
        self.keys, self.values, self.offset = snap
        self._idx = self.rows
