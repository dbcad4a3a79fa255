"""EAGLE-3 drafters in their published layouts (SpecForge, speculators/vLLM): loading, refusal of ones that
do not fit, greedy identity with mlx-lm, exact sampling with several drafts a round, and a head trained
for a few steps on the target's features is accepted (an untrained one hardly ever)."""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

import drafter_checks as checks
import factory
import mlx_spec
from mlx_spec.drafters import checkpoint_kind, model_drafter
from mlx_spec.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Model
from drafter_checks import plain
from test_lossless_greedy import PROMPTS, spec

BLOCKS = range(2, 9)


def make_eagle3(out: Path, target_dir: Path, layout: str = "specforge", draft_vocab: int | None = None,
                aux_ids=None, seed: int = 1, head_scale: float = 1.0, bits: int | None = None, own_embedding=False,
                **overrides) -> Path:
    """A random EAGLE-3 checkpoint with the config keys and tensor names its trainer writes."""
    tcfg = json.loads((target_dir / "config.json").read_text())
    vocab, hidden = tcfg["vocab_size"], tcfg["hidden_size"]
    draft_vocab = draft_vocab or vocab
    layer = dict(model_type="llama", hidden_size=hidden, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, num_hidden_layers=1, rms_norm_eps=1e-6, vocab_size=vocab,
                 max_position_embeddings=512, rope_theta=10000.0, hidden_act="silu", attention_bias=False,
                 tie_word_embeddings=False)
    if layout == "specforge":
        config = dict(architectures=["LlamaForCausalLMEagle3"], **layer, draft_vocab_size=draft_vocab)
        if aux_ids is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_ids)}
    else:  # speculators (vLLM): the layer's settings nested, tensors under layers.0
        config = dict(architectures=["Eagle3Speculator"], speculators_model_type="eagle3",
                      transformer_layer_config=layer, draft_vocab_size=draft_vocab, norm_before_residual=False,
                      eagle_aux_hidden_state_layer_ids=list(aux_ids) if aux_ids is not None else None,
                      speculators_config={"algorithm": "eagle3", "verifier": {"name_or_path": str(target_dir)}})
    config.update(overrides)
    mx.random.seed(seed)
    model = Eagle3Model(Eagle3Config.from_dict(config), own_embedding=own_embedding)
    model.lm_head.weight = model.lm_head.weight * head_scale
    for norm in ([model.input_norm] if "input_norm" in model else []) + list(model.get("fc_norm", [])):
        norm.weight = 1.0 + 0.5 * mx.random.normal(norm.weight.shape)  # not ones: the norm must matter
    if bits:
        nn.quantize(model, group_size=32, bits=bits)
        config["quantization"] = {"group_size": 32, "bits": bits}
    weights = dict(tree_flatten(model.parameters()))
    if layout != "specforge":
        weights = {k.replace("midlayer.", "layers.0."): v for k, v in weights.items()}
        weights["verifier_lm_head.weight"] = mx.zeros((vocab, hidden))  # speculators keeps these; ignored
    if draft_vocab != vocab:  # the draft vocabulary: a random subset of the target's ids, in order
        ids = mx.sort(mx.random.permutation(vocab)[:draft_vocab])
        weights["d2t"] = (ids - mx.arange(draft_vocab)).astype(mx.int64)
        weights["t2d"] = (mx.arange(vocab)[:, None] == ids[None]).any(-1)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def eagle(models_dir, target_dir):
    """SpecForge layout, reduced draft vocabulary, default aux layers ([1, 1, 0] on 4 layers: reordered)."""
    return make_eagle3(models_dir / "eagle3", target_dir, draft_vocab=200)


def load(target, drafter, **kw):
    model, tok = mlx_spec.load(str(target), drafter=str(drafter), block_size=8, **kw)
    assert isinstance(model_drafter(model.drafter), Eagle3Drafter)
    model.drafter = model_drafter(model.drafter)  # the drafter alone (auto adds prompt lookup: test_pick.py)
    return model, tok


def test_auto_mode_reads_eagle3_from_content(target_dir, eagle):
    assert checkpoint_kind(eagle) == "eagle3"
    model, _ = load(target_dir, eagle, mode="eagle3")
    assert model.drafter.tap_ids == (0, 1) and model.target.tap_ids == (0, 1)
    load(target_dir, eagle)  # auto
    with pytest.raises(mlx_spec.DrafterMismatchError, match="EAGLE-3 drafter, not what --mode dflash expects"):
        mlx_spec.load(str(target_dir), drafter=str(eagle), mode="dflash")


@pytest.fixture(scope="module")
def arch_q4(models_dir, target_dir):
    return factory.quantize(target_dir, models_dir / "eagle3-target-q4", 4)


@pytest.mark.parametrize("precision", ["fp32", "q4-target-q8-drafter"])
def test_greedy_identity_every_block(precision, target_dir, arch_q4, eagle, models_dir):
    target, drafter = target_dir, eagle
    if precision != "fp32":
        target, drafter = arch_q4, make_eagle3(models_dir / "eagle3-q8", target_dir, draft_vocab=200, bits=8)
    model, tok = load(target, drafter)
    checks.assert_greedy_identity(model, tok, target, PROMPTS[:1], BLOCKS, precision)


