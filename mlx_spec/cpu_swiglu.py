"""SwiGLU's SiLU in base 2 on MLX's CPU backend, for the same reason as cpu_attention.py's softmax.

`silu(g) = g · sigmoid(g)` takes one `exp` an element, and MLX's CPU `exp` runs one element at a time on
x86 (~15 ns): mlx-lm's compiled `swiglu` over a 9-row verify block of the embedded target (768 wide) took
0.22 ms a layer, `g / (1 + 2^(-g·log2 e)) · u` 0.10 (512 prompt rows: 7.8 -> 4.8 ms). The same values to
~3e-7 relative, not bit for bit: the target takes it for several rows at once (verify blocks, prompt
chunks, a batch's one-token rows), never for a one-token pass alone, as with the attention (kernels.py).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models import llama, qwen3

from . import cpu_attention
from .cpu_attention import LOG2E


def pays(x: mx.array) -> bool:
    """Where this SiLU runs instead of mlx-lm's on the CPU (the caller knows it is on it: `KernelConfig.on_cpu`):
    several rows, a CPU whose exp is the slow part."""
    return x.size >= 2 * x.shape[-1] and cpu_attention.exp2_faster()


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    g = gate.astype(mx.float32)  # (half precision: the SiLU in float32, as mlx-lm's compiled one comes out)
    return (g / (1 + mx.power(2.0, g * -LOG2E))).astype(gate.dtype) * x


class _SwiGLU:
    """The mlx-lm qwen3/llama MLP, several rows' SiLU through `swiglu` above on the CPU (one row alone, or
    Metal's kernels on, or `--no-kernels`: the original body). Swapped in by `kernels.patch_model`, which
    sets `_kernel_config`."""

    def __call__(self, x):
        cfg = self._kernel_config
        if not (cfg.on_cpu and not cfg.active and pays(x)):
            return super().__call__(x)
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class Qwen3MLP(_SwiGLU, qwen3.MLP):
    pass


class LlamaMLP(_SwiGLU, llama.MLP):
    pass


MLP_SWAPS = {qwen3.MLP: Qwen3MLP, llama.MLP: LlamaMLP}
