"""Sampling settings (no MLX import: the CLI's argument parsing and the apps' settings build them
before the re-exec that preloads an optimized BLAS)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import MlxSpecError


# Edge values that float32 cannot carry through the distribution (as vLLM treats them):
# logits / temperature overflows, and top_p * mass underflows to 0 and keeps no token at all.
GREEDY_BELOW = 1e-5  # a temperature under this is greedy decoding
MIN_TOP_P = 1e-6  # a smaller top_p keeps the same single most likely token


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    penalty_context: int = 20
    logit_bias: dict[int, float] | None = field(default=None, hash=False)
    seed: int | None = None

    def __post_init__(self):
        checks = [
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k >= 0, "top_k must be >= 0"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (self.repetition_penalty is None or self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (self.penalty_context >= 1, "penalty_context must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise MlxSpecError(message)
