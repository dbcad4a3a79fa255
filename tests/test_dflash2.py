"""DFlash 2: the public checkpoint layout loads, drafts through the one loop losslessly (greedy identity
with mlx-lm, chi-square when sampling), mismatches are refused, and drafts equal z-lab's reference."""

import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

import drafter_checks as checks
import factory
import mlx_spec
from mlx_spec.drafters import model_drafter
from mlx_spec.drafters.dflash2 import DFlash2Config, DFlash2Drafter
from mlx_spec.engine.sampling import SamplingParams
from mlx_spec.errors import DrafterMismatchError
from drafter_checks import plain
from test_lossless_greedy import spec


def make_dflash2(out: Path, target_dir: Path, taps=(1, 2), block_size: int = 8, layers: int = 2, seed: int = 4,
                 top_k: int = 16, rank: int = 32, group: int = 16, output_multiplier: float = 1.0,
                 edge_scale: float = 1.0, **top_level) -> Path:
    """A random DFlash 2 drafter written as z-lab publishes one: config keys in `dflash_config`, per-layer
    `{attention,mlp}_conv.{base_kernel,kernel_projection.weight}`, selector codebooks without `.weight`."""
    tcfg, mask, cfg = factory.drafter_config(target_dir, taps, block_size, layers, DFlash2Config, conv_kernel_size=2,
                                             conv_group_size=group, selector_rank=rank, selector_top_k=top_k)
    mx.random.seed(seed)
    model = DFlash2Drafter(cfg)
    weights = dict(tree_flatten(model.parameters()))
    for name in list(weights):
        if name.endswith("base_kernel"):  # zeros at init; random here so the conv really acts
            weights[name] = 0.5 * mx.random.normal(weights[name].shape)
        if "codebook" in name:
            weights[name] = weights[name] * edge_scale
    for name in ("predecessor_codebook", "successor_codebook"):
        weights[f"candidate_selector.{name}"] = weights.pop(f"candidate_selector.{name}.weight")
    config = {
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": cfg.hidden_size,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "vocab_size": cfg.vocab_size, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 512, "num_target_layers": tcfg["num_hidden_layers"], "is_causal": False,
        "tie_word_embeddings": False,
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": list(taps), "block_size": block_size,
                          "output_multiplier": output_multiplier, "conv_kernel_size": 2, "conv_group_size": group,
                          "selector_rank": rank, "selector_top_k": top_k},
        **top_level,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    return out


@pytest.fixture(scope="module")
def dflash2_dir(models_dir, target_dir):
    return make_dflash2(models_dir / "qwen3-dflash2", target_dir, block_size=8)


def test_public_layout_loads_and_auto_detects(target_dir, dflash2_dir, drafter_dir):
    from mlx_spec.drafters import checkpoint_kind

    assert checkpoint_kind(dflash2_dir) == "dflash2"
    names = json.loads((dflash2_dir / "model.safetensors").read_bytes()[8:][: int.from_bytes(
        (dflash2_dir / "model.safetensors").read_bytes()[:8], "little")])
    assert "candidate_selector.predecessor_codebook" in names and "layers.0.mlp_conv.base_kernel" in names
    for mode in ("auto", "dflash2"):
        model, _ = mlx_spec.load(str(target_dir), drafter=str(dflash2_dir), mode=mode)
        assert type(model_drafter(model.drafter)).__name__ == "DFlash2Drafter" and model.drafter.block_size == 8
    with pytest.raises(DrafterMismatchError, match="is a DFlash 2 drafter, not what --mode dflash expects"):
        mlx_spec.load(str(target_dir), drafter=str(dflash2_dir), mode="dflash")
    with pytest.raises(DrafterMismatchError, match="is a DFlash drafter, not what --mode dflash2 expects"):
        mlx_spec.load(str(target_dir), drafter=str(drafter_dir), mode="dflash2")


