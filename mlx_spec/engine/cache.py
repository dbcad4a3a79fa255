"""Caches that can roll back: rollback is `trim(n)` on each cache type, never loop code."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import CacheList, ConcatenateKVCache, KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

from ..errors import MlxSpecError
from .rotating import SpecRotatingKVCache


def spec_caches(caches: list, slack: int = 0) -> list:
    """mlx-lm's caches with sliding windows swapped for ones that trim exactly after they wrap."""
    def swap(c):
        if type(c) is RotatingKVCache and c.keep == 0:
            return SpecRotatingKVCache.like(c, slack)
        if isinstance(c, CacheList):
            return CacheList(*(swap(x) for x in c.caches))
        return c

    return [swap(c) for c in caches]


UNBOUNDED = 1 << 60  # a plain KV cache can go back to any earlier token


def max_trim(c) -> int:
    """How many of its newest rows a cache can drop and be exactly as it was (a cache type's capability)."""
    own = getattr(c, "max_trim", None)
    if own is not None:
        return own()
    if isinstance(c, CacheList):
        return min(max_trim(x) for x in c.caches)
    if type(c) in (KVCache, QuantizedKVCache, ConcatenateKVCache):
        return UNBOUNDED
    return 0


def make_cache(model) -> list:
    """The target's prompt cache, with every layer's cache able to roll back."""
    caches = spec_caches(make_prompt_cache(model))
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

    def reset(self) -> None:
        """Forget everything: a fresh target cache and drafter state."""
        self.cache = make_cache(self.model)
        self.tokens = []
        self._state = self._drafter.make_state() if self._drafter is not None else None
        self._pending, self._pending_rows = [], 0

    def max_trim(self) -> int:
        """Tokens the target's cache can give back exactly (a sliding window keeps only a few spare rows)."""
        return min((max_trim(c) for c in self.cache), default=UNBOUNDED)

    def truncate(self, n: int) -> None:
        """Keep the first n tokens, in the target's cache and the drafter's state alike."""
        drop = len(self.tokens) - n
        if drop <= 0:
            return
        if drop > self.max_trim():
            raise MlxSpecError(f"cannot roll the cache back {drop} tokens exactly (at most {self.max_trim()})")
        trim(self.cache, drop)
        if self._drafter is not None:
            state = self.drafter_state()
            state.trim(max(0, state.offset - n))
        del self.tokens[n:]

    def reuse(self, prompt: list[int]) -> int:
        """Truncate to the longest common prefix with `prompt` (keeping >= 1 token to prefill); returns
        the tokens really reused. What the caches cannot give back exactly is not reused: then the
        cache starts afresh and the whole prompt is prefilled."""
        n = 0
        limit = min(len(self.tokens), len(prompt) - 1)
        while n < limit and self.tokens[n] == prompt[n]:
            n += 1
        if len(self.tokens) - n > self.max_trim():
            self.reset()
            n = 0
        self.truncate(n)
        self.reused = n
        return n


def eval_state(pc: PromptCache) -> None:
    mx.eval([c.state for c in pc.cache])
