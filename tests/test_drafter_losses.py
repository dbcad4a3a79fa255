"""The drafter's training losses (cross-entropy, Accept-Until-Fail, distillation from the target's
distribution), its labels (the answer's or the target's own) and its sliding-window option: what each step
supervises, against a small random target."""

import json

import mlx.core as mx
import numpy as np
import pytest

import mlx_spec
from mlx_spec.drafters.dflash import load_dflash, save_dflash
from mlx_spec.train.drafter import (DrafterTrainConfig, DrafterTrainer, auf_mask, block_batch, new_drafter,
                                    sequence_loss, slot_kl, target_labels, train_logits)


def test_auf_mask_stops_after_first_miss():
    correct = mx.array([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]])
    assert auf_mask(correct).tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


@pytest.fixture(scope="module")
def pair(target_dir):
    model, tok = mlx_spec.load(str(target_dir), drafter=None)  # a small random target: fast on any BLAS
    return model, tok


def _one_sequence(model, tok, drafter, block):
    tokens = tok.encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n")
    model.target.set_taps(drafter.tap_ids)
    _, hidden = model.target(mx.array([tokens]), cache=None)
    rng = np.random.default_rng(0)
    return tokens, hidden, block_batch(tokens, 4, 6, block, drafter.config.mask_token_id, rng)


def test_auf_loss_weights_only_reachable_slots(pair, tmp_path):
    model, tok = pair
    cfg = DrafterTrainConfig(out=tmp_path, block_size=4, target_layer_ids=[1, 3])
    drafter = new_drafter(model.target, model.config, tok, cfg)
    tokens, hidden, (pos, ids, labels) = _one_sequence(model, tok, drafter, 4)
    ce = sequence_loss(drafter, hidden, pos, ids, labels, 4.0, "ce")
    auf = sequence_loss(drafter, hidden, pos, ids, labels, 4.0, "auf")
    assert auf[1].item() < ce[1].item()  # an untrained drafter misses: fewer slots carry weight
    assert auf[1].item() >= float(mx.exp(-mx.zeros(1)).item()) * pos.shape[0] - 1e-4  # slot 1 always counts
    assert mx.array_equal(ce[2], auf[2]).item()  # same predictions, same accuracy counters
    with pytest.raises(ValueError, match="loss"):
        sequence_loss(drafter, hidden, pos, ids, labels, 4.0, "mse")


def test_kd_loss_reads_the_targets_distribution_at_each_slots_own_row(pair, tmp_path):
    """A target certain of the sequence's next token at every row: the KL part is the cross-entropy
    against that token, so kd reads twice ce."""
    model, tok = pair
    cfg = DrafterTrainConfig(out=tmp_path, block_size=4, target_layer_ids=[1, 3])
    drafter = new_drafter(model.target, model.config, tok, cfg)
    tokens, hidden, (pos, ids, labels) = _one_sequence(model, tok, drafter, 4)
    vocab = drafter.config.vocab_size
    nxt = mx.array(tokens[1:] + [0])
    certain = 60.0 * (mx.arange(vocab)[None] == nxt[:, None]).astype(mx.float32)[None]  # row r: token r+1
    ce = sequence_loss(drafter, hidden, pos, ids, labels, 4.0, "ce")
    kd = sequence_loss(drafter, hidden, pos, ids, labels, 4.0, "kd", certain)
    assert kd[0].item() == pytest.approx(2 * ce[0].item(), rel=1e-4)
    assert kd[1].item() == ce[1].item() and mx.array_equal(kd[2], ce[2]).item()
    with pytest.raises(ValueError, match="teacher"):
        sequence_loss(drafter, hidden, pos, ids, labels, 4.0, "kd")


def test_slot_kl_pairs_slot_j_of_an_anchor_p_with_the_targets_row_p_plus_j():
    rows = 10.0 * (mx.arange(6)[None] == (mx.arange(12) % 6)[:, None]).astype(mx.float32)  # row r: token r % 6
    teacher, pos = rows[None], mx.array([2, 7])
    aligned = mx.stack([rows[p : p + 3] for p in (2, 7)])
    assert (mx.abs(slot_kl(aligned, teacher, pos, 3)) < 1e-4).all().item()
    off_by_one = mx.stack([rows[p + 1 : p + 4] for p in (2, 7)])
    assert (slot_kl(off_by_one, teacher, pos, 3) > 5).all().item()
    past_the_end = mx.stack([rows[2:5], rows[mx.array([11, 11, 11])]])  # anchor 11: rows 12, 13 read the last
    assert (mx.abs(slot_kl(past_the_end, teacher, mx.array([2, 11]), 3)) < 1e-4).all().item()


