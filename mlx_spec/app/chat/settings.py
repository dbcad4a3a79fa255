"""What `/set` changes: sampling, reply length, block size and display switches, checked on every change."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mlx_spec import SamplingParams
from mlx_spec.errors import MlxSpecError

# /set key -> (field, value kind, help). Sampling keys live on the nested SamplingParams.
SETTABLE = {
    "temp": ("sampling.temperature", "float", "temperature, 0 = greedy"),
    "top_p": ("sampling.top_p", "float", "nucleus sampling, in (0, 1]"),
    "top_k": ("sampling.top_k", "int", "keep the k most likely tokens, 0 = off"),
    "min_p": ("sampling.min_p", "float", "drop tokens below min_p * the top probability"),
    "seed": ("sampling.seed", "int?", "sampling seed, 'none' for a fresh one each reply"),
    "max_tokens": ("max_tokens", "int", "longest reply, in tokens"),
    "block_size": ("block_size", "int?", "tokens per verify round (anchor + drafts); 'default': chosen each round, up to the drafter's"),
    "verbose": ("verbose", "bool", "live view: accepted draft tokens shown apart from target tokens"),
    "markdown": ("markdown", "bool", "style Markdown and code blocks as lines complete"),
}


@dataclass(frozen=True)
class Settings:
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 1024
    block_size: int | None = None  # None: chosen each round from the cost curve, up to the drafter's
    verbose: bool = False
    markdown: bool = True
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        if self.max_tokens < 1:
            raise MlxSpecError("max_tokens must be at least 1")
        if self.block_size is not None and self.block_size < 1:
            raise MlxSpecError("block_size must be at least 1")

    def get(self, key: str):
        owner, _, name = SETTABLE[key][0].rpartition(".")
        return getattr(self.sampling if owner else self, name)

    def with_value(self, key: str, value) -> "Settings":
        """A copy with one /set key changed; raises MlxSpecError with a one-line reason if it is out of range."""
        owner, _, name = SETTABLE[key][0].rpartition(".")
        if owner:
            return replace(self, sampling=replace(self.sampling, **{name: value}))
        return replace(self, **{name: value})

    def describe(self) -> list[tuple[str, str]]:
        return [(key, show(key, self.get(key))) for key in SETTABLE]


def show(key: str, value) -> str:
    if SETTABLE[key][1] == "bool":
        return "on" if value else "off"
    if value is None:
        return "default" if key == "block_size" else "none"
    return str(value)
