"""Sequence-level unlikelihood (Welleck et al., 2019, "Neural Text Generation with Unlikelihood
Training"): a fine-tune against the target's own greedy loops.

Each step the model answers a few training-side prompts greedily; every token of its answer that
lies in a 4-gram it already wrote gets the loss -log(1 - p(token)), which pushes the probability
of repeating down exactly where greedy decoding repeats ("def _get_get_get…"). Cross-entropy on the
corpus in the same step keeps the language model (`target.train`).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .config import UnlikelihoodConfig


def repeated_ngrams(tokens: list[int], n: int = 4) -> list[bool]:
    """For each token: whether it lies in an n-gram that occurred earlier in `tokens`."""
    seen, marked = set(), [False] * len(tokens)
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        if gram in seen:
            marked[i : i + n] = [True] * n
        seen.add(gram)
    return marked


def unlikelihood_loss(model: nn.Module, tokens: mx.array, marked: mx.array) -> mx.array:
    """Mean of -log(1 - p(x_t | x_<t)) over the marked positions of `tokens` [B, T] (`marked` [B, T])."""
    logits = model(tokens[:, :-1]).astype(mx.float32)
    logp = nn.log_softmax(logits, axis=-1)
    p = mx.exp(mx.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0])
    weights = marked[:, 1:]
    return -(mx.log(mx.clip(1 - p, 1e-5, 1.0)) * weights).sum() / mx.maximum(weights.sum(), 1)


class Rollouts:
    """The model's greedy answers to prompts drawn per step (deterministic given seed and step), as a
    right-padded token batch and the mask of repeated tokens in the answers."""

    def __init__(self, cfg: UnlikelihoodConfig, tokenizer, seed: int):
        from .data import encode, read_prompts

        self.cfg, self.tokenizer, self.seed = cfg, tokenizer, seed
        encoded = [encode(tokenizer, p) for p in read_prompts(Path(cfg.prompts))]
        self.prompts = [e for e in encoded if len(e) <= cfg.max_prompt]
        if not self.prompts:
            from ..errors import MlxSpecError

            raise MlxSpecError(f"{cfg.prompts}: no prompt of at most {cfg.max_prompt} tokens")

    def batch(self, model, step: int) -> tuple[mx.array, mx.array, float]:
        """(tokens, marked, share of answer tokens marked)."""
        from .data import answer_batch

        rng = np.random.default_rng([self.seed, step, 7])
        drawn = rng.choice(len(self.prompts), min(self.cfg.batch, len(self.prompts)), replace=False)
        picks = [self.prompts[i] for i in drawn]
        rows, masks, marked_total, answer_total = [], [], 0, 0
        for prompt, answer in zip(picks, answer_batch(model, self.tokenizer, picks, self.cfg.tokens)):
            marked = repeated_ngrams(answer, self.cfg.n)
            rows.append(prompt + answer)
            masks.append([False] * len(prompt) + marked)
            marked_total, answer_total = marked_total + sum(marked), answer_total + len(answer)
        width = max(len(r) for r in rows)
        tokens = np.zeros((len(rows), width), dtype=np.int32)
        mask = np.zeros((len(rows), width), dtype=np.float32)
        for i, (r, m) in enumerate(zip(rows, masks)):
            tokens[i, : len(r)], mask[i, : len(m)] = r, m
        return mx.array(tokens), mx.array(mask), marked_total / max(answer_total, 1)
