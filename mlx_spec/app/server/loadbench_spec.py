"""Speculation under load: a speculative server against a `--no-draft` one, same requests, 1/4/8 clients.

    mlx-spec serve --port 8080 &                # the drafter, draft lengths planned per batched round
    mlx-spec serve --port 8081 --no-draft &     # plain decoding, the same target
    python -m mlx_spec.app.server.loadbench_spec --spec http://127.0.0.1:8080 --plain http://127.0.0.1:8081

Each client count runs both servers in turn (spec, plain, spec, plain, ...), so that drifting machine
load hits both alike; every client sends its requests one after another. Reported per prompt kind
(chat-formatted code requests; raw code continuations through /v1/completions; `long`: ~800-token
source excerpts with a request): aggregate completion
tokens per second of each server, and the median of the paired ratios: over the whole run, and while every
client had a request in flight (`steady_rate`). `--json` for machines.

Every request asks for `--max-tokens` by default, so a plain server's requests, started together, end in
the same round and its batch stays whole; a speculative server's end rounds apart. `--vary-tokens` gives
request j of client c `VARIED[(c + j) % 3]` times as many, rounded (every three requests of a client average
`--max-tokens`; the same sequence for both servers), as traffic whose answers differ in length would.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import urllib.request

VARIED = (0.625, 1.0, 1.375)  # --vary-tokens: shares of --max-tokens, averaging 1

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


def long_prompts(chars: int = 2500) -> list[str]:
    """A source file's first `chars` characters (~800 tokens) and a request about it: an editor's or an agent's
    context, where every row of a batch carries a long cache."""
    import inspect
    import json.decoder
    import json.encoder
    import statistics
    import string
    import textwrap
    import threading

    asks = ["Rewrite this code with docstrings.", "Explain what this code does.", "Write tests for this code.",
            "Find a bug in this code."]
    mods = (textwrap, json.encoder, statistics, threading, json.decoder, string, textwrap, json.encoder)
    return [f"```python\n{inspect.getsource(m)[i * 300 : i * 300 + chars]}\n```\n\n{asks[i % len(asks)]}"
            for i, m in enumerate(mods)]


def max_tokens(args, c: int, j: int) -> int:
    """The answer length client c asks for in its j-th request."""
    return round(args.max_tokens * VARIED[(c + j) % len(VARIED)]) if args.vary_tokens else args.max_tokens


def request(url: str, kind: str, prompt: str, args, tokens: int) -> int:
    body = {"max_tokens": tokens, "temperature": 0.0, "logit_bias": json.loads(args.logit_bias)}
    if kind == "raw":
        path, body["prompt"] = "/v1/completions", prompt
    else:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})}
    with urllib.request.urlopen(urllib.request.Request(url + path, json.dumps(body).encode(), headers), timeout=900) as r:
        return json.loads(r.read())["usage"]["completion_tokens"]


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a local server process (Linux /proc), 0 without a pid."""
    if not pid:
        return 0.0
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steady_rate(spans: list[list[tuple[float, float, int]]]) -> float | None:
    """Tokens per second while every client had a request in flight: from the last client's first request
    sent to the first client's last answer, each request's tokens counted for the share of its time inside
    that window (None: no such window). Its end, after the clients that finished first left, runs fewer
    requests a round than the clients asked for: another concurrency, and one a plain server never reaches,
    its requests all ending in the same round (at 8 clients of 3 requests, a quarter of a speculative run)."""
    start, end = max(s[0][0] for s in spans), min(s[-1][1] for s in spans)
    if end <= start:
        return None
    inside = sum(n * max(0.0, min(b, end) - max(a, start)) / (b - a) for s in spans for a, b, n in s if b > a)
    return inside / (end - start)


