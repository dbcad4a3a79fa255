"""Few-row attention for the verify block: L = 2-16 queries per head against a
long KV cache, grouped-query heads, causal inside the block (query i sits at
position S - L + i). Two passes: partial softmax over KV splits, then merge.

q: (B, Hq, L, D); k, v: (B, Hkv, S, D), may be strided views of a larger
cache (mlx-lm's KVCache slices its buffer), so they are read through strides."""

import mlx.core as mx

from ._portable import KernelSpec, scalar_f32

# Pass 1. Threadgroup (split, b*Hkv + hk, row chunk): RT query rows of one KV
# head (rows of all G query heads sharing it) over SPLIT keys. Each SIMD group
# takes every SG-th key and keeps an online softmax per row, so a key is read
# once per chunk for all its rows; the SIMD groups then merge in threadgroup
# memory. Outputs are unnormalised: o = sum p*v, l = sum p, m = max score.
# Metal compiles with fast math, so "no score yet" is a finite -3e38, not -inf:
# exp(-3e38 - m) is 0 without any infinity arithmetic.
_PARTIAL = """
    constexpr int DPL = (D + 31) / 32;
    constexpr int R = G * L;
    const int S = k_shape[2];
    const int Hkv = k_shape[1];
    const int Hq = q_shape[1];
    const int NS = (S + SPLIT - 1) / SPLIT;
    const uint lane = thread_index_in_simdgroup;
    const int sg = int(simdgroup_index_in_threadgroup);
    const int split = int(threadgroup_position_in_grid.x);
    const int b = int(threadgroup_position_in_grid.y) / Hkv;
    const int hk = int(threadgroup_position_in_grid.y) % Hkv;
    const int r0 = int(threadgroup_position_in_grid.z) * RT;
    const int k_begin = split * SPLIT;
    const int k_end = metal::min(S, k_begin + SPLIT);
    const float sc = scale[0];

    threadgroup float tm[SG];
    threadgroup float tl[SG];
    threadgroup float to[SG][D];

    float qv[RT][DPL], o[RT][DPL], m[RT], l[RT];
    int last[RT];  // last visible key per row; -1 for padding rows
    for (int rr = 0; rr < RT; rr++) {
        int r = metal::min(r0 + rr, R - 1);
        int hq = hk * G + r / L, qi = r % L;
        last[rr] = r0 + rr < R ? S - L + qi : -1;
        auto qp = q + b * q_strides[0] + hq * q_strides[1] + qi * q_strides[2];
        for (int i = 0; i < DPL; i++) {
            int d = int(lane) + 32 * i;
            qv[rr][i] = d < D ? static_cast<float>(qp[d]) * sc : 0.0f;
            o[rr][i] = 0.0f;
        }
        m[rr] = -3.0e38f;
        l[rr] = 0.0f;
    }
    for (int j = k_begin + sg; j < k_end; j += SG) {
        auto kp = k + b * k_strides[0] + hk * k_strides[1] + j * k_strides[2];
        auto vp = v + b * v_strides[0] + hk * v_strides[1] + j * v_strides[2];
        float kv[DPL], vv[DPL];
        for (int i = 0; i < DPL; i++) {
            int d = int(lane) + 32 * i;
            kv[i] = d < D ? static_cast<float>(kp[d]) : 0.0f;
            vv[i] = d < D ? static_cast<float>(vp[d]) : 0.0f;
        }
        for (int rr = 0; rr < RT; rr++) {
            if (j > last[rr]) continue;  // uniform in the SIMD group
            float s = 0.0f;
            for (int i = 0; i < DPL; i++) s += qv[rr][i] * kv[i];
            s = simd_sum(s);
            float mn = metal::max(m[rr], s);
            float a = metal::exp(m[rr] - mn), p = metal::exp(s - mn);
            l[rr] = l[rr] * a + p;
            for (int i = 0; i < DPL; i++) o[rr][i] = o[rr][i] * a + p * vv[i];
            m[rr] = mn;
        }
    }
    for (int rr = 0; rr < RT; rr++) {
        if (lane == 0) { tm[sg] = m[rr]; tl[sg] = l[rr]; }
        for (int i = 0; i < DPL; i++) {
            int d = int(lane) + 32 * i;
            if (d < D) to[sg][d] = o[rr][i];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (sg == 0 && r0 + rr < R) {
            int r = r0 + rr, hq = hk * G + r / L, qi = r % L;
            float mm = -3.0e38f;
            for (int t = 0; t < SG; t++) mm = metal::max(mm, tm[t]);
            float ll = 0.0f, oo[DPL];
            for (int i = 0; i < DPL; i++) oo[i] = 0.0f;
            for (int t = 0; t < SG; t++) {
                float f = metal::exp(tm[t] - mm);
                ll += tl[t] * f;
                for (int i = 0; i < DPL; i++) {
                    int d = int(lane) + 32 * i;
                    if (d < D) oo[i] += to[t][d] * f;
                }
            }
            size_t row = (size_t(b * Hq + hq) * L + qi) * NS + split;
            for (int i = 0; i < DPL; i++) {
                int d = int(lane) + 32 * i;
                if (d < D) po[row * D + d] = oo[i];
            }
            if (lane == 0) { pm[row] = mm; pl[row] = ll; }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // MERGE_BARRIER: tm/tl/to reused
    }
"""

