"""Greedy acceptance of a verify block in one kernel: the target's argmax per
row, the number of leading draft tokens it agrees with, and the bonus token.

logits: (M, V), row i is the target's prediction after token i of
[last, d_1 .. d_{M-1}]; draft: (M-1,) int32. accepted = first i with
d_{i+1} != argmax_i (or M-1), bonus = argmax_accepted."""

import mlx.core as mx

from ._portable import KernelSpec

# Floats compare as order-preserving ints (sign-magnitude flipped), so -inf
# logits stay ordered under Metal's fast math; -0.0 folds to +0.0.
_HEADER = """
#ifndef FLOAT_BITS
#define FLOAT_BITS(f) as_type<int>(f)
#endif
"""

# One threadgroup walks the rows; all its threads scan each row, reduce per
# SIMD group (largest key, then smallest index holding it), then across SIMD
# groups. Thread 0 alone writes and re-reads `target`, so no device fence.
_SOURCE = """
    constexpr int BIG = 0x7fffffff;
    const int M = logits_shape[0];
    const int V = logits_shape[1];
    const int t = int(thread_position_in_threadgroup.x);
    const int nt = int(threads_per_threadgroup.x);
    const uint lane = thread_index_in_simdgroup;
    const uint sg = simdgroup_index_in_threadgroup;
    const uint nsg = simdgroups_per_threadgroup;
    threadgroup int tkey[32];
    threadgroup int tidx[32];
    for (int r = 0; r < M; r++) {
        auto row = logits + size_t(r) * V;
        int best = -BIG - 1, bi = BIG;
        for (int i = t; i < V; i += nt) {
            int u = FLOAT_BITS(static_cast<float>(row[i]));
            int key = u == int(0x80000000) ? 0 : (u < 0 ? u ^ 0x7fffffff : u);
            if (key > best) { best = key; bi = i; }
        }
        int mk = simd_max(best);
        int mi = simd_min(best == mk ? bi : BIG);
        if (lane == 0) { tkey[sg] = mk; tidx[sg] = mi; }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (sg == 0) {
            int k2 = lane < nsg ? tkey[lane] : -BIG - 1;
            int i2 = lane < nsg ? tidx[lane] : BIG;
            int mk2 = simd_max(k2);
            int mi2 = simd_min(k2 == mk2 ? i2 : BIG);
            if (lane == 0) target[r] = mi2;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // tkey/tidx reused by the next row
    }
    if (t == 0) {
        int a = 0;
        while (a < M - 1 && draft[a] == target[a]) a++;
        accepted[0] = a;
        bonus[0] = target[a];
    }
"""

def make_spec(source: str = _SOURCE) -> KernelSpec:
    return KernelSpec(name="mlx_spec_fused_accept", input_names=("logits", "draft"),
                      output_names=("target", "accepted", "bonus"), source=source,
                      header=_HEADER)


SPEC = make_spec()


def launch(logits2, draft, *, threads: int = 1024) -> dict:
    m = logits2.shape[0]
    # pad so a 1-row block (no drafts) still binds a non-empty buffer
    draft = draft.astype(mx.int32) if draft.size else mx.zeros((1,), mx.int32)
    return dict(inputs=[logits2, draft], grid=(threads, 1, 1), threadgroup=(threads, 1, 1),
                output_shapes=[(m,), (1,), (1,)], output_dtypes=[mx.int32] * 3)


def fused_accept(logits: mx.array, draft: mx.array, *, threads: int = 1024, kernel=None,
                 **launch_kw) -> tuple[mx.array, mx.array, mx.array]:
    """(target argmax (M,), accepted length (), bonus token ()) as int32."""
    logits2 = logits.reshape(-1, logits.shape[-1])
    kernel = kernel or SPEC.metal()
    target, acc, bonus = kernel(**launch(logits2, draft.reshape(-1), threads=threads), **launch_kw)
    return target, acc[0], bonus[0]


def fused_accept_ref(logits: mx.array, draft: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """The plain-MLX twin."""
    target = mx.argmax(logits.reshape(-1, logits.shape[-1]), axis=-1).astype(mx.int32)
    n = draft.size
    agree = (draft.reshape(-1).astype(mx.int32) == target[:n]).astype(mx.int32)
    accepted = mx.cumprod(agree).sum() if n else mx.array(0, mx.int32)
    accepted = accepted.astype(mx.int32)
    return target, accepted, target[accepted]
