"""The simulator harness itself: MLX must still expose the Metal source it
generates (else every kernel test would test nothing), and msim must still see
the bugs it exists to see."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np
import mlx.core as mx
import pytest

import msim
from msim.cases import sim
from mlx_spec.metal_kernels import fused_accept, qmm_mma, qmm_rows, verify_attention

BODY = "uint i = thread_position_in_grid.x; if (i < x_shape[0]) y[i] = x[i] * T(SCALE);"


def test_mlx_exposes_generated_source():
    k = msim.metal_kernel(name="probe", input_names=["x"], output_names=["y"], source=BODY)
    x = mx.arange(40, dtype=mx.float32)
    src = k.generated_source([x], [(40,)], [mx.float32], (64, 1, 1), (32, 1, 1),
                             template=[("T", mx.float32), ("SCALE", 3)])
    assert "[[kernel]]" in src and BODY in src
    assert "[[thread_position_in_grid]]" in src and "[[buffer(" in src
    assert "<float, 3>" in src, "template instantiation missing"
    y = k(inputs=[x], template=[("T", mx.float32), ("SCALE", 3)], grid=(64, 1, 1),
          threadgroup=(32, 1, 1), output_shapes=[(40,)], output_dtypes=[mx.float32])[0]
    assert mx.array_equal(y, x * 3)


@pytest.mark.parametrize("spec", [qmm_rows.SPEC, qmm_mma.SPEC, verify_attention.PARTIAL_SPEC,
                                  verify_attention.MERGE_SPEC, fused_accept.SPEC],
                         ids=lambda s: s.name)
def test_kernels_build_with_mlx(spec):
    # mx.fast.metal_kernel accepts every spec on any backend (calling needs Metal)
    assert spec.metal() is spec.metal()


def test_poison_marks_unwritten_outputs():
    k = msim.metal_kernel(name="half_write", input_names=["x"], output_names=["y"],
                          source="uint i = thread_position_in_grid.x; if (i % 2 == 0) y[i] = x[i];")
    x = mx.ones((64,))
    y = np.array(k(inputs=[x], grid=(64, 1, 1), threadgroup=(32, 1, 1),
                   output_shapes=[(64,)], output_dtypes=[mx.float32])[0])
    assert (y[::2] == 1).all() and np.isnan(y[1::2]).all()


def test_threadgroup_memory_limit():
    k = msim.metal_kernel(name="too_big", input_names=["x"], output_names=["y"],
                          source="threadgroup float big[9000]; uint i = thread_position_in_grid.x;"
                                 " big[i] = x[i]; threadgroup_barrier(mem_flags::mem_threadgroup);"
                                 " y[i] = big[i];")
    with pytest.raises(msim.KernelError, match="32768"):
        k(inputs=[mx.ones((32,))], grid=(32, 1, 1), threadgroup=(32, 1, 1),
          output_shapes=[(32,)], output_dtypes=[mx.float32])


def test_cache_lives_outside_the_repo():
    repo = Path(__file__).resolve().parents[1]
    assert not Path(msim.CACHE).resolve().is_relative_to(repo)
    assert sim.cache_info() is not None
