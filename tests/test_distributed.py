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
from concurrent.futures import ThreadPoolExecutor

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
    # (a prompt whose continuation the embedded target copies from it: lookup's drafts are accepted)
    {"name": "lookup", "prompts": ["import os\nimport os\nimport os\nimport"], "max_tokens": 24}]}
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
            {"name": "hy-lookup", "prompts": [REPEAT], "max_tokens": 12},
            # a follow-up turn on the same cache: the ranks must agree on the prefix they reuse
            {"name": "hy-turns", "turns": [REPEAT, " Hello, how are"], "max_tokens": 8},
            {"name": "hy-edit", "turns": [REPEAT, " class Stack:"], "max_tokens": 8, "edit": True}]},
    ]


@pytest.fixture(scope="module")
def mtp(models_dir, tokenizer_dir):
    """The target's own MTP head (Qwen3.5-style hybrid, GLM-4.5 MoE): it reads the last layer's hidden
    state, rank 0's own; and falcon_h1 (a CacheList of Mamba2 state and KV per layer), batched."""
    import mtp_checkpoints

    qwen = mtp_checkpoints.qwen35(models_dir / "mtp-qwen35", tokenizer_dir)
    glm = mtp_checkpoints.glm(models_dir / "mtp-glm", tokenizer_dir)
    falcon = archs.make(models_dir / "dist-falcon_h1", tokenizer_dir, "falcon_h1", seed=3)
    small = models_dir / "dist-falcon_h1-4bit"
    if not (small / "config.json").exists():
        factory.quantize(falcon, small, 4)
    return [
        {"target": str(qwen), "block_size": 3, "cases": [{"name": "mtp-qwen", "prompts": [REPEAT, "class Stack:"],
                                                          "max_tokens": 10}]},
        {"target": str(glm), "block_size": 4, "cases": [{"name": "mtp-glm", "prompts": [REPEAT], "max_tokens": 10}]},
        {"target": str(falcon), "drafter": str(small), "mode": "draft-model", "block_size": 5, "cases": [
            {"name": "falcon-batched", "prompts": [REPEAT, "class Stack:"], "max_tokens": 12}]},
    ]


def reference(groups: list[dict]) -> dict:
    """What one process generates for the same groups."""
    from mlx_spec import load

    out = {}
    for group in groups:
        model, tokenizer = load(group.get("target"), **load_kwargs(group))
        out.update(run_cases(model, tokenizer, group["cases"]))
    return out


def launch_raw(n: int, groups: list[dict], tmp_path, timeout: float = 240):
    spec, out = tmp_path / f"spec{n}.json", tmp_path / f"out{n}.json"
    spec.write_text(json.dumps({"groups": groups}))
    return distributed_launch.run(n, ["tests/distributed_worker.py", str(spec), str(out)], timeout)


def check_equal(got: dict, groups: list[dict], ranks: int) -> None:
    want = reference(groups)
    merged = {k: v for g in got["groups"] for k, v in g.items()}
    assert set(merged) == set(want)
    for name in want:
        assert merged[name]["tokens"] == want[name]["tokens"], name
        assert merged[name]["accepted"] == want[name]["accepted"], name
    # Plain decoding (running one token ahead) through the same ranks: the same tokens as speculation.
    assert merged["plain"]["tokens"][0] == merged["dflash"]["tokens"][0][:12]
    # Speculation ran (drafts were accepted), so rollback and commit were exercised across ranks.
    assert merged["dflash"]["accepted"] > 0 and merged["lookup"]["accepted"] > 0
    assert merged["hy-batched"]["accepted"] > 0
    if "mtp-qwen" in merged:  # MTP drafted on rank 0 (its random heads' drafts are rejected: rollback ran)
        assert merged["mtp-qwen"]["rounds"] > 0 and merged["falcon-batched"]["accepted"] > 0
    # No rank loaded the whole model: each holds its layers only (the last group's target here).
    from mlx.utils import tree_flatten

    from mlx_spec import load

    whole = load(groups[-1]["target"], drafter=None)[0].model
    total = sum(v.nbytes for _, v in tree_flatten(whole.parameters()))
    assert len(got["param_bytes"]) == ranks and all(b < total for b in got["param_bytes"])


def _endless(tmp_path) -> dict:
    return {"block_size": 8, "endless": str(tmp_path), "cases": [
        {"name": "long", "prompts": ["def add(a, b):"], "max_tokens": 1500}]}


def _wait_generating(procs, tmp_path, timeout: float = 200) -> None:
    deadline = time.monotonic() + timeout
    while not all((tmp_path / f"rank{r}.pid").exists() for r in range(len(procs))):
        assert time.monotonic() < deadline, "the ranks did not reach the long generation"
        _check_running(procs)
        time.sleep(0.2)
    time.sleep(1.0)  # well inside the generation
    assert all(p.poll() is None for p in procs), "a rank finished before the fault"


