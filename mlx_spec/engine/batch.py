"""Several requests' caches seen as one batch, so one target pass verifies every block.

Each request keeps its own per-layer caches. For a batched pass, one view per layer hands the
model a batch made of those rows and writes each row's update back into that row's own cache:

- `SlabView` (RowKVCache, our plain KV): the rows stay in one slab while the same requests batch,
  and a round writes each row's new keys/values at its own offset in place (engine/slab.py);
- `BatchView` (plain KV otherwise; `QuantizedView` for QuantizedKVCache, whose packed parts pad alike):
  per-row offsets (for RoPE); each row's new keys/values go into its own cache and come back
  right-padded to a common length, with a mask that hides the padding and keeps the block causal;
- `WindowView` (SpecRotatingKVCache): the same, with each row's window in the mask (rows keep
  different numbers of old rows, so each query's window starts at its own buffer row);
- `StateView` (RecurrentCache: Gated DeltaNet, Mamba2, conv, KDA states): the rows' states stacked
  into one batch; the layer's new state is split back into the rows. The whole padded block runs
  through every row's state; what came after a row's own last token (padding, rejected drafts)
  is rolled back per row, by that row's accepted length (rewind + replay, see recurrent.py).

Rows never mix, so a batched request decodes exactly as it would alone. Rewound rows then replay
their accepted tokens together, one batched pass per replay length (`replay`), never padded:
padding would run through a state that is kept.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import CacheList, KVCache, QuantizedKVCache

from .recurrent import RecurrentCache
from .rollback import leaves
from .rotating import SpecRotatingKVCache
from .slab import RowKVCache, Slab, lendable, pad_rows


class BatchView:
    def __init__(self, caches: list):
        self.caches = caches
        self.lengths = [c.offset for c in caches]
        self.offset = mx.array(self.lengths)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        rows = [c.update_and_fetch(keys[i : i + 1], values[i : i + 1]) for i, c in enumerate(self.caches)]
        # kept as attributes: deepseek_v32's indexer reads `cache.keys` after an update and reassigns both
        # (graph bookkeeping only; each row's own cache keeps its arrays, evaluated every round)
        self.keys, self.values = _stack([k for k, _ in rows]), _stack([v for _, v in rows])
        return self.keys, self.values

    def _mask(self, starts: list[int], n: int, window: int | None) -> mx.array:
        """[B, 1, n, L]: query q of row b sits at buffer row starts[b] + q and sees the rows up to it
        (and, with a window, only the last `window` of them)."""
        keys = mx.arange(max(starts) + n)[None, None, :]
        last = mx.array(starts)[:, None, None] + mx.arange(n)[None, :, None]
        mask = keys <= last
        if window:
            mask = mask & (keys > last - window)
        return mask[:, None]

    def make_mask(self, n: int, window_size: int | None = None, **_) -> mx.array:
        return self._mask(self.lengths, n, window_size)


def _stack(rows: list):
    """Rows [1, H, L_b, D] right-padded to the longest and stacked; quantized rows are (packed, scales,
    biases) tuples, each part padded alike (the mask hides the padding whatever it dequantizes to)."""
    if isinstance(rows[0], tuple):
        return tuple(_stack(list(part)) for part in zip(*rows))
    width = max(a.shape[2] for a in rows)
    return mx.concatenate([pad_rows(a, width) for a in rows])


class SlabView(BatchView):
    """RowKVCache rows: one slab holds them while the same requests batch, written in place (engine/slab.py)."""

    def __init__(self, caches: list[RowKVCache]):
        super().__init__(caches)
        self.slab = Slab.of(caches)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        # (each row's own offset, as a row cache would write: right after whatever it holds now)
        self.keys, self.values = self.slab.write([c.offset for c in self.caches], keys, values)
        return self.keys, self.values


class QuantizedView(BatchView):
    """QuantizedKVCache rows: mlx-lm's attention picks its quantized SDPA by `bits`/`group_size`."""

    def __init__(self, caches: list[QuantizedKVCache]):
        super().__init__(caches)
        self.bits, self.group_size = caches[0].bits, caches[0].group_size


class WindowView(BatchView):
    def __init__(self, caches: list[SpecRotatingKVCache]):
        super().__init__(caches)
        self.kept = [c._kept() for c in caches]  # buffer rows before each row's new ones, after the update
        self.window = caches[0].max_size

    def make_mask(self, n: int, window_size: int | None = None, **_) -> mx.array:
        return self._mask(self.kept, n, window_size or self.window)


class StateView:
    """The rows' RecurrentCaches as one ArraysCache-like batch, as mlx-lm's recurrent layers use it:
    `cache[i]` reads, `cache[i] = ...` writes, `advance(S)`, `lengths`, `make_mask`."""

    lengths = None  # every row runs the whole block: what follows a row's own tokens is rolled back

    def __init__(self, caches: list[RecurrentCache]):
        self.caches = caches

    def __getitem__(self, i):
        rows = [c[i] for c in self.caches]
        like = next((r for r in rows if r is not None), None)
        if like is None:
            return None
        # a row without state yet starts from zeros, as the layer itself would start it
        return mx.concatenate([mx.zeros_like(like) if r is None else r for r in rows])

    def __setitem__(self, i, value):
        for b, c in enumerate(self.caches):
            c[i] = value[b : b + 1]

    def advance(self, n: int) -> None:
        for c in self.caches:
            c.advance(n)

    def make_mask(self, n: int):
        return None  # no padding inside a row's own tokens: the padded tail only follows them

    def __bool__(self):  # some layers test `if cache:`
        return True


def _view(layer: list):
    first = layer[0]
    if isinstance(first, CacheList):
        return CacheList(*(_view(list(sub)) for sub in zip(*(c.caches for c in layer))))
    if isinstance(first, RecurrentCache):
        return StateView(layer)
    if isinstance(first, SpecRotatingKVCache):
        return WindowView(layer)
    if isinstance(first, QuantizedKVCache):
        return QuantizedView(layer)
    if lendable(layer):
        return SlabView(layer)
    return BatchView(layer)


BATCHABLE = (KVCache, RowKVCache, QuantizedKVCache, SpecRotatingKVCache, RecurrentCache)


def _kind(c):
    return type(c), getattr(c, "bits", None), getattr(c, "group_size", None)


def can_batch(cache_lists: list[list]) -> bool:
    """Plain KV, quantized KV, sliding-window and recurrent caches (also inside CacheLists) batch when every
    request's layer has the same kind (quantized ones the same bits and group size); anything else
    verifies one request at a time."""
    layers = list(zip(*(leaves(caches) for caches in cache_lists)))
    return all(type(c) in BATCHABLE and _kind(c) == _kind(layer[0]) for layer in layers for c in layer)


def batch_caches(cache_lists: list[list]) -> list:
    return [_view(list(layer)) for layer in zip(*cache_lists)]


def replay(pcs: list) -> None:
    """Feed the rewound recurrent states of several requests their accepted tokens again (PromptCache
    defers them in a batched round): requests replaying as many tokens share one unpadded pass."""
    groups: dict[int, list] = {}
    for pc in pcs:
        if pc.deferred:
            groups.setdefault(len(pc.deferred), []).append(pc)
    from .cache import replay as replay_group

    for group in groups.values():
        replay_group(group, [pc.deferred for pc in group])
        for pc in group:
            pc.deferred = None
