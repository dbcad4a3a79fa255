"""One target split across machines (MLX distributed, launched with `mlx.launch`), speculation intact.

Every rank runs the same deterministic loop (SPMD). The target's decoder layers are split into
pipeline stages by rank (`layout.py`); a verify pass runs through every stage once, activations and
tapped hidden states travel stage to stage (`stage.py`); the last stage, on rank 0, computes the
logits and shares them, so every rank takes the same accept/commit decision and trims its caches by
the same amount. The drafter lives on rank 0 and shares its proposals (`drafting.py`). Loading reads
only each rank's own tensors (`load.py`); `session.py` checks the ranks agree and turns a dead peer
or a stalled network into a clear error.
"""

from .layout import Layout
from .session import DistributedError, Session

__all__ = ["Layout", "Session", "DistributedError"]
