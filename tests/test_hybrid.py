"""Hybrid (Gated DeltaNet, Mamba2, short-conv, KDA), sliding-window and MoE targets under the one loop, exactly.

For each family (tiny random models in the on-disk format): plain decoding works; greedy
speculative output equals mlx-lm's plain greedy token for token with oracle drafters that accept
nothing, everything or a part (so recurrent states are rewound and replayed after partial
acceptance), with a DFlash drafter tapping its layers (linear-attention ones included), with prompt
lookup and with a draft model; multi-turn reuse equals a fresh run. (8-bit and 4-bit: test_hybrid_quantized.py.)
"""

import mlx_lm
import pytest
from transformers import PretrainedConfig

import archs
import factory
import mlx_spec
from mlx_spec.engine.recurrent import RecurrentCache

# mlx-lm 0.32's newer families: every test here and in test_hybrid_batch covers them under -m slow; each default
# run checks each of them once (test_newer_family_partial_acceptance, the batch file's short test, and 8-bit and
# 4-bit weights: test_hybrid_quantized's default test takes NAMES)
NEWER = ["bailing_moe_v3", "gear", "kimi_k3", "longcat_flash", "deepseek_v32", "minimax_m3_vl"]
OLDER = ["qwen3_5", "qwen3_5_moe", "qwen3_next", "nemotron_h", "falcon_h1", "lfm2", "lfm2_moe", "granitemoehybrid",
         "kimi_linear", "mamba2", "plamo2", "olmo_hybrid", "bailing_hybrid", "gemma3_text", "gpt_oss", "qwen3_moe"]
FAMILIES = OLDER + [pytest.param(name, marks=pytest.mark.slow) for name in NEWER]
NAMES = OLDER + NEWER
PROMPT = "Hello, how are you"
N = 30


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, models_dir, tokenizer_dir):
    return request.param, archs.make(models_dir / f"hy-{request.param}", tokenizer_dir, request.param, seed=3)


def plain(model_dir, prompt=PROMPT, n=N):
    # transformers 5 rejects gear's config.json while looking for the tokenizer class (see model_files.load_target)
    gear = '"conv_mixer"' in (model_dir / "config.json").read_text()
    model, tok = mlx_lm.load(str(model_dir), tokenizer_config={"config": PretrainedConfig()} if gear else None)
    rs = list(mlx_lm.stream_generate(model, tok, prompt, max_tokens=n))
    tokens = [r.token for r in rs]
    return tokens[:-1] if rs[-1].finish_reason == "stop" else tokens


def spec(model, tok, prompt, n=N, **kw):
    out = []
    for r in mlx_spec.stream_generate(model, tok, prompt, max_tokens=n, **kw):
        out += r.tokens
    return out, r


def test_oracle_drafters_match_plain_greedy(family, monkeypatch):
    """Partial acceptance on every family: rejected drafts are rolled back exactly, block sizes 2..16; the
    kept tokens are replayed from the verify pass's recorded mixer inputs (falcon_h1's CacheList layers:
    through the whole stack)."""
    from mlx_spec.engine import cache as cache_mod

    name, target = family
    from_mixers = []
    real = cache_mod.replay_mixers
    monkeypatch.setattr(cache_mod, "replay_mixers", lambda *a: from_mixers.append(real(*a)) or from_mixers[-1])
    ref = plain(target)
    model, tok = mlx_spec.load(str(target), drafter=None)
    assert spec(model, tok, PROMPT)[0] == ref  # plain decoding first: no rollback needed, none refused
    ids = tok.encode(PROMPT)
    for error_rate, blocks in ((0.0, (2, 16)), (0.3, (2, 5, 16)), (1.0, (2, 16))):
        for block in blocks:
            model.drafter = factory.OracleDrafter(ids + ref, block, error_rate, seed=block, vocab=300)
            got, last = spec(model, tok, PROMPT, block_size=block)
            assert got == ref, (name, error_rate, block)
            if error_rate == 0.0:
                assert last.spec.accepted >= last.spec.drafted - (block - 1)
    if name in ("gemma3_text", "gpt_oss", "qwen3_moe", "falcon_h1", "longcat_flash", "deepseek_v32", "minimax_m3_vl"):
        # nothing replayed (KV caches only) / through the stack
        assert not from_mixers
    else:
        assert from_mixers and all(from_mixers), (name, from_mixers)


