"""`mlx-spec serve --distributed`: rank 0 listens; the other ranks follow its schedule.

The server's scheduler is unchanged: it talks to a `DistributedBackend`, which announces every
model operation (start a request, a prefill chunk, a batched round, release a request) to the other
ranks before doing it; they do the same operation on mirrored requests, so every rank's caches,
prefix pool and generations stay in step. Requests without a seed get one on rank 0 (ranks must draw
alike). A lost peer fails the running requests, and every later one, with a 503 naming the cause.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from dataclasses import replace
from itertools import count

import mlx.core as mx

from ..app.server.backend import Backend
from ..app.server.errors import APIError
from ..engine.params import GREEDY_BELOW
from ..errors import MlxSpecError
from .session import DistributedError, Session, from_root

log = logging.getLogger("mlx_spec.server")


def share_object(session: Session, obj=None):
    """Rank 0's `obj`, on every rank (pickled: the ranks of one run trust each other)."""
    data = pickle.dumps(obj) if session.is_root else b""
    (n,) = session.share_ints([len(data)] if session.is_root else None, 1)
    buf = mx.array(list(data), mx.uint8) if session.is_root else None
    return pickle.loads(bytes(from_root(buf, (n,), mx.uint8, session.group).tolist()))


def dismiss(session: Session, what: str) -> None:
    """Rank 0, leaving: tell the followers to exit (one already gone changes nothing: rank 0 leaves too)."""
    try:
        with session.guard(what):
            share_object(session, ("exit",))
    except DistributedError:
        pass


class _Mirror:
    """A follower's copy of a request: what `Backend` reads and writes on a Sequence."""

    def __init__(self, job):
        self.job, self.cache, self.gen, self.prefilling = job, None, None, None

    def on_round(self, r) -> None:
        pass


class DistributedBackend(Backend):
    def __init__(self, cfg, prefix_cache_size: int, session: Session):
        super().__init__(cfg, prefix_cache_size)
        self.session, self.broken = session, None
        self._ids = count()

    def load(self) -> None:
        from .load import load_distributed

        cfg = self.cfg
        with self.session.guard("loading"):
            model, tokenizer = load_distributed(self.session, cfg.target, drafter=cfg.drafter, mode=cfg.mode,
                                                dtype=cfg.dtype, block_size=cfg.block_size)
        if model.drafter is not None and cfg.block_size is None:
            # Fixed draft lengths: the adaptive controller's cost curve is per machine, the ranks must agree.
            self.cfg = cfg = replace(cfg, block_size=model.drafter.block_size)
        self._loaded = (model, tokenizer)
        super().load()

    def load_model(self):
        return self._loaded

    # -- rank 0: announce, then do -------------------------------------------------------------

    def _run(self, what: str, announce, work):
        if self.broken:
            raise APIError(503, self.broken, code="distributed_failure")
        try:
            with self.session.guard(what):
                if self.session.is_root:
                    share_object(self.session, announce)
                return work()
        except DistributedError as e:
            self.broken = f"the distributed target failed: {e}"
            log.error(self.broken)
            raise APIError(503, self.broken, code="distributed_failure") from None

    def start(self, seq) -> None:
        job = seq.job
        if job.sampling.seed is None and job.sampling.temperature >= GREEDY_BELOW:
            seq.job = job = replace(job, sampling=replace(job.sampling, seed=int.from_bytes(os.urandom(3), "little")))
        seq.dist_id = next(self._ids)
        self._run("a request's start", ("start", seq.dist_id, job), lambda: super(DistributedBackend, self).start(seq))

    def prefill_step(self, seq) -> None:
        self._run("prefill", ("prefill", seq.dist_id), lambda: super(DistributedBackend, self).prefill_step(seq))

    def step(self, seqs) -> None:
        self._run("generation", ("step", [s.dist_id for s in seqs]), lambda: super(DistributedBackend, self).step(seqs))

    def stop(self, seq, reusable: bool) -> None:
        if getattr(seq, "dist_id", None) is None or self.broken:
            return super().stop(seq, reusable)
        self._run("a request's end", ("stop", seq.dist_id, reusable), lambda: super(DistributedBackend, self).stop(seq, reusable))

    def shutdown(self) -> None:
        """Rank 0: tell the followers to exit."""
        if not self.broken:
            dismiss(self.session, "shutdown")

    # -- the other ranks -------------------------------------------------------------------------

    def follow(self) -> None:
        """Do what rank 0 announces until it says exit. Errors that rank 0 also meets (they are
        deterministic) are skipped as its scheduler skips them."""
        mirrors = {}
        while True:
            with self.session.guard("waiting for rank 0's next request", watch=False):
                op, *args = share_object(self.session)  # idle as long as rank 0 is
            if op == "exit":
                return
            with self.session.guard(op):
                try:
                    if op == "start":
                        key, job = args
                        mirrors[key] = _Mirror(job)
                        Backend.start(self, mirrors[key])
                    elif op == "prefill":
                        Backend.prefill_step(self, mirrors[args[0]])
                    elif op == "step":
                        Backend.step(self, [mirrors[k] for k in args[0]])
                    elif op == "stop":
                        Backend.stop(self, mirrors.pop(args[0]), args[1])
                except MlxSpecError as e:
                    log.info("rank %d: %s (rank 0 fails this request too)", self.session.rank, e)


def run_serve(args, cfg) -> int:
    """Rank 0 runs the HTTP server; the others follow."""
    from ..app.server.app import create_app
    from ..app.server.serve import make_server
    from .cli import config_from

    session = Session(config_from(args))  # not under mlx.launch: a plain error, nothing to tear down
    try:
        backend = DistributedBackend(cfg.model, cfg.prefix_cache_size, session)
        if not session.is_root:
            backend.load()
            backend.follow()
            os._exit(0)
        app = create_app(cfg, backend=backend)
        try:
            make_server(app, cfg).run()
        finally:  # uvicorn re-raises the signal that stopped it
            backend.shutdown()
    except DistributedError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    except KeyboardInterrupt:
        os._exit(130)
    error = app.state.server.scheduler.load_error
    if error is not None:
        print(f"error: {error}", file=sys.stderr, flush=True)
        os._exit(2)
    sys.stdout.flush()
    os._exit(0)  # the ring's teardown may wait on peers that already left