def test_sliding_window_training_matches_inference(pair, tmp_path):
    """The training loss sees exactly the rows the drafter attends to while decoding, and the option
    survives saving and loading."""
    model, tok = pair
    cfg = DrafterTrainConfig(out=tmp_path, block_size=4, target_layer_ids=[1, 3], sliding_window=5)
    drafter = new_drafter(model.target, model.config, tok, cfg)
    assert drafter.config.window(0) == 5 and not drafter.config.causal(0)
    tokens, hidden, (pos, ids, labels) = _one_sequence(model, tok, drafter, 4)
    path = save_dflash(drafter, tmp_path / "drafter")
    loaded = load_dflash(path, model.target, model.config)
    assert loaded.config.window(0) == 5 and loaded.config.causal(0) is False
    full = DrafterTrainConfig(out=tmp_path, block_size=4, target_layer_ids=[1, 3])
    unwindowed = new_drafter(model.target, model.config, tok, full)
    unwindowed.update(drafter.parameters())
    a = int(pos[-1].item())
    assert a > 5  # the window hides rows from this block
    got = []
    for d in (loaded, unwindowed):
        state = d.make_state()
        d.observe(state, hidden[:, :a], tokens[:a])
        logits = d.block_logits(state, tokens[a], 4)[0, 1:]
        assert mx.allclose(logits, train_logits(d, hidden, pos[-1:], ids[-1:])[0], atol=1e-4).item()
        got.append(logits)
    assert not mx.allclose(got[0], got[1], atol=1e-3).item()
    assert json.loads((path / "config.json").read_text())["sliding_window"] == 5


def test_trainer_runs_auf_with_window_and_resumes(pair, tmp_path):
    model, tok = pair
    text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n" * 3
    records = [{"tokens": tok.encode(text), "prompt_len": 5}]
    cfg = DrafterTrainConfig(out=tmp_path, block_size=4, target_layer_ids=[1, 3], steps=2, warmup=1,
                             loss="auf", sliding_window=16, checkpoint_every=1, sequences_per_step=1,
                             anchors_per_sequence=4)
    t = DrafterTrainer(model.target, model.config, tok, records, cfg)
    while not t.done:
        record = t.step()
    assert record["step"] == 2 and record["loss"] > 0
    cfg.steps = 3
    again = DrafterTrainer(model.target, model.config, tok, records, cfg)
    assert again.step_no == 2 and again.drafter.config.window(0) == 16  # resumed with the window


def test_train_drafter_rejects_bad_window(capsys):
    from mlx_spec.cli import main

    assert main(["train-drafter", "--sliding-window", "1"]) == 2
    assert "at least 2" in capsys.readouterr().err
    assert main(["train-drafter", "--sliding-window", "64", "--init-drafter", "x"]) == 2
    assert "cannot be combined" in capsys.readouterr().err


def test_target_labels_are_a_greedy_answers_own_tokens():
    tokens = [5, 6, 7, 8, 9, 10, 11]
    greedy = np.array(tokens[1:] + [3])  # row k's argmax is token k + 1: the answer is the target's greedy one
    pos, _, labels = block_batch(tokens, 2, 5, 4, 0, np.random.default_rng(1))
    assert target_labels(tokens, greedy, pos, 4).tolist() == labels.tolist()  # -1 past the end included


def test_target_labels_follow_the_target_until_a_sampled_token_leaves_it():
    tokens = [5, 6, 7, 8, 9, 10, 11, 12]
    greedy = np.array([6, 7, 40, 9, 10, 11, 12, 3])  # token 3 (8) was sampled: the target would say 40
    got = target_labels(tokens, greedy, mx.array([1, 2, 3, 5]), 4).tolist()
    assert got == [[7, 40, -1],  # slot 2 is the target's token, and after the answer left it nothing is known
                   [40, -1, -1],
                   [9, 10, 11],  # an anchor after the sampled token: the target's tokens from its context
                   [11, 12, -1]]


def test_the_trainer_reads_the_targets_labels(pair, tmp_path):
    """On the target's own greedy answer both labels are one; on other text they are not."""
    model, tok = pair
    ids = tok.encode("def add(a, b):")
    prompt_len = len(ids)
    for _ in range(24):  # the random target's greedy answer, one full pass a token
        logits, _ = model.target(mx.array([ids]), cache=None)
        ids.append(int(logits[0, -1].argmax()))
    text = tok.encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n")
    losses = {}
    for name, tokens in (("greedy", ids), ("text", text)):
        for labels in ("data", "target"):
            cfg = DrafterTrainConfig(out=tmp_path / f"{name}-{labels}", block_size=4, target_layer_ids=[1, 3],
                                     steps=1, warmup=1, labels=labels, sequences_per_step=1, anchors_per_sequence=6)
            losses[name, labels] = DrafterTrainer(model.target, model.config, tok,
                                                  [{"tokens": tokens, "prompt_len": prompt_len}], cfg).step()["loss"]
    assert losses["greedy", "data"] == pytest.approx(losses["greedy", "target"], rel=1e-5)
    assert losses["text", "data"] != pytest.approx(losses["text", "target"], rel=1e-3)
    with pytest.raises(ValueError, match="labels must be one of data, target"):
        DrafterTrainer(model.target, model.config, tok, [], DrafterTrainConfig(out=tmp_path / "x", labels="greedy"))
