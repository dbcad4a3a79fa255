"""Side-by-side benchmark: mlx-lm's plain decoding vs mlx-spec's speculative decoding, one process.

Runs are interleaved (plain, spec, plain, spec, ...) after a warm-up, and reported as medians,
so machine noise hits both sides alike. Decode speed excludes prefill; identity of the greedy
outputs is checked on every pair.
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import mlx.core as mx

from .cpu_layout import as_stored

PROMPTS = {
    "code": [
        "Write a Python function that checks whether a string is a palindrome.",
        "Write a Python class Stack with push, pop and peek methods.",
        "Write a Python function `merge_sorted(a, b)` that merges two sorted lists.",
    ],
    "chat": [
        "Hi! How was your weekend?",
        "I just got back from a long bike ride and I'm exhausted.",
        "What kind of music do you like?",
    ],
    "math": [
        "What is 17 times 23? Explain step by step.",
        "A train travels 60 miles per hour for 3 hours. How far does it go?",
    ],
}


def _frozen(name: str) -> str:
    """Code the edit and long prompts rework, frozen (`bench_prompts.json`): were it read from this
    package's own source, every edit there would change the prompts, and runs could not be compared."""
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / "bench_prompts.json").read_text())[name]


def edit_prompts() -> list[str]:
    """Copy-heavy requests: the answer repeats most of the prompt (prompt lookup's home ground).
    Code first, then the request: the form the embedded target was trained on."""
    code = _frozen("edit_code")
    return [f"```python\n{code}```\n\nRename the variable `best` to `longest` in this function.",
            f"```python\n{code}```\n\nRewrite this function with a docstring."]


LONG_ASKS = ("Rewrite this code with docstrings.", "Write the next function of this module.",
             "Explain what this code does, function by function.")
LONG_CHAT_ASKS = ("Write a Python function that reverses a list.",
                  "Write a Python function that counts the words in a string.",
                  "Write a Python function that returns the median of a list of numbers.")


def long_context_prompts(tokenizer, n_tokens: int) -> list[list[dict]]:
    """A long piece of code cut to about n_tokens of context, then a request: rework it, continue it,
    explain it. Several answers per length: over one answer of ~70 tokens a prompt's τ swings ±15%."""
    ids = tokenizer.encode(_frozen("long_code"), verbose=False)  # (longer than the model: cut below, no warning)
    while len(ids) < n_tokens:
        ids += ids
    code = tokenizer.decode(ids[:n_tokens])
    return [[{"role": "user", "content": f"```python\n{code}\n```\n\n{ask}"}] for ask in LONG_ASKS]


