"""The local-adaptation benchmark: a "user" whose traffic is one domain the drafter never saw.

The domain: completing functions of NumPy's own source (raw-text completion, as an editor
sends to /v1/completions), a library outside the embedded pair's training corpus (CPython's
stdlib and docs, chit-chat). The script

1. records `--record` requests of that domain through the library's recording hook
   (`History.record_generation`, what `serve --learn` calls when a request finishes),
2. runs `Adaptation` (what `mlx-spec adapt` runs) under a `--minutes` training budget,
3. measures on `--test` further requests of the domain, never recorded: τ and decode
   tokens/s, plain vs speculative with the shipped and with the adapted drafter.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 OPENBLAS_NUM_THREADS=1 \\
    XDG_DATA_HOME=/tmp/adapt-bench python -m mlx_spec.train.adapt_bench --record 300 --minutes 15

Use a throwaway XDG_DATA_HOME: the script installs an adapted drafter for the embedded model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def domain_prompts(n: int, seed: int = 0) -> list[str]:
    """Function heads (signature and the start of the body, 6-14 lines) from NumPy's sources."""
    import random

    import numpy

    heads = []
    for f in sorted(Path(numpy.__file__).parent.rglob("*.py")):
        if "tests" in f.parts:
            continue
        lines = f.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if line.lstrip().startswith("def ") and line.rstrip().endswith(":") and len(lines) > i + 14:
                heads.append("\n".join(lines[i : i + 6 + (i % 9)]) + "\n")
    random.Random(seed).shuffle(heads)
    return heads[:n]


def run_one(model, tok, prompt: str, max_tokens: int, speculative: bool = True):
    from mlx_spec import stream_generate

    ids = tok.encode(prompt)
    out, last = [], None
    for last in stream_generate(model, tok, ids, max_tokens, speculative=speculative):
        out += last.tokens
    return ids, out, last


def measure_domain(model, tok, prompts: list[str], max_tokens: int) -> dict:
    """τ (full blocks) and median decode tok/s, plain and speculative (cost-curve controller)."""
    from mlx_spec.train.evaluate import measure

    tau = measure(model, tok, [{"messages": tok.encode(p)} for p in prompts], max_tokens)["all"]
    plain, spec, ratios = [], [], []
    for p in prompts:
        _, _, a = run_one(model, tok, p, max_tokens, speculative=False)
        _, _, b = run_one(model, tok, p, max_tokens)
        if a.generation_tokens >= 16:
            plain.append(a.generation_tps)
            spec.append(b.generation_tps)
            ratios.append(b.generation_tps / a.generation_tps)
    return {"tau": round(tau.tau, 3), "acceptance": [round(x, 3) for x in tau.acceptance_rates],
            "plain_tps": round(statistics.median(plain), 1), "spec_tps": round(statistics.median(spec), 1),
            "speedup": round(statistics.median(ratios), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--record", type=int, default=300)
    p.add_argument("--test", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--general-prompts", type=int, default=None)
    p.add_argument("--out", type=Path, default=Path("runs/adapt-bench.json"))
    args = p.parse_args()

    import mlx_spec
    from mlx_spec import adapters
    from mlx_spec.history import History, target_key
    from mlx_spec.train.adapt import AdaptConfig, Adaptation

    model, tok = mlx_spec.load()
    key = target_key(None)
    if adapters.current(key) is not None:
        raise SystemExit("an adapted drafter is already in use here: run with a fresh XDG_DATA_HOME")
    prompts = domain_prompts(args.record + args.test)
    train, test = prompts[: args.record], prompts[args.record :]
    history = History.for_target(key)
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    t0 = time.time()
    if len(history.records()) < args.record:  # resumable: recording is the slow, boring part
        history.clear()
        for i, prompt in enumerate(train):
            ids, out, last = run_one(model, tok, prompt, args.max_tokens)
            history.record_generation(ids, out, last.spec)
            if (i + 1) % 50 == 0:
                print(f"recorded {i + 1}/{len(train)} ({time.time() - t0:.0f} s)", flush=True)
    report["record_seconds"] = round(time.time() - t0)
    report["before"] = measure_domain(model, tok, test, args.max_tokens)
    print("before", report["before"], flush=True)

    cfg = AdaptConfig(steps=args.steps, minutes=args.minutes, lr=args.lr, general_prompts=args.general_prompts)
    job = Adaptation(model, tok, key, cfg, model.drafter_path, history)
    t1, last_print = time.time(), 0.0
    for unit in job.run():
        if time.time() - last_print > 30:
            print(f"[{time.time() - t1:.0f} s] {unit.phase} {unit.done}/{unit.total} {unit.info}", flush=True)
            last_print = time.time()
    report["adapt_seconds"] = round(time.time() - t1)
    report["adapt"] = {k: job.result[k] for k in ("steps", "train_records", "held_out_records", "before", "after",
                                                   "accepted", "reason")}
    print("adapt", json.dumps(report["adapt"]), flush=True)
    if job.result["accepted"]:
        adapted, _ = mlx_spec.load()  # --mode auto now finds the installed version
        assert adapted.drafter_path == adapters.current(key)
        report["after"] = measure_domain(adapted, tok, test, args.max_tokens)
        print("after", report["after"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
