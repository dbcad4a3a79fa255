"""`bench --vs-dspark`: mlx-spec side by side with mlx-dspark's DFlash loop on the same pair (optional).

mlx-dspark is an optional peer, never a dependency: this runs only where `import mlx_dspark` works.
It loads the same target and drafter files (float32, no quantization) into mlx-dspark's own loop,
and runs it with each fixed draft cap in turn, interleaved with mlx-spec's adaptive runs on the same
prompts (after a warm-up of both). The comparison takes mlx-dspark's best cap per prompt kind,
chosen in hindsight: its most favourable setting.
"""

from __future__ import annotations

import statistics
import time

from .bench import Sample, first_divergence, run_spec
from .errors import MlxSpecError


def load_peer(model):
    """mlx-dspark's (target, tokenizer, drafter) for the same files as `model`."""
    try:
        from mlx_dspark.load import load_dflash, load_target
    except ImportError:
        raise MlxSpecError("--vs-dspark needs mlx-dspark importable (an optional peer: install it in another "
                           "environment and run `python -m mlx_spec.cli bench` with that Python)") from None
    target, tok = load_target(str(model.target_path), require_tap=True)
    drafter, _ = load_dflash(str(model.drafter_path), quantize=False)
    drafter.bind(target.model)
    return target, tok, drafter


def run_peer(peer, ids: list[int], max_tokens: int, cap: int) -> Sample:
    from mlx_dspark.generate import dflash_generate

    target, tok, drafter = peer
    tic = time.perf_counter()
    r = dflash_generate(target, tok, drafter, prompt_ids=ids, max_new_tokens=max_tokens, max_draft_tokens=cap,
                        temperature=0.0, apply_chat_template=False)
    end = time.perf_counter()
    tokens = list(r.token_ids[:max_tokens])
    s = Sample(tokens, r.prefill_seconds, r.decode_tokens_per_sec, len(tokens) / max(end - tic, 1e-9), 0.0)
    s.tau = r.mean_accept_len
    return s


def compare(model, tok, sets: dict[str, list], caps: list[int], max_tokens: int, repeats: int) -> list[dict]:
    """Per kind: mlx-spec (adaptive) and mlx-dspark at each cap, interleaved; medians and paired ratios."""
    from .generate import encode_prompt

    peer = load_peer(model)
    out = []
    for kind, prompts in sets.items():
        ours, theirs, diverged = [], {c: [] for c in caps}, 0
        for prompt in prompts:
            ids = encode_prompt(tok, prompt["raw"] if isinstance(prompt, dict) else
                                [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt)
            run_spec(model, tok, ids, 4, None)
            for c in caps:
                run_peer(peer, ids, 4, c)
            for _ in range(repeats):
                a = run_spec(model, tok, ids, max_tokens, None)
                ours.append(a)
                for c in caps:
                    b = run_peer(peer, ids, max_tokens, c)
                    theirs[c].append(b)
                    n = min(len(a.tokens), len(b.tokens))
                    diverged += first_divergence(a.tokens[:n], b.tokens[:n]) is not None
        med = {c: statistics.median(s.decode_tps for s in theirs[c]) for c in caps}
        best = max(caps, key=lambda c: med[c])
        out.append({
            "kind": kind, "mlx_spec_auto_tps": statistics.median(s.decode_tps for s in ours),
            "dspark_tps_by_cap": med, "dspark_tau_by_cap": {c: statistics.median(s.tau for s in theirs[c]) for c in caps},
            "dspark_best_cap": best,
            "ratio_vs_best": statistics.median(a.decode_tps / max(b.decode_tps, 1e-9) for a, b in zip(ours, theirs[best])),
            "pairs": len(ours), "outputs_differ": diverged})
    return out
