"""Cost curves: what a verify pass, a drafter pass and a whole loop round cost on this machine.

Measured once per model (a few seconds) and cached on disk; the draft-length controller
(`controller.py`) chooses from them. Round costs are measured through the real loop, host work
included (ideally a round costs t_verify(k+1) + t_draft(k)).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx


@dataclass
class CostCurve:
    verify: list[float]  # seconds for a target pass over M = 1, 2, ... tokens
    draft: list[float]  # seconds for a drafter pass producing k = 1, 2, ... drafts (index k-1)
    rounds: list[float] = field(default_factory=list)  # seconds for a whole loop round with k = 0, 1, ... drafts

    @property
    def max_drafts(self) -> int:
        return min(len(self.verify) - 1, len(self.draft))

    def pass_time(self, k: int) -> float:
        """The ideal round: one target pass over k + 1 tokens and one drafter pass, nothing else."""
        return self.verify[k] + (self.draft[k - 1] if k else 0.0)

    def round_time(self, k: int) -> float:
        return self.rounds[k] if k < len(self.rounds) else self.pass_time(k)

    def ratios(self) -> list[float]:
        return [t / self.verify[0] for t in self.verify]

    def round_ratios(self) -> list[float]:
        """Measured round cost with k = 0, 1, ... drafts, in plain decoding steps."""
        return [t / self.rounds[0] for t in self.rounds]


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def measure_curve(model, max_width: int, context: int = 256, repeats: int = 9) -> CostCurve:
    """Time the target over M = 1..max_width new tokens after `context` cached ones, the drafter,
    and whole loop rounds with k = 0..max_width-1 drafts."""
    from .engine.cache import PromptCache, trim
    from .engine.sampling import Sampler, SamplingParams

    vocab = model.vocab_size
    ids = [(i * 7919) % vocab for i in range(context)]
    pc = PromptCache(model.model, model.drafter)
    logits, hidden = model.target(mx.array([ids]), pc.cache)
    pc.add(ids, hidden)
    mx.eval(logits)

    def verify(m):
        def run():
            out, h = model.target(mx.array([ids[:m]]), pc.cache)
            mx.eval(out, h) if h is not None else mx.eval(out)
            trim(pc.cache, m)
        return run

    curve = CostCurve([_timed(verify(m), repeats) for m in range(1, max_width + 1)], [])
    greedy = Sampler(SamplingParams(), vocab)
    if model.drafter is not None:
        for k in range(1, max_width):
            state = pc.drafter_state()
            propose = lambda: mx.eval(model.drafter.propose(state, ids[-1], k, greedy).tokens)  # noqa: E731
            curve.draft.append(_timed(propose, repeats))
    curve.rounds = measure_rounds(model, pc, greedy, max_width - 1 if model.drafter is not None else 0, repeats)
    return CostCurve(*(monotone(ts) for ts in (curve.verify, curve.draft, curve.rounds)))


def monotone(times: list[float]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators): more tokens never cost less,
    so a dip is timing noise, and a noisy dip would lure the controller."""
    blocks: list[list[float]] = []  # [mean, count]
    for t in times:
        blocks.append([t, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(n)]


def measure_rounds(model, pc, sampler, max_k: int, repeats: int) -> list[float]:
    """Seconds per round of the real loop with k = 0..max_k drafts (k = 0: pipelined plain decoding).

    The widths take turns within each repetition, so a burst of load on the machine hits all of them
    rather than skewing one; each k's time is the median over repetitions."""
    from .engine.loop import DecodeState, FixedLength, settle, step

    base, anchor = len(pc.tokens), pc.tokens[-1]
    times: list[list[float]] = [[] for _ in range(max_k + 1)]
    for rep in range(repeats + 1):  # the first repetition warms up
        for k in range(max_k + 1):
            s = DecodeState(pc, sampler, FixedLength(k), anchor=anchor)
            step(model.target, model.drafter, [s])  # the steady state: running ahead, the drafter fed
            n = 4 if k == 0 else 2
            tic = time.perf_counter()
            for _ in range(n):
                step(model.target, model.drafter, [s])
            if rep:
                times[k].append((time.perf_counter() - tic) / n)
            settle(s)
            pc.truncate(base)
    return [statistics.median(t) for t in times]


def curve_key(model) -> str:
    from mlx.utils import tree_flatten

    dtype = tree_flatten(model.model.parameters())[0][1].dtype
    parts = [str(model.target_path), str(model.drafter_path), json.dumps(model.config.get("quantization")), str(dtype),
             str(mx.default_device()), mx.__version__, platform.machine(), os.environ.get("LD_PRELOAD", ""),
             f"eval_every={model.target.eval_every}", "rounds/2"]  # rounds/2: interleaved round timing
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("MLX_SPEC_CACHE", Path.home() / ".cache" / "mlx-spec"))


def calibrated_curve(model, max_width: int, refresh: bool = False) -> CostCurve:
    """The cost curve for this model on this machine, measured once and cached."""
    path = cache_dir() / "curves" / f"{curve_key(model)}.json"
    if path.exists() and not refresh:
        curve = CostCurve(**json.loads(path.read_text()))
        if len(curve.verify) >= max_width and len(curve.rounds) >= min(max_width, len(curve.draft) + 1):
            return curve
    curve = measure_curve(model, max_width)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(curve)))
    return curve


def cost_curve(model, refresh: bool = False) -> CostCurve | None:
    """The cost curve the draft-length controller uses for this pair on this machine (measured once, in
    a few seconds, then cached on disk); None without a drafter."""
    return calibrated_curve(model, model.drafter.block_size, refresh) if model.drafter is not None else None
