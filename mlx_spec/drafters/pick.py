"""A model drafter and prompt lookup, picked per conversation by what each would have had accepted.

Prompt lookup costs nothing and wins where the target re-emits its context (raw continuations of a
file, edits, quoting); a model drafter wins where the text is new. Neither is best everywhere, and a
fixed rule (lookup whenever it found a continuation) cost edits a third of their τ. So each round this
drafter proposes from the source with the better record in this conversation:

- the records compare the two on the same rounds only: rounds where lookup found a continuation (the
  model drafter alone is judged on other rounds too, which flattered or sank it by selection);
- lookup's record is kept on every such round, proposed or not: its continuation is free to compute
  and is judged against the tokens committed after it; the model's only where it ran; plain rounds'
  tokens judge lookup too (after the model's misses have sent the controller plain, lookup can still
  come to lead where the text repeats);
- a draft is judged once the committed tokens settle it (a mismatch, or as many tokens as it has), so a
  source is never capped by the other's shorter acceptance (until lookup's first candidate settles, what
  it has had right so far stands in for its record);
- the model drafts until both have a record (lookup's costs no round: it is judged either way), and
  while lookup leads it still drafts every `RETRY`-th such round, so that its record follows the
  conversation.

Lossless: the choice depends on committed tokens only, never on the round being verified, and each
draft carries its own proposal distribution (lookup's is one-hot).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from .base import Draft, observe_all, propose_all
from .lookup import LookupDrafter, LookupState

RETRY = 8  # while lookup leads, the model drafts every RETRY-th round where both could
SPAN = 16  # records are means over about the last SPAN judged rounds


@dataclass
class Record:
    """Mean tokens accepted per judged round, weighted towards recent rounds."""

    mean: float = 0.0
    n: int = 0

    def add(self, accepted: int) -> None:
        self.n += 1
        self.mean += (accepted - self.mean) / min(self.n, SPAN)


@dataclass
class Pending:
    """A draft (or lookup's continuation, proposed or not) waiting for the tokens that judge it."""

    at: int  # position of the anchor it followed
    tokens: mx.array | list[int]  # a model draft stays lazy until judged: reading it at once would wait for it
    record: Record
    agreed: int = 0  # tokens committed since, all of which it had right (while undecided)


@dataclass
class PickState:
    lookup: LookupState
    model: object
    records: dict[str, Record] = field(default_factory=lambda: {"lookup": Record(), "model": Record()})
    pending: list[Pending] = field(default_factory=list)
    since_model: int = 0  # rounds where both could draft since the model last did
    drafted: dict[str, int] = field(default_factory=lambda: {"lookup": 0, "model": 0})  # rounds each drafted
    width: int = 1 << 30  # drafts of the latest round that drafted: lookup's continuations are judged that long
    proposed: bool = False  # a round drafted since tokens were last committed

    @property
    def offset(self) -> int:
        return self.lookup.offset

    def lookup_estimate(self) -> float | None:
        """Lookup's record; before its first candidate is settled, what the longest of them has had right so
        far (a candidate the model's rounds leave undecided would otherwise keep lookup waiting for rounds)."""
        record = self.records["lookup"]
        if record.n:
            return record.mean
        return max((p.agreed for p in self.pending if p.record is record), default=None)

    def lookup_leads(self) -> bool:
        """Both sources have a record (or lookup a candidate so far right) and lookup's is the better."""
        lookup, model = self.lookup_estimate(), self.records["model"]
        return model.n > 0 and lookup is not None and lookup > model.mean

    def trim(self, n: int) -> int:
        """The last n rows taken back: lookup sees every row at once, the model may not have seen the last few
        yet (they wait in the prompt cache), so it goes back to the same length, not by the same count."""
        self.pending.clear()  # they judge positions that are being taken back
        length = max(0, self.lookup.offset - n)
        self.model.trim(max(0, self.model.offset - length))
        return self.lookup.trim(n)

    def leave_batch(self) -> None:
        leave = getattr(self.model, "leave_batch", None)
        if leave is not None:
            leave()


class PickDrafter:
    """`model` (any drafter with a model behind it) or prompt lookup, whichever this conversation favours."""

    def __init__(self, model, max_ngram: int = 3):
        self.inner = model
        self.lookup = LookupDrafter(model.block_size, max_ngram)
        self.block_size, self.tap_ids = model.block_size, model.tap_ids

    def __getattr__(self, name):  # the model drafter's own attributes (config, layers, ...) read through
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def make_state(self) -> PickState:
        return PickState(self.lookup.make_state(), self.inner.make_state())

    def observe(self, state: PickState, hidden, tokens: list[int]) -> None:
        ahead = state.lookup.offset - state.model.offset  # lookup may have them already (observe_tokens)
        self.observe_tokens(state, tokens[ahead:])
        self.inner.observe(state.model, hidden, tokens)

    def observe_batch(self, states: list[PickState], hidden: mx.array, tokens: list[list[int]]) -> None:
        for s, t in zip(states, tokens):
            self.observe_tokens(s, t[s.lookup.offset - s.model.offset :])
        observe_all(self.inner, [s.model for s in states], hidden, tokens)

    def observe_tokens(self, state: PickState, tokens: list[int]) -> None:
        """Committed tokens, as soon as they are: lookup needs no hidden states, and `next_source` reads it
        while the model drafter's rows wait for its next pass (engine/cache.py)."""
        state.lookup.extend(tokens)
        if tokens and not state.proposed:  # a plain round's (or the prompt's)
            self._judge_lookup(state)
        if tokens:
            state.proposed = False

    def _judge_lookup(self, state: PickState) -> None:
        """Settle what these tokens decide, and queue lookup's continuation after them (as long as the last
        drafting round's drafts) if none of its is pending: its record follows the text while no round drafts."""
        settle(state)
        lookup = state.records["lookup"]
        if any(p.record is lookup for p in state.pending):
            return  # one of its candidates is still being judged
        found = state.lookup.continuation(min(state.width, self.block_size - 1))
        if found:
            state.pending.append(Pending(state.offset - 1, found, lookup))

    def next_source(self, state: PickState) -> str | None:
        """Whom the next round will likely draft from, before its anchor is known (while the loop runs a
        token ahead it has not read it): lookup where the last tokens occurred before and lookup leads
        this conversation, else the model (None). The controller plans the round's length from that
        source's acceptance (controller.py)."""
        found = state.lookup.continuation(1)
        return "lookup" if found and state.lookup_leads() else None

    def context_spans(self, state: PickState) -> list[int]:
        spans = getattr(self.inner, "context_spans", None)
        return spans(state.model) if spans else []

    def propose(self, state: PickState, anchor: int, k: int, sampling) -> Draft:
        found, by_lookup = self._choose(state, anchor, k)
        draft = looked_up(found) if by_lookup else self.inner.propose(state.model, anchor, k, sampling)
        return self._record(state, found, draft, not by_lookup)

    def propose_batch(self, states: list[PickState], anchors: list[int], ks: list[int], samplings: list) -> list[Draft]:
        chosen = [self._choose(s, a, k) for s, a, k in zip(states, anchors, ks)]
        drafts = [looked_up(found) if by_lookup else None for found, by_lookup in chosen]
        modelled = [i for i, d in enumerate(drafts) if d is None]
        if modelled:
            args = [[col[i] for i in modelled] for col in ([s.model for s in states], anchors, ks, samplings)]
            for i, d in zip(modelled, propose_all(self.inner, *args)):
                drafts[i] = d
        return [self._record(s, found, d, not by_lookup) for s, (found, by_lookup), d in zip(states, chosen, drafts)]

    def _choose(self, state: PickState, anchor: int, k: int) -> tuple[list[int], bool]:
        """Lookup's continuation, and whether it drafts this round (after judging what is now settled)."""
        settle(state, anchor)
        state.width, state.proposed = k, True
        found = state.lookup.continuation(k, [anchor])
        if not found:
            return found, False
        state.since_model += 1
        return found, state.lookup_leads() and state.since_model < RETRY

    def _record(self, state: PickState, found: list[int], draft: Draft, by_model: bool) -> Draft:
        """Queue the round's candidates for judging, where both sources could draft."""
        state.drafted["model" if by_model else "lookup"] += 1
        if found:
            state.pending.append(Pending(state.offset, found, state.records["lookup"]))
            if by_model:
                state.pending.append(Pending(state.offset, draft.tokens, state.records["model"]))
                state.since_model = 0
        return draft


def looked_up(found: list[int]) -> Draft:
    return Draft(mx.array(found, mx.int32), source="lookup")  # one-hot q: deterministic drafts


def settle(state: PickState, anchor: int | None = None) -> None:
    """Record every pending candidate that the committed tokens (and the new anchor) now decide."""
    if not state.pending:
        return
    undecided, tokens = [], state.lookup.tokens
    for p in state.pending:
        if p.at >= state.offset:
            continue  # nothing committed since it was proposed (proposed again in its place): no judgment
        if not isinstance(p.tokens, list):
            p.tokens = p.tokens.tolist()  # evaluated by now: the round that verified it has ended
        truth = tokens[p.at + 1 :] + ([] if anchor is None else [anchor])
        n = 0
        while n < min(len(p.tokens), len(truth)) and p.tokens[n] == truth[n]:
            n += 1
        if n == len(truth) < len(p.tokens):
            p.agreed = n  # every committed token agrees so far
            undecided.append(p)
        else:
            p.record.add(n)
    state.pending = undecided