def test_drafts_depend_on_the_walk_and_state_trims(target_dir, dflash2_dir):
    """The selector conditions each draft on the one before it (changing the anchor changes later
    slots through the walk), q rows are the top-k candidates' law, and trim restores the state."""
    model, tok = mlx_spec.load(str(target_dir), drafter=str(dflash2_dir))
    d, ids = model_drafter(model.drafter), tok.encode("def add(a, b):")
    _, hidden = model.target(mx.array([ids]), None)
    state = d.make_state()
    d.observe(state, hidden, ids)
    params = SamplingParams(temperature=0.9)
    from mlx_spec.engine.sampling import Sampler

    sampler = Sampler(params, d.config.vocab_size)
    draft = d.propose(state, 5, 6, sampler.drafting(len(ids) + 1))
    assert draft.q.shape == (6, d.config.vocab_size)
    support = (draft.q > 0).sum(-1)
    assert (support <= d.config.selector_top_k).all().item() and mx.allclose(draft.q.sum(-1), mx.ones(6)).item()
    assert (mx.take_along_axis(draft.q, draft.tokens[:, None], -1) > 0).all().item()
    greedy = Sampler(SamplingParams(), d.config.vocab_size).drafting(0)
    before = d.propose(state, 5, 6, greedy).tokens.tolist()
    d.observe(state, hidden[:, :3], ids[:3])  # three more rows, then rolled back
    assert state.offset == len(ids) + 3
    state.trim(3)
    assert d.propose(state, 5, 6, greedy).tokens.tolist() == before


@pytest.mark.parametrize("precision", ["fp32", "q4"])
def test_greedy_matches_plain(target_dir, models_dir, precision):
    target = target_dir
    if precision != "fp32":
        target = models_dir / "qwen3-dflash2-q4"
        if not target.exists():
            factory.quantize(target_dir, target, bits=4)
    drafter = make_dflash2(models_dir / f"dflash2-{precision}", target, taps=(0, 2), block_size=8)
    model, tok = mlx_spec.load(str(target), drafter=str(drafter))
    for prompt in ("def add(a, b):", "Hello, how are you"):
        ref = plain(target, prompt, 24)
        for block in (2, 5, 8):
            got, _ = spec(model, tok, prompt, 24, block_size=block)
            assert got == ref, (precision, block, prompt)
            assert all(drafted == min(block - 1, wanted - 1) for drafted, wanted in spec.budgets)


@pytest.fixture(scope="module")
def tiny_dflash2(models_dir):
    """The tiny 8-id target of the sampling tests and a DFlash 2 drafter over 4 candidates a slot, its
    codebooks scaled up so that the walk's edge term decides between them."""
    target = factory.tiny_target(models_dir)
    return target, make_dflash2(models_dir / "tiny-dflash2", target, taps=(0, 1), block_size=8, top_k=4, rank=8,
                                output_multiplier=0.3, edge_scale=1.5)


def test_sampling_follows_target(tiny_dflash2):
    """Rejection sampling against the selector's k-sparse q, several drafts a round (k = 2..7 pooled)."""
    target, drafter = tiny_dflash2
    model, tok = mlx_spec.load(str(target), drafter=str(drafter), mode="dflash2")
    p, accepted = checks.pooled_sampling(model, tok, SamplingParams(temperature=0.8, top_k=5,
                                                                      logit_bias={2: -2.0, 4: 0.8}), 360)
    assert p > 1e-3
    assert accepted[1] >= 10 and accepted[0] - accepted[1] >= 10, accepted  # accepts and rejects deep


def test_mismatches_are_refused(tmp_path, target_dir, dflash2_dir):
    def edited(name, **changes):
        d = tmp_path / name
        shutil.copytree(dflash2_dir, d)
        cfg = json.loads((d / "config.json").read_text())
        cfg["dflash_config"].update(changes.pop("dflash_config", {}))
        (d / "config.json").write_text(json.dumps({**cfg, **changes}))
        return d

    cases = [
        (edited("group", dflash_config={"conv_group_size": 24}), "conv_group_size 24 does not divide hidden size 64"),
        (edited("vocab", vocab_size=999), "vocabulary 999 != target's"),
        (edited("rank", dflash_config={"selector_rank": 16}), "weights do not match its config"),
        (edited("taps", dflash_config={"target_layer_ids": [1, 9]}), r"target_layer_ids \[9\] out of range"),
    ]
    for path, message in cases:
        with pytest.raises(DrafterMismatchError, match=message):
            mlx_spec.load(str(target_dir), drafter=str(path))
    with pytest.raises(DrafterMismatchError, match="hidden size 128 != target's 64"):
        mlx_spec.load(str(target_dir), drafter=str(edited("hidden", hidden_size=128)))


