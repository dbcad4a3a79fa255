"""Acceptance length τ measured with the real verify loop, per content kind and per block position."""

from __future__ import annotations

from ..generate import SpecStats, stream_generate


def merge(a: SpecStats, b: SpecStats) -> SpecStats:
    """A new SpecStats with both runs' counters (drafting rounds included: τ is per drafting round)."""
    out = SpecStats()
    out.merge(a)
    out.merge(b)
    return out


def measure(model, tokenizer, prompts: list[dict], max_tokens: int = 128, block_size: int | None = None,
            progress=None) -> dict[str, SpecStats]:
    """Greedy τ pooled over prompts, keyed by prompt kind, plus "all"."""
    by_kind: dict[str, SpecStats] = {}
    for i, p in enumerate(prompts):
        last = None
        prompt = p["text"] if "text" in p else p["messages"]  # a string is completed raw, no chat template
        for last in stream_generate(model, tokenizer, prompt, max_tokens, block_size=block_size, adaptive=False):
            pass
        kind = p.get("kind", "text")
        by_kind[kind] = merge(by_kind.get(kind, SpecStats()), last.spec)
        if progress:
            progress(i + 1, len(prompts))
    total = SpecStats()
    for s in by_kind.values():
        total = merge(total, s)
    return {**by_kind, "all": total}


def table(results: dict[str, SpecStats]) -> str:
    lines = [f"{'kind':<8} {'rounds':>6} {'τ':>6}  acceptance by position"]
    for kind, s in results.items():
        rates = " ".join(f"{r:.2f}" for r in s.acceptance_rates)
        lines.append(f"{kind:<8} {s.rounds:>6} {s.tau:>6.2f}  {rates}")
    return "\n".join(lines)
