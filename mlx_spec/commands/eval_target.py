"""`mlx-spec eval-target`: a target's held-out loss and the repetition of its greedy answers."""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("--model", type=Path, default=None, help="target folder (default: the embedded model)")
    p.add_argument("--val", type=Path, required=True, help="a train-target run's data/val.npy (same tokenizer)")
    p.add_argument("--seq-lens", default="512,2048", help="comma-separated window lengths for the loss")
    p.add_argument("--batches", type=int, default=16)
    p.add_argument("--prompts", type=Path, default=None, help="JSONL prompts for the repetition measure "
                                                               "(default: built-in set)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--no-repetition", action="store_true", help="only the validation loss")


def run(args) -> int:
    import json

    from ..errors import MlxSpecError
    from ..train.data import builtin_prompts, read_prompts
    from ..train.target_eval import report

    try:
        seq_lens = [int(x) for x in args.seq_lens.split(",")]
    except ValueError:
        raise MlxSpecError(f"--seq-lens must be comma-separated integers, not {args.seq_lens!r}") from None
    if not args.val.exists():
        raise MlxSpecError(f"{args.val} does not exist; `mlx-spec train-target` writes it under OUT/data")
    model = args.model or Path(__file__).resolve().parents[1] / "models" / "default" / "target"
    prompts = None if args.no_repetition else read_prompts(args.prompts or builtin_prompts())
    print(json.dumps(report(model, args.val, seq_lens, args.batches, prompts=prompts, max_tokens=args.max_tokens),
                     indent=2))
    return 0
