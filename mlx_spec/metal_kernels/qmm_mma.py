"""Verify-width quantized matmul, SIMD-group-matrix form (Metal only), for
8-32 activation rows: each threadgroup dequantizes a 32-column weight tile
once into threadgroup memory and multiplies it with every 8-row block of x.

Same contract and twin as `qmm_rows` (affine 4/8-bit, mlx-lm packing)."""

import mlx.core as mx

from ._portable import KernelSpec
from .qmm_rows import out_dtype, quantized_matmul_ref  # noqa: F401  (shared twin)

# K advances in BK = 32 steps, which never straddle a quantization group and
# always divide K (mx.quantize needs K % group_size == 0, group_size >= 32).
_SOURCE = """
    constexpr int BK = 32;
    constexpr int BN = 8 * SG;
    constexpr int PACK = 32 / BITS;
    constexpr uint MASK = (1u << BITS) - 1u;
    constexpr int NT = SG * 32;
    const int K = x_shape[1];
    const int N = w_shape[0];
    const int tid = int(thread_index_in_threadgroup);
    const int sg = int(simdgroup_index_in_threadgroup);
    const int nb = int(threadgroup_position_in_grid.x) * BN;

    threadgroup float xs[MT * 8][BK];
    threadgroup float ws[BN][BK];
    threadgroup float os[MT * 8][BN];

    simdgroup_float8x8 acc[MT];
    for (int t = 0; t < MT; t++) acc[t] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

    for (int k0 = 0; k0 < K; k0 += BK) {
        // x rows past M are zero so the padded 8-row blocks add nothing
        for (int i = tid; i < MT * 8 * BK; i += NT) {
            int m = i / BK, kk = i % BK;
            xs[m][kk] = m < M ? static_cast<float>(x[size_t(m) * K + k0 + kk]) : 0.0f;
        }
        // each thread dequantizes 8 consecutive values of one column
        for (int i = tid; i < BN * (BK / 8); i += NT) {
            int c = i / (BK / 8), kk = (i % (BK / 8)) * 8, n = nb + c;
            if (n < N) {
                auto wr = w + size_t(n) * (K / PACK) + (k0 + kk) / PACK;
                size_t g = size_t(n) * (K / GS) + (k0 + kk) / GS;
                float s = static_cast<float>(scales[g]), b = static_cast<float>(biases[g]);
                for (int j = 0; j < 8 / PACK; j++) {
                    uint word = wr[j];
                    for (int v = 0; v < PACK; v++)
                        ws[c][kk + j * PACK + v] = s * float((word >> (v * BITS)) & MASK) + b;
                }
            } else {
                for (int v = 0; v < 8; v++) ws[c][kk + v] = 0.0f;
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int kk = 0; kk < BK; kk += 8) {
            simdgroup_float8x8 bm;
            simdgroup_load(bm, &ws[sg * 8][kk], BK, ulong2(0, 0), true);  // B[k][n] = ws[n][k]
            for (int t = 0; t < MT; t++) {
                simdgroup_float8x8 am;
                simdgroup_load(am, &xs[t * 8][kk], BK);
                simdgroup_multiply_accumulate(acc[t], am, bm, acc[t]);
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (int t = 0; t < MT; t++) simdgroup_store(acc[t], &os[t * 8][sg * 8], BN);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = tid; i < M * BN; i += NT) {
        int m = i / BN, c = i % BN, n = nb + c;
        if (n < N) y[size_t(m) * N + n] = static_cast<O>(os[m][c]);
    }
"""

SG = 4  # SIMD groups per threadgroup: 32 output columns

SPEC = KernelSpec(name="mlx_spec_qmm_mma", input_names=("x", "w", "scales", "biases"),
                  output_names=("y",), source=_SOURCE,
                  header="#include <metal_simdgroup_matrix>\n", portable=False)


def launch(x2, w, scales, biases, *, group_size: int, bits: int) -> dict:
    """Keyword arguments of the kernel call for x2 of shape (M, K)."""
    m, n = x2.shape[0], w.shape[0]
    n_tg = -(-n // (8 * SG))
    return dict(
        inputs=[x2, w, scales, biases],
        template=[("O", out_dtype(x2, scales)), ("M", m), ("MT", -(-m // 8)), ("SG", SG),
                  ("BITS", bits), ("GS", group_size)],
        grid=(n_tg * SG * 32, 1, 1),
        threadgroup=(SG * 32, 1, 1),
        output_shapes=[(m, n)],
        output_dtypes=[out_dtype(x2, scales)],
    )


def qmm_mma(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, *,
            group_size: int, bits: int, kernel=None, **launch_kw) -> mx.array:
    """x (..., K) @ dequantize(w).T with 1 <= prod(x.shape[:-1]) <= 32."""
    x2 = x.reshape(-1, x.shape[-1])
    kernel = kernel or SPEC.metal()
    y = kernel(**launch(x2, w, scales, biases, group_size=group_size, bits=bits), **launch_kw)[0]
    return y.reshape(*x.shape[:-1], w.shape[0])
