"""Small-request latency of a running server while other clients send it big bodies.

    mlx-spec serve --port 8080 &
    python -m mlx_spec.app.server.loadbench --url http://127.0.0.1:8080 --big-clients 3 --big-mb 3.7

Big clients post chat requests of about --big-mb MiB (one long message) in a loop; the server
must refuse or serve them without stalling everyone else. Meanwhile one client times small
requests one after another: GET /health and a one-token chat completion. Reports p50/p90/max.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.error
import urllib.request


def post(url: str, body: bytes, key: str | None, timeout: float = 120) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


def timed(fn) -> float:
    tic = time.perf_counter()
    fn()
    return (time.perf_counter() - tic) * 1000


def percentiles(ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=10)
    return f"p50 {statistics.median(ms):7.1f} ms · p90 {q[8]:7.1f} ms · max {max(ms):7.1f} ms · n {len(ms)}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--big-clients", type=int, default=3)
    p.add_argument("--big-mb", type=float, default=3.7, help="size of each big body in MiB (under --max-body-mb)")
    p.add_argument("--samples", type=int, default=60, help="small requests of each kind")
    p.add_argument("--api-key", default=None)
    args = p.parse_args(argv)

    big = json.dumps({"messages": [{"role": "user", "content": "lorem ipsum " * int(args.big_mb * (1 << 20) / 12)}],
                      "max_tokens": 1}).encode()
    small = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}).encode()
    chat, health = f"{args.url}/v1/chat/completions", f"{args.url}/health"

    def run_small() -> tuple[list[float], list[float]]:
        h = [timed(lambda: urllib.request.urlopen(health, timeout=120).read()) for _ in range(args.samples)]
        c = [timed(lambda: post(chat, small, args.api_key)) for _ in range(args.samples)]
        return h, c

    run_small()  # warm-up
    quiet = run_small()
    stop, big_sent, big_status = threading.Event(), [0], {}

    def load():
        while not stop.is_set():
            status = post(chat, big, args.api_key)
            big_sent[0] += 1
            big_status[status] = big_status.get(status, 0) + 1

    threads = [threading.Thread(target=load, daemon=True) for _ in range(args.big_clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # let the big bodies get going
    tic = time.perf_counter()
    loaded = run_small()
    elapsed = time.perf_counter() - tic
    stop.set()
    for t in threads:
        t.join(120)
    print(f"big bodies: {args.big_clients} clients x {len(big) / (1 << 20):.1f} MiB, "
          f"{big_sent[0] / elapsed:.1f}/s sent, statuses {big_status}")
    for name, i in (("GET /health", 0), ("chat, 1 token", 1)):
        print(f"{name:14s} idle:       {percentiles(quiet[i])}")
        print(f"{name:14s} under load: {percentiles(loaded[i])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
