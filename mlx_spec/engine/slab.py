"""Plain KV rows that batch without copying.

Stacking every request's keys and values into a batch each round copied the whole cache of every
row in every layer, in ~60 small ops a layer: at 8 requests of ~450 tokens it was two thirds of a
one-token round on the CPU. So while the same requests verify together round after round, their rows
live in one [B, H, capacity, D] `Slab` per layer, and a round writes its new rows with one scatter a layer.

A `RowKVCache` is mlx-lm's KVCache whose arrays may be lent to a slab: reading or writing them
(a pass of its request alone, a snapshot, saving) first takes them back, so code that sees one
request sees a plain KVCache. Its `offset` stays its own: trimming a lent row is free.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache


class _Lent:
    """An array of a row whose arrays a slab may hold: reading or writing it takes them back first."""

    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, row, owner=None):
        if row is None:
            return self
        if row.slab is not None:
            row.reclaim()
        return getattr(row, self.name)

    def __set__(self, row, value):
        if row.slab is not None:
            row.reclaim()
        setattr(row, self.name, value)


class RowKVCache(KVCache):
    keys, values = _Lent(), _Lent()
    _keys = _values = None
    slab: "Slab | None" = None  # where this row's arrays are while lent
    row = 0

    def reclaim(self) -> None:
        """Take this row's arrays back from its slab (copied out: a view would keep the slab alive)."""
        slab, self.slab = self.slab, None
        self._keys, self._values = slab.take(self.row, self.offset)


def _copy(a: mx.array) -> mx.array:
    return mx.contiguous(a) if a.shape[2] else a