def load(url: str, kind: str, prompts: list[str], clients: int, per_client: int, args, pid: int | None = None):
    """Aggregate completion tokens per second with `clients` clients each sending `per_client` requests:
    over the whole run, per CPU-second of the server process when its pid is known (0.0 otherwise: on a
    shared machine the CPU time a server spends is much less sensitive to other jobs than the wall time),
    and while all clients were busy (`steady_rate`)."""
    spans, errors = [[] for _ in range(clients)], []
    cpu = cpu_seconds(pid)

    def client(c):
        try:
            for j in range(per_client):
                sent = time.perf_counter()
                n = request(url, kind, prompts[(c * per_client + j) % len(prompts)], args, max_tokens(args, c, j))
                spans[c].append((sent, time.perf_counter(), n))
        except Exception as e:  # a refused or failed request fails the benchmark, not only its thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    tic = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{url}: {errors[0]}")
    wall, cpu = time.perf_counter() - tic, cpu_seconds(pid) - cpu
    tokens = sum(n for s in spans for _, _, n in s)
    return tokens / wall, tokens / cpu if cpu > 0 else 0.0, steady_rate(spans)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default="http://127.0.0.1:8080", help="the speculative server")
    p.add_argument("--plain", default="http://127.0.0.1:8081", help="the --no-draft server")
    p.add_argument("--kinds", default="code,raw", help="code, raw, long")
    p.add_argument("--clients", default="1,4,8")
    p.add_argument("--per-client", type=int, default=2, help="requests each client sends, one after another")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--vary-tokens", action="store_true",
                   help="answers of 5/8, 1 and 11/8 times --max-tokens in turn (the same for both servers)")
    p.add_argument("--repeats", type=int, default=3, help="spec/plain pairs per client count (medians shown)")
    p.add_argument("--logit-bias", default="{}", help='JSON, e.g. \'{"0": -100, "2": -100}\' to keep EOS away')
    p.add_argument("--api-key", default=None)
    p.add_argument("--spec-pid", type=int, default=None, help="the speculative server's pid: also tokens per CPU-second")
    p.add_argument("--plain-pid", type=int, default=None, help="the --no-draft server's pid")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sets = {"code": CODE, "raw": raw_prompts(), "long": long_prompts()}
    rows = []
    for kind in args.kinds.split(","):
        for url in (args.spec, args.plain):  # warm-up: first requests, calibration, caches
            load(url, kind, sets[kind], 2, 1, args)
        for n in (int(c) for c in args.clients.split(",")):
            pairs = [(load(args.spec, kind, sets[kind], n, args.per_client, args, args.spec_pid),
                      load(args.plain, kind, sets[kind], n, args.per_client, args, args.plain_pid))
                     for _ in range(args.repeats)]
            row = {"kind": kind, "clients": n, "spec_tps": statistics.median(s[0] for s, _ in pairs),
                   "plain_tps": statistics.median(q[0] for _, q in pairs),
                   "ratio": statistics.median(s[0] / q[0] for s, q in pairs), "ratios": [s[0] / q[0] for s, q in pairs]}
            steady = [s[2] / q[2] for s, q in pairs if s[2] and q[2]]
            row.update(steady_ratio=statistics.median(steady) if steady else None, steady_ratios=steady)
            if args.spec_pid and args.plain_pid:
                cpu = [s[1] / q[1] for s, q in pairs if s[1] and q[1]]  # none: too little CPU time to count
                row["cpu_ratio"] = statistics.median(cpu) if cpu else None
                row["spec_tokens_per_cpu_s"] = statistics.median(s[1] for s, _ in pairs)
                row["plain_tokens_per_cpu_s"] = statistics.median(q[1] for _, q in pairs)
            rows.append(row)
            if not args.json:
                cpu = f" | per CPU-second {row['cpu_ratio']:.2f}x" if row.get("cpu_ratio") else ""
                cpu += f" | all clients busy {row['steady_ratio']:.2f}x" if steady else ""
                print(f"{kind:5s} {n:3d} clients | spec {row['spec_tps']:7.1f} tok/s | no-draft {row['plain_tps']:7.1f}"
                      f" tok/s | {row['ratio']:.2f}x (pairs {' '.join(f'{r:.2f}' for r in row['ratios'])}){cpu}",
                      flush=True)
    if args.json:
        settings = {k: getattr(args, k) for k in ("max_tokens", "vary_tokens", "per_client", "repeats", "logit_bias")}
        print(json.dumps({"schema": "mlx-spec-loadbench-spec/1", "load_average": os.getloadavg(), "settings": settings,
                          "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
