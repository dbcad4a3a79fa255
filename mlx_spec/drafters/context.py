"""The DFlash family's context cache: fused keys/values of the target's committed rows, per drafter layer.

Requests that draft together in batched rounds keep their rows in one slab per full-attention layer
(engine/slab.py), as the target's plain KV rows do: the round's catch-up (every request's new
committed rows) is one scatter a layer and the batched drafter pass reads the slab as it is, where
padding and concatenating every request's whole context each round cost as much as the pass itself.
Windowed layers read only their last rows, so they are cut and padded per round instead.
"""

from __future__ import annotations

import mlx.core as mx

from ..engine.slab import RowKVCache, Slab, lendable, pad_rows, release


class DFlashState:
    """The drafter's context cache: fused K/V of committed rows only, so it never needs rollback
    during decoding; `trim` serves prefix reuse across conversation turns."""

    def __init__(self, n_layers: int):
        self.caches = [RowKVCache() for _ in range(n_layers)]

    @property
    def offset(self) -> int:
        return self.caches[0].offset

    def trim(self, n: int) -> int:
        return [c.trim(n) for c in self.caches][0]

    def kv(self, i: int):
        c = self.caches[i]
        return c.keys_and_values() if c.offset > 0 and c.keys is not None else (None, None)

    def leave_batch(self) -> None:
        """Its request stops drafting in batches: its rows take their arrays back from the slabs."""
        release(self.caches)


def write_rows(states: list[DFlashState], i: int, keys: mx.array, values: mx.array, counts: list[int]) -> None:
    """Layer i's new context rows of several requests, [B, heads, n, D], each one's first counts[b] of them:
    into the slab a row is lent to (one scatter per slab), else into the row's own arrays."""
    rows, lent = [s.caches[i] for s in states], {}
    for b, (c, n) in enumerate(zip(rows, counts)):
        if c.slab is not None:
            lent.setdefault(id(c.slab), (c.slab, []))[1].append(b)
        elif n:
            c.update_and_fetch(keys[b : b + 1, :, :n], values[b : b + 1, :, :n])
    for slab, bs in lent.values():
        pick = mx.array(bs) if len(bs) < len(rows) else slice(None)
        slab.update([rows[b] for b in bs], keys[pick], values[pick], [counts[b] for b in bs])


def batch_context(states: list[DFlashState], i: int, window: int | None):
    """Layer i's context of several requests for one batched pass: ((keys, values) [B, heads, S, D], the
    [B, 1, 1, S] mask of each one's own rows), or ((None, None), None) where none has any."""
    rows = [s.caches[i] for s in states]
    if window is None and lendable(rows):
        slab, lengths = Slab.of(rows), [c.offset for c in rows]
        n = max(lengths)
        return (slab.keys[:, :, :n], slab.values[:, :, :n]), own_rows(lengths, n)
    return padded_context([s.kv(i) for s in states], window)


def own_rows(lengths: list[int], n: int) -> mx.array:
    """[B, 1, 1, n]: which of n context rows are each request's own (the first lengths[b]; the rest padding)."""
    return (mx.arange(n)[None] < mx.array(lengths)[:, None])[:, None, None]


def last_rows(a: mx.array, n: int) -> mx.array:
    """The last n context rows of [B, heads, S, D] (none for n = 0: a window of 1 sees only the block)."""
    return a[:, :, max(0, a.shape[2] - n):]


def padded_context(kvs: list, window: int | None):
    """Requests' context keys/values [1, heads, S_i, D] ((None, None) where empty), each cut to its
    window, right-padded to the longest and stacked, with the [n, 1, 1, S] mask of each one's own rows."""
    if window is not None:
        kvs = [(last_rows(k, window - 1), last_rows(v, window - 1)) if k is not None else (k, v) for k, v in kvs]
    lengths = [0 if k is None else k.shape[2] for k, _ in kvs]
    longest = max(lengths)
    if not longest:
        return (None, None), None
    like = next(k for k, _ in kvs if k is not None)
    empty = mx.zeros(like.shape[:2] + (longest,) + like.shape[3:], like.dtype)
    keys, values = (mx.concatenate([empty if kv[j] is None else pad_rows(kv[j], longest) for kv in kvs])
                    for j in (0, 1))
    return (keys, values), own_rows(lengths, longest)
