"""The speculative loop: draft -> verify -> accept -> commit. One loop serves every drafter,
and one request or many (their blocks are verified together in one target pass).

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
from .batch import batch_caches, can_batch
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


@dataclass
class DecodeState:
    """One request inside the loop."""

    pc: PromptCache
    sampler: Sampler
    lengths: DraftLength
    anchor: int = -1


def prefill(target, drafter, s: DecodeState, prompt: list[int], chunk: int = 512) -> Iterator[int | Round]:
    """Run the uncached part of the prompt through the target, yielding the prompt tokens done after
    each chunk (so a caller can interleave other work or stop), then the first token as a Round."""
    pc = s.pc
    done = pc.reuse(prompt)
    rest = prompt[done:]
    for i in range(0, len(rest), chunk):
        piece = rest[i : i + chunk]
        logits, hidden = target(mx.array([piece]), pc.target)
        if drafter is not None:
            drafter.observe(pc.drafter, hidden, piece)
        eval_state(pc)
        pc.tokens += piece
        yield done + i + len(piece)
    last = s.sampler.process(pc.tokens, [], logits[0, -1:])
    s.anchor = (last.argmax(-1) if s.sampler.greedy else s.sampler.draw(s.sampler.probs(last))).item()
    yield Round([s.anchor], 0, 0)


def step(target, drafter, states: list[DecodeState]) -> list[Round]:
    """One verify round for every request."""
    proposals = [draft(drafter, s) for s in states]
    logits, hidden, width = verify(target, states, proposals)
    rounds = []
    for i, (s, p) in enumerate(zip(states, proposals)):
        rows = s.sampler.process(s.pc.tokens + [s.anchor], p.tokens, logits[i, : len(p) + 1])
        accepted, tokens = accept(rows, p, s.sampler, target.kernels)
        commit(drafter, s, tokens, None if hidden is None else hidden[i : i + 1], width)
        s.lengths.update(len(p), accepted)
        rounds.append(Round(tokens, len(p), accepted))
    return rounds


def draft(drafter, s: DecodeState) -> Draft:
    k = s.lengths.next()
    if drafter is None or k == 0:
        return Draft(mx.zeros((0,), mx.int32))
    return drafter.propose(s.pc.drafter, s.anchor, k, s.sampler)


def verify(target, states: list[DecodeState], proposals: list[Draft]):
    """[anchor, drafts] of every request, right-padded to one width, through the target once."""
    width = max(len(p) for p in proposals) + 1
    blocks = [mx.concatenate([mx.array([s.anchor], mx.int32), p.tokens, mx.zeros((width - 1 - len(p),), mx.int32)])
              for s, p in zip(states, proposals)]
    caches = [s.pc.target for s in states]
    if len(states) == 1:
        logits, hidden = target(blocks[0][None], caches[0])
    elif can_batch(caches):
        logits, hidden = target(mx.stack(blocks), batch_caches(caches))
    else:  # caches that cannot be viewed as a batch: verify one request at a time
        outs = [target(b[None], c) for b, c in zip(blocks, caches)]
        logits = mx.concatenate([o[0] for o in outs])
        hidden = None if outs[0][1] is None else mx.concatenate([o[1] for o in outs])
    return logits, hidden, width


def commit(drafter, s: DecodeState, tokens: list[int], hidden, width: int) -> None:
    keep = len(tokens)  # the anchor plus the accepted drafts (the bonus is the next anchor)
    trim(s.pc.target, width - keep)
    s.pc.tokens += [s.anchor] + tokens[:-1]
    if drafter is not None:
        drafter.observe(s.pc.drafter, None if hidden is None else hidden[:, :keep], s.pc.tokens[-keep:])
    s.anchor = tokens[-1]
