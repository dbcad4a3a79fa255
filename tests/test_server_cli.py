"""`mlx-spec serve` as a real process: graceful shutdown and a model that fails to load."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx2 as httpx

from test_server_harness import EOS_BIAS, sse_events


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "mlx_spec.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(proc, url, timeout=90.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"server not healthy (exit {proc.poll()})")


def running(url) -> int:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    line = next(x for x in text.splitlines() if x.startswith("mlx_spec:num_requests_running{"))
    return int(line.rsplit(" ", 1)[1])


def test_graceful_shutdown_finishes_short_requests_and_cancels_long_ones(long_target_dir):
    proc, url = start("--model", str(long_target_dir), "--no-draft", "--shutdown-timeout", "4")
    try:
        wait_healthy(proc, url)
        results = {}

        def stream(name, max_tokens):
            body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens,
                    "logit_bias": EOS_BIAS, "stream": True}
            events = []
            try:
                with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
                    for line in r.iter_lines():
                        events += sse_events([line])
            except httpx.TransportError:
                pass
            results[name] = events

        threads = [threading.Thread(target=stream, args=a) for a in (("short", 150), ("long", 4000))]
        for t in threads:
            t.start()
        end = time.monotonic() + 30
        while time.monotonic() < end and running(url) < 2:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert proc.wait(30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
    short, long = results["short"], results["long"]
    assert short[-1] == "[DONE]" and short[-2]["choices"][0]["finish_reason"] == "length"
    assert "[DONE]" not in long  # cut off when the grace period ran out


def test_model_that_cannot_load_exits_with_an_error(tmp_path):
    proc, url = start("--model", str(tmp_path / "missing"))
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2 and "error:" in err and "missing" in err
