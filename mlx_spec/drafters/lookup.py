"""Prompt-lookup (n-gram) drafting: no model at all.

If the last n tokens appeared earlier in the prompt or the output, propose what followed them
then. Shines when the model re-emits its context (code edits, quoting, summaries). Drafts are
deterministic, so the verifier treats their proposal distribution as one-hot: still lossless
when sampling.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from .base import Draft


class LookupState:
    def __init__(self, max_ngram: int):
        self.tokens: list[int] = []
        self.max_ngram = max_ngram
        self.index: list[dict[tuple, int]] = [dict() for _ in range(max_ngram + 1)]  # n -> n-gram -> end

    @property
    def offset(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens)
            for n in range(1, self.max_ngram + 1):
                if end > n:  # the n-gram ending just before the new token predicts it
                    self.index[n][tuple(self.tokens[end - 1 - n : end - 1])] = end - 1

    def trim(self, n: int) -> int:
        n = min(n, len(self.tokens))
        kept = self.tokens[: len(self.tokens) - n]
        self.tokens, self.index = [], [dict() for _ in range(self.max_ngram + 1)]
        self.extend(kept)
        return n

    def continuation(self, k: int, ahead: Sequence[int] = ()) -> list[int]:
        """Up to k tokens of what followed the latest earlier occurrence of the longest matching suffix of
        the tokens, `ahead` (not yet committed: the round's anchor) appended to them. A match closer than k
        tokens is a loop: its copy runs on into the text it is copying (as LZ77's overlapping copies do),
        where a plain copy would stop at the present and draft a token or two where the loop goes on."""
        seq = self.tokens[-self.max_ngram :] + list(ahead)
        for n in range(min(self.max_ngram, len(seq)), 0, -1):
            start = self.index[n].get(tuple(seq[-n:]))
            if start is not None:
                found = self.tokens[start : start + k]
                if len(found) < k:  # the copy reached the present: a loop of period p, copied on
                    found = (found + list(ahead))[:k]
                    period = len(self.tokens) + len(ahead) - start
                    while len(found) < k:
                        found.append(found[-period])
                return found
        return []


class LookupDrafter:
    tap_ids = ()

    def __init__(self, block_size: int = 8, max_ngram: int = 3):
        self.block_size, self.max_ngram = block_size, max_ngram

    def make_state(self) -> LookupState:
        return LookupState(self.max_ngram)

    def observe(self, state: LookupState, hidden, tokens: list[int]) -> None:
        state.extend(list(tokens))

    def propose(self, state: LookupState, anchor: int, k: int, sampling) -> Draft:
        found = state.continuation(k, [anchor])
        return Draft(mx.array(found, dtype=mx.int32))
