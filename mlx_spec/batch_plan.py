"""Draft lengths for a batched round: one verify pass for several requests, planned from the batch's width
and each request's own acceptance (`plan_batch`); the batch's measured rounds rescale its costs and its
drafting rows' accepted drafts temper their estimates. One request alone is `controller.AdaptiveLength`'s.
"""

from __future__ import annotations

from .controller import AdaptiveLength, ControllerMemory, expected_tokens


def plan_batch(states: list, follow: float = 0.1, margin: float = 0.1) -> list[int]:
    """Draft lengths for one batched verify pass, from the batch's width and each request's own acceptance.

    Every block is padded to the widest and every row to the longest context C, so the pass costs
    `curve.batch_time(rows, W, C)` whoever drafts, and the drafting requests share one drafter pass,
    `curve.draft_time(m, W-1, C)`: for each
    width W the m requests with the most expected gain, E[tokens | W-1] - 1, draft W-1 tokens, m
    chosen for the most expected tokens per second, the others run plain in the same pass; the W
    with the most wins, and drafting must beat an all-plain pass by `margin` (drafts that need a bigger
    drafter block, by it again: `CostCurve.block_steps`). Requests with fixed draft lengths (`FixedLength`)
    keep theirs. The batch's measured round times rescale the batch costs (plain and drafting passes
    apart), as `AdaptiveLength` does for one request, and the drafting rows'
    accepted drafts against their estimates temper every estimated gain (`_judge_yield`). A new request
    tests the estimates it started from soon (`AdaptiveLength.probe_in_batch`: one token in the pass),
    and in any pass that is wider than one token anyway (`join_probe`: one widened pass for the batch's
    new requests, not one each). While nobody drafts, every request drafts one token now and then: as
    often as the probes cost `probe_share` of the batch's throughput (a probe that nearly pays every
    `first_probe` rounds, a dear one rarely), since a few unlucky first drafts (an answer's first tokens
    are the hardest) leave estimates that nothing else corrects. (A wait doubling after every probe, as
    before, left 8 rows of raw completions plain for 128 rounds at a time, where a block of 4 paid 1.20x.)
    No probe runs where it could not change the plan: where the requests it tests would not draft even
    at `hopeful` acceptance (`could_pay`).
    Sets and returns each state's `k`.
    """
    adaptive = [s for s in states if isinstance(s.lengths, AdaptiveLength)]
    if not adaptive:
        return [s.k for s in states]
    lead = adaptive[0].lengths
    curve, memory, b = lead.curve, lead.memory, len(states)
    scale = memory.batch_scale if memory is not None else [1.0, 1.0]
    fixed = [s for s in states if not isinstance(s.lengths, AdaptiveLength)]
    floor = 1 + max([s.k for s in fixed], default=0)  # fixed rows set the least width
    caps = {id(s): min(s.lengths.max_k, max(0, s.remaining - 1)) for s in adaptive}
    top = max([floor] + [caps[id(s)] + 1 for s in adaptive])
    gains = {id(s): s.lengths.estimates() for s in adaptive}
    trust = _judge_yield(memory, adaptive, follow) if memory is not None else 1.0
    fixed_tokens = sum(1 + 0.5 * s.k for s in fixed)  # their yield does not depend on W
    fixed_drafting = sum(1 for s in fixed if s.k)  # they share the drafter pass too
    context = max(_context(s) for s in states)  # rows are padded to the longest

    def option(width, gains=gains, scale=scale):
        """(expected tokens per second, k per adaptive request) for a pass `width` wide."""
        cost, tokens = curve.batch_time(b, width, context) * scale[width > 1], fixed_tokens + len(adaptive)
        reach = [min(width - 1, caps[id(s)]) for s in adaptive]  # the drafts each request could make
        offers = [((expected_tokens(gains[id(s)], k) - 1) * trust, i)
                  for i, (s, k) in enumerate(zip(adaptive, reach)) if k]
        offers.sort(key=lambda o: -o[0])  # the most expected gain first
        best_rate = tokens / (cost + curve.draft_time(fixed_drafting, width - 1, context) * scale[1])
        best_m, gain = 0, 0.0
        for m, (g, _) in enumerate(offers, 1):
            gain += g
            rate = (tokens + gain) / (cost + curve.draft_time(fixed_drafting + m, width - 1, context) * scale[1])
            if rate > best_rate:
                best_rate, best_m = rate, m
        chosen = {i for _, i in offers[:best_m]}
        ks = {id(s): reach[i] if i in chosen else 0 for i, s in enumerate(adaptive)}
        if width > 1 and not chosen and floor < width:
            return 0.0, ks  # nobody drafts: a wider pass would be padding only
        steps = (1 + curve.block_steps(width - 1)) if width > 1 and width > floor else 0
        return best_rate / (1 + margin) ** steps, ks

    def best(gains=gains, scale=scale):
        return max((option(w, gains, scale) + (w,) for w in range(floor, top + 1)), key=lambda o: (o[0], -o[2]))

    def could_pay(hopeful: list) -> bool:
        """Whether any of these requests would draft were its drafts accepted at `hopeful` odds at every
        position: else testing their estimates cannot change the plan, and a probe (a wider pass, the
        drafter catching up with their contexts) would only cost. At 8 rows of a steep curve one request
        alone can never pay; several fresh ones together may. Judged by the calibrated costs, as
        `AdaptiveLength.can_pay` is: the measured scale of drafting passes is updated only by drafting
        passes, so judging by it could shut out the very rounds that would correct it."""
        trial = {**gains, **{id(s): [s.lengths.cfg.hopeful] * s.lengths.max_k for s in hopeful}}
        return any(best(trial, [1.0, 1.0])[1][id(s)] for s in hopeful)

    def priced(width: int, drafting: int) -> float:
        """Calibrated seconds of a round: the pass `width` wide and `drafting` requests' drafter pass."""
        return curve.batch_time(b, width, context) + curve.draft_time(drafting, width - 1, context)

    def probe_loss() -> float:
        """The fraction of a plain round's throughput lost to a probe round (every request one token)."""
        probing = [s for s in adaptive if caps[id(s)]]
        tokens = b + sum(gains[id(s)][0] for s in probing)
        return max(0.0, 1 - tokens / (priced(2, len(probing)) * scale[1]) / (b / (priced(1, 0) * scale[0])))

    rate, ks, width = best()
    fresh = [s for s in adaptive if s.lengths.fresh and caps[id(s)]]  # what a probe would test
    probes = [s for s in adaptive if not ks[id(s)] and caps[id(s)] and s.lengths.probe_in_batch()]
    probes = probes if probes and could_pay(fresh) else []
    for s in probes:  # a request testing its estimates: as far as the pass is wide anyway
        ks[id(s)] = min(max(1, width - 1), caps[id(s)])
    width = max(width, 2 if probes else 1)
    joining = [s for s in fresh if not ks[id(s)]] if width > 1 else []
    if joining and (probes or could_pay(fresh)):  # the pass is wide anyway: they probe with it, not each alone
        reach = width - 1 if curve.draft_batch else 1  # (a drafter that drafts requests one by one: its cheapest)
        for s in joining:
            if s.lengths.join_probe():
                ks[id(s)] = min(reach, caps[id(s)])
    if memory is not None and top > 1:
        memory.batch_off = memory.batch_off + 1 if width == 1 else 0
        # a probe (one token each) at least `first_probe` rounds apart: where one nearly pays, probing every
        # round would be drafting on less evidence than the margin asks for
        off = memory.batch_off
        if width == 1 and off >= lead.cfg.first_probe and off * lead.cfg.probe_share >= probe_loss():
            memory.batch_off = 0
            if could_pay(adaptive):
                width, ks = 2, {id(s): min(1, caps[id(s)]) for s in adaptive}
    drafting = fixed_drafting + sum(1 for k in ks.values() if k)
    if lead.clock is not None:  # (clock=None: the costs stay as calibrated, as for one request)
        _time_batch(memory, tuple(id(s) for s in states), width > 1, priced(width, drafting), follow, lead.clock())
    for s in adaptive:
        s.k = ks[id(s)]
        s.lengths.skip_timing()
        # what each drafting row should accept: its `update` keeps it beside what it did, judged next batched round
        s.lengths.expected = expected_tokens(gains[id(s)], s.k) - 1 if s.k else None
    return [s.k for s in states]


