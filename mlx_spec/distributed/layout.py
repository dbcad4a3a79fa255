"""Which decoder layers each rank runs: a pipeline split by layers.

Rank 0 runs the last layers (and the LM head and the drafter, so the rank that decides and the one
that listens are the same), rank size-1 the first ones: mlx-lm's own pipeline convention
(`mlx_lm.models.pipeline.PipelineMixin`), so the same split serves both.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import MlxSpecError


@dataclass(frozen=True)
class Layout:
    num_layers: int
    size: int
    rank: int
    split: tuple[int, ...] = ()  # layers per rank; () = even, the low ranks get the extra ones

    def __post_init__(self):
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise MlxSpecError(f"rank {self.rank} is not in a group of {self.size}")
        if self.num_layers < self.size:
            raise MlxSpecError(f"cannot split {self.num_layers} layers over {self.size} ranks (at least one each)")
        if not self.split:
            base, extra = divmod(self.num_layers, self.size)
            object.__setattr__(self, "split", tuple(base + (r < extra) for r in range(self.size)))
        if len(self.split) != self.size or any(s < 1 for s in self.split) or sum(self.split) != self.num_layers:
            raise MlxSpecError(f"split {list(self.split)} must give each of {self.size} ranks at least one layer, "
                               f"{self.num_layers} in all")

    def bounds(self, rank: int) -> tuple[int, int]:
        start = sum(self.split[rank + 1 :])
        return start, start + self.split[rank]

    @property
    def start(self) -> int:
        return self.bounds(self.rank)[0]

    @property
    def end(self) -> int:
        return self.bounds(self.rank)[1]

    @property
    def is_last(self) -> bool:
        """The last stage: the LM head, the decision, the drafter."""
        return self.rank == 0

    @property
    def is_first(self) -> bool:
        """The first stage: the embedding feeds its first layer."""
        return self.rank == self.size - 1

    @property
    def source(self) -> int | None:
        """The rank whose activations this stage receives."""
        return None if self.is_first else self.rank + 1

    @property
    def dest(self) -> int | None:
        """The rank this stage sends its activations to."""
        return None if self.is_last else self.rank - 1
