"""`bench --modeled`: the controller against every fixed block, each round charged its calibrated cost."""

import json
import subprocess

import pytest

import mlx_spec
from mlx_spec.bench import encode
from mlx_spec.bench_modeled import batched_rate, compare, compare_batched, modeled_rate
from mlx_spec.curve import CostCurve
from mlx_spec.engine.loop import FixedLength


@pytest.fixture(scope="module")
def pair(target_dir, drafter_dir):
    return mlx_spec.load(str(target_dir), drafter=str(drafter_dir))


def test_each_round_is_charged_its_cost_at_its_context(pair):
    model, tok = pair
    ids = encode(tok, {"raw": "def add(a, b):"})
    b = model.drafter.block_size
    curve = CostCurve(verify=[1.0] * b, draft=[0.1] * (b - 1), rounds=[1.0] + [2.0 + k for k in range(1, b)])
    n, seconds = modeled_rate(model, tok, ids, 20, FixedLength(0), curve)
    assert n == 20 and seconds == pytest.approx(20.0)  # one token a plain round, each costing 1
    n, seconds = modeled_rate(model, tok, ids, 20, FixedLength(3), curve)
    # the prefill's plain round, then rounds of up to 3 drafts (fewer at the end: the tokens still wanted)
    assert n == 20 and 1.0 + 19 / 4 * curve.rounds[1] <= seconds <= 1.0 + 19 * curve.rounds[3]


def test_auto_stays_plain_where_drafting_cannot_pay(pair):
    model, tok = pair
    b = model.drafter.block_size
    dear = CostCurve(verify=[1.0] * b, draft=[50.0] * (b - 1), rounds=[1.0] + [60.0 + k for k in range(1, b)])
    rows = compare(model, tok, {"code": ["Write a Python function that adds two numbers."]}, dear, 24)
    (p,) = rows[0]["prompts"]
    assert p["best_block"] == 1 and len(p["fixed_tps"]) == model.drafter.block_size
    assert rows[0]["auto_over_best"] == p["auto_over_best"] == pytest.approx(p["auto_tps"] / max(p["fixed_tps"]))
    assert p["auto_over_best"] > 0.97  # plain throughout but for a probe or two
    assert rows[0]["auto_shared_over_best"] == p["auto_shared_over_best"] == pytest.approx(
        p["auto_shared_tps"] / max(p["fixed_tps"]))
    assert p["auto_shared_over_best"] > 0.97  # in the bench's order too


def test_in_the_bench_order_every_kind_shares_one_memory(pair):
    """auto in the bench's order: one controller memory across kinds and prompts, each prompt a warm-up and
    two counted repeats, each of its kind (as the timed bench sends them); the per-prompt auto keeps a memory
    of its own."""
    from mlx_spec.controller import AdaptiveLength, ControllerMemory

    model, tok = pair
    b = model.drafter.block_size
    flat = CostCurve(verify=[1.0] * b, draft=[0.01] * (b - 1), rounds=[1.0] * b)
    prompt = "Write a Python function that adds two numbers."
    rows = compare(model, tok, {"first": [prompt], "second": [prompt]}, flat, 24)
    (first,), (second,) = (r["prompts"] for r in rows)
    assert first["auto_tps"] == second["auto_tps"]  # a memory of its own: the same runs again
    ids, memory = encode(tok, prompt), ControllerMemory()

    def in_order():
        runs = [modeled_rate(model, tok, ids, 24, AdaptiveLength(flat, b - 1, memory=memory, clock=None, kind="chat"),
                             flat) for _ in range(3)][1:]
        return sum(n for n, _ in runs) / sum(s for _, s in runs)
    assert first["auto_shared_tps"] == pytest.approx(in_order())
    assert second["auto_shared_tps"] == pytest.approx(in_order())  # after the first kind's three requests

