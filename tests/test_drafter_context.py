"""The drafter's context in batched rounds: requests drafting together catch up in one batched update and
keep their rows in one slab per layer; every request's context reads exactly as when it drafts alone."""

import random

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

import mlx_spec
from mlx_spec.drafters import model_drafter
from mlx_spec.drafters.context import DFlashState, batch_context, write_rows
from mlx_spec.engine.sampling import Sampler, SamplingParams
from mlx_spec.engine.slab import Slab
from test_batch_drafting import PROMPTS


def kv(b, n, seed, heads=2, dim=4):
    k = mx.random.normal((b, heads, n, dim), key=mx.random.key(seed))
    return k, 3 * k + 1


def test_context_rows_read_as_plain_caches_through_batched_catch_ups(monkeypatch):
    """A random schedule: several requests catch up together (ragged counts, some with nothing new, the
    set changing), a subset reads the batch's context (the requests lookup does not draft for), single
    requests read or write alone, rows trim and leave; against mlx-lm's KVCache fed the same rows."""
    rng = random.Random(1)
    ours, ref = [DFlashState(1) for _ in range(6)], [KVCache() for _ in range(6)]
    built = []
    real_init = Slab.__init__
    monkeypatch.setattr(Slab, "__init__", lambda self, rows: built.append(len(rows)) or real_init(self, rows))
    members, seed, reads = [0, 1, 2, 3], 0, 0
    for step in range(120):
        seed += 1
        op = rng.random()
        if op < 0.08:  # the drafting set changes
            members = rng.sample(range(6), rng.randint(2, 6))
        if op < 0.7:  # a batched catch-up, then the batch's read (of all, or of the model-drafted few)
            counts = [rng.choice([0, 1, 1, 2, 3, 7]) if ours[i].offset else rng.randint(1, 40) for i in members]
            n = max(counts)
            if not n:
                continue
            keys, values = kv(len(members), n, seed)
            write_rows([ours[i] for i in members], 0, keys, values, counts)
            for b, (i, c) in enumerate(zip(members, counts)):
                if c:
                    ref[i].update_and_fetch(keys[b : b + 1, :, :c], values[b : b + 1, :, :c])
            readers = members if rng.random() < 0.85 else sorted(rng.sample(members, rng.randint(1, len(members))))
            (k, v), mask = batch_context([ours[i] for i in readers], 0, None)
            reads += 1
            for b, i in enumerate(readers):
                seen = np.array(mask[b, 0, 0]) if mask is not None else np.zeros(0, bool)
                assert seen.sum() == ref[i].offset and not seen[ref[i].offset :].any()
                if ref[i].offset:
                    assert np.array_equal(np.array(k[b : b + 1])[:, :, seen], np.array(ref[i].keys[:, :, : ref[i].offset]))
                    assert np.array_equal(np.array(v[b : b + 1])[:, :, seen], np.array(ref[i].values[:, :, : ref[i].offset]))
        elif op < 0.8:  # a request drafts alone (its own rows read as a plain cache)
            i = rng.randrange(6)
            k, v = ours[i].kv(0)
            if ref[i].offset:
                assert np.array_equal(np.array(k), np.array(ref[i].keys[:, :, : ref[i].offset]))
            else:
                assert k is None
        elif op < 0.9:  # a follow-up turn's prefix reuse
            i = rng.randrange(6)
            drop = rng.randint(0, ours[i].offset)
            assert ours[i].trim(drop) == ref[i].trim(drop)
        else:  # a request finishes (its rows leave the slab)
            ours[rng.randrange(6)].leave_batch()
    for a, b in zip(ours, ref):
        assert a.offset == b.offset
        if b.offset:
            assert np.array_equal(np.array(a.kv(0)[0]), np.array(b.keys[:, :, : b.offset]))
    assert built and len(built) < reads / 2  # a slab outlives rounds while the set stays the same


