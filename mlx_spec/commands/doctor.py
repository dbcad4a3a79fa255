"""`mlx-spec doctor`: what MLX runs on here, whether the BLAS is the slow one, and the cost curve."""

from __future__ import annotations

import json
import os
import platform
import sys

from ..options import add_model_arguments


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--no-curve", action="store_true", help="skip measuring the cost curve")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the cost curve again and replace the cached one (measure on a quiet machine: "
                        "the controller prices every round from it), batched rows included")
    p.add_argument("--long-context", default="1024,2048", metavar="TOKENS",
                   help="contexts at which to measure prefill and verify cost ('' to skip)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def facts() -> dict:
    import mlx.core as mx
    import mlx_lm

    from .. import __version__
    from ..platform_blas import blas_info

    blas = blas_info()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else None
    return {
        "mlx_spec": __version__, "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
        "python": platform.python_version(), "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "device": str(mx.default_device()), "metal": bool(mx.metal.is_available()),
        "cuda": bool(getattr(mx, "cuda", None) and mx.cuda.is_available()),
        "memory_gib": round(mem, 1) if mem else None,
        "blas": {"loaded": blas.loaded, "reference": blas.reference, "advice": blas.advice},
    }


def run(args) -> int:
    from ..calibrate import calibrated_curve, context_costs
    from ..controller import best_length
    from ..options import load_from

    if args.recalibrate and args.no_curve:
        from ..errors import MlxSpecError

        raise MlxSpecError("--recalibrate measures the cost curve: drop --no-curve")
    info = facts()
    if not args.no_curve:
        model, _ = load_from(args)
        width = args.block_size or (model.drafter.block_size if model.drafter else 8)
        curve = calibrated_curve(model, width, refresh=args.recalibrate)
        info["model"] = str(model.target_path)
        info["drafter"] = str(model.drafter_path) if model.drafter_path else None
        info["relaid"] = model.relaid
        info["cost_curve"] = {"t1_ms": round(curve.verify[0] * 1e3, 3), "verify_ratio": [round(r, 2) for r in curve.ratios()],
                              # a plain step runs ahead (the next pass is queued before this token is read), as
                              # generate decodes; t(1) is one synchronous pass: graph building and the wait included
                              "plain_step_ms": round(curve.rounds[0] * 1e3, 3) if curve.rounds else None,
                              "batch_ms": [[b, w, round(t * 1e3, 3)] for b, w, t in curve.batch],
                              "draft_ms": [round(t * 1e3, 3) for t in curve.draft],
                              "round_ratio": [round(r, 2) for r in curve.round_ratios()],
                              "long_context": curve.long_context or None,  # the rounds again, after this many tokens
                              "long_round_ratio": [round(t / curve.rounds[0], 2) for t in curve.long_rounds],
                              "host_ms": [round((curve.round_time(k) - curve.pass_time(k)) * 1e3, 3)
                                          for k in range(1, len(curve.rounds))]}
        from .bench import rollback_line

        info["rollback_ms"] = rollback_line(model, width)
        contexts = [int(c) for c in args.long_context.split(",") if c.strip()]
        info["long_context"] = context_costs(model, contexts, width) if contexts else []
        if curve.draft:
            info["chosen_length"] = {str(a): best_length(curve, [a] * curve.max_drafts) for a in (0.5, 0.7, 0.9)}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    show(info)
    return 0


def show(info: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(show_header=False, box=None)
    for key in ("mlx_spec", "mlx", "mlx_lm", "python", "os", "device", "metal", "cuda", "memory_gib"):
        t.add_row(key, str(info[key]))
    t.add_row("blas", info["blas"]["advice"])
    if "cost_curve" in info:
        c = info["cost_curve"]
        t.add_row("model", info["model"])
        t.add_row("drafter", str(info["drafter"]))
        if info.get("relaid"):
            t.add_row("weights", "float32 weights relaid row-major for x @ W.T (faster on the bundled BLAS)")
        t.add_row("t(1)", f"{c['t1_ms']} ms  (one synchronous target pass, at a 256-token context)")
        if c.get("plain_step_ms"):
            t.add_row("plain step", f"{c['plain_step_ms']} ms  (running one token ahead, as generate decodes)")
        t.add_row("t(M)/t(1), M=1…", " ".join(f"{r:.2f}" for r in c["verify_ratio"]))
        if c["draft_ms"]:
            t.add_row("draft ms, k=1…", " ".join(f"{x:.2f}" for x in c["draft_ms"]))
            t.add_row("round / plain step, k=0…", " ".join(f"{x:.2f}" for x in c["round_ratio"]))
            if c["long_round_ratio"]:
                t.add_row(f"  … at {c['long_context']} tokens", " ".join(f"{x:.2f}" for x in c["long_round_ratio"])
                          + "  (same unit: longer contexts favour narrower blocks)")
            host = " ".join(f"{x:.2f}" for x in c["host_ms"])
            t.add_row("host ms per round, k=1…", host + "  (round − verify − draft)")
            t.add_row("chosen draft length", ", ".join(f"α={a}: k={k}" for a, k in info["chosen_length"].items()))
        for lc in info.get("long_context", []):
            verify = ", ".join(f"t({m}) {ms:.2f} ms" for m, ms in lc["verify_ms"].items())
            t.add_row(f"at {lc['context']} tokens", f"prefill {lc['prefill_ms_per_token']:.3f} ms/token; {verify}")
        if info.get("rollback_ms"):  # a hybrid target: recurrent states roll back by replay
            from .bench import format_rollback

            t.add_row("rollback", format_rollback(info["rollback_ms"]))
    Console(file=sys.stdout).print(t)
