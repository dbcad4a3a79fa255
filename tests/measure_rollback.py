"""Not a test: `python tests/measure_rollback.py [DIR]` — where a Qwen3.5-shaped hybrid's verify pass spends
its time against a dense qwen3 of the same size (the models of `mlx-spec bench --rollback`).

Prints, in CPU seconds of this process (robust on a shared machine, unlike wall time): one synchronous
target pass over M = 1 and 8 tokens for both models (the hybrid with mlx-lm's mixers and with
kernels.patch_recurrence's, which `mlx_spec.load` uses), and the Gated DeltaNet recurrence alone at T = 1 and
8: mlx-lm's (`gated_delta_update`, which off Metal runs `gated_delta_ops`: one compiled step per token) and
ours (metal_kernels/gated_delta_verify.py: the whole block as one compiled graph, the same floats).
Run it with the BLAS you measure (LD_PRELOAD=.../libopenblas.so.0 OPENBLAS_NUM_THREADS=1 for OpenBLAS).
"""
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.models.gated_delta import gated_delta_update

from mlx_spec.bench_models import DENSE, QWEN35, build
from mlx_spec.kernels import patch_recurrence
from mlx_spec.metal_kernels import gated_delta_verify


def cpu_ms(fn, reps=60):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times) * 1e3


def main():
    d = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    ids = mx.array([[(7 * i) % 1000 + 3 for i in range(64)]])
    for name, config, patch in (("qwen3.5-shaped", QWEN35, False), ("qwen3.5-shaped, ours", QWEN35, True),
                                ("dense qwen3", DENSE, False)):
        model, _ = mlx_lm.load(str(build(d / name.split(",")[0].split()[-1], config)))
        if patch:
            patch_recurrence(model)
        row = {}
        for m in (1, 8):
            def run():
                cache = make_prompt_cache(model)
                model(ids[:, :48], cache=cache)  # a context, then the pass measured with it
                mx.eval([c.state for c in cache])
                t = time.process_time()
                mx.eval(model(ids[:, 48 : 48 + m], cache=cache))
                return time.process_time() - t
            run()
            row[m] = statistics.median(run() for _ in range(40)) * 1e3
        print(f"{name:21s} t(1) {row[1]:6.2f} ms  t(8) {row[8]:6.2f} ms  t(8)/t(1) {row[8] / row[1]:.2f}")
    text = QWEN35["text_config"]
    hk, dk, hv, dv = (text[k] for k in ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
                                        "linear_value_head_dim"))
    for t_len in (1, 8):
        q, k = (mx.random.normal((1, t_len, hk, dk)) * 0.1 for _ in range(2))
        v, a, b = (mx.random.normal(s) for s in ((1, t_len, hv, dv), (1, t_len, hv), (1, t_len, hv)))
        state, a_log, dt = mx.zeros((1, hv, dv, dk)), mx.zeros((hv,)), mx.ones((hv,))
        mx.eval(q, k, v, a, b, state)
        for who, fn in (("mlx-lm", gated_delta_update), ("ours", gated_delta_verify.gated_delta_update)):
            ms = cpu_ms(lambda: mx.eval(fn(q, k, v, a, b, a_log, dt, state)), reps=200)
            print(f"{who:6s} Gated DeltaNet recurrence, one layer, T = {t_len}: {ms:.3f} ms")


if __name__ == "__main__":
    main()
