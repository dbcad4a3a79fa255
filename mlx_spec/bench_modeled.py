"""`bench --modeled`: the draft-length controller's choices against every fixed block, without the
machine's noise. Each policy runs the real loop (greedy: the output and each round's acceptance are
what they would be), and each round is charged what the calibrated cost curve says a round with
its draft length costs at its context, instead of being timed. On a shared machine, wall-clock pairs
of auto and a fixed block spread more than the few percent between them; this view does not. It is
the cost model's view, not a speed: where the curve is wrong, so is it.

With `rows` (`bench --modeled --rows 4,8`), the same for batched rounds as the server runs them: that many
requests decode together, and each round is charged the calibrated batched costs of its width.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from .bench import encode, prompt_kind


def kind_of(prompts: list) -> str:
    """The kind whose estimates the server's controller would start these requests from."""
    return "raw" if all(prompt_kind(p) == "raw" for p in prompts) else "chat"


def modeled_rate(model, tokenizer, ids: list[int], max_tokens: int, lengths, curve) -> tuple[int, float]:
    """(tokens, modeled seconds) of one greedy generation with these draft lengths."""
    from .generate import make_generation, step_all

    g = make_generation(model, tokenizer, ids, max_tokens, draft_lengths=lengths)
    tokens = len(g.start().tokens)  # the prefill ends with a plain round
    seconds = curve.round_time(0, len(ids))
    while not g.finished:
        context = len(g.state.pc.tokens)
        r = step_all(model, [g])[0]
        tokens, seconds = tokens + len(r.tokens), seconds + curve.round_time(r.drafted, context)
    return tokens, seconds


def compare(model, tokenizer, sets: dict, curve, max_tokens: int, config=None) -> list[dict]:
    """Per prompt kind: modeled tokens per second of every fixed block and of auto (run after one
    request with the same prompt, as a server's or a chat's next request starts from its predecessor's
    estimates), and auto over the best fixed block (per prompt; the kind's median). "auto_shared": auto
    in the timed bench's order instead, one controller memory across every kind and prompt, each prompt a
    warm-up and two repeats of its kind (`bench.prompt_kind`): where earlier prompts' estimates mislead later ones."""
    from .controller import AdaptiveLength, ControllerConfig, ControllerMemory
    from .engine.loop import FixedLength

    config, top = config or ControllerConfig(), model.drafter.block_size - 1
    rows, shared = [], ControllerMemory()
    for kind, prompts in sets.items():
        per_prompt = []
        for prompt in prompts:
            ids = encode(tokenizer, prompt)
            fixed = [modeled_rate(model, tokenizer, ids, max_tokens, FixedLength(k), curve) for k in range(top + 1)]
            if fixed[0][0] < 8:  # an answer of a few tokens: nothing to compare
                continue
            memory = ControllerMemory()
            for _ in range(2):
                lengths = AdaptiveLength(curve, top, config, memory=memory, clock=None, kind=prompt_kind(prompt),
                                         prompt_tokens=len(ids))
                auto = modeled_rate(model, tokenizer, ids, max_tokens, lengths, curve)
            in_order = [modeled_rate(model, tokenizer, ids, max_tokens,
                                     AdaptiveLength(curve, top, config, memory=shared, clock=None,
                                                    kind=prompt_kind(prompt), prompt_tokens=len(ids)), curve)
                        for _ in range(3)][1:]
            rates = [n / s for n, s in fixed]
            best = max(range(top + 1), key=lambda k: rates[k])
            shared_tps = sum(n for n, _ in in_order) / sum(s for _, s in in_order)
            per_prompt.append({"tokens": auto[0], "auto_tps": auto[0] / auto[1], "fixed_tps": rates,
                               "best_block": best + 1, "auto_over_best": auto[0] / auto[1] / rates[best],
                               "auto_shared_tps": shared_tps, "auto_shared_over_best": shared_tps / rates[best]})
        if per_prompt:
            rows.append({"kind": kind, "prompts": per_prompt,
                         "auto_over_best": statistics.median(p["auto_over_best"] for p in per_prompt),
                         "auto_shared_over_best": statistics.median(p["auto_shared_over_best"] for p in per_prompt)})
    return rows


class BatchRun(NamedTuple):
    tokens: int
    seconds: float
    busy_tokens: int  # ...of the rounds that ran `rows` requests (the served benchmark's "all clients busy")
    busy_seconds: float


