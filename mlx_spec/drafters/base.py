"""The small interface every drafter implements; the verify loop knows nothing else about drafters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from ..errors import DrafterMismatchError, LoadError


@dataclass
class Draft:
    """k proposed tokens and the distribution each was drawn from.

    q is [k, V] probabilities, or None when the tokens are deterministic (argmax or lookup):
    the verifier then treats q as one-hot, which keeps sampling exactly lossless.
    """

    tokens: mx.array  # [k] int32
    q: mx.array | None = None
    source: str | None = None  # where a drafter draws from several sources, which one this is (drafters/pick.py)

    def __len__(self) -> int:
        return self.tokens.shape[0]


class Drafter(Protocol):
    block_size: int  # most tokens one round can verify: the anchor plus block_size - 1 drafts
    tap_ids: tuple[int, ...]  # target layers whose outputs the drafter reads

    def make_state(self):
        """Per-conversation state (e.g. the context cache); supports `trim(n)` and `offset`."""

    def observe(self, state, hidden: mx.array | None, tokens: list[int]) -> None:
        """Committed rows: their tapped hidden states [1, n, taps*H] and token ids."""

    def propose(self, state, anchor: int, k: int, sampling) -> Draft:
        """Up to k tokens following `anchor`, which sits at position `state.offset`."""

    # Optional: `propose_batch(states, anchors, ks, samplings) -> list[Draft]`, several requests' drafts
    # in one pass (what `propose` gives each alone); batched rounds use it where a drafter has it.
    # Optional: `observe_batch(states, hidden [B, n, taps*H], tokens)`, several requests' new rows at once,
    # request b's first len(tokens[b]) rows of hidden[b] (the rest padding): what `observe` does for each.
    # Optional: `context_spans(state) -> list[int]`, the most context rows each of its attention layers
    # reads (0: all of them), for the cost curve's growth with the context (curve.CostCurve.spans).


def propose_all(drafter, states: list, anchors: list[int], ks: list[int], samplings: list) -> list[Draft]:
    """Several requests' drafts: in one pass where the drafter batches them, else one request at a time."""
    batched = getattr(drafter, "propose_batch", None) if len(states) > 1 else None
    if batched:
        return batched(states, anchors, ks, samplings)
    return [drafter.propose(*a) for a in zip(states, anchors, ks, samplings)]


def observe_all(drafter, states: list, hidden: mx.array, tokens: list[list[int]]) -> None:
    """Several requests' new rows: in one update where the drafter batches them, else one request at a time."""
    batched = getattr(drafter, "observe_batch", None)
    if batched:
        batched(states, hidden, tokens)
        return
    for b, (s, t) in enumerate(zip(states, tokens)):
        drafter.observe(s, hidden[b : b + 1, : len(t)], t)


def load_strict(module, weights: dict, path, against: str = "its config", what: str = "weights") -> None:
    """Load a checkpoint's weights into `module`, every tensor accounted for; a mismatch is the
    checkpoint's, named in one line."""
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise DrafterMismatchError(f"{path}: {what} do not match {against} ({' '.join(str(e).split())[:240]})") from None
    mx.eval(module.parameters())


def parse_config(cls, raw: dict, path):
    """`cls.from_dict(raw)`; a missing key is the checkpoint's, named in one line."""
    try:
        return cls.from_dict(raw)
    except KeyError as e:
        raise LoadError(f"{path}/config.json lacks {e.args[0]!r}") from None
