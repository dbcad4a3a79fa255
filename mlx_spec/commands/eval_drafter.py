"""`mlx-spec eval-drafter`: acceptance length τ per content kind and block position, with the real loop."""

from __future__ import annotations

from pathlib import Path

from ..options import add_model_arguments


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--prompts", type=Path, default=None, help="JSONL of prompts (default: built-in set)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N prompts")


def run(args) -> int:
    from ..drafters import model_drafter
    from ..errors import MlxSpecError
    from ..train.data import builtin_prompts, read_prompts
    from ..train.evaluate import measure, table
    from ..options import load_from

    model, tok = load_from(args)
    if model.drafter is None:
        raise MlxSpecError("no drafter to evaluate; pass --drafter")
    model.drafter = model_drafter(model.drafter)  # the drafter itself: never prompt lookup standing in for it
    prompts = read_prompts(args.prompts or builtin_prompts())[: args.limit]
    print(table(measure(model, tok, prompts, args.max_tokens, args.block_size)))
    return 0
