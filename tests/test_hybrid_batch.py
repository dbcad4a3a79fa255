"""Batched verification of hybrid, sliding-window and MoE targets: one target pass per round for all
requests, each rolling back by its own acceptance, and every request decodes exactly as alone.

Greedy and seeded sampled requests join and leave mid-flight (the helpers of tests/test_batch.py).
The drafter drafts from the target itself and corrupts some drafts by (seed, position) only, so a
request's drafts do not depend on its company and some are rejected every few rounds.
"""

import pytest

import archs
import factory
import mlx_spec
from mlx_spec.engine import batch, loop
from mlx_spec.engine.sampling import SamplingParams
from test_batch import alone, together
from test_hybrid import FAMILIES
REQUESTS = [  # prompt, sampling, block size
    ("def add(a, b):", SamplingParams(), 4),
    ("Hello, how are you today? I am fine", SamplingParams(), 2),
    ("for i in range(10):", SamplingParams(temperature=0.8, top_k=20, seed=3), 5),
    ("import os", SamplingParams(temperature=1.0, top_p=0.9, seed=9, repetition_penalty=1.2), 3),
]


@pytest.mark.parametrize("name", FAMILIES)
def test_batched_equals_alone(name, models_dir, tokenizer_dir, monkeypatch):
    target = archs.make(models_dir / f"hy-{name}", tokenizer_dir, name, seed=3)
    model, tok = mlx_spec.load(str(target), drafter=None)
    model.drafter = factory.SelfDrafter(model.model, block_size=5, mode="argmax-onehot", error_rate=0.3, seed=1)
    sizes, replays = [], []
    real_batch, real_replay = loop.batch_caches, batch.replay
    monkeypatch.setattr(loop, "batch_caches", lambda caches: sizes.append(len(caches)) or real_batch(caches))
    monkeypatch.setattr(loop, "replay", lambda pcs: replays.append(sum(bool(pc.deferred) for pc in pcs))
                        or real_replay(pcs))
    solo = [alone(model, tok, r + (16,)) for r in REQUESTS]
    sizes.clear()
    batched = together(model, tok, [r + (16,) for r in REQUESTS], join_at=[0, 0, 1, 3])
    for i, (a, b) in enumerate(zip(solo, batched)):
        assert a == b, (name, i, REQUESTS[i][1])
    assert max(sizes) >= 3, name  # several blocks really shared one verify pass
    assert together.left_mid_flight, name  # and some requests left while others went on
    if name in ("qwen3_5", "nemotron_h", "falcon_h1", "lfm2", "kimi_linear"):
        assert max(replays) >= 2, name  # several rows rolled back by their own lengths in one round
