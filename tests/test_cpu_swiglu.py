"""cpu_swiglu: several rows' SiLU in base 2 on the CPU, against mlx-lm's swiglu; where the target and the
drafter take it (greedy identity with mlx-lm through it: test_cpu_attention.py, test_lossless_greedy.py)."""

import mlx.core as mx
import pytest
from mlx_lm.models import qwen3
from mlx_lm.models.activations import swiglu

import mlx_spec
from mlx_spec import cpu_attention, cpu_swiglu


@pytest.mark.parametrize("dtype,tol", [(mx.float32, 1e-6), (mx.bfloat16, 2e-2)])
def test_matches_mlx_lms_swiglu(dtype, tol):
    gate = (mx.random.normal((2, 9, 96)) * 6).astype(dtype)  # far into both tails
    x = mx.random.normal((2, 9, 96)).astype(dtype)
    got, want = cpu_swiglu.swiglu(gate, x), swiglu(gate, x)
    assert got.dtype == want.dtype
    err = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)) / (mx.abs(want.astype(mx.float32)) + 1e-3)
    assert err.max().item() < tol


def test_where_it_runs(monkeypatch):
    monkeypatch.setattr(cpu_attention, "exp2_faster", lambda: True)
    assert cpu_swiglu.pays(mx.zeros((1, 2, 8))) and cpu_swiglu.pays(mx.zeros((3, 1, 8)))  # a block; batched rows
    assert not cpu_swiglu.pays(mx.zeros((1, 1, 8)))  # a one-token pass alone stays mlx-lm's
    monkeypatch.setattr(cpu_attention, "exp2_faster", lambda: False)  # a CPU whose exp is fast (NEON)
    assert not cpu_swiglu.pays(mx.zeros((1, 8, 8)))


def test_the_target_and_drafter_take_it_for_several_rows_only(target_dir, drafter_dir, monkeypatch):
    monkeypatch.setattr(cpu_attention, "exp2_faster", lambda: True)
    seen = []
    real = cpu_swiglu.swiglu
    monkeypatch.setattr(cpu_swiglu, "swiglu", lambda g, x: seen.append(g.shape[:2]) or real(g, x))
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir), mode="dflash")
    mlx_spec.generate(model, tok, "def add(a, b):", max_tokens=12, block_size=4)
    assert seen and all(b * rows > 1 for b, rows in seen)
    assert {rows for _, rows in seen} >= {4}  # verify blocks of 4
    off, _ = mlx_spec.load(str(target_dir), drafter=str(drafter_dir), mode="dflash", kernels=False)
    assert type(off.model.layers[0].mlp) is qwen3.MLP  # --no-kernels: mlx-lm's own
