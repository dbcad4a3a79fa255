"""Batched rounds plan their draft lengths together: per-request lengths in one verify pass, chosen from the
batch's width and each request's own acceptance, rows that do not pay running plain beside drafting rows;
and whatever the mix, every request decodes exactly as it would alone."""

import math
from types import SimpleNamespace

import pytest

import factory
import mlx_spec
from mlx_spec.curve import CostCurve
from mlx_spec.batch_plan import TRUST, plan_batch
from mlx_spec.controller import AdaptiveLength, ControllerConfig, ControllerMemory, expected_tokens
from mlx_spec.engine.loop import FixedLength
from mlx_spec.engine.sampling import Sampler, SamplingParams
from mlx_spec.generate import Generation, encode_prompt, step_all


def curve(per_token: float) -> CostCurve:
    """One row: a flat verify curve (an optimized BLAS). Batched: each extra token in the pass costs
    `per_token` of a one-token pass (padding included), the compute-bound regime of a wide batch."""
    batch = [[b, w, 1.0 + per_token * (b * w - 1)] for b in (2, 4, 8) for w in (1, 2, 4, 8)]
    return CostCurve(verify=[1.0 + 0.05 * m for m in range(8)], draft=[0.1] * 7, rounds=[], batch=batch)


def row(c: CostCurve, alpha: float, memory=None, remaining=1 << 30, clock=None):
    lengths = AdaptiveLength(c, 7, memory=memory, clock=clock)
    lengths.hits, lengths.trials = [alpha * 50] * 7, [50.0] * 7
    lengths.judged = 50  # (evidence of its own: 50 drafting rounds)
    return SimpleNamespace(lengths=lengths, k=lengths.next(), remaining=remaining)


def new_rows(c: CostCurve, memory, n: int = 4) -> list:
    """n new requests, their estimates their predecessors' (in `memory`) or the prior."""
    return [SimpleNamespace(lengths=AdaptiveLength(c, 7, memory=memory, clock=None), k=None, remaining=1 << 30)
            for _ in range(n)]


def plan_rounds(states: list, rounds: int, accepted=None) -> list[list[int]]:
    """Each round's plan: every request's own choice, the batch's plan, then (with `accepted(round, k)`) the
    verdict on every request's drafts."""
    plans = []
    for i in range(rounds):
        for s in states:
            s.k = s.lengths.next()
        plans.append(plan_batch(states))
        for s in states if accepted else ():
            s.lengths.update(s.k, accepted(i, s.k))
    return plans


def test_a_bigger_drafter_block_is_planned_only_where_it_pays_by_the_margin_again():
    """A drafter that learnt blocks of 4 and 8: a batch drafts past 3 (its bigger block) only where that beats
    the smaller block by the plan's margin again; at 4 code rows a 16-row drafter's plan drafted 10-15 a row,
    priced a little better than 7, and ran at 2.12x of plain against 2.41x for a fixed 7."""
    for blocks, alphas, wide in (([], LITTLE_MORE, True), ([4, 8], LITTLE_MORE, False), ([4, 8], [0.9] * 7, True)):
        c = curve(0.0)  # every width costs the same: past 3 drafts, 2% more tokens for nothing
        c.blocks = blocks
        states = [row(c, 0.0) for _ in range(4)]
        for s in states:
            s.lengths.hits = [a * 50 for a in alphas]
        assert all(k == (7 if wide else 3) for k in plan_batch(states))


LITTLE_MORE = [0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1]


def test_rows_that_do_not_pay_run_plain_beside_drafting_rows():
    c = curve(0.02)
    states = [row(c, 0.95), row(c, 0.0), row(c, 0.9), row(c, 0.05)]
    ks = plan_batch(states)
    assert ks[0] > 0 and ks[2] > 0 and ks[1] == 0 and ks[3] == 0
    assert ks[0] == ks[2]  # the pass is as wide as its widest block: a drafting row fills it


def test_a_wide_batch_where_padding_costs_stays_plain():
    steep = curve(0.5)  # a batched pass costs about what its tokens do: a block of 8 per row is 8x the pass
    assert plan_batch([row(steep, 0.6) for _ in range(8)]) == [0] * 8
    flat = curve(0.005)
    assert all(k > 0 for k in plan_batch([row(flat, 0.6) for _ in range(8)]))


