"""CUDA twins: the portable kernel bodies, wrapped the way mx.fast.cuda_kernel
wraps them, must compile with `nvcc -c -arch=sm_90` (compile only: no GPU)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import mlx.core as mx
import pytest

from msim import cuda
from mlx_spec.metal_kernels import _portable
from mlx_spec.metal_kernels import fused_accept as F
from mlx_spec.metal_kernels import qmm_mma, qmm_rows
from mlx_spec.metal_kernels import verify_attention as A

pytestmark = pytest.mark.skipif(cuda.nvcc() is None, reason="nvcc is not installed")


def calls(dt):
    w = mx.zeros((40, 256 // 8), mx.uint32)
    s = mx.zeros((40, 4), dt)
    q, k = mx.zeros((1, 4, 3, 80), dt), mx.zeros((1, 2, 100, 80), dt)
    part, merge = A.launch(q, k, k, scale=0.1, split=64)
    pm = mx.zeros((12, 2))
    merge["inputs"] = [mx.zeros((12, 2, 80)), pm, pm]
    return {
        "qmm_rows": (qmm_rows.SPEC, qmm_rows.launch(mx.zeros((5, 256), dt), w, s, s, group_size=64, bits=4)),
        "attn_partial": (A.PARTIAL_SPEC, part),
        "attn_merge": (A.MERGE_SPEC, merge),
        "fused_accept": (F.SPEC, F.launch(mx.zeros((4, 100), dt), mx.zeros((3,), mx.int32))),
    }


def compile_ok(name, dt):
    spec, call = calls(dt)[name]
    r = cuda.compile_cuda(spec, _portable.CUDA_HEADER, call)
    assert r.returncode == 0, f"nvcc failed for {name} ({dt}):\n{r.stderr[-4000:]}"


@pytest.mark.parametrize("name", ["qmm_rows", "attn_partial", "attn_merge", "fused_accept"])
def test_portable_kernel_compiles(name):
    compile_ok(name, mx.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qmm_rows", "attn_partial", "attn_merge", "fused_accept"])
@pytest.mark.parametrize("dt", [mx.float32, mx.float16], ids=str)
def test_portable_kernel_compiles_all_dtypes(name, dt):
    compile_ok(name, dt)


def test_metal_only_kernel_is_marked():
    # simdgroup_matrix has no CUDA spelling here; the spec says so
    assert not qmm_mma.SPEC.portable
    with pytest.raises(ValueError):
        qmm_mma.SPEC.cuda()


def test_broken_body_fails_to_compile():
    # the check can fail: a Metal-only name the header does not map
    bad = F.SPEC.__class__(**{**F.SPEC.__dict__, "source": F.SPEC.source + "simdgroup_barrier(mem_flags::mem_none);"})
    spec, call = calls(mx.float32)["fused_accept"]
    r = cuda.compile_cuda(bad, _portable.CUDA_HEADER, call)
    assert r.returncode != 0
