"""Kernel runs for AddressSanitizer mode, one case per process:

    MSIM_ASAN=1 LD_PRELOAD=$(g++ -print-file-name=libasan.so) python asan_cases.py CASE

Every buffer msim binds is an exact-size malloc, so a read or write past any
input or output is reported. `clean` must exit 0; the broken cases must not."""
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import mlx.core as mx

from msim.cases import normal, quantized, sim
from mlx_spec.metal_kernels import fused_accept as F
from mlx_spec.metal_kernels import qmm_mma, qmm_rows
from mlx_spec.metal_kernels import verify_attention as A


def qmm(spec, fn, m, n, k=160):
    rng = np.random.default_rng(0)
    w, s, b = quantized(rng, n, k, bits=4, group_size=32, dtype=mx.bfloat16)
    return fn(normal(rng, (m, k), mx.bfloat16), w, s, b, group_size=32, bits=4, kernel=sim(spec))


def attn(partial_spec):
    rng = np.random.default_rng(0)
    q, k, v = (normal(rng, s, mx.float16) for s in ((1, 6, 3, 80), (1, 2, 70, 80), (1, 2, 70, 80)))
    return A.verify_attention(q, k, v, scale=0.1, split=32, kernels=(sim(partial_spec), sim(A.MERGE_SPEC)))


def clean():
    mx.eval(qmm(qmm_rows.SPEC, qmm_rows.qmm_rows, 3, 13))
    mx.eval(qmm(qmm_mma.SPEC, qmm_mma.qmm_mma, 9, 37))
    mx.eval(attn(A.PARTIAL_SPEC))
    logits = normal(np.random.default_rng(1), (5, 77), mx.float32)
    mx.eval(F.fused_accept(logits, mx.zeros((4,), mx.int32), threads=64, kernel=sim(F.SPEC)))


CASES = {
    "clean": clean,
    # no clamp on the column index: the last simdgroup reads rows past N
    "qmm_noclamp": lambda: mx.eval(qmm(qmm_rows.make_spec("n0 + r", "qmm_noclamp"), qmm_rows.qmm_rows, 3, 13)),
    # no clamp on the last split: keys past S are read
    "attn_noclamp": lambda: mx.eval(attn(replace(
        A.PARTIAL_SPEC, name="attn_noclamp",
        source=A.PARTIAL_SPEC.source.replace("metal::min(S, k_begin + SPLIT)", "k_begin + SPLIT")))),
}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
    print("finished", sys.argv[1])