def batched_rate(model, tokenizer, prompts: list, rows: int, max_tokens: int, lengths, curve,
                 requests: int | None = None) -> BatchRun:
    """Tokens and modeled seconds of `requests` (default: `rows`) greedy generations of the prompts (cycled),
    at most `rows` decoding together, as the server's batched rounds run them under `rows` clients that each
    send their next request when the last ends: each round charged the calibrated batched target pass over
    the live requests' blocks padded to the widest and their contexts to the longest, and one drafter pass for
    the drafting ones (what `batch_plan.plan_batch` plans with). Prefills cost every policy the same and are
    not charged. `lengths()`: a new request's draft lengths."""
    from .generate import make_generation, step_all

    queue = [encode(tokenizer, prompts[i % len(prompts)]) for i in range(requests or rows)]
    live, tokens, seconds, busy = [], 0, 0.0, [0, 0.0]
    while queue or live:
        while queue and len(live) < rows:  # a client whose request ended sends its next one
            g = make_generation(model, tokenizer, queue.pop(0), max_tokens, draft_lengths=lengths())
            tokens += len(g.start().tokens)
            live += [] if g.finished else [g]
        if not live:
            continue
        context = max(len(g.state.pc.tokens) for g in live)
        done = step_all(model, live)
        width, drafting = 1 + max(r.drafted for r in done), sum(1 for r in done if r.drafted)
        cost, made = curve.batch_time(len(live), width, context) + curve.draft_time(drafting, width - 1, context), \
            sum(len(r.tokens) for r in done)
        tokens, seconds = tokens + made, seconds + cost
        if len(live) == rows:
            busy = [busy[0] + made, busy[1] + cost]
        live = [g for g in live if not g.finished]
    return BatchRun(tokens, seconds, *busy)


def compare_batched(model, tokenizer, sets: dict, curve, max_tokens: int, rows: list[int], config=None,
                    per_client: int = 3) -> list[dict]:
    """Per prompt kind and batch size: modeled tokens per second of plain decoding, of every fixed block
    for all requests alike, and of auto (`plan_batch`: each request's own length, in one pass), each over
    plain; and auto over the best fixed block (the ceiling a uniform block reaches). Each as the served
    benchmark runs it: `rows` clients sending `per_client` requests each, one after another; over the whole
    run and over its rounds of `rows` requests ("busy": before the first clients are done)."""
    from .controller import AdaptiveLength, ControllerConfig, ControllerMemory
    from .engine.loop import FixedLength

    config, top = config or ControllerConfig(), model.drafter.block_size - 1
    out = []
    for kind, prompts in sets.items():
        for b in rows:
            fixed = [batched_rate(model, tokenizer, prompts, b, max_tokens, lambda k=k: FixedLength(k), curve,
                                  b * per_client) for k in range(top + 1)]
            memory = ControllerMemory()
            for n in (b, b * per_client):  # the run starts from a batch's estimates, as a server's next requests do
                auto = batched_rate(model, tokenizer, prompts, b, max_tokens, lambda: AdaptiveLength(
                    curve, top, config, memory=memory, clock=None, kind=kind_of(prompts)), curve, n)
            rates = [r.tokens / r.seconds for r in fixed]
            busy = [r.busy_tokens / r.busy_seconds for r in fixed]
            best = max(range(top + 1), key=lambda k: busy[k])
            auto_busy = auto.busy_tokens / auto.busy_seconds
            out.append({"kind": kind, "rows": b, "tokens": auto.tokens, "over_plain": [r / rates[0] for r in rates],
                        "busy_over_plain": [r / busy[0] for r in busy],
                        "auto_over_plain": auto.tokens / auto.seconds / rates[0],
                        "auto_busy_over_plain": auto_busy / busy[0], "best_block": best + 1,
                        "auto_over_best": auto_busy / busy[best]})
    return out


def show(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="modeled: each round charged its calibrated cost at its context (not timed)")
    for col in ("kind", "auto / best fixed block, per prompt (best block)", "median", "in the bench's order"):
        t.add_column(col)
    for r in rows:
        each = " ".join(f"{p['auto_over_best']:.3f} ({p['best_block']})" for p in r["prompts"])
        t.add_row(r["kind"], each, f"{r['auto_over_best']:.3f}", f"{r['auto_shared_over_best']:.3f}")
    t.caption = "in the bench's order: one controller memory across every kind and prompt, as the timed bench runs them"
    Console(width=160).print(t)


def show_batched(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="modeled batched rounds: each charged its calibrated batched cost (not timed); speeds over plain")
    for col in ("kind", "rows", "fixed block 2…B over plain, busy", "auto over plain: busy (whole run)",
                "auto / best fixed, busy (best block)"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["kind"], str(r["rows"]), " ".join(f"{x:.2f}" for x in r["busy_over_plain"][1:]),
                  f"{r['auto_busy_over_plain']:.2f} ({r['auto_over_plain']:.2f})",
                  f"{r['auto_over_best']:.3f} ({r['best_block']})")
    t.caption = ("busy: the rounds that ran all the rows, before the first clients were done; the whole run adds its "
                 "end, fewer rows a round")
    Console(width=160).print(t)
