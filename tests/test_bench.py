"""`mlx-spec bench`: its parts and its JSON; the full benchmark itself is not a unit test."""

import json
import subprocess

import pytest

import mlx_spec
from mlx_spec import bench

SCHEMA_KEYS = {"kind", "block", "plain_decode_tps", "spec_decode_tps", "plain_e2e_tps", "spec_e2e_tps", "plain_ttft",
               "spec_ttft", "speedup", "tau", "acceptance", "peak_gb", "identical", "divergences", "bound", "efficiency", "mode", "mean_draft",
               "tokens", "prompt_tokens", "cpu_speedup", "pair_tps", "pair_cpu_tps"}


def test_first_divergence():
    assert bench.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert bench.first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert bench.first_divergence([1, 2], [1, 2, 3]) == 2


def test_planted_divergence_is_reported(target_dir, drafter_dir, monkeypatch):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    honest = bench.run_spec

    def planted(*args, **kwargs):
        s = honest(*args, **kwargs)
        if len(s.tokens) > 5:
            s.tokens[5] = (s.tokens[5] + 1) % 300
        return s

    row = bench.bench_kind(model, tok, "code", ["def add(a, b):"], 12, 4, repeats=1)
    assert row.identical and not row.divergences
    monkeypatch.setattr(bench, "run_spec", planted)
    row = bench.bench_kind(model, tok, "code", ["def add(a, b):"], 12, 4, repeats=2)
    assert not row.identical and row.divergences == [5, 5]


def test_block_sizes_run_side_by_side(target_dir, drafter_dir, monkeypatch):
    """Every repeat runs plain and each size once, in a rotated order; the auto/fixed ratio is paired."""
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    calls, speeds = [], iter(range(1, 100))

    def fake(block):
        def run(model, tok, ids, max_tokens, *args, **kw):
            if max_tokens > 4:  # not a warm-up
                calls.append(block)
            v = float(next(speeds))
            return bench.Sample([1, 2, 3], 0.0, v, v, 0.0, 2.0, [0.5], 1.0, v)
        return run

    monkeypatch.setattr(bench, "run_plain", fake("plain"))
    monkeypatch.setattr(bench, "run_spec", lambda m, t, ids, n, b, kind: fake(b or "auto")(m, t, ids, n))
    rows = bench.bench_sizes(model, tok, "code", ["def add(a, b):"], 12, [None, 4], repeats=3)
    assert calls == ["plain", "auto", 4, "auto", 4, "plain", 4, "plain", "auto"]
    assert [r.block for r in rows] == ["auto", "4"] and all(len(r.pair_tps) == 3 for r in rows)
    auto, fixed = rows
    ratios = sorted(a / b for a, b in zip(auto.pair_tps, fixed.pair_tps))
    assert bench.summary(rows)[0]["auto_vs_best_fixed"] == ratios[1]


def test_cli_json(target_dir, drafter_dir, tmp_path):
    out = subprocess.run(["mlx-spec", "bench", "--model", str(target_dir), "--drafter", str(drafter_dir),
                          "--kinds", "code,long", "--long-context", "64", "--max-tokens", "8", "--repeats", "1",
                          "--block-sizes", "auto,3", "--modes", "auto,lookup", "--json"], capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "MLX_SPEC_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema"] == "mlx-spec-bench/2" and "cost_curve" in data["meta"]
    assert data["meta"]["blas"] and len(data["meta"]["load_average"]) == 3 and data["meta"]["cost_curve"]["seconds"]
    assert [(s["mode"], s["kind"]) for s in data["summary"]] == [(m, k) for m in ("auto", "lookup") for k in ("code", "long")]
    assert all(s["best_fixed_block"] == "3" and s["auto_vs_best_fixed"] > 0 for s in data["summary"])
    rows = data["results"]
    assert all(r["cpu_speedup"] > 0 for r in rows)  # the same pairs per CPU-second
    assert [(r["mode"], r["kind"], r["block"]) for r in rows] == [
        (m, k, b) for m in ("auto", "lookup") for k in ("code", "long") for b in ("auto", "3")]
    for r in rows:
        assert set(r) == SCHEMA_KEYS and r["identical"] and r["plain_decode_tps"] > 0
        assert r["tau"] >= 1 or (r["tau"] == 0 and r["mean_draft"] == 0)  # τ 0: no round drafted
    assert rows[1]["bound"] is not None and rows[1]["efficiency"] is not None


