"""Which BLAS MLX's float32 GEMMs run on (Linux CPU), and how to switch to an optimized one.

MLX's Linux CPU wheel bundles the reference BLAS (~2-6 GFLOP/s, one thread). Preloading an
optimized BLAS (Debian's OpenBLAS) takes over its `sgemm` symbols: measured ~30x faster here,
and a 16-token verify then costs ~1.6 one-token passes instead of ~16. It can only be chosen at
process start, so the CLI re-executes itself with LD_PRELOAD set (see `maybe_reexec`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)
PRELOAD_OPT_OUT = "MLX_SPEC_BLAS"  # "bundled" keeps MLX's own BLAS


@dataclass
class BlasInfo:
    loaded: list[str]  # BLAS libraries mapped into this process
    reference: bool  # MLX's slow bundled reference BLAS does the GEMMs
    optimized: str | None  # an optimized BLAS found on disk (or loaded)

    @property
    def advice(self) -> str:
        if not self.reference:
            threads = os.environ.get("OPENBLAS_NUM_THREADS")
            if not self.loaded or not threads:
                return "float32 GEMMs run on an optimized BLAS"
            return (f"float32 GEMMs run on an optimized BLAS, {threads} thread{'s' if threads != '1' else ''}"
                    f" (OPENBLAS_NUM_THREADS; `serve` defaults to every core, {usable_cores()})")
        if self.optimized:
            return f"slow reference BLAS in use; run with LD_PRELOAD={self.optimized} OPENBLAS_NUM_THREADS=1"
        return "slow reference BLAS in use; install an optimized one: apt-get install libopenblas0-pthread"


def blas_info() -> BlasInfo:
    import mlx.core  # noqa: F401  (maps MLX's libraries into the process)

    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:  # not Linux: MLX uses Accelerate on macOS
        return BlasInfo([], False, None)
    libs = sorted({line.split()[-1] for line in maps if "blas" in line.lower() and "/" in line})
    # numpy's own OpenBLAS (scipy_openblas) exports prefixed symbols and never serves MLX.
    optimized = next((p for p in libs if ("libopenblas" in p or "libmkl" in p) and "scipy_" not in p), None)
    # The bundled library is named libblas-<hash>.so in mlx_cpu.libs; preloaded OpenBLAS overrides it.
    reference = any("mlx_cpu.libs/libblas" in p for p in libs) and optimized is None
    found = optimized or next((p for p in OPENBLAS_CANDIDATES if Path(p).exists()), None)
    return BlasInfo(libs, reference, found)


def default_threads(argv: list[str]) -> int:
    """OpenBLAS threads for a command (OPENBLAS_NUM_THREADS overrides). `serve` batches many requests' rows
    into one pass, which OpenBLAS splits across cores: on two here, aggregate throughput at 4-8 clients
    rose 10-65% (README, "Speculation under load"). One stream's passes gain nothing and the
    idle threads spin beside MLX's own, so everything else runs on one, as do a distributed target's ranks
    (several may share a machine)."""
    if argv[:1] == ["serve"] and "--distributed" not in argv and "MLX_RANK" not in os.environ:
        return usable_cores()
    return 1


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def maybe_reexec(argv: list[str]) -> None:
    """On Linux, restart once with an optimized BLAS preloaded when one is installed and not in use."""
    if sys.platform != "linux" or os.environ.get(PRELOAD_OPT_OUT) == "bundled" or os.environ.get("_MLX_SPEC_REEXEC"):
        return
    lib = next((p for p in OPENBLAS_CANDIDATES if Path(p).exists()), None)
    if lib is None or lib in os.environ.get("LD_PRELOAD", ""):
        return
    env = dict(os.environ, _MLX_SPEC_REEXEC="1", LD_PRELOAD=":".join(filter(None, [lib, os.environ.get("LD_PRELOAD")])))
    env.setdefault("OPENBLAS_NUM_THREADS", str(default_threads(argv)))
    # Restart the same launcher, so the same installation runs again whatever the working directory holds.
    script = sys.argv[0]
    if os.path.basename(script) == "mlx-spec" and os.access(script, os.X_OK):
        os.execve(script, [script, *argv], env)
    os.execve(sys.executable, [sys.executable, "-m", "mlx_spec.cli", *argv], env)
