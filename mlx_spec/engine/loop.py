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

from ..batch_plan import plan_batch
from ..drafters.base import Draft, propose_all
from .batch import batch_caches, can_batch, replay
from .cache import PromptCache, drafter_states, eval_state, trim
from .rollback import batchable
from .sampling import Sampler, accept


@dataclass
class Round:
    tokens: list[int]  # committed this round: accepted drafts, then the target's own token
    drafted: int
    accepted: int


class DraftLength(Protocol):
    def next(self, context: int = 0) -> int: ...  # context: cached tokens before the round

    def update(self, drafted: int, accepted: int, source: str | None = None) -> None: ...  # source: Draft.source

    def expect(self, source: str | None) -> None: ...  # the source the next round will likely draft from

    def interrupt(self) -> None: ...  # a prompt's pass runs between rounds: not a round's cost


class FixedLength:
    def __init__(self, k: int):
        self.k = k

    def next(self, context: int = 0) -> int:
        return self.k

    def update(self, drafted: int, accepted: int, source: str | None = None) -> None:
        pass

    def expect(self, source: str | None) -> None:
        pass

    def interrupt(self) -> None:
        pass


@dataclass
class DecodeState:
    """One request inside the loop.

    Normally the anchor is not in the target's cache yet. While speculation is off the loop runs
    one token ahead: then the anchor is already in the cache and `ahead` is the (lazy) token after it.
    """

    pc: PromptCache
    sampler: Sampler
    lengths: DraftLength
    anchor: int = -1
    remaining: int = 1 << 30  # tokens the caller still wants: caps drafts and running ahead
    k: int | None = None  # drafts planned for the next round
    ahead: mx.array | None = None


def prefill(target, s: DecodeState, prompt: list[int], chunk: int = 512) -> Iterator[int | Round]:
    """Run the uncached part of the prompt through the target, yielding the prompt tokens done after
    each chunk but the last (so a caller can interleave other work or stop), then the first token as a Round."""
    pc = s.pc
    done = pc.reuse(prompt)
    rest = prompt[done:]
    # Only the last token needs logits (`last`: a [chunk, vocab] LM-head product is no small cost), and it
    # goes with its chunk (a pass of its own cost a whole one-token pass of TTFT); but caches that cannot
    # go back take their checkpoint before it (PromptCache.reuse), so there it goes alone, as mlx-lm's does.
    split = len(rest) - 1 if pc.checkpoint_at == len(prompt) - 1 else len(rest)
    pieces = [rest[i : min(i + chunk, split)] for i in range(0, split, chunk)] + [rest[split:]] * (split < len(rest))
    for j, piece in enumerate(pieces):
        final = j == len(pieces) - 1
        s.lengths.interrupt()  # (a request joining a batch: the time across this pass is not the batch's round)
        logits, hidden = target(mx.array([piece]), pc.cache, last=1 if final else None)
        pc.add(piece, hidden)
        if not final:
            eval_state(pc)
            done += len(piece)
            yield done
    # The first token, with no pass queued behind it: a request joining a batch would throw a pass run
    # ahead away (`settle`), a whole one-row pass at its context in the batch's next round; alone, the
    # next plain round starts running ahead.
    s.anchor = s.sampler.next_token(pc.tokens, logits[0, -1:], len(pc.tokens)).item()
    s.k = None
    s.lengths.update(0, 0)
    yield Round([s.anchor], 0, 0)


def step(target, drafter, states: list[DecodeState]) -> list[Round]:
    """One round for every request: draft -> verify -> accept -> commit."""
    if len(states) == 1 and plan(states[0]) == 0:
        return [plain_round(target, states[0])]
    for s in states:
        plan(s)
        settle(s)
    if len(states) > 1:  # one pass for all: the lengths are planned together, from the batch's width
        plan_batch(states)
    proposals = draft(drafter, states)
    logits, hidden, width = verify(target, states, proposals)
    rounds = []
    for i, (s, p) in enumerate(zip(states, proposals)):
        history = s.pc.tokens + [s.anchor] if s.sampler.processors else None
        rows = s.sampler.process(history, p.tokens, logits[i, : len(p) + 1])
        accepted, tokens = accept(rows, p, s.sampler, target.kernels, position=len(s.pc.tokens) + 1)
        commit(s, tokens, None if hidden is None else hidden[i : i + 1], width, defer=len(states) > 1)
        s.lengths.update(len(p), accepted, p.source)
        rounds.append(Round(tokens, len(p), accepted))
    replay([s.pc for s in states])  # rewound recurrent states, batched
    return rounds


