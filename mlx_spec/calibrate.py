"""Measuring the cost curve (`curve.py`): what a verify pass, a drafter pass and a whole loop round
cost on this machine.

Measured once per model (a few seconds) and cached on disk; the draft-length controller
(`controller.py`) chooses from them. Round costs are measured through the real loop, host work
included (ideally a round costs t_verify(k+1) + t_draft(k)).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path

import mlx.core as mx

from .curve import CostCurve


def _timed(fns: list, repeats: int) -> list[float]:
    """The fastest of `repeats` timings of each function. The functions take turns within each
    repetition, so a burst of load on the machine slows one repetition of every shape rather than
    every repetition of one (timed one shape after another, a burst once put a 70% step at width 8
    into a verify curve that is flat there)."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            tic = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - tic)
    return [min(ts) for ts in times]  # other jobs only ever add time


def _verify_pass(model, pc, ids: list[int]):
    """One synchronous target pass over `ids` after what `pc` holds, taken back at once (a timing body)."""
    from .engine.cache import trim

    def run():
        logits, hidden = model.target(mx.array([ids]), pc.cache)
        mx.eval(logits, hidden) if hidden is not None else mx.eval(logits)
        trim(pc.cache, len(ids))
    return run


def measure_curve(model, max_width: int, context: int = 256, repeats: int = 9, long_context: int = 1024) -> CostCurve:
    """Time the target over M = 1..max_width new tokens after `context` cached ones, the drafter,
    and whole loop rounds with k = 0..max_width-1 drafts; the rounds again after `long_context`."""
    from .engine.rollback import attention_spans
    from .engine.sampling import Sampler, SamplingParams
    from .generate import make_prompt_cache

    vocab = model.vocab_size
    pc = make_prompt_cache(model)
    (ids,) = _fill_rows(model, [pc], [context])

    curve = CostCurve(_timed([_verify_pass(model, pc, ids[:m]) for m in range(1, max_width + 1)], repeats), [])
    greedy = Sampler(SamplingParams(), vocab)
    if model.drafter is not None:
        state = pc.drafter_state()

        def propose(k):
            return lambda: mx.eval(model.drafter.propose(state, ids[-1], k, greedy).tokens)
        curve.draft = _timed([propose(k) for k in range(1, max_width)], repeats)
    max_k = max_width - 1 if model.drafter is not None else 0
    pcs, long = [pc], min(long_context, model.context_length - 4 * max_width)  # room for the rounds' drafts
    if long > 2 * context:
        pcs.append(make_prompt_cache(model))
        _fill_rows(model, pcs[1:], [long])
    # both contexts' rounds take turns, equally often: timed apart, a burst of load in one phase read as
    # growth with the context (or hid it), and round_time carries that growth on with the context
    measured = measure_rounds(model, pcs, greedy, max_k, max(1, 2 * repeats // 3))
    rounds, *long_rounds = [_smooth_rounds(r) for r in measured]
    rounds = level_dips(rounds, curve.verify, measured[0])
    out = CostCurve(linear(monotone(curve.verify)), linear(monotone(curve.draft)), rounds, context=context)
    if long_rounds:
        out.long_rounds, out.long_context = straight_growth(rounds, long_rounds[0]), long
        spans = getattr(model.drafter, "context_spans", None)  # a drafter reads the context too
        out.spans = attention_spans(pcs[1].cache) + (spans(pcs[1].drafter_state()) if spans else [])
    return out


def level_dips(rounds: list[float], verify: list[float], raw_rounds: list[float]) -> list[float]:
    """Smoothed `rounds`, except that a round with k drafts measured no dearer than one with k - 1, both in
    the verify passes and in the loop's rounds (two separate timings: one dip alone is noise), costs what
    the narrower one does. OpenBLAS's kernels favour row counts that are multiples of 4: here 8 rows cost
    less than 7 and 4 less than 3, so a controller reading the smoothed line stopped one draft short of a
    round that was cheaper. Plain decoding and one draft are other kinds of round: never levelled."""
    out = list(rounds)
    for k in range(2, min(len(out), len(verify), len(raw_rounds))):
        if verify[k] <= verify[k - 1] and raw_rounds[k] <= raw_rounds[k - 1]:
            out[k] = out[k - 1]
    return out


def straight_growth(rounds: list[float], long_rounds: list[float]) -> list[float]:
    """`long_rounds` with their growth over `rounds` made a straight line in k (never negative): the
    added context costs attention in proportion to the block's width, k + 1 (plain decoding's k = 0
    too: a round of another kind, but the same attention per token), and the difference of two
    separate measurements is noisier than either, a noise that `round_time` then carries on with
    the context (one calibration here measured no growth at all for k = 0)."""
    growth = [b - a for a, b in zip(rounds, long_rounds)]
    if len(growth) > 1:
        growth = _least_squares(growth, min_slope=0.0)  # a wider block never grows less
    return [a + max(0.0, g) for a, g in zip(rounds, growth)]


def _smooth_rounds(rounds: list[float]) -> list[float]:
    rounds = monotone(rounds)
    return rounds[:1] + linear(rounds[1:])  # k = 0 is a plain step: another kind of round than drafting ones


def linear(times: list[float], tolerance: float = 0.05) -> list[float]:
    """The least-squares line through times[0], times[1], ... (never falling) where it fits them within
    `tolerance`; else the times as they are. Measured on a shared machine, a nearly straight curve has
    small steps that are load, not the model: one at 7 drafts once made the controller stop at 5 where
    7 paid (12% slower than a fixed block on code). A curve that is flat and then climbs (a GPU past a
    kernel's tile) is real, and stays."""
    if len(times) < 3:
        return list(times)
    line = _least_squares(times, min_slope=0.0)
    return line if all(abs(f - t) <= tolerance * t for f, t in zip(line, times)) else list(times)


def _least_squares(ys: list[float], min_slope: float = float("-inf")) -> list[float]:
    """The least-squares line through ys[0], ys[1], ... (at least two points), its slope at least min_slope."""
    n = len(ys)
    mean_x, mean_y = (n - 1) / 2, sum(ys) / n
    slope = max(min_slope, sum((i - mean_x) * (y - mean_y) for i, y in enumerate(ys))
                / sum((i - mean_x) ** 2 for i in range(n)))
    return [mean_y + slope * (i - mean_x) for i in range(n)]


def monotone(times: list[float]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators): more tokens never cost less,
    so a dip is timing noise, and a noisy dip would lure the controller."""
    blocks: list[list[float]] = []  # [mean, count]
    for t in times:
        blocks.append([t, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(n)]


def measure_rounds(model, pcs: list, sampler, max_k: int, repeats: int) -> list[list[float]]:
    """Seconds per round of the real loop with k = 0..max_k drafts (k = 0: pipelined plain decoding),
    after each cache's context.

    The widths take turns within each repetition, so a burst of load on the machine hits all of them
    rather than skewing one; each k's time is the fastest repetition (a median still took in bursts: a
    curve measured on a busy machine once said a plain step costs three synchronous passes, so drafting
    looked free, and it stays cached)."""
    starts = [(pc.mark(), pc.tokens[-1]) for pc in pcs]
    times = [[[] for _ in range(max_k + 1)] for _ in pcs]
    for rep in range(repeats + 1):  # the first repetition warms up
        for k in range(max_k + 1):
            for pc, start, ts in zip(pcs, starts, times):
                seconds = timed_rounds(model, [pc], [start], sampler, k, 4 if k == 0 else 2)
                if rep:
                    ts[k].append(seconds)
    return [[min(t) for t in ts] for ts in times]  # other jobs only ever add time: the quietest repetition is the cost


def timed_rounds(model, pcs: list, starts: list, sampler, k: int, n: int) -> float:
    """Seconds per round of n rounds of the real loop with k drafts for every request, these caches decoding
    together (one alone: pipelined plain decoding at k = 0), after one round that reaches the steady state
    (running ahead, the drafter fed, the slab built); then each cache goes back to its (mark, anchor)."""
    from .engine.loop import DecodeState, FixedLength, settle, step

    states = [DecodeState(pc, sampler, FixedLength(k), anchor=anchor) for pc, (_, anchor) in zip(pcs, starts)]
    step(model.target, model.drafter, states)
    tic = time.perf_counter()
    for _ in range(n):
        step(model.target, model.drafter, states)
    seconds = (time.perf_counter() - tic) / n
    for s, pc, (mark, _) in zip(states, pcs, starts):
        settle(s)
        pc.back_to(mark)  # (several rounds back: a hybrid's recurrent state only from a mark)
    return seconds


def sweep(top: int, dense: int = 16) -> tuple[int, ...]:
    """Every width (or draft count) from 1 to `top`, up to `dense` of them: batched costs step rather than grow
    smoothly (4 rows of the embedded target: widths 12 and 16 cost less than 11 and 15, where the rows reach
    a multiple of the product's tile; a drafter's pass jumps where it moves to a bigger block), so prices
    interpolated between widths 8 and 16 were 10-20% below what widths 9-11 cost, and a batch planned there."""
    return tuple(sorted({*range(1, min(top, dense) + 1), top}))


def batches(model) -> bool:
    """Whether the target's requests verify together in one pass (caches that batch), or one by one."""
    from .engine.batch import can_batch
    from .engine.rollback import batchable
    from .generate import make_prompt_cache

    return batchable(model.target.model) and can_batch([make_prompt_cache(model).cache for _ in range(2)])


def measure_batch_rounds(model, curve: CostCurve, rows: list[int], max_width: int, context: int, repeats: int = 3,
                         widths: tuple | None = None, filled: dict | None = None) -> list[list[float]]:
    """[rows, width, seconds] of whole batched loop rounds, every request drafting width - 1 tokens (width 1:
    plain), less the drafter pass `curve` prices for them: the target's share of a round, host work included
    (catching the drafter up, accepting, committing), as `plan_batch` prices a round. Timed as isolated
    passes, a 4-row round with 2-token blocks was priced 1.49x a plain one where it took 1.36x, and 4 to 8
    wide ones below what they took, so the batch plan passed over the block that paid most on raw text.
    The widths take turns within each repetition; each shape's fastest repetition is its cost."""
    from .engine.sampling import Sampler, SamplingParams

    pcs = filled or {b: filled_rows(model, b, context) for b in rows}
    widths = [w for w in widths if w < max_width] + [max_width] if widths else sweep(max_width)
    sampler = Sampler(SamplingParams(), model.vocab_size)
    starts = {b: [(pc.mark(), pc.tokens[-1]) for pc in pcs[b]] for b in rows}
    times: dict[tuple, list[float]] = {(b, w): [] for b in rows for w in widths}
    for rep in range(repeats + 1):  # the first repetition warms up
        for (b, w), ts in times.items():
            seconds = timed_rounds(model, pcs[b], starts[b], sampler, w - 1, 2)
            if rep:
                ts.append(seconds)
    return [[b, w, max(min(ts) - curve.draft_time(b if w > 1 else 0, w - 1, context), min(ts) / 2)]
            for (b, w), ts in times.items()]


def filled_rows(model, n: int, context: int) -> list:
    """n prompt caches holding contexts of about `context` tokens (of different lengths, as in a real batch)."""
    from .generate import make_prompt_cache

    pcs = [make_prompt_cache(model) for _ in range(n)]
    _fill_rows(model, pcs, [context + 3 * r for r in range(n)])
    return pcs


def _fill_rows(model, pcs: list, lengths: list[int], chunk: int = 256) -> list[list[int]]:
    """Each row's cache filled with its own context of the given length (and its drafter fed), as in a
    real batch; in chunks, as prefill runs ([n, vocab] logits at once is no small array). Returns the
    rows' token ids."""
    rows = []
    for r, (pc, n) in enumerate(zip(pcs, lengths)):
        ids = [(i * 7919 + r * 31) % model.vocab_size for i in range(n)]
        for i in range(0, n, chunk):
            out, hidden = model.target(mx.array([ids[i : i + chunk]]), pc.cache)
            pc.add(ids[i : i + chunk], hidden)
            mx.eval(out)
        rows.append(ids)
    return rows


def measure_draft_batch(model, rows: list[int], max_k: int, context: int = 64, repeats: int = 3,
                        ks: tuple | None = None, filled: list | None = None) -> list[list[float]]:
    """[rows, k, seconds] of one drafter pass drafting k tokens for each of `rows` requests (each its own
    context; one row too, measured alike, so that more rows never look cheaper); [] for a drafter that
    drafts one request at a time. filled: `max(rows)` prompt caches already `filled_rows`."""
    from .engine.sampling import Sampler, SamplingParams

    drafter = model.drafter
    if getattr(drafter, "propose_batch", None) is None:
        return []
    states = [pc.drafter_state() for pc in filled or filled_rows(model, max(rows), context)]
    greedy = Sampler(SamplingParams(), model.vocab_size).drafting(0)
    shapes = [(b, k) for b in [1] + rows for k in sorted({*(ks or sweep(max_k)), max_k}) if k <= max_k]

    def run(b, k):
        return lambda: mx.eval([d.tokens for d in drafter.propose_batch(states[:b], [1] * b, [k] * b, [greedy] * b)])
    return [[b, k, t] for (b, k), t in zip(shapes, _timed([run(b, k) for b, k in shapes], repeats))]


def context_costs(model, contexts: list[int], width: int, repeats: int = 3) -> list[dict]:
    """What long prompts cost: prefill seconds per token, and one synchronous verify pass over 1 and
    over `width` tokens, after `context` cached tokens (a context past the model's length is cut to fit)."""
    from .generate import make_prompt_cache

    vocab, out = model.vocab_size, []
    for context in sorted({min(c, model.context_length - width - 1) for c in contexts if c > 0}):
        pc = make_prompt_cache(model)
        ids = [(i * 7919) % vocab for i in range(context)]
        tic = time.perf_counter()
        for i in range(0, context, 512):  # chunked, as prefill runs
            logits, hidden = model.target(mx.array([ids[i : i + 512]]), pc.cache)
            mx.eval(logits, hidden) if hidden is not None else mx.eval(logits)
        prefill = (time.perf_counter() - tic) / context
        widths = sorted({1, width})
        times = _timed([_verify_pass(model, pc, ids[:m]) for m in widths], repeats)
        verify_ms = {str(m): t * 1e3 for m, t in zip(widths, times)}
        out.append({"context": context, "prefill_ms_per_token": prefill * 1e3, "verify_ms": verify_ms})
    return out


def _weights_files(path) -> str:
    """Which weights a folder holds now (names, sizes, modification times): a drafter retrained or
    installed in place is another drafter, with other costs (a 2-layer one drafts dearer)."""
    folder = Path(path) if path is not None else None
    if folder is None or not folder.is_dir():
        return ""
    stats = [(f.name, f.stat()) for f in sorted(folder.glob("*.safetensors"))]
    return json.dumps([(name, st.st_size, st.st_mtime_ns) for name, st in stats])


def curve_key(model) -> str:
    dtype = model.target.dtype
    parts = [str(model.target_path), str(model.drafter_path), _weights_files(model.target_path),
             _weights_files(model.drafter_path), json.dumps(model.config.get("quantization")), str(dtype),
             str(mx.default_device()), mx.__version__, platform.machine(), os.environ.get("LD_PRELOAD", ""),
             os.environ.get("OPENBLAS_NUM_THREADS", ""),
             f"eval_every={model.target.eval_every}", json.dumps(model.kv_cache, sort_keys=True),
             f"relaid={getattr(model, 'relaid', False)}",
             # rounds/11..: fastest repetitions, fitted lines, every shape timed in turn, long rounds in turn, spans,
             # dips levelled; /12: batched rows kept in slabs; /13: batched passes at a long context too;
             # /14: batched costs from whole rounds; /15: verify blocks' CPU attention (cpu_attention.py);
             # /16: DFlash drafts of any length run the drafter's whole block; /17: a batch's one-token rows
             # through the CPU attention; /18: several rows' SiLU in base 2 (cpu_swiglu.py); /19: every batched
             # width and draft count (`sweep`)
             "rounds/19"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("MLX_SPEC_CACHE", Path.home() / ".cache" / "mlx-spec"))


def calibrated_curve(model, max_width: int, refresh: bool = False, batch_rows: int = 0) -> CostCurve:
    """The cost curve for this model on this machine, measured once and cached. batch_rows: also
    batched passes of up to that many rows (2, 4, 8, ... rows; what a server's batched rounds cost).
    refresh: measure again (a curve measured while another job held the CPU misprices every round)."""
    path = cache_dir() / "curves" / f"{curve_key(model)}.json"
    model = model_drafting(model)
    curve = None
    if path.exists() and refresh:  # measured anew, the batched rows a server had measured included
        batch_rows = max([batch_rows] + [int(b) for b, _, _ in json.loads(path.read_text()).get("batch", [])])
    if path.exists() and not refresh:
        curve = CostCurve(**json.loads(path.read_text()))
        if len(curve.verify) < max_width or len(curve.rounds) < min(max_width, len(curve.draft) + 1):
            curve = None
    rows = [b for b in (2, 4, 8, 16, 32, 64) if b <= max(batch_rows, 2)] if batch_rows > 1 else []
    have = {int(b) for b, _, _ in curve.batch} if curve is not None else set()
    drafts = {int(b) for b, _, _ in curve.draft_batch} if curve is not None else set()
    batches_drafts = getattr(model.drafter, "propose_batch", None) is not None
    if curve is not None and set(rows) <= have and (set(rows) <= drafts or not batches_drafts):
        return curve
    if curve is None:
        from .drafters import learnt_blocks

        curve = measure_curve(model, max_width)
        curve.blocks = learnt_blocks(model.drafter)  # (one size takes no steps: `CostCurve.block_steps`)
    if rows:
        measure_batches(model, curve, rows, max_width)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(curve)))
    return curve


