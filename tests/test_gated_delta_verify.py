"""The verify-width Gated DeltaNet recurrence (metal_kernels/gated_delta_verify.py) and its mixers (kernels.py).

Bit-identity, not closeness: the compiled recurrence must give mlx-lm's `gated_delta_ops` floats exactly
(y and state), so that greedy speculation on a qwen3_5 / qwen3_next / olmo_hybrid target stays token for
token mlx-lm's plain decoding. Greedy identity of the whole loop on those families with the substituted
mixers: tests/test_hybrid.py (which loads through `mlx_spec.load`, so these classes run there).
"""

import itertools

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import gated_delta as gd
from mlx_lm.models import qwen3_5
from mlx_lm.models.cache import make_prompt_cache

import archs
from mlx_spec import kernels as K
from mlx_spec.bench_models import PositionDrafter
from mlx_spec.engine.cache import PromptCache
from mlx_spec.metal_kernels import gated_delta_verify as gdv


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and mx.array_equal(a, b).item()


def _inputs(B, T, Hk, Hv, Dk, Dv, dtype, seed):
    mx.random.seed(seed)
    q, k = ((mx.random.normal((B, T, Hk, Dk)) * 0.3).astype(dtype) for _ in range(2))
    v = mx.random.normal((B, T, Hv, Dv)).astype(dtype)
    g = mx.random.uniform(0.2, 1.0, (B, T, Hv))
    beta = mx.random.uniform(0.0, 1.0, (B, T, Hv)).astype(dtype)
    return q, k, v, g, beta, mx.random.normal((B, Hv, Dv, Dk))


SHAPES = [(1, 4, 8, 32, 32), (2, 2, 2, 16, 8), (3, 1, 3, 8, 4)]  # (B, Hk, Hv, Dk, Dv): Hv = 2 Hk, Hv = Hk, Hv = 3 Hk


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-Hk{}-Hv{}-Dk{}-Dv{}".format(*s))
def test_twin_is_bit_identical_to_gated_delta_ops(shape):
    """T = 1..16, with and without a padding mask, float32 and bfloat16 inputs (the state stays float32)."""
    B, Hk, Hv, Dk, Dv = shape
    for T, masked, dtype in itertools.product(range(1, 17), (False, True), (mx.float32, mx.bfloat16)):
        if dtype == mx.bfloat16 and T % 3:  # bfloat16 on a subset of lengths: each length is its own graph
            continue
        q, k, v, g, beta, s = _inputs(B, T, Hk, Hv, Dk, Dv, dtype, seed=T)
        mask = (mx.random.uniform(shape=(B, T)) > 0.3) if masked else None
        y0, s0 = gd.gated_delta_ops(q, k, v, g, beta, s, mask)
        y1, s1 = gdv.gated_delta_verify_ref(q, k, v, g, beta, s, mask)
        assert _same(y0, y1) and _same(s0, s1), (T, masked, dtype)


def test_twin_is_not_merely_close():
    """The comparison above can fail: a recurrence that reassociates the state update (mathematically
    equal) differs in the last bits, and `_same` sees it."""
    q, k, v, g, beta, s = _inputs(1, 8, 4, 8, 32, 32, mx.float32, seed=0)
    y0, s0 = gd.gated_delta_ops(q, k, v, g, beta, s)
    kr = mx.repeat(k, 2, -2)
    st = s
    for t in range(8):  # g*(s) + k*delta with the decay folded into kv_mem: (s @ k) * g instead of (s * g) @ k
        kv = (st * kr[:, t][..., None, :]).sum(-1) * g[:, t][..., None]
        st = st * g[:, t][..., None, None] + kr[:, t][..., None, :] * ((v[:, t] - kv) * beta[:, t][..., None])[..., None]
    assert mx.allclose(st, s0, atol=1e-4).item() and not _same(st, s0)
    assert _same(gdv.gated_delta_verify_ref(q, k, v, g, beta, s)[1], s0)


