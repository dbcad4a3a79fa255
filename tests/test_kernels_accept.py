"""Fused greedy acceptance against its plain-MLX twin (argmax, cumprod), under msim."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np
import mlx.core as mx
import pytest

import msim
from msim.cases import SCHEDULES, normal, sim, variant
from mlx_spec.metal_kernels import fused_accept as F


def drafts_for(logits, n_agree):
    """Draft tokens that agree with the target's argmax for n_agree rows."""
    t = np.array(mx.argmax(logits, axis=-1)).astype(np.int32)[:-1].copy()
    t[n_agree:] = (t[n_agree:] + 1) % logits.shape[-1]
    return mx.array(t)


def check(logits, draft, threads=256, **kw):
    got = F.fused_accept(logits, draft, threads=threads, kernel=sim(F.SPEC), **kw)
    want = F.fused_accept_ref(logits, draft)
    for name, g, w in zip(("target", "accepted", "bonus"), got, want):
        assert g.shape == w.shape and mx.array_equal(g, w), f"{name}: {g.tolist()} != {w.tolist()}"
    return [x.tolist() for x in got]


# (rows M, vocab V, dtype, threads, agreeing drafts): one row (no drafts),
# all accepted, none accepted, M > 32, V not a multiple of the threadgroup.
CASES = [
    (1, 77, mx.bfloat16, 64, 0),
    (5, 1000, mx.float32, 256, 2),
    (9, 5003, mx.float16, 1024, 8),
    (33, 300, mx.bfloat16, 128, 0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"M{c[0]}V{c[1]}T{c[3]}")
def test_matches_twin(case):
    m, v, dt, threads, agree = case
    logits = normal(np.random.default_rng(m), (m, v), dt, scale=3.0)
    _, accepted, _ = check(logits, drafts_for(logits, agree), threads, schedule="random", seed=m)
    assert accepted == min(agree, m - 1)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_ties_and_infinities(schedule):
    # equal maxima: the first index wins, as in mx.argmax; -inf and -0.0 are ordered
    rows = np.full((4, 700), -np.inf, np.float32)
    rows[0, [5, 600, 3]] = 2.0
    rows[1, :] = -0.0
    rows[1, 650] = 0.0
    rows[2, 699] = -1e30
    rows[3, [100, 40]] = [1.0, 1.0]
    logits = mx.array(rows).astype(mx.bfloat16)
    target, _, _ = check(logits, mx.array([3, 0, 699], mx.int32), schedule=schedule, seed=7)
    assert target == [3, 0, 699, 40]


def test_batched_logits_shape():
    logits = normal(np.random.default_rng(0), (1, 4, 50), mx.float32)
    check(logits, drafts_for(logits[0], 3))


def test_divergent_collective_is_caught():
    # a SIMD reduction called by half the lanes is undefined on Metal; msim says so
    bad = variant(F.SPEC, "int mk = simd_max(best);", "int mk = lane < 16 ? simd_max(best) : best;")
    logits = normal(np.random.default_rng(0), (3, 200), mx.float32)
    with pytest.raises(msim.KernelError, match="divergent"):
        F.fused_accept(logits, drafts_for(logits, 1), threads=64, kernel=sim(bad))


def test_unwritten_output_is_caught():
    bad = variant(F.SPEC, "accepted[0] = a;", "")
    logits = normal(np.random.default_rng(0), (3, 200), mx.float32)
    _, acc, _ = F.fused_accept(logits, drafts_for(logits, 2), threads=64, kernel=sim(bad))
    assert acc.item() == -1  # the 0xFF poison, never a plausible length


@pytest.mark.slow
@pytest.mark.parametrize("dt", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_sweep(dt):
    for m in (1, 2, 3, 8, 16, 17, 32, 33):
        for v, threads in ((31, 32), (4097, 1024), (151_936, 1024)):
            logits = normal(np.random.default_rng(m * v), (m, v), dt, scale=4.0)
            for agree in {0, m // 2, m - 1}:
                check(logits, drafts_for(logits, agree), threads, schedule="random", seed=agree)