def _check_running(procs) -> None:
    if any(p.poll() is not None for p in procs):
        ends = distributed_launch.finish(procs, timeout=5)
        raise AssertionError("a rank exited early:\n" + "\n".join(
            f"rank {r} exited with {rc}:\n{err[-2000:]}" for r, (rc, _, err) in enumerate(ends)))


def _wait_serving(port: int, procs, timeout: float = 240) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        _check_running(procs)
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except (urllib.error.URLError, OSError):
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.3)


SERVED = ["def add(a, b):", "class Stack:", "for i in range(10):\n"]


def _serve_and_kill(port: int, procs) -> tuple[list, str, str]:
    """Through a real `openai` client: concurrent requests (batched rounds; streamed, not streamed, one
    seeded), then the middle rank is killed while a long reply streams."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)

    def complete(prompt, stream=False, **kw):
        r = client.completions.create(model="m", prompt=prompt, max_tokens=20, stream=stream, **kw)
        return "".join(c.choices[0].text for c in r) if stream else r.choices[0].text

    with ThreadPoolExecutor(4) as pool:
        texts = [pool.submit(complete, p, stream=i == 1, temperature=0) for i, p in enumerate(SERVED)]
        seeded = pool.submit(complete, "Hello, how", temperature=0.9, seed=5)
        texts, sampled = [f.result() for f in texts], seeded.result()
    stream = client.completions.create(model="m", prompt=SERVED[0], max_tokens=1500, temperature=0, stream=True)
    next(iter(stream))
    os.kill(procs[1].pid, signal.SIGKILL)
    killed = time.monotonic()
    failed = ""
    try:
        for _ in stream:
            pass
    except openai.APIError as e:
        failed = str(e)
    assert time.monotonic() - killed < 15
    try:
        complete(SERVED[0], temperature=0)
        raise AssertionError("a request succeeded with a dead rank")
    except openai.APIStatusError as e:
        assert e.status_code == 503, e
        after = str(e)
    return [texts, sampled], failed, after


def test_three_ranks_decode_and_serve_as_one_process_and_a_killed_rank_fails_clearly(hybrid, mtp, tmp_path):
    """Three stages (first, middle, last) equal one process: generation groups, then `serve --distributed`
    (rank 0 listens) through the openai client; then the middle rank is killed mid-stream: the stream
    ends with an error, the first stage exits with a clear message within seconds, later requests 503."""
    groups = [DENSE, LOOKUP] + hybrid[1:] + mtp[::2]  # the GLM head runs at 2 ranks (slow)
    port = distributed_launch.free_ports(1)[0]
    spec, out = tmp_path / "spec.json", tmp_path / "out.json"
    serve = {"serve": ["--port", str(port), "--block-size", "8", "--rank-timeout", "20"]}
    spec.write_text(json.dumps({"groups": groups + [serve]}))
    procs = distributed_launch.start(3, ["tests/distributed_worker.py", str(spec), str(out)])
    try:
        _wait_serving(port, procs)
        got = json.loads(out.read_text())
        served, failed, after = _serve_and_kill(port, procs)
        (rc2, _, err2), = distributed_launch.finish(procs[2:], timeout=15)
        assert procs[0].poll() is None  # the server stays up, answering 503
        os.kill(procs[0].pid, signal.SIGINT)
        results = distributed_launch.finish(procs, timeout=20)
    finally:
        distributed_launch.finish(procs, timeout=1)
    assert rc2 == 2 and "error: rank 2: lost the connection to another rank during" in err2, err2[-2000:]
    assert "the distributed target failed" in failed + after and "lost the connection" in after, (failed, after)
    assert results[0][0] == 130, results[0][2][-2000:]  # SIGINT: uvicorn shut down, then re-raised it
    check_equal(got, groups, 3)
    from mlx_spec import generate, load

    model, tokenizer = load(None)
    assert served[0] == [generate(model, tokenizer, p, 20, block_size=8) for p in SERVED]
    assert served[1] == generate(model, tokenizer, "Hello, how", 20, block_size=8, temperature=0.9, seed=5)


@pytest.mark.slow
def test_two_ranks_decode_as_one_process(hybrid, mtp, tmp_path):
    groups = [DENSE, LOOKUP] + hybrid + mtp
    results = launch_raw(2, groups, tmp_path)
    for rank, (rc, _, err) in enumerate(results):
        assert rc == 0, f"rank {rank} exited with {rc}:\n{err[-3000:]}"
    check_equal(json.loads((tmp_path / "out2.json").read_text()), groups, 2)


@pytest.mark.slow
def test_stalled_rank_ends_the_others_clearly(tmp_path):
    """Rank 1 freezes (SIGSTOP: its sockets stay open, so nothing raises): the watchdog ends rank 0."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"timeout": 3, "groups": [_endless(tmp_path)]}))
    procs = distributed_launch.start(2, ["tests/distributed_worker.py", str(spec), str(tmp_path / "out.json")])
    try:
        _wait_generating(procs, tmp_path)
        os.kill(procs[1].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        procs[0].wait(30)
        assert time.monotonic() - stopped < 15
    finally:
        (rc, _, err), _ = distributed_launch.finish(procs, timeout=1)
    assert rc == 3, err[-2000:]
    assert "rank 0: no progress from the other ranks for 3 s during generation" in err


@pytest.mark.slow
def test_ranks_with_different_weights_refuse_to_start(tmp_path):
    import shutil

    from mlx_spec.models import DEFAULT_TARGET

    other = tmp_path / "other"
    shutil.copytree(DEFAULT_TARGET, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    group = {"target_by_rank": {"1": str(other)}, "cases": []}
    results = launch_raw(2, [group], tmp_path)
    for rank, (rc, _, err) in enumerate(results):
        assert rc == 2, err[-2000:]
        assert "rank 1 holds different weights (config.json or safetensors headers differ) than rank 0" in err


def test_layout_splits_like_mlx_lm():
    assert [Layout(8, 3, r).bounds(r) for r in range(3)] == [(5, 8), (2, 5), (0, 2)]
    lay = Layout(8, 2, 0, split=(5, 3))
    assert (lay.start, lay.end, lay.is_last, lay.is_first, lay.source, lay.dest) == (3, 8, True, False, 1, None)
    for bad in [dict(num_layers=2, size=3, rank=0), dict(num_layers=8, size=2, rank=0, split=(8, 0)),
                dict(num_layers=8, size=2, rank=2)]:
        with pytest.raises(MlxSpecError):
            Layout(**bad)


def test_distributed_needs_a_launcher_or_ranks_to_start(monkeypatch, capsys, tmp_path):
    from mlx_spec.cli import main

    monkeypatch.delenv("MLX_RANK", raising=False)
    monkeypatch.delenv("MLX_HOSTFILE", raising=False)
    assert main(["generate", "--distributed", "-m", "4"]) == 2
    assert "--distributed needs ranks started by mlx.launch" in capsys.readouterr().err
    assert main(["chat", "--distributed"]) == 2  # chat starts its own ranks: it needs to know how many
    assert "give -n N (N >= 2 local ranks) or --hostfile FILE" in capsys.readouterr().err
    bad = tmp_path / "hosts.json"
    bad.write_text('[{"ssh": "a"}]')
    assert main(["chat", "--distributed", "--hostfile", str(bad)]) == 2
    assert "want mlx.launch's host list" in capsys.readouterr().err
    assert main(["generate", "--distributed", "--split", "4,x"]) == 2
    assert "--split wants comma-separated layer counts" in capsys.readouterr().err
    assert main(["serve", "--distributed", "--kv-bits", "8"]) == 2
    assert "--kv-bits is not supported with --distributed" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_cli_under_mlx_launch():
    """The documented command: `mlx.launch --backend ring -n 2 ... generate --distributed` prints what one
    process prints."""
    import shutil
    import subprocess
    import sys

    from mlx_spec import generate, load

    launcher = shutil.which("mlx.launch")
    if launcher is None:
        pytest.skip("mlx.launch is not on PATH")
    cmd = [launcher, "--backend", "ring", "-n", "2", "--python", sys.executable, "--", "-m", "mlx_spec.cli",
           "generate", "--distributed", "--raw", "-p", "def add(a, b):", "-m", "16", "--block-size", "8"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=distributed_launch.REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    model, tokenizer = load(None)
    assert out.stdout == generate(model, tokenizer, "def add(a, b):", 16, block_size=8) + "\n"
    assert "| 2 ranks" in out.stderr


@pytest.mark.slow
def test_bench_distributed_reports_communication_and_speedup():
    """`bench --distributed` on two ranks: plain and speculative on the same split target, τ, time per round
    and the communication of a plain and of a verify round."""
    procs = distributed_launch.start(2, ["-m", "mlx_spec.cli", "bench", "--distributed", "--json", "--kinds", "raw",
                                         "--block-size", "8", "--max-tokens", "12", "--repeats", "1"])
    results = distributed_launch.finish(procs, timeout=240)
    for rank, (rc, _, err) in enumerate(results):
        assert rc == 0, f"rank {rank}: {err[-2000:]}"
    out = results[0][1]
    row = json.loads(out[out.index("{"):])
    assert row["ranks"] == 2 and row["split"] == [4, 4] and row["block_size"] == 8
    assert row["plain_tps"] > 0 and row["spec_tps"] > 0 and row["speedup"] > 0 and row["tokens_per_pass_spec"] >= 1
    assert 0 < row["comm_ms_per_plain_round"] and 0 < row["comm_ms_per_verify_round"]
    assert row["ms_per_verify_round"] > 0 and 0 < row["comm_share_spec"] < 1
    assert results[1][1] == ""  # only rank 0 prints
