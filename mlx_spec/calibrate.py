"""Cost curves and the draft-length controller: speculate only as far as it pays.

Speed of a round with k drafts is E[tokens | k] / t_round(k), where E[tokens | k] =
1 + sum_j prod_{i<=j} alpha_i and alpha_i is the chance draft i is accepted given the ones
before it were. t_round(k) is measured through the real loop, host work included (ideally
t_verify(k+1) + t_draft(k)); k = 0 is plain decoding. Where verify cost grows steeply with
width (MLX's stock Linux CPU wheel), the controller picks short drafts or none.
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


def expected_tokens(alphas: list[float], k: int) -> float:
    total, survive = 1.0, 1.0
    for a in alphas[:k]:
        survive *= a
        total += survive
    return total


def best_length(curve: CostCurve, alphas: list[float], max_k: int | None = None, margin: float = 0.0) -> int:
    """The draft length with the highest expected tokens per second (0 = plain decoding); drafting must
    beat plain decoding by `margin` (a fraction) to be chosen."""
    top = min(curve.max_drafts, len(alphas), max_k if max_k is not None else 1 << 30)

    def speed(k):
        return expected_tokens(alphas, k) / curve.round_time(k) / (1 + margin if k else 1)

    return max(range(top + 1), key=lambda k: (speed(k), -k))


@dataclass
class AcceptanceMemory:
    """Acceptance estimates that outlive a request, so the next one with this pair starts from them."""

    alphas: list[float] | None = None


class AdaptiveLength:
    """Chooses k each round from the cost curve and running acceptance estimates.

    alpha_i = (hits_i + w * alpha_{i-1}) / (trials_i + w) over the rounds that judged position i,
    with counts decayed each drafting round so the estimate follows the text: a position with little
    data leans on the one before it (acceptance rarely jumps between neighbours), so deeper
    drafts get tried and corrected; while drafting, a position just past the chosen length whose
    evidence has decayed away is drafted too now and then. While speculation is off, a probe round keeps the estimates
    honest: after `probe_every` rounds off, then twice as long each time it finds nothing
    (up to `max_probe_every`), since every probe costs. Where even `hopeful` acceptance at every
    position would not pay (a steep curve), it never probes.
    """

    def __init__(self, curve: CostCurve, max_k: int, prior: float = 0.6, weight: float = 2.0, decay: float = 0.95,
                 probe_every: int = 48, max_probe_every: int = 512, memory: AcceptanceMemory | None = None,
                 hopeful: float = 0.9, margin: float = 0.05, explore_below: float = 0.5):
        self.curve, self.max_k = curve, min(max_k, curve.max_drafts)
        self.explore_below = explore_below  # effective recent trials under which the next position is explored
        self.margin = margin  # the cost model's error: a predicted gain smaller than this is not worth the risk
        self.can_pay = best_length(curve, [hopeful] * self.max_k, self.max_k, margin) > 0
        self._choice: int | None = None  # best_length for the current counts (they change only when drafting)
        self.hits, self.trials = [0.0] * self.max_k, [0.0] * self.max_k
        self.prior, self.weight, self.decay = prior, weight, decay
        self.probe_every, self.max_probe_every, self.interval = probe_every, max_probe_every, probe_every
        self.rounds_off = 0
        self.memory = memory
        if memory is not None and memory.alphas:  # start from the last request's estimates, lightly held
            for i, a in enumerate(memory.alphas[: self.max_k]):
                self.hits[i], self.trials[i] = a * weight, weight

    def estimates(self) -> list[float]:
        alphas, before = [], self.prior
        for h, t in zip(self.hits, self.trials):
            before = (h + self.weight * before) / (t + self.weight)
            alphas.append(before)
        return alphas

    def next(self) -> int:
        if self._choice is None:
            self._choice = best_length(self.curve, self.estimates(), self.max_k, self.margin)
        k = self._choice
        if k:
            self.interval = self.probe_every
            if k < self.max_k and self.trials[k] < self.explore_below:
                k += 1  # little recent evidence one position deeper: draft it too, so a longer block can win
        else:
            self.rounds_off += 1
            if self.rounds_off >= self.interval and self.max_k and self.can_pay:
                self.rounds_off, k = 0, 1
                self.interval = min(2 * self.interval, self.max_probe_every)
        return k

    def update(self, drafted: int, accepted: int) -> None:
        if not drafted:  # a plain round tells nothing about acceptance: keep the estimates as they are
            return
        judged = min(drafted, accepted + 1)  # positions that were actually verified
        self._choice = None
        self.hits = [h * self.decay for h in self.hits]
        self.trials = [t * self.decay for t in self.trials]
        for i in range(judged):
            self.trials[i] += 1
            self.hits[i] += i < accepted
        if self.memory is not None and judged:
            self.memory.alphas = self.estimates()


# ----------------------------------------------------------------------------- measuring


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def measure_curve(model, max_width: int, context: int = 256, repeats: int = 5) -> CostCurve:
    """Time the target over M = 1..max_width new tokens after `context` cached ones, the drafter,
    and whole loop rounds with k = 0..max_width-1 drafts."""
    from .engine.cache import PromptCache, trim
    from .engine.sampling import Sampler, SamplingParams

    vocab = int(model.config.get("vocab_size", 1000))
    ids = [(i * 7919) % vocab for i in range(context)]
    pc = PromptCache(model.model, model.drafter)
    logits, hidden = model.target(mx.array([ids]), pc.target)
    pc.add(ids, hidden)
    mx.eval(logits)

    def verify(m):
        def run():
            out, h = model.target(mx.array([ids[:m]]), pc.target)
            mx.eval(out, h) if h is not None else mx.eval(out)
            trim(pc.target, m)
        return run

    curve = CostCurve([_timed(verify(m), repeats) for m in range(1, max_width + 1)], [])
    greedy = Sampler(SamplingParams(), vocab)
    if model.drafter is not None:
        for k in range(1, max_width):
            propose = lambda: mx.eval(model.drafter.propose(pc.drafter_state(), ids[-1], k, greedy).tokens)  # noqa: E731
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
    """Seconds per round of the real loop with k = 0..max_k drafts (k = 0: pipelined plain decoding)."""
    from .engine.loop import DecodeState, FixedLength, settle, step

    base, anchor = len(pc.tokens), pc.tokens[-1]
    out = []
    for k in range(max_k + 1):
        s = DecodeState(pc, sampler, FixedLength(k), anchor=anchor)
        run = lambda: step(model.target, model.drafter, [s])  # noqa: E731
        if k == 0:  # consecutive plain rounds overlap: time a run of them
            run()
            tic = time.perf_counter()
            for _ in range(2 * repeats):
                run()
            out.append((time.perf_counter() - tic) / (2 * repeats))
        else:
            out.append(_timed(run, repeats))
        settle(s)
        pc.truncate(base)
    return out


def curve_key(model) -> str:
    from mlx.utils import tree_flatten

    dtype = tree_flatten(model.model.parameters())[0][1].dtype
    parts = [str(model.target_path), str(model.drafter_path), json.dumps(model.config.get("quantization")), str(dtype),
             str(mx.default_device()), mx.__version__, platform.machine(), os.environ.get("LD_PRELOAD", ""),
             f"eval_every={model.target.eval_every}"]
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
