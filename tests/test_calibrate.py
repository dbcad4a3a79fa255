"""Calibration: the chosen draft length maximises expected speed; the controller adapts."""

import pytest

import archs
import factory
import mlx_spec
from mlx_spec.calibrate import calibrated_curve, level_dips, measure_curve, monotone, straight_growth
from mlx_spec.curve import CostCurve
from mlx_spec.controller import AdaptiveLength, ControllerConfig, ControllerMemory, best_length, expected_tokens

FLAT = CostCurve(verify=[1.0, 1.02, 1.05, 1.07, 1.1, 1.15, 1.2, 1.25, 1.3], draft=[0.05] * 8)  # Apple-like
STEEP = CostCurve(verify=[1.0 * m for m in range(1, 10)], draft=[0.1 * (k + 1) for k in range(8)])  # stock CPU BLAS


def test_expected_tokens():
    assert expected_tokens([1.0] * 4, 4) == 5
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.9], 0) == 1


def brute_force(curve, alphas):
    speeds = [expected_tokens(alphas, k) / curve.round_time(k) for k in range(len(alphas) + 1)]
    return speeds.index(max(speeds))


@pytest.mark.parametrize("curve", [FLAT, STEEP], ids=["flat", "steep"])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.6, 0.9, 0.99])
def test_best_length_maximises_speed(curve, alpha):
    alphas = [alpha] * 8
    assert best_length(curve, alphas) == brute_force(curve, alphas)


def test_flat_curve_speculates_far_steep_curve_stays_plain():
    assert best_length(FLAT, [0.9] * 8) == 8
    assert best_length(STEEP, [0.9] * 8) == 0  # a k-token verify costs k plain steps: never pays
    mild = CostCurve(verify=[1.0, 1.3, 1.9, 2.6, 3.4, 4.3, 5.2, 6.1, 7.0], draft=[0.05] * 8)
    assert best_length(mild, [0.9] * 8) in (1, 2)


def test_controller_turns_off_on_rejection_and_probes_back():
    c = AdaptiveLength(FLAT, max_k=8, config=ControllerConfig(probe_every=5))
    for _ in range(40):  # every draft rejected
        c.update(c.next(), 0)
    ks = [c.next() for _ in range(10)]
    assert ks.count(0) >= 8 and 1 in ks  # off, with periodic probes
    for _ in range(200):  # acceptance comes back: the probes see it and it ramps up
        k = c.next()
        c.update(k, k)
    assert c.next() == 8


def test_controller_on_steep_curve_never_speculates():
    c = AdaptiveLength(STEEP, max_k=8, config=ControllerConfig(probe_every=10 ** 9))
    for _ in range(20):
        k = c.next()
        assert k == 0
        c.update(k, k)
    c.hits, c.trials = [50.0] * 8, [50.0] * 8  # even near-certain acceptance does not pay there
    assert c.next() == 0


