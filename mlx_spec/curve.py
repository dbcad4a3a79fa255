"""The cost curve: what a verify pass, a drafter pass and a loop round cost on this machine, and the
costs between and beyond the measured points (more rows, longer contexts). `calibrate.py` measures it;
the draft-length controller (`controller.py`) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CostCurve:
    verify: list[float]  # seconds for a target pass over M = 1, 2, ... tokens
    draft: list[float]  # seconds for a drafter pass producing k = 1, 2, ... drafts (index k-1)
    rounds: list[float] = field(default_factory=list)  # seconds for a whole loop round with k = 0, 1, ... drafts
    # [rows, width, seconds]: a batched round less its drafter pass (the target's pass and the host's work)
    batch: list[list[float]] = field(default_factory=list)
    draft_batch: list[list[float]] = field(default_factory=list)  # [rows, k, seconds]: one drafter pass for rows
    batch_context: int = 64  # cached tokens in every row behind `batch` and `draft_batch`
    long_batch: list[list[float]] = field(default_factory=list)  # `batch` again (fewer widths) after...
    long_draft_batch: list[list[float]] = field(default_factory=list)  # ...and `draft_batch`...
    long_batch_context: int = 0  # ...this many cached tokens in every row
    context: int = 256  # cached tokens behind `verify`, `draft` and `rounds`
    long_rounds: list[float] = field(default_factory=list)  # `rounds` again, after `long_context` cached tokens
    long_context: int = 0
    # the most cached rows each attention layer (the target's, and a drafter's over the context) reads
    # (0: all of them; recurrent layers, whose state does not grow, are left out); None: not known
    spans: list[int] | None = None
    # the block sizes the drafter learnt, smallest first (drafts past the smallest run a bigger block)
    blocks: list[int] = field(default_factory=list)

    @property
    def max_drafts(self) -> int:
        return min(len(self.verify) - 1, len(self.draft))

    def __setattr__(self, name, value):
        self.__dict__.pop("_memo", None)  # costs remembered from the old values
        super().__setattr__(name, value)

    def block_steps(self, k: int) -> int:
        """How many of the drafter's blocks k drafts outgrow (0: they fit its smallest). A bigger block is
        a step the controllers take only where it pays by their margin again: past 8 drafts the 16-row
        drafter's rounds lost to 8-draft ones wherever measured here (4 code rows 2.03-2.07x of plain
        at 12-16 wide, 2.26x at 8; a 1,524-token file 1.46x against 1.87x), and the cost model, priced
        within ~10% and leaning on deep positions it rarely tries, planned them in a batch anyway."""
        return sum(b <= k for b in self.blocks)

    def pass_time(self, k: int) -> float:
        """The ideal round: one target pass over k + 1 tokens and one drafter pass, nothing else."""
        return self.verify[k] + (self.draft[k - 1] if k else 0.0)

    def round_time(self, k: int, context: int | None = None) -> float:
        """Seconds of a loop round with k drafts; after `context` cached tokens, the growth from `context`
        to `long_context` carried on in proportion to the cached rows attention reads (every token of
        the block reads them all, so a wide round grows fastest: at 800 tokens a narrower block can
        win). A sliding-window layer stops growing at its window; a recurrent one never grows."""
        t = self.rounds[k] if k < len(self.rounds) else self.pass_time(k)
        return t + self.per_row(k) * self.extra_rows(context) if context else t

    def extra_rows(self, context: int) -> int:
        """Cached rows the attention layers read in all, per query, after `context` tokens beyond what
        they read at the curve's own context (0 at or below it)."""
        if context <= self.context:
            return 0
        return self._rows_read(context) - self._measured_rows()[0]

    def per_row(self, k: int) -> float:
        """Seconds a round with k drafts grows per extra row read (0: no growth measured)."""
        if self.long_context <= self.context or k >= len(self.long_rounds) or k >= len(self.rounds):
            return 0.0
        measured = self._measured_rows()[1]
        return max(0.0, self.long_rounds[k] - self.rounds[k]) / measured if measured > 0 else 0.0

    def _measured_rows(self) -> tuple[int, int]:
        """(rows read at `context`, extra rows read at `long_context`), remembered until a field is set
        again: every round's timing asks."""
        memo = self.__dict__.setdefault("_memo", {})
        if "rows" not in memo:
            base = self._rows_read(self.context)
            memo["rows"] = (base, self._rows_read(self.long_context) - base)
        return memo["rows"]

    def _rows_read(self, context: int) -> int:
        if self.spans is None:  # not known: every layer reads the whole context
            return context
        return sum(min(context, s) if s else context for s in self.spans)

    def batch_time(self, rows: int, width: int, context: int = 0) -> float:
        """Seconds of one target pass over `rows` blocks of `width` tokens each, with the round's host work,
        after `context` cached tokens in the longest row (a batch's rows are padded to it): the measured
        batched rounds (less their drafter passes), interpolated in width and rows, and their growth with
        the context; without them, one row of rows * width tokens, each row growing as one request's rounds do."""
        if rows > 1 and self.batch and self.long_batch:
            t, growth = self._at("batch", rows, width)
            return t + growth * max(0, context - self.batch_context)
        t = self._at("batch", rows, width)[0] if rows > 1 and self.batch else _along(self.verify, rows * width)
        return t + rows * self.per_row(width - 1) * self.extra_rows(context)

    def draft_time(self, rows: int, k: int, context: int = 0) -> float:
        """Seconds to draft k tokens for each of `rows` requests after `context` cached tokens (the longest
        row's): one batched drafter pass where those were measured (a drafter that batches), else one
        pass per request (whose growth with the context the rounds' carries)."""
        if rows <= 1 or not self.draft_batch:
            return rows * self.draft[min(k, len(self.draft)) - 1] if rows and k else 0.0
        t, growth = self._at("draft", rows, k)
        return t + growth * max(0, context - self.batch_context)

    def _at(self, name: str, rows: int, x: int) -> tuple[float, float]:
        """(seconds, growth per cached token a row) of a batched pass ("batch": the target's, x = width;
        "draft": the drafter's, x = drafts), remembered per (rows, x) until a field is set again: the
        controller asks for the same costs many times a round."""
        memo = self.__dict__.setdefault("_memo", {})
        if name not in memo:
            memo[name] = (self._ladders(name), {})
        (times, growth), seen = memo[name]
        if (rows, x) not in seen:
            seen[(rows, x)] = (_grid(times, rows, x), max(0.0, _grid(growth, rows, x)) if growth else 0.0)
        return seen[(rows, x)]

    def _ladders(self, name: str) -> tuple[dict, dict]:
        """{rows: {x: seconds}} of the measured passes (one row: the one-request times), and {rows: {x:
        seconds per cached token a row}} of their growth to `long_batch_context` (none at 0 rows; a long
        measurement that came out cheaper, noise, adds nothing). Attention reads every cached row, so
        the growth carries on in proportion; a drafter reading a window shows less of it."""
        short, long, one_row = ((self.batch, self.long_batch, self.verify) if name == "batch"
                                else (self.draft_batch, self.long_draft_batch, self.draft))
        times: dict[int, dict[int, float]] = {1: {i: t for i, t in enumerate(one_row, 1)}}
        for b, w, t in short:
            times.setdefault(int(b), {})[int(w)] = t
        span = self.long_batch_context - self.batch_context
        growth: dict[int, dict[int, float]] = {}
        for b, w, t in long if span > 0 else ():
            if int(w) in times.get(int(b), {}):
                growth.setdefault(int(b), {})[int(w)] = max(0.0, t - times[int(b)][int(w)]) / span
        if growth:
            growth[0] = {w: 0.0 for points in growth.values() for w in points}
        return times, growth

    def ratios(self) -> list[float]:
        return [t / self.verify[0] for t in self.verify]

    def round_ratios(self) -> list[float]:
        """Measured round cost with k = 0, 1, ... drafts, in plain decoding steps."""
        return [t / self.rounds[0] for t in self.rounds]


