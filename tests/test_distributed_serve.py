"""`mlx-spec serve --distributed` on two local ranks: rank 0 listens, rank 1 follows its schedule.

Concurrent requests (batched rounds) answer exactly what one process generates; after the follower
is killed, a request ends with a clear 503 at once instead of hanging.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import distributed_launch

PROMPTS = ["def add(a, b):", "class Stack:", "for i in range(10):\n"]
SEEDED = {"prompt": "Hello, how", "max_tokens": 16, "temperature": 0.9, "seed": 5}


def post(port: int, body: dict, timeout: float = 60) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())


def wait_up(port: int, procs, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a rank exited while starting"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise AssertionError("the server did not come up")


@pytest.mark.slow  # ~25-55 s here: over what the default run has room for next to test_distributed's 3-rank run
def test_serve_distributed_matches_one_process_and_fails_clearly():
    from mlx_spec import generate, load

    port = distributed_launch.free_ports(1)[0]
    procs = distributed_launch.start(2, ["-m", "mlx_spec.cli", "serve", "--distributed", "--port", str(port),
                                         "--block-size", "8", "--rank-timeout", "20"])
    try:
        wait_up(port, procs)
        with ThreadPoolExecutor(4) as pool:
            greedy = [pool.submit(post, port, {"prompt": p, "max_tokens": 20, "temperature": 0}) for p in PROMPTS]
            seeded = pool.submit(post, port, SEEDED)
            texts = [f.result()["choices"][0]["text"] for f in greedy]
            sampled = seeded.result()["choices"][0]["text"]
        model, tokenizer = load(None)
        assert texts == [generate(model, tokenizer, p, 20, block_size=8) for p in PROMPTS]
        body = {k: v for k, v in SEEDED.items() if k not in ("prompt", "max_tokens")}
        assert sampled == generate(model, tokenizer, SEEDED["prompt"], SEEDED["max_tokens"], block_size=8, **body)

        os.kill(procs[1].pid, signal.SIGKILL)
        t = time.monotonic()
        try:
            post(port, {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0}, timeout=30)
            raise AssertionError("a request succeeded with a dead rank")
        except urllib.error.HTTPError as e:
            assert e.code == 503
            assert "the distributed target failed" in e.read().decode()
        assert time.monotonic() - t < 15
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGINT)
        distributed_launch.finish(procs, timeout=20)
