"""Batched drafting: the requests of a batched round draft in one drafter pass, each block over its own
context at its own position, and get the drafts they would get alone; the planner prices that one pass."""

import json

import mlx.core as mx
import numpy as np
import pytest

import factory
import mlx_spec
from mlx_spec.calibrate import calibrated_curve
from mlx_spec.curve import CostCurve
from mlx_spec.drafters import model_drafter
from mlx_spec.engine import loop
from mlx_spec.engine.sampling import Sampler, SamplingParams
from test_batch import REQUESTS, alone, together
from test_batch_plan import row
from test_dflash2 import make_dflash2

PROMPTS = ["def add(a, b):\n    return a + b\n", "Hello", "class Stack:\n    def push(self, x):\n        self.items.append(x)",
           "import os"]


def drafter_kinds(models_dir, target_dir, drafter_dir):
    sw = factory.make_drafter(models_dir / "batch-sw", target_dir, layers=2,
                              layer_types=["sliding_attention", "full_attention"], sliding_window=4)
    cfg = json.loads((sw / "config.json").read_text())
    cfg.update(layer_types=["sliding_attention", "full_attention"], sliding_window=4, is_causal=False)
    (sw / "config.json").write_text(json.dumps(cfg))
    return {"dflash": drafter_dir, "sliding-window": sw,
            "dflash2": make_dflash2(models_dir / "batch-dflash2", target_dir, block_size=8),
            "dspark": factory.make_dspark(models_dir / "batch-dspark", target_dir, block_size=6, threshold=0.3),
            "dspark-logits-start": factory.make_dspark(models_dir / "batch-dspark1", target_dir, block_size=6,
                                                       confidence=False, logits_start=1)}


def contexts(model, tok):
    """Drafter states over prompts of different lengths, and each prompt's last token as the anchor."""
    states, anchors = [], []
    for p in PROMPTS:
        ids = tok.encode(p)
        _, hidden = model.target(mx.array([ids[:-1]]), cache=None)
        state = model.drafter.make_state()
        model.drafter.observe(state, hidden, ids[:-1])
        states.append(state)
        anchors.append(ids[-1])
    return states, anchors


@pytest.mark.parametrize("kind", ["dflash", "sliding-window", "dflash2", "dspark", "dspark-logits-start"])
def test_one_pass_drafts_what_each_request_drafts_alone(models_dir, target_dir, drafter_dir, kind):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_kinds(models_dir, target_dir, drafter_dir)[kind]))
    model.drafter = model_drafter(model.drafter)  # the model drafter's own batch (with lookup beside it: test_pick.py)
    d = model.drafter
    states, anchors = contexts(model, tok)
    assert len({s.offset for s in states}) == len(states)  # every block sits at its own position
    top = d.block_size - 1
    ks = [top, 1, 3, 2]
    greedy = Sampler(SamplingParams(), model.vocab_size).drafting(0)
    alone_ = [d.propose(s, a, k, greedy).tokens.tolist() for s, a, k in zip(states, anchors, ks)]
    batched = d.propose_batch(states, anchors, ks, [greedy] * 4)
    assert [b.tokens.tolist() for b in batched] == alone_
    hidden = d.blocks_hidden(states, anchors)  # every request's whole block (a draft of k is its first k)
    for i, (s, a, k) in enumerate(zip(states, anchors, ks)):
        n = d.config.block_size
        np.testing.assert_allclose(np.array(hidden[i, :n]), np.array(d.block_hidden(s, a, n)[0]), atol=1e-5)
    # Sampled: each request's law is the one it would draft from alone (its own temperature).
    samplers = [Sampler(SamplingParams(temperature=t, seed=i), model.vocab_size).drafting(0)
                for i, t in enumerate((0.7, 1.0, 1.3, 0.9))]
    solo_q = [d.propose(s, a, k, sp).q for s, a, k, sp in zip(states, anchors, ks, samplers)]
    for b, q in zip(d.propose_batch(states, anchors, ks, samplers), solo_q):
        if q is not None and len(b):
            n = min(len(b), q.shape[0])  # a confidence head may stop a draft early
            np.testing.assert_allclose(np.array(b.q[:n]), np.array(q[:n]), atol=1e-5)


