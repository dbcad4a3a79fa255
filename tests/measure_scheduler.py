"""Not a test: `python tests/measure_scheduler.py --kind raw --clients 4,8` — the server's own scheduler and
backend in this process, no HTTP: a speculative one and a `--no-draft` one, each with its worker thread, and
`clients` client threads that each send `--per-client` requests of `loadbench_spec`'s prompts (greedy, 128
tokens) one after another, the two schedulers taking turns `--repeats` times per client count. Prints each
turn's tokens per second and the median ratio. `loadbench_spec` through real servers minus the HTTP side:
where the two differ, the difference is HTTP's. Run it with the BLAS you measure
(LD_PRELOAD=.../libopenblas.so.0 OPENBLAS_NUM_THREADS=2 _MLX_SPEC_REEXEC=1).
"""
import argparse
import statistics
import threading
import time

from mlx_spec import SamplingParams
from mlx_spec.app.server.backend import Backend
from mlx_spec.app.server.config import ModelConfig
from mlx_spec.app.server.loadbench_spec import CODE, long_prompts, raw_prompts
from mlx_spec.app.server.metrics import Metrics
from mlx_spec.app.server.scheduler import Scheduler
from mlx_spec.app.server.sequence import Job, Sequence
from mlx_spec.chat_template import encode_chat


def scheduler(drafter: str | None) -> Scheduler:
    s = Scheduler(Backend(ModelConfig(drafter=drafter), 4), Metrics(), max_active=8, max_queue=64, retry_after=1)
    s.start()
    s.ready.wait()
    return s


def client(sched: Scheduler, jobs: list[Job], out: list[int]) -> None:
    for job in jobs:
        done, got = threading.Event(), []

        def deliver(o, got=got, done=done):
            if o.finish_reason:
                got.append(o.completion_tokens)
                done.set()
        sched.submit(Sequence(job, deliver, timeout=900))
        done.wait()
        out += got


def run(sched: Scheduler, jobs: list[list[Job]]) -> float:
    """Tokens per second of every client's requests."""
    out, tic = [], time.perf_counter()
    threads = [threading.Thread(target=client, args=(sched, mine, out)) for mine in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(out) / (time.perf_counter() - tic)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", default="raw", choices=["code", "raw", "long"])
    p.add_argument("--clients", default="8")
    p.add_argument("--per-client", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    scheds = {"spec": scheduler("auto"), "plain": scheduler(None)}
    tok = scheds["spec"].backend.tokenizer
    if args.kind == "raw":
        ids = [tok.encode(t) for t in raw_prompts()]
    else:
        texts = long_prompts() if args.kind == "long" else CODE
        ids = [encode_chat(tok, [{"role": "user", "content": t}]) for t in texts]
    kind = "raw" if args.kind == "raw" else "chat"
    for clients in [int(c) for c in args.clients.split(",")]:
        jobs = [[Job(ids[(c * args.per_client + j) % len(ids)], 128, SamplingParams(temperature=0.0), kind=kind)
                 for j in range(args.per_client)] for c in range(clients)]
        tps = {"spec": [], "plain": []}
        for rep in range(args.repeats):
            for name in ("spec", "plain") if rep % 2 == 0 else ("plain", "spec"):
                tps[name].append(run(scheds[name], jobs))
                print(f"{args.kind} {clients} clients, turn {rep}: {name} {tps[name][-1]:.1f} tok/s", flush=True)
        pairs = [a / b for a, b in zip(tps["spec"], tps["plain"])]
        print(f"{args.kind} {clients} clients: spec / no-draft {statistics.median(pairs):.3f} "
              f"(pairs {' '.join(f'{r:.2f}' for r in pairs)})", flush=True)
    for s in scheds.values():
        s.stop()


if __name__ == "__main__":
    main()
