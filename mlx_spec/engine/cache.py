"""Caches that can roll back: rollback is `trim(n)` on each cache type, never loop code."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from ..errors import MlxSpecError


class SpecRotatingKVCache(RotatingKVCache):
    """A sliding-window cache that can be trimmed after it wraps.

    Updates always go through the concatenating path, which keeps the buffer in time
    order with window-1+S rows; dropping the last n rows is then exact.
    """

    @classmethod
    def like(cls, cache: RotatingKVCache) -> "SpecRotatingKVCache":
        return cls(max_size=cache.max_size, keep=cache.keep)

    def update_and_fetch(self, keys, values):
        return self._update_concat(keys, values)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        if n == 0 or self.keys is None:
            return 0
        self.keys = self._temporal_order(self.keys)[..., : -n, :]
        self.values = self._temporal_order(self.values)[..., : -n, :]
        self.offset -= n
        self._idx = self.keys.shape[2]
        return n


def make_cache(model) -> list:
    """The target's prompt cache, with every layer's cache able to roll back."""
    caches = make_prompt_cache(model)
    caches = [SpecRotatingKVCache.like(c) if type(c) is RotatingKVCache else c for c in caches]
    bad = {type(c).__name__ for c in caches if not c.is_trimmable()}
    if bad:
        raise MlxSpecError(f"speculative decoding needs caches that can roll back; {', '.join(sorted(bad))} cannot")
    return caches


def trim(caches: list, n: int) -> None:
    for c in caches:
        c.trim(n)


class PromptCache:
    """One conversation's state: the target's cache, the drafter's state and the tokens they hold.

    Rows reach the drafter lazily: committed rows wait until the drafter next drafts, then go in
    one batched update (and while speculation is off, only every FLUSH_ROWS rows). A follow-up turn
    truncates both to the common prefix and prefills only the rest.
    """

    FLUSH_ROWS = 256  # bounds the hidden states held for the drafter

    def __init__(self, model, drafter=None):
        self.model = model
        self.cache = make_cache(model)  # the target's per-layer caches
        self.tokens: list[int] = []  # tokens whose rows are in `cache`
        self.reused = 0  # prompt tokens the last `reuse` found already cached
        self._drafter = drafter
        self._state = drafter.make_state() if drafter is not None else None
        self._pending: list[tuple[mx.array | None, list[int]]] = []  # rows the drafter has not seen
        self._pending_rows = 0

    def add(self, tokens: list[int], hidden: mx.array | None) -> None:
        """Rows just written to the target cache, with their tapped hidden states [1, n, taps*H] (or None)."""
        self.tokens += tokens
        if self._drafter is None:
            return
        self._pending.append((hidden, list(tokens)))
        self._pending_rows += len(tokens)
        if self._pending_rows >= self.FLUSH_ROWS:
            self.drafter_state()

    def drafter_state(self):
        """The drafter's state, caught up with every committed row."""
        if self._pending:
            hidden = [h for h, _ in self._pending]
            hidden = None if hidden[0] is None else mx.concatenate(hidden, axis=1)
            self._drafter.observe(self._state, hidden, [t for _, ts in self._pending for t in ts])
            self._pending, self._pending_rows = [], 0
        return self._state

    def truncate(self, n: int) -> None:
        """Keep the first n tokens, in the target's cache and the drafter's state alike."""
        drop = len(self.tokens) - n
        if drop <= 0:
            return
        trim(self.cache, drop)
        if self._drafter is not None:
            state = self.drafter_state()
            state.trim(max(0, state.offset - n))
        del self.tokens[n:]

    def reuse(self, prompt: list[int]) -> int:
        """Truncate to the longest common prefix with `prompt` (keeping >= 1 token to prefill); returns it."""
        n = 0
        limit = min(len(self.tokens), len(prompt) - 1)
        while n < limit and self.tokens[n] == prompt[n]:
            n += 1
        self.truncate(n)
        self.reused = n
        return n


def eval_state(pc: PromptCache) -> None:
    mx.eval([c.state for c in pc.cache])
