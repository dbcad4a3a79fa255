"""Float32 weights laid out for MLX's CPU backend when its bundled reference BLAS does the GEMMs.

A Linear computes x @ W.T with W stored [out, in]. The reference BLAS runs that transposed product
well below the speed of the same product over a row-major [in, out] copy (the embedded target, one
pass: one token 19.5 -> 17.6 ms, an 8-token verify 90.6 -> 65.0 ms, a 256-token prefill 2.65 ->
1.71 s). So each float32 weight becomes a transposed view of such a copy: `W.T` is then row-major,
and nothing else changes (the same logical shape, the same values, the same memory; the products
came out bit for bit the same). An optimized BLAS runs both layouts alike (measured with OpenBLAS)
and Metal has kernels of its own: there the weights stay as stored.
"""

from __future__ import annotations

from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn


def pays() -> bool:
    """Where the layout was measured to pay: the CPU device, on the bundled reference BLAS."""
    from .platform_blas import blas_info

    return mx.default_device() == mx.cpu and blas_info().reference


def relayout(*modules: nn.Module, stored: bool = False) -> int:
    """Lay out every float32 Linear and Embedding weight of `modules` row-major for `x @ W.T` (`stored`:
    back as the files store them, row-major [out, in]), one weight at a time (a shared weight, e.g. a
    tied head, once); returns how many weights moved."""
    holders: dict[int, list[nn.Module]] = {}
    for module in modules:
        for _, m in module.named_modules():
            w = m.get("weight") if isinstance(m, (nn.Linear, nn.Embedding)) else None
            if w is not None and w.dtype == mx.float32 and w.ndim == 2:
                holders.setdefault(id(w), []).append(m)
    for group in holders.values():
        w = group[0]["weight"]
        moved = mx.contiguous(w) if stored else mx.contiguous(w.T).T
        mx.eval(moved)
        for m in group:
            m["weight"] = moved  # the old copy is freed as its last holder lets go
        del w
    return len(holders)


@contextmanager
def as_stored(model: nn.Module, relaid: bool):
    """`model`'s weights as their files store them for a while, where they were relaid: a baseline run
    as mlx-lm itself would run it."""
    if relaid:
        relayout(model, stored=True)
    try:
        yield
    finally:
        if relaid:
            relayout(model)
