"""`mlx-spec chat --distributed`: rank 0 is the terminal chat; the other ranks follow it.

The chat itself is unchanged. Its `Session` (every model operation the chat makes, all on its worker
thread) is replaced on rank 0 by `RootSession`, which announces each operation to the followers
before doing it: a reply (the messages, the settings, drafting on or off), the plain-speed baseline,
dropping the caches after a failure. A reply then runs in lockstep: before each of its rounds (each
prefill chunk, each verify round) rank 0 says "go on" or "stop" (a Ctrl-C stops between rounds, on
every rank alike), so every rank's caches stay in step across turns, /regen and stopped replies.

Draft lengths are fixed (the adaptive controller's cost curve is per machine, the ranks must agree)
and an unseeded sampled reply gets a seed drawn on rank 0. A lost rank fails the reply with a clear
message; the chat stays up (/save keeps the conversation) and every later reply says the same.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace

from ..app.chat.session import Session as ChatSession
from ..engine.params import GREEDY_BELOW
from ..errors import MlxSpecError
from .serve import dismiss, share_object
from .session import DistributedError, Session

log = logging.getLogger("mlx_spec.chat")
GO, STOP = 1, 0


def fixed(settings, model, seed: int | None = None):
    """The settings every rank runs a reply with: a fixed block, and a seed if sampling has none."""
    if settings.block_size is None and model.drafter is not None:
        settings = replace(settings, block_size=model.drafter.block_size)
    s = settings.sampling
    if seed is not None and s.seed is None and s.temperature >= GREEDY_BELOW:
        settings = replace(settings, sampling=replace(s, seed=seed))
    return settings


class RootSession(ChatSession):
    """Rank 0's chat session: every model operation is announced to the followers first."""

    def __init__(self, model, tokenizer, dist: Session, followers=None):
        super().__init__(model, tokenizer)
        self.dist, self.followers, self.broken = dist, followers, None

    def _failed(self, e: DistributedError) -> DistributedError:
        dead = self.followers.dead() if self.followers is not None else ""
        self.broken = (f"the distributed target failed: {e}{' (' + dead + ')' if dead else ''}. /save keeps the "
                       f"conversation; restart the chat to go on")
        return DistributedError(self.broken)

    def _collective(self, what: str, fn, *args):
        if self.broken:
            raise DistributedError(self.broken)
        try:
            with self.dist.guard(what):
                return fn(*args)
        except DistributedError as e:
            raise self._failed(e) from None

    def _announce(self, what: str, *message):
        self._collective(what, share_object, self.dist, message)

    def reply(self, messages, settings):
        settings = fixed(settings, self.model, int.from_bytes(os.urandom(3), "little"))
        self._announce("a reply", "reply", messages, settings, self.speculative)
        return self._lockstep(self._collective("a reply", super().reply, messages, settings))

    def _lockstep(self, rounds):
        """Each item only after every rank heard "go on"; "stop" if the chat stops early."""
        between = False  # the followers wait for a flag (not inside a round)
        try:
            while True:
                between = False
                self._collective("a reply", self.dist.share_ints, [GO], 1)
                try:
                    item = self._collective("a reply", next, rounds)
                except StopIteration:
                    return
                between = True
                yield item
        finally:
            if between and not self.broken:
                self._collective("a reply's end", self.dist.share_ints, [STOP], 1)

    def measure_baseline(self, tokens: int):
        self._announce("the baseline", "baseline", tokens)
        return self._collective("the baseline", super().measure_baseline, tokens)

    def block_label(self, settings) -> str:
        label = super().block_label(fixed(settings, self.model))
        return f"{label}, {self.dist.size} ranks"

    def cost_curve(self):
        return None  # draft lengths are fixed in distributed runs

    def forget_caches(self) -> None:
        super().forget_caches()
        if not self.broken:
            try:
                self._announce("forgetting the caches", "forget")
            except DistributedError:
                pass

    def shutdown(self) -> None:
        """Tell the followers to exit (the chat is leaving)."""
        if not self.broken:
            dismiss(self.dist, "leaving")


def follow(dist: Session, model, tokenizer) -> int:
    """A follower: do what rank 0 announces until it says exit (or goes away)."""
    session = ChatSession(model, tokenizer)
    while True:
        with dist.guard("waiting for rank 0", watch=False):  # idle as long as the user is
            op, *args = share_object(dist)
        if op == "exit":
            return 0
        with dist.guard(op):
            try:
                if op == "reply":
                    messages, settings, session.speculative = args
                    rounds = session.reply(messages, settings)
                    while dist.share_ints(None, 1)[0] == GO:
                        dist.progress()
                        if next(rounds, None) is None:
                            break
                elif op == "baseline":
                    session.measure_baseline(*args)
                elif op == "forget":
                    session.forget_caches()
            except DistributedError:
                raise
            except Exception as e:  # deterministic: rank 0 met it too, and its chat goes on
                log.warning("rank %d: %s: %s (rank 0 fails this reply too)", dist.rank, type(e).__name__, e)
                if not isinstance(e, MlxSpecError):  # a bug below us: rank 0 drops its caches too
                    session.forget_caches()


def start(args):
    """(dist, followers) for this process: under mlx.launch or by hand (MLX_RANK set) it joins; else it
    is rank 0 and starts the followers itself (-n N local ranks, or --hostfile FILE)."""
    from .cli import config_from
    from .ranks import Followers, follower_argv, ring_hosts

    followers = None
    if "MLX_RANK" not in os.environ:
        rows, ssh = ring_hosts(args.ranks, args.hostfile)
        followers = Followers(rows, ssh, follower_argv(args))
    try:
        return Session(config_from(args)), followers
    except DistributedError:
        if followers is not None:
            followers.close(wait=0)
        raise


def load(dist: Session, args):
    from .load import load_distributed

    with dist.guard("loading"):
        return load_distributed(dist, args.model, drafter=None if args.no_draft else args.drafter, mode=args.mode,
                                dtype=args.dtype, block_size=args.block_size)


def run_follower(dist: Session, args) -> int:
    try:
        model, tokenizer = load(dist, args)
        code = follow(dist, model, tokenizer)
    except DistributedError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    sys.stderr.flush()
    os._exit(code)  # the ring's teardown may wait on peers that already left
