"""Not a test: `python tests/measure_rebuild.py` — what a batch whose members change costs. 8 rows of 64 and
250 cached tokens decode in batched rounds (plain, and every row drafting 3 or 7 tokens), once with the
rows in the same order every round (one slab reused, engine/slab.py) and once reordered every round (a
new slab each round, as when a request joins or leaves); prints the fastest of 4 repetitions of each.
Run it with the BLAS you measure (LD_PRELOAD=.../libopenblas.so.0 OPENBLAS_NUM_THREADS=2 _MLX_SPEC_REEXEC=1).
"""
import time

from mlx_spec.calibrate import filled_rows, model_drafting
from mlx_spec.engine.loop import DecodeState, FixedLength, settle, step
from mlx_spec.engine.sampling import Sampler, SamplingParams
from mlx_spec.loading import load

ROWS, WIDTHS = 8, (1, 4, 8)


def rounds(model, sampler, pcs, starts, width: int, reorder: bool, n: int = 4) -> float:
    """Seconds per batched round over these rows, after one round that reaches the steady state."""
    states = [DecodeState(pc, sampler, FixedLength(width - 1), anchor=a) for pc, (_, a) in zip(pcs, starts)]
    step(model.target, model.drafter, states)
    tic = time.perf_counter()
    for _ in range(n):
        if reorder:
            states = states[1:] + states[:1]
        step(model.target, model.drafter, states)
    seconds = (time.perf_counter() - tic) / n
    for s, pc, (start, _) in zip(states, pcs, starts):
        settle(s)
        pc.back_to(start)
    return seconds


def main():
    model, _ = load(None)
    model = model_drafting(model)
    sampler = Sampler(SamplingParams(), model.vocab_size)
    for context in (64, 250):
        pcs = filled_rows(model, ROWS, context)
        starts = [(pc.mark(), pc.tokens[-1]) for pc in pcs]
        times = {}
        for rep in range(5):  # the first repetition warms up; the shapes take turns
            for w in WIDTHS:
                for reorder in (False, True):
                    t = rounds(model, sampler, pcs, starts, w, reorder)
                    times.setdefault((w, reorder), []).append(t) if rep else None
        for w in WIDTHS:
            kept, moved = min(times[(w, False)]), min(times[(w, True)])
            print(f"{ROWS} rows, {context} cached tokens, width {w}: same rows {kept * 1e3:.2f} ms a round, "
                  f"reordered every round {moved * 1e3:.2f} ms (+{(moved - kept) * 1e3:.2f})")


if __name__ == "__main__":
    main()