def measure_batches(model, curve: CostCurve, rows: list[int], max_width: int, long_context: int = 1024) -> None:
    """Batched target and drafter passes for `rows` after `curve.batch_context` cached tokens a row, and
    again (fewer shapes, the most rows) after `long_context`: at 8 rows of ~800 tokens a one-token pass
    cost twice what it did at 64 and a one-token draft three times, growth that one request's rounds had
    understated, so that drafting looked cheap beside long prompts (`plan_batch` priced a 2-wide round at
    1.4x a plain one; it cost 2x)."""
    if not batches(model):  # verified one by one
        return
    long = min(long_context, model.context_length - 2 * max_width)
    pcs = {b: filled_rows(model, b, curve.batch_context) for b in rows}
    curve.draft_batch = measure_draft_batch(model, rows, max_width - 1, curve.batch_context, filled=pcs[rows[-1]])
    curve.batch = measure_batch_rounds(model, curve, rows, max_width, curve.batch_context, filled=pcs)
    if long > 2 * curve.batch_context:
        # the most rows only (the growth goes in proportion to the rows, none at 0), the target's and the
        # drafter's passes over the same rows: filling them is most of the cost (~13 s here)
        top = rows[-1]
        pcs = filled_rows(model, top, long)
        curve.long_draft_batch = measure_draft_batch(model, [top], max_width - 1, long, ks=(1, 3), filled=pcs)
        curve.long_batch_context = long
        curve.long_batch = measure_batch_rounds(model, curve, [top], max_width, long, widths=(1, 2, 4),
                                                filled={top: pcs})


def model_drafting(model):
    """`model` with its model drafter alone, where prompt lookup may stand in for it (drafters/pick.py):
    a round costs what it does when the model drafts, lookup's rounds only cost less."""
    from .drafters import model_drafter

    return replace(model, drafter=model_drafter(model.drafter))


def cost_curve(model, refresh: bool = False) -> CostCurve | None:
    """The cost curve the draft-length controller uses for this pair on this machine (measured once, in
    a few seconds, then cached on disk); None without a drafter."""
    return calibrated_curve(model, model.drafter.block_size, refresh) if model.drafter is not None else None
