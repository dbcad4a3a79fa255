"""Native MTP heads read from the target's own checkpoint (Qwen3.5 hybrid `mtp.*`, GLM-4.5 layers past
N), in Hugging Face's layout: auto picks them, greedy identity with mlx-lm at every block size, a quantized
converted target, exact sampling with several drafts a round, refusals, a trained head is accepted, and
eval-drafter / bench run with --mode mtp; DeepSeek-V3 (61 layers, MLA, MoE) with a random head and with a
fitted one whose drafts are accepted."""

from types import SimpleNamespace

import mlx.core as mx
import pytest

import drafter_checks as checks
import factory
import mlx_spec
import mtp_checkpoints as ckpt
from mlx_spec.drafters import checkpoint_kind
from mlx_spec.drafters import model_drafter
from mlx_spec.drafters.mtp import MTPDrafter, has_mtp, mtp_tensor_names
from drafter_checks import plain
from test_lossless_greedy import PROMPTS, spec


@pytest.fixture(scope="module")
def qwen35(models_dir, tokenizer_dir):
    return ckpt.qwen35(models_dir / "mtp-qwen35", tokenizer_dir)


@pytest.fixture(scope="module")
def glm(models_dir, tokenizer_dir):
    return ckpt.glm(models_dir / "mtp-glm", tokenizer_dir)


def load(target, **kw):
    model, tok = mlx_spec.load(str(target), block_size=8, **kw)
    assert isinstance(model_drafter(model.drafter), MTPDrafter)
    return model, tok


def test_auto_finds_the_head_in_the_target(qwen35, glm, models_dir):
    for target in (qwen35, glm):
        model, _ = load(target)  # auto, no drafter known: the target's own head
        assert model.drafter_path == target and model.drafter.tap_ids == (model.target.num_layers - 1,)
        load(target, mode="mtp")
    assert mtp_tensor_names(qwen35) and {n for n in mtp_tensor_names(glm)} == \
        {n for n in mtp_tensor_names(glm) if n.startswith("model.layers.3.")}
    plain_target = models_dir / "mtp-qwen35-mlx"  # what mlx-lm's converter leaves: no head
    assert not has_mtp(plain_target)
    assert type(mlx_spec.load(str(plain_target))[0].drafter).__name__ == "LookupDrafter"
    with pytest.raises(mlx_spec.DrafterMismatchError, match="declares no MTP head"):
        mlx_spec.load(str(plain_target), mode="mtp")


@pytest.mark.parametrize("family", ["qwen35", "glm", "qwen35-q8-converted"])
def test_greedy_identity_every_block(family, qwen35, glm, models_dir):
    target = {"qwen35": qwen35, "glm": glm}.get(family)
    if target is None:
        target = ckpt.converted(qwen35, models_dir / "mtp-qwen35-q8", 8)
    model, tok = load(target)
    blocks = (2, 3, 5, 8) if family == "qwen35" else (2, 4, 8)
    checks.assert_greedy_identity(model, tok, target, PROMPTS[:1], blocks, family)


def test_split_head_folder(qwen35, models_dir):
    """The head alone in a folder (as mlx-vlm's split writes it) is an MTP drafter by content."""
    head = ckpt.split(qwen35, models_dir / "mtp-qwen35-head")
    assert checkpoint_kind(head) == "mtp"
    model, tok = mlx_spec.load(str(qwen35), drafter=str(head), block_size=8)
    assert isinstance(model_drafter(model.drafter), MTPDrafter)
    assert spec(model, tok, PROMPTS[0], 16, block_size=4)[0] == plain(qwen35, PROMPTS[0], 16)


@pytest.mark.parametrize("edit, message", [
    (dict(hidden_size=32), "hidden_size 32 != target's 64"),
    (dict(num_hidden_layers=6), "MTP head of a 6-layer model"),
    (dict(mtp_num_hidden_layers=2), "only 1 is supported"),
    ("fc-width", "MTP weights do not match"),
])
def test_mismatch_is_refused(tmp_path, qwen35, edit, message):
    if edit == "fc-width":
        head = ckpt.split(qwen35, tmp_path / "head")
        weights = dict(mx.load(str(head / "model.safetensors")))
        weights["mtp.fc.weight"] = weights["mtp.fc.weight"][:, :96]
        mx.save_safetensors(str(head / "model.safetensors"), weights)
    else:
        head = ckpt.split(qwen35, tmp_path / "head", **edit)
    with pytest.raises(mlx_spec.DrafterMismatchError, match=message):
        mlx_spec.load(str(qwen35), drafter=str(head), mode="mtp")


