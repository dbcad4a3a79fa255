"""`bench --vs-dspark`: mlx-spec side by side with mlx-dspark's DFlash loop on the same pair (optional).

mlx-dspark is an optional peer, never a dependency: this runs only where `import mlx_dspark` works.
It loads the same target and drafter files (float32, no quantization) into mlx-dspark's own loop,
and runs it with each fixed draft cap in turn on the same prompts (after a warm-up of both); then its
best cap per prompt kind, chosen in hindsight (its most favourable setting), and mlx-spec's adaptive
runs take turns.
"""

from __future__ import annotations

import statistics
import time

from .bench import Sample, encode, first_divergence, prompt_kind, run_spec
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
    if tokens and tokens[-1] in set(tok.eos_token_ids):  # its tokens end with the EOS; ours (and mlx-lm's) do not
        tokens = tokens[:-1]
    # Decode rate as ours counts it (`bench._sample`): the tokens after the first, over the time after it.
    # (mlx-dspark's own decode rate counts the first token and the EOS too: +20% on a 10-token answer.)
    decode = (len(tokens) - 1) / max(r.seconds - r.prefill_seconds, 1e-9) if len(tokens) > 1 else 0.0
    s = Sample(tokens, r.prefill_seconds, decode, len(tokens) / max(end - tic, 1e-9), 0.0)
    s.tau = r.mean_accept_len
    return s


def compare(model, tok, sets: dict[str, list], caps: list[int], max_tokens: int, repeats: int) -> list[dict]:
    """Per kind: mlx-dspark at each cap, to find its best in hindsight; then mlx-spec (adaptive) and that cap
    taking turns, `repeats` pairs a prompt: the ratios are of these pairs. (Compared in the sweep, its best cap
    ran right after its own runs of the same weights, in a warm CPU cache, and mlx-spec's after a switch from
    the other copy of the weights: code came out 0.88x where pairs in turns give ~1.0x.)"""
    peer = load_peer(model)
    out = []
    for kind, prompts in sets.items():
        encoded = [(encode(tok, p), prompt_kind(p)) for p in prompts]
        theirs = {c: [] for c in caps}
        for ids, as_kind in encoded:
            run_spec(model, tok, ids, 4, None, as_kind)
            for c in caps:
                run_peer(peer, ids, 4, c)
            for _ in range(repeats):
                for c in caps:
                    theirs[c].append(run_peer(peer, ids, max_tokens, c))
        med = {c: statistics.median(s.decode_tps for s in theirs[c]) for c in caps}
        best = max(caps, key=lambda c: med[c])
        pairs, diverged = [], 0
        for ids, as_kind in encoded:
            for _ in range(repeats):
                a, b = run_spec(model, tok, ids, max_tokens, None, as_kind), run_peer(peer, ids, max_tokens, best)
                pairs.append((a, b))
                n = min(len(a.tokens), len(b.tokens))
                diverged += first_divergence(a.tokens[:n], b.tokens[:n]) is not None
        out.append({
            "kind": kind, "mlx_spec_auto_tps": statistics.median(a.decode_tps for a, _ in pairs),
            "dspark_tps_by_cap": med, "dspark_tau_by_cap": {c: statistics.median(s.tau for s in theirs[c]) for c in caps},
            "dspark_best_cap": best, "dspark_best_tps": statistics.median(b.decode_tps for _, b in pairs),
            "ratio_vs_best": statistics.median(a.decode_tps / max(b.decode_tps, 1e-9) for a, b in pairs),
            "ratio_vs_best_e2e": statistics.median(a.e2e_tps / max(b.e2e_tps, 1e-9) for a, b in pairs),  # prefill too
            "pairs": len(pairs), "outputs_differ": diverged})
    return out
