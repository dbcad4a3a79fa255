"""The loaded pair as the chat uses it: draft on/off, one prompt cache per mode, plain-speed baseline.

The methods that run or change the model (reply, set_drafting, measure_baseline, forget_caches)
are called on the chat's worker thread only.
"""

from __future__ import annotations

from typing import Iterator

import mlx_spec
from mlx_spec import GenerationResponse, MlxSpecError, make_generation, make_prompt_cache, step_all, stream_generate

from .settings import Settings
from .worker import TICK

BASELINE_PROMPT = "def main():\n"  # plain text, so a chat model does not end its reply at once


class Session:
    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.drafter = model.drafter
        self.speculative = self.drafter is not None  # /draft off: plain decoding, same model
        self.caches: dict[bool, object] = {}  # speculative? -> PromptCache (only a speculative one feeds the drafter)
        self.baseline_tps: float | None = None  # measured plain decoding speed, tokens/s

    def set_drafting(self, on: bool) -> None:
        if on and self.drafter is None:
            raise MlxSpecError("no drafter is loaded (start with --drafter PATH)")
        self.speculative = on

    def check_block_size(self, n: int | None) -> None:
        mlx_spec.check_block_size(self.model, n)

    def block_label(self, settings: Settings) -> str:
        """The block size in use: fixed, or chosen each round from the cost curve (the default)."""
        if settings.block_size is not None or self.drafter is None:
            return f"block size {settings.block_size}"
        return f"block size auto (up to {self.drafter.block_size})"

    def reply(self, messages: list[dict], settings: Settings) -> Iterator[GenerationResponse]:
        cache = self.caches.get(self.speculative)
        if cache is None:
            cache = self.caches[self.speculative] = make_prompt_cache(self.model, self.speculative)
        g = make_generation(self.model, self.tokenizer, messages, settings.max_tokens, sampling=settings.sampling,
                            stop=list(settings.stop), prompt_cache=cache, block_size=settings.block_size,
                            speculative=self.speculative)
        return self._rounds(g)

    def _rounds(self, g) -> Iterator[object]:
        """TICKs between prefill chunks (a Ctrl-C can stop there), then one response per round."""
        for item in g.prefill():
            yield TICK if isinstance(item, int) else item
        while not g.finished:
            yield step_all(self.model, [g])[0]

    def cost_curve(self):
        """This machine's cost curve for the pair (measured once, then cached on disk)."""
        return mlx_spec.cost_curve(self.model) if self.speculative else None

    def forget_caches(self) -> None:
        """After a failure mid-round a cache may be half-updated; the next turn prefills afresh."""
        self.caches.clear()

    def measure_baseline(self, tokens: int) -> float | None:
        """Plain decoding speed on a short prompt, for the speedup estimate; None if too few tokens came."""
        last = None
        for last in stream_generate(self.model, self.tokenizer, BASELINE_PROMPT, tokens, speculative=False):
            pass
        if last is not None and last.generation_tokens >= min(8, tokens):
            self.baseline_tps = last.generation_tps
        return self.baseline_tps

    def note_plain_run(self, tokens: int, tps: float) -> None:
        """A plain-decoding reply is the freshest baseline there is."""
        if tokens >= 8 and tps > 0:
            self.baseline_tps = tps