def test_calibrated_curve_is_measured_and_cached(target_dir, drafter_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("MLX_SPEC_CACHE", str(tmp_path))
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    curve = calibrated_curve(model, 4)
    assert len(curve.verify) == 4 and len(curve.draft) == 3 and len(curve.rounds) == 4
    assert all(t > 0 for t in curve.verify + curve.draft + curve.rounds)
    assert list((tmp_path / "curves").glob("*.json"))
    again = calibrated_curve(model, 4)
    assert again == curve  # read from the cache, not re-measured
    out = list(mlx_spec.stream_generate(model, tok, "def add(a, b):", 20))  # adaptive by default
    assert out[-1].generation_tokens == 20


def test_a_drafter_replaced_in_place_is_calibrated_anew(target_dir, drafter_dir, tmp_path):
    """The cached curve is keyed by the weights a folder holds, not only its path: a drafter retrained and
    copied over the old one (a deeper one drafts dearer) must not be priced with the old one's costs."""
    import os
    import shutil

    from mlx_spec.calibrate import curve_key

    here = shutil.copytree(drafter_dir, tmp_path / "drafter")
    model, _ = mlx_spec.load(str(target_dir), drafter=str(here))
    before = curve_key(model)
    assert curve_key(model) == before  # stable while nothing changes
    weights = next(here.glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert curve_key(model) != before


# Measured shape on this project's CPU (embedded pair, OpenBLAS): at 256 cached tokens 7 drafts cost
# little more than 3; at 1,024 every extra draft token also reads 1,024 cached rows in every layer.
ROUNDS_256 = [1.0, 1.3, 1.4, 1.45, 1.55, 1.6, 1.65, 1.7]
ROUNDS_1024 = [1.2, 1.6, 1.75, 1.85, 2.2, 2.45, 2.7, 2.95]


def _long(rounds=ROUNDS_256, long_rounds=ROUNDS_1024):
    return CostCurve(verify=[1.0] * 8, draft=[0.1] * 7, rounds=list(rounds), context=256,
                     long_rounds=list(long_rounds), long_context=1024)


def test_round_time_carries_on_in_context():
    curve = _long()
    for k in range(8):
        assert curve.round_time(k) == curve.round_time(k, 100) == curve.round_time(k, 256) == ROUNDS_256[k]
        assert curve.round_time(k, 1024) == pytest.approx(ROUNDS_1024[k])
        assert curve.round_time(k, 1792) == pytest.approx(2 * ROUNDS_1024[k] - ROUNDS_256[k])  # linear past it
    dip = _long(long_rounds=[r - 0.05 for r in ROUNDS_256])  # noise: a long context is never cheaper
    assert dip.round_time(3, 2000) == ROUNDS_256[3]
    assert CostCurve(verify=[1.0] * 8, draft=[0.1] * 7, rounds=ROUNDS_256).round_time(5, 2000) == ROUNDS_256[5]
    edited = CostCurve(verify=[1.0] * 8, draft=[0.1] * 7, rounds=ROUNDS_256, long_rounds=ROUNDS_1024)  # no long_context
    assert edited.round_time(2, 2000) == ROUNDS_256[2]


def test_the_growth_stops_at_a_sliding_window_and_skips_recurrent_layers():
    # two layers: a window of 512 rows and a global one. 256 -> 1,024 tokens reads 768 + 256 more rows;
    # past 1,024 only the global layer grows: half the all-global rate per token
    windowed = _long()
    windowed.spans = [512, 0]
    grew = ROUNDS_1024[5] - ROUNDS_256[5]
    assert windowed.round_time(5, 1024) == pytest.approx(ROUNDS_1024[5])
    assert windowed.round_time(5, 512) == pytest.approx(ROUNDS_256[5] + grew * 512 / 1024)
    assert windowed.round_time(5, 2048) == pytest.approx(ROUNDS_1024[5] + grew * 1024 / 1024)
    assert _long().round_time(5, 2048) == pytest.approx(ROUNDS_1024[5] + grew * 1024 / 768)  # global only
    local = _long()
    local.spans = [512, 512, 0]  # two windowed layers of three: rows read 768 at 256, 2,048 at 1,024
    assert local.round_time(5, 10_000) == pytest.approx(ROUNDS_256[5] + grew * (2 * 512 + 10_000 - 768) / 1280)
    for spans in ([128], []):  # every window full before the calibration's context; recurrent layers only
        flat = _long()
        flat.spans = spans
        assert flat.round_time(5, 4096) == ROUNDS_256[5]


def test_the_growth_with_context_is_a_straight_line_in_k():
    base = [1.0, 1.3, 1.4, 1.5, 1.6]
    noisy = [1.0 + 0.0, 1.3 + 0.10, 1.4 + 0.35, 1.5 + 0.25, 1.6 + 0.40]  # ~0.1 per draft, noisy; none for plain
    got = straight_growth(base, noisy)
    growth = [g - b for g, b in zip(got, base)]
    steps = [b - a for a, b in zip(growth, growth[1:])]
    assert all(s == pytest.approx(steps[0]) for s in steps) and steps[0] > 0 and growth[0] > 0
    assert sum(growth) == pytest.approx(0.10 + 0.35 + 0.25 + 0.40)  # least squares: the same mean
    assert straight_growth(base, [b - 0.1 for b in base]) == base  # a long context never costs less
    shrinking = straight_growth(base, [b + 0.2 - 0.04 * k for k, b in enumerate(base)])  # noise at k = 0
    assert [g - b for g, b in zip(shrinking, base)] == pytest.approx([0.12] * 5)  # a wider block never grows less


def test_controller_drafts_less_far_at_a_long_context():
    alphas = [0.69, 0.55, 0.79, 0.7, 0.86, 0.78, 0.93]  # long prompts, the embedded pair: τ ≈ 3 at block 8
    assert best_length(_long(), alphas) == 7
    assert best_length(_long(), alphas, cost=lambda k: _long().round_time(k, 1024)) == 3
    c = AdaptiveLength(_long(), max_k=7, clock=None)
    c.hits, c.trials = [a * 100 for a in alphas], [100.0] * 7
    assert c.next(context=360) == 7
    assert c.next(context=385) == 7  # the choice is kept while the context moves little (fresh: 6)...
    assert c.next(context=392) == 6  # ...and made again once it has moved `recontext` tokens
    assert c.next(context=1024) == 3


def test_controller_times_rounds_against_the_cost_at_their_context():
    now = [0.0]
    c = AdaptiveLength(_long(), max_k=7, clock=lambda: now[0])
    c.hits, c.trials = [90.0] * 7, [100.0] * 7
    for _ in range(20):  # rounds at 1,024 tokens that take what the curve says they take there
        k = c.next(context=1024)
        now[0] += _long().round_time(k, 1024)
        c.update(k, k)
    assert c.cost_scale == pytest.approx([1.0, 1.0])  # no load to correct for


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text", "qwen3_next"])  # dense; a ring of 8 that wraps; recurrent
def test_the_rounds_are_measured_again_at_a_long_context(arch, models_dir, tokenizer_dir):
    target = archs.make(models_dir / f"long-rounds-{arch}", tokenizer_dir, arch, seed=5)
    drafter = factory.make_drafter(models_dir / f"long-rounds-{arch}-dflash", target, taps=(0, 2), block_size=4)
    model, _ = mlx_spec.load(str(target), drafter=str(drafter))
    curve = measure_curve(model, 4, context=32, repeats=2, long_context=160)
    assert curve.context == 32 and curve.long_context == 160 and len(curve.long_rounds) == len(curve.rounds) == 4
    assert all(t > 0 for t in curve.long_rounds)
    layers = len(model.target.model.layers)
    want = {"qwen3": [0] * layers, "gemma3_text": [8, 0] * (layers // 2), "qwen3_next": [0] * (layers // 2)}[arch]
    want += [0] * len(model.drafter.layers)  # the drafter's attention over the context grows too
    assert curve.spans == want  # what each attention layer reads grows with the context; recurrent states do not


def test_controller_explores_longer_drafts_when_acceptance_is_high():
    c = AdaptiveLength(FLAT, max_k=8)
    for _ in range(30):
        k = c.next()
        c.update(k, k)  # everything accepted
    assert c.next() == 8


def test_measured_rounds_override_the_ideal_pass_time():
    # Host work per round (here 0.5 plain steps) makes short drafts lose where the ideal curve says win.
    ideal = CostCurve(verify=[1.0, 1.1, 1.2, 1.3], draft=[0.1] * 3)
    loaded = CostCurve(verify=ideal.verify, draft=ideal.draft, rounds=[1.0] + [ideal.pass_time(k) + 0.5 for k in (1, 2, 3)])
    assert best_length(ideal, [0.3] * 3) > 0 and best_length(loaded, [0.3] * 3) == 0
    assert loaded.round_time(0) == 1.0 and loaded.pass_time(2) == pytest.approx(1.3)


def test_probes_back_off_while_they_find_nothing():
    hard = CostCurve(verify=[1.0 + 0.6 * m for m in range(9)], draft=[0.1] * 8)  # pays only at high acceptance
    c = AdaptiveLength(hard, max_k=8, config=ControllerConfig(probe_every=4, max_probe_every=16))
    probes = []
    for r in range(100):
        k = c.next()
        if k:
            probes.append(r)
        c.update(k, 0)
    starts = [r for r in probes if r - 1 not in probes]
    assert all(r + 1 in probes for r in starts) and len(probes) == 2 * len(starts)  # two rounds: the second is timed
    gaps = [b - a - 1 for a, b in zip(starts, starts[1:])]  # plain rounds between a probe's end and the next
    assert starts[0] == 3 and gaps[:3] == [8, 16, 16] and len(starts) == 7


def test_probe_interval_resets_once_speculation_pays_again():
    c = AdaptiveLength(FLAT, max_k=8, config=ControllerConfig(probe_every=4, max_probe_every=64))
    for _ in range(300):  # rejected for long: probes have backed off to the maximum
        c.update(c.next(), 0)
    assert c.interval == 64
    for _ in range(200):
        k = c.next()
        c.update(k, k)
    assert c.next() == 8 and c.interval == 4


def test_memory_warm_starts_the_next_request():
    mild = CostCurve(verify=[1.0, 1.15, 1.3, 1.45, 1.6, 1.75, 1.9, 2.05, 2.2], draft=[0.05] * 8)
    memory = ControllerMemory()
    first = AdaptiveLength(mild, max_k=8, memory=memory)
    cold = first.next()
    for _ in range(50):
        k = first.next()
        first.update(k, k)
    assert memory.alphas and min(memory.alphas) > 0.9
    assert AdaptiveLength(mild, max_k=8, memory=memory).next() > cold


def test_each_kind_of_request_starts_from_its_own_kinds_estimates():
    """Chat answers and raw continuations accept so differently that a chat request after raw ones must
    not start from raw's estimates (it stayed plain until probes lifted it); a request of no known kind
    starts from recent requests' of every kind."""
    mild = CostCurve(verify=[1.0, 1.15, 1.3, 1.45, 1.6, 1.75, 1.9, 2.05, 2.2], draft=[0.05] * 8)
    memory = ControllerMemory()

    def run(kind, accept):
        c = AdaptiveLength(mild, max_k=8, memory=memory, kind=kind)
        for _ in range(50):
            k = c.next() or 1  # drafting every round, so that each round is judged
            c.update(k, k if accept else 0)
    run("chat", True)
    run("raw", False)
    assert min(memory.by_kind["chat"]) > 0.9 and memory.by_kind["raw"][0] < 0.2
    chat, raw = (AdaptiveLength(mild, max_k=8, memory=memory, kind=kind) for kind in ("chat", "raw"))
    unknown = AdaptiveLength(mild, max_k=8, memory=memory)  # the mean of chat's and raw's
    assert chat.estimates()[0] > 0.7 > 0.5 > raw.estimates()[0]
    assert all(r < u < c for r, u, c in zip(raw.estimates(), unknown.estimates(), chat.estimates()))
    assert chat.next() > raw.next()


def test_long_prompts_remember_their_estimates_apart_from_short_ones_of_their_kind():
    """Deep into a long context the drafter accepts less: 792-token chats after short chat requests, starting
    from the short ones' estimates, drafted 8 deep where 5 paid. They keep estimates of their own."""
    mild = CostCurve(verify=[1.0, 1.15, 1.3, 1.45, 1.6, 1.75, 1.9, 2.05, 2.2], draft=[0.05] * 8)
    memory = ControllerMemory()

    def run(prompt_tokens, accept):
        c = AdaptiveLength(mild, max_k=8, memory=memory, clock=None, kind="chat", prompt_tokens=prompt_tokens)
        for _ in range(50):
            c.update(8, accept)
        return c
    assert run(800, 2).kind == "chat, long" and run(100, 8).kind == "chat"
    assert memory.by_kind["chat"][2] > 0.9 > 0.2 > memory.by_kind["chat, long"][2]
    short, long = (AdaptiveLength(mild, max_k=8, memory=memory, clock=None, kind="chat", prompt_tokens=n)
                   for n in (ControllerConfig().long_prompt - 1, ControllerConfig().long_prompt))
    assert short.estimates()[2] > 0.9 > 0.6 > long.estimates()[2]
    assert short.next() > long.next()
    fresh = AdaptiveLength(mild, max_k=8, memory=ControllerMemory(), kind="raw", prompt_tokens=900)
    assert fresh.kind == "raw, long" and not fresh.tested  # nothing known of its kind: it probes its own


def test_the_next_request_starts_from_recent_requests_not_one_lucky_one():
    """Eight raw rows decode together; the drafter follows one of them (repetitive text) and none of the
    others. A new row must start from the mean of the rows' estimates, not from whichever row spoke last:
    at 8 rows, starting from one lucky row's, every new row drafted 7 tokens and most were rejected."""
    mild = CostCurve(verify=[1.0, 1.15, 1.3, 1.45, 1.6, 1.75, 1.9, 2.05, 2.2], draft=[0.05] * 8)
    memory = ControllerMemory()
    rows = [AdaptiveLength(mild, max_k=8, memory=memory, clock=None, kind="raw") for _ in range(8)]
    for _ in range(20):
        for i, c in enumerate(rows):  # the lucky row speaks last each round
            c.update(8, 8 if i == 7 else 0)
    assert rows[7].estimates()[0] > 0.9 > 0.1 > rows[0].estimates()[0]
    assert 0.1 < memory.by_kind["raw"][0] < 0.3  # the mean of the rows', not the lucky row's > 0.9
    assert AdaptiveLength(mild, max_k=8, memory=memory, clock=None, kind="raw").estimates()[0] < 0.5
    later = [AdaptiveLength(mild, max_k=8, memory=memory, clock=None, kind="raw") for _ in range(8)]
    for _ in range(20):  # then eight rows the drafter follows: only the last `remember` requests count
        for c in later:
            c.update(8, 8)
    assert memory.by_kind["raw"][0] > 0.9


def test_the_library_tells_chat_prompts_from_raw_text():
    from mlx_spec.generate import prompt_kind

    assert prompt_kind([{"role": "user", "content": "hi"}]) == "chat" and prompt_kind("def f(") == "raw"
    assert prompt_kind([1, 2, 3]) is None  # token ids: either


def test_measured_curves_are_made_monotone():
    assert monotone([1.0, 0.98, 1.21, 1.03, 1.17]) == pytest.approx([0.99, 0.99, 1.12, 1.12, 1.17])
    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0] and monotone([]) == []


def test_no_probes_where_even_high_acceptance_would_not_pay():
    c = AdaptiveLength(STEEP, max_k=8, config=ControllerConfig(probe_every=2))
    assert not c.can_pay
    for _ in range(100):
        k = c.next()
        assert k == 0
        c.update(k, 0)


def test_drafting_must_beat_plain_by_the_margin():
    curve = CostCurve(verify=[1.0, 1.3], draft=[0.05])
    alphas = [0.4]  # 1.4 tokens per 1.35 steps: a 3.7% predicted gain
    assert best_length(curve, alphas) == 1 and best_length(curve, alphas, margin=0.05) == 0
    assert best_length(curve, [0.6], margin=0.05) == 1


def test_a_bigger_drafter_block_must_beat_the_smaller_by_the_margin_again():
    """A drafter that learnt blocks of 4 and 8 drafts past 3 with its 8-row block: a step taken only where it
    pays by the margin again (a 16-row drafter's rounds past 8 drafts lost to 8-draft ones wherever measured
    here, while its cost model, leaning on deep positions it rarely tried, said they paid a little)."""
    curve = CostCurve(verify=[1.0] * 8, draft=[0.1] * 7, rounds=[1.0] + [1.2] * 7)
    little_more = [0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1]  # past 3 drafts, 2% more tokens at the same cost
    assert best_length(curve, little_more, margin=0.05) == 7
    curve.blocks = [4, 8]
    assert curve.block_steps(3) == 0 and curve.block_steps(4) == curve.block_steps(7) == 1
    assert best_length(curve, little_more, margin=0.05) == 3
    assert best_length(curve, [0.9] * 7, margin=0.05) == 7  # where it pays clearly, it is taken


def test_the_calibration_records_a_drafters_block_sizes(target_dir, models_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SPEC_CACHE", str(tmp_path))
    two = factory.make_drafter(models_dir / "two-blocks", target_dir, block_size=8, block_sizes=[4, 8])
    model, _ = mlx_spec.load(str(target_dir), drafter=str(two))
    assert calibrated_curve(model, 8).blocks == [4, 8]
    model, _ = mlx_spec.load(str(target_dir), drafter=str(models_dir / "qwen3-dflash"))  # one block size
    assert calibrated_curve(model, 8).blocks == []


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run_rounds(c, clock, n, cost, accept):
    """n rounds whose real duration is cost(k) and that accept `accept` of each draft's positions."""
    ks = []
    for _ in range(n):
        k = c.next()
        clock.now += cost(k)
        c.update(k, min(k, accept))
        ks.append(k)
    return ks


def test_rounds_dearer_than_calibrated_turn_drafting_off():
    curve = CostCurve(verify=[1.0, 1.1, 1.2, 1.3, 1.4], draft=[0.05] * 4)
    clock = FakeClock()
    c = AdaptiveLength(curve, max_k=4, clock=clock)
    ks = run_rounds(c, clock, 10, curve.round_time, accept=1)  # as calibrated: about 1.8 tokens per round pays
    assert ks[-1] > 0
    # The same rounds now take twice as long (a longer context, a busy machine): plain decoding wins.
    ks = run_rounds(c, clock, 60, lambda k: curve.round_time(k) * (2 if k else 1), accept=1)
    assert ks[-30:].count(0) >= 28  # off, but for a probe (two rounds)
    assert c.cost_scale[1] > 1.5 and c.cost_scale[0] == pytest.approx(1.0)


def test_cost_scales_follow_real_rounds_ignore_pauses_and_carry_over():
    curve = CostCurve(verify=[1.0, 1.3, 1.6, 1.9, 2.2], draft=[0.05] * 4)
    memory, clock = ControllerMemory(), FakeClock()
    c = AdaptiveLength(curve, max_k=4, clock=clock, memory=memory)
    half = lambda k: curve.round_time(k) * (0.5 if k else 1.0)  # noqa: E731
    run_rounds(c, clock, 40, half, accept=4)
    assert c.cost_scale[1] == pytest.approx(0.5, abs=0.05)
    clock.now += 100.0  # a pause between rounds is not a round's cost
    run_rounds(c, clock, 1, half, accept=4)
    assert c.cost_scale[1] == pytest.approx(0.5, abs=0.05)
    assert memory.cost_scale == c.cost_scale  # the next request starts from what this one learnt
    # Where the calibrated curve says plain, drafting rounds known to cost half make it pay.
    steep = CostCurve(verify=[1.0, 1.9, 2.8], draft=[0.1, 0.2])
    assert AdaptiveLength(steep, max_k=2, config=ControllerConfig(prior=0.9)).next() == 0
    assert AdaptiveLength(steep, max_k=2, config=ControllerConfig(prior=0.9),
                          memory=ControllerMemory(cost_scale=[1.0, 0.5])).next() > 0


def test_a_request_that_starts_off_from_its_predecessor_probes_soon():
    memory = ControllerMemory(alphas=[0.02] * 8)  # the last request was text the drafter could not follow
    openblas = CostCurve(verify=[1.0, 1.3, 1.5, 1.5, 1.5, 1.8, 1.8, 1.8, 1.9], draft=[0.05] * 8)  # measured shape
    c = AdaptiveLength(openblas, max_k=8, memory=memory, clock=None)
    ks = []
    for _ in range(30):  # this text is easy: every draft is accepted
        ks.append(c.next())
        c.update(ks[-1], ks[-1])
    assert ks[:3] == [0, 0, 0] and ks.index(1) <= 5  # off at first, but it looks again within a few rounds
    assert ks[-1] >= 4  # and ramps up


def test_measured_curves_are_fitted_with_a_line():
    from mlx_spec.calibrate import linear

    stepped = linear([1.28, 1.44, 1.44, 1.51, 1.57, 1.73, 1.73])  # a load step at 6 drafts
    slopes = [b - a for a, b in zip(stepped, stepped[1:])]
    assert max(slopes) - min(slopes) < 1e-9 and slopes[0] > 0  # an even ramp instead of the step
    assert sum(stepped) == pytest.approx(1.28 + 1.44 + 1.44 + 1.51 + 1.57 + 1.73 + 1.73)
    assert linear([1.02, 1.0, 1.0, 1.0]) == pytest.approx([1.005] * 4)  # never falling: flat at the mean
    gpu = [1.0] * 8 + [1.5, 2.0, 2.5]  # flat, then climbing past a kernel's tile: real, so it stays
    assert linear(gpu) == gpu
    assert linear([1.0, 2.0]) == [1.0, 2.0] and linear([]) == []


def test_a_burst_of_load_slows_one_repetition_of_every_shape_not_one_shape():
    """Shapes take turns: a burst as long as one shape's repetitions leaves every shape's fastest time clean."""
    import time

    from mlx_spec.calibrate import _timed

    calls = []

    def shape(i):
        def run():
            calls.append(i)
            busy = 4 <= len(calls) < 10  # six calls in a row: one shape's repetitions, timed one after another
            time.sleep(0.002 + (0.02 if busy else 0.0))
        return run
    times = _timed([shape(i) for i in range(3)], repeats=6)
    assert calls[:6] == [0, 1, 2, 0, 1, 2]  # warm-ups, then the shapes in turn
    assert all(t < 0.015 for t in times), times


# Accepted drafts per round of a fixed block of 8 on the embedded pair's built-in code prompts (greedy,
# 128 tokens): a round takes all 7 drafts or stops within the first few.
CODE_ROUNDS = [[1, 3, 0, 1, 7, 2],
               [0, 1, 6, 2, 3, 1, 0, 0, 6, 2, 5, 1, 2, 0, 1, 2, 7, 7, 7, 7, 7, 7, 7, 7, 3, 0, 0, 0, 1, 1, 3],
               [7, 4, 2, 7, 7, 0, 6, 6, 5, 5, 2, 2, 2, 2, 2, 5, 7, 7, 7, 7, 7, 6]]


def test_all_or_nothing_acceptance_keeps_up_with_a_full_block():
    """Deep positions are judged only after the early ones pass, and acceptance there is high. Replayed
    on this machine's measured round costs (OpenBLAS), the controller must keep within 1% of always
    drafting 7 (leaning each unjudged position flat on the one before, it stopped at 4-5: 2% short)."""
    openblas = CostCurve(verify=[1.0 + 0.06 * m for m in range(8)], draft=[0.2] * 7,
                         rounds=[1.0] + [1.2 + 0.086 * k for k in range(7)])
    c = AdaptiveLength(openblas, max_k=7, clock=None)
    tokens = seconds = 0.0
    for request in CODE_ROUNDS:
        for full in request:
            k = c.next()
            c.update(k, min(full, k))
            tokens, seconds = tokens + min(full, k) + 1, seconds + openblas.round_time(k)
    rounds = [a for r in CODE_ROUNDS for a in r]
    always_7 = sum(a + 1 for a in rounds) / (len(rounds) * openblas.round_time(7))
    assert tokens / seconds > 0.99 * always_7


def test_attention_spans_of_each_cache_kind():
    from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, QuantizedKVCache, RotatingKVCache

    from mlx_spec.engine.rollback import attention_spans, spec_caches

    caches = [KVCache(), RotatingKVCache(max_size=64), ArraysCache(2), QuantizedKVCache(),
              CacheList(KVCache(), RotatingKVCache(max_size=16))]
    assert attention_spans(caches) == [0, 64, 0, 0, 16]  # recurrent state: left out
    assert attention_spans(spec_caches(caches)) == [0, 64, 0, 0, 16]  # the rollback-exact swaps read the same


def test_a_round_measured_no_dearer_than_the_narrower_one_costs_the_same():
    # Measured here with OpenBLAS (ms, fastest of 9): verify passes of 1..8 tokens and rounds of 0..7 drafts.
    # 4 rows cost less than 3 and 8 less than 7, in the passes and in the rounds alike.
    verify = [11.05, 11.34, 12.22, 11.89, 13.22, 13.30, 16.40, 14.79]
    raw = [10.31, 14.53, 17.77, 15.35, 17.76, 19.39, 21.93, 19.98]
    line = [10.31, 14.5, 15.5, 16.5, 17.5, 18.5, 19.5, 20.5]  # what smoothing makes of them
    levelled = level_dips(line, verify, raw)
    assert levelled == [10.31, 14.5, 15.5, 15.5, 17.5, 18.5, 19.5, 19.5]
    smooth, level = (CostCurve(verify=verify, draft=[1.0] * 7, rounds=r) for r in (line, levelled))
    for alphas, short in (([0.85] * 6 + [0.5], 6), ([0.85, 0.8, 0.2], 2)):  # the line stops one draft short
        assert best_length(smooth, alphas) == short and best_length(level, alphas) == short + 1
    # the verify passes dipping alone is noise (these rounds do not), and a round of one draft never takes a
    # plain step's cost (another kind of round), even where both timings say it is cheaper
    rising = [10.31, 14.53, 17.77, 17.8, 17.9, 19.39, 22.0, 23.0]
    assert level_dips(line, verify, rising) == line
    assert level_dips(line, [11.05, 11.0] + verify[2:], [10.31, 9.0] + rising[2:]) == line


def test_unreached_positions_lean_on_evidence_not_on_a_guess():
    """A position leans on the one before it lifted toward 1 only where that one has trials behind it: past
    the deepest position reached, the estimates stay flat (a lift on a lift read 0.94 fifteen positions deep
    where a 16-row drafter's deep drafts were mostly wrong, and it drafted 15 at 800 tokens of context)."""
    mild = CostCurve(verify=[1.0 + 0.15 * m for m in range(16)], draft=[0.05] * 15)
    c = AdaptiveLength(mild, max_k=15, clock=None)
    for _ in range(20):
        c.update(3, 2)  # three drafts a round, two accepted: positions 1-3 judged, 4 and beyond never reached
    est = c.estimates()
    assert est[3] > est[2] and est[3] == pytest.approx(est[2] + (1 - est[2]) * c.cfg.lift)  # lifted on evidence
    assert est[4:] == pytest.approx([est[3]] * 11)  # a guess is not lifted again
    old = AdaptiveLength(mild, max_k=15, config=ControllerConfig(evidence=0.0), clock=None)  # a lift on every lean
    for _ in range(20):
        old.update(3, 2)
    assert old.estimates()[14] > 0.9 > est[14]