def test_trained_head_is_accepted(qwen35, models_dir):
    """Fitted (first step only) to the hybrid target's greedy continuation, the head's first draft is accepted
    in every round: decoding pairs h_t (last layer, after the final norm) with x_{t+1} as training did."""
    model, tok = load(qwen35)
    checks.assert_training_gets_accepted(model, tok, qwen35)


@pytest.fixture(scope="module")
def tiny(models_dir):
    """A hybrid Qwen3.5 over 8 token ids (joint law enumerable) with a flat random MTP head."""
    tok_dir = factory.make_tiny_tokenizer(models_dir / "mtp-tiny-tokenizer")
    return ckpt.qwen35(models_dir / "mtp-tiny", tok_dir, seed=7, scale=1.6)


class WithVocab:
    """The model as exact_joint reads it: qwen3_5 keeps vocab_size in its text config, not in args."""

    def __init__(self, model, vocab_size):
        self.model, self.args = model, SimpleNamespace(vocab_size=vocab_size)

    def __call__(self, tokens):
        return self.model(tokens)


def test_sampling_follows_target_with_several_drafts(tiny):
    """Unseeded rejection sampling on a hybrid target, pooled over 2..7 drafts a round."""
    model, tok = load(tiny)
    p, accepted = checks.pooled_sampling(model, tok, checks.TINY_LAW, 120, joint=True,
                                         law_model=WithVocab(model.model, model.vocab_size))
    assert p > 1e-3
    assert accepted[0] > 10 and accepted[1] > 3, accepted


def test_seeded_sampling_equals_plain_seeded_decoding(tiny):
    model, tok = load(tiny)
    checks.assert_seeded_is_plain_seeded(model, tok, range(3))


def test_eval_drafter_and_bench_run(glm, capsys):
    common = ["--model", str(glm), "--mode", "mtp"]  # no --drafter: the target's own head
    checks.assert_eval_drafter_and_bench_run(capsys, common, ["--max-tokens", "12", "--limit", "2", "--block-size", "3"],
                                             3, mode="mtp")




# ----------------------------------------------------------------------------- DeepSeek-V3 / Kimi-K2


@pytest.fixture(scope="module")
def deepseek(models_dir, tokenizer_dir):
    return ckpt.deepseek_v3(models_dir / "mtp-deepseek-v3", tokenizer_dir)


def test_deepseek_v3_head_computes_the_published_module(deepseek):
    """The head read from model.layers.61 (MLA kv_b_proj split and experts stacked by mlx-lm's own
    sanitize, the shared_head/embed_tokens copies replaced by the target's) computes what the module it
    was written from computes: lm_head(shared_head.norm(block(eh_proj([enorm(emb) ; hnorm(h)]))))."""
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import deepseek_v3 as ds

    model, tok = load(deepseek, mode="mtp")
    assert model.drafter.tap_ids == (60,)
    assert {n.split(".")[2] for n in mtp_tensor_names(deepseek)} == {"61"}
    args = ds.ModelArgs.from_dict(ckpt.DEEPSEEK_V3)
    mx.random.seed(5)  # the builder's mtp_seed: the same block, before it was written in HF form
    block = ds.DeepseekV3DecoderLayer(args, 61)
    block.update(tree_unflatten([(k, v * 2.0 if v.ndim >= 2 else v) for k, v in tree_flatten(block.parameters())]))
    w = mx.load(str(deepseek / "model.safetensors"))
    rms = lambda x, name: mx.fast.rms_norm(x, w[f"model.layers.61.{name}.weight"], 1e-6)
    ids = tok.encode("def add(a, b):")
    _, hidden = model.target(mx.array([ids]), None)
    h = model.drafter.features(hidden)[:, -1:]  # the last layer's output after the target's final norm
    emb = model.target.embed(mx.array([[ids[-1]]]))
    x = mx.concatenate([rms(emb, "enorm"), rms(h, "hnorm")], axis=-1) @ w["model.layers.61.eh_proj.weight"].T
    ref = rms(block(x, None, None), "shared_head.norm") @ w["lm_head.weight"].T
    ours = model.drafter.logits(model.drafter.step(h, mx.array([[ids[-1]]]), None))
    assert mx.allclose(ours, ref[0].astype(mx.float32), atol=1e-4).item()


DS_N = 48  # PROMPTS[0]'s greedy continuation on this target ends (EOS) after 17 tokens


