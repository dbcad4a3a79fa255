"""`mlx-spec bench --distributed`: on the cluster the ranks form, plain vs speculative decoding of the
same split target, and what a round costs in communication.

Communication per round is measured apart from compute: the round's own messages (the activations
and taps each stage sends on, the shared logits, the shared draft) with the shapes of a plain round
(1 token) and of a verify round (the block), sent through the same ranks with nothing computed,
median of `repeats` rounds. Throughput is tokens per second of whole generations, plain and
speculative alternating per prompt after a warm-up, medians.
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx

from .session import Session, from_root


def round_messages(model, session: Session, width: int, repeats: int = 20) -> float:
    """Seconds of one round's communication at `width` tokens per pass (median)."""
    target, group = model.target, session.group
    lay = target.layout
    h = int(target.embed(mx.array([[0]])).shape[-1])
    dtype = target.embed(mx.array([[0]])).dtype
    taps = sorted(target.tap_ids)
    times = []
    for _ in range(repeats + 2):
        session.barrier()
        t = time.perf_counter()
        if lay.source is not None:  # the stage before this one sends its output and the taps so far
            n_up = sum(i < lay.start for i in taps)
            mx.eval(mx.distributed.recv((1, width, h * (1 + n_up)), dtype, lay.source, group=group))
        if lay.dest is not None:
            n_down = sum(i < lay.end for i in taps)
            mx.eval(mx.distributed.send(mx.zeros((1, width, h * (1 + n_down)), dtype), lay.dest, group=group))
        shape = (1, width, target.vocab_size)
        mx.eval(from_root(mx.zeros(shape, mx.float32) if lay.is_last else None, shape, mx.float32, group))
        if width > 1:
            mx.eval(from_root(mx.zeros((width,), mx.int32) if lay.is_last else None, (width,), mx.int32, group))
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def generation_tps(model, tokenizer, prompt, max_tokens: int, speculative: bool, session: Session) -> tuple[float, int]:
    from ..generate import make_generation, step_all

    g = make_generation(model, tokenizer, prompt, max_tokens, speculative=speculative, adaptive=False)
    session.barrier()
    first = g.start()
    t, n, rounds = time.perf_counter(), first.generation_tokens, 0
    while not g.finished:
        r = step_all(model, [g])[0]
        n, rounds = r.generation_tokens, rounds + 1
        session.progress()
    return n, time.perf_counter() - t, rounds


class Alone:
    """`compare` in one process (no ranks): the same loop, nothing to wait for."""

    size = 1

    def barrier(self) -> None:
        pass

    def progress(self) -> None:
        pass


def compare(sync, model, tokenizer, prompts: list, max_tokens: int, repeats: int) -> dict:
    """Tokens per second after the first token (summed over a pass's generations), median over the
    `repeats` passes over the prompts; plain and speculative alternate per prompt. `sync` is the
    Session (or `Alone`: the same loop in one process, for the single-process side of a comparison)."""
    generation_tps(model, tokenizer, prompts[0], 16, False, sync)  # warm-up
    generation_tps(model, tokenizer, prompts[0], 16, True, sync)
    tps = {"plain": [], "spec": []}
    rounds = {"plain": 0, "spec": 0}
    tokens = {"plain": 0, "spec": 0}
    pairs = []  # speculative over plain tok/s of one prompt, run back to back: robust to a drifting load
    for _ in range(repeats):
        work = {"plain": [0, 0.0], "spec": [0, 0.0]}
        for prompt in prompts:
            pair = {}
            for kind in ("plain", "spec"):
                n, seconds, r = generation_tps(model, tokenizer, prompt, max_tokens, kind == "spec", sync)
                work[kind][0] += n - 1
                work[kind][1] += seconds
                rounds[kind] += r
                tokens[kind] += n - 1
                pair[kind] = (n - 1) / max(seconds, 1e-9)
            if pair["plain"] > 0:
                pairs.append(pair["spec"] / pair["plain"])
        for kind in tps:
            tps[kind].append(work[kind][0] / max(work[kind][1], 1e-9))
    p, s = statistics.median(tps["plain"]), statistics.median(tps["spec"])
    tau = tokens["spec"] / max(rounds["spec"], 1)
    return {"ranks": sync.size, "block_size": model.drafter.block_size,
            "plain_tps": round(p, 2), "spec_tps": round(s, 2), "speedup": round(s / p, 3),
            "speedup_median_of_pairs": round(statistics.median(pairs), 3) if pairs else None,
            "tokens_per_pass_spec": round(tau, 3),
            "ms_per_plain_round": round(1e3 / p, 2), "ms_per_verify_round": round(1e3 * tau / s, 2),
            "_rounds": rounds, "_tokens": tokens}


def run_bench(session: Session, model, tokenizer, prompts: list, max_tokens: int, repeats: int) -> dict:
    """`compare` on the cluster, and the communication of a plain and of a verify round."""
    row = compare(session, model, tokenizer, prompts, max_tokens, repeats)
    rounds, tokens = row.pop("_rounds"), row.pop("_tokens")
    block = model.drafter.block_size
    comm_plain, comm_spec = round_messages(model, session, 1), round_messages(model, session, block)
    p, s = row["plain_tps"], row["spec_tps"]
    return {**row, "split": list(model.target.layout.split),
            "comm_ms_per_plain_round": round(comm_plain * 1e3, 3),
            "comm_ms_per_verify_round": round(comm_spec * 1e3, 3),
            "comm_share_plain": round(comm_plain * rounds["plain"] / max(tokens["plain"] / p, 1e-9), 3),
            "comm_share_spec": round(comm_spec * rounds["spec"] / max(tokens["spec"] / s, 1e-9), 3)}