def test_plot_needs_matplotlib_or_writes_png(tmp_path):
    row = bench.Row("code", "4", 10, 12, 9, 11, 0.1, 0.1, 1.2, 2.0, [0.5], 0.1, True)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(mlx_spec.MlxSpecError, match="pip install matplotlib"):
            bench.plot([row], str(tmp_path / "x.png"))
        return
    bench.plot([row], str(tmp_path / "x.png"))
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"


def test_mlx_lm_draft_model_mode_runs_side_by_side(target_dir, drafter_dir):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    ids = tok.encode("def add(a, b):")
    plain = bench.run_plain(model, tok, ids, 16)
    other = bench.run_mlx_lm_draft(model, tok, ids, 16, draft_model=model.model, num_draft=2)
    assert other.tokens == plain.tokens and other.decode_tps > 0


def test_raw_and_long_chat_kinds(target_dir, drafter_dir):
    from types import SimpleNamespace

    from mlx_spec.commands.bench import prompt_sets

    _, tok = mlx_spec.load(str(target_dir), drafter=None)
    args = SimpleNamespace(kinds="raw,long-chat", long_context=1500, prompts=None)
    sets = prompt_sets(args, tok)
    raw = sets["raw"][0]
    assert bench.encode(tok, raw) == tok.encode(raw["raw"])  # no chat template around a raw completion
    chat = sets["long-chat"][0]
    assert len(chat) >= 3 and chat[-1]["role"] == "user" and len(bench.encode(tok, chat)) <= 1500
    with pytest.raises(mlx_spec.MlxSpecError, match="unknown prompt kind"):
        prompt_sets(SimpleNamespace(kinds="cod", long_context=64, prompts=None), tok)


def test_summary_puts_auto_against_the_best_fixed_block():
    rows = [bench.Row("code", b, 10, 10 * s, 9, 9, 0.1, 0.1, s, 2.0, [0.5], 0.1, True)
            for b, s in (("auto", 2.0), ("4", 1.5), ("8", 2.5))]
    (s,) = bench.summary(rows)
    assert s["best_fixed_block"] == "8" and s["auto_vs_best_fixed"] == pytest.approx(0.8)


def test_vs_dspark_needs_mlx_dspark(target_dir, drafter_dir):
    try:
        import mlx_dspark  # noqa: F401
    except ImportError:
        from mlx_spec.bench_dspark import load_peer

        model, _ = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
        with pytest.raises(mlx_spec.MlxSpecError, match="needs mlx-dspark"):
            load_peer(model)
        return
    pytest.skip("mlx-dspark is importable here: the side-by-side runs in the benchmark, not as a unit test")


def test_each_request_goes_to_the_controller_as_its_kind(target_dir, drafter_dir, monkeypatch):
    """Raw continuations and chats accept so differently that the controller remembers each kind apart; the
    bench sends ids, so it names the kind a user's request of each prompt would have."""
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    bench.run_spec(model, tok, bench.encode(tok, {"raw": "def add(a, b):"}), 12, None, "raw")
    assert set(model.memory.by_kind) == {"raw"}
    kinds = []

    def spec(m, t, ids, n, b, kind):
        kinds.append(kind)
        return bench.Sample([1, 2, 3], 0.0, 1.0, 1.0, 0.0, 2.0, [0.5], 1.0, 1.0)
    monkeypatch.setattr(bench, "run_plain", lambda *a, **kw: bench.Sample([1, 2, 3], 0.0, 1.0, 1.0, 0.0))
    monkeypatch.setattr(bench, "run_spec", spec)
    prompts = [{"raw": "def f("}, "Write a function.", [{"role": "user", "content": "Hi"}]]
    bench.bench_sizes(model, tok, "mixed", prompts, 12, [None], repeats=1)
    assert kinds == ["raw", "raw", "chat", "chat", "chat", "chat"]  # (each prompt's warm-up, then its repeat)