def test_fixed_rows_keep_their_lengths_and_remaining_tokens_cap_drafts():
    c = curve(0.02)
    fixed = SimpleNamespace(lengths=FixedLength(3), k=3, remaining=100, pc=SimpleNamespace(tokens=[]))
    short = row(c, 0.95, remaining=2)
    assert plan_batch([fixed, row(c, 0.95), short]) == [3, 7, 1]


def test_batch_costs_follow_measured_rounds():
    memory = ControllerMemory()
    c = curve(0.5)  # (so dear that no probe widens a pass)
    now = [100.0]
    states = [row(c, 0.0, memory, clock=lambda: now[0]) for _ in range(4)]
    for _ in range(30):  # plain passes really take twice what the curve says
        plan_batch(states)
        now[0] += 2 * c.batch_time(4, 1)
    assert memory.batch_scale[0] == pytest.approx(2.0, rel=0.1) and memory.batch_scale[1] == 1.0


def test_a_round_alone_between_batched_rounds_is_not_judged_as_batched():
    """A request that drafted in a batched round and then ran a round alone (the others had ended) is not judged
    by that round's drafts against the batched round's expectation: `update` settles each round's own."""
    memory = ControllerMemory()
    lengths = row(curve(0.02), 0.9, memory).lengths
    lengths.expected = 3.0  # a batched round planned it to have 3 drafts accepted...
    lengths.update(4, 3)
    assert lengths.last == (3, 3.0)
    lengths.update(0, 0)  # ...then a plain round alone
    assert lengths.last == (0, None) and lengths.expected is None


def test_a_prompt_pass_between_rounds_is_not_a_rounds_cost():
    """A request joining a server's batch runs its prompt between two of the batch's rounds: with the pass
    counted in, rounds read dearer than they are (drafting ones, predicted longer, slipped under the 4x
    guard more often), and the batch stopped drafting where drafting paid."""
    c = curve(0.5)
    for interrupted in (False, True):
        memory, now = ControllerMemory(), [100.0]
        states = [row(c, 0.0, memory, clock=lambda: now[0]) for _ in range(4)]
        joining = AdaptiveLength(c, 7, memory=memory, clock=lambda: now[0])
        for _ in range(30):
            plan_batch(states)
            now[0] += c.batch_time(4, 1)  # the round as the curve says...
            if interrupted:
                joining.interrupt()  # ...and the joining request's prompt pass, two rounds long
            now[0] += 2 * c.batch_time(4, 1)
        assert memory.batch_scale[0] == pytest.approx(1.0 if interrupted else 3.0, rel=0.1)
    one = row(c, 0.0, memory, clock=lambda: now[0])  # a request decoding alone is not timed across it either
    scale = list(one.lengths.cost_scale)
    for _ in range(30):
        one.lengths.next()
        one.lengths.update(0, 0)
        joining.interrupt()
        now[0] += 2 * c.round_time(0)
    assert one.lengths.cost_scale == scale


def test_a_plain_batch_probes_as_often_as_costs_its_share():
    """While nobody drafts, every request drafts one token now and then: one probe every n rounds, where
    n is the least number of rounds over which a probe's loss (against a plain round) stays within
    `probe_share` of the throughput, but at least `first_probe`. The worse the estimates, the dearer a probe
    and the rarer."""
    dear = curve(0.1)  # drafting at these odds does not pay (by the margin); at the hopeful 0.9 it would
    cfg = ControllerConfig()
    plain, gaps = 4 / dear.batch_time(4, 1), []
    for alpha in (0.6, 0.3, 0.1):
        memory = ControllerMemory()
        states = [row(dear, alpha, memory) for _ in range(4)]
        plans = [plan_batch(states) for _ in range(400)]
        a1 = states[0].lengths.estimates()[0]  # (alpha, leaning a little on the prior)
        loss = 1 - (4 + 4 * a1) / (dear.batch_time(4, 2) + dear.draft_time(4, 1)) / plain
        n = max(cfg.first_probe, math.ceil(loss / cfg.probe_share - 1e-9))
        assert [i for i, p in enumerate(plans) if any(p)] == list(range(n - 1, 400, n))
        assert all(p in ([0] * 4, [1] * 4) for p in plans)
        gaps.append(n)
    assert gaps[0] == cfg.first_probe < gaps[1] < gaps[2] < 400
    steep = curve(0.5)  # where not even 0.9 would pay, a probe could not change the plan: none runs
    states = [row(steep, 0.6, ControllerMemory()) for _ in range(4)]
    assert all(plan_batch(states) == [0] * 4 for _ in range(30))


