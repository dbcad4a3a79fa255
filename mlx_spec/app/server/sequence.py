"""One request's life inside the scheduler: what to generate, how far it got, and where output goes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from mlx_spec import GenerationResponse, SamplingParams, SpecStats


@dataclass(frozen=True)
class Job:
    """What the HTTP side asks for, already tokenized and validated."""

    ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    partition: tuple = ()  # whose idle prefix caches it may reuse (API key, client cache key)
    kind: str = "chat"  # or "raw" (/v1/completions): each kind starts from its own acceptance estimates


@dataclass
class Output:
    """A piece of output sent to the HTTP side: new text, and on the last one the finish and totals."""

    text: str = ""
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    error: Exception | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    spec: SpecStats | None = None
    timed_out: bool = False
    stop_string: str | None = None  # the stop string that ended the reply, if one did


class Sequence:
    """State the worker thread keeps per request. Only `cancel()` is called from other threads."""

    def __init__(self, job: Job, deliver: Callable[[Output], None], timeout: float):
        self.job, self.deliver = job, deliver
        self.submitted = time.monotonic()
        self.deadline = self.submitted + timeout
        self.started: float | None = None
        self.first_token: float | None = None
        self.gen = None  # the library's Generation, set on admission
        self.prefilling = None  # its prefill, advanced one chunk per scheduler step
        self.cache = None
        self.stats = SpecStats()
        self.rounds = 0
        self.completion_tokens = self.cached_tokens = 0
        self.tokens: list[int] = []  # the output token ids (kept for --learn)
        self.cancelled = False
        self.finish_reason: str | None = None
        self.stop_string: str | None = None
        self.timed_out = False

    def cancel(self) -> None:
        self.cancelled = True  # a plain flag: the worker reads it between rounds

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def on_round(self, r: GenerationResponse) -> None:
        if self.rounds:
            self.stats.add(r)  # the library counts verify rounds only, not the prefill's first token
        else:
            self.first_token, self.cached_tokens = time.monotonic(), r.cached_tokens
        self.rounds += 1
        self.completion_tokens = r.generation_tokens
        self.tokens += r.tokens
        if r.finish_reason is not None:
            self.finish_reason, self.stop_string = r.finish_reason, r.stop_string
        self.deliver(self._output(r.text, r.finish_reason))

    def finish(self, reason: str, error: Exception | None = None, timed_out: bool = False) -> None:
        """End early: timeout ("length"), client gone ("abort"), failure ("error")."""
        self.finish_reason, self.timed_out = reason, timed_out
        out = self._output("", reason)
        out.error = error
        self.deliver(out)

    def _output(self, text: str, finish: str | None) -> Output:
        if finish is None:
            return Output(text)
        return Output(text, finish, None, len(self.job.ids), self.completion_tokens, self.cached_tokens,
                      self.stats, self.timed_out, self.stop_string)
