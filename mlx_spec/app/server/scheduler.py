"""One worker thread owns the model; requests wait in a bounded queue, then share it round by round.

Each `step()` admits waiting requests into free slots (prefilling them), advances every
active request by one verify round — all their blocks in one batched target pass — and
retires the finished ones. Requests join and leave between rounds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from mlx_spec import MlxSpecError

from .backend import Backend
from .config import LearnConfig
from .errors import APIError
from .metrics import Metrics
from .sequence import Sequence

log = logging.getLogger("mlx_spec.server")


class Scheduler:
    def __init__(self, backend: Backend, metrics: Metrics, max_active: int, max_queue: int, retry_after: int,
                 learn: LearnConfig = LearnConfig()):
        self.backend, self.metrics, self.learn = backend, metrics, learn
        self.recorder = self.idle = None  # --learn's history store, --adapt-when-idle's job (set once loaded)
        self.last_active = time.monotonic()
        self.max_active, self.max_queue, self.retry_after = max_active, max_queue, retry_after
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.closed = False  # no new requests (shutting down)
        self.ready = threading.Event()
        self.load_error: Exception | None = None

    # -- called from the HTTP side --------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        with self._lock:
            if self.closed:
                raise APIError(503, "the server is shutting down", code="shutting_down",
                               headers={"Retry-After": str(self.retry_after)})
            if len(self.waiting) >= self.max_queue + self.max_active - len(self.running):
                raise APIError(429, f"the server is busy: {len(self.running)} requests running, "
                               f"{len(self.waiting)} waiting", code="queue_full",
                               headers={"Retry-After": str(self.retry_after)})
            self.waiting.append(seq)
            self.last_active = time.monotonic()
            self._lock.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mlx-spec-worker", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self.closed = True

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel whatever is left and end the worker thread."""
        with self._lock:
            self.closed = self._stopping = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the worker thread ----------------------------------------------------------------------

    def _run(self) -> None:
        if self._load():
            self._serve()

    def _load(self) -> bool:
        try:
            self.backend.load()
            self._calibrate_batches()
            self.metrics.model = self.backend.info.id
            self._start_learning()
            return True
        except Exception as e:  # reported by /health and the CLI
            self.load_error = e
            log.error("cannot load the model: %s", e)
            return False
        finally:
            self.ready.set()

    def _calibrate_batches(self) -> None:
        """Batched rounds plan their draft lengths from what a batched pass costs here (batch_plan.plan_batch):
        measured once for up to --max-active rows while loading, then cached with the cost curve."""
        model, cfg = self.backend.model, self.backend.cfg
        if model.drafter is not None and cfg.block_size is None and self.max_active > 1:
            from mlx_spec.calibrate import calibrated_curve

            calibrated_curve(model, model.drafter.block_size, batch_rows=self.max_active)

    def _start_learning(self) -> None:
        from mlx_spec.history import History, target_key

        if not (self.learn.record or self.learn.adapt_when_idle):
            return
        key = target_key(self.backend.cfg.target, self.backend.model.target_path)
        history = History.for_target(key, self.learn.cap_bytes)
        self.recorder = history if self.learn.record else None
        if self.learn.adapt_when_idle and self.backend.model.drafter_path is not None:
            from .idle import IdleAdapter

            self.idle = IdleAdapter(self.backend, history, key, self.learn.adapt_when_idle, self.learn.min_new_records)

    def _serve(self) -> None:
        while self._wait_for_work():
            if not (self.waiting or self.running):  # idle: one unit of background adaptation
                self.idle.unit()
                continue
            try:
                self.step()
            except Exception as e:  # a bug must not wedge the server: fail the active requests, keep serving
                log.exception("scheduler step failed")
                with self._lock:
                    failed, self.running = self.running, []
                self._abandon(failed, e)
        with self._lock:
            left, self.running, self.waiting = [*self.running, *self.waiting], [], deque()
        self._abandon(left, APIError(503, "the server shut down", code="shutting_down"))

    def _wait_for_work(self) -> bool:
        """Until there is a request, the server stops, or idle work is due (then with nothing to serve)."""
        with self._lock:
            while not (self.waiting or self.running or self._stopping):
                if self.idle is None:
                    self._lock.wait()
                    continue
                due = self.idle.due_in(time.monotonic() - self.last_active)
                if due <= 0:
                    break
                self._lock.wait(min(due, 3600.0))  # due is infinite once idle adaptation is off
            return not self._stopping

    def step(self) -> None:
        self._admit()
        self._advance_all()
        self._retire()
        self.metrics.set_load(len(self.running), len(self.waiting))

    def _admit(self) -> None:
        with self._lock:
            for seq in [s for s in self.waiting if s.cancelled or self._expired(s)]:
                self.waiting.remove(seq)
            while self.waiting and len(self.running) < self.max_active:
                seq = self.waiting.popleft()
                seq.started = time.monotonic()
                self.running.append(seq)
        for seq in self.running:
            if seq.gen is None and not seq.finished:
                self._start(seq)

    def _start(self, seq: Sequence) -> None:
        self._guarded([seq], lambda: self.backend.start(seq), "cannot start a request")

    def _advance_all(self) -> None:
        live = []
        for seq in self.running:
            if seq.finished:
                continue
            if seq.cancelled:
                seq.finish("abort")
            elif time.monotonic() > seq.deadline:
                seq.finish("length", timed_out=True)  # like llama.cpp's t_max_predict_ms: a limit, not a failure
            elif seq.prefilling is not None:
                self._prefill(seq)  # a long prompt advances a chunk per step: the others keep decoding
            else:
                live.append(seq)
        if live:
            self._advance(live)

    def _prefill(self, seq: Sequence) -> None:
        self._guarded([seq], lambda: self.backend.prefill_step(seq), "prefill failed")

    def _advance(self, seqs: list[Sequence]) -> None:
        self._guarded(seqs, lambda: self.backend.step(seqs), "generation failed")

    def _guarded(self, seqs: list[Sequence], work, what: str) -> None:
        """Run model work; a user error fails these requests with a 400, anything else with a 500."""
        try:
            work()
        except MlxSpecError as e:
            for seq in seqs:
                seq.finish("error", APIError(400, str(e)))
        except Exception as e:
            log.exception(what)
            for seq in seqs:
                seq.finish("error", e)

    def _retire(self) -> None:
        done = [s for s in self.running if s.finished]
        if not done:
            return
        with self._lock:
            self.running = [s for s in self.running if not s.finished]
        self.last_active = time.monotonic()
        for seq in done:
            self._record(seq)
            self.backend.stop(seq, reusable=seq.finish_reason != "error")
            self.metrics.record(seq)

    def _record(self, seq: Sequence) -> None:
        """--learn: what the target committed for this request (a failed one is not kept)."""
        if self.recorder is None or seq.finish_reason == "error" or not seq.tokens:
            return
        try:
            self.recorder.record_generation(seq.job.ids, seq.tokens, seq.stats if self.backend.info.speculative else None)
        except OSError as e:  # a full disk must not fail the request
            log.warning("cannot record to the history: %s", e)

    def _expired(self, seq: Sequence) -> bool:
        """A request still waiting at its deadline gets 503: nothing was generated, so a retry is cheap."""
        if time.monotonic() <= seq.deadline:
            return False
        seq.finish("error", APIError(503, "timed out waiting for a free slot", code="queue_timeout",
                                     headers={"Retry-After": str(self.retry_after)}))
        return True

    def _abandon(self, seqs: list[Sequence], error: Exception) -> None:
        for seq in seqs:
            if not seq.finished:
                seq.finish("error", error)
            try:
                self.backend.stop(seq, reusable=False)
            except Exception:
                log.exception("cannot release a request")
