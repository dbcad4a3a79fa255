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
    """One conversation's state: target cache, drafter state and the tokens they hold.

    A follow-up turn trims both back to the common prefix and prefills only the rest.
    """

    def __init__(self, model, drafter=None):
        self.model = model
        self.target = make_cache(model)
        self.drafter = drafter.make_state() if drafter is not None else None
        self.tokens: list[int] = []  # tokens whose K/V are in `target`
        self.reused = 0  # prompt tokens the last `reuse` found already cached

    def reuse(self, prompt: list[int]) -> int:
        """Trim to the longest common prefix with `prompt` (keeping >= 1 token to prefill); returns it."""
        n = 0
        limit = min(len(self.tokens), len(prompt) - 1)
        while n < limit and self.tokens[n] == prompt[n]:
            n += 1
        drop = len(self.tokens) - n
        if drop:
            trim(self.target, drop)
            if self.drafter is not None:
                self.drafter.trim(max(0, self.drafter.offset - n))
            del self.tokens[n:]
        self.reused = n
        return n


def eval_state(pc: PromptCache) -> None:
    mx.eval([c.state for c in pc.target])