class Slab:
    """The rows of one layer for a fixed list of requests, in one array each for keys and values."""

    step = KVCache.step

    def __init__(self, rows: list[RowKVCache]):
        # (read before lending: a row's old slab may be another's)
        self.keys, self.values = gather(rows, self._round(max(c.offset for c in rows) + 1))
        self.rows: list[RowKVCache | None] = list(rows)
        old = {id(c.slab): c.slab for c in rows if c.slab is not None}
        for b, c in enumerate(rows):
            if c.slab is not None:
                c.slab.rows[c.row] = None
            c.slab, c.row, c._keys, c._values = self, b, None, None
        for slab in old.values():  # their batch has ended: rows not in this one take their arrays back
            slab.release()

    @classmethod
    def of(cls, rows: list[RowKVCache]) -> "Slab":
        """The slab holding exactly these rows in this order, else a new one (rows leave their old slabs)."""
        slab = rows[0].slab
        if slab is not None and len(slab.rows) == len(rows) and all(a is b for a, b in zip(slab.rows, rows)):
            return slab
        return cls(rows)

    def _round(self, n: int) -> int:
        return -(-n // self.step) * self.step

    def take(self, b: int, n: int) -> tuple[mx.array, mx.array]:
        self.rows[b] = None  # this slab no longer speaks for the row
        return _copy(self.keys[b : b + 1, :, :n]), _copy(self.values[b : b + 1, :, :n])

    def write(self, starts: list[int], keys: mx.array, values: mx.array,
              counts: list[int] | None = None) -> tuple[mx.array, mx.array]:
        """Row b's new keys/values [B, H, n, D] at its own offset starts[b] (its first counts[b] of them, the
        rest padding past its offset; default all n); returns every row up to the longest (the mask hides
        the rest)."""
        n, end = keys.shape[2], max(starts) + keys.shape[2]
        if end > self.keys.shape[2]:
            grow = self._round(end) - self.keys.shape[2]
            self.keys = pad_rows(self.keys, self.keys.shape[2] + grow)
            self.values = pad_rows(self.values, self.values.shape[2] + grow)
        at = (mx.array(starts)[:, None] + mx.arange(n)[None])[:, None, :, None]
        self.keys = mx.put_along_axis(self.keys, mx.broadcast_to(at, keys.shape), keys, axis=2)
        self.values = mx.put_along_axis(self.values, mx.broadcast_to(at, values.shape), values, axis=2)
        for b, c in enumerate(self.rows):
            if c is not None:
                c.offset += n if counts is None else counts[b]
        return self.keys[:, :, :end], self.values[:, :, :end]

    def update(self, rows: list[RowKVCache], keys: mx.array, values: mx.array, counts: list[int]) -> None:
        """New keys/values [len(rows), H, n, D] for some of this slab's rows, each its first counts[r] of them;
        the slab's other rows get padding past their offsets, which they never read."""
        if len(rows) == len(self.rows) and all(a is b for a, b in zip(rows, self.rows)):
            self.write([c.offset for c in rows], keys, values, counts)
            return
        at = {id(c): r for r, c in enumerate(rows)}
        pick = mx.array([at.get(id(c), len(rows)) for c in self.rows])  # (len(rows): a row of zeros)
        keys, values = (mx.concatenate([a, mx.zeros((1,) + a.shape[1:], a.dtype)])[pick] for a in (keys, values))
        self.write([c.offset if c is not None else 0 for c in self.rows], keys, values,
                   [counts[at[id(c)]] if id(c) in at else 0 for c in self.rows])

    def release(self) -> None:
        """Hand every row still here its arrays back (the batch is over)."""
        for c in self.rows:
            if c is not None and c.slab is self:
                c.reclaim()


def gather(rows: list[RowKVCache], cap: int) -> tuple[mx.array, mx.array]:
    """[B, H, cap, D] keys and values of these rows in this order. Rows already in slabs (the last batch's,
    whose members changed: one left, one joined) come out of each slab with one take; only the others are
    padded one by one. Rebuilt row by row, ~30 small ops a layer, a new batch cost 4-7 ms at 8 rows, half a
    one-token round, and the server's batch changes every time a request joins or leaves. Past a row's
    offset a slab holds stale rows, not zeros: the mask hides them either way."""
    sources, at, where = [], {}, []
    for c in rows:
        key = id(c.slab) if c.slab is not None else id(c)
        if key not in at:
            at[key] = sum(a.shape[0] for a, _ in sources)
            sources.append((c.slab.keys, c.slab.values) if c.slab is not None else row_arrays(c))
        where.append(at[key] + (c.row if c.slab is not None else 0))
    keys, values = (mx.concatenate([fit(part[i], cap) for part in sources]) if len(sources) > 1 else fit(sources[0][i], cap)
                    for i in (0, 1))
    if where != list(range(keys.shape[0])):
        pick = mx.array(where)
        keys, values = keys[pick], values[pick]
    return keys, values


def fit(a: mx.array, cap: int) -> mx.array:
    """Rows [B, H, L, D] padded or cut to `cap` along L."""
    return pad_rows(a, cap) if a.shape[2] <= cap else a[:, :, :cap]


def _arrays(c: RowKVCache) -> tuple[mx.array, mx.array]:
    """Where a row's keys and values are: its slab's (all rows) or its own."""
    return (c.slab.keys, c.slab.values) if c.slab is not None else (c._keys, c._values)


def row_arrays(c: RowKVCache) -> tuple[mx.array, mx.array]:
    """A row's first `offset` keys and values, wherever they are."""
    b = c.row if c.slab is not None else 0
    return tuple(a[b : b + 1, :, : c.offset] for a in _arrays(c))


def pad_rows(a: mx.array, width: int, axis: int = 2) -> mx.array:
    """[B, H, L, D] (or any array along `axis`) right-padded with zeros to `width` rows along L."""
    if a.shape[axis] == width:
        return a
    return mx.pad(a, [(0, width - a.shape[axis]) if d == axis else (0, 0) for d in range(a.ndim)])


def lendable(rows: list) -> bool:
    """Rows one slab can hold: RowKVCaches that hold rows already (so their shapes are known), all alike."""
    if not all(type(c) is RowKVCache and c.offset > 0 for c in rows):
        return False
    return len({tuple((a.shape[1], a.shape[3], a.dtype) for a in _arrays(c)) for c in rows}) == 1


def release(caches: list) -> None:
    """A request leaves its batch: its rows take their arrays back from the slab."""
    for c in caches:
        if type(c) is RowKVCache and c.slab is not None:
            c.reclaim()