def test_a_batched_round_drafts_in_one_pass_and_decodes_as_alone(target_dir, drafter_dir, monkeypatch):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    passes, real = [], model.drafter.propose_batch
    monkeypatch.setattr(model.drafter, "propose_batch", lambda *a: passes.append(len(a[0])) or real(*a))
    solo = [alone(model, tok, r) for r in REQUESTS]
    assert not passes  # a request alone drafts alone
    assert together(model, tok, REQUESTS, join_at=[0, 0, 1, 1, 2, 2]) == solo  # greedy and seeded sampled rows
    assert max(passes) >= 4  # several requests drafted in one pass


def test_the_shared_drafter_across_ranks_never_batches():
    """Ranks draft collectively, one request at a time: rank 0 must not take its inner drafter's batch."""
    from mlx_spec.distributed.drafting import SharedDrafter

    inner = type("Inner", (), {"propose_batch": lambda *a: 1 / 0})()
    assert getattr(SharedDrafter(inner, None, 4, (1,)), "propose_batch", None) is None


def test_the_planner_prices_one_drafter_pass_for_the_batch():
    """Eight requests at 0.6 acceptance: drafting pays when they share one drafter pass, not when each
    pays its own (a drafter pass that costs 30% of a batched verify pass)."""
    batch = [[b, w, 1.0 + 0.01 * (b * w - 1)] for b in (2, 4, 8) for w in (1, 2, 4, 8)]
    shared = CostCurve(verify=[1.0] * 8, draft=[0.3] * 7, batch=batch,
                       draft_batch=[[b, k, 0.3 + 0.01 * b] for b in (2, 4, 8) for k in (1, 3, 7)])
    alone_ = CostCurve(verify=[1.0] * 8, draft=[0.3] * 7, batch=batch)
    assert alone_.draft_time(8, 3) == pytest.approx(2.4) and shared.draft_time(8, 3) == pytest.approx(0.38)
    assert loop.plan_batch([row(alone_, 0.6) for _ in range(8)]) == [0] * 8
    assert all(k > 0 for k in loop.plan_batch([row(shared, 0.6) for _ in range(8)]))


def test_calibration_measures_batched_drafter_passes(target_dir, drafter_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SPEC_CACHE", str(tmp_path))
    model, _ = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    curve = calibrated_curve(model, model.drafter.block_size, batch_rows=4)
    assert {int(b) for b, _, _ in curve.draft_batch} == {1, 2, 4}  # one row measured alike
    assert all(t > 0 for _, _, t in curve.draft_batch)
    # every width and draft count, not a few to interpolate between: batched costs step (where the rows
    # reach a multiple of a product's tile, where a drafter moves to a bigger block), and a 16-row drafter's
    # widths 9-11 interpolated between 8 and 16 were priced 10-20% below their cost
    width = model.drafter.block_size
    for b in (2, 4):
        assert sorted(int(w) for r, w, _ in curve.batch if r == b) == list(range(1, width + 1))
        assert sorted(int(k) for r, k, _ in curve.draft_batch if r == b) == list(range(1, width))
    # again, the most rows (and one), after a long context in every row (the model's own length, less room
    # for a block): what long prompts add to batched passes
    assert curve.batch_context < curve.long_batch_context <= model.context_length
    assert {int(b) for b, _, _ in curve.long_batch} == {4} and {int(b) for b, _, _ in curve.long_draft_batch} == {1, 4}
    again = calibrated_curve(model, model.drafter.block_size, batch_rows=4)  # cached on disk, drafts included
    assert again.draft_batch == curve.draft_batch and again.long_batch == curve.long_batch