# ----------------------------------------------------------------------------- z-lab's reference


def _reference_drafter(path: Path):
    """z-lab's own DFlash2DraftModel (PyPI `dflash`), built from the same files."""
    ref = pytest.importorskip("dflash.model_mlx", reason="z-lab's `dflash` package is not installed "
                              "(pip install --no-deps dflash) - the cross-check needs it")
    cfg = json.loads((path / "config.json").read_text())
    d = cfg["dflash_config"]
    config = ref.DFlashConfig(
        hidden_size=cfg["hidden_size"], num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"], intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
        rms_norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"],
        max_position_embeddings=cfg["max_position_embeddings"], block_size=d["block_size"],
        target_layer_ids=tuple(d["target_layer_ids"]), num_target_layers=cfg["num_target_layers"],
        mask_token_id=d["mask_token_id"], output_multiplier=d["output_multiplier"],
        conv_kernel_size=d["conv_kernel_size"], conv_group_size=d["conv_group_size"],
        selector_rank=d["selector_rank"], selector_top_k=d["selector_top_k"], is_causal=cfg["is_causal"],
        layer_types=("full_attention",) * cfg["num_hidden_layers"])
    weights = mx.load(str(path / "model.safetensors"))
    for name in ("predecessor_codebook", "successor_codebook"):  # their loader renames these the same way
        weights[f"candidate_selector.{name}.weight"] = weights.pop(f"candidate_selector.{name}")
    model = ref.DFlash2DraftModel(config)
    model.load_weights(list(weights.items()))
    return ref, model


def test_matches_zlab_reference(target_dir, models_dir):
    """Same random weights: z-lab's generation loop and ours commit the same tokens round by round
    (so the same drafts are accepted each round), and the first slot's sampling law q is the same."""
    import mlx_lm

    drafter = make_dflash2(models_dir / "dflash2-xcheck", target_dir, taps=(0, 2), block_size=6, edge_scale=2.0)
    ref, ref_draft = _reference_drafter(drafter)
    ref_target, ref_tok = mlx_lm.load(str(target_dir))
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter))
    for prompt in ("def add(a, b):", "Hello, how are you", "for i in range(10):"):
        theirs = [r.tokens for r in ref.stream_generate(ref_target, ref_draft, ref_tok, prompt, block_size=6,
                                                          max_tokens=40)]
        ours = [r.tokens for r in mlx_spec.stream_generate(model, tok, prompt, max_tokens=40, block_size=6)]
        theirs = [t for t in theirs if t]  # their last response (finish) carries no tokens
        assert ours == theirs, prompt
    # The sampled law of the first draft (its predecessor is the anchor, so both know it): q over the
    # candidates, spread over the vocabulary.
    ids = tok.encode("def add(a, b):")
    _, hidden = model.target(mx.array([ids]), None)
    state = model.drafter.make_state()
    model.drafter.observe(state, hidden, ids)
    from mlx_spec.engine.sampling import Sampler

    ours_q = model.drafter.propose(state, 7, 5, Sampler(SamplingParams(temperature=0.7), 320).drafting(0)).q[0]
    ref_draft.bind(ref_target)
    cache = ref_draft.make_cache()
    block = mx.array([[7] + [ref_draft.config.mask_token_id] * 5])
    _, cands, q = ref_draft.propose(block, hidden, cache, 0.7, logits_start=1)
    theirs_q = mx.zeros((ours_q.shape[-1],)).at[cands[0, 0]].add(q[0, 0])
    assert mx.allclose(ours_q, theirs_q, atol=1e-5).item()


def test_eval_drafter_and_bench_run_it(target_dir, dflash2_dir, capsys):
    common = ["--model", str(target_dir), "--drafter", str(dflash2_dir), "--mode", "dflash2"]
    checks.assert_eval_drafter_and_bench_run(capsys, common, ["--max-tokens", "8", "--limit", "1"], 4)
