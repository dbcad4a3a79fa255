"""Not a test: `python tests/measure_batch.py --kind raw --rows 8 --max-tokens 256` — batched decoding of the
embedded pair in this process, as the server's rounds run it but without HTTP or prefill in the timing: `rows`
requests of one of `bench`'s prompt kinds (cycled) decoded together, plain, plain without a drafter loaded
(what `serve --no-draft` runs), fixed blocks for every request, and the controller (`plan_batch`, the clock
on), taking turns `--repeats` times. Prints wall tokens per second over plain (medians) and, each turn, what
auto drafted and the batch's cost scales (measured rounds over their calibrated prices: plain, drafting).
`--per-slot 3`: each row a slot running 3 requests one after another, each joining the batch as a server's
clients' requests do (prefill timed then). `--config probe_share=0.02` overrides ControllerConfig fields.
`bench --modeled --rows` is the same workload with every round priced, not timed. Run it with the BLAS you
measure (LD_PRELOAD=.../libopenblas.so.0 OPENBLAS_NUM_THREADS=2 _MLX_SPEC_REEXEC=1).
"""
import argparse
import dataclasses
import statistics
import time
from types import SimpleNamespace

from mlx_spec.bench import encode
from mlx_spec.bench_modeled import kind_of
from mlx_spec.calibrate import calibrated_curve
from mlx_spec.commands.bench import prompt_sets
from mlx_spec.controller import AdaptiveLength, ControllerConfig, ControllerMemory
from mlx_spec.engine.loop import FixedLength
from mlx_spec.generate import make_generation, step_all
from mlx_spec.loading import load


def decode(model, tok, prompts, rows, max_tokens, lengths, per_slot=0):
    """(tokens per second, draft tokens, rounds) of `rows` requests decoded together, prefill not timed; with
    `per_slot`, each row a slot running that many requests one after another, as a server's clients do
    (a finished request's slot prefills the next, which joins the batch; prefill timed)."""
    queue = [prompts[i % len(prompts)] for i in range(rows * max(1, per_slot))]
    live, tokens = [], 0

    def admit():
        nonlocal tokens
        g = make_generation(model, tok, encode(tok, queue.pop(0)), max_tokens, draft_lengths=lengths())
        tokens += len(g.start().tokens)
        if not g.finished:
            live.append(g)

    start = time.perf_counter()
    for _ in range(rows):
        admit()
    if not per_slot:
        start = time.perf_counter()
    drafted, rounds = 0, 0
    while live:
        done = step_all(model, live)
        tokens += sum(len(r.tokens) for r in done)
        drafted, rounds = drafted + sum(r.drafted for r in done), rounds + 1
        ended = [g for g in live if g.finished]
        live[:] = [g for g in live if not g.finished]
        for _ in ended if per_slot else ():
            if queue:
                admit()
    return tokens / (time.perf_counter() - start), drafted, rounds


def config(pairs: str) -> ControllerConfig:
    types = {f.name: type(f.default) for f in dataclasses.fields(ControllerConfig)}
    values = dict(kv.split("=") for kv in pairs.split(",") if kv)
    return ControllerConfig(**{k: types[k](v) for k, v in values.items()})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", default="raw", help="one of bench's prompt kinds: code, chat, raw, long, ...")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--blocks", default="4", help="fixed blocks to run beside plain and auto")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--config", default="", help="ControllerConfig overrides, e.g. probe_share=0.02")
    p.add_argument("--per-slot", type=int, default=0,
                   help="each row a slot running this many requests one after another (prefill timed)")
    args = p.parse_args()
    model, tok = load(None)
    curve = calibrated_curve(model, model.drafter.block_size, batch_rows=args.rows)
    prompts = prompt_sets(SimpleNamespace(kinds=args.kind, long_context=1024, prompts=None), tok)[args.kind]
    bare, _ = load(None, drafter=None)  # what `serve --no-draft` runs: no hidden states tapped, no drafter fed
    top, cfg, memory = model.drafter.block_size - 1, config(args.config), ControllerMemory()
    variants = {"plain": lambda: FixedLength(0), "no drafter": None,
                **{f"block {b}": (lambda b=b: FixedLength(b - 1)) for b in map(int, args.blocks.split(","))},
                "auto": lambda: AdaptiveLength(curve, top, cfg, memory=memory, kind=kind_of(prompts))}
    decode(model, tok, prompts, args.rows, args.max_tokens, variants["auto"], args.per_slot)  # warm-up; the memory
    rates = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, lengths in variants.items():
            rate, drafted, rounds = decode(bare if lengths is None else model, tok, prompts, args.rows,
                                           args.max_tokens, lengths or (lambda: FixedLength(0)), args.per_slot)
            rates[name].append(rate)
            if name == "auto":
                print(f"  auto: {drafted} draft tokens in {rounds} rounds; cost scales (plain, drafting) "
                      f"{memory.batch_scale[0]:.2f}, {memory.batch_scale[1]:.2f}", flush=True)
    plain = statistics.median(rates["plain"])
    for name, r in rates.items():
        print(f"{args.kind} x{args.rows}, {args.max_tokens} tokens, {name}: {statistics.median(r):.1f} tok/s, "
              f"{statistics.median(r) / plain:.3f}x plain (turns: {' '.join(f'{x / plain:.2f}' for x in r)})")


if __name__ == "__main__":
    main()
