"""The CUDA side of a portable kernel body: the source `mx.fast.cuda_kernel`
would JIT-compile, generated here (the CPU wheel cannot build CUDA kernels)
and compiled with `nvcc -c` (no GPU needed, nothing runs)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import mlx.core as mx

CUDA_T = {mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16",
          mx.int32: "int32_t", mx.uint32: "uint32_t", mx.int64: "int64_t", mx.bool_: "bool"}

# Stand-in for MLX's JIT header, which the wheels do not ship as a file.
STUB_UTILS = """#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cstdint>
#define MAX_NDIM 10
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, MAX_NDIM>;
using Strides = cuda::std::array<int64_t, MAX_NDIM>;
}
using namespace mlx::core::cu;
"""


def nvcc() -> str | None:
    return shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc") or None


def mlx_cuda_source(name, input_names, inputs, output_names, output_dtypes, source, header, template):
    """Port of build_kernel() in mlx/backend/cuda/custom_kernel.cpp (MLX 0.32)."""
    s = '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
    s += header + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
    h = "".join(f"_{v}" if not isinstance(v, mx.Dtype) else f"_{CUDA_T[v]}" for _, v in template or [])
    s += f"__global__ void custom_kernel_{name}{h}(\n"
    for n, a in zip(input_names, inputs):
        s += f"    const {CUDA_T[a.dtype]}* {n},\n"
        if a.ndim > 0:
            for suffix, typ in (("_shape", "Shape"), ("_strides", "Strides"), ("_ndim", "int")):
                if n + suffix in source:
                    s += f"    const __grid_constant__ {typ} {n}{suffix},\n"
    s += ",\n".join(f"    {CUDA_T[d]}* {n}" for n, d in zip(output_names, output_dtypes)) + ") {\n"
    for n, v in template or []:
        if isinstance(v, mx.Dtype):
            s += f"  using {n} = {CUDA_T[v]};\n"
        elif isinstance(v, bool):
            s += f"  constexpr bool {n} = {str(v).lower()};\n"
        else:
            s += f"  constexpr int {n} = {v};\n"
    return s + "\n" + source + "\n}\n\n} // namespace mlx::core::cu\n"


def compile_cuda(spec, header: str, call: dict, arch: str = "sm_90") -> subprocess.CompletedProcess:
    """nvcc -c the CUDA source of `spec` (a metal_kernels KernelSpec) for one call."""
    src = mlx_cuda_source(spec.name, spec.input_names, call["inputs"], spec.output_names,
                          call["output_dtypes"], spec.source, header + spec.header,
                          call.get("template"))
    with tempfile.TemporaryDirectory(prefix="mlx-spec-nvcc-") as d:
        inc = os.path.join(d, "stub", "mlx", "backend", "cuda", "device")
        os.makedirs(inc)
        with open(os.path.join(inc, "utils.cuh"), "w") as f:
            f.write(STUB_UTILS)
        path = os.path.join(d, f"{spec.name}.cu")
        with open(path, "w") as f:
            f.write(src)
        return subprocess.run(["nice", "-n", "10", nvcc(), "-c", "-std=c++17", f"-arch={arch}",
                               "-I", os.path.join(d, "stub"), path, "-o", path[:-3] + ".o"],
                              capture_output=True, text=True)
