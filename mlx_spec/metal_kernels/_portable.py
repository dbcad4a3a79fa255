"""One kernel body for `mx.fast.metal_kernel` and `mx.fast.cuda_kernel`.

Portable bodies use Metal's builtin names (the CUDA header below maps them),
spell `threadgroup` only in declarations, use `auto` for pointers (MLX may pass
small inputs in the `constant` address space), take no 0-d inputs, and launch
grids that are whole threadgroups (CUDA rounds the grid up to whole blocks).
"""

from dataclasses import dataclass
from functools import lru_cache

import mlx.core as mx

# Metal names on CUDA, for 1-D threadgroups of whole 32-lane SIMD groups.
CUDA_HEADER = r"""
#define thread_position_in_grid make_uint3(blockIdx.x * blockDim.x + threadIdx.x, blockIdx.y * blockDim.y + threadIdx.y, blockIdx.z * blockDim.z + threadIdx.z)
#define thread_position_in_threadgroup threadIdx
#define threadgroup_position_in_grid blockIdx
#define threads_per_threadgroup blockDim
#define thread_index_in_simdgroup (threadIdx.x % 32u)
#define simdgroup_index_in_threadgroup (threadIdx.x / 32u)
#define simdgroups_per_threadgroup ((blockDim.x + 31u) / 32u)
#define threadgroup __shared__
#define threadgroup_barrier(...) __syncthreads()
#define FLOAT_BITS(f) __float_as_int(f)
typedef unsigned int uint;
namespace metal {
__device__ inline float exp(float x) { return ::expf(x); }
template <class T> __device__ inline T max(T a, T b) { return a < b ? b : a; }
template <class T> __device__ inline T min(T a, T b) { return b < a ? b : a; }
}
// the ascending xor butterfly (1, 2, 4, 8, 16) that msim uses for simd_*
template <class T> __device__ T simd_sum(T v) {
  for (int o = 1; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class T> __device__ T simd_max(T v) {
  for (int o = 1; o < 32; o <<= 1) v = metal::max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <class T> __device__ T simd_min(T v) {
  for (int o = 1; o < 32; o <<= 1) v = metal::min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
"""


@dataclass(frozen=True)
class KernelSpec:
    """The arguments of `mx.fast.metal_kernel`, kept so tests can build the same
    kernel under a simulator; `portable` bodies also build as CUDA kernels."""

    name: str
    input_names: tuple
    output_names: tuple
    source: str
    header: str = ""
    ensure_row_contiguous: bool = True
    portable: bool = True

    def kwargs(self) -> dict:
        return dict(name=self.name, input_names=list(self.input_names),
                    output_names=list(self.output_names), source=self.source,
                    header=self.header, ensure_row_contiguous=self.ensure_row_contiguous)

    def metal(self):
        return _build_metal(self)

    def cuda(self):
        if not self.portable:
            raise ValueError(f"{self.name} has no CUDA twin")
        return _build_cuda(self)


@lru_cache(maxsize=None)
def _build_metal(spec: KernelSpec):
    # building works on every backend; calling needs Metal
    return mx.fast.metal_kernel(**spec.kwargs())


@lru_cache(maxsize=None)
def _build_cuda(spec: KernelSpec):
    kw = spec.kwargs()
    kw["header"] = CUDA_HEADER + spec.header
    return mx.fast.cuda_kernel(**kw)


def scalar_f32(v: float) -> mx.array:
    """A 1-element float32 input (0-d inputs are not portable to CUDA)."""
    return mx.array([v], dtype=mx.float32)
