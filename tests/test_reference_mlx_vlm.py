"""EAGLE-3 against mlx-vlm's own implementation, on the same random weights: mlx-vlm's round loop
(`mlx_vlm.speculative.eagle3._eagle3_rounds` with its `Eagle3DraftModel`) and mlx-spec's loop commit the
same tokens and accept the same number of drafts in every round, greedy, at several block sizes.

mlx-vlm pulls heavy dependencies, so it is not in the test environment; run these in a virtual
environment that has it (`python -m venv --system-site-packages /work/venvs/dspark &&
/work/venvs/dspark/bin/pip install mlx-vlm==0.7.10`, then `/work/venvs/dspark/bin/python -m pytest -q
tests/test_reference_mlx_vlm.py`). Without it they are skipped with that reason.
"""

import json
from types import SimpleNamespace

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

import drafter_checks as checks
import mlx_spec
from test_eagle3 import make_eagle3
from test_lossless_greedy import PROMPTS

vlm_eagle3 = pytest.importorskip(
    "mlx_vlm.speculative.eagle3", reason="mlx-vlm is not installed (heavy: run in a venv with "
    "`pip install mlx-vlm==0.7.10`, see this file's docstring) - the cross-check needs it")
from mlx_vlm.speculative.drafters.eagle3.config import Eagle3Config as VlmConfig  # noqa: E402
from mlx_vlm.speculative.drafters.eagle3.eagle3 import Eagle3DraftModel  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402


class VlmTarget:
    """The loaded mlx-lm target as mlx-vlm's loop calls a language model: logits plus the hidden states
    of `capture_layer_ids` (our tap wrappers, checked against the model's own logits at load), and
    rollback of the KV caches by trimming what the round did not accept."""

    def __init__(self, model):
        self._model = model
        self.model = model.model.model  # where mlx-vlm's drafter finds embed_tokens to share
        self.config = SimpleNamespace(eos_token_id=None)

    def __call__(self, inputs, cache=None, capture_layer_ids=(), **_):
        assert list(capture_layer_ids) == list(self._model.target.tap_ids), capture_layer_ids
        logits, hidden = self._model.target(inputs, cache)
        return SimpleNamespace(logits=logits, hidden_states=[hidden], gdn_states=None)

    def rollback_speculative_cache(self, caches, state, accepted, block_size):
        for c in caches:
            c.trim(block_size - 1 - int(accepted))


def reference_rounds(model, drafter_dir, prompt, max_tokens, block):
    """mlx-vlm's loop, greedy: (tokens, accepted drafts) per round, the prefill's token first."""
    config = json.loads((drafter_dir / "config.json").read_text())
    draft = Eagle3DraftModel(VlmConfig.from_dict(config))
    weights = draft.sanitize(dict(mx.load(str(drafter_dir / "model.safetensors"))))
    draft.load_weights(list(weights.items()), strict=False)  # embed_tokens: the target's (bound below)
    target = VlmTarget(model)
    ids = mx.array([model_tokenizer(model).encode(prompt)])
    cache = make_prompt_cache(model.model)
    logits, hidden = model.target(ids, cache)
    first = int(logits[0, -1].argmax())
    out = [([first], 0)]
    argmax = lambda x: mx.argmax(x, axis=-1)
    toks = list(vlm_eagle3._eagle3_rounds(target, draft, cache, hidden, prompt_tokens=ids, first_bonus=first,
                                          max_tokens=max_tokens, sampler=argmax, draft_block_size=block,
                                          greedy_sampling=True))
    pos = 0
    for a in draft.accept_lens:  # each round commits its accepted drafts plus one token of the target's
        out.append(([t for t, _ in toks[pos: pos + a + 1]], a))
        pos += a + 1
    return out


def model_tokenizer(model):
    return model_tokenizer.tok


def our_rounds(model, tok, prompt, max_tokens, block):
    return [(r.tokens, r.accepted) for r in mlx_spec.stream_generate(model, tok, prompt, max_tokens=max_tokens,
                                                                      block_size=block)]


@pytest.mark.parametrize("draft_vocab, extra", [(None, {}), (200, {}), (None, {"norm_before_fc": True})],
                         ids=["full-vocab", "draft-vocab-200", "norm_before_fc"])
def test_eagle3_rounds_equal_mlx_vlm(models_dir, target_dir, draft_vocab, extra):
    """speculators layout with HF hidden_states ids [2, 3, 4] (mlx-vlm's convention: layers 1, 2, 3);
    norm_before_fc (`input_norm`) as mlx-vlm reads it (it has no fc_norm)."""
    drafter = make_eagle3(models_dir / f"eagle3-vlm-{draft_vocab}-{'-'.join(extra)}", target_dir, layout="speculators",
                          aux_ids=[2, 3, 4], draft_vocab=draft_vocab, seed=7, **extra)
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter), block_size=8)
    # Fitted a little to the target's continuation of the first prompt, so that rounds accept some drafts
    # and reject others (a random head is never accepted: only the first draft would be compared).
    checks.train(model.drafter, model.target, tok.encode(PROMPTS[0]) + checks.plain(target_dir, PROMPTS[0], 24),
                 steps=40)
    weights = dict(mx.load(str(drafter / "model.safetensors")))
    weights.update({k.replace("midlayer.", "layers.0."): v for k, v in tree_flatten(model.drafter.model.parameters())})
    mx.save_safetensors(str(drafter / "model.safetensors"), weights)
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter), block_size=8)
    model_tokenizer.tok = tok
    accepted, rejected = 0, 0
    for prompt in PROMPTS:
        for block in (2, 4, 6):
            ours = our_rounds(model, tok, prompt, 24, block)
            theirs = reference_rounds(model, drafter, prompt, 24, block)
            n = sum(len(t) for t, _ in theirs)
            assert [t for r, _ in ours for t in r][:n] == [t for r, _ in theirs for t in r], (prompt, block)
            # Round by round, but for the last: near max_tokens the loops size their last draft differently.
            assert ours[: len(theirs) - 1] == theirs[:-1], (prompt, block)
            accepted += sum(a for _, a in theirs[1:-1])
            rejected += sum(a < block - 1 for _, a in theirs[1:-1])
    assert accepted > 10 and rejected > 5, (accepted, rejected)  # both paths of the loop compared
