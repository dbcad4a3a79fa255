"""Prompt lookup picked per conversation beside a model drafter (drafters/pick.py): the choice follows
what each source would have had accepted, and output stays the target's, alone and batched."""

import random

import mlx.core as mx
import pytest

import factory
import mlx_spec
from mlx_spec.drafters import model_drafter
from mlx_spec.drafters.pick import RETRY, PickDrafter
from mlx_spec.engine.sampling import Sampler, SamplingParams
from drafter_checks import plain
from test_batch import together
from test_lossless_greedy import spec
from test_lossless_sampling import BLOCKS, LAWS, TINY_N, TINY_PROMPT, TINY_RUNS, count_runs, exact_joint, law_pvalue, tiny  # noqa: F401

GREEDY = Sampler(SamplingParams(), 100).drafting(0)


def play(drafter, truth: list[int], prompt: int, k: int = 7):
    """The loop's bookkeeping over a known continuation: each round commits the anchor and the drafts
    that agree with `truth`, and the token after them becomes the next anchor. Returns the state and
    which source drafted each round ("lookup" or "model")."""
    state, sources = drafter.make_state(), []
    drafter.observe(state, None, truth[:prompt])
    at = prompt  # the anchor's position
    while at + 1 + k < len(truth):
        before = dict(state.drafted)
        got = drafter.propose(state, truth[at], k, GREEDY).tokens.tolist()
        sources.append(next(s for s in before if state.drafted[s] > before[s]))
        a = 0
        while a < len(got) and got[a] == truth[at + 1 + a]:
            a += 1
        drafter.observe(state, None, truth[at : at + 1 + a])
        at += 1 + a
    return state, sources


def repeating(n: int, seed: int = 0) -> list[int]:
    """n random tokens, then the same n again: the second half is prompt lookup's home ground."""
    rng = random.Random(seed)
    head = [rng.randrange(50, 100) for _ in range(n)]
    return head + head


def test_lookup_drafts_where_the_text_repeats_and_the_model_is_retried():
    truth = repeating(120)
    bad_model = factory.OracleDrafter(truth, block_size=8, error_rate=1.0, vocab=40)  # never right
    state, sources = play(PickDrafter(bad_model), truth, prompt=125)
    assert sources[0] == "model"  # the model drafts until both have a record
    assert sources[1:].count("lookup") >= len(sources) // 2
    eligible_model = [i for i, s in enumerate(sources[1:], 1) if s == "model"]
    assert eligible_model and all(b - a == RETRY for a, b in zip(eligible_model, eligible_model[1:]))
    assert state.records["lookup"].mean > 5 > 0 == state.records["model"].mean


def test_the_model_keeps_drafting_where_it_is_better():
    rng = random.Random(1)
    truth = [rng.randrange(4) for _ in range(300)]  # 3-grams recur, what follows them does not
    state, sources = play(PickDrafter(factory.OracleDrafter(truth, block_size=8, error_rate=0.0)), truth, prompt=40)
    assert set(sources) == {"model"}
    assert state.records["lookup"].n > 0 and state.records["lookup"].mean < state.records["model"].mean == 7


def test_lookup_is_judged_on_plain_rounds_too():
    """After the model's misses the controller runs plain: lookup, judged only in rounds that drafted, could
    never lead there, and raw continuations it would have copied ran plain. Plain rounds' tokens judge it too
    (as long as the last round's drafts), so it leads once the text repeats."""
    truth = repeating(120)
    drafter = PickDrafter(factory.OracleDrafter(truth, block_size=8, error_rate=1.0, vocab=40))
    state = drafter.make_state()
    drafter.observe(state, None, truth[:125])
    assert drafter.propose(state, truth[125], 3, GREEDY).source != "lookup"  # the model drafts first: misses
    for at in range(125, 145):  # then plain rounds, one committed token each
        drafter.observe(state, None, truth[at : at + 1])
        drafter.next_source(state)
    assert state.records["lookup"].n >= 4 and state.records["lookup"].mean >= 3 > state.records["model"].mean
    assert drafter.next_source(state) == "lookup"