@pytest.mark.parametrize("mode", ["dflash", "lookup", "draft-model"])
def test_drafters_match_plain_greedy(family, mode):
    """A DFlash drafter (block 16) tapping a linear-attention layer (0) and an attention one (1), drafting
    blocks of 2 and 16; lookup; a draft model."""
    name, target = family
    drafter = {"dflash": lambda: factory.make_drafter(target.parent / f"{target.name}-dflash16", target, taps=(0, 1),
                                                      block_size=16),
               "lookup": lambda: "auto", "draft-model": lambda: target}[mode]()
    model, tok = mlx_spec.load(str(target), drafter=str(drafter), mode=mode)
    ref = plain(target)
    for block in (2, 16) if mode == "dflash" else (4,):
        got, last = spec(model, tok, PROMPT, block_size=block)
        assert got == ref, (name, mode, block)
        if mode == "dflash":  # full blocks in most rounds (the last ones are capped by max_tokens)
            assert last.spec.drafted >= (block - 1) * last.spec.rounds // 2, (name, block)
    if mode == "draft-model":  # the target drafting for itself: every draft is accepted
        assert last.spec.accepted == last.spec.drafted


def test_multi_turn_reuse_matches_fresh(family):
    """Regenerate, follow up and edit the last message with a kept cache: the same tokens as a fresh one,
    and recurrent states come back from the prompt-end checkpoint (cached_tokens says how much)."""
    name, target = family
    model, tok = mlx_spec.load(str(target), drafter=str(target), mode="draft-model")
    cache = mlx_spec.make_prompt_cache(model)
    hello = [{"role": "user", "content": PROMPT}]
    first, _ = spec(model, tok, hello, 16, prompt_cache=cache, block_size=3)
    follow = hello + [{"role": "assistant", "content": tok.decode(first)}, {"role": "user", "content": "def add(a, b):"}]
    edited = follow[:-1] + [{"role": "user", "content": "for i in range(10):"}]
    for chat in (hello, follow, edited, edited):
        got, last = spec(model, tok, chat, 16, prompt_cache=cache, block_size=3)
        assert got == spec(model, tok, chat, 16, block_size=3)[0], (name, chat)
        if chat is edited or chat is hello:  # the same prompt as before, or one sharing the last prompt
            assert last.cached_tokens > 0, name
        assert last.cached_tokens < last.prompt_tokens  # (the prompt as the library tokenized it)
    recurrent = [c for c in cache.cache if isinstance(c, RecurrentCache)]
    assert all(c.offset == len(cache.tokens) for c in recurrent)


def test_untested_recurrent_architecture_is_refused_for_speculation_only(models_dir, tokenizer_dir, monkeypatch):
    """An architecture with recurrent state that is not in the tested set decodes plainly, and speculation is
    refused with a message naming it."""
    from mlx_spec.engine import rollback

    target = archs.make(models_dir / "hy-lfm2", tokenizer_dir, "lfm2", seed=3)
    monkeypatch.setattr(rollback, "RECURRENT_TESTED", frozenset())
    model, tok = mlx_spec.load(str(target), drafter=None)
    assert spec(model, tok, PROMPT)[0] == plain(target)
    with pytest.raises(mlx_spec.LoadError, match="lfm2: rollback of its recurrent state"):
        model.target.check_speculation()
    model.drafter = factory.OracleDrafter([0] * 64, 4)
    with pytest.raises(mlx_spec.MlxSpecError, match="lfm2"):
        mlx_spec.make_prompt_cache(model)