def test_batch_time_interpolates_and_extrapolates():
    c = curve(0.02)
    assert c.batch_time(1, 3) == c.verify[2]
    assert c.batch_time(4, 2) == pytest.approx(1.0 + 0.02 * 7)
    assert c.batch_time(3, 2) == pytest.approx((c.batch_time(2, 2) + c.batch_time(4, 2)) / 2)
    assert c.batch_time(4, 3) == pytest.approx((c.batch_time(4, 2) + c.batch_time(4, 4)) / 2)
    assert c.batch_time(16, 8) > c.batch_time(8, 8)
    bare = CostCurve(verify=[1.0, 1.1, 1.2], draft=[0.1, 0.1])  # no batch measured: one row of the tokens
    assert bare.batch_time(2, 1) == 1.1 and bare.batch_time(2, 3) == pytest.approx(1.5)


def long_curve(growth: float) -> CostCurve:
    """`curve(0.02)` measured again after 1,024 cached tokens a row: each pass `growth` seconds dearer per
    row and token of its width, a drafter pass `growth` per row and draft."""
    c = curve(0.02)
    c.draft_batch = [[b, k, 0.1 + 0.01 * b * k] for b in (1, 2, 4, 8) for k in (1, 3, 7)]
    c.long_batch = [[b, w, t + growth * b * w] for b, w, t in c.batch if w in (1, 2, 4, 8)]
    c.long_draft_batch = [[b, k, t + growth * b * k] for b, k, t in c.draft_batch]
    c.long_batch_context = 1024
    return c


def test_batched_passes_grow_with_the_longest_row():
    c = long_curve(0.01)
    assert c.batch_time(4, 2, 64) == c.batch_time(4, 2) == pytest.approx(1.14)  # at the measured context
    assert c.batch_time(4, 2, 544) == pytest.approx(1.14 + 0.04)  # halfway to the long one: half its growth
    assert c.batch_time(4, 2, 2944) == pytest.approx(1.14 + 0.08 * 3)  # carried on past it
    assert c.batch_time(6, 2, 1024) - c.batch_time(6, 2) == pytest.approx(0.12)  # rows interpolated...
    assert c.batch_time(16, 2, 1024) - c.batch_time(16, 2) == pytest.approx(0.32)  # ...and extrapolated
    assert c.draft_time(8, 3, 1024) - c.draft_time(8, 3) == pytest.approx(0.24)
    assert c.draft_time(4, 3, 2944) - c.draft_time(4, 3) == pytest.approx(0.36)
    flat = long_curve(0.0)
    flat.long_batch[0][2] -= 0.5  # a long measurement that came out cheaper (noise) adds nothing
    assert flat.batch_time(2, 1, 2000) == flat.batch_time(2, 1)


def test_rows_with_long_contexts_draft_only_where_the_dearer_passes_still_pay():
    """What drafting costs beside long rows: a pass and a drafter pass over 1,500 cached tokens a row.
    Where they grow with the width, 0.6 acceptance stops paying; where they grow alike, it still does."""
    def rows(c, context):
        states = [row(c, 0.6) for _ in range(8)]
        for s in states:
            s.lengths.context = context
        return states
    steep = long_curve(0.02)
    assert all(k > 0 for k in plan_batch(rows(steep, 64)))
    assert plan_batch(rows(steep, 1500)) == [0] * 8
    even = long_curve(0.0)
    even.long_batch = [[b, w, t + 0.3 * b] for b, w, t in even.long_batch]  # attention a row, whatever the width
    assert all(k > 0 for k in plan_batch(rows(even, 1500)))

