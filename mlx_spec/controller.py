"""The draft-length controller: speculate only as far as it pays.

Speed of a round with k drafts is E[tokens | k] / t_round(k), where E[tokens | k] =
1 + sum_j prod_{i<=j} alpha_i and alpha_i is the chance draft i is accepted given the ones
before it were. t_round(k) is the calibrated round cost, rescaled by what rounds really take
in this run; k = 0 is plain decoding. Where verify cost grows steeply with width (MLX's stock
Linux CPU wheel), the controller picks short drafts or none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .curve import CostCurve


def expected_tokens(alphas: list[float], k: int) -> float:
    total, survive = 1.0, 1.0
    for a in alphas[:k]:
        survive *= a
        total += survive
    return total


def best_length(curve: CostCurve, alphas: list[float], max_k: int | None = None, margin: float = 0.0,
                cost: Callable[[int], float] | None = None) -> int:
    """The draft length with the highest expected tokens per second (0 = plain decoding); drafting must
    beat plain decoding by `margin` (a fraction) to be chosen. `cost(k)`: round time (default: the curve's)."""
    top = min(curve.max_drafts, len(alphas), max_k if max_k is not None else 1 << 30)
    cost = cost or curve.round_time

    def speed(k):  # (a bigger drafter block is one more step to pay for: `CostCurve.block_steps`)
        return expected_tokens(alphas, k) / cost(k) / (1 + margin) ** ((k > 0) + curve.block_steps(k))

    return max(range(top + 1), key=lambda k: (speed(k), -k))


@dataclass(frozen=True)
class ControllerConfig:
    prior: float = 0.6  # acceptance assumed before any evidence
    weight: float = 2.0  # pseudo-trials behind the prior (and behind a remembered estimate)
    decay: float = 0.95  # per drafting round: the estimates follow the text
    probe_every: int = 16  # plain rounds before a probe; doubles while probes find nothing...
    first_probe: int = 4  # ...but a request that starts off (its predecessor's estimates) probes this soon
    fresh_probes: int = 2  # (batched: and as often again, until it has this many drafting rounds of its own)
    max_probe_every: int = 512  # ...up to this
    probe_share: float = 0.01  # batched: the batch probes as often as costs this share of plain throughput
    hopeful: float = 0.9  # no probes where even this acceptance at every position would not pay
    margin: float = 0.05  # drafting must beat plain by this: the cost model's error
    explore_below: float = 1.0  # recent trials under which the position past the chosen length is drafted too
    # a position with little evidence leans on the one before it, lifted this far toward 1: past a few
    # accepted drafts the text is easy, so acceptance rises with depth (flat: deep drafts never get tried)
    lift: float = 0.25
    follow: float = 0.1  # how fast the cost scales follow measured rounds
    recontext: int = 32  # the context grew this many tokens since the last choice: choose again
    remember: int = 8  # the memory's estimates are the mean of this many recent requests' (`ControllerMemory`)
    # once some position has this many trials (decayed), a position leans lifted only on one that has them too:
    # a guess lifted on a guess compounded, and a 16-row drafter's unreached positions past 10 read 0.85-0.94
    evidence: float = 2.0
    # prompts this long remember their estimates apart from short ones of their kind: the drafter accepts less
    # deep into a long context, and 792-token chats after short ones drafted 8 deep where 5 paid
    long_prompt: int = 512


@dataclass
class ControllerMemory:
    """What requests learnt that the next one with this pair starts from."""

    alphas: list[float] | None = None  # acceptance estimates per draft position: recent requests' mean
    # the same per kind of request ("chat", "raw"): chat answers and raw continuations accept so differently
    # that code requests after raw ones, starting from raw's estimates, stayed plain until probes lifted them
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    # the same for drafts from sources other than the model drafter (prompt lookup's), by source, then kind: on
    # raw text lookup's long accepted runs, handed on as the model's, had the next request's model drafting
    # 15 a round where it had 2 accepted
    by_source: dict[str, dict[str | None, list[float]]] = field(default_factory=dict)
    # the latest estimates of each of the last few requests (by source and kind; kind None: every kind), whose
    # mean those are:
    # at 8 rows of raw completions, the last request's alone was often one row's lucky run (7 of 7 accepted),
    # and 8 new rows starting from it drafted 7 tokens each for 12 tokens, 3 plain rounds' cost
    recent: dict = field(default_factory=dict)
    enrolled: int = 0  # requests that started from this memory: each one's number keys its entry in `recent`
    cost_scale: list[float] = field(default_factory=lambda: [1.0, 1.0])  # plain, drafting: real / calibrated
    batch_scale: list[float] = field(default_factory=lambda: [1.0, 1.0])  # the same for batched rounds
    batch_tick: tuple | None = None  # (time, its requests, drafting, predicted seconds) of the last batched round
    batch_off: int = 0  # batched rounds in a row where nobody drafted (see `plan_batch`'s probes)
    interruptions: int = 0  # prompt passes run between rounds so far (`interrupt`)
    batch_yield: float = 1.0  # batched rounds' drafting rows: drafts accepted / expected (`_judge_yield`)

    def interrupt(self) -> None:
        """A prompt's pass ran between two rounds (a request joining a server's batch): the time across it
        is not a round's cost. Counted in, it read drafting rounds at twice their cost at 8 rows of ~800-token
        prompts (a prompt chunk fell under the 4x guard beside a wide round's longer prediction, rarely
        beside a plain one's), and the batch stopped drafting where drafting paid."""
        self.batch_tick = None
        self.interruptions += 1

    def enroll(self) -> int:
        self.enrolled += 1
        return self.enrolled

    def start(self, kind: str | None, source: str | None = None) -> list[float] | None:
        """The estimates a request of this kind starts from for drafts of this source (None: the model's)."""
        if source is None:
            return self.by_kind.get(kind, self.alphas)
        known = self.by_source.get(source, {})
        return known.get(kind, known.get(None))

    def record(self, kind: str | None, request: int, alphas: list[float], remember: int,
               source: str | None = None) -> None:
        """A request's (`request`: its `enroll` number) latest estimates for drafts of `source`: the mean of the
        last `remember` requests' becomes the memory's."""
        for key in {kind, None}:
            recent = self.recent.setdefault((source, key), {})
            recent.pop(request, None)
            recent[request] = alphas  # (the dict keeps the order requests last spoke in)
            while len(recent) > remember:
                recent.pop(next(iter(recent)))
            mean = [sum(a[i] for a in recent.values()) / len(recent) for i in range(min(map(len, recent.values())))]
            if source is not None:
                self.by_source.setdefault(source, {})[key] = mean
            elif key is None:
                self.alphas = mean
            else:
                self.by_kind[key] = mean


class AdaptiveLength:
    """Chooses k each round from the cost curve and running acceptance estimates.

    alpha_i = (hits_i + w * lean_i) / (trials_i + w) over the rounds that judged position i, with
    counts decayed each drafting round so the estimate follows the text: a position with little
    data leans on the one before it, lifted toward 1 (lean_i = alpha_{i-1} + lift * (1 - alpha_{i-1}):
    past a few accepted drafts the text is easy), so deeper drafts get tried and corrected; while
    drafting, a position just past the chosen length whose evidence has decayed away is drafted too
    now and then. While speculation is off, a probe round
    keeps the estimates honest: after `probe_every` rounds off, then twice as long each time it
    finds nothing (up to `max_probe_every`), since every probe costs. Where even `hopeful`
    acceptance at every position would not pay (a steep curve), it never probes. The knobs are
    in `ControllerConfig`.

    Costs: the time from one round's end to the next (the caller's work included) is compared
    with the curve, and plain and drafting rounds each get a running scale factor, so a curve
    measured at another context length or machine load still ranks k right. Only a round of the
    same kind as the one before counts: the steady state the curve measured (so a probe is two
    k = 1 rounds: the second times drafting, whose cost scale would otherwise go stale while
    speculation is off). A request starting from its predecessor's estimates (another kind of text,
    perhaps) probes after `first_probe` plain rounds. `clock=None` keeps
    the costs as calibrated (draft lengths that depend on acceptance alone).
    """

    def __init__(self, curve: CostCurve, max_k: int, config: ControllerConfig = ControllerConfig(),
                 memory: ControllerMemory | None = None, clock: Callable[[], float] | None = time.perf_counter,
                 kind: str | None = None, prompt_tokens: int = 0):
        self.curve, self.max_k, self.cfg = curve, min(max_k, curve.max_drafts), config
        long = kind is not None and prompt_tokens >= config.long_prompt
        self.memory, self.clock, self.kind = memory, clock, f"{kind}, long" if long else kind
        self.number = memory.enroll() if memory is not None else 0
        start = None if memory is None else memory.start(self.kind)
        # estimates a request of its own kind left: tested already, so no probes of its own (`fresh`)
        self.tested = memory is not None and self.kind is not None and self.kind in memory.by_kind
        self.source, self._sources = None, {}  # the source whose estimates these are; the others' (`_use`)
        self.hits, self.trials = self._started(start)  # from recent requests' estimates (of this kind)
        self.cost_scale = list(memory.cost_scale) if memory is not None else [1.0, 1.0]
        self.can_pay = best_length(curve, [config.hopeful] * self.max_k, self.max_k, config.margin) > 0
        self.interval, self.rounds_off = config.probe_every, 0
        if start:  # recent requests' text may have been another kind of text
            self.rounds_off = max(0, config.probe_every - config.first_probe)
        self._choice: int | None = None  # best_length for the current estimates and costs
        self._scale_chosen = list(self.cost_scale)
        self.context = self._context_chosen = 0  # cached tokens of the round being planned
        self._tick: float | None = None
        self._last_k: int | None = None
        self._interruptions = memory.interruptions if memory is not None else 0
        self._probe_left = 0  # a probe is two k = 1 rounds: the second is steady, so it times drafting too
        self.judged, self.plain_rounds = 0, 0  # drafting rounds of its own; batched rounds plain since the last
        self.expected: float | None = None  # drafts the batch plan expects this round to have accepted
        self.last: tuple[int, float | None] = (0, None)  # the last round's accepted drafts and that expectation

    def estimates(self) -> list[float]:
        alphas, before, w = [], self.cfg.prior, self.cfg.weight
        guessing = max(self.trials, default=0.0) < self.cfg.evidence  # the prior's shape: lifted all the way
        for i, (h, t) in enumerate(zip(self.hits, self.trials)):
            lifted = i and (guessing or self.trials[i - 1] >= self.cfg.evidence)
            lean = before + (1 - before) * self.cfg.lift if lifted else before
            before = (h + w * lean) / (t + w)
            alphas.append(before)
        return alphas

    def round_time(self, k: int) -> float:
        return self.curve.round_time(k, self.context) * self.cost_scale[k > 0]

    def skip_timing(self) -> None:
        """This round is batched: its time is the batch's, not this request's (see `plan_batch`)."""
        self._tick = self._last_k = None

    def interrupt(self) -> None:
        """A prompt's pass runs now, between rounds: no round is timed across it (`ControllerMemory.interrupt`)."""
        self._tick = None
        if self.memory is not None:
            self.memory.interrupt()

    def next(self, context: int = 0) -> int:
        """Drafts for the next round, after `context` cached tokens (longer contexts favour narrower blocks)."""
        if abs(context - self._context_chosen) >= self.cfg.recontext:
            self._choice = None
        self.context = context
        if self._choice is None:
            self._choice = best_length(self.curve, self.estimates(), self.max_k, self.cfg.margin, self.round_time)
            self._scale_chosen, self._context_chosen = list(self.cost_scale), context
        k = self._choice
        if k:
            self.interval = self.cfg.probe_every
            if k < self.max_k and self.trials[k] < self.cfg.explore_below:
                k += 1  # little recent evidence one position deeper: draft it too, so a longer block can win
        elif self._probe_left:
            self._probe_left, k = 0, 1
        else:
            self.rounds_off += 1
            if self.rounds_off >= self.interval and self.max_k and self.can_pay:
                self.rounds_off, k, self._probe_left = 0, 1, 1
                self.interval = min(2 * self.interval, self.cfg.max_probe_every)
        return k

    def probe_in_batch(self) -> bool:
        """Told to run plain in a batched round: True where it should draft one token instead. A new request
        tests the estimates it started from (its predecessors', perhaps another kind of text; or the prior)
        soon, and again as often, until `fresh_probes` drafting rounds of its own back or refute them."""
        self.plain_rounds += 1
        if self.fresh and self.plain_rounds >= self.cfg.first_probe and self.max_k and self.can_pay:
            self.plain_rounds = 0
            return True
        return False

    def join_probe(self) -> bool:
        """The batched pass is wider than one token anyway (another request drafts or probes): a request
        still testing its predecessors' estimates drafts with it, for a drafter row, not a wider pass."""
        if self.fresh and self.max_k and self.can_pay:
            self.plain_rounds = 0
            return True
        return False

    @property
    def fresh(self) -> bool:
        """Still testing the estimates it started from (it has had fewer than `fresh_probes` drafting rounds):
        the prior, or its predecessors' where they were another kind of text. A request of the kind they
        were starts from tested estimates: at 8 rows of raw completions, every new request's own probes
        (a widened pass, the drafter catching up with its prompt, mostly rejected) cost 6% of throughput."""
        return not self.tested and self.judged < self.cfg.fresh_probes

    def update(self, drafted: int, accepted: int, source: str | None = None) -> None:
        self.last, self.expected = (accepted, self.expected), None
        self._time_round(drafted)
        if not drafted:  # a plain round tells nothing about acceptance: keep the estimates as they are
            return
        self._use(source)
        judged = min(drafted, accepted + 1)  # positions that were actually verified
        self._choice, self.judged, self.plain_rounds = None, self.judged + 1, 0
        self.hits = [h * self.cfg.decay for h in self.hits]
        self.trials = [t * self.cfg.decay for t in self.trials]
        for i in range(judged):
            self.trials[i] += 1
            self.hits[i] += i < accepted
        if self.memory is not None:  # the next request's rounds of this source start from it
            self.memory.record(self.kind, self.number, self.estimates(), self.cfg.remember, self.source)

    def expect(self, source: str | None) -> None:
        """The next round will likely draft from `source` (the drafter's guess, engine/cache.py
        `next_source`): plan it from that source's estimates."""
        self._use(source)

    def _use(self, source: str | None) -> None:
        """Estimates per source of drafts (drafters/pick.py: the model drafter's, None, and prompt
        lookup's): each round is planned from the estimates of the source expected to draft it (`expect`)
        and recorded in those of the source that did, since lookup's long accepted runs would otherwise
        have the model drafting long blocks where it is rarely right (and the reverse)."""
        if source == self.source:
            return
        self._sources[self.source] = (self.hits, self.trials)
        if source in self._sources:
            self.hits, self.trials = self._sources.pop(source)
        else:  # this request's first round of it: recent requests' estimates of that source (of this kind)
            remembered = None if self.memory is None else self.memory.start(self.kind, source)
            self.hits, self.trials = self._started(remembered)
        self.source, self._choice = source, None

    def _started(self, start: list[float] | None) -> tuple[list[float], list[float]]:
        """(hits, trials) holding `start`'s estimates lightly (`weight` trials each); none: no evidence."""
        start = (start or [])[: self.max_k]
        pad = [0.0] * (self.max_k - len(start))
        return [a * self.cfg.weight for a in start] + pad, [self.cfg.weight] * len(start) + pad

    def _time_round(self, k: int) -> None:
        if self.clock is None:  # costs as calibrated: the lengths depend on acceptance alone
            return
        now = self.clock()
        last, self._tick = self._tick, now
        if self.memory is not None and self.memory.interruptions != self._interruptions:
            self._interruptions, last = self.memory.interruptions, None  # another request's prompt ran since
        steady = self._last_k is not None and (k > 0) == (self._last_k > 0)
        self._last_k = k
        if last is None or not steady:  # a switch costs extra once: the run-ahead restarts, the drafter catches up
            return
        ratio = (now - last) / self.curve.round_time(k, self.context)
        if not 0.25 < ratio < 4:  # a pause (a prefill, another request's turn) is not this round's cost
            return
        i = int(k > 0)
        self.cost_scale[i] += self.cfg.follow * (ratio - self.cost_scale[i])
        if abs(self.cost_scale[i] / self._scale_chosen[i] - 1) > 0.02:
            self._choice = None
        if self.memory is not None:
            self.memory.cost_scale = list(self.cost_scale)
