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
