"""`mlx-spec bench`: plain vs speculative decoding side by side, per content kind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..options import add_model_arguments

KINDS = ("code", "chat", "math", "edit", "long")
EXTRA_KINDS = ("raw", "long-chat")  # raw code continuations (no chat template); a long multi-turn chat


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"built-in prompt kinds to run: {', '.join(KINDS + EXTRA_KINDS)}")
    p.add_argument("--prompts", type=Path, default=None, help="JSONL of your own prompts (optional 'kind')")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="plain/spec pairs per prompt (medians reported)")
    p.add_argument("--block-sizes", default="auto", help="'auto' (calibrated) and/or sizes, e.g. auto,2,4,8,16")
    p.add_argument("--long-context", type=int, default=768, help="prompt tokens of the long-context kind")
    p.add_argument("--kernels", default="on", help="'on', 'off' or 'on,off' (custom Metal kernels)")
    p.add_argument("--modes", default=None, help="drafting modes side by side, e.g. auto,lookup (default: --mode)")
    p.add_argument("--vs-draft-model", default=None, help="also run mlx-lm's speculative mode with this draft model")
    p.add_argument("--vs-dspark", default=None, metavar="CAPS",
                   help="also run mlx-dspark's DFlash loop with these fixed draft caps, e.g. 1,2,3,7 (needs mlx-dspark "
                        "importable; optional)")
    p.add_argument("--modeled", action="store_true",
                   help="auto against every fixed block with each round charged its calibrated cost, not timed: "
                        "the controller's choices without the machine's noise (the cost model's view, not a speed)")
    p.add_argument("--rows", default=None, metavar="N,N",
                   help="with --modeled: also batched rounds of this many requests decoding together (as the server "
                        "runs them), charged the calibrated batched costs, e.g. 4,8")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", default=None, help="write speedup vs block size per kind to this PNG")
    p.add_argument("--rollback", nargs="?", const="", default=None, metavar="DIR",
                   help="instead: a Qwen3.5-shaped random hybrid vs a dense model of its size, oracle drafters at "
                        "0/50/100%% acceptance, with the rollback cost per round (random models built in DIR)")
    from ..distributed.cli import add_distributed_arguments

    add_distributed_arguments(p)  # --distributed: under mlx.launch, plain vs speculative on the cluster


def batch_sizes(args) -> list[int]:
    """--rows: the batch sizes of `--modeled`'s batched view (none without it)."""
    from ..errors import MlxSpecError

    if not args.rows:
        return []
    if not args.modeled:
        raise MlxSpecError("--rows is a view of --modeled: pass both")
    try:
        sizes = [int(b) for b in args.rows.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise MlxSpecError(f"--rows takes request counts of at least 1, e.g. 4,8; got {args.rows!r}")
    return sizes


def prompt_sets(args, tokenizer) -> dict[str, list]:
    from ..bench import PROMPTS, edit_prompts, long_chat_prompts, long_context_prompts, raw_prompts
    from ..errors import MlxSpecError
    from ..train.data import read_prompts

    sets = {}
    for kind in [k for k in args.kinds.split(",") if k]:
        if kind not in KINDS + EXTRA_KINDS:
            raise MlxSpecError(f"unknown prompt kind {kind!r}: choose from {', '.join(KINDS + EXTRA_KINDS)}")
        if kind == "long":
            sets["long"] = long_context_prompts(tokenizer, args.long_context)
        elif kind == "long-chat":
            sets["long-chat"] = long_chat_prompts(tokenizer, args.long_context)
        elif kind == "raw":
            sets["raw"] = raw_prompts()
        elif kind == "edit":
            sets["edit"] = edit_prompts()
        elif kind in PROMPTS:
            sets[kind] = PROMPTS[kind]
    if args.prompts:
        for p in read_prompts(args.prompts):
            sets.setdefault(p.get("kind", "user"), []).append({"raw": p["text"]} if "text" in p else p["messages"])
    return sets


def run(args) -> int:
    import mlx.core as mx

    if args.rollback is not None:
        return run_rollback(args)
    if args.distributed:
        from ..distributed.cli import run_bench

        return run_bench(args, prompt_sets)

    from ..bench import as_json, bench_sizes, plot
    from ..calibrate import calibrated_curve
    from ..errors import MlxSpecError
    from ..loading import load

    rows, extra, meta = [], {}, {"mlx": mx.__version__, "device": str(mx.default_device()), **machine()}
    setups = [(m, k) for m in (args.modes or args.mode).split(",") for k in args.kernels.split(",")]
    batch_rows = batch_sizes(args)
    for mode, kernels in setups:
        model, tok = load(args.model, drafter=args.drafter, mode=mode, dtype=args.dtype, kernels=kernels == "on",
                          kv_bits=args.kv_bits, kv_group_size=args.kv_group_size)
        if model.drafter is None:
            raise MlxSpecError("nothing to compare: no drafter for this model (pass --drafter)")
        meta.update(model=str(model.target_path), drafter=str(model.drafter_path))
        curve = calibrated_curve(model, model.drafter.block_size, batch_rows=max(batch_rows, default=0))
        meta["rollback_ms"] = rollback_line(model, model.drafter.block_size)
        meta["cost_curve"] = {"verify_ratio": [round(r, 3) for r in curve.ratios()], "t1_ms": curve.verify[0] * 1e3,
                              "round_ratio": [round(r, 3) for r in curve.round_ratios()],
                              "plain_step_ms": curve.rounds[0] * 1e3 if curve.rounds else None,
                              "seconds": {"verify": curve.verify, "draft": curve.draft, "rounds": curve.rounds,
                                          "batch": curve.batch, "draft_batch": curve.draft_batch,
                                          "long_batch": curve.long_batch, "long_draft_batch": curve.long_draft_batch},
                              "batch_context": curve.batch_context, "long_batch_context": curve.long_batch_context}
        if args.modeled:
            from ..bench_modeled import compare, compare_batched

            sets = prompt_sets(args, tok)
            extra.setdefault("modeled", []).extend(dict(r, mode=mode) for r in compare(
                model, tok, sets, curve, args.max_tokens))
            if batch_rows:
                extra.setdefault("modeled_batched", []).extend(dict(r, mode=mode) for r in compare_batched(
                    model, tok, sets, curve, args.max_tokens, batch_rows))
            continue
        sizes = [None if b == "auto" else int(b) for b in args.block_sizes.split(",")]
        for kind, prompts in prompt_sets(args, tok).items():
            for row in bench_sizes(model, tok, kind, prompts, args.max_tokens, sizes, args.repeats, curve):
                row.block += "" if args.kernels == "on" else f" kernels={kernels}"
                row.mode = mode
                rows.append(row)
                if not args.json:
                    print(f"{kind} {mode} block={row.block}: speedup {row.speedup:.2f}x τ {row.tau:.2f}", file=sys.stderr)
    if args.modeled:
        if args.json:
            print(json.dumps({"meta": meta, **extra}, indent=2))
        else:
            from ..bench_modeled import show as show_modeled, show_batched

            show_modeled(extra["modeled"])
            if extra.get("modeled_batched"):
                show_batched(extra["modeled_batched"])
        return 0
    if args.vs_draft_model:
        rows += draft_model_rows(args, model, tok)
    if args.vs_dspark:
        from ..bench_dspark import compare

        extra["vs_dspark"] = compare(model, tok, prompt_sets(args, tok), [int(c) for c in args.vs_dspark.split(",")],
                                     args.max_tokens, args.repeats)
    meta["load_average_end"] = machine()["load_average"]
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        print(json.dumps(as_json(rows, meta, extra), indent=2))
    else:
        show(rows, meta)
        if extra:
            show_dspark(extra["vs_dspark"])
    return 0 if all(r.identical for r in rows) else 1


def machine() -> dict:
    """What the figures depend on: the BLAS doing float32 GEMMs, and how busy the machine was."""
    import os

    from ..platform_blas import blas_info

    blas = blas_info()
    return {"blas": "bundled reference BLAS" if blas.reference else (blas.optimized or "optimized BLAS"),
            "load_average": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count()}


def show_dspark(rows: list[dict]) -> None:
    from rich.console import Console

    for r in rows:
        caps = " ".join(f"cap {c}: {t:.1f}" for c, t in r["dspark_tps_by_cap"].items())
        Console(width=200).print(f"vs mlx-dspark, {r['kind']}: mlx-spec auto {r['mlx_spec_auto_tps']:.1f} tok/s; "
                                 f"mlx-dspark {caps} tok/s; mlx-spec / best cap ({r['dspark_best_cap']}) "
                                 f"{r['ratio_vs_best']:.2f}x decoding, {r['ratio_vs_best_e2e']:.2f}x end to end "
                                 f"(medians of {r['pairs']} pairs)")


def draft_model_rows(args, model, tok):
    import statistics

    from ..bench import Row, encode, run_mlx_lm_draft, run_plain
    from ..model_files import load_target, resolve

    draft, _, _ = load_target(resolve(args.vs_draft_model))
    rows = []
    for kind, prompts in prompt_sets(args, tok).items():
        pairs = []
        for p in prompts:
            ids = encode(tok, p)
            run_mlx_lm_draft(model, tok, ids, 4, draft, 2)
            for _ in range(args.repeats):
                pairs.append((run_plain(model, tok, ids, args.max_tokens),
                              run_mlx_lm_draft(model, tok, ids, args.max_tokens, draft, 2)))
        plain = statistics.median(a.decode_tps for a, _ in pairs)
        other = statistics.median(b.decode_tps for _, b in pairs)
        same = all(a.tokens == b.tokens for a, b in pairs)
        rows.append(Row(kind, "mlx-lm draft model", plain, other, 0, 0, 0, 0, other / plain, 0.0, [], 0.0, same))
    return rows


def show(rows, meta) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"mlx-spec bench — {meta.get('model')} ({meta.get('device')})")
    for col in ("kind", "mode", "block", "drafts/round", "tokens", "plain tok/s", "spec tok/s", "speedup", "per CPU-s",
                "τ", "e2e speedup", "TTFT plain/spec ms", "acceptance by position", "peak GB", "identical", "efficiency"):
        t.add_column(col)
    for r in rows:
        e2e = r.spec_e2e_tps / r.plain_e2e_tps if r.plain_e2e_tps else 0
        few = " (few: noisy)" if r.tokens < 16 else ""
        t.add_row(r.kind, r.mode, r.block, f"{r.mean_draft:.1f}", f"{r.tokens:.0f}{few}", f"{r.plain_decode_tps:.1f}",
                  f"{r.spec_decode_tps:.1f}", f"{r.speedup:.2f}x", f"{r.cpu_speedup:.2f}x",
                  f"{r.tau:.2f}" if r.tau else "–",  # –: no drafts
                  f"{e2e:.2f}x", f"{r.plain_ttft * 1e3:.0f}/{r.spec_ttft * 1e3:.0f}",
                  " ".join(f"{a:.2f}" for a in r.acceptance[:8]), f"{r.peak_gb:.3f}",
                  "yes" if r.identical else f"NO (first at {r.divergences[0]})",
                  f"{r.efficiency:.2f}" if r.efficiency else "")
    console = Console()
    if not console.is_terminal:  # a pipe or a file: do not squeeze 15 columns into 80
        console = Console(width=200)
    console.print(t)
    curve = meta.get("cost_curve", {})
    console.print(f"{meta.get('blas')}; load average {meta.get('load_average')} at start, "
                  f"{meta.get('load_average_end')} at the end ({meta.get('cpu_count')} CPUs)")
    if curve.get("plain_step_ms"):
        console.print(f"one synchronous target pass t(1) {curve['t1_ms']:.2f} ms; a plain step (running ahead, as "
                      f"generate decodes) {curve['plain_step_ms']:.2f} ms")
    console.print("cost curve t(M)/t(1), M=1…: " + " ".join(f"{x:.2f}" for x in curve.get("verify_ratio", [])))
    rounds = curve.get("round_ratio", [])
    console.print("measured round / plain step, k=0… drafts: " + " ".join(f"{x:.2f}" for x in rounds))
    if meta.get("rollback_ms"):
        console.print(format_rollback(meta["rollback_ms"]))


