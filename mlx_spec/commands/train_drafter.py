"""`mlx-spec train-drafter`: the target answers prompts, then a DFlash drafter learns to predict it."""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    from ..train.config import DRAFTER_LABELS, DRAFTER_LOSSES, DrafterTrainConfig, steps
    from ..train.data import DataConfig

    d, dd = DrafterTrainConfig(), DataConfig()
    p.add_argument("--model", default=None, help="target folder or repo id (default: embedded model)")
    p.add_argument("--prompts", type=Path, default=None, help="JSONL of chats/prompts or a text file (default: built-in set)")
    p.add_argument("--out", type=Path, default=d.out)
    p.add_argument("--block-size", type=int, default=None,
                   help=f"tokens per drafting block, anchor included (default {d.block_size}; with --init-drafter: its "
                        "own, or another size to fine-tune it to)")
    p.add_argument("--sub-blocks", default=None,
                   help="comma-separated shorter blocks it also learns to draft from (e.g. 8 for a block of 16): a "
                        "short draft then runs only the rows it needs (default: none; with --init-drafter: its own)")
    p.add_argument("--layers", type=int, default=None,
                   help=f"drafter layers (default {d.num_layers}; with --init-drafter: its own, or more to grow it: "
                        "the new layers start as no-ops)")
    p.add_argument("--taps", default=None, help="comma-separated target layer ids (default: spread over depth)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--sequences-per-step", type=int, default=d.sequences_per_step)
    p.add_argument("--anchors", type=int, default=d.anchors_per_sequence, help="blocks per sequence per step")
    p.add_argument("--max-tokens", type=int, default=dd.max_tokens, help="answer length when generating data")
    p.add_argument("--data-temp", type=float, default=dd.temperature, help="temperature of the target's answers")
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts for τ")
    p.add_argument("--loss", choices=DRAFTER_LOSSES, default=d.loss,
                   help="ce: every block slot; auf (Accept-Until-Fail): slots up to the first wrong one; "
                        "kd: ce plus the KL divergence from the target's next-token distribution")
    p.add_argument("--labels", choices=DRAFTER_LABELS, default=d.labels,
                   help="data: each slot learns the answer's next token; target: the target's own greedy token "
                        "there (for answers sampled with --data-temp: labels verification would check)")
    p.add_argument("--decay-gamma", type=float, default=None,
                   help="slot k's loss weight is exp(-(k-1)/gamma) (default: 4 at block 8, 5 at 10, 7 at 16)")
    p.add_argument("--sliding-window", type=int, default=None,
                   help="drafter attends to the last N-1 context rows only (flat draft cost at long context)")
    p.add_argument("--init-drafter", type=Path, default=None, help="fine-tune this drafter instead of a new one")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--until", type=steps, default=None,
                   help="stop after this many steps, short of --steps (checkpointed, nothing written; 0: the data only); "
                        "rerun without it to go on")


def run(args) -> int:
    from rich.progress import Progress

    from ..errors import MlxSpecError
    from ..loading import Loaded, load
    from ..train.data import DataConfig, builtin_prompts, generate_data, read_prompts
    from ..train.drafter import DrafterTrainConfig, train_drafter
    from ..train.evaluate import measure, table

    if args.sliding_window is not None and args.sliding_window < 2:
        raise MlxSpecError("--sliding-window must be at least 2 (the anchor's context row and one more)")
    if args.sliding_window is not None and args.init_drafter is not None:
        raise MlxSpecError("--sliding-window makes a new drafter; it cannot be combined with --init-drafter")
    if args.layers is not None and args.layers < 1:
        raise MlxSpecError("--layers must be at least 1")
    if args.decay_gamma is not None and not args.decay_gamma > 0:
        raise MlxSpecError("--decay-gamma must be positive")
    if args.block_size is not None and args.block_size < 2:
        raise MlxSpecError("--block-size must be at least 2 (the anchor and one draft)")
    sub_blocks = _sizes(args.sub_blocks) if args.sub_blocks is not None else None
    model, tok = load(args.model, drafter=None)
    init = None
    if args.init_drafter is not None:
        from ..drafters.dflash import load_dflash
        from ..train.drafter import grow, reblock

        init = load_dflash(args.init_drafter, model.target, model.config)
        if args.block_size is not None and args.block_size != init.config.block_size:
            init = reblock(init, args.block_size)
        if args.layers is not None and args.layers != init.config.num_hidden_layers:
            try:
                init = grow(init, args.layers)
            except ValueError as e:  # fewer layers than it has, or a quantized drafter
                raise MlxSpecError(f"--layers {args.layers}: {args.init_drafter}: {e}") from None
    block = init.config.block_size if init is not None else args.block_size or DrafterTrainConfig.block_size
    if sub_blocks is None:  # a drafter fine-tuned at its own block keeps the sub-blocks it learnt
        sub_blocks = [b for b in (init.config.block_sizes or ()) if b != block] if init is not None else []
    layers = init.config.num_hidden_layers if init is not None else args.layers or DrafterTrainConfig.num_layers
    taps = [int(x) for x in args.taps.split(",")] if args.taps else None
    try:  # (settings that cannot train are refused before any answers are generated)
        cfg = DrafterTrainConfig(
            out=args.out, block_size=block, num_layers=layers, target_layer_ids=taps, steps=args.steps, lr=args.lr,
            sequences_per_step=args.sequences_per_step, anchors_per_sequence=args.anchors,
            eval_every=args.eval_every, seed=args.seed, loss=args.loss, decay_gamma=args.decay_gamma,
            labels=args.labels, sliding_window=args.sliding_window, sub_blocks=sub_blocks,
        )
    except ValueError as e:  # the sub-blocks
        raise MlxSpecError(f"--sub-blocks: {e}") from None
    prompts = read_prompts(args.prompts or builtin_prompts())
    held_out = set(range(0, len(prompts), max(1, len(prompts) // max(1, args.eval_prompts)))) if args.eval_prompts else set()
    args.out.mkdir(parents=True, exist_ok=True)
    with Progress() as bar:
        task = bar.add_task("target answers", total=len(prompts))
        records = generate_data(model.model, tok, prompts, args.out / "data.jsonl",
                                DataConfig(max_tokens=args.max_tokens, temperature=args.data_temp, seed=args.seed),
                                progress=lambda done, total: bar.update(task, completed=done))
    train = [r for r in records if r["id"] not in held_out]
    evals = [prompts[i] for i in sorted(held_out)]

    def evaluate(drafter):
        pair = Loaded(model.target, drafter, model.target_path, None, model.config, relaid=model.relaid)
        return round(measure(pair, tok, evals, max_tokens=64)["all"].tau, 3)

    path = train_drafter(model.target, model.config, tok, train, cfg, evaluate=evaluate if evals else None,
                         init=init, until=args.until,
                         provenance={"init_drafter": str(args.init_drafter) if args.init_drafter else None,
                                     "prompts": str(args.prompts) if args.prompts else "built-in"})
    if path is None:
        from ..train.checkpoint import stopped

        print(stopped(args.out / "checkpoint"))
        return 0
    print(f"drafter written to {path}")
    if evals:
        final, _ = load(str(model.target_path), drafter=str(path))
        print(table(measure(final, tok, evals, max_tokens=128)))
    return 0


def _sizes(text: str) -> list[int]:
    from ..errors import MlxSpecError

    try:
        return sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise MlxSpecError(f"--sub-blocks takes comma-separated block sizes, e.g. 8 or 4,8; got {text!r}") from None