@pytest.mark.parametrize("model_type", ["deepseek_v3", pytest.param("kimi_k2", marks=pytest.mark.slow)])
def test_deepseek_v3_greedy_identity(deepseek, models_dir, tokenizer_dir, model_type):
    """The random head: every draft rejected, the output still mlx-lm's."""
    target = deepseek if model_type == "deepseek_v3" else ckpt.deepseek_v3(models_dir / "mtp-kimi-k2", tokenizer_dir,
                                                                          model_type="kimi_k2")
    model, tok = load(target, eval_every=0)  # auto: the target's own head. 61 layers: one eval per pass
    checks.assert_greedy_identity(model, tok, target, PROMPTS[:1], (4,), model_type, n=DS_N)


@pytest.fixture(scope="module")
def fitted_deepseek(deepseek, models_dir):
    """The DeepSeek-V3 target with its MTP module fitted (first step only) to the target's own greedy
    continuation of PROMPTS[0], then written back at model.layers.61 in the published layout, so that
    loading it goes through the whole reading path again (mlx-lm's sanitize included)."""
    out = models_dir / "mtp-deepseek-v3-fitted"
    if not (out / "config.json").exists():
        model, tok = load(deepseek, mode="mtp", eval_every=0)
        checks.train(model.drafter, model.target, tok.encode(PROMPTS[0]) + plain(deepseek, PROMPTS[0], DS_N),
                     steps=60, lr=1e-2)
        ckpt.with_head(deepseek, out, model.drafter.head)
    return out


@pytest.mark.parametrize("model_type", ["deepseek_v3", pytest.param("kimi_k2", marks=pytest.mark.slow)])
def test_deepseek_v3_fitted_head_is_accepted(fitted_deepseek, deepseek, models_dir, model_type):
    """Drafts accepted and rejected, at one MTP step a round (block 2) and at five (block 6, the head chained
    on its own output), and the output is mlx-lm's plain greedy token for token."""
    target = fitted_deepseek
    if model_type == "kimi_k2":  # mlx-lm maps kimi_k2 to deepseek_v3: the same tensors under Kimi's config
        model, _ = load(fitted_deepseek, mode="mtp", eval_every=0)
        target = ckpt.with_head(fitted_deepseek, models_dir / "mtp-kimi-k2-fitted", model.drafter.head, "kimi_k2")
    model, tok = load(target, eval_every=0)  # auto: the fitted head inside the target
    ref = plain(deepseek if model_type == "deepseek_v3" else target, PROMPTS[0], DS_N)  # with_head copies the
    # target's own tensors unchanged (and mlx-lm drops layer 61): mlx-lm's greedy output is the original's
    stats = {}
    for block in (2, 6):
        got, last = spec(model, tok, PROMPTS[0], DS_N, block_size=block)
        assert got == ref, (model_type, block)
        stats[block] = (last.spec.accepted, last.spec.drafted, last.spec.accepted_per_position)
    (a2, d2, _), (a6, d6, per6) = stats[2], stats[6]
    assert a2 / d2 > 0.7, stats  # fitted: the first step is mostly right
    assert a6 < d6 and per6[1] > 0 and a6 > a2 / 2, stats  # some chained drafts accepted, some rejected


def test_deepseek_v3_eval_drafter_and_bench_run(fitted_deepseek, tmp_path, capsys):
    """eval-drafter and bench with --mode mtp on the fitted head, over the one raw prompt it was fitted to
    (a 61-layer pass is slow here: the built-in prompt sets would take a minute); bench's cost curve preset."""
    import json

    from mlx_spec.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"text": PROMPTS[0], "kind": "code"}) + "\n")
    common = ["--model", str(fitted_deepseek), "--mode", "mtp", "--prompts", str(prompts)]
    checks.preset_cost_curve(common[:4])
    assert main(["eval-drafter", *common, "--max-tokens", "8", "--block-size", "3"]) == 0
    assert "code" in capsys.readouterr().out  # the τ table, one row for the prompt's kind
    assert main(["bench", *common, "--kinds", "", "--max-tokens", "8", "--repeats", "1", "--block-sizes", "3",
                 "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["results"]
    assert row["identical"] and row["mode"] == "mtp" and row["tau"] > 1.5, row


@pytest.mark.slow
def test_deepseek_v3_greedy_identity_every_block(deepseek):
    model, tok = load(deepseek, eval_every=0)
    checks.assert_greedy_identity(model, tok, deepseek, PROMPTS[:2], range(2, 9), "deepseek_v3")
