"""Sampling settings, the target's token distribution, and lossless acceptance of a draft.

The distribution mirrors mlx-lm's `make_sampler` exactly (top-p, min-p, top-k on the
log-probabilities, then temperature), so speculative sampling follows the same law
as mlx-lm's plain sampling.

Two exact schemes for sampled drafts. Unseeded: speculative rejection sampling, the best
acceptance. Seeded: each position's token is argmax(log p + g) with Gumbel noise g keyed by
(seed, position) (the Gumbel-max trick: an exact sample from p); verification is then greedy on
the perturbed logits, so the committed tokens equal plain decoding with that seed whatever the
draft lengths, the drafter, the batch or the machine.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from ..drafters.base import Draft
from ..kernels import fused_accept
from .params import GREEDY_BELOW, MIN_TOP_P, SamplingParams


class Sampler:
    """Per-request sampling: logits processors, the truncated distribution p, and its draws (position-keyed
    Gumbel noise when seeded, MLX's global key stream otherwise)."""

    def __init__(self, params: SamplingParams, vocab_size: int):
        self.params = params
        self.greedy = params.temperature < GREEDY_BELOW
        if params.top_k >= vocab_size:
            params = SamplingParams(**{**params.__dict__, "top_k": 0})
            self.params = params
        self.processors = make_logits_processors(
            params.logit_bias, params.repetition_penalty, params.penalty_context,
            params.presence_penalty, params.penalty_context, params.frequency_penalty, params.penalty_context,
        )
        self.coupled = params.seed is not None and not self.greedy  # position-keyed Gumbel draws
        self.vocab_size = vocab_size

    def process(self, history: list[int] | mx.array, drafts: list[int] | mx.array, logits: mx.array) -> mx.array:
        """Apply processors to verify rows [n, V]; row i sees history + drafts[:i]."""
        if not self.processors:
            return logits
        base = history if isinstance(history, mx.array) else mx.array(history, dtype=mx.int32)
        drafts = mx.array(drafts, dtype=mx.int32) if not isinstance(drafts, mx.array) else drafts
        rows = []
        for i in range(logits.shape[0]):
            seen = mx.concatenate([base, drafts[:i]]) if i else base
            row = logits[i : i + 1]
            for processor in self.processors:
                row = processor(seen, row)
            rows.append(row)
        return mx.concatenate(rows, axis=0)

    def scaled(self, logits: mx.array) -> mx.array:
        """Truncated log-probabilities over the temperature [n, V]: softmax of them is what mlx-lm's
        sampler draws from."""
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        p = self.params
        if 0 < p.top_p < 1.0:
            logprobs = apply_top_p(logprobs, max(p.top_p, MIN_TOP_P))
        if p.min_p != 0.0:
            logprobs = apply_min_p(logprobs, p.min_p)
        if p.top_k > 0:
            logprobs = apply_top_k(logprobs, p.top_k)
        return logprobs / p.temperature

    def probs(self, logits: mx.array) -> mx.array:
        """The distribution mlx-lm's sampler draws from, for each row of logits [n, V]."""
        return mx.softmax(self.scaled(logits), axis=-1)

    def next_token(self, history: list[int] | mx.array, logits: mx.array, position: int) -> mx.array:
        """The token at `position` (after `history`) given its logits [1, V], as a lazy int32 array [1]."""
        row = self.process(history, [], logits)
        if self.greedy:
            return row.argmax(-1).astype(mx.int32)
        if self.coupled:
            return self.perturbed(row, position).argmax(-1).astype(mx.int32)
        return self.draw(self.probs(row))

    def perturbed(self, logits: mx.array, start: int) -> mx.array:
        """Seeded sampling: the truncated log-probabilities of rows at positions start, start+1, ...
        plus each position's Gumbel noise. Their argmax is the sampled token."""
        return self.scaled(logits) + self.noise(start, logits.shape[0])

    def noise(self, start: int, n: int) -> mx.array:
        """Gumbel noise [n, V] for positions start..start+n-1: a function of (seed, position) alone."""
        rows = [mx.random.gumbel((self.vocab_size,), key=mx.random.key(_mix(self.params.seed, start + i)))
                for i in range(n)]
        return mx.stack(rows)

    def drafting(self, start: int) -> "DraftSampling":
        """What a drafter samples its proposals with this round; draft 1 sits at position `start`."""
        return DraftSampling(self, start)

    def draw(self, probs: mx.array) -> mx.array:
        return mx.random.categorical(mx.log(probs)).astype(mx.int32)  # unseeded: MLX's global key stream

    def uniform(self, n: int) -> mx.array:
        return mx.random.uniform(shape=(n,))


def accept(logits: mx.array, draft: Draft, sampler: Sampler, kernels=None, position: int = 0) -> tuple[int, list[int]]:
    """Verify logits [k+1, V] against k drafts, the first at `position`: (accepted count a, the a
    drafts + 1 bonus token).

    One host sync. Greedy: accept while the draft equals the target's argmax; seeded sampling
    likewise on Gumbel-perturbed logits. Unseeded sampling:
    accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw
    from norm(max(0, p_i - q_i)); if all pass, draw the bonus from p_k. One-hot q for
    deterministic drafts.
    """
    k = len(draft)
    if sampler.greedy or sampler.coupled:  # argmax, accepted length and bonus in one pass
        if sampler.coupled:  # seeded: greedy on the perturbed logits, whatever q was
            logits = sampler.perturbed(logits, position)
        _, a, bonus = fused_accept(logits, draft.tokens, kernels)
        out = mx.concatenate([a[None], draft.tokens.astype(mx.int32), bonus[None]]).tolist()
        return out[0], out[1 : 1 + out[0]] + [out[-1]]
    if k == 0:  # nothing to judge: one draw, as plain decoding makes
        return 0, [sampler.draw(sampler.probs(logits)).item()]
    p = sampler.probs(logits)
    q = draft.q if draft.q is not None else _one_hot(draft.tokens, p.shape[-1])
    idx = draft.tokens[:, None]
    p_d = mx.take_along_axis(p[:k], idx, axis=-1)[:, 0]
    q_d = mx.take_along_axis(q, idx, axis=-1)[:, 0]
    ok = sampler.uniform(k) * q_d < p_d
    residual = mx.maximum(p[:k] - q, 0.0)
    empty = residual.sum(-1, keepdims=True) <= 0
    residual = mx.where(empty, p[:k], residual)
    choice = sampler.draw(mx.concatenate([residual / residual.sum(-1, keepdims=True), p[k:]], axis=0))
    a = mx.cumprod(ok.astype(mx.int32)).sum()
    out = mx.concatenate([a[None].astype(mx.int32), draft.tokens.astype(mx.int32), choice]).tolist()
    n = out[0]
    return n, out[1 : 1 + n] + [out[1 + k + n]]


class DraftSampling:
    """A drafter's view of the request's sampler for one round: the same distribution, and seeded
    draws that take the Gumbel noise of the positions they fill (so drafts agree with the target
    as often as the two distributions allow)."""

    def __init__(self, sampler: Sampler, start: int):
        self.sampler, self.position = sampler, start
        self.greedy = sampler.greedy
        self.probs = sampler.probs

    def draw(self, probs: mx.array) -> mx.array:
        """One token per row of probs [n, V], for the next n positions."""
        if not self.sampler.coupled:
            return self.sampler.draw(probs)
        n = probs.shape[0]
        noise = self.sampler.noise(self.position, n)
        self.position += n
        return (mx.log(probs) + noise).argmax(-1).astype(mx.int32)


def _mix(seed: int, position: int) -> int:
    """A 63-bit key seed from (seed, position): splitmix64 of each, so neighbours share nothing."""
    def splitmix(x: int) -> int:
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return x ^ (x >> 31)

    return splitmix(splitmix(seed & 0xFFFFFFFFFFFFFFFF) ^ position) >> 1


def _one_hot(tokens: mx.array, vocab: int) -> mx.array:
    return (mx.arange(vocab)[None, :] == tokens[:, None]).astype(mx.float32)