def test_cli_modeled_json(target_dir, drafter_dir, tmp_path):
    out = subprocess.run(["mlx-spec", "bench", "--model", str(target_dir), "--drafter", str(drafter_dir), "--modeled",
                          "--kinds", "code", "--max-tokens", "16", "--json"], capture_output=True, text=True,
                         timeout=300, env={**__import__("os").environ, "MLX_SPEC_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["modeled"]
    assert [r["kind"] for r in rows] == ["code"] and all(0 < p["auto_over_best"] for p in rows[0]["prompts"])


def batch_curve(b: int, draft_cost: float) -> CostCurve:
    """A flat one-row curve; batched passes cost 1 + 0.5 per token past the first (compute-bound rows)."""
    batch = [[rows, w, 1.0 + 0.5 * (rows * w - 1)] for rows in (2, 4) for w in range(1, b + 1)]
    draft_batch = [[rows, k, draft_cost] for rows in (2, 4) for k in range(1, b)]
    return CostCurve(verify=[1.0] * b, draft=[draft_cost] * (b - 1), rounds=[1.0] * b, batch=batch,
                     draft_batch=draft_batch)


def test_batched_rounds_are_charged_the_batched_costs(pair):
    model, tok = pair
    c = batch_curve(model.drafter.block_size, 0.1)
    prompt = {"raw": "def add(a, b):"}
    n, seconds, *_ = batched_rate(model, tok, [prompt], 2, 20, lambda: FixedLength(0), c)
    # both rows decode the same 20 tokens (the first from the prefill, uncharged), a plain pass of 2 rows a round
    assert n == 40 and seconds == pytest.approx(19 * c.batch_time(2, 1))
    n, seconds, *_ = batched_rate(model, tok, [prompt], 2, 20, lambda: FixedLength(3), c)
    rounds = seconds / (c.batch_time(2, 4) + c.draft_time(2, 3))  # every round 4 wide, both rows drafting...
    assert n == 40 and 19 / 4 <= rounds <= 19  # ...but the last ones, narrower (the tokens still wanted)


def test_two_clients_send_five_requests_one_after_another(pair):
    """A client's next request joins the batch as its last ends; "busy" counts the rounds of two rows only."""
    model, tok = pair
    c = batch_curve(model.drafter.block_size, 0.1)
    run = batched_rate(model, tok, [{"raw": "def add(a, b):"}], 2, 20, lambda: FixedLength(0), c, requests=5)
    assert run.tokens == 100 and run.seconds == pytest.approx(38 * c.batch_time(2, 1) + 19 * c.batch_time(1, 1))
    assert run.busy_tokens == 76 and run.busy_seconds == pytest.approx(38 * c.batch_time(2, 1))


def test_batched_auto_stays_plain_where_wide_passes_cannot_pay(pair):
    model, tok = pair
    rows = compare_batched(model, tok, {"code": ["Write a Python function that adds two numbers."]},
                           batch_curve(model.drafter.block_size, 5.0), 24, [2, 4])
    assert [(r["kind"], r["rows"]) for r in rows] == [("code", 2), ("code", 4)]
    for r in rows:
        assert r["best_block"] == 1 and r["over_plain"][0] == 1.0 and max(r["over_plain"][1:]) < 1
        assert r["auto_over_plain"] > 0.97 and r["auto_over_best"] == pytest.approx(r["auto_over_plain"])


def test_cli_batched_view_and_its_bad_input(target_dir, drafter_dir, tmp_path):
    env = {**__import__("os").environ, "MLX_SPEC_CACHE": str(tmp_path)}
    base = ["mlx-spec", "bench", "--model", str(target_dir), "--drafter", str(drafter_dir), "--kinds", "code",
            "--max-tokens", "12"]
    for extra, said in ((["--rows", "2"], "--rows is a view of --modeled"),
                        (["--modeled", "--rows", "two"], "--rows takes request counts")):
        out = subprocess.run(base + extra, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode != 0 and said in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run(base + ["--modeled", "--rows", "2", "--json"], capture_output=True, text=True, timeout=600,
                         env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    (row,) = report["modeled_batched"]
    assert row["rows"] == 2 and len(row["over_plain"]) == 8 and row["auto_over_plain"] > 0
    costs = report["meta"]["cost_curve"]  # what the view charged: batched passes at two contexts
    assert costs["long_batch_context"] > costs["batch_context"] and costs["seconds"]["long_batch"]
