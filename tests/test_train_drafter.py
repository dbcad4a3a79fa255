"""The drafter trainer: it learns, resumes, and writes drafters the loader accepts."""

import json
from dataclasses import replace

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

import factory
import mlx_spec
from mlx_spec.errors import MlxSpecError
from mlx_spec.loading import Loaded
from mlx_spec.train.checkpoint import load_checkpoint, save_checkpoint
from mlx_spec.train.data import DataConfig, generate_data, read_prompts
from mlx_spec.train.drafter import (DrafterTrainConfig, block_batch, cut_labels, decay_gamma, grow, new_drafter, reblock,
                                    train_drafter, train_logits)
from mlx_spec.train.evaluate import measure

PROMPTS = [{"messages": [{"role": "user", "content": t}], "kind": k} for t, k in [
    ("def add(a, b):", "code"), ("Hello, how are you", "chat"), ("for i in range(10):", "code"),
    ("The quick brown fox", "chat"), ("import os", "code"), ("class Stack:", "code"),
    ("I am fine, thanks", "chat"), ("print(os.path.join", "code")]]


@pytest.fixture(scope="module")
def shallow(models_dir, tokenizer_dir):
    # One layer: the target's next token depends mostly on recent tokens, which a short run can learn.
    path = factory.make_target(models_dir / "shallow", tokenizer_dir, "qwen3", layers=2, seed=5, scale=6.0)
    model, tok = mlx_spec.load(str(path), drafter=None)
    return model, tok


def test_trainer_learns(tmp_path, shallow):
    model, tok = shallow
    records = generate_data(model.model, tok, PROMPTS, tmp_path / "data.jsonl", DataConfig(max_tokens=48))
    cfg = DrafterTrainConfig(out=tmp_path / "run", block_size=4, steps=200, lr=3e-3, warmup=20,
                             target_layer_ids=[0, 1], sequences_per_step=4, anchors_per_sequence=16, checkpoint_every=1000)
    untrained = new_drafter(model.target, model.config, tok, cfg)
    model.target.set_taps(untrained.tap_ids)
    before = measure(Loaded(model.target, untrained, model.target_path, None, model.config), tok, PROMPTS, 32)["all"].tau
    path = train_drafter(model.target, model.config, tok, records, cfg)
    trained, _ = mlx_spec.load(str(model.target_path), drafter=str(path))
    after = measure(trained, tok, PROMPTS, 32)["all"].tau
    assert after > before + 0.5, (before, after)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"] * 0.7


def test_data_generation_resumes(tmp_path, shallow):
    model, tok = shallow
    out = tmp_path / "data.jsonl"
    first = generate_data(model.model, tok, PROMPTS[:3], out, DataConfig(max_tokens=8, batch_size=2))
    kept = out.read_text()
    with out.open("a") as fh:
        fh.write('{"id": 3, "tok')  # an interrupted write
    calls = []
    everything = generate_data(model.model, tok, PROMPTS, out, DataConfig(max_tokens=8, batch_size=2),
                               progress=lambda done, total: calls.append(done))
    assert out.read_text().startswith(kept)
    assert [r["id"] for r in everything] == list(range(len(PROMPTS)))
    assert everything[:3] == first and calls == [5, 7, 8]  # only the 5 missing prompts were generated
    assert all(json.loads(line) for line in out.read_text().splitlines())


def test_checkpoint_round_trip(tmp_path, shallow):
    model, tok = shallow
    cfg = DrafterTrainConfig(out=tmp_path, target_layer_ids=[0, 1])
    a = new_drafter(model.target, model.config, tok, cfg)
    opt = optim.AdamW(learning_rate=1e-3)
    opt.init(a.trainable_parameters())
    save_checkpoint(tmp_path / "ckpt", a, opt, 42, cfg)
    mx.random.seed(99)
    b = new_drafter(model.target, model.config, tok, cfg)
    opt_b = optim.AdamW(learning_rate=1e-3)
    assert load_checkpoint(tmp_path / "ckpt", b, opt_b) == 42
    for (ka, va), (kb, vb) in zip(tree_flatten(a.parameters()), tree_flatten(b.parameters())):
        assert ka == kb and mx.array_equal(va, vb).item()
    assert set(dict(tree_flatten(opt_b.state))) == set(dict(tree_flatten(opt.state)))


