"""Speculation under load: a speculative server against a `--no-draft` one, same requests, 1/4/8 clients.

    mlx-spec serve --port 8080 &                # the drafter, draft lengths planned per batched round
    mlx-spec serve --port 8081 --no-draft &     # plain decoding, the same target
    python -m mlx_spec.app.server.loadbench_spec --spec http://127.0.0.1:8080 --plain http://127.0.0.1:8081

Each client count runs both servers in turn (spec, plain, spec, plain, ...), so that drifting machine
load hits both alike; every client sends its requests one after another. Reported per prompt kind
(chat-formatted code requests; raw code continuations through /v1/completions): aggregate completion
tokens per second of each server, and the median of the paired ratios. `--json` for machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import urllib.request

CODE = ["Write a Python function that checks whether a string is a palindrome.",
        "Write a Python class Stack with push, pop and peek methods.",
        "Write a Python function `merge_sorted(a, b)` that merges two sorted lists.",
        "Write a Python function that counts the words in a text file.",
        "Write a Python function that returns the n-th Fibonacci number.",
        "Write a Python function that flattens a nested list.",
        "Write a Python function that parses a date string like 2024-01-31.",
        "Write a Python function that removes duplicates from a list, keeping order."]


def raw_prompts() -> list[str]:
    """Beginnings of real Python source (the standard library), to be continued: no chat template."""
    from mlx_spec.bench import raw_prompts as prompts

    return [p["raw"] for p in prompts()]


def request(url: str, kind: str, prompt: str, args) -> int:
    body = {"max_tokens": args.max_tokens, "temperature": 0.0, "logit_bias": json.loads(args.logit_bias)}
    if kind == "raw":
        path, body["prompt"] = "/v1/completions", prompt
    else:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})}
    with urllib.request.urlopen(urllib.request.Request(url + path, json.dumps(body).encode(), headers), timeout=900) as r:
        return json.loads(r.read())["usage"]["completion_tokens"]


def load(url: str, kind: str, prompts: list[str], clients: int, per_client: int, args) -> float:
    """Aggregate completion tokens per second with `clients` clients each sending `per_client` requests."""
    tokens = [0] * clients

    def client(c):
        for j in range(per_client):
            tokens[c] += request(url, kind, prompts[(c * per_client + j) % len(prompts)], args)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    tic = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens) / (time.perf_counter() - tic)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default="http://127.0.0.1:8080", help="the speculative server")
    p.add_argument("--plain", default="http://127.0.0.1:8081", help="the --no-draft server")
    p.add_argument("--kinds", default="code,raw")
    p.add_argument("--clients", default="1,4,8")
    p.add_argument("--per-client", type=int, default=2, help="requests each client sends, one after another")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="spec/plain pairs per client count (medians shown)")
    p.add_argument("--logit-bias", default="{}", help='JSON, e.g. \'{"0": -100, "2": -100}\' to keep EOS away')
    p.add_argument("--api-key", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sets = {"code": CODE, "raw": raw_prompts()}
    rows = []
    for kind in args.kinds.split(","):
        for url in (args.spec, args.plain):  # warm-up: first requests, calibration, caches
            load(url, kind, sets[kind], 2, 1, args)
        for n in (int(c) for c in args.clients.split(",")):
            pairs = [(load(args.spec, kind, sets[kind], n, args.per_client, args),
                      load(args.plain, kind, sets[kind], n, args.per_client, args)) for _ in range(args.repeats)]
            row = {"kind": kind, "clients": n, "spec_tps": statistics.median(s for s, _ in pairs),
                   "plain_tps": statistics.median(q for _, q in pairs),
                   "ratio": statistics.median(s / q for s, q in pairs), "ratios": [s / q for s, q in pairs]}
            rows.append(row)
            if not args.json:
                print(f"{kind:5s} {n:3d} clients | spec {row['spec_tps']:7.1f} tok/s | no-draft {row['plain_tps']:7.1f}"
                      f" tok/s | {row['ratio']:.2f}x (pairs {' '.join(f'{r:.2f}' for r in row['ratios'])})", flush=True)
    if args.json:
        print(json.dumps({"schema": "mlx-spec-loadbench-spec/1", "load_average": os.getloadavg(), "results": rows},
                         indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
