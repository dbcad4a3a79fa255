"""`mlx-spec adapt`: fine-tune the drafter on your recorded traffic; install it only if it is better."""

from __future__ import annotations


def add_arguments(p) -> None:
    from ..train.adapt import AdaptConfig

    d = AdaptConfig()
    p.add_argument("--model", default=None, help="target folder or repo id (default: embedded model)")
    p.add_argument("--drafter", default="auto", help="drafter to start from (default: the one in use)")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps (the learning-rate schedule's length)")
    p.add_argument("--minutes", type=float, default=None, help="stop training after this long (evaluation follows)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--eval-tokens", type=int, default=d.eval_tokens, help="tokens generated per evaluation prompt")
    p.add_argument("--general-prompts", type=int, default=None, help="built-in prompts for the general τ (default: all)")
    p.add_argument("--rollback", action="store_true", help="go back to the previous drafter version and exit")
    p.add_argument("--list", action="store_true", help="show the installed versions and exit")


def run(args) -> int:
    from .. import adapters
    from ..history import target_key

    key = target_key(args.model)
    if args.rollback:
        n = adapters.rollback(key)
        print(f"now using {'v' + str(n) if n else 'the shipped drafter'} for {key}")
        return 0
    if args.list:
        return _list(key)
    return _adapt(args, key)


def _list(key: str) -> int:
    from .. import adapters

    m = adapters.manifest(key)
    print(f"adapted drafters of {key} ({adapters.folder(key)}); in use: {'v%d' % m['current'] if m['current'] else 'shipped'}")
    for v in m["versions"]:
        b, a = v["before"], v["after"]
        print(f"  v{v['version']}  {v['created']}  held-out τ {b['held_out']['tau']:.2f} → {a['held_out']['tau']:.2f}  "
              f"general τ {b['general']['tau']:.2f} → {a['general']['tau']:.2f}" + ("  (rolled back)" if v.get("rolled_back") else ""))
    return 0


def _adapt(args, key: str) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..errors import MlxSpecError
    from ..loading import load
    from ..train.adapt import AdaptConfig, Adaptation

    model, tok = load(args.model, drafter=args.drafter)
    if model.drafter_path is None:
        raise MlxSpecError("no drafter to adapt: pass --drafter PATH (a DFlash drafter for this target)")
    cfg = AdaptConfig(steps=args.steps, minutes=args.minutes, lr=args.lr, eval_tokens=args.eval_tokens,
                      general_prompts=args.general_prompts)
    job = Adaptation(model, tok, key, cfg, model.drafter_path)
    columns = [TextColumn("{task.description:<7}"), TextColumn("{task.completed}/{task.total}"), BarColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
    with Progress(*columns) as bar:
        tasks: dict[str, int] = {}
        for unit in job.run():
            if unit.phase not in tasks:
                tasks[unit.phase] = bar.add_task(unit.phase, total=unit.total, info="")
            bar.update(tasks[unit.phase], completed=unit.done, total=unit.total, info=unit.info)
    r = job.result
    for name in ("held_out", "general"):
        print(f"{name:<9} τ {r['before'][name]['tau']:.2f} → {r['after'][name]['tau']:.2f}")
    print(f"{r['steps']} steps on {r['train_records']} recorded requests, {r['held_out_records']} held out")
    print(f"installed {r['installed']} (now in use with --drafter auto)" if r["accepted"] else f"not installed: {r['reason']}")
    return 0