def test_stopping_with_until_then_resuming_is_the_same_run(tmp_path, shallow):
    model, tok = shallow
    records = generate_data(model.model, tok, PROMPTS[:4], tmp_path / "data.jsonl", DataConfig(max_tokens=16))

    def run(out, until=None):
        cfg = DrafterTrainConfig(out=out, block_size=4, steps=6, warmup=2, target_layer_ids=[0, 1],
                                 sequences_per_step=2, anchors_per_sequence=4, checkpoint_every=1000)
        mx.random.seed(0)
        return train_drafter(model.target, model.config, tok, records, cfg, until=until,
                             provenance={"init_drafter": None, "prompts": "four"})

    assert run(tmp_path / "split", until=3) is None and not (tmp_path / "split" / "drafter").exists()
    assert run(tmp_path / "data-only", until=0) is None and not (tmp_path / "data-only" / "checkpoint").exists()
    assert load_checkpoint(tmp_path / "split" / "checkpoint", *_fresh_state(model, tok, tmp_path)) == 3
    resumed, straight = run(tmp_path / "split"), run(tmp_path / "straight")
    a, b = mx.load(str(resumed / "model.safetensors")), mx.load(str(straight / "model.safetensors"))
    assert a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)
    meta = json.loads((resumed / "config.json").read_text())["mlx_spec"]
    assert meta["steps"] == 6 and meta["prompts"] == "four" and meta["lr"] == DrafterTrainConfig.lr


def _fresh_state(model, tok, tmp_path):
    d = new_drafter(model.target, model.config, tok, DrafterTrainConfig(out=tmp_path, target_layer_ids=[0, 1], block_size=4))
    opt = optim.AdamW(learning_rate=1e-3)
    opt.init(d.trainable_parameters())
    return d, opt


