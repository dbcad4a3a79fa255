"""Verify-width quantized matmul, SIMD-reduction form: y = x @ dequant(w).T
for 2-32 activation rows, each packed weight word read once for all rows.

Affine 4/8-bit weights in mlx-lm's packing: `w` is (N, K*bits/32) uint32 with
the lowest bits first, `scales`/`biases` are (N, K/group_size)."""

import mlx.core as mx

from ._portable import KernelSpec

# One SIMD group owns RN output columns for all M rows; its lanes split K in
# chunks of 8 values, so a chunk never straddles a group (group sizes are
# multiples of 32). sum((s*q + b) * x) = s*sum(q*x) + b*sum(x) per chunk.
_SOURCE = """
    constexpr int PACK = 32 / BITS;
    constexpr int VPT = 8;
    constexpr uint MASK = (1u << BITS) - 1u;
    const int K = x_shape[1];
    const int N = w_shape[0];
    const uint lane = thread_index_in_simdgroup;
    const int n0 = (int(threadgroup_position_in_grid.x) * SG + int(simdgroup_index_in_threadgroup)) * RN;

    float acc[M][RN];
    for (int m = 0; m < M; m++)
        for (int r = 0; r < RN; r++) acc[m][r] = 0.0f;

    for (int k = int(lane) * VPT; k < K; k += 32 * VPT) {
        float q[RN][VPT];
        float s[RN];
        float b[RN];
        for (int r = 0; r < RN; r++) {
            // clamp: columns past N load row N-1 and are never stored
            int n = CLAMP_N;
            auto wr = w + size_t(n) * (K / PACK) + k / PACK;
            for (int j = 0; j < VPT / PACK; j++) {
                uint word = wr[j];
                for (int i = 0; i < PACK; i++)
                    q[r][j * PACK + i] = float((word >> (i * BITS)) & MASK);
            }
            size_t g = size_t(n) * (K / GS) + k / GS;
            s[r] = static_cast<float>(scales[g]);
            b[r] = static_cast<float>(biases[g]);
        }
        for (int m = 0; m < M; m++) {
            auto xr = x + size_t(m) * K + k;
            float xv[VPT];
            float xs = 0.0f;
            for (int i = 0; i < VPT; i++) {
                xv[i] = static_cast<float>(xr[i]);
                xs += xv[i];
            }
            for (int r = 0; r < RN; r++) {
                float d = 0.0f;
                for (int i = 0; i < VPT; i++) d += q[r][i] * xv[i];
                acc[m][r] += s[r] * d + b[r] * xs;
            }
        }
    }
    for (int m = 0; m < M; m++) {
        for (int r = 0; r < RN; r++) {
            float v = simd_sum(acc[m][r]);
            int n = n0 + r;
            if (lane == 0 && n < N) y[size_t(m) * N + n] = static_cast<O>(v);
        }
    }
"""

SG = 2  # SIMD groups per threadgroup


def make_spec(clamp: str = "metal::min(n0 + r, N - 1)", name: str = "mlx_spec_qmm_rows") -> KernelSpec:
    """The spec; tests build a broken variant (no clamp) to prove ASan sees it."""
    return KernelSpec(name=name, input_names=("x", "w", "scales", "biases"), output_names=("y",),
                      source=_SOURCE.replace("CLAMP_N", clamp))


SPEC = make_spec()


def columns_per_simdgroup(m: int) -> int:
    # keep acc[M][RN] + q[RN][8] within a few dozen registers
    return 4 if m <= 8 else 2 if m <= 16 else 1


def out_dtype(x: mx.array, scales: mx.array) -> mx.Dtype:
    return mx.result_type(x, scales)


def launch(x2, w, scales, biases, *, group_size: int, bits: int) -> dict:
    """Keyword arguments of the kernel call for x2 of shape (M, K)."""
    m, n = x2.shape[0], w.shape[0]
    rn = columns_per_simdgroup(m)
    n_tg = -(-n // (SG * rn))
    return dict(
        inputs=[x2, w, scales, biases],
        template=[("O", out_dtype(x2, scales)), ("M", m), ("RN", rn), ("SG", SG),
                  ("BITS", bits), ("GS", group_size)],
        grid=(n_tg * SG * 32, 1, 1),
        threadgroup=(SG * 32, 1, 1),
        output_shapes=[(m, n)],
        output_dtypes=[out_dtype(x2, scales)],
    )


def qmm_rows(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, *,
             group_size: int, bits: int, kernel=None, **launch_kw) -> mx.array:
    """x (..., K) @ dequantize(w).T with 1 <= prod(x.shape[:-1]) <= 32.

    `kernel` defaults to the Metal kernel; `launch_kw` reaches the kernel call
    (simulator schedules in the tests)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    kernel = kernel or SPEC.metal()
    y = kernel(**launch(x2, w, scales, biases, group_size=group_size, bits=bits), **launch_kw)[0]
    return y.reshape(*x.shape[:-1], w.shape[0])


def quantized_matmul_ref(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, *,
                         group_size: int, bits: int) -> mx.array:
    """The plain-MLX twin: exactly what `nn.QuantizedLinear` computes."""
    return mx.quantized_matmul(x, w, scales=scales, biases=biases, transpose=True,
                               group_size=group_size, bits=bits, mode="affine")
