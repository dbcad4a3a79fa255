"""mlx_spec.kernels: per-shape selection, its cache, the entry points, and
patch_model on a tiny quantized mlx-lm qwen3 model."""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np
import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3
from mlx_lm.models.cache import make_prompt_cache

from msim.cases import assert_close, normal, sim
from mlx_spec import kernels as K
from mlx_spec.metal_kernels import fused_accept_ref, verify_attention_ref

def sim_config(**kw):
    """Kernels forced on and run by the simulator (Metal is absent here)."""
    return K.KernelConfig(make_kernel=sim, force="kernel", **kw)


def tiny_qwen3(bits, group_size, dtype=mx.float32, tied=True, seed=0):
    mx.random.seed(seed)
    args = qwen3.ModelArgs(model_type="qwen3", hidden_size=64, num_hidden_layers=2,
                           intermediate_size=128, num_attention_heads=4, rms_norm_eps=1e-6,
                           vocab_size=256, num_key_value_heads=2, max_position_embeddings=512,
                           head_dim=16, tie_word_embeddings=tied, rope_theta=10000.0)
    model = qwen3.Model(args)
    model.set_dtype(dtype)
    nn.quantize(model, group_size=group_size, bits=bits)
    mx.eval(model.parameters())
    return model


def logits_of(model, blocks=((0, 1, 2, 3, 4, 5, 6), (7,), (8, 9, 10, 11, 12))):
    # a prompt, one decode step, then a 5-token verify block
    cache = make_prompt_cache(model)
    outs = [model(mx.array([list(b)]), cache=cache) for b in blocks]
    mx.eval(outs)
    return outs


@pytest.mark.parametrize("bits,gs,dtype,tied", [(4, 64, mx.float32, True), (8, 32, mx.bfloat16, False)],
                         ids=["q4g64-f32-tied", "q8g32-bf16"])
def test_patch_model_is_bit_identical_on_cpu(bits, gs, dtype, tied):
    model = tiny_qwen3(bits, gs, dtype, tied)
    before = logits_of(model)
    params = {k: v for k, v in tree_flatten(model.parameters())}
    K.patch_model(model, K.KernelConfig())
    kinds = {type(m) for _, m in model.named_modules()}
    assert nn.QuantizedLinear not in kinds and K.VerifyQuantizedLinear in kinds
    assert qwen3.Attention not in kinds and K.VerifyQwen3Attention in kinds
    assert K.VerifyQuantizedEmbedding in kinds  # tied or not, the embedding is quantized
    assert {k for k, _ in tree_flatten(model.parameters())} == set(params)
    for a, b in zip(before, logits_of(model)):
        assert mx.array_equal(a, b), "patched model changed the logits"


@pytest.mark.parametrize("block", [(8, 9, 10, 11, 12), tuple(range(8, 17))], ids=["M5-rows", "M9-mma"])
def test_patched_model_with_simulated_kernels(block):
    model = tiny_qwen3(4, 64)
    before = logits_of(model, ((0, 1, 2, 3, 4, 5, 6, 7), block))
    used = []
    K.patch_model(model, K.KernelConfig(make_kernel=lambda s: used.append(s.name) or sim(s), force="kernel"))
    after = logits_of(model, ((0, 1, 2, 3, 4, 5, 6, 7), block))
    assert_close(after[1], before[1], mx.float32, "verify logits through msim kernels")
    want = "mlx_spec_qmm_mma" if len(block) >= 8 else "mlx_spec_qmm_rows"
    assert used.count(want) >= 15, used  # 7 linears x 2 layers + the tied lm head
    assert used.count("mlx_spec_attn_partial") >= 2, used  # one per layer


def test_patch_model_leaves_other_modules_alone():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.QuantizedLinear(64, 8, bits=4, group_size=64)
            self.plain = nn.Linear(64, 8)

    model = K.patch_model(Custom(), K.KernelConfig())
    assert type(model.inner) is K.VerifyQuantizedLinear and type(model.plain) is nn.Linear
    assert model.inner._kernel_config == K.KernelConfig()


def test_entry_points_default_to_twins():
    rng = np.random.default_rng(0)
    logits = normal(rng, (4, 90), mx.float32)
    draft = mx.argmax(logits, -1)[:3].astype(mx.int32)
    for got, want in zip(K.fused_accept(logits, draft), fused_accept_ref(logits, draft)):
        assert mx.array_equal(got, want)
    q, k = normal(rng, (1, 4, 3, 32), mx.float32), normal(rng, (1, 2, 40, 32), mx.float32)
    assert mx.array_equal(K.verify_attention(q, k, k, scale=0.2, config=K.KernelConfig()),
                          verify_attention_ref(q, k, k, scale=0.2))


def test_fused_accept_through_simulated_kernel():
    logits = normal(np.random.default_rng(1), (1, 6, 300), mx.bfloat16)
    draft = mx.argmax(logits[0], -1)[:5]  # uint32, as mx.argmax returns
    draft[3] = (draft[3] + 1) % 300
    got, want = K.fused_accept(logits, draft, sim_config()), fused_accept_ref(logits, draft)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert got[1].item() == 3


def test_verify_attention_through_simulated_kernel():
    rng = np.random.default_rng(2)
    q, k, v = normal(rng, (1, 8, 4, 64), mx.float16), normal(rng, (1, 2, 77, 64), mx.float16), \
        normal(rng, (1, 2, 77, 64), mx.float16)
    out = K.verify_attention(q, k, v, scale=0.125, config=sim_config())
    ref = verify_attention_ref(*(a.astype(mx.float32) for a in (q, k, v)), scale=0.125)
    assert_close(out, ref.astype(mx.float16), mx.float16)


# ---------------------------------------------------------------- selection
def slow(value, seconds=0.02):
    def fn():
        time.sleep(seconds)
        return value
    return fn


def test_race_picks_fastest_correct_and_caches(tmp_path):
    good = mx.arange(10, dtype=mx.float32)
    cands = {"ref": slow(good), "wrong": slow(good + 1, 0), "kernel": slow(good, 0)}
    cfg = K.KernelConfig(make_kernel=sim, cache_file=tmp_path / "k.json")
    assert K.select(cfg, ("op", 1), cands) == "kernel"
    saved = json.loads((tmp_path / "k.json").read_text())
    (key, choice), = saved.items()
    assert choice == "kernel" and mx.__version__ in key and "op|1" in key
    # a new engine reads the choice instead of racing again
    boom = {"ref": lambda: 1 / 0, "kernel": lambda: 1 / 0}
    assert K.select(K.KernelConfig(make_kernel=sim, cache_file=tmp_path / "k.json"), ("op", 1), boom) == "kernel"


def test_race_keeps_twin_unless_kernel_is_clearly_faster(tmp_path):
    good = mx.ones((3,))
    cands = {"ref": slow(good, 0.01), "kernel": slow(good, 0.01)}
    assert K.select(K.KernelConfig(make_kernel=sim, cache_file=tmp_path / "k.json"), ("x",), cands) == "ref"


def test_twins_when_off_or_without_metal(tmp_path):
    cands = {"ref": lambda: 0, "kernel": lambda: 1 / 0}
    assert not K.metal_available()
    assert K.select(K.KernelConfig(), ("x",), cands) == "ref"                   # no Metal here
    assert K.select(K.KernelConfig(enabled=False, make_kernel=sim, force="kernel"), ("x",), cands) == "ref"
    cfg = K.KernelConfig(make_kernel=sim, race=False, cache_file=tmp_path / "none.json")
    assert K.select(cfg, ("x",), cands) == "ref"                                # no race, nothing cached
