"""`--distributed` for the entry points: its options, and `generate` run on every rank (rank 0 prints)."""

from __future__ import annotations

import os
import sys

from .session import DistributedConfig, DistributedError, Session


def add_distributed_arguments(p) -> None:
    p.add_argument("--distributed", action="store_true",
                   help="split the target across the ranks mlx.launch started (pipeline by layers; rank 0 prints)")
    p.add_argument("--split", default=None,
                   help="with --distributed: decoder layers per rank, comma-separated, rank 0 first (it runs the "
                        "last layers); default: even")
    p.add_argument("--rank-timeout", type=float, default=30.0,
                   help="with --distributed: seconds a round may wait on the other ranks before giving up")


def config_from(args) -> DistributedConfig:
    split = ()
    if args.split:
        try:
            split = tuple(int(s) for s in args.split.split(","))
        except ValueError:
            raise DistributedError(f"--split wants comma-separated layer counts, got {args.split!r}") from None
    if args.rank_timeout <= 0:
        raise DistributedError(f"--rank-timeout must be positive, got {args.rank_timeout}")
    if getattr(args, "kv_bits", None) is not None:  # a stage's caches are made per rank: untested with quantized KV
        raise DistributedError("--kv-bits is not supported with --distributed yet (full-precision KV caches only)")
    return DistributedConfig(timeout=args.rank_timeout, split=split)


def start(args, session: Session):
    """(session, model, tokenizer) of this rank, from the model arguments."""
    from .load import load_distributed

    with session.guard("loading"):
        model, tokenizer = load_distributed(session, args.model, drafter=None if args.no_draft else args.drafter,
                                            mode=args.mode, dtype=args.dtype, block_size=args.block_size)
    return session, model, tokenizer


def shared_sampling(session: Session, sampling):
    """Unseeded sampling draws from each process's own random stream: ranks would disagree. A request
    without a seed gets one drawn on rank 0 (seeded sampling is just as lossless)."""
    from dataclasses import replace

    from ..engine.params import GREEDY_BELOW

    if sampling.seed is None and sampling.temperature >= GREEDY_BELOW:
        return replace(sampling, seed=session.seed())
    return sampling


def run_generate(args, prompt, chat_prompt) -> int:
    from ..commands.generate import summary
    from ..generate import make_generation, step_all
    from ..options import sampling_from

    session = Session(config_from(args))  # not under mlx.launch: a plain error, nothing to tear down
    try:
        session, model, tokenizer = start(args, session)
        sampling = shared_sampling(session, sampling_from(args))
        prompt = chat_prompt(args, tokenizer, prompt)
        g = make_generation(model, tokenizer, prompt, args.max_tokens, sampling=sampling, stop=args.stop,
                            block_size=args.block_size, adaptive=False)
        with session.guard("generation"):
            for last in g.prefill():  # the watchdog's clock restarts after every chunk and round
                session.progress()
            while True:
                if session.is_root:
                    print(last.text, end="", flush=True)
                if g.finished:
                    break
                last = step_all(model, [g])[0]
                session.progress()
        if session.is_root:
            print()
            print(summary(last, model.drafter is not None) + f" | {session.size} ranks", file=sys.stderr, flush=True)
        session.barrier()
    except DistributedError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(2)  # a ring with a dead peer may hang in teardown: leave now
    sys.stdout.flush()
    return 0


def run_bench(args, prompt_sets) -> int:
    """`bench --distributed`: plain vs speculative on this cluster, and communication per round."""
    import json

    from .bench import run_bench as bench

    session = Session(config_from(args))
    try:
        session, model, tokenizer = start(args, session)
        if model.drafter is None:
            raise DistributedError("bench --distributed compares plain and speculative decoding: it needs a drafter")
        from ..bench import encode

        prompts = [encode(tokenizer, p) for ps in prompt_sets(args, tokenizer).values() for p in ps]
        with session.guard("bench"):
            row = bench(session, model, tokenizer, prompts, args.max_tokens, args.repeats)
        if session.is_root:
            from ..commands.bench import machine

            row.update(machine())
            print(json.dumps(row, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in row.items()), flush=True)
        session.barrier()
    except DistributedError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    return 0
