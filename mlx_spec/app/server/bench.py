"""Aggregate throughput of a running server at several client counts, against serving the same requests one at a time.

    mlx-spec serve --model M --port 8080 &
    python -m mlx_spec.app.server.bench --url http://127.0.0.1:8080 --clients 1,2,4,8
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n", "Once upon a time",
           "class Stack:\n    def push(self, x):", "for i in range(10):", "Dear diary, today", "SELECT * FROM"]


def one(url: str, i: int, args) -> tuple[int, float]:
    body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.max_tokens, "temperature": 0.0,
            "logit_bias": json.loads(args.logit_bias)}
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), headers)
    tic = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        usage = json.loads(r.read())["usage"]
    return usage["completion_tokens"], time.perf_counter() - tic


def sequential(url: str, n: int, args) -> float:
    tic, tokens = time.perf_counter(), 0
    for i in range(n):
        tokens += one(url, i, args)[0]
    return tokens / (time.perf_counter() - tic)


def concurrent(url: str, n: int, args) -> float:
    results = [None] * n

    def run(i):
        results[i] = one(url, i, args)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    tic = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(r[0] for r in results) / (time.perf_counter() - tic)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", default="1,2,4,8")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--logit-bias", default="{}", help='JSON, e.g. \'{"2": -100}\' to keep EOS from ending early')
    p.add_argument("--repeats", type=int, default=3, help="alternating runs per client count; medians are shown")
    p.add_argument("--api-key", default=None)
    args = p.parse_args(argv)
    one(args.url, 0, args)  # warm-up
    print("clients | one at a time (tok/s) | concurrent (tok/s) | ratio")
    for n in (int(c) for c in args.clients.split(",")):
        # Alternate the two modes so that drifting machine load hits both alike.
        runs = [(sequential(args.url, n, args), concurrent(args.url, n, args)) for _ in range(args.repeats)]
        seq, con = (statistics.median(r[i] for r in runs) for i in (0, 1))
        ratio = statistics.median(c / s for s, c in runs)
        print(f"{n:7d} | {seq:21.1f} | {con:18.1f} | {ratio:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