def test_a_candidate_is_judged_on_the_tokens_after_the_round_that_ended_it():
    """The model's round accepts nothing, so it commits two tokens; lookup's candidate (all of which is
    right) must be judged over the rounds that follow, not capped at what that round committed."""
    truth = repeating(60)
    drafter = PickDrafter(factory.OracleDrafter(truth, block_size=8, error_rate=1.0, vocab=40))
    state = drafter.make_state()
    drafter.observe(state, None, truth[:70])
    drafter.propose(state, truth[70], 7, GREEDY)  # the model drafts (no records yet): all wrong
    drafter.observe(state, None, truth[70:71])
    drafter.propose(state, truth[71], 7, GREEDY)
    assert state.records["model"].mean == 0 and state.records["lookup"].n == 0  # lookup's 7 not yet settled
    drafter.observe(state, None, truth[71:80])
    drafter.propose(state, truth[80], 7, GREEDY)
    assert state.records["lookup"].mean == 7


def test_trim_takes_back_both_sources_and_the_pending_judgments():
    truth = repeating(60)
    drafter = PickDrafter(factory.OracleDrafter(truth, block_size=8, error_rate=1.0, vocab=40))
    state, _ = play(drafter, truth, prompt=70)
    n = state.offset
    state.pending.append(state.pending[0] if state.pending else None)
    assert state.trim(5) == 5
    assert state.offset == state.model.offset == n - 5 and state.pending == []
    assert state.lookup.tokens == truth[: n - 5]


def test_auto_mode_wraps_a_model_drafter_and_named_modes_do_not(target_dir, drafter_dir):
    model, _ = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    assert isinstance(model.drafter, PickDrafter) and model_drafter(model.drafter) is model.drafter.inner
    assert model.drafter.block_size == model.drafter.inner.block_size and model.drafter.tap_ids
    assert not isinstance(mlx_spec.load(str(target_dir), drafter=str(drafter_dir), mode="dflash")[0].drafter, PickDrafter)


REPEATS = "for i in range(10):\n    print(i)\nfor i in range(10):\n    print("


@pytest.mark.parametrize("prompt", [REPEATS, "def add(a, b):"])
def test_greedy_identity_with_both_sources(target_dir, drafter_dir, prompt):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    ref = plain(target_dir, prompt, 40)
    cache = mlx_spec.make_prompt_cache(model)
    for block in (3, 8):
        got, last = spec(model, tok, prompt, 40, block_size=block, prompt_cache=cache)  # records carry over
        assert got == ref, block
        assert last.spec.drafted > 0
    if prompt == REPEATS:
        drafted = cache.drafter_state().drafted
        assert drafted["lookup"] > 0 and drafted["model"] > 0, drafted


def test_batched_rounds_mix_sources_and_stay_lossless(target_dir, drafter_dir):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    states, real = {}, model.drafter.propose_batch
    model.drafter.propose_batch = lambda batch, *a: states.update({id(s): s for s in batch}) or real(batch, *a)
    requests = [(p, SamplingParams(), 6) for p in (REPEATS, "def add(a, b):", "Hello", REPEATS + "i)\n")]
    outs = together(model, tok, requests, join_at=[0, 0, 1, 2])
    assert outs == [plain(target_dir, p, 24) for p, _, _ in requests]
    drafted = {src: sum(s.drafted[src] for s in states.values()) for src in ("lookup", "model")}
    assert drafted["lookup"] > 0 and drafted["model"] > 0, drafted


def test_sampled_output_follows_the_target_with_either_source_drafting(tiny):
    """Rejection sampling with the source picked per round (lookup's q one-hot, the model's its own): the
    first tokens' law is the target's. The records carry across runs (one cache), so both sources draft."""
    model, tok = mlx_spec.load(str(tiny["target"]), drafter=str(tiny["dflash"]))
    made, real = [], model.drafter.make_state
    model.drafter.make_state = lambda: made.append(real()) or made[-1]
    params = LAWS["lookup"]  # letters made likelier: lookup finds continuations in the prompt
    exact = exact_joint(model.model, tok.encode(TINY_PROMPT), params, TINY_N, eos=set(tok.eos_token_ids))
    counts = count_runs(model, tok, params, TINY_RUNS, TINY_PROMPT, TINY_N, BLOCKS, seeded=False)
    assert law_pvalue(exact, counts, TINY_RUNS, TINY_N) > 1e-3
    (state,) = made
    assert min(state.drafted.values()) >= 50, state.drafted


