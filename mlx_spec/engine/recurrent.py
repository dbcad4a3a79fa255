"""Recurrent and convolutional layer state (Gated DeltaNet, Mamba2, short convolutions, KDA) that rolls back exactly.

A recurrent state cannot drop its newest steps: it is one array summarizing all of them. But
mlx-lm's layers (qwen3_5, qwen3_next, nemotron_h, falcon_h1, lfm2, granitemoehybrid,
kimi_linear) write each new state as a whole new array (`cache[0] = ...`, then
`cache.advance(S)`), and MLX arrays are immutable, so keeping the state as it was before the
latest update costs one reference per slot, never a copy.

Rollback is then checkpoint + replay: `rewind(n)` puts back the state from before the latest
update of S tokens and reports S - n tokens to feed again; the prompt cache replays those
(the accepted ones) through the target. Only rounds that rejected a draft pay for it; a fully
accepted block, plain decoding and prefill never replay. (Measured against recording a state per
step during verify: see `mlx-spec doctor`'s rollback line and the README's support table.)
"""

from __future__ import annotations

from mlx_lm.models.cache import ArraysCache


class RecurrentCache(ArraysCache):
    """An ArraysCache (or MambaCache) that remembers its state from before the latest update."""

    def __init__(self, size: int):
        super().__init__(size)
        self.offset = 0  # tokens summarized by the state
        self.last_n = 0  # tokens of the latest update
        self.pending = 0  # tokens rewound but not yet replayed (see PromptCache.add)
        self._before: list | None = None  # slot values before the latest update
        self._writing = False  # inside an update: slots already saved

    @classmethod
    def like(cls, cache: ArraysCache) -> "RecurrentCache":
        return cls(len(cache.cache))

    def __setitem__(self, idx, value):
        if not self._writing:  # the first write of an update: keep what it replaces
            self._before, self._writing = list(self.cache), True
        self.cache[idx] = value

    def advance(self, N: int):
        super().advance(N)
        self.offset += N
        self.last_n, self._writing = N, False

    def rewind(self, n: int) -> int:
        """Undo the latest update and return how many of its tokens must be replayed (its first S - n)."""
        if n <= 0:
            return 0
        if self._before is None or n > self.last_n:
            raise ValueError(f"a recurrent state can only rewind within its latest update ({self.last_n} tokens)")
        self.cache, self._before = self._before, None
        self.offset -= self.last_n
        self.pending, self.last_n = self.last_n - n, 0
        return self.pending

    def max_trim(self) -> int:
        return 0  # further back than the latest update: only from a checkpoint (PromptCache)

    def is_trimmable(self) -> bool:
        return True  # within the latest update, by replay

    def snapshot(self):
        return list(self.cache), self.offset

    def restore(self, snap) -> None:
        cache, self.offset = snap
        self.cache = list(cache)
        self._before, self.last_n, self.pending, self._writing = None, 0, 0, False

    def trim(self, n: int) -> int:
        raise TypeError("a recurrent state rolls back with rewind + replay (engine.cache.trim), not trim")
