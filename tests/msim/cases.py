"""Shared helpers for the kernel tests: simulated kernels, inputs, tolerances."""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
import mlx.core as mx

import msim

SCHEDULES = ("forward", "reverse", "random")

# Differences allowed against a float32 evaluation of the twin: a few output
# roundings of the dtype, relative to the largest output.
REL_TOL = {mx.float32: 2e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}


@lru_cache(maxsize=None)
def sim(spec):
    """The msim kernel for a metal_kernels KernelSpec (built once per spec)."""
    return msim.metal_kernel(**spec.kwargs())


def variant(spec, old: str, new: str, name: str | None = None):
    """A deliberately edited copy of a kernel, for negative tests."""
    assert old in spec.source, old
    return replace(spec, source=spec.source.replace(old, new), name=name or spec.name + "_broken")


def f32(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


def assert_close(out: mx.array, ref: mx.array, dtype, what: str = ""):
    o, r = f32(out), f32(ref)
    assert o.shape == r.shape, (o.shape, r.shape)
    diff = np.abs(o - r)
    tol = REL_TOL[dtype] * (np.abs(r).max() + 1.0)
    worst = float(np.nanmax(diff)) if diff.size else 0.0
    bad = int((~(diff <= tol)).sum())  # NaN (poison) counts as bad
    assert bad == 0, (f"{what}: {bad}/{diff.size} elements off, max|diff|={worst:.3e} "
                      f"(tol {tol:.3e}), NaN in output: {int(np.isnan(o).sum())}")
    return worst


def quantized(rng, n: int, k: int, *, bits: int, group_size: int, dtype):
    """mlx-lm-packed affine weights (w, scales, biases) with scales in `dtype`."""
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size, bits)
    return wq, s.astype(dtype), b.astype(dtype)


def normal(rng, shape, dtype, scale: float = 1.0) -> mx.array:
    return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)
