"""Not a test: `python tests/measure_distributed.py [--pairs 3] [--max-tokens 64] [--kinds code] [--repeats 2]`.

Speculation's speedup with the target split over two local ranks against one process, made fair:
each rank pinned to its own core (`taskset -c 0` / `-c 1`), the one process pinned to one core, all
with OpenBLAS on one thread (LD_PRELOAD, OPENBLAS_NUM_THREADS=1), so each stage computes as it
would in the one process and only the pipeline's hand-offs differ. Both sides run the same loop
(`mlx_spec.distributed.bench.compare`: warm-up, plain and speculative alternating per prompt, block 8).
The two setups alternate (pairs), each a fresh process; prints every row and the medians as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import distributed_launch  # noqa: E402

BLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
ENV = {"LD_PRELOAD": BLAS, "OPENBLAS_NUM_THREADS": "1"}  # as the CLI preloads it


def one_process(args) -> None:
    from mlx_spec import load
    from mlx_spec.bench import encode
    from mlx_spec.commands.bench import prompt_sets
    from mlx_spec.distributed.bench import Alone, compare

    model, tokenizer = load(None, block_size=8)
    prompts = [encode(tokenizer, p) for ps in prompt_sets(args, tokenizer).values() for p in ps]
    row = compare(Alone(), model, tokenizer, prompts, args.max_tokens, args.repeats)
    row.pop("_rounds"), row.pop("_tokens")
    print(json.dumps(row))


def run_one(args) -> dict:
    cmd = ["taskset", "-c", "0", sys.executable, __file__, "--one-process", "--kinds", args.kinds,
           "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_two(args) -> dict:
    bench = ["-m", "mlx_spec.cli", "bench", "--distributed", "--json", "--kinds", args.kinds, "--block-size", "8",
             "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats), "--rank-timeout", "120"]
    procs = distributed_launch.start(2, bench, env=ENV, pin=True)
    results = distributed_launch.finish(procs, timeout=900)
    for rank, (rc, _, err) in enumerate(results):
        assert rc == 0, f"rank {rank}: {err[-2000:]}"
    text = results[0][1]
    return json.loads(text[text.index("{"):])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--one-process", action="store_true")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--kinds", default="code")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--prompts", default=None)
    args = p.parse_args()
    if args.one_process:
        return one_process(args)
    rows = {"one": [], "two": []}
    for i in range(args.pairs):
        for side in (("one", "two") if i % 2 == 0 else ("two", "one")):
            rows[side].append(run_one(args) if side == "one" else run_two(args))
            print(side, json.dumps(rows[side][-1]), flush=True)
    keys = ["plain_tps", "spec_tps", "speedup", "speedup_median_of_pairs", "tokens_per_pass_spec",
            "ms_per_plain_round", "ms_per_verify_round", "comm_ms_per_plain_round", "comm_ms_per_verify_round"]
    print(json.dumps({side: {k: statistics.median(r[k] for r in rs) for k in keys if k in rs[0]}
                      for side, rs in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
