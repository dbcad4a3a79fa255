"""Verify-width quantized matmul kernels (SIMD-reduction and SIMD-group-matrix
forms) against their plain-MLX twin, run on the CPU by the msim simulator."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np
import mlx.core as mx
import pytest

from msim.cases import SCHEDULES, assert_close, normal, quantized, sim, variant
from mlx_spec.metal_kernels import qmm_mma, qmm_rows
from mlx_spec.metal_kernels.qmm_rows import quantized_matmul_ref

KERNELS = {"rows": (qmm_rows.qmm_rows, qmm_rows.SPEC), "mma": (qmm_mma.qmm_mma, qmm_mma.SPEC)}

# (bits, group_size, M, K, N, activation dtype, scales dtype): M not a multiple
# of 8, K not a multiple of the 256-value rows tile, N not a multiple of either
# kernel's column block, mixed activation/scale dtypes.
CASES = [
    (4, 64, 3, 320, 21, mx.float32, mx.float32),
    (4, 32, 2, 96, 13, mx.bfloat16, mx.bfloat16),
    (8, 64, 5, 640, 9, mx.float16, mx.float16),
    (8, 128, 12, 384, 33, mx.float32, mx.bfloat16),
    (4, 128, 17, 256, 40, mx.bfloat16, mx.bfloat16),
    (8, 32, 32, 160, 7, mx.float16, mx.float16),
]


def run_case(which, bits, gs, m, k, n, xdt, sdt, data_seed=0, **kw):
    rng = np.random.default_rng(data_seed)
    w, s, b = quantized(rng, n, k, bits=bits, group_size=gs, dtype=sdt)
    x = normal(rng, (1, m, k), xdt)
    fn, spec = KERNELS[which]
    y = fn(x, w, s, b, group_size=gs, bits=bits, kernel=sim(spec), **kw)
    # the twin in float32: MLX's CPU loops accumulate low-precision inputs in
    # their own dtype, the Metal kernels (ours and MLX's) in float32
    ref = quantized_matmul_ref(x.astype(mx.float32), w, s.astype(mx.float32),
                               b.astype(mx.float32), group_size=gs, bits=bits)
    assert y.shape == (1, m, n) and y.dtype == mx.result_type(x, s)
    return y, ref.astype(y.dtype)


@pytest.mark.parametrize("which", KERNELS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"q{c[0]}g{c[1]}M{c[2]}K{c[3]}N{c[4]}")
def test_matches_twin(which, case):
    y, ref = run_case(which, *case, schedule="random", seed=1)
    assert_close(y, ref, y.dtype, f"{which} {case}")


@pytest.mark.parametrize("which", KERNELS)
def test_schedule_independent(which):
    outs = [run_case(which, *CASES[3], schedule=s, seed=3)[0] for s in SCHEDULES]
    assert_close(outs[0], run_case(which, *CASES[3])[1], outs[0].dtype, "forward schedule")
    for o in outs[1:]:
        assert mx.array_equal(o, outs[0]), "result depends on the thread schedule"


def test_twin_is_quantized_linear():
    # the twin is exactly what nn.QuantizedLinear computes
    import mlx.nn as nn
    layer = nn.QuantizedLinear(128, 24, bias=False, group_size=64, bits=4)
    x = mx.random.normal((5, 128))
    ref = quantized_matmul_ref(x, layer.weight, layer.scales, layer.biases, group_size=64, bits=4)
    assert mx.array_equal(layer(x), ref)


def test_unwritten_column_is_caught():
    # a kernel that skips the last output column leaves poison (NaN) there
    broken = variant(qmm_rows.SPEC, "n < N)", "n < N - 1)")
    rng = np.random.default_rng(0)
    w, s, b = quantized(rng, 13, 128, bits=4, group_size=64, dtype=mx.float32)
    x = normal(rng, (3, 128), mx.float32)
    y = qmm_rows.qmm_rows(x, w, s, b, group_size=64, bits=4, kernel=sim(broken))
    assert np.isnan(np.array(y)[:, -1]).all()
    with pytest.raises(AssertionError, match="elements off"):
        assert_close(y, quantized_matmul_ref(x, w, s, b, group_size=64, bits=4), mx.float32)


@pytest.mark.slow
@pytest.mark.parametrize("which", KERNELS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("gs", [32, 64, 128])
@pytest.mark.parametrize("dt", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_sweep(which, bits, gs, dt):
    for m in (2, 7, 8, 9, 16, 31, 32):
        for k, n in ((gs * 3, 19), (gs * 9, 64), (gs * 1, 1)):
            y, ref = run_case(which, bits, gs, m, k, n, dt, dt, data_seed=m, schedule="random")
            assert_close(y, ref, dt, f"{which} q{bits} g{gs} M{m} K{k} N{n}")
