"""`mlx-spec history`: what `--learn` has recorded for a target (size, per-day counts, τ trend), or --clear."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="target folder or repo id (default: embedded model)")
    p.add_argument("--clear", action="store_true", help="delete this target's recorded history")


def run(args) -> int:
    from ..history import History, daily, target_key

    key = target_key(args.model)
    store = History.for_target(key)
    if args.clear:
        store.clear()
        print(f"cleared {store.folder}")
        return 0
    records = store.records()
    print(f"history of {key}: {store.folder}")
    if not records:
        print("nothing recorded (start `mlx-spec chat --learn` or `mlx-spec serve --learn` to record)")
        return 0
    tokens = sum(len(r.prompt) + len(r.output) for r in records)
    print(f"{len(records)} requests · {tokens} tokens · {store.size_bytes() / 1e6:.2f} MB on disk")
    print(f"{'day':<10}  {'requests':>8}  {'output tokens':>13}  {'τ':>5}")
    for day, n, out, tau in daily(records):
        print(f"{day:<10}  {n:>8}  {out:>13}  {tau:>5.2f}" if tau else f"{day:<10}  {n:>8}  {out:>13}  {'–':>5}")
    trend = [t for t in (_tau(records[i * len(records) // 10 : (i + 1) * len(records) // 10]) for i in range(10))
             if t is not None]
    if len(records) >= 20 and trend:  # the trend within a day too (before and after an adaptation, say)
        print("τ by tenth of the history, oldest first: " + " ".join(f"{t:.2f}" for t in trend))
    return 0


def _tau(records) -> float | None:
    rounds = sum(r.drafted[0] for r in records if r.drafted)
    return 1 + sum(sum(r.accepted or []) for r in records) / rounds if rounds else None