def test_batched_catch_up_drafts_what_each_request_drafts_alone(target_dir, drafter_dir):
    """Round after round, requests catch up together with ragged new rows and draft in one pass; the same
    requests caught up and drafting one by one draft the same tokens."""
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    d = model_drafter(model.drafter)
    greedy = Sampler(SamplingParams(), model.vocab_size).drafting(0)
    ids = [tok.encode(p) for p in PROMPTS]
    hidden = [model.target(mx.array([t]), cache=None)[1] for t in ids]
    batched, solo = [d.make_state() for _ in ids], [d.make_state() for _ in ids]
    rng = random.Random(2)
    done = [0] * len(ids)
    for step in range(6):
        counts = [min(len(t) - 1 - n, rng.randint(0 if step else 1, 4)) for t, n in zip(ids, done)]
        n = max(counts)
        rows = mx.concatenate([mx.pad(h[:, a : a + c], [(0, 0), (0, n - c), (0, 0)])
                               for h, a, c in zip(hidden, done, counts)])
        d.observe_batch(batched, rows, [t[a : a + c] for t, a, c in zip(ids, done, counts)])
        for s, h, t, a, c in zip(solo, hidden, ids, done, counts):
            if c:
                d.observe(s, h[:, a : a + c], t[a : a + c])
        done = [a + c for a, c in zip(done, counts)]
        anchors, ks = [t[a] for t, a in zip(ids, done)], [rng.randint(1, d.block_size - 1) for _ in ids]
        got = d.propose_batch(batched, anchors, ks, [greedy] * len(ids))
        want = [d.propose(s, a, k, greedy) for s, a, k in zip(solo, anchors, ks)]
        assert [g.tokens.tolist() for g in got] == [w.tokens.tolist() for w in want]
    assert batched[0].caches[0].slab is not None  # the last rounds ran through a slab
    for b, s in zip(batched, solo):  # the context itself (positions included), not only its argmax
        for i in range(len(d.layers)):
            for x, y in zip(b.kv(i), s.kv(i)):
                np.testing.assert_allclose(np.array(x), np.array(y), atol=1e-5)


def test_requests_catch_up_together_when_their_new_rows_are_alike(target_dir, drafter_dir, monkeypatch):
    """`drafter_states`: rounds' few new rows go in as one batched update; a prompt much longer than the
    others' new rows (mostly padding together) goes in a group of its own; either way each state is what
    catching up alone gives."""
    from mlx_spec.engine.cache import PAD_ROWS, drafter_states

    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    calls = []
    real = type(model.drafter).observe_batch
    monkeypatch.setattr(type(model.drafter), "observe_batch", lambda self, *a: calls.append(a[2]) or real(self, *a))

    def caches(lengths):
        pcs = [mlx_spec.make_prompt_cache(model) for _ in lengths]
        for pc, n, p in zip(pcs, lengths, PROMPTS * 2):
            ids = (tok.encode(p) * 40)[:n]
            _, hidden = model.target(mx.array([ids]), pc.cache)
            pc.add(ids, hidden)
        return pcs

    prompts = [3, 2 * PAD_ROWS + 40, 5, 3 + PAD_ROWS]  # the short ones together, the long one alone
    pcs, solo = caches(prompts), caches(prompts)
    drafter_states(pcs)
    assert sorted(sorted(len(t) for t in c) for c in calls) == [[3, 5, 3 + PAD_ROWS], [2 * PAD_ROWS + 40]]
    calls.clear()
    for step in range(3):  # then rounds of a few rows each: together
        for pc, s, n in zip(pcs, solo, (1, 3, 2, 2)):
            ids = tok.encode("x = 1\n")[:n]
            for c in (pc, s):
                _, hidden = model.target(mx.array([ids]), c.cache)
                c.add(ids, hidden)
        drafter_states(pcs)
    assert len(calls) == 3
    models = [pc.drafter_state().model for pc in pcs]
    for i in range(len(models[0].caches)):  # a drafting pass lends their rows to a slab per layer
        batch_context(models, i, None)
    calls.clear()
    for pc, s, n in zip(pcs, solo, (2 * PAD_ROWS + 9, 1, 2, 1)):  # one long turn beside rounds' few rows
        ids = (tok.encode("y = [x for x in range(10)]\n") * 9)[:n]
        for c in (pc, s):
            _, hidden = model.target(mx.array([ids]), c.cache)
            c.add(ids, hidden)
    drafter_states(pcs)
    assert sorted(sorted(len(t) for t in c) for c in calls) == [[1, 1, 2], [2 * PAD_ROWS + 9]]
    assert all(c.slab is not None for m in models for c in m.caches)  # written into the slab, none taken back
    for pc, s in zip(pcs, solo):
        a, b = pc.drafter_state(), s.drafter_state()
        assert a.offset == b.offset
        for i in range(len(a.model.caches)):
            for x, y in zip(a.model.kv(i), b.model.kv(i)):
                np.testing.assert_allclose(np.array(x), np.array(y), atol=1e-5)