def _grid(ladder: dict[int, dict[int, float]], rows: int, x: int) -> float:
    """Seconds at (rows, x) from {rows: {x: seconds}}: interpolated in x within a row count, then in
    rows; extrapolated past the most rows measured."""
    known = sorted(ladder)
    lo = max([b for b in known if b <= rows], default=known[0])
    hi = min([b for b in known if b > rows], default=None)
    if hi is None:  # past the widest measured batch: extrapolate from the last two
        lo, hi = (known[-2], known[-1]) if len(known) > 1 else (known[-1], known[-1])
    t_lo, t_hi = _interp(ladder[lo], x), _interp(ladder[hi], x)
    return t_lo if hi == lo else t_lo + (t_hi - t_lo) * (rows - lo) / (hi - lo)


def _along(times: list[float], n: int) -> float:
    """times[n-1], extrapolated linearly past the end."""
    if n <= len(times):
        return times[n - 1]
    slope = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else times[-1]
    return times[-1] + slope * (n - len(times))


def _interp(points: dict[int, float], x: int) -> float:
    xs = sorted(points)
    if x in points:
        return points[x]
    below, above = [v for v in xs if v < x], [v for v in xs if v > x]
    if below and above:
        a, b = below[-1], above[0]
    else:  # outside: the nearest two
        a, b = (xs[-2], xs[-1]) if below else (xs[0], xs[1]) if len(xs) > 1 else (xs[0], xs[0])
    if a == b:
        return points[a]
    return points[a] + (points[b] - points[a]) * (x - a) / (b - a)
