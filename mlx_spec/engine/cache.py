"""A conversation's caches: rollback is a capability of each cache type (engine/rollback.py), never loop code."""

from __future__ import annotations

import inspect
import time

import mlx.core as mx
from mlx.utils import tree_flatten

from ..errors import MlxSpecError
from .recurrent import recurrent_mixers, replay_mixers
from .rollback import UNBOUNDED, drop_kept, leaves, make_cache, max_trim, pending, replayed, restore, rewindable, \
    snapshot, spec_caches, trim
from .rotating import SpecRotatingKVCache
from .slab import pad_rows, release

__all__ = ["PromptCache", "make_cache", "trim", "max_trim", "spec_caches", "eval_state", "SpecRotatingKVCache"]


def body(model):
    """The module that runs the decoder stack (embedding, layers, final norm) without the LM head, where
    it takes tokens and the cache as the whole model does; else the whole model. (plamo2's layer list
    owner takes hidden states, not tokens: it has no embedding.)"""
    from ..target import EMBEDDINGS, find_layers

    owner = find_layers(model)[0]
    if owner is not model and "cache" in inspect.signature(owner.__call__).parameters \
            and any(owner.get(name) is not None for name in EMBEDDINGS):
        return owner
    return model


class PromptCache:
    """One conversation's state: the target's cache, the drafter's state and the tokens they hold.

    Rows reach the drafter lazily: committed rows wait until the drafter next drafts, then go in
    one batched update (and while speculation is off, only every FLUSH_ROWS rows). A follow-up turn
    truncates both to the common prefix and prefills only the rest.

    Caches that cannot go back to any earlier token (sliding windows after they wrap, recurrent
    states) also keep checkpoints: the state at the end of each of the latest prompts (before
    its last token), so that a regenerated reply, an edited last message or a follow-up turn reuse
    the longest checkpointed prefix and re-prefill only what follows it. Checkpoints hold
    references, not copies: MLX arrays are immutable and these caches never write in place.
    """

    replay_seconds: float | None = None  # set to 0.0 to time replay passes (a measurement; syncs each one)
    FLUSH_ROWS = 256  # bounds the hidden states held for the drafter
    CHECKPOINTS = 4  # prompt ends kept (turn boundaries of a conversation)

    def __init__(self, model, drafter=None, kv_bits: int | None = None, kv_group_size: int = 64):
        self.model = model
        from ..target import find_layers

        self.layers = find_layers(model)[2]  # (the list itself: taps are substituted into it)
        self.kv = dict(kv_bits=kv_bits, kv_group_size=kv_group_size)  # quantized KV caches (mlx-lm's), if set
        self._body = body(model)
        self._drafter = drafter
        self._eager = getattr(drafter, "observe_tokens", None)
        self.deferred: list[int] | None = None  # accepted tokens whose replay waits (see add)
        self.reset()
        recurrent_mixers(model, self.layers, self.cache)  # from now on they record their inputs (see replay)
        self.reused = 0  # prompt tokens the last `reuse` found already cached

    def reset(self) -> None:
        """Forget everything: a fresh target cache and drafter state."""
        self.cache = make_cache(self.model, rollback=self._drafter is not None, **self.kv)  # per-layer caches
        self.tokens: list[int] = []  # tokens whose rows are in `cache`
        self._state = self._drafter.make_state() if self._drafter is not None else None
        self._pending: list[tuple[mx.array | None, list[int]]] = []  # rows the drafter has not seen
        self._pending_rows = 0
        self._checkpoints = min((max_trim(c) for c in leaves(self.cache)), default=UNBOUNDED) < UNBOUNDED
        self._marks: list[tuple[int, list]] = []  # (tokens, snapshot), by position
        self._mark_at: int | None = None  # take the checkpoint when the cache holds this many tokens

    def add(self, tokens: list[int], hidden: mx.array | None, defer: bool = False) -> None:
        """Rows just written to the target cache, with their tapped hidden states [1, n, taps*H] (or None).
        defer: a rewound recurrent state's replay waits for `engine.batch.replay` (a batched round
        replays its requests together)."""
        behind = pending(self.cache)
        if behind:  # a recurrent state was rewound past a rejected draft: feed it the accepted tokens again
            if behind != len(tokens):
                raise MlxSpecError(f"{behind} tokens to replay, {len(tokens)} committed")
            if defer:
                self.deferred = list(tokens)
            else:
                replay([self], [tokens])
        self.tokens += tokens
        if len(self.tokens) == self._mark_at:
            self._checkpoint()
        if self._drafter is None:
            return
        if self._eager is not None:  # what needs no hidden states goes in at once (drafters/pick.py's lookup)
            self._eager(self._state, tokens)
        self._pending.append((hidden, list(tokens)))
        self._pending_rows += len(tokens)
        if self._pending_rows >= self.FLUSH_ROWS:
            self.drafter_state()

    def replay_pass(self, tokens: mx.array, cache) -> None:
        """Run tokens [B, n] through the target only to update its caches: through the decoder stack's
        owner when it takes a cache (no LM head: its logits are not needed), else the whole model."""
        if PromptCache.replay_seconds is None:
            self._body(tokens, cache=cache)
            return
        t = time.perf_counter()  # measuring (bench --rollback): wait for the pass and the states it wrote
        out = self._body(tokens, cache=cache)
        mx.eval(out, [a for c in leaves(cache) if hasattr(c, "state") for _, a in tree_flatten(c.state)
                      if isinstance(a, mx.array)])
        PromptCache.replay_seconds += time.perf_counter() - t

    def next_source(self) -> str | None:
        """The source the drafter expects to draft the next round from (None: its model), read from the
        tokens so far: while the loop runs a token ahead, the anchor is not known yet (drafters/pick.py)."""
        guess = getattr(self._drafter, "next_source", None)
        return guess(self._state) if guess is not None else None

    def drafter_state(self):
        """The drafter's state, caught up with every committed row."""
        if self._pending:
            self._drafter.observe(self._state, *self._take_pending())
        return self._state

    def _drop_pending(self, n: int) -> None:
        """The rows not seen by the drafter yet at positions n and past: dropped."""
        keep = max(0, n - (len(self.tokens) - self._pending_rows))
        kept, rows = [], 0
        for hidden, tokens in self._pending:
            take = min(len(tokens), keep - rows)
            if take <= 0:
                break
            kept.append((hidden if hidden is None or take == len(tokens) else hidden[:, :take], tokens[:take]))
            rows += take
        self._pending, self._pending_rows = kept, rows

    def _take_pending(self) -> tuple[mx.array | None, list[int]]:
        """The rows the drafter has not seen: their hidden states [1, n, taps*H] (or None) and tokens."""
        hidden = [h for h, _ in self._pending]
        hidden = None if hidden[0] is None else mx.concatenate(hidden, axis=1) if len(hidden) > 1 else hidden[0]
        tokens = [t for _, ts in self._pending for t in ts]
        self._pending, self._pending_rows = [], 0
        return hidden, tokens

    def leave_batch(self) -> None:
        """This request's rounds are over: its rows leave the slabs they shared with others (engine/slab.py),
        the target's and the drafter's, so that an idle cache never keeps a batch's arrays alive."""
        release(leaves(self.cache))
        leave = getattr(self._state, "leave_batch", None)
        if leave is not None:
            leave()

    def max_trim(self) -> int:
        """Tokens the target's cache can give back exactly (a sliding window keeps only a few spare rows)."""
        return rewindable(self.cache)

    def truncate(self, n: int) -> None:
        """Keep the first n tokens, in the target's cache and the drafter's state alike."""
        drop = len(self.tokens) - n
        if drop <= 0:
            return
        if drop > self.max_trim():
            raise MlxSpecError(f"cannot roll the cache back {drop} tokens exactly (at most {self.max_trim()})")
        kept = trim(self.cache, drop)
        if kept:  # (no verify pass to replay from here: through the whole stack)
            drop_kept(self.cache, kept)
            self.replay_pass(mx.array([self.tokens[n - kept : n]]), self.cache)
            replayed(self.cache)
        self._forget(n)

    def mark(self):
        """Where this cache stands now; `back_to(mark)` returns here exactly however many updates later
        (a recurrent state cannot be trimmed back across rounds: this keeps references to it)."""
        return len(self.tokens), snapshot(self.cache)

    def back_to(self, mark) -> None:
        n, snap = mark
        restore(self.cache, snap)
        self._forget(n)

    def _forget(self, n: int) -> None:
        """The target's cache holds the first n tokens again: match the drafter and the checkpoint. Rows past n
        that the drafter has not seen go unseen (catching it up on a finished request's whole answer only
        to trim it away took 4 ms of every reuse of an idle cache, 0.1 ms without a drafter)."""
        if self._drafter is not None:
            self._drop_pending(n)
            self._state.trim(max(0, self._state.offset - n))
        del self.tokens[n:]
        self._marks = [m for m in self._marks if m[0] <= n]

    @property
    def checkpoint_at(self) -> int | None:
        """Where the prompt being prefilled is checkpointed (`reuse`): a pass must end there. None: no checkpoints."""
        return self._mark_at if self._checkpoints else None

    def _checkpoint(self) -> None:
        n = len(self.tokens)
        if self._checkpoints and all(pos != n for pos, _ in self._marks):
            self._marks = (self._marks + [(n, snapshot(self.cache))])[-self.CHECKPOINTS:]

    def common_prefix(self, ids: list[int]) -> int:
        """How many leading tokens of `ids` this cache holds (what a prefix pool ranks caches by)."""
        n, limit = 0, min(len(self.tokens), len(ids))
        while n < limit and self.tokens[n] == ids[n]:
            n += 1
        return n

    def reuse(self, prompt: list[int]) -> int:
        """Go back to the longest common prefix with `prompt` (keeping >= 1 token to prefill); returns
        the tokens really reused. What the caches cannot give back exactly is not reused: they go
        back to the checkpoint if it lies within the common prefix, else start afresh."""
        n = min(self.common_prefix(prompt), len(prompt) - 1)
        usable = [m for m in self._marks if m[0] <= n]
        if len(self.tokens) - n <= self.max_trim():
            self.truncate(n)
        elif usable:
            n, snap = usable[-1]
            restore(self.cache, snap)
            self._forget(n)
        else:
            self.reset()
            n = 0
        self.reused = n
        self._mark_at = len(prompt) - 1
        if n == self._mark_at:
            self._checkpoint()
        return n