@pytest.mark.parametrize("variant", [{}, {"norm_before_fc": True}, {"fc_norm": True}], ids=["plain", "norm_before_fc",
                                                                                           "fc_norm"])
def test_speculators_layout_and_hf_layer_ids(models_dir, target_dir, variant):
    """vLLM numbering (HF hidden_states: one more than the layer) and `layers.0.*` names; full vocabulary;
    speculators' tap norms before fc (one over the concatenation as `input_norm`, or `fc_norm.{i}`)."""
    drafter = make_eagle3(models_dir / f"eagle3-speculators-{'-'.join(variant)}", target_dir, layout="speculators",
                          aux_ids=[2, 3, 4], **variant)
    model, tok = load(target_dir, drafter)
    assert model.drafter.tap_ids == (1, 2, 3)
    names = set(mx.load(str(drafter / "model.safetensors")))
    assert ("input_norm.weight" in names) == bool(variant.get("norm_before_fc"))
    assert ("fc_norm.2.weight" in names) == bool(variant.get("fc_norm"))
    if variant:  # the norms are applied: without them the features differ
        _, hidden = model.target(mx.array([tok.encode(PROMPTS[0])]), None)
        bare = model.drafter.model.fc(hidden)
        assert not mx.allclose(model.drafter.features(hidden), bare, atol=1e-3).item()
    for prompt in PROMPTS[: 1 if variant else 2]:  # the norms' effect on drafts: test_reference_mlx_vlm.py
        ref = plain(target_dir, prompt, 24)
        for block in (2, 5):
            assert spec(model, tok, prompt, 24, block_size=block)[0] == ref


MISMATCHES = [
    (dict(target_hidden_size=32), "reads hidden states of size 32"),
    (dict(vocab_size=999), "vocabulary 999"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}), r"layers \[9\]"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}), r"layers \[-1\]"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2]}), "2 aux hidden-state layers"),
    ("no-d2t", "no d2t id map"),
    ("fc-width", "weights do not match"),
]


@pytest.mark.parametrize("edit, message", MISMATCHES, ids=lambda x: str(x)[:30])
def test_mismatch_is_refused(tmp_path, target_dir, eagle, edit, message):
    import shutil

    bad = shutil.copytree(eagle, tmp_path / "bad")
    config = json.loads((bad / "config.json").read_text())
    weights = dict(mx.load(str(bad / "model.safetensors")))
    if edit == "no-d2t":
        weights.pop("d2t")
    elif edit == "fc-width":
        weights["fc.weight"] = weights["fc.weight"][:, :128]
    else:
        config.update(edit)
    mx.save_safetensors(str(bad / "model.safetensors"), weights)
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(mlx_spec.DrafterMismatchError, match=message):
        mlx_spec.load(str(target_dir), drafter=str(bad), mode="eagle3")


def test_both_tap_norms_are_refused(models_dir, target_dir, tmp_path):
    drafter = make_eagle3(tmp_path / "both", target_dir, layout="speculators", aux_ids=[2, 3, 4], norm_before_fc=True)
    config = json.loads((drafter / "config.json").read_text())
    (drafter / "config.json").write_text(json.dumps({**config, "fc_norm": True}))
    with pytest.raises(mlx_spec.LoadError, match="norm_before_fc and fc_norm exclude each other"):
        mlx_spec.load(str(target_dir), drafter=str(drafter))


def test_trained_head_is_accepted(models_dir, target_dir):
    """Decoding must pair features and tokens as training did (catch-up pair, pending row, trims): a head
    fitted to the target's greedy continuation (first step only) then has its first draft accepted in
    every round; untrained, hardly ever."""
    drafter = make_eagle3(models_dir / "eagle3-train", target_dir)
    model, tok = load(target_dir, drafter)
    checks.assert_training_gets_accepted(model, tok, target_dir)


@pytest.fixture(scope="module")
def tiny(models_dir):
    """An 8-token target whose joint law is enumerable, and a flat EAGLE-3 head over 6 of its ids."""
    target = factory.tiny_target(models_dir, "eagle3-tiny")
    drafter = make_eagle3(models_dir / "eagle3-tiny-head", target, draft_vocab=6, aux_ids=[1, 0, 1], head_scale=0.3,
                          seed=3)
    return target, drafter


def test_sampling_follows_target_with_several_drafts(tiny):
    """Unseeded rejection sampling, pooled over 2..7 drafts a round; q lives on the draft vocabulary's
    ids only (zero elsewhere)."""
    model, tok = load(*tiny)
    p, accepted = checks.pooled_sampling(model, tok, checks.TINY_LAW, 160, joint=True)
    assert p > 1e-3
    assert accepted[0] > 20 and accepted[1] > 5, accepted


def test_seeded_sampling_equals_plain_seeded_decoding(tiny):
    """Seeded requests draw position-keyed noise: the output is plain seeded decoding's, whatever the drafts."""
    model, tok = load(*tiny)
    checks.assert_seeded_is_plain_seeded(model, tok, range(4))


def test_eval_drafter_and_bench_run(target_dir, eagle, capsys):
    common = ["--model", str(target_dir), "--drafter", str(eagle), "--mode", "eagle3"]
    checks.assert_eval_drafter_and_bench_run(capsys, common, ["--max-tokens", "12", "--limit", "2", "--block-size", "4"],
                                             3, mode="eagle3")
