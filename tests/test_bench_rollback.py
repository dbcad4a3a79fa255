"""The pieces of `mlx-spec bench --rollback` and doctor's rollback line, on tiny models: the fixed-acceptance
drafter accepts exactly its share, replay is timed only where there is recurrent state, and the recording
estimate exists only for Gated DeltaNet layers."""

import archs
import mlx_spec
from mlx_spec.bench_models import FixedAcceptance, recording_cost, replay_cost

PROMPT = "Hello, how are you"


def test_fixed_acceptance_and_rollback_costs(models_dir, tokenizer_dir):
    hybrid = archs.make(models_dir / "hy-qwen3_5", tokenizer_dir, "qwen3_5", seed=3)
    dense = archs.make(models_dir / "hy-qwen3_moe", tokenizer_dir, "qwen3_moe", seed=3)
    model, tok = mlx_spec.load(str(hybrid), drafter=None)
    truth = [t for r in mlx_spec.stream_generate(model, tok, PROMPT, max_tokens=40) for t in r.tokens]
    for rate, accepted in ((0.0, 0), (0.5, 4), (1.0, 7)):
        model.drafter = FixedAcceptance(tok.encode(PROMPT) + truth, rate, 8, vocab=model.config["vocab_size"])
        out, rounds = [], []
        for r in mlx_spec.stream_generate(model, tok, PROMPT, max_tokens=33, block_size=8):
            out += r.tokens
            rounds.append((r.drafted, r.accepted))
        assert out == truth[: len(out)]
        assert all(a == accepted for d, a in rounds if d == 7), (rate, rounds)
    cost = replay_cost(model, 4, prompt_len=8, repeats=1)
    assert sorted(cost) == [1, 2, 3] and all(t > 0 for t in cost.values())
    assert recording_cost(model, 4, repeats=1) is not None
    dense_model, _ = mlx_spec.load(str(dense), drafter=None)
    assert replay_cost(dense_model, 4) is None and recording_cost(dense_model, 4) is None


def test_rollback_bench_rows(tmp_path, monkeypatch):
    """`bench --rollback` end to end on its own models, shortened: the three models in turn, each row's
    output equal to plain decoding, and the hybrid's plain output the same with mlx-lm's recurrence."""
    import mlx_spec.bench_models as bm

    # 4 layers instead of 8 (the same layer shapes)
    monkeypatch.setattr(bm, "QWEN35", {**bm.QWEN35, "text_config": {**bm.QWEN35["text_config"], "num_hidden_layers": 4}})
    monkeypatch.setattr(bm, "DENSE", {**bm.DENSE, "num_hidden_layers": 4})
    rows = bm.rollback_bench(tmp_path, block=4, tokens=6, repeats=1, rates=(0.0, 1.0))
    assert [(r["model"], r["acceptance"]) for r in rows] == [
        (m, a) for m in ("qwen3.5-shaped", "qwen3.5-shaped, mlx-lm recurrence", "dense qwen3") for a in (0.0, 1.0)]
    assert all(r["identical"] for r in rows)
    assert all(r["vs_dense"] == 1.0 for r in rows if r["model"] == "dense qwen3")
    hybrid = {r["acceptance"]: r for r in rows if r["model"] == "qwen3.5-shaped"}
    assert hybrid[0.0]["rollback_ms_per_round"] > 0 and hybrid[1.0]["rollback_ms_per_round"] == 0