# Padding past this many rows a request costs more than updating requests one by one (here: ~0.05 ms a
# padded row against ~0.8 ms an update), as when new requests' prompts of different lengths go in.
PAD_ROWS = 16


def drafter_states(pcs: list[PromptCache]) -> list:
    """The drafter states of requests about to draft together, caught up with every committed row: where
    the drafter has a batched update (`observe_batch`: one pass and one scatter for all), requests whose
    new rows are alike in number go in together and the others (a new request's prompt) in groups of
    their own, each still written into the slab its rows are lent to; else one request at a time."""
    batched = getattr(pcs[0]._drafter, "observe_batch", None) if pcs else None
    behind = [p for p in pcs if p._pending]
    if len(pcs) < 2 or batched is None or any(h is None for p in behind for h, _ in p._pending):
        return [p.drafter_state() for p in pcs]
    for group in alike(behind):
        hidden, tokens = zip(*(p._take_pending() for p in group))
        n = max(len(t) for t in tokens)
        batched([p._state for p in group],
                mx.concatenate([pad_rows(h, n, axis=1) for h in hidden]), list(tokens))
    return [p._state for p in pcs]


def alike(pcs: list[PromptCache]) -> list[list[PromptCache]]:
    """Requests in groups whose pending rows differ by at most PAD_ROWS (fewest first)."""
    groups: list[list[PromptCache]] = []
    for p in sorted(pcs, key=lambda p: p._pending_rows):
        if groups and p._pending_rows <= groups[-1][0]._pending_rows + PAD_ROWS:
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def replay(pcs: list[PromptCache], tokens: list[list[int]]) -> None:
    """Feed rewound recurrent states (of requests verified in one pass) their accepted tokens again, as many
    for each: from the verify pass's recorded mixer inputs where the model's layout allows (only the
    recurrent mixers run), else through the whole decoder stack (every layer takes the tokens again)."""
    from .batch import StateView, batch_caches

    pc = pcs[0]
    t = time.perf_counter() if PromptCache.replay_seconds is not None else None
    mixers = recurrent_mixers(pc.model, pc.layers, pc.cache)
    caches = [p.cache for p in pcs]
    if mixers and replay_mixers(mixers, caches, len(tokens[0]), StateView):
        if t is not None:  # measuring (bench --rollback): wait for the states written
            mx.eval([a for c in caches for _, a in tree_flatten([x.state for x in leaves(c)]) if isinstance(a, mx.array)])
            PromptCache.replay_seconds += time.perf_counter() - t
    else:
        for c in caches:
            drop_kept(c, len(tokens[0]))
        pc.replay_pass(mx.array(tokens), caches[0] if len(pcs) == 1 else batch_caches(caches))
    for c in caches:
        replayed(c)


def eval_state(pc: PromptCache) -> None:
    mx.eval([a for _, a in tree_flatten([c.state for c in pc.cache]) if isinstance(a, mx.array)])
