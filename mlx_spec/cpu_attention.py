"""A verify block's attention on MLX's CPU backend, where the softmax's exp is what long contexts cost.

On x86, MLX's CPU exp runs one element at a time (~15 ns each here; numpy's ~1.6 ns), and an L-token
block over S tokens of context takes H·L·S of them a layer: at 1,500 tokens, 15 of the embedded
target's 24 ms 8-token verify were attention, against 0.3 ms of products. `2 ** x` runs ~2.4x faster
than `exp(x)` there, so this softmax works in base 2 (log2 e folded into the queries' scale), and the
query heads sharing a KV head go through one product (their rows stacked, the keys never broadcast).
The same softmax up to float rounding (~1e-6 relative), not bit for bit: the target takes it for verify
blocks, prompt chunks and a batch's one-token rows, never for the one-token pass alone that plain
decoding matches mlx-lm with (kernels.py); the DFlash drafters' blocks take it too (drafts are
verified: they need no bit-identity). A prompt chunk's causal rows go 64 at a time, each over the keys
it sees: at 1,524 tokens that took the embedded target's time to first token from 1.23 to 0.82 s.
"""

from __future__ import annotations

import functools
import time

import mlx.core as mx

LOG2E = 1.4426950408889634
MIN_SCORES = 4096  # scores a layer below which the extra ops cost more than the cheaper exps save (measured)
ROWS = 64  # a prompt chunk's causal queries go this many at a time (measured: 512 rows over 1,536 keys 2x faster)


@functools.cache
def exp2_faster() -> bool:
    """Whether `2 ** x` beats `exp(x)` clearly on this CPU (x86: ~2.4x; NEON's vectorised exp: no)."""
    x = mx.random.uniform(-20.0, 0.0, (1 << 16,))
    mx.eval(x)

    def best(fn) -> float:
        times = []
        for _ in range(5):
            t = time.perf_counter()
            mx.eval(fn(x))
            times.append(time.perf_counter() - t)
        return min(times)

    return best(lambda a: mx.power(2.0, a)) < 0.7 * best(mx.exp)


def pays(queries: mx.array, keys: mx.array, mask) -> bool:
    """Where this formulation runs instead of `mx.fast.scaled_dot_product_attention`: the CPU, no mask, a
    causal or a boolean one, enough scores, and a machine whose exp is the slow part."""
    B, H, L, _ = queries.shape
    masks = mask is None or (isinstance(mask, str) and mask == "causal") or (
        isinstance(mask, mx.array) and mask.dtype == mx.bool_ and mask.ndim in (2, 4))
    return (masks and mx.default_device() == mx.cpu and B * H * L * keys.shape[2] >= MIN_SCORES
            and exp2_faster())


def sdpa(queries: mx.array, keys: mx.array, values: mx.array, *, scale: float, mask=None) -> mx.array:
    """`mx.fast.scaled_dot_product_attention`, or `attention` below where it pays."""
    if pays(queries, keys, mask):
        return attention(queries, keys, values, scale=scale, mask=mask)
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)


def attention(queries: mx.array, keys: mx.array, values: mx.array, *, scale: float, mask=None) -> mx.array:
    """softmax(q kᵀ · scale, masked) v for queries (B, H, L, D) and keys/values (B, Hkv, S, D); mask None,
    "causal" (the block at the last L positions) or a boolean array that broadcasts to (B, H, L, S)."""
    L, S = queries.shape[2], keys.shape[2]
    if isinstance(mask, str) and L > ROWS:
        # A prompt chunk, causal: a few rows at a time, each over the keys it sees, so the scores stay in the
        # cache between the softmax's passes and the masked-out triangle is never computed.
        pieces = [(i, min(i + ROWS, L)) for i in range(0, L, ROWS)]
        return mx.concatenate([_attention(queries[:, :, i:j], keys[:, :, : S - L + j], values[:, :, : S - L + j],
                                          scale, mask) for i, j in pieces], axis=2)
    return _attention(queries, keys, values, scale, mask)


def _attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask) -> mx.array:
    B, H, L, D = queries.shape
    Hkv, S = keys.shape[1], keys.shape[2]
    G = H // Hkv
    q = (queries * (scale * LOG2E)).reshape(B, Hkv, G * L, D)
    scores = (q @ keys.swapaxes(-1, -2)).reshape(B, Hkv, G, L, S).astype(mx.float32)
    if isinstance(mask, str):
        mask = mx.arange(S)[None] <= mx.arange(S - L, S)[:, None]
    elif mask is not None and mask.ndim == 4:  # (B|1, H|1, L|1, S): its heads split as the queries' are
        b, h, l, s = mask.shape
        mask = mask.reshape(b, Hkv, G, l, s) if h == H else mask.reshape(b, 1, 1, l, s)
    if mask is not None:  # (a row with no key left comes out uniform, as from mx.fast, not NaN)
        scores = mx.where(mask, scores, mx.finfo(mx.float32).min)
    e = mx.power(2.0, scores - scores.max(axis=-1, keepdims=True))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(values.dtype).reshape(B, Hkv, G * L, S)
    return (p @ values).reshape(B, H, L, D)