def test_the_controller_plans_each_source_from_its_own_rounds():
    """Lookup's fully accepted runs must not have the model drafter drafting long blocks it rarely gets
    right, nor the model's misses keep lookup short: each round is planned from the estimates of the
    source that drafted the last one."""
    from mlx_spec.curve import CostCurve
    from mlx_spec.controller import AdaptiveLength

    lengths = AdaptiveLength(CostCurve(verify=[1.0 + 0.05 * m for m in range(8)], draft=[0.1] * 7), 7, clock=None)
    for _ in range(12):
        lengths.update(7, 7, "lookup")
    lookup_k = lengths.next()
    for _ in range(12):
        lengths.update(7, 0)  # the model drafter (no source named)
    assert lookup_k == 7 and lengths.next() == 0
    lengths.update(1, 1, "lookup")
    assert lengths.next() == 7  # lookup's own record, not the model's misses


def test_lookup_is_expected_before_the_anchor_is_read(target_dir, drafter_dir):
    """While the loop runs a token ahead it plans the next round without its anchor: the drafter tells
    which source will likely draft it, from the tokens so far (lookup's index is fed at once, not with
    the model drafter's rows)."""
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    pc = mlx_spec.make_prompt_cache(model)
    ids = tok.encode(REPEATS)
    unseen = next(t for t in range(model.vocab_size) if t not in ids)
    _, hidden = model.target(mx.array([ids + [unseen]]), None)
    pc.add(ids, hidden[:, :-1])
    state = pc._state
    assert state.lookup.tokens == ids and state.model.offset == 0  # the model's rows wait for its next pass
    assert pc.next_source() is None  # no records yet: the model
    state.records["model"].add(0)
    state.records["lookup"].add(5)
    assert pc.next_source() == "lookup"  # the last tokens occurred before
    pc.add([unseen], hidden[:, -1:])
    assert pc.next_source() is None  # a token never seen: lookup has nothing to follow
    pc.drafter_state()  # the model catches up; lookup does not take those tokens twice
    assert state.lookup.tokens == ids + [unseen] and state.model.offset == len(ids) + 1


def test_the_next_request_starts_each_source_from_that_sources_estimates():
    """On raw text lookup's long accepted runs handed on as the model's had the next request's model drafting
    15 a round where it had 2 accepted; the model's misses handed on as lookup's would keep lookup plain.
    Each source starts from its own (of the request's kind; of every kind where that kind has none yet)."""
    from mlx_spec.curve import CostCurve
    from mlx_spec.controller import AdaptiveLength, ControllerMemory

    curve = CostCurve(verify=[1.0 + 0.3 * m for m in range(8)], draft=[0.3] * 7)  # drafting pays at high acceptance
    memory = ControllerMemory()
    first = AdaptiveLength(curve, 7, memory=memory, clock=None, kind="raw")
    for source in [None, "lookup"] * 12:
        first.update(7, 0 if source is None else 7, source)
    assert memory.by_kind["raw"][0] < 0.2 < 0.9 < min(memory.by_source["lookup"]["raw"])
    after = AdaptiveLength(curve, 7, memory=memory, clock=None, kind="raw")
    assert after.next() == 0  # the model's misses
    after.expect("lookup")
    assert after.next() == 7  # lookup's runs
    assert memory.start("chat") == memory.by_kind["raw"]  # no chat yet: every kind's
    assert memory.start("chat", "lookup") == memory.start("raw", "lookup")
    memory.record("chat", memory.enroll(), [0.5] * 7, 8, "lookup")
    assert memory.start("chat", "lookup") == [0.5] * 7 != memory.start("raw", "lookup")


def test_trimming_takes_lookup_and_a_model_that_lags_back_to_one_length():
    """Lookup sees every committed row at once; the model drafter may not have seen the last ones yet (they
    wait in the prompt cache): taking n rows back leaves both at the same length."""
    from mlx_spec.drafters.lookup import LookupState
    from mlx_spec.drafters.pick import PickState

    class Rows:  # a model drafter's state: the rows it has seen
        def __init__(self, n):
            self.offset = n

        def trim(self, n):
            self.offset -= n
            return n

    lookup = LookupState(3)
    lookup.extend([1, 2, 3, 4, 5, 6, 7, 8])
    state = PickState(lookup, Rows(5))  # the model has not seen the last 3 rows
    state.trim(2)
    assert lookup.tokens == [1, 2, 3, 4, 5, 6] and state.model.offset == 5
    state.trim(3)
    assert lookup.tokens == [1, 2, 3] and state.model.offset == 3