def rollback_line(model, width: int) -> dict | None:
    """A hybrid target's rollback cost: ms to replay n accepted tokens after a rejection (n = 1 … width-1)."""
    from ..bench_models import replay_cost

    cost = replay_cost(model, width)
    return None if cost is None else {str(n): round(t * 1e3, 3) for n, t in cost.items()}


def format_rollback(ms: dict) -> str:
    return ("rollback (recurrent state: restore + replay the accepted tokens), ms for n = 1… kept tokens: "
            + " ".join(f"{v:.2f}" for v in ms.values()) + "; nothing when every draft is accepted")


def run_rollback(args) -> int:
    import tempfile

    from rich.console import Console
    from rich.table import Table

    from ..bench_models import rollback_bench

    block = args.block_size or 8
    rows = rollback_bench(Path(args.rollback or tempfile.mkdtemp()), block=block, tokens=args.max_tokens,
                          repeats=args.repeats)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        t = Table(title=f"rollback: block {block}, {args.max_tokens} tokens, medians of {args.repeats} plain/spec pairs "
                        "(models taking turns; vs dense: the speedup over the dense model's in the same repeat)")
        for col in ("model", "acceptance", "plain tok/s", "spec tok/s", "speedup", "vs dense", "τ",
                    "rollback ms/round", "recording would add ms/round", "identical"):
            t.add_column(col)
        for r in rows:
            rec = r["recording_ms_per_round"]
            t.add_row(r["model"], f"{r['acceptance']:.0%}", f"{r['plain_tps']:.1f}", f"{r['spec_tps']:.1f}",
                      f"{r['speedup']:.2f}x", f"{r['vs_dense']:.2f}", f"{r['tau']:.2f}", f"{r['rollback_ms_per_round']:.2f}",
                      "" if rec is None else f"{rec:.2f}", "yes" if r["identical"] else "NO")
        Console(width=160).print(t)
    return 0 if all(r["identical"] for r in rows) else 1
