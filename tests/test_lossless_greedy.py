"""Greedy speculative output equals plain greedy decoding (mlx-lm) token for token."""

import mlx_lm
import pytest

import factory
import mlx_spec

PROMPTS = ["def add(a, b):", "Hello, how are you", "for i in range(10):\n    print("]


def plain(model_dir, prompt, n, eos=None):
    """mlx-lm's plain greedy tokens (its final response repeats the EOS token; drop it). eos: a token id
    to stop at as well."""
    model, tok = mlx_lm.load(str(model_dir))
    if eos is not None:
        tok.add_eos_token(tok.convert_ids_to_tokens(eos))
    responses = list(mlx_lm.stream_generate(model, tok, prompt, max_tokens=n))
    tokens = [r.token for r in responses]
    return tokens[:-1] if responses[-1].finish_reason == "stop" else tokens


def spec(model, tok, prompt, n, **kw):
    out, budgets = [], []  # budgets: (drafts proposed, tokens still wanted) per round
    for r in mlx_spec.stream_generate(model, tok, prompt, max_tokens=n, **kw):
        budgets.append((r.drafted, n - len(out)))
        out += r.tokens
    spec.budgets = budgets[1:]  # the first response is the prefill's token
    return out, r


@pytest.fixture(scope="module", params=["qwen3", "llama", "qwen2", "mistral", "gemma3_text"])
def arch_pair(request, models_dir, tokenizer_dir):
    arch = request.param
    target = models_dir / f"arch-{arch}"
    if not target.exists():
        factory.make_target(target, tokenizer_dir, arch, seed=3)
    return arch, target


@pytest.mark.parametrize("precision", ["fp32", "q8", "q4"])
def test_dflash_greedy_matches_plain(arch_pair, precision, models_dir):
    arch, target = arch_pair
    if precision != "fp32":
        qdir = models_dir / f"arch-{arch}-{precision}"
        if not qdir.exists():
            factory.quantize(target, qdir, bits=int(precision[1]))
        target = qdir
    drafter = factory.make_drafter(models_dir / f"dflash-{arch}-{precision}", target, taps=(0, 2), block_size=16)
    model, tok = mlx_spec.load(str(target), drafter=str(drafter))
    quantized = "Quantized" in type(model.model.layers[0].mlp.up_proj).__name__
    assert quantized == (precision != "fp32")
    for prompt in PROMPTS[:2]:
        ref = plain(target, prompt, 30)
        for block in (2, 5, 16):
            got, last = spec(model, tok, prompt, 30, block_size=block)
            assert got == ref, (arch, precision, block, prompt)
            # full blocks, except near the end: no round drafts past what max_tokens still wants
            assert all(drafted == min(block - 1, wanted - 1) for drafted, wanted in spec.budgets)


@pytest.mark.parametrize("error_rate", [0.0, 0.15, 0.4, 1.0])
@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text"])
def test_partial_acceptance_is_lossless(arch, error_rate, models_dir, tokenizer_dir):
    """An oracle drafter with corrupted tokens drives every accept/reject/trim path.

    gemma3_text has sliding-window layers (window 8), so trims also happen after the ring buffer wraps.
    """
    target = models_dir / f"arch-{arch}"
    if not target.exists():
        factory.make_target(target, tokenizer_dir, arch, seed=3)
    model, tok = mlx_spec.load(str(target), drafter=None)
    for prompt in PROMPTS:
        n = 48
        ids = tok.encode(prompt)
        ref = plain(target, prompt, n)
        for block in (2, 4, 8):
            model.drafter = factory.OracleDrafter(ids + ref, block, error_rate, seed=block, vocab=300)
            got, last = spec(model, tok, prompt, n, block_size=block)
            assert got == ref, (arch, error_rate, block, prompt)
            if error_rate == 0.0:  # only the last round may run past the known continuation
                assert last.spec.accepted >= last.spec.drafted - (block - 1)
            if error_rate == 1.0:
                assert last.spec.accepted < last.spec.drafted