REQUESTS = [("def add(a, b):", SamplingParams(), [0, 3, 1, 5, 0, 0, 2]),
            ("Hello, how are you today?", SamplingParams(temperature=0.8, top_k=20, seed=3), [4, 0, 2, 0, 5]),
            ("import os", SamplingParams(), [0, 0, 1, 4]),
            ("class Stack:", SamplingParams(temperature=1.0, top_p=0.9, seed=9), [2, 5, 0])]


def gen(model, tok, prompt, sampling, lengths, max_tokens=24):
    return Generation(model, tok, encode_prompt(tok, prompt), max_tokens, Sampler(sampling, model.config["vocab_size"]),
                      [], mlx_spec.make_prompt_cache(model), lengths)


def decode(model, gens):
    """Step all generations together until each finishes; the drafted counts of every pass."""
    outs = [g.start().tokens for g in gens]
    passes = []
    while not all(g.finished for g in gens):
        live = [i for i, g in enumerate(gens) if not g.finished]
        rs = step_all(model, [gens[i] for i in live])
        passes.append([r.drafted for r in rs])
        for i, r in zip(live, rs):
            outs[i] += r.tokens
    return outs, passes


@pytest.fixture(scope="module")
def pair(target_dir, drafter_dir):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    model.drafter = factory.SelfDrafter(model.model, block_size=6, mode="argmax-onehot", error_rate=0.3, seed=1)
    return model, tok


def test_drafting_rows_that_accept_less_than_estimated_draft_less():
    """Rows chosen for the estimates that read highest accept less than those estimates say (at 8 rows of
    ~800-token requests, 7% less, and drafting planned 10% ahead came out even with plain): the batch plan
    follows how the drafting rows' accepted drafts compare with what was expected, within `TRUST`."""
    c = curve(0.05)  # drafting at 0.6 pays, but not by much
    for shortfall, drafts in ((1.0, True), (0.8, False)):
        memory = ControllerMemory()
        states = [row(c, 0.6, memory) for _ in range(4)]
        plans = []
        for _ in range(60):  # the rows accept `shortfall` of what their (unchanging) estimates expect
            plans.append(plan_batch(states))
            for s, k in zip(states, plans[-1]):  # (the round's outcome as `update` keeps it)
                want = s.lengths.expected
                assert want == (pytest.approx(expected_tokens(s.lengths.estimates(), k) - 1) if k else None)
                s.lengths.last, s.lengths.expected = (0 if want is None else shortfall * want, want), None
        # (short by a fifth, drafting stops paying once the factor nears 0.85: only the batch's probes draft)
        assert all(max(p) > 1 for p in plans[-30:]) if drafts else all(max(p) <= 1 for p in plans[-30:])
        assert memory.batch_yield == pytest.approx(1.0) if drafts else memory.batch_yield < 0.9
    memory.batch_yield = 0.0  # however far the drafts fell short, the plan trusts the estimates this much
    for s in states:
        s.lengths.last = (0, 1.0 if s is states[0] else None)  # one row drafted and had none of its drafts accepted
    plan_batch(states)
    assert memory.batch_yield == pytest.approx(0.1 * TRUST[0])


def test_each_prompt_chunk_interrupts_the_round_clock(pair):
    model, tok = pair
    calls = []

    class Recording(FixedLength):
        def interrupt(self):
            calls.append(len(calls))

    gen = mlx_spec.make_generation(model, tok, list(range(3, 40)), 4, draft_lengths=Recording(0))
    list(gen.prefill(chunk=16))
    assert len(calls) == 3  # 37 prompt tokens in chunks of 16


def test_mixed_draft_lengths_in_one_pass_decode_as_plain(pair):
    model, tok = pair
    want = [decode(model, [gen(model, tok, p, s, FixedLength(0))])[0][0] for p, s, _ in REQUESTS]
    got, passes = decode(model, [gen(model, tok, p, s, factory.ScriptedLengths(ks)) for p, s, ks in REQUESTS])
    assert got == want  # greedy and seeded rows alike
    assert any(0 in p and max(p) > 0 and len(set(p)) > 2 for p in passes)  # k = 0 beside several lengths