def test_prompt_files(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hi", "kind": "chat"}\n"plain"\n{"messages": [{"role": "user", "content": "x"}]}\n')
    got = read_prompts(f)
    assert [p["messages"][0]["content"] for p in got] == ["hi", "plain", "x"] and got[0]["kind"] == "chat"
    t = tmp_path / "p.txt"
    t.write_text("one\n\ntwo\n")
    assert len(read_prompts(t)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\n')
    with pytest.raises(mlx_spec.MlxSpecError, match="bad.jsonl:1"):
        read_prompts(bad)


def test_a_checkpoint_of_another_run_is_refused(tmp_path, shallow):
    """Resuming with other settings would load mismatched weights (or none: MLX only checks shapes when
    strict) and go on as if it were the same run; a new step count is a schedule change, and goes on."""
    model, tok = shallow
    cfg = DrafterTrainConfig(out=tmp_path, target_layer_ids=[0, 1], block_size=4)
    saved = new_drafter(model.target, model.config, tok, cfg)
    opt = optim.AdamW(learning_rate=1e-3)
    opt.init(saved.trainable_parameters())
    save_checkpoint(tmp_path / "ckpt", saved, opt, 7, cfg)
    longer = DrafterTrainConfig(out=tmp_path, target_layer_ids=[0, 1], block_size=4, steps=9000, lr=1e-4)
    assert load_checkpoint(tmp_path / "ckpt", *_fresh_state(model, tok, tmp_path), longer) == 7
    for other in (dict(target_layer_ids=[0]), dict(block_size=8), dict(seed=3), dict(loss="auf"),
                  dict(labels="target"), dict(decay_gamma=7.0)):
        changed = DrafterTrainConfig(**{**dict(out=tmp_path, target_layer_ids=[0, 1], block_size=4), **other})
        with pytest.raises(MlxSpecError, match="checkpoint of another run.*" + next(iter(other))):
            load_checkpoint(tmp_path / "ckpt", *_fresh_state(model, tok, tmp_path), changed)
    deeper = DrafterTrainConfig(out=tmp_path, target_layer_ids=[0, 1], block_size=4, num_layers=2)
    d = new_drafter(model.target, model.config, tok, deeper)  # other weights (no settings to compare)
    o = optim.AdamW(learning_rate=1e-3)
    o.init(d.trainable_parameters())
    with pytest.raises(MlxSpecError, match="other weights"):
        load_checkpoint(tmp_path / "ckpt", d, o)


def test_a_grown_drafter_drafts_as_before_then_trains_its_new_layer(tmp_path, shallow):
    model, tok = shallow
    cfg = DrafterTrainConfig(out=tmp_path / "run", block_size=4, target_layer_ids=[0, 1], steps=2, warmup=1,
                             sequences_per_step=1, anchors_per_sequence=4, checkpoint_every=1000)
    shallower = new_drafter(model.target, model.config, tok, cfg)
    deeper = grow(shallower, 3)
    assert deeper.config.num_hidden_layers == 3 and shallower.config.num_hidden_layers == 1
    model.target.set_taps(shallower.tap_ids)
    ids = tok.encode("def add(a, b):\n    return a + b\n")
    _, hidden = model.target(mx.array([ids]), cache=None)
    logits = []
    for d in (shallower, deeper):
        state = d.make_state()
        d.observe(state, hidden, ids)
        logits.append(d.block_logits(state, ids[-1], 4))
    assert mx.allclose(logits[0], logits[1], atol=1e-5).item()
    records = [{"tokens": ids + ids, "prompt_len": 4}]
    cfg.num_layers = 3
    path = train_drafter(model.target, model.config, tok, records, cfg, init=deeper)
    trained = mx.load(str(path / "model.safetensors"))
    assert mx.abs(trained["layers.2.self_attn.o_proj.weight"]).max().item() > 0  # the new layer learns
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 3
    with pytest.raises(ValueError, match="cannot grow"):
        grow(deeper, 2)
    shallower.config = replace(shallower.config, quantization={"group_size": 64, "bits": 4})
    with pytest.raises(ValueError, match="quantized"):
        grow(shallower, 2)


def test_train_drafter_grows_but_never_shrinks_an_initial_drafter(tmp_path, capsys, shallow):
    from mlx_spec.cli import main
    from mlx_spec.drafters.dflash import save_dflash

    model, tok = shallow
    two = new_drafter(model.target, model.config, tok, DrafterTrainConfig(target_layer_ids=[0, 1], num_layers=2))
    init = save_dflash(two, tmp_path / "two")
    assert main(["train-drafter", "--model", str(model.target_path), "--init-drafter", str(init),
                 "--layers", "1", "--out", str(tmp_path / "run")]) == 2
    assert "can grow, not shrink" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before any answers were generated
    assert main(["train-drafter", "--layers", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_a_reblocked_drafter_keeps_its_weights_and_fine_tunes_at_the_new_size(tmp_path, shallow):
    model, tok = shallow
    four = new_drafter(model.target, model.config, tok,
                       DrafterTrainConfig(target_layer_ids=[0, 1], block_size=4))
    eight = reblock(four, 8)
    assert (four.config.block_size, eight.config.block_size) == (4, 8)
    for (name, a), (_, b) in zip(tree_flatten(four.parameters()), tree_flatten(eight.parameters())):
        assert mx.array_equal(a, b).item(), name
    with pytest.raises(ValueError, match="at least one draft"):
        reblock(four, 1)
    ids = tok.encode("def add(a, b):\n    return a + b\n")
    cfg = DrafterTrainConfig(out=tmp_path / "run", block_size=8, target_layer_ids=[0, 1], steps=2, warmup=1,
                             sequences_per_step=1, anchors_per_sequence=4, checkpoint_every=1000)
    records = [{"tokens": ids + ids, "prompt_len": 4}]
    with pytest.raises(ValueError, match="drafts blocks of 4, the settings ask for 8"):
        train_drafter(model.target, model.config, tok, records, cfg, init=four)  # never re-blocked unasked
    path = train_drafter(model.target, model.config, tok, records, cfg, init=eight)
    assert json.loads((path / "config.json").read_text())["dflash_config"]["block_size"] == 8
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len(log[-1]["slot_acc"]) == 7  # every slot of the new block was taught
    four.config = replace(four.config, quantization={"group_size": 64, "bits": 4})
    with pytest.raises(ValueError, match="quantized"):
        reblock(four, 8)


def test_the_loss_decays_slower_over_a_longer_block():
    assert [decay_gamma(DrafterTrainConfig(), b) for b in (4, 8, 10, 13, 16, 32)] == [4.0, 4.0, 5.0, 6.0, 7.0, 7.0]
    assert decay_gamma(DrafterTrainConfig(decay_gamma=2.5), 16) == 2.5


def test_train_drafter_fine_tunes_an_initial_drafter_to_another_block_size(tmp_path, capsys, shallow):
    from mlx_spec.cli import main
    from mlx_spec.drafters.dflash import save_dflash

    model, tok = shallow
    four = new_drafter(model.target, model.config, tok, DrafterTrainConfig(target_layer_ids=[0, 1], block_size=4))
    init = save_dflash(four, tmp_path / "four")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:2]))
    common = ["train-drafter", "--model", str(model.target_path), "--init-drafter", str(init), "--prompts", str(prompts),
              "--max-tokens", "8", "--steps", "1", "--eval-prompts", "0"]
    assert main(common + ["--out", str(tmp_path / "same")]) == 0  # no --block-size: the drafter's own
    assert json.loads((tmp_path / "same" / "drafter" / "config.json").read_text())["block_size"] == 4
    assert main(common + ["--out", str(tmp_path / "six"), "--block-size", "6"]) == 0
    assert json.loads((tmp_path / "six" / "drafter" / "config.json").read_text())["block_size"] == 6
    assert main(["train-drafter", "--block-size", "1"]) == 2
    assert "at least 2" in capsys.readouterr().err
    assert main(["train-drafter", "--decay-gamma", "0"]) == 2
    assert "--decay-gamma must be positive" in capsys.readouterr().err


def test_a_block_trained_at_a_sub_block_size_sees_only_its_own_rows(shallow):
    """Blocks of several sizes train in one batch: the first s rows of a block trained at size s give the
    logits a block of s rows gives alone (what drafting from it runs), and only its s - 1 slots are taught."""
    model, tok = shallow
    d = new_drafter(model.target, model.config, tok, DrafterTrainConfig(target_layer_ids=[0, 1], block_size=8))
    model.target.set_taps(d.tap_ids)
    ids = tok.encode("def add(a, b):\n    return a + b\n" * 2)
    _, hidden = model.target(mx.array([ids]), cache=None)
    pos, blocks, labels = block_batch(ids, 2, 3, 8, d.config.mask_token_id, np.random.default_rng(0))
    sizes = np.array([4, 8, 2])
    cut, whole = train_logits(d, hidden, pos, blocks, sizes), train_logits(d, hidden, pos, blocks)
    for i, n in enumerate(sizes):
        alone = train_logits(d, hidden, pos[i : i + 1], blocks[i : i + 1, :n])  # a block of n rows, alone
        np.testing.assert_allclose(np.array(cut[i, : n - 1]), np.array(alone[0]), atol=1e-4)
    assert not mx.allclose(cut[0, :3], whole[0, :3], atol=1e-4).item()  # the later rows would have mattered
    taught = cut_labels(labels, sizes)
    assert mx.array_equal(taught[1], labels[1]).item() and mx.array_equal(taught[0, :3], labels[0, :3]).item()
    assert (taught[0, 3:] == -1).all().item() and (taught[2, 1:] == -1).all().item()


def test_train_drafter_teaches_sub_blocks_and_a_fine_tune_keeps_them(tmp_path, capsys, shallow):
    from mlx_spec.cli import main
    from mlx_spec.drafters.dflash import save_dflash

    model, tok = shallow
    ids = tok.encode("def add(a, b):\n    return a + b\n")
    cfg = DrafterTrainConfig(out=tmp_path / "run", block_size=8, sub_blocks=[4], target_layer_ids=[0, 1], steps=2,
                             warmup=1, sequences_per_step=1, anchors_per_sequence=8, checkpoint_every=1000)
    path = train_drafter(model.target, model.config, tok, [{"tokens": ids + ids, "prompt_len": 4}], cfg)
    trained, _ = mlx_spec.load(str(model.target_path), drafter=str(path))
    assert trained.drafter.config.block_sizes == [4, 8] and trained.drafter.block_size == 8
    for bad in ([8], [1]):
        with pytest.raises(ValueError, match="sub-blocks"):
            train_drafter(model.target, model.config, tok, [{"tokens": ids + ids, "prompt_len": 4}],
                          replace(cfg, out=tmp_path / f"bad{bad[0]}", sub_blocks=bad))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:2]))
    common = ["train-drafter", "--model", str(model.target_path), "--init-drafter", str(path), "--prompts", str(prompts),
              "--max-tokens", "8", "--steps", "1", "--eval-prompts", "0"]

    def sizes(run):
        return json.loads((tmp_path / run / "drafter" / "config.json").read_text())["dflash_config"].get("block_sizes")

    assert main(common + ["--out", str(tmp_path / "kept")]) == 0 and sizes("kept") == [4, 8]
    assert main(common + ["--out", str(tmp_path / "more"), "--sub-blocks", "2,6"]) == 0 and sizes("more") == [2, 6, 8]
    assert main(common + ["--out", str(tmp_path / "re"), "--block-size", "6"]) == 0 and sizes("re") is None
    for bad, message in (("8", "shorter than the block (8)"), ("4,x", "comma-separated block sizes")):
        assert main(common + ["--out", str(tmp_path / "bad"), "--sub-blocks", bad]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # refused before any answers were generated
