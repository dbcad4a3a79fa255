"""`mlx-spec doctor` and the optimized-BLAS path on Linux."""

import json
import os
import subprocess
import sys

import pytest

from mlx_spec.platform_blas import OPENBLAS_CANDIDATES, blas_info

HAS_OPENBLAS = sys.platform == "linux" and any(os.path.exists(p) for p in OPENBLAS_CANDIDATES)


def doctor(*args, **env):
    out = subprocess.run(["mlx-spec", "doctor", "--json", *args], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_doctor_reports_platform_and_curve(target_dir, drafter_dir, tmp_path):
    info = doctor("--model", str(target_dir), "--drafter", str(drafter_dir), "--long-context", "96,192",
                  MLX_SPEC_CACHE=str(tmp_path))
    for key in ("mlx", "mlx_lm", "device", "metal", "memory_gib", "blas", "cost_curve", "chosen_length", "long_context"):
        assert key in info
    assert [lc["context"] for lc in info["long_context"]] == [96, 192]
    for lc in info["long_context"]:  # prefill and verify cost at long context
        assert lc["prefill_ms_per_token"] > 0 and set(lc["verify_ms"]) == {"1", "8"} and lc["verify_ms"]["8"] > 0
    assert info["cost_curve"]["plain_step_ms"] > 0
    assert info["relaid"] == info["blas"]["reference"]  # weights relaid for the bundled BLAS only (cpu_layout.py)
    curve = info["cost_curve"]
    assert curve["verify_ratio"][0] == 1.0 and len(curve["verify_ratio"]) == 8 and len(curve["draft_ms"]) == 7
    assert curve["round_ratio"][0] == 1.0 and len(curve["round_ratio"]) == 8 and len(curve["host_ms"]) == 7
    assert curve["long_round_ratio"] == [] and curve["long_context"] is None  # a 512-token model: no long rounds
    assert all(0 <= k <= 7 for k in info["chosen_length"].values())


def test_recalibrate_replaces_a_mismeasured_curve(target_dir, drafter_dir, tmp_path):
    """A curve measured while the CPU was busy stays cached until `doctor --recalibrate` measures it again,
    batched rows (a server's) included."""
    args = ("--model", str(target_dir), "--drafter", str(drafter_dir), "--long-context", "")
    first = doctor(*args, MLX_SPEC_CACHE=str(tmp_path))["cost_curve"]["t1_ms"]
    [path] = (tmp_path / "curves").glob("*.json")
    curve = json.loads(path.read_text())
    curve["verify"] = [t * 100 for t in curve["verify"]]  # as if another job had held the CPU
    curve["batch"] = [[2, 1, 1.0], [2, 2, 1.0]]
    path.write_text(json.dumps(curve))
    assert doctor(*args, MLX_SPEC_CACHE=str(tmp_path))["cost_curve"]["t1_ms"] > 50 * first  # cached as it is
    again = doctor(*args, "--recalibrate", MLX_SPEC_CACHE=str(tmp_path))["cost_curve"]
    assert again["t1_ms"] < 10 * first
    assert {b for b, _, _ in again["batch_ms"]} == {2} and all(t < 1000 for _, _, t in again["batch_ms"])
    assert json.loads(path.read_text())["verify"][0] * 1e3 == pytest.approx(again["t1_ms"], rel=1e-3)
    out = subprocess.run(["mlx-spec", "doctor", "--no-curve", "--recalibrate"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and "--recalibrate measures the cost curve" in out.stderr


def test_in_process_blas_detection():
    info = blas_info()
    if sys.platform == "linux" and not os.environ.get("LD_PRELOAD"):
        assert info.reference  # pytest runs MLX's bundled reference BLAS
        assert "slow reference BLAS" in info.advice


@pytest.mark.skipif(not HAS_OPENBLAS, reason="no OpenBLAS installed (apt-get install libopenblas0-pthread)")
def test_cli_runs_on_optimized_blas_unless_opted_out():
    assert doctor("--no-curve")["blas"]["reference"] is False
    assert doctor("--no-curve", MLX_SPEC_BLAS="bundled")["blas"]["reference"] is True


def test_doctor_table_shows_the_long_rounds(capsys):
    from mlx_spec.commands.doctor import show

    info = {k: "-" for k in ("mlx_spec", "mlx", "mlx_lm", "python", "os", "device", "metal", "cuda", "memory_gib")}
    info |= {"blas": {"advice": "openblas"}, "model": "t", "drafter": "d", "chosen_length": {"0.7": 3},
             "cost_curve": {"t1_ms": 10.0, "plain_step_ms": 9.0, "verify_ratio": [1.0, 1.1], "draft_ms": [1.5],
                            "round_ratio": [1.0, 1.3], "long_context": 1024, "long_round_ratio": [1.2, 1.75],
                            "host_ms": [0.4]}}
    show(info)
    out = capsys.readouterr().out
    assert "… at 1024 tokens" in out and "1.20 1.75" in out and "round / plain step, k=0…" in out


def test_serve_runs_openblas_on_every_core_and_everything_else_on_one(monkeypatch):
    """A server's batched rounds split across cores; one stream's passes and a distributed target's ranks
    (several may share a machine) stay on one thread."""
    from mlx_spec.platform_blas import default_threads, usable_cores

    monkeypatch.delenv("MLX_RANK", raising=False)
    assert default_threads(["serve", "--port", "8080"]) == usable_cores()
    assert default_threads(["generate"]) == default_threads(["chat"]) == default_threads(["bench"]) == 1
    assert default_threads(["serve", "--distributed"]) == 1
    monkeypatch.setenv("MLX_RANK", "0")
    assert default_threads(["serve"]) == 1


@pytest.mark.skipif(not HAS_OPENBLAS, reason="no OpenBLAS installed (apt-get install libopenblas0-pthread)")
def test_the_cli_restarts_with_the_commands_thread_count_unless_the_user_set_one(monkeypatch):
    from mlx_spec.platform_blas import maybe_reexec, usable_cores

    envs = []
    monkeypatch.setattr(os, "execve", lambda path, args, env: envs.append(env))
    monkeypatch.setattr(sys, "argv", [sys.executable])  # restarts through `python -m mlx_spec.cli`: one execve
    for name in ("_MLX_SPEC_REEXEC", "MLX_SPEC_BLAS", "OPENBLAS_NUM_THREADS", "LD_PRELOAD", "MLX_RANK"):
        monkeypatch.delenv(name, raising=False)
    maybe_reexec(["serve"])
    maybe_reexec(["generate", "--prompt", "hi"])
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    maybe_reexec(["serve"])
    got = [e["OPENBLAS_NUM_THREADS"] for e in envs]
    assert got == [str(usable_cores()), "1", "3"] and all("libopenblas" in e["LD_PRELOAD"] for e in envs)
