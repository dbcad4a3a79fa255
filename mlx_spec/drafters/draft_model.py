"""A classic draft model: any small mlx-lm language model that shares the target's tokenizer.

It drafts autoregressively, one token per forward pass, from its own KV cache. Greedy
requests take its argmax; sampled requests draw from its (truncated) distribution, which
is reported as q so that rejection sampling stays exact.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..engine.cache import max_trim, spec_caches
from ..engine.rollback import attention_spans
from ..errors import DrafterMismatchError
from .base import Draft


class DraftModelState:
    def __init__(self, model, slack: int = 0):
        # Drafting writes one row per pass and then rewinds up to a block of them: a sliding-window
        # cache keeps that many spare rows so the rewind is a trim (see SpecRotatingKVCache).
        self.model, self.slack = model, slack
        self.cache = spec_caches(make_prompt_cache(model), slack)
        self.tokens: list[int] = []  # tokens whose K/V are in `cache`
        self.committed = 0  # how many of them the target has committed

    @property
    def offset(self) -> int:
        return self.committed

    def trim(self, n: int) -> int:
        n = min(n, self.committed)
        self.committed -= n
        self._rewind(self.committed)
        return n

    def _rewind(self, keep: int) -> None:
        drop = len(self.tokens) - keep
        if drop <= 0:
            return
        del self.tokens[keep:]
        if all(max_trim(c) >= drop for c in self.cache):
            for c in self.cache:
                c.trim(drop)
        else:  # further back than a sliding window can go (prefix reuse): rebuild from the kept tokens
            self.cache = spec_caches(make_prompt_cache(self.model), self.slack)
            if self.tokens:
                self.model(mx.array([self.tokens]), cache=self.cache)


class DraftModelDrafter:
    tap_ids = ()

    def __init__(self, model, block_size: int = 4):
        self.model, self.block_size = model, block_size

    def make_state(self) -> DraftModelState:
        return DraftModelState(self.model, slack=self.block_size)

    def context_spans(self, state: DraftModelState) -> list[int]:
        return attention_spans(state.cache)

    def observe(self, state: DraftModelState, hidden, tokens: list[int]) -> None:
        # Keep what drafting already fed when it matches the committed tokens; feed the rest.
        start = state.committed
        same = 0
        while same < len(tokens) and start + same < len(state.tokens) and state.tokens[start + same] == tokens[same]:
            same += 1
        state._rewind(start + same)
        rest = list(tokens[same:])
        if rest:
            self.model(mx.array([rest]), cache=state.cache)
            state.tokens += rest
        state.committed += len(tokens)

    def propose(self, state: DraftModelState, anchor: int, k: int, sampling) -> Draft:
        state._rewind(state.committed)
        token, tokens, qs = anchor, [], []
        for _ in range(k):
            logits = self.model(mx.array([[token]]), cache=state.cache)[0, -1:].astype(mx.float32)
            state.tokens.append(token)
            if sampling.greedy:
                token = logits.argmax(-1)
            else:
                q = sampling.probs(logits)
                qs.append(q)
                token = sampling.draw(q)
            token = token.item()
            tokens.append(token)
        q = mx.concatenate(qs, axis=0) if qs else None
        return Draft(mx.array(tokens, dtype=mx.int32), q)


def check_vocab(draft_config: dict, target_config: dict, path) -> None:
    dv, tv = draft_config.get("vocab_size"), target_config.get("vocab_size")
    if dv is not None and tv is not None and dv != tv:
        raise DrafterMismatchError(f"draft model {path} has a vocabulary of {dv}, the target's is {tv}")
