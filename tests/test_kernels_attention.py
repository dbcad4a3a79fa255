"""Few-row verify attention (split-KV partials + merge) against its twin,
`mx.fast.scaled_dot_product_attention(mask="causal")`, under msim."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np
import mlx.core as mx
import pytest

from msim.cases import SCHEDULES, assert_close, normal, sim, variant
from mlx_spec.metal_kernels import verify_attention as A

# (B, Hq, Hkv, L, S, D, dtype, split): GQA ratios 1-8, KV lengths that are not
# multiples of the split, S == L, a head dim that is not a multiple of 32,
# more query rows than one threadgroup holds (G * L > RT), D = 256 (RT = 4).
CASES = [
    (1, 4, 2, 3, 150, 64, mx.float32, 64),
    (2, 8, 1, 5, 70, 80, mx.bfloat16, 32),
    (1, 6, 6, 16, 40, 32, mx.float16, 64),
    (1, 8, 2, 2, 2, 128, mx.float32, 32),
    (1, 12, 4, 7, 301, 64, mx.bfloat16, 128),
    (1, 2, 1, 16, 33, 256, mx.bfloat16, 32),
]


def run_case(b, hq, hkv, l, s, d, dt, split, data_seed=0, kernels=None, **kw):
    rng = np.random.default_rng(data_seed)
    q, k, v = normal(rng, (b, hq, l, d), dt), normal(rng, (b, hkv, s, d), dt), normal(rng, (b, hkv, s, d), dt)
    kernels = kernels or (sim(A.PARTIAL_SPEC), sim(A.MERGE_SPEC))
    out = A.verify_attention(q, k, v, scale=d ** -0.5, split=split, kernels=kernels, **kw)
    ref = A.verify_attention_ref(q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32),
                                 scale=d ** -0.5)
    assert out.shape == q.shape and out.dtype == dt
    return out, ref.astype(dt)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}Hq{c[1]}Hkv{c[2]}L{c[3]}S{c[4]}D{c[5]}")
def test_matches_twin(case):
    out, ref = run_case(*case, schedule="random", seed=2)
    assert_close(out, ref, case[6], str(case))


def test_schedule_independent():
    runs = [run_case(*CASES[0], schedule=s, seed=5) for s in SCHEDULES]
    outs = [out for out, _ in runs]
    assert_close(outs[0], runs[0][1], CASES[0][6], "forward schedule")
    for o in outs[1:]:
        assert mx.array_equal(o, outs[0]), "result depends on the thread schedule"


def test_strided_cache_view_twin():
    # mlx-lm's KVCache hands out a slice of a larger buffer; the twin accepts it
    rng = np.random.default_rng(1)
    buf = normal(rng, (1, 2, 256, 64), mx.float32)
    k = buf[:, :, :100, :]
    q = normal(rng, (1, 4, 4, 64), mx.float32)
    out = A.verify_attention(q, k, k, scale=0.125, split=64,
                             kernels=(sim(A.PARTIAL_SPEC), sim(A.MERGE_SPEC)))
    assert_close(out, A.verify_attention_ref(q, mx.array(k), mx.array(k), scale=0.125), mx.float32)


def test_missing_barrier_is_caught():
    # without the barrier after each row's merge, the next row overwrites the
    # threadgroup scratch while SIMD group 0 still reads it
    racy = variant(A.PARTIAL_SPEC, "threadgroup_barrier(mem_flags::mem_threadgroup);  // MERGE_BARRIER:", "//")
    errs = []
    for s in SCHEDULES:
        out, ref = run_case(*CASES[0], kernels=(sim(racy), sim(A.MERGE_SPEC)), schedule=s, seed=1)
        errs.append(float(np.abs(np.array(out) - np.array(ref)).max()))
    print("max|err| per schedule without the barrier:", errs)
    assert max(errs) > 1e-3, f"missing barrier not visible: {errs}"


@pytest.mark.slow
@pytest.mark.parametrize("g", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dt", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_sweep(g, dt):
    for l in (2, 3, 8, 16):
        for s, split in ((l, 32), (97, 32), (513, 128)):
            for d in (64, 96, 128):
                out, ref = run_case(1, 2 * g, 2, l, s, d, dt, split, data_seed=l + s, schedule="random")
                assert_close(out, ref, dt, f"G{g} L{l} S{s} D{d}")