@pytest.mark.parametrize("kw", [{}, {"allow_neg_eigval": True}, {"lower_bound": -5.0}, {"no_state": True}])
def test_update_matches_mlx_lm(kw):
    """Our `gated_delta_update` (the mixers' call) against mlx-lm's, gates computed from a and b; longer calls
    than MAX_T (prefill) are mlx-lm's own."""
    kw = dict(kw)
    no_state = kw.pop("no_state", False)
    for T in (1, 8, gdv.MAX_T + 4):
        q, k, v, _, _, s = _inputs(1, T, 2, 4, 16, 16, mx.float32, seed=T)
        a, b = mx.random.normal((1, T, 4)), mx.random.normal((1, T, 4))
        A_log, dt_bias = mx.random.normal((4,)), mx.random.normal((4,))
        state = None if no_state else s
        ref = gd.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, **kw)
        got = gdv.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, **kw)
        assert _same(ref[0], got[0]) and _same(ref[1], got[1]), (T, kw)


def _blocks(model):
    """Logits and final caches of a prompt, a decode step, a 7-token verify block and a 16-token one."""
    cache = make_prompt_cache(model)
    ids = [(5 * i) % 200 + 3 for i in range(40)]
    outs = [model(mx.array([ids[a:b]]), cache=cache) for a, b in ((0, 16), (16, 17), (17, 24), (24, 40))]
    mx.eval(outs, [c.state for c in cache])
    return outs + [x for c in cache for x in c.state if isinstance(x, mx.array)]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "olmo_hybrid"])
def test_patched_mixers_are_bit_identical(family, models_dir, tokenizer_dir):
    """Each family's Gated DeltaNet mixer becomes our subclass (parameters untouched), and logits and states
    over prefill, decode and verify blocks equal the unpatched model's bit for bit; a recording mixer
    (engine/recurrent.py) built on top keeps our recurrence for its replays."""
    path = archs.make(models_dir / f"gdv-{family}", tokenizer_dir, family, seed=5)
    ref_model, _ = mlx_lm.load(str(path))
    model, _ = mlx_lm.load(str(path))
    before = dict(tree_flatten(model.parameters()))
    K.patch_recurrence(model)
    swapped = [m for _, m in model.named_modules() if type(m) in K.RECURRENCE_SWAPS.values()]
    assert swapped and not any(type(m) in K.RECURRENCE_SWAPS for _, m in model.named_modules())
    after = dict(tree_flatten(model.parameters()))
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    for a, b in zip(_blocks(ref_model), _blocks(model)):
        assert _same(a, b)
    PromptCache(model, PositionDrafter())  # a speculating cache: the mixers become recording ones, on top of ours
    recording = [m for _, m in model.named_modules() if hasattr(type(m), "_spec_base")]
    assert recording and all(type(m)._spec_base in K.RECURRENCE_SWAPS.values() for m in recording)


def test_load_substitutes_the_mixers(models_dir, tokenizer_dir, monkeypatch):
    """mlx_spec.load substitutes the mixers whatever the kernels setting (here off), and on the CPU a verify
    block's recurrence is our graph, not a delegation to mlx-lm (which would pass the identity tests too)."""
    import mlx_spec

    path = archs.make(models_dir / "gdv-load-qwen3_5", tokenizer_dir, "qwen3_5", seed=6)
    model, _ = mlx_spec.load(str(path), drafter=None, kernels=False)
    kinds = {type(m) for _, m in model.target.model.named_modules()}
    assert K.RECURRENCE_SWAPS[qwen3_5.GatedDeltaNet] in kinds and qwen3_5.GatedDeltaNet not in kinds
    widths, real = [], gdv.gated_delta_verify_ref
    monkeypatch.setattr(gdv, "gated_delta_verify_ref", lambda q, *a: widths.append(q.shape[1]) or real(q, *a))
    monkeypatch.setattr(gd, "gated_delta_ops", lambda *a: pytest.fail("mlx-lm's loop ran"))
    mx.eval(model.target.model(mx.array([list(range(3, 11))]), cache=make_prompt_cache(model.target.model)))
    assert widths == [8, 8]  # both Gated DeltaNet layers


def test_a_mixer_that_stops_calling_the_recurrence_is_refused():
    class Other:
        def __call__(self, x, mask=None, cache=None):
            return x

    with pytest.raises(TypeError, match="gated_delta_update"):
        K._recurrence_call(Other)
