"""Batched rounds keep plain KV rows in one slab per layer: every row reads exactly as a plain cache fed the
same updates, the slab is reused while the batch stays the same, and no idle cache keeps one alive."""

import random

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

import mlx_spec
from mlx_spec.engine import slab as slab_mod
from mlx_spec.engine.batch import SlabView, batch_caches
from mlx_spec.engine.slab import RowKVCache, Slab
from test_batch import REQUESTS, alone, together


def kv(n, seed, heads=2, dim=4):
    k = mx.random.normal((1, heads, n, dim), key=mx.random.key(seed))
    return k, -2 * k


def rows_of(c):
    k, v = c.keys, c.values  # (a lent row takes its arrays back here)
    return np.array(k[..., : c.offset, :]), np.array(v[..., : c.offset, :])


def test_rows_read_as_plain_caches_through_batches_trims_and_single_passes():
    """A random schedule of batched rounds (members joining and leaving), trims and passes of one row
    alone, against mlx-lm's KVCache fed the same updates."""
    rng = random.Random(0)
    ours, ref = [RowKVCache() for _ in range(5)], [KVCache() for _ in range(5)]
    for i in range(5):  # prefilled rows of different lengths
        k, v = kv(3 + 40 * i, seed=i)
        ours[i].update_and_fetch(k, v), ref[i].update_and_fetch(k, v)
    built, seed = [], 100
    real_init = Slab.__init__
    Slab.__init__ = lambda self, rows: built.append(len(rows)) or real_init(self, rows)
    try:
        members = [0, 1, 2]
        for step in range(60):
            seed += 1
            op = rng.random()
            if op < 0.1:  # the batch changes
                members = sorted(rng.sample(range(5), rng.randint(2, 5)))
            if op < 0.75:
                n = rng.randint(1, 9)
                keys = mx.concatenate([kv(n, seed * 10 + i)[0] for i in members])
                view = batch_caches([[ours[i]] for i in members])[0]
                assert isinstance(view, SlabView)
                got_k, got_v = view.update_and_fetch(keys, -2 * keys)
                mask = np.array(view.make_mask(n))
                for b, i in enumerate(members):
                    want_k, want_v = ref[i].update_and_fetch(keys[b : b + 1], -2 * keys[b : b + 1])
                    seen = mask[b, 0, -1]  # the block's last query sees the row's whole history
                    assert seen.sum() == ref[i].offset
                    assert np.array_equal(np.array(got_k[b : b + 1])[:, :, seen], np.array(want_k))
                    assert np.array_equal(np.array(got_v[b : b + 1])[:, :, seen], np.array(want_v))
                for i in members:  # a round keeps what it accepted
                    drop = rng.randint(0, n - 1)
                    ours[i].trim(drop), ref[i].trim(drop)
            elif op < 0.9:  # one request alone (a plain round, a follow-up turn's prefill)
                i, n = rng.randrange(5), rng.randint(1, 300)
                k, v = kv(n, seed)
                ours[i].update_and_fetch(k, v), ref[i].update_and_fetch(k, v)
            else:
                i = rng.randrange(5)
                drop = rng.randint(0, ours[i].offset - 1)
                ours[i].trim(drop), ref[i].trim(drop)
        for a, b in zip(ours, ref):
            assert a.offset == b.offset
            for x, y in zip(rows_of(a), rows_of(b)):
                assert np.array_equal(x, y)
    finally:
        Slab.__init__ = real_init
    assert len(built) < 35  # rebuilt when the batch changed or a row went alone, else reused

    view = batch_caches([[c] for c in ours[:2]])[0]
    view.update_and_fetch(mx.zeros((2, 2, 1, 4)), mx.zeros((2, 2, 1, 4)))
    assert ours[0].slab is not None
    k, v = kv(7, 99)
    ours[0].state = (k, v, 7)  # restoring a saved state into a lent row replaces it
    assert ours[0].slab is None and np.array_equal(rows_of(ours[0])[0], np.array(k))


def test_a_finished_request_leaves_its_slab_and_the_last_one_frees_it(target_dir, drafter_dir):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    made = []
    real_init = Slab.__init__

    def init(self, rows):
        made.append(self)
        real_init(self, rows)
    Slab.__init__ = init
    try:
        reqs = [(p, s, 4) for p, s, _ in REQUESTS[:3]]
        assert together(model, tok, reqs, join_at=[0, 0, 1]) == [alone(model, tok, r) for r in reqs]
    finally:
        Slab.__init__ = real_init
    assert made  # the batched rounds ran through slabs
    # every request finished: none of their rows is still lent, so no slab is kept alive by an idle cache
    assert all(row is None or row.slab is not s for s in made for row in s.rows)


def test_slab_rounds_decode_as_alone_and_reuse_one_slab(target_dir, drafter_dir, monkeypatch):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    counts = {"built": 0, "views": 0}
    real_init, real_view = Slab.__init__, SlabView.__init__

    def init(self, rows):
        counts["built"] += 1
        real_init(self, rows)

    def view(self, caches):
        counts["views"] += 1
        real_view(self, caches)
    monkeypatch.setattr(Slab, "__init__", init)
    monkeypatch.setattr(SlabView, "__init__", view)
    reqs = [(p, s, 4) for p, s, _ in REQUESTS[:2]] + [("class Stack:", REQUESTS[0][1], 4)]
    got = together(model, tok, reqs, join_at=[0, 0, 0])
    monkeypatch.undo()
    assert got == [alone(model, tok, r) for r in reqs]
    assert counts["views"] >= 3 * counts["built"]  # per layer: built when the batch formed or changed, then reused


def test_rows_that_cannot_share_a_slab_batch_by_copies():
    a, b = RowKVCache(), KVCache()
    for c in (a, b):
        c.update_and_fetch(*kv(5, 1))
    assert not slab_mod.lendable([a, b]) and not slab_mod.lendable([a, RowKVCache()])
    assert not isinstance(batch_caches([[a], [b]])[0], SlabView)
