"""Start N local ranks of a script over the ring backend (as `mlx.launch --backend ring -n N` does:
a hostfile of local ports and MLX_RANK), with a hard timeout: a test can never hang on them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlx_spec.distributed.ranks import free_ports

REPO = Path(__file__).resolve().parent.parent


def blas_env() -> dict:
    """OpenBLAS preloaded, as the CLI starts itself (`platform_blas.maybe_reexec`): MLX's bundled reference
    BLAS makes every rank's passes several times slower (a served round: 100-650 ms instead of ~40)."""
    from mlx_spec.platform_blas import OPENBLAS_CANDIDATES, PRELOAD_OPT_OUT

    lib = next((p for p in OPENBLAS_CANDIDATES if Path(p).exists()), None)
    if lib is None or os.environ.get(PRELOAD_OPT_OUT) == "bundled":
        return {}
    return {"LD_PRELOAD": ":".join(filter(None, [lib, os.environ.get("LD_PRELOAD")])), "OPENBLAS_NUM_THREADS": "1"}


def start(n: int, args: list[str], env: dict | None = None, pin: bool = False) -> list[subprocess.Popen]:
    """The ranks of `python args...`, stdout/stderr to files (read with `finish`); `pin`: rank r on core r."""
    hostfile = Path(tempfile.mkstemp(suffix=".json")[1])
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(n)]))
    procs = []
    for rank in range(n):
        e = {**os.environ, **blas_env(), **(env or {}), "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile),
             "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        p = subprocess.Popen([*(["taskset", "-c", str(rank)] if pin else []), sys.executable, *args], env=e, stdout=out, stderr=err, cwd=REPO, start_new_session=True)
        p.out, p.err = out, err
        procs.append(p)
    return procs


def finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    """Wait for every rank (killing them all at the deadline): (returncode, stdout, stderr) per rank."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    results = []
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        p.out.seek(0), p.err.seek(0)
        results.append((p.returncode, p.out.read().decode(errors="replace"), p.err.read().decode(errors="replace")))
    return results


def run(n: int, args: list[str], timeout: float, env: dict | None = None) -> list[tuple[int, str, str]]:
    return finish(start(n, args, env), timeout)