# Pass 2. One SIMD group per output row (b, hq, i): rescale and sum the splits.
# Split 0 always holds key 0, which every row sees, so mm is a real score.
_MERGE = """
    constexpr int DPL = (D + 31) / 32;
    const int NS = pm_shape[1];
    const size_t row = threadgroup_position_in_grid.y;
    const uint lane = thread_index_in_simdgroup;
    float mm = -3.0e38f;
    for (int s = 0; s < NS; s++) mm = metal::max(mm, pm[row * NS + s]);
    float den = 0.0f, acc[DPL];
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    for (int s = 0; s < NS; s++) {
        float ms = pm[row * NS + s];
        float f = metal::exp(ms - mm);
        den += pl[row * NS + s] * f;
        for (int i = 0; i < DPL; i++) {
            int d = int(lane) + 32 * i;
            if (d < D) acc[i] += po[(row * NS + s) * D + d] * f;
        }
    }
    for (int i = 0; i < DPL; i++) {
        int d = int(lane) + 32 * i;
        if (d < D) out[row * D + d] = static_cast<T>(acc[i] / den);
    }
"""

SG = 4  # SIMD groups per threadgroup in pass 1


def rows_per_threadgroup(d: int) -> int:
    # q and o take 2 * RT * ceil(D / 32) registers per lane: stay near 64
    return 8 if d <= 128 else 4


def make_partial_spec(source: str = _PARTIAL) -> KernelSpec:
    return KernelSpec(name="mlx_spec_attn_partial", input_names=("q", "k", "v", "scale"),
                      output_names=("po", "pm", "pl"), source=source, ensure_row_contiguous=False)


PARTIAL_SPEC = make_partial_spec()
MERGE_SPEC = KernelSpec(name="mlx_spec_attn_merge", input_names=("po", "pm", "pl"),
                        output_names=("out",), source=_MERGE)


def launch(q, k, v, *, scale: float, split: int) -> tuple[dict, dict]:
    """Keyword arguments of the two kernel calls."""
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    assert S >= L and Hq % Hkv == 0, (q.shape, k.shape)
    G, ns, rt = Hq // Hkv, -(-S // split), rows_per_threadgroup(D)
    rows = B * Hq * L
    partial = dict(
        inputs=[q, k, v, scalar_f32(scale)],
        template=[("D", D), ("G", G), ("L", L), ("RT", rt), ("SG", SG), ("SPLIT", split)],
        grid=(ns * SG * 32, B * Hkv, -(-G * L // rt)),
        threadgroup=(SG * 32, 1, 1),
        output_shapes=[(rows, ns, D), (rows, ns), (rows, ns)],
        output_dtypes=[mx.float32] * 3,
    )
    merge = dict(template=[("T", q.dtype), ("D", D)], grid=(32, rows, 1), threadgroup=(32, 1, 1),
                 output_shapes=[q.shape], output_dtypes=[q.dtype])
    return partial, merge


def verify_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, split: int = 256,
                     kernels=None, **launch_kw) -> mx.array:
    """Causal attention of L block queries over S >= L keys (GQA by Hq // Hkv).

    `kernels` is a (partial, merge) pair, the Metal kernels by default."""
    part_k, merge_k = kernels or (PARTIAL_SPEC.metal(), MERGE_SPEC.metal())
    partial, merge = launch(q, k, v, scale=scale, split=split)
    po, pm, pl = part_k(**partial, **launch_kw)
    return merge_k(inputs=[po, pm, pl], **merge, **launch_kw)[0]


def verify_attention_ref(q: mx.array, k: mx.array, v: mx.array, *, scale: float) -> mx.array:
    """The plain-MLX twin: bottom-right causal SDPA, as mlx-lm calls it."""
    mask = "causal" if q.shape[2] > 1 else None
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
