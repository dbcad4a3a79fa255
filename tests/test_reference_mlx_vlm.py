"""EAGLE-3 and Qwen3.5 MTP against mlx-vlm's own implementations, on the same weights, greedy.

- EAGLE-3: mlx-vlm's round loop (`mlx_vlm.speculative.eagle3._eagle3_rounds` with its `Eagle3DraftModel`)
  and mlx-spec's loop commit the same tokens and accept the same number of drafts in every round, at
  several block sizes.
- Qwen3.5 MTP: mlx-vlm's `Qwen3_5MTPDraftModel` (loaded by its own sanitize from the Hugging Face `mtp.*`
  tensors), driven through its prefill / draft_block / accept_verified_tokens, proposes the drafts our
  loop accepts round by round, one draft per round (block 2). With more drafts a round the two differ
  by design: mlx-vlm keeps its own chained entries for accepted drafts in the head's KV cache, mlx-spec
  rewrites them from the target's features (as vLLM does), so only block 2 is compared.

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
from mlx_vlm.speculative.drafters.qwen3_5_mtp.config import Qwen3_5MTPConfig  # noqa: E402
from mlx_vlm.speculative.drafters.qwen3_5_mtp.qwen3_5_mtp import Qwen3_5MTPDraftModel  # noqa: E402
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


def reference_rounds(model, tok, drafter_dir, prompt, max_tokens, block):
    """mlx-vlm's loop, greedy: (tokens, accepted drafts) per round, the prefill's token first."""
    config = json.loads((drafter_dir / "config.json").read_text())
    draft = Eagle3DraftModel(VlmConfig.from_dict(config))
    weights = draft.sanitize(dict(mx.load(str(drafter_dir / "model.safetensors"))))
    draft.load_weights(list(weights.items()), strict=False)  # embed_tokens: the target's (bound below)
    target = VlmTarget(model)
    ids = mx.array([tok.encode(prompt)])
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
    accepted, rejected = 0, 0
    for prompt in PROMPTS:
        for block in (2, 4, 6):
            ours = our_rounds(model, tok, prompt, 24, block)
            theirs = reference_rounds(model, tok, drafter, prompt, 24, block)
            n = sum(len(t) for t, _ in theirs)
            assert [t for r, _ in ours for t in r][:n] == [t for r, _ in theirs for t in r], (prompt, block)
            # Round by round, but for the last: near max_tokens the loops size their last draft differently.
            assert ours[: len(theirs) - 1] == theirs[:-1], (prompt, block)
            accepted += sum(a for _, a in theirs[1:-1])
            rejected += sum(a < block - 1 for _, a in theirs[1:-1])
    assert accepted > 10 and rejected > 5, (accepted, rejected)  # both paths of the loop compared


def driven_rounds(model, draft, tok, prompt, n, block):
    """mlx-vlm's drafter driven through its own round API against the target's greedy continuation (the
    verify pass stood in by mlx-lm's greedy tokens and the target's hidden states over the whole sequence:
    rows of committed tokens are all a drafter reads), our drafter in lock-step on the same rows.
    Returns the rounds (committed tokens, accepted drafts) and both drafters' drafts, round by round."""
    from mlx_spec.engine.sampling import Sampler, SamplingParams

    ids = tok.encode(prompt)
    seq = ids + checks.plain(model.target_path, prompt, n)
    _, taps = model.target(mx.array([seq]), None)
    h = model.drafter.features(taps)
    draft.reset(model.model)
    draft.prefill_from_target_hidden(mx.array([ids]), h[:, : len(ids)], seq[len(ids)], None, greedy=True)
    ours, state = model.drafter, model.drafter.make_state()
    ours.observe(state, taps[:, : len(ids)], ids)
    greedy = Sampler(SamplingParams(), model.vocab_size).drafting(0)
    pos, rounds, drafts = len(ids), [([seq[len(ids)]], 0)], []
    while pos + block <= len(seq):
        d = draft.draft_block(seq[pos], h[:, pos: pos + 1], None, block, None, greedy=True)[0].tolist()
        drafts.append((d, ours.propose(state, seq[pos], len(d), greedy).tokens.tolist()))
        a = 0
        while a < len(d) and d[a] == seq[pos + 1 + a]:
            a += 1
        new = seq[pos + 1: pos + 2 + a]
        draft.accept_verified_tokens(h[:, pos: pos + 1 + len(d)], mx.array([d]), a, new, None, greedy=True)
        ours.observe(state, taps[:, pos: pos + 1 + a], seq[pos: pos + 1 + a])  # the anchor and accepted drafts
        rounds.append((new, a))
        pos += len(new)
    return rounds, drafts


def hf_mtp_weights(model, tok, target):
    """Our head after a few training steps on the target's continuation of the first prompt (so that
    rounds accept some drafts and reject others), written back as Hugging Face stores it: `mtp.*` names,
    zero-centred norms, which mlx-vlm's own sanitize reads."""
    checks.train(model.drafter, model.target, tok.encode(PROMPTS[0]) + checks.plain(target, PROMPTS[0], 24), steps=40)
    names = {"norm_e.": "pre_fc_norm_embedding.", "norm_h.": "pre_fc_norm_hidden.", "layer.": "layers.0."}
    out = {}
    for k, v in tree_flatten(model.drafter.head.parameters()):
        for old, new in names.items():
            k = new + k[len(old):] if k.startswith(old) else k
        out["mtp." + k] = v - 1.0 if "norm" in k and v.ndim == 1 else v
    return out


def test_qwen35_mtp_drafts_equal_mlx_vlm(models_dir, tokenizer_dir):
    import mtp_checkpoints

    target = mtp_checkpoints.qwen35(models_dir / "mtp-qwen35", tokenizer_dir)
    model, tok = mlx_spec.load(str(target), block_size=2)  # auto: the target's own head
    weights = hf_mtp_weights(model, tok, target)
    config = json.loads((target / "config.json").read_text())
    rope = config["text_config"]["rope_parameters"]  # published Qwen3.5 configs also carry the M-RoPE split,
    rope.update(type=rope.pop("rope_type", "default"), mrope_section=[2, 1, 1])  # which mlx-vlm requires
    draft = Qwen3_5MTPDraftModel(Qwen3_5MTPConfig.from_dict(config))
    draft.load_weights(list(draft.sanitize(weights).items()), strict=True)
    accepted, rejected = 0, 0
    for prompt in PROMPTS:
        theirs, drafts = driven_rounds(model, draft, tok, prompt, 24, 2)
        assert all(t == o for t, o in drafts), (prompt, drafts)
        ours = our_rounds(model, tok, prompt, 24, 2)
        assert ours[: len(theirs) - 1] == theirs[:-1], prompt  # the last round: cut by max_tokens
        accepted += sum(a for _, a in theirs[1:-1])
        rejected += sum(a == 0 for _, a in theirs[1:-1])
    assert accepted > 5 and rejected > 5, (accepted, rejected)
