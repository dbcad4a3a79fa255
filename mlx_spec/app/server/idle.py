"""--adapt-when-idle: `mlx-spec adapt` in the server's worker thread while no request is in.

The worker runs one unit of the adaptation (a training step or one evaluation prompt) at a
time, only when nothing is waiting or running and the last request is `after_s` old; a
request that arrives waits at most one unit. Serving is never changed: the adaptation
trains a private copy of the drafter, and an accepted version is installed for the next
start (speculation is lossless whatever the drafter, so outputs would not change anyway).
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("mlx_spec.server")


class IdleAdapter:
    def __init__(self, backend, history, key: str, after_s: float, min_new: int, cfg=None):
        from mlx_spec.train.adapt import AdaptConfig

        self.backend, self.history, self.key = backend, history, key
        self.after_s, self.min_new, self.cfg = after_s, min_new, cfg or AdaptConfig()
        self.job = self.units = None
        self.checked_at = float("-inf")
        self.trained_on = _last_count(key)  # history records the last adaptation (of any process) started with
        self.seen_size = -1  # the history's size at the last look
        self.results: list[dict] = []

    def due_in(self, idle_for: float) -> float:
        """Seconds until the next unit should run (<= 0: now), given how long the server has been idle."""
        wait = self.after_s - idle_for
        if self.units is None:  # look for new history at most once per idle period
            wait = max(wait, self.after_s - (time.monotonic() - self.checked_at))
        return wait

    def unit(self) -> None:
        """Run one unit of work; start an adaptation when enough new traffic was recorded."""
        from mlx_spec import adapters
        from mlx_spec.train.adapt import Adaptation

        try:
            if self.units is None:
                self.checked_at = time.monotonic()
                interrupted = (adapters.work_dir(self.key) / "split.json").exists()  # resume it first
                size = self.history.size_bytes()
                if size == self.seen_size and not interrupted:  # nothing new: skip parsing the whole history
                    return
                self.seen_size, count = size, len(self.history.records())
                if count - self.trained_on < self.min_new and not interrupted:
                    return
                base = adapters.current(self.key) or self.backend.model.drafter_path
                self.job = Adaptation(self.backend.model, self.backend.tokenizer, self.key, self.cfg, base, self.history)
                self.units, self.trained_on = self.job.run(), count
                log.info("adapting the drafter in the background on %d recorded requests", count)
            next(self.units)
        except StopIteration:
            r = self.job.result
            self.results.append(r)
            self.job = self.units = None
            log.info("background adaptation: held-out τ %.2f → %.2f, general τ %.2f → %.2f: %s",
                     r["before"]["held_out"]["tau"], r["after"]["held_out"]["tau"], r["before"]["general"]["tau"],
                     r["after"]["general"]["tau"], f"installed {r['installed']}" if r["accepted"] else r["reason"])
        except Exception:  # never take the server down for a background job
            log.exception("background adaptation failed; it stays off until restart")
            self.job = self.units = None
            self.after_s = float("inf")


def _last_count(key: str) -> int:
    """So that a restarted server does not adapt again on the history it already adapted on."""
    import json

    from mlx_spec import adapters

    try:
        return int(json.loads((adapters.folder(key) / "last-report.json").read_text()).get("history_records", 0))
    except (OSError, ValueError):
        return 0