def test_planned_batches_decode_as_alone(pair):
    model, tok = pair
    c = curve(0.02)
    c.draft = [0.1] * 5
    memory = ControllerMemory()

    def planned(alpha):
        lengths = AdaptiveLength(c, 5, memory=memory)
        lengths.hits, lengths.trials = [alpha * 50] * 5, [50.0] * 5
        lengths.judged = 50  # (evidence of its own)
        return lengths

    alphas = [0.95, 0.0, 0.9, 0.0]
    want = [decode(model, [gen(model, tok, p, s, FixedLength(0))])[0][0] for p, s, _ in REQUESTS]
    got, passes = decode(model, [gen(model, tok, p, s, planned(a)) for (p, s, _), a in zip(REQUESTS, alphas)])
    assert got == want
    assert passes[0][0] > 0 and passes[0][1] == 0  # the planner mixed plain and drafting rows in a pass


def test_a_request_alone_keeps_its_own_lengths_and_timing(pair):
    """plan_batch is for batches: a lone request's drafting rounds are its own controller's, and timed."""
    model, tok = pair
    ticks = iter(range(0, 10 ** 6, 2))  # every round takes about twice what the curve says
    lengths = AdaptiveLength(curve(0.02), 5, clock=lambda: float(next(ticks)))
    lengths.hits, lengths.trials = [45.0] * 5, [50.0] * 5
    g = gen(model, tok, "def add(a, b):", SamplingParams(), lengths)
    g.start()
    seen = []
    for _ in range(4):
        want = lengths.next() if g.state.k is None else g.state.k
        r = step_all(model, [g])[0]
        seen.append((want, r.drafted))
        if g.finished:
            break
    assert seen[0][0] > 0 and all(w == d for w, d in seen)  # the drafted lengths are the controller's own
    assert lengths.cost_scale[1] > 1.05  # and its rounds were timed (a batched round's are not: they are the batch's)


def test_new_requests_in_a_batch_test_their_predecessors_estimates_soon():
    """The last requests were text the drafter could not follow; these follow it perfectly. Batched, each
    new request still probes within a few rounds (one token, in the shared pass), and they ramp up."""
    plans = plan_rounds(new_rows(curve(0.02), ControllerMemory(alphas=[0.02] * 7)), 24,
                        lambda i, k: k)  # every draft accepted
    assert plans[0] == [0] * 4  # off at first: the estimates say the drafts fail
    first = next(i for i, p in enumerate(plans) if any(p))
    assert first <= 5 and all(k == 1 for k in plans[first])  # every new request probes one token, soon
    assert all(k >= 4 for k in plans[-1])  # and, finding the drafts good, they draft long


def test_a_stale_cost_scale_does_not_shut_probes_out():
    """The measured scale of drafting passes went up (another kind of traffic before) and only drafting
    passes update it: new requests still probe, judged by the calibrated costs, so it can come down."""
    plans = plan_rounds(new_rows(curve(0.02), ControllerMemory(alphas=[0.02] * 7, batch_scale=[1.0, 5.0])), 12)
    assert any(any(p) for p in plans)


def test_new_requests_arriving_apart_probe_in_one_widened_pass():
    """Four requests join a plain batch (where a widened pass is dear) one round apart, inheriting
    estimates that say drafts fail, and the drafts do fail (raw text). Each tests those estimates
    `fresh_probes` times: in shared widened passes, not in widened passes of its own."""
    fresh = ControllerConfig().fresh_probes
    judged, widened = arrive_apart(curve(0.03))  # where the four together would pay at hopeful odds
    assert judged == [fresh] * 4
    assert widened == fresh  # each in passes of its own: 4x as many


