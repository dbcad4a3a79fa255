"""DSpark's gated and RNN Markov heads and confidence truncation: the DeepSpec layout loads, greedy
output equals mlx-lm's, sampled drafts carry exactly the law they were drawn from, chi-square holds with
several drafts a round, and checkpoints that do not fit are refused."""

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import drafter_checks as checks
import factory
import mlx_spec
from mlx_spec.engine.sampling import Sampler, SamplingParams
from drafter_checks import plain
from test_lossless_greedy import spec

RANK = 16  # factory.make_dspark's markov_rank


def make_head(out: Path, target_dir: Path, head: str, scale: float = 1.0, **kw) -> Path:
    """factory's DSpark drafter with a `head` Markov head: DeepSpec's tensor names and shapes
    (`markov_head.gate_proj` [r, H+r] or `markov_head.joint_proj` [3r, 2r+H], both with bias)."""
    factory.make_dspark(out, target_dir, **kw)
    cfg = json.loads((out / "config.json").read_text())
    weights = dict(mx.load(str(out / "model.safetensors")))
    h = cfg["hidden_size"]
    mx.random.seed(len(head))
    if head == "gated":
        weights["markov_head.gate_proj.weight"] = scale * mx.random.normal((RANK, h + RANK)) / np.sqrt(h)
        weights["markov_head.gate_proj.bias"] = mx.random.normal((RANK,))
    elif head == "rnn":
        weights["markov_head.joint_proj.weight"] = scale * mx.random.normal((3 * RANK, 2 * RANK + h)) / np.sqrt(h)
        weights["markov_head.joint_proj.bias"] = mx.random.normal((3 * RANK,))
    (out / "config.json").write_text(json.dumps({**cfg, "markov_head_type": head}, indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    return out


@pytest.fixture(scope="module", params=["gated", "rnn"])
def head_dir(request, models_dir, target_dir):
    return request.param, make_head(models_dir / f"dspark-{request.param}", target_dir, request.param, scale=3.0)


def test_loads_and_greedy_matches_plain(head_dir, target_dir):
    head, path = head_dir
    model, tok = mlx_spec.load(str(target_dir), drafter=str(path))  # auto: read as DSpark from its content
    assert type(model.drafter.markov_head).__name__ == {"gated": "GatedMarkovHead", "rnn": "RNNHead"}[head]
    for prompt in ("def add(a, b):", "Hello, how are you"):
        ref = plain(target_dir, prompt, 24)
        for block in (2, 4, 6):
            got, _ = spec(model, tok, prompt, 24, block_size=block)
            assert got == ref, (head, block, prompt)


def test_quantized_target_greedy(models_dir, target_dir):
    q = models_dir / "dspark-heads-q8"
    if not q.exists():
        factory.quantize(target_dir, q, bits=8)
    path = make_head(models_dir / "dspark-rnn-q8", target_dir, "rnn", scale=3.0)  # a float drafter, 8-bit target
    model, tok = mlx_spec.load(str(q), drafter=str(path))
    got, _ = spec(model, tok, "def add(a, b):", 24, block_size=6)
    assert got == plain(q, "def add(a, b):", 24)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def reference_logits(weights: dict, head: str, base: np.ndarray, h: np.ndarray, anchor: int, tokens: list[int]):
    """DeepSpec's head math written out in numpy, teacher-forced on the drawn tokens: each slot's logits."""
    w1, w2 = weights["markov_head.markov_w1.weight"], weights["markov_head.markov_w2.weight"]
    prev, s, out = [anchor] + tokens[:-1], np.zeros(w1.shape[1]), []
    for k, x in enumerate(prev):
        e = w1[x]
        if head == "gated":
            gate = _sigmoid(weights["markov_head.gate_proj.weight"] @ np.concatenate([h[k], e])
                            + weights["markov_head.gate_proj.bias"])
            bias = w2 @ (gate * e)
        else:
            z = weights["markov_head.joint_proj.weight"] @ np.concatenate([s, e, h[k]]) + weights["markov_head.joint_proj.bias"]
            g, c, o = np.split(z, 3)
            s = _sigmoid(g) * s + (1 - _sigmoid(g)) * np.tanh(c)
            bias = w2 @ np.tanh(o)
        out.append(base[k] + bias)
    return np.stack(out)


def test_sampled_q_is_the_law_each_draft_was_drawn_from(head_dir, target_dir):
    """q_k = softmax(logits_k / T) where logits_k depends on the tokens actually drawn before slot k
    (and, for the RNN, on the state they built)."""
    head, path = head_dir
    model, tok = mlx_spec.load(str(target_dir), drafter=str(path), mode="dspark")
    d, ids = model.drafter, tok.encode("def add(a, b):")
    _, hidden = model.target(mx.array([ids]), None)
    state = d.make_state()
    d.observe(state, hidden, ids)
    weights = {k: np.array(v, dtype=np.float64) for k, v in mx.load(str(path / "model.safetensors")).items()}
    h = d.block_hidden(state, 9, 5)[0]
    base = np.array(d.lm_head(h).astype(mx.float32), dtype=np.float64)
    h = np.array(h, dtype=np.float64)
    temp = 0.9
    mx.random.seed(3)
    for _ in range(3):
        draft = d.propose(state, 9, 5, Sampler(SamplingParams(temperature=temp), d.config.vocab_size).drafting(0))
        tokens = draft.tokens.tolist()
        logits = reference_logits(weights, head, base, h, 9, tokens) / temp
        q = np.exp(logits - logits.max(-1, keepdims=True))
        np.testing.assert_allclose(np.array(draft.q), q / q.sum(-1, keepdims=True), atol=2e-5)
    greedy = d.propose(state, 9, 5, Sampler(SamplingParams(), d.config.vocab_size).drafting(0)).tokens.tolist()
    assert reference_logits(weights, head, base, h, 9, greedy).argmax(-1).tolist() == greedy


@pytest.mark.parametrize("rule", ["survival", "step"])
def test_confidence_truncation(models_dir, target_dir, rule):
    """Drafts stop where the confidence (product, or the slot's own) drops below the threshold; the
    output is still plain greedy decoding."""
    path = make_head(models_dir / f"dspark-cut-{rule}", target_dir, "rnn", scale=3.0, threshold=0.45,
                     confidence_rule=rule)
    model, tok = mlx_spec.load(str(target_dir), drafter=str(path))
    assert model.drafter.rule == rule
    got, _ = spec(model, tok, "def add(a, b):", 30, block_size=6)
    assert got == plain(target_dir, "def add(a, b):", 30)
    assert any(drafted < min(5, wanted - 1) for drafted, wanted in spec.budgets)


@pytest.fixture(scope="module")
def tiny_rnn(models_dir):
    target = factory.tiny_target(models_dir)
    return target, {head: make_head(models_dir / f"tiny-dspark-{head}", target, head, scale=2.0, taps=(0, 1),
                                    block_size=7, head_scale=0.5, markov_scale=3.0) for head in ("gated", "rnn")}


@pytest.mark.parametrize("head", ["rnn", pytest.param("gated", marks=pytest.mark.slow)])
def test_sampling_follows_target(tiny_rnn, head):
    """Rejection sampling against each slot's head-conditioned q, k = 2..7 drafts a round pooled."""
    target, drafters = tiny_rnn
    model, tok = mlx_spec.load(str(target), drafter=str(drafters[head]), mode="dspark")
    p, accepted = checks.pooled_sampling(model, tok, SamplingParams(temperature=0.8, top_p=0.9,
                                                                      logit_bias={2: -2.0, 4: 0.8}), 360)
    assert p > 1e-3
    assert accepted[1] >= 10 and accepted[0] - accepted[1] >= 10, accepted


def test_mismatches_are_refused(tmp_path, target_dir):
    def edit(name, head, config=None, drop=None):
        d = make_head(tmp_path / name, target_dir, head)
        if config:
            (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()), **config}))
        if drop:
            w = dict(mx.load(str(d / "model.safetensors")))
            mx.save_safetensors(str(d / "model.safetensors"), {k: v for k, v in w.items() if drop not in k})
        return d

    cases = [
        (edit("lstm", "rnn", {"markov_head_type": "lstm"}), mlx_spec.LoadError,
         "markov_head_type 'lstm' is not supported"),
        (edit("nogate", "gated", drop="gate_proj"), mlx_spec.DrafterMismatchError, "weights do not match its config"),
        (edit("asgated", "rnn", {"markov_head_type": "gated"}), mlx_spec.DrafterMismatchError,
         "weights do not match its config"),
        (edit("rank", "rnn", {"markov_rank": 8}), mlx_spec.DrafterMismatchError, "weights do not match its config"),
        (edit("rule", "gated", {"confidence_rule": "min"}), mlx_spec.LoadError, "confidence_rule 'min'"),
    ]
    for path, error, message in cases:
        with pytest.raises(error, match=message):
            mlx_spec.load(str(target_dir), drafter=str(path))


def test_eval_drafter_and_bench_run_it(models_dir, target_dir, capsys):
    path = make_head(models_dir / "dspark-rnn", target_dir, "rnn", scale=3.0)  # the rnn fixture's drafter
    common = ["--model", str(target_dir), "--drafter", str(path), "--mode", "dspark"]
    checks.assert_eval_drafter_and_bench_run(capsys, common, ["--max-tokens", "8", "--limit", "1"], 4)
