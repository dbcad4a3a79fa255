"""Several requests' caches seen as one batch, so one target pass verifies every block.

Each request keeps its own per-layer KVCache. For a batched pass, a `BatchView` per layer
hands the model per-row offsets (for RoPE), writes each row's new keys/values into that
row's own cache, and returns them right-padded to a common length with a mask that hides
the padding and keeps the block causal. Rows never mix, so a batched request decodes
exactly as it would alone.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache


class BatchView:
    def __init__(self, caches: list[KVCache]):
        self.caches = caches
        self.lengths = [c.offset for c in caches]
        self.offset = mx.array(self.lengths)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        rows = [c.update_and_fetch(keys[i : i + 1], values[i : i + 1]) for i, c in enumerate(self.caches)]
        width = max(k.shape[2] for k, _ in rows)

        def pad(a):
            return mx.pad(a, [(0, 0), (0, 0), (0, width - a.shape[2]), (0, 0)]) if a.shape[2] < width else a

        return mx.concatenate([pad(k) for k, _ in rows]), mx.concatenate([pad(v) for _, v in rows])

    def make_mask(self, n: int, **_) -> mx.array:
        """[B, 1, n, L]: query q of row b sees keys 0 .. lengths[b] + q."""
        keys = mx.arange(max(self.lengths) + n)[None, None, :]
        last = self.offset[:, None, None] + mx.arange(n)[None, :, None]
        return (keys <= last)[:, None]


def can_batch(cache_lists: list[list]) -> bool:
    """Plain KV caches batch this way; sliding-window and other caches verify one request at a time."""
    return all(type(c) is KVCache for caches in cache_lists for c in caches)


def batch_caches(cache_lists: list[list]) -> list[BatchView]:
    return [BatchView(list(layer)) for layer in zip(*cache_lists)]