@pytest.mark.parametrize("name", NEWER)
def test_newer_family_partial_acceptance(name, models_dir, tokenizer_dir):
    """Plain decoding, then an oracle drafter that gets part of each block wrong (recurrent states rewound and
    replayed, KV and sliding-window caches trimmed), equal to mlx-lm's plain greedy; kimi_k3 (layers return
    a tuple) and gear (scaled embeddings) also with a DFlash drafter tapping their first two layers."""
    target = archs.make(models_dir / f"hy-{name}", tokenizer_dir, name, seed=3)
    ref = plain(target, n=16)
    model, tok = mlx_spec.load(str(target), drafter=None)
    assert spec(model, tok, PROMPT, 16)[0] == ref
    model.drafter = factory.OracleDrafter(tok.encode(PROMPT) + ref, 5, 0.3, seed=5, vocab=300)
    got, last = spec(model, tok, PROMPT, 16, block_size=5)
    assert got == ref, name
    assert 0 < last.spec.accepted < last.spec.drafted, name
    if name in ("kimi_k3", "gear"):
        drafter = factory.make_drafter(target.parent / f"{target.name}-dflash4", target, taps=(0, 1), block_size=4)
        model, tok = mlx_spec.load(str(target), drafter=str(drafter), mode="dflash")
        assert spec(model, tok, PROMPT, 16, block_size=4)[0] == ref, name


def test_kimi_k3_attention_residuals(models_dir, tokenizer_dir):
    """kimi_k3 with attention residuals (a layer returns a block's partial sum; the blocks are mixed at the end):
    an oracle drafter at partial acceptance and lookup equal plain greedy; a DFlash drafter is refused at load,
    since no layer's output, through the final norm and head, gives the model's logits."""
    target = archs.make(models_dir / "hy-kimi_k3_attn_res", tokenizer_dir, "kimi_k3_attn_res", seed=3)
    ref = plain(target, n=16)
    model, tok = mlx_spec.load(str(target), drafter=None)
    model.drafter = factory.OracleDrafter(tok.encode(PROMPT) + ref, 5, 0.3, seed=5, vocab=300)
    got, last = spec(model, tok, PROMPT, 16, block_size=5)
    assert got == ref and 0 < last.spec.accepted < last.spec.drafted
    model, tok = mlx_spec.load(str(target), drafter="auto", mode="lookup")
    assert spec(model, tok, PROMPT, 16, block_size=4)[0] == ref
    drafter = factory.make_drafter(target.parent / f"{target.name}-dflash4", target, taps=(0, 1), block_size=4)
    with pytest.raises(mlx_spec.LoadError, match="taps do not reproduce kimi_k3 logits"):
        mlx_spec.load(str(target), drafter=str(drafter), mode="dflash")


@pytest.mark.parametrize("name,reason", [("mamba", "never call cache.advance"),
                                         ("longcat_flash_ngram", "n-gram context cache .* without cache.advance")])
def test_refused_architecture_names_the_reason(name, reason, models_dir, tokenizer_dir):
    """An architecture refused by name decodes plainly, and speculation is refused saying why."""
    target = archs.make(models_dir / f"hy-{name}", tokenizer_dir, name, seed=3)
    model, tok = mlx_spec.load(str(target), drafter=None)
    assert spec(model, tok, PROMPT, 12)[0] == plain(target, n=12)
    with pytest.raises(mlx_spec.LoadError, match=f"{name}: .*{reason}"):
        model.target.check_speculation()


def test_adaptive_draft_length_calibrates_on_a_hybrid(models_dir, tokenizer_dir, tmp_path, monkeypatch):
    """The default path (no fixed block size): the controller's cost calibration runs whole rounds on a
    Gated DeltaNet hybrid and puts its recurrent states back (they cannot be trimmed across rounds), and
    the reply equals plain greedy."""
    monkeypatch.setenv("MLX_SPEC_CACHE", str(tmp_path))  # calibrate afresh
    target = archs.make(models_dir / "hy-qwen3_5", tokenizer_dir, "qwen3_5", seed=3)
    drafter = factory.make_drafter(models_dir / "hy-qwen3_5-cal-dflash", target, taps=(0, 1), block_size=4)
    model, tok = mlx_spec.load(str(target), drafter=str(drafter), mode="dflash")
    assert spec(model, tok, PROMPT, 16)[0] == plain(target, n=16)
    assert len(mlx_spec.cost_curve(model).rounds) == 4
