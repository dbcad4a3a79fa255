"""`bench --modeled`: the controller against every fixed block, each round charged its calibrated cost."""

import json
import subprocess

import pytest

import mlx_spec
from mlx_spec.bench import encode
from mlx_spec.bench_modeled import compare, modeled_rate
from mlx_spec.calibrate import CostCurve
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


def test_cli_modeled_json(target_dir, drafter_dir, tmp_path):
    out = subprocess.run(["mlx-spec", "bench", "--model", str(target_dir), "--drafter", str(drafter_dir), "--modeled",
                          "--kinds", "code", "--max-tokens", "16", "--json"], capture_output=True, text=True,
                         timeout=300, env={**__import__("os").environ, "MLX_SPEC_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["modeled"]
    assert [r["kind"] for r in rows] == ["code"] and all(0 < p["auto_over_best"] for p in rows[0]["prompts"])
