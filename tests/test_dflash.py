"""The DFlash drafter: format round trip, context caching, attention pattern, variants."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import factory
import mlx_spec
from mlx_spec.drafters.dflash import load_dflash


@pytest.fixture(scope="module")
def pair(target_dir, drafter_dir):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir), mode="dflash")
    return model, tok


def context(model, ids):
    _, hidden = model.target(mx.array([ids]), cache=None)
    return hidden


def test_incremental_context_equals_full_recompute(pair):
    model, tok = pair
    d = model.drafter
    ids = tok.encode("def add(a, b):\n    return a + b\n")
    hidden = context(model, ids)
    whole = d.make_state()
    d.observe(whole, hidden, ids)
    pieces = d.make_state()
    for lo, hi in [(0, 3), (3, 4), (4, len(ids))]:
        d.observe(pieces, hidden[:, lo:hi], ids[lo:hi])
    assert whole.offset == pieces.offset == len(ids)
    a, b = d.block_logits(whole, 17, 8), d.block_logits(pieces, 17, 8)
    assert mx.allclose(a, b, atol=1e-5).item()


def test_block_is_bidirectional_and_sees_context(pair):
    model, tok = pair
    d = model.drafter
    ids = tok.encode("Hello, how are you")
    state = d.make_state()
    d.observe(state, context(model, ids), ids)
    base = d.block_logits(state, 5, 4)
    # Drafting from a different context changes every slot.
    other = d.make_state()
    ids2 = tok.encode("for i in range(10)")
    d.observe(other, context(model, ids2), ids2)
    assert not mx.allclose(base, d.block_logits(other, 5, 4)).item()
    # A different anchor changes later slots: they attend to it.
    assert not mx.allclose(base[0, 1:], d.block_logits(state, 6, 4)[0, 1:]).item()


def test_a_short_draft_is_the_whole_blocks_first_drafts(pair):
    """Drafts of k < block-1 tokens come from the whole trained block, cut (a shorter block of mask slots is
    outside what the drafter learnt), so they are the first k of the longest draft, greedy or sampled."""
    from mlx_spec.engine.sampling import Sampler, SamplingParams

    model, tok = pair
    d = model.drafter
    ids = tok.encode("def add(a, b):\n    return a + b\n")
    state = d.make_state()
    d.observe(state, context(model, ids), ids)
    top = d.block_size - 1
    greedy = Sampler(SamplingParams(), model.vocab_size).drafting(0)
    longest = d.propose(state, 17, top, greedy).tokens.tolist()
    for k in range(1, top):
        assert d.propose(state, 17, k, greedy).tokens.tolist() == longest[:k]
    sampled = Sampler(SamplingParams(temperature=5.0, seed=1), model.vocab_size).drafting(0)  # flat: every logit shows
    q = d.propose(state, 17, top, sampled).q
    assert mx.allclose(d.propose(state, 17, 3, sampled).q, q[:3], atol=1e-6).item()


def test_a_drafter_trained_at_sub_blocks_runs_the_smallest_that_holds_the_draft(tmp_path, target_dir):
    """A drafter that learnt blocks of 4 and 8 (`train-drafter --sub-blocks`) drafts up to 3 tokens from a block
    of 4 rows, more from the whole block, alone or batched; greedy speculation with it stays lossless."""
    from mlx_spec.drafters.dflash import DFlashConfig
    from mlx_spec.engine.sampling import Sampler, SamplingParams
    from test_lossless_greedy import plain, spec

    path = factory.make_drafter(tmp_path / "sub", target_dir, block_size=8, block_sizes=[4, 8])
    assert json.loads((path / "config.json").read_text())["dflash_config"]["block_sizes"] == [4, 8]
    model, tok = mlx_spec.load(str(target_dir), drafter=str(path), mode="dflash")
    d = model.drafter
    assert d.config.block_sizes == [4, 8] and d.block_size == 8
    assert [d.config.rows_for(k) for k in range(1, 8)] == [4, 4, 4, 8, 8, 8, 8]
    ids = tok.encode("def add(a, b):\n    return a + b\n")
    state = d.make_state()
    d.observe(state, context(model, ids), ids)
    sampled = Sampler(SamplingParams(temperature=5.0, seed=1), model.vocab_size).drafting(0)  # flat: every logit shows
    four, eight = (sampled.probs(d.block_logits(state, 17, n)[0, 1:]) for n in (4, 8))
    assert not mx.allclose(four, eight[:3], atol=1e-6).item()  # (else the test could not tell the blocks apart)
    for k, law in ((3, four), (2, four[:2]), (5, eight[:5])):
        assert mx.allclose(d.propose(state, 17, k, sampled).q, law, atol=1e-6).item(), k
    batched = d.propose_batch([state, state], [17, 17], [3, 1], [sampled] * 2)
    assert mx.allclose(batched[0].q, four, atol=1e-5).item() and mx.allclose(batched[1].q, four[:1], atol=1e-5).item()
    ref = plain(target_dir, "def add(a, b):", 30)
    for block in (3, 4, 8, None):
        assert spec(model, tok, "def add(a, b):", 30, block_size=block)[0] == ref, block
    whole = json.loads((factory.make_drafter(tmp_path / "whole", target_dir) / "config.json").read_text())
    assert DFlashConfig.from_dict(whole).block_sizes is None  # the key only where it says something
    for bad in ([4, 32], [1, 8], "8", [4.5]):
        whole["dflash_config"]["block_sizes"] = bad
        with pytest.raises(mlx_spec.LoadError, match="block_sizes must list block sizes from 2 to its block_size"):
            DFlashConfig.from_dict(whole)


def test_sliding_causal_layers(tmp_path, target_dir):
    path = factory.make_drafter(tmp_path / "sw", target_dir, layers=2, layer_types=["sliding_attention", "full_attention"],
                                sliding_window=4)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(layer_types=["sliding_attention", "sliding_attention"], sliding_window=4)
    (path / "config.json").write_text(json.dumps(cfg))
    model, tok = mlx_spec.load(str(target_dir), drafter=str(path), mode="dflash")
    d = model.drafter
    assert d.config.window(0) == 4 and d.config.causal(0)
    ids = tok.encode("def add(a, b):\n    return a + b")
    state = d.make_state()
    d.observe(state, context(model, ids), ids)
    # Causal block: slot 1 cannot see slot 2, so varying a later block token leaves it unchanged.
    mask = d.config.mask_token_id
    h = model.target.embed(mx.array([[5, mask, mask, mask]]))
    h2 = model.target.embed(mx.array([[5, mask, 9, mask]]))
    outs = []
    for x in (h, h2):
        for i, layer in enumerate(d.layers):
            x = layer(x, state.kv(i), state.offset, d.config.window(i), d.config.causal(i))
        outs.append(x)
    assert mx.allclose(outs[0][:, :2], outs[1][:, :2], atol=1e-6).item()
    assert not mx.allclose(outs[0][:, 2:], outs[1][:, 2:]).item()
    assert mlx_spec.generate(model, tok, "Hello", max_tokens=12, block_size=4)


def test_save_load_round_trip(tmp_path, pair, target_dir):
    model, tok = pair
    from mlx_spec.drafters.dflash import save_dflash

    out = save_dflash(model.drafter, tmp_path / "copy")
    again = load_dflash(out, model.target, json.loads((target_dir / "config.json").read_text()))
    for (k1, v1), (k2, v2) in zip(tree_flatten(model.drafter.parameters()), tree_flatten(again.parameters())):
        assert k1 == k2 and mx.array_equal(v1, v2).item()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and "mask_token_id" in cfg["dflash_config"]
    names = set(mx.load(str(out / "model.safetensors")))
    assert "fc.weight" in names and "hidden_norm.weight" in names and not any("embed" in n or "lm_head" in n for n in names)


def test_muse_layout_and_quantized_drafter(tmp_path, target_dir, drafter_dir, pair):
    model, tok = pair
    ids = tok.encode("Hello")
    ref_state = model.drafter.make_state()
    model.drafter.observe(ref_state, context(model, ids), ids)
    ref = model.drafter.block_logits(ref_state, 3, 4)

    muse = tmp_path / "muse"
    muse.mkdir()
    (muse / "config.json").write_text((drafter_dir / "config.json").read_text())
    w = mx.load(str(drafter_dir / "model.safetensors"))
    w = {("encoder." + k.replace("hidden_norm", "output_norm_enc") if k.startswith(("fc", "hidden_norm")) else k): v
         for k, v in w.items()}
    mx.save_safetensors(str(muse / "model.safetensors"), w)
    m2, _ = mlx_spec.load(str(target_dir), drafter=str(muse), mode="dflash")
    s2 = m2.drafter.make_state()
    m2.drafter.observe(s2, context(m2, ids), ids)
    assert mx.allclose(ref, m2.drafter.block_logits(s2, 3, 4), atol=1e-5).item()

    import mlx.nn as nn
    from mlx_spec.drafters.dflash import save_dflash

    q = load_dflash(drafter_dir, model.target, json.loads((target_dir / "config.json").read_text()))
    nn.quantize(q, group_size=32, bits=8)
    qdir = save_dflash(q, tmp_path / "q8", {"quantization": {"group_size": 32, "bits": 8}})
    m3, _ = mlx_spec.load(str(target_dir), drafter=str(qdir), mode="dflash")
    assert "Quantized" in type(m3.drafter.fc).__name__
    s3 = m3.drafter.make_state()
    m3.drafter.observe(s3, context(m3, ids), ids)
    np.testing.assert_allclose(np.array(ref), np.array(m3.drafter.block_logits(s3, 3, 4)), atol=0.5)
