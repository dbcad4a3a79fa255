"""What a generation returns and refuses: tokens up to a stop string, one definition of τ, block-size bounds."""

import itertools
import subprocess
import sys

import pytest

import mlx_spec
from mlx_spec.engine.loop import Round
from mlx_spec.models import DEFAULT_DRAFTER, DEFAULT_TARGET

PROMPT = [{"role": "user", "content": "Write a Python function that reverses a string."}]


@pytest.fixture(scope="module")
def pair():
    return mlx_spec.load(str(DEFAULT_TARGET), drafter=str(DEFAULT_DRAFTER))


def tokens_of(responses):
    return [t for r in responses for t in r.tokens]


def stop_inside_a_round(tok, ref, ends):
    """A stop string that completes at a token strictly inside a round of several tokens (rounds end after
    `ends` tokens), mid-way through that token's piece of text, and nowhere before it; and that token's count."""
    inside = [j for a, b in zip([0] + ends, ends) for j in range(a + 1, b) if j >= 9] or [10]
    for j in inside:
        before, upto = tok.decode(ref[: j - 1]), tok.decode(ref[:j])
        stop = upto[len(before) - 2:]
        if stop.strip() and stop not in before:
            return stop, j
    raise AssertionError("no usable stop string in this output")


@pytest.mark.parametrize("block", [1, 2, 4, 6, 8])
def test_tokens_stop_at_the_one_that_completes_a_stop_string(pair, block):
    model, tok = pair
    ref = tokens_of(mlx_spec.stream_generate(model, tok, PROMPT, 48, block_size=1))
    ends = list(itertools.accumulate(len(r.tokens) for r in mlx_spec.stream_generate(model, tok, PROMPT, 48,
                                                                                      block_size=block)))
    stop, cut = stop_inside_a_round(tok, ref, ends if block > 1 else [])
    out = list(mlx_spec.stream_generate(model, tok, PROMPT, 48, block_size=block, stop=[stop]))
    last = out[-1]
    assert tokens_of(out) == ref[:cut]
    assert last.generation_tokens == cut and last.finish_reason == "stop"
    assert "".join(r.text for r in out) == tok.decode(ref[:cut]).split(stop)[0]
    if block > 1:  # the stop completed inside an accepted block: the round committed more than was output
        assert cut not in ends and last.spec.accepted + last.spec.rounds + 1 > cut, last.spec.as_dict()


def test_tau_counts_only_rounds_that_drafted():
    s = mlx_spec.SpecStats()
    for r in [Round([1], 0, 0), Round([1], 0, 0), Round([1, 2, 3, 4], 3, 3), Round([5, 6], 4, 1)]:
        s.add(r)
    assert s.tau == pytest.approx(1 + 4 / 2)  # vLLM's mean acceptance length
    assert s.tokens_per_pass == pytest.approx(8 / 4)
    assert s.as_dict()["drafting_rounds"] == 2
    assert mlx_spec.SpecStats().tau == 0.0


class Alternate:
    """Draft lengths 0, 3, 0, 3, ...: a run with plain and drafting rounds, as the controller makes."""

    def __init__(self):
        self.n = 0

    def next(self, context: int = 0) -> int:
        self.n += 1
        return 3 * (self.n % 2 == 0)

    def update(self, drafted: int, accepted: int, source=None) -> None:
        pass

    def expect(self, source) -> None:
        pass

    def interrupt(self) -> None:
        pass


def test_tau_of_a_mixed_run_matches_its_counters(pair):
    model, tok = pair
    g = mlx_spec.make_generation(model, tok, PROMPT, 64, draft_lengths=Alternate())
    out = [g.start()]
    while not g.finished:
        out.append(mlx_spec.step_all(model, [g])[0])
    s = out[-1].spec
    assert 0 < s.drafting_rounds < s.rounds
    assert s.tau == pytest.approx(1 + s.accepted / s.drafting_rounds) and s.tau > s.tokens_per_pass
    assert s.as_dict()["tau"] == pytest.approx(s.tau, abs=1e-4)


@pytest.mark.parametrize("bad", [0, -1, 9, 99, 2.5, True])
def test_block_size_is_checked_by_the_library(pair, bad):
    model, tok = pair
    with pytest.raises(mlx_spec.MlxSpecError, match="block size must be an integer from 1 to 8"):
        mlx_spec.make_generation(model, tok, "hi", 8, block_size=bad)


def test_block_size_without_a_drafter_and_for_lookup():
    plain, tok = mlx_spec.load(str(DEFAULT_TARGET), drafter=None)
    mlx_spec.make_generation(plain, tok, "hi", 8, block_size=4)  # plain decoding: nothing to bound it
    with pytest.raises(mlx_spec.MlxSpecError, match="of at least 1"):
        mlx_spec.make_generation(plain, tok, "hi", 8, block_size=0)
    lookup, _ = mlx_spec.load(str(DEFAULT_TARGET), mode="lookup", block_size=16)
    mlx_spec.make_generation(lookup, tok, "hi", 8, block_size=16)
    with pytest.raises(mlx_spec.MlxSpecError, match="from 1 to 16"):
        mlx_spec.make_generation(lookup, tok, "hi", 8, block_size=17)


@pytest.mark.parametrize("value", ["0", "9", "99"])
def test_cli_refuses_a_block_size_the_drafter_cannot_verify(value):
    out = subprocess.run([sys.executable, "-m", "mlx_spec.cli", "generate", "--prompt", "hi", "-m", "4",
                          "--block-size", value], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "block size must be an integer" in out.stderr, out.stderr


def test_server_usage_counts_only_tokens_up_to_the_stop(pair):
    """usage.completion_tokens inherits the library's count: tokens past the stop string are not billed."""
    from mlx_spec.app.server.config import ModelConfig, ServerConfig
    from test_server_harness import RunningServer

    model, tok = pair
    ref = tokens_of(mlx_spec.stream_generate(model, tok, PROMPT, 48, block_size=1))
    before, upto = tok.decode(ref[:9]), tok.decode(ref[:10])
    stop = upto[len(before) - 2:]
    cut = next(j for j in range(1, len(ref) + 1) if stop in tok.decode(ref[:j]))
    server = RunningServer(ServerConfig(model=ModelConfig(str(DEFAULT_TARGET), str(DEFAULT_DRAFTER), block_size=6)))
    try:
        r = server.client().chat.completions.create(model="m", messages=PROMPT, max_tokens=48, stop=[stop])
        assert r.usage.completion_tokens == cut and r.choices[0].finish_reason == "stop"
        assert r.choices[0].message.content == tok.decode(ref[:cut]).split(stop)[0]
    finally:
        server.stop()
