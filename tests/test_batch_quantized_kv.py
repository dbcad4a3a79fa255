"""Quantized KV caches (mlx-lm's QuantizedKVCache, `PromptCache(kv_bits=...)`) under the one loop, with
float and quantized weights, on a dense and a hybrid target.

Greedy speculative output equals mlx-lm's plain greedy output with the same quantized caches from the
first token, with an oracle drafter rejecting part of every block (quantized rows are trimmed and
rewritten in place); batched requests (greedy and seeded, joining and leaving mid-flight) equal their
runs alone, and really share one verify pass whose layers see the rows' quantized caches as one batch.
"""

import mlx_lm
import pytest
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

import archs
import factory
import mlx_spec
import test_batch
from mlx_spec.engine import batch, loop
from mlx_spec.engine.cache import PromptCache
from mlx_spec.engine.sampling import Sampler
from mlx_spec.generate import Generation, choose_lengths, encode_prompt
from test_hybrid_batch import REQUESTS

KV = dict(kv_bits=8, kv_group_size=32)
PROMPT = "Hello, how are you"


def build(models_dir, tokenizer_dir, which):
    """head_dim 32: quantized KV rows need a multiple of the group size."""
    name, _, q = which.partition("-")
    wide = dict(head_dim=32)
    if name == "qwen3_5":
        wide["text_config"] = {**archs.FAMILIES[name]["text_config"], "head_dim": 32}
    src = archs.make(models_dir / f"kvq-{name}", tokenizer_dir, name, seed=4, **wide)
    if not q:
        return src
    out = models_dir / f"kvq-{name}-{q}"
    return out if out.exists() else factory.quantize(src, out, bits=int(q[1:]))


def kv_cache(model):
    return PromptCache(model.target.model, model.drafter, **KV)


@pytest.mark.parametrize("which", ["qwen3", "qwen3_5", "qwen3_5-q4"])
def test_greedy_matches_mlx_lm_with_quantized_kv(which, models_dir, tokenizer_dir):
    target = build(models_dir, tokenizer_dir, which)
    ref_model, ref_tok = mlx_lm.load(str(target))
    caches = [QuantizedKVCache(group_size=32, bits=8) if type(c) is KVCache else c for c in make_prompt_cache(ref_model)]
    ref = [r.token for r in mlx_lm.stream_generate(ref_model, ref_tok, PROMPT, max_tokens=24, prompt_cache=caches)]
    model, tok = mlx_spec.load(str(target), drafter=None)
    model.drafter = factory.OracleDrafter(tok.encode(PROMPT) + ref, 5, 0.3, seed=2, vocab=300)
    pc = kv_cache(model)
    out = []
    for r in mlx_spec.stream_generate(model, tok, PROMPT, max_tokens=24, block_size=5, prompt_cache=pc):
        out += r.tokens
    assert out == ref[: len(out)] and len(out) == len(ref) - (r.finish_reason == "stop")
    assert 0 < r.spec.accepted < r.spec.drafted  # drafts were rejected: quantized rows trimmed
    assert any(isinstance(c, QuantizedKVCache) for c in pc.cache)


@pytest.mark.parametrize("which", [pytest.param("qwen3", marks=pytest.mark.slow), "qwen3_5-q4"])  # hybrid, 4-bit
def test_batched_equals_alone_with_quantized_kv(which, models_dir, tokenizer_dir, monkeypatch):
    target = build(models_dir, tokenizer_dir, which)
    model, tok = mlx_spec.load(str(target), drafter=None)
    model.drafter = factory.SelfDrafter(model.model, block_size=5, mode="argmax-onehot", error_rate=0.3, seed=1)

    def make(model, tok, prompt, sampling, block, max_tokens=24):
        return Generation(model, tok, encode_prompt(tok, prompt), max_tokens, Sampler(sampling,
                          model.config["vocab_size"]), [], kv_cache(model), choose_lengths(model, block, adaptive=False))

    monkeypatch.setattr(test_batch, "make", make)
    views = []
    real = loop.batch_caches
    monkeypatch.setattr(loop, "batch_caches", lambda caches: views.append(real(caches)) or views[-1])
    reqs = [r + (16,) for r in REQUESTS]
    solo = [test_batch.alone(model, tok, r) for r in reqs]
    together = test_batch.together(model, tok, reqs, join_at=[0, 0, 1, 3])
    for i, (a, b) in enumerate(zip(solo, together)):
        assert a == b, (target.name, i, REQUESTS[i][1])
    assert any(isinstance(v, batch.QuantizedView) and len(v.caches) >= 3 for layers in views for v in layers)
    assert test_batch.together.left_mid_flight


def test_load_kv_bits_serves_every_entry_point(models_dir, tokenizer_dir):
    """`load(kv_bits=...)` (the CLI's and server's --kv-bits) makes every prompt cache quantized: a DFlash
    drafter's greedy output equals mlx-lm's with the same caches, in the library and through a real server."""
    from mlx_spec.app.server.config import ModelConfig, ServerConfig
    from test_server_harness import EOS_BIAS, RunningServer

    target = build(models_dir, tokenizer_dir, "qwen3_5")
    drafter = factory.make_drafter(models_dir / "kvq-qwen3_5-dflash", target, taps=(0, 1), block_size=4)
    ref_model, ref_tok = mlx_lm.load(str(target))
    caches = [QuantizedKVCache(group_size=32, bits=8) if type(c) is KVCache else c for c in make_prompt_cache(ref_model)]
    ref = [r.token for r in mlx_lm.stream_generate(ref_model, ref_tok, PROMPT, max_tokens=16, prompt_cache=caches)]
    model, tok = mlx_spec.load(str(target), drafter=str(drafter), mode="dflash", **KV)
    assert any(isinstance(c, QuantizedKVCache) for c in mlx_spec.make_prompt_cache(model).cache)
    out = []
    for r in mlx_spec.stream_generate(model, tok, PROMPT, max_tokens=16, block_size=4):  # (fixed: it drafts)
        out += r.tokens
    assert out == ref[: len(out)] and r.spec.drafted > 0
    s = RunningServer(ServerConfig(model=ModelConfig(target=str(target), drafter=str(drafter), mode="dflash",
                                                     block_size=4, **KV)))
    try:
        got = s.client().completions.create(model="x", prompt=PROMPT, max_tokens=16, temperature=0, logit_bias=EOS_BIAS)
        plain_q = mlx_spec.generate(model, tok, PROMPT, max_tokens=16, block_size=4, logit_bias={0: -100, 2: -100})
        assert got.choices[0].text == plain_q
        assert s.state.scheduler.backend.model.kv_cache == KV
    finally:
        s.stop()


@pytest.mark.parametrize("family,kw,match", [
    ("qwen3", dict(kv_bits=7), "--kv-bits must be one of"),
    ("qwen3", dict(kv_bits=8, kv_group_size=64), "qwen3 cannot use a quantized KV cache"),  # head_dim 16 < 64
    ("gpt_oss", dict(kv_bits=8, kv_group_size=32), "gpt_oss cannot use a quantized KV cache"),  # attention sinks
])
def test_kv_bits_a_model_cannot_use_is_refused_at_load(family, kw, match, models_dir, tokenizer_dir):
    target = archs.make(models_dir / f"hy-{family}", tokenizer_dir, family, seed=3)
    with pytest.raises(mlx_spec.LoadError, match=match):
        mlx_spec.load(str(target), drafter=None, **kw)
