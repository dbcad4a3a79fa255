"""Checks the drafter families' tests share (no tests here): greedy identity at each block size, pooled
rejection sampling on the tiny target, seeded sampling equal to plain seeded decoding, a head trained for
a few steps on the target's features being accepted, and eval-drafter / bench running a drafter."""

import functools
import json

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

import mlx_spec
from mlx_spec.calibrate import cache_dir, curve_key
from mlx_spec.curve import CostCurve
from mlx_spec.cli import main
from mlx_spec.engine.sampling import SamplingParams
from test_lossless_greedy import PROMPTS, spec
from test_lossless_greedy import plain as _plain
from test_lossless_sampling import TINY_N, TINY_PROMPT, chi2_pvalue, count_runs, exact_joint, law_pvalue

TINY_LAW = SamplingParams(temperature=0.9, top_k=5, logit_bias={2: -2.0})


@functools.lru_cache(maxsize=None)
def _plain_cached(model_dir: str, prompt: str, n: int) -> tuple:
    return tuple(_plain(model_dir, prompt, n))


def plain(model_dir, prompt, n) -> list[int]:
    """mlx-lm's plain greedy tokens, computed once per (folder, prompt, length) in a session: the test
    folders are written once and never change, and loading + decoding is most of a greedy check's time."""
    return list(_plain_cached(str(model_dir), prompt, n))


def assert_greedy_identity(model, tok, target, prompts, blocks, label, n: int = 24) -> None:
    """Speculative greedy output equals mlx-lm's at every block size, and the drafter did draft."""
    for prompt in prompts:
        ref = plain(target, prompt, n)
        for block in blocks:
            got, last = spec(model, tok, prompt, n, block_size=block)
            assert got == ref, (label, prompt, block)
            assert last.spec.drafted > 0


def pooled_sampling(model, tok, params, runs: int, joint: bool = False, law_model=None):
    """Unseeded rejection sampling of TINY_PROMPT's first TINY_N tokens, 2..7 drafts a round pooled, against
    the exact law (`law_model` as exact_joint reads the target; the loaded one by default): the p-value (of
    the whole joint with `joint`, else law_pvalue's) and the drafts accepted at each position."""
    exact = exact_joint(law_model or model.model, tok.encode(TINY_PROMPT), params, TINY_N, eos=set(tok.eos_token_ids))
    counts = count_runs(model, tok, params, runs, TINY_PROMPT, TINY_N, tuple(range(3, 9)), seeded=False)
    p = chi2_pvalue(exact, counts, runs) if joint else law_pvalue(exact, counts, runs, TINY_N)
    return p, [a for _, a in count_runs.positions]


def assert_seeded_is_plain_seeded(model, tok, seeds, law=TINY_LAW) -> None:
    """Seeded requests draw position-keyed noise: the output is plain seeded decoding's, whatever the drafts."""
    for seed in seeds:
        params = SamplingParams(**{**law.__dict__, "seed": seed})
        ref = spec(model, tok, TINY_PROMPT, 12, sampling=params, speculative=False)[0]
        for block in (3, 8):
            got, last = spec(model, tok, TINY_PROMPT, 12, sampling=params, block_size=block)
            assert got == ref and last.spec.drafted > 0, (seed, block)


def train(drafter, target, tokens: list[int], steps: int = 120, lr: float = 3e-3) -> None:
    """Teacher-forced training on the target's own features: pair (g_j, x_{j+1}) predicts x_{j+2}."""
    _, hidden = target(mx.array([tokens]), cache=None)
    g = drafter.features(hidden)[:, :-2]
    x, y = mx.array([tokens[1:-1]]), mx.array(tokens[2:])
    module = drafter.model if hasattr(drafter, "model") else drafter.head

    def loss_fn(_):
        return nn.losses.cross_entropy(drafter.logits(drafter.step(g, x, None)), y).mean()

    opt = optim.Adam(lr)
    step = nn.value_and_grad(module, loss_fn)
    for _ in range(steps):
        loss, grads = step(None)
        opt.update(module, grads)
        mx.eval(module.parameters(), opt.state)
    train.loss = loss.item()


def first_draft_share(model, tok, prompt, n=64, block=4):
    """The share of rounds whose first draft the target accepted (output checked against mlx-lm)."""
    ref = plain(model.target_path, prompt, n)
    got, last = spec(model, tok, prompt, n, block_size=block)
    assert got == ref
    return last.spec.accepted_per_position[0] / last.spec.drafted_per_position[0]


def assert_training_gets_accepted(model, tok, target, prompt=PROMPTS[0]) -> None:
    """Untrained, the head's first draft is hardly ever accepted; fitted (first step only) to the target's
    greedy continuation of `prompt`, in every round."""
    before = first_draft_share(model, tok, prompt)
    train(model.drafter, model.target, tok.encode(prompt) + plain(target, prompt, 64))
    after = first_draft_share(model, tok, prompt)
    assert before < 0.1 and after > 0.95, (before, after, train.loss)


def preset_cost_curve(common: list[str]) -> None:
    """Store a cost curve for the pair bench will load, so that it skips its few-second calibration: the
    smoke test is about bench running the drafter, calibration has tests of its own (test_calibrate)."""
    opts = dict(zip(common[::2], common[1::2]))
    model, _ = mlx_spec.load(opts["--model"], drafter=opts.get("--drafter", "auto"), mode=opts.get("--mode", "auto"))
    b = model.drafter.block_size
    curve = CostCurve(verify=[1e-3 * (1 + 0.05 * m) for m in range(b)], draft=[2e-4 * k for k in range(1, b)],
                      rounds=[1e-3 * (1 + 0.08 * k) for k in range(b)])
    path = cache_dir() / "curves" / f"{curve_key(model)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(curve.__dict__))


def assert_eval_drafter_and_bench_run(capsys, common: list[str], eval_args: list[str], bench_block: int,
                                      mode: str | None = None) -> None:
    """eval-drafter prints its τ table; bench's rows are all identical to plain decoding (and of `mode`)."""
    preset_cost_curve(common)
    assert main(["eval-drafter", *common, *eval_args]) == 0
    assert capsys.readouterr().out.strip()  # the τ table
    assert main(["bench", *common, "--kinds", "code", "--max-tokens", "8", "--repeats", "1", "--block-sizes",
                 str(bench_block), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert rows and all(r["identical"] and (mode is None or r["mode"] == mode) for r in rows)
