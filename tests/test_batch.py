"""Continuous batching: requests verified together, joining and leaving mid-flight, decode exactly as alone."""

import mlx.core as mx
import pytest

import factory
import mlx_spec
from mlx_spec.engine import loop
from mlx_spec.engine.sampling import Sampler, SamplingParams
from mlx_spec.generate import Generation, choose_lengths, encode_prompt, step_all

REQUESTS = [  # prompt, sampling, block size
    ("def add(a, b):", SamplingParams(), 4),
    ("Hello, how are you today? I am fine", SamplingParams(), 2),
    ("for i in range(10):", SamplingParams(temperature=0.8, top_k=20, seed=3), 5),
    ("import os", SamplingParams(temperature=1.0, top_p=0.9, seed=9, repetition_penalty=1.2), 3),
    ("class Stack:", SamplingParams(), 6),
    ("print(", SamplingParams(temperature=0.7, min_p=0.05, frequency_penalty=0.4, logit_bias={40: 2.0}, seed=4), 4),
]


def make(model, tok, prompt, sampling, block, max_tokens=24):
    ids = encode_prompt(tok, prompt)
    return Generation(model, tok, ids, max_tokens, Sampler(sampling, model.config["vocab_size"]), [],
                      mlx_spec.make_prompt_cache(model), choose_lengths(model, block, adaptive=False))


def alone(model, tok, req):
    g = make(model, tok, *req)
    out = g.start().tokens
    while not g.finished:
        out += step_all(model, [g])[0].tokens
    return out


def together(model, tok, requests, join_at):
    """Start requests at the given round numbers; step everything active until all finish.
    `together.left_mid_flight`: rounds after which a request finished while others went on."""
    gens, outs, active, rnd = {}, {}, [], 0
    together.left_mid_flight = 0
    while len(outs) < len(requests) or active:
        for i, at in enumerate(join_at):
            if at == rnd:
                gens[i] = make(model, tok, *requests[i])
                outs[i] = gens[i].start().tokens
                if not gens[i].finished:
                    active.append(i)
        if active:
            for i, r in zip(list(active), step_all(model, [gens[i] for i in active])):
                outs[i] += r.tokens
            left = any(gens[i].finished for i in active)
            active = [i for i in active if not gens[i].finished]
            together.left_mid_flight += left and bool(active)
        rnd += 1
    return [outs[i] for i in range(len(requests))]


@pytest.mark.parametrize("drafter_kind", ["self", "dflash"])
def test_batched_equals_alone(target_dir, drafter_dir, drafter_kind, monkeypatch):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir) if drafter_kind == "dflash" else None)
    if drafter_kind == "self":  # accepts some drafts and rejects others
        model.drafter = factory.SelfDrafter(model.model, block_size=6, mode="argmax-onehot", error_rate=0.3, seed=1)
    sizes = []
    real = loop.batch_caches
    monkeypatch.setattr(loop, "batch_caches", lambda caches: sizes.append(len(caches)) or real(caches))
    solo = [alone(model, tok, r) for r in REQUESTS]
    batched = together(model, tok, REQUESTS, join_at=[0, 0, 2, 3, 5, 4])
    # Every request, sampled (seeded) ones included: each draws from its own key stream and drafts from
    # its own history, so sharing verify passes with others must change nothing.
    for i, (a, b) in enumerate(zip(solo, batched)):
        assert a == b, (i, REQUESTS[i][1])
    assert max(sizes) >= 4  # several blocks really shared one verify pass
    assert together.left_mid_flight  # and some requests left while others went on


def test_sliding_window_models_batched_equal_alone(models_dir, tokenizer_dir):
    target = models_dir / "arch-gemma3_text"
    if not target.exists():
        factory.make_target(target, tokenizer_dir, "gemma3_text", seed=3)
    drafter = factory.make_drafter(models_dir / "gemma-dflash-batch", target, taps=(0, 2))
    model, tok = mlx_spec.load(str(target), drafter=str(drafter))
    reqs = [(p, SamplingParams(), 4) for p in ("def add(a, b):", "Hello, how are you", "import os")]
    assert together(model, tok, reqs, join_at=[0, 1, 1]) == [alone(model, tok, r) for r in reqs]


def test_plain_rounds_that_ran_ahead_join_a_batch(target_dir, drafter_dir):
    """A request decoding plainly alone runs one token ahead; joining a batch backs that out exactly."""
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    reqs = [("def add(a, b):", SamplingParams(), 1),
            ("import os", SamplingParams(temperature=0.8, top_k=20, seed=5), 1),
            ("class Stack:", SamplingParams(), 4)]
    assert together(model, tok, reqs, join_at=[0, 3, 6]) == [alone(model, tok, r) for r in reqs]


def test_a_prefilled_request_queues_no_pass_until_it_decodes(target_dir, drafter_dir):
    """The first token comes with no pass queued behind it (a request joining a batch would throw that pass
    away); decoding alone, the next plain round runs one token ahead again."""
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    g = make(model, tok, "def add(a, b):", SamplingParams(), 1)
    g.start()
    assert g.state.ahead is None
    step_all(model, [g])
    assert g.state.ahead is not None


def test_prefill_computes_the_last_tokens_logits_in_its_chunk(target_dir, drafter_dir):
    """The prompt's last token goes through the target with its chunk (no pass of its own), and only its
    logits are computed; its first token is the one a whole-prompt pass gives."""
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    target, calls = model.target, []

    def counted(tokens, cache, last=None):
        logits, hidden = target(tokens, cache, last=last)
        calls.append((tokens.shape[1], last, logits.shape[1], hidden.shape[1]))
        return logits, hidden

    ids = encode_prompt(tok, "def add(a, b):\n    return a + b\n\ndef sub(a, b):")
    whole, _ = target(mx.array([ids]), None)
    for chunk, passes in ((512, [len(ids)]), (8, [8] * (len(ids) // 8) + [len(ids) % 8] * bool(len(ids) % 8))):
        g = make(model, tok, ids, SamplingParams(), 1)
        calls.clear()
        first = [item for item in loop.prefill(counted, g.state, ids, chunk)][-1]
        assert [c[0] for c in calls] == passes
        assert [c[1] for c in calls] == [None] * (len(passes) - 1) + [1]
        assert calls[-1][2] == 1 and all(c[3] == c[0] for c in calls)  # one row of logits; every row's taps
        assert first.tokens == [whole[0, -1].argmax().item()]