def test_a_batch_turned_plain_by_unlucky_first_drafts_probes_again():
    """Requests draft from the prior and their first drafts are all rejected (the first tokens of an answer
    are the hardest), so the plan turns plain. The whole batch then probes, one token each, at a bounded
    cost, and once drafts are accepted the probes come sooner and the batch drafts long again. (With a
    wait that doubled after every probe it found the easy text after 83 rounds; before that, after 128
    plain rounds: 4 rows of long prompts stayed plain to the end of their answers.)"""
    cfg = ControllerConfig()
    plans = plan_rounds(new_rows(curve(0.02), ControllerMemory()), 120,
                        lambda i, k: 0 if i < 30 else k)  # rejected for a while, then accepted
    drafting = [i for i, p in enumerate(plans) if any(p)]
    fresh = cfg.fresh_probes  # its first drafting rounds: the plan's two, then (past two) a new request's probes
    assert drafting[:fresh] == [0, 1] + [1 + cfg.first_probe * j for j in range(1, fresh - 1)]
    probes = drafting[fresh : drafting.index(next(i for i in drafting if max(plans[i]) > 1 and i > 1))]
    assert all(plans[i] == [1] * 4 for i in probes) and len(probes) >= 3
    gaps = [b - a for a, b in zip(drafting[fresh - 1 :], probes)]
    assert min(gaps) >= cfg.first_probe
    after = [i for i in probes if i >= 30]  # the probes that were accepted: the next comes sooner
    assert after[0] < 30 + max(gaps[: len(probes) - len(after)]) and gaps[-1] < gaps[-len(after) - 1]
    assert probes[-1] < 60 and all(k >= 4 for k in plans[-1])  # found good again: drafting long


def test_a_request_that_could_not_pay_even_at_best_does_not_probe():
    """The same arrivals where a widened pass is so dear that even drafts accepted at the controller's
    hopeful odds would not pay for these requests (a wide batch on a CPU): testing their estimates could
    not change the plan, so no probe widens a pass or has the drafter catch up with their contexts
    (raw completions at 8 clients lost 5% to such probes)."""
    judged, widened = arrive_apart(curve(0.5))
    assert judged == [0] * 4 and widened == 0


def test_new_requests_of_their_predecessors_kind_do_not_probe_on_their_own():
    """The estimates were left by requests of this kind (raw completions the drafter could not follow):
    tested already, so new raw requests joining one round apart never widen a pass of their own; only the
    batch's own probes (every request one token, rarely where they cost) test them again. A chat request
    starting from them (another kind of text) still tests them soon."""
    memory = ControllerMemory(alphas=[0.02] * 7, by_kind={"raw": [0.02] * 7})
    assert AdaptiveLength(curve(0.03), 7, memory=memory, kind="chat").fresh
    assert not AdaptiveLength(curve(0.03), 7, memory=memory, kind="raw").fresh
    judged, widened = arrive_apart(curve(0.03), memory, kind="raw")
    assert widened < ControllerConfig().fresh_probes and max(judged) <= widened
    assert arrive_apart(curve(0.03), memory, kind="chat")[1] == ControllerConfig().fresh_probes


def arrive_apart(c: CostCurve, memory: ControllerMemory | None = None, kind: str | None = None):
    """Four requests inherit estimates that say drafts fail and join a plain batch of four one round apart;
    the drafts do fail. Their drafting rounds each, and the widened passes."""
    memory = memory or ControllerMemory(alphas=[0.02] * 7)
    states, widened = [row(c, 0.0) for _ in range(4)], 0
    for i in range(40):
        if i < 4:
            lengths = AdaptiveLength(c, 7, memory=memory, clock=None, kind=kind)
            states.append(SimpleNamespace(lengths=lengths, k=lengths.next(), remaining=1 << 30))
        widened += any(plan_batch(states))
        for s in states:
            s.lengths.update(s.k, 0)
            s.k = s.lengths.next()
    return [s.lengths.judged for s in states[4:]], widened


def test_a_batch_at_a_long_context_drafts_less_far():
    """At 256 cached tokens per row the batch drafts its full blocks; at 4,096 every row's attention over
    its context makes each extra token of width dear (the growth `round_time` measured), and the plan
    narrows, where the batched curve alone (measured at a short context) would not."""
    c = curve(0.02)
    c.rounds, c.context = [1.0 + 0.05 * k for k in range(8)], 256
    c.long_rounds, c.long_context = [r + 0.02 * (k + 1) for k, r in enumerate(c.rounds)], 1024

    def plan_at(context):
        states = [row(c, 0.8) for _ in range(4)]
        for s in states:
            s.k = s.lengths.next(context)
        return plan_batch(states)
    short, long = plan_at(256), plan_at(4096)
    assert short == [7] * 4 and 0 < max(long) < 7
