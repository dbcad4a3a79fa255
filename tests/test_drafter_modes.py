"""Every drafting mode under the one verify loop stays lossless; auto picks by checkpoint content."""

import random

import pytest

import factory
import mlx_spec
from mlx_spec.drafters import model_drafter
from mlx_spec.drafters.draft_model import DraftModelDrafter
from mlx_spec.drafters.lookup import LookupDrafter, LookupState
from mlx_spec.drafters.pick import PickDrafter
from drafter_checks import plain
from test_lossless_greedy import PROMPTS, spec

# Sampling under every mode (k = 2..7 drafts, penalties, logit_bias): test_lossless_sampling.py.


@pytest.fixture(scope="module")
def other_lm(models_dir, tokenizer_dir):
    """A different small LM with the same tokenizer: a classic draft model."""
    return factory.make_target(models_dir / "draft-lm", tokenizer_dir, "llama", layers=2, seed=11)


def test_auto_mode_picks_by_content(target_dir, drafter_dir, other_lm):
    # auto: the checkpoint's kind, with prompt lookup picked per conversation beside it (drafters/pick.py)
    picked = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))[0].drafter
    assert isinstance(picked, PickDrafter) and type(picked.inner).__name__ == "DFlashDrafter"
    assert type(mlx_spec.load(str(target_dir), drafter=str(drafter_dir), mode="dflash")[0].drafter).__name__ == "DFlashDrafter"
    assert isinstance(model_drafter(mlx_spec.load(str(target_dir), drafter=str(other_lm))[0].drafter), DraftModelDrafter)
    assert isinstance(mlx_spec.load(str(target_dir))[0].drafter, LookupDrafter)  # no known drafter: lookup
    assert mlx_spec.load(str(target_dir), mode="off")[0].drafter is None
    with pytest.raises(mlx_spec.DrafterMismatchError, match="not what --mode dflash expects"):
        mlx_spec.load(str(target_dir), drafter=str(other_lm), mode="dflash")
    with pytest.raises(mlx_spec.MlxSpecError, match="unknown mode"):
        mlx_spec.load(str(target_dir), mode="medusa")


@pytest.mark.parametrize("mode", ["lookup", "draft-model", "draft-model-self"])
def test_greedy_identity(target_dir, other_lm, mode):
    drafter = {"lookup": None, "draft-model": str(other_lm), "draft-model-self": str(target_dir)}[mode]
    model, tok = mlx_spec.load(str(target_dir), drafter=drafter, mode="lookup" if mode == "lookup" else "draft-model")
    assert isinstance(model.drafter, LookupDrafter if mode == "lookup" else DraftModelDrafter)  # not plain decoding
    for prompt in PROMPTS:
        ref = plain(target_dir, prompt, 24)
        for block in (2, 5):
            got, last = spec(model, tok, prompt, 24, block_size=block)
            assert got == ref, (mode, prompt, block)
            if mode == "draft-model-self":  # the target drafting for itself: every draft is accepted
                assert last.spec.accepted == last.spec.drafted


def test_lookup_finds_repeats():
    s = LookupState(max_ngram=3)
    s.extend([1, 2, 3, 4, 9, 9, 1, 2])
    assert s.continuation(3, [3]) == [4, 9, 9]  # "1 2 3" seen before: what followed
    assert s.continuation(3, [7]) == [] and s.continuation(0, [3]) == []
    s.trim(3)
    assert s.tokens == [1, 2, 3, 4, 9] and s.continuation(2) == [] and s.continuation(1, [4]) == [9]


def test_lookup_runs_a_loop_on_past_the_present():
    """A match closer than k tokens is a loop: the copy runs into the text it copies, not stopping at the end."""
    s = LookupState(max_ngram=3)
    s.extend([5, 1, 2, 1, 2, 1])
    assert s.continuation(5, [2]) == [1, 2, 1, 2, 1]  # period 2, through the anchor and the drafts themselves
    s.extend([2, 7, 7])
    assert s.continuation(4) == [7, 7, 7, 7]  # period 1
    assert s.continuation(3, [9]) == []
    rng = random.Random(0)
    for _ in range(2000):  # the same as copying token by token from the growing text, on random short texts
        s = LookupState(max_ngram=3)
        s.extend([rng.randrange(3) for _ in range(rng.randrange(1, 12))])
        k, ahead = rng.randrange(8), [rng.randrange(3)] * rng.randrange(2)
        seq, toks = s.tokens[-3:] + ahead, s.tokens
        # the latest earlier occurrence (one with a token after it) of the longest suffix of up to 3 tokens
        start = next((j for n in range(min(3, len(seq)), 0, -1) for j in range(len(toks) - 1, n - 1, -1)
                      if toks[j - n : j] == seq[-n:]), None)
        text = s.tokens + ahead
        for i in range(k if start is not None else 0):
            text.append(text[start + i])
        assert s.continuation(k, ahead) == text[len(s.tokens) + len(ahead):]


@pytest.fixture(scope="module")
def dspark_dir(models_dir, target_dir):
    return factory.make_dspark(models_dir / "dspark", target_dir)


def test_dspark_loads_and_is_lossless(target_dir, dspark_dir, models_dir):
    from mlx_spec.drafters.dspark import DSparkDrafter

    model, tok = mlx_spec.load(str(target_dir), drafter=str(dspark_dir))
    assert isinstance(model_drafter(model.drafter), DSparkDrafter) and model_drafter(model.drafter).block_size == 6  # 5 slots: 5 drafts
    for prompt in PROMPTS[:2]:
        ref = plain(target_dir, prompt, 30)
        for block in (2, 6):
            got, last = spec(model, tok, prompt, 30, block_size=block)
            assert got == ref and all(d == min(block - 1, wanted - 1) for d, wanted in spec.budgets)
    # The confidence head cuts drafts short where the survival product drops below the threshold.
    cut = factory.make_dspark(models_dir / "dspark-cut", target_dir, threshold=0.2)
    model, tok = mlx_spec.load(str(target_dir), drafter=str(cut))
    got, last = spec(model, tok, PROMPTS[0], 30, block_size=6)
    assert got == plain(target_dir, PROMPTS[0], 30) and any(d < min(5, wanted - 1) for d, wanted in spec.budgets)


@pytest.mark.parametrize("edit, message", [
    (dict(markov_head_type="lstm"), "markov_head_type 'lstm' is not supported"),
    (dict(hidden_size=32), "hidden size 32 != target's 64"),
    (dict(target_layer_ids=[0, 7]), r"target_layer_ids \[7\] out of range"),
])
def test_dspark_mismatch_is_refused(tmp_path, target_dir, edit, message):
    import json

    d = factory.make_dspark(tmp_path / "d", target_dir)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(mlx_spec.LoadError, match=message):
        mlx_spec.load(str(target_dir), drafter=str(d))
