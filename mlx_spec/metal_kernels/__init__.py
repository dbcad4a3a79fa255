"""Custom Metal kernels for the verify step, one kernel per file, each with a
plain-MLX twin. Selection between kernel and twin lives in `mlx_spec.kernels`.

Modules (each kernel wrapper is named like its module, e.g. `qmm_rows.qmm_rows`):
`qmm_rows`, `qmm_mma`, `verify_attention`, `fused_accept`."""

from . import fused_accept, qmm_mma, qmm_rows, verify_attention  # noqa: F401
from .fused_accept import fused_accept_ref
from .qmm_rows import quantized_matmul_ref
from .verify_attention import verify_attention_ref

__all__ = ["fused_accept", "qmm_mma", "qmm_rows", "verify_attention",
           "fused_accept_ref", "quantized_matmul_ref", "verify_attention_ref"]
