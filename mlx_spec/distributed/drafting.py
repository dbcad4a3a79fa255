"""The drafter runs on rank 0 (the last stage, where the tapped hidden states arrive); its proposals
are sent to every rank, so every rank verifies the same block. The other ranks hold a stand-in."""

from __future__ import annotations

import mlx.core as mx

from ..drafters.base import Draft
from .session import from_root


class _NoState:
    """A stand-in's per-conversation state: nothing to keep."""

    offset = 0

    def trim(self, n: int) -> int:
        return 0


class SharedDrafter:
    """On rank 0, the real drafter (`inner`); elsewhere None. `propose` is collective: every rank
    calls it with the same k (the draft lengths are fixed in distributed runs) and gets rank 0's tokens."""

    def __init__(self, inner, group, block_size: int, tap_ids: tuple[int, ...]):
        self.inner, self.group = inner, group
        self.block_size, self.tap_ids = block_size, tuple(tap_ids)

    def __getattr__(self, key):  # rank 0: the real drafter's other attributes (config, kind, ...)
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(key)
        return getattr(inner, key)

    propose_batch = observe_batch = None  # proposals are collective, one request at a time (not the inner drafter's batch)

    def make_state(self):
        return self.inner.make_state() if self.inner is not None else _NoState()

    def observe(self, state, hidden, tokens: list[int]) -> None:
        if self.inner is not None:
            self.inner.observe(state, hidden, tokens)

    def propose(self, state, anchor: int, k: int, sampling) -> Draft:
        q = None
        if self.inner is not None:
            d = self.inner.propose(state, anchor, k, sampling)
            n, q = len(d), d.q
            buf = mx.concatenate([mx.array([n], mx.int32), d.tokens.astype(mx.int32), mx.zeros((k - n,), mx.int32)])
        else:
            buf = None
        got = from_root(buf, (k + 1,), mx.int32, self.group).tolist()  # one host sync: the length decides shapes
        return Draft(mx.array(got[1 : 1 + got[0]], mx.int32), q)
