"""The target's fine-tune against greedy loops (train/unlikelihood.py): which tokens count as repeats,
what the loss does to them, and the trainer running it (resumable, logged, refused without prompts)."""

import dataclasses
import json

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import pytest
from mlx_lm import load

import mlx_spec
from mlx_spec.train.config import UnlikelihoodConfig
from mlx_spec.train.unlikelihood import Rollouts, repeated_ngrams, unlikelihood_loss

from test_train_mix import fake_sources, tiny_run  # noqa: F401  (the fixture)


def test_repeated_ngrams_marks_every_token_of_a_repeat():
    assert repeated_ngrams([1, 2, 3, 4, 5, 6]) == [False] * 6
    # "a b c d a b c d": the second 4-gram repeats the first; so do the ones across the seam
    assert repeated_ngrams([1, 2, 3, 4, 1, 2, 3, 4]) == [False] * 4 + [True] * 4
    assert repeated_ngrams([7] * 6) == [False, True, True, True, True, True]
    assert repeated_ngrams([1, 2, 3], n=4) == [False] * 3
    assert repeated_ngrams([1, 2, 1, 2, 1], n=2) == [False, False, True, True, True]


def test_the_loss_lowers_only_the_marked_tokens(target_dir):
    model, _ = load(str(target_dir))
    tokens = mx.array([[5, 9, 5, 9, 5, 9, 5, 9]])
    marked = mx.array([[0, 0, 0, 0, 0, 0, 1, 1]], dtype=mx.float32)
    assert unlikelihood_loss(model, tokens, mx.zeros_like(marked)).item() == 0.0

    def p(position):  # probability of the token at `position` given the ones before it
        logits = model(tokens[:, :position])[0, -1]
        return mx.softmax(logits.astype(mx.float32))[tokens[0, position]].item()

    before = p(7), p(3)
    opt = optim.SGD(learning_rate=0.5)
    loss_and_grad = nn.value_and_grad(model, unlikelihood_loss)
    first, _ = loss_and_grad(model, tokens, marked)
    for _ in range(3):
        loss, grads = loss_and_grad(model, tokens, marked)
        opt.update(model, grads)
        mx.eval(model.parameters())
    assert loss.item() < first.item() and p(7) < before[0]
    # the loss is -log(1 - p): the token at 7 is marked, at 3 it is not, yet the same context predicts it
    expected = -(mx.log(1 - mx.array([p(6), p(7)]))).mean().item()
    assert unlikelihood_loss(model, tokens, marked).item() == pytest.approx(expected, rel=1e-4)


def test_rollouts_are_the_models_greedy_answers(target_dir, tmp_path):
    model, tok = load(str(target_dir))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(5))
                       + json.dumps({"prompt": "long " * 500}) + "\n")
    cfg = UnlikelihoodConfig(prompts=prompts, batch=3, tokens=12, max_prompt=64)
    rollouts = Rollouts(cfg, tok, seed=0)
    assert len(rollouts.prompts) == 5  # the over-long prompt is left out
    tokens, marked, share = rollouts.batch(model, step=3)
    again = rollouts.batch(model, step=3)
    assert mx.array_equal(tokens, again[0]).item() and mx.array_equal(marked, again[1]).item()
    assert tokens.shape[0] == 3 and 0 <= share <= 1
    for row, mask in zip(tokens.tolist(), marked.tolist()):  # each row: a prompt, then its answer's repeats
        prompt = next(p for p in rollouts.prompts if row[: len(p)] == p)
        answer = row[len(prompt):]
        while answer and answer[-1] == 0 and not mask[len(prompt) + len(answer) - 1]:
            answer.pop()  # (right padding)
        assert mask[: len(prompt)] == [0] * len(prompt)
        assert [bool(m) for m in mask[len(prompt):len(prompt) + len(answer)]] == repeated_ngrams(answer)
    with pytest.raises(mlx_spec.errors.MlxSpecError, match="no prompt of at most"):
        Rollouts(dataclasses.replace(cfg, max_prompt=1), tok, seed=0)


def test_trainer_fine_tunes_with_unlikelihood_and_resumes_exactly(fake_sources, tmp_path):  # noqa: F811
    from mlx_spec.train.target import train

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {i}", "kind": "chat"}) + "\n" for i in range(6)))

    def cfg(out):
        return tiny_run(out, fake_sources, steps=3,
                        unlikelihood=UnlikelihoodConfig(prompts=prompts, batch=2, tokens=16))

    straight = train(cfg(tmp_path / "a"))
    log = [json.loads(line) for line in (tmp_path / "a/log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and all("ul" in r and 0 <= r["repeats"] <= 1 for r in log)
    assert train(cfg(tmp_path / "b"), until=1) is None
    resumed = train(cfg(tmp_path / "b"))
    a, b = mx.load(str(straight / "model.safetensors")), mx.load(str(resumed / "model.safetensors"))
    assert all(mx.array_equal(a[k], b[k]).item() for k in a)


def test_cli_refuses_a_missing_prompt_file(tmp_path, capsys):
    from mlx_spec.cli import main

    assert main(["train-target", "--out", str(tmp_path / "run"), "--unlikelihood", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such prompt file" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
