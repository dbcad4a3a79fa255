"""The Gated DeltaNet recurrence of a verify block (T = 1-16 tokens), as one compiled graph.

Off Metal, mlx-lm's `gated_delta_update` runs `gated_delta_ops`: a Python loop calling one compiled
step per token, each step its own graph of slices, broadcasts and two reductions. On the CPU backend
every MLX primitive costs several microseconds of dispatch whatever its size, and these states are
small (Hv x Dv x Dk floats), so an 8-token verify pays for 199 primitives per layer: the recurrence
was the largest part of what grows with the block in a hybrid's verify pass (README, rollback bench).

`gated_delta_verify_ref` computes exactly the same floats with 40 primitives: the
per-step operands are split once along time (no per-step slices), the grouped heads broadcast
instead of being repeated, and y is read from the stacked per-step states in one product and one
reduction after the loop. Every value is produced by the same IEEE operation on the same operands
as in `gated_delta_ops` (the reductions run over the same contiguous last axis, one row at a time),
so y and the state are bit-identical to it; tests/test_gated_delta_verify.py checks that on random
shapes (Hv > Hk, masks, T = 1-16, float32 and bfloat16 inputs).

Used on the CPU backend only. No Metal body: on Metal mlx-lm already runs its own fused kernel for any
T, and `gated_delta_update` below hands such calls (and any other GPU backend's) to mlx-lm unchanged, so
greedy output there stays mlx-lm's.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models import gated_delta as _gd

MAX_T = 16  # verify widths; longer calls (prefill chunks) keep mlx-lm's loop: a graph per length would grow with it


def _per_step(x: mx.array, shape: tuple) -> list[mx.array]:
    """x (B, T, ...) as T time-major pieces of `shape` (one Split, not T slices)."""
    x = (x if x.shape[0] == 1 else x.swapaxes(0, 1)).reshape(shape)  # B = 1: the same order, no transpose
    return mx.split(x, x.shape[0], axis=0) if x.shape[0] > 1 else [x]


def _recurrence(q, k, v, g, beta, state, mask):
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    r = Hv // Hk  # value heads per key head: mx.repeat(k, r, -2) puts value head h under key head h // r
    ks = _per_step(k, (T, B, Hk, 1, 1, Dk))
    gs = _per_step(g, (T, B, Hk, r, 1, 1))
    bs = _per_step(beta, (T, B, Hk, r, 1, 1))
    vs = _per_step(v, (T, B, Hk, r, Dv, 1))
    ms = None if mask is None else _per_step(mask, (T, B, 1, 1, 1, 1))
    s = state.reshape(1, B, Hk, r, Dv, Dk)
    seen = []  # the state each step's y reads (before the mask), as in gated_delta_ops
    for t in range(T):
        # gated_delta_ops' step, operation for operation: state * decay; kv_mem = sum(state * k);
        # delta = (v - kv_mem) * beta; state + k * delta. (g * s is s * g bit for bit; written this way
        # so that compile's common-subexpression pass leaves it inside the update's fused kernel.)
        kv = ((s * gs[t]) * ks[t]).sum(-1, keepdims=True)
        new = (gs[t] * s) + ks[t] * ((vs[t] - kv) * bs[t])
        seen.append(new)
        s = new if ms is None else mx.where(ms[t], new, s)
    states = mx.concatenate(seen, axis=0) if T > 1 else seen[0]
    y = (states * (q if B == 1 else q.swapaxes(0, 1)).reshape(T, B, Hk, 1, 1, Dk)).sum(-1)
    y = y.reshape(B, T, Hv, Dv) if B == 1 else mx.contiguous(y.reshape(T, B, Hv, Dv).swapaxes(0, 1))
    return y.astype(q.dtype), s.reshape(B, Hv, Dv, Dk)


_compiled = mx.compile(lambda q, k, v, g, beta, state: _recurrence(q, k, v, g, beta, state, None))
_compiled_masked = mx.compile(_recurrence)


def gated_delta_verify_ref(q, k, v, g, beta, state, mask=None):
    """`gated_delta_ops(q, k, v, g, beta, state, mask)`, bit for bit, as one compiled graph for
    T <= MAX_T and scalar gates; anything else runs `gated_delta_ops` itself.

    q, k: (B, T, Hk, Dk); v: (B, T, Hv, Dv); g, beta: (B, T, Hv); state: (B, Hv, Dv, Dk); mask: (B, T)."""
    T = q.shape[1]
    if not 1 <= T <= MAX_T or g.ndim != 3 or state is None or v.shape[-2] % q.shape[-2]:
        return _gd.gated_delta_ops(q, k, v, g, beta, state, mask)
    if mask is None:
        return _compiled(q, k, v, g, beta, state)
    return _compiled_masked(q, k, v, g, beta, state, mask)


def mlx_lm_uses_kernel(k: mx.array, use_kernel: bool) -> bool:
    """Whether mlx-lm's `gated_delta_update` would run its Metal kernel for this call (its own test)."""
    return (use_kernel and mx.default_device() == mx.gpu and mx.metal.is_available()
            and k.shape[-1] >= 32 and k.shape[-1] % 32 == 0)


def gated_delta_update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, *, use_kernel: bool = True,
                       lower_bound: float | None = None, allow_neg_eigval: bool = False):
    """mlx-lm's `gated_delta_update` (same arguments, same results), with the recurrence of calls it
    would run through `gated_delta_ops` on the CPU computed by `gated_delta_verify_ref`. Everything else
    goes to mlx-lm's function unchanged: Metal (its kernel), calls longer than MAX_T (prefill), and other
    GPU backends, where bit-identity of the stacked-state reduction has not been tested."""
    if mx.default_device() != mx.cpu or mlx_lm_uses_kernel(k, use_kernel) or q.shape[1] > MAX_T:
        return _gd.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, mask, use_kernel=use_kernel,
                                      lower_bound=lower_bound, allow_neg_eigval=allow_neg_eigval)
    # mlx-lm's preamble, with its own compiled gate functions
    beta = mx.sigmoid(b)
    if allow_neg_eigval:
        beta = beta * 2.0
    if lower_bound is None:
        g = _gd.compute_g(A_log, a, dt_bias)
    else:
        g = _gd.compute_lower_bound_g(A_log, a, dt_bias, lower_bound)
    if state is None:
        B, _, Hk, Dk = q.shape
        Hv, Dv = v.shape[-2:]
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    return gated_delta_verify_ref(q, k, v, g, beta, state, mask)