def test_max_tokens_eos_and_stop(target_dir):
    model, tok = mlx_spec.load(str(target_dir), drafter=None)
    prompt = "def add(a, b):"
    ids = tok.encode(prompt)
    ref = plain(target_dir, prompt, 40)
    for n in (1, 2, 7, 13):
        model.drafter = factory.OracleDrafter(ids + ref, 6, 0.0)
        got, last = spec(model, tok, prompt, n, block_size=6)
        assert got == ref[:n] and last.generation_tokens == n and last.finish_reason == "length"

    # EOS inside an accepted run: everything after it is dropped.
    eos_at = 9
    truth = ref[:eos_at] + [2] + ref[eos_at:]
    model.drafter = factory.OracleDrafter(ids + truth, 8, 0.0)
    tok.add_eos_token(tok.convert_ids_to_tokens(ref[eos_at]))
    got, last = spec(model, tok, prompt, 40, block_size=8)
    assert got == ref[:eos_at] and last.finish_reason == "stop"

    # A stop string is cut from the text and ends generation.
    fresh, tok2 = mlx_spec.load(str(target_dir), drafter=None)
    full = mlx_spec.generate(fresh, tok2, prompt, max_tokens=40)
    stop = full[12:15]
    fresh.drafter = factory.OracleDrafter(ids + ref, 6, 0.0)
    pieces = list(mlx_spec.stream_generate(fresh, tok2, prompt, max_tokens=40, stop=[stop, "never-there"], block_size=6))
    text = "".join(p.text for p in pieces)
    assert pieces[-1].finish_reason == "stop" and text == full[: full.find(stop)]


@pytest.mark.parametrize("block", [4, 8])
def test_eos_inside_an_accepted_run_with_drafts_after_it(target_dir, block):
    """EOS lands inside a round whose later drafts are accepted too: the output stops exactly at the
    EOS, equals plain greedy stopping there, and its counts agree with the tokens returned."""
    model, tok = mlx_spec.load(str(target_dir), drafter=None)
    prompt = PROMPTS[0]
    ids = tok.encode(prompt)
    ref = plain(target_dir, prompt, 48)
    # The first token comes from the prefill; round j then commits ref[(j-1)*block + 1 : j*block + 1], its
    # drafts and then its bonus. Pick a position of the second round or later with a draft before it and
    # at least one after it in that round, holding a token not seen before (it becomes an EOS token).
    eos_at = next(i for i in range(block + 1, len(ref)) if 1 <= (i - 1) % block <= block - 3 and ref[i] not in ref[:i])
    model.drafter = factory.OracleDrafter(ids + ref, block, 0.0)  # every draft is the target's own token
    tok.add_eos_token(tok.convert_ids_to_tokens(ref[eos_at]))
    got, last = spec(model, tok, prompt, 48, block_size=block)
    assert got == ref[:eos_at] == plain(target_dir, prompt, 48, eos=ref[eos_at])
    assert last.finish_reason == "stop" and last.generation_tokens == eos_at and last.token == ref[eos_at - 1]
    # The round that met the EOS accepted every draft, some before the EOS (they came out) and some after
    # it (they did not).
    assert last.drafted == last.accepted == block - 1 and 0 < len(last.tokens) < last.accepted - 1


def test_penalties_under_speculation(target_dir):
    """Logits processors see each verify row's own history, exactly as in plain decoding."""
    from mlx_lm.sample_utils import make_logits_processors

    model, tok = mlx_spec.load(str(target_dir), drafter=None)
    plain_model, plain_tok = mlx_lm.load(str(target_dir))
    prompt = "Hello, how are you"
    procs = make_logits_processors(repetition_penalty=1.5, repetition_context_size=20, frequency_penalty=0.7,
                                   frequency_context_size=20)
    ref = [r.token for r in mlx_lm.stream_generate(plain_model, plain_tok, prompt, max_tokens=40,
                                                    logits_processors=procs)][:40]
    unpenalized = plain(target_dir, prompt, 40)
    assert ref != unpenalized[: len(ref)]
    ids = tok.encode(prompt)
    for err, block in ((0.0, 6), (0.3, 6), (0.0, 1)):  # block 1: plain rounds, run ahead on a lazy token
        model.drafter = factory.OracleDrafter(ids + ref, 6, err, seed=4)
        got, _ = spec(model, tok, prompt, 40, block_size=block, repetition_penalty=1.5, frequency_penalty=0.7)
        assert got == ref[: len(got)] and len(got) >= len(ref) - 1


@pytest.mark.parametrize("script", [[0], [0, 0, 0, 3], [0, 5, 5, 0, 0, 2, 0, 0, 0, 0, 7]])
def test_speculation_off_and_on_again(target_dir, drafter_dir, script):
    """Plain rounds run one token ahead and the drafter catches up lazily when drafting resumes."""
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    for prompt in PROMPTS:
        ref = plain(target_dir, prompt, 40)
        got, last = spec(model, tok, prompt, 40, draft_lengths=factory.ScriptedLengths(script))
        assert got == ref
    # An exact oracle is accepted in full only if its context lines up after every plain stretch.
    ids = tok.encode(PROMPTS[0])
    ref = plain(target_dir, PROMPTS[0], 60)
    model.drafter = factory.OracleDrafter(ids + ref, 8, 0.0)
    got, last = spec(model, tok, PROMPTS[0], 60, draft_lengths=factory.ScriptedLengths(script))
    assert got == ref and last.spec.accepted == last.spec.drafted
