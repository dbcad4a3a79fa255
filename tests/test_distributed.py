"""A target split across local ranks (ring backend) decodes exactly as one process does.

Every launch here starts real processes over TCP with a hard timeout (`distributed_launch`), so
they are few and small: one run per group size covering dense and hybrid targets, DFlash and
lookup drafting, batched requests and seeded sampling; one run where a rank is killed.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import archs
import distributed_launch
import factory
from distributed_worker import load_kwargs, run_cases

from mlx_spec.distributed import Layout
from mlx_spec.errors import MlxSpecError

DENSE = {"block_size": 8, "cases": [
    {"name": "dflash", "prompts": ["def add(a, b):"], "max_tokens": 24},
    {"name": "batched", "prompts": ["def add(a, b):", "class Stack:"], "max_tokens": 16},
    {"name": "seeded", "prompts": ["Hello, how are"], "max_tokens": 16, "sampling": {"temperature": 0.8, "seed": 7}},
    {"name": "plain", "prompts": ["def add(a, b):"], "max_tokens": 12, "speculative": False},  # runs one token ahead
]}
LOOKUP = {"mode": "lookup", "block_size": 6, "cases": [
    {"name": "lookup", "prompts": ["for i in range(10):\n    print(i)\nfor i in range(10):\n"], "max_tokens": 24}]}
REPEAT = "Hello, how are you today? Hello, how are you today? Hello,"


@pytest.fixture(scope="module")
def hybrid(models_dir, tokenizer_dir):
    """Qwen3.5 (Gated DeltaNet + attention): a random DFlash drafter, lookup, and the target's own 4-bit
    copy as a draft model (it agrees often but not always: both accepted drafts and rewound states)."""
    target = archs.make(models_dir / "dist-qwen3_5", tokenizer_dir, "qwen3_5", seed=3)
    drafter, small = models_dir / "dist-qwen3_5-dflash", models_dir / "dist-qwen3_5-4bit"
    if not (drafter / "config.json").exists():
        factory.make_drafter(drafter, target, taps=(1, 2), block_size=5)
    if not (small / "config.json").exists():
        factory.quantize(target, small, 4)
    t = str(target)
    return [
        {"target": t, "drafter": str(drafter), "mode": "dflash", "cases": [
            {"name": "hy-dflash", "prompts": [REPEAT], "max_tokens": 12}]},
        {"target": t, "drafter": str(small), "mode": "draft-model", "block_size": 5, "cases": [
            {"name": "hy-batched", "prompts": [REPEAT, "class Stack:"], "max_tokens": 16},
            {"name": "hy-seeded", "prompts": [REPEAT], "max_tokens": 12, "sampling": {"temperature": 1.0, "seed": 3}}]},
        {"target": t, "mode": "lookup", "block_size": 5, "cases": [
            {"name": "hy-lookup", "prompts": [REPEAT], "max_tokens": 12}]},
    ]


def reference(groups: list[dict]) -> dict:
    """What one process generates for the same groups."""
    from mlx_spec import load

    out = {}
    for group in groups:
        model, tokenizer = load(group.get("target"), **load_kwargs(group))
        out.update(run_cases(model, tokenizer, group["cases"]))
    return out


def launch(n: int, groups: list[dict], tmp_path, timeout: float = 240):
    spec, out = tmp_path / f"spec{n}.json", tmp_path / f"out{n}.json"
    spec.write_text(json.dumps({"groups": groups}))
    results = distributed_launch.run(n, ["tests/distributed_worker.py", str(spec), str(out)], timeout)
    for rank, (rc, _, err) in enumerate(results):
        assert rc == 0, f"rank {rank} exited with {rc}:\n{err[-3000:]}"
    return json.loads(out.read_text())


@pytest.mark.parametrize("ranks", [2, 3])
def test_split_target_decodes_as_one_process(ranks, hybrid, tmp_path):
    groups = [DENSE, LOOKUP] + hybrid
    got = launch(ranks, groups, tmp_path)
    want = reference(groups)
    merged = {k: v for g in got["groups"] for k, v in g.items()}
    assert set(merged) == set(want)
    for name in want:
        assert merged[name]["tokens"] == want[name]["tokens"], name
        assert merged[name]["accepted"] == want[name]["accepted"], name
    # Speculation ran (drafts were accepted), so rollback and commit were exercised across ranks.
    assert merged["dflash"]["accepted"] > 0 and merged["lookup"]["accepted"] > 0
    assert merged["hy-batched"]["accepted"] > 0
    # No rank loaded the whole model: each holds its layers only (the last group's target here).
    from mlx_spec import load

    whole = load(groups[-1]["target"], drafter=None)[0].model
    from mlx.utils import tree_flatten

    total = sum(v.nbytes for _, v in tree_flatten(whole.parameters()))
    assert len(got["param_bytes"]) == ranks and all(b < total for b in got["param_bytes"])


def test_greedy_reference_is_plain_decoding():
    """The single-process reference itself equals plain greedy decoding (so the ranks do too)."""
    from mlx_spec import load

    spec = reference([DENSE])
    model, tokenizer = load(None, drafter=None)
    plain = run_cases(model, tokenizer, [DENSE["cases"][0]])
    assert plain["dflash"]["tokens"] == spec["dflash"]["tokens"]


def test_killed_rank_ends_the_others_clearly(tmp_path):
    """Rank 1 is killed mid-generation: rank 0 exits with a clear message within seconds."""
    group = {"block_size": 8, "endless": str(tmp_path), "cases": [
        {"name": "long", "prompts": ["def add(a, b):"], "max_tokens": 1500}]}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"groups": [group]}))
    procs = distributed_launch.start(2, ["tests/distributed_worker.py", str(spec), str(tmp_path / "out.json")])
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"rank{r}.pid").exists() for r in range(2)) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a rank ended before generating"
        time.sleep(0.2)
    time.sleep(1.0)  # well inside the generation
    assert procs[0].poll() is None, "rank 0 finished before the kill"
    os.kill(int((tmp_path / "rank1.pid").read_text()), signal.SIGKILL)
    killed = time.monotonic()
    (rc, _, err), _ = distributed_launch.finish(procs, timeout=30)
    assert time.monotonic() - killed < 15
    assert rc == 2, err[-2000:]
    assert "rank 0: lost the connection to another rank during generation" in err


def test_layout_splits_like_mlx_lm():
    assert [Layout(8, 3, r).bounds(r) for r in range(3)] == [(5, 8), (2, 5), (0, 2)]
    lay = Layout(8, 2, 0, split=(5, 3))
    assert (lay.start, lay.end, lay.is_last, lay.is_first, lay.source, lay.dest) == (3, 8, True, False, 1, None)
    for bad in [dict(num_layers=2, size=3, rank=0), dict(num_layers=8, size=2, rank=0, split=(8, 0)),
                dict(num_layers=8, size=2, rank=2)]:
        with pytest.raises(MlxSpecError):
            Layout(**bad)