def raw_prompts() -> list[dict]:
    """Raw code continuations, no chat template (what /v1/completions and notebooks send): the first third
    of a few standard-library functions, to be completed. Each stops at its last line's last character: the
    tokenizer merges a newline with the next line's indentation, so a bare trailing newline reads as a block's end."""
    import inspect
    import json
    import statistics
    import textwrap
    import threading

    out = []
    for fn in (textwrap.dedent, textwrap.indent, json.dumps, inspect.getdoc, statistics.median, statistics.mean,
               threading.Thread.join):
        try:
            lines = inspect.getsource(fn).splitlines(keepends=True)
        except (OSError, TypeError):  # a Python installed without its sources
            continue
        out.append({"raw": "".join(lines[: max(4, len(lines) // 3)]).rstrip("\n")})
    return out or [{"raw": "def add(a, b):"}]


def long_chat_prompts(tokenizer, n_tokens: int) -> list[list[dict]]:
    """Long multi-turn chats (earlier turns on code, answered), at most about n_tokens each, then a new request."""
    return [long_chat_prompt(tokenizer, n_tokens, ask) for ask in LONG_CHAT_ASKS]


def long_chat_prompt(tokenizer, n_tokens: int, ask: str) -> list[dict]:
    """A long multi-turn chat (earlier turns on code, answered), at most about n_tokens, then `ask`."""
    request = [{"role": "user", "content": ask}]
    turns: list[dict] = []
    for fn in raw_prompts() * 8:
        turn = [{"role": "user", "content": f"Here is part of a function:\n```python\n{fn['raw']}\n```\nWhat does it do?"},
                {"role": "assistant", "content": "It " + fn["raw"].split("\n")[0].strip().rstrip(":") + "."}]
        if turns and len(encode(tokenizer, turns + turn + request)) > n_tokens:
            break
        turns += turn
    return turns + request


def as_request(prompt):
    """A bench prompt as a user's request sends it: a string is one chat request, {"raw": text} raw text,
    a list chat messages."""
    if isinstance(prompt, dict):
        return prompt["raw"]
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def prompt_kind(prompt) -> str | None:
    """The kind `generate` gives a user's request of this bench prompt ("raw" or "chat"), which the bench,
    sending ids, names itself: with no kind, every request started from the estimates of the last ones of
    any kind (chats from raw continuations'), as no user's request does."""
    from .generate import prompt_kind as kind_of_request

    return kind_of_request(as_request(prompt))


def encode(tokenizer, prompt) -> list[int]:
    from .generate import encode_prompt

    return encode_prompt(tokenizer, as_request(prompt))


@dataclass
class Sample:
    tokens: list[int]
    ttft: float
    decode_tps: float
    e2e_tps: float
    peak_gb: float
    tau: float = 0.0
    acceptance: list[float] = field(default_factory=list)
    mean_draft: float = 0.0  # drafts per verify round (what the controller chose, for block "auto")
    cpu_decode_tps: float = 0.0  # per CPU-second of this process: what other jobs on the machine disturb least


def plain_kwargs(model) -> dict:
    """mlx-lm's generation options for the same caches as ours (quantized KV from the first token, if set)."""
    kv = model.kv_cache
    return dict(kv_bits=kv["kv_bits"], kv_group_size=kv["kv_group_size"], quantized_kv_start=0) if kv else {}


def run_plain(model, tokenizer, ids: list[int], max_tokens: int, **mlx_lm_kwargs) -> Sample:
    """mlx-lm's own stream_generate on the same loaded weights, laid out as mlx-lm loads them and through
    mlx-lm's own layers (not the CPU attention or kernels ours take): the baseline (or its draft-model mode)."""
    import mlx_lm

    kernels = model.target.kernels
    with as_stored(model.model, model.relaid), kernels.paused() if kernels else nullcontext():
        mx.reset_peak_memory()
        tokens, start, first, cpu = [], time.perf_counter(), None, None
        for r in mlx_lm.stream_generate(model.model, tokenizer, mx.array(ids), max_tokens=max_tokens, **mlx_lm_kwargs):
            first, cpu = first or time.perf_counter(), cpu or time.process_time()
            tokens.append(r.token)
            last = r
        end = time.perf_counter()
    if last.finish_reason == "stop":
        tokens = tokens[:-1]  # mlx-lm repeats the EOS token in its final response
    return _sample(tokens, start, first, end, cpu)


def run_spec(model, tokenizer, ids: list[int], max_tokens: int, block_size: int | None,
             kind: str | None = None) -> Sample:
    from .generate import stream_generate

    mx.reset_peak_memory()
    tokens, start, first, cpu = [], time.perf_counter(), None, None
    for r in stream_generate(model, tokenizer, ids, max_tokens, block_size=block_size, kind=kind):
        first, cpu = first or time.perf_counter(), cpu or time.process_time()
        tokens += r.tokens
    s = _sample(tokens, start, first, time.perf_counter(), cpu)
    s.tau, s.acceptance = r.spec.tau, r.spec.acceptance_rates
    s.mean_draft = r.spec.drafted / r.spec.rounds if r.spec.rounds else 0.0
    return s


def _sample(tokens, start, first, end, cpu: float | None = None) -> Sample:
    n = len(tokens)
    s = Sample(tokens, first - start, (n - 1) / max(end - first, 1e-9) if n > 1 else 0.0, n / (end - start),
               mx.get_peak_memory() / 1e9)
    if cpu is not None and n > 1:
        s.cpu_decode_tps = (n - 1) / max(time.process_time() - cpu, 1e-9)
    return s


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or of the shorter end), None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class Row:
    kind: str
    block: str
    plain_decode_tps: float
    spec_decode_tps: float
    plain_e2e_tps: float
    spec_e2e_tps: float
    plain_ttft: float
    spec_ttft: float
    speedup: float
    tau: float
    acceptance: list[float]
    peak_gb: float
    identical: bool
    divergences: list[int] = field(default_factory=list)
    bound: float | None = None  # tau * t(1) / (t(k+1) + t_draft(k)) from the cost curve
    efficiency: float | None = None
    mode: str = "auto"
    mean_draft: float = 0.0
    tokens: float = 0.0  # median tokens generated per run: a few tokens make a noisy speed
    prompt_tokens: float = 0.0  # median prompt length
    cpu_speedup: float = 0.0  # the same pairs per CPU-second of this process (steadier on a shared machine)
    pair_tps: list[float] = field(default_factory=list)  # each speculative run's decode speed, in run order
    pair_cpu_tps: list[float] = field(default_factory=list)  # the same per CPU-second


def bench_kind(model, tokenizer, kind: str, prompts: list, max_tokens: int, block_size: int | None,
               repeats: int, curve=None) -> Row:
    """One block size's row (see `bench_sizes`)."""
    return bench_sizes(model, tokenizer, kind, prompts, max_tokens, [block_size], repeats, curve)[0]


def bench_sizes(model, tokenizer, kind: str, prompts: list, max_tokens: int, block_sizes: list,
                repeats: int, curve=None) -> list[Row]:
    """Plain and speculative runs at every block size, interleaved, over one kind of prompt: one row per
    size, medians over prompts x repeats. Each repeat runs plain once and every size once, in an order
    rotated per repeat, so the sizes are compared side by side (the speedup is the median of the ratios
    to the same repeat's plain run; `pair_tps` keeps every run's speed, in order, for paired ratios
    between sizes)."""
    block_sizes = list(dict.fromkeys(block_sizes))  # a size given twice is one row
    plain, spec, kw = [], {b: [] for b in block_sizes}, plain_kwargs(model)
    divergences = {b: [] for b in block_sizes}
    turn = 0
    for prompt in prompts:
        ids, as_kind = encode(tokenizer, prompt), prompt_kind(prompt)
        run_plain(model, tokenizer, ids, 4, **kw)  # warm-up both paths
        for b in block_sizes:
            run_spec(model, tokenizer, ids, 4, b, as_kind)
        for _ in range(repeats):
            order = [None, *range(len(block_sizes))]
            order = order[turn % len(order):] + order[: turn % len(order)]
            turn += 1
            for i in order:
                if i is None:
                    a = run_plain(model, tokenizer, ids, max_tokens, **kw)
                else:
                    spec[block_sizes[i]].append(run_spec(model, tokenizer, ids, max_tokens, block_sizes[i], as_kind))
            plain.append(a)
            for b in block_sizes:
                d = first_divergence(a.tokens, spec[b][-1].tokens)
                if d is not None:
                    divergences[b].append(d)
    return [_row(model, tokenizer, kind, prompts, b, plain, spec[b], divergences[b], curve) for b in block_sizes]


def _row(model, tokenizer, kind, prompts, block_size, plain: list[Sample], spec: list[Sample], divergences, curve) -> Row:
    med = statistics.median
    row = Row(
        kind=kind, block=str(block_size or "auto"),
        plain_decode_tps=med([s.decode_tps for s in plain]), spec_decode_tps=med([s.decode_tps for s in spec]),
        plain_e2e_tps=med([s.e2e_tps for s in plain]), spec_e2e_tps=med([s.e2e_tps for s in spec]),
        plain_ttft=med([s.ttft for s in plain]), spec_ttft=med([s.ttft for s in spec]), speedup=0.0,
        tau=med([s.tau for s in spec]),
        acceptance=[med(col) for col in zip(*[s.acceptance for s in spec if s.acceptance])] if spec else [],
        peak_gb=max(s.peak_gb for s in spec), identical=not divergences, divergences=divergences,
        mean_draft=med([s.mean_draft for s in spec]), tokens=med([len(s.tokens) for s in spec]),
        prompt_tokens=med([len(encode(tokenizer, p)) for p in prompts]),
        pair_tps=[s.decode_tps for s in spec], pair_cpu_tps=[s.cpu_decode_tps for s in spec],
    )
    row.speedup = med([b.decode_tps / max(a.decode_tps, 1e-9) for a, b in zip(plain, spec)])  # pairwise: drift cancels
    row.cpu_speedup = med([b.cpu_decode_tps / max(a.cpu_decode_tps, 1e-9) for a, b in zip(plain, spec)])
    if curve is not None and block_size:
        k = min(block_size - 1, curve.max_drafts)
        row.bound = row.tau * curve.verify[0] / curve.pass_time(k)
        row.efficiency = row.speedup / row.bound if row.bound else None
    return row


def summary(rows: list[Row]) -> list[dict]:
    """Per mode and kind: auto against the best fixed block (chosen in hindsight)."""
    out = []
    for mode, kind in dict.fromkeys((r.mode, r.kind) for r in rows):
        mine = [r for r in rows if (r.mode, r.kind) == (mode, kind)]
        auto = next((r for r in mine if r.block.split()[0] == "auto"), None)
        fixed = [r for r in mine if r.block.split()[0].isdigit()]
        best = max(fixed, key=lambda r: r.speedup, default=None)
        out.append({"mode": mode, "kind": kind, "auto_speedup": auto.speedup if auto else None,
                    "auto_tau": auto.tau if auto else None, "best_fixed_block": best.block if best else None,
                    "best_fixed_speedup": best.speedup if best else None,
                    "auto_vs_best_fixed": _paired(auto, best, "pair_tps", "speedup"),
                    "auto_vs_best_fixed_cpu": _paired(auto, max(fixed, key=lambda r: r.cpu_speedup, default=None),
                                                      "pair_cpu_tps", "cpu_speedup")})
    return out


def _paired(a: Row | None, b: Row | None, runs: str, speedup: str) -> float | None:
    """a's speed over b's: the median of the ratios of runs made side by side (same prompt, same repeat)
    where both rows have them, else the ratio of their speedups."""
    if a is None or b is None:
        return None
    ra, rb = getattr(a, runs), getattr(b, runs)
    if ra and len(ra) == len(rb) and all(rb):
        return statistics.median(x / y for x, y in zip(ra, rb))
    return getattr(a, speedup) / getattr(b, speedup) if getattr(b, speedup) else None


def as_json(rows: list[Row], meta: dict, extra: dict | None = None) -> dict:
    return {"schema": "mlx-spec-bench/2", "meta": meta, "results": [asdict(r) for r in rows], "summary": summary(rows),
            **(extra or {})}


def run_mlx_lm_draft(model, tokenizer, ids, max_tokens, draft_model, num_draft: int) -> Sample:
    """mlx-lm's own speculative mode with a small draft model, for comparison."""
    return run_plain(model, tokenizer, ids, max_tokens, draft_model=draft_model, num_draft_tokens=num_draft)


def plot(rows: list[Row], path: str) -> None:
    """Speedup vs block size, one line per content kind."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from .errors import MlxSpecError

        raise MlxSpecError("--plot needs matplotlib: pip install matplotlib") from None
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in dict.fromkeys(r.kind for r in rows):
        pts = sorted((int(r.block), r.speedup) for r in rows if r.kind == kind and r.block.isdigit())
        if pts:
            ax.plot(*zip(*pts), marker="o", label=kind)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("block size (anchor + drafts)")
    ax.set_ylabel("decode speedup vs plain")
    ax.set_title("mlx-spec speedup by block size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
