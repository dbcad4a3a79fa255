"""The speculative loop: draft -> verify -> accept -> commit. One loop serves every drafter.

Positions: the anchor (last committed token, not yet in the target cache) sits at
position P = len(cache). The target verifies [anchor, d1..dk] at P..P+k; row i predicts
position P+i+1. We keep the anchor and the a accepted drafts (a+1 rows), trim the
rest, and the bonus token becomes the next anchor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import mlx.core as mx

from ..drafters.base import Draft
from .cache import PromptCache, eval_state, trim
from .sampling import Sampler, accept


@dataclass
class Round:
    tokens: list[int]  # committed this round: accepted drafts, then the target's own token
    drafted: int
    accepted: int


class DraftLength(Protocol):
    def next(self) -> int: ...

    def update(self, drafted: int, accepted: int) -> None: ...


class FixedLength:
    def __init__(self, k: int):
        self.k = k

    def next(self) -> int:
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        pass


def prefill(target, drafter, pc: PromptCache, prompt: list[int], sampler: Sampler, chunk: int = 512) -> int:
    """Run the uncached part of the prompt through the target; returns the first new token."""
    start = pc.reuse(prompt)
    rest = prompt[start:]
    for i in range(0, len(rest), chunk):
        piece = rest[i : i + chunk]
        logits, hidden = target(mx.array([piece]), pc.target)
        if drafter is not None:
            drafter.observe(pc.drafter, hidden, piece)
        eval_state(pc)
    pc.tokens += rest
    last = sampler.process(pc.tokens, [], logits[0, -1:])
    token = last.argmax(-1) if sampler.greedy else sampler.draw(sampler.probs(last))
    return token.item()


def draft(drafter, pc: PromptCache, anchor: int, k: int, sampler: Sampler) -> Draft:
    if drafter is None or k == 0:
        return Draft(mx.zeros((0,), mx.int32))
    return drafter.propose(pc.drafter, anchor, k, sampler)


def verify(target, pc: PromptCache, anchor: int, proposal: Draft) -> tuple[mx.array, mx.array | None]:
    tokens = mx.concatenate([mx.array([anchor], mx.int32), proposal.tokens])
    logits, hidden = target(tokens[None], pc.target)
    return logits[0], hidden


def commit(drafter, pc: PromptCache, anchor: int, tokens: list[int], hidden, drafted: int) -> None:
    keep = len(tokens)  # the anchor plus the accepted drafts (the bonus is the next anchor)
    trim(pc.target, drafted + 1 - keep)
    pc.tokens += [anchor] + tokens[:-1]
    if drafter is not None:
        drafter.observe(pc.drafter, None if hidden is None else hidden[:, :keep], pc.tokens[-keep:])


def speculative_rounds(target, drafter, pc: PromptCache, prompt: list[int], sampler: Sampler,
                       lengths: DraftLength) -> Iterator[Round]:
    """Yields the first token as a round of its own, then one Round per verify pass, forever."""
    anchor = prefill(target, drafter, pc, prompt, sampler)
    yield Round([anchor], 0, 0)
    while True:
        proposal = draft(drafter, pc, anchor, lengths.next(), sampler)
        logits, hidden = verify(target, pc, anchor, proposal)
        logits = sampler.process(pc.tokens + [anchor], proposal.tokens, logits)
        accepted, tokens = accept(logits, proposal, sampler, target.kernels)
        commit(drafter, pc, anchor, tokens, hidden, len(proposal))
        lengths.update(len(proposal), accepted)
        anchor = tokens[-1]
        yield Round(tokens, len(proposal), accepted)