def plan(s: DecodeState, budget: int | None = None) -> int:
    """The next round's draft length: the controller's choice, within the tokens still wanted."""
    if s.k is None:
        s.lengths.expect(s.pc.next_source())
        s.k = min(s.lengths.next(len(s.pc.tokens)), max(0, (s.remaining if budget is None else budget) - 1))
    return s.k


def draft(drafter, states: list[DecodeState]) -> list[Draft]:
    """Each request's drafts (none where k = 0); requests drafting together share one drafter pass
    where the drafter can batch them."""
    drafting = [drafter is not None and bool(s.k) for s in states]
    who = [s for s, d in zip(states, drafting) if d]
    caught_up = drafter_states([s.pc for s in who])  # every drafting request's new rows: one batched update
    args = [(d, s.anchor, s.k, s.sampler.drafting(len(s.pc.tokens) + 1)) for s, d in zip(who, caught_up)]
    made = iter(propose_all(drafter, *(list(col) for col in zip(*args))) if args else [])
    proposals = [next(made) if d else Draft(mx.zeros((0,), mx.int32)) for d in drafting]
    mx.async_eval([p.tokens for p in proposals])  # the drafter runs while the host builds the verify pass
    return proposals


def verify(target, states: list[DecodeState], proposals: list[Draft]):
    """[anchor, drafts] of every request, right-padded to one width, through the target once."""
    width = max(len(p) for p in proposals) + 1
    blocks = [mx.concatenate([mx.array([s.anchor], mx.int32), p.tokens, mx.zeros((width - 1 - len(p),), mx.int32)])
              for s, p in zip(states, proposals)]
    caches = [s.pc.cache for s in states]
    if len(states) == 1:
        logits, hidden = target(blocks[0][None], caches[0])
    elif can_batch(caches) and batchable(getattr(target, "model", target)):
        logits, hidden = target(mx.stack(blocks), batch_caches(caches))
    else:  # caches that cannot be viewed as a batch: verify one request at a time
        outs = [target(b[None], c) for b, c in zip(blocks, caches)]
        logits = mx.concatenate([o[0] for o in outs])
        hidden = None if outs[0][1] is None else mx.concatenate([o[1] for o in outs])
    return logits, hidden, width


def commit(s: DecodeState, tokens: list[int], hidden, width: int, defer: bool = False) -> None:
    keep = len(tokens)  # the anchor plus the accepted drafts (the bonus is the next anchor)
    trim(s.pc.cache, width - keep)
    s.pc.add([s.anchor] + tokens[:-1], None if hidden is None else hidden[:, :keep], defer)
    s.anchor = tokens[-1]
    s.k = None


# ----------------------------------------------------------------------------- speculation off


def plain_round(target, s: DecodeState) -> Round:
    """k = 0: plain decoding of one token, run one token ahead as mlx-lm does, so the target's next
    pass is queued before the host reads this token and the host's work hides behind it."""
    if s.ahead is None:
        s.ahead, hidden = advance(target, s, mx.array([s.anchor], mx.int32))
        s.pc.add([s.anchor], hidden)
    token, s.ahead = s.ahead, None
    s.k = None
    if s.remaining > 1 and plan(s, s.remaining - 1) == 0:
        s.ahead, hidden = advance(target, s, token)
    s.anchor = token.item()
    if s.ahead is not None:
        s.pc.add([s.anchor], hidden)
    s.lengths.update(0, 0)  # after the token is read: the round ends here, as a drafting round does
    return Round([s.anchor], 0, 0)


def advance(target, s: DecodeState, token: mx.array) -> tuple[mx.array, mx.array | None]:
    """Queue the target's pass over one token (its value may not be known yet): the next token, lazily."""
    logits, hidden = target(token[None], s.pc.cache)
    history = mx.concatenate([mx.array(s.pc.tokens, mx.int32), token]) if s.sampler.processors else None
    nxt = s.sampler.next_token(history, logits[0], len(s.pc.tokens) + 1)
    mx.async_eval(nxt)
    return nxt, hidden


def settle(s: DecodeState) -> None:
    """Back out of running ahead (another request joined): the anchor leaves the cache again."""
    if s.ahead is not None:
        s.ahead = None
        s.pc.truncate(len(s.pc.tokens) - 1)
