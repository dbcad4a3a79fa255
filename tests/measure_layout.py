"""Not a test: `python tests/measure_layout.py --context 256 --repeats 15` — the embedded target's passes with its
float32 weights as stored ([out, in]) and as `cpu_layout.relayout` lays them out (row-major for x @ W.T), taking
turns: a prefill of `--context` tokens, then one-, two- and eight-token passes after it (medians).
Run it with the BLAS you measure: as is for MLX's bundled one; `LD_PRELOAD=.../libopenblas.so.0
OPENBLAS_NUM_THREADS=1` for OpenBLAS.
"""
import argparse
import statistics
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from mlx_spec import models
from mlx_spec.cpu_layout import relayout


def timed(fn) -> float:
    start = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    model, _ = load(str(models.DEFAULT_TARGET))
    prompt = mx.array([[5 + i % 4000 for i in range(args.context)]])
    times = {"stored": {}, "relaid": {}}
    for _ in range(args.repeats):
        for layout in times:
            relayout(model, stored=layout == "stored")
            cache = make_prompt_cache(model)
            times[layout].setdefault("prefill", []).append(timed(lambda: model(prompt, cache=cache)))
            for width in (1, 2, 8):
                for _ in range(3):
                    block = mx.array([list(range(7, 7 + width))])
                    times[layout].setdefault(width, []).append(timed(lambda: model(block, cache=cache)))
                    for c in cache:
                        c.trim(width)
    for layout, parts in times.items():
        print(f"{layout}: " + ", ".join(f"{'prefill' if k == 'prefill' else f't({k})'} "
                                        f"{statistics.median(v) * 1e3:.2f} ms" for k, v in parts.items()))


if __name__ == "__main__":
    main()
