"""cpu_attention: a verify block's base-2 softmax on the CPU, against mx.fast's SDPA, and the loop through it:
greedy speculative output at long context still equals mlx-lm's plain decoding, alone and batched."""

import mlx.core as mx
import pytest
from mlx_lm.models import qwen3

import factory
import mlx_spec
from mlx_spec import cpu_attention, kernels
from mlx_spec.engine.sampling import SamplingParams
from test_batch import alone, together
from test_lossless_greedy import plain, spec


def qkv(B, H, Hkv, L, S, dtype=mx.float32, seed=0):
    mx.random.seed(seed)
    return [mx.random.normal(shape).astype(dtype) for shape in ((B, H, L, 64), (B, Hkv, S, 64), (B, Hkv, S, 64))]


def row_mask(B, L, S):
    """Each row's block ends a few keys before the last (as a batch's shorter rows do), [B, 1, L, S]."""
    last = mx.array([S - 1 - 3 * b for b in range(B)])[:, None, None] - mx.arange(L)[::-1][None, :, None]
    return (mx.arange(S)[None, None] <= last)[:, None]


@pytest.mark.parametrize("H,Hkv", [(4, 2), (8, 8), (8, 1), (6, 2)])
@pytest.mark.parametrize("L,S", [(2, 2), (5, 40), (8, 700), (16, 300), (150, 150), (130, 400)])  # prompt chunks last
@pytest.mark.parametrize("B", [1, 3])
def test_matches_sdpa(H, Hkv, L, S, B):
    q, k, v = qkv(B, H, Hkv, L, S)
    for mask in ["causal", row_mask(B, L, S), row_mask(1, L, S)[0, 0]]:
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
        got = cpu_attention.attention(q, k, v, scale=0.125, mask=mask)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert mx.abs(got - want).max().item() < 1e-5


def test_per_head_mask_and_half_precision():
    q, k, v = qkv(2, 4, 2, 8, 90, mx.bfloat16)
    heads = mx.random.uniform(shape=(2, 4, 8, 90)) < 0.7
    mask = heads | (mx.arange(90) == 0)  # every row sees at least one key
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
    got = cpu_attention.attention(q, k, v, scale=0.125, mask=mask)
    assert got.dtype == mx.bfloat16
    assert mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item() < 2e-2


def test_where_it_runs(monkeypatch):
    q, k, _ = qkv(1, 4, 2, 8, 200)
    assert cpu_attention.pays(q, k, "causal") == cpu_attention.exp2_faster()
    assert not cpu_attention.pays(q[:, :, :2], k[:, :, :20], "causal")  # too few scores: the extra ops cost more
    assert not cpu_attention.pays(q, k, mx.zeros((1, 1, 8, 200)))  # an additive mask: left to mx.fast
    assert not cpu_attention.pays(q, k, mx.ones((1, 8, 200), mx.bool_))  # a 3-d mask: its axes are ambiguous
    monkeypatch.setattr(cpu_attention, "exp2_faster", lambda: False)  # a CPU whose exp is fast (NEON)
    assert not cpu_attention.pays(q, k, "causal")


@pytest.fixture
def calls(monkeypatch):
    """The blocks that went through cpu_attention, as (whose, queries' shape): "target" inside the target's
    verify attention, else "drafter" (on any machine: its exp race is forced)."""
    seen, inside = [], []
    attention, verify = cpu_attention.attention, kernels.verify_attention

    def spy_attention(*a, **kw):
        seen.append(("target" if inside else "drafter", a[0].shape))
        return attention(*a, **kw)

    def spy_verify(*a, **kw):
        inside.append(1)
        try:
            return verify(*a, **kw)
        finally:
            inside.pop()

    monkeypatch.setattr(cpu_attention, "exp2_faster", lambda: True)
    monkeypatch.setattr(cpu_attention, "attention", spy_attention)
    monkeypatch.setattr(kernels, "verify_attention", spy_verify)
    return seen


LONG = "def add(a, b):\n    return a + b\n" * 12  # 240 tokens (of the test target's 512): past MIN_SCORES for every block


def test_long_context_greedy_matches_plain(target_dir, models_dir, calls):
    drafter = models_dir / "qwen3-dflash-b16"
    if not drafter.exists():
        factory.make_drafter(drafter, target_dir, block_size=16)
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter), mode="dflash")
    ref = plain(target_dir, LONG, 40)
    for block in (2, 8, 16):
        calls.clear()
        got, _ = spec(model, tok, LONG, 40, block_size=block)
        assert got == ref, block
        target = [shape[2] for whose, shape in calls if whose == "target"]
        assert max((rows for rows in target if rows <= 16), default=0) == (block if block >= 8 else 0)  # 2: too few scores
        assert any(rows > 16 for rows in target)  # the prompt too (time to first token)
        assert {shape[2] for whose, shape in calls if whose == "drafter"} == {16}  # its whole block, always


def test_the_bench_baseline_runs_mlx_lms_own_attention(target_dir, calls):
    from mlx_spec import bench

    model, tok = mlx_spec.load(str(target_dir), drafter=None)
    got = bench.run_plain(model, tok, bench.encode(tok, {"raw": LONG}), 8).tokens
    assert not calls  # neither its prompt nor its one-token passes went through ours
    assert model.target.kernels.enabled  # and ours are back after it
    assert got == plain(target_dir, LONG, 8)


def test_no_kernels_keeps_the_targets_attention(target_dir, drafter_dir, calls):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir), mode="dflash", kernels=False)
    assert type(model.model.layers[0].self_attn) is qwen3.Attention  # mlx-lm's own, unpatched
    got, _ = spec(model, tok, LONG, 20, block_size=8)
    assert got == plain(target_dir, LONG, 20)
    assert calls and all(whose == "drafter" for whose, _ in calls)  # drafts need no identity


def test_batched_rows_at_long_context_decode_as_alone(target_dir, drafter_dir, calls):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir), mode="dflash")
    requests = [(LONG, SamplingParams(), 4), (LONG[:200] + "class Stack:", SamplingParams(), 8),
                (LONG + "import os", SamplingParams(temperature=0.8, top_k=20, seed=3), 6)]
    want = [alone(model, tok, r) for r in requests]
    calls.clear()
    assert together(model, tok, requests, join_at=[0, 0, 2]) == want
    assert any(whose == "target" and shape[0] > 1 for whose, shape in calls)  # batched blocks (a mask per row) too


def test_a_batch_of_plain_rows_at_long_context_decodes_as_alone(target_dir, drafter_dir, calls):
    """A batch's one-token rows take the CPU attention (mx.fast's masked batch is the slow one); a one-token
    pass alone stays mlx-lm's own."""
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir), mode="dflash")
    longer = LONG + LONG[: len(LONG) // 2]  # 360 tokens: 3 rows' one-token passes past MIN_SCORES
    requests = [(longer, SamplingParams(), 1), (longer[:400] + "class Stack:", SamplingParams(), 1),
                (longer + "import os", SamplingParams(temperature=0.8, top_k=20, seed=3), 1)]
    want = [alone(model, tok, r) for r in requests]
    assert not [shape for whose, shape in calls if whose == "target" and shape[2] == 1]
    calls.clear()
    assert together(model, tok, requests, join_at=[0, 0, 2]) == want
    assert any(whose == "target" and shape[0] > 1 and shape[2] == 1 for whose, shape in calls)
