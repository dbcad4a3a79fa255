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
from mlx_spec.engine import batch, loop, rollback
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
    replays = check(name, models_dir, tokenizer_dir, monkeypatch, REQUESTS, 16, join_at=[0, 0, 1, 3], shared=3)
    if name in ("qwen3_5", "nemotron_h", "falcon_h1", "lfm2", "kimi_linear"):
        assert max(replays) >= 2, name  # several rows rolled back by their own lengths in one round


@pytest.mark.parametrize("name", ["deepseek_v32", "minimax_m3_vl", "kimi_k3"])
def test_batched_newer_families_equal_alone(name, models_dir, tokenizer_dir, monkeypatch):
    """Each default run (the full test above is -m slow for them): deepseek_v32's top-k indexer reads the batch
    view's keys; minimax_m3_vl's block-sparse indexer cannot take a padded batch, so its rounds verify one
    request at a time (rollback.UNBATCHED); kimi_k3's KDA layers unpack the stacked recurrent states."""
    check(name, models_dir, tokenizer_dir, monkeypatch, [REQUESTS[0], REQUESTS[2], REQUESTS[3]], 10,
          join_at=[0, 0, 1], shared=2)


def check(name, models_dir, tokenizer_dir, monkeypatch, requests, n, join_at, shared) -> list[int]:
    """Batched equals alone; returns, per replay, how many rows it rolled back."""
    target = archs.make(models_dir / f"hy-{name}", tokenizer_dir, name, seed=3)
    model, tok = mlx_spec.load(str(target), drafter=None)
    model.drafter = factory.SelfDrafter(model.model, block_size=5, mode="argmax-onehot", error_rate=0.3, seed=1)
    sizes, replays = [], []
    real_batch, real_replay = loop.batch_caches, batch.replay
    monkeypatch.setattr(loop, "batch_caches", lambda caches: sizes.append(len(caches)) or real_batch(caches))
    monkeypatch.setattr(loop, "replay", lambda pcs: replays.append(sum(bool(pc.deferred) for pc in pcs))
                        or real_replay(pcs))
    solo = [alone(model, tok, r + (n,)) for r in requests]
    sizes.clear()
    batched = together(model, tok, [r + (n,) for r in requests], join_at=join_at)
    for i, (a, b) in enumerate(zip(solo, batched)):
        assert a == b, (name, i, requests[i][1])
    if name in rollback.UNBATCHED:  # its rounds verify one request at a time
        assert not sizes, name
    else:
        assert max(sizes) >= shared, name  # several blocks really shared one verify pass
    assert together.left_mid_flight, name  # and some requests left while others went on
    return replays