def _judge_yield(memory: ControllerMemory, adaptive: list, follow: float) -> float:
    """How far the last batched round's drafting rows fell short of their estimates, followed from round to round:
    the factor on every estimated gain, within `TRUST`. A batch drafts with the rows whose estimates
    read highest, and estimates chosen for reading high read high: at 8 rows of ~800-token requests the drafting
    rows accepted 7% fewer drafts than estimated, and drafting there, planned 10% ahead, came out even with
    plain. (Bounded: after a run of rejections the estimates fall too, and a factor that fell with them would
    keep a batch plain after its text turned easy again.)"""
    rows = [s.lengths.last for s in adaptive if s.lengths.last[1] is not None]  # (accepted, expected)
    want = sum(w for _, w in rows)
    if want > 0:
        got = sum(a for a, _ in rows) / want
        memory.batch_yield += follow * (min(max(got, TRUST[0]), TRUST[1]) - memory.batch_yield)
    return memory.batch_yield


TRUST = (0.8, 1.0)  # the least and most `_judge_yield` makes of the estimates (never more eager than they are)


def _context(s) -> int:
    """Tokens in a batched request's cache: what its controller planned at, or its prompt cache's."""
    return s.lengths.context if isinstance(s.lengths, AdaptiveLength) else len(s.pc.tokens)


def _time_batch(memory: ControllerMemory | None, requests: tuple, drafting: bool, predicted: float, follow: float,
                now: float) -> None:
    """Compare the time since the last batched round began planning with what the costs predicted for
    that round, and rescale the batch costs of that kind: only when it was of the same kind as this one
    and ran the same requests (the steady state: a round just after a request joined or left also pays
    for rebuilding the batch's slabs and for the newcomer's drafter catching up with its prompt)."""
    if memory is None:
        return
    last = memory.batch_tick
    memory.batch_tick = (now, requests, drafting, predicted)
    if last is None or last[1] != requests or last[2] != drafting:
        return
    i, ratio = int(drafting), (now - last[0]) / last[3]
    if 0.25 < ratio / memory.batch_scale[i] < 4:  # a pause (a prefill, an idle queue) is not the round's cost
        memory.batch_scale[i] += follow * (ratio - memory.batch_scale[i])
