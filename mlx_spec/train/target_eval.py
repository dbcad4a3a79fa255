"""The target's two quality numbers, before and after a training change (issue #19):

- held-out validation loss and top-1 accuracy on fixed windows of a run's val stream, at the old
  512-token and the new 2,048-token length (the same windows for every model);
- a repetition measure: distinct 4-grams / all 4-grams of each greedy 256-token answer to the
  built-in prompts (1.0 = no 4-gram repeats; "def _get_get_get…" drives it towards 0), averaged
  over answers, per prompt kind.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def distinct_ngrams(tokens: list[int], n: int = 4) -> float | None:
    """Distinct n-grams over all n-grams of one answer; None when it has fewer than n tokens."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def answers(model, tokenizer, prompts: list[dict], max_tokens: int = 256, batch_size: int = 16) -> list[list[int]]:
    """Greedy answers (EOS cut), batched with mlx-lm."""
    from .data import answer_batch, encode

    out = []
    for lo in range(0, len(prompts), batch_size):
        encoded = [encode(tokenizer, p) for p in prompts[lo : lo + batch_size]]
        out += answer_batch(model, tokenizer, encoded, max_tokens, keep_eos=False)
    return out


def repetition(model, tokenizer, prompts: list[dict], max_tokens: int = 256) -> dict:
    by_kind: dict[str, list[float]] = {}
    lengths: dict[str, list[int]] = {}
    for p, a in zip(prompts, answers(model, tokenizer, prompts, max_tokens)):
        kind = p.get("kind", "text")
        lengths.setdefault(kind, []).append(len(a))
        d = distinct_ngrams(a)
        if d is not None:
            by_kind.setdefault(kind, []).append(d)
    out = {k: {"distinct4": round(float(np.mean(v)), 4), "answers": len(v),
               "mean_tokens": round(float(np.mean(lengths[k])), 1)} for k, v in by_kind.items()}
    pooled = [d for v in by_kind.values() for d in v]
    out["all"] = {"distinct4": round(float(np.mean(pooled)), 4) if pooled else None, "answers": len(pooled)}
    return out


def report(model_dir: Path, val_path: Path, seq_lens=(512, 2048), batches: int = 16, batch_size: int = 4,
           prompts: list[dict] | None = None, max_tokens: int = 256) -> dict:
    from mlx_lm import load

    from .target import validation

    model, tokenizer = load(str(model_dir))
    val = np.load(val_path)
    out = {"model": str(model_dir), "val": str(val_path), "val_tokens": int(len(val))}
    for n in seq_lens:
        loss, acc = validation(model, val, n, batches, batch_size, seed=1)
        out[f"val_loss_{n}"], out[f"val_acc_{n}"] = round(loss, 4), round(acc, 4)
    if prompts:
        out["repetition"] = repetition(model, tokenizer, prompts, max_tokens)
    return out
